//! The footer-free scan: plans every range request of a query from the table
//! version's manifest, prunes row groups with the manifest's zone maps, fetches
//! only the projected column chunks, and decodes them with the footer that the
//! manifest carries — no GET ever reads a Parquet footer.
//!
//! Unit of retrieval: one row group of one data object. The whole scan is
//! planned before the first GET; [`pipeline`] then downloads the units
//! under the object scheduler's budget ([`crate::scheduler`]), cuts each
//! into morsels (pieces of its rows, as many as the partitions need:
//! `plan::assign_morsels`) and hands them to the partitions in the order
//! they arrive.

mod metadata;
mod metrics;
mod pipeline;
mod plan;
mod portable;

use std::fmt;
use std::sync::{Arc, Mutex};

use datafusion::arrow::datatypes::SchemaRef;
use datafusion::common::config::ConfigOptions;
use datafusion::common::stats::Precision;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::{ColumnStatistics, DataFusionError, Result, Statistics};
use datafusion::execution::TaskContext;
use datafusion::physical_expr::expressions::DynamicFilterPhysicalExpr;
use datafusion::physical_expr::{EquivalenceProperties, PhysicalExpr};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use futures::StreamExt;
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType, apply_expression_roots};
use datafusion::physical_plan::filter_pushdown::{ChildPushdownResult, FilterPushdownPhase, FilterPushdownPropagation, PushedDown};
use datafusion::physical_plan::metrics::{ExecutionPlanMetricsSet, MetricBuilder, MetricsSet};
use datafusion::physical_plan::statistics::StatisticsArgs;
use datafusion::physical_plan::{
    ChildrenPropertiesMode, DisplayAs, DisplayFormatType, ExecutionPlan, Partitioning, PlanProperties,
    ReplaceChildrenOptions, SendableRecordBatchStream,
};

use blobhouse_storage::histogram::Histogram;

use pipeline::{CpuSpan, Pipeline, ScanCounters, ScanToRun};
use crate::runtime_filter::{RuntimeFilters, is_runtime_filter};
use crate::scheduler::SchedulerOptions;
use crate::source::DataSource;
use crate::zone_maps::ZoneMaps;

pub use metadata::MetadataCache;
pub use metrics::{GET_PRICE_USD, ScanMetrics, collect_scan_metrics, collect_scheduler_timelines};
use plan::PlanSummary;
pub use plan::ScanRequest;
pub use portable::{ScanCodec, ScanTally, TallyRead};
pub(crate) use plan::ScanUnit;

/// The scan operator of blobhouse tables.
#[derive(Debug)]
pub struct BlobScanExec {
    table: String,
    source: DataSource,
    schema: SchemaRef,
    /// Table column of each output column; `row_id_column` stands for the
    /// row ids.
    projection: Vec<usize>,
    row_id_column: usize,
    /// Every unit to read, in plan order (object, row group).
    units: Vec<ScanUnit>,
    partitions: usize,
    summary: PlanSummary,
    filters: Vec<String>,
    batch_size: usize,
    rows: u64,
    metrics: ExecutionPlanMetricsSet,
    properties: Arc<PlanProperties>,
    scheduler: SchedulerOptions,
    counters: ScanCounters,
    /// The execution in progress, shared by the partitions.
    run: Arc<Mutex<Option<Run>>>,
    /// The download manager's CPU while this scan ran.
    download_cpu: Arc<CpuSpan>,
    /// Per projected column, from the manifest's zone maps of the row
    /// groups read: the optimizer's join and filter estimates.
    column_stats: Vec<ColumnStatistics>,
    /// Per projected column, the histograms of the row groups read (`None`
    /// unless every one has one): the optimizer's range estimates
    /// ([`crate::selectivity`]).
    histograms: Vec<Option<Arc<[Histogram]>>>,
    /// The zone maps of the projected columns of the units, in plan order:
    /// what runtime filters prune with.
    unit_zone_maps: Arc<ZoneMaps>,
    /// Filters that operators above fill in while the query runs
    /// ([`crate::runtime_filter`]).
    runtime_filters: Option<RuntimeFilters>,
    /// The filters pushed in at planning, over the scan's output: applied
    /// before the runtime filters (see [`RuntimeFilters::rows`]).
    pushed_predicate: Option<Arc<dyn PhysicalExpr>>,
    /// Set when a hybrid scan above ([`crate::hybrid`]) sends some units to
    /// a storage node: this scan then reads only the others.
    split: Option<Arc<Split>>,
    /// The caching tiers already saw this scan's access (a hybrid scan
    /// plans the tiers itself, with every unit, before it splits them).
    tiers_planned: bool,
}

