//! Scan planning: from the table version's manifest to the scan's units —
//! zone-map and page-index pruning of row groups, the LIMIT cut, column
//! statistics, and the range requests of every unit.

use base64::Engine as _;
use std::collections::HashMap;
use std::ops::Range;
use std::sync::Arc;

use datafusion::arrow::datatypes::{DataType, SchemaRef};
use datafusion::catalog::Session;
use datafusion::common::stats::Precision;
use datafusion::common::{ColumnStatistics, DFSchema, Result};
use datafusion::datasource::physical_plan::parquet::{PagePruningAccessPlanFilter, ParquetAccessPlan, ParquetFileMetrics, RowGroupAccess};
use datafusion::logical_expr::Expr;
use datafusion::logical_expr::utils::conjunction;
use datafusion::physical_expr::utils::{collect_columns, reassign_expr_columns};
use datafusion::physical_expr::{EquivalenceProperties, PhysicalExpr};
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::metrics::{ExecutionPlanMetricsSet, MetricBuilder};
use datafusion::physical_plan::{Partitioning, PlanProperties};
use futures::{StreamExt, TryStreamExt};
use object_store::path::Path;
use parquet::arrow::arrow_reader::ArrowReaderMetadata;
use roaring::RoaringBitmap;

use blobhouse_storage::format::DataObject;
use blobhouse_storage::rows::RowRanges;
use blobhouse_storage::{Database, LiveObject, TableData};

use crate::chunks::{RequestPolicy, Span};
use super::pipeline::ScanCounters;
use crate::scheduler::SchedulerOptions;
use crate::source::DataSource;
use crate::tiers::DecodedSize;
use crate::zone_maps::{self, BoundsCache, ZoneMaps};

use super::BlobScanExec;
use super::metadata::MetadataCache;

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
    /// The checksums of its footer and of its page index as the manifest
    /// recorded them (for a storage node, which reads both from the object).
    pub footer_checksum: Option<u64>,
    pub page_index_checksum: Option<u64>,
    /// An encrypted object's footer as stored (crypto metadata and the
    /// encrypted footer): what is sent to a worker, which decrypts it with
    /// its own keys — never the decrypted footer.
    pub encrypted_footer: Option<bytes::Bytes>,
}

/// One row group to read: the unit of retrieval of this scan, decoded in
/// one or more morsels.
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
    /// Their checksums as written (`ColumnChunkMeta::checksum`), which
    /// bytes from the store must match; `None` for an object written
    /// before checksums were kept.
    pub checksums: Option<Vec<u64>>,
    /// Their single pages' checksums where written
    /// (`ColumnChunkMeta::pages`): a storage node reading only some pages
    /// checks them.
    pub pages: Vec<Option<String>>,
    /// Their requests to the store when none is cached.
    pub spans: Vec<Span>,
    /// Per chunk, an estimate of its whole Arrow array's memory (every row
    /// of the row group): what the memory tier is charged to hold it
    /// decoded, until the array is there to be measured.
    pub decoded: Vec<DecodedSize>,
    /// Into how many morsels its rows are cut once it has arrived, each
    /// decoded by whichever partition takes it ([`assign_morsels`]).
    pub morsels: usize,
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
pub(super) struct PlanSummary {
    pub(super) row_groups_total: usize,
    pub(super) row_groups_pruned: usize,
    pub(super) bytes_planned: u64,
    pub(super) bytes_skipped: u64,
    pub(super) requests_planned: usize,
    /// Rows of row groups kept by the zone maps that page-index pruning
    /// leaves undecoded (whole row groups it prunes included).
    pub(super) rows_skipped_by_pages: u64,
    /// Page indexes read from their objects while planning.
    pub(super) page_index_reads: u64,
    /// Morsels the kept row groups are decoded in ([`assign_morsels`]).
    pub(super) morsels: usize,
}

/// The fewest rows worth a morsel of their own: below this, the dictionary
/// pages every morsel decodes again and the partly decoded pages at its
/// edges cost more than spreading the work gains.
pub(crate) const MORSEL_MIN_ROWS: u64 = 100_000;
/// The most rows of a morsel: about a tenth of a second of decoding, the
/// longest a partition that has finished may wait for the last one.
pub(crate) const MORSEL_MAX_ROWS: u64 = 1 << 20;
/// Morsels per partition a scan aims for, so that partitions finishing at
/// different times still find work and none waits long for the last one.
const MORSELS_PER_PARTITION: u64 = 4;

/// Decides how many morsels each unit is decoded in, and returns the
/// scan's morsels in all.
///
/// Why not a row group per morsel: row groups are sized for the store
/// (8–16 MiB requests per column chunk), which leaves SF 10's `lineitem`
/// with about a dozen of them — fewer than a 16-core machine's partitions,
/// and at SF 1 a single one that one partition decoded while the others
/// idled. A row group is still fetched once and whole; after it arrives
/// its rows are cut into consecutive pieces that any partition may decode
/// (the Parquet reader skips the pages before a piece without
/// decompressing them). Units are cut as far as the scan needs: into
/// about four morsels per partition, of 100 000 to 1 048 576 rows each; a
/// scan of one partition cuts nothing.
pub(crate) fn assign_morsels(units: &mut [ScanUnit], partitions: usize) -> usize {
    let rows: Vec<u64> = units.iter().map(|u| u.selection.as_ref().map_or(u.rows, |s| s.selected())).collect();
    let cuts = morsels_per_unit(&rows, partitions);
    for (u, k) in units.iter_mut().zip(&cuts) {
        u.morsels = *k;
    }
    cuts.iter().sum()
}

