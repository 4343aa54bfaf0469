//! The manifest's zone maps — each column chunk's bounds, null count and
//! quantile histogram — as the planner uses them: to prune row groups, to
//! give DataFusion column statistics, and to estimate selectivities.
//!
//! The manifest keeps bounds as text (they must survive any type the
//! table has); turning them back into typed values cost about 4 % of the
//! CPU of a stream of short star-join queries, parsed again on every plan
//! (docs/notes/2026-11-24-hybrid-bound.md, "Twenty-first session"). Data
//! objects are never rewritten, so [`BoundsCache`] parses each object's
//! column once and plans gather from the typed arrays. No crate holds
//! zone maps in this form: DataFusion's Parquet source reads statistics
//! from footers, which our scans never fetch.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use datafusion::arrow::array::{Array, ArrayRef, StringArray, UInt64Array, new_empty_array, new_null_array};
use datafusion::arrow::compute::{CastOptions, cast_with_options, interleave};
use datafusion::arrow::datatypes::{DataType, Schema, SchemaRef};
use datafusion::common::stats::Precision;
use datafusion::common::{Column, ColumnStatistics, ScalarValue, pruning::PruningStatistics};
use datafusion::execution::memory_pool::{MemoryConsumer, MemoryPool, MemoryReservation};
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_optimizer::pruning::PruningPredicateBuilder;

use blobhouse_storage::format::DataObject;
use blobhouse_storage::histogram::{self, Histogram};

/// One column of one data object, parsed from the manifest: per row
/// group, its bounds (null: unknown) and its histogram.
#[derive(Debug)]
pub(crate) struct ColumnBounds {
    data_type: DataType,
    mins: ArrayRef,
    maxs: ArrayRef,
    histograms: Vec<Option<Histogram>>,
}

impl ColumnBounds {
    fn parse(object: &DataObject, column: usize, data_type: &DataType) -> ColumnBounds {
        let groups = object.row_groups.len();
        let text = |min: bool| -> StringArray {
            object
                .row_groups
                .iter()
                .map(|rg| {
                    let chunk = rg.columns.get(column)?;
                    if min { chunk.min.as_deref() } else { chunk.max.as_deref() }
                })
                .collect()
        };
        // Text that no longer casts becomes null: "unknown", never pruned.
        let typed = |text: StringArray| {
            cast_with_options(&text, data_type, &CastOptions { safe: true, ..Default::default() }).unwrap_or_else(|_| new_null_array(data_type, groups))
        };
        let histograms = if histogram::supported(data_type) {
            object
                .row_groups
                .iter()
                .map(|rg| {
                    let chunk = rg.columns.get(column)?;
                    Histogram::parse(rg.rows, data_type, chunk.min.as_deref(), chunk.quantiles.as_deref(), chunk.max.as_deref())
                })
                .collect()
        } else {
            vec![None; groups]
        };
        ColumnBounds { data_type: data_type.clone(), mins: typed(text(true)), maxs: typed(text(false)), histograms }
    }

    /// What it holds in memory, for the engine's budget.
    fn memory_size(&self) -> usize {
        let histograms: usize = self.histograms.iter().flatten().map(Histogram::memory_size).sum();
        std::mem::size_of::<Self>() + self.mins.get_array_memory_size() + self.maxs.get_array_memory_size() + histograms
    }
}

/// Parsed zone maps by object path, then column (so a lookup borrows the
/// path instead of building a key). Objects are never rewritten, so an
/// entry never goes stale; an entry is used only for the type it was
/// parsed as. Entries are held in the engine's memory budget; one the
/// budget refuses serves the plan at hand and is not kept.
#[derive(Debug)]
pub struct BoundsCache {
    entries: Mutex<HashMap<String, HashMap<usize, Arc<ColumnBounds>>>>,
    reservation: MemoryReservation,
}

impl BoundsCache {
    /// An empty cache accounted in `pool`.
    pub fn new(pool: &Arc<dyn MemoryPool>) -> Self {
        BoundsCache { entries: Mutex::default(), reservation: MemoryConsumer::new("BoundsCache").register(pool) }
    }

