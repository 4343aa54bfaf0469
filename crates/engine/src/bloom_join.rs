//! Bloom filters from hash joins' build sides for the pushed scans of their
//! probe sides (FlexPushdownDB §4.2: a join is not separable, but its probe
//! side's filtering by the build side's keys is).
//!
//! [`BloomRule`], a physical optimizer rule that runs after the hybrid rule,
//! looks at each hash join that collects its build side once (`CollectLeft`)
//! and drops probe rows without a match (inner, left outer, left/right semi,
//! left anti and left mark joins; nulls never equal). It follows the
//! probe-side keys down through projections, filters, repartitioning and the
//! probe side of inner joins to a [`HybridExec`]; when it finds one, it puts
//! a [`BloomBuildExec`] over the join's build side, which hashes the keys as
//! they pass, and gives the hybrid scan a probe on the same shared
//! [`BloomSlot`]. The hybrid scan's pushed tasks start when the join first
//! polls it — after the build side ended — and carry the filter to the node.
//!
//! Why not DataFusion's own dynamic filter: it is built for the scans of
//! this process (a hash table lookup or an IN list of at most 150 values)
//! and has no wire form; DataFusion's filter still prunes what is read here.

use std::fmt;
use std::sync::Arc;

use datafusion::common::JoinType;
use datafusion::common::NullEquality;
use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::TaskContext;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_expr::expressions::Column;
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::joins::{HashJoinExec, PartitionMode};
use datafusion::physical_plan::metrics::{ExecutionPlanMetricsSet, MetricBuilder, MetricsSet};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{DisplayAs, DisplayFormatType, ExecutionPlan, ExecutionPlanProperties, PlanProperties, SendableRecordBatchStream, replace_children_if_necessary};
use futures::StreamExt;

use blobhouse_pushdown::BloomSlot;
use blobhouse_pushdown::bloom::{MAX_KEY_COLUMNS, hash_rows, supports};

use crate::column_trace::{self, Aggregates};
use crate::hybrid::{HybridExec, Probe, Pushdown, PushdownMode};

/// Passes its input (a hash join's build side) through unchanged and
/// hashes the join keys into a [`BloomSlot`] on the way.
#[derive(Debug)]
pub struct BloomBuildExec {
    input: Arc<dyn ExecutionPlan>,
    keys: Vec<Arc<dyn PhysicalExpr>>,
    slot: Arc<BloomSlot>,
    metrics: ExecutionPlanMetricsSet,
}

impl BloomBuildExec {
    fn new(input: Arc<dyn ExecutionPlan>, keys: Vec<Arc<dyn PhysicalExpr>>, slot: Arc<BloomSlot>) -> Self {
        BloomBuildExec { input, keys, slot, metrics: ExecutionPlanMetricsSet::new() }
    }
}

impl DisplayAs for BloomBuildExec {
    fn fmt_as(&self, _: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        let keys: Vec<String> = self.keys.iter().map(|k| k.to_string()).collect();
        write!(f, "BloomBuildExec: keys=[{}]", keys.join(", "))
    }
}

impl ExecutionPlan for BloomBuildExec {
    fn name(&self) -> &str {
        "BloomBuildExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        self.input.properties()
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
    }

    fn apply_expressions(&self, f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>) -> Result<TreeNodeRecursion> {
        for k in &self.keys {
            if f(k)? == TreeNodeRecursion::Stop {
                return Ok(TreeNodeRecursion::Stop);
            }
        }
        Ok(TreeNodeRecursion::Continue)
    }

    fn with_new_children(self: Arc<Self>, mut children: Vec<Arc<dyn ExecutionPlan>>) -> Result<Arc<dyn ExecutionPlan>> {
        if children.len() != 1 {
            return Err(DataFusionError::Internal("BloomBuildExec has one child".into()));
        }
        Ok(Arc::new(BloomBuildExec::new(children.remove(0), self.keys.clone(), self.slot.clone())))
    }

    fn execute(&self, partition: usize, context: Arc<TaskContext>) -> Result<SendableRecordBatchStream> {
        let input = self.input.execute(partition, context)?;
        let schema = input.schema();
        let (keys, slot, end) = (self.keys.clone(), self.slot.clone(), self.slot.clone());
        let rows = MetricBuilder::new(&self.metrics).global_counter("bloom_keys_hashed");
        let hashed = input.map(move |batch| {
            // The probe gave the filter up (its scan pushes nothing): the
            // keys need no hashing.
            if !slot.wanted() {
                return batch;
            }
            if let Ok(b) = &batch {
                let columns: Result<Vec<_>> = keys.iter().map(|k| k.evaluate(b)?.into_array(b.num_rows())).collect();
                match columns.and_then(|c| hash_rows(&c)) {
                    Ok(h) => {
                        rows.add(h.len());
                        slot.add(&h);
                    }
                    Err(_) => slot.abandon(),
                }
            } else {
                slot.abandon();
            }
            batch
        });
        // The end of the stream completes this partition's part.
        let ended = hashed.map(Some).chain(futures::stream::once(async move {
            end.finish(partition);
            None
        }));
        Ok(Box::pin(RecordBatchStreamAdapter::new(schema, ended.filter_map(futures::future::ready))))
    }

