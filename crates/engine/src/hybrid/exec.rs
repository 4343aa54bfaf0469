//! Running a hybrid scan: [`HybridExec`] splits the scan's row groups
//! between the caching tiers, the storage node and fetching, drives the
//! pushed tasks (falling back to reading them here), and merges both sides
//! into one stream.

use std::collections::VecDeque;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use datafusion::arrow::record_batch::RecordBatch;
use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::TaskContext;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_expr::expressions::Column;
use datafusion::physical_plan::filter::FilterExec;
use datafusion::physical_plan::metrics::{Count, ExecutionPlanMetricsSet, MetricBuilder, MetricsSet};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{DisplayAs, DisplayFormatType, ExecutionPlan, ExecutionPlanProperties, PlanProperties, SendableRecordBatchStream};
use futures::StreamExt;
use tokio::sync::mpsc;

use blobhouse_cache::Touch;
use blobhouse_pushdown::{BloomProbeExpr, BloomSlot};

use crate::scan::{BlobScanExec, ScanUnit, Split};

use super::PushdownMode;
use super::cost::{miss_weight, push_next, shape_class, shape_of};
use super::node::{Pushdown, PushdownTotals};
use super::rule::{fragment, with_leaf};

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
    pub(super) fn new(input: Arc<dyn ExecutionPlan>, scan: Arc<BlobScanExec>, split: Arc<Split>, pushdown: Arc<Pushdown>) -> Self {
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
