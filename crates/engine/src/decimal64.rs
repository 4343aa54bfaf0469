//! Decimal arithmetic in 64-bit integers when the values allow it.
//!
//! DataFusion types every decimal as `Decimal128` and arrow computes `+`,
//! `-` and `*` on it with overflow-checked 128-bit operations: TPC-H Q1's
//! `l_extendedprice * (1 - l_discount) * (1 + l_tax)` spent a quarter of
//! the query's CPU in `i128::checked_mul` and the rescaling around it.
//! The values are rarely that wide: a `DECIMAL(15,2)` column fits in 64
//! bits, and so do most products of two of them. [`Decimal64Rule`] wraps
//! each maximal tree of such operations in a [`Decimal64Expr`], which
//! evaluates the whole tree in `i64` with overflow flags and widens only
//! the result.
//!
//! Answers never change: the result has the type, the values and the nulls
//! the wrapped expression computes. When a leaf value does not fit in 64
//! bits, or any step overflows 64 bits (even in a null slot), the batch is
//! evaluated by the wrapped DataFusion expression instead, which widens or
//! fails exactly as it always did. An expression that keeps falling back
//! stops trying ([`GIVE_UP_AFTER`]). The tree is read again from the
//! wrapped expression for every batch, so a later rewrite of the wrapped
//! expression's columns (a projection pushed down) is always honoured.
//!
//! Why ours: DataFusion 55 and arrow 59 have `Decimal64` arrays but no
//! planner path to them, and narrowing at the type level would change the
//! result types users see (DuckDB picks the width from statistics; the
//! result type stays `DECIMAL(38, s)`). A plan sent to another process
//! (the cluster's workers) can replace each `Decimal64Expr` by the
//! expression it wraps: they compute the same thing.

use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use datafusion::arrow::array::{Array, ArrayRef, AsArray, Decimal128Array, RecordBatch};
use datafusion::arrow::buffer::{NullBuffer, ScalarBuffer};
use datafusion::arrow::datatypes::{DataType, Decimal128Type, Schema};
use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::common::{Result, ScalarValue};
use datafusion::logical_expr::{ColumnarValue, Operator};
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_expr::expressions::{BinaryExpr, Column, Literal};
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::aggregates::AggregateExec;
use datafusion::physical_plan::filter::{FilterExec, FilterExecBuilder};
use datafusion::physical_plan::projection::{ProjectionExec, ProjectionExpr};

use crate::hybrid::HybridExec;

/// Batches that fell back to 128 bits after which an expression stops
/// trying 64 bits, if fewer batches succeeded than fell back.
pub const GIVE_UP_AFTER: u32 = 8;

/// Arrow's largest `Decimal128` precision (the cap of its result types).
const MAX_PRECISION: u8 = 38;

/// Wraps `+`, `-` and `*` trees over `Decimal128` in [`Decimal64Expr`]s,
/// in projections, filters and aggregate arguments — not in the fragments
/// a hybrid scan ships to a storage node.
#[derive(Debug, Default)]
pub struct Decimal64Rule;

