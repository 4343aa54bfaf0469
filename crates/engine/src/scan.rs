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
use datafusion::arrow::datatypes::{DataType, SchemaRef};
use datafusion::common::stats::Precision;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::{ColumnStatistics, DFSchema, DataFusionError, Result, Statistics};
use datafusion::execution::TaskContext;
use datafusion::execution::memory_pool::{MemoryConsumer, MemoryPool, MemoryReservation};
use datafusion::logical_expr::Expr;
use datafusion::logical_expr::utils::conjunction;
use datafusion::physical_expr::utils::{collect_columns, reassign_expr_columns};
use datafusion::physical_expr::{EquivalenceProperties, PhysicalExpr};
use datafusion::datasource::physical_plan::parquet::{PagePruningAccessPlanFilter, ParquetAccessPlan, ParquetFileMetrics, RowGroupAccess};
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::metrics::{ExecutionPlanMetricsSet, MetricBuilder, MetricsSet};
use datafusion::physical_plan::execution_plan::apply_expression_roots;
use datafusion::physical_plan::filter_pushdown::{ChildPushdownResult, FilterPushdownPhase, FilterPushdownPropagation, PushedDown};
use datafusion::physical_plan::statistics::StatisticsArgs;
use datafusion::common::config::ConfigOptions;
use datafusion::physical_plan::{
    ChildrenPropertiesMode, DisplayAs, DisplayFormatType, ExecutionPlan, Partitioning, PlanProperties,
    ReplaceChildrenOptions, SendableRecordBatchStream,
};
use datafusion::catalog::Session;
use object_store::path::Path;
use parquet::arrow::arrow_reader::{ArrowReaderMetadata, ArrowReaderOptions};
use parquet::file::metadata::{ParquetMetaData, ParquetMetaDataReader};

use blobhouse_storage::chunks::with_page_index;
use blobhouse_storage::format::DataObject;
use blobhouse_storage::histogram::Histogram;
use blobhouse_storage::rows::RowRanges;
use blobhouse_storage::{Database, LiveObject, StorageError, TableData};
use futures::{StreamExt, TryStreamExt};
use roaring::RoaringBitmap;

use crate::chunks::{RequestPolicy, Span};
use crate::pipeline::{CpuSpan, Pipeline, ScanCounters, ScanToRun};
use crate::tiers::DecodedSize;
use crate::runtime_filter::{RuntimeFilters, is_runtime_filter};
use crate::scheduler::{Decision, SchedulerOptions};
use crate::source::DataSource;
use crate::zone_maps::{self, BoundsCache, ZoneMaps};

/// What scans decode from the manifest once per data object and keep:
/// Parquet footers by object path, and zone maps parsed into typed values
/// ([`BoundsCache`]). Objects are never rewritten, so an entry never goes
/// stale. Entries are held in the engine's memory budget (`FooterCache`,
/// `BoundsCache`); one the budget refuses is used for the scan at hand and
/// not kept.
#[derive(Debug)]
pub struct MetadataCache {
    footers: Mutex<HashMap<String, ArrowReaderMetadata>>,
    reservation: MemoryReservation,
    bounds: BoundsCache,
}

impl MetadataCache {
    /// An empty cache accounted in `pool`.
    pub fn new(pool: &Arc<dyn MemoryPool>) -> Self {
        MetadataCache { footers: Mutex::default(), reservation: MemoryConsumer::new("FooterCache").register(pool), bounds: BoundsCache::new(pool) }
    }

    /// The parsed zone maps.
    pub fn bounds(&self) -> &BoundsCache {
        &self.bounds
    }

