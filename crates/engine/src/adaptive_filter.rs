//! [`AdaptiveFilterRule`]: each filter of two or more conjuncts evaluates
//! them adaptively, one after another on the rows still selected
//! ([`ConjunctionExpr`], where the why is).

use std::sync::Arc;

use datafusion::common::Result;
use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::physical_expr::{PhysicalExpr, split_conjunction};
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::filter::{FilterExec, FilterExecBuilder};

use crate::conjunction::ConjunctionExpr;
use crate::hybrid::HybridExec;
use crate::shared_subplan::SharedExec;

/// Replaces each `FilterExec` predicate of two or more conjuncts by a
/// [`ConjunctionExpr`] — not in the fragments a hybrid scan ships to a
/// storage node (its codec knows only DataFusion's expressions), nor in
/// shared subplans. It runs last: DataFusion's statistics, which the rules
/// before it read, cannot see into a `ConjunctionExpr`.
#[derive(Debug, Default)]
pub struct AdaptiveFilterRule;

impl PhysicalOptimizerRule for AdaptiveFilterRule {
    fn optimize(&self, plan: Arc<dyn ExecutionPlan>, _: &ConfigOptions) -> Result<Arc<dyn ExecutionPlan>> {
        plan.transform_down(|node| {
            // A shared subplan's copies share one child; a new child would
            // unshare them (`SharedExec::with_new_children`).
            if node.is::<HybridExec>() || node.is::<SharedExec>() {
                return Ok(Transformed::new(node, false, TreeNodeRecursion::Jump));
            }
            let Some(f) = node.downcast_ref::<FilterExec>() else { return Ok(Transformed::no(node)) };
            if f.predicate().downcast_ref::<ConjunctionExpr>().is_some() {
                return Ok(Transformed::no(node));
            }
            let conjuncts: Vec<Arc<dyn PhysicalExpr>> = split_conjunction(f.predicate()).into_iter().cloned().collect();
            if conjuncts.len() < 2 {
                return Ok(Transformed::no(node));
            }
            let schema = f.input().schema();
            let predicate: Arc<dyn PhysicalExpr> = Arc::new(ConjunctionExpr::try_new(conjuncts, &schema)?);
            Ok(Transformed::yes(Arc::new(FilterExecBuilder::from(f).with_predicate(predicate).build()?)))
        })
        .map(|t| t.data)
    }

    fn name(&self) -> &str {
        "blobhouse_adaptive_filter"
    }

    fn schema_check(&self) -> bool {
        true
    }
}

