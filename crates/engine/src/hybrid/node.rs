//! The engine's link to its storage node ([`Pushdown`]): the mode in force,
//! what pushing measured (engine-wide and per chain shape), the warnings
//! of failures a query survived, and the totals of what hybrid scans did.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use blobhouse_pushdown::{NodeClient, PushdownError};

use super::cost::CostModel;
use super::{PushdownMode, PushdownOptions};

/// The engine's link to its storage node, shared by its queries.
#[derive(Debug)]
pub struct Pushdown {
    pub(super) client: NodeClient,
    pub(super) options: PushdownOptions,
    mode: Mutex<PushdownMode>,
    /// Whether joins send Bloom filters of their build sides with pushed
    /// probe-side scans (`SET pushdown_bloom`).
    bloom: std::sync::atomic::AtomicBool,
    model: Mutex<CostModel>,
    /// What was measured by chain shape
    /// ([`shape_of`](super::cost::shape_of)): a query plans afresh each
    /// time, so what its earlier runs measured must live here, not in the
    /// plan, for the split and Weighted-LFU to see it.
    shapes: Mutex<HashMap<Arc<str>, ShapeFigures>>,
    warnings: Mutex<Vec<String>>,
    totals: Mutex<PushdownTotals>,
}

/// How many chain shapes' figures an engine remembers; past it, an
/// arbitrary one is forgotten (it is re-measured when it runs again).
const MAX_SHAPES: usize = 4096;

/// What pushing one chain shape measured, smoothed over its runs.
#[derive(Debug, Clone, Copy, Default)]
struct ShapeFigures {
    /// Bytes the node sent back per compressed byte it scanned.
    output_ratio: Option<f64>,
    /// Compressed bytes of row groups pushed per second, end to end (the
    /// node's scan and filter, and its reply crossing the link). A shape
    /// whose reply is most of what it scanned pushes far slower than one
    /// the node filters to nothing; one engine-wide rate would blur them.
    push_bytes_per_second: Option<f64>,
}

/// What an engine's hybrid scans did since it opened, summed over queries
/// (per query: EXPLAIN ANALYZE). Benchmarks read it around a workload.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PushdownTotals {
    /// Row groups read from the caching tiers.
    pub row_groups_cached: u64,
    /// Row groups the node evaluated.
    pub row_groups_pushed: u64,
    /// Row groups fetched from the store because the split said so.
    pub row_groups_fetched: u64,
    /// Row groups fetched because the node refused, failed or was away.
    pub row_groups_fallback: u64,
    /// Compressed bytes of the row groups the node read for us.
    pub bytes_pushed: u64,
    /// Bytes of the Flight messages the node sent back (compressed Arrow IPC).
    pub bytes_received: u64,
}

impl std::ops::AddAssign for PushdownTotals {
    fn add_assign(&mut self, o: Self) {
        self.row_groups_cached += o.row_groups_cached;
        self.row_groups_pushed += o.row_groups_pushed;
        self.row_groups_fetched += o.row_groups_fetched;
        self.row_groups_fallback += o.row_groups_fallback;
        self.bytes_pushed += o.bytes_pushed;
        self.bytes_received += o.bytes_received;
    }
}

impl Pushdown {
    /// A link to the node `options` names (connected on first use).
    pub fn new(options: PushdownOptions) -> std::result::Result<Arc<Pushdown>, PushdownError> {
        let client = NodeClient::with_ca(&options.endpoint, &options.token, options.ca.as_deref())?;
        Ok(Arc::new(Pushdown {
            client,
            mode: Mutex::new(options.mode),
            bloom: std::sync::atomic::AtomicBool::new(true),
            options,
            model: Mutex::default(),
            shapes: Mutex::default(),
            warnings: Mutex::default(),
            totals: Mutex::default(),
        }))
    }

    /// The mode now in force.
    pub fn mode(&self) -> PushdownMode {
        *self.mode.lock().expect("not poisoned")
    }

    /// `SET pushdown = …`.
    pub fn set_mode(&self, mode: PushdownMode) {
        *self.mode.lock().expect("not poisoned") = mode;
    }

