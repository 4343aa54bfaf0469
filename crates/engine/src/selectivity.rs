//! Row estimates for filters, which decide the build sides of hash joins.
//!
//! DataFusion estimates a filter with interval analysis, which understands
//! only comparisons of numeric and date columns with constants. One conjunct
//! it does not understand — a string equality, an IN list, two columns
//! compared, a LIKE — and the whole predicate gets the default selectivity
//! (20 %). In TPC-H Q12 that estimated 12 M of SF 10's 60 M `lineitem` rows
//! where 0.3 M pass, so the hash join built its table on all 15 M `orders`
//! rows (3.1× DuckDB's time).
//!
//! [`FilterEstimates`] plugs into DataFusion's statistics registry (its
//! extension point for cardinality estimation) and estimates each conjunct
//! on its own: interval analysis where it applies, the textbook defaults of
//! System R and PostgreSQL where it does not, combined under independence.
//! It then sizes the filter's output by the columns the filter keeps, which
//! DataFusion's own estimate leaves at the size of all its input columns.
//! Only the optimizer's join choices read these numbers; answers never
//! depend on them.

use std::cmp::Ordering;
use std::sync::Arc;

use blobhouse_storage::histogram::{Histogram, fraction, to_number};
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::common::stats::Precision;
use datafusion::common::{ColumnStatistics, Result, ScalarValue, Statistics};
use datafusion::logical_expr::Operator;
use datafusion::physical_expr::intervals::utils::check_support;
use datafusion::physical_expr::utils::collect_columns;
use datafusion::physical_expr::{AnalysisContext, PhysicalExpr, analyze};
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::coalesce_partitions::CoalescePartitionsExec;
use datafusion::physical_plan::expressions::{BinaryExpr, Column, InListExpr, IsNotNullExpr, IsNullExpr, LikeExpr, Literal, NotExpr};
use datafusion::physical_plan::filter::FilterExec;
use datafusion::physical_plan::joins::{CrossJoinExec, HashJoinExec, NestedLoopJoinExec, SortMergeJoinExec};
use datafusion::physical_plan::repartition::RepartitionExec;
use datafusion::physical_plan::statistics::StatisticsArgs;
use datafusion::physical_plan::operator_statistics::{
    DefaultStatisticsProvider, ExtendedStatistics, LimitStatisticsProvider, PassthroughStatisticsProvider,
    ProjectionStatisticsProvider, StatisticsProvider, StatisticsRegistry, StatisticsResult, UnionStatisticsProvider,
};

use crate::conjunction::ConjunctionExpr;
use crate::scan::BlobScanExec;

/// An equality with a constant when the column's distinct values are
/// unknown (PostgreSQL assumes 0.005; TPC-H's filtered string columns have
/// 5 to 150 values, so 0.1 errs less).
const EQUALITY: f64 = 0.1;
/// A range comparison that interval analysis cannot bound, e.g. of two
/// columns (System R's and PostgreSQL's 1/3).
const RANGE: f64 = 1.0 / 3.0;
/// A LIKE pattern.
const LIKE: f64 = 0.1;
/// IS NULL when the column's nulls are not known.
const IS_NULL: f64 = 0.1;

/// The statistics registry the engine's sessions plan with: filters are
/// estimated by [`FilterEstimates`]; projections, repartitions, limits and
/// unions carry their inputs' estimates up; everything else (joins and
/// aggregations included) keeps DataFusion's own estimate.
///
/// DataFusion's registry-based join and aggregate estimators are left out
/// on purpose: without distinct counts they estimate an equi-join as the
/// cross product, where the built-in estimate uses the key ranges.
pub fn registry() -> StatisticsRegistry {
    StatisticsRegistry::with_providers(vec![
        Arc::new(FilterEstimates),
        Arc::new(JoinBytes),
        Arc::new(ProjectionStatisticsProvider),
        Arc::new(PassthroughStatisticsProvider),
        Arc::new(LimitStatisticsProvider),
        Arc::new(UnionStatisticsProvider),
        Arc::new(DefaultStatisticsProvider),
    ])
}

/// Estimates a [`FilterExec`]'s output conjunct by conjunct (see the module
/// docs).
#[derive(Debug, Default)]
pub struct FilterEstimates;

