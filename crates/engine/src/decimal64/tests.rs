use std::sync::Arc;
use std::sync::atomic::Ordering;

use datafusion::arrow::array::{Array, ArrayRef, Decimal128Array, RecordBatch};
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::common::ScalarValue;
use datafusion::logical_expr::{ColumnarValue, Operator};
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_expr::expressions::{BinaryExpr, Column, Literal};

use super::{Decimal64Expr, GIVE_UP_AFTER, Program};

/// A small deterministic generator (no test may depend on luck).
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        self.0 >> 17
    }
}

fn decimals(values: Vec<Option<i128>>, p: u8, s: i8) -> ArrayRef {
    Arc::new(Decimal128Array::from(values).with_precision_and_scale(p, s).unwrap())
}

/// `rows` values below `bound` in magnitude, every seventh null.
fn random(rng: &mut Lcg, rows: usize, bound: u64, p: u8, s: i8) -> ArrayRef {
    let values = (0..rows)
        .map(|i| {
            let v = (rng.next() % bound) as i128;
            if i % 7 == 3 { None } else if rng.next() % 2 == 0 { Some(v) } else { Some(-v) }
        })
        .collect();
    decimals(values, p, s)
}

fn col(name: &str, schema: &Schema) -> Arc<dyn PhysicalExpr> {
    Arc::new(Column::new_with_schema(name, schema).unwrap())
}

fn lit(v: i128, p: u8, s: i8) -> Arc<dyn PhysicalExpr> {
    Arc::new(Literal::new(ScalarValue::Decimal128(Some(v), p, s)))
}

fn bin(l: Arc<dyn PhysicalExpr>, op: Operator, r: Arc<dyn PhysicalExpr>) -> Arc<dyn PhysicalExpr> {
    Arc::new(BinaryExpr::new(l, op, r))
}

fn batch(columns: Vec<(&str, ArrayRef)>) -> RecordBatch {
    let fields: Vec<Field> = columns.iter().map(|(n, a)| Field::new(*n, a.data_type().clone(), true)).collect();
    RecordBatch::try_new(Arc::new(Schema::new(fields)), columns.into_iter().map(|(_, a)| a).collect()).unwrap()
}

fn array(v: ColumnarValue) -> ArrayRef {
    match v {
        ColumnarValue::Array(a) => a,
        ColumnarValue::Scalar(s) => panic!("expected an array, got {s:?}"),
    }
}

/// Evaluates `expr` both ways on `batch`; asserts equal results and
/// returns whether the 64-bit path computed it.
fn check(expr: &Arc<dyn PhysicalExpr>, batch: &RecordBatch) -> bool {
    let wrapped = Decimal64Expr::new(Arc::clone(expr));
    let expected = array(expr.evaluate(batch).unwrap());
    let got = array(wrapped.evaluate(batch).unwrap());
    assert_eq!(got.data_type(), expected.data_type(), "{expr}");
    assert_eq!(got.to_data(), expected.to_data(), "{expr}");
    assert_eq!(got.logical_nulls(), expected.logical_nulls(), "{expr}");
    assert_eq!(wrapped.data_type(batch.schema_ref()).unwrap(), expr.data_type(batch.schema_ref()).unwrap());
    wrapped.succeeded.load(Ordering::Relaxed) == 1
}

#[test]
fn tpch_pricing_expressions_match_the_128_bit_result() {
    let mut rng = Lcg(42);
    let rows = 10_000;
    let b = batch(vec![
        ("price", random(&mut rng, rows, 10_494_950, 15, 2)),
        ("discount", random(&mut rng, rows, 11, 15, 2)),
        ("tax", random(&mut rng, rows, 9, 15, 2)),
        ("cost", random(&mut rng, rows, 100_000, 15, 2)),
        ("qty", random(&mut rng, rows, 5_001, 15, 2)),
    ]);
    let s = b.schema();
    // Q1: price * (1 - discount) * (1 + tax), with the literal as DataFusion types it.
    let net = bin(col("price", &s), Operator::Multiply, bin(lit(1, 20, 0), Operator::Minus, col("discount", &s)));
    let charge = bin(Arc::clone(&net), Operator::Multiply, bin(lit(1, 20, 0), Operator::Plus, col("tax", &s)));
    // Q9: price * (1 - discount) - cost * qty.
    let profit = bin(Arc::clone(&net), Operator::Minus, bin(col("cost", &s), Operator::Multiply, col("qty", &s)));
    for e in [&net, &charge, &profit] {
        assert!(check(e, &b), "{e} took the 128-bit path");
    }
    // Sliced inputs (a batch's columns are often slices of a morsel).
    let sliced = b.slice(1234, 4321);
    assert!(check(&charge, &sliced));
}