    /// Whether joins send Bloom filters to pushed scans.
    pub fn bloom(&self) -> bool {
        self.bloom.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// `SET pushdown_bloom = on | off`.
    pub fn set_bloom(&self, on: bool) {
        self.bloom.store(on, std::sync::atomic::Ordering::Relaxed);
    }

    /// The rates measured so far.
    pub fn model(&self) -> CostModel {
        *self.model.lock().expect("not poisoned")
    }

    /// What the hybrid scans did so far.
    pub fn totals(&self) -> PushdownTotals {
        *self.totals.lock().expect("not poisoned")
    }

    pub(super) fn count(&self, f: impl FnOnce(&mut PushdownTotals)) {
        f(&mut self.totals.lock().expect("not poisoned"));
    }

    /// The node's client (for its stats).
    pub fn client(&self) -> &NodeClient {
        &self.client
    }

    /// Warnings since the last call: each node failure a query survived by
    /// fetching instead, once per distinct message.
    pub fn take_warnings(&self) -> Vec<String> {
        std::mem::take(&mut *self.warnings.lock().expect("not poisoned"))
    }

    pub(super) fn warn(&self, message: String) {
        let mut w = self.warnings.lock().expect("not poisoned");
        if !w.contains(&message) {
            w.push(message);
        }
    }

    /// What the node sent back per byte scanned for chains of `shape`,
    /// smoothed over their runs; `None` until one ran pushed.
    pub fn output_ratio(&self, shape: &str) -> Option<f64> {
        self.shapes.lock().expect("not poisoned").get(shape).and_then(|f| f.output_ratio)
    }

    /// The push rate of chains of `shape` (the engine-wide one until that
    /// shape was pushed).
    pub fn push_rate(&self, shape: &str) -> Option<f64> {
        self.shape_push_rate(shape).or(self.model().push_bytes_per_second)
    }

    /// The push rate measured on chains of `shape` only.
    pub(super) fn shape_push_rate(&self, shape: &str) -> Option<f64> {
        self.shapes.lock().expect("not poisoned").get(shape).and_then(|f| f.push_bytes_per_second)
    }

    pub(super) fn observe_ratio(&self, shape: &Arc<str>, ratio: f64) {
        if !ratio.is_finite() || ratio < 0.0 {
            return;
        }
        self.update_shape(shape, |f| f.output_ratio = CostModel::blend(f.output_ratio, ratio));
    }

    pub(super) fn observe_shape_rate(&self, shape: &Arc<str>, rate: f64) {
        self.update_shape(shape, |f| f.push_bytes_per_second = CostModel::blend(f.push_bytes_per_second, rate));
    }

    fn update_shape(&self, shape: &Arc<str>, update: impl FnOnce(&mut ShapeFigures)) {
        let mut shapes = self.shapes.lock().expect("not poisoned");
        if !shapes.contains_key(shape) && shapes.len() >= MAX_SHAPES {
            let victim = shapes.keys().next().cloned().expect("the map is full");
            shapes.remove(&victim);
        }
        update(shapes.entry(shape.clone()).or_default());
        debug_assert!(shapes.len() <= MAX_SHAPES);
    }

    pub(super) fn observe(&self, push: Option<f64>, fetch: Option<f64>) {
        let mut m = self.model.lock().expect("not poisoned");
        if let Some(p) = push {
            m.push_bytes_per_second = CostModel::blend(m.push_bytes_per_second, p);
        }
        if let Some(f) = fetch {
            m.fetch_bytes_per_second = CostModel::blend(m.fetch_bytes_per_second, f);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::physical_expr::expressions::Column;
    use datafusion::physical_plan::ExecutionPlan;
    use datafusion::physical_plan::filter::FilterExec;

    use super::super::cost::shape_of;

    #[tokio::test]
    async fn runs_of_one_template_share_their_measured_ratio() {
        use datafusion::arrow::datatypes::{DataType, Field, Schema};
        use datafusion::physical_expr::expressions::{BinaryExpr, lit};
        use datafusion::physical_plan::empty::EmptyExec;
        let schema = Arc::new(Schema::new(vec![Field::new("lo_quantity", DataType::Int32, false), Field::new("lo_discount", DataType::Int32, false)]));
        let filter = |column: &str, index: usize, op, value: i32| -> Arc<dyn ExecutionPlan> {
            let predicate = Arc::new(BinaryExpr::new(Arc::new(Column::new(column, index)), op, lit(value)));
            Arc::new(FilterExec::try_new(predicate, Arc::new(EmptyExec::new(schema.clone()))).expect("a boolean predicate"))
        };
        use datafusion::logical_expr::Operator::{Eq, Lt};
        let (a, b) = (shape_of(&filter("lo_quantity", 0, Eq, 10)), shape_of(&filter("lo_quantity", 0, Eq, 37)));
        assert_eq!(a, b, "constants do not make another shape");
        assert_ne!(a, shape_of(&filter("lo_discount", 1, Eq, 10)), "another column does");
        assert_ne!(a, shape_of(&filter("lo_quantity", 0, Lt, 10)), "another operator does");

        let pushdown = Pushdown::new(PushdownOptions::new("http://127.0.0.1:1", "t")).expect("a valid endpoint");
        assert_eq!(pushdown.output_ratio(&a), None);
        pushdown.observe_ratio(&a, 0.1);
        assert_eq!(pushdown.output_ratio(&b), Some(0.1));
        pushdown.observe_ratio(&b, 0.3);
        assert!((pushdown.output_ratio(&a).expect("measured") - 0.2).abs() < 1e-12);
        pushdown.observe_ratio(&a, f64::NAN);
        assert!((pushdown.output_ratio(&a).expect("measured") - 0.2).abs() < 1e-12, "a bad measurement is ignored");
        // The memory is bounded.
        for i in 0..MAX_SHAPES + 10 {
            pushdown.observe_ratio(&Arc::from(format!("shape {i}")), 0.5);
        }
        assert_eq!(pushdown.shapes.lock().expect("not poisoned").len(), MAX_SHAPES);
        // Push rates are kept by shape too, the engine-wide one until then.
        assert_eq!(pushdown.push_rate(&a), None);
        pushdown.observe(Some(100.0), None);
        assert_eq!(pushdown.push_rate(&a), Some(100.0));
        pushdown.observe_shape_rate(&a, 400.0);
        assert_eq!(pushdown.push_rate(&a), Some(400.0));
        assert_eq!(pushdown.push_rate("another shape"), Some(100.0));
    }
}
