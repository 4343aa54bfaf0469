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
    let (_db, e) = tpch_without_caches("shape-q15").await;
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

/// Q1's pricing arithmetic (`l_extendedprice * (1 - l_discount) * (1 +
/// l_tax)`) runs in 64 bits, in the projection and in the aggregate's
/// argument, and the answer is the official one; values that need 128 bits
/// still get the exact answer, and an overflow of 128 bits is still an error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn decimal_arithmetic_runs_in_64_bits_with_the_same_answers() {
    let (_db, e) = tpch_without_caches("shape-decimal64").await;
    let plan = text(&run(&e, &format!("EXPLAIN {}", tpch::query(1))).await);
    // (EXPLAIN names an aggregate, not its arguments: the unit tests of
    // `blobhouse_engine::decimal64` check those are wrapped too.)
    assert!(plan.contains("decimal64(l_extendedprice@"), "the projection: {plan}");
    for q in [1, 3, 9] {
        let r = run(&e, tpch::query(q)).await;
        assert!(matches!(answers::verify(q, 0.01, &r), Verdict::Verified), "Q{q}'s answer");
    }

    run(&e, "CREATE TABLE d (a DECIMAL(38, 0), b DECIMAL(12, 2))").await;
    run(&e, "INSERT INTO d VALUES (4000000000000, 1.25), (-5000000000000, -2.50), (NULL, 3.00), (7, NULL)").await;
    let plan = text(&run(&e, "EXPLAIN SELECT a * a + b FROM d").await);
    assert!(plan.contains("decimal64("), "{plan}");
    // 4e12 squared needs 128 bits: the batch is computed as before.
    let rows = lines(&run(&e, "SELECT a * a + b AS v FROM d ORDER BY a NULLS LAST").await);
    assert_eq!(rows, ["24999999999999999999999997.50", "NULL", "16000000000000000000000001.25", "NULL"], "{rows:?}");
    let rows = lines(&run(&e, "SELECT a * b - a AS v FROM d WHERE a = 7 OR a > 0 ORDER BY a").await);
    assert_eq!(rows, ["NULL", "1000000000000.00"], "{rows:?}");
    let err = e.execute("SELECT a * a * a * a FROM d").await.expect_err("10^50 overflows DECIMAL(38)");
    assert!(err.to_string().to_lowercase().contains("overflow"), "{err}");
}

/// Q17's correlated `avg(l_quantity)` per part is read from the line items
/// the query has already joined to its parts, as a window
/// (`engine::subquery::window`): lineitem is scanned once, and the average
/// sees only the line items of the parts that match (`Brand#23`, `MED
/// BOX`), not an aggregation over every part.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn q17_averages_the_joined_line_items_in_one_scan() {
    let (_db, e) = tpch_without_caches("shape-q17").await;
    // At SF 0.01 no part is Brand#23 in a MED BOX: the shape is checked
    // with the brand and container most parts have, the answer with Q17's own.
    let top = lines(&run(&e, "SELECT p_brand, p_container, count(*) FROM part GROUP BY 1, 2 ORDER BY 3 DESC, 1, 2 LIMIT 1").await);
    let [brand, container, parts]: [&str; 3] = top[0].split('|').collect::<Vec<_>>().try_into().unwrap();
    let parts: u64 = parts.parse().unwrap();
    let all: u64 = scalar(&run(&e, "SELECT count(DISTINCT l_partkey) FROM lineitem").await).parse().unwrap();
    assert!(parts > 0 && parts * 100 < all, "{parts} of {all}");
    let matching: f64 = scalar(&run(&e, &format!("SELECT count(*) FROM lineitem, part WHERE p_partkey = l_partkey AND p_brand = '{brand}' AND p_container = '{container}'")).await).parse().unwrap();
    assert!(matching > 0.0);
    let q17 = tpch::query(17).replace("Brand#23", brand).replace("MED BOX", container);
    assert_ne!(q17, tpch::query(17));
    let plan = text(&run(&e, &format!("EXPLAIN ANALYZE {q17}")).await);
    assert_eq!(plan.lines().filter(|l| l.contains("BlobScanExec: table=lineitem")).count(), 1, "{plan}");
    let line = plan.lines().find(|l| l.contains("WindowAggExec")).unwrap_or_else(|| panic!("{plan}"));
    let rows = metric(line, "output_rows").unwrap_or_else(|| panic!("{line}"));
    assert_eq!(rows, matching, "the window's rows are the matching line items: {line}");
    assert_official_answer(&e, 17).await;
}

