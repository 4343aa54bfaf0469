//! Hybrid scans (FlexPushdownDB §4): per row group, read from the caching
//! tiers, push the separable operators above the scan to a storage node,
//! or fetch the data and run them here — and merge the two into one stream.
//!
//! Planning: [`HybridRule`], a physical optimizer rule, finds the separable
//! operators directly above a [`BlobScanExec`] — filters, projections and a
//! partial (first-phase) aggregation, FlexPushdownDB §4.1 — and puts a
//! [`HybridExec`] on top of them. Only chains that reduce the data (a filter
//! or an aggregation) are worth shipping: a bare projection is already free
//! in Parquet, and decoded rows are larger than the compressed chunks.
//!
//! Execution: when the first partition starts, [`HybridExec`] tells the
//! caching tiers of the scan's access (one access, Algorithm 1, with each
//! segment weighted by the pushdown work a hit saves — what Weighted-LFU
//! values), then splits the row groups:
//! - every chunk cached or admitted → read here (the scan below reads it);
//! - otherwise pushed or fetched, by [`PushdownMode`]: `on` pushes all of
//!   them (FlexPushdownDB's heuristic), `auto` sends each to the path that
//!   would finish it first ([`push_next`]), by the fetch rate and the push
//!   rate of this chain's shape measured on earlier scans ([`CostModel`]).
//!
//! Pushed row groups travel in tasks of up to `row_groups_per_task` row
//! groups of one object; each task's output arrives whole or not at all, so
//! a node that is busy, dies or fails mid-query costs only time: its row
//! groups are then read here by a scan restricted to them. Partial
//! aggregates from either side go to the same final aggregation, which is
//! what makes the merge exact.
//!
//! A hybrid scan on the probe side of a hash join carries [`Probe`]s (put
//! there by `crate::bloom_join`): its pushed tasks start when the join first
//! asks for rows — after the build side is complete — and add a Bloom
//! filter of the build side's keys to the fragment, so the node sends back
//! only rows that may join (FlexPushdownDB §4.2).

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use datafusion::arrow::record_batch::RecordBatch;
use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::TaskContext;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_expr::expressions::Column;
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::aggregates::{AggregateExec, AggregateMode};
use datafusion::physical_plan::filter::FilterExec;
use datafusion::physical_plan::metrics::{Count, ExecutionPlanMetricsSet, MetricBuilder, MetricsSet};
use datafusion::physical_plan::projection::ProjectionExec;
use datafusion::physical_plan::repartition::RepartitionExec;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{DisplayAs, DisplayFormatType, ExecutionPlan, ExecutionPlanProperties, Partitioning, PlanProperties, SendableRecordBatchStream};
use futures::StreamExt;
use tokio::sync::mpsc;

use blobhouse_cache::Touch;
use blobhouse_pushdown::{BloomProbeExpr, BloomSlot, NodeClient, ObjectSlice, ObjectSliceExec, PushdownError};

use crate::scan::{BlobScanExec, ScanUnit, Split};

/// When scans push work to the storage node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PushdownMode {
    /// Never: fetch what the caches do not hold.
    Off,
    /// Always, for what the caches do not hold (FlexPushdownDB's heuristic).
    On,
    /// Divide the uncached row groups between pushing and fetching by the
    /// rates measured on earlier scans.
    #[default]
    Auto,
}

impl PushdownMode {
    /// Parses `off`, `on` or `auto` (any case).
    pub fn parse(text: &str) -> Option<PushdownMode> {
        [PushdownMode::Off, PushdownMode::On, PushdownMode::Auto].into_iter().find(|m| m.name().eq_ignore_ascii_case(text.trim()))
    }

    /// Its name, as `parse` takes it.
    pub fn name(self) -> &'static str {
        match self {
            PushdownMode::Off => "off",
            PushdownMode::On => "on",
            PushdownMode::Auto => "auto",
        }
    }
}

/// The storage node an engine pushes to.
#[derive(Clone)]
pub struct PushdownOptions {
    /// `http://host:port` of a `blobhouse storage-node` serving the same database.
    pub endpoint: String,
    /// The node's bearer token.
    pub token: String,
    pub mode: PushdownMode,
    /// Row groups of one object per task: fewer tasks, against finer
    /// fallback and balance.
    pub row_groups_per_task: usize,
    /// Tasks one scan keeps at the node at once.
    pub tasks_in_flight: usize,
}

/// Never shows the token (engine options are printed in messages and logs).
impl fmt::Debug for PushdownOptions {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.debug_struct("PushdownOptions")
            .field("endpoint", &self.endpoint)
            .field("token", &"<redacted>")
            .field("mode", &self.mode)
            .field("row_groups_per_task", &self.row_groups_per_task)
            .field("tasks_in_flight", &self.tasks_in_flight)
            .finish()
    }
}

impl PushdownOptions {
    /// Defaults for the node at `endpoint`.
    pub fn new(endpoint: impl Into<String>, token: impl Into<String>) -> Self {
        PushdownOptions { endpoint: endpoint.into(), token: token.into(), mode: PushdownMode::Auto, row_groups_per_task: 4, tasks_in_flight: 8 }
    }
}