    /// The object's footer as the manifest holds it, decoded once: with the
    /// page index when the manifest carries its bytes (older objects), else
    /// without (until [`MetadataCache::footer_with_page_index`] reads it).
    fn footer(&self, db: &Database, object: &DataObject) -> Result<ArrowReaderMetadata> {
        if let Some(m) = self.footers.lock().expect("footer cache").get(&object.path) {
            return Ok(m.clone());
        }
        let location = db.location().display(&db.location().child(&object.path));
        let footer = base64::engine::general_purpose::STANDARD
            .decode(&object.footer)
            .map_err(|e| corrupt(&location, format!("footer is not base64: {e}")))?;
        let mut meta = ParquetMetaDataReader::decode_metadata(&footer).map_err(|e| corrupt(&location, format!("footer does not decode: {e}")))?;
        if meta.num_row_groups() != object.row_groups.len() {
            return Err(corrupt(&location, "footer and manifest disagree on the row groups".into()));
        }
        if let Some(index) = &object.page_index {
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(&index.bytes)
                .map_err(|e| corrupt(&location, format!("page index is not base64: {e}")))?;
            meta = with_page_index(meta, index.offset, bytes.into(), object.size, &location).map_err(|e| corrupt(&location, format!("page index does not decode: {e}")))?;
        }
        self.keep(&object.path, &location, meta)
    }

    /// The object's footer with its page index. When the manifest says only
    /// where the index lies, it is read from the object (one range GET) the
    /// first time and kept: `true` then. Objects without a page index come
    /// back as [`MetadataCache::footer`] gives them.
    async fn footer_with_page_index(&self, db: &Database, source: &DataSource, object: &DataObject) -> Result<(ArrowReaderMetadata, bool)> {
        let footer = self.footer(db, object)?;
        let Some(at) = object.page_index_at else { return Ok((footer, false)) };
        if footer.metadata().offset_index().is_some() {
            return Ok((footer, false));
        }
        let path = db.location().child(&object.path);
        let location = db.location().display(&path);
        // What the manifest says about the index, or the index itself, is wrong.
        let damaged = |reason: String| DataFusionError::External(Box::new(StorageError::Corrupt { location: location.clone(), reason }));
        if at.range().end > object.size {
            return Err(damaged(format!("the manifest puts its page index at {:?}, past the object's {} bytes", at.range(), object.size)));
        }
        let read = source.get_ranges(&path, &location, &[at.range()]).await.map_err(|e| DataFusionError::External(Box::new(e)))?;
        let bytes = read.bytes.into_iter().next().expect("one range asked, one returned");
        let meta = with_page_index(footer.metadata().as_ref().clone(), at.offset, bytes, object.size, &location)
            .map_err(|e| damaged(format!("its page index (bytes {:?}, where the manifest puts it) does not decode: {e}", at.range())))?;
        Ok((self.keep(&object.path, &location, meta)?, true))
    }

    /// Keeps `meta` for `path` (replacing what was kept) if the memory
    /// budget allows, and returns it ready for the Arrow reader.
    fn keep(&self, path: &str, location: &str, meta: ParquetMetaData) -> Result<ArrowReaderMetadata> {
        let meta = ArrowReaderMetadata::try_new(Arc::new(meta), ArrowReaderOptions::new()).map_err(|e| corrupt(location, e.to_string()))?;
        if self.reservation.try_grow(meta.metadata().memory_size()).is_ok() {
            let old = self.footers.lock().expect("footer cache").insert(path.to_string(), meta.clone());
            if let Some(old) = old {
                // Two scans decoded the same footer at once, or the page
                // index was added: one copy is kept.
                self.reservation.shrink(old.metadata().memory_size());
            }
        }
        Ok(meta)
    }
}

/// A corrupt manifest entry or page index of the object at `location`.
fn corrupt(location: &str, reason: String) -> DataFusionError {
    DataFusionError::External(Box::new(StorageError::Corrupt { location: format!("manifest entry for {location}"), reason }))
}

/// One data object as the scan sees it.
#[derive(Debug)]
pub(crate) struct ScanObject {
    pub path: Path,
    /// Its name relative to the database root (what a storage node is given).
    pub name: String,
    pub display: String,
    pub size: u64,
    pub reader: ArrowReaderMetadata,
    /// Its ordinal in the table version (the upper half of its row ids).
    pub ordinal: u32,
    /// Its deleted rows, if any.
    pub deleted: Option<Arc<RoaringBitmap>>,
}

