//! A short I/O benchmark on a real testbed: both clients fetch every byte and
//! the report and plot are written.

use blobhouse_bench::io_bench::{Client, IoBenchOptions, report, run};
use blobhouse_testbed::{Lifetime, Profile, Testbed};

#[test]
fn short_io_benchmark_measures_both_clients() {
    let dir = tempfile::tempdir().unwrap();
    let tb = Testbed::up(&dir.path().join("tb"), Profile::Lan, Lifetime::TiedToThisProcess).unwrap();
    let out = dir.path().join("out");
    let opts = IoBenchOptions { requests: 16, sizes: vec![1 << 20], in_flight: vec![4], out: out.clone() };
    let runs = run(&tb, &opts, &|_| {}).unwrap();
    Testbed::down(tb.dir()).unwrap();
    assert_eq!(runs.len(), 2);
    assert_eq!(runs[0].client, Client::DownloadManager);
    assert_eq!(runs[1].client, Client::ObjectStore);
    for r in &runs {
        assert_eq!(r.bytes, 16 << 20);
        assert!(r.seconds > 0.0 && r.cpu_seconds >= 0.0);
    }
    assert!(report("lan", &runs).contains("CPU-s/GiB ratio"));
    assert_eq!(&std::fs::read(out.join("cpu-throughput.png")).unwrap()[..4], b"\x89PNG");
    assert!(std::fs::read_to_string(out.join("io.csv")).unwrap().lines().count() == 3);
}

#[test]
fn hedging_benchmark_reports_both_runs() {
    let dir = tempfile::tempdir().unwrap();
    let tb = Testbed::up(&dir.path().join("tb"), Profile::Lan, Lifetime::TiedToThisProcess).unwrap();
    let runs = blobhouse_bench::io_bench::hedging(&tb, 20, 64 << 10, 4).unwrap();
    Testbed::down(tb.dir()).unwrap();
    assert!(!runs[0].hedging && runs[1].hedging);
    for r in &runs {
        assert_eq!((r.requests, r.failed, r.latencies_ms.len()), (20, 0, 20));
        assert!(r.latencies_ms.windows(2).all(|w| w[0] <= w[1]));
    }
    assert!(blobhouse_bench::io_bench::hedging_report("lan", 64 << 10, 4, &runs).contains("p99 without / with hedging"));
}