/// Smoothing of the measured rates: each scan's measurement weighs this much.
const RATE_WEIGHT: f64 = 0.5;

/// Push and fetch rates (compressed bytes of row groups handled per
/// second), measured on the scans that ran; `None` until measured. The
/// split sends each row group to the path that would finish it first
/// ([`push_next`]), so that both paths end together.
#[derive(Debug, Clone, Copy, Default)]
pub struct CostModel {
    pub push_bytes_per_second: Option<f64>,
    pub fetch_bytes_per_second: Option<f64>,
}

impl CostModel {
    fn blend(old: Option<f64>, new: f64) -> Option<f64> {
        if !new.is_finite() || new <= 0.0 {
            return old;
        }
        Some(old.map_or(new, |o| o * (1.0 - RATE_WEIGHT) + new * RATE_WEIGHT))
    }

}

/// Whether the next row group not wholly cached goes to the node, given
/// the bytes each path already has: to the path that would finish it
/// first at its measured rate (list scheduling on two machines of known
/// speed). Pushing it moves `push_bytes` (the whole row group: the node
/// reads every chunk); fetching it only `fetch_bytes` (the chunks no tier
/// holds), so a row group that is mostly cached is fetched. Until both
/// rates are measured the paths count as equally fast, so that a scan of
/// two or more row groups measures both.
///
/// An earlier rule gave each path a share of the bytes by rate and sent
/// each row group to the path further behind its share; with the one or
/// two row groups a selective scan has, that sent every second row group
/// to be fetched even when the node was many times faster (a fetch of a
/// row group the node would have filtered to 2 % of its bytes).
pub fn push_next(pushed: f64, fetched: f64, push_bytes: f64, fetch_bytes: f64, push_rate: Option<f64>, fetch_rate: Option<f64>) -> bool {
    let (p, f) = match (push_rate, fetch_rate) {
        (Some(p), Some(f)) if p > 0.0 && f > 0.0 => (p, f),
        _ => (1.0, 1.0),
    };
    (pushed + push_bytes) / p <= (fetched + fetch_bytes) / f
}

/// The engine's link to its storage node, shared by its queries.
#[derive(Debug)]
pub struct Pushdown {
    client: NodeClient,
    options: PushdownOptions,
    mode: Mutex<PushdownMode>,
    /// Whether joins send Bloom filters of their build sides with pushed
    /// probe-side scans (`SET pushdown_bloom`).
    bloom: std::sync::atomic::AtomicBool,
    model: Mutex<CostModel>,
    /// What was measured by chain shape ([`shape_of`]): a query plans
    /// afresh each time, so what its earlier runs measured must live here,
    /// not in the plan, for the split and Weighted-LFU to see it.
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

/// A separable chain's shape: its plan text with every digit masked, so
/// that runs of one query template with other constants (dates,
/// quantities, row-group counts) share their measured output ratio.
/// String constants stay: a template whose strings vary is measured per
/// string, which costs only the unmeasured default on first use.
fn shape_of(chain: &Arc<dyn ExecutionPlan>) -> Arc<str> {
    let text = datafusion::physical_plan::displayable(chain.as_ref()).indent(false).to_string();
    let mut masked = String::with_capacity(text.len());
    let mut last_digit = false;
    for c in text.chars() {
        let digit = c.is_ascii_digit();
        if !digit {
            masked.push(c);
        } else if !last_digit {
            masked.push('#');
        }
        last_digit = digit;
    }
    Arc::from(masked)
}

/// The cache policy's class of a chain shape ([`blobhouse_cache::Touch::class`]):
/// a hash, stable within the process, which is as long as a policy lives.
fn shape_class(shape: &str) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::hash::DefaultHasher::new();
    shape.hash(&mut h);
    h.finish()
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
        let client = NodeClient::new(&options.endpoint, &options.token)?;
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