impl StatisticsProvider for FilterEstimates {
    fn compute_statistics(&self, plan: &dyn ExecutionPlan, child_stats: &[ExtendedStatistics]) -> Result<StatisticsResult> {
        let (Some(filter), [input]) = (plan.downcast_ref::<FilterExec>(), child_stats) else {
            return Ok(StatisticsResult::Delegate);
        };
        let schema = filter.input().schema();
        let fallback = filter.default_selectivity() as f64 / 100.0;
        let input = input.base();
        let histograms = scan_below(filter.input()).map(|scan| (0..schema.fields().len()).map(|c| scan.histograms(c)).collect::<Vec<_>>()).unwrap_or_default();
        let estimator = Estimator { schema: &schema, input, fallback, histograms: &histograms };
        let (selectivity, ranges) = estimator.estimate(filter.predicate());
        let stats = narrowed(filtered(input, selectivity), &ranges).project(filter.projection().as_ref());
        Ok(StatisticsResult::Computed(ExtendedStatistics::new(with_total_bytes(stats))))
    }
}

/// A join's output: DataFusion's row estimate, sized at its output
/// schema's row width.
///
/// DataFusion's own join estimates leave the bytes out (an inner join) or
/// keep an input's bytes whatever the rows (a semi join: 950 MB for 0.6 M
/// rows in TPC-H Q21), and the optimizer compares bytes when both join
/// sides have them, rows otherwise — so a join above a join was sized
/// against a scan in the wrong unit.
#[derive(Debug, Default)]
pub struct JoinBytes;

/// Bytes per value of a variable-width column when nothing better is
/// known: a 16-byte view and about as much data.
const VARIABLE_WIDTH: usize = 32;

impl StatisticsProvider for JoinBytes {
    fn compute_statistics(&self, plan: &dyn ExecutionPlan, inputs: &[ExtendedStatistics]) -> Result<StatisticsResult> {
        let join = plan.is::<HashJoinExec>() || plan.is::<SortMergeJoinExec>() || plan.is::<NestedLoopJoinExec>() || plan.is::<CrossJoinExec>();
        if !join {
            return Ok(StatisticsResult::Delegate);
        }
        // DataFusion's formula, over the inputs as this registry estimated
        // them (its own walk would estimate the filters below again, its way).
        let inputs: Vec<Arc<Statistics>> = inputs.iter().map(|s| s.base_arc().clone()).collect();
        let mut stats = plan.statistics_from_inputs(&inputs, &StatisticsArgs::new())?.as_ref().clone();
        if let (Some(join), [left, right]) = (plan.downcast_ref::<HashJoinExec>(), inputs.as_slice())
            && let Some(rows) = composite_key_rows(join, left, right)
        {
            stats.num_rows = Precision::Inexact(rows);
        }
        let width: usize = plan.schema().fields().iter().map(|f| f.data_type().primitive_width().unwrap_or(VARIABLE_WIDTH)).sum();
        stats.total_byte_size = match stats.num_rows.get_value() {
            Some(rows) => Precision::Inexact(rows.saturating_mul(width)),
            None => Precision::Absent,
        };
        Ok(StatisticsResult::Computed(ExtendedStatistics::new(stats)))
    }
}

/// An inner equi-join on two or more keys, estimated over the keys
/// together: |L| × |R| / max(distinct key tuples of L, of R), a side's
/// tuples being the product of its keys' distinct values, at most its rows.
///
/// DataFusion follows Spark here and divides by the most selective single
/// key only, which for TPC-H Q9's `partsupp` join (on part and supplier)
/// divides 8 M × 6 M rows by the 2 M parts: 24 M rows, where 3.3 M come out,
/// and every join above it was then sized against the wrong number. `None`
/// where a key's distinct values are unknown (DataFusion's estimate stays).
fn composite_key_rows(join: &HashJoinExec, left: &Statistics, right: &Statistics) -> Option<usize> {
    if join.on().len() < 2 || *join.join_type() != datafusion::common::JoinType::Inner {
        return None;
    }
    let (l_rows, r_rows) = (*left.num_rows.get_value()?, *right.num_rows.get_value()?);
    let tuples = |stats: &Statistics, rows: usize, side: fn(&(Arc<dyn PhysicalExpr>, Arc<dyn PhysicalExpr>)) -> &Arc<dyn PhysicalExpr>| -> Option<usize> {
        join.on().iter().try_fold(1usize, |product, pair| {
            let column = side(pair).downcast_ref::<Column>()?;
            let distinct = distinct_values(stats.column_statistics.get(column.index())?, rows)?;
            Some(product.saturating_mul(distinct.max(1)))
        })
        .map(|t| t.min(rows.max(1)))
    };
    let denominator = tuples(left, l_rows, |p| &p.0)?.max(tuples(right, r_rows, |p| &p.1)?);
    Some(((l_rows as u128 * r_rows as u128) / denominator.max(1) as u128).min(usize::MAX as u128) as usize)
}

