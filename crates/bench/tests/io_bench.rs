//! A short I/O benchmark on a real testbed: every client fetches every byte,
//! repeats are summarised, and the report and plots are written.

use blobhouse_bench::io_bench::{Client, IoBenchOptions, report, run};
use blobhouse_testbed::{Lifetime, Profile, Testbed};

#[test]
fn short_io_benchmark_measures_both_clients() {
    let dir = tempfile::tempdir().unwrap();
    let tb = Testbed::up(&dir.path().join("tb"), Profile::Lan, Lifetime::TiedToThisProcess).unwrap();
    let out = dir.path().join("out");
    let opts = IoBenchOptions {
        requests: 16,
        sizes: vec![1 << 20],
        in_flight: vec![2, 4],
        repeats: 2,
        clients: vec![Client::DownloadManager, Client::DownloadManagerModel, Client::ObjectStore],
        model_memory: 64 << 20,
        model_target: 1e9,
        rate: None,
        backend: blobhouse_io::uring::Backend::Auto,
        calibrated_mib_s: Some(1000.0),
        out: out.clone(),
    };
    let runs = run(&tb, &opts, &|_| {}).unwrap();
    Testbed::down(tb.dir()).unwrap();
    // 2 in-flight levels x 2 repeats x 3 clients, interleaved.
    assert_eq!(runs.len(), 12);
    assert_eq!(runs.iter().map(|r| r.client).take(3).collect::<Vec<_>>(), opts.clients);
    for r in &runs {
        assert_eq!(r.bytes, 16 << 20);
        assert!(r.seconds > 0.0 && r.steady_seconds > 0.0 && r.cpu_seconds >= 0.0);
    }
    // The fixed client never has more on the wire than asked.
    assert!(runs.iter().filter(|r| r.client == Client::DownloadManager).all(|r| r.max_in_flight <= r.in_flight));
    let points = blobhouse_bench::io_bench::points(&runs);
    assert_eq!(points.len(), 6);
    assert!(points.iter().all(|p| p.runs == 2));
    let text = report("lan", &opts, &runs);
    assert!(text.contains("at object_store's throughput") && text.contains("share of the calibrated aggregate"), "{text}");
    for png in ["cpu-throughput.png", "throughput-concurrency.png"] {
        assert_eq!(&std::fs::read(out.join(png)).unwrap()[..4], b"\x89PNG");
    }
    assert_eq!(std::fs::read_to_string(out.join("io.csv")).unwrap().lines().count(), 13);
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