    fn count(&self, f: impl FnOnce(&mut PushdownTotals)) {
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

    fn warn(&self, message: String) {
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
    fn shape_push_rate(&self, shape: &str) -> Option<f64> {
        self.shapes.lock().expect("not poisoned").get(shape).and_then(|f| f.push_bytes_per_second)
    }

    fn observe_ratio(&self, shape: &Arc<str>, ratio: f64) {
        if !ratio.is_finite() || ratio < 0.0 {
            return;
        }
        self.update_shape(shape, |f| f.output_ratio = CostModel::blend(f.output_ratio, ratio));
    }

    fn observe_shape_rate(&self, shape: &Arc<str>, rate: f64) {
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

    fn observe(&self, push: Option<f64>, fetch: Option<f64>) {
        let mut m = self.model.lock().expect("not poisoned");
        if let Some(p) = push {
            m.push_bytes_per_second = CostModel::blend(m.push_bytes_per_second, p);
        }
        if let Some(f) = fetch {
            m.fetch_bytes_per_second = CostModel::blend(m.fetch_bytes_per_second, f);
        }
    }
}

/// The physical optimizer rule that makes scans hybrid (see the module docs).
#[derive(Debug)]
pub struct HybridRule {
    pushdown: Arc<Pushdown>,
}

impl HybridRule {
    pub fn new(pushdown: Arc<Pushdown>) -> Self {
        HybridRule { pushdown }
    }
}

/// What a separable chain above a scan holds.
struct Chain {
    reduces: bool,
}

/// The chain of separable operators from `plan` down to a scan, if `plan`
/// starts one: a partial aggregation (at the top only), filters and
/// projections, over a scan without row ids that is not split yet.
fn separable_chain(plan: &Arc<dyn ExecutionPlan>) -> Option<Chain> {
    let mut node = plan.clone();
    let mut reduces = false;
    let mut top = true;
    loop {
        if let Some(scan) = node.downcast_ref::<BlobScanExec>() {
            return (!top && scan.data_projection().is_some() && !scan.is_split() && !scan.units().is_empty()).then_some(Chain { reduces });
        }
        let child = if let Some(a) = node.downcast_ref::<AggregateExec>() {
            if !top || *a.mode() != AggregateMode::Partial {
                return None;
            }
            reduces = true;
            a.input().clone()
        } else if let Some(f) = node.downcast_ref::<FilterExec>() {
            reduces = true;
            f.input().clone()
        } else if let Some(p) = node.downcast_ref::<ProjectionExec>() {
            p.input().clone()
        } else if let Some(r) = node.downcast_ref::<RepartitionExec>().filter(|r| round_robin(r)) {
            // Spreads a scan of few row groups over the cores; a fragment
            // leaves it out (a node runs one slice in one partition).
            r.input().clone()
        } else {
            return None;
        };
        top = false;
        node = child;
    }
}

impl PhysicalOptimizerRule for HybridRule {
    fn optimize(&self, plan: Arc<dyn ExecutionPlan>, _: &ConfigOptions) -> Result<Arc<dyn ExecutionPlan>> {
        if self.pushdown.mode() == PushdownMode::Off {
            return Ok(plan);
        }
        plan.transform_down(|node| {
            let Some(chain) = separable_chain(&node) else { return Ok(Transformed::no(node)) };
            if !chain.reduces {
                return Ok(Transformed::no(node));
            }
            let split = Arc::new(Split::default());
            let mut scan: Option<Arc<BlobScanExec>> = None;
            let input = node
                .clone()
                .transform_up(|n| match n.downcast_ref::<BlobScanExec>() {
                    Some(s) => {
                        let split_scan = Arc::new(s.with_split(split.clone()));
                        scan = Some(split_scan.clone());
                        Ok(Transformed::yes(split_scan as Arc<dyn ExecutionPlan>))
                    }
                    None => Ok(Transformed::no(n)),
                })?
                .data;
            let scan = scan.expect("the chain ends at a scan");
            // Ship the chain once now: a fragment a node cannot run (an
            // expression datafusion-proto does not carry, a scalar
            // subquery's value) stays local.
            let probe = fragment(&input, &scan, &scan.units()[..1])?;
            if blobhouse_pushdown::codec::shippable(probe).is_err() {
                return Ok(Transformed::no(node));
            }
            let hybrid = HybridExec::new(input, scan, split, self.pushdown.clone());
            Ok(Transformed::new(Arc::new(hybrid) as Arc<dyn ExecutionPlan>, true, TreeNodeRecursion::Jump))
        })
        .map(|t| t.data)
    }

    fn name(&self) -> &str {
        "blobhouse_hybrid_pushdown"
    }

    fn schema_check(&self) -> bool {
        true
    }
}

fn round_robin(r: &RepartitionExec) -> bool {
    matches!(r.partitioning(), Partitioning::RoundRobinBatch(_))
}

/// `chain` with its scan replaced by a slice of `units` (one object's).
fn fragment(chain: &Arc<dyn ExecutionPlan>, scan: &BlobScanExec, units: &[ScanUnit]) -> Result<Arc<dyn ExecutionPlan>> {
    let projection = scan.data_projection().ok_or_else(|| DataFusionError::Internal("a hybrid scan reads row ids".into()))?.to_vec();
    let first = units.first().ok_or_else(|| DataFusionError::Internal("an empty pushdown task".into()))?;
    let slice = ObjectSlice {
        object: first.object.name.clone(),
        row_groups: units.iter().map(|u| u.row_group).collect(),
        columns: projection,
        deleted: first.object.deleted.clone(),
        selections: units.iter().map(|u| u.selection.clone()).collect(),
    };
    with_leaf(chain, Arc::new(ObjectSliceExec::new(slice, scan.schema())))
}

/// `chain` over `leaf` instead of its scan, in one partition (round-robin
/// repartitioning left out).
fn with_leaf(chain: &Arc<dyn ExecutionPlan>, leaf: Arc<dyn ExecutionPlan>) -> Result<Arc<dyn ExecutionPlan>> {
    chain
        .clone()
        .transform_up(|n| {
            if n.is::<BlobScanExec>() {
                return Ok(Transformed::yes(leaf.clone()));
            }
            match n.downcast_ref::<RepartitionExec>().filter(|r| round_robin(r)) {
                Some(r) => Ok(Transformed::yes(r.input().clone())),
                None => Ok(Transformed::no(n)),
            }
        })
        .map(|t| t.data)
}

/// Where each unit of a scan goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Route {
    Cached,
    Push,
    Fetch,
}

/// The separable chain above a scan, run here and on the storage node.
#[derive(Debug)]
pub struct HybridExec {
    input: Arc<dyn ExecutionPlan>,
    scan: Arc<BlobScanExec>,
    split: Arc<Split>,
    pushdown: Arc<Pushdown>,
    metrics: ExecutionPlanMetricsSet,
    run: Arc<Mutex<Option<Run>>>,
    /// Bloom filters from joins above, applied to the pushed rows.
    probes: Vec<Probe>,
    /// The chain's shape, under which [`Pushdown`] keeps the bytes the
    /// node sent back per compressed byte it scanned on earlier runs: how
    /// much a pushed miss still moves.
    shape: Arc<str>,
}

/// A Bloom filter a join above builds from its build side, to be applied
/// to columns of this scan's output.
#[derive(Debug, Clone)]
pub(crate) struct Probe {
    /// The key columns in the hybrid scan's output schema.
    pub columns: Vec<usize>,
    pub slot: Arc<BloomSlot>,
}

/// What a miss of a segment costs relative to fetching it, when the scan
/// that reads it can push down (Weighted-LFU's weight, FlexPushdownDB
/// Equation 1 in relative form: pushdown time over fetch time).
///
/// Once this chain shape has been pushed and a fetch measured, that is
/// `fetch rate / push rate of the shape`: the push rate is measured end to
/// end, so it holds all three of Equation 1's terms (the reply on the
/// link, the node's scan and its filtering) as they were, not as
/// constants would model them. Before, the network part is what the node
/// sends back per byte scanned (`output_ratio`, half until measured) and
/// the node's part its engine-wide time per byte relative to a fetch.
/// Clamped to [0.01, 1]. Segments of scans that cannot push weigh 1.
fn miss_weight(output_ratio: Option<f64>, shape_push_rate: Option<f64>, model: CostModel) -> f64 {
    if let (Some(f), Some(p)) = (model.fetch_bytes_per_second, shape_push_rate)
        && p > 0.0
    {
        return (f / p).clamp(0.01, 1.0);
    }
    let network = output_ratio.unwrap_or(0.5);
    let node = match (model.fetch_bytes_per_second, model.push_bytes_per_second) {
        (Some(f), Some(p)) if p > 0.0 => f / p,
        _ => 0.0,
    };
    (network + node).clamp(0.01, 1.0)
}

/// One execution: the pushed results of each partition, still to be taken.
struct Run {
    pushed: Vec<Option<mpsc::Receiver<Result<RecordBatch>>>>,
    /// Signalled when a partition is first polled: the pushed tasks start then.
    go: Arc<tokio::sync::Notify>,
    tasks: Arc<Mutex<Vec<tokio::task::JoinHandle<()>>>>,
    progress: Arc<LocalProgress>,
}

/// The local side of an execution, for the fetch rate: fetched bytes over
/// the time until its last partition ended. Measured only when the units
/// read from the caches are a small part of it (they would flatter the
/// store).
#[derive(Debug)]
struct LocalProgress {
    started: Instant,
    open: std::sync::atomic::AtomicUsize,
    fetched_bytes: u64,
    cached_bytes: u64,
    pushdown: Arc<Pushdown>,
}

impl LocalProgress {
    fn partition_done(&self) {
        if self.open.fetch_sub(1, std::sync::atomic::Ordering::SeqCst) != 1 {
            return;
        }
        if self.fetched_bytes > 0 && self.cached_bytes * 4 <= self.fetched_bytes {
            let secs = self.started.elapsed().as_secs_f64().max(1e-6);
            self.pushdown.observe(None, Some(self.fetched_bytes as f64 / secs));
        }
    }
}

impl fmt::Debug for Run {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.debug_struct("Run").finish_non_exhaustive()
    }
}

impl Drop for Run {
    fn drop(&mut self) {
        // A query that is dropped (or run again) stops its pushed tasks.
        for t in self.tasks.lock().expect("not poisoned").drain(..) {
            t.abort();
        }
    }
}

#[derive(Clone)]
struct Counters {
    cached: Count,
    pushed: Count,
    fetched: Count,
    fallback: Count,
    pushed_bytes: Count,
    received_bytes: Count,
    bloom_filters: Count,
}

impl HybridExec {
    fn new(input: Arc<dyn ExecutionPlan>, scan: Arc<BlobScanExec>, split: Arc<Split>, pushdown: Arc<Pushdown>) -> Self {
        let shape = shape_of(&input);
        HybridExec { input, scan, split, pushdown, metrics: ExecutionPlanMetricsSet::new(), run: Arc::default(), shape, probes: Vec::new() }
    }

