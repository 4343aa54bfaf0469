//! Iceberg metadata (docs/interop.md): written for every commit where
//! Iceberg is on, switched by ALTER DATABASE, collected by VACUUM by
//! blobhouse's own rules, never naming a missing object. Other engines
//! reading it are tested in python/tests/test_iceberg.py (DuckDB,
//! pyiceberg).

use std::collections::BTreeSet;

use blobhouse_engine::{EngineOptions, Session};

use crate::common::*;
use crate::on_both_backends;

on_both_backends!(alter_database_switches_iceberg_and_on_writes_what_is_missing, vacuum_collects_iceberg_metadata_by_the_same_rules);

/// A commit whose Iceberg metadata cannot be written stands, and its
/// client is warned with what to run; the next ALTER DATABASE writes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_iceberg_write_warns_the_client_and_the_commit_stands() {
    let db = TestDb::new(Backend::Local, "iceberg-failure");
    let e = db.engine(EngineOptions::default()).await;
    run(&e, "CREATE TABLE t (id BIGINT)").await;
    // A file where the table folders go: every Iceberg write fails.
    let dir = std::path::PathBuf::from(db.url.strip_prefix("file://").unwrap_or(&db.url));
    std::fs::remove_dir_all(dir.join("iceberg/tables")).unwrap();
    std::fs::write(dir.join("iceberg/tables"), b"in the way").unwrap();
    let r = run(&e, "INSERT INTO t VALUES (1), (2)").await;
    let v = e.engine().database().current().version;
    assert_eq!(r.notices.len(), 1, "{:?}", r.notices);
    let notice = &r.notices[0].message;
    assert!(notice.contains(&format!("committed as version {v}")) && notice.contains("ALTER DATABASE SET iceberg = on"), "{notice}");
    assert_eq!(scalar(&run(&e, "SELECT count(*) FROM t").await), "2");
    // In an explicit transaction, COMMIT carries the warning.
    run(&e, "BEGIN").await;
    run(&e, "INSERT INTO t VALUES (3)").await;
    let r = run(&e, "COMMIT").await;
    assert!(r.notices.iter().any(|n| n.message.contains("Iceberg metadata was not written")), "{:?}", r.notices);
    assert_eq!(metadata_of(&e, "t").await, "");
    // Out of the way: ALTER DATABASE writes what is missing; later commits warn no more.
    std::fs::remove_file(dir.join("iceberg/tables")).unwrap();
    let answer = lines(&run(&e, "ALTER DATABASE SET iceberg = on").await);
    assert!(answer[0].starts_with("t|file://"), "{answer:?}");
    let r = run(&e, "INSERT INTO t VALUES (4)").await;
    assert!(r.notices.is_empty(), "{:?}", r.notices);
    assert!(!metadata_of(&e, "t").await.is_empty());
}

/// Every object under `iceberg/`, relative to the database.
async fn iceberg_objects(db: &TestDb) -> BTreeSet<String> {
    crate::lifecycle::stored_under(db, "iceberg").await
}

/// Requests under `iceberg/` since the audit log was cleared: (PUTs,
/// GETs and HEADs, LISTs).
fn iceberg_requests(db: &TestDb) -> (usize, usize, usize) {
    let mut n = (0, 0, 0);
    for r in db.audit.requests() {
        match r {
            blobhouse_testkit::Request::Put { path, .. } if path.contains("iceberg/") => n.0 += 1,
            blobhouse_testkit::Request::Get { path, .. } if path.contains("iceberg/") => n.1 += 1,
            blobhouse_testkit::Request::List { prefix } if prefix.contains("iceberg/") => n.2 += 1,
            _ => {}
        }
    }
    n
}

/// SHOW TABLES' `iceberg_metadata` of `table` (empty for NULL).
async fn metadata_of(e: &Session, table: &str) -> String {
    let found = lines(&run(e, "SHOW TABLES").await).into_iter().find_map(|l| l.strip_prefix(&format!("{table}|")).map(str::to_string));
    found.filter(|p| p != "NULL").unwrap_or_default()
}

