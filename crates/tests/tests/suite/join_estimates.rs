//! The optimizer's estimates that choose hash-join build sides: scans sized
//! in decoded bytes, filters estimated conjunct by conjunct
//! (`blobhouse_engine::selectivity`). Plans only: the answers are checked by
//! the TPC-H suite.

use std::sync::Arc;

use blobhouse_bench::tpch;
use blobhouse_engine::EngineOptions;

use crate::common::*;

async fn orders_and_lineitem(name: &str) -> (TestDb, blobhouse_engine::Session) {
    let db = TestDb::new(Backend::Local, name);
    let e = db.engine(EngineOptions::default()).await;
    tpch::load_tables(&e, 0.01, &["orders", "lineitem"], Arc::new(|_, _, _| {})).await.expect("load orders and lineitem");
    (db, e)
}

/// The table scanned first below the first hash join of `plan`: its build
/// (left) side.
fn build_side(plan: &str) -> String {
    let join = plan.find("HashJoinExec").unwrap_or_else(|| panic!("a hash join in:\n{plan}"));
    let scan = plan[join..].find("BlobScanExec: table=").expect("a scan below the join") + join + "BlobScanExec: table=".len();
    plan[scan..].split([',', ' ']).next().unwrap().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn q12_builds_its_hash_table_on_the_few_filtered_line_items() {
    let (_db, e) = orders_and_lineitem("estimates-q12").await;
    let explain = format!("EXPLAIN {}", tpch::query(12));
    let plan = text(&run(&e, &explain).await);
    assert_eq!(build_side(&plan), "lineitem", "five conjuncts leave ~0.5 % of lineitem; all of orders joins:\n{plan}");

    // DataFusion's own estimate (20 % for any predicate it cannot analyse)
    // builds on orders: the estimator is what changes the plan.
    run(&e, "SET datafusion.optimizer.use_statistics_registry = false").await;
    let plan = text(&run(&e, &explain).await);
    assert_eq!(build_side(&plan), "orders", "{plan}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scans_are_sized_in_decoded_bytes_not_downloaded_ones() {
    let (_db, e) = orders_and_lineitem("estimates-bytes").await;
    run(&e, "SET datafusion.explain.show_statistics = true").await;
    let plan = text(&run(&e, "EXPLAIN SELECT o_orderkey FROM orders").await);
    let scan = plan.lines().find(|l| l.contains("BlobScanExec")).expect("a scan");
    // 15 000 keys of 8 bytes; compressed they are a fraction of that.
    assert!(scan.contains("Rows=Exact(15000), Bytes=Inexact(120000)"), "{scan}");
}
