//! The footer-free scan: plans every range request of a query from the table
//! version's manifest, prunes row groups with the manifest's zone maps, fetches
//! only the projected column chunks, and decodes them with the footer that the
//! manifest carries — no GET ever reads a Parquet footer.
//!
//! Work unit: one row group of one data object ("morsel"). The whole scan
//! is planned before the first GET; [`crate::pipeline`] then downloads the
//! units under the object scheduler's budget ([`crate::scheduler`]) and
//! hands them to the partitions in the order they arrive.

use std::collections::HashMap;
use std::fmt;
use std::ops::Range;
use std::sync::{Arc, Mutex};

use base64::Engine as _;
use datafusion::arrow::array::{ArrayRef, StringArray, UInt64Array};
use datafusion::arrow::compute::{CastOptions, cast_with_options};
use datafusion::arrow::datatypes::{DataType, Schema, SchemaRef};
use datafusion::common::stats::Precision;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::{Column, ColumnStatistics, DFSchema, DataFusionError, Result, ScalarValue, Statistics, pruning::PruningStatistics};
use datafusion::execution::TaskContext;
use datafusion::execution::memory_pool::{MemoryConsumer, MemoryPool, MemoryReservation};
use datafusion::logical_expr::Expr;
use datafusion::logical_expr::utils::conjunction;
use datafusion::physical_expr::{EquivalenceProperties, PhysicalExpr};
use datafusion::physical_optimizer::pruning::PruningPredicateBuilder;
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::metrics::{ExecutionPlanMetricsSet, MetricBuilder, MetricsSet};
use datafusion::physical_plan::statistics::StatisticsArgs;
use datafusion::physical_plan::{
    ChildrenPropertiesMode, DisplayAs, DisplayFormatType, ExecutionPlan, Partitioning, PlanProperties,
    ReplaceChildrenOptions, SendableRecordBatchStream,
};
use datafusion::catalog::Session;
use object_store::path::Path;
use parquet::arrow::arrow_reader::{ArrowReaderMetadata, ArrowReaderOptions};
use parquet::file::metadata::ParquetMetaDataReader;

use blobhouse_storage::format::{DataObject, Manifest};
use blobhouse_storage::{Database, StorageError};

use crate::chunks::{RequestPolicy, Span};
use crate::pipeline::{CpuSpan, Pipeline, ScanCounters};
use crate::scheduler::{Decision, SchedulerOptions};
use crate::source::DataSource;

/// Decoded Parquet footers, by object path. Objects are never rewritten, so
/// an entry never goes stale. Entries are held in the engine's memory
/// budget (`FooterCache`); when the budget refuses one, the footer is used
/// for the scan at hand and not kept.
#[derive(Debug)]
pub struct FooterCache {
    entries: Mutex<HashMap<String, ArrowReaderMetadata>>,
    reservation: MemoryReservation,
}

impl FooterCache {
    /// An empty cache accounted in `pool`.
    pub fn new(pool: &Arc<dyn MemoryPool>) -> Self {
        FooterCache { entries: Mutex::default(), reservation: MemoryConsumer::new("FooterCache").register(pool) }
    }

    fn get(&self, db: &Database, object: &DataObject) -> Result<ArrowReaderMetadata> {
        if let Some(m) = self.entries.lock().expect("footer cache").get(&object.path) {
            return Ok(m.clone());
        }
        let location = db.location().display(&db.location().child(&object.path));
        let corrupt = |reason: String| DataFusionError::External(Box::new(StorageError::Corrupt { location: format!("manifest entry for {location}"), reason }));
        let footer = base64::engine::general_purpose::STANDARD
            .decode(&object.footer)
            .map_err(|e| corrupt(format!("footer is not base64: {e}")))?;
        let meta = ParquetMetaDataReader::decode_metadata(&footer).map_err(|e| corrupt(format!("footer does not decode: {e}")))?;
        if meta.num_row_groups() != object.row_groups.len() {
            return Err(corrupt("footer and manifest disagree on the row groups".into()));
        }
        let meta = ArrowReaderMetadata::try_new(Arc::new(meta), ArrowReaderOptions::new()).map_err(|e| corrupt(e.to_string()))?;
        if self.reservation.try_grow(meta.metadata().memory_size()).is_ok() {
            let old = self.entries.lock().expect("footer cache").insert(object.path.clone(), meta.clone());
            if let Some(old) = old {
                // Two scans decoded the same footer at once: one copy is kept.
                self.reservation.shrink(old.metadata().memory_size());
            }
        }
        Ok(meta)
    }
}