    /// This scan, with one more Bloom filter for its pushed rows.
    pub(crate) fn with_probe(&self, probe: Probe) -> HybridExec {
        let mut probes = self.probes.clone();
        probes.push(probe);
        HybridExec { probes, ..HybridExec::new(self.input.clone(), self.scan.clone(), self.split.clone(), self.pushdown.clone()) }
    }

    fn counters(&self) -> Counters {
        let c = |name: &'static str| MetricBuilder::new(&self.metrics).global_counter(name);
        Counters {
            cached: c("row_groups_cached"),
            pushed: c("row_groups_pushed"),
            fetched: c("row_groups_fetched"),
            fallback: c("row_groups_fallback"),
            pushed_bytes: c("bytes_pushed"),
            received_bytes: c("bytes_received"),
            bloom_filters: c("bloom_filters"),
        }
    }

    /// Where each unit goes now, from the tiers' contents and the mode.
    /// Also returns, per unit, the bytes of its chunks no tier holds.
    fn routes(&self, mode: PushdownMode) -> (Vec<Route>, Vec<u64>) {
        let tiers = self.scan.source().tiers();
        let rates = (self.pushdown.push_rate(&self.shape), self.pushdown.model().fetch_bytes_per_second);
        let (mut pushed, mut fetched) = (0f64, 0f64);
        self.scan
            .units()
            .iter()
            .map(|u| {
                let missing = tiers.map_or(u.bytes(), |t| t.missing_bytes(&u.object.display, &u.chunks));
                if tiers.is_some() && missing == 0 {
                    return (Route::Cached, 0);
                }
                let bytes = u.bytes() as f64;
                let push = match mode {
                    PushdownMode::Off => false,
                    PushdownMode::On => true,
                    PushdownMode::Auto => push_next(pushed, fetched, bytes, missing as f64, rates.0, rates.1),
                };
                if push {
                    pushed += bytes;
                    (Route::Push, missing)
                } else {
                    fetched += missing as f64;
                    (Route::Fetch, missing)
                }
            })
            .unzip()
    }

