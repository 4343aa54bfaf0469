//! The rule against DataFusion without it: the same rows, and the
//! subquery read from the groups only where that is exact.

use std::sync::Arc;

use datafusion::arrow::array::{Float64Array, Int64Array, RecordBatch, StringArray};
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::datasource::MemTable;
use datafusion::prelude::SessionContext;

use super::SubqueryTotalRule;
use crate::subquery::testing;

fn context(with_rule: bool) -> SessionContext {
    let ctx = testing::context(with_rule.then(|| Arc::new(SubqueryTotalRule) as _));
    // Sales: store, product, amount (NULLs in both), a float.
    let schema = Arc::new(Schema::new(vec![
        Field::new("store", DataType::Int64, true),
        Field::new("product", DataType::Int64, true),
        Field::new("amount", DataType::Int64, true),
        Field::new("weight", DataType::Float64, true),
    ]));
    let rows: [(Option<i64>, Option<i64>, Option<i64>, f64); 12] = [
        (Some(1), Some(10), Some(100), 0.1),
        (Some(1), Some(10), Some(50), 0.2),
        (Some(1), Some(11), Some(7), 0.3),
        (Some(2), Some(11), Some(300), 0.4),
        (Some(2), Some(12), None, 0.5),
        (Some(2), None, Some(40), 0.6),
        (Some(3), Some(12), Some(5), 0.7),
        (Some(3), Some(13), Some(900), 0.8),
        (None, Some(13), Some(1), 0.9),
        (Some(1), Some(14), Some(2), 1.0),
        (Some(2), Some(14), Some(3), 1.1),
        (Some(3), Some(10), Some(60), 1.2),
    ];
    let batch = RecordBatch::try_new(
        schema.clone(),
        vec![
            Arc::new(rows.iter().map(|r| r.0).collect::<Int64Array>()),
            Arc::new(rows.iter().map(|r| r.1).collect::<Int64Array>()),
            Arc::new(rows.iter().map(|r| r.2).collect::<Int64Array>()),
            Arc::new(rows.iter().map(|r| Some(r.3)).collect::<Float64Array>()),
        ],
    )
    .unwrap();
    let (a, b) = (batch.slice(0, 6), batch.slice(6, 6));
    ctx.register_table("sale", Arc::new(MemTable::try_new(schema, vec![vec![a], vec![b]]).unwrap())).unwrap();
    let stores = Arc::new(Schema::new(vec![Field::new("id", DataType::Int64, true), Field::new("region", DataType::Utf8, true)]));
    let batch = RecordBatch::try_new(
        stores.clone(),
        vec![Arc::new(Int64Array::from(vec![Some(1), Some(2), Some(3)])), Arc::new(StringArray::from(vec![Some("north"), Some("south"), Some("north")]))],
    )
    .unwrap();
    ctx.register_table("store", Arc::new(MemTable::try_new(stores, vec![vec![batch]]).unwrap())).unwrap();
    ctx
}

/// Runs `sql` with and without the rule; returns whether the rule rewrote it.
async fn same_answer(sql: &str) -> bool {
    let plan = testing::same_rows(&context(false), &context(true), sql).await;
    let rewritten = plan.contains("WindowAggr");
    if rewritten {
        assert!(!plan.contains("Subquery:"), "{plan}");
        assert_eq!(plan.matches("TableScan: sale").count(), 1, "{plan}");
    }
    rewritten
}

const JOINED: &str = "FROM sale JOIN store ON store = id WHERE region = 'north'";

#[tokio::test]
async fn q11_shape_is_read_from_the_groups_with_the_same_rows() {
    let sql = format!("SELECT product, sum(amount) AS v {JOINED} GROUP BY product HAVING sum(amount) > (SELECT sum(amount) * 0.1 {JOINED}) ORDER BY v DESC");
    assert!(same_answer(&sql).await);
    // Decimal sums keep their type (the subquery's value is cast back).
    let sql = format!(
        "SELECT product, sum(CAST(amount AS DECIMAL(15, 2))) {JOINED} GROUP BY product \
         HAVING sum(CAST(amount AS DECIMAL(15, 2))) > (SELECT sum(CAST(amount AS DECIMAL(15, 2))) * 0.1 {JOINED})"
    );
    assert!(same_answer(&sql).await);
}

#[tokio::test]
async fn count_min_and_max_combine_over_groups() {
    for (agg, cmp) in [("count(amount)", "* 3 >="), ("count(*)", "* 4 >"), ("min(amount)", "="), ("max(amount)", "* 10 >")] {
        let sql = format!("SELECT store, {agg} {JOINED} GROUP BY store HAVING {agg} {cmp} (SELECT {agg} {JOINED})");
        assert!(same_answer(&sql).await, "{agg}");
    }
    // Groups with a NULL key are groups too.
    let sql = "SELECT product, sum(amount) FROM sale GROUP BY product HAVING sum(amount) * 4 > (SELECT sum(amount) FROM sale)";
    assert!(same_answer(sql).await);
}

#[tokio::test]
async fn other_rows_or_aggregates_are_left_to_the_subquery() {
    // Other rows: another filter, another table.
    let sql = format!("SELECT product, sum(amount) {JOINED} GROUP BY product HAVING sum(amount) > (SELECT sum(amount) * 0.1 FROM sale)");
    assert!(!same_answer(&sql).await);
    let sql = format!("SELECT product, sum(amount) {JOINED} GROUP BY product HAVING sum(amount) > (SELECT sum(amount) * 0.1 {JOINED} AND amount > 10)");
    assert!(!same_answer(&sql).await);
    // Aggregates that do not add up over groups, or not exactly.
    for agg in ["avg(amount)", "sum(DISTINCT amount)", "sum(weight)"] {
        let sql = format!("SELECT product, {agg} {JOINED} GROUP BY product HAVING {agg} >= (SELECT {agg} * 0.1 {JOINED})");
        assert!(!same_answer(&sql).await, "{agg}");
    }
    // An aggregate the groups do not compute.
    let sql = format!("SELECT product, sum(amount) {JOINED} GROUP BY product HAVING sum(amount) > (SELECT max(amount) * 0.1 {JOINED})");
    assert!(!same_answer(&sql).await);
    // Grouping sets count a row in several groups.
    let sql = format!("SELECT store, product, sum(amount) {JOINED} GROUP BY ROLLUP (store, product) HAVING sum(amount) * 2 > (SELECT sum(amount) {JOINED})");
    assert!(!same_answer(&sql).await);
}

