//! [`SubqueryWindowRule`]: a correlated aggregate over rows the outer
//! query already joins becomes a window over the outer query's rows —
//! TPC-H Q17's `avg(l_quantity)` per part is computed from the line items
//! the query has already joined to its parts, not from a second scan of
//! all of `lineitem`; Q2's `min(ps_supplycost)` per part from the region's
//! suppliers the query has already joined.
//!
//! Why ours: DataFusion 55 decorrelates `x < (SELECT avg(y) FROM t WHERE
//! t.k = outer.k)` into a join with `SELECT k, avg(y) FROM t GROUP BY k`,
//! which reads `t` a second time, in full. When the outer query reads the
//! same rows and keeps, for each key it keeps, every one of them with that
//! key, the aggregate can be read off the outer rows instead (the WinMagic
//! rewrite of IBM's DB2, Zuzarte et al., SIGMOD 2003). No DataFusion rule
//! does this, and DuckDB does not either (it reads `lineitem` twice in
//! Q17). At SF 10 the second scan of Q17 decodes 60 M rows to keep 61 K.
//!
//! When it is exact — the rule rewrites only a plan it can prove:
//! - The join is an inner or left-semi equi-join on `outer.k = sub.g` (and
//!   possibly more pairs, which become filters), NULLs never equal,
//!   optionally with a filter over both sides.
//! - The subquery side is `[alias] [projection] Aggregate(GROUP BY g)` over
//!   a plan `P` of scans, filters, inner joins and projections of plain
//!   columns; its aggregates are `avg`, `min` or `max` without DISTINCT,
//!   FILTER or ORDER BY. These three do not change when every row of a
//!   group is repeated the same number of times.
//! - The outer side holds `P` as it is — each of its scans (same table,
//!   name, pushed-down filters, no limit), filters and joins — and besides
//!   only projections of plain columns, filters and inner joins that read
//!   no column of `P`'s tables but `g`; one of those joins equates
//!   `outer.k` with `g` (or `outer.k` is `g`). Then for each key value the
//!   outer rows hold every row of `P` with that `g`, each repeated as often
//!   as its key's partners on the other sides: the same number for all
//!   rows of a key. The window `agg(y) OVER (PARTITION BY outer.k)`
//!   therefore equals the subquery's `agg(y)` for that key. (A subquery
//!   over one table may name it by another alias than the outer query.)
//! - A key the outer side does not have cannot match; a NULL key never
//!   matches, so rows with a NULL `outer.k` are dropped as the join did.
//!
//! The result is `Filter(other pairs, join filter) ∘ Projection(outer
//! columns, the subquery's columns from the window)` over the outer side,
//! with the join's own output columns (names, qualifiers, types).

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
        // A rewrite that fails to build leaves the query as it was: the
        // rule only ever removes work, it must never fail a query.
        match rewrite_join(join) {
            Ok(Some(new)) => Ok(Transformed::yes(new)),
            Ok(None) | Err(_) => Ok(Transformed::no(plan)),
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

/// `plan` below projections of plain columns (which choose columns, not
/// rows). Not below an alias: a renamed column would escape the checks.
fn below_projections(plan: &LogicalPlan) -> &LogicalPlan {
    match plan {
        LogicalPlan::Projection(p) if p.expr.iter().all(|e| matches!(e, Expr::Column(_))) => below_projections(&p.input),
        p => p,
    }
}

/// The qualifiers of the tables a subquery's rows come from, when they
/// come from scans through filters, inner joins and projections of plain
/// columns only.
fn source_tables(plan: &LogicalPlan, out: &mut Vec<TableReference>) -> Option<()> {
    if let Some(o) = occurrence(plan) {
        out.push(o.qualifier);
        return Some(());
    }
    match below_projections(plan) {
        LogicalPlan::Filter(f) => source_tables(&f.input, out),
        LogicalPlan::Join(j) if j.join_type == JoinType::Inner && !j.null_aware => {
            source_tables(&j.left, out)?;
            source_tables(&j.right, out)
        }
        p if !std::ptr::eq(p, plan) => source_tables(p, out),
        _ => None,
    }
}

/// The subquery side: its output columns as expressions over the
/// aggregate's output, the aggregate, and the rows it aggregates.
struct Subquery<'a> {
    outputs: Vec<Expr>,
    aggregate: &'a Aggregate,
    /// The aggregate's input and the qualifiers of its tables.
    source: &'a LogicalPlan,
    tables: Vec<TableReference>,
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
    let mut tables = Vec::new();
    source_tables(aggregate.input.as_ref(), &mut tables)?;
    let owned = |c: &Column| c.relation.as_ref().is_some_and(|r| tables.contains(r));
    let [Expr::Column(group)] = aggregate.group_expr.as_slice() else {
        return None;
    };
    if !owned(group) {
        return None;
    }
    for expr in &aggregate.aggr_expr {
        let Expr::AggregateFunction(AggregateFunction { func, params }) = unalias(expr) else {
            return None;
        };
        if !REPEAT_INSENSITIVE.contains(&func.name()) || params.distinct || params.filter.is_some() || !params.order_by.is_empty() || params.null_treatment.is_some() {
            return None;
        }
        if !columns_of(&params.args).iter().all(owned) {
            return None;
        }
    }
    let outputs = match projection {
        Some(exprs) => exprs.iter().map(|e| unalias(e).clone()).collect(),
        None => aggregate.schema.columns().into_iter().map(Expr::Column).collect(),
    };
    Some(Subquery { outputs, aggregate, source: aggregate.input.as_ref(), tables, group: group.clone() })
}

