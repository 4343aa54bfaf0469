//! Garbage collection: VACUUM deletes exactly what no retained version or
//! snapshot references, defers what only snapshots keep, and expires old
//! versions (docs/lifecycle.md).

use std::collections::BTreeSet;

use blobhouse_engine::{EngineOptions, Session};
use blobhouse_testkit::Request;

use crate::common::*;
use crate::on_every_store_encrypted_too;

on_every_store_encrypted_too!(
    vacuum_deletes_exactly_what_nothing_retained_references,
    concurrent_vacuums_writers_and_snapshot_readers,
    crash_harness_short_mode,
    expired_versions_outlive_the_grace_period,
    a_commit_on_a_fresh_base_never_lands_in_a_gap_vacuum_left,
    a_refusal_on_a_fresh_base_is_decided_again_on_the_newest_version
);

/// Every object under `objects/`, relative to the database root.
pub(crate) async fn stored(db: &TestDb) -> BTreeSet<String> {
    stored_under(db, "objects").await
}

/// Every object under `dir/`, relative to the database root.
pub(crate) async fn stored_under(db: &TestDb, dir: &str) -> BTreeSet<String> {
    let prefix = db.location.child(dir);
    let root = db.location.prefix.to_string();
    let metas: Vec<_> = futures::TryStreamExt::try_collect(db.location.store.list(Some(&prefix))).await.unwrap();
    metas
        .into_iter()
        .map(|m| {
            let p = m.location.to_string();
            p.strip_prefix(&format!("{root}/")).map(str::to_string).unwrap_or(p)
        })
        .collect()
}

/// The store holds exactly what the newest version and the snapshots
/// reference (`blobhouse_storage::gc::audit`).
pub(crate) async fn assert_nothing_unreferenced(_db: &TestDb, e: &Session, when: &str) {
    let (missing, left) = blobhouse_storage::gc::audit(e.engine().database()).await.unwrap();
    assert!(missing.is_empty(), "{when}: referenced but gone: {missing:?}");
    assert!(left.is_empty(), "{when}: unreferenced but left: {left:?}");
}

async fn vacuum_deletes_exactly_what_nothing_retained_references(b: Backend) {
    let db = TestDb::new(b, "vacuum");
    let e = db.engine(EngineOptions::default()).await;
    run(&e, "CREATE TABLE t (id INT, v VARCHAR)").await;
    for i in 0..4 {
        run(&e, &format!("INSERT INTO t VALUES ({i}, 'v{i}'), ({}, 'w{i}')", i + 10)).await;
    }
    let early = e.engine().database().current().version;
    run(&e, "DELETE FROM t WHERE id = 1").await;
    run(&e, "DELETE FROM t WHERE id = 11").await; // replaces the object's vector
    run(&e, "UPDATE t SET v = 'u' WHERE id = 2").await;
    run(&e, "CREATE SNAPSHOT keep").await;
    let at_snapshot = lines(&run(&e, "SELECT * FROM t ORDER BY id").await);
    run(&e, "CREATE TABLE gone AS SELECT * FROM t").await;
    run(&e, "DROP TABLE gone").await;
    run(&e, "OPTIMIZE t").await;
    run(&e, "DELETE FROM t WHERE id = 13").await;
    let now = lines(&run(&e, "SELECT * FROM t ORDER BY id").await);

    // SHOW STORAGE: live bytes by table, what the snapshot pins, what
    // awaits VACUUM.
    let storage = lines(&run(&e, "SHOW STORAGE").await);
    let row = |kind: &str| storage.iter().find(|l| l.starts_with(kind)).cloned().unwrap_or_default();
    let bytes = |line: String| line.rsplit('|').next().unwrap().parse::<u64>().unwrap();
    assert!(row("table|t|").split('|').nth(2).unwrap().parse::<u64>().unwrap() >= 1, "{storage:?}");
    assert!(bytes(row("snapshot|keep|")) > 0, "{storage:?}");
    let awaiting = bytes(row("awaiting vacuum|data objects"));
    assert!(awaiting > 0, "the dropped table and the rewritten objects await VACUUM: {storage:?}");

    // A dry run lists what it would delete, and deletes nothing.
    let from = db.audit.requests().len();
    let plan = run(&e, "VACUUM RETAIN '0 seconds' DRY RUN").await;
    assert!(plan.rows() > 0);
    assert!(text(&plan).contains("no longer listed"), "{}", text(&plan));
    assert!(!db.audit.requests()[from..].iter().any(|r| matches!(r, Request::Delete { .. } | Request::Put { .. })), "a dry run wrote");

    // The real one: the snapshot's objects stay, the dropped table's go.
    let r = lines(&run(&e, "VACUUM RETAIN '0 seconds'").await);
    let fields: Vec<u64> = r[0].split('|').map(|x| x.parse().unwrap()).collect();
    assert!(fields[6] > 0 && fields[5] > 0, "deleted and deferred something: {r:?}");
    assert_nothing_unreferenced(&db, &e, "after VACUUM").await;
    assert_eq!(lines(&run(&e, "SELECT * FROM t ORDER BY id").await), now);
    assert_eq!(lines(&run(&e, "SELECT * FROM t AT(SNAPSHOT => 'keep') ORDER BY id").await), at_snapshot);
    let err = fail(&e, &format!("SELECT * FROM t AT(VERSION => {early})")).await;
    assert!(err.contains("expired"), "{err}");
    assert!(fail(&e, &format!("RESTORE DATABASE TO VERSION {early}")).await.contains("expired"));
    // A new handle opens the vacuumed database and reads the same.
    let fresh = db.engine(EngineOptions::default()).await;
    assert_eq!(lines(&run(&fresh, "SELECT * FROM t ORDER BY id").await), now);

    // Dropping the snapshot lets the next VACUUM take what only it kept.
    run(&e, "DROP SNAPSHOT keep").await;
    run(&e, "VACUUM RETAIN '0 seconds'").await;
    assert_nothing_unreferenced(&db, &e, "after the snapshot was dropped").await;
    let storage = lines(&run(&e, "SHOW STORAGE").await);
    assert!(storage.iter().any(|l| l.starts_with("awaiting vacuum|data objects") && l.ends_with("|0|0")), "nothing awaits after VACUUM: {storage:?}");
    assert_eq!(lines(&run(&fresh, "SELECT * FROM t ORDER BY id").await), now);
    // Default retention keeps everything this young.
    run(&e, "DELETE FROM t").await;
    let before = stored(&db).await;
    run(&e, "VACUUM").await;
    assert!(stored(&db).await.is_superset(&before.into_iter().filter(|p| !p.ends_with(".gc.json")).collect()));
    run(&e, "BEGIN").await;
    assert!(fail(&e, "VACUUM").await.contains("inside a transaction"));
    run(&e, "ROLLBACK").await;
}

