//! The rule against DataFusion without it, on tables with repeated keys,
//! NULL keys and NULL values: the same rows, and a window only where the
//! rewrite is exact.

use std::sync::Arc;

use datafusion::arrow::array::{Int64Array, RecordBatch};
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::datasource::MemTable;
use datafusion::prelude::SessionContext;

use super::SubqueryWindowRule;
use crate::subquery::testing;

fn table(columns: &[&str], rows: &[&[Option<i64>]]) -> Arc<MemTable> {
    let schema = Arc::new(Schema::new(columns.iter().map(|c| Field::new(*c, DataType::Int64, true)).collect::<Vec<_>>()));
    let arrays = (0..columns.len()).map(|i| Arc::new(rows.iter().map(|r| r[i]).collect::<Int64Array>()) as _).collect();
    let batch = RecordBatch::try_new(schema.clone(), arrays).unwrap();
    // Two partitions, so the window and the join see keys split apart.
    let (a, b) = (batch.slice(0, batch.num_rows() / 2), batch.slice(batch.num_rows() / 2, batch.num_rows() - batch.num_rows() / 2));
    Arc::new(MemTable::try_new(schema, vec![vec![a], vec![b]]).unwrap())
}

fn context(with_rule: bool) -> SessionContext {
    let ctx = testing::context(with_rule.then(|| Arc::new(SubqueryWindowRule) as _));
    // Line items: part key, quantity (NULL keys and NULL quantities included).
    let n = |v: i64| Some(v);
    ctx.register_table(
        "item",
        table(
            &["part", "qty", "price"],
            &[
                &[n(1), n(10), n(100)],
                &[n(1), n(20), n(200)],
                &[n(1), n(1), n(300)],
                &[n(2), n(5), n(400)],
                &[n(2), None, n(500)],
                &[n(2), n(50), n(600)],
                &[n(3), n(7), n(700)],
                &[None, n(1), n(800)],
                &[None, n(100), n(900)],
                &[n(4), n(2), n(1000)],
                &[n(4), n(9), n(1100)],
            ],
        ),
    )
    .unwrap();
    // Part suppliers (part, supplier, cost) and suppliers (id, nation), for
    // subqueries over a join (TPC-H Q2's shape).
    ctx.register_table(
        "ps",
        table(
            &["part", "supp", "cost"],
            &[
                &[n(1), n(1), n(30)],
                &[n(1), n(2), n(20)],
                &[n(1), n(3), n(20)],
                &[n(2), n(1), n(5)],
                &[n(2), n(3), None],
                &[n(3), n(2), n(9)],
                &[n(3), n(3), n(8)],
                &[None, n(1), n(1)],
                &[n(4), n(1), n(7)],
                &[n(4), n(2), n(6)],
            ],
        ),
    )
    .unwrap();
    ctx.register_table("sup", table(&["id", "nation"], &[&[n(1), n(1)], &[n(2), n(1)], &[n(3), n(2)]])).unwrap();
    // Parts, with part 1 twice: its line items are repeated, evenly.
    ctx.register_table("part", table(&["key", "brand"], &[&[n(1), n(7)], &[n(1), n(7)], &[n(2), n(7)], &[n(3), n(8)], &[None, n(7)], &[n(4), n(7)]])).unwrap();
    ctx
}

/// Runs `sql` with and without the rule; returns whether the rule rewrote it.
async fn same_answer(sql: &str) -> bool {
    let plan = testing::same_rows(&context(false), &context(true), sql).await;
    let rewritten = plan.contains("WindowAggr");
    if rewritten {
        // Each table read once: the subquery's second copy is gone.
        let mut scans: Vec<&str> = plan.lines().filter_map(|l| l.trim().strip_prefix("TableScan: ")?.split_whitespace().next()).collect();
        let all = scans.len();
        scans.sort();
        scans.dedup();
        assert_eq!(scans.len(), all, "{plan}");
    }
    rewritten
}

#[tokio::test]
async fn q17_shape_is_rewritten_with_the_same_rows() {
    let sql = "SELECT i.price FROM item i, part p WHERE p.key = i.part AND p.brand = 7 \
               AND i.qty < (SELECT 0.5 * avg(qty) FROM item WHERE item.part = p.key)";
    assert!(same_answer(sql).await);
    let sql = "SELECT sum(price) FROM item, part WHERE key = part AND brand = 7 \
               AND qty < (SELECT 0.5 * avg(qty) FROM item i2 WHERE i2.part = key)";
    assert!(same_answer(sql).await);
}