/// One data object as the scan sees it.
#[derive(Debug)]
pub(crate) struct ScanObject {
    pub path: Path,
    pub display: String,
    pub size: u64,
    pub reader: ArrowReaderMetadata,
}

/// One row group to read: the morsel of this scan.
#[derive(Debug, Clone)]
pub(crate) struct ScanUnit {
    pub object: Arc<ScanObject>,
    pub row_group: usize,
    pub rows: u64,
    pub spans: Vec<Span>,
}

impl ScanUnit {
    /// Bytes of the unit's requests.
    pub fn bytes(&self) -> u64 {
        self.spans.iter().map(|s| s.range.end - s.range.start).sum()
    }
}

/// What planning decided, reported in EXPLAIN and the metrics.
#[derive(Debug, Clone, Default)]
struct PlanSummary {
    row_groups_total: usize,
    row_groups_pruned: usize,
    bytes_planned: u64,
    bytes_skipped: u64,
    requests_planned: usize,
}

/// The scan operator of blobhouse tables.
#[derive(Debug)]
pub struct BlobScanExec {
    table: String,
    source: DataSource,
    schema: SchemaRef,
    projection: Vec<usize>,
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

/// Inputs of scan planning.
pub struct ScanRequest<'a> {
    pub table: &'a str,
    pub table_schema: SchemaRef,
    pub manifest: &'a Manifest,
    pub projection: Option<&'a Vec<usize>>,
    pub filters: &'a [Expr],
    pub limit: Option<usize>,
    pub target_partitions: usize,
    pub batch_size: usize,
    pub policy: &'a RequestPolicy,
    /// How downloads are paced.
    pub scheduler: &'a SchedulerOptions,
    /// Where the data ranges are read from.
    pub source: &'a DataSource,
}

