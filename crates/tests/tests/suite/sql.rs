//! The SQL surface: DDL, DML, COPY, SHOW/DESCRIBE, EXPLAIN ANALYZE, reopening.

use blobhouse_engine::EngineOptions;
use object_store::{ObjectStoreExt, PutPayload};
use object_store::path::Path;

use crate::common::*;
use crate::on_both_backends;

on_both_backends!(ddl_and_dml_round_trip, copy_from_csv_and_parquet, explain_analyze_shows_scan_metrics);

async fn ddl_and_dml_round_trip(b: Backend) {
    let db = TestDb::new(b, "ddl");
    let e = db.engine(EngineOptions::default()).await;
    run(&e, "CREATE TABLE t (id BIGINT NOT NULL, name VARCHAR, price DECIMAL(10,2))").await;
    assert_eq!(scalar(&run(&e, "SELECT count(*) FROM t").await), "0");
    run(&e, "INSERT INTO t VALUES (1, 'a', 1.50), (2, NULL, 2.25)").await;
    run(&e, "INSERT INTO t SELECT id + 10, name, price * 2 FROM t").await;
    assert_eq!(scalar(&run(&e, "SELECT count(*) FROM t").await), "4");
    assert_eq!(scalar(&run(&e, "SELECT sum(price) FROM t").await), "11.25");
    assert_eq!(scalar(&run(&e, "SELECT count(name) FROM t").await), "2");
    run(&e, "CREATE TABLE t2 AS SELECT id, name FROM t WHERE id > 5").await;
    assert_eq!(scalar(&run(&e, "SELECT count(*) FROM t2").await), "2");
    let tables = text(&run(&e, "SHOW TABLES").await);
    assert!(tables.contains("| t ") && tables.contains("| t2 "), "{tables}");
    // The database's tables only, not DataFusion's information_schema views.
    assert!(!tables.contains("columns") && !tables.contains("information_schema"), "{tables}");
    let desc = text(&run(&e, "DESCRIBE t").await);
    // Types as SQL names, as they were written in CREATE TABLE.
    for row in ["| id          | BIGINT        | NO ", "| name        | VARCHAR       | YES", "| price       | DECIMAL(10,2) | YES"] {
        assert!(desc.contains(row), "{row} in\n{desc}");
    }
    run(&e, "DROP TABLE t2").await;
    let err = fail(&e, "SELECT * FROM t2").await;
    assert!(err.contains("t2"), "{err}");
    run(&e, "DROP TABLE IF EXISTS t2").await;
    run(&e, "CREATE TABLE IF NOT EXISTS t (x INT)").await;
    let err = fail(&e, "CREATE TABLE t (x INT)").await;
    assert!(err.contains("already exists"), "{err}");
    assert_eq!(scalar(&run(&e, "SELECT count(*) FROM t").await), "4");

    // A second handle (a new process would do the same) sees everything committed.
    let e2 = db.engine(EngineOptions::default()).await;
    assert_eq!(scalar(&run(&e2, "SELECT sum(id) FROM t").await), "26");
    let tables = text(&run(&e2, "SHOW TABLES").await);
    assert!(!tables.contains("| t2 "), "{tables}");
}

async fn copy_from_csv_and_parquet(b: Backend) {
    let db = TestDb::new(b, "copy");
    let e = db.engine(EngineOptions::default()).await;
    run(&e, "CREATE TABLE people (id INT NOT NULL, name VARCHAR, born DATE)").await;
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("people.csv");
    std::fs::write(&csv, "id|name|born\n1|ada|1815-12-10\n2|alan|1912-06-23\n3|grace|1906-12-09\n").unwrap();
    let source = match b {
        Backend::Local | Backend::LocalEncrypted => csv.to_string_lossy().to_string(),
        Backend::Minio | Backend::MinioEncrypted | Backend::Azurite | Backend::Gcs => {
            // Load straight from the object store.
            let url = format!("{}/people.csv", db.url);
            let loc = blobhouse_storage::open_location(&db.url, &db.store_options).unwrap();
            let path = Path::from(format!("{}/people.csv", loc.prefix));
            loc.store.put(&path, PutPayload::from(std::fs::read(&csv).unwrap())).await.unwrap();
            url
        }
    };
    let r = run(&e, &format!("COPY people FROM '{source}' WITH (FORMAT csv, HEADER true, DELIMITER '|')")).await;
    assert_eq!(scalar(&r), "3");
    assert_eq!(scalar(&run(&e, "SELECT name FROM people WHERE born < DATE '1900-01-01'").await), "ada");

    // Parquet written by DataFusion's COPY TO, loaded back by name.
    let pq = dir.path().join("people.parquet");
    run(&e, &format!("COPY (SELECT * FROM people) TO '{}' STORED AS PARQUET", pq.display())).await;
    run(&e, "CREATE TABLE people2 (id INT NOT NULL, name VARCHAR, born DATE)").await;
    assert_eq!(scalar(&run(&e, &format!("COPY people2 FROM '{}'", pq.display())).await), "3");
    assert_eq!(scalar(&run(&e, "SELECT count(*) FROM people2 JOIN people USING (id, name, born)").await), "3");
}

async fn explain_analyze_shows_scan_metrics(b: Backend) {
    let db = TestDb::new(b, "explain");
    let e = db.engine(EngineOptions::default()).await;
    run(&e, "CREATE TABLE n AS SELECT value AS v, value * 2 AS w FROM generate_series(1, 10000)").await;
    let plan = text(&run(&e, "EXPLAIN ANALYZE SELECT sum(v) FROM n WHERE v > 5000").await);
    for metric in ["BlobScanExec", "get_requests=", "bytes_fetched=", "row_groups_read=", "row_groups_pruned=", "bytes_skipped=", "retries=", "hedged=", "first_byte_time="] {
        assert!(plan.contains(metric), "EXPLAIN ANALYZE lacks {metric}:\n{plan}");
    }
    // On S3 the data ranges go through the download manager, elsewhere through object_store.
    let reader = if matches!(b, Backend::Minio) { "reader=download_manager" } else { "reader=object_store" };
    assert!(plan.contains(reader), "EXPLAIN ANALYZE lacks {reader}:\n{plan}");
    // The download manager's CPU during the scan (its loop threads).
    assert_eq!(plan.contains("download_cpu="), matches!(b, Backend::Minio), "{plan}");
}