/// One row group to read: the morsel of this scan.
#[derive(Debug, Clone)]
pub(crate) struct ScanUnit {
    /// Position in the scan's plan order (and in its [`ZoneMaps`]).
    pub index: usize,
    pub object: Arc<ScanObject>,
    pub row_group: usize,
    /// Rows of the row group, and its first row's position in the object.
    pub rows: u64,
    pub first_row: u64,
    /// The rows to decode when the page index ruled some out (`None`: all).
    /// The chunks are still fetched and cached whole.
    pub selection: Option<Arc<RowRanges>>,
    /// The column chunks it reads (the caches' segments), in projection order.
    pub chunks: Vec<Range<u64>>,
    /// Their requests to the store when none is cached.
    pub spans: Vec<Span>,
    /// Per chunk, an estimate of its whole Arrow array's memory (every row
    /// of the row group): what the memory tier is charged to hold it
    /// decoded, until the array is there to be measured.
    pub decoded: Vec<DecodedSize>,
}

impl ScanUnit {
    /// Bytes of the unit's requests.
    pub fn bytes(&self) -> u64 {
        self.spans.iter().map(|s| s.range.end - s.range.start).sum()
    }

    /// The unit's column chunks as the caches name them, each with its
    /// decoded-size estimate.
    pub fn segments(&self) -> impl Iterator<Item = (blobhouse_cache::SegmentKey, DecodedSize)> + '_ {
        let object: Arc<str> = Arc::from(self.object.display.as_str());
        self.chunks.iter().zip(&self.decoded).map(move |(r, d)| (blobhouse_cache::SegmentKey { object: object.clone(), start: r.start, len: r.end - r.start }, *d))
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
    /// Rows of row groups kept by the zone maps that page-index pruning
    /// leaves undecoded (whole row groups it prunes included).
    rows_skipped_by_pages: u64,
    /// Page indexes read from their objects while planning.
    page_index_reads: u64,
}

/// Page indexes read from objects at once while planning a scan. Each is
/// one range GET of about 0.13 % of its object; the download manager paces
/// them like any other request.
const PAGE_INDEX_READS_AT_ONCE: usize = 32;

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

