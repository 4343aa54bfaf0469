//! DELETE and UPDATE: deletion vectors, row ids through a SELECT, and what
//! scans do with deleted rows.

use blobhouse_engine::EngineOptions;

use crate::common::*;
use crate::on_every_store_encrypted_too;

on_every_store_encrypted_too!(delete_and_update_change_exactly_the_rows_they_select, copy_to_exports_exactly_the_current_rows);

async fn delete_and_update_change_exactly_the_rows_they_select(b: Backend) {
    let db = TestDb::new(b, "dml");
    // Small row groups: deletes spread over many of them.
    let e = db.engine(small_chunks(2048)).await;
    run(&e, "CREATE TABLE t AS SELECT CAST(v AS BIGINT) AS id, CAST(v % 10 AS INT) AS g, 'row ' || CAST(v AS VARCHAR) AS s FROM generate_series(1, 1000) AS x(v)").await;
    run(&e, "CREATE TABLE keep (id BIGINT)").await;
    run(&e, "INSERT INTO keep VALUES (5), (15), (25)").await;

    // A 1-row DELETE writes a deletion vector and a version: bytes, not the table.
    db.audit.clear_requests();
    assert_eq!(scalar(&run(&e, "DELETE FROM t WHERE id = 1000").await), "1");
    let puts: Vec<(String, usize)> = db
        .audit
        .requests()
        .into_iter()
        .filter_map(|r| match r {
            blobhouse_testkit::Request::Put { path, bytes, .. } => Some((path, bytes.unwrap_or(usize::MAX))),
            _ => None,
        })
        .collect();
    // blobhouse's own: a vector and a version; beside them, where the store
    // is one other engines read, the Iceberg metadata (a position delete
    // file, its manifest, the manifest list and the metadata file).
    let (iceberg, ours): (Vec<_>, Vec<_>) = puts.iter().partition(|(p, _)| p.contains("iceberg/"));
    let written: usize = ours.iter().map(|(_, b)| b).sum();
    assert!(written <= 8 << 10 && ours.iter().all(|(p, _)| !p.ends_with(".parquet")), "a 1-row DELETE wrote {puts:?}");
    assert!(iceberg.len() <= 4 && iceberg.iter().map(|(_, b)| b).sum::<usize>() <= 16 << 10, "a 1-row DELETE wrote {puts:?}");
    run(&e, "INSERT INTO t VALUES (1000, 0, 'row 1000')").await;

    // A subquery in WHERE, correlated and not.
    let deleted = run(&e, "DELETE FROM t WHERE g = 5 AND id NOT IN (SELECT id FROM keep)").await;
    assert_eq!(scalar(&deleted), "97");
    assert_eq!(scalar(&run(&e, "SELECT count(*) FROM t").await), "903");
    assert_eq!(scalar(&run(&e, "SELECT count(*) FROM t WHERE g = 5").await), "3");
    assert_eq!(scalar(&run(&e, "SELECT sum(id) FROM t WHERE g = 5").await), "45");
    let deleted = run(&e, "DELETE FROM t AS a WHERE EXISTS (SELECT 1 FROM keep k WHERE k.id = a.id + 1)").await;
    assert_eq!(scalar(&deleted), "3");

    // UPDATE = delete + append: the row keeps its identity in queries.
    let updated = run(&e, "UPDATE t SET s = upper(s), g = g + 100 WHERE id <= 3").await;
    assert_eq!(scalar(&updated), "3");
    let r = run(&e, "SELECT id, g, s FROM t WHERE id <= 3 ORDER BY id").await;
    assert_eq!(lines(&r), vec!["1|101|ROW 1", "2|102|ROW 2", "3|103|ROW 3"]);
    assert_eq!(scalar(&run(&e, "SELECT count(*) FROM t").await), "900");
    assert_eq!(scalar(&run(&e, "SELECT count(DISTINCT id) FROM t").await), "900");

    // Nothing matches: no new version.
    let before = e.engine().database().refresh().await.unwrap().version;
    assert_eq!(scalar(&run(&e, "DELETE FROM t WHERE id < 0").await), "0");
    assert_eq!(e.engine().database().refresh().await.unwrap().version, before);

    // EXPLAIN ANALYZE counts the rows the scan dropped as deleted: 1 + 97 + 3,
    // and the 3 old versions of the updated rows.
    let plan = text(&run(&e, "EXPLAIN ANALYZE SELECT count(s) FROM t").await);
    assert!(plan.contains("rows_deleted=104"), "{plan}");

    // A second handle (another process) sees the same.
    let e2 = db.engine(EngineOptions::default()).await;
    let r = run(&e2, "SELECT count(*), sum(id) FROM t WHERE g > 100").await;
    assert_eq!(lines(&r), vec!["3|6"]);

    // Deleting everything leaves an empty table that still works.
    assert_eq!(scalar(&run(&e2, "DELETE FROM t").await), "900");
    assert_eq!(scalar(&run(&e, "SELECT count(*) FROM t").await), "0");
    run(&e, "INSERT INTO t VALUES (7, 7, 'seven')").await;
    assert_eq!(lines(&run(&e, "SELECT * FROM t").await), vec!["7|7|seven"]);
}