/// The numbers of the version objects in `log/`.
async fn logged_versions(db: &TestDb) -> BTreeSet<u64> {
    let log = db.location.child("log");
    let metas: Vec<_> = futures::TryStreamExt::try_collect(db.location.store.list(Some(&log))).await.unwrap();
    metas.iter().filter_map(|m| m.location.filename()?.strip_suffix(".json")?.parse().ok()).collect()
}

/// A version expires at the horizon, but its object stays until its
/// successor is older than GRACE: a writer that saw it as the newest may
/// still be putting the next version, which must not land in a gap
/// (`database::FRESH_BASE`). A later VACUUM takes what an earlier one kept
/// back; the checkpoint the horizon's delta needs stays.
async fn expired_versions_outlive_the_grace_period(b: Backend) {
    let db = TestDb::new(b, "expiry");
    let e = db.engine(EngineOptions::default()).await;
    run(&e, "CREATE TABLE t (id INT)").await;
    for i in 0..5 {
        run(&e, &format!("INSERT INTO t VALUES ({i})")).await;
    }
    let written = logged_versions(&db).await;
    assert_eq!(written.len(), 6, "{written:?}");
    let horizon = |r: &blobhouse_engine::QueryResult| lines(r)[0].split('|').nth(1).unwrap().parse::<u64>().unwrap();

    // GRACE '1 day' (the default): the versions expire, their objects stay.
    let first = horizon(&run(&e, "VACUUM RETAIN '0 seconds'").await);
    assert_eq!(first, *written.last().unwrap(), "RETAIN 0 moves the horizon to the newest version");
    assert!(fail(&e, "SELECT * FROM t AT(VERSION => 2)").await.contains("expired"));
    assert!(logged_versions(&db).await.is_superset(&written), "no version object goes before its successor is a GRACE old");

    // GRACE 0: the next VACUUM deletes them, all but the checkpoint its
    // horizon's delta is read against.
    run(&e, "INSERT INTO t VALUES (5)").await;
    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    let second = horizon(&run(&e, "VACUUM RETAIN '0 seconds' GRACE '0 seconds'").await);
    assert!(second > first);
    let relative = blobhouse_storage::versions::log_path(second);
    let object = db.location.child(&relative);
    let body = object_store::ObjectStoreExt::get(&db.location.store, &object).await.unwrap().bytes().await.unwrap();
    // As the database reads it (decrypted, when it is encrypted).
    let body = e.engine().database().decrypt(&relative, body).unwrap();
    let checkpoint = serde_json::from_slice::<serde_json::Value>(&body).unwrap()["checkpoint"].as_u64();
    let older: BTreeSet<u64> = logged_versions(&db).await.into_iter().filter(|v| *v < second).collect();
    assert_eq!(older, checkpoint.into_iter().collect(), "versions before the horizon {second} left behind");
    assert_eq!(lines(&run(&e, "SELECT count(*) FROM t").await), vec!["6"]);
    let fresh = db.engine(EngineOptions::default()).await;
    assert_eq!(lines(&run(&fresh, "SELECT count(*) FROM t").await), vec!["6"]);
}

