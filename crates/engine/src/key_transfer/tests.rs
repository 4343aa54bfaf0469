use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, AsArray, Int32Array, Int64Array, RecordBatch};
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_expr::expressions::Column;

use super::{MAX_IN_LIST, Values};

fn keeps(values: &Values, data: ArrayRef) -> Vec<bool> {
    let schema = Arc::new(Schema::new(vec![Field::new("k", data.data_type().clone(), true)]));
    let col: Arc<dyn PhysicalExpr> = Arc::new(Column::new("k", 0));
    let predicate = values.predicate(&col, data.data_type(), &schema).unwrap();
    let batch = RecordBatch::try_new(schema, vec![data]).unwrap();
    let mask = predicate.evaluate(&batch).unwrap().into_array(batch.num_rows()).unwrap();
    let mask = mask.as_boolean();
    (0..mask.len()).map(|i| mask.is_valid(i) && mask.value(i)).collect()
}

#[test]
fn few_values_become_an_in_list_and_nulls_never_match() {
    let mut v = Values::default();
    v.add(&Int64Array::from(vec![Some(8), Some(21), None, Some(12), Some(8)])).unwrap();
    assert_eq!(v.set.len(), 3);
    let probe = Arc::new(Int64Array::from(vec![Some(8), Some(9), Some(12), None, Some(21), Some(22)]));
    assert_eq!(keeps(&v, probe), [true, false, true, false, true, false]);
}

#[test]
fn many_values_keep_only_their_range() {
    let mut v = Values::default();
    v.add(&Int64Array::from_iter_values((0..(MAX_IN_LIST as i64 + 10)).map(|i| 100 + 2 * i))).unwrap();
    assert!(v.overflowed && v.set.is_empty());
    let top = 100 + 2 * (MAX_IN_LIST as i64 + 9);
    let probe = Arc::new(Int64Array::from(vec![99, 100, 101, top, top + 1]));
    // 101 is not a key but lies in the range: the range filter keeps it.
    assert_eq!(keeps(&v, probe), [false, true, true, true, false]);
}

#[test]
fn partitions_merge_and_an_empty_build_matches_nothing() {
    let mut a = Values::default();
    a.add(&Int32Array::from(vec![1, 2])).unwrap();
    let mut b = Values::default();
    b.add(&Int32Array::from(vec![5])).unwrap();
    a.merge(b);
    assert_eq!(a.range, Some((1, 5)));
    let probe = Arc::new(Int32Array::from(vec![1, 3, 5]));
    assert_eq!(keeps(&a, probe), [true, false, true]);
    // A merge that goes over the limit drops the set.
    let mut big = Values::default();
    big.add(&Int64Array::from_iter_values(0..MAX_IN_LIST as i64)).unwrap();
    assert!(!big.overflowed);
    let mut more = Values::default();
    more.add(&Int64Array::from_iter_values(MAX_IN_LIST as i64..MAX_IN_LIST as i64 + 5)).unwrap();
    big.merge(more);
    assert!(big.overflowed && big.set.is_empty());
    let empty = Values::default();
    assert_eq!(keeps(&empty, Arc::new(Int64Array::from(vec![1, 2]))), [false, false]);
    assert_eq!(DataType::Int64, *Int64Array::from(vec![1]).data_type());
}
