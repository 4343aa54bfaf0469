//! The scan spreads its work over every partition it plans: a row group is
//! fetched whole but decoded in morsels (pieces of its rows) that any
//! partition may take, so a table of few, large row groups still keeps
//! every core busy. Not timings: which partitions decoded what, and that
//! the answers, row ids, deletes and the memory tier's decoded copies are
//! the same as when one partition decodes everything.

use futures::StreamExt;

use blobhouse_engine::{CacheOptions, EngineOptions, Session};

use crate::common::*;

/// Rows of the test table: one row group of 400 000 rows (the writer's
/// default chunk target is far above its size), four morsels' worth at the
/// scan's 100 000-row minimum.
const ROWS: u64 = 400_000;

fn options(partitions: usize, cache: CacheOptions) -> EngineOptions {
    EngineOptions { target_partitions: partitions, cache, ..EngineOptions::default() }
}

async fn one_row_group(b: Backend, name: &str) -> (TestDb, Session) {
    let db = TestDb::new(b, name);
    let e = db.engine(options(4, CacheOptions::off())).await;
    run(&e, &format!("CREATE TABLE t AS SELECT value AS x, 'row ' || value AS s FROM generate_series(1, {ROWS}) ORDER BY value")).await;
    let current = e.engine().database().current();
    let manifest = e.engine().database().manifest(&current.tables["t"]).await.unwrap();
    let row_groups: usize = manifest.objects.iter().map(|o| o.row_groups.len()).sum();
    assert_eq!(row_groups, 1, "the test wants one large row group");
    (db, e)
}

/// One row group, four partitions: before morsels, the scan planned one
/// partition (as many as row groups) and one core decoded everything.
async fn one_row_group_is_decoded_by_every_partition(b: Backend) {
    let (db, e) = one_row_group(b, "morsels-spread").await;
    let plan = text(&run(&e, "EXPLAIN SELECT x, s FROM t").await);
    assert!(plan.contains("morsels=4"), "{plan}");

    let (rows, sum) = rows_per_partition(&e, 4).await;
    assert!(rows.iter().all(|r| *r > 0), "rows per partition: {rows:?}");
    assert_eq!((rows.iter().sum::<u64>(), sum), (ROWS, (1..=ROWS).sum()), "every row once");

    // Through SQL, with the same answer on four partitions as on one.
    let sql = "SELECT sum(x), count(*), count(DISTINCT s), min(s), max(x) FROM t";
    let r = run(&e, sql).await;
    assert_eq!(lines(&r), vec![format!("{}|{ROWS}|{ROWS}|row 1|{ROWS}", (1..=ROWS).sum::<u64>())]);
    assert_eq!((r.scan.row_groups_read, r.scan.morsels_read, r.scan.partitions), (1, 4, 4), "{:?}", r.scan);
    assert!(r.scan.partitions_busy >= 2, "{:?}", r.scan);
    let single = db.engine(options(1, CacheOptions::off())).await;
    let r1 = run(&single, sql).await;
    assert_eq!(lines(&r1), lines(&r));
    assert_eq!((r1.scan.partitions, r1.scan.partitions_busy, r1.scan.morsels_read), (1, 1, 1), "one partition needs no cutting: {:?}", r1.scan);
}

/// `SELECT x FROM t`'s scan, its `partitions` partitions driven by hand:
/// each takes the morsel at the head of the queue when it first needs data
/// and holds it until it has decoded it, so the first batches of the
/// partitions, asked for in turn, come from as many morsels. Returns the
/// rows each partition decoded and the sum of `x` over all.
async fn rows_per_partition(e: &Session, partitions: usize) -> (Vec<u64>, u64) {
    let physical = e.context().sql("SELECT x FROM t").await.unwrap().create_physical_plan().await.unwrap();
    let scan = find(&physical, "BlobScanExec").expect("a blobhouse scan");
    assert_eq!(scan.properties().output_partitioning().partition_count(), partitions);
    let task = e.context().task_ctx();
    let mut streams: Vec<_> = (0..partitions).map(|p| scan.execute(p, task.clone()).unwrap()).collect();
    let (mut rows, mut sum) = (vec![0u64; partitions], 0u64);
    let mut count = |p: usize, batch: datafusion::arrow::array::RecordBatch| {
        let x = batch.column(0).as_any().downcast_ref::<datafusion::arrow::array::Int64Array>().expect("x is BIGINT");
        rows[p] += x.len() as u64;
        sum += x.values().iter().map(|v| *v as u64).sum::<u64>();
    };
    for (p, stream) in streams.iter_mut().enumerate() {
        count(p, stream.next().await.expect("a first batch").unwrap());
    }
    for (p, stream) in streams.iter_mut().enumerate() {
        while let Some(batch) = stream.next().await {
            count(p, batch.unwrap());
        }
    }
    (rows, sum)
}

