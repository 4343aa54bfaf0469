//! The scan's promises: only projected chunks are fetched, no footer is ever
//! read, zone maps prune, LIMIT and COUNT(*) stop early.

use std::sync::Arc;

use base64::Engine as _;
use blobhouse_bench::tpch;
use blobhouse_engine::EngineOptions;
use blobhouse_storage::format::Manifest;
use blobhouse_engine::QueryResult;
use blobhouse_testkit::Request;

use crate::common::*;
use crate::on_both_backends;

on_both_backends!(
    projection_fetches_only_projected_chunks_and_no_footer,
    sorted_range_predicate_prunes_row_groups,
    limit_and_count_stop_early,
    a_limit_above_a_filter_stops_the_downloads,
    a_scan_nobody_reads_yet_downloads_only_a_head_start,
    a_scan_faster_than_its_query_holds_little_ahead,
    the_scan_reports_zone_map_statistics,
    the_page_index_skips_pages_and_keeps_answers_and_row_ids
);

/// lineitem at SF 0.01 with small chunks, so it has many row groups.
async fn lineitem(b: Backend, name: &str) -> (TestDb, blobhouse_engine::Session, Arc<Manifest>) {
    let db = TestDb::new(b, name);
    let e = db.engine(small_chunks(4 << 10)).await;
    tpch::load_tables(&e, 0.01, &["lineitem"], Arc::new(|_, _, _| {})).await.expect("load lineitem");
    let current = e.engine().database().current();
    let manifest = e.engine().database().manifest(&current.tables["lineitem"]).await.unwrap();
    (db, e, manifest)
}

async fn projection_fetches_only_projected_chunks_and_no_footer(b: Backend) {
    let (db, e, manifest) = lineitem(b, "projection").await;
    let row_groups: usize = manifest.objects.iter().map(|o| o.row_groups.len()).sum();
    assert!(row_groups >= 10, "want many row groups, got {row_groups}");
    // l_orderkey (0) and l_quantity (4): 2 of 16 columns.
    let chunk_bytes: u64 = manifest.objects.iter().flat_map(|o| &o.row_groups).map(|rg| rg.columns[0].length + rg.columns[4].length).sum();
    db.audit.clear_requests();
    let logged_before = data_reads(&db, &e).len();
    let r = run(&e, "SELECT l_orderkey, l_quantity FROM lineitem").await;
    assert_eq!(r.rows() as u64, manifest.objects.iter().map(|o| o.rows).sum::<u64>());
    assert!(r.scan.bytes_fetched >= chunk_bytes, "fetched {} < chunks {chunk_bytes}", r.scan.bytes_fetched);
    assert!(r.scan.bytes_fetched as f64 <= 1.1 * chunk_bytes as f64, "fetched {} > 1.1 x chunks {chunk_bytes}", r.scan.bytes_fetched);
    assert_eq!(r.scan.row_groups_read as usize, row_groups);

    // No GET touched a footer: every read of a data object is a bounded range
    // that ends before the object's footer begins.
    let footer_start = |path: &str| {
        let o = manifest.objects.iter().find(|o| path.ends_with(&o.path)).expect("object in manifest");
        o.size - 8 - base64::engine::general_purpose::STANDARD.decode(&o.footer).unwrap().len() as u64
    };
    let reads = data_reads(&db, &e).split_off(logged_before);
    let mut data_gets = 0;
    for (path, range) in reads {
        data_gets += 1;
        match range {
            Some(r) => assert!(r.end <= footer_start(&path), "GET {path} {r:?} reads the footer"),
            None => panic!("GET of {path} without a range: a footer-free scan issues only bounded ranges"),
        }
    }
    if matches!(b, Backend::Minio) {
        assert!(e.engine().download_manager().is_some(), "S3 data reads go through the download manager");
        assert!(!db.audit.requests().iter().any(|r| matches!(r, Request::Get { path, .. } if path.ends_with(".parquet"))), "a data GET went through object_store");
    }
    assert_eq!(data_gets as u64, r.scan.get_requests, "scan metrics and store disagree on GETs");
}