/// Inputs of scan planning.
pub struct ScanRequest<'a> {
    pub table: &'a str,
    /// The table's columns, and the row-id column last when `row_ids`.
    pub table_schema: SchemaRef,
    pub row_ids: bool,
    /// The table version's live objects and their deletion vectors.
    pub data: &'a TableData,
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
    pub async fn try_new(db: &Database, metadata: &MetadataCache, state: &dyn Session, req: ScanRequest<'_>) -> Result<Self> {
        let projection: Vec<usize> = match req.projection {
            Some(p) => p.clone(),
            None => (0..req.table_schema.fields().len()).collect(),
        };
        let schema = Arc::new(req.table_schema.project(&projection)?);
        let row_id_column = req.table_schema.fields().len() - usize::from(req.row_ids);

        // Every row group of every live object, with its live rows.
        let mut all: Vec<(&DataObject, usize)> = Vec::new();
        let mut placement: Vec<(&LiveObject, u64, u64)> = Vec::new(); // object, first row, live rows
        for live in &req.data.objects {
            let object = req.data.object(live);
            let mut first = 0u64;
            for (i, rg) in object.row_groups.iter().enumerate() {
                let deleted = live.deleted.as_ref().map_or(0, |d| d.range_cardinality(first as u32..(first + rg.rows) as u32));
                all.push((object, i));
                placement.push((live, first, rg.rows - deleted));
                first += rg.rows;
            }
        }
        // Zone-map pruning; row groups whose rows are all deleted go too.
        let mut keep: Vec<bool> = prune(metadata.bounds(), state, &req.table_schema, req.filters, &all).into_iter().zip(&placement).map(|(k, p)| k && p.2 > 0).collect();
        // Page-index pruning of the row groups kept: the rows whose pages
        // may hold matches. A row group none of whose pages may is pruned.
        // (Footers are decoded here only when some filter can use them: a
        // LIMIT without filters reads only the objects it reaches.)
        let mut readers: HashMap<&str, ArrowReaderMetadata> = HashMap::new();
        let mut selections: Vec<Option<Arc<RowRanges>>> = vec![None; all.len()];
        let mut summary = PlanSummary { row_groups_total: all.len(), ..Default::default() };
        if let Some(pages) = PageFilter::new(state, &req.table_schema, req.row_ids, req.filters) {
            // The objects with a row group left (`all[i..end]` are an
            // object's row groups); their page indexes are read at once.
            let mut objects_kept: Vec<Range<usize>> = Vec::new();
            let mut i = 0;
            while i < all.len() {
                let end = i + all[i..].iter().take_while(|(o, _)| std::ptr::eq(*o, all[i].0)).count();
                if keep[i..end].iter().any(|k| *k) {
                    objects_kept.push(i..end);
                }
                i = end;
            }
            let reads: Vec<_> = objects_kept.iter().map(|r| metadata.footer_with_page_index(db, req.source, all[r.start].0)).collect();
            let footers: Vec<(ArrowReaderMetadata, bool)> = futures::stream::iter(reads)
                .buffered(PAGE_INDEX_READS_AT_ONCE)
                .try_collect()
                .await?;
            for (group, (reader, read)) in objects_kept.into_iter().zip(footers) {
                let object = all[group.start].0;
                summary.page_index_reads += u64::from(read);
                let wanted: Vec<usize> = group.clone().filter(|&j| keep[j]).map(|j| all[j].1).collect();
                let access = pages.select(&reader, &wanted);
                readers.insert(object.path.as_str(), reader);
                for j in group {
                    if !keep[j] {
                        continue;
                    }
                    let rows = object.row_groups[all[j].1].rows;
                    match &access[all[j].1] {
                        RowGroupAccess::Skip => {
                            keep[j] = false;
                            summary.rows_skipped_by_pages += rows;
                        }
                        RowGroupAccess::Selection(s) => {
                            let ranges = RowRanges::from_selection(s, rows);
                            summary.rows_skipped_by_pages += rows - ranges.selected();
                            placement[j].2 = ranges.live(placement[j].1, placement[j].0.deleted.as_deref());
                            keep[j] = placement[j].2 > 0;
                            selections[j] = Some(Arc::new(ranges));
                        }
                        RowGroupAccess::Scan => {}
                    }
                }
            }
        }
        let any_deleted = req.data.objects.iter().any(|l| l.vector.is_some());

        let mut kept: Vec<(&DataObject, usize)> = all.iter().zip(&keep).filter(|(_, k)| **k).map(|(rg, _)| *rg).collect();
        if let Some(l) = req.limit {
            // Only the row groups that reach the limit are read (below).
            let live: Vec<u64> = placement.iter().zip(&keep).filter(|(_, k)| **k).map(|(p, _)| p.2).collect();
            let mut rows = 0u64;
            let mut i = 0;
            kept.retain(|_| {
                let take = rows < l as u64;
                rows += live[i];
                i += 1;
                take
            });
        }
        let unit_zone_maps = Arc::new(ZoneMaps::new(metadata.bounds(), &req.table_schema, &projection, &kept));
        let mut column_stats: Vec<ColumnStatistics> = (0..projection.len()).map(|i| unit_zone_maps.statistics(i)).collect();
        if any_deleted {
            // Zone maps count the deleted rows too: bounds, not counts.
            for c in &mut column_stats {
                c.null_count = c.null_count.to_inexact();
            }
        }
        let histograms = projection
            .iter()
            .map(|&c| (c != row_id_column).then(|| zone_maps::histograms(metadata.bounds(), req.table_schema.field(c).data_type(), c, &kept)).flatten())
            .collect();
        let mut units = Vec::new();
        let mut objects: HashMap<&str, Arc<ScanObject>> = HashMap::new();
        let mut rows_planned = 0u64;
        let mut decoded_bytes = vec![0u64; projection.len()];
        let data_columns: Vec<usize> = projection.iter().copied().filter(|&c| c != row_id_column).collect();
        for ((((object, rg), keep), (live, first_row, live_rows)), selection) in all.iter().zip(keep).zip(&placement).zip(selections) {
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
                        name: object.path.clone(),
                        display: db.location().display(&path),
                        path,
                        size: object.size,
                        reader: match readers.get(object.path.as_str()) {
                            Some(r) => r.clone(),
                            None => metadata.footer(db, object)?,
                        },
                        ordinal: live.ordinal,
                        deleted: live.deleted.clone(),
                    });
                    objects.insert(object.path.as_str(), o.clone());
                    o
                }
            };
            // Per data column: its Parquet bytes uncompressed, once for the
            // statistics (live rows) and the cache's estimate (every row).
            let uncompressed: Vec<u64> = data_columns.iter().map(|&c| uncompressed_size(&scan_object.reader, *rg, c)).collect();
            let mut data_sizes = uncompressed.iter();
            for (sum, &c) in decoded_bytes.iter_mut().zip(&projection) {
                *sum += match c == row_id_column {
                    true => live_rows * 8,
                    false => decoded_size(req.table_schema.field(c).data_type(), *live_rows, *data_sizes.next().expect("one size per data column")),
                };
            }
            let ranges: Vec<Range<u64>> = data_columns.iter().map(|&c| rg_meta.columns[c].range()).collect();
            let decoded = data_columns
                .iter()
                .zip(&uncompressed)
                .map(|(&c, &bytes)| {
                    let data_type = req.table_schema.field(c).data_type();
                    DecodedSize { bytes: decoded_size(data_type, rg_meta.rows, bytes), fixed_width: data_type.primitive_width().is_some() }
                })
                .collect();
            let spans = if data_columns.is_empty() { Vec::new() } else { req.policy.plan(&ranges) };
            let selection = selection.filter(|s| !s.is_all());
            let unit = ScanUnit { index: units.len(), object: scan_object, row_group: *rg, rows: rg_meta.rows, first_row: *first_row, selection, chunks: ranges, spans, decoded };
            summary.bytes_planned += unit.bytes();
            summary.bytes_skipped += all_bytes.saturating_sub(unit.bytes());
            summary.requests_planned += unit.spans.iter().map(|s| s.requests.len()).sum::<usize>();
            rows_planned += live_rows;
            units.push(unit);
        }

        for (stats, bytes) in column_stats.iter_mut().zip(&decoded_bytes) {
            stats.byte_size = Precision::Inexact(*bytes as usize);
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
        MetricBuilder::new(&metrics).global_counter("rows_skipped_by_page_index").add(summary.rows_skipped_by_pages as usize);
        let counters = ScanCounters::new(&metrics, req.source.download_manager().is_some());
        let pushed_predicate = physical_predicate(state, &schema, req.filters);
        Ok(BlobScanExec {
            table: req.table.to_string(),
            source: req.source.clone(),
            schema,
            projection,
            row_id_column,
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
            histograms,
            unit_zone_maps,
            runtime_filters: None,
            pushed_predicate,
            split: None,
            tiers_planned: false,
        })
    }

    /// This scan with other runtime filters: a new node, as the optimizer
    /// wants, sharing the plan and the metrics.
    fn with_runtime_filters(&self, runtime_filters: Option<RuntimeFilters>) -> BlobScanExec {
        self.rebuilt(runtime_filters, self.split.clone(), self.units.clone(), self.partitions, self.properties.clone(), self.tiers_planned)
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

    /// Where its data comes from (the caching tiers among it).
    pub(crate) fn source(&self) -> &DataSource {
        &self.source
    }
}

