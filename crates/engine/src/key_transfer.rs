//! [`KeyTransferRule`]: a hash join's build-side keys, sent to a scan that
//! DataFusion's own join filter cannot reach.
//!
//! DataFusion 55 gives each hash join a dynamic filter over its probe-side
//! keys and pushes it into the probe side, but only as one expression over
//! all key columns: it stops at the first operator below that cannot take
//! all of them. TPC-H Q5 joins `supplier` on `(s_suppkey, s_nationkey) =
//! (l_suppkey, c_nationkey)`; `l_suppkey` comes from `lineitem` and
//! `c_nationkey` from `customer`, two sides of the joins below, so the filter
//! stays at that join and all 1.5 M customers (SF 10) are joined with their
//! orders and lineitems before four in five are dropped for the wrong
//! nation. DuckDB derives `c_nationkey IN (the nations of ASIA)` and filters
//! the customers first. Upstream the transfer across join keys is
//! apache/datafusion#17171 and its follow-ups, not in a release that
//! matches ours (issue 43, item 4).
//!
//! The same holds for a decorrelated subquery: Q2's `min(ps_supplycost)`
//! and Q20's `sum(l_quantity)` are aggregations grouped by the join key
//! whose join filter covers the aggregate's result too, so it cannot pass
//! the aggregation, and every part's groups are computed (Q17's passes:
//! its key is the only column).
//!
//! What the rule does: for each key column of a hash join that drops probe
//! rows without a match, it follows the probe-side column down through
//! projections, filters, repartitioning, the group keys of aggregations
//! and inner hash joins — into either side of those — to the
//! [`BlobScanExec`] that produces it. That scan gets a new runtime filter
//! (a DataFusion `DynamicFilterPhysicalExpr`, so the scan treats it like
//! the others: rows, row groups, EXPLAIN), and the join's build side is
//! wrapped in a [`KeyCollectExec`] that collects the key's values as they
//! pass. When every build partition has ended the filter becomes `col
//! BETWEEN min AND max AND col IN (values)`, or with more than
//! [`MAX_IN_LIST`] distinct values `... AND col IN BLOOM` (a
//! [`KeyBloom`]), or with more than [`MAX_BLOOM_KEYS`] only the range, for
//! the zone maps; the scan applies it to the rows it decodes, as far as it
//! pays ([`crate::runtime_filter`]).
//!
//! Where DataFusion's own filter does reach the scan's column, it already
//! holds the range and an IN list or, for many keys, a lookup in the
//! join's hash table per row — as costly as the join's probe itself. The
//! scan then gets only the Bloom filter (EXPLAIN: `(bloom)`), evaluated
//! before DataFusion's, which then sees the few rows it let through
//! (Q5's `lineitem`: 60 M rows to keep 0.37 M).
//!
//! When: DataFusion starts the build side of a join below as soon as the
//! plan is executed (`CoalescePartitionsExec` spawns its inputs), so Q5's
//! customer scan would race the supplier build and mostly win. Below a
//! join that builds once for all partitions (`CollectLeft`), the scan's
//! partitions therefore wait for the filter before they decode (the
//! download starts meanwhile; `runtime_filter_wait_time` in EXPLAIN
//! ANALYZE). That cannot deadlock: the filter's producer is the join's
//! build side, which runs when any partition of the join is polled and
//! never reads the scan (the scan is on the probe side). Below a
//! partitioned join the scan does not wait and takes the filter if it is
//! there in time.
//!
//! Why it is correct: a scan row whose key is not among the build side's
//! values reaches the join (if at all) with that same key — the operators
//! on the way only filter, project, repartition or join it with other rows
//! — and the join drops it. Nulls never match. A scan below the build side
//! of an inner join under the probe side starts only when that join is
//! first polled, which is after the outer join's build side ended; a scan
//! that starts earlier reads with the filter still `true`. An aggregation
//! keeps or drops whole groups, and all rows of a group have its key. Only
//! scans the key reaches unchanged get the filter; a computed key, grouping
//! sets, a window, a union or an outer join on the way stops the search.

use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use datafusion::arrow::array::{Array, AsArray};
use datafusion::arrow::datatypes::{DataType, Int64Type, Schema, SchemaRef};
use datafusion::arrow::compute::cast;
use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::common::{DataFusionError, JoinType, NullEquality, Result, ScalarValue};
use datafusion::execution::TaskContext;
use datafusion::execution::memory_pool::{MemoryConsumer, MemoryReservation};
use datafusion::logical_expr::Operator;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_expr::expressions::{BinaryExpr, Column, DynamicFilterPhysicalExpr, in_list, lit};
use datafusion::physical_expr::utils::collect_columns;
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::joins::{HashJoinExec, PartitionMode};
use datafusion::physical_plan::metrics::{ExecutionPlanMetricsSet, MetricBuilder, MetricsSet};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{DisplayAs, DisplayFormatType, ExecutionPlan, ExecutionPlanProperties, PlanProperties, SendableRecordBatchStream, replace_children_if_necessary};
use futures::StreamExt;