/// A commit builds on the version its handle saw to be the newest less
/// than `FRESH_BASE` ago, without listing again. Meanwhile another handle
/// commits twice and VACUUMs with RETAIN 0: the horizon passes the stale
/// base, but the version after it keeps its object (GRACE), so the stale
/// put-if-absent is refused and the commit re-applied on the newest
/// version — had VACUUM deleted that object, the put would have landed in
/// the gap, committed in a version no reader ever reads.
async fn a_commit_on_a_fresh_base_never_lands_in_a_gap_vacuum_left(b: Backend) {
    let db = TestDb::new(b, "gap");
    let stale = db.engine(EngineOptions::default()).await;
    let other = db.engine(EngineOptions::default()).await;
    run(&stale, "CREATE TABLE t (id INT)").await;
    let seen = stale.engine().database().refresh().await.unwrap();
    let started = std::time::Instant::now();
    run(&other, "INSERT INTO t VALUES (1)").await;
    run(&other, "INSERT INTO t VALUES (2)").await;
    run(&other, "VACUUM RETAIN '0 seconds'").await;
    let newest = other.engine().database().current().version;
    assert!(newest >= seen.version + 3);

    db.audit.clear_requests();
    // CREATE TABLE late, through the storage layer (a statement would
    // refresh first).
    let mut txn = blobhouse_storage::Transaction::begin(stale.engine().database(), seen.clone());
    let schema = datafusion::arrow::datatypes::Schema::new(vec![datafusion::arrow::datatypes::Field::new("x", datafusion::arrow::datatypes::DataType::Int32, true)]);
    txn.create_table("late", schema, false, Vec::new()).await.unwrap();
    let outcome = txn.commit().await.unwrap();
    let blobhouse_storage::CommitOutcome::Committed(version) = outcome else { panic!("{outcome:?}") };
    assert_eq!(version.version, newest + 1, "re-applied on the newest version");
    if started.elapsed() < blobhouse_storage::database::FRESH_BASE {
        // The stale base was used (the point of the test): the first
        // request put the version after it, and was refused.
        let first = db.audit.requests().first().cloned();
        let expected = db.location.child(&blobhouse_storage::versions::log_path(seen.version + 1)).to_string();
        assert!(matches!(&first, Some(Request::Put { path, create: true, .. }) if *path == expected), "{first:?}");
    }
    let reader = db.engine(EngineOptions::default()).await;
    assert_eq!(lines(&run(&reader, "SELECT count(*) FROM late").await), vec!["0"]);
    assert_eq!(lines(&run(&reader, "SELECT count(*) FROM t").await), vec!["2"]);
}

/// What a commit on an unlisted (fresh) base refuses or finds to be a no-op
/// may be out of date; it is decided again on the newest version. Here
/// another handle created the snapshot after this one looked.
async fn a_refusal_on_a_fresh_base_is_decided_again_on_the_newest_version(b: Backend) {
    let db = TestDb::new(b, "refusal");
    let stale = db.engine(EngineOptions::default()).await;
    let other = db.engine(EngineOptions::default()).await;
    run(&stale, "CREATE TABLE t (id INT)").await;
    stale.engine().database().refresh().await.unwrap();
    run(&other, "CREATE SNAPSHOT s").await;
    use blobhouse_storage::{Change, CommitOutcome};
    let drop = Change::DropSnapshot { name: "s".into(), if_exists: false };
    let outcome = stale.engine().database().commit(std::slice::from_ref(&drop)).await.unwrap();
    assert!(matches!(outcome, CommitOutcome::Committed(_)), "{outcome:?}");
    assert!(lines(&run(&other, "SHOW SNAPSHOTS").await).is_empty());
    run(&other, "CREATE SNAPSHOT s").await;
    stale.engine().database().refresh().await.unwrap();
    run(&other, "DROP SNAPSHOT s").await;
    // Not a no-op on a base that still has it, nor an error: gone is gone.
    let again = Change::CreateSnapshot { name: "s".into(), version: None, created_at_ms: 0 };
    let outcome = stale.engine().database().commit(std::slice::from_ref(&again)).await.unwrap();
    assert!(matches!(outcome, CommitOutcome::Committed(_)), "{outcome:?}");
    assert_eq!(lines(&run(&other, "SHOW SNAPSHOTS").await).len(), 1);
}