    /// Tells the tiers of the access, splits the units, starts the pushed
    /// tasks; returns the receivers of the partitions' pushed results.
    fn start(&self, context: &Arc<TaskContext>) -> Result<Run> {
        let partitions = self.input.output_partitioning().partition_count();
        let units = self.scan.units();
        if let Some(tiers) = self.scan.source().tiers() {
            // The weight is this shape's current estimate; its class lets
            // Weighted-LFU re-value the shape's earlier reads by it.
            let (weight, class) = match self.pushdown.mode() {
                PushdownMode::Off => (1.0, None),
                _ => (
                    miss_weight(self.pushdown.output_ratio(&self.shape), self.pushdown.shape_push_rate(&self.shape), self.pushdown.model()),
                    Some(shape_class(&self.shape)),
                ),
            };
            // A unit is read here only when all its chunks are cached, so
            // its chunks are admitted together or not at all.
            let touches: Vec<(Touch, crate::tiers::DecodedSize)> = units
                .iter()
                .enumerate()
                .flat_map(|(i, u)| u.segments().map(move |(key, decoded)| (Touch { weight, class, unit: Some(i as u64), ..Touch::of(key) }, decoded)))
                .collect();
            tiers.plan_touches(&touches);
        }
        let (routes, missing) = self.routes(self.pushdown.mode());
        if let Some(tiers) = self.scan.source().tiers() {
            for (u, _) in units.iter().zip(&routes).filter(|(_, r)| **r == Route::Push) {
                tiers.release_unfilled(&u.object.display, &u.chunks);
            }
        }
        self.split.decide(routes.iter().map(|r| *r == Route::Push).collect());
        let counters = self.counters();
        for r in &routes {
            match r {
                Route::Cached => counters.cached.add(1),
                Route::Push => counters.pushed.add(1),
                Route::Fetch => counters.fetched.add(1),
            }
        }
        let n = |route: Route| routes.iter().filter(|r| **r == route).count() as u64;
        self.pushdown.count(|t| {
            t.row_groups_cached += n(Route::Cached);
            t.row_groups_pushed += n(Route::Push);
            t.row_groups_fetched += n(Route::Fetch);
        });
        // Tasks: runs of pushed row groups of one object.
        let mut tasks: Vec<Vec<usize>> = Vec::new();
        for (i, u) in units.iter().enumerate() {
            if routes[i] != Route::Push {
                continue;
            }
            match tasks.last_mut() {
                Some(t) if t.len() < self.pushdown.options.row_groups_per_task.max(1) && Arc::ptr_eq(&units[t[0]].object, &u.object) => t.push(i),
                _ => tasks.push(vec![i]),
            }
        }
        let mut senders = Vec::with_capacity(partitions);
        let mut receivers = Vec::with_capacity(partitions);
        for _ in 0..partitions {
            let (tx, rx) = mpsc::channel(2);
            senders.push(tx);
            receivers.push(Some(rx));
        }
        let handles = Arc::new(Mutex::new(Vec::new()));
        let go = Arc::new(tokio::sync::Notify::new());
        if tasks.is_empty() {
            // Nothing is pushed, so no Bloom filter will be asked for: the
            // join's build side need not hash its keys.
            for p in &self.probes {
                p.slot.abandon();
            }
        } else {
            let queue: VecDeque<(usize, Vec<usize>)> = tasks.into_iter().enumerate().map(|(i, t)| (i % partitions, t)).collect();
            let driver = Driver {
                chain: self.input.clone(),
                scan: self.scan.clone(),
                pushdown: self.pushdown.clone(),
                context: context.clone(),
                counters,
                started: Instant::now(),
                shape: self.shape.clone(),
                bloom: None,
            };
            let (go, probes, schema) = (go.clone(), self.probes.clone(), self.input.schema());
            handles.lock().expect("not poisoned").push(tokio::spawn(async move {
                go.notified().await;
                let mut driver = driver;
                // The push rate counts from here: a join polls its probe
                // side only once its build side ended.
                driver.started = Instant::now();
                driver.bloom = bloom_predicate(&probes, &schema);
                if driver.bloom.is_some() {
                    driver.counters.bloom_filters.add(probes.len());
                }
                driver.run(queue, senders).await
            }));
        }
        // A fetched unit may have some chunks cached: only the rest is fetched.
        let (mut fetched_bytes, mut cached_bytes) = (0, 0);
        for ((u, r), missing) in units.iter().zip(&routes).zip(&missing) {
            if *r != Route::Push {
                fetched_bytes += missing;
                cached_bytes += u.bytes().saturating_sub(*missing);
            }
        }
        let progress = Arc::new(LocalProgress {
            started: Instant::now(),
            open: std::sync::atomic::AtomicUsize::new(partitions),
            fetched_bytes,
            cached_bytes,
            pushdown: self.pushdown.clone(),
        });
        Ok(Run { pushed: receivers, go, tasks: handles, progress })
    }
}

/// The Bloom probes whose filters are ready, as one predicate over the
/// scan's output (`None`: none is ready). A filter not ready when the
/// tasks start is left out rather than waited for: it only saves bytes.
fn bloom_predicate(probes: &[Probe], schema: &datafusion::arrow::datatypes::SchemaRef) -> Option<Arc<dyn PhysicalExpr>> {
    let ready: Vec<Arc<dyn PhysicalExpr>> = probes
        .iter()
        .filter_map(|p| {
            let filter = p.slot.ready()?;
            let keys = p.columns.iter().map(|c| Arc::new(Column::new(schema.field(*c).name(), *c)) as Arc<dyn PhysicalExpr>).collect();
            Some(Arc::new(BloomProbeExpr::new(keys, filter).ok()?) as Arc<dyn PhysicalExpr>)
        })
        .collect();
    ready.into_iter().reduce(|a, b| datafusion::physical_expr::conjunction([a, b]))
}

/// Sums what every [`HybridExec`] in an executed plan did (the statement's
/// share of [`Pushdown::totals`]).
pub fn collect_pushdown(plan: &Arc<dyn ExecutionPlan>) -> PushdownTotals {
    let mut t = PushdownTotals::default();
    if let Some(h) = plan.downcast_ref::<HybridExec>() {
        let m = h.metrics.clone_inner();
        let v = |name: &str| m.sum_by_name(name).map_or(0, |v| v.as_usize() as u64);
        t = PushdownTotals {
            row_groups_cached: v("row_groups_cached"),
            row_groups_pushed: v("row_groups_pushed"),
            row_groups_fetched: v("row_groups_fetched"),
            row_groups_fallback: v("row_groups_fallback"),
            bytes_pushed: v("bytes_pushed"),
            bytes_received: v("bytes_received"),
        };
    }
    for child in plan.children() {
        t += collect_pushdown(child);
    }
    t
}

/// Runs a scan's pushed tasks, falling back to reading them here.
struct Driver {
    chain: Arc<dyn ExecutionPlan>,
    scan: Arc<BlobScanExec>,
    pushdown: Arc<Pushdown>,
    context: Arc<TaskContext>,
    counters: Counters,
    started: Instant,
    shape: Arc<str>,
    /// Bloom probes added on top of each pushed fragment.
    bloom: Option<Arc<dyn PhysicalExpr>>,
}

impl Driver {
    async fn run(self, queue: VecDeque<(usize, Vec<usize>)>, senders: Vec<mpsc::Sender<Result<RecordBatch>>>) {
        let this = Arc::new(self);
        let bytes: u64 = queue.iter().flat_map(|(_, t)| t.iter()).map(|i| this.scan.units()[*i].bytes()).sum();
        let in_flight = this.pushdown.options.tasks_in_flight.max(1);
        let results = futures::stream::iter(queue)
            .map(|(partition, units)| {
                let this = this.clone();
                async move { (partition, this.task(&units).await) }
            })
            .buffer_unordered(in_flight);
        futures::pin_mut!(results);
        let mut all_pushed = true;
        while let Some((partition, outcome)) = results.next().await {
            match outcome {
                Ok((batches, pushed)) => {
                    all_pushed &= pushed;
                    for b in batches {
                        if senders[partition].send(Ok(b)).await.is_err() {
                            return; // the query stopped
                        }
                    }
                }
                Err(e) => {
                    let _ = senders[partition].send(Err(e)).await;
                    return;
                }
            }
        }
        if all_pushed {
            let rate = bytes as f64 / this.started.elapsed().as_secs_f64().max(1e-6);
            this.pushdown.observe(Some(rate), None);
            this.pushdown.observe_shape_rate(&this.shape, rate);
            let (sent, scanned) = (this.counters.received_bytes.value(), this.counters.pushed_bytes.value());
            if scanned > 0 {
                this.pushdown.observe_ratio(&this.shape, sent as f64 / scanned as f64);
            }
        }
    }

