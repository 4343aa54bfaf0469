//! All 22 TPC-H queries against the official answers (SF 0.01), on both
//! backends.

use std::sync::Arc;

use blobhouse_bench::answers::{self, Verdict};
use blobhouse_bench::tpch;
use blobhouse_engine::EngineOptions;

use crate::common::*;
use crate::on_every_store_encrypted_too;

on_every_store_encrypted_too!(tpch_answers_match_the_official_answers);

async fn tpch_answers_match_the_official_answers(b: Backend) {
    let db = TestDb::new(b, "tpch");
    let e = db.engine(EngineOptions::default()).await;
    let loads = tpch::load(&e, 0.01, Arc::new(|_, _, _| {})).await.expect("load TPC-H");
    assert_eq!(loads.iter().find(|l| l.table == "lineitem").unwrap().rows, 60175);
    assert_22_answers(&e, "").await;
}

/// Runs the 22 queries at SF 0.01 and fails with every wrong answer listed.
pub(crate) async fn assert_22_answers(e: &blobhouse_engine::Session, context: &str) {
    let mut failures = Vec::new();
    for q in 1..=22 {
        match tpch::run_query(e, q, 0.01).await {
            Ok(run) if run.verdict == Verdict::Verified => {}
            Ok(run) => failures.push(format!("Q{q}: {:?}", run.verdict)),
            Err(err) => failures.push(format!("Q{q}: {err}")),
        }
    }
    assert!(failures.is_empty(), "{} of 22 answers wrong{context}:\n{}", failures.len(), failures.join("\n"));
}

/// The 22 answers stay exact when the data path misbehaves: the engine's
/// download manager reads through a toxiproxy in front of MinIO that resets,
/// truncates and stalls a share of the connections (the catalog and the
/// manifests go to MinIO directly), and every fault is retried or hedged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tpch_answers_stay_exact_through_resets_truncations_and_stalls() {
    use blobhouse_testbed::Toxic;
    let db = TestDb::new(Backend::Minio, "faulty");
    let loader = db.engine(EngineOptions::default()).await;
    tpch::load(&loader, 0.01, Arc::new(|_, _, _| {})).await.expect("load TPC-H");
    drop(loader);

    // Every read goes to the store: the caches would spare the faults.
    let mut options = EngineOptions { cache: blobhouse_engine::CacheOptions::off(), ..EngineOptions::default() };
    let dm = options.download.as_mut().unwrap();
    dm.loop_options.attempt_timeout = std::time::Duration::from_secs(2);
    dm.loop_options.max_attempts = 12;
    dm.loop_options.backoff = std::time::Duration::from_millis(5);
    // Faults are drawn per connection: a connection per request meets many.
    dm.loop_options.keep_alive = false;
    let e = engine_through_proxy(
        &db,
        "faulty",
        &[
            Toxic::new("reset", "reset_peer", 0.1, serde_json::json!({"timeout": 0})),
            Toxic::new("truncate", "limit_data", 0.1, serde_json::json!({"bytes": 20_000})),
            Toxic::new("stall", "timeout", 0.05, serde_json::json!({"timeout": 0})),
        ],
        options,
    )
    .await;

    assert_22_answers(&e, " through faults").await;
    let stats = e.engine().download_manager().expect("S3 reads go through the download manager").stats().loops;
    eprintln!("download manager through faults: {stats:?}");
    assert!(stats.requests > 50, "{stats:?}");
    assert!(stats.retries >= 3, "too few faults were hit: {stats:?}");
    assert_eq!(stats.failures, 0, "{stats:?}");
}

/// An engine on `db` (MinIO) whose data reads go through a toxiproxy of
/// its own, shaped by `toxics`; the catalog and manifests go to MinIO
/// directly.
pub(crate) async fn engine_through_proxy(db: &TestDb, name: &str, toxics: &[blobhouse_testbed::Toxic], options: EngineOptions) -> blobhouse_engine::Session {
    let minio = blobhouse_testkit::MinioServer::shared();
    let tb = &minio.testbed;
    let port = blobhouse_testbed::process::free_port().unwrap();
    let name = format!("{name}-data-{}", std::process::id());
    let api = tb.toxiproxy();
    api.proxy(&name, port, tb.state().minio_port).unwrap();
    for toxic in toxics {
        api.add_toxic(&name, toxic).unwrap();
    }
    // URLs presigned for the proxy's address: data reads go through it.
    let mut through_proxy = db.store_options.clone();
    through_proxy.endpoint = Some(format!("http://127.0.0.1:{port}"));
    let signer = blobhouse_storage::open_location(&db.url, &through_proxy).unwrap().signer;
    assert!(signer.is_some());
    blobhouse_engine::Session::open_location(db.location.clone().with_signer(signer), db.store_options.clone(), options).await.unwrap()
}