use crate::bloom_join::BloomBuildExec;
use crate::column_trace::{self, Aggregates};
use crate::key_bloom::{KeyBloom, KeyBloomExpr};
use crate::runtime_filter::is_runtime_filter;
use crate::scan::BlobScanExec;

/// The most distinct key values sent as an IN list (a hash set: one lookup
/// per row the scan filters, and the scan stops filtering rows when it
/// keeps most of them); above it the filter is the values' range and a
/// [`KeyBloom`] of them.
pub const MAX_IN_LIST: usize = 64 * 1024;

/// The most key values one collector holds for a Bloom filter, over all its
/// partitions (8 bytes a value: 32 MiB); above it the build side stops
/// collecting them and the filter is the values' range only.
pub const MAX_BLOOM_KEYS: usize = 4 << 20;

/// The rule; see the module docs.
#[derive(Debug, Default)]
pub struct KeyTransferRule;

/// Join types whose output never needs a probe row that matched nothing.
fn drops_unmatched_probe_rows(t: &JoinType) -> bool {
    matches!(t, JoinType::Inner | JoinType::Left | JoinType::LeftSemi | JoinType::RightSemi)
}

/// Key types whose values the collector reads (as 64-bit integers).
fn supported(t: &DataType) -> bool {
    matches!(t, DataType::Int8 | DataType::Int16 | DataType::Int32 | DataType::Int64 | DataType::UInt8 | DataType::UInt16 | DataType::UInt32 | DataType::Date32)
}

impl PhysicalOptimizerRule for KeyTransferRule {
    fn optimize(&self, plan: Arc<dyn ExecutionPlan>, config: &ConfigOptions) -> Result<Arc<dyn ExecutionPlan>> {
        // These are join filters: DataFusion's switch for its own turns
        // them off too (`SET datafusion.optimizer.enable_join_dynamic_filter_pushdown = false`).
        if !config.optimizer.enable_join_dynamic_filter_pushdown {
            return Ok(plan);
        }
        // A recursive query re-runs its plan: a collector would see its
        // partitions end twice, and the scans drop their runtime filters.
        let mut recursive = false;
        plan.apply(|n| {
            recursive |= n.name() == "RecursiveQueryExec";
            Ok(if recursive { TreeNodeRecursion::Stop } else { TreeNodeRecursion::Continue })
        })?;
        if recursive {
            return Ok(plan);
        }
        plan.transform_up(|node| {
            let Some(join) = node.downcast_ref::<HashJoinExec>() else { return Ok(Transformed::no(node)) };
            if !drops_unmatched_probe_rows(join.join_type()) || join.null_equality() != NullEquality::NullEqualsNothing || join.left().is::<KeyCollectExec>() {
                return Ok(Transformed::no(node));
            }
            let build_schema = join.left().schema();
            let mut right = Arc::clone(join.right());
            let mut keys = Vec::new();
            for (l, r) in join.on() {
                let (Some(l), Some(r)) = (l.downcast_ref::<Column>(), r.downcast_ref::<Column>()) else { continue };
                let key_type = build_schema.field(l.index()).data_type();
                if !supported(key_type) {
                    continue;
                }
                let mut targets = Vec::new();
                // One build for every probe partition: the scans can wait
                // for it (a partitioned join's builds end one by one, and a
                // consumer that drains one partition first would wait
                // forever for the others).
                let wait = *join.partition_mode() == PartitionMode::CollectLeft;
                if let Some(new) = attach(&right, r.index(), key_type, wait, &mut targets)? {
                    right = new;
                    keys.push(Key { column: l.index(), targets });
                }
            }
            if keys.is_empty() {
                return Ok(Transformed::no(node));
            }
            let left = Arc::new(KeyCollectExec::new(Arc::clone(join.left()), keys)) as Arc<dyn ExecutionPlan>;
            Ok(Transformed::yes(replace_children_if_necessary(Arc::clone(&node), vec![left, right])?))
        })
        .map(|t| t.data)
    }

    fn name(&self) -> &str {
        "blobhouse_key_transfer"
    }

    fn schema_check(&self) -> bool {
        true
    }
}

