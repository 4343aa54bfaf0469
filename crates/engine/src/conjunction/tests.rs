use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, BooleanArray, Int32Array, RecordBatch, StringArray};
use datafusion::arrow::compute::prep_null_mask_filter;
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::common::ScalarValue;
use datafusion::logical_expr::Operator;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_expr::expressions::{BinaryExpr, Column, Literal};

use super::{ConjunctionExpr, REORDER_EVERY};

/// A small deterministic generator (no test may depend on luck).
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        self.0 >> 17
    }
}

fn schema() -> Arc<Schema> {
    Arc::new(Schema::new(vec![
        Field::new("a", DataType::Int32, true),
        Field::new("b", DataType::Int32, true),
        Field::new("s", DataType::Utf8, true),
    ]))
}

/// `rows` rows: `a` in 0..100, `b` in 0..1000, `s` one of four words; every
/// eleventh `a` and every thirteenth `s` null.
fn batch(rng: &mut Lcg, rows: usize) -> RecordBatch {
    let a: Int32Array = (0..rows).map(|i| (i % 11 != 5).then(|| (rng.next() % 100) as i32)).collect();
    let b: Int32Array = (0..rows).map(|_| Some((rng.next() % 1000) as i32)).collect();
    let words = ["MAIL", "SHIP", "AIR", "RAIL"];
    let s: StringArray = (0..rows).map(|i| (i % 13 != 7).then(|| words[(rng.next() % 4) as usize])).collect();
    RecordBatch::try_new(schema(), vec![Arc::new(a) as ArrayRef, Arc::new(b), Arc::new(s)]).unwrap()
}

fn col(name: &str) -> Arc<dyn PhysicalExpr> {
    Arc::new(Column::new_with_schema(name, &schema()).unwrap())
}

fn int(v: i32) -> Arc<dyn PhysicalExpr> {
    Arc::new(Literal::new(ScalarValue::Int32(Some(v))))
}

fn cmp(l: Arc<dyn PhysicalExpr>, op: Operator, r: Arc<dyn PhysicalExpr>) -> Arc<dyn PhysicalExpr> {
    Arc::new(BinaryExpr::new(l, op, r))
}

/// What DataFusion's own `AND` chain selects: true rows, null as false.
fn reference(conjuncts: &[Arc<dyn PhysicalExpr>], batch: &RecordBatch) -> BooleanArray {
    let chain = conjuncts.iter().skip(1).fold(Arc::clone(&conjuncts[0]), |acc, c| cmp(acc, Operator::And, Arc::clone(c)));
    let value = chain.evaluate(batch).unwrap().into_array(batch.num_rows()).unwrap();
    let mask = value.as_any().downcast_ref::<BooleanArray>().unwrap();
    if mask.null_count() > 0 { prep_null_mask_filter(mask) } else { mask.clone() }
}

fn ours(expr: &ConjunctionExpr, batch: &RecordBatch) -> BooleanArray {
    let value = expr.evaluate(batch).unwrap().into_array(batch.num_rows()).unwrap();
    let mask = value.as_any().downcast_ref::<BooleanArray>().unwrap().clone();
    assert_eq!(mask.null_count(), 0, "the mask of a conjunction has no nulls");
    mask
}

