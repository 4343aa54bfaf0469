//! Files queried in place (docs/interop.md): a hive-partitioned Parquet
//! dataset and CSV files written by DuckDB, read by `read_parquet`,
//! `read_csv`, external tables and `COPY … FROM` globs, on a local
//! directory and on MinIO. Answers equal DuckDB's on the same files;
//! partition and row-group pruning are asserted from the requests the
//! engine sent (`EngineOptions::record_file_requests`) and, on MinIO, from
//! the download manager's own request log.

use std::path::Path;

use blobhouse_engine::{EngineOptions, FileRequest, Session};
use blobhouse_storage::open_location;
use object_store::{ObjectStoreExt, PutPayload};

use crate::common::*;
use crate::on_both_backends;

on_both_backends!(files_in_place_answer_as_duckdb_and_skip_what_filters_exclude);

/// Runs scripts/duckdb-files.py with `args`.
fn duckdb_files(args: &[&str]) -> Vec<String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let out = std::process::Command::new("python3").arg(root.join("scripts/duckdb-files.py")).args(args).output().expect("python3 runs");
    assert!(out.status.success(), "DuckDB failed (run scripts/install-test-deps.sh): {}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    text.split("==> ").filter(|s| !s.is_empty()).map(str::to_string).collect()
}

/// DuckDB's rows of a section (after its marker and header lines).
fn rows(section: &str) -> Vec<String> {
    section.lines().skip(2).map(str::to_string).collect()
}

/// Every file under `dir`, relative to it.
fn files_under(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let p = entry.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else {
                out.push(p.strip_prefix(dir).unwrap().to_string_lossy().to_string());
            }
        }
    }
    out.sort();
    out
}

/// Where the test's files are for blobhouse: the local directory, or a
/// copy of it in MinIO.
async fn place(backend: Backend, dir: &Path) -> (String, blobhouse_storage::StoreOptions) {
    match backend {
        Backend::Local => (dir.to_string_lossy().to_string(), Default::default()),
        _ => {
            let minio = blobhouse_testkit::MinioServer::shared();
            let options = minio_options(minio);
            let url = minio.fresh_url("files");
            let loc = open_location(&url, &options).unwrap();
            for rel in files_under(dir) {
                let body = std::fs::read(dir.join(&rel)).unwrap();
                let path = object_store::path::Path::from(format!("{}/{rel}", loc.prefix));
                loc.store.put(&path, PutPayload::from(body)).await.unwrap();
            }
            (url, options)
        }
    }
}

/// Bytes the GETs asked for (`whole` for an unbounded one).
fn read_bytes(gets: &[FileRequest], whole: u64) -> u64 {
    gets.iter().map(|g| g.range.as_ref().map_or(whole, |r| r.end - r.start)).sum()
}

/// The requests sent since `from`, GETs only.
fn gets_since(e: &Session, from: usize) -> Vec<FileRequest> {
    e.engine().file_requests().into_iter().skip(from).filter(|r| r.method == "GET").collect()
}

