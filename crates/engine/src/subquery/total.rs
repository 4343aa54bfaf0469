//! [`SubqueryTotalRule`]: a scalar subquery that totals the rows an
//! aggregation groups — TPC-H Q11's `HAVING sum(v) > (SELECT sum(v) *
//! 0.0001 FROM <the same joins>)` — is read from the aggregation's groups
//! instead of joining and aggregating the same rows a second time.
//!
//! Why ours: DataFusion 55 runs an uncorrelated scalar subquery as its own
//! plan (`ScalarSubqueryExec`), before the query, and has no rule that
//! notices it repeats the query's own joins; our shared-subplan rule shares
//! only whole aggregations. The "share of the total" filter is common in
//! reports (groups above 1 % of all sales). In Q11 the second copy scans
//! and joins `partsupp` again: half the query's work.
//!
//! When it is exact — the rule rewrites only what it can prove:
//! - A filter directly over an aggregation `G` (a HAVING) holds a scalar
//!   subquery without outer references whose plan is `Projection(one
//!   column) ∘ Aggregate(no GROUP BY: a₁ … aₙ)` over rows `J₂`.
//! - `J₂` computes the same rows as `G`'s input `J₁`: the two plans are
//!   equal once projections of plain columns are set aside (they choose
//!   columns, not rows), scans compared by table, pushed-down filters and
//!   limit.
//! - Each `aᵢ` is one of `G`'s aggregates, without DISTINCT, FILTER or
//!   ORDER BY, and one that adds up over disjoint groups: `sum` of integers
//!   or decimals, `count` (summed), `min`, `max`. `G` groups by plain
//!   expressions (no GROUPING SETS, which would count a row in several
//!   groups), so every row of `J₁` is in exactly one group.
//! - Then `aᵢ` over `J₂` equals `aᵢ`'s combination over `G`'s groups, a
//!   window over all of `G`'s rows (`sum(g) OVER ()`), cast back to the
//!   subquery's type. When `G` has no rows the filter has none to test.
//!
//! The result is `Projection(G's columns) ∘ Filter(the predicate, the
//! subquery replaced) ∘ Window(the totals) ∘ G`.

use datafusion::common::tree_node::{Transformed, TreeNode};
use std::sync::Arc;

use datafusion::arrow::datatypes::DataType;
use datafusion::common::{Column, DFSchemaRef, Result};
use datafusion::logical_expr::expr::{AggregateFunction, WindowFunction};
use datafusion::logical_expr::{Aggregate, Expr, ExprSchemable, LogicalPlan, LogicalPlanBuilder, Subquery, WindowFunctionDefinition, cast};
use datafusion::optimizer::optimizer::ApplyOrder;
use datafusion::optimizer::{OptimizerConfig, OptimizerRule};

use super::{same_columns, unalias};

/// The rule; see the module docs.
#[derive(Debug, Default)]
pub struct SubqueryTotalRule;

impl OptimizerRule for SubqueryTotalRule {
    fn name(&self) -> &str {
        "subquery_total"
    }

    fn apply_order(&self) -> Option<ApplyOrder> {
        Some(ApplyOrder::BottomUp)
    }

    fn supports_rewrite(&self) -> bool {
        true
    }

    fn rewrite(&self, plan: LogicalPlan, _: &dyn OptimizerConfig) -> Result<Transformed<LogicalPlan>> {
        // A rewrite that fails to build leaves the query as it was: the
        // rule only ever removes work, it must never fail a query.
        match rewrite_filter(&plan) {
            Ok(Some(new)) => Ok(Transformed::yes(new)),
            Ok(None) | Err(_) => Ok(Transformed::no(plan)),
        }
    }
}