impl BlobScanExec {
    /// Plans the scan: prune, choose chunks, cut requests, assign partitions.
    pub fn try_new(db: &Database, footers: &FooterCache, state: &dyn Session, req: ScanRequest<'_>) -> Result<Self> {
        let projection: Vec<usize> = match req.projection {
            Some(p) => p.clone(),
            None => (0..req.table_schema.fields().len()).collect(),
        };
        let schema = Arc::new(req.table_schema.project(&projection)?);

        // Zone-map pruning over all row groups of all objects.
        let all: Vec<(&DataObject, usize)> =
            req.manifest.objects.iter().flat_map(|o| (0..o.row_groups.len()).map(move |i| (o, i))).collect();
        let keep = prune(state, &req.table_schema, req.filters, &all);

        let kept: Vec<(&DataObject, usize)> = all.iter().zip(&keep).filter(|(_, k)| **k).map(|(rg, _)| *rg).collect();
        let column_stats = projection.iter().map(|&c| zone_map_statistics(req.table_schema.field(c).data_type(), c, &kept)).collect();
        let mut summary = PlanSummary { row_groups_total: all.len(), ..Default::default() };
        let mut units = Vec::new();
        let mut objects: HashMap<&str, Arc<ScanObject>> = HashMap::new();
        let mut rows_planned = 0u64;
        for ((object, rg), keep) in all.iter().zip(keep) {
            let rg_meta = &object.row_groups[*rg];
            let all_bytes: u64 = rg_meta.columns.iter().map(|c| c.length).sum();
            let limit_reached = req.limit.is_some_and(|l| rows_planned >= l as u64);
            if !keep || limit_reached {
                if !keep {
                    summary.row_groups_pruned += 1;
                }
                summary.bytes_skipped += all_bytes;
                continue;
            }
            let scan_object = match objects.get(object.path.as_str()) {
                Some(o) => o.clone(),
                None => {
                    let path = db.location().child(&object.path);
                    let o = Arc::new(ScanObject {
                        display: db.location().display(&path),
                        path,
                        size: object.size,
                        reader: footers.get(db, object)?,
                    });
                    objects.insert(object.path.as_str(), o.clone());
                    o
                }
            };
            let ranges: Vec<Range<u64>> = projection.iter().map(|&c| rg_meta.columns[c].range()).collect();
            let spans = if projection.is_empty() { Vec::new() } else { req.policy.plan(&ranges) };
            let unit = ScanUnit { object: scan_object, row_group: *rg, rows: rg_meta.rows, spans };
            summary.bytes_planned += unit.bytes();
            summary.bytes_skipped += all_bytes.saturating_sub(unit.bytes());
            summary.requests_planned += unit.spans.iter().map(|s| s.requests.len()).sum::<usize>();
            rows_planned += unit.rows;
            units.push(unit);
        }

        // Partitions take units as they arrive; more partitions than units
        // would only idle.
        let n = req.target_partitions.max(1).min(units.len().max(1));

        let properties = Arc::new(PlanProperties::new(
            EquivalenceProperties::new(schema.clone()),
            Partitioning::UnknownPartitioning(n),
            EmissionType::Incremental,
            Boundedness::Bounded,
        ));
        let metrics = ExecutionPlanMetricsSet::new();
        MetricBuilder::new(&metrics).global_counter("row_groups_pruned").add(summary.row_groups_pruned);
        MetricBuilder::new(&metrics).global_counter("bytes_skipped").add(summary.bytes_skipped as usize);
        let counters = ScanCounters::new(&metrics, req.source.download_manager().is_some());
        Ok(BlobScanExec {
            table: req.table.to_string(),
            source: req.source.clone(),
            schema,
            projection,
            units,
            partitions: n,
            summary,
            filters: req.filters.iter().map(|f| f.to_string()).collect(),
            batch_size: req.batch_size,
            rows: rows_planned,
            metrics,
            properties,
            scheduler: req.scheduler.clone(),
            counters,
            run: Arc::default(),
            download_cpu: Arc::default(),
            column_stats,
        })
    }
}

/// A column's statistics over row groups, from their zone maps: the
/// smallest minimum, the largest maximum (inexact: bounds, not values seen)
/// and the nulls. Without them DataFusion cannot tell that a join input is
/// small: in TPC-H Q18 it built a hash table on six million joined rows
/// (820 MB at SF 1) instead of on the 57 rows of the subquery.
fn zone_map_statistics(data_type: &DataType, column: usize, row_groups: &[(&DataObject, usize)]) -> ColumnStatistics {
    let mut stats = ColumnStatistics::new_unknown();
    let chunks = || row_groups.iter().map(|(o, rg)| o.row_groups[*rg].columns.get(column));
    let parse = |text: Option<&String>| text.and_then(|t| ScalarValue::try_from_string(t.clone(), data_type).ok()).filter(|v| !v.is_null());
    let mut bounds: Option<(ScalarValue, ScalarValue)> = None;
    let mut complete = true;
    for chunk in chunks() {
        let (Some(min), Some(max)) = (parse(chunk.and_then(|c| c.min.as_ref())), parse(chunk.and_then(|c| c.max.as_ref()))) else {
            complete = false;
            break;
        };
        bounds = Some(match bounds {
            None => (min, max),
            Some((lo, hi)) => (
                if min.partial_cmp(&lo) == Some(std::cmp::Ordering::Less) { min } else { lo },
                if max.partial_cmp(&hi) == Some(std::cmp::Ordering::Greater) { max } else { hi },
            ),
        });
    }
    if let (true, Some((lo, hi))) = (complete, bounds) {
        stats.min_value = Precision::Inexact(lo);
        stats.max_value = Precision::Inexact(hi);
    }
    let nulls: Option<u64> = chunks().map(|c| c.and_then(|c| c.nulls)).sum();
    if let Some(n) = nulls {
        stats.null_count = Precision::Exact(n as usize);
    }
    stats
}