#[tokio::test]
async fn min_and_max_are_rewritten_too() {
    for agg in ["min", "max"] {
        let sql = format!("SELECT i.price, i.qty FROM item i JOIN part p ON p.key = i.part WHERE i.qty = (SELECT {agg}(qty) FROM item x WHERE x.part = p.key)");
        assert!(same_answer(&sql).await, "{agg}");
    }
    // The outer query's own table, no other join: the key is the group column.
    let sql = "SELECT i.price FROM item i WHERE i.qty > (SELECT avg(qty) FROM item x WHERE x.part = i.part)";
    assert!(same_answer(sql).await);
}

#[tokio::test]
async fn aggregates_that_count_repeats_are_not_rewritten() {
    for agg in ["sum(qty)", "count(*)", "count(qty)", "avg(DISTINCT qty)"] {
        let sql = format!("SELECT i.price FROM item i, part p WHERE p.key = i.part AND i.qty * 5 > (SELECT {agg} FROM item x WHERE x.part = p.key)");
        assert!(!same_answer(&sql).await, "{agg}");
    }
}

#[tokio::test]
async fn a_subquery_or_outer_query_that_filters_other_rows_is_not_rewritten() {
    // The subquery keeps rows the outer query does not.
    let sql = "SELECT i.price FROM item i, part p WHERE p.key = i.part AND i.qty < 20 \
               AND i.qty < (SELECT avg(qty) FROM item x WHERE x.part = p.key)";
    assert!(!same_answer(sql).await);
    // The outer query keeps rows the subquery does not.
    let sql = "SELECT i.price FROM item i, part p WHERE p.key = i.part \
               AND i.qty < (SELECT avg(qty) FROM item x WHERE x.part = p.key AND x.price > 150)";
    assert!(!same_answer(sql).await);
    // Joined on a column of the table other than the group column.
    let sql = "SELECT i.price FROM item i, part p WHERE p.key = i.part AND p.brand = i.qty + 6 \
               AND i.qty <= (SELECT avg(qty) FROM item x WHERE x.part = p.key)";
    assert!(!same_answer(sql).await);
    // The outer key is not the table's group column.
    let sql = "SELECT i.price FROM item i, part p WHERE p.brand - 6 = i.part \
               AND i.qty < (SELECT avg(qty) FROM item x WHERE x.part = p.key)";
    assert!(!same_answer(sql).await);
    // A derived table that renames the table's columns and filters on one.
    let sql = "SELECT q.price FROM (SELECT part AS pk, qty AS q2, price FROM item) q, part p \
               WHERE p.key = q.pk AND q.q2 < 20 AND q.q2 < (SELECT avg(qty) FROM item x WHERE x.part = p.key)";
    assert!(!same_answer(sql).await);
}

#[tokio::test]
async fn a_subquery_over_the_same_joins_is_rewritten() {
    // Q2: the cheapest supplier of each part among one nation's suppliers.
    let sql = "SELECT key, sup.id, cost FROM part, ps, sup WHERE key = ps.part AND sup.id = ps.supp AND nation = 1 \
               AND cost = (SELECT min(cost) FROM ps, sup WHERE ps.part = key AND sup.id = ps.supp AND nation = 1)";
    assert!(same_answer(sql).await);
    // The subquery's joins filter other rows than the outer query's.
    let sql = "SELECT key, sup.id, cost FROM part, ps, sup WHERE key = ps.part AND sup.id = ps.supp AND nation = 1 \
               AND cost = (SELECT min(cost) FROM ps, sup WHERE ps.part = key AND sup.id = ps.supp)";
    assert!(!same_answer(sql).await);
    let sql = "SELECT key, sup.id, cost FROM part, ps, sup WHERE key = ps.part AND sup.id = ps.supp \
               AND cost = (SELECT min(cost) FROM ps, sup WHERE ps.part = key AND sup.id = ps.supp AND nation = 1)";
    assert!(!same_answer(sql).await);
    // The outer query joins the subquery's tables on more than the key.
    let sql = "SELECT key, sup.id, cost FROM part, ps, sup WHERE key = ps.part AND sup.id = ps.supp AND nation = 1 AND brand = sup.id + 6 \
               AND cost = (SELECT min(cost) FROM ps, sup WHERE ps.part = key AND sup.id = ps.supp AND nation = 1)";
    assert!(!same_answer(sql).await);
}
