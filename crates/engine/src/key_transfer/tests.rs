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

/// The collected values count in the memory budget: a collector the budget
/// refuses stops collecting and its filter is the range only; with room,
/// the same build sends its IN list. Either way every row passes through.
#[tokio::test]
async fn a_collector_the_budget_refuses_sends_the_range_only() {
    use datafusion::datasource::memory::MemorySourceConfig;
    use datafusion::execution::TaskContext;
    use datafusion::execution::memory_pool::GreedyMemoryPool;
    use datafusion::execution::runtime_env::RuntimeEnvBuilder;
    use datafusion::physical_expr::expressions::{DynamicFilterPhysicalExpr, lit};

    use super::{Key, KeyCollectExec, Target};

    let schema = Arc::new(Schema::new(vec![Field::new("k", DataType::Int64, false)]));
    let batch = RecordBatch::try_new(Arc::clone(&schema), vec![Arc::new(Int64Array::from_iter_values((0..10_000).map(|i| i * 3)))]).unwrap();
    for (limit, in_list) in [(1024, false), (1 << 30, true)] {
        let input = MemorySourceConfig::try_new_exec(&[vec![batch.clone()]], Arc::clone(&schema), None).unwrap();
        let col: Arc<dyn PhysicalExpr> = Arc::new(Column::new("k", 0));
        let dynamic = Arc::new(DynamicFilterPhysicalExpr::new(vec![Arc::clone(&col)], lit(true)));
        let target = Target { dynamic: Arc::clone(&dynamic), column: col, schema: Arc::clone(&schema), bloom_only: false };
        let exec = Arc::new(KeyCollectExec::new(input, vec![Key { column: 0, targets: vec![target] }]));
        let runtime = RuntimeEnvBuilder::new().with_memory_pool(Arc::new(GreedyMemoryPool::new(limit))).build_arc().unwrap();
        let ctx = Arc::new(TaskContext::default().with_runtime(runtime));
        let out = datafusion::physical_plan::collect(exec, ctx).await.unwrap();
        assert_eq!(out.iter().map(RecordBatch::num_rows).sum::<usize>(), 10_000);
        let filter = dynamic.current().unwrap().to_string();
        assert_eq!(filter.contains("IN (SET)"), in_list, "limit {limit}: {filter}");
        assert!(filter.contains(">= 0") && filter.contains("<= 29997"), "{filter}");
    }
}
