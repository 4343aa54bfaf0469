//! [`SharedSubplanRule`]: a finished aggregation that a plan computes twice
//! — TPC-H Q15's `revenue` CTE, once for the join and once for its
//! `max()` — is computed once, and both places read its result.
//!
//! Why ours: DataFusion 55 inlines every CTE and has no rule that finds
//! repeated subplans (apache/datafusion#8777 is open; whether to
//! materialise is the contested part). DuckDB materialises a CTE that is
//! referenced twice and aggregates, which halved its Q15. The rule here is
//! that narrow case: only a subplan ending in a final aggregation (a
//! pipeline breaker, so buffering its output cannot stall a producer that
//! waits for its consumer), small by the optimizer's estimate, with no
//! volatile expression, reading the same data objects. The two copies of
//! such a subplan compute the same rows, so reading one copy twice changes
//! no answer.
//!
//! How: each copy becomes a [`SharedExec`]; both hold the same subplan and
//! one cell. Whichever is executed first runs every partition of the
//! subplan and keeps the batches (a reservation in the engine's budget,
//! `SharedSubplan[n]`); both then stream a partition's batches from the
//! cell. The first copy keeps the subplan as its child (EXPLAIN
//! shows it once, with its metrics); the second shows only which copy it
//! reads.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use datafusion::arrow::array::RecordBatch;
use datafusion::common::config::ConfigOptions;
use datafusion::common::stats::Precision;
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::TaskContext;
use datafusion::execution::memory_pool::{MemoryConsumer, MemoryReservation};
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_expr_common::physical_expr::is_volatile;
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::aggregates::{AggregateExec, AggregateMode};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties, SendableRecordBatchStream, collect_partitioned, displayable};
use futures::{StreamExt, TryStreamExt};

use crate::scan::BlobScanExec;

/// The most rows a shared subplan may be estimated to return: its output
/// is held in memory until the query ends (counted in the engine's budget,
/// so the operators around it spill first). The estimate of an aggregation
/// is often only the rows going in: Q15's `revenue` has one row per
/// supplier (100 000 at SF 10) but is estimated at its input, about 2.3 M
/// lineitem rows at SF 10.
const MAX_SHARED_ROWS: usize = 16 << 20;

/// The rule; see the module docs.
#[derive(Debug, Default)]
pub struct SharedSubplanRule;

impl PhysicalOptimizerRule for SharedSubplanRule {
    fn optimize(&self, plan: Arc<dyn ExecutionPlan>, _: &ConfigOptions) -> Result<Arc<dyn ExecutionPlan>> {
        // A recursive query re-runs its plan; a cell would keep the first run's rows.
        let mut recursive = false;
        plan.apply(|n| {
            recursive |= n.name() == "RecursiveQueryExec";
            Ok(if recursive { TreeNodeRecursion::Stop } else { TreeNodeRecursion::Continue })
        })?;
        if recursive {
            return Ok(plan);
        }
        // Every final aggregation (nested ones too: Q15's second copy sits
        // under the `max()` aggregation). Most plans have fewer than two,
        // and then nothing more is computed.
        let mut finals: Vec<Arc<dyn ExecutionPlan>> = Vec::new();
        plan.apply(|n| {
            if final_aggregation(n).is_some() {
                finals.push(n.clone());
            }
            Ok(TreeNodeRecursion::Continue)
        })?;
        if finals.len() < 2 {
            return Ok(plan);
        }
        // What each candidate computes, once.
        let seen: Vec<(String, Arc<dyn ExecutionPlan>)> = finals.into_iter().filter_map(|n| shareable(&n).map(|k| (k, n))).collect();
        let mut groups: Vec<(String, Arc<dyn ExecutionPlan>, Arc<SharedCell>)> = Vec::new();
        for (key, node) in &seen {
            let repeats = seen.iter().filter(|(k, _)| k == key).count();
            if repeats >= 2 && !groups.iter().any(|(k, _, _)| k == key) {
                groups.push((key.clone(), node.clone(), Arc::new(SharedCell::new(groups.len() + 1))));
            }
        }
        if groups.is_empty() {
            return Ok(plan);
        }
        // The nodes to replace are found by identity: going down, a node is
        // still the one collected until one of its children changes.
        Ok(plan
            .transform_down(|n| {
                let Some((key, _)) = seen.iter().find(|(_, s)| Arc::ptr_eq(s, &n)) else { return Ok(Transformed::no(n)) };
                let Some((_, producer, cell)) = groups.iter().find(|(k, _, _)| k == key) else { return Ok(Transformed::no(n)) };
                let primary = cell.copies.fetch_add(1, Ordering::Relaxed) == 0;
                let shared = SharedExec { input: producer.clone(), cell: cell.clone(), primary };
                Ok(Transformed::new(Arc::new(shared) as Arc<dyn ExecutionPlan>, true, TreeNodeRecursion::Jump))
            })?
            .data)
    }

