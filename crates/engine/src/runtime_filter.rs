//! Filters that the operators above a scan fill in while the query runs —
//! a hash join's build-side keys, a TopK's current threshold — applied by
//! the scan to what it reads.
//!
//! DataFusion creates these filters (`DynamicFilterPhysicalExpr`) and pushes
//! them down to the scans of the probe side when the plan is optimised;
//! they start as `true` and are updated when the join's build side is
//! complete. Its own Parquet scan uses them to prune files and row groups.
//! Ours does two things with them:
//!
//! - **rows**: each decoded batch is filtered before it leaves the scan, so
//!   rows no join will match never reach the join's probe, its output or
//!   the operators above (TPC-H Q18 joined 60 million rows at SF 10 only
//!   to drop all but 30 thousand of them in a semi join afterwards);
//! - **row groups**: a row group whose zone maps show no row can pass is
//!   not downloaded at all (see [`crate::scan`]).
//!
//! Filtering rows costs an evaluation per row, which is wasted when the
//! filter keeps almost everything; each partition therefore measures what
//! the current filter keeps and stops applying it to rows after
//! [`BYPASS_AFTER_ROWS`] rows when it keeps more than [`BYPASS_KEPT_PERCENT`]
//! of them (a new version of the filter is measured afresh). DataFusion's
//! filter for a partitioned join (a `CASE` over the hash partition, then a
//! hash lookup) costs about as much per row as the join's own probe, so it
//! pays only when it drops most rows. Measured on TPC-H (optimised, local,
//! 2 cores), thresholds from 1 % to 80 %: at SF 10 filters keeping up to
//! ~30 % pay, also through chains of joins (Q7 4.9 → 2.0 s once customer,
//! then orders are filtered by the nations; Q18 17.5 → 6 s; Q17 4.9 →
//! 3.5 s); higher thresholds made Q3, Q5, Q9 and Q21 slower at SF 1, where
//! lineitem is one row group that one core decodes and filters while the
//! join's work is spread over two. The filters
//! pushed into the scan at planning are evaluated first, so a runtime
//! filter reads only rows the operators above would see anyway (Q19: 1.3 M
//! of 60 M). Dropping rows
//! is only an optimisation: the operator that made the filter still checks
//! every row it gets, so a filter applied late, in part, or not at all
//! never changes an answer.

use std::sync::Arc;

use datafusion::arrow::array::{Array, AsArray, BooleanArray, RecordBatch};
use datafusion::arrow::compute::{filter_record_batch, prep_null_mask_filter};
use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
use datafusion::common::{DataFusionError, Result, ScalarValue};
use datafusion::physical_expr::expressions::{DynamicFilterPhysicalExpr, Literal};
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::physical_expr::split_conjunction;
use datafusion::physical_expr::utils::{collect_columns, conjunction, reassign_expr_columns};
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_expr_common::physical_expr::{snapshot_generation, snapshot_physical_expr};
use datafusion::physical_expr_common::utils::scatter;

use crate::conjunction::ConjunctionExpr;

/// Rows a partition filters before it judges whether filtering pays.
pub const BYPASS_AFTER_ROWS: u64 = 64 * 1024;
/// A filter that keeps more than this share of rows is not applied to rows.
pub const BYPASS_KEPT_PERCENT: u64 = 30;

/// Whether `expr` holds a filter that changes while the query runs.
pub fn is_runtime_filter(expr: &Arc<dyn PhysicalExpr>) -> bool {
    let mut found = false;
    let _ = expr.apply(|e| {
        found = e.downcast_ref::<DynamicFilterPhysicalExpr>().is_some();
        Ok(if found { TreeNodeRecursion::Stop } else { TreeNodeRecursion::Continue })
    });
    found
}