/// `plan` with a new runtime filter on the scan that produces its output
/// column `column`, if the column can be followed down to one that has no
/// runtime filter on it yet (DataFusion's own reaches the scans it can).
/// The filter is added to `targets`.
fn attach(plan: &Arc<dyn ExecutionPlan>, column: usize, key_type: &DataType, wait: bool, targets: &mut Vec<Target>) -> Result<Option<Arc<dyn ExecutionPlan>>> {
    if let Some(scan) = plan.downcast_ref::<BlobScanExec>() {
        let schema = scan.schema();
        let field = schema.field(column);
        if field.data_type() != key_type {
            return Ok(None);
        }
        // DataFusion's own filter already reads the column (its range, and
        // an IN list or a hash-table lookup): ours adds only a Bloom filter
        // in front of the lookup, when there are too many keys for a list,
        // and the scan does not wait for it.
        let bloom_only = has_runtime_filter_on(scan, column);
        let col: Arc<dyn PhysicalExpr> = Arc::new(Column::new(field.name(), column));
        let filter = Arc::new(DynamicFilterPhysicalExpr::new(vec![Arc::clone(&col)], lit(true)));
        targets.push(Target { dynamic: Arc::clone(&filter), column: col, schema, bloom_only });
        return Ok(Some(Arc::new(scan.with_runtime_filter(filter, wait && !bloom_only))));
    }
    // Our own collectors pass their input through unchanged.
    let passed = (plan.is::<KeyCollectExec>() || plan.is::<BloomBuildExec>()).then_some((0, column));
    let Some((child, mapped)) = passed.or_else(|| column_trace::source(plan, column, Aggregates::ThroughGroupKeys)) else { return Ok(None) };
    let children = plan.children();
    let Some(new) = attach(children[child], mapped, key_type, wait, targets)? else { return Ok(None) };
    let mut all: Vec<Arc<dyn ExecutionPlan>> = children.into_iter().cloned().collect();
    all[child] = new;
    Ok(Some(replace_children_if_necessary(Arc::clone(plan), all)?))
}

/// Whether a runtime filter of `scan` reads its output column `column`.
fn has_runtime_filter_on(scan: &BlobScanExec, column: usize) -> bool {
    scan.runtime_filter_exprs().iter().any(|e| is_runtime_filter(e) && collect_columns(e).iter().any(|c| c.index() == column))
}

/// One key column of the build side and the filters its values fill.
#[derive(Debug)]
struct Key {
    column: usize,
    targets: Vec<Target>,
}

/// A filter on one scan's column.
#[derive(Debug)]
struct Target {
    dynamic: Arc<DynamicFilterPhysicalExpr>,
    /// The scan's column the filter reads.
    column: Arc<dyn PhysicalExpr>,
    /// The scan's output schema (an IN list checks its types against it).
    schema: SchemaRef,
    /// DataFusion's filter covers the column: only a Bloom filter is added.
    bloom_only: bool,
}

impl Target {
    fn fill(&self, values: &Values) -> Result<()> {
        let key_type = self.column.data_type(&self.schema)?;
        self.dynamic.update(values.predicate(&self.column, &key_type, &self.schema, self.bloom_only)?)?;
        self.dynamic.mark_complete();
        Ok(())
    }
}

/// The values of one key seen so far.
#[derive(Debug)]
struct Values {
    /// Every value seen, duplicates too (sorting millions of them would
    /// delay the filter more than the duplicates cost).
    keys: Vec<i64>,
    /// The most values `keys` may hold.
    cap: usize,
    /// More values than `cap`: they are dropped and only the range kept.
    overflowed: bool,
    range: Option<(i64, i64)>,
}

impl Values {
    fn new(cap: usize) -> Self {
        Values { keys: Vec::new(), cap, overflowed: false, range: None }
    }

    fn add(&mut self, array: &dyn Array) -> Result<()> {
        let wide = cast(array, &DataType::Int64)?;
        for v in wide.as_primitive::<Int64Type>().iter().flatten() {
            self.range = Some(self.range.map_or((v, v), |(lo, hi)| (lo.min(v), hi.max(v))));
            if !self.overflowed {
                self.keys.push(v);
            }
        }
        self.check_size();
        Ok(())
    }

    fn merge(&mut self, other: Values) {
        self.range = match (self.range, other.range) {
            (Some((a, b)), Some((c, d))) => Some((a.min(c), b.max(d))),
            (a, b) => a.or(b),
        };
        self.overflowed |= other.overflowed;
        if !self.overflowed {
            self.keys.extend(other.keys);
        }
        self.check_size();
    }