impl PhysicalOptimizerRule for Decimal64Rule {
    fn optimize(&self, plan: Arc<dyn ExecutionPlan>, _: &ConfigOptions) -> Result<Arc<dyn ExecutionPlan>> {
        plan.transform_down(|node| {
            // What a hybrid scan ships to a storage node is DataFusion's
            // own expressions (the node's codec knows only those).
            if node.is::<HybridExec>() {
                return Ok(Transformed::new(node, false, TreeNodeRecursion::Jump));
            }
            let schema = node.children().first().map(|c| c.schema());
            let Some(schema) = schema else { return Ok(Transformed::no(node)) };
            if let Some(p) = node.downcast_ref::<ProjectionExec>() {
                let mut changed = false;
                let exprs: Vec<ProjectionExpr> = p
                    .expr()
                    .iter()
                    .map(|e| {
                        let (expr, c) = wrap(&e.expr, &schema)?;
                        changed |= c;
                        Ok(ProjectionExpr { expr, alias: e.alias.clone() })
                    })
                    .collect::<Result<_>>()?;
                if changed {
                    return Ok(Transformed::yes(Arc::new(ProjectionExec::try_new(exprs, Arc::clone(p.input()))?)));
                }
            } else if let Some(f) = node.downcast_ref::<FilterExec>() {
                let (predicate, changed) = wrap(f.predicate(), &schema)?;
                if changed {
                    return Ok(Transformed::yes(Arc::new(FilterExecBuilder::from(f).with_predicate(predicate).build()?)));
                }
            } else if let Some(a) = node.downcast_ref::<AggregateExec>() {
                let input_schema = a.input_schema();
                let mut changed = false;
                let mut aggrs = Vec::with_capacity(a.aggr_expr().len());
                for aggr in a.aggr_expr() {
                    let mut args = Vec::new();
                    let mut this = false;
                    for arg in aggr.expressions() {
                        let (e, c) = wrap(&arg, &input_schema)?;
                        this |= c;
                        args.push(e);
                    }
                    let order_by = aggr.order_bys().iter().map(|s| Arc::clone(&s.expr)).collect();
                    match aggr.with_new_expressions(args, order_by).filter(|_| this) {
                        Some(new) => {
                            changed = true;
                            aggrs.push(Arc::new(new));
                        }
                        None => aggrs.push(Arc::clone(aggr)),
                    }
                }
                if changed {
                    return Ok(Transformed::yes(Arc::new(a.with_new_aggr_exprs(aggrs))));
                }
            }
            Ok(Transformed::no(node))
        })
        .map(|t| t.data)
    }

    fn name(&self) -> &str {
        "decimal64"
    }

    fn schema_check(&self) -> bool {
        true
    }
}

/// `expr` with each maximal decimal arithmetic tree in it wrapped; whether
/// any was.
fn wrap(expr: &Arc<dyn PhysicalExpr>, schema: &Schema) -> Result<(Arc<dyn PhysicalExpr>, bool)> {
    let t = Arc::clone(expr).transform_down(|e| {
        if e.downcast_ref::<Decimal64Expr>().is_some() {
            return Ok(Transformed::new(e, false, TreeNodeRecursion::Jump));
        }
        if e.downcast_ref::<BinaryExpr>().is_some() && Program::compile(&e, schema).is_some() {
            let wrapped: Arc<dyn PhysicalExpr> = Arc::new(Decimal64Expr::new(e));
            return Ok(Transformed::new(wrapped, true, TreeNodeRecursion::Jump));
        }
        Ok(Transformed::no(e))
    })?;
    Ok((t.data, t.transformed))
}

/// A tree of `Decimal128` `+`, `-`, `*` over columns and literals, computed
/// in 64-bit integers; the wrapped expression computes it when the values
/// do not fit (see the module docs).
#[derive(Debug)]
pub struct Decimal64Expr {
    inner: Arc<dyn PhysicalExpr>,
    succeeded: AtomicU32,
    fell_back: AtomicU32,
}

impl Decimal64Expr {
    /// Wraps `inner`, which must be a decimal arithmetic tree for the
    /// 64-bit path to be taken (any other expression is simply evaluated).
    pub fn new(inner: Arc<dyn PhysicalExpr>) -> Self {
        Decimal64Expr { inner, succeeded: AtomicU32::new(0), fell_back: AtomicU32::new(0) }
    }

    /// The wrapped expression.
    pub fn inner(&self) -> &Arc<dyn PhysicalExpr> {
        &self.inner
    }

    fn given_up(&self) -> bool {
        let fell_back = self.fell_back.load(Ordering::Relaxed);
        fell_back >= GIVE_UP_AFTER && fell_back > self.succeeded.load(Ordering::Relaxed)
    }

    /// The 64-bit result, or `None` when this batch needs 128 bits.
    fn evaluate_narrow(&self, batch: &RecordBatch) -> Option<ArrayRef> {
        let program = Program::compile(&self.inner, batch.schema_ref())?;
        program.run(batch)
    }
}

impl PartialEq for Decimal64Expr {
    fn eq(&self, other: &Self) -> bool {
        self.inner.eq(&other.inner)
    }
}

impl Eq for Decimal64Expr {}

impl Hash for Decimal64Expr {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.inner.hash(state);
    }
}

impl fmt::Display for Decimal64Expr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "decimal64({})", self.inner)
    }
}

impl PhysicalExpr for Decimal64Expr {
    fn data_type(&self, input_schema: &Schema) -> Result<DataType> {
        self.inner.data_type(input_schema)
    }