fn columns_of(exprs: &[Expr]) -> Vec<Column> {
    let mut out = Vec::new();
    for e in exprs {
        out.extend(e.column_refs().into_iter().cloned());
    }
    out
}

/// Every occurrence of a table in `plan`, at any depth.
fn occurrences<'a>(plan: &'a LogicalPlan, out: &mut Vec<Occurrence<'a>>) {
    if let Some(o) = occurrence(plan) {
        out.push(o);
        return;
    }
    for input in plan.inputs() {
        occurrences(input, out);
    }
}

/// How the outer side names the subquery's tables. A subquery over one
/// table may read it under another alias than the outer query does (`FROM
/// item i … (SELECT avg(qty) FROM item x …)`): then the table's one
/// occurrence in the outer side gives the name. Over several tables the
/// names must be the same.
fn outer_names(sub: &Subquery<'_>, outer: &LogicalPlan) -> Option<Option<(TableReference, TableReference)>> {
    let Some(inner) = occurrence(sub.source) else {
        return Some(None);
    };
    let mut found = Vec::new();
    occurrences(outer, &mut found);
    let same: Vec<&Occurrence<'_>> = found.iter().filter(|o| o.same_rows(&inner)).collect();
    match same.as_slice() {
        [one] if one.qualifier != inner.qualifier => Some(Some((inner.qualifier.clone(), one.qualifier.clone()))),
        [_] => Some(None),
        _ => None,
    }
}

/// What the outer side is matched against: the subquery's rows, its
/// tables' qualifiers as the outer side names them, the group column and
/// the outer join key.
struct Target<'a> {
    source: &'a LogicalPlan,
    rename: Option<(TableReference, TableReference)>,
    tables: Vec<TableReference>,
    group: Column,
    key: &'a Column,
}

/// `q` as the outer side names it.
fn renamed(rename: &Option<(TableReference, TableReference)>, q: &TableReference) -> TableReference {
    match rename {
        Some((from, to)) if from == q => to.clone(),
        _ => q.clone(),
    }
}

impl Target<'_> {
    fn outer_name(&self, q: &TableReference) -> TableReference {
        renamed(&self.rename, q)
    }

    /// Whether `columns` read the subquery's tables only through the group
    /// column.
    fn reads_only_group<'c>(&self, mut columns: impl Iterator<Item = &'c Column>) -> bool {
        columns.all(|c| c.relation.as_ref().is_none_or(|r| !self.tables.contains(r)) || *c == self.group)
    }

    /// Whether `on` equates the key with the group column.
    fn equates(&self, on: &[(Expr, Expr)]) -> bool {
        on.iter().any(|(l, r)| match (l, r) {
            (Expr::Column(a), Expr::Column(b)) => (a == self.key && *b == self.group) || (b == self.key && *a == self.group),
            _ => false,
        })
    }
}

