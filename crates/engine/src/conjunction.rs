//! A filter's conjuncts evaluated one after another on the rows still
//! selected, cheapest and most selective first.
//!
//! DataFusion evaluates `a AND b AND c` as a tree of binary `AND`s: each
//! right side runs on the whole batch, unless the left side kept at most
//! 20 % of the rows, in which case it filters *every column of the batch*
//! down to those rows, evaluates the right side, and scatters the result
//! back into a full-length mask one value at a time. In TPC-H Q6 (five
//! comparisons over 60 M `lineitem` rows, 1.9 % kept) the filter took
//! 0.94 core-seconds of the query's 2.4, a tenth of it in that scatter.
//!
//! [`ConjunctionExpr`] replaces such a predicate in a `FilterExec`
//! ([`crate::adaptive_filter`]) and in a scan's runtime filters. It keeps
//! the survivors as a bitmap while most rows pass, then as row indices:
//! each later conjunct gathers only the columns it reads at those rows,
//! and the final mask is built once. The order adapts to the data: each
//! conjunct's cost per row and pass rate are counted, and every
//! [`REORDER_EVERY`] batches the conjuncts are sorted by the classic rank
//! `cost / (1 − pass rate)` (what the cheapest route to rejecting a row
//! costs), with the counts halved so that the order follows data whose
//! selectivity drifts (sorted or clustered columns).
//!
//! Answers never change: a row passes when every conjunct is true, in any
//! order. Errors never appear where there were none: only conjuncts that
//! cannot fail (comparisons, `IN`, `LIKE`, `IS NULL`, `NOT`, over columns
//! and literals) move; any other (arithmetic, casts, functions) keeps its
//! place after them and is evaluated only on the rows they selected, so
//! `x <> 0 AND 10 / x > 1` no longer divides by zero.
//!
//! Why ours: DataFusion 55 has no adaptive filter ordering, and its
//! pre-selection is a property of the binary `AND` (one pair at a time),
//! not of the filter. DuckDB's adaptive filter is the model (it reorders
//! by measured cost, not by rank); the code is our own. A plan sent to
//! another process can replace each `ConjunctionExpr` by the `AND` chain
//! it displays: they compute the same mask.

use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use datafusion::arrow::array::{Array, ArrayRef, AsArray, BooleanArray, RecordBatch, RecordBatchOptions, UInt32Array};
use datafusion::arrow::buffer::{BooleanBuffer, MutableBuffer};
use datafusion::arrow::compute::{filter, prep_null_mask_filter, take_arrays};
use datafusion::arrow::datatypes::{DataType, Schema};
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::common::{DataFusionError, Result, ScalarValue};
use datafusion::logical_expr::{ColumnarValue, Operator};
use datafusion::physical_expr::expressions::{BinaryExpr, Column, InListExpr, IsNotNullExpr, IsNullExpr, LikeExpr, Literal, NotExpr};
use datafusion::physical_expr::PhysicalExpr;

use crate::key_bloom::KeyBloomExpr;

/// Batches between two reorderings of an expression's conjuncts.
pub const REORDER_EVERY: u64 = 64;

/// Below this share of the batch's rows the survivors are kept as indices
/// and later conjuncts see only them; above it a conjunct runs on the whole
/// batch (arrow's comparison kernels are faster than a gather of most rows).
const SPARSE_BELOW: f64 = 0.25;

/// A conjunction evaluated conjunct by conjunct on the surviving rows, in an
/// order that adapts to the data (see the module docs). Its value is a
/// mask without nulls: true where every conjunct is true. It belongs in a
/// filter, where a null row is a rejected one.
#[derive(Debug)]
pub struct ConjunctionExpr {
    /// In the predicate's own order.
    conjuncts: Vec<Conjunct>,
    /// The `AND` chain of the conjuncts: what EXPLAIN shows, and the
    /// identity of this expression.
    chain: Arc<dyn PhysicalExpr>,
    /// Positions into `conjuncts`, in evaluation order: the conjuncts that
    /// may move first, then the others in their own order.
    order: Mutex<Arc<[usize]>>,
    /// How many of `order`'s leading entries may move.
    movable: usize,
    batches: AtomicU64,
}

/// One conjunct, with what it needs to run on a gathered subset of rows,
/// and its counters.
#[derive(Debug)]
struct Conjunct {
    expr: Arc<dyn PhysicalExpr>,
    /// The input columns it reads, ascending.
    columns: Vec<usize>,
    /// `expr` with each column index replaced by its position in `columns`.
    narrow: Arc<dyn PhysicalExpr>,
    movable: bool,
    /// Before any measurement: a guess from the types it reads.
    static_cost: f64,
    /// Rows it was evaluated on, time it took (ns), and the rows selected
    /// before and after it.
    evaluated: AtomicU64,
    nanos: AtomicU64,
    before: AtomicU64,
    after: AtomicU64,
}