#[test]
fn mixed_scales_rescale_like_arrow() {
    let mut rng = Lcg(7);
    let b = batch(vec![("a", random(&mut rng, 1000, 1 << 32, 18, 4)), ("b", random(&mut rng, 1000, 1 << 28, 12, 1))]);
    let s = b.schema();
    for op in [Operator::Plus, Operator::Minus, Operator::Multiply] {
        assert!(check(&bin(col("a", &s), op, col("b", &s)), &b));
        assert!(check(&bin(col("b", &s), op, col("a", &s)), &b));
        assert!(check(&bin(lit(-25, 5, 3), op, col("a", &s)), &b));
    }
}

#[test]
fn wider_than_64_bits_falls_back_to_the_same_answer() {
    // Products above i64::MAX but far inside i128.
    let big = 4_000_000_000_000i128;
    let b = batch(vec![("a", decimals(vec![Some(big), Some(-big), None, Some(3)], 38, 2)), ("b", decimals(vec![Some(big), Some(big), Some(1), Some(5)], 38, 2))]);
    let s = b.schema();
    assert!(!check(&bin(col("a", &s), Operator::Multiply, col("b", &s)), &b), "the product needs 128 bits");
    // An input value that does not fit in 64 bits.
    let b = batch(vec![("a", decimals(vec![Some(i128::from(i64::MAX) + 1), Some(1)], 38, 0)), ("b", decimals(vec![Some(1), Some(1)], 38, 0))]);
    let s = b.schema();
    assert!(!check(&bin(col("a", &s), Operator::Minus, col("b", &s)), &b), "the input needs 128 bits");
    // Rescaling that overflows 64 bits: 10^17 at scale 0 plus a value at scale 3.
    let b = batch(vec![("a", decimals(vec![Some(100_000_000_000_000_000)], 18, 0)), ("b", decimals(vec![Some(1)], 10, 3))]);
    let s = b.schema();
    assert!(!check(&bin(col("a", &s), Operator::Plus, col("b", &s)), &b), "the rescale needs 128 bits");
}

#[test]
fn an_overflow_of_128_bits_is_still_the_same_error() {
    let huge = 10i128.pow(37);
    let b = batch(vec![("a", decimals(vec![Some(huge)], 38, 0)), ("b", decimals(vec![Some(huge)], 38, 0))]);
    let s = b.schema();
    let e = bin(col("a", &s), Operator::Multiply, col("b", &s));
    let expected = e.evaluate(&b).unwrap_err().to_string();
    let got = Decimal64Expr::new(Arc::clone(&e)).evaluate(&b).unwrap_err().to_string();
    assert_eq!(got, expected);
}

#[test]
fn an_expression_that_keeps_falling_back_stops_trying() {
    let big = 4_000_000_000_000i128;
    let b = batch(vec![("a", decimals(vec![Some(big)], 38, 2)), ("b", decimals(vec![Some(big)], 38, 2))]);
    let s = b.schema();
    let e = Decimal64Expr::new(bin(col("a", &s), Operator::Multiply, col("b", &s)));
    for _ in 0..GIVE_UP_AFTER + 5 {
        e.evaluate(&b).unwrap();
    }
    assert_eq!(e.fell_back.load(Ordering::Relaxed), GIVE_UP_AFTER);
    assert!(e.given_up());
}