async fn alter_database_switches_iceberg_and_on_writes_what_is_missing(b: Backend) {
    let db = TestDb::new(b, "iceberg-switch");
    let e = db.engine(EngineOptions::default()).await;
    // A new database has it on: each commit writes the metadata of what it changed.
    run(&e, "CREATE TABLE t (id BIGINT NOT NULL, name VARCHAR, price DECIMAL(10,2), d DATE)").await;
    run(&e, "INSERT INTO t VALUES (1, 'a', 1.50, '2020-01-01'), (2, 'b', 2.25, '2021-02-03')").await;
    let v = e.engine().database().current().version;
    assert!(metadata_of(&e, "t").await.ends_with(&format!("/metadata/v{v}.metadata.json")), "{}", text(&run(&e, "SHOW TABLES").await));

    // Off: commits write none, and SHOW TABLES no longer names a current one.
    assert_eq!(lines(&run(&e, "ALTER DATABASE SET iceberg = off").await), Vec::<String>::new());
    let before = iceberg_objects(&db).await;
    run(&e, "INSERT INTO t VALUES (3, 'c', 3.00, '2022-03-04')").await;
    run(&e, "DELETE FROM t WHERE id = 1").await;
    run(&e, "CREATE TABLE u (at TIMESTAMP, n INT)").await;
    assert_eq!(iceberg_objects(&db).await, before, "Iceberg off, yet commits wrote Iceberg objects");
    assert_eq!(metadata_of(&e, "t").await, "", "t's metadata is stale: SHOW TABLES must not name it");

    // On again: every table that can have it gets it now, one that cannot says why.
    let answer = lines(&run(&e, "ALTER DATABASE SET iceberg = on").await);
    let now = e.engine().database().current().version;
    assert_eq!(answer.len(), 2, "{answer:?}");
    assert!(answer[0].starts_with("t|") && answer[0].contains(&format!("/metadata/v{now}.metadata.json|")), "{answer:?}");
    assert!(answer[1].starts_with("u|NULL|") && answer[1].contains("column at") && answer[1].contains("nanosecond"), "{answer:?}");
    assert!(metadata_of(&e, "t").await.ends_with(&format!("v{now}.metadata.json")));
    assert_eq!(metadata_of(&e, "u").await, "");
    // Run again, it writes nothing: the metadata is current.
    let objects = iceberg_objects(&db).await;
    run(&e, "ALTER DATABASE SET iceberg = on").await;
    assert_eq!(iceberg_objects(&db).await, objects);
    // The metadata names the live rows only: 2 and 3 (1 was deleted), and
    // nothing it names is missing.
    let meta: serde_json::Value = {
        let uri = metadata_of(&e, "t").await;
        let relative = uri.rsplit_once("/iceberg/").map(|(_, r)| format!("iceberg/{r}")).unwrap();
        let bytes = e.engine().database().get(&db.location.child(&relative)).await.unwrap();
        serde_json::from_slice(&bytes).unwrap()
    };
    assert_eq!(meta["current-snapshot-id"], now);
    assert_eq!(meta["snapshots"].as_array().unwrap().last().unwrap()["summary"]["blobhouse-live-rows"], "2");
    assert_eq!(blobhouse_storage::iceberg::dangling(e.engine().database()).await.unwrap(), Vec::<(String, String)>::new());
    // A new handle (a new process) builds on what is there.
    let e2 = db.engine(EngineOptions::default()).await;
    db.audit.clear_requests();
    run(&e2, "INSERT INTO t VALUES (4, 'd', 4.00, '2023-01-01')").await;
    // Its cost: a data manifest, the manifest list and the metadata file
    // (3 PUTs); reading back the newest metadata and its manifest list
    // once per process (1 LIST, 2 GETs), then nothing.
    let cold = iceberg_requests(&db);
    assert_eq!(cold, (3, 2, 1), "a new handle's first INSERT: (PUTs, GETs, LISTs) under iceberg/");
    db.audit.clear_requests();
    run(&e2, "INSERT INTO t VALUES (5, 'e', 5.00, '2024-01-01')").await;
    assert_eq!(iceberg_requests(&db), (3, 0, 0), "the next INSERT: (PUTs, GETs, LISTs) under iceberg/");
    let v2 = e2.engine().database().current().version;
    assert!(metadata_of(&e2, "t").await.ends_with(&format!("v{v2}.metadata.json")));
    assert_eq!(blobhouse_storage::iceberg::dangling(e2.engine().database()).await.unwrap(), Vec::<(String, String)>::new());
    // Bad input says what is accepted.
    assert!(fail(&e, "ALTER DATABASE SET iceberg = maybe").await.contains("on, off, v2 or v3"));
    assert!(fail(&e, "ALTER DATABASE SET colour = on").await.contains("iceberg"));
}