/// Bytes of a column chunk once decoded into Arrow: exact for fixed-width
/// types; for variable-width ones the Parquet chunk's uncompressed size
/// (values, or dictionary and indices) plus a 16-byte view per row, the
/// layout the scan decodes strings into. An estimate, as DataFusion's own
/// Parquet source makes it.
fn decoded_size(data_type: &DataType, rows: u64, uncompressed: u64) -> u64 {
    match data_type.primitive_width() {
        Some(width) => rows * width as u64,
        None => uncompressed + rows * 16,
    }
}

/// Uncompressed Parquet bytes of top-level column `column` in row group
/// `row_group` (all its leaves, for nested types).
fn uncompressed_size(reader: &ArrowReaderMetadata, row_group: usize, column: usize) -> u64 {
    let meta = reader.metadata();
    let schema = meta.file_metadata().schema_descr();
    let rg = meta.row_group(row_group);
    (0..rg.num_columns())
        .filter(|&leaf| schema.get_column_root_idx(leaf) == column)
        .map(|leaf| rg.column(leaf).uncompressed_size().max(0) as u64)
        .sum()
}

/// `filters` as one predicate over `schema`; `None` when there are none or
/// they do not translate (they are an optimisation here: the operators
/// above the scan apply them).
fn physical_predicate(state: &dyn Session, schema: &SchemaRef, filters: &[Expr]) -> Option<Arc<dyn PhysicalExpr>> {
    let predicate = conjunction(filters.to_vec())?;
    let df_schema = DFSchema::try_from(schema.as_ref().clone()).ok()?;
    state.create_physical_expr(predicate, &df_schema).ok()
}