#[test]
fn only_decimal_arithmetic_compiles() {
    let b = batch(vec![
        ("d", decimals(vec![Some(1)], 15, 2)),
        ("i", Arc::new(datafusion::arrow::array::Int64Array::from(vec![1])) as ArrayRef),
    ]);
    let s = b.schema();
    let d = col("d", &s);
    assert!(Program::compile(&bin(Arc::clone(&d), Operator::Multiply, Arc::clone(&d)), &s).is_some());
    // Division rounds; comparisons return booleans; integers are not decimals.
    assert!(Program::compile(&bin(Arc::clone(&d), Operator::Divide, Arc::clone(&d)), &s).is_none());
    assert!(Program::compile(&bin(Arc::clone(&d), Operator::Lt, Arc::clone(&d)), &s).is_none());
    assert!(Program::compile(&bin(col("i", &s), Operator::Plus, col("i", &s)), &s).is_none());
    // A literal wider than 64 bits.
    assert!(Program::compile(&bin(Arc::clone(&d), Operator::Plus, lit(i128::from(i64::MAX) * 4, 38, 2)), &s).is_none());
    // The wrapped expression's declared type is always kept.
    assert_eq!(Decimal64Expr::new(bin(Arc::clone(&d), Operator::Multiply, d)).data_type(&s).unwrap(), DataType::Decimal128(31, 4));
}

/// The rule wraps the arithmetic of filters, projections and aggregate
/// arguments in a planned query, and the query's answer is unchanged.
#[tokio::test]
async fn the_rule_wraps_filters_projections_and_aggregate_arguments() {
    use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
    use datafusion::datasource::MemTable;
    use datafusion::execution::SessionStateBuilder;
    use datafusion::physical_plan::aggregates::{AggregateExec, AggregateMode};
    use datafusion::physical_plan::collect;
    use datafusion::physical_plan::filter::FilterExec;
    use datafusion::physical_plan::projection::ProjectionExec;
    use datafusion::prelude::SessionContext;

    let mut rng = Lcg(3);
    let b = batch(vec![("a", random(&mut rng, 5000, 1_000_000, 15, 2)), ("b", random(&mut rng, 5000, 100, 15, 2)), ("g", random(&mut rng, 5000, 4, 15, 0))]);
    let table = Arc::new(MemTable::try_new(b.schema(), vec![vec![b]]).unwrap());
    let sql = "SELECT g, sum(a * (1 - b)), max(a + b) FROM (SELECT a, b, g, a * b AS p FROM t) WHERE p > 100 GROUP BY g ORDER BY g";
    let mut answers = Vec::new();
    let mut wrapped = Vec::new();
    for with_rule in [false, true] {
        let mut state = SessionStateBuilder::new().with_default_features();
        if with_rule {
            state = state.with_physical_optimizer_rule(Arc::new(super::Decimal64Rule));
        }
        let ctx = SessionContext::new_with_state(state.build());
        ctx.register_table("t", table.clone()).unwrap();
        let plan = ctx.sql(sql).await.unwrap().create_physical_plan().await.unwrap();
        let mut found = Vec::new();
        let is64 = |e: &Arc<dyn PhysicalExpr>| {
            let mut any = false;
            e.apply(|n| {
                any |= n.downcast_ref::<Decimal64Expr>().is_some();
                Ok(TreeNodeRecursion::Continue)
            })
            .unwrap();
            any
        };
        plan.apply(|n| {
            if let Some(a) = n.downcast_ref::<AggregateExec>().filter(|a| *a.mode() == AggregateMode::Partial) {
                found.extend(a.aggr_expr().iter().filter(|x| x.expressions().iter().any(is64)).map(|_| "aggregate"));
            }
            if let Some(f) = n.downcast_ref::<FilterExec>() {
                found.extend(is64(f.predicate()).then_some("filter"));
            }
            if let Some(p) = n.downcast_ref::<ProjectionExec>() {
                found.extend(p.expr().iter().filter(|e| is64(&e.expr)).map(|_| "projection"));
            }
            Ok(TreeNodeRecursion::Continue)
        })
        .unwrap();
        found.sort();
        wrapped.push(found);
        let rows = collect(plan, ctx.task_ctx()).await.unwrap();
        answers.push(datafusion::arrow::util::pretty::pretty_format_batches(&rows).unwrap().to_string());
    }
    assert!(wrapped[0].is_empty(), "{:?}", wrapped[0]);
    assert_eq!(wrapped[1].iter().filter(|w| **w == "aggregate").count(), 2, "{:?}", wrapped[1]);
    assert!(wrapped[1].contains(&"filter") || wrapped[1].contains(&"projection"), "{:?}", wrapped[1]);
    assert_eq!(answers[0], answers[1]);
    assert!(answers[0].lines().count() > 5, "{}", answers[0]);
}
