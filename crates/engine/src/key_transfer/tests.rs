use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, AsArray, Int32Array, Int64Array, RecordBatch};
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_expr::expressions::Column;

use super::{MAX_BLOOM_KEYS, MAX_IN_LIST, Values};

fn keeps(values: &Values, data: ArrayRef) -> Vec<bool> {
    keeps_with(values, data, false)
}

fn keeps_with(values: &Values, data: ArrayRef, bloom_only: bool) -> Vec<bool> {
    let schema = Arc::new(Schema::new(vec![Field::new("k", data.data_type().clone(), true)]));
    let col: Arc<dyn PhysicalExpr> = Arc::new(Column::new("k", 0));
    let predicate = values.predicate(&col, data.data_type(), &schema, bloom_only).unwrap();
    let batch = RecordBatch::try_new(schema, vec![data]).unwrap();
    let mask = predicate.evaluate(&batch).unwrap().into_array(batch.num_rows()).unwrap();
    let mask = mask.as_boolean();
    (0..mask.len()).map(|i| mask.is_valid(i) && mask.value(i)).collect()
}

#[test]
fn few_values_become_an_in_list_and_nulls_never_match() {
    let mut v = Values::new(MAX_BLOOM_KEYS);
    v.add(&Int64Array::from(vec![Some(8), Some(21), None, Some(12), Some(8)])).unwrap();
    assert_eq!(v.keys.len(), 4);
    let probe = Arc::new(Int64Array::from(vec![Some(8), Some(9), Some(12), None, Some(21), Some(22)]));
    assert_eq!(keeps(&v, probe.clone()), [true, false, true, false, true, false]);
    // Where DataFusion's filter covers the column, a short list adds nothing.
    assert_eq!(keeps_with(&v, probe, true), [true; 6]);
}

/// Above the IN list's limit the values become a Bloom filter beside the
/// range: every key passes, few others do.
#[test]
fn many_values_become_a_bloom_filter() {
    let mut v = Values::new(MAX_BLOOM_KEYS);
    let n = MAX_IN_LIST as i64 + 10;
    v.add(&Int64Array::from_iter_values((0..n).map(|i| 100 + 2 * i))).unwrap();
    assert!(!v.overflowed);
    let top = 100 + 2 * (n - 1);
    let keys: Vec<i64> = (0..n).map(|i| 100 + 2 * i).collect();
    assert!(keeps(&v, Arc::new(Int64Array::from(keys.clone()))).iter().all(|k| *k));
    assert!(keeps_with(&v, Arc::new(Int64Array::from(keys)), true).iter().all(|k| *k));
    let odd: Vec<i64> = (0..n).map(|i| 101 + 2 * i).collect();
    let passed = keeps(&v, Arc::new(Int64Array::from(odd))).iter().filter(|k| **k).count();
    assert!(passed * 50 < n as usize, "{passed} of {n} non-keys passed");
    assert_eq!(keeps(&v, Arc::new(Int64Array::from(vec![99, top + 2]))), [false, false]);
}

/// Above the collector's cap only the range is kept.
#[test]
fn too_many_values_keep_only_their_range() {
    let cap = 1000;
    let mut v = Values::new(cap);
    v.add(&Int64Array::from_iter_values((0..cap as i64 + 10).map(|i| 100 + 2 * i))).unwrap();
    assert!(v.overflowed && v.keys.is_empty());
    let top = 100 + 2 * (cap as i64 + 9);
    let probe = Arc::new(Int64Array::from(vec![99, 100, 101, top, top + 1]));
    // 101 is not a key but lies in the range: the range filter keeps it.
    assert_eq!(keeps(&v, probe.clone()), [false, true, true, true, false]);
    assert_eq!(keeps_with(&v, probe, true), [true; 5]);
}

#[test]
fn partitions_merge_and_an_empty_build_matches_nothing() {
    let mut a = Values::new(MAX_BLOOM_KEYS);
    a.add(&Int32Array::from(vec![1, 2])).unwrap();
    let mut b = Values::new(MAX_BLOOM_KEYS);
    b.add(&Int32Array::from(vec![5])).unwrap();
    a.merge(b);
    assert_eq!(a.range, Some((1, 5)));
    let probe = Arc::new(Int32Array::from(vec![1, 3, 5]));
    assert_eq!(keeps(&a, probe), [true, false, true]);
    // A merge that goes over the cap drops the values.
    let mut big = Values::new(100);
    big.add(&Int64Array::from_iter_values(0..100)).unwrap();
    assert!(!big.overflowed);
    let mut more = Values::new(100);
    more.add(&Int64Array::from_iter_values(100..105)).unwrap();
    big.merge(more);
    assert!(big.overflowed && big.keys.is_empty());
    let empty = Values::new(100);
    assert_eq!(keeps(&empty, Arc::new(Int64Array::from(vec![1, 2]))), [false, false]);
    assert_eq!(DataType::Int64, *Int64Array::from(vec![1]).data_type());
}
