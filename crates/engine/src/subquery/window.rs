//! [`SubqueryWindowRule`]: a correlated aggregate over the table the outer
//! query already joins becomes a window over the outer query's rows —
//! TPC-H Q17's `avg(l_quantity)` per part is computed from the line items
//! the query has already joined to its parts, not from a second scan of
//! all of `lineitem`.
//!
//! Why ours: DataFusion 55 decorrelates `x < (SELECT avg(y) FROM t WHERE
//! t.k = outer.k)` into a join with `SELECT k, avg(y) FROM t GROUP BY k`,
//! which reads `t` a second time, in full. When the outer query reads the
//! same `t` and keeps, for each key it keeps, every row of `t` with that
//! key, the aggregate can be read off the outer rows instead (the WinMagic
//! rewrite of IBM's DB2, Zuzarte et al., SIGMOD 2003). No DataFusion rule
//! does this, and DuckDB does not either (it reads `lineitem` twice in
//! Q17). At SF 10 the second scan of Q17 decodes 60 M rows to keep 61 K.
//!
//! When it is exact — the rule rewrites only a plan it can prove:
//! - The join is an inner or left-semi equi-join on one key, `outer.k =
//!   sub.g`, NULLs never equal, optionally with a filter over both sides.
//! - The subquery side is `[alias] [projection] Aggregate(GROUP BY g)` over
//!   a bare scan of a table `t`; its aggregates are `avg`, `min` or `max`
//!   without DISTINCT, FILTER or ORDER BY. These three do not change when
//!   every row of a group is repeated the same number of times.
//! - The outer side reaches a scan of the same table `t` (same name, same
//!   pushed-down filters, no limit) through projections of plain columns,
//!   filters and inner joins that read no column of `t` but `g`, and one
//!   of those joins equates `outer.k` with `t.g`. Then for each key value
//!   the outer rows hold every row of `t` with that `g`, each repeated as
//!   often as its key's partners on the other sides: the same number for
//!   all rows of a key. The window `agg(y) OVER (PARTITION BY outer.k)`
//!   therefore equals the subquery's `agg(y)` for that key.
//! - A key the outer side does not have cannot match; a NULL key never
//!   matches, so rows with a NULL `outer.k` are dropped as the join did.
//!
//! The result is `Filter(join filter) ∘ Projection(outer columns, the
//! subquery's columns from the window)` over the outer side, with the
//! join's own output columns (names, qualifiers, types).

use std::sync::Arc;

use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::common::{Column, NullEquality, Result, TableReference};
use datafusion::logical_expr::expr::{AggregateFunction, WindowFunction};
use datafusion::logical_expr::{Aggregate, Expr, ExprFunctionExt, Join, JoinType, LogicalPlan, LogicalPlanBuilder, TableScan, WindowFunctionDefinition};
use datafusion::optimizer::optimizer::ApplyOrder;
use datafusion::optimizer::{OptimizerConfig, OptimizerRule};

use super::{same_columns, unalias};

/// Aggregates whose value over a group does not change when every row of
/// the group is repeated the same number of times.
const REPEAT_INSENSITIVE: [&str; 3] = ["avg", "min", "max"];

/// The rule; see the module docs.
#[derive(Debug, Default)]
pub struct SubqueryWindowRule;

impl OptimizerRule for SubqueryWindowRule {
    fn name(&self) -> &str {
        "subquery_window"
    }

    fn apply_order(&self) -> Option<ApplyOrder> {
        Some(ApplyOrder::BottomUp)
    }

    fn supports_rewrite(&self) -> bool {
        true
    }

    fn rewrite(&self, plan: LogicalPlan, _: &dyn OptimizerConfig) -> Result<Transformed<LogicalPlan>> {
        let LogicalPlan::Join(join) = &plan else {
            return Ok(Transformed::no(plan));
        };
        match rewrite_join(join)? {
            Some(new) => Ok(Transformed::yes(new)),
            None => Ok(Transformed::no(plan)),
        }
    }
}

/// One occurrence of a table in a plan: its scan and the qualifier its
/// columns carry above it (the alias, else the table's name).
struct Occurrence<'a> {
    scan: &'a TableScan,
    qualifier: TableReference,
}

impl Occurrence<'_> {
    /// Whether `other` reads the same rows: same table, same pushed-down
    /// filters, no limit on either.
    fn same_rows(&self, other: &Occurrence<'_>) -> bool {
        self.scan.table_name == other.scan.table_name && self.scan.filters == other.scan.filters && self.scan.fetch.is_none() && other.scan.fetch.is_none()
    }

    fn owns(&self, column: &Column) -> bool {
        column.relation.as_ref() == Some(&self.qualifier)
    }
}