async fn vacuum_collects_iceberg_metadata_by_the_same_rules(b: Backend) {
    let db = TestDb::new(b, "iceberg-vacuum");
    let e = db.engine(EngineOptions::default()).await;
    run(&e, "CREATE TABLE t (id BIGINT NOT NULL, v VARCHAR)").await;
    run(&e, "CREATE TABLE still (id BIGINT)").await;
    run(&e, "INSERT INTO still VALUES (1)").await;
    let still_version = e.engine().database().current().version;
    for i in 0..4 {
        run(&e, &format!("INSERT INTO t VALUES ({i}, 'v{i}'), ({}, 'w{i}')", i + 10)).await;
    }
    run(&e, "DELETE FROM t WHERE id = 1").await;
    run(&e, "DELETE FROM t WHERE id = 11").await; // replaces the object's vector
    run(&e, "CREATE SNAPSHOT keep").await;
    let kept_version = e.engine().database().current().version;
    run(&e, "UPDATE t SET v = 'u' WHERE id = 2").await;
    run(&e, "OPTIMIZE t").await;
    let (t_id, still_id) = {
        let v = e.engine().database().current();
        (v.tables["t"].id, v.tables["still"].id)
    };
    run(&e, "DROP TABLE still").await;
    let newest = e.engine().database().current().version;
    let before = iceberg_objects(&db).await;
    run(&e, "VACUUM RETAIN '0 seconds' GRACE '0 seconds'").await;
    let after = iceberg_objects(&db).await;
    let meta = |id: u64, v: u64| format!("iceberg/tables/{id:016x}/metadata/v{v}.metadata.json");
    for kept in [meta(t_id, newest - 1), meta(t_id, kept_version - 1), meta(still_id, still_version)] {
        assert!(before.contains(&kept), "{kept} was never written: {before:#?}");
        // t's newest (OPTIMIZE), and what the snapshot reads of t and of the since dropped `still`.
        assert!(after.contains(&kept), "VACUUM deleted {kept}, which a retained version needs: {after:#?}");
    }
    for expired in [meta(t_id, 1), meta(t_id, kept_version - 2), meta(still_id, still_version - 1)] {
        assert!(before.contains(&expired), "{expired} was never written");
        assert!(!after.contains(&expired), "VACUUM left {expired}: {after:#?}");
    }
    // The replaced vector's position delete file went with it.
    assert!(after.len() < before.len() && after.iter().filter(|p| p.ends_with(".pos.parquet")).count() < before.iter().filter(|p| p.ends_with(".pos.parquet")).count());
    // Without the snapshot, nothing of `still` is needed any more.
    run(&e, "DROP SNAPSHOT keep").await;
    run(&e, "VACUUM RETAIN '0 seconds' GRACE '0 seconds'").await;
    let last = iceberg_objects(&db).await;
    assert!(!last.iter().any(|p| p.contains(&format!("{still_id:016x}/"))), "the dropped table's metadata stayed: {last:#?}");
    assert!(last.contains(&meta(t_id, newest - 1)));
    // Whatever remains names nothing missing, and answers as blobhouse.
    assert_eq!(blobhouse_storage::iceberg::dangling(e.engine().database()).await.unwrap(), Vec::<(String, String)>::new());
    // The next commit builds on it.
    run(&e, "INSERT INTO t VALUES (100, 'x')").await;
    assert_eq!(blobhouse_storage::iceberg::dangling(e.engine().database()).await.unwrap(), Vec::<(String, String)>::new());
    // An object the metadata names, lost: `verify` names it and what names it.
    let verify = |e: &Session| {
        let db = e.engine().database().clone();
        async move { blobhouse_storage::verify::verify(&db, &|_| {}).await.unwrap() }
    };
    assert!(verify(&e).await.damaged.is_empty());
    let manifest = iceberg_objects(&db).await.into_iter().find(|p| p.ends_with(".m.avro")).unwrap();
    object_store::ObjectStoreExt::delete(db.location.store.as_ref(), &db.location.child(&manifest)).await.unwrap();
    let damaged = verify(&e).await.damaged;
    assert_eq!(damaged.len(), 1, "{damaged:?}");
    assert!(damaged[0].object.ends_with(&manifest) && damaged[0].reason.contains("snap-"), "{damaged:?}");
}