/// Page-index pruning: which rows of a row group may match a scan's
/// filters, by the min/max of their pages (DataFusion's page filter over
/// the page index that the manifest carries).
struct PageFilter {
    filter: PagePruningAccessPlanFilter,
    metrics: ExecutionPlanMetricsSet,
}

impl PageFilter {
    /// `None` when no filter can prune pages.
    fn new(state: &dyn Session, table_schema: &SchemaRef, row_ids: bool, filters: &[Expr]) -> Option<PageFilter> {
        // The files' columns: the table's, without the row ids.
        let columns = table_schema.fields().len() - usize::from(row_ids);
        let file_schema = Arc::new(table_schema.project(&(0..columns).collect::<Vec<_>>()).ok()?);
        let predicate = physical_predicate(state, &file_schema, filters)?;
        let filter = PagePruningAccessPlanFilter::new(&predicate, file_schema);
        (filter.filter_number() > 0).then(|| PageFilter { filter, metrics: ExecutionPlanMetricsSet::new() })
    }

    /// How to read each of the object's row groups, for `row_groups` (the
    /// others are skipped): all rows, some, or none. All rows when the
    /// object has no page index.
    fn select(&self, reader: &ArrowReaderMetadata, row_groups: &[usize]) -> Vec<RowGroupAccess> {
        let meta = reader.metadata();
        let mut plan = ParquetAccessPlan::new_none(meta.num_row_groups());
        for &rg in row_groups {
            plan.scan(rg);
        }
        if meta.column_index().is_none() || meta.offset_index().is_none() {
            return plan.into_inner();
        }
        let file_metrics = ParquetFileMetrics::new(0, "", &self.metrics);
        self.filter.prune_plan_with_page_index(plan, reader.schema(), meta.file_metadata().schema_descr(), meta, &file_metrics).into_inner()
    }
}