async fn sorted_range_predicate_prunes_row_groups(b: Backend) {
    let (_db, e, manifest) = lineitem(b, "pruning").await;
    let total: u64 = manifest.objects.iter().map(|o| o.row_groups.len() as u64).sum();
    // lineitem is generated in l_orderkey order.
    let r = run(&e, "SELECT count(*) FROM lineitem WHERE l_orderkey BETWEEN 1000 AND 1100").await;
    assert!(r.scan.row_groups_read * 10 <= total, "read {} of {total} row groups", r.scan.row_groups_read);
    assert_eq!(r.scan.row_groups_pruned + r.scan.row_groups_read, total);
    // Same answer as a query that cannot prune.
    let full = run(&e, "SELECT sum(CASE WHEN l_orderkey BETWEEN 1000 AND 1100 THEN 1 ELSE 0 END) FROM lineitem").await;
    assert_eq!(full.scan.row_groups_pruned, 0);
    assert_eq!(scalar(&r), scalar(&full));
    assert_ne!(scalar(&r), "0");
}

/// lineitem at SF 0.01 in one row group of about 60 000 rows (3–4 pages,
/// sorted by l_orderkey): page-index pruning decodes only the pages whose
/// bounds pass the filter, and row ids and deletes still land on the right
/// rows. Each answer is checked against a form of the query whose filter
/// cannot prune (a CASE), which decodes every row.
async fn the_page_index_skips_pages_and_keeps_answers_and_row_ids(b: Backend) {
    let db = TestDb::new(b, "page-index");
    let e = db.engine(EngineOptions::default()).await;
    tpch::load_tables(&e, 0.01, &["lineitem"], Arc::new(|_, _, _| {})).await.expect("load lineitem");
    let current = e.engine().database().current();
    let manifest = e.engine().database().manifest(&current.tables["lineitem"]).await.unwrap();
    assert!(manifest.objects.iter().all(|o| o.page_index_at.is_some() && o.page_index.is_none()), "every object records where its page index lies");
    let rows: u64 = manifest.objects.iter().map(|o| o.rows).sum();
    let index_reads = |e: &blobhouse_engine::Session| {
        let at: Vec<std::ops::Range<u64>> = manifest.objects.iter().map(|o| o.page_index_at.unwrap().range()).collect();
        data_reads(&db, e).into_iter().filter(|(_, r)| r.as_ref().is_some_and(|r| at.contains(r))).count()
    };

    let both = |range: &str| {
        (
            format!("SELECT count(*), sum(l_quantity), sum(l_linenumber) FROM lineitem WHERE {range}"),
            format!("SELECT sum(CASE WHEN {range} THEN 1 ELSE 0 END), sum(CASE WHEN {range} THEN l_quantity END), sum(CASE WHEN {range} THEN l_linenumber END) FROM lineitem"),
        )
    };
    let check = |pruned: QueryResult, full: QueryResult, what: &str| {
        assert_eq!(full.scan.rows_skipped_by_page_index, 0, "{what}: the CASE form cannot prune");
        assert_eq!(lines(&pruned), lines(&full), "{what}");
        pruned.scan.rows_skipped_by_page_index
    };
    // The first of ~60 000 orders' rows: the other pages are skipped.
    let (pruned, full) = both("l_orderkey < 5000");
    let first = run(&e, &pruned).await;
    assert_eq!(first.scan.page_index_reads, manifest.objects.len() as u64, "the first filtered scan reads each object's page index");
    let skipped = check(first, run(&e, &full).await, "first page");
    assert!(skipped * 2 >= rows, "the page index skipped {skipped} of {rows} rows");
    if matches!(b, Backend::Minio) {
        assert!(!db.audit.requests().iter().any(|r| matches!(r, Request::Get { path, .. } if path.ends_with(".parquet"))), "the page index is read through the download manager");
    }
    let plan = text(&run(&e, &format!("EXPLAIN {pruned}")).await);
    assert!(plan.contains("page_index_skips="), "{plan}");

    // DELETE and UPDATE find their rows by row id, through a selection that
    // starts mid-row-group.
    let (pruned, _) = both("l_orderkey BETWEEN 45000 AND 45100");
    let doomed = scalar(&run(&e, &pruned.replace("count(*), sum(l_quantity), sum(l_linenumber)", "count(*)")).await);
    assert_ne!(doomed, "0");
    let plan = text(&run(&e, &format!("EXPLAIN {pruned}")).await);
    assert!(plan.contains("page_index_skips="), "the DELETE's scan can use the page index: {plan}");
    run(&e, "DELETE FROM lineitem WHERE l_orderkey BETWEEN 45000 AND 45100").await;
    // The right rows went: a scan that decodes every row finds none left.
    let left = run(&e, "SELECT sum(CASE WHEN l_orderkey BETWEEN 45000 AND 45100 THEN 1 ELSE 0 END) FROM lineitem").await;
    assert_eq!(scalar(&left), "0");
    assert_eq!(scalar(&run(&e, "SELECT count(*) FROM lineitem").await), (rows - doomed.parse::<u64>().unwrap()).to_string());
    let bumped = scalar(&run(&e, "SELECT count(*) FROM lineitem WHERE l_orderkey BETWEEN 50000 AND 50050").await);
    run(&e, "UPDATE lineitem SET l_quantity = l_quantity + 1000 WHERE l_orderkey BETWEEN 50000 AND 50050").await;
    let changed = run(&e, "SELECT count(*), min(l_orderkey), max(l_orderkey) FROM lineitem WHERE l_quantity > 1000").await;
    let changed = lines(&changed)[0].split('|').map(str::to_string).collect::<Vec<_>>();
    assert_eq!(changed[0], bumped, "the UPDATE changed exactly its rows");
    assert!(changed[1].parse::<u64>().unwrap() >= 50000 && changed[2].parse::<u64>().unwrap() <= 50050, "{changed:?}");

    // With deleted rows inside the selected pages.
    for range in ["l_orderkey > 40000", "l_orderkey BETWEEN 44000 AND 46000", "l_orderkey BETWEEN 49000 AND 51000"] {
        let (pruned, full) = both(range);
        let skipped = check(run(&e, &pruned).await, run(&e, &full).await, range);
        assert!(skipped > 0, "{range}: nothing skipped");
    }
    assert_eq!(index_reads(&e), manifest.objects.len(), "each object's page index was read once, however many scans used it");
}

