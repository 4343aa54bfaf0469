//! All 22 TPC-H queries against the official answers (SF 0.01), on both
//! backends.

use std::sync::Arc;

use blobhouse_bench::answers::Verdict;
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