/// Which row groups may hold rows matching `filters` (true = read it).
fn prune(bounds: &BoundsCache, state: &dyn Session, schema: &SchemaRef, filters: &[Expr], all: &[(&DataObject, usize)]) -> Vec<bool> {
    let keep_all = vec![true; all.len()];
    let Some(physical) = physical_predicate(state, schema, filters) else { return keep_all };
    // Zone maps of only the columns the filters read: parsing every
    // column's bounds would cost planning time on wide tables.
    let mut columns: Vec<usize> = collect_columns(&physical).iter().map(|c| c.index()).collect();
    columns.sort_unstable();
    columns.dedup();
    let zone_maps = ZoneMaps::new(bounds, schema, &columns, all);
    match reassign_expr_columns(physical, &zone_maps.schema) {
        Ok(predicate) => zone_maps.prune(predicate),
        Err(_) => keep_all,
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
        Ok(pipeline.stream(partition, self.schema.clone(), self.projection.clone(), self.row_id_column, self.batch_size, rows, Box::new(guard)))
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
            runtime_skipped_row_groups: get("runtime_filter_row_groups_skipped"),
            runtime_dropped_rows: get("runtime_filter_rows_dropped"),
            rows_deleted: get("rows_deleted"),
            rows_skipped_by_page_index: self.summary.rows_skipped_by_pages,
            page_index_reads: self.summary.page_index_reads,
            memory_hits: get("cache_memory_hits"),
            memory_bytes: get("cache_memory_bytes"),
            ssd_hits: get("cache_ssd_hits"),
            ssd_bytes: get("cache_ssd_bytes"),
            cache_misses: get("cache_misses"),
            gets_avoided: get("cache_gets_avoided"),
            routed_to_store: get("cache_routed_to_store"),
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
    /// Row groups not downloaded because a runtime filter excluded them.
    pub runtime_skipped_row_groups: u64,
    /// Decoded rows the runtime filters dropped.
    pub runtime_dropped_rows: u64,
    /// Decoded rows dropped because they are deleted.
    pub rows_deleted: u64,
    /// Rows of row groups kept by the zone maps that the page index left
    /// undecoded.
    pub rows_skipped_by_page_index: u64,
    /// Page indexes the planner read from their objects (the first
    /// filtered scan of each object; later ones find them cached).
    pub page_index_reads: u64,
    /// Column chunks served by the memory and SSD tiers, and their bytes.
    pub memory_hits: u64,
    pub memory_bytes: u64,
    pub ssd_hits: u64,
    pub ssd_bytes: u64,
    /// Chunks no tier had (fetched from the store).
    pub cache_misses: u64,
    /// Requests to the store the tiers made unnecessary.
    pub gets_avoided: u64,
    /// Chunks the SSD held that were read from the store, being faster.
    pub routed_to_store: u64,
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
        self.runtime_skipped_row_groups += o.runtime_skipped_row_groups;
        self.runtime_dropped_rows += o.runtime_dropped_rows;
        self.rows_deleted += o.rows_deleted;
        self.rows_skipped_by_page_index += o.rows_skipped_by_page_index;
        self.page_index_reads += o.page_index_reads;
        self.memory_hits += o.memory_hits;
        self.memory_bytes += o.memory_bytes;
        self.ssd_hits += o.ssd_hits;
        self.ssd_bytes += o.ssd_bytes;
        self.cache_misses += o.cache_misses;
        self.gets_avoided += o.gets_avoided;
        self.routed_to_store += o.routed_to_store;
    }
}

/// Public S3 price of a GET: $0.0004 per 1,000 requests. What the caches
/// save is counted at this price (the store's own price may differ; S3's is
/// the reference every peer quotes).
pub const GET_PRICE_USD: f64 = 0.0004 / 1000.0;

impl ScanMetrics {
    /// What the caches did for these scans, in one line for the shell and
    /// EXPLAIN ANALYZE: hit rate, bytes by tier, GETs avoided and what they
    /// would have cost. `None` when no cache was asked (no tier, or a scan
    /// that read nothing).
    pub fn cache_summary(&self) -> Option<String> {
        let hits = self.memory_hits + self.ssd_hits;
        let asked = hits + self.cache_misses + self.routed_to_store;
        if asked == 0 {
            return None;
        }
        let mib = |b: u64| b as f64 / 1048576.0;
        let routed = match self.routed_to_store {
            0 => String::new(),
            n => format!(", {n} read{} routed to the store", if n == 1 { "" } else { "s" }),
        };
        Some(format!(
            "{:.0}% of {asked} chunks from cache ({} memory, {:.2} MiB; {} SSD, {:.2} MiB{routed}), {} GET{} avoided = ${:.6} saved",
            100.0 * hits as f64 / asked as f64,
            self.memory_hits,
            mib(self.memory_bytes),
            self.ssd_hits,
            mib(self.ssd_bytes),
            self.gets_avoided,
            if self.gets_avoided == 1 { "" } else { "s" },
            self.gets_avoided as f64 * GET_PRICE_USD,
        ))
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