    /// One task: pushed, or read here when the node cannot. Returns the
    /// batches and whether the node did it.
    async fn task(&self, units: &[usize]) -> Result<(Vec<RecordBatch>, bool)> {
        let all = self.scan.units();
        let picked: Vec<ScanUnit> = units.iter().map(|i| all[*i].clone()).collect();
        let mut fragment = fragment(&self.chain, &self.scan, &picked)?;
        if let Some(b) = &self.bloom {
            fragment = Arc::new(FilterExec::try_new(b.clone(), fragment)?);
        }
        match self.pushdown.client.run(fragment).await {
            Ok(reply) => {
                // What the link carried (compressed IPC), against the
                // compressed Parquet the node read: both are network bytes.
                let (scanned, sent) = (picked.iter().map(|u| u.bytes() as usize).sum(), reply.wire_bytes as usize);
                let batches = reply.batches;
                self.counters.pushed_bytes.add(scanned);
                self.counters.received_bytes.add(sent);
                self.pushdown.count(|t| {
                    t.bytes_pushed += scanned as u64;
                    t.bytes_received += sent as u64;
                });
                Ok((batches, true))
            }
            Err(e) => {
                self.pushdown.warn(format!("{e}; read the data here instead (the answer is unaffected)"));
                self.counters.fallback.add(units.len());
                self.pushdown.count(|t| {
                    t.row_groups_fallback += units.len() as u64;
                    t.row_groups_pushed -= units.len() as u64;
                });
                let batches = self.locally(units).await?;
                Ok((batches, false))
            }
        }
    }