    /// Column `column` of `object`, as `data_type`.
    fn column(&self, object: &DataObject, column: usize, data_type: &DataType) -> Arc<ColumnBounds> {
        if let Some(b) = self.entries.lock().expect("bounds cache").get(object.path.as_str()).and_then(|o| o.get(&column)).filter(|b| &b.data_type == data_type) {
            return b.clone();
        }
        let parsed = Arc::new(ColumnBounds::parse(object, column, data_type));
        let size = parsed.memory_size();
        if self.reservation.try_grow(size).is_ok() {
            let old = self.entries.lock().expect("bounds cache").entry(object.path.clone()).or_default().insert(column, parsed.clone());
            if let Some(old) = old {
                self.reservation.shrink(old.memory_size());
            }
        }
        parsed
    }

    /// Entries (object columns) kept (for tests).
    pub fn len(&self) -> usize {
        self.entries.lock().expect("bounds cache").values().map(HashMap::len).sum()
    }

    /// Whether no entry is kept.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The per-object entries of one column for `row_groups`, and for each
/// row group which entry and which of its row groups it is.
fn gather(cache: &BoundsCache, column: usize, data_type: &DataType, row_groups: &[(&DataObject, usize)]) -> (Vec<Arc<ColumnBounds>>, Vec<(usize, usize)>) {
    let mut entries: Vec<Arc<ColumnBounds>> = Vec::new();
    let mut at: Vec<(usize, usize)> = Vec::with_capacity(row_groups.len());
    let mut last: Option<*const DataObject> = None;
    for (object, rg) in row_groups {
        if last != Some(*object as *const DataObject) {
            // Row groups of one object come together: one lookup per run.
            entries.push(cache.column(object, column, data_type));
            last = Some(*object as *const DataObject);
        }
        at.push((entries.len() - 1, *rg));
    }
    (entries, at)
}

/// Table column `column`'s histograms over `row_groups`, one per row
/// group; `None` when one has none (written before histograms were kept,
/// or of a type without them) or there are no row groups.
pub(crate) fn histograms(cache: &BoundsCache, data_type: &DataType, column: usize, row_groups: &[(&DataObject, usize)]) -> Option<Arc<[Histogram]>> {
    if row_groups.is_empty() || !histogram::supported(data_type) {
        return None;
    }
    let (entries, at) = gather(cache, column, data_type, row_groups);
    at.iter().map(|&(e, rg)| entries[e].histograms[rg].clone()).collect()
}

/// The manifest's zone maps of some columns over some row groups, seen
/// through DataFusion's pruning interface. Owned, so that a running scan
/// can prune with filters that arrive after planning.
#[derive(Debug)]
pub(crate) struct ZoneMaps {
    pub(crate) schema: SchemaRef,
    /// Per column of `schema`: minimums, maximums (null: unknown), nulls.
    mins: Vec<ArrayRef>,
    maxs: Vec<ArrayRef>,
    nulls: Vec<ArrayRef>,
    rows: ArrayRef,
}

impl ZoneMaps {
    /// Zone maps of the table columns `columns` over `row_groups`.
    pub(crate) fn new(cache: &BoundsCache, table: &Schema, columns: &[usize], row_groups: &[(&DataObject, usize)]) -> ZoneMaps {
        let (mut mins, mut maxs) = (Vec::new(), Vec::new());
        for &c in columns {
            let data_type = table.field(c).data_type();
            let (entries, at) = gather(cache, c, data_type, row_groups);
            let pick = |side: fn(&ColumnBounds) -> &ArrayRef| -> ArrayRef {
                if at.is_empty() {
                    return new_empty_array(data_type);
                }
                let sources: Vec<&dyn Array> = entries.iter().map(|e| side(e).as_ref()).collect();
                // Every source has the column's type, and every index is a
                // row group of its object: interleave cannot fail.
                interleave(&sources, &at).unwrap_or_else(|_| new_null_array(data_type, at.len()))
            };
            mins.push(pick(|e| &e.mins));
            maxs.push(pick(|e| &e.maxs));
        }
        let nulls = |c: usize| -> ArrayRef { Arc::new(row_groups.iter().map(|(o, rg)| o.row_groups[*rg].columns.get(c)?.nulls).collect::<UInt64Array>()) };
        ZoneMaps {
            schema: Arc::new(table.project(columns).expect("columns of the table")),
            mins,
            maxs,
            nulls: columns.iter().map(|&c| nulls(c)).collect(),
            rows: Arc::new(row_groups.iter().map(|(o, rg)| Some(o.row_groups[*rg].rows)).collect::<UInt64Array>()),
        }
    }