/// Which of a scan's units an operator above took over, decided when the
/// query starts (a hybrid scan pushes them to a storage node).
#[derive(Debug, Default)]
pub(crate) struct Split {
    taken: Mutex<Option<Arc<Vec<bool>>>>,
}

impl Split {
    /// Units (by plan index) taken over for the execution about to start.
    pub(crate) fn decide(&self, taken: Vec<bool>) {
        *self.taken.lock().expect("not poisoned") = Some(Arc::new(taken));
    }

    fn taken(&self) -> Option<Arc<Vec<bool>>> {
        self.taken.lock().expect("not poisoned").clone()
    }
}

/// An execution of the scan: its pipeline and which partitions started.
/// Executing a partition a second time starts a new execution.
struct Run {
    pipeline: Arc<Pipeline>,
    started: Vec<bool>,
    open: usize,
}

impl fmt::Debug for Run {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.debug_struct("Run").field("started", &self.started).field("open", &self.open).finish()
    }
}

/// Held by a partition's stream. When the last stream of an execution
/// whose partitions have all started is dropped (the query finished, or
/// stopped early at a LIMIT), the execution ends: its pending downloads
/// are cancelled.
struct StreamGuard {
    run: Arc<Mutex<Option<Run>>>,
    pipeline: Arc<Pipeline>,
}

impl Drop for StreamGuard {
    fn drop(&mut self) {
        let mut slot = self.run.lock().expect("not poisoned");
        if let Some(run) = slot.as_mut()
            && Arc::ptr_eq(&run.pipeline, &self.pipeline)
        {
            run.open -= 1;
            if run.open == 0 && run.started.iter().all(|s| *s) {
                slot.take();
            }
        }
    }
}

impl BlobScanExec {
    /// This scan with other runtime filters: a new node, as the optimizer
    /// wants, sharing the plan and the metrics.
    fn with_runtime_filters(&self, runtime_filters: Option<RuntimeFilters>) -> BlobScanExec {
        self.rebuilt(runtime_filters, self.split.clone(), self.units.clone(), self.partitions, self.properties.clone(), self.tiers_planned)
    }

    /// This scan with one more runtime filter ([`crate::key_transfer`]);
    /// with `wait`, its partitions wait for the filter to be complete
    /// before they decode ([`RuntimeFilters::awaited`]).
    pub(crate) fn with_runtime_filter(&self, filter: Arc<DynamicFilterPhysicalExpr>, wait: bool) -> BlobScanExec {
        let filters = RuntimeFilters::adding(self.runtime_filters.as_ref(), filter, wait);
        self.with_runtime_filters(Some(filters))
    }

    /// The runtime filters pushed into this scan, as they were pushed.
    pub(crate) fn runtime_filter_exprs(&self) -> &[Arc<dyn PhysicalExpr>] {
        self.runtime_filters.as_ref().map_or(&[], |r| r.exprs())
    }

    /// This scan, reading only the units that `split` leaves it.
    pub(crate) fn with_split(&self, split: Arc<Split>) -> BlobScanExec {
        self.rebuilt(self.runtime_filters.clone(), Some(split), self.units.clone(), self.partitions, self.properties.clone(), self.tiers_planned)
    }

    /// A scan of only `units` (plan indices), in one partition, whose access
    /// the tiers already saw: what a hybrid scan reads itself when a
    /// storage node could not do them.
    pub(crate) fn restricted(&self, units: &[usize]) -> BlobScanExec {
        let units: Vec<ScanUnit> = units.iter().filter_map(|i| self.units.get(*i).cloned()).collect();
        let properties = Arc::new(PlanProperties::new(
            EquivalenceProperties::new(self.schema.clone()),
            Partitioning::UnknownPartitioning(1),
            EmissionType::Incremental,
            Boundedness::Bounded,
        ));
        self.rebuilt(self.runtime_filters.clone(), None, units, 1, properties, true)
    }

    fn rebuilt(
        &self,
        runtime_filters: Option<RuntimeFilters>,
        split: Option<Arc<Split>>,
        units: Vec<ScanUnit>,
        partitions: usize,
        properties: Arc<PlanProperties>,
        tiers_planned: bool,
    ) -> BlobScanExec {
        BlobScanExec {
            table: self.table.clone(),
            source: self.source.clone(),
            schema: self.schema.clone(),
            projection: self.projection.clone(),
            row_id_column: self.row_id_column,
            units,
            partitions,
            summary: self.summary.clone(),
            filters: self.filters.clone(),
            batch_size: self.batch_size,
            rows: self.rows,
            metrics: self.metrics.clone(),
            properties,
            scheduler: self.scheduler.clone(),
            counters: self.counters.clone(),
            run: Arc::default(),
            download_cpu: Arc::default(),
            column_stats: self.column_stats.clone(),
            histograms: self.histograms.clone(),
            unit_zone_maps: self.unit_zone_maps.clone(),
            runtime_filters,
            pushed_predicate: self.pushed_predicate.clone(),
            split,
            tiers_planned,
        }
    }