async fn limit_and_count_stop_early(b: Backend) {
    let (_db, e, manifest) = lineitem(b, "limit").await;
    let r = run(&e, "SELECT * FROM lineitem LIMIT 10").await;
    assert_eq!(r.rows(), 10);
    assert_eq!(r.scan.row_groups_read, 1, "LIMIT 10 should read one row group");
    assert!(r.scan.get_requests <= 16, "{} requests for LIMIT 10", r.scan.get_requests);
    let c = run(&e, "SELECT count(*) FROM lineitem").await;
    assert_eq!(scalar(&c), manifest.objects.iter().map(|o| o.rows).sum::<u64>().to_string());
    assert_eq!(c.scan.get_requests, 0, "COUNT(*) is answered from the manifest");
}

/// A LIMIT above a filter cannot be planned into the scan (any row group
/// may hold the matches); the scan plans every row group, and it is the
/// query finishing early that must stop the downloads. The scheduler's
/// budgets are scaled down with the row groups (~40 KiB here vs ~100 MiB
/// at SF 10) so a few row groups fill them.
async fn a_limit_above_a_filter_stops_the_downloads(b: Backend) {
    let db = TestDb::new(b, "limit-filter");
    let mut options = small_chunks(4 << 10);
    options.scan.initial = 64 << 10;
    options.scan.memory = 256 << 10;
    let e = db.engine(options).await;
    tpch::load_tables(&e, 0.01, &["lineitem"], Arc::new(|_, _, _| {})).await.expect("load lineitem");
    let all = run(&e, "SELECT * FROM lineitem WHERE l_quantity > 10").await;
    assert!(all.scan.get_requests >= 20, "want many requests for the whole table, got {}", all.scan.get_requests);
    let limited = run(&e, "SELECT * FROM lineitem WHERE l_quantity > 10 LIMIT 10").await;
    assert_eq!(limited.rows(), 10);
    assert!(
        limited.scan.get_requests <= 10 && limited.scan.get_requests * 4 <= all.scan.get_requests,
        "LIMIT 10 issued {} of the {} requests of the whole scan",
        limited.scan.get_requests,
        all.scan.get_requests
    );
}

