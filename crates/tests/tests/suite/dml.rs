//! DELETE and UPDATE: deletion vectors, row ids through a SELECT, and what
//! scans do with deleted rows.

use blobhouse_engine::EngineOptions;

use crate::common::*;
use crate::on_both_backends;

on_both_backends!(delete_and_update_change_exactly_the_rows_they_select);

async fn delete_and_update_change_exactly_the_rows_they_select(b: Backend) {
    let db = TestDb::new(b, "dml");
    // Small row groups: deletes spread over many of them.
    let e = db.engine(small_chunks(2048)).await;
    run(&e, "CREATE TABLE t AS SELECT CAST(v AS BIGINT) AS id, CAST(v % 10 AS INT) AS g, 'row ' || CAST(v AS VARCHAR) AS s FROM generate_series(1, 1000) AS x(v)").await;
    run(&e, "CREATE TABLE keep (id BIGINT)").await;
    run(&e, "INSERT INTO keep VALUES (5), (15), (25)").await;

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
    let before = e.database().refresh().await.unwrap().version;
    assert_eq!(scalar(&run(&e, "DELETE FROM t WHERE id < 0").await), "0");
    assert_eq!(e.database().refresh().await.unwrap().version, before);

    // EXPLAIN ANALYZE counts the rows the scan dropped as deleted: 97 + 3,
    // and the 3 old versions of the updated rows.
    let plan = text(&run(&e, "EXPLAIN ANALYZE SELECT count(s) FROM t").await);
    assert!(plan.contains("rows_deleted=103"), "{plan}");

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