    /// Runs the chain here over a scan of only `units`.
    async fn locally(&self, units: &[usize]) -> Result<Vec<RecordBatch>> {
        let chain = with_leaf(&self.chain, Arc::new(self.scan.restricted(units)))?;
        let mut out = Vec::new();
        for p in 0..chain.output_partitioning().partition_count() {
            let mut s = chain.execute(p, self.context.clone())?;
            while let Some(b) = s.next().await {
                out.push(b?);
            }
        }
        Ok(out)
    }
}

impl DisplayAs for HybridExec {
    fn fmt_as(&self, t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        let mode = self.pushdown.mode();
        if t == DisplayFormatType::TreeRender {
            return write!(f, "node={}\nmode={}", self.pushdown.client.endpoint(), mode.name());
        }
        let (routes, _) = self.routes(mode);
        let count = |r: Route| routes.iter().filter(|x| **x == r).count();
        let model = self.pushdown.model();
        let rate = |r: Option<f64>| r.map_or("not measured".to_string(), |r| format!("{:.1} MiB/s", r / 1048576.0));
        write!(
            f,
            "HybridExec: node={}, mode={}, split now: cached={}, push={}, fetch={}; measured push {}, fetch {}",
            self.pushdown.client.endpoint(),
            mode.name(),
            count(Route::Cached),
            count(Route::Push),
            count(Route::Fetch),
            rate(self.pushdown.push_rate(&self.shape)),
            rate(model.fetch_bytes_per_second),
        )?;
        if !self.probes.is_empty() {
            let schema = self.input.schema();
            let keys: Vec<String> = self.probes.iter().map(|p| p.columns.iter().map(|c| schema.field(*c).name().as_str()).collect::<Vec<_>>().join("+")).collect();
            write!(f, "; bloom probes on {}", keys.join(", "))?;
        }
        Ok(())
    }
}

impl ExecutionPlan for HybridExec {
    fn name(&self) -> &str {
        "HybridExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        self.input.properties()
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
    }

    fn apply_expressions(&self, _: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>) -> Result<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    fn with_new_children(self: Arc<Self>, mut children: Vec<Arc<dyn ExecutionPlan>>) -> Result<Arc<dyn ExecutionPlan>> {
        if children.len() != 1 {
            return Err(DataFusionError::Internal("HybridExec has one child".into()));
        }
        let input = children.remove(0);
        // The split scan may have been rebuilt (runtime filters): find it.
        let mut scan = None;
        input.apply(|n| {
            if let Some(s) = n.downcast_ref::<BlobScanExec>() {
                scan = Some(Arc::new(s.with_split(self.split.clone())));
                return Ok(TreeNodeRecursion::Stop);
            }
            Ok(TreeNodeRecursion::Continue)
        })?;
        let scan = scan.ok_or_else(|| DataFusionError::Internal("HybridExec lost its scan".into()))?;
        Ok(Arc::new(HybridExec { probes: self.probes.clone(), ..HybridExec::new(input, scan, self.split.clone(), self.pushdown.clone()) }))
    }

