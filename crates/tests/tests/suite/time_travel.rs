//! Time travel as part of the statement: `t AT(…)` wherever a table may
//! stand, result columns named as the user wrote them, and — inside a
//! transaction — the past read as it was committed, never with the
//! transaction's own changes (docs/lifecycle.md).

use blobhouse_engine::{EngineOptions, Session};

use crate::common::*;

/// `t (id, v)` with rows 1, 2, 3 committed at version 2 (version 1 is the
/// empty table): the "as a new user would" set-up.
async fn three_rows(name: &str) -> (TestDb, Session) {
    let db = TestDb::new(Backend::Local, name);
    let e = db.engine(EngineOptions::default()).await;
    run(&e, "CREATE TABLE t (id INT, v VARCHAR)").await;
    run(&e, "INSERT INTO t VALUES (1,'a'),(2,'b'),(3,'c')").await;
    assert_eq!(e.engine().database().refresh().await.unwrap().version, 2);
    (db, e)
}

fn names(r: &blobhouse_engine::QueryResult) -> Vec<String> {
    r.schema.fields().iter().map(|f| f.name().clone()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn results_are_named_as_written_and_literals_keep_their_case() {
    let (_db, e) = three_rows("tt-names").await;
    run(&e, "DELETE FROM t WHERE id = 3").await;
    // The same names as without AT, qualified or not.
    for (with, without) in [
        ("SELECT sum(id) FROM t AT(VERSION => 2)", "SELECT sum(id) FROM t"),
        ("SELECT sum(t.id) FROM t VERSION AS OF 2", "SELECT sum(t.id) FROM t"),
        ("SELECT x.v FROM t AT(VERSION => 2) AS x", "SELECT x.v FROM t AS x"),
    ] {
        assert_eq!(names(&run(&e, with).await), names(&run(&e, without).await), "{with}");
    }
    assert_eq!(names(&run(&e, "SELECT sum(id) FROM t AT(VERSION => 2)").await), ["sum(t.id)"]);
    let r = run(&e, "SELECT 'MiXeD AT(VERSION => 9)' AS \"CamelCase\", count(*) AS n FROM t AT(VERSION => 2)").await;
    assert_eq!(names(&r), ["CamelCase", "n"]);
    assert_eq!(lines(&r), ["MiXeD AT(VERSION => 9)|3"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_clause_stands_wherever_a_table_does() {
    let (_db, e) = three_rows("tt-places").await;
    run(&e, "DELETE FROM t WHERE id = 3").await;
    let count = |sql: &'static str| {
        let e = &e;
        async move { scalar(&run(e, sql).await) }
    };
    // Joins, of the past with the present and with itself.
    assert_eq!(count("SELECT count(*) FROM t AT(VERSION => 2) AS old JOIN t ON old.id = t.id").await, "2");
    assert_eq!(count("SELECT count(*) FROM t AT(VERSION => 2) AS a JOIN t AT(VERSION => 2) AS b ON a.id = b.id").await, "3");
    // Subqueries and CTEs.
    assert_eq!(count("SELECT count(*) FROM (SELECT id FROM t AT(VERSION => 2)) AS s").await, "3");
    assert_eq!(count("SELECT count(*) FROM t AT(VERSION => 2) WHERE id NOT IN (SELECT id FROM t)").await, "1");
    assert_eq!(count("WITH old AS (SELECT * FROM t AT(VERSION => 2)) SELECT count(*) FROM old").await, "3");
    // DML's WHERE subqueries: put back what was deleted, then delete what was not there.
    run(&e, "INSERT INTO t SELECT * FROM t AT(VERSION => 2) WHERE id NOT IN (SELECT id FROM t)").await;
    assert_eq!(lines(&run(&e, "SELECT id, v FROM t ORDER BY id").await), ["1|a", "2|b", "3|c"]);
    run(&e, "UPDATE t SET v = 'x' WHERE id IN (SELECT id FROM t AT(VERSION => 2) WHERE v = 'b')").await;
    run(&e, "DELETE FROM t WHERE id IN (SELECT id FROM t AT(VERSION => 2) WHERE id = 1)").await;
    assert_eq!(lines(&run(&e, "SELECT id, v FROM t ORDER BY id").await), ["2|x", "3|c"]);
    // A syntax error in a clause says where.
    let err = fail(&e, "SELECT * FROM t AT(OFFSET => 1)").await;
    assert!(err.contains("VERSION, TIMESTAMP or SNAPSHOT"), "{err}");
}

/// Inside BEGIN … COMMIT, version 2 — the one the transaction started
/// from — is read as committed, whatever the transaction changed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inside_a_transaction_the_past_is_read_as_committed() {
    // SELECT reads all three rows, though the transaction deleted one.
    let (_db, e) = three_rows("tt-select").await;
    run(&e, "BEGIN").await;
    run(&e, "DELETE FROM t WHERE id = 1").await;
    assert_eq!(lines(&run(&e, "SELECT id FROM t AT(VERSION => 2) ORDER BY id").await), ["1", "2", "3"]);
    assert_eq!(lines(&run(&e, "SELECT id FROM t ORDER BY id").await), ["2", "3"], "the present has the transaction's change");
    run(&e, "ROLLBACK").await;

    // INSERT … SELECT from the past copies the rows the transaction deleted.
    let (_db, e) = three_rows("tt-insert").await;
    let r = e.execute_script("BEGIN; DELETE FROM t WHERE id >= 2; INSERT INTO t SELECT * FROM t AT(VERSION => 2) WHERE id >= 2; COMMIT").await.unwrap();
    assert_eq!(scalar(&r[2]), "2", "INSERT copied rows 2 and 3");
    assert_eq!(lines(&run(&e, "SELECT id, v FROM t ORDER BY id").await), ["1|a", "2|b", "3|c"]);

    // RESTORE to the start version undoes the transaction's DELETE.
    let (_db, e) = three_rows("tt-restore").await;
    e.execute_script("BEGIN; DELETE FROM t; RESTORE TABLE t TO VERSION 2; COMMIT").await.unwrap();
    assert_eq!(scalar(&run(&e, "SELECT count(*) FROM t").await), "3");
    let (_db, e) = three_rows("tt-restore-db").await;
    e.execute_script("BEGIN; DELETE FROM t; RESTORE DATABASE TO VERSION 2; COMMIT").await.unwrap();
    assert_eq!(scalar(&run(&e, "SELECT count(*) FROM t").await), "3");

    // TIMESTAMP AS OF and a snapshot that resolve to the start version.
    let (_db, e) = three_rows("tt-timestamp").await;
    run(&e, "CREATE SNAPSHOT two").await;
    // Version 3 (the snapshot's commit) holds the same rows; the
    // transaction starts from it.
    let start = e.engine().database().refresh().await.unwrap();
    assert_eq!(start.version, 3);
    let when = chrono_free_utc(start.committed_at_ms);
    run(&e, "BEGIN").await;
    run(&e, "DELETE FROM t WHERE id = 2").await;
    assert_eq!(scalar(&run(&e, &format!("SELECT count(*) FROM t TIMESTAMP AS OF '{when}'")).await), "3");
    assert_eq!(scalar(&run(&e, "SELECT count(*) FROM t AT(VERSION => 3)").await), "3");
    assert_eq!(scalar(&run(&e, "SELECT count(*) FROM t AT(SNAPSHOT => 'two')").await), "3");

    // Every other statement that reads the past: CREATE TABLE AS, COPY TO,
    // UPDATE and DELETE with a subquery of the past.
    run(&e, "CREATE TABLE copy2 AS SELECT * FROM t AT(VERSION => 2)").await;
    assert_eq!(scalar(&run(&e, "SELECT count(*) FROM copy2").await), "3");
    let out = tempfile::tempdir().unwrap();
    let file = out.path().join("two.csv");
    let r = run(&e, &format!("COPY (SELECT * FROM t AT(VERSION => 2)) TO '{}' WITH (FORMAT csv)", file.display())).await;
    assert_eq!(scalar(&r), "3");
    assert_eq!(std::fs::read_to_string(&file).unwrap().lines().count(), 4, "a header and three rows");
    run(&e, "UPDATE t SET v = 'gone' WHERE id IN (SELECT id FROM t AT(VERSION => 2) WHERE v = 'b')").await;
    assert_eq!(scalar(&run(&e, "SELECT count(*) FROM t WHERE v = 'gone'").await), "0", "row 2 is deleted in the transaction");
    run(&e, "DELETE FROM t WHERE id IN (SELECT id FROM t AT(VERSION => 2) WHERE v = 'c')").await;
    run(&e, "COMMIT").await;
    assert_eq!(lines(&run(&e, "SELECT id FROM t ORDER BY id").await), ["1"]);
    assert_eq!(scalar(&run(&e, "SELECT count(*) FROM t AT(VERSION => 2)").await), "3", "the past is as it was");
}

/// `ms` since the epoch as `YYYY-MM-DD HH:MM:SS.fff` (UTC), via Arrow's cast.
fn chrono_free_utc(ms: u64) -> String {
    use datafusion::arrow::array::{Array, StringArray, TimestampMillisecondArray};
    use datafusion::arrow::compute::cast;
    use datafusion::arrow::datatypes::DataType;
    let ts = TimestampMillisecondArray::from(vec![ms as i64]);
    let text = cast(&ts, &DataType::Utf8).unwrap();
    let text = text.as_any().downcast_ref::<StringArray>().unwrap();
    assert!(!text.is_null(0));
    text.value(0).replace('T', " ")
}