    /// Bytes its values hold.
    fn bytes(&self) -> usize {
        self.keys.capacity() * std::mem::size_of::<i64>()
    }

    /// Stops collecting (the memory budget refused more): the range only.
    fn give_up(&mut self) {
        self.overflowed = true;
        self.keys = Vec::new();
    }

    fn check_size(&mut self) {
        if self.overflowed || self.keys.len() > self.cap {
            self.overflowed = true;
            self.keys = Vec::new();
        }
    }

    /// The predicate on `col` (of type `key_type`) that keeps the rows
    /// whose value was seen: the range, and an IN list of the values or,
    /// with more than [`MAX_IN_LIST`], a Bloom filter of them (overflowed:
    /// the range only). `bloom_only`: the Bloom filter or nothing.
    fn predicate(&self, col: &Arc<dyn PhysicalExpr>, key_type: &DataType, schema: &Schema, bloom_only: bool) -> Result<Arc<dyn PhysicalExpr>> {
        let Some((min, max)) = self.range else {
            // No value at all: no row can match.
            return Ok(lit(false));
        };
        let scalar = |v: i64| ScalarValue::Int64(Some(v)).cast_to(key_type);
        let range: Arc<dyn PhysicalExpr> = Arc::new(BinaryExpr::new(
            Arc::new(BinaryExpr::new(Arc::clone(col), Operator::GtEq, lit(scalar(min)?))),
            Operator::And,
            Arc::new(BinaryExpr::new(Arc::clone(col), Operator::LtEq, lit(scalar(max)?))),
        ));
        if self.overflowed {
            return Ok(if bloom_only { lit(true) } else { range });
        }
        // Many values are a Bloom filter (duplicates only make it larger);
        // few are sorted for the IN list.
        let bloom = |values: &[i64]| -> Arc<dyn PhysicalExpr> { Arc::new(KeyBloomExpr::new(Arc::clone(col), Arc::new(KeyBloom::new(values)))) };
        let with_range = |filter: Arc<dyn PhysicalExpr>| -> Arc<dyn PhysicalExpr> { Arc::new(BinaryExpr::new(Arc::clone(&range), Operator::And, filter)) };
        if self.keys.len() > 4 * MAX_IN_LIST {
            return Ok(if bloom_only { bloom(&self.keys) } else { with_range(bloom(&self.keys)) });
        }
        let mut values = self.keys.clone();
        values.sort_unstable();
        values.dedup();
        if values.len() > MAX_IN_LIST {
            return Ok(if bloom_only { bloom(&values) } else { with_range(bloom(&values)) });
        }
        if bloom_only {
            return Ok(lit(true));
        }
        let list = values.into_iter().map(|v| Ok(lit(scalar(v)?))).collect::<Result<Vec<_>>>()?;
        Ok(Arc::new(BinaryExpr::new(range, Operator::And, in_list(Arc::clone(col), list, &false, schema)?)))
    }
}

/// What the partitions of one [`KeyCollectExec`] share.
#[derive(Debug)]
struct Shared {
    keys: Vec<Key>,
    values: Mutex<Vec<Values>>,
    /// Partitions that have not ended yet.
    open: AtomicUsize,
    /// The most key values one partition holds ([`MAX_BLOOM_KEYS`] shared).
    partition_cap: usize,
    /// The budget's share of the ended partitions' values, until the
    /// filters are filled.
    held: Mutex<Vec<MemoryReservation>>,
}

impl Shared {
    /// Called once per ended partition with its values and the memory
    /// they hold; the last one fills the filters and frees them all.
    fn partition_ended(&self, seen: Vec<Values>, reservation: MemoryReservation) -> Result<()> {
        let mut values = self.values.lock().expect("key values lock");
        for (all, part) in values.iter_mut().zip(seen) {
            all.merge(part);
        }
        self.held.lock().expect("key values reservations").push(reservation);
        // A partition executed twice (never, in the plans this rule
        // changes) must not fill the filters before the others ended.
        let before = self.open.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1));
        if before != Ok(1) {
            return Ok(());
        }
        for (key, values) in self.keys.iter().zip(values.iter()) {
            for target in &key.targets {
                target.fill(values)?;
            }
        }
        // The filters hold what they need; the values are not read again.
        values.iter_mut().for_each(Values::give_up);
        self.held.lock().expect("key values reservations").clear();
        Ok(())
    }
}