/// The rewrite of a filter over an aggregation, or `None` when the rule
/// does not apply.
fn rewrite_filter(plan: &LogicalPlan) -> Result<Option<LogicalPlan>> {
    let LogicalPlan::Filter(filter) = plan else {
        return Ok(None);
    };
    let LogicalPlan::Aggregate(group) = filter.input.as_ref() else {
        return Ok(None);
    };
    if group.group_expr.iter().any(|e| matches!(e, Expr::GroupingSet(_))) {
        return Ok(None);
    }
    // Each subquery of the predicate that totals the groups' rows.
    let mut found: Vec<(Subquery, Total)> = Vec::new();
    filter.predicate.apply(|e| {
        if let Expr::ScalarSubquery(sq) = e
            && let Some(total) = totals(sq, group)?
        {
            found.push((sq.clone(), total));
        }
        Ok(datafusion::common::tree_node::TreeNodeRecursion::Continue)
    })?;
    if found.is_empty() {
        return Ok(None);
    }
    // One window per distinct total, over all of the groups.
    let mut windows: Vec<Expr> = Vec::new();
    let positions: Vec<Vec<usize>> = found
        .iter()
        .map(|(_, t)| {
            t.windows
                .iter()
                .map(|(w, _)| match windows.iter().position(|x| x == w) {
                    Some(at) => at,
                    None => {
                        windows.push(w.clone());
                        windows.len() - 1
                    }
                })
                .collect()
        })
        .collect();
    let group_plan = filter.input.as_ref().clone();
    let columns: Vec<Expr> = group_plan.schema().columns().into_iter().map(Expr::Column).collect();
    let width = columns.len();
    // A plan the builder refuses leaves the query as it was.
    let Ok(windowed) = LogicalPlanBuilder::from(group_plan).window(windows).and_then(|b| b.build()) else {
        return Ok(None);
    };
    let window_column = |at: usize| {
        let (q, f) = windowed.schema().qualified_field(width + at);
        Expr::Column(Column::new(q.cloned(), f.name()))
    };
    // Each subquery's value: its aggregates read from the windows, cast
    // back to the types they had.
    let mut values: Vec<(Subquery, Expr)> = Vec::with_capacity(found.len());
    for ((sq, total), at) in found.into_iter().zip(positions) {
        let value = total
            .output
            .transform_up(|e| match e {
                Expr::Column(c) => match total.schema.index_of_column(&c) {
                    Ok(i) => Ok(Transformed::yes(cast(window_column(at[i]), total.windows[i].1.clone()))),
                    Err(_) => Ok(Transformed::no(Expr::Column(c))),
                },
                e => Ok(Transformed::no(e)),
            })?
            .data;
        values.push((sq, value));
    }
    let predicate = filter
        .predicate
        .clone()
        .transform_up(|e| match e {
            Expr::ScalarSubquery(sq) => match values.iter().find(|(s, _)| *s == sq) {
                Some((_, value)) => Ok(Transformed::yes(value.clone())),
                None => Ok(Transformed::no(Expr::ScalarSubquery(sq))),
            },
            e => Ok(Transformed::no(e)),
        })?
        .data;
    let Ok(new) = LogicalPlanBuilder::from(windowed).filter(predicate).and_then(|b| b.project(columns)).and_then(|b| b.build()) else {
        return Ok(None);
    };
    Ok(same_columns(new.schema(), plan.schema()).then_some(new))
}

/// A scalar subquery that totals an aggregation's rows, as read from its
/// groups.
struct Total {
    /// The subquery's value, over the columns of `schema`.
    output: Expr,
    /// The subquery's aggregate's output (one column per aggregate).
    schema: DFSchemaRef,
    /// For each aggregate: its window over the groups, and its own type.
    windows: Vec<(Expr, DataType)>,
}

