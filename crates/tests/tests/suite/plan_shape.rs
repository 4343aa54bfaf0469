//! Plan shapes that later changes must not silently undo (not timings):
//! the optimizer rules of issue 43, checked on executed plans.

use std::sync::Arc;

use blobhouse_bench::answers::{self, Verdict};
use blobhouse_bench::tpch;
use blobhouse_engine::{CacheOptions, EngineOptions};

use crate::common::*;

/// Q15's `revenue` CTE is referenced twice (the join and its `max()`):
/// it is computed once, so lineitem is read once, and the answer is the
/// official one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn q15_revenue_is_computed_once() {
    let db = TestDb::new(Backend::Local, "shape-q15");
    let e = db.engine(EngineOptions { cache: CacheOptions::off(), ..EngineOptions::default() }).await;
    tpch::load(&e, 0.01, Arc::new(|_, _, _| {})).await.expect("load TPC-H");
    let plan = text(&run(&e, &format!("EXPLAIN {}", tpch::query(15))).await);
    assert_eq!(plan.matches("BlobScanExec: table=lineitem").count(), 1, "{plan}");
    assert_eq!(plan.matches("SharedExec: subplan=1").count(), 2, "{plan}");
    let r = run(&e, tpch::query(15)).await;
    assert!(matches!(answers::verify(15, 0.01, &r), Verdict::Verified), "Q15's answer");
    let current = e.engine().database().current();
    let manifest = e.engine().database().manifest(&current.tables["lineitem"]).await.unwrap();
    let lineitem: u64 = manifest.objects.iter().map(|o| o.row_groups.len() as u64).sum();
    let supplier = 1;
    assert_eq!(r.scan.row_groups_read, lineitem + supplier, "lineitem read once: {:?}", r.scan);
}

/// Only what computes the same rows is shared: the same aggregate twice at
/// one version is; one aggregate at two versions of a table, one with a
/// volatile function, and copies that a join's runtime filter reaches are
/// computed twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_identical_deterministic_subplans_are_shared() {
    let db = TestDb::new(Backend::Local, "shape-shared");
    let e = db.engine(EngineOptions::default()).await;
    run(&e, "CREATE TABLE t AS SELECT value AS x, value % 7 AS g FROM generate_series(1, 1000)").await;
    run(&e, "INSERT INTO t SELECT value AS x, value % 7 AS g FROM generate_series(1001, 2000)").await;
    let agg = |at: &str| format!("SELECT g, sum(x) AS s FROM t{at} GROUP BY g");
    let twice = format!("SELECT * FROM ({}) UNION ALL SELECT * FROM ({}) ORDER BY g", agg(""), agg(""));
    let plan = text(&run(&e, &format!("EXPLAIN {twice}")).await);
    assert_eq!(plan.matches("SharedExec").count(), 2, "{plan}");
    let rows = lines(&run(&e, &twice).await);
    assert_eq!(rows.len(), 14);
    assert!(rows.chunks(2).all(|pair| pair[0] == pair[1]), "{rows:?}");

    let versions = format!("SELECT * FROM ({}) UNION ALL SELECT * FROM ({}) ORDER BY g, s", agg(" AT(VERSION => 1)"), agg(""));
    let plan = text(&run(&e, &format!("EXPLAIN {versions}")).await);
    assert!(!plan.contains("SharedExec"), "two versions are two subplans: {plan}");
    let rows = lines(&run(&e, &versions).await);
    let old: u64 = (1..=1000).filter(|x| x % 7 == 0).sum();
    let new: u64 = (1..=2000).filter(|x| x % 7 == 0).sum();
    assert_eq!(rows[..2], [format!("0|{old}"), format!("0|{new}")], "{rows:?}");

    let volatile = format!("SELECT * FROM ({0}) UNION ALL SELECT * FROM ({0})", "SELECT g, sum(x * random()) AS s FROM t GROUP BY g");
    let plan = text(&run(&e, &format!("EXPLAIN {volatile}")).await);
    assert!(!plan.contains("SharedExec"), "random() is computed in each: {plan}");

    // A join's runtime filter reaches one copy only: not shared.
    let joined = format!("SELECT a.g FROM ({}) a JOIN ({}) b ON a.g = b.g", agg(""), agg(""));
    let plan = text(&run(&e, &format!("EXPLAIN {joined}")).await);
    assert!(!plan.contains("SharedExec"), "{plan}");
}