/// Passes a hash join's build side through unchanged and collects the
/// distinct values of its key columns for the filters the rule attached.
#[derive(Debug)]
pub struct KeyCollectExec {
    input: Arc<dyn ExecutionPlan>,
    shared: Arc<Shared>,
    metrics: ExecutionPlanMetricsSet,
}

impl KeyCollectExec {
    fn new(input: Arc<dyn ExecutionPlan>, keys: Vec<Key>) -> Self {
        let partitions = input.output_partitioning().partition_count();
        let values = Mutex::new(keys.iter().map(|_| Values::new(MAX_BLOOM_KEYS)).collect());
        let shared = Arc::new(Shared { keys, values, open: AtomicUsize::new(partitions), partition_cap: MAX_BLOOM_KEYS / partitions.max(1), held: Mutex::new(Vec::new()) });
        KeyCollectExec { input, shared, metrics: ExecutionPlanMetricsSet::new() }
    }
}

impl DisplayAs for KeyCollectExec {
    fn fmt_as(&self, _: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        let schema = self.input.schema();
        let keys: Vec<String> = self
            .shared
            .keys
            .iter()
            .map(|k| {
                let scans: Vec<String> = k.targets.iter().map(|t| if t.bloom_only { format!("{} (bloom)", t.column) } else { t.column.to_string() }).collect();
                format!("{} -> {}", schema.field(k.column).name(), scans.join(" "))
            })
            .collect();
        write!(f, "KeyCollectExec: keys=[{}]", keys.join(", "))
    }
}

impl ExecutionPlan for KeyCollectExec {
    fn name(&self) -> &str {
        "KeyCollectExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        self.input.properties()
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
    }

    /// The key columns it reads.
    fn apply_expressions(&self, f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>) -> Result<TreeNodeRecursion> {
        let schema = self.input.schema();
        for k in &self.shared.keys {
            let column: Arc<dyn PhysicalExpr> = Arc::new(Column::new(schema.field(k.column).name(), k.column));
            if f(&column)? == TreeNodeRecursion::Stop {
                return Ok(TreeNodeRecursion::Stop);
            }
        }
        Ok(TreeNodeRecursion::Continue)
    }

    fn with_new_children(self: Arc<Self>, mut children: Vec<Arc<dyn ExecutionPlan>>) -> Result<Arc<dyn ExecutionPlan>> {
        if children.len() != 1 {
            return Err(DataFusionError::Internal("KeyCollectExec has one child".into()));
        }
        Ok(Arc::new(KeyCollectExec { input: children.remove(0), shared: Arc::clone(&self.shared), metrics: ExecutionPlanMetricsSet::new() }))
    }

    fn execute(&self, partition: usize, context: Arc<TaskContext>) -> Result<SendableRecordBatchStream> {
        // The values count in the engine's budget; refused, the partition
        // stops collecting and its keys' filters become ranges.
        let reservation = MemoryConsumer::new(format!("KeyCollect[{partition}]")).register(context.memory_pool());
        let input = self.input.execute(partition, context)?;
        let schema = input.schema();
        let shared = Arc::clone(&self.shared);
        let columns: Vec<usize> = shared.keys.iter().map(|k| k.column).collect();
        let cap = shared.partition_cap;
        let seen = Arc::new(Mutex::new(Some((columns.iter().map(|_| Values::new(cap)).collect::<Vec<_>>(), reservation))));
        let values_metric = MetricBuilder::new(&self.metrics).global_counter("key_rows_collected");
        let collecting = Arc::clone(&seen);
        let passed = input.map(move |batch| {
            let b = batch?;
            let mut guard = collecting.lock().expect("partition key values");
            if let Some((seen, reservation)) = guard.as_mut() {
                for (values, column) in seen.iter_mut().zip(&columns) {
                    values.add(b.column(*column))?;
                }
                if reservation.try_resize(seen.iter().map(Values::bytes).sum()).is_err() {
                    seen.iter_mut().for_each(Values::give_up);
                    reservation.free();
                }
                values_metric.add(b.num_rows());
            }
            Ok(b)
        });
        // The end of the stream (not an error, not a drop) completes this
        // partition's part.
        let ended = passed.map(Some).chain(futures::stream::once(async move {
            let part = seen.lock().expect("partition key values").take();
            match part.map(|(p, reservation)| shared.partition_ended(p, reservation)) {
                Some(Err(e)) => Some(Err(e)),
                _ => None,
            }
        }));
        Ok(Box::pin(RecordBatchStreamAdapter::new(schema, ended.filter_map(futures::future::ready))))
    }

    fn metrics(&self) -> Option<MetricsSet> {
        Some(self.metrics.clone_inner())
    }
}

#[cfg(test)]
mod tests;