    /// Every unit of the plan, in plan order.
    pub(crate) fn units(&self) -> &[ScanUnit] {
        &self.units
    }

    /// The histograms of output column `column` over the row groups this
    /// scan reads, when every one has one.
    pub(crate) fn histograms(&self, column: usize) -> Option<&[Histogram]> {
        self.histograms.get(column)?.as_deref()
    }

    /// The table column of each output column, when none is the row ids.
    pub(crate) fn data_projection(&self) -> Option<&[usize]> {
        (!self.projection.contains(&self.row_id_column)).then_some(self.projection.as_slice())
    }

    /// Whether a hybrid scan already splits this scan.
    pub(crate) fn is_split(&self) -> bool {
        self.split.is_some()
    }

    /// The data objects and row groups it reads, as text: two scans that
    /// print alike (one table at two versions) differ here.
    pub(crate) fn data_fingerprint(&self) -> String {
        let units: Vec<String> = self.units.iter().map(|u| format!("{}#{}{:?}", u.object.path, u.row_group, u.selection.as_deref().map(|s| s.ranges()))).collect();
        units.join(",")
    }

    /// Where its data comes from (the caching tiers among it).
    pub(crate) fn source(&self) -> &DataSource {
        &self.source
    }
}

impl DisplayAs for BlobScanExec {
    fn fmt_as(&self, t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        let cols: Vec<&str> = self.schema.fields().iter().map(|f| f.name().as_str()).collect();
        match t {
            DisplayFormatType::TreeRender => write!(f, "table={}", self.table),
            _ => {
                write!(
                    f,
                    "BlobScanExec: table={}, projection=[{}], row_groups={}/{} (pruned {}), requests={}, bytes={}",
                    self.table,
                    cols.join(", "),
                    self.summary.row_groups_total - self.summary.row_groups_pruned,
                    self.summary.row_groups_total,
                    self.summary.row_groups_pruned,
                    self.summary.requests_planned,
                    self.summary.bytes_planned,
                )?;
                if self.summary.morsels > self.units.len() {
                    write!(f, ", morsels={}", self.summary.morsels)?;
                }
                if self.summary.rows_skipped_by_pages > 0 {
                    write!(f, ", page_index_skips={} rows", self.summary.rows_skipped_by_pages)?;
                }
                if self.summary.page_index_reads > 0 {
                    write!(f, ", page_index_reads={}", self.summary.page_index_reads)?;
                }
                if !self.filters.is_empty() {
                    write!(f, ", pruning_filters=[{}]", self.filters.join(", "))?;
                }
                if let Some(r) = &self.runtime_filters {
                    let shown: Vec<String> = r.exprs().iter().map(|e| e.to_string()).collect();
                    write!(f, ", runtime_filters=[{}]", shown.join(", "))?;
                }
                let reader = if self.source.download_manager().is_some() { "download_manager" } else { "object_store" };
                write!(f, ", reader={reader}")
            }
        }
    }
}

impl ExecutionPlan for BlobScanExec {
    fn name(&self) -> &str {
        "BlobScanExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![]
    }

    /// The runtime filters: a hash join computes its filter only when it
    /// finds it in the plan below it.
    fn apply_expressions(&self, f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>) -> Result<TreeNodeRecursion> {
        apply_expression_roots(self.runtime_filters.iter().flat_map(|r| r.exprs()), f)
    }

    /// Takes the filters that change while the query runs (DataFusion's
    /// dynamic filters, pushed down after planning) and answers "not
    /// pushed down" for every filter: the scan applies them as far as it
    /// pays ([`crate::runtime_filter`]), so its parents keep checking.
    fn handle_child_pushdown_result(
        &self,
        phase: FilterPushdownPhase,
        child: ChildPushdownResult,
        _config: &ConfigOptions,
    ) -> Result<FilterPushdownPropagation<Arc<dyn ExecutionPlan>>> {
        let answers = vec![PushedDown::No; child.parent_filters.len()];
        let runtime: Vec<Arc<dyn PhysicalExpr>> = if phase == FilterPushdownPhase::Post {
            child.parent_filters.into_iter().map(|f| f.filter).filter(is_runtime_filter).collect()
        } else {
            Vec::new()
        };
        let propagation = FilterPushdownPropagation::with_parent_pushdown_result(answers);
        if runtime.is_empty() {
            return Ok(propagation);
        }
        let mut all: Vec<Arc<dyn PhysicalExpr>> = self.runtime_filters.iter().flat_map(|f| f.exprs().iter().cloned()).collect();
        all.extend(runtime);
        Ok(propagation.with_updated_node(Arc::new(self.with_runtime_filters(RuntimeFilters::new(all)))))
    }