/// Which row groups may hold rows matching `filters` (true = read it).
fn prune(state: &dyn Session, schema: &SchemaRef, filters: &[Expr], all: &[(&DataObject, usize)]) -> Vec<bool> {
    let keep_all = vec![true; all.len()];
    let Some(predicate) = conjunction(filters.to_vec()) else { return keep_all };
    let Ok(df_schema) = DFSchema::try_from(schema.as_ref().clone()) else { return keep_all };
    let Ok(physical) = state.create_physical_expr(predicate, &df_schema) else { return keep_all };
    let Ok(pruning) = PruningPredicateBuilder::new().with_file_schema(schema.clone()).try_build(physical) else { return keep_all };
    let stats = ZoneMaps { schema, row_groups: all };
    pruning.prune(&stats).unwrap_or(keep_all)
}

/// The manifest's zone maps seen through DataFusion's pruning interface.
struct ZoneMaps<'a> {
    schema: &'a Schema,
    row_groups: &'a [(&'a DataObject, usize)],
}

impl ZoneMaps<'_> {
    fn bound(&self, column: &Column, min: bool) -> Option<ArrayRef> {
        let idx = self.schema.index_of(&column.name).ok()?;
        let text: StringArray = self
            .row_groups
            .iter()
            .map(|(o, rg)| {
                let c = o.row_groups[*rg].columns.get(idx)?;
                if min { c.min.as_deref() } else { c.max.as_deref() }
            })
            .collect();
        // Text that no longer casts becomes null: "unknown", never pruned.
        cast_with_options(&text, self.schema.field(idx).data_type(), &CastOptions { safe: true, ..Default::default() }).ok()
    }
}

impl PruningStatistics for ZoneMaps<'_> {
    fn min_values(&self, column: &Column) -> Option<ArrayRef> {
        self.bound(column, true)
    }
    fn max_values(&self, column: &Column) -> Option<ArrayRef> {
        self.bound(column, false)
    }
    fn num_containers(&self) -> usize {
        self.row_groups.len()
    }
    fn null_counts(&self, column: &Column) -> Option<ArrayRef> {
        let idx = self.schema.index_of(&column.name).ok()?;
        let counts: UInt64Array = self.row_groups.iter().map(|(o, rg)| o.row_groups[*rg].columns.get(idx)?.nulls).collect();
        Some(Arc::new(counts))
    }
    fn row_counts(&self) -> Option<ArrayRef> {
        let counts: UInt64Array = self.row_groups.iter().map(|(o, rg)| Some(o.row_groups[*rg].rows)).collect();
        Some(Arc::new(counts))
    }
    fn contained(&self, _: &Column, _: &std::collections::HashSet<datafusion::common::ScalarValue>) -> Option<datafusion::arrow::array::BooleanArray> {
        None
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
                if !self.filters.is_empty() {
                    write!(f, ", pruning_filters=[{}]", self.filters.join(", "))?;
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

    fn apply_expressions(&self, _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>) -> Result<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
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
                let pipeline = Pipeline::start(
                    &self.table,
                    self.units.clone(),
                    self.partitions,
                    self.source.clone(),
                    self.scheduler.clone(),
                    self.counters.clone(),
                    self.download_cpu.clone(),
                    context.memory_pool(),
                );
                *slot = Some(Run { pipeline: Arc::new(pipeline), started: vec![false; self.partitions], open: 0 });
            }
            let run = slot.as_mut().expect("just set");
            run.started[partition] = true;
            run.open += 1;
            run.pipeline.clone()
        };
        let guard = StreamGuard { run: self.run.clone(), pipeline: pipeline.clone() };
        Ok(pipeline.stream(partition, self.schema.clone(), self.projection.clone(), self.batch_size, Box::new(guard)))
    }

    fn metrics(&self) -> Option<MetricsSet> {
        Some(self.metrics.clone_inner())
    }

    fn statistics_from_inputs(&self, _: &[Arc<Statistics>], args: &StatisticsArgs) -> Result<Arc<Statistics>> {
        let mut stats = Statistics::new_unknown(&self.schema);
        if args.partition().is_none() {
            stats.num_rows = Precision::Exact(self.rows as usize);
            stats.total_byte_size = Precision::Inexact(self.summary.bytes_planned as usize);
            stats.column_statistics = self.column_stats.clone();
        }
        Ok(Arc::new(stats))
    }
}

