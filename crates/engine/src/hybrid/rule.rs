//! Planning hybrid scans: [`HybridRule`], the physical optimizer rule that
//! finds the separable chains above scans and puts a [`HybridExec`] on top
//! of them, and the rewriting of a chain into the fragment a storage node
//! runs ([`fragment`], [`with_leaf`]).

use std::sync::Arc;

use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::error::{DataFusionError, Result};
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::aggregates::{AggregateExec, AggregateMode};
use datafusion::physical_plan::filter::FilterExec;
use datafusion::physical_plan::projection::ProjectionExec;
use datafusion::physical_plan::repartition::RepartitionExec;
use datafusion::physical_plan::{ExecutionPlan, Partitioning};

use blobhouse_pushdown::{ObjectSlice, ObjectSliceExec, SliceChecks};

use crate::scan::{BlobScanExec, ScanUnit, Split};

use super::PushdownMode;
use super::exec::HybridExec;
use super::node::Pushdown;

/// The physical optimizer rule that makes scans hybrid (see the module docs).
#[derive(Debug)]
pub struct HybridRule {
    pushdown: Arc<Pushdown>,
}

impl HybridRule {
    pub fn new(pushdown: Arc<Pushdown>) -> Self {
        HybridRule { pushdown }
    }
}

/// What a separable chain above a scan holds.
struct Chain {
    reduces: bool,
}

/// The chain of separable operators from `plan` down to a scan, if `plan`
/// starts one: a partial aggregation (at the top only), filters and
/// projections, over a scan without row ids that is not split yet.
fn separable_chain(plan: &Arc<dyn ExecutionPlan>) -> Option<Chain> {
    let mut node = plan.clone();
    let mut reduces = false;
    let mut top = true;
    loop {
        if let Some(scan) = node.downcast_ref::<BlobScanExec>() {
            return (!top && scan.data_projection().is_some() && !scan.is_split() && !scan.units().is_empty()).then_some(Chain { reduces });
        }
        let child = if let Some(a) = node.downcast_ref::<AggregateExec>() {
            if !top || *a.mode() != AggregateMode::Partial {
                return None;
            }
            reduces = true;
            a.input().clone()
        } else if let Some(f) = node.downcast_ref::<FilterExec>() {
            reduces = true;
            f.input().clone()
        } else if let Some(p) = node.downcast_ref::<ProjectionExec>() {
            p.input().clone()
        } else if let Some(r) = node.downcast_ref::<RepartitionExec>().filter(|r| round_robin(r)) {
            // Spreads a scan of few row groups over the cores; a fragment
            // leaves it out (a node runs one slice in one partition).
            r.input().clone()
        } else {
            return None;
        };
        top = false;
        node = child;
    }
}

impl PhysicalOptimizerRule for HybridRule {
    fn optimize(&self, plan: Arc<dyn ExecutionPlan>, _: &ConfigOptions) -> Result<Arc<dyn ExecutionPlan>> {
        if self.pushdown.mode() == PushdownMode::Off {
            return Ok(plan);
        }
        plan.transform_down(|node| {
            let Some(chain) = separable_chain(&node) else { return Ok(Transformed::no(node)) };
            if !chain.reduces {
                return Ok(Transformed::no(node));
            }
            let split = Arc::new(Split::default());
            let mut scan: Option<Arc<BlobScanExec>> = None;
            let input = node
                .clone()
                .transform_up(|n| match n.downcast_ref::<BlobScanExec>() {
                    Some(s) => {
                        let split_scan = Arc::new(s.with_split(split.clone()));
                        scan = Some(split_scan.clone());
                        Ok(Transformed::yes(split_scan as Arc<dyn ExecutionPlan>))
                    }
                    None => Ok(Transformed::no(n)),
                })?
                .data;
            let scan = scan.expect("the chain ends at a scan");
            // Ship the chain once now: a fragment a node cannot run (an
            // expression datafusion-proto does not carry, a scalar
            // subquery's value) stays local.
            let probe = fragment(&input, &scan, &scan.units()[..1])?;
            if blobhouse_pushdown::codec::shippable(probe).is_err() {
                return Ok(Transformed::no(node));
            }
            let hybrid = HybridExec::new(input, scan, split, self.pushdown.clone());
            Ok(Transformed::new(Arc::new(hybrid) as Arc<dyn ExecutionPlan>, true, TreeNodeRecursion::Jump))
        })
        .map(|t| t.data)
    }

    fn name(&self) -> &str {
        "blobhouse_hybrid_pushdown"
    }

    fn schema_check(&self) -> bool {
        true
    }
}

fn round_robin(r: &RepartitionExec) -> bool {
    matches!(r.partitioning(), Partitioning::RoundRobinBatch(_))
}

/// `chain` with its scan replaced by a slice of `units` (one object's).
pub(super) fn fragment(chain: &Arc<dyn ExecutionPlan>, scan: &BlobScanExec, units: &[ScanUnit]) -> Result<Arc<dyn ExecutionPlan>> {
    let projection = scan.data_projection().ok_or_else(|| DataFusionError::Internal("a hybrid scan reads row ids".into()))?.to_vec();
    let first = units.first().ok_or_else(|| DataFusionError::Internal("an empty pushdown task".into()))?;
    let width = projection.len();
    let slice = ObjectSlice {
        object: first.object.name.clone(),
        row_groups: units.iter().map(|u| u.row_group).collect(),
        columns: projection,
        deleted: first.object.deleted.clone(),
        selections: units.iter().map(|u| u.selection.clone()).collect(),
        // Objects written with checksums: the node checks what it reads.
        checks: first.object.footer_checksum.zip(units.iter().map(|u| u.checksums.clone()).collect::<Option<Vec<_>>>()).map(|(footer, chunks)| SliceChecks {
            footer,
            page_index: first.object.page_index_checksum,
            chunks,
            pages: match units.iter().all(|u| u.pages.len() == width) {
                true => units.iter().map(|u| u.pages.clone()).collect(),
                false => Vec::new(),
            },
        }),
    };
    with_leaf(chain, Arc::new(ObjectSliceExec::new(slice, scan.schema())))
}

/// `chain` over `leaf` instead of its scan, in one partition (round-robin
/// repartitioning left out).
pub(super) fn with_leaf(chain: &Arc<dyn ExecutionPlan>, leaf: Arc<dyn ExecutionPlan>) -> Result<Arc<dyn ExecutionPlan>> {
    chain
        .clone()
        .transform_up(|n| {
            if n.is::<BlobScanExec>() {
                return Ok(Transformed::yes(leaf.clone()));
            }
            match n.downcast_ref::<RepartitionExec>().filter(|r| round_robin(r)) {
                Some(r) => Ok(Transformed::yes(r.input().clone())),
                None => Ok(Transformed::no(n)),
            }
        })
        .map(|t| t.data)
}