/// A plan starts all its scans at once, but a hash join reads its probe
/// side only after its build side: until a partition asks, a scan
/// downloads only its head start (`SchedulerOptions::prefetch`), and then
/// everything. Budgets are scaled down with the row groups as above.
async fn a_scan_nobody_reads_yet_downloads_only_a_head_start(b: Backend) {
    let db = TestDb::new(b, "head-start");
    let mut options = small_chunks(4 << 10);
    options.scan.memory = 1 << 20;
    options.scan.prefetch = 128 << 10;
    let e = db.engine(options).await;
    tpch::load_tables(&e, 0.01, &["lineitem"], Arc::new(|_, _, _| {})).await.expect("load lineitem");
    let current = e.engine().database().current();
    let manifest = e.engine().database().manifest(&current.tables["lineitem"]).await.unwrap();
    let largest_row_group = manifest.objects.iter().flat_map(|o| &o.row_groups).map(|rg| rg.columns.iter().map(|c| c.length).sum::<u64>()).max().unwrap();
    assert!(largest_row_group < 128 << 10, "row groups of {largest_row_group} bytes leave no room to tell a head start from a full budget");

    let df = e.context().sql("SELECT * FROM lineitem").await.unwrap();
    let task = Arc::new(df.task_ctx());
    let plan = df.create_physical_plan().await.unwrap();
    let streams: Vec<_> = (0..plan.properties().partitioning.partition_count()).map(|p| plan.execute(p, task.clone()).unwrap()).collect();
    // Give the fetcher time to download far more than the head start, were it allowed.
    tokio::time::sleep(std::time::Duration::from_millis(800)).await;
    let early = blobhouse_engine::collect_scan_metrics(&plan).bytes_fetched;
    assert!(early > 0, "the head start is downloaded before anyone asks");
    assert!(early <= (128 << 10) + largest_row_group, "{early} bytes downloaded before any partition asked; the head start is 128 KiB");

    let mut rows = 0;
    for mut s in streams {
        while let Some(batch) = futures::StreamExt::next(&mut s).await {
            rows += batch.unwrap().num_rows() as u64;
        }
    }
    assert_eq!(rows, manifest.objects.iter().map(|o| o.rows).sum::<u64>());
    let all = blobhouse_engine::collect_scan_metrics(&plan).bytes_fetched;
    let chunks: u64 = manifest.objects.iter().flat_map(|o| &o.row_groups).flat_map(|rg| &rg.columns).map(|c| c.length).sum();
    assert!(chunks > 8 * early, "the table ({chunks} bytes) is much larger than the head start ({early} bytes)");
    assert!(all >= chunks, "once asked, the whole table is read: {all} of {chunks} bytes");
}

/// A store faster than the query (here: one whose link the scheduler is
/// told is slow, so the bytes it wants in flight are a few hundred; a
/// local disk under a heavy query is the real case) must not fill memory
/// with row groups nobody is ready for: at TPC-H SF 10, Q1's scan held all
/// of its 400 MB at once. With two partitions that take one batch each and
/// then stop, the scan fetches what they took, two morsels per partition
/// waiting and one row group on its way — not the table, although its
/// memory cap would allow all of it.
async fn a_scan_faster_than_its_query_holds_little_ahead(b: Backend) {
    let db = TestDb::new(b, "little-ahead");
    let mut options = small_chunks(2 << 10);
    options.target_partitions = 2;
    options.scan.memory = 1 << 30;
    options.scan.initial = 64 << 10;
    options.scan.link_bytes_per_sec = Some(64.0 * 1024.0);
    let e = db.engine(options).await;
    tpch::load_tables(&e, 0.01, &["lineitem"], Arc::new(|_, _, _| {})).await.expect("load lineitem");
    let current = e.engine().database().current();
    let manifest = e.engine().database().manifest(&current.tables["lineitem"]).await.unwrap();
    let sizes: Vec<u64> = manifest.objects.iter().flat_map(|o| &o.row_groups).map(|rg| rg.columns.iter().map(|c| c.length).sum::<u64>()).collect();
    let (largest, table) = (*sizes.iter().max().unwrap(), sizes.iter().sum::<u64>());

    let df = e.context().sql("SELECT * FROM lineitem").await.unwrap();
    let task = Arc::new(df.task_ctx());
    let plan = df.create_physical_plan().await.unwrap();
    let scan = find(&plan, "BlobScanExec").expect("a blobhouse scan");
    assert_eq!(scan.properties().output_partitioning().partition_count(), 2);
    let mut streams: Vec<_> = (0..2).map(|p| scan.execute(p, task.clone()).unwrap()).collect();
    let mut rows = 0;
    for s in streams.iter_mut() {
        rows += futures::StreamExt::next(s).await.expect("a first batch").unwrap().num_rows() as u64;
    }
    // Time enough to download the whole table, were it allowed.
    tokio::time::sleep(std::time::Duration::from_millis(800)).await;
    let early = blobhouse_engine::collect_scan_metrics(&plan).bytes_fetched;
    // Taken (2) + waiting (2 per partition) + on its way (1), and the first
    // epoch's 64 KiB before the scheduler knew the link.
    let bound = 7 * largest + (64 << 10);
    assert!(table > 4 * bound, "the table ({table} bytes, row groups up to {largest}) must dwarf what may be held ahead ({bound})");
    assert!(early <= bound, "{early} of {table} bytes fetched while the partitions waited; at most {bound} expected");

    for mut s in streams {
        while let Some(batch) = futures::StreamExt::next(&mut s).await {
            rows += batch.unwrap().num_rows() as u64;
        }
    }
    assert_eq!(rows, manifest.objects.iter().map(|o| o.rows).sum::<u64>(), "every row, once");
    assert!(blobhouse_engine::collect_scan_metrics(&plan).bytes_fetched >= table);
}