async fn files_in_place_answer_as_duckdb_and_skip_what_filters_exclude(backend: Backend) {
    let dir = tempfile::tempdir().unwrap();
    duckdb_files(&["write", &dir.path().to_string_lossy()]);
    let (files, store_options) = place(backend, dir.path()).await;
    let db = TestDb::new(backend, "files");
    // The files' store is reached with the database's store options.
    assert_eq!(db.store_options.endpoint, store_options.endpoint);
    let e = db.engine(EngineOptions::default()).await;

    // The same questions, in DuckDB's words and in ours.
    let pairs: [(&str, &str); 6] = [
        (
            "SELECT year, region, count(*), sum(id), CAST(round(sum(amount) * 10) AS BIGINT), min(name) FROM read_parquet('{files}/sales/*/*/*.parquet', hive_partitioning = true) GROUP BY year, region ORDER BY year, region",
            "SELECT year, region, count(*), sum(id), CAST(round(sum(amount) * 10) AS BIGINT), min(name) FROM read_parquet('{files}/sales/*/*/*.parquet', hive_partitioning => true) GROUP BY year, region ORDER BY year, region",
        ),
        (
            "SELECT count(*), sum(id), max(name) FROM read_parquet('{files}/sales/**/*.parquet', hive_partitioning = true) WHERE year = 2023 AND region = 'us'",
            "SELECT count(*), sum(id), max(name) FROM read_parquet('{files}/sales/**/*.parquet') WHERE year = 2023 AND region = 'us'",
        ),
        ("SELECT count(*), sum(v), min(s), max(s) FROM read_csv('{files}/csv/*.csv')", "SELECT count(*), sum(v), min(s), max(s) FROM read_csv('{files}/csv/*.csv')"),
        (
            "SELECT region, count(*), sum(id) FROM read_parquet('{files}/sales/*/*/*.parquet', hive_partitioning = true) WHERE year >= 2023 GROUP BY region ORDER BY region",
            "SELECT region, count(*), sum(id) FROM sales WHERE year >= 2023 GROUP BY region ORDER BY region",
        ),
        ("SELECT count(*), sum(id), sum(payload % 1000) FROM read_parquet('{files}/big.parquet') WHERE id BETWEEN 45000 AND 45099", "SELECT count(*), sum(id), sum(CAST(payload % 1000 AS BIGINT)) FROM read_parquet('{files}/big.parquet') WHERE id BETWEEN 45000 AND 45099"),
        ("SELECT count(*), sum(v), min(s), max(s) FROM read_csv('{files}/csv/*.csv')", "SELECT count(*), sum(v), min(s), max(s) FROM loaded"),
    ];
    let duck: Vec<&str> = pairs.iter().map(|(d, _)| *d).collect();
    let mut args = vec!["query", dir.path().to_str().unwrap()];
    args.extend(duck.iter().copied());
    let expected = duckdb_files(&args);
    let ours = |i: usize| pairs[i].1.replace("{files}", &files);

    run(&e, &format!("CREATE EXTERNAL TABLE sales STORED AS PARQUET LOCATION '{files}/sales/'")).await;
    run(&e, "CREATE TABLE loaded (id BIGINT, v BIGINT, s VARCHAR)").await;
    let copied = run(&e, &format!("COPY loaded FROM '{files}/csv/*.csv' WITH (HEADER true)")).await;
    assert_eq!(scalar(&copied), "100", "notes.txt is not a *.csv");
    for i in 0..pairs.len() {
        let r = run(&e, &ours(i)).await;
        assert_eq!(lines(&r), rows(&expected[i]), "query {i}: {}", ours(i));
    }

    // Pruning, seen from the requests of an engine whose caches are cold
    // (another process): the external table's definition holds its
    // columns, so a filter on the partition columns reads that
    // partition's file and no other.
    let cold = db.engine(EngineOptions { record_file_requests: true, ..EngineOptions::default() }).await;
    let r = run(&cold, "SELECT count(*), sum(id), max(name) FROM sales WHERE year = 2023 AND region = 'us'").await;
    assert_eq!(lines(&r), rows(&expected[1]));
    let gets = gets_since(&cold, 0);
    eprintln!("files, one partition: {} GETs, {} bytes", gets.len(), read_bytes(&gets, 0));
    assert!(!gets.is_empty() && gets.iter().all(|g| g.url.contains("/sales/year=2023/region=us/")), "{gets:#?}");
    assert_eq!(r.scan.get_requests, gets.len() as u64, "the statement reports its file GETs");
    // Only the partition's directory was listed.
    let lists: Vec<String> = cold.engine().file_requests().into_iter().filter(|r| r.method == "LIST").map(|r| r.url).collect();
    eprintln!("files, one partition: LISTs {lists:?}");
    assert!(!lists.is_empty() && lists.iter().all(|l| l.ends_with("/sales/year=2023/region=us")), "{lists:#?}");
    if let Some(dm) = cold.engine().download_manager().filter(|_| backend == Backend::Minio) {
        // Presigned URLs escape `=`.
        let urls: Vec<String> = dm.request_log().into_iter().map(|q| q.url.replace("%3D", "=")).filter(|u| u.contains("/sales/")).collect();
        assert!(!urls.is_empty() && urls.iter().all(|u| u.contains("/year=2023/region=us/")), "file GETs go through the download manager: {urls:#?}");
    }
    // 100 rows of 400,000 in row groups of 20,000: the footer's statistics
    // leave one row group, so a small part of the file is read.
    let before = cold.engine().file_requests().len();
    let r = run(&cold, &ours(4)).await;
    assert_eq!(lines(&r), rows(&expected[4]));
    let size = std::fs::metadata(dir.path().join("big.parquet")).unwrap().len();
    let gets = gets_since(&cold, before);
    let read = read_bytes(&gets, size);
    eprintln!("files, row groups pruned: {} GETs, {read} of {size} bytes", gets.len());
    assert!(read * 4 < size, "read {read} of {size} bytes: {gets:#?}");
    // A whole dataset on a bucket is listed as a walk of its directories,
    // several at once (one LIST per directory), and once per statement:
    // `read_parquet` lists to find the partitions, its scan reuses that.
    let before = cold.engine().file_requests().len();
    run(&cold, &ours(0)).await;
    let lists: Vec<String> = cold.engine().file_requests().into_iter().skip(before).filter(|r| r.method == "LIST").map(|r| r.url).collect();
    eprintln!("files, whole dataset: {} LISTs", lists.len());
    let directories = if backend == Backend::Minio { 1 + 3 + 6 } else { 1 };
    assert_eq!(lists.len(), directories, "{lists:#?}");
    // Read again: on MinIO the memory tier serves every range (keyed by
    // the object's e_tag from this statement's listing); local files are
    // read from the disk again.
    let before = cold.engine().file_requests().len();
    let again = run(&cold, &ours(4)).await;
    assert_eq!(lines(&again), rows(&expected[4]));
    let gets = gets_since(&cold, before);
    eprintln!("files, again: {} GETs, {} ranges from memory", gets.len(), again.scan.memory_hits);
    if backend == Backend::Minio {
        assert!(gets.is_empty() && again.scan.memory_hits > 0, "{gets:#?} {:?}", again.scan);
    } else {
        assert!(!gets.is_empty());
    }
    // SHOW TABLES lists the external table (no Iceberg metadata: not ours).
    assert!(lines(&run(&e, "SHOW TABLES").await).contains(&"sales|NULL".to_string()));
    // External tables are read only; DROP TABLE forgets the definition only.
    let error = fail(&e, "INSERT INTO sales SELECT * FROM sales").await;
    assert!(error.contains("external table") && error.contains("CREATE TABLE"), "{error}");
    assert!(fail(&e, "DELETE FROM sales WHERE year = 2022").await.contains("'sales' is an external table"));
    assert!(fail(&e, &format!("COPY sales FROM '{files}/csv/*.csv'")).await.contains("'sales' is an external table"));
    assert!(fail(&e, &format!("CREATE EXTERNAL TABLE loaded STORED AS PARQUET LOCATION '{files}/sales/'")).await.contains("exists"));
    run(&e, "DROP TABLE sales").await;
    assert!(fail(&e, "SELECT count(*) FROM sales").await.contains("sales"));
    assert_eq!(files_under(dir.path()).iter().filter(|f| f.starts_with("sales/")).count(), 6, "the files stay");
    // What a missing or empty location says.
    let error = fail(&e, &format!("SELECT * FROM read_parquet('{files}/nothing/*.parquet')")).await;
    assert!(error.contains("nothing") && error.contains("no file matches"), "{error}");
    let error = fail(&e, &format!("CREATE EXTERNAL TABLE s2 STORED AS PARQUET PARTITIONED BY (region) LOCATION '{files}/sales/'")).await;
    assert!(error.contains("PARTITIONED BY (region)") && error.contains("(year, region)"), "{error}");
}