/// The runtime filters of one scan, as one predicate over the scan's
/// output schema.
#[derive(Debug, Clone)]
pub struct RuntimeFilters {
    exprs: Vec<Arc<dyn PhysicalExpr>>,
    predicate: Arc<dyn PhysicalExpr>,
    /// Filters the scan waits for before it decodes: their producer ends
    /// before the scan's rows are needed ([`crate::key_transfer`]).
    awaited: Vec<Arc<DynamicFilterPhysicalExpr>>,
}

impl RuntimeFilters {
    /// `None` when there are none.
    pub fn new(exprs: Vec<Arc<dyn PhysicalExpr>>) -> Option<Self> {
        if exprs.is_empty() {
            return None;
        }
        let predicate = conjunction(exprs.iter().cloned());
        Some(RuntimeFilters { exprs, predicate, awaited: Vec::new() })
    }

    /// `existing` and one more filter, which the scan waits for before it
    /// decodes when `wait` (see [`Self::awaited`]).
    pub fn adding(existing: Option<&RuntimeFilters>, filter: Arc<DynamicFilterPhysicalExpr>, wait: bool) -> Self {
        let mut exprs = existing.map_or_else(Vec::new, |r| r.exprs.clone());
        exprs.push(Arc::clone(&filter) as Arc<dyn PhysicalExpr>);
        let mut awaited = existing.map_or_else(Vec::new, |r| r.awaited.clone());
        if wait {
            awaited.push(filter);
        }
        RuntimeFilters { predicate: conjunction(exprs.iter().cloned()), exprs, awaited }
    }

    /// The filters to wait for before decoding: each is complete once its
    /// producer (a join's build side) ended, which does not depend on this
    /// scan. Waiting keeps the scan from decoding, and passing up, rows the
    /// filter would have dropped a moment later.
    pub fn awaited(&self) -> &[Arc<DynamicFilterPhysicalExpr>] {
        &self.awaited
    }

    /// The filters as they were pushed down (for EXPLAIN and plan walks).
    pub fn exprs(&self) -> &[Arc<dyn PhysicalExpr>] {
        &self.exprs
    }

    /// Changes whenever any of the filters is updated.
    pub fn generation(&self) -> u64 {
        snapshot_generation(&self.predicate)
    }

    /// The filters' current state as a static predicate; `None` while it
    /// still keeps every row.
    pub fn current(&self) -> Result<Option<Arc<dyn PhysicalExpr>>> {
        let snapshot = snapshot_physical_expr(self.predicate.clone())?;
        let keeps_all = snapshot.downcast_ref::<Literal>().is_some_and(|l| l.value() == &ScalarValue::Boolean(Some(true)));
        Ok((!keeps_all).then_some(snapshot))
    }

    /// A filter of batches of `schema` (the scan's output) for one
    /// partition of the scan. `pushed` is the conjunction of the filters
    /// pushed into the scan at planning (which the operators above apply
    /// again): rows it rejects are dropped first, so that the runtime
    /// filters are evaluated only on rows that would reach them anyway.
    pub fn rows(&self, schema: &SchemaRef, pushed: Option<&Arc<dyn PhysicalExpr>>) -> Result<RowFilter> {
        let pushed = pushed.map(|p| Narrow::new(p.clone(), schema)).transpose()?;
        Ok(RowFilter { filters: self.clone(), schema: schema.clone(), pushed, generation: None, current: None, rows_in: 0, rows_kept: 0, bypass: false })
    }
}

/// A predicate rewritten to read only the columns it needs: predicates can
/// copy their input (CASE does, per branch), and scans are wide.
#[derive(Debug)]
struct Narrow {
    predicate: Arc<dyn PhysicalExpr>,
    /// Positions of the columns it reads in the full batch.
    columns: Vec<usize>,
}

