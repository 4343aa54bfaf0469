//! A short calibration on a real testbed: every output is written and the
//! measurements are plausible for the profile.

use std::time::Duration;

use blobhouse_bench::calibrate::{CalibrateOptions, Outcome, calibrate};
use blobhouse_testbed::{Lifetime, Profile, Testbed};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn short_calibration_writes_tables_and_plots() {
    let dir = tempfile::tempdir().unwrap();
    let tb = Testbed::up(&dir.path().join("tb"), Profile::S3, Lifetime::TiedToThisProcess).unwrap();
    let out = dir.path().join("out");
    let opts = CalibrateOptions { samples: 3, concurrency: vec![1, 4], window: Duration::from_millis(1500), out: out.clone() };
    let cal = calibrate(&tb, &opts, &|_| {}).await.unwrap();
    Testbed::down(tb.dir()).unwrap();

    for f in ["report.txt", "latency.csv", "throughput.csv", "latency.png", "throughput.png"] {
        let bytes = std::fs::read(out.join(f)).unwrap_or_else(|e| panic!("{f}: {e}"));
        if f.ends_with(".png") {
            assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n", "{f} is not a PNG");
        }
    }
    // Through the s3 proxy nothing arrives before the 30 ms latency toxic.
    let first_bytes: Vec<Duration> = cal.sizes.iter().flat_map(|s| &s.samples).filter_map(|o| match o {
        Outcome::Ok { first_byte, .. } => Some(*first_byte),
        _ => None,
    }).collect();
    assert!(!first_bytes.is_empty());
    assert!(first_bytes.iter().all(|d| *d >= Duration::from_millis(20)), "{first_bytes:?}");
    // With one request in flight, a stalled or lost connection (3 % of
    // connections on s3) can hold the whole 1.5 s window at zero bytes, as
    // it does for a real client; four connections are never all stalled.
    assert!(cal.sweep.last().is_some_and(|p| p.concurrency == 4 && p.mib_per_s > 0.0), "{:?}", cal.sweep);
    assert!(cal.report().contains("requests of 16 MiB in flight needed"));
}
