//! The footer-free scan: plans every range request of a query from the table
//! version's manifest, prunes row groups with the manifest's zone maps, fetches
//! only the projected column chunks, and decodes them with the footer that the
//! manifest carries — no GET ever reads a Parquet footer.
//!
//! Work unit: one row group of one data object ("morsel"). Each output
//! partition fetches its units' chunks one unit ahead of decoding, so download
//! and decode overlap. The adaptive object scheduler (issue 5) replaces the
//! fixed one-ahead policy; this module's planning stays.

use std::collections::HashMap;
use std::fmt;
use std::ops::Range;
use std::sync::{Arc, Mutex};

use base64::Engine as _;
use bytes::{Bytes, BytesMut};
use datafusion::arrow::array::{ArrayRef, RecordBatch, RecordBatchOptions, StringArray, UInt64Array};
use datafusion::arrow::compute::{CastOptions, cast_with_options};
use datafusion::arrow::datatypes::{Schema, SchemaRef};
use datafusion::common::runtime::SpawnedTask;
use datafusion::common::stats::Precision;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::{Column, DFSchema, DataFusionError, Result, Statistics, pruning::PruningStatistics};
use datafusion::execution::TaskContext;
use datafusion::logical_expr::Expr;
use datafusion::logical_expr::utils::conjunction;
use datafusion::physical_expr::{EquivalenceProperties, PhysicalExpr};
use datafusion::physical_optimizer::pruning::PruningPredicateBuilder;
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::metrics::{Count, ExecutionPlanMetricsSet, MetricBuilder, MetricsSet, Time};
use datafusion::physical_plan::statistics::StatisticsArgs;
use datafusion::physical_plan::stream::RecordBatchReceiverStream;
use datafusion::physical_plan::{
    ChildrenPropertiesMode, DisplayAs, DisplayFormatType, ExecutionPlan, Partitioning, PlanProperties,
    ReplaceChildrenOptions, SendableRecordBatchStream,
};
use datafusion::catalog::Session;
use object_store::path::Path;
use parquet::arrow::ProjectionMask;
use parquet::arrow::arrow_reader::{ArrowReaderMetadata, ArrowReaderOptions, ParquetRecordBatchReaderBuilder};
use parquet::file::metadata::ParquetMetaDataReader;

use blobhouse_storage::format::{DataObject, Manifest};
use blobhouse_storage::{Database, StorageError};

use crate::chunks::{FetchedChunks, RequestPolicy, Span};
use crate::source::DataSource;

/// Decoded Parquet footers, by object path. Objects are never rewritten, so
/// an entry never goes stale.
#[derive(Debug, Default)]
pub struct FooterCache {
    entries: Mutex<HashMap<String, ArrowReaderMetadata>>,
}

impl FooterCache {
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
        self.entries.lock().expect("footer cache").insert(object.path.clone(), meta.clone());
        Ok(meta)
    }
}

/// One data object as the scan sees it.
#[derive(Debug)]
struct ScanObject {
    path: Path,
    display: String,
    size: u64,
    reader: ArrowReaderMetadata,
}

/// One row group to read: the morsel of this scan.
#[derive(Debug, Clone)]
struct ScanUnit {
    object: Arc<ScanObject>,
    row_group: usize,
    rows: u64,
    spans: Vec<Span>,
}

impl ScanUnit {
    fn bytes(&self) -> u64 {
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
    partitions: Vec<Vec<ScanUnit>>,
    summary: PlanSummary,
    filters: Vec<String>,
    batch_size: usize,
    rows: u64,
    metrics: ExecutionPlanMetricsSet,
    properties: Arc<PlanProperties>,
    /// The download manager's CPU while this scan ran.
    download_cpu: Arc<CpuSpan>,
}

/// The CPU time the download manager's loop threads spent from the first
/// partition's start to the latest partition's end. The loops serve every
/// query of the engine, so concurrent scans share it.
#[derive(Debug, Default)]
struct CpuSpan {
    start: std::sync::OnceLock<std::time::Duration>,
    reported: std::sync::Mutex<std::time::Duration>,
}

impl CpuSpan {
    fn begin(&self, source: &DataSource) {
        if let Some(dm) = source.download_manager() {
            self.start.get_or_init(|| dm.stats().cpu);
        }
    }