/// Morsels per unit of `rows` rows each (see [`assign_morsels`]).
fn morsels_per_unit(rows: &[u64], partitions: usize) -> Vec<usize> {
    if partitions <= 1 {
        // One partition reads every morsel anyway: cutting would only
        // decode the dictionary pages again.
        return vec![1; rows.len()];
    }
    let wanted = partitions as u64 * MORSELS_PER_PARTITION;
    let target = rows.iter().sum::<u64>().div_ceil(wanted).clamp(MORSEL_MIN_ROWS, MORSEL_MAX_ROWS);
    rows.iter().map(|&r| r.div_ceil(target).clamp(1, (r / MORSEL_MIN_ROWS).max(1)) as usize).collect()
}

#[cfg(test)]
mod morsel_tests {
    use super::*;

    #[test]
    fn units_are_cut_as_far_as_the_partitions_need() {
        // SF 1's lineitem: one row group of 6 M rows.
        assert_eq!(morsels_per_unit(&[6_001_215], 2), vec![8], "2 partitions: 8 wanted, ≤ 1 Mi rows each");
        assert_eq!(morsels_per_unit(&[6_001_215], 16), vec![60], "16 partitions: 64 wanted, ≥ 100 000 rows each");
        // SF 10's lineitem: a dozen row groups of about 5 M rows.
        let sf10 = vec![5_000_000u64; 12];
        assert_eq!(morsels_per_unit(&sf10, 2), vec![5; 12], "none over 1 Mi rows: the last one waited for is short");
        assert_eq!(morsels_per_unit(&sf10, 16), vec![6; 12]);
        // Small row groups are never cut below 100 000 rows.
        assert_eq!(morsels_per_unit(&[50_000; 8], 2), vec![1; 8]);
        assert_eq!(morsels_per_unit(&[150_000], 64), vec![1]);
        assert_eq!(morsels_per_unit(&[250_000], 64), vec![2]);
        // One partition: nothing to spread.
        assert_eq!(morsels_per_unit(&[6_001_215], 1), vec![1]);
        assert_eq!(morsels_per_unit(&[], 4), Vec::<usize>::new());
        assert_eq!(morsels_per_unit(&[0, 10], 4), vec![1, 1]);
    }
}

/// Page indexes read from objects at once while planning a scan. Each is
/// one range GET of about 0.13 % of its object; the download manager paces
/// them like any other request.
const PAGE_INDEX_READS_AT_ONCE: usize = 32;

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
                        footer_checksum: object.footer_checksum,
                        page_index_checksum: object.page_index_at.and_then(|at| at.checksum),
                        encrypted_footer: match object.encrypted {
                            true => Some(base64::engine::general_purpose::STANDARD.decode(&object.footer).map_err(|e| datafusion::error::DataFusionError::External(Box::new(blobhouse_storage::StorageError::Corrupt { location: db.location().display(&db.location().child(&object.path)), reason: format!("footer is not base64: {e}") })))?.into()),
                            false => None,
                        },
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
            let checksums: Option<Vec<u64>> = data_columns.iter().map(|&c| rg_meta.columns[c].checksum).collect();
            let pages: Vec<Option<String>> = data_columns.iter().map(|&c| rg_meta.columns[c].pages.clone()).collect();
            let decoded = data_columns
                .iter()
                .zip(&uncompressed)
                .map(|(&c, &bytes)| {
                    let data_type = req.table_schema.field(c).data_type();
                    // The memory tier's size of it, which may be narrower than
                    // the arrays scans make (`tiers::decoded`).
                    let bytes = match crate::tiers::decoded::held_width(data_type) {
                        Some(width) => rg_meta.rows * width as u64,
                        None => decoded_size(data_type, rg_meta.rows, bytes),
                    };
                    DecodedSize { bytes, fixed_width: data_type.primitive_width().is_some() }
                })
                .collect();
            let spans = if data_columns.is_empty() { Vec::new() } else { req.policy.plan(&ranges) };
            let selection = selection.filter(|s| !s.is_all());
            let unit = ScanUnit { index: units.len(), object: scan_object, row_group: *rg, rows: rg_meta.rows, first_row: *first_row, selection, chunks: ranges, checksums, pages, spans, decoded, morsels: 1 };
            summary.bytes_planned += unit.bytes();
            summary.bytes_skipped += all_bytes.saturating_sub(unit.bytes());
            summary.requests_planned += unit.spans.iter().map(|s| s.requests.len()).sum::<usize>();
            rows_planned += live_rows;
            units.push(unit);
        }

        for (stats, bytes) in column_stats.iter_mut().zip(&decoded_bytes) {
            stats.byte_size = Precision::Inexact(*bytes as usize);
        }

        // Partitions take morsels as their row groups arrive; more
        // partitions than morsels would only idle.
        let morsels = assign_morsels(&mut units, req.target_partitions);
        let n = req.target_partitions.max(1).min(morsels.max(1));
        summary.morsels = morsels;

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