    /// Drops the runtime filters: the operators that fill them start afresh
    /// without them (a recursive query re-runs its plan so), and a filter
    /// left from the previous run would drop rows the next one needs.
    fn reset_state(self: Arc<Self>) -> Result<Arc<dyn ExecutionPlan>> {
        Ok(Arc::new(self.with_runtime_filters(None)))
    }

    fn replace_children(self: Arc<Self>, _: Vec<Arc<dyn ExecutionPlan>>, _: ReplaceChildrenOptions) -> Result<Arc<dyn ExecutionPlan>> {
        Ok(self)
    }

    fn with_new_children(self: Arc<Self>, children: Vec<Arc<dyn ExecutionPlan>>) -> Result<Arc<dyn ExecutionPlan>> {
        self.replace_children(children, ReplaceChildrenOptions::new(ChildrenPropertiesMode::Recompute))
    }

    fn execute(&self, partition: usize, context: Arc<TaskContext>) -> Result<SendableRecordBatchStream> {
        if partition >= self.partitions {
            return Err(DataFusionError::Internal(format!("BlobScanExec has no partition {partition}")));
        }
        let pipeline = {
            let mut slot = self.run.lock().expect("not poisoned");
            let fresh = slot.as_ref().is_none_or(|r| r.started[partition]);
            if fresh {
                let units = match &self.split {
                    None => self.units.clone(),
                    Some(split) => {
                        let taken = split.taken().ok_or_else(|| DataFusionError::Internal(format!("the hybrid scan of {} started its scan before splitting it", self.table)))?;
                        self.units.iter().filter(|u| !taken.get(u.index).copied().unwrap_or(false)).cloned().collect()
                    }
                };
                let scan = ScanToRun {
                    table: &self.table,
                    units,
                    tiers_planned: self.tiers_planned || self.split.is_some(),
                    partitions: self.partitions,
                    source: self.source.clone(),
                    opts: self.scheduler.clone(),
                    counters: self.counters.clone(),
                    cpu: self.download_cpu.clone(),
                    runtime: self.runtime_filters.clone().map(|f| (f, self.unit_zone_maps.clone())),
                };
                let pipeline = Pipeline::start(scan, &context.memory_pool());
                *slot = Some(Run { pipeline: Arc::new(pipeline), started: vec![false; self.partitions], open: 0 });
            }
            let run = slot.as_mut().expect("just set");
            run.started[partition] = true;
            run.open += 1;
            run.pipeline.clone()
        };
        let guard = StreamGuard { run: self.run.clone(), pipeline: pipeline.clone() };
        let rows = self.runtime_filters.as_ref().map(|f| f.rows(&self.schema, self.pushed_predicate.as_ref())).transpose()?;
        let morsels = MetricBuilder::new(&self.metrics).counter("morsels_decoded", partition);
        let stream = pipeline.stream(partition, self.schema.clone(), self.projection.clone(), self.row_id_column, self.batch_size, rows, morsels, Box::new(guard));
        let awaited: Vec<_> = self.runtime_filters.iter().flat_map(|r| r.awaited().iter().cloned()).collect();
        if awaited.is_empty() {
            return Ok(stream);
        }
        let waited = MetricBuilder::new(&self.metrics).subset_time("runtime_filter_wait_time", partition);
        let schema = stream.schema();
        let waiting = futures::stream::once(async move {
            let _timer = waited.timer();
            for filter in awaited {
                filter.wait_complete().await;
            }
            stream
        })
        .flatten();
        Ok(Box::pin(RecordBatchStreamAdapter::new(schema, waiting)))
    }

    fn metrics(&self) -> Option<MetricsSet> {
        Some(self.metrics.clone_inner())
    }

    fn statistics_from_inputs(&self, _: &[Arc<Statistics>], args: &StatisticsArgs) -> Result<Arc<Statistics>> {
        let mut stats = Statistics::new_unknown(&self.schema);
        if args.partition().is_none() {
            stats.num_rows = Precision::Exact(self.rows as usize);
            // Decoded (Arrow) bytes, not the compressed bytes downloaded: the
            // optimizer sizes hash tables with this. Compressed sizes made
            // TPC-H Q12 build on all of `orders` (its keys compress 10:1)
            // rather than on the few filtered `lineitem` rows.
            stats.total_byte_size = self.column_stats.iter().map(|c| c.byte_size).fold(Precision::Exact(0), |a, b| a.add(&b)).to_inexact();
            stats.column_statistics = self.column_stats.clone();
        }
        Ok(Arc::new(stats))
    }
}