/// Row ids and deletion vectors are positions in the object; a morsel
/// starting in the middle of a row group must place its rows right.
async fn morsels_keep_row_ids_and_deletes(b: Backend) {
    let (_db, e) = one_row_group(b, "morsels-deletes").await;
    // Every 7th row and one whole stretch across the morsels' cuts.
    run(&e, "DELETE FROM t WHERE x % 7 = 0 OR x BETWEEN 99990 AND 100010").await;
    let r = run(&e, "SELECT count(*), sum(x) FROM t").await;
    let kept: Vec<u64> = (1..=ROWS).filter(|x| x % 7 != 0 && !(99_990..=100_010).contains(x)).collect();
    assert_eq!(lines(&r), vec![format!("{}|{}", kept.len(), kept.iter().sum::<u64>())]);
    assert!(r.scan.partitions_busy >= 2, "{:?}", r.scan);
    // An UPDATE finds its rows by row id, through every morsel.
    run(&e, "UPDATE t SET s = 'changed' WHERE x % 1000 = 1").await;
    let changed = run(&e, "SELECT count(*), min(x), max(x) FROM t WHERE s = 'changed'").await;
    let want: Vec<u64> = kept.iter().copied().filter(|x| x % 1000 == 1).collect();
    assert_eq!(lines(&changed), vec![format!("{}|{}|{}", want.len(), want[0], want[want.len() - 1])]);
    assert_eq!(scalar(&run(&e, "SELECT count(*) FROM t").await), kept.len().to_string());
}

/// The memory tier's decoded copy of a chunk is put together from the
/// morsels' pieces: a second run is served from it, with the same answer.
async fn the_memory_tier_is_filled_from_the_morsels(b: Backend) {
    let (db, _e) = one_row_group(b, "morsels-cache").await;
    let e = db.engine(options(4, CacheOptions { memory: Some(256 << 20), ..CacheOptions::default() })).await;
    let sql = "SELECT sum(x), count(*), min(s), max(s) FROM t WHERE x % 3 = 1";
    let first = run(&e, sql).await;
    assert_eq!(first.scan.morsels_read, 4, "{:?}", first.scan);
    let second = run(&e, sql).await;
    assert_eq!(lines(&second), lines(&first));
    assert_eq!(second.scan.cache_misses, 0, "every chunk from memory: {:?}", second.scan);
    assert!(second.scan.memory_hits >= 1, "{:?}", second.scan);
    // Still cut into morsels; which partitions take them is the
    // scheduler's (from memory one partition may drain all four before
    // another asks: seen in a cold CI run).
    assert_eq!(second.scan.morsels_read, 4, "{:?}", second.scan);
    let held = lines(&run(&e, "SHOW CACHE").await);
    assert!(held[0].starts_with("memory|"), "{held:?}");
    // From the third run on, rows come out of the decoded pieces, each
    // morsel's in its place: the same answer, and every row's columns
    // still belong together.
    let tiers = e.engine().tiers().unwrap();
    assert!(tiers.decoded_segments().0 >= 1, "x is held decoded after its second read");
    let third = run(&e, sql).await;
    assert_eq!(lines(&third), lines(&first));
    assert_eq!(scalar(&run(&e, "SELECT count(*) FROM t WHERE s <> 'row ' || x").await), "0");
    assert_eq!(scalar(&run(&e, "SELECT sum(x) FROM t WHERE x % 99991 = 0").await), (1..=ROWS).filter(|x| x % 99991 == 0).sum::<u64>().to_string());
}

/// Page-index pruning and morsels together: the morsels cut the selected
/// rows, not the row group, and the answer is the one without pruning.
async fn morsels_cut_what_the_page_index_selects(b: Backend) {
    let (_db, e) = one_row_group(b, "morsels-pages").await;
    let r = run(&e, "SELECT count(*), sum(x) FROM t WHERE x > 150000 AND x <= 390000").await;
    let want: u64 = (150_001..=390_000).sum();
    assert_eq!(lines(&r), vec![format!("240000|{want}")]);
    assert!(r.scan.rows_skipped_by_page_index > 0, "{:?}", r.scan);
    assert!(r.scan.morsels_read >= 2, "{:?}", r.scan);
}

crate::on_both_backends!(
    one_row_group_is_decoded_by_every_partition,
    morsels_keep_row_ids_and_deletes,
    the_memory_tier_is_filled_from_the_morsels,
    morsels_cut_what_the_page_index_selects
);

/// Many small row groups (under 100 000 rows: not worth cutting) are not
/// cut, and spread over every partition as they are.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_small_row_groups_reach_every_partition_uncut() {
    let db = TestDb::new(Backend::Local, "morsels-many");
    let mut o = options(4, CacheOptions::off());
    o.write.max_row_group_rows = Some(25_000);
    let e = db.engine(o).await;
    run(&e, &format!("CREATE TABLE t AS SELECT value AS x FROM generate_series(1, {ROWS}) ORDER BY value")).await;
    let r = run(&e, "SELECT sum(x) FROM t").await;
    // The writer cuts row groups near 25 000 rows (in whole slices, so sizes vary).
    assert!(r.scan.row_groups_read >= 12, "{:?}", r.scan);
    assert_eq!((r.scan.morsels_read, r.scan.partitions), (r.scan.row_groups_read, 4), "{:?}", r.scan);
    let plan = text(&run(&e, "EXPLAIN SELECT x FROM t").await);
    assert!(!plan.contains("morsels="), "{plan}");
    let (rows, sum) = rows_per_partition(&e, 4).await;
    assert!(rows.iter().all(|r| *r > 0), "every partition decoded a row group: {rows:?}");
    assert_eq!((rows.iter().sum::<u64>(), sum), (ROWS, (1..=ROWS).sum()));
}