/// Matches the outer side `outer` against the subquery's rows `sub`: every
/// node of `sub` must be found in `outer` as it is, and every other node of
/// `outer` may only select or repeat rows by the group column (a filter or
/// inner join that reads no other column of the subquery's tables). Returns
/// whether one of those nodes equates the outer key with the group column,
/// or `None` when `outer` does not match.
fn matches(outer: &LogicalPlan, sub: &LogicalPlan, target: &Target<'_>) -> Option<bool> {
    if let (Some(o), Some(s)) = (occurrence(outer), occurrence(sub)) {
        return (o.same_rows(&s) && o.qualifier == target.outer_name(&s.qualifier)).then_some(false);
    }
    let (o, s) = (below_projections(outer), below_projections(sub));
    match (o, s) {
        (LogicalPlan::Filter(a), LogicalPlan::Filter(b)) if a.predicate == b.predicate => return matches(&a.input, &b.input, target),
        (LogicalPlan::Join(a), LogicalPlan::Join(b)) if a.join_type == b.join_type && a.on == b.on && a.filter == b.filter && a.null_equality == b.null_equality && a.null_aware == b.null_aware => {
            // Both sides must match: no short-circuit.
            let (left, right) = (matches(&a.left, &b.left, target)?, matches(&a.right, &b.right, target)?);
            return Some(left || right);
        }
        _ => {}
    }
    // A node of the outer side only: it may read the subquery's tables
    // through the group column alone.
    match o {
        LogicalPlan::Filter(f) if target.reads_only_group(f.predicate.column_refs().into_iter()) => matches(&f.input, sub, target),
        LogicalPlan::Join(j) if j.join_type == JoinType::Inner && !j.null_aware => {
            let on = j.on.iter().flat_map(|(l, r)| l.column_refs().into_iter().chain(r.column_refs()));
            let filter = j.filter.iter().flat_map(|f| f.column_refs());
            if !target.reads_only_group(on.chain(filter)) {
                return None;
            }
            let below = matches(&j.left, sub, target).or_else(|| matches(&j.right, sub, target))?;
            Some(below || target.equates(&j.on))
        }
        p if !std::ptr::eq(p, outer) => matches(p, sub, target),
        _ => None,
    }
}

/// The rewrite of one join, or `None` when the rule does not apply.
fn rewrite_join(join: &Join) -> Result<Option<LogicalPlan>> {
    if !matches!(join.join_type, JoinType::Inner | JoinType::LeftSemi) || join.null_equality != NullEquality::NullEqualsNothing || join.null_aware {
        return Ok(None);
    }
    let Some(sub) = subquery(join.right.as_ref()) else {
        return Ok(None);
    };
    // The key pair: the subquery's group column, passed through, equal to
    // a column of the outer side. Other pairs become filters.
    let right_schema = join.right.schema();
    let is_group = |e: &Expr| match e {
        Expr::Column(c) => right_schema.index_of_column(c).is_ok_and(|i| matches!(&sub.outputs[i], Expr::Column(g) if sub.aggregate.schema.index_of_column(g).ok() == Some(0))),
        _ => false,
    };
    let Some(pair) = join.on.iter().position(|(l, r)| matches!(l, Expr::Column(_)) && is_group(r)) else {
        return Ok(None);
    };
    let Expr::Column(key) = &join.on[pair].0 else {
        return Ok(None);
    };
    let others: Vec<Expr> = join.on.iter().enumerate().filter(|(i, _)| *i != pair).map(|(_, (l, r))| l.clone().eq(r.clone())).collect();
    if !join.left.schema().has_column(key) {
        return Ok(None);
    }
    let Some(rename) = outer_names(&sub, join.left.as_ref()) else {
        return Ok(None);
    };
    let outer_column = |c: &Column| Column::new(c.relation.as_ref().map(|q| renamed(&rename, q)), c.name.clone());
    let tables = sub.tables.iter().map(|q| renamed(&rename, q)).collect();
    let target = Target { source: sub.source, rename: rename.clone(), tables, group: outer_column(&sub.group), key };
    let Some(equated) = matches(join.left.as_ref(), target.source, &target) else {
        return Ok(None);
    };
    // A key that is the group column itself needs no join to equate them.
    if !(equated || *key == target.group) {
        return Ok(None);
    }
    // The aggregates' arguments, read from the outer side's columns.
    let to_outer = |e: Expr| -> Result<Expr> {
        e.transform_up(|e| match e {
            Expr::Column(c) => Ok(Transformed::yes(Expr::Column(outer_column(&c)))),
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
    // The other key pairs (NULL never equal, as in the join) and the filter.
    for condition in others.into_iter().chain(join.filter.clone()) {
        builder = builder.filter(condition)?;
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
