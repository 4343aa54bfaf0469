//! Following a column down a physical plan to where its values come from,
//! through operators that pass values through unchanged and keep or drop
//! whole rows: what the rules that send a join's keys to a scan below it
//! ([`crate::bloom_join`], [`crate::key_transfer`]) need to know. Their own
//! pass-through nodes they recognise themselves (this module depends on
//! neither).

use std::sync::Arc;

use datafusion::common::JoinType;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_expr::expressions::Column;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::aggregates::AggregateExec;
use datafusion::physical_plan::coalesce_partitions::CoalescePartitionsExec;
use datafusion::physical_plan::filter::FilterExec;
use datafusion::physical_plan::joins::HashJoinExec;
use datafusion::physical_plan::projection::ProjectionExec;
use datafusion::physical_plan::repartition::RepartitionExec;

/// Whether [`source`] may pass an aggregation, by its group keys. A group
/// keeps or loses all its rows together, and they all have its key, so a
/// filter on the key drops exactly the groups a join above would drop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Aggregates {
    Stop,
    ThroughGroupKeys,
}

/// Where output column `column` of `plan` comes from: (the child's index,
/// the column in that child), if `plan` passes the column's values on
/// unchanged — a projection that names it, a filter, repartitioning,
/// either side of an inner hash join, and with
/// [`Aggregates::ThroughGroupKeys`] a plain group key (no grouping sets).
pub(crate) fn source(plan: &Arc<dyn ExecutionPlan>, column: usize, aggregates: Aggregates) -> Option<(usize, usize)> {
    let as_column = |e: &Arc<dyn PhysicalExpr>| e.downcast_ref::<Column>().map(Column::index);
    if let Some(p) = plan.downcast_ref::<ProjectionExec>() {
        return Some((0, as_column(&p.expr().get(column)?.expr)?));
    }
    if let Some(f) = plan.downcast_ref::<FilterExec>() {
        return Some((0, f.projection().as_ref().map_or(Some(column), |p| p.get(column).copied())?));
    }
    if plan.is::<RepartitionExec>() || plan.is::<CoalescePartitionsExec>() || plan.name() == "CoalesceBatchesExec" {
        return Some((0, column));
    }
    if let Some(a) = plan.downcast_ref::<AggregateExec>() {
        let groups = a.group_expr();
        if aggregates == Aggregates::Stop || !groups.is_single() {
            return None;
        }
        return Some((0, as_column(&groups.expr().get(column)?.0)?));
    }
    if let Some(j) = plan.downcast_ref::<HashJoinExec>() {
        // An inner join's output is the build side's columns, then the
        // probe side's (then its projection).
        if *j.join_type() != JoinType::Inner {
            return None;
        }
        let mapped = j.projection.as_ref().map_or(Some(column), |p| p.get(column).copied())?;
        let left = j.left().schema().fields().len();
        return Some(if mapped < left { (0, mapped) } else { (1, mapped - left) });
    }
    None
}