/// Two writers, a reader of a snapshot, and two VACUUMs at once: the reader
/// never misses an object, the writers' rows all land, and afterwards
/// nothing reachable is gone and nothing unreachable is left.
async fn concurrent_vacuums_writers_and_snapshot_readers(b: Backend) {
    let db = TestDb::new(b, "vacuum-race");
    let e = db.engine(EngineOptions::default()).await;
    run(&e, "CREATE TABLE t (w INT, i INT)").await;
    run(&e, "INSERT INTO t SELECT 0, CAST(v AS INT) FROM generate_series(1, 100) AS s(v)").await;
    run(&e, "CREATE SNAPSHOT base").await;
    let writers: Vec<Session> = futures::future::join_all((0..2).map(|_| db.engine(EngineOptions::default()))).await;
    let vacuums: Vec<Session> = futures::future::join_all((0..2).map(|_| db.engine(EngineOptions::default()))).await;
    let reader = db.engine(EngineOptions::default()).await;
    let stop = std::sync::atomic::AtomicBool::new(false);
    let read = async {
        let mut reads = 0;
        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
            assert_eq!(lines(&run(&reader, "SELECT count(*), sum(i) FROM t AT(SNAPSHOT => 'base')").await), vec!["100|5050"]);
            reads += 1;
        }
        reads
    };
    let work = async {
        tokio::join!(write(&writers[0], 1), write(&writers[1], 2), vacuum(&vacuums[0]), vacuum(&vacuums[1]));
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
    };
    let (reads, ()) = tokio::join!(read, work);
    assert!(reads > 0);
    assert_eq!(lines(&run(&e, "SELECT w, count(*), sum(i) FROM t GROUP BY w ORDER BY w").await), vec!["0|100|5050", "1|12|66", "2|12|66"]);
    run(&e, "VACUUM RETAIN '0 seconds'").await;
    assert_nothing_unreferenced(&db, &e, "after racing VACUUMs").await;
    let deleted_data = db.audit.requests().iter().filter(|r| matches!(r, Request::Delete { path } if path.ends_with(".parquet") || path.ends_with(".dv"))).count();
    assert!(deleted_data > 10, "the VACUUMs deleted {deleted_data} data objects and vectors");
}

async fn write(e: &Session, w: i32) {
    for i in 0..12 {
        run(e, &format!("INSERT INTO t VALUES ({w}, {i}), ({w}, {})", i + 100)).await;
        // The other writer's OPTIMIZE may rewrite the object first: then the
        // DELETE fails as a serialization failure and is run again. So it is
        // when a VACUUM RETAIN '0 seconds' expired the version it read (the
        // retention contract; the error says so).
        let delete = format!("DELETE FROM t WHERE w = {w} AND i = {}", i + 100);
        loop {
            match e.execute(&delete).await {
                Ok(_) => break,
                Err(err) if err.to_string().contains("serialization failure") || err.to_string().contains("which a VACUUM expired") => continue,
                Err(err) => panic!("{delete}: {err}"),
            }
        }
        if i % 4 == 3 {
            // OPTIMIZE may lose to the other writer's DELETE: that is the rule.
            let _ = e.execute("OPTIMIZE t").await;
        }
    }
}

async fn vacuum(e: &Session) {
    for _ in 0..6 {
        // Conflicts between the two VACUUMs are re-planned inside.
        run(e, "VACUUM RETAIN '0 seconds'").await;
    }
}