/// Many batches, so the order is measured and changed several times; each
/// mask must equal DataFusion's, whatever the order and whichever of the
/// dense and sparse paths a batch takes.
#[test]
fn every_batch_selects_what_the_and_chain_selects() {
    let cases: Vec<Vec<Arc<dyn PhysicalExpr>>> = vec![
        // Dense then sparse: `a < 60` keeps most rows, `b` ranges few.
        vec![cmp(col("a"), Operator::Lt, int(60)), cmp(col("b"), Operator::GtEq, int(100)), cmp(col("b"), Operator::Lt, int(130))],
        // Selective first, a string equality last.
        vec![
            cmp(col("b"), Operator::Lt, int(50)),
            cmp(col("s"), Operator::Eq, Arc::new(Literal::new(ScalarValue::Utf8(Some("MAIL".into()))))),
            cmp(col("a"), Operator::GtEq, int(10)),
        ],
        // Two columns compared, and a conjunct that keeps nothing.
        vec![cmp(col("a"), Operator::Lt, col("b")), cmp(col("a"), Operator::Gt, int(1000))],
        // All rows pass every conjunct but the nulls.
        vec![cmp(col("a"), Operator::GtEq, int(0)), cmp(col("b"), Operator::GtEq, int(0))],
    ];
    for conjuncts in cases {
        let expr = ConjunctionExpr::try_new(conjuncts.clone(), &schema()).unwrap();
        let mut rng = Lcg(7);
        for n in 0..(3 * REORDER_EVERY as usize + 5) {
            let b = batch(&mut rng, 1 + (n * 37) % 3000);
            assert_eq!(ours(&expr, &b), reference(&conjuncts, &b), "batch {n} of {}", expr);
        }
    }
}

/// A conjunct that rejects almost every row moves to the front once it has
/// been measured, whatever the written order.
#[test]
fn the_most_selective_cheap_conjunct_moves_first() {
    let keeps_most = cmp(col("a"), Operator::GtEq, int(5));
    let keeps_few = cmp(col("b"), Operator::Lt, int(3));
    let expr = ConjunctionExpr::try_new(vec![Arc::clone(&keeps_most), Arc::clone(&keeps_few)], &schema()).unwrap();
    assert_eq!(expr.evaluation_order()[0].to_string(), keeps_most.to_string(), "before measuring, equal guesses keep the written order");
    let mut rng = Lcg(11);
    for _ in 0..REORDER_EVERY {
        ours(&expr, &batch(&mut rng, 4096));
    }
    assert_eq!(expr.evaluation_order()[0].to_string(), keeps_few.to_string());
}

/// A conjunct that can fail (here a division) stays behind the ones that
/// cannot, and sees only the rows they selected: `a <> 0 AND 100 / a > 10`
/// divides by zero in DataFusion's chain, not here.
#[test]
fn a_conjunct_that_can_fail_runs_last_on_the_selected_rows_only() {
    let divides = cmp(cmp(int(100), Operator::Divide, col("a")), Operator::Gt, int(10));
    let nonzero = cmp(col("a"), Operator::NotEq, int(0));
    let conjuncts = vec![Arc::clone(&divides), Arc::clone(&nonzero)];
    let expr = ConjunctionExpr::try_new(conjuncts.clone(), &schema()).unwrap();
    assert_eq!(expr.evaluation_order()[1].to_string(), divides.to_string());
    let a: Int32Array = vec![Some(0), Some(5), None, Some(20), Some(0), Some(9)].into_iter().collect();
    let b = Int32Array::from(vec![0; 6]);
    let s = StringArray::from(vec!["x"; 6]);
    let batch = RecordBatch::try_new(schema(), vec![Arc::new(a) as ArrayRef, Arc::new(b), Arc::new(s)]).unwrap();
    let chain = cmp(Arc::clone(&divides), Operator::And, Arc::clone(&nonzero));
    let err = chain.evaluate(&batch).err().expect("DataFusion divides by zero");
    assert!(err.to_string().contains("Divide by zero"), "{err}");
    assert_eq!(ours(&expr, &batch), BooleanArray::from(vec![false, true, false, false, false, true]));
}

/// EXPLAIN shows the predicate as DataFusion wrote it.
#[test]
fn it_displays_as_the_and_chain() {
    let conjuncts = vec![cmp(col("a"), Operator::Lt, int(60)), cmp(col("b"), Operator::GtEq, int(100))];
    let expr = ConjunctionExpr::try_new(conjuncts, &schema()).unwrap();
    assert_eq!(expr.to_string(), "a@0 < 60 AND b@1 >= 100");
}