/// A column's distinct values: its count where known, else the size of an
/// integer column's range, at most `rows`.
fn distinct_values(column: &ColumnStatistics, rows: usize) -> Option<usize> {
    if let Some(d) = column.distinct_count.get_value() {
        return Some((*d).min(rows));
    }
    let range = match (column.min_value.get_value()?, column.max_value.get_value()?) {
        (ScalarValue::Int64(Some(lo)), ScalarValue::Int64(Some(hi))) => hi.checked_sub(*lo)?.checked_add(1)?,
        (ScalarValue::Int32(Some(lo)), ScalarValue::Int32(Some(hi))) => (*hi as i64) - (*lo as i64) + 1,
        _ => return None,
    };
    usize::try_from(range).ok().map(|r| r.min(rows))
}

/// The scan a filter's input passes on unchanged, if any: the one whose
/// histograms describe the filter's columns.
fn scan_below(plan: &Arc<dyn ExecutionPlan>) -> Option<&BlobScanExec> {
    let mut node = plan;
    loop {
        if let Some(scan) = node.downcast_ref::<BlobScanExec>() {
            return Some(scan);
        }
        // Operators that keep the schema and the rows.
        if !(node.is::<RepartitionExec>() || node.is::<CoalescePartitionsExec>() || node.name() == "CoalesceBatchesExec" || node.name() == "CooperativeExec") {
            return None;
        }
        node = node.children().into_iter().next()?;
    }
}

/// The fraction of rows `predicate` keeps, in [0, 1], from statistics
/// alone (no histograms).
pub fn estimate(predicate: &Arc<dyn PhysicalExpr>, schema: &SchemaRef, input: &Statistics, fallback: f64) -> f64 {
    Estimator { schema, input, fallback, histograms: &[] }.estimate(predicate).0
}

/// A column's values kept by the range conjuncts on it: `[lo, hi]`, an
/// end `None` when open, in the column's own type.
#[derive(Debug, Clone, Default)]
struct Range {
    lo: Option<ScalarValue>,
    hi: Option<ScalarValue>,
}

impl Range {
    /// Narrows by `column op value` (`op` a range comparison).
    fn and(&mut self, op: Operator, value: ScalarValue) {
        let tighter = |old: &Option<ScalarValue>, new: &ScalarValue, wanted: Ordering| old.as_ref().is_none_or(|o| new.partial_cmp(o) == Some(wanted));
        match op {
            Operator::Gt | Operator::GtEq if tighter(&self.lo, &value, Ordering::Greater) => self.lo = Some(value),
            Operator::Lt | Operator::LtEq if tighter(&self.hi, &value, Ordering::Less) => self.hi = Some(value),
            _ => {}
        }
    }
}

/// What a filter estimate reads: its input's statistics and, per input
/// column, the histograms of the row groups a scan below reads.
struct Estimator<'a> {
    schema: &'a SchemaRef,
    input: &'a Statistics,
    fallback: f64,
    histograms: &'a [Option<&'a [Histogram]>],
}