    fn metrics(&self) -> Option<MetricsSet> {
        Some(self.metrics.clone_inner())
    }
}

/// The rule (see the module docs); off while pushdown or its Bloom probes are.
#[derive(Debug)]
pub struct BloomRule {
    pushdown: Arc<Pushdown>,
}

impl BloomRule {
    pub fn new(pushdown: Arc<Pushdown>) -> Self {
        BloomRule { pushdown }
    }
}

/// Join types whose output never needs a probe row that matched nothing.
fn drops_unmatched_probe_rows(t: &JoinType) -> bool {
    matches!(t, JoinType::Inner | JoinType::Left | JoinType::LeftSemi | JoinType::LeftAnti | JoinType::RightSemi | JoinType::LeftMark)
}

impl PhysicalOptimizerRule for BloomRule {
    fn optimize(&self, plan: Arc<dyn ExecutionPlan>, _: &ConfigOptions) -> Result<Arc<dyn ExecutionPlan>> {
        if self.pushdown.mode() == PushdownMode::Off || !self.pushdown.bloom() {
            return Ok(plan);
        }
        plan.transform_up(|node| {
            let Some(join) = node.downcast_ref::<HashJoinExec>() else { return Ok(Transformed::no(node)) };
            if *join.partition_mode() != PartitionMode::CollectLeft
                || !drops_unmatched_probe_rows(join.join_type())
                || join.null_equality() != NullEquality::NullEqualsNothing
                || join.left().is::<BloomBuildExec>()
                || join.on().len() > MAX_KEY_COLUMNS
            {
                return Ok(Transformed::no(node));
            }
            let left_schema = join.left().schema();
            let mut columns = Vec::new();
            for (l, r) in join.on() {
                let Some(c) = r.downcast_ref::<Column>() else { return Ok(Transformed::no(node)) };
                if !l.data_type(&left_schema).is_ok_and(|t| supports(&t)) {
                    return Ok(Transformed::no(node));
                }
                columns.push(c.index());
            }
            let slot = Arc::new(BloomSlot::new(join.left().output_partitioning().partition_count()));
            let Some(right) = attach(join.right(), &columns, &slot)? else { return Ok(Transformed::no(node)) };
            let keys = join.on().iter().map(|(l, _)| l.clone()).collect();
            let left = Arc::new(BloomBuildExec::new(join.left().clone(), keys, slot)) as Arc<dyn ExecutionPlan>;
            Ok(Transformed::yes(replace_children_if_necessary(node.clone(), vec![left, right])?))
        })
        .map(|t| t.data)
    }

    fn name(&self) -> &str {
        "blobhouse_bloom_join"
    }

    fn schema_check(&self) -> bool {
        true
    }
}

/// `plan` with the hybrid scan that produces `columns` given a probe on
/// `slot`, if the columns can be followed down to one.
fn attach(plan: &Arc<dyn ExecutionPlan>, columns: &[usize], slot: &Arc<BloomSlot>) -> Result<Option<Arc<dyn ExecutionPlan>>> {
    if let Some(h) = plan.downcast_ref::<HybridExec>() {
        return Ok(Some(Arc::new(h.with_probe(Probe { columns: columns.to_vec(), slot: slot.clone() }))));
    }
    if plan.is::<BloomBuildExec>() {
        return rebuilt(plan, 0, columns.to_vec(), slot);
    }
    // Every column must come from the same child.
    let mut child = None;
    let mut mapped = Vec::with_capacity(columns.len());
    for c in columns {
        let Some((i, m)) = column_trace::source(plan, *c, Aggregates::Stop) else { return Ok(None) };
        if child.is_some_and(|existing| existing != i) {
            return Ok(None);
        }
        child = Some(i);
        mapped.push(m);
    }
    let Some(child) = child else { return Ok(None) };
    rebuilt(plan, child, mapped, slot)
}

/// `plan` with its child `child` given the probe on `columns` (of that child).
fn rebuilt(plan: &Arc<dyn ExecutionPlan>, child: usize, columns: Vec<usize>, slot: &Arc<BloomSlot>) -> Result<Option<Arc<dyn ExecutionPlan>>> {
    let children = plan.children();
    let Some(new) = attach(children[child], &columns, slot)? else { return Ok(None) };
    let mut all: Vec<Arc<dyn ExecutionPlan>> = children.into_iter().cloned().collect();
    all[child] = new;
    Ok(Some(replace_children_if_necessary(plan.clone(), all)?))
}