/// Q2's correlated `min(ps_supplycost)` among the region's suppliers is read
/// from the suppliers the query has already joined to its parts (the
/// subquery's four-table join is found inside the outer query's), so
/// partsupp, supplier, nation and region are each scanned once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn q2_cheapest_supplier_is_a_window_over_the_joined_suppliers() {
    let (_db, e) = tpch_without_caches("shape-q2").await;
    let plan = text(&run(&e, &format!("EXPLAIN {}", tpch::query(2))).await);
    for table in ["partsupp", "supplier", "nation", "region"] {
        assert_eq!(plan.matches(&format!("BlobScanExec: table={table},")).count(), 1, "{table}: {plan}");
    }
    assert!(plan.contains("WindowAggExec"), "{plan}");
    assert_official_answer(&e, 2).await;
}

/// Q11 keeps the parts whose stock value exceeds a share of the total over
/// the same joins: the total is read from the query's own groups
/// (`engine::subquery::total`), so partsupp is scanned and joined once, and
/// the answer stays exact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn q11_total_is_read_from_its_own_groups() {
    let (_db, e) = tpch_without_caches("shape-q11").await;
    let plan = text(&run(&e, &format!("EXPLAIN ANALYZE {}", tpch::query(11))).await);
    assert_eq!(plan.lines().filter(|l| l.contains("BlobScanExec: table=partsupp")).count(), 1, "{plan}");
    assert!(!plan.contains("ScalarSubqueryExec"), "{plan}");
    let line = plan.lines().find(|l| l.contains("WindowAggExec")).unwrap_or_else(|| panic!("{plan}"));
    // The window sees one row per part group, not the joined rows.
    let groups: f64 = scalar(&run(&e, "SELECT count(DISTINCT ps_partkey) FROM partsupp, supplier, nation WHERE ps_suppkey = s_suppkey AND s_nationkey = n_nationkey AND n_name = 'GERMANY'").await).parse().unwrap();
    assert_eq!(metric(line, "output_rows"), Some(groups), "{line}");
    assert_official_answer(&e, 11).await;
}

/// TPC-H at SF 0.01 on local disk, caches off: plans and metrics show the
/// store's reads.
async fn tpch_without_caches(name: &str) -> (TestDb, blobhouse_engine::Session) {
    let db = TestDb::new(Backend::Local, name);
    let e = db.engine(EngineOptions { cache: CacheOptions::off(), ..EngineOptions::default() }).await;
    tpch::load(&e, 0.01, Arc::new(|_, _, _| {})).await.expect("load TPC-H");
    (db, e)
}

/// Query `q` of TPC-H answers as the official SF 0.01 answer does.
async fn assert_official_answer(e: &blobhouse_engine::Session, q: usize) {
    let r = run(e, tpch::query(q)).await;
    assert!(matches!(answers::verify(q, 0.01, &r), Verdict::Verified), "Q{q}'s answer");
}

/// A metric of an EXPLAIN ANALYZE line (`name=1.23 K` → 1230).
fn metric(line: &str, name: &str) -> Option<f64> {
    let rest = &line[line.find(&format!("{name}="))? + name.len() + 1..];
    let text: String = rest.chars().take_while(|c| *c != ',' && *c != ']').collect();
    let mut parts = text.split_whitespace();
    let value: f64 = parts.next()?.parse().ok()?;
    let scale = match parts.next() {
        Some("K") => 1e3,
        Some("M") => 1e6,
        Some("B") => 1e9,
        _ => 1.0,
    };
    Some(value * scale)
}