    fn name(&self) -> &str {
        "blobhouse_shared_subplan"
    }

    fn schema_check(&self) -> bool {
        true
    }
}

/// What `node` computes, when it may be shared: a final aggregation,
/// estimated small, without volatile expressions, runtime filters or
/// scalar subqueries; its text and the data objects its scans read.
fn shareable(node: &Arc<dyn ExecutionPlan>) -> Option<String> {
    let agg = final_aggregation(node)?;
    // The estimate the join choices use ([`crate::selectivity`]); with no
    // estimate of the groups, at most the rows going in.
    let registry = crate::selectivity::registry();
    let estimate = |plan: &dyn ExecutionPlan| registry.compute_base(plan).ok().map(|s| s.num_rows);
    let rows = match estimate(node.as_ref())? {
        Precision::Absent => estimate(agg.input().as_ref())?,
        known => known,
    };
    match rows {
        Precision::Exact(n) | Precision::Inexact(n) if n <= MAX_SHARED_ROWS => {}
        _ => return None,
    }
    // The first scan of an object reads its page index and says so; a
    // later one finds it cached. Not a difference in what they compute.
    let mut key = without_page_index_reads(&displayable(node.as_ref()).indent(true).to_string());
    // Filters filled in while the query runs belong to one join each, and
    // a scalar subquery's value to one ScalarSubqueryExec: two copies that
    // print alike may still hold different ones.
    if key.contains("DynamicFilter") || key.contains("scalar_subquery") {
        return None;
    }
    let mut volatile = false;
    node.apply(|n| {
        // A Bloom filter's build is a side effect another scan waits for.
        volatile |= n.name() == "BloomBuildExec";
        n.apply_expressions(&mut |e| {
            volatile |= is_volatile(e);
            Ok(TreeNodeRecursion::Continue)
        })?;
        // Two scans print alike when they read one table at two versions
        // (time travel): their objects tell them apart.
        if let Some(scan) = n.downcast_ref::<BlobScanExec>() {
            key.push_str(&scan.data_fingerprint());
        }
        Ok(TreeNodeRecursion::Continue)
    })
    .ok()?;
    (!volatile).then_some(key)
}

/// `node` as an aggregation that finishes its groups (a pipeline breaker).
fn final_aggregation(node: &Arc<dyn ExecutionPlan>) -> Option<&AggregateExec> {
    let agg = node.downcast_ref::<AggregateExec>()?;
    matches!(agg.mode(), AggregateMode::Final | AggregateMode::FinalPartitioned | AggregateMode::Single | AggregateMode::SinglePartitioned).then_some(agg)
}

/// `text` without the `, page_index_reads=N` of scans.
fn without_page_index_reads(text: &str) -> String {
    const MARK: &str = ", page_index_reads=";
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find(MARK) {
        out.push_str(&rest[..at]);
        rest = rest[at + MARK.len()..].trim_start_matches(|c: char| c.is_ascii_digit());
    }
    out.push_str(rest);
    out
}