    fn nullable(&self, input_schema: &Schema) -> Result<bool> {
        self.inner.nullable(input_schema)
    }

    fn evaluate(&self, batch: &RecordBatch) -> Result<ColumnarValue> {
        if !self.given_up() {
            if let Some(array) = self.evaluate_narrow(batch) {
                self.succeeded.fetch_add(1, Ordering::Relaxed);
                return Ok(ColumnarValue::Array(array));
            }
            self.fell_back.fetch_add(1, Ordering::Relaxed);
        }
        self.inner.evaluate(batch)
    }

    fn children(&self) -> Vec<&Arc<dyn PhysicalExpr>> {
        vec![&self.inner]
    }

    fn with_new_children(self: Arc<Self>, mut children: Vec<Arc<dyn PhysicalExpr>>) -> Result<Arc<dyn PhysicalExpr>> {
        if children.len() != 1 {
            return Err(datafusion::error::DataFusionError::Internal(format!("Decimal64Expr wraps one expression, was given {}", children.len())));
        }
        Ok(Arc::new(Decimal64Expr::new(children.remove(0))))
    }

    fn fmt_sql(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.inner.fmt_sql(f)
    }
}

/// One node of a compiled tree.
#[derive(Debug)]
enum Node {
    Column(usize),
    Literal(i64),
    Op { op: Op, left: Box<Node>, right: Box<Node> },
}

/// An operation with the multipliers that bring both sides to the
/// result's scale (addition and subtraction), as arrow computes it.
#[derive(Debug, Clone, Copy)]
enum Op {
    Add { l_mul: i64, r_mul: i64 },
    Sub { l_mul: i64, r_mul: i64 },
    Mul,
}

/// A tree compiled against one schema, with the result's type.
#[derive(Debug)]
struct Program {
    root: Node,
    precision: u8,
    scale: i8,
}

/// Values of one node for a batch: one per row, or one for all rows.
enum Values {
    Scalar(i64),
    Array(Vec<i64>),
}

impl Program {
    /// `None` unless `expr` is a decimal `+`, `-` or `*` over `Decimal128`
    /// columns, literals that fit in 64 bits and such operations, whose
    /// result type is the one the wrapped expression declares.
    fn compile(expr: &Arc<dyn PhysicalExpr>, schema: &Schema) -> Option<Program> {
        expr.downcast_ref::<BinaryExpr>()?;
        let (root, precision, scale) = compile_node(expr, schema)?;
        match expr.data_type(schema).ok()? {
            DataType::Decimal128(p, s) if p == precision && s == scale => Some(Program { root, precision, scale }),
            _ => None,
        }
    }

    /// The result, or `None` when a value or a step needs more than 64 bits.
    fn run(&self, batch: &RecordBatch) -> Option<ArrayRef> {
        let mut overflow = false;
        let mut nulls: Option<NullBuffer> = None;
        let values = eval(&self.root, batch, &mut nulls, &mut overflow);
        if overflow {
            return None;
        }
        // A value per row (a tree of literals alone is left to DataFusion).
        let Values::Array(values) = values else { return None };
        if values.len() != batch.num_rows() {
            return None;
        }
        let wide: ScalarBuffer<i128> = values.into_iter().map(i128::from).collect();
        let array = Decimal128Array::new(wide, nulls).with_precision_and_scale(self.precision, self.scale).ok()?;
        Some(Arc::new(array))
    }
}