/// The scan tells the optimizer each column's range and nulls from the
/// manifest's zone maps, so join and filter estimates can see which input is
/// small (without them, TPC-H Q18 built a hash table on six million joined
/// rows instead of on the subquery's 57).
async fn the_scan_reports_zone_map_statistics(backend: Backend) {
    use datafusion::common::ScalarValue;
    use datafusion::common::stats::Precision;
    let db = TestDb::new(backend, "scan-stats");
    let e = db.engine(EngineOptions::default()).await;
    run(&e, "CREATE TABLE t (id BIGINT NOT NULL, name VARCHAR)").await;
    run(&e, "INSERT INTO t VALUES (5, 'b'), (1, NULL), (9, 'a')").await;
    run(&e, "INSERT INTO t VALUES (-3, 'c')").await;
    let mut plan = e.context().sql("SELECT id, name FROM t").await.unwrap().create_physical_plan().await.unwrap();
    while plan.downcast_ref::<blobhouse_engine::BlobScanExec>().is_none() {
        plan = plan.children().first().map(|c| (*c).clone()).expect("a BlobScanExec under the plan");
    }
    let stats = datafusion::physical_plan::statistics::StatisticsContext::new().compute(plan.as_ref(), &Default::default()).unwrap();
    assert_eq!(stats.num_rows, Precision::Exact(4));
    let id = &stats.column_statistics[0];
    assert_eq!(id.min_value, Precision::Inexact(ScalarValue::Int64(Some(-3))));
    assert_eq!(id.max_value, Precision::Inexact(ScalarValue::Int64(Some(9))));
    assert_eq!(id.null_count, Precision::Exact(0));
    assert_eq!(stats.column_statistics[1].null_count, Precision::Exact(1));
}

/// With those statistics DataFusion builds Q18's semi join on the
/// subquery's few rows (RightSemi: the right input probes), not on the
/// join of customer, orders and lineitem; the answer stays the official one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn q18_builds_its_semi_join_on_the_subquery() {
    let db = TestDb::new(Backend::Local, "q18-plan");
    let e = db.engine(EngineOptions::default()).await;
    blobhouse_bench::tpch::load(&e, 0.01, std::sync::Arc::new(|_, _, _| {})).await.expect("load");
    let plan = text(&run(&e, &format!("EXPLAIN {}", blobhouse_bench::tpch::query(18))).await);
    let semi: Vec<&str> = plan.lines().filter(|l| l.contains("HashJoinExec") && l.contains("Semi")).collect();
    assert!(semi.len() == 1 && semi[0].contains("join_type=RightSemi"), "{plan}");
    let run = blobhouse_bench::tpch::run_query(&e, 18, 0.01).await.unwrap();
    assert!(matches!(run.verdict, blobhouse_bench::answers::Verdict::Verified), "{:?}", run.verdict);
}
