//! Storage format 2: commits whose metadata follows the change, opening
//! without listing the history, and version-1 databases that keep opening
//! and are upgraded by their next commit (docs/storage-format.md).

use blobhouse_engine::EngineOptions;
use blobhouse_testkit::audit::Request;

use crate::common::*;

/// Bytes of metadata PUT (everything but data objects) since the log was
/// cleared, and the PUTs.
/// blobhouse's own metadata PUT since the requests were cleared: the
/// Iceberg metadata written beside it (`iceberg/`) is counted apart
/// (`iceberg_written`).
fn metadata_written(db: &TestDb) -> (usize, Vec<String>) {
    let puts: Vec<(String, usize)> = db
        .audit
        .requests()
        .into_iter()
        .filter_map(|r| match r {
            Request::Put { path, bytes, .. } if !path.ends_with(".parquet") && !path.contains("iceberg/") => Some((path, bytes.expect("single PUTs for metadata"))),
            _ => None,
        })
        .collect();
    (puts.iter().map(|(_, b)| b).sum(), puts.into_iter().map(|(p, b)| format!("{p} ({b} B)")).collect())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_thousand_and_first_insert_writes_little_and_opening_takes_few_requests() {
    let db = TestDb::new(Backend::Local, "commit-cost");
    let e = db.engine(EngineOptions::default()).await;
    run(&e, "CREATE TABLE t (x BIGINT NOT NULL, note VARCHAR)").await;
    for i in 1..=1000 {
        run(&e, &format!("INSERT INTO t VALUES ({i}, 'row {i}')")).await;
    }
    db.audit.clear_requests();
    run(&e, "INSERT INTO t VALUES (1001, 'row 1001')").await;
    let (bytes, puts) = metadata_written(&db);
    eprintln!("the 1,001st commit wrote {bytes} bytes of metadata: {puts:?}");
    let iceberg: Vec<(String, usize)> = db
        .audit
        .requests()
        .into_iter()
        .filter_map(|r| match r {
            Request::Put { path, bytes, .. } if path.contains("iceberg/") => Some((path, bytes.unwrap_or(0))),
            _ => None,
        })
        .collect();
    // Iceberg's manifest list names every manifest (1,002 here; OPTIMIZE
    // merges them): reported, bounded loosely (docs/interop.md, cost).
    let iceberg_bytes: usize = iceberg.iter().map(|(_, b)| b).sum();
    eprintln!("and {iceberg_bytes} bytes of Iceberg metadata: {iceberg:?}");
    assert_eq!(iceberg.len(), 3, "a data manifest, the manifest list and the metadata file: {iceberg:?}");
    assert!(iceberg_bytes <= 256 << 10, "{iceberg:?}");
    assert!(bytes <= 64 << 10, "the 1,001st commit wrote {bytes} bytes of metadata: {puts:#?}");
    // In format 1 the same commit rewrote the whole manifest: 1,001 entries
    // of about the size of this commit's one-entry manifest file.


    db.audit.clear_requests();
    let fresh = db.engine(EngineOptions::default()).await;
    let opening = db.audit.requests();
    eprintln!("opening took {} requests: {opening:?}", opening.len());
    assert!(opening.len() <= 10, "opening took {} requests: {opening:#?}", opening.len());
    assert!(!opening.iter().any(|r| matches!(r, Request::List { prefix } if prefix.ends_with("catalog"))), "format 2 never lists catalog/: {opening:#?}");
    assert_eq!(scalar(&run(&fresh, "SELECT count(*) FROM t").await), "1001");
    assert_eq!(scalar(&run(&fresh, "SELECT sum(x) FROM t").await), "501501");

    // OPTIMIZE merges the 1,001 one-row objects (one of them with a deleted
    // row) into one, and the manifests with them.
    run(&e, "DELETE FROM t WHERE x = 500").await;
    let answer = "SELECT count(*), sum(x), min(note), max(note) FROM t WHERE x % 3 <> 0";
    let before = lines(&run(&e, answer).await);
    let reads = |db: &TestDb| {
        let requests = db.audit.requests();
        let gets = |ext: &str| requests.iter().filter(|r| matches!(r, Request::Get { path, .. } if path.ends_with(ext))).count();
        (gets(".parquet"), gets(".manifest.json"))
    };
    db.audit.clear_requests();
    let cold = db.engine(EngineOptions::default()).await;
    assert_eq!(lines(&run(&cold, answer).await), before);
    let (data_before, manifests_before) = reads(&db);
    assert_eq!(scalar(&run(&e, "OPTIMIZE t").await), "1000", "rows rewritten");
    let version = e.engine().database().current();
    let t = &version.tables["t"];
    assert_eq!((t.objects, t.rows, t.manifests.len()), (1, 1000, 1), "{t:?}");
    assert!(t.removed.is_empty() && t.deletes.is_empty(), "{t:?}");
    db.audit.clear_requests();
    let cold = db.engine(EngineOptions::default()).await;
    assert_eq!(lines(&run(&cold, answer).await), before);
    let (data_after, manifests_after) = reads(&db);
    eprintln!("a cold scan before OPTIMIZE: {data_before} data GETs and {manifests_before} manifest GETs; after: {data_after} and {manifests_after}");
    // One GET per object (its two column chunks are adjacent: one request);
    // the object whose only row is deleted is not read at all.
    assert_eq!((data_before, manifests_before), (1000, 1001));
    assert_eq!((data_after, manifests_after), (1, 1));
    // Nothing to do the second time.
    assert_eq!(scalar(&run(&e, "OPTIMIZE t").await), "0");
}

/// The fixture of crates/tests/fixtures/v1-database, copied so that it can
/// be written to.
fn v1_copy() -> TestDb {
    fixture_copy("v1-database", "v1")
}

/// A copy of crates/tests/fixtures/`fixture` in a fresh local test database.
pub(crate) fn fixture_copy(fixture: &str, name: &str) -> TestDb {
    let db = TestDb::new(Backend::Local, name);
    let fixture = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures").join(fixture);
    copy_dir(&fixture, std::path::Path::new(&db.url));
    db
}

fn copy_dir(from: &std::path::Path, to: &std::path::Path) {
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            std::fs::create_dir_all(&target).unwrap();
            copy_dir(&entry.path(), &target);
        } else if entry.file_name() != "README.md" {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

const ACCOUNTS: &str = "SELECT id, owner, balance, opened FROM accounts ORDER BY id";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_1_database_opens_answers_the_same_and_is_upgraded_by_its_next_commit() {
    let db = v1_copy();
    let dir = std::path::PathBuf::from(&db.url);
    let e = db.engine(EngineOptions::default()).await;
    let tables = text(&run(&e, "SHOW TABLES").await);
    assert!(tables.contains("accounts") && tables.contains("notes") && !tables.contains("dropped"), "{tables}");
    let before = text(&run(&e, ACCOUNTS).await);
    for row in ["| 1  | ada   | 100.50  | 2020-01-02 |", "| 2  | bob   | 20.00   | 2021-03-04 |", "| 3  |       | 0.00    | 2022-05-06 |"] {
        assert!(before.contains(row), "{row} missing from\n{before}");
    }
    assert_eq!(text(&run(&e, "SELECT * FROM notes ORDER BY id").await).matches('!').count(), 2);
    assert!(!dir.join("log").exists(), "reading writes nothing");

    // The next commit upgrades: version 7 in catalog/ (where version-1
    // binaries look, and then refuse a newer format), as a format-2 checkpoint.
    run(&e, "INSERT INTO accounts VALUES (4, 'cy', 7.25, DATE '2023-07-08')").await;
    let upgrade: serde_json::Value = serde_json::from_slice(&std::fs::read(dir.join("catalog/00000000000000000007.json")).unwrap()).unwrap();
    assert_eq!(upgrade["format_version"], blobhouse_storage::format::FORMAT_VERSION);
    assert!(upgrade["seal"].is_string(), "the upgrade is sealed: {upgrade}");
    assert!(upgrade["checkpoint"].is_null(), "the upgrade is a checkpoint: {upgrade}");
    // Version 1's manifests are reused as manifest files, not rewritten.
    assert_eq!(upgrade["tables"]["accounts"]["manifests"].as_array().unwrap().len(), 2);

    run(&e, "INSERT INTO accounts VALUES (5, 'di', 1.00, DATE '2024-09-10')").await;
    assert!(dir.join("log/00000000000000000/00000000000000000008.json").exists(), "after the upgrade, versions go to log/");
    assert!(!dir.join("catalog/00000000000000000008.json").exists());

    let fresh = db.engine(EngineOptions::default()).await;
    let after = text(&run(&fresh, ACCOUNTS).await);
    assert!(after.starts_with(&before[..before.rfind("\n+--").unwrap()]), "old rows unchanged:\n{after}");
    assert_eq!(scalar(&run(&fresh, "SELECT count(*) FROM accounts").await), "5");
    assert_eq!(scalar(&run(&fresh, "SELECT sum(balance) FROM accounts").await), "128.75");

    // Range filters over objects without histograms (version 1's) and with
    // them (the two new ones) together, and a join above one: estimates
    // fall back to the zone maps, answers stay exact.
    let ranged = "SELECT count(*), sum(balance) FROM accounts WHERE opened >= DATE '2021-01-01' AND opened < DATE '2024-01-01' AND id > 1";
    assert_eq!(lines(&run(&fresh, ranged).await), ["3|27.25"]);
    let joined = "SELECT n.note FROM notes n JOIN accounts a ON a.id = n.id WHERE a.opened < DATE '2021-01-01' AND a.balance > 50";
    assert_eq!(lines(&run(&fresh, joined).await), ["ada!"]);
    let new_objects: Vec<String> = walk(&dir.join("objects")).into_iter().filter(|p| p.to_string_lossy().ends_with(".manifest.json")).map(|p| std::fs::read_to_string(p).unwrap()).collect();
    assert!(new_objects.iter().any(|m| m.contains("\"quantiles\"")), "the new objects carry histograms");
    assert!(new_objects.iter().any(|m| !m.contains("\"quantiles\"")), "version 1's do not");
}

/// Every file under `dir`.
pub(crate) fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() { out.extend(walk(&path)) } else { out.push(path) }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_version_or_a_missing_checkpoint_is_named_in_the_error() {
    let db = TestDb::new(Backend::Local, "damaged-version");
    let e = db.engine(EngineOptions::default()).await;
    run(&e, "CREATE TABLE t (x BIGINT)").await;
    run(&e, "INSERT INTO t VALUES (1)").await;
    let dir = std::path::PathBuf::from(&db.url);
    let bucket = dir.join("log/00000000000000000");
    let open = || blobhouse_engine::Session::open_location(db.location.clone(), db.store_options.clone(), EngineOptions::default());

    // Version 2 is a delta over checkpoint 1: without it, it cannot be read.
    let checkpoint = bucket.join("00000000000000000001.json");
    let saved = std::fs::read(&checkpoint).unwrap();
    std::fs::remove_file(&checkpoint).unwrap();
    let err = open().await.err().expect("opening must fail").to_string();
    assert!(err.contains("has no version 1"), "{err}");
    std::fs::write(&checkpoint, saved).unwrap();

    // A truncated newest version.
    let newest = bucket.join("00000000000000000002.json");
    let body = std::fs::read(&newest).unwrap();
    std::fs::write(&newest, &body[..body.len() / 2]).unwrap();
    let err = open().await.err().expect("opening must fail").to_string();
    assert!(err.contains("corrupt object") && err.contains("00000000000000000002.json"), "{err}");
}

async fn readings_manifest(e: &blobhouse_engine::Session) -> std::sync::Arc<blobhouse_storage::format::Manifest> {
    let current = e.engine().database().current();
    e.engine().database().manifest(&current.tables["readings"]).await.unwrap()
}

/// Reads of the byte range `at` of some data object so far.
fn reads_of(db: &TestDb, e: &blobhouse_engine::Session, at: std::ops::Range<u64>) -> usize {
    data_reads(db, e).into_iter().filter(|(_, r)| r.as_ref() == Some(&at)).count()
}

/// The page index moved out of the manifest. Objects of the builds that kept
/// it inline (the fixture crates/tests/fixtures/v2-inline-page-index) keep
/// pruning pages from the manifest alone, with no GET for it; objects
/// written now record only where their index lies, and a scan reads it from
/// the object once, on the first filtered scan that reaches the object.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inline_page_indexes_keep_pruning_and_new_objects_read_theirs_once() {
    let db = fixture_copy("v2-inline-page-index", "inline-page-index");
    let e = db.engine(EngineOptions::default()).await;
    let old = readings_manifest(&e).await;
    assert_eq!(old.objects.len(), 1);
    let inline = old.objects[0].clone();
    assert!(inline.page_index.is_some() && inline.page_index_at.is_none(), "the fixture keeps its page index inline");

    let narrow = "SELECT count(*), sum(bucket), count(DISTINCT label) FROM readings WHERE id BETWEEN 100 AND 200";
    let r = run(&e, narrow).await;
    assert_eq!(lines(&r), ["101|0|7"]);
    assert!(r.scan.rows_skipped_by_page_index >= 25_000, "skipped {} of 50 000 rows", r.scan.rows_skipped_by_page_index);
    assert_eq!(r.scan.page_index_reads, 0, "an inline page index is not read from the object");
    assert_eq!(data_reads(&db, &e).len() as u64, r.scan.get_requests, "the only data GETs are the scan's chunks");

    // Rows written now: the new object keeps only the index's place.
    run(&e, "INSERT INTO readings SELECT id + 50000, bucket + 50, label FROM readings").await;
    let both = readings_manifest(&e).await;
    let fresh = both.objects.iter().find(|o| o.path != inline.path).expect("the new object").clone();
    let at = fresh.page_index_at.expect("the new object records where its page index lies");
    assert!(fresh.page_index.is_none(), "new manifests do not carry page-index bytes");
    let on_disk = std::fs::read_to_string(walk(&std::path::PathBuf::from(&db.url).join("objects")).into_iter().find(|p| p.to_string_lossy().ends_with(".manifest.json") && std::fs::read_to_string(p).unwrap().contains(&fresh.path)).unwrap()).unwrap();
    assert!(!on_disk.contains("\"bytes\""), "{on_disk}");

    // A fresh engine (nothing cached): an unfiltered scan reads no index; the
    // first filtered scan reaching the new object reads its index once, the
    // old object's zone maps keep it out (ids < 50 000).
    let cold = db.engine(EngineOptions::default()).await;
    assert_eq!(run(&cold, "SELECT count(*) FROM readings").await.scan.page_index_reads, 0);
    let upper = "SELECT count(*), sum(bucket), count(DISTINCT label) FROM readings WHERE id BETWEEN 50100 AND 50200";
    let first = run(&cold, upper).await;
    assert_eq!(lines(&first), ["101|5050|7"]);
    assert_eq!(first.scan.page_index_reads, 1);
    assert!(first.scan.rows_skipped_by_page_index >= 25_000, "skipped {}", first.scan.rows_skipped_by_page_index);
    let plan = text(&run(&cold, &format!("EXPLAIN {narrow}")).await);
    assert!(!plan.contains("page_index_reads="), "the old object's index is inline: {plan}");
    let again = run(&cold, upper).await;
    assert_eq!((lines(&again), again.scan.page_index_reads), (lines(&first), 0), "the index is kept with the footer");
    assert_eq!(reads_of(&db, &cold, at.range()), 1, "one GET of the page index in all");
    // Both objects in one scan, each pruned by its own kind of index.
    let spanning = run(&cold, "SELECT count(*) FROM readings WHERE id BETWEEN 40000 AND 60000").await;
    assert_eq!(scalar(&spanning), "20001");
    let full = run(&cold, "SELECT sum(CASE WHEN id BETWEEN 40000 AND 60000 THEN 1 ELSE 0 END) FROM readings").await;
    assert_eq!((scalar(&full), full.scan.rows_skipped_by_page_index), ("20001".to_string(), 0));
}
