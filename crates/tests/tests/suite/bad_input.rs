//! Bad input gets a clear error naming what failed; nothing committed is lost
//! and nothing half-written becomes visible.

use std::time::{Duration, Instant};

use blobhouse_engine::{EngineOptions, Session};
use blobhouse_storage::{StoreOptions, open_location};
use blobhouse_testkit::MinioServer;
use object_store::path::Path;
use object_store::{ObjectStoreExt, PutPayload};

use crate::common::*;
use crate::on_both_backends;

on_both_backends!(missing_tables_and_type_errors, malformed_csv_names_the_line_and_changes_nothing, corrupt_objects_are_reported);

async fn open_err(url: &str, opts: &StoreOptions) -> String {
    match Session::open(url, opts, EngineOptions::default()).await {
        Ok(_) => panic!("opening {url} should fail"),
        Err(e) => e.to_string(),
    }
}

#[tokio::test]
async fn wrong_credentials_are_named() {
    let minio = MinioServer::shared();
    let mut opts = minio_options(minio);
    opts.secret_access_key = Some("not-the-secret".into());
    let url = minio.fresh_url("creds");
    let err = open_err(&url, &opts).await;
    assert!(err.contains(&url), "{err}");
    assert!(err.contains("credentials"), "{err}");
    assert!(!err.contains("not-the-secret"), "the secret leaked into the error: {err}");
}

#[tokio::test]
async fn missing_bucket_is_named() {
    let minio = MinioServer::shared();
    let err = open_err("s3://no-such-bucket-here/db", &minio_options(minio)).await;
    assert!(err.contains("s3://no-such-bucket-here/db"), "{err}");
    assert!(err.contains("bucket does not exist"), "{err}");
}

#[tokio::test]
async fn unreachable_endpoint_is_named_quickly() {
    let opts = StoreOptions { endpoint: Some("http://127.0.0.1:9".into()), access_key_id: Some("k".into()), secret_access_key: Some("s".into()), ..Default::default() };
    let started = Instant::now();
    let err = open_err("s3://bucket/db", &opts).await;
    assert!(err.contains("endpoint did not answer"), "{err}");
    assert!(started.elapsed() < Duration::from_secs(60), "took {:?}", started.elapsed());
}

#[tokio::test]
async fn bad_urls_are_explained() {
    let err = open_err("ftp://x/y", &StoreOptions::default()).await;
    assert!(err.contains("unsupported scheme 'ftp'"), "{err}");
    let err = open_err("s3:///nobucket", &StoreOptions::default()).await;
    assert!(err.contains("missing bucket"), "{err}");
}

async fn missing_tables_and_type_errors(b: Backend) {
    let db = TestDb::new(b, "errors");
    let e = db.engine(EngineOptions::default()).await;
    let err = fail(&e, "SELECT * FROM nope").await;
    assert!(err.contains("nope"), "{err}");
    let err = fail(&e, "INSERT INTO nope VALUES (1)").await;
    assert!(err.contains("nope"), "{err}");
    let err = fail(&e, "DROP TABLE nope").await;
    assert!(err.contains("'nope' does not exist"), "{err}");
    let err = fail(&e, "COPY nope FROM '/tmp/x.csv'").await;
    assert!(err.contains("'nope' does not exist"), "{err}");
    run(&e, "CREATE TABLE t (a INT NOT NULL)").await;
    run(&e, "INSERT INTO t VALUES (1)").await;
    let err = fail(&e, "INSERT INTO t VALUES ('abc')").await;
    assert!(err.to_lowercase().contains("cast") || err.contains("abc"), "{err}");
    let err = fail(&e, "INSERT INTO t VALUES (NULL)").await;
    assert!(err.to_lowercase().contains("null"), "{err}");
    let err = fail(&e, "SELECT a + 'x' FROM t").await;
    assert!(!err.is_empty());
    assert_eq!(scalar(&run(&e, "SELECT count(*) FROM t").await), "1");
}

async fn malformed_csv_names_the_line_and_changes_nothing(b: Backend) {
    let db = TestDb::new(b, "csv");
    let e = db.engine(EngineOptions::default()).await;
    run(&e, "CREATE TABLE t (a INT NOT NULL, b VARCHAR)").await;
    run(&e, "INSERT INTO t VALUES (1, 'one'), (2, 'two')").await;
    let version = e.engine().database().refresh().await.unwrap().version;
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("bad.csv");
    let mut text = String::from("a,b\n");
    for i in 0..20000 {
        text.push_str(&format!("{i},row {i}\n"));
    }
    text.push_str("oops,bad row\n"); // line 20002 of the file
    std::fs::write(&csv, text).unwrap();
    let err = fail(&e, &format!("COPY t FROM '{}'", csv.display())).await;
    assert!(err.contains("bad.csv"), "{err}");
    assert!(err.contains("line 20002"), "{err}");
    // A column type that could never be stored is refused when the table is made.
    let err = fail(&e, "CREATE TABLE iv (d INTERVAL)").await;
    assert!(err.contains("INTERVAL columns cannot be stored") && err.contains("'d'"), "{err}");
    // Without a header the first line is line 1, not the reader's line 0.
    let first = dir.path().join("first.csv");
    std::fs::write(&first, "x,1\n2,two\n").unwrap();
    let err = fail(&e, &format!("COPY t FROM '{}' WITH (FORMAT csv, HEADER false)", first.display())).await;
    assert!(err.contains("at line 1.") && !err.contains("line 0"), "{err}");
    assert_eq!(scalar(&run(&e, "SELECT count(*) FROM t").await), "2");
    assert_eq!(e.engine().database().refresh().await.unwrap().version, version, "a failed COPY must not commit");
}

async fn corrupt_objects_are_reported(b: Backend) {
    let db = TestDb::new(b, "corrupt");
    let e = db.engine(EngineOptions::default()).await;
    run(&e, "CREATE TABLE t AS SELECT value AS v FROM generate_series(1, 1000)").await;
    let current = e.engine().database().current();
    let entry = &current.tables["t"];
    let manifest = e.engine().database().manifest(entry).await.unwrap();
    let object = &manifest.objects[0];
    // Damage the store behind blobhouse's back (not through the audited store).
    let raw = open_location(&db.url, &db.store_options).unwrap();
    let child = |rel: &str| Path::from(format!("{}/{rel}", raw.prefix).trim_start_matches('/').to_string());
    let bytes = raw.store.get(&child(&object.path)).await.unwrap().bytes().await.unwrap();
    raw.store.delete(&child(&object.path)).await.unwrap();
    raw.store.put(&child(&object.path), PutPayload::from(bytes.slice(..bytes.len() / 3))).await.unwrap();
    let err = fail(&e, "SELECT sum(v) FROM t").await;
    assert!(err.contains(&object.path), "error does not name the object: {err}");

    let manifest_file = blobhouse_storage::versions::manifest_path(&entry.manifests[0]);
    raw.store.delete(&child(&manifest_file)).await.unwrap();
    raw.store.put(&child(&manifest_file), PutPayload::from_static(b"{ not json")).await.unwrap();
    let fresh = db.engine(EngineOptions::default()).await; // no cached manifest
    let err = fail(&fresh, "SELECT sum(v) FROM t").await;
    assert!(err.contains("corrupt object") && err.contains(&manifest_file), "{err}");
}