/// A node, its precision and scale (arrow's rules for the result types).
fn compile_node(expr: &Arc<dyn PhysicalExpr>, schema: &Schema) -> Option<(Node, u8, i8)> {
    if let Some(c) = expr.downcast_ref::<Column>() {
        return match schema.fields().get(c.index())?.data_type() {
            DataType::Decimal128(p, s) => Some((Node::Column(c.index()), *p, *s)),
            _ => None,
        };
    }
    if let Some(l) = expr.downcast_ref::<Literal>() {
        return match l.value() {
            ScalarValue::Decimal128(Some(v), p, s) => Some((Node::Literal(i64::try_from(*v).ok()?), *p, *s)),
            _ => None,
        };
    }
    let b = expr.downcast_ref::<BinaryExpr>()?;
    let (left, p1, s1) = compile_node(b.left(), schema)?;
    let (right, p2, s2) = compile_node(b.right(), schema)?;
    let (op, precision, scale) = match b.op() {
        Operator::Plus | Operator::Minus => {
            let scale = s1.max(s2);
            let precision = (scale.saturating_add((p1 as i8 - s1).max(p2 as i8 - s2)) as u8).saturating_add(1).min(MAX_PRECISION);
            let l_mul = 10i64.checked_pow(u32::try_from(scale - s1).ok()?)?;
            let r_mul = 10i64.checked_pow(u32::try_from(scale - s2).ok()?)?;
            let op = if *b.op() == Operator::Plus { Op::Add { l_mul, r_mul } } else { Op::Sub { l_mul, r_mul } };
            (op, precision, scale)
        }
        Operator::Multiply => {
            let scale = s1.checked_add(s2)?;
            if scale > MAX_PRECISION as i8 {
                return None;
            }
            (Op::Mul, p1.saturating_add(p2 + 1).min(MAX_PRECISION), scale)
        }
        _ => return None,
    };
    Some((Node::Op { op, left: Box::new(left), right: Box::new(right) }, precision, scale))
}

fn eval(node: &Node, batch: &RecordBatch, nulls: &mut Option<NullBuffer>, overflow: &mut bool) -> Values {
    match node {
        Node::Literal(v) => Values::Scalar(*v),
        Node::Column(i) => {
            let array = batch.column(*i).as_primitive::<Decimal128Type>();
            *nulls = NullBuffer::union(nulls.as_ref(), array.nulls());
            let mut wide = false;
            let narrow: Vec<i64> = array
                .values()
                .iter()
                .map(|&v| {
                    let n = v as i64;
                    wide |= i128::from(n) != v;
                    n
                })
                .collect();
            *overflow |= wide;
            Values::Array(narrow)
        }
        Node::Op { op, left, right } => {
            let l = eval(left, batch, nulls, overflow);
            let r = eval(right, batch, nulls, overflow);
            match *op {
                Op::Mul => apply(l, r, overflow, |a, b| a.overflowing_mul(b)),
                Op::Add { l_mul: 1, r_mul: 1 } => apply(l, r, overflow, |a, b| a.overflowing_add(b)),
                Op::Sub { l_mul: 1, r_mul: 1 } => apply(l, r, overflow, |a, b| a.overflowing_sub(b)),
                Op::Add { l_mul, r_mul } => apply(l, r, overflow, |a, b| rescaled(a, l_mul, b, r_mul, i64::overflowing_add)),
                Op::Sub { l_mul, r_mul } => apply(l, r, overflow, |a, b| rescaled(a, l_mul, b, r_mul, i64::overflowing_sub)),
            }
        }
    }
}

/// `a * l_mul (op) b * r_mul`, and whether any step overflowed.
#[inline(always)]
fn rescaled(a: i64, l_mul: i64, b: i64, r_mul: i64, op: fn(i64, i64) -> (i64, bool)) -> (i64, bool) {
    let (a, o1) = a.overflowing_mul(l_mul);
    let (b, o2) = b.overflowing_mul(r_mul);
    let (v, o3) = op(a, b);
    (v, o1 | o2 | o3)
}

/// `f` over two value sets, with the overflow flags or-ed into `overflow`.
#[inline(always)]
fn apply(l: Values, r: Values, overflow: &mut bool, f: impl Fn(i64, i64) -> (i64, bool)) -> Values {
    let mut any = false;
    let out = match (l, r) {
        (Values::Scalar(a), Values::Scalar(b)) => {
            let (v, o) = f(a, b);
            *overflow |= o;
            return Values::Scalar(v);
        }
        (Values::Array(mut a), Values::Scalar(b)) => {
            a.iter_mut().for_each(|x| {
                let (v, o) = f(*x, b);
                any |= o;
                *x = v;
            });
            a
        }
        (Values::Scalar(a), Values::Array(mut b)) => {
            b.iter_mut().for_each(|x| {
                let (v, o) = f(a, *x);
                any |= o;
                *x = v;
            });
            b
        }
        (Values::Array(mut a), Values::Array(b)) => {
            a.iter_mut().zip(b.iter()).for_each(|(x, &y)| {
                let (v, o) = f(*x, y);
                any |= o;
                *x = v;
            });
            a
        }
    };
    *overflow |= any;
    Values::Array(out)
}

#[cfg(test)]
mod tests;