    /// Which row groups may hold rows matching `predicate` (a physical
    /// expression over [`Self::schema`]); all of them when it cannot tell.
    pub(crate) fn prune(&self, predicate: Arc<dyn PhysicalExpr>) -> Vec<bool> {
        let keep_all = vec![true; self.rows.len()];
        let Ok(pruning) = PruningPredicateBuilder::new().with_file_schema(self.schema.clone()).try_build(predicate) else { return keep_all };
        pruning.prune(self).unwrap_or(keep_all)
    }

    /// The statistics of the `i`-th column over the row groups: the
    /// smallest minimum, the largest maximum (inexact: bounds, not values
    /// seen) and the nulls. Without them DataFusion cannot tell that a
    /// join input is small: in TPC-H Q18 it built a hash table on six
    /// million joined rows (820 MB at SF 1) instead of on the 57 rows of
    /// the subquery.
    pub(crate) fn statistics(&self, i: usize) -> ColumnStatistics {
        let mut stats = ColumnStatistics::new_unknown();
        let (mins, maxs) = (&self.mins[i], &self.maxs[i]);
        if mins.null_count() == 0 && maxs.null_count() == 0 {
            let mut bounds: Option<(ScalarValue, ScalarValue)> = None;
            for rg in 0..mins.len() {
                let (Ok(min), Ok(max)) = (ScalarValue::try_from_array(mins, rg), ScalarValue::try_from_array(maxs, rg)) else {
                    bounds = None;
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
            if let Some((lo, hi)) = bounds {
                stats.min_value = Precision::Inexact(lo);
                stats.max_value = Precision::Inexact(hi);
            }
        }
        let nulls = self.nulls[i].as_any().downcast_ref::<UInt64Array>().expect("null counts are u64");
        if nulls.null_count() == 0 {
            stats.null_count = Precision::Exact(nulls.values().iter().sum::<u64>() as usize);
        }
        stats
    }

    fn column(&self, column: &Column) -> Option<usize> {
        self.schema.index_of(&column.name).ok()
    }
}

impl PruningStatistics for ZoneMaps {
    fn min_values(&self, column: &Column) -> Option<ArrayRef> {
        self.column(column).map(|i| self.mins[i].clone())
    }
    fn max_values(&self, column: &Column) -> Option<ArrayRef> {
        self.column(column).map(|i| self.maxs[i].clone())
    }
    fn num_containers(&self) -> usize {
        self.rows.len()
    }
    fn null_counts(&self, column: &Column) -> Option<ArrayRef> {
        self.column(column).map(|i| self.nulls[i].clone())
    }
    fn row_counts(&self) -> Option<ArrayRef> {
        Some(self.rows.clone())
    }
    fn contained(&self, _: &Column, _: &std::collections::HashSet<datafusion::common::ScalarValue>) -> Option<datafusion::arrow::array::BooleanArray> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use blobhouse_storage::format::{ColumnChunkMeta, RowGroupMeta};
    use datafusion::arrow::datatypes::Field;
    use datafusion::execution::memory_pool::UnboundedMemoryPool;
    use datafusion::logical_expr::Operator;
    use datafusion::physical_expr::expressions::{BinaryExpr, Column as ColumnExpr, lit};

    fn chunk(min: Option<&str>, max: Option<&str>, nulls: Option<u64>) -> ColumnChunkMeta {
        ColumnChunkMeta { offset: 0, length: 1, nulls, min: min.map(str::to_string), max: max.map(str::to_string), quantiles: None, checksum: None, pages: None }
    }

    /// An object of one Int64 column and one Utf8 column, a row group per
    /// (min, max) of the Int64 column.
    fn object(path: &str, bounds: &[(Option<&str>, Option<&str>)]) -> DataObject {
        DataObject {
            path: path.to_string(),
            key: 0,
            size: 0,
            rows: 10 * bounds.len() as u64,
            footer: String::new(),
            page_index: None,
            page_index_at: None,
            row_groups: bounds.iter().map(|(lo, hi)| RowGroupMeta { rows: 10, columns: vec![chunk(*lo, *hi, Some(1)), chunk(Some("a"), Some("z"), None)] }).collect(),
            checksum: None,
            footer_checksum: None,
            encrypted: false,
        }
    }

    fn table() -> Schema {
        Schema::new(vec![Field::new("k", DataType::Int64, true), Field::new("s", DataType::Utf8, true)])
    }

    fn cache() -> BoundsCache {
        BoundsCache::new(&(Arc::new(UnboundedMemoryPool::default()) as Arc<dyn MemoryPool>))
    }

    fn k_above(n: i64) -> Arc<dyn PhysicalExpr> {
        Arc::new(BinaryExpr::new(Arc::new(ColumnExpr::new("k", 0)), Operator::Gt, lit(n)))
    }

    #[test]
    fn zone_maps_from_the_cache_prune_and_summarise_as_the_text_says() {
        let cache = cache();
        let a = object("objects/a.parquet", &[(Some("1"), Some("5")), (Some("6"), Some("9"))]);
        let b = object("objects/b.parquet", &[(Some("20"), Some("30")), (None, Some("40")), (Some("x"), Some("50"))]);
        let all: Vec<(&DataObject, usize)> = vec![(&a, 0), (&a, 1), (&b, 0), (&b, 1), (&b, 2)];
        let maps = ZoneMaps::new(&cache, &table(), &[0], &all);
        // An unknown bound (missing, or text that no longer parses) never
        // prunes; the other bound of the row group still does.
        assert_eq!(maps.prune(k_above(7)), vec![false, true, true, true, true]);
        assert_eq!(maps.prune(k_above(45)), vec![false, false, false, false, true]);
        assert_eq!(maps.prune(k_above(60)), vec![false, false, false, false, false]);
        // One unknown bound leaves the column's bounds unknown; nulls add up.
        let stats = maps.statistics(0);
        assert_eq!((stats.min_value, stats.max_value), (Precision::Absent, Precision::Absent));
        assert_eq!(stats.null_count, Precision::Exact(5));
        let known = ZoneMaps::new(&cache, &table(), &[0], &[(&b, 0), (&a, 1), (&a, 0)]);
        let stats = known.statistics(0);
        assert_eq!(stats.min_value, Precision::Inexact(ScalarValue::Int64(Some(1))));
        assert_eq!(stats.max_value, Precision::Inexact(ScalarValue::Int64(Some(30))));
        // A column without null counts has none; strings keep their bounds.
        let s = ZoneMaps::new(&cache, &table(), &[1], &all).statistics(0);
        assert_eq!(s.null_count, Precision::Absent);
        assert_eq!(s.min_value, Precision::Inexact(ScalarValue::Utf8(Some("a".into()))));
        // Nothing to read: no bounds, zero nulls.
        let none = ZoneMaps::new(&cache, &table(), &[0], &[]);
        assert_eq!(none.prune(k_above(0)), Vec::<bool>::new());
        assert_eq!(none.statistics(0).null_count, Precision::Exact(0));
    }

    #[test]
    fn each_objects_column_is_parsed_once_and_only_for_its_type() {
        let cache = cache();
        let a = object("objects/a.parquet", &[(Some("1"), Some("5"))]);
        let first = cache.column(&a, 0, &DataType::Int64);
        assert!(Arc::ptr_eq(&first, &cache.column(&a, 0, &DataType::Int64)), "the second plan takes the parsed column");
        assert_eq!(cache.len(), 1);
        // Read as another type (a table whose column changed type): parsed
        // afresh, never served from the entry of the old type.
        let wider = cache.column(&a, 0, &DataType::Float64);
        assert_eq!(wider.mins.data_type(), &DataType::Float64);
        assert_eq!(cache.len(), 1);
        // A column the object does not have (added after it was written,
        // or the row ids): unknown bounds.
        let missing = cache.column(&a, 7, &DataType::UInt64);
        assert_eq!(missing.mins.null_count(), 1);
    }

    #[test]
    fn an_entry_the_budget_refuses_is_used_and_not_kept() {
        let pool: Arc<dyn MemoryPool> = Arc::new(datafusion::execution::memory_pool::GreedyMemoryPool::new(16));
        let cache = BoundsCache::new(&pool);
        let a = object("objects/a.parquet", &[(Some("1"), Some("5"))]);
        let maps = ZoneMaps::new(&cache, &table(), &[0], &[(&a, 0)]);
        assert_eq!(maps.prune(k_above(7)), vec![false]);
        assert!(cache.is_empty());
    }
}