/// Q5 joins supplier on `(s_suppkey, s_nationkey) = (l_suppkey,
/// c_nationkey)`: DataFusion's join filter covers both keys and stops at
/// that join, so the key transfer sends the suppliers' nations (ASIA's, by
/// the joins above) to the customer scan across two joins, and Q2's
/// qualifying parts to its partsupp scan.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn q5_and_q2_scans_get_the_keys_of_joins_above_them() {
    let (_db, e) = tpch_without_caches("shape-q5").await;
    let scan_line = |plan: &str, table: &str| plan.lines().find(|l| l.contains(&format!("BlobScanExec: table={table},"))).unwrap_or_else(|| panic!("{plan}")).to_string();

    let plan = text(&run(&e, &format!("EXPLAIN ANALYZE {}", tpch::query(5))).await);
    let customer = scan_line(&plan, "customer");
    assert!(customer.contains("DynamicFilter [ c_nationkey@1 >= "), "{customer}");
    let asia: u64 = scalar(&run(&e, "SELECT count(*) FROM customer JOIN nation ON c_nationkey = n_nationkey JOIN region ON n_regionkey = r_regionkey WHERE r_name = 'ASIA'").await).parse().unwrap();
    let all: u64 = scalar(&run(&e, "SELECT count(*) FROM customer").await).parse().unwrap();
    let dropped = metric(&customer, "runtime_filter_rows_dropped").unwrap_or_else(|| panic!("{customer}"));
    // (EXPLAIN rounds counts to three digits.)
    assert!((dropped - (all - asia) as f64).abs() <= 0.01 * all as f64, "the {} customers outside ASIA are dropped in the scan: {customer}", all - asia);
    assert!(plan.contains("KeyCollectExec: keys=[s_suppkey -> l_suppkey@1, s_nationkey -> c_nationkey@1]"), "{plan}");
    assert_official_answer(&e, 5).await;

    let plan = text(&run(&e, &format!("EXPLAIN ANALYZE {}", tpch::query(2))).await);
    // One partsupp scan since the `min()` is a window (the test above).
    let partsupp: Vec<&str> = plan.lines().filter(|l| l.contains("BlobScanExec: table=partsupp,")).collect();
    assert_eq!(partsupp.len(), 1, "{plan}");
    assert!(partsupp.iter().all(|l| l.contains("DynamicFilter [ ps_partkey@0 >= ")), "the partsupp scan filters by the parts: {partsupp:?}");
    assert_official_answer(&e, 2).await;
}

/// A filter's conjuncts run one after another on the rows still selected:
/// a conjunct that can fail (a division) runs after the comparisons and
/// only on the rows they kept, so `x <> 0 AND 100 / x > 10` does not divide
/// by zero (DataFusion's `AND` evaluated the division on every row of a
/// batch where `x <> 0` kept more than a fifth), and Q6's answer is exact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn filter_conjuncts_run_on_the_rows_still_selected() {
    let db = TestDb::new(Backend::Local, "shape-conjunction");
    let e = db.engine(EngineOptions { cache: CacheOptions::off(), ..EngineOptions::default() }).await;
    run(&e, "CREATE TABLE t AS SELECT value % 10 AS x, value AS y FROM generate_series(1, 1000)").await;
    let q = "SELECT count(*) FROM t WHERE y > 0 AND x <> 0 AND 100 / x > 10";
    // x in 1..9 with 100 / x > 10: x = 1..9 except 9 (100 / 9 = 11 > 10 too), so all of 1..9.
    assert_eq!(scalar(&run(&e, q).await), "900");
    let q = "SELECT count(*) FROM t WHERE 100 / x > 20 AND x <> 0";
    // 100 / x > 20: x in 1..4.
    assert_eq!(scalar(&run(&e, q).await), "400");
    tpch::load(&e, 0.01, Arc::new(|_, _, _| {})).await.expect("load TPC-H");
    for q in [6, 12, 19] {
        let r = run(&e, tpch::query(q)).await;
        assert!(matches!(answers::verify(q, 0.01, &r), Verdict::Verified), "Q{q}'s answer");
    }
}