/// A bare scan, possibly under an alias.
fn occurrence(plan: &LogicalPlan) -> Option<Occurrence<'_>> {
    match plan {
        LogicalPlan::TableScan(scan) => Some(Occurrence { scan, qualifier: scan.table_name.clone() }),
        LogicalPlan::SubqueryAlias(alias) => match alias.input.as_ref() {
            LogicalPlan::TableScan(scan) => Some(Occurrence { scan, qualifier: alias.alias.clone() }),
            _ => None,
        },
        _ => None,
    }
}

/// The subquery side: its output columns as expressions over the
/// aggregate's output, the aggregate, and the table it reads.
struct Subquery<'a> {
    outputs: Vec<Expr>,
    aggregate: &'a Aggregate,
    table: Occurrence<'a>,
    group: Column,
}

fn subquery(plan: &LogicalPlan) -> Option<Subquery<'_>> {
    let mut plan = plan;
    if let LogicalPlan::SubqueryAlias(alias) = plan {
        plan = alias.input.as_ref();
    }
    let (projection, aggregate) = match plan {
        LogicalPlan::Projection(p) => match p.input.as_ref() {
            LogicalPlan::Aggregate(a) => (Some(&p.expr), a),
            _ => return None,
        },
        LogicalPlan::Aggregate(a) => (None, a),
        _ => return None,
    };
    let table = occurrence(aggregate.input.as_ref())?;
    let [Expr::Column(group)] = aggregate.group_expr.as_slice() else {
        return None;
    };
    if !table.owns(group) {
        return None;
    }
    for expr in &aggregate.aggr_expr {
        let Expr::AggregateFunction(AggregateFunction { func, params }) = unalias(expr) else {
            return None;
        };
        if !REPEAT_INSENSITIVE.contains(&func.name()) || params.distinct || params.filter.is_some() || !params.order_by.is_empty() || params.null_treatment.is_some() {
            return None;
        }
        if !columns_of(&params.args).iter().all(|c| table.owns(c)) {
            return None;
        }
    }
    let outputs = match projection {
        Some(exprs) => exprs.iter().map(|e| unalias(e).clone()).collect(),
        None => aggregate.schema.columns().into_iter().map(Expr::Column).collect(),
    };
    Some(Subquery { outputs, aggregate, table, group: group.clone() })
}


fn columns_of(exprs: &[Expr]) -> Vec<Column> {
    let mut out = Vec::new();
    for e in exprs {
        out.extend(e.column_refs().into_iter().cloned());
    }
    out
}

/// Walks the outer side down to the scan of `table`'s rows. Returns the
/// outer side's occurrence of the table and whether some inner join on
/// the way equates `key` with its column `group`, or `None` when a node
/// on the way could drop or add rows of the table unevenly per key.
fn outer_path<'a>(plan: &'a LogicalPlan, table: &Occurrence<'_>, group: &str, key: &Column) -> Option<(Occurrence<'a>, bool)> {
    if let Some(found) = occurrence(plan) {
        return found.same_rows(table).then_some((found, false));
    }
    // Which columns of the table a node may read: only the group column.
    let reads_only_group = |columns: &[Column], qualifier: &TableReference| columns.iter().all(|c| c.relation.as_ref() != Some(qualifier) || c.name == group);
    match plan {
        LogicalPlan::Projection(p) => {
            // Not even an alias: a renamed column of the table would escape
            // the checks of the nodes above.
            if !p.expr.iter().all(|e| matches!(e, Expr::Column(_))) {
                return None;
            }
            outer_path(p.input.as_ref(), table, group, key)
        }
        LogicalPlan::Filter(f) => {
            let (found, equated) = outer_path(f.input.as_ref(), table, group, key)?;
            let columns: Vec<Column> = f.predicate.column_refs().into_iter().cloned().collect();
            reads_only_group(&columns, &found.qualifier).then_some((found, equated))
        }
        LogicalPlan::Join(j) if j.join_type == JoinType::Inner && !j.null_aware => {
            let (found, equated) = match outer_path(j.left.as_ref(), table, group, key) {
                Some(f) => f,
                None => outer_path(j.right.as_ref(), table, group, key)?,
            };
            let mut columns = Vec::new();
            for (l, r) in &j.on {
                columns.extend(l.column_refs().into_iter().cloned());
                columns.extend(r.column_refs().into_iter().cloned());
            }
            if let Some(filter) = &j.filter {
                columns.extend(filter.column_refs().into_iter().cloned());
            }
            if !reads_only_group(&columns, &found.qualifier) {
                return None;
            }
            let group_column = Column::new(Some(found.qualifier.clone()), group);
            let equates = j.on.iter().any(|(l, r)| match (l, r) {
                (Expr::Column(a), Expr::Column(b)) => (a == key && *b == group_column) || (b == key && *a == group_column),
                _ => false,
            });
            Some((found, equated || equates))
        }
        _ => None,
    }
}