impl ConjunctionExpr {
    /// A conjunction of `conjuncts` (at least one) over `schema`, the
    /// filter's input.
    pub fn try_new(conjuncts: Vec<Arc<dyn PhysicalExpr>>, schema: &Schema) -> Result<Self> {
        let costs = conjuncts.iter().map(|e| guess_cost(e, schema)).collect();
        Self::from_parts(conjuncts, costs)
    }

    /// `conjuncts` with their cost guesses (the first order, until
    /// measurements replace them).
    fn from_parts(conjuncts: Vec<Arc<dyn PhysicalExpr>>, costs: Vec<f64>) -> Result<Self> {
        let mut iter = conjuncts.iter();
        let first = iter.next().ok_or_else(|| DataFusionError::Internal("a conjunction needs at least one conjunct".into()))?;
        let chain = iter.fold(Arc::clone(first), |acc, c| Arc::new(BinaryExpr::new(acc, Operator::And, Arc::clone(c))) as Arc<dyn PhysicalExpr>);
        let conjuncts: Vec<Conjunct> = conjuncts.into_iter().zip(costs).map(|(e, cost)| Conjunct::try_new(e, cost)).collect::<Result<_>>()?;
        let mut order: Vec<usize> = (0..conjuncts.len()).filter(|&i| conjuncts[i].movable).collect();
        order.sort_by(|&a, &b| conjuncts[a].static_cost.total_cmp(&conjuncts[b].static_cost));
        let movable = order.len();
        order.extend((0..conjuncts.len()).filter(|&i| !conjuncts[i].movable));
        Ok(ConjunctionExpr { conjuncts, chain, order: Mutex::new(order.into()), movable, batches: AtomicU64::new(0) })
    }

    /// The conjuncts in the order the next batch will evaluate them.
    pub fn evaluation_order(&self) -> Vec<Arc<dyn PhysicalExpr>> {
        self.current_order().iter().map(|&i| Arc::clone(&self.conjuncts[i].expr)).collect()
    }