/// A join with more build keys than an IN list holds (here 100 000): the
/// probe scan checks a Bloom filter of them before DataFusion's own join
/// filter, drops the rows it rejects, and the answer is exact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_build_keys_reach_the_probe_scan_as_a_bloom_filter() {
    let db = TestDb::new(Backend::Local, "shape-bloom");
    let e = db.engine(EngineOptions { cache: CacheOptions::off(), ..EngineOptions::default() }).await;
    run(&e, "CREATE TABLE probe AS SELECT value AS p FROM generate_series(1, 2000000)").await;
    run(&e, "CREATE TABLE build AS SELECT value AS b FROM generate_series(1, 1000000)").await;
    let q = "SELECT count(*) FROM probe JOIN build ON p = b WHERE b % 10 = 0";
    let plan = text(&run(&e, &format!("EXPLAIN ANALYZE {q}")).await);
    assert!(plan.contains("KeyCollectExec: keys=[b -> p@0 (bloom)]"), "{plan}");
    let scan = plan.lines().find(|l| l.contains("BlobScanExec: table=probe,")).unwrap_or_else(|| panic!("{plan}"));
    assert!(scan.contains("p@0 IN BLOOM (100000 keys)"), "{scan}");
    let dropped = metric(scan, "runtime_filter_rows_dropped").unwrap_or_else(|| panic!("{scan}"));
    // 1.9 M rows match no key; a Bloom filter lets about 1 % of them through.
    assert!(dropped >= 1.8e6, "{scan}");
    assert_eq!(scalar(&run(&e, q).await), "100000");
}

/// Q9's partitioned joins build on the joined line items (fewer rows), not
/// on `orders` and `partsupp` (fewer bytes): at SF 10 3.3 M rows against
/// 15 M and 8 M. Shared (collect-left) tables are turned off so that every
/// join is partitioned at SF 0.01 as it is at SF 10; the answer stays the
/// official one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn q9_builds_on_the_joined_line_items_not_on_orders_or_partsupp() {
    let (_db, e) = tpch_without_caches("shape-q9").await;
    run(&e, "SET datafusion.optimizer.hash_join_single_partition_threshold = 0").await;
    run(&e, "SET datafusion.optimizer.hash_join_single_partition_threshold_rows = 0").await;
    let plan = text(&run(&e, &format!("EXPLAIN {}", tpch::query(9))).await);
    let join_on = |key: &str| -> String {
        let line = plan.lines().find(|l| l.contains("HashJoinExec: mode=Partitioned") && l.contains(key)).unwrap_or_else(|| panic!("a partitioned join on {key} in\n{plan}"));
        line[line.find("on=[").unwrap()..].to_string()
    };
    // The build (left) key of each pair comes first.
    assert!(join_on("o_orderkey").starts_with("on=[(l_orderkey@"), "the line items build, orders probes: {}\n{plan}", join_on("o_orderkey"));
    assert!(join_on("ps_partkey").starts_with("on=[(l_"), "the line items build, partsupp probes: {}\n{plan}", join_on("ps_partkey"));
    assert_official_answer(&e, 9).await;
}

/// A partial aggregation that reduces its rows only 4× (Q18's line items
/// into orders) passes them on to the final one instead of aggregating
/// twice (`options::SKIP_PARTIAL_AGGREGATION_RATIO`); one that reduces them
/// 20× keeps aggregating. Same answers either way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partial_aggregation_that_barely_reduces_is_skipped() {
    let db = TestDb::new(Backend::Local, "shape-skip-partial");
    let e = db.engine(EngineOptions::default()).await;
    run(&e, "CREATE TABLE t AS SELECT value AS v FROM generate_series(1, 400000)").await;
    let skipped = |plan: &str| plan.lines().filter(|l| l.contains("AggregateExec: mode=Partial")).map(|l| metric(l, "skipped_aggregation_rows").unwrap_or(0.0)).sum::<f64>();
    for (per_group, skips) in [(4, true), (20, false)] {
        let q = format!("SELECT v / {per_group} AS k, count(*) AS n FROM t GROUP BY k");
        let plan = text(&run(&e, &format!("EXPLAIN ANALYZE {q}")).await);
        assert_eq!(skipped(&plan) > 0.0, skips, "{per_group} rows a group: {plan}");
        let check = format!("SELECT count(*), sum(n), min(n), max(n) FROM ({q})");
        let groups = 400000 / per_group + 1;
        assert_eq!(lines(&run(&e, &check).await), vec![format!("{groups}|400000|1|{per_group}")], "{per_group}");
    }
}
