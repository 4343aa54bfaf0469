//! All 22 TPC-H queries against the official answers (SF 0.01), on both
//! backends.

use std::sync::Arc;

use blobhouse_bench::answers::{self, Verdict};
use blobhouse_bench::tpch;
use blobhouse_engine::EngineOptions;

use crate::common::*;
use crate::on_both_backends;

on_both_backends!(tpch_answers_match_the_official_answers);

async fn tpch_answers_match_the_official_answers(b: Backend) {
    let db = TestDb::new(b, "tpch");
    let e = db.engine(EngineOptions::default()).await;
    let loads = tpch::load(&e, 0.01, Arc::new(|_, _, _| {})).await.expect("load TPC-H");
    assert_eq!(loads.iter().find(|l| l.table == "lineitem").unwrap().rows, 60175);
    let mut failures = Vec::new();
    for q in 1..=22 {
        match tpch::run_query(&e, q, 0.01).await {
            Ok(run) if run.verdict == Verdict::Verified => {}
            Ok(run) => failures.push(format!("Q{q}: {:?}", run.verdict)),
            Err(err) => failures.push(format!("Q{q}: {err}")),
        }
    }
    assert!(failures.is_empty(), "{} of 22 answers wrong:\n{}", failures.len(), failures.join("\n"));
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