impl Narrow {
    fn new(predicate: Arc<dyn PhysicalExpr>, schema: &SchemaRef) -> Result<Narrow> {
        let mut columns: Vec<usize> = collect_columns(&predicate).iter().map(|c| c.index()).collect();
        columns.sort_unstable();
        columns.dedup();
        let narrow = schema.project(&columns)?;
        let predicate = reassign_expr_columns(predicate, &narrow)?;
        // Several filters (or one with several conjuncts): each runs on the
        // rows the cheaper, more selective ones kept — DataFusion's hash
        // lookup after our Bloom filter, for one.
        let conjuncts: Vec<Arc<dyn PhysicalExpr>> = split_conjunction(&predicate).into_iter().cloned().collect();
        let predicate = if conjuncts.len() > 1 { Arc::new(ConjunctionExpr::try_new(conjuncts, &narrow)?) } else { predicate };
        Ok(Narrow { predicate, columns })
    }

    /// Which rows of `batch` pass (null: do not pass).
    fn evaluate(&self, batch: &RecordBatch) -> Result<BooleanArray> {
        self.evaluate_narrow(&batch.project(&self.columns)?)
    }

    /// Like [`Self::evaluate`], on a batch of only its columns.
    fn evaluate_narrow(&self, narrow: &RecordBatch) -> Result<BooleanArray> {
        let mask = self.predicate.evaluate(narrow)?.into_array(narrow.num_rows())?;
        let mask = mask
            .as_boolean_opt()
            .ok_or_else(|| DataFusionError::Internal(format!("filter {} gave {} instead of booleans", self.predicate, mask.data_type())))?;
        Ok(if Array::null_count(mask) > 0 { prep_null_mask_filter(mask) } else { mask.clone() })
    }
}

/// Applies the runtime filters to one partition's batches, measuring
/// whether it pays.
#[derive(Debug)]
pub struct RowFilter {
    filters: RuntimeFilters,
    schema: SchemaRef,
    pushed: Option<Narrow>,
    generation: Option<u64>,
    current: Option<Narrow>,
    rows_in: u64,
    rows_kept: u64,
    bypass: bool,
}