/// The object scheduler changes when bytes arrive and which partition
/// decodes them, never the answers: the 22 queries give the official
/// answers with it and with the fixed one-row-group-ahead policy, over a
/// link with the object store's first-byte latency, on tables cut into
/// many row groups so that arrival order really differs from plan order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tpch_answers_are_the_same_with_and_without_the_scheduler() {
    use blobhouse_testbed::Toxic;
    let db = TestDb::new(Backend::Minio, "scheduler");
    let mut load_options = EngineOptions::default();
    load_options.write.target_chunk_bytes = 16 << 10;
    let loader = db.engine(load_options).await;
    tpch::load(&loader, 0.01, Arc::new(|_, _, _| {})).await.expect("load TPC-H");
    let lineitem = loader.engine().database().manifest(&loader.engine().database().current().tables["lineitem"]).await.unwrap();
    let row_groups: usize = lineitem.objects.iter().map(|o| o.row_groups.len()).sum();
    assert!(row_groups >= 8, "lineitem should have many row groups, has {row_groups}");
    drop(loader);
    // 30 +- 10 ms to the first byte of every response.
    let latency = [Toxic::new("latency", "latency", 1.0, serde_json::json!({"latency": 30, "jitter": 10}))];
    for adaptive in [true, false] {
        let mut options = EngineOptions::default();
        options.scan.adaptive = adaptive;
        options.scan.initial = 256 << 10;
        let e = engine_through_proxy(&db, if adaptive { "scheduled" } else { "fixed" }, &latency, options).await;
        assert_22_answers(&e, if adaptive { " with the scheduler" } else { " without the scheduler" }).await;
        let timeline = last_scan_timeline(&e, "SELECT sum(l_quantity) FROM lineitem").await;
        assert_eq!(timeline.is_empty(), !adaptive, "the scheduler decides only when adaptive: {timeline:?}");
    }
}

/// The scheduler's decisions in the scans of `sql`.
async fn last_scan_timeline(e: &blobhouse_engine::Session, sql: &str) -> Vec<blobhouse_engine::Decision> {
    run(e, sql).await.scheduler.into_iter().flat_map(|(_, d)| d).collect()
}

/// DuckDB, with its own Parquet reader, runs the 22 queries directly on the
/// data objects blobhouse wrote and must agree with blobhouse's answers: the
/// objects are standard Parquet and the answers do not depend on our reader.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duckdb_on_our_data_objects_agrees() {
    let db = TestDb::new(Backend::Local, "duckdb");
    let e = db.engine(EngineOptions::default()).await;
    tpch::load(&e, 0.01, Arc::new(|_, _, _| {})).await.expect("load TPC-H");
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let queries: Vec<String> = (1..=22).map(|q| root.join(format!("crates/bench/tpch/queries/q{q:02}.sql")).to_string_lossy().to_string()).collect();
    let out = std::process::Command::new("python3")
        .arg(root.join("scripts/duckdb-oracle.py"))
        .arg(&db.url)
        .args(&queries)
        .output()
        .expect("python3 runs");
    assert!(out.status.success(), "DuckDB oracle failed (run scripts/install-test-deps.sh): {}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    let answers: Vec<&str> = text.split("==> ").filter(|s| !s.is_empty()).collect();
    assert_eq!(answers.len(), 22, "{text}");
    for (i, answer) in answers.iter().enumerate() {
        let body = answer.split_once('\n').map(|(_, b)| b).unwrap_or("");
        let ours = run(&e, tpch::query(i + 1)).await;
        let verdict = answers::compare(&answers::parse_answer(body), &answers::result_rows(&ours.batches));
        assert_eq!(verdict, Verdict::Verified, "Q{} differs between blobhouse and DuckDB", i + 1);
    }
}

/// `EXPLAIN` of the 22 queries gives the physical plans recorded in
/// `tests/golden/tpch_plans.txt`: a change to how statements are parsed,
/// dispatched or planned that alters a plan fails here, plan by plan.
/// After a change that improves plans on purpose, record them again with
/// `BLOBHOUSE_BLESS=1 cargo test -p blobhouse-tests --test suite tpch_physical_plans`
/// and commit the file with the reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tpch_physical_plans_are_the_recorded_ones() {
    let db = TestDb::new(Backend::Local, "plans");
    // Plans name partition counts: fix them, whatever this machine's cores.
    let e = db.engine(EngineOptions { target_partitions: 4, ..EngineOptions::default() }).await;
    tpch::load(&e, 0.01, Arc::new(|_, _, _| {})).await.expect("load TPC-H");
    let mut plans = String::new();
    for q in 1..=22 {
        let r = run(&e, &format!("EXPLAIN {}", tpch::query(q).trim().trim_end_matches(';'))).await;
        let physical = lines(&r).into_iter().filter_map(|l| l.strip_prefix("physical_plan|").map(str::to_string)).collect::<Vec<_>>();
        assert_eq!(physical.len(), 1, "Q{q}: EXPLAIN has one physical plan: {}", text(&r));
        plans += &format!("-- Q{q}\n{}\n", physical[0].trim_end());
    }
    let golden = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/tpch_plans.txt");
    if std::env::var_os("BLOBHOUSE_BLESS").is_some() {
        std::fs::create_dir_all(golden.parent().unwrap()).unwrap();
        std::fs::write(&golden, &plans).unwrap();
        return;
    }
    let recorded = std::fs::read_to_string(&golden).unwrap_or_else(|e| panic!("{}: {e} (record it with BLOBHOUSE_BLESS=1)", golden.display()));
    let split = |s: &str| s.split("-- Q").skip(1).map(str::to_string).collect::<Vec<_>>();
    let (now, then) = (split(&plans), split(&recorded));
    assert_eq!(now.len(), then.len());
    let changed: Vec<String> = now.iter().zip(&then).filter(|(a, b)| a != b).map(|(a, b)| format!("now:\n{a}\nrecorded:\n{b}")).collect();
    assert!(changed.is_empty(), "{} of 22 physical plans changed:\n{}", changed.len(), changed.join("\n"));
}