/// The rewrite of one join, or `None` when the rule does not apply.
fn rewrite_join(join: &Join) -> Result<Option<LogicalPlan>> {
    if !matches!(join.join_type, JoinType::Inner | JoinType::LeftSemi) || join.null_equality != NullEquality::NullEqualsNothing || join.null_aware {
        return Ok(None);
    }
    let [(Expr::Column(key), Expr::Column(sub_group))] = join.on.as_slice() else {
        return Ok(None);
    };
    let Some(sub) = subquery(join.right.as_ref()) else {
        return Ok(None);
    };
    // The join's subquery column must be the group column passed through.
    let right_schema = join.right.schema();
    let Ok(position) = right_schema.index_of_column(sub_group) else {
        return Ok(None);
    };
    if !matches!(&sub.outputs[position], Expr::Column(c) if sub.aggregate.schema.index_of_column(c).ok() == Some(0)) {
        return Ok(None);
    }
    if !join.left.schema().has_column(key) {
        return Ok(None);
    }
    let Some((outer, equated)) = outer_path(join.left.as_ref(), &sub.table, &sub.group.name, key) else {
        return Ok(None);
    };
    // A key equal to the group column itself needs no join to equate them.
    let key_is_group = outer.owns(key) && key.name == sub.group.name;
    if !(equated || key_is_group) {
        return Ok(None);
    }
    // The aggregates' arguments, read from the outer side's columns.
    let to_outer = |e: Expr| -> Result<Expr> {
        e.transform_up(|e| match e {
            Expr::Column(c) if sub.table.owns(&c) => Ok(Transformed::yes(Expr::Column(Column::new(Some(outer.qualifier.clone()), c.name)))),
            e => Ok(Transformed::no(e)),
        })
        .map(|t| t.data)
    };
    let mut windows = Vec::with_capacity(sub.aggregate.aggr_expr.len());
    for expr in &sub.aggregate.aggr_expr {
        let Expr::AggregateFunction(AggregateFunction { func, params }) = unalias(expr) else {
            return Ok(None);
        };
        let args = params.args.iter().cloned().map(&to_outer).collect::<Result<Vec<_>>>()?;
        if !columns_of(&args).iter().all(|c| join.left.schema().has_column(c)) {
            return Ok(None);
        }
        let window = Expr::from(WindowFunction::new(WindowFunctionDefinition::AggregateUDF(Arc::clone(func)), args)).partition_by(vec![Expr::Column(key.clone())]).build()?;
        windows.push(window);
    }
    let left_width = join.left.schema().fields().len();
    let windowed = LogicalPlanBuilder::from(join.left.as_ref().clone()).filter(Expr::Column(key.clone()).is_not_null())?.window(windows)?.build()?;
    // The aggregate's output columns, as expressions over the windowed plan.
    let aggregate_schema = &sub.aggregate.schema;
    let window_columns: Vec<Expr> = (0..sub.aggregate.aggr_expr.len())
        .map(|i| {
            let (qualifier, field) = windowed.schema().qualified_field(left_width + i);
            Expr::Column(Column::new(qualifier.cloned(), field.name()))
        })
        .collect();
    let mut projection: Vec<Expr> = join.left.schema().columns().into_iter().map(Expr::Column).collect();
    let mut unmapped = false;
    for (i, output) in sub.outputs.iter().enumerate() {
        let mapped = output
            .clone()
            .transform_up(|e| match e {
                Expr::Column(c) => match aggregate_schema.index_of_column(&c) {
                    Ok(0) => Ok(Transformed::new(Expr::Column(key.clone()), true, TreeNodeRecursion::Jump)),
                    Ok(n) => Ok(Transformed::new(window_columns[n - 1].clone(), true, TreeNodeRecursion::Jump)),
                    Err(_) => {
                        unmapped = true;
                        Ok(Transformed::no(Expr::Column(c)))
                    }
                },
                e => Ok(Transformed::no(e)),
            })?
            .data;
        let (qualifier, field) = right_schema.qualified_field(i);
        projection.push(mapped.alias_qualified(qualifier.cloned(), field.name()));
    }
    if unmapped {
        return Ok(None);
    }
    let mut builder = LogicalPlanBuilder::from(windowed).project(projection)?;
    if let Some(filter) = &join.filter {
        builder = builder.filter(filter.clone())?;
    }
    if join.join_type == JoinType::LeftSemi {
        builder = builder.project(join.left.schema().columns().into_iter().map(Expr::Column))?;
    }
    let plan = builder.build()?;
    if !same_columns(plan.schema(), &join.schema) {
        return Ok(None);
    }
    Ok(Some(plan))
}

#[cfg(test)]
mod tests;