impl BlobScanExec {
    /// Scan counters as plain numbers, for benchmarks and tests.
    pub fn scan_metrics(&self) -> ScanMetrics {
        let m = self.metrics.clone_inner();
        let get = |name: &str| m.sum_by_name(name).map(|v| v.as_usize() as u64).unwrap_or(0);
        ScanMetrics {
            query_wait: self.counters.query_wait_time.value() as u64,
            data_wait: self.counters.data_wait_time.value() as u64,
            get_requests: get("get_requests"),
            bytes_fetched: get("bytes_fetched"),
            row_groups_read: get("row_groups_read"),
            row_groups_pruned: self.summary.row_groups_pruned as u64,
            row_groups_total: self.summary.row_groups_total as u64,
            bytes_skipped: self.summary.bytes_skipped,
        }
    }

    /// The scheduler's decisions in the latest execution (empty when it
    /// does not adapt).
    pub fn scheduler_timeline(&self) -> Vec<Decision> {
        self.counters.timeline.lock().expect("not poisoned").clone()
    }
}

/// Counters of one or more scans, summed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ScanMetrics {
    /// Nanoseconds partitions waited for data, and data for partitions.
    pub query_wait: u64,
    pub data_wait: u64,
    pub get_requests: u64,
    pub bytes_fetched: u64,
    pub row_groups_read: u64,
    pub row_groups_pruned: u64,
    pub row_groups_total: u64,
    pub bytes_skipped: u64,
}

impl std::ops::AddAssign for ScanMetrics {
    fn add_assign(&mut self, o: Self) {
        self.get_requests += o.get_requests;
        self.bytes_fetched += o.bytes_fetched;
        self.row_groups_read += o.row_groups_read;
        self.row_groups_pruned += o.row_groups_pruned;
        self.row_groups_total += o.row_groups_total;
        self.bytes_skipped += o.bytes_skipped;
        self.query_wait += o.query_wait;
        self.data_wait += o.data_wait;
    }
}

/// Sums the scan metrics of every [`BlobScanExec`] in an executed plan.
pub fn collect_scan_metrics(plan: &Arc<dyn ExecutionPlan>) -> ScanMetrics {
    let mut total = ScanMetrics::default();
    if let Some(scan) = plan.downcast_ref::<BlobScanExec>() {
        total += scan.scan_metrics();
    }
    for child in plan.children() {
        total += collect_scan_metrics(child);
    }
    total
}

/// Each [`BlobScanExec`]'s table and scheduler decisions in an executed plan.
pub fn collect_scheduler_timelines(plan: &Arc<dyn ExecutionPlan>) -> Vec<(String, Vec<Decision>)> {
    let mut out = Vec::new();
    if let Some(scan) = plan.downcast_ref::<BlobScanExec>() {
        out.push((scan.table.clone(), scan.scheduler_timeline()));
    }
    for child in plan.children() {
        out.extend(collect_scheduler_timelines(child));
    }
    out
}