/// A small deterministic generator (xorshift64*): the same steps every run.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545F4914F6CDD1D) >> 11) % n
    }
}

fn random_dml(r: &mut Rng, step: usize) -> String {
    let modes = ["AIR", "MAIL", "SHIP", "RAIL", "TRUCK", "FOB", "REG AIR"];
    match r.below(9) {
        0 => format!("DELETE FROM lineitem WHERE l_orderkey % {} = {} AND l_quantity > {}", 13 + r.below(40), r.below(13), 20 + r.below(30)),
        1 => format!(
            "DELETE FROM orders WHERE o_orderkey IN (SELECT l_orderkey FROM lineitem WHERE l_discount = 0.0{} AND l_shipmode = '{}')",
            r.below(10),
            modes[r.below(7) as usize]
        ),
        2 => format!("UPDATE lineitem SET l_quantity = l_quantity + 1, l_comment = 'step {step}' WHERE l_partkey % {} = {}", 50 + r.below(50), r.below(50)),
        3 => format!("UPDATE orders SET o_orderpriority = 'P{step}' WHERE o_custkey IN (SELECT c_custkey FROM customer WHERE c_nationkey = {})", r.below(25)),
        4 => format!("DELETE FROM customer WHERE c_acctbal < {} AND NOT EXISTS (SELECT 1 FROM orders WHERE o_custkey = c_custkey)", r.below(3000)),
        5 => format!("INSERT INTO lineitem SELECT * FROM lineitem WHERE l_orderkey % {} = {}", 200 + r.below(300), r.below(200)),
        6 => format!("UPDATE part SET p_retailprice = p_retailprice * 2 WHERE p_size = {}", 1 + r.below(50)),
        7 => format!("DELETE FROM partsupp WHERE ps_availqty < {} AND ps_suppkey % 3 = {}", 100 + r.below(900), r.below(3)),
        _ => format!("UPDATE lineitem SET l_discount = 0.00 WHERE l_orderkey IN (SELECT o_orderkey FROM orders WHERE o_orderpriority = 'P{}')", step.saturating_sub(1 + r.below(10) as usize)),
    }
}