    fn current_order(&self) -> Arc<[usize]> {
        Arc::clone(&self.order.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// Sorts the movable conjuncts by rank and halves every counter.
    fn reorder(&self) {
        let rank = |c: &Conjunct| {
            let evaluated = c.evaluated.load(Ordering::Relaxed);
            let before = c.before.load(Ordering::Relaxed);
            if evaluated == 0 || before == 0 {
                return c.static_cost;
            }
            let cost = c.nanos.load(Ordering::Relaxed) as f64 / evaluated as f64;
            let pass = c.after.load(Ordering::Relaxed) as f64 / before as f64;
            cost / (1.0 - pass).max(1e-3)
        };
        let mut order = self.current_order().to_vec();
        order[..self.movable].sort_by(|&a, &b| rank(&self.conjuncts[a]).total_cmp(&rank(&self.conjuncts[b])));
        for c in &self.conjuncts {
            for counter in [&c.evaluated, &c.nanos, &c.before, &c.after] {
                counter.store(counter.load(Ordering::Relaxed) / 2, Ordering::Relaxed);
            }
        }
        *self.order.lock().unwrap_or_else(|p| p.into_inner()) = order.into();
    }

    fn mask(&self, batch: &RecordBatch) -> Result<Survivors> {
        let rows = batch.num_rows();
        let mut survivors = Survivors::All;
        for &i in self.current_order().iter() {
            let c = &self.conjuncts[i];
            // A conjunct that may fail sees only the rows still selected.
            if let (false, Survivors::Mask(mask, _)) = (c.movable, &survivors) {
                survivors = Survivors::Rows(UInt32Array::from_iter_values(mask.set_indices_u32()));
            }
            let before = survivors.count(rows);
            let start = Instant::now();
            let (evaluated, next) = match survivors {
                Survivors::All | Survivors::Mask(..) => {
                    let Some(mask) = c.evaluate(batch)? else { return Ok(Survivors::None) };
                    let mask = match survivors {
                        Survivors::Mask(prev, _) => &prev & &mask,
                        _ => mask,
                    };
                    let count = mask.count_set_bits();
                    let next = if count == 0 {
                        Survivors::None
                    } else if (count as f64) < SPARSE_BELOW * rows as f64 {
                        Survivors::Rows(UInt32Array::from_iter_values(mask.set_indices_u32()))
                    } else {
                        Survivors::Mask(mask, count)
                    };
                    (rows, next)
                }
                Survivors::Rows(ref indices) => {
                    let columns: Vec<ArrayRef> = c.columns.iter().map(|&i| Arc::clone(batch.column(i))).collect();
                    let gathered = take_arrays(&columns, indices, None)?;
                    let schema = Arc::new(batch.schema_ref().project(&c.columns)?);
                    let subset = RecordBatch::try_new_with_options(schema, gathered, &RecordBatchOptions::new().with_row_count(Some(indices.len())))?;
                    let next = match c.narrow_evaluate(&subset)? {
                        None => Survivors::None,
                        Some(mask) => {
                            let kept = filter(indices, &BooleanArray::new(mask, None))?;
                            let kept = kept.as_primitive::<datafusion::arrow::datatypes::UInt32Type>().clone();
                            if kept.is_empty() { Survivors::None } else { Survivors::Rows(kept) }
                        }
                    };
                    (indices.len(), next)
                }
                Survivors::None => unreachable!("the loop returns on no survivors"),
            };
            survivors = next;
            c.evaluated.fetch_add(evaluated as u64, Ordering::Relaxed);
            c.nanos.fetch_add(start.elapsed().as_nanos() as u64, Ordering::Relaxed);
            c.before.fetch_add(before as u64, Ordering::Relaxed);
            c.after.fetch_add(survivors.count(rows) as u64, Ordering::Relaxed);
            if matches!(survivors, Survivors::None) {
                break;
            }
        }
        Ok(survivors)
    }
}

/// The rows that passed every conjunct evaluated so far.
enum Survivors {
    All,
    /// A bitmap over the batch, with its count of set bits.
    Mask(BooleanBuffer, usize),
    /// Ascending row positions.
    Rows(UInt32Array),
    None,
}

impl Survivors {
    fn count(&self, rows: usize) -> usize {
        match self {
            Survivors::All => rows,
            Survivors::Mask(_, n) => *n,
            Survivors::Rows(r) => r.len(),
            Survivors::None => 0,
        }
    }

    fn into_mask(self, rows: usize) -> BooleanArray {
        match self {
            Survivors::All => BooleanArray::new(BooleanBuffer::new_set(rows), None),
            Survivors::Mask(m, _) => BooleanArray::new(m, None),
            Survivors::None => BooleanArray::new(BooleanBuffer::new_unset(rows), None),
            Survivors::Rows(r) => {
                let mut bits = MutableBuffer::from_len_zeroed(rows.div_ceil(8));
                let slice = bits.as_slice_mut();
                for &i in r.values() {
                    datafusion::arrow::util::bit_util::set_bit(slice, i as usize);
                }
                BooleanArray::new(BooleanBuffer::new(bits.into(), 0, rows), None)
            }
        }
    }
}

impl Conjunct {
    fn try_new(expr: Arc<dyn PhysicalExpr>, static_cost: f64) -> Result<Self> {
        let mut columns: Vec<usize> = datafusion::physical_expr::utils::collect_columns(&expr).iter().map(Column::index).collect();
        columns.sort_unstable();
        columns.dedup();
        let narrow = Arc::clone(&expr)
            .transform(|e| match e.downcast_ref::<Column>() {
                Some(c) => {
                    let at = columns.binary_search(&c.index()).map_err(|_| DataFusionError::Internal(format!("column {c} missing from its conjunct's columns")))?;
                    Ok(Transformed::yes(Arc::new(Column::new(c.name(), at)) as Arc<dyn PhysicalExpr>))
                }
                None => Ok(Transformed::no(e)),
            })?
            .data;
        Ok(Conjunct {
            movable: cannot_fail(&expr),
            expr,
            columns,
            narrow,
            static_cost,
            evaluated: AtomicU64::new(0),
            nanos: AtomicU64::new(0),
            before: AtomicU64::new(0),
            after: AtomicU64::new(0),
        })
    }

    /// On the whole batch: the rows where it is true, or `None` when it is
    /// true nowhere.
    fn evaluate(&self, batch: &RecordBatch) -> Result<Option<BooleanBuffer>> {
        truth(self.expr.evaluate(batch)?, batch.num_rows())
    }

    /// On a batch of `columns` only.
    fn narrow_evaluate(&self, subset: &RecordBatch) -> Result<Option<BooleanBuffer>> {
        truth(self.narrow.evaluate(subset)?, subset.num_rows())
    }
}

/// Where a predicate's value is true (null counts as false), or `None` when
/// it is true nowhere.
fn truth(value: ColumnarValue, rows: usize) -> Result<Option<BooleanBuffer>> {
    match value {
        ColumnarValue::Scalar(ScalarValue::Boolean(Some(true))) => Ok(Some(BooleanBuffer::new_set(rows))),
        ColumnarValue::Scalar(ScalarValue::Boolean(_)) => Ok(None),
        ColumnarValue::Scalar(other) => Err(DataFusionError::Internal(format!("a filter's conjunct evaluated to {other:?}, not a boolean"))),
        ColumnarValue::Array(array) => {
            let Some(b) = array.as_boolean_opt() else {
                return Err(DataFusionError::Internal(format!("a filter's conjunct evaluated to {}, not a boolean", array.data_type())));
            };
            let b = if b.null_count() > 0 { prep_null_mask_filter(b) } else { b.clone() };
            let (values, _) = b.into_parts();
            Ok(if values.count_set_bits() == 0 { None } else { Some(values) })
        }
    }
}

/// Whether `expr` can be evaluated on any row without an error: the only
/// conjuncts whose evaluation may move earlier.
fn cannot_fail(expr: &Arc<dyn PhysicalExpr>) -> bool {
    let node_ok = expr.downcast_ref::<Column>().is_some()
        || expr.downcast_ref::<Literal>().is_some()
        || expr.downcast_ref::<InListExpr>().is_some()
        || expr.downcast_ref::<LikeExpr>().is_some()
        || expr.downcast_ref::<IsNullExpr>().is_some()
        || expr.downcast_ref::<IsNotNullExpr>().is_some()
        || expr.downcast_ref::<NotExpr>().is_some()
        || expr.downcast_ref::<KeyBloomExpr>().is_some()
        || expr.downcast_ref::<BinaryExpr>().is_some_and(|b| {
            matches!(
                b.op(),
                Operator::Eq
                    | Operator::NotEq
                    | Operator::Lt
                    | Operator::LtEq
                    | Operator::Gt
                    | Operator::GtEq
                    | Operator::And
                    | Operator::Or
                    | Operator::IsDistinctFrom
                    | Operator::IsNotDistinctFrom
                    | Operator::LikeMatch
                    | Operator::ILikeMatch
                    | Operator::NotLikeMatch
                    | Operator::NotILikeMatch
            )
        });
    node_ok && expr.children().into_iter().all(cannot_fail)
}

/// A rough cost per row before anything is measured: wide and variable-
/// length columns, IN lists and pattern matches cost more.
fn guess_cost(expr: &Arc<dyn PhysicalExpr>, schema: &Schema) -> f64 {
    let own = if let Some(c) = expr.downcast_ref::<Column>() {
        match schema.fields().get(c.index()).map(|f| f.data_type()) {
            Some(DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View | DataType::Binary | DataType::LargeBinary | DataType::BinaryView) => 4.0,
            Some(DataType::Decimal128(..) | DataType::Decimal256(..) | DataType::Dictionary(..)) => 2.0,
            _ => 1.0,
        }
    } else if let Some(list) = expr.downcast_ref::<InListExpr>() {
        2.0 + list.list().len() as f64 / 8.0
    } else if expr.downcast_ref::<LikeExpr>().is_some() {
        8.0
    } else if expr.downcast_ref::<KeyBloomExpr>().is_some() {
        1.0
    } else if expr.downcast_ref::<BinaryExpr>().is_some() || expr.downcast_ref::<Literal>().is_some() {
        0.0
    } else {
        4.0
    };
    own + expr.children().into_iter().map(|c| guess_cost(c, schema)).sum::<f64>()
}

impl PartialEq for ConjunctionExpr {
    fn eq(&self, other: &Self) -> bool {
        self.chain.eq(&other.chain)
    }
}

impl Eq for ConjunctionExpr {}

impl Hash for ConjunctionExpr {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.chain.hash(state);
    }
}

impl fmt::Display for ConjunctionExpr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.chain, f)
    }
}