    /// Adds to `metric` the CPU spent since the start and not yet reported.
    fn end(&self, source: &DataSource, metric: Option<&Time>) {
        let (Some(dm), Some(start), Some(metric)) = (source.download_manager(), self.start.get(), metric) else { return };
        let total = dm.stats().cpu.saturating_sub(*start);
        let mut reported = self.reported.lock().expect("not poisoned");
        if total > *reported {
            metric.add_duration(total - *reported);
            *reported = total;
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

        // Spread units over partitions, largest first onto the least loaded.
        let n = req.target_partitions.max(1).min(units.len().max(1));
        let mut partitions: Vec<Vec<ScanUnit>> = vec![Vec::new(); n];
        let mut load = vec![0u64; n];
        let mut order: Vec<ScanUnit> = units;
        order.sort_by_key(|u| std::cmp::Reverse(u.bytes().max(u.rows)));
        for u in order {
            let i = (0..n).min_by_key(|&i| load[i]).expect("n >= 1");
            load[i] += u.bytes().max(u.rows);
            partitions[i].push(u);
        }
        for p in &mut partitions {
            p.sort_by(|a, b| a.object.path.cmp(&b.object.path).then(a.row_group.cmp(&b.row_group)));
        }

        let properties = Arc::new(PlanProperties::new(
            EquivalenceProperties::new(schema.clone()),
            Partitioning::UnknownPartitioning(n),
            EmissionType::Incremental,
            Boundedness::Bounded,
        ));
        let metrics = ExecutionPlanMetricsSet::new();
        MetricBuilder::new(&metrics).global_counter("row_groups_pruned").add(summary.row_groups_pruned);
        MetricBuilder::new(&metrics).global_counter("bytes_skipped").add(summary.bytes_skipped as usize);
        Ok(BlobScanExec {
            table: req.table.to_string(),
            source: req.source.clone(),
            schema,
            projection,
            partitions,
            summary,
            filters: req.filters.iter().map(|f| f.to_string()).collect(),
            batch_size: req.batch_size,
            rows: rows_planned,
            metrics,
            properties,
            download_cpu: Arc::default(),
        })
    }
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

    fn execute(&self, partition: usize, _context: Arc<TaskContext>) -> Result<SendableRecordBatchStream> {
        let units = self
            .partitions
            .get(partition)
            .ok_or_else(|| DataFusionError::Internal(format!("BlobScanExec has no partition {partition}")))?
            .clone();
        let m = PartitionMetrics::new(&self.metrics, partition, self.source.download_manager().is_some());
        let mut builder = RecordBatchReceiverStream::builder(self.schema.clone(), 2);
        let tx = builder.tx();
        let source = self.source.clone();
        let schema = self.schema.clone();
        let projection = self.projection.clone();
        let batch_size = self.batch_size;
        let cpu = self.download_cpu.clone();
        cpu.begin(&source);
        builder.spawn(async move {
            let result = async {
                let fetch = |u: &ScanUnit| {
                    let (source, u, m) = (source.clone(), u.clone(), m.clone());
                    SpawnedTask::spawn(async move { fetch_unit(&source, &u, &m).await })
                };
                let mut iter = units.into_iter();
                let mut next = iter.next().map(|u| {
                    let f = fetch(&u);
                    (u, f)
                });
                while let Some((unit, task)) = next.take() {
                    // Fetch one unit ahead while this one is decoded.
                    next = iter.next().map(|u| {
                        let f = fetch(&u);
                        (u, f)
                    });
                    let chunks = task.join().await.map_err(|e| DataFusionError::External(Box::new(e)))??;
                    let decode_timer = m.decode_time.timer();
                    let batches = decode_unit(&unit, chunks, &schema, &projection, batch_size)?;
                    decode_timer.done();
                    m.row_groups_read.add(1);
                    for b in batches {
                        if tx.send(Ok(b)).await.is_err() {
                            return Ok(()); // the consumer is gone (LIMIT, cancel): stop fetching
                        }
                    }
                }
                Ok(())
            }
            .await;
            cpu.end(&source, m.download_cpu.as_ref());
            result
        });
        Ok(builder.build())
    }

    fn metrics(&self) -> Option<MetricsSet> {
        Some(self.metrics.clone_inner())
    }

    fn statistics_from_inputs(&self, _: &[Arc<Statistics>], args: &StatisticsArgs) -> Result<Arc<Statistics>> {
        let mut stats = Statistics::new_unknown(&self.schema);
        if args.partition().is_none() {
            stats.num_rows = Precision::Exact(self.rows as usize);
            stats.total_byte_size = Precision::Inexact(self.summary.bytes_planned as usize);
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
            get_requests: get("get_requests"),
            bytes_fetched: get("bytes_fetched"),
            row_groups_read: get("row_groups_read"),
            row_groups_pruned: self.summary.row_groups_pruned as u64,
            row_groups_total: self.summary.row_groups_total as u64,
            bytes_skipped: self.summary.bytes_skipped,
        }
    }
}

/// Counters of one or more scans, summed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ScanMetrics {
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

#[derive(Debug, Clone)]
struct PartitionMetrics {
    get_requests: Count,
    bytes_fetched: Count,
    row_groups_read: Count,
    fetch_time: Time,
    decode_time: Time,
    retries: Count,
    hedged: Count,
    first_byte_time: Time,
    /// Only when a download manager reads the data.
    download_cpu: Option<Time>,
}

impl PartitionMetrics {
    fn new(set: &ExecutionPlanMetricsSet, partition: usize, managed: bool) -> Self {
        PartitionMetrics {
            get_requests: MetricBuilder::new(set).counter("get_requests", partition),
            bytes_fetched: MetricBuilder::new(set).counter("bytes_fetched", partition),
            row_groups_read: MetricBuilder::new(set).counter("row_groups_read", partition),
            fetch_time: MetricBuilder::new(set).subset_time("fetch_time", partition),
            decode_time: MetricBuilder::new(set).subset_time("decode_time", partition),
            retries: MetricBuilder::new(set).counter("retries", partition),
            hedged: MetricBuilder::new(set).counter("hedged", partition),
            first_byte_time: MetricBuilder::new(set).subset_time("first_byte_time", partition),
            download_cpu: managed.then(|| MetricBuilder::new(set).subset_time("download_cpu", partition)),
        }
    }
}

/// Issues all range requests of a unit concurrently and reassembles spans.
async fn fetch_unit(source: &DataSource, unit: &ScanUnit, m: &PartitionMetrics) -> Result<FetchedChunks> {
    let timer = m.fetch_time.timer();
    let object = &unit.object;
    let requests: Vec<Range<u64>> = unit.spans.iter().flat_map(|s| s.requests.iter().cloned()).collect();
    let got = source.get_ranges(&object.path, &object.display, &requests).await.map_err(|e| DataFusionError::External(Box::new(e)))?;
    let fetched = got.bytes;
    m.get_requests.add(fetched.len());
    m.bytes_fetched.add(fetched.iter().map(Bytes::len).sum());
    m.retries.add(got.retries as usize);
    m.hedged.add(got.hedged as usize);
    m.first_byte_time.add_duration(got.first_byte);
    let mut parts = fetched.into_iter();
    let mut spans = Vec::with_capacity(unit.spans.len());
    for span in &unit.spans {
        let bytes = if span.requests.len() == 1 {
            parts.next().expect("one part per request")
        } else {
            let mut buf = BytesMut::with_capacity((span.range.end - span.range.start) as usize);
            for _ in &span.requests {
                buf.extend_from_slice(&parts.next().expect("one part per request"));
            }
            buf.freeze()
        };
        spans.push((span.range.start, bytes));
    }
    timer.done();
    Ok(FetchedChunks::new(spans, object.size, object.display.clone()))
}

/// Decodes one row group's projected columns from fetched chunks.
fn decode_unit(unit: &ScanUnit, chunks: FetchedChunks, schema: &SchemaRef, projection: &[usize], batch_size: usize) -> Result<Vec<RecordBatch>> {
    if projection.is_empty() {
        // COUNT(*) and friends: the row count is in the manifest, no bytes needed.
        let opts = RecordBatchOptions::new().with_row_count(Some(unit.rows as usize));
        return Ok(vec![RecordBatch::try_new_with_options(schema.clone(), vec![], &opts)?]);
    }
    let object = &unit.object;
    let wrap = |e: parquet::errors::ParquetError| DataFusionError::External(Box::new(StorageError::Parquet { location: object.display.clone(), source: e }));
    // The Parquet reader returns columns in file order; map them back.
    let mut sorted: Vec<usize> = projection.to_vec();
    sorted.sort_unstable();
    let mask = ProjectionMask::roots(object.reader.metadata().file_metadata().schema_descr(), sorted.iter().copied());
    let reader = ParquetRecordBatchReaderBuilder::new_with_metadata(chunks, object.reader.clone())
        .with_row_groups(vec![unit.row_group])
        .with_projection(mask)
        .with_batch_size(batch_size)
        .build()
        .map_err(wrap)?;
    let positions: Vec<usize> = projection.iter().map(|c| sorted.binary_search(c).expect("column in projection")).collect();
    let mut out = Vec::new();
    for batch in reader {
        let batch = batch.map_err(|e| DataFusionError::External(Box::new(StorageError::Corrupt { location: object.display.clone(), reason: e.to_string() })))?;
        let columns = positions.iter().map(|&i| batch.column(i).clone()).collect();
        out.push(RecordBatch::try_new(schema.clone(), columns)?);
    }
    Ok(out)
}