fn random_query(r: &mut Rng) -> String {
    match r.below(9) {
        0 => "SELECT count(*), sum(l_quantity), sum(l_extendedprice), sum(l_discount) FROM lineitem".into(),
        1 => "SELECT o_orderpriority, count(*) FROM orders GROUP BY o_orderpriority ORDER BY o_orderpriority".into(),
        2 => "SELECT count(*), sum(c_acctbal) FROM customer".into(),
        3 => "SELECT l_returnflag, l_linestatus, sum(l_quantity), count(*) FROM lineitem GROUP BY l_returnflag, l_linestatus ORDER BY l_returnflag, l_linestatus".into(),
        4 => "SELECT count(*) FROM orders WHERE NOT EXISTS (SELECT 1 FROM lineitem WHERE l_orderkey = o_orderkey)".into(),
        5 => "SELECT count(*), sum(p_retailprice) FROM part".into(),
        6 => "SELECT count(*), sum(ps_supplycost), sum(ps_availqty) FROM partsupp".into(),
        7 => format!("SELECT count(*), min(l_comment), max(l_comment) FROM lineitem WHERE l_comment LIKE 'step%' AND l_orderkey % 7 = {}", r.below(7)),
        _ => "SELECT n_name, count(*), sum(o_totalprice) FROM nation, customer, orders WHERE n_nationkey = c_nationkey AND c_custkey = o_custkey GROUP BY n_name ORDER BY n_name".into(),
    }
}

/// At least `n` DML and query steps, some inside transactions that commit
/// or roll back.
fn random_steps(seed: u64, n: usize) -> Vec<String> {
    let mut r = Rng(seed);
    let mut steps = Vec::new();
    let mut counted = 0;
    while counted < n {
        match r.below(10) {
            0..=4 => steps.push(random_dml(&mut r, steps.len())),
            5..=8 => steps.push(random_query(&mut r)),
            _ => {
                steps.push("BEGIN".into());
                for _ in 0..1 + r.below(3) {
                    steps.push(random_dml(&mut r, steps.len()));
                    counted += 1;
                }
                steps.push(random_query(&mut r));
                steps.push(if r.below(2) == 0 { "COMMIT".into() } else { "ROLLBACK".into() });
            }
        }
        counted += 1;
    }
    steps
}

/// DELETE, UPDATE and INSERT … SELECT, with subqueries, alone and inside
/// transactions, on TPC-H SF 0.01: after every step, blobhouse and DuckDB
/// (running the same statements on a copy of the same data) agree.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dml_agrees_with_duckdb_over_a_random_sequence() {
    let db = TestDb::new(Backend::Local, "dml-duckdb");
    // Small row groups: deletes land in many row groups and objects.
    let e = db.engine(small_chunks(256 << 10)).await;
    blobhouse_bench::tpch::load(&e, 0.01, std::sync::Arc::new(|_, _, _| {})).await.expect("load TPC-H");
    let steps = random_steps(0x5eed_0012, 220);
    let script = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(script.path(), steps.join("\n")).unwrap();
    let answers = duckdb_oracle(&["--script".as_ref(), db.url.as_ref(), script.path().as_os_str()]);
    assert_eq!(answers.len(), steps.len());
    let (mut dml, mut queries, mut effective) = (0, 0, 0);
    for (i, (step, answer)) in steps.iter().zip(&answers).enumerate() {
        let ours = run(&e, step).await;
        let expected = blobhouse_bench::answers::parse_answer(answer.split_once('\n').map_or("", |(_, b)| b));
        let verdict = blobhouse_bench::answers::compare(&expected, &blobhouse_bench::answers::result_rows(&ours.batches));
        assert_eq!(verdict, blobhouse_bench::answers::Verdict::Verified, "step {i}: {step}\nDuckDB: {expected:?}\nblobhouse: {:?}", lines(&ours));
        match step.split_whitespace().next() {
            Some("SELECT") => queries += 1,
            Some("BEGIN" | "COMMIT" | "ROLLBACK") => {}
            _ => {
                dml += 1;
                effective += usize::from(scalar(&ours) != "0");
            }
        }
    }
    assert!(dml + queries >= 200 && dml >= 80, "{dml} DML and {queries} query steps");
    assert!(effective * 2 >= dml, "only {effective} of {dml} DML steps changed rows: the test would prove little");
    eprintln!("{dml} DML steps ({effective} changed rows), {queries} queries, all agree with DuckDB");
}