    fn execute(&self, partition: usize, context: Arc<TaskContext>) -> Result<SendableRecordBatchStream> {
        let pushed = {
            let mut slot = self.run.lock().expect("not poisoned");
            let fresh = slot.as_ref().is_none_or(|r| r.pushed.get(partition).is_none_or(Option::is_none));
            if fresh {
                *slot = Some(self.start(&context)?);
            }
            let run = slot.as_mut().expect("just set");
            let rx = run.pushed.get_mut(partition).and_then(Option::take).ok_or_else(|| DataFusionError::Internal(format!("HybridExec has no partition {partition}")))?;
            (rx, run.tasks.clone(), run.progress.clone(), run.go.clone())
        };
        let (rx, tasks, progress, go) = pushed;
        let local = self.input.execute(partition, context)?;
        let schema = local.schema();
        // The local side's end, for the fetch rate (the last partition
        // to finish measures it).
        let local = local.map(Some).chain(futures::stream::once(async move {
            progress.partition_done();
            None
        }))
        .filter_map(futures::future::ready);
        let remote = futures::stream::unfold((rx, tasks), |(mut rx, tasks)| async move { rx.recv().await.map(|b| (b, (rx, tasks))) });
        let merged = futures::stream::select(local, remote);
        // The first poll starts the pushed tasks: a join polls its probe
        // side only once its build side (and so its Bloom filter) is done.
        let started = futures::stream::once(async move {
            go.notify_one();
            None
        })
        .chain(merged.map(Some))
        .filter_map(futures::future::ready);
        Ok(Box::pin(RecordBatchStreamAdapter::new(schema, started)))
    }

    fn metrics(&self) -> Option<MetricsSet> {
        Some(self.metrics.clone_inner())
    }
}


#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_miss_weighs_what_pushing_it_still_costs() {
        let unmeasured = CostModel::default();
        assert_eq!(miss_weight(None, None, unmeasured), 0.5);
        assert_eq!(miss_weight(Some(0.05), None, unmeasured), 0.05);
        // A node four times faster than the link: a quarter for its scan.
        let model = CostModel { push_bytes_per_second: Some(400.0), fetch_bytes_per_second: Some(100.0) };
        assert!((miss_weight(Some(0.05), None, model) - 0.30).abs() < 1e-12);
        // Never more than a fetch, never free.
        assert_eq!(miss_weight(Some(3.0), None, model), 1.0);
        assert_eq!(miss_weight(Some(0.0), None, CostModel { push_bytes_per_second: Some(1e12), fetch_bytes_per_second: Some(1.0) }), 0.01);
        // Once the shape was pushed: its own end-to-end time against a fetch.
        assert!((miss_weight(Some(0.05), Some(500.0), model) - 0.2).abs() < 1e-12);
        assert_eq!(miss_weight(Some(0.05), Some(50.0), model), 1.0);
    }

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

    /// Each row group goes to the path that would finish it first.
    #[test]
    fn the_split_follows_the_rates() {
        let split = |units: &[f64], p: Option<f64>, f: Option<f64>| -> Vec<bool> {
            let (mut pushed, mut fetched) = (0.0, 0.0);
            units
                .iter()
                .map(|b| {
                    let push = push_next(pushed, fetched, *b, *b, p, f);
                    if push { pushed += b } else { fetched += b }
                    push
                })
                .collect()
        };
        // Unmeasured: alternate, so that both paths get measured.
        assert_eq!(split(&[1.0, 1.0, 1.0, 1.0], None, Some(100.0)), [true, false, true, false]);
        // A node three times as fast takes three of four equal row groups…
        assert_eq!(split(&[1.0; 4], Some(300.0), Some(100.0)).iter().filter(|p| **p).count(), 3);
        // …and both of two: fetching one would end later than pushing both.
        assert_eq!(split(&[1.0, 1.0], Some(300.0), Some(100.0)), [true, true]);
        // A node slower than the link fetches most.
        assert_eq!(split(&[1.0; 4], Some(50.0), Some(100.0)).iter().filter(|p| **p).count(), 1);
        // A row group mostly cached is fetched (a tenth of it is missing)
        // although the node is three times as fast on the whole of it.
        assert!(!push_next(0.0, 0.0, 1.0, 0.1, Some(300.0), Some(100.0)));
        assert!(push_next(0.0, 0.0, 1.0, 0.5, Some(300.0), Some(100.0)));
        let mut b = CostModel::blend(None, 100.0);
        assert_eq!(b, Some(100.0));
        b = CostModel::blend(b, 200.0);
        assert_eq!(b, Some(150.0));
        assert_eq!(CostModel::blend(b, f64::NAN), Some(150.0));
    }

    #[test]
    fn options_never_show_the_token() {
        let o = PushdownOptions::new("http://node:50061", "s3cr3t-token");
        assert!(!format!("{o:?}").contains("s3cr3t"), "{o:?}");
    }

    #[test]
    fn modes_by_name() {
        assert_eq!(PushdownMode::parse(" AUTO "), Some(PushdownMode::Auto));
        assert_eq!(PushdownMode::parse("off"), Some(PushdownMode::Off));
        assert_eq!(PushdownMode::parse("sometimes"), None);
    }
}