/// `blobhouse bench crash`'s short mode: 100 trials, each a writer process
/// (this test binary, re-run as [`crash_worker`]) crashed at a fail point,
/// failed, killed with SIGKILL or left alone, checked against the oracle.
async fn crash_harness_short_mode(b: Backend) {
    let db = TestDb::new(b, "crash");
    let scratch = tempfile::tempdir().unwrap();
    let options = blobhouse_bench::crash::CrashOptions { trials: 100, seed: 7, check_every: 20, scratch: scratch.path().to_path_buf() };
    let command = || worker_command("lifecycle::crash_worker");
    let report = blobhouse_bench::crash::run(&db.url, &db.store_options, &options, &command, &|_| {}).await.expect("crash harness");
    eprintln!("{}", report.describe());
    assert!(report.violations.is_empty(), "{}", report.describe());
    assert_eq!(report.orphans_after_gc + report.missing_objects + report.torn_versions + report.lost_committed_rows, 0);
    // The trials did crash, and some of them committed and some did not.
    assert!(report.by_fault.get("crash").copied().unwrap_or(0) >= 20 && report.by_fault.get("kill -9").copied().unwrap_or(0) >= 10, "{:?}", report.by_fault);
    assert!(report.committed > 20 && report.committed < 100, "{} committed", report.committed);
}

/// A worker process of the crash harness (it sets the task and the fail
/// points in the environment); fails when run on its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a worker process, started by crash_harness_short_mode"]
async fn crash_worker() {
    match blobhouse_bench::crash::worker_from_env().await {
        Some(result) => result.expect("crash worker"),
        None => panic!("started by the crash harness, which sets {}", blobhouse_bench::crash::WORKER_ENV),
    }
}

/// Garbage collection racing real processes on MinIO: three writer
/// processes appending, two reader processes reading a snapshot taken
/// before they started (their answer is checked in SQL: a wrong count
/// divides by zero), and two processes running VACUUM RETAIN 0 in a loop.
/// No process fails, every row lands, and afterwards the store holds
/// exactly what is referenced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vacuums_race_writer_and_snapshot_reader_processes_on_minio() {
    let db = TestDb::new(Backend::Minio, "gc-processes");
    let e = db.engine(EngineOptions::default()).await;
    run(&e, "CREATE TABLE t (w INT, i INT)").await;
    run(&e, "INSERT INTO t SELECT 0, CAST(v AS INT) FROM generate_series(1, 100) AS s(v)").await;
    run(&e, "DELETE FROM t WHERE i > 90").await;
    run(&e, "CREATE SNAPSHOT base").await;
    run(&e, "OPTIMIZE t").await; // the snapshot now pins objects the table no longer uses
    let spawn = |statements: Vec<String>| {
        let task = blobhouse_bench::crash::WorkerTask { url: db.url.clone(), store: db.store_options.clone(), statements };
        let mut c = tokio::process::Command::from(worker_command("lifecycle::crash_worker"));
        c.env(blobhouse_bench::crash::WORKER_ENV, serde_json::to_string(&task).unwrap())
            .env("BLOBHOUSE_FAILPOINTS", "")
            .kill_on_drop(true);
        c.output()
    };
    let writers = (1..=3).map(|w| spawn((0..15).map(|i| format!("INSERT INTO t VALUES ({w}, {i}), ({w}, {})", i + 100)).collect()));
    let check = "SELECT 1 / CASE WHEN count(*) = 90 AND sum(i) = 4095 THEN 1 ELSE 0 END FROM t AT(SNAPSHOT => 'base')";
    let readers = (0..2).map(|_| spawn(vec![check.to_string(); 25]));
    let vacuums = (0..2).map(|_| spawn(vec!["VACUUM RETAIN '0 seconds'".to_string(); 6]));
    let outputs = futures::future::join_all(writers.chain(readers).chain(vacuums)).await;
    for out in outputs {
        let out = out.expect("worker ran");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(stdout.contains("CRASH-WORKER done"), "a worker failed: {stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    }
    let counts = lines(&run(&e, "SELECT w, count(*) FROM t GROUP BY w ORDER BY w").await);
    assert_eq!(counts, vec!["0|90", "1|30", "2|30", "3|30"]);
    let snapshot_version = e.engine().database().current().snapshots["base"].version;
    assert!(e.engine().database().refresh().await.unwrap().gc.horizon > snapshot_version + 10, "the VACUUM processes moved the horizon past the writers' commits");
    run(&e, "VACUUM RETAIN '0 seconds'").await;
    assert_nothing_unreferenced(&db, &e, "after the racing processes").await;
    assert_eq!(lines(&run(&e, "SELECT count(*), sum(i) FROM t AT(SNAPSHOT => 'base')").await), vec!["90|4095"]);
}