/// DuckDB's answer on a Parquet or CSV file (read with its own readers).
fn duckdb_on_file(file: &std::path::Path, csv: bool, query: &str) -> Vec<String> {
    let reader = if csv { "read_csv" } else { "read_parquet" };
    let script = format!(
        "import duckdb\ncon = duckdb.connect()\ncon.execute(\"CREATE VIEW f AS SELECT * FROM {reader}('{}')\")\nfor r in con.execute({query:?}).fetchall():\n    print('|'.join(str(v) for v in r))",
        file.display()
    );
    let out = std::process::Command::new("python3").args(["-c", &script]).output().expect("python3 runs");
    assert!(out.status.success(), "DuckDB failed (run scripts/install-test-deps.sh): {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap().lines().map(str::to_string).collect()
}

/// COPY … TO writes the table as it is now — without deleted rows, with
/// updated values — as a plain file any tool reads: DuckDB agrees, from a
/// local file and from one exported to the store (fetched back here).
async fn copy_to_exports_exactly_the_current_rows(b: Backend) {
    let db = TestDb::new(b, "copy-to");
    let e = db.engine(small_chunks(2048)).await;
    run(&e, "CREATE TABLE t AS SELECT CAST(v AS BIGINT) AS id, CAST(v % 10 AS INT) AS g, 'row ' || CAST(v AS VARCHAR) AS s FROM generate_series(1, 1000) AS x(v)").await;
    run(&e, "DELETE FROM t WHERE g = 3 OR id > 900").await;
    run(&e, "UPDATE t SET s = 'changed', id = id + 10000 WHERE g = 7").await;
    let summary = "SELECT count(*), sum(id), sum(g), min(s), max(s) FROM f";
    let ours = lines(&run(&e, &summary.replace(" f", " t")).await);
    // 900 - 90 rows with g = 3; sum(1..900) - sum of the g = 3 ids + 10000 x 90.
    assert_eq!(ours, vec!["810|1265130|3780|changed|row 99"]);

    let dir = tempfile::tempdir().unwrap();
    let local = dir.path().join("t.parquet");
    let written = run(&e, &format!("COPY (SELECT * FROM t) TO '{}'", local.display())).await;
    assert_eq!(scalar(&written), "810");
    assert_eq!(duckdb_on_file(&local, false, summary), ours);

    // To the store the database is on, as CSV, then read back.
    let (target, fetch_to) = match b {
        Backend::Local | Backend::LocalEncrypted => (dir.path().join("export.csv").display().to_string(), None),
        // Beside the database, in its bucket or container.
        Backend::Minio | Backend::MinioEncrypted | Backend::Azurite | Backend::Gcs => (format!("{}-export/t.csv", db.url), Some(dir.path().join("fetched.csv"))),
    };
    run(&e, &format!("COPY t TO '{target}' WITH (FORMAT csv, HEADER true)")).await;
    let csv = match fetch_to {
        None => std::path::PathBuf::from(&target),
        Some(path) => {
            let loc = blobhouse_storage::open_location(&target, &db.store_options).unwrap();
            let bytes = object_store::ObjectStoreExt::get(&loc.store, &loc.prefix).await.unwrap().bytes().await.unwrap();
            std::fs::write(&path, &bytes).unwrap();
            path
        }
    };
    assert_eq!(duckdb_on_file(&csv, true, summary), ours);

    // Inside a transaction the export sees the transaction's changes.
    run(&e, "BEGIN").await;
    run(&e, "DELETE FROM t WHERE g = 1").await;
    let inside = dir.path().join("inside.parquet");
    assert_eq!(scalar(&run(&e, &format!("COPY t TO '{}'", inside.display())).await), "720");
    run(&e, "ROLLBACK").await;
    // The database's own folder is refused: its objects are never overwritten.
    let err = fail(&e, &format!("COPY t TO '{}/objects/x.parquet'", db.url)).await;
    assert!(err.contains("inside the database"), "{err}");
}