impl PhysicalExpr for ConjunctionExpr {
    fn data_type(&self, _: &Schema) -> Result<DataType> {
        Ok(DataType::Boolean)
    }

    fn nullable(&self, _: &Schema) -> Result<bool> {
        Ok(false)
    }

    fn evaluate(&self, batch: &RecordBatch) -> Result<ColumnarValue> {
        let survivors = self.mask(batch)?;
        if self.batches.fetch_add(1, Ordering::Relaxed) % REORDER_EVERY == REORDER_EVERY - 1 {
            self.reorder();
        }
        Ok(ColumnarValue::Array(Arc::new(survivors.into_mask(batch.num_rows()))))
    }

    fn children(&self) -> Vec<&Arc<dyn PhysicalExpr>> {
        self.conjuncts.iter().map(|c| &c.expr).collect()
    }

    fn with_new_children(self: Arc<Self>, children: Vec<Arc<dyn PhysicalExpr>>) -> Result<Arc<dyn PhysicalExpr>> {
        if children.len() != self.conjuncts.len() {
            return Err(DataFusionError::Internal(format!("a conjunction of {} was given {} conjuncts", self.conjuncts.len(), children.len())));
        }
        // A rewrite of the children keeps each column's type, so the
        // first guesses carry over.
        let costs = self.conjuncts.iter().map(|c| c.static_cost).collect();
        Ok(Arc::new(ConjunctionExpr::from_parts(children, costs)?))
    }

    fn fmt_sql(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.chain.fmt_sql(f)
    }
}

#[cfg(test)]
mod tests;