impl RowFilter {
    /// The rows of `batch` the filters keep (all of them while the filters
    /// are empty or do not pay).
    pub fn apply(&mut self, batch: RecordBatch) -> Result<RecordBatch> {
        let generation = self.filters.generation();
        if self.generation != Some(generation) {
            self.generation = Some(generation);
            self.current = self.filters.current()?.map(|p| Narrow::new(p, &self.schema)).transpose()?;
            (self.rows_in, self.rows_kept, self.bypass) = (0, 0, false);
        }
        let Some(runtime) = self.current.as_ref().filter(|_| !self.bypass) else { return Ok(batch) };
        let mask = match &self.pushed {
            None => runtime.evaluate(&batch)?,
            Some(pushed) => {
                let first = pushed.evaluate(&batch)?;
                let survivors = filter_record_batch(&batch.project(&runtime.columns)?, &first)?;
                let second = runtime.evaluate_narrow(&survivors)?;
                // Back to one flag per row of `batch`; rows the first
                // filter dropped become null, which does not pass.
                scatter(&first, &second)?.as_boolean().clone()
            }
        };
        let kept = filter_record_batch(&batch, &mask)?;
        self.rows_in += batch.num_rows() as u64;
        self.rows_kept += kept.num_rows() as u64;
        if self.rows_in >= BYPASS_AFTER_ROWS && self.rows_kept * 100 > self.rows_in * BYPASS_KEPT_PERCENT {
            self.bypass = true;
        }
        Ok(kept)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::{Int64Array, StringArray};
    use datafusion::arrow::datatypes::{DataType, Field, Schema};
    use datafusion::logical_expr::Operator;
    use datafusion::physical_expr::expressions::{BinaryExpr, Column, lit};

    fn schema() -> SchemaRef {
        Arc::new(Schema::new(vec![Field::new("name", DataType::Utf8, true), Field::new("k", DataType::Int64, true)]))
    }

    fn batch(keys: Vec<Option<i64>>) -> RecordBatch {
        let names: StringArray = keys.iter().map(|k| k.map(|k| format!("n{k}"))).collect();
        RecordBatch::try_new(schema(), vec![Arc::new(names), Arc::new(Int64Array::from(keys))]).unwrap()
    }

    fn keys(b: &RecordBatch) -> Vec<Option<i64>> {
        b.column(1).as_primitive::<datafusion::arrow::datatypes::Int64Type>().iter().collect()
    }

    fn k_below(n: i64) -> Arc<dyn PhysicalExpr> {
        Arc::new(BinaryExpr::new(Arc::new(Column::new("k", 1)), Operator::Lt, lit(n)))
    }

    /// A dynamic filter over column `k`, as a hash join makes one.
    fn dynamic() -> Arc<DynamicFilterPhysicalExpr> {
        Arc::new(DynamicFilterPhysicalExpr::new(vec![Arc::new(Column::new("k", 1))], lit(true)))
    }

    #[test]
    fn rows_pass_until_the_filter_is_filled_and_nulls_never_pass_after() {
        let filter = dynamic();
        let filters = RuntimeFilters::new(vec![filter.clone() as Arc<dyn PhysicalExpr>]).unwrap();
        assert!(is_runtime_filter(&filters.exprs()[0]));
        assert!(!is_runtime_filter(&k_below(3)));
        let mut rows = filters.rows(&schema(), None).unwrap();
        let input = vec![Some(1), None, Some(5), Some(2)];
        assert_eq!(keys(&rows.apply(batch(input.clone())).unwrap()), input, "an empty filter keeps every row");
        filter.update(k_below(3)).unwrap();
        let kept = rows.apply(batch(input)).unwrap();
        assert_eq!(keys(&kept), vec![Some(1), Some(2)]);
        assert_eq!(kept.column(0).as_string::<i32>().value(1), "n2", "the other columns follow the kept rows");
    }

    #[test]
    fn the_pushed_filter_runs_first_and_its_nulls_drop_rows() {
        let filter = dynamic();
        filter.update(k_below(10)).unwrap();
        let filters = RuntimeFilters::new(vec![filter as Arc<dyn PhysicalExpr>]).unwrap();
        // Pushed: k > 1 (null for the null key).
        let pushed: Arc<dyn PhysicalExpr> = Arc::new(BinaryExpr::new(Arc::new(Column::new("k", 1)), Operator::Gt, lit(1i64)));
        let mut rows = filters.rows(&schema(), Some(&pushed)).unwrap();
        let kept = rows.apply(batch(vec![Some(1), None, Some(5), Some(12), Some(9)])).unwrap();
        assert_eq!(keys(&kept), vec![Some(5), Some(9)]);
    }

    #[test]
    fn a_filter_that_keeps_most_rows_is_no_longer_applied_until_it_changes() {
        let filter = dynamic();
        filter.update(k_below(1_000_000)).unwrap();
        let filters = RuntimeFilters::new(vec![filter.clone() as Arc<dyn PhysicalExpr>]).unwrap();
        let mut rows = filters.rows(&schema(), None).unwrap();
        let big = |first: i64| batch((first..first + BYPASS_AFTER_ROWS as i64).map(Some).collect());
        // Keeps everything: after BYPASS_AFTER_ROWS rows it is bypassed, so
        // a row it would drop now passes (harmless: the join checks again).
        assert_eq!(rows.apply(big(0)).unwrap().num_rows(), BYPASS_AFTER_ROWS as usize);
        assert_eq!(rows.apply(big(2_000_000)).unwrap().num_rows(), BYPASS_AFTER_ROWS as usize, "bypassed");
        // A new version of the filter is measured afresh.
        filter.update(k_below(5)).unwrap();
        assert_eq!(keys(&rows.apply(batch(vec![Some(1), Some(7)])).unwrap()), vec![Some(1)]);
    }
}