impl Estimator<'_> {
    /// The fraction of rows `predicate` keeps, in [0, 1], and the ranges
    /// its top-level conjuncts keep of columns with histograms.
    fn estimate(&self, predicate: &Arc<dyn PhysicalExpr>) -> (f64, Vec<(usize, Range)>) {
        // The range conjuncts on one column are estimated together: apart,
        // a narrow range would be the product of two wide ones.
        let mut conjuncts = Vec::new();
        flatten_and(predicate, &mut conjuncts);
        let mut ranges: Vec<(usize, Range)> = Vec::new();
        let mut s = 1.0;
        for c in conjuncts {
            match self.range_conjunct(c) {
                Some((column, op, value)) => match ranges.iter_mut().find(|(k, _)| *k == column) {
                    Some((_, r)) => r.and(op, value),
                    None => {
                        let mut r = Range::default();
                        r.and(op, value);
                        ranges.push((column, r));
                    }
                },
                None => s *= self.one(c),
            }
        }
        for (column, range) in &ranges {
            s *= self.histogram_share(*column, range);
        }
        (s.clamp(0.0, 1.0), ranges)
    }

    /// One conjunct's estimate (never an AND: [`Self::estimate`] splits those).
    fn one(&self, predicate: &Arc<dyn PhysicalExpr>) -> f64 {
        let estimate = |e: &Arc<dyn PhysicalExpr>| self.estimate(e).0;
        let columns = &self.input.column_statistics;
        let any = predicate;
        let s = if let Some(binary) = any.downcast_ref::<BinaryExpr>() {
            match binary.op() {
                Operator::Or => {
                    let (l, r) = (estimate(binary.left()), estimate(binary.right()));
                    l + r - l * r
                }
                op => comparison(binary, *op, self.schema, columns).unwrap_or(self.fallback),
            }
        } else if let Some(not) = any.downcast_ref::<NotExpr>() {
            1.0 - estimate(not.arg())
        } else if let Some(list) = any.downcast_ref::<InListExpr>() {
            let s = (list.list().len() as f64 * equality(list.expr(), columns)).min(1.0);
            if list.negated() { 1.0 - s } else { s }
        } else if let Some(like) = any.downcast_ref::<LikeExpr>() {
            if like.negated() { 1.0 - LIKE } else { LIKE }
        } else if let Some(is_null) = any.downcast_ref::<IsNullExpr>() {
            null_fraction(is_null.arg(), self.input)
        } else if let Some(is_not_null) = any.downcast_ref::<IsNotNullExpr>() {
            1.0 - null_fraction(is_not_null.arg(), self.input)
        } else if let Some(literal) = any.downcast_ref::<Literal>() {
            match literal.value() {
                ScalarValue::Boolean(Some(true)) => 1.0,
                _ => 0.0,
            }
        } else {
            self.fallback
        };
        s.clamp(0.0, 1.0)
    }

    /// `column op value` (as written, or mirrored) when `predicate` compares
    /// a column that has histograms with a constant by `<`, `<=`, `>` or
    /// `>=`; the constant in the column's type.
    fn range_conjunct(&self, predicate: &Arc<dyn PhysicalExpr>) -> Option<(usize, Operator, ScalarValue)> {
        let binary = predicate.downcast_ref::<BinaryExpr>()?;
        let (column, op, literal) = match (binary.left().downcast_ref::<Column>(), binary.right().downcast_ref::<Literal>()) {
            (Some(c), Some(l)) => (c, *binary.op(), l),
            _ => {
                let (l, c) = (binary.left().downcast_ref::<Literal>()?, binary.right().downcast_ref::<Column>()?);
                (c, binary.op().swap()?, l)
            }
        };
        if !matches!(op, Operator::Lt | Operator::LtEq | Operator::Gt | Operator::GtEq) {
            return None;
        }
        self.histograms.get(column.index())?.as_ref()?;
        let data_type = self.schema.field(column.index()).data_type();
        let value = literal.value().cast_to(data_type).ok().filter(|v| !v.is_null())?;
        to_number(&value)?;
        Some((column.index(), op, value))
    }

    /// The share of the input's rows in `range` by `column`'s histograms,
    /// at least one row's worth (an estimate of none would make a join side
    /// vanish). The histograms cover whole row groups; the input may be
    /// fewer rows (pages the page index ruled out), so the share is taken
    /// of the row groups' rows and then of the input's.
    fn histogram_share(&self, column: usize, range: &Range) -> f64 {
        let Some(histograms) = self.histograms.get(column).copied().flatten() else { return 1.0 };
        let number = |v: &Option<ScalarValue>| v.as_ref().and_then(to_number);
        let Some(share) = fraction(histograms, number(&range.lo), number(&range.hi)) else { return 1.0 };
        let covered: u64 = histograms.iter().map(|h| h.rows).sum();
        let input = self.input.num_rows.get_value().map_or(covered, |r| *r as u64).clamp(1, covered.max(1));
        (share * covered as f64 / input as f64).clamp(1.0 / input as f64, 1.0)
    }
}