/// `sq` as read from `group`'s groups, when it totals `group`'s rows.
fn totals(sq: &Subquery, group: &Aggregate) -> Result<Option<Total>> {
    if !sq.outer_ref_columns.is_empty() {
        return Ok(None);
    }
    // `Projection(one column) ∘ Aggregate`, or the aggregate of one value.
    let (output, total) = match sq.subquery.as_ref() {
        LogicalPlan::Projection(projection) => match (projection.expr.as_slice(), projection.input.as_ref()) {
            ([output], LogicalPlan::Aggregate(total)) => (unalias(output).clone(), total),
            _ => return Ok(None),
        },
        LogicalPlan::Aggregate(total) if total.schema.fields().len() == 1 => (Expr::Column(total.schema.columns().remove(0)), total),
        _ => return Ok(None),
    };
    if !total.group_expr.is_empty() || !same_rows(total.input.as_ref(), group.input.as_ref()) {
        return Ok(None);
    }
    // The value may read nothing but the aggregates.
    if !output.column_refs().into_iter().all(|c| total.schema.has_column(c)) {
        return Ok(None);
    }
    let group_schema = group.schema.as_ref();
    let mut windows = Vec::with_capacity(total.aggr_expr.len());
    for (i, expr) in total.aggr_expr.iter().enumerate() {
        let Expr::AggregateFunction(AggregateFunction { func, params }) = unalias(expr) else {
            return Ok(None);
        };
        if params.distinct || params.filter.is_some() || !params.order_by.is_empty() {
            return Ok(None);
        }
        // The same aggregate among the groups' columns.
        let Some(position) = group.aggr_expr.iter().position(|g| unalias(g) == unalias(expr)) else {
            return Ok(None);
        };
        // Aggregates come last in the output (after the group columns and,
        // for grouping sets, the grouping id).
        let (q, f) = group_schema.qualified_field(group_schema.fields().len() - group.aggr_expr.len() + position);
        let per_group = Expr::Column(Column::new(q.cloned(), f.name()));
        let combine = match func.name() {
            "sum" if f.data_type().is_integer() || f.data_type().is_decimal() => datafusion::functions_aggregate::sum::sum_udaf(),
            "count" => datafusion::functions_aggregate::sum::sum_udaf(),
            "min" => datafusion::functions_aggregate::min_max::min_udaf(),
            "max" => datafusion::functions_aggregate::min_max::max_udaf(),
            _ => return Ok(None),
        };
        let window = Expr::from(WindowFunction::new(WindowFunctionDefinition::AggregateUDF(combine), vec![per_group]));
        // The window's type must cast to the subquery's exactly (decimal
        // widths); a value that no longer fits fails the query, never
        // changes.
        let (_, want) = total.schema.qualified_field(i);
        let want = want.data_type().clone();
        let have = window.get_type(group_schema)?;
        if !(have == want || (have.is_decimal() && want.is_decimal()) || (have.is_integer() && want.is_integer())) {
            return Ok(None);
        }
        windows.push((window, want));
    }
    Ok(Some(Total { output, schema: Arc::clone(&total.schema), windows }))
}

/// Whether two plans compute the same rows: equal once projections of
/// plain columns are skipped, scans compared by table, filters and limit.
fn same_rows(a: &LogicalPlan, b: &LogicalPlan) -> bool {
    let a = skip_projections(a);
    let b = skip_projections(b);
    match (a, b) {
        (LogicalPlan::TableScan(x), LogicalPlan::TableScan(y)) => x.table_name == y.table_name && x.filters == y.filters && x.fetch == y.fetch,
        (LogicalPlan::Filter(x), LogicalPlan::Filter(y)) => x.predicate == y.predicate && same_rows(&x.input, &y.input),
        (LogicalPlan::Join(x), LogicalPlan::Join(y)) => {
            x.join_type == y.join_type
                && x.on == y.on
                && x.filter == y.filter
                && x.null_equality == y.null_equality
                && x.null_aware == y.null_aware
                && same_rows(&x.left, &y.left)
                && same_rows(&x.right, &y.right)
        }
        (LogicalPlan::SubqueryAlias(x), LogicalPlan::SubqueryAlias(y)) => x.alias == y.alias && same_rows(&x.input, &y.input),
        (x, y) => x == y,
    }
}

fn skip_projections(plan: &LogicalPlan) -> &LogicalPlan {
    match plan {
        LogicalPlan::Projection(p) if p.expr.iter().all(|e| matches!(e, Expr::Column(_))) => skip_projections(&p.input),
        p => p,
    }
}

#[cfg(test)]
mod tests;