/// The output of one shared subplan, computed once.
#[derive(Debug)]
struct SharedCell {
    /// Its number in the plan, for EXPLAIN.
    id: usize,
    /// Copies made so far by the rule (the first is the primary).
    copies: AtomicUsize,
    batches: tokio::sync::OnceCell<Buffered>,
}

/// A shared subplan's output, and its bytes in the engine's budget.
#[derive(Debug)]
struct Buffered {
    partitions: Vec<Vec<RecordBatch>>,
    _reservation: MemoryReservation,
}

impl SharedCell {
    fn new(id: usize) -> Self {
        SharedCell { id, copies: AtomicUsize::new(0), batches: tokio::sync::OnceCell::new() }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn page_index_reads_do_not_tell_subplans_apart() {
        let a = "BlobScanExec: table=t, bytes=10, page_index_reads=1, pruning_filters=[x > 1]\n";
        let b = "BlobScanExec: table=t, bytes=10, pruning_filters=[x > 1]\n";
        assert_eq!(super::without_page_index_reads(a), b);
        assert_eq!(super::without_page_index_reads(b), b);
    }
}

/// One place in the plan that reads a shared subplan's output.
#[derive(Debug)]
pub struct SharedExec {
    input: Arc<dyn ExecutionPlan>,
    cell: Arc<SharedCell>,
    /// The first copy: shows the subplan as its child.
    primary: bool,
}

impl DisplayAs for SharedExec {
    fn fmt_as(&self, _: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        match self.primary {
            true => write!(f, "SharedExec: subplan={} (computed once, read by each copy)", self.cell.id),
            false => write!(f, "SharedExec: subplan={} (read from the first copy)", self.cell.id),
        }
    }
}

impl ExecutionPlan for SharedExec {
    fn name(&self) -> &str {
        "SharedExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        self.input.properties()
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        match self.primary {
            true => vec![&self.input],
            false => Vec::new(),
        }
    }

    /// None of its own: the subplan's are its child's.
    fn apply_expressions(&self, _: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>) -> Result<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    fn with_new_children(self: Arc<Self>, mut children: Vec<Arc<dyn ExecutionPlan>>) -> Result<Arc<dyn ExecutionPlan>> {
        match (self.primary, children.len()) {
            (false, 0) => Ok(self),
            // The copies share the cell, not the child: a new child would
            // leave the other copy reading the old one.
            (true, 1) if Arc::ptr_eq(&children[0], &self.input) => Ok(self),
            (true, 1) => Ok(children.remove(0)),
            _ => Err(DataFusionError::Internal(format!("SharedExec got {} children", children.len()))),
        }
    }

    fn execute(&self, partition: usize, context: Arc<TaskContext>) -> Result<SendableRecordBatchStream> {
        let (input, cell) = (self.input.clone(), self.cell.clone());
        let schema = self.input.schema();
        let batches = async move {
            let all = cell
                .batches
                .get_or_try_init(|| async {
                    let reservation = MemoryConsumer::new(format!("SharedSubplan[{}]", cell.id)).register(context.memory_pool());
                    let partitions = collect_partitioned(input, context).await?;
                    // Counted, never refused: the rows exist already.
                    reservation.grow(partitions.iter().flatten().map(RecordBatch::get_array_memory_size).sum());
                    Ok::<_, DataFusionError>(Buffered { partitions, _reservation: reservation })
                })
                .await?;
            let mine: Vec<Result<RecordBatch>> = all.partitions.get(partition).cloned().unwrap_or_default().into_iter().map(Ok).collect();
            Ok::<_, DataFusionError>(futures::stream::iter(mine))
        };
        let stream = futures::stream::once(batches).try_flatten().boxed();
        Ok(Box::pin(RecordBatchStreamAdapter::new(schema, stream)))
    }
}