/// The conjuncts of `predicate` (itself when it is no AND).
fn flatten_and<'a>(predicate: &'a Arc<dyn PhysicalExpr>, out: &mut Vec<&'a Arc<dyn PhysicalExpr>>) {
    // Our adaptive conjunction is an AND of its children (a rule that
    // estimates after it, like the shared subplans', must see the same
    // numbers: at SF 30 Q15's `revenue` otherwise got the 20 % default and
    // was computed twice).
    if predicate.downcast_ref::<ConjunctionExpr>().is_some() {
        for c in predicate.children() {
            flatten_and(c, out);
        }
        return;
    }
    match predicate.downcast_ref::<BinaryExpr>() {
        Some(b) if *b.op() == Operator::And => {
            flatten_and(b.left(), out);
            flatten_and(b.right(), out);
        }
        _ => out.push(predicate),
    }
}

/// `stats` with the bounds of the columns in `ranges` narrowed to them: a
/// filtered column's values lie within what the filter kept, and the join
/// estimates above count its distinct values from its bounds.
fn narrowed(mut stats: Statistics, ranges: &[(usize, Range)]) -> Statistics {
    for (column, range) in ranges {
        let Some(c) = stats.column_statistics.get_mut(*column) else { continue };
        if let (Some(lo), Some(min)) = (&range.lo, c.min_value.get_value())
            && lo.partial_cmp(min) == Some(Ordering::Greater)
        {
            c.min_value = Precision::Inexact(lo.clone());
        }
        if let (Some(hi), Some(max)) = (&range.hi, c.max_value.get_value())
            && hi.partial_cmp(max) == Some(Ordering::Less)
        {
            c.max_value = Precision::Inexact(hi.clone());
        }
    }
    stats
}

/// A comparison of one column with constants: interval analysis when the
/// column's bounds are known; of two columns, or of types the analysis does
/// not handle: the defaults. `None`: no estimate (the caller's fallback).
fn comparison(binary: &BinaryExpr, op: Operator, schema: &SchemaRef, columns: &[ColumnStatistics]) -> Option<f64> {
    let expr: Arc<dyn PhysicalExpr> = Arc::new(binary.clone());
    let referenced = collect_columns(&expr);
    let bounded = |c: &Column| columns.get(c.index()).is_some_and(|s| s.min_value.get_value().is_some() && s.max_value.get_value().is_some());
    let one_column = referenced.len() == 1;
    if one_column && referenced.iter().all(bounded) && check_support(&expr, schema) {
        let context = AnalysisContext::try_from_statistics(schema, columns).ok()?;
        if let Some(s) = analyze(&expr, context, schema).ok().and_then(|a| a.selectivity) {
            return Some(s);
        }
    }
    let side = if binary.left().downcast_ref::<Column>().is_some() { binary.left() } else { binary.right() };
    match op {
        Operator::Eq | Operator::IsNotDistinctFrom => Some(equality(side, columns)),
        Operator::NotEq | Operator::IsDistinctFrom => Some(1.0 - equality(side, columns)),
        // A column without bounds against a constant (e.g. HAVING sum(x) >
        // 300) is anyone's guess: the caller's fallback, as DataFusion does.
        Operator::Lt | Operator::LtEq | Operator::Gt | Operator::GtEq if one_column => None,
        Operator::Lt | Operator::LtEq | Operator::Gt | Operator::GtEq => Some(RANGE),
        Operator::LikeMatch | Operator::ILikeMatch | Operator::RegexMatch | Operator::RegexIMatch => Some(LIKE),
        Operator::NotLikeMatch | Operator::NotILikeMatch | Operator::RegexNotMatch | Operator::RegexNotIMatch => Some(1.0 - LIKE),
        _ => None,
    }
}

/// The share of rows equal to one value of `expr`: 1 / distinct values when
/// `expr` is a column whose distinct values are known.
fn equality(expr: &Arc<dyn PhysicalExpr>, columns: &[ColumnStatistics]) -> f64 {
    expr
        .downcast_ref::<Column>()
        .and_then(|c| columns.get(c.index()))
        .and_then(|s| s.distinct_count.get_value().copied())
        .filter(|n| *n > 0)
        .map_or(EQUALITY, |n| 1.0 / n as f64)
}

/// The share of rows where `expr` is null: from the column's null count
/// when both it and the rows are known.
fn null_fraction(expr: &Arc<dyn PhysicalExpr>, input: &Statistics) -> f64 {
    let nulls = expr.downcast_ref::<Column>().and_then(|c| input.column_statistics.get(c.index())).and_then(|s| s.null_count.get_value().copied());
    match (nulls, input.num_rows.get_value()) {
        (Some(n), Some(&rows)) if rows > 0 => n as f64 / rows as f64,
        _ => IS_NULL,
    }
}

/// `input` with `selectivity` of its rows: counts scaled, bounds kept (a
/// subset's values stay within them), everything inexact.
fn filtered(input: &Statistics, selectivity: f64) -> Statistics {
    let rows = input.num_rows.with_estimated_selectivity(selectivity);
    let cap = |p: Precision<usize>| match (p.get_value(), rows.get_value()) {
        (Some(v), Some(r)) => Precision::Inexact((*v).min(*r)),
        _ => p.to_inexact(),
    };
    let column_statistics = input
        .column_statistics
        .iter()
        .map(|c| ColumnStatistics {
            null_count: cap(c.null_count),
            distinct_count: cap(c.distinct_count),
            byte_size: c.byte_size.with_estimated_selectivity(selectivity),
            sum_value: Precision::Absent,
            ..c.clone().to_inexact()
        })
        .collect();
    Statistics { num_rows: rows, total_byte_size: input.total_byte_size.with_estimated_selectivity(selectivity), column_statistics }
}

/// `stats` with its total bytes the sum of its columns' bytes, when every
/// column's is known (after a projection the total would otherwise still
/// count the columns dropped).
fn with_total_bytes(mut stats: Statistics) -> Statistics {
    let columns = stats.column_statistics.iter().map(|c| c.byte_size).try_fold(0usize, |sum, b| b.get_value().map(|b| sum + b));
    if let Some(total) = columns {
        stats.total_byte_size = Precision::Inexact(total);
    }
    stats
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::datatypes::{DataType, Field, Schema};
    use datafusion::common::ScalarValue;
    use datafusion::physical_plan::expressions::{binary, col, in_list, lit, like};

    /// `s` (a string), `a` and `b` (unbounded integers), `d` (an integer in
    /// [0, 700]), over 1000 rows of which 100 have a null `s`.
    fn input() -> (SchemaRef, Statistics) {
        let schema = Arc::new(Schema::new(vec![
            Field::new("s", DataType::Utf8, true),
            Field::new("a", DataType::Int64, false),
            Field::new("b", DataType::Int64, false),
            Field::new("d", DataType::Int64, false),
        ]));
        let mut stats = Statistics::new_unknown(&schema);
        stats.num_rows = Precision::Exact(1000);
        stats.column_statistics[0].null_count = Precision::Exact(100);
        stats.column_statistics[3].min_value = Precision::Inexact(ScalarValue::Int64(Some(0)));
        stats.column_statistics[3].max_value = Precision::Inexact(ScalarValue::Int64(Some(700)));
        for (c, bytes) in stats.column_statistics.iter_mut().zip([40_000, 8000, 8000, 8000]) {
            c.byte_size = Precision::Inexact(bytes);
        }
        (schema, stats)
    }

    fn estimated(predicate: Arc<dyn PhysicalExpr>) -> f64 {
        let (schema, stats) = input();
        estimate(&predicate, &schema, &stats, 0.2)
    }

    fn close(got: f64, want: f64) {
        assert!((got - want).abs() < 0.01, "estimated {got}, want {want}");
    }

    #[test]
    fn conjuncts_are_estimated_one_by_one_and_multiplied() {
        let (schema, _) = input();
        let s = || col("s", &schema).unwrap();
        let eq = |v: &str| binary(s(), Operator::Eq, lit(v), &schema).unwrap();
        close(estimated(eq("MAIL")), EQUALITY);
        let either = binary(eq("MAIL"), Operator::Or, eq("SHIP"), &schema).unwrap();
        close(estimated(either.clone()), 0.19);
        close(estimated(in_list(s(), vec![lit("MAIL"), lit("SHIP")], &false, &schema).unwrap()), 0.2);
        close(estimated(like(true, false, s(), lit("%x%"), &schema).unwrap()), 1.0 - LIKE);

        let columns = binary(col("a", &schema).unwrap(), Operator::Lt, col("b", &schema).unwrap(), &schema).unwrap();
        close(estimated(columns.clone()), RANGE);
        // One year of seven, as interval analysis over d's bounds says.
        let d = |op, v: i64| binary(col("d", &schema).unwrap(), op, lit(v), &schema).unwrap();
        let year = binary(d(Operator::GtEq, 0), Operator::And, d(Operator::Lt, 100), &schema).unwrap();
        close(estimated(year.clone()), 100.0 / 700.0);

        // DataFusion gives this whole predicate its 20 % default.
        let q12 = binary(binary(either.clone(), Operator::And, columns.clone(), &schema).unwrap(), Operator::And, year.clone(), &schema).unwrap();
        close(estimated(q12), 0.19 * RANGE * 100.0 / 700.0);
        // The same conjuncts in the adaptive filter's expression: the same estimate.
        let adaptive = crate::conjunction::ConjunctionExpr::try_new(vec![either, columns, d(Operator::GtEq, 0), d(Operator::Lt, 100)], &schema).unwrap();
        close(estimated(Arc::new(adaptive)), 0.19 * RANGE * 100.0 / 700.0);
    }

    #[test]
    fn range_conjuncts_on_a_column_with_histograms_are_estimated_together() {
        let (schema, stats) = input();
        // d's values: three quarters of the rows in [0, 90], the rest up to 700.
        let inner: Vec<String> = ["15", "30", "45", "60", "75", "90", "400"].iter().map(|v| v.to_string()).collect();
        let h = vec![Histogram::parse(1000, &DataType::Int64, Some("0"), Some(&inner), Some("700")).unwrap()];
        let histograms = [None, None, None, Some(h.as_slice())];
        let e = Estimator { schema: &schema, input: &stats, fallback: 0.2, histograms: &histograms };
        let d = |op, v: i64| binary(col("d", &schema).unwrap(), op, lit(v), &schema).unwrap();
        let and = |a, b| binary(a, Operator::And, b, &schema).unwrap();

        let first = and(d(Operator::GtEq, 0), d(Operator::Lt, 90));
        let (share, ranges) = e.estimate(&first);
        close(share, 0.75);
        // Without histograms: evenly between the bounds.
        close(estimate(&first, &schema, &stats, 0.2), 90.0 / 700.0);
        // The filter's output keeps d within what it kept.
        let out = narrowed(filtered(&stats, share), &ranges);
        assert_eq!(out.column_statistics[3].min_value, Precision::Inexact(ScalarValue::Int64(Some(0))));
        assert_eq!(out.column_statistics[3].max_value, Precision::Inexact(ScalarValue::Int64(Some(90))));

        // A narrow range in the middle, written both ways round, with
        // another conjunct between: two buckets, times the other's share.
        let s = binary(col("s", &schema).unwrap(), Operator::Eq, lit("MAIL"), &schema).unwrap();
        let mirrored = binary(lit(60i64), Operator::GtEq, col("d", &schema).unwrap(), &schema).unwrap();
        close(e.estimate(&and(and(d(Operator::GtEq, 30), s), mirrored)).0, 0.25 * EQUALITY);
        // The tighter of two bounds on one side wins.
        close(e.estimate(&and(d(Operator::Lt, 400), d(Operator::Lt, 90))).0, 0.75);
        // A range outside the values keeps one row's worth, not none.
        close(e.estimate(&d(Operator::Gt, 5000)).0, 0.001);
        // Other columns and other comparisons go the old way.
        close(e.estimate(&binary(col("a", &schema).unwrap(), Operator::Gt, lit(300i64), &schema).unwrap()).0, 0.2);
    }

    #[test]
    fn what_nothing_is_known_about_gets_the_fallback() {
        let (schema, _) = input();
        // An unbounded column against a constant (HAVING sum(x) > 300).
        close(estimated(binary(col("a", &schema).unwrap(), Operator::Gt, lit(300i64), &schema).unwrap()), 0.2);
        let is_null = Arc::new(IsNullExpr::new(col("s", &schema).unwrap()));
        close(estimated(is_null.clone()), 0.1);
        close(estimated(Arc::new(NotExpr::new(is_null))), 0.9);
    }

    #[test]
    fn a_filter_is_sized_by_the_columns_it_keeps() {
        let (_, stats) = input();
        let out = with_total_bytes(filtered(&stats, 0.5).project(Some(&vec![1usize, 3])));
        assert_eq!(out.num_rows, Precision::Inexact(500));
        assert_eq!(out.total_byte_size, Precision::Inexact(8000));
        assert_eq!(out.column_statistics[1].min_value, Precision::Inexact(ScalarValue::Int64(Some(0))));
    }
}
