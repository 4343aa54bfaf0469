//! The leaf of every pushed fragment: some row groups of one data object.
//!
//! On the compute side an [`ObjectSliceExec`] only describes what to read
//! (it is encoded into the request, never executed there). On the storage
//! node the codec rebuilds it with a [`SliceReader`], which reads the row
//! groups' column chunks from the store, decodes them and drops the rows
//! the object's deletion vector deletes — the same rows, in the same
//! schema, that the compute side's scan would have produced, so whatever
//! runs above the leaf gives the same answer on either side.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use bytes::Bytes;
use datafusion::arrow::array::ArrayRef;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::record_batch::{RecordBatch, RecordBatchOptions};
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::TaskContext;
use datafusion::physical_expr::{EquivalenceProperties, PhysicalExpr};
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{DisplayAs, DisplayFormatType, ExecutionPlan, Partitioning, PlanProperties, SendableRecordBatchStream};
use futures::{StreamExt, TryStreamExt};
use object_store::{GetOptions, GetRange, ObjectStoreExt};
use parquet::arrow::ProjectionMask;
use parquet::arrow::arrow_reader::{ArrowReaderMetadata, ArrowReaderOptions, ParquetRecordBatchReaderBuilder};
use parquet::file::metadata::{FooterTail, ParquetMetaDataReader};
use roaring::RoaringBitmap;

use blobhouse_storage::Location;
use blobhouse_storage::chunks::FetchedChunks;
use blobhouse_storage::rows::{Positions, RowRanges, drop_deleted};

/// Rows per decoded batch on the node.
const BATCH_ROWS: usize = 8192;
/// The suffix read to find an object's footer: one GET for every footer
/// blobhouse writes (they are a few KiB to a few hundred KiB).
const FOOTER_GUESS: u64 = 256 * 1024;
/// Footers kept by a node; objects are never rewritten, so an entry never
/// goes stale, and past this many the oldest half is dropped.
const MAX_FOOTERS: usize = 4096;

/// What to read: row groups of one data object, some of its columns.
#[derive(Debug, Clone, PartialEq)]
pub struct ObjectSlice {
    /// The object's name relative to the database root (`objects/…/….parquet`).
    pub object: String,
    /// Row groups to read, in the order their rows are wanted.
    pub row_groups: Vec<usize>,
    /// File columns, in output order (a table's columns are its files' columns).
    pub columns: Vec<usize>,
    /// Row positions in the object that a deletion vector deletes.
    pub deleted: Option<Arc<RoaringBitmap>>,
    /// Per entry of `row_groups`: the rows to decode when the compute
    /// side's page index ruled some out (`None`: all). Empty: all rows of
    /// every row group.
    pub selections: Vec<Option<Arc<RowRanges>>>,
}

/// The leaf of a pushed fragment. See the module docs.
#[derive(Debug)]
pub struct ObjectSliceExec {
    slice: ObjectSlice,
    schema: SchemaRef,
    reader: Option<Arc<SliceReader>>,
    properties: Arc<PlanProperties>,
}

impl ObjectSliceExec {
    /// A leaf to ship: `schema` is the rows' schema (the compute side's scan
    /// output without row ids), one field per entry of `slice.columns`.
    pub fn new(slice: ObjectSlice, schema: SchemaRef) -> Self {
        let properties = Arc::new(PlanProperties::new(
            EquivalenceProperties::new(schema.clone()),
            Partitioning::UnknownPartitioning(1),
            EmissionType::Incremental,
            Boundedness::Bounded,
        ));
        ObjectSliceExec { slice, schema, reader: None, properties }
    }

    /// The same leaf, executable on a node that reads through `reader`.
    pub(crate) fn with_reader(mut self, reader: Arc<SliceReader>) -> Self {
        self.reader = Some(reader);
        self
    }

    /// What it reads.
    pub fn slice(&self) -> &ObjectSlice {
        &self.slice
    }
}

impl DisplayAs for ObjectSliceExec {
    fn fmt_as(&self, _: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        let cols: Vec<&str> = self.schema.fields().iter().map(|f| f.name().as_str()).collect();
        write!(f, "ObjectSliceExec: object={}, row_groups={:?}, columns=[{}]", self.slice.object, self.slice.row_groups, cols.join(", "))
    }
}

impl ExecutionPlan for ObjectSliceExec {
    fn name(&self) -> &str {
        "ObjectSliceExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![]
    }

    fn apply_expressions(&self, _: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>) -> Result<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    fn with_new_children(self: Arc<Self>, children: Vec<Arc<dyn ExecutionPlan>>) -> Result<Arc<dyn ExecutionPlan>> {
        if children.is_empty() { Ok(self) } else { Err(DataFusionError::Internal("ObjectSliceExec has no children".into())) }
    }

    fn execute(&self, partition: usize, _: Arc<TaskContext>) -> Result<SendableRecordBatchStream> {
        if partition != 0 {
            return Err(DataFusionError::Internal(format!("ObjectSliceExec has one partition, not {partition}")));
        }
        let Some(reader) = self.reader.clone() else {
            return Err(DataFusionError::Plan(format!(
                "the slice of {} runs on a storage node; this process has no store to read it from",
                self.slice.object
            )));
        };
        let slice = Arc::new(self.slice.clone());
        let schema = self.schema.clone();
        let batches = futures::stream::iter(0..self.slice.row_groups.len())
            .then(move |i| {
                let (reader, slice, schema) = (reader.clone(), slice.clone(), schema.clone());
                async move { reader.read_row_group(&slice, i, &schema).await }
            })
            .map_ok(|batches| futures::stream::iter(batches.into_iter().map(Ok)))
            .try_flatten();
        Ok(Box::pin(RecordBatchStreamAdapter::new(self.schema.clone(), batches)))
    }
}

/// A node's measured work, read by [`crate::node::NodeStats`].
#[derive(Debug, Default)]
pub(crate) struct ReadCounters {
    /// Compressed bytes of column chunks read from the store.
    pub bytes_read: AtomicU64,
    /// Time spent fetching them.
    pub fetch_nanos: AtomicU64,
    /// Rows decoded (before any filter).
    pub rows_decoded: AtomicU64,
    /// Time spent decoding.
    pub decode_nanos: AtomicU64,
    /// Footers read from the store (the rest came from the node's cache).
    pub footer_reads: AtomicU64,
}

/// Reads slices of data objects on a storage node, from the database's
/// location only. Objects are never rewritten, so decoded footers are
/// kept and never go stale.
#[derive(Debug)]
pub struct SliceReader {
    location: Location,
    footers: Mutex<HashMap<String, (ArrowReaderMetadata, u64)>>,
    pub(crate) counters: ReadCounters,
}

impl SliceReader {
    /// A reader of the database at `location`.
    pub fn new(location: Location) -> Self {
        SliceReader { location, footers: Mutex::default(), counters: ReadCounters::default() }
    }

    fn error(&self, object: &str, what: impl fmt::Display) -> DataFusionError {
        let path = self.location.child(object);
        DataFusionError::Execution(format!("storage node reading {}: {what}", self.location.display(&path)))
    }

    /// The object's footer and size: from the cache, or with one suffix GET
    /// (two when the footer is larger than the guess).
    async fn footer(&self, object: &str) -> Result<(ArrowReaderMetadata, u64)> {
        if let Some(f) = self.footers.lock().expect("footers").get(object) {
            return Ok(f.clone());
        }
        let path = self.location.child(object);
        let store = &self.location.store;
        let got = store
            .get_opts(&path, GetOptions { range: Some(GetRange::Suffix(FOOTER_GUESS)), ..Default::default() })
            .await
            .map_err(|e| self.error(object, e))?;
        let size = got.meta.size;
        let tail = got.bytes().await.map_err(|e| self.error(object, e))?;
        if tail.len() < 8 {
            return Err(self.error(object, "the object is too short to be Parquet"));
        }
        let mut last8 = [0u8; 8];
        last8.copy_from_slice(&tail[tail.len() - 8..]);
        let footer = FooterTail::try_new(&last8).map_err(|e| self.error(object, e))?;
        let len = footer.metadata_length() as u64;
        if len + 8 > size {
            return Err(self.error(object, format!("its footer claims {len} bytes, more than the object's {size}")));
        }
        let meta_bytes: Bytes = if len + 8 <= tail.len() as u64 {
            tail.slice(tail.len() - 8 - len as usize..tail.len() - 8)
        } else {
            store.get_range(&path, size - 8 - len..size - 8).await.map_err(|e| self.error(object, e))?
        };
        let meta = ParquetMetaDataReader::decode_metadata(&meta_bytes).map_err(|e| self.error(object, e))?;
        let meta = ArrowReaderMetadata::try_new(Arc::new(meta), ArrowReaderOptions::new()).map_err(|e| self.error(object, e))?;
        self.counters.footer_reads.fetch_add(1, Ordering::Relaxed);
        let mut footers = self.footers.lock().expect("footers");
        if footers.len() >= MAX_FOOTERS {
            let drop: Vec<String> = footers.keys().take(MAX_FOOTERS / 2).cloned().collect();
            for k in drop {
                footers.remove(&k);
            }
        }
        footers.insert(object.to_string(), (meta.clone(), size));
        Ok((meta, size))
    }

    /// Decodes the `i`-th row group of the slice: the projected columns of
    /// its selected rows, without deleted rows, in `schema`.
    async fn read_row_group(&self, slice: &ObjectSlice, i: usize, schema: &SchemaRef) -> Result<Vec<RecordBatch>> {
        let object = slice.object.as_str();
        let rg = slice.row_groups[i];
        let (meta, size) = self.footer(object).await?;
        let file = meta.metadata();
        if rg >= file.num_row_groups() {
            return Err(self.error(object, format!("it has {} row groups, row group {rg} was asked for", file.num_row_groups())));
        }
        let columns = file.file_metadata().schema_descr().num_columns();
        if let Some(c) = slice.columns.iter().find(|c| **c >= columns) {
            return Err(self.error(object, format!("it has {columns} columns, column {c} was asked for")));
        }
        let first_row: u64 = file.row_groups()[..rg].iter().map(|g| g.num_rows() as u64).sum();
        let rows = file.row_group(rg).num_rows() as u64;
        let selection = slice.selections.get(i).cloned().flatten();
        if let Some(s) = &selection
            && s.rows() != rows
        {
            return Err(self.error(object, format!("row group {rg} has {rows} rows, the slice's row selection is for {}", s.rows())));
        }
        let selected = selection.unwrap_or_else(|| Arc::new(RowRanges::all(rows)));

        // Fetch the projected column chunks.
        let mut sorted = slice.columns.clone();
        sorted.sort_unstable();
        sorted.dedup();
        let ranges: Vec<std::ops::Range<u64>> = sorted
            .iter()
            .map(|c| {
                let (start, len) = file.row_group(rg).column(*c).byte_range();
                start..start + len
            })
            .collect();
        let started = Instant::now();
        let path = self.location.child(object);
        let fetched = if ranges.is_empty() { Vec::new() } else { self.location.store.get_ranges(&path, &ranges).await.map_err(|e| self.error(object, e))? };
        let fetched_bytes: u64 = fetched.iter().map(|b| b.len() as u64).sum();
        self.counters.bytes_read.fetch_add(fetched_bytes, Ordering::Relaxed);
        self.counters.fetch_nanos.fetch_add(started.elapsed().as_nanos() as u64, Ordering::Relaxed);

        let started = Instant::now();
        let decoded = self.decode(slice, &meta, size, rg, &selected, first_row, &sorted, ranges.iter().map(|r| r.start).zip(fetched).collect(), schema);
        self.counters.rows_decoded.fetch_add(selected.selected(), Ordering::Relaxed);
        self.counters.decode_nanos.fetch_add(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
        decoded
    }

    #[allow(clippy::too_many_arguments)]
    fn decode(
        &self,
        slice: &ObjectSlice,
        meta: &ArrowReaderMetadata,
        size: u64,
        rg: usize,
        selected: &Arc<RowRanges>,
        first_row: u64,
        sorted: &[usize],
        spans: Vec<(u64, Bytes)>,
        schema: &SchemaRef,
    ) -> Result<Vec<RecordBatch>> {
        let object = slice.object.as_str();
        let mut out = Vec::new();
        let mut rows_at = Positions::new(selected.clone());
        let mut push = |columns: Vec<ArrayRef>, n: usize, out: &mut Vec<RecordBatch>| -> Result<()> {
            let opts = RecordBatchOptions::new().with_row_count(Some(n));
            let batch = RecordBatch::try_new_with_options(schema.clone(), columns, &opts)
                .map_err(|e| self.error(object, format!("its columns do not match the plan's schema: {e}")))?;
            let at = rows_at.take(n);
            if at.iter().map(|r| r.end - r.start).sum::<u64>() != n as u64 {
                return Err(self.error(object, format!("the decoder returned more rows than the {} selected", selected.selected())));
            }
            let (batch, _) = drop_deleted(batch, first_row, &at, slice.deleted.as_deref()).map_err(|e| self.error(object, e))?;
            if batch.num_rows() > 0 {
                out.push(batch);
            }
            Ok(())
        };
        if sorted.is_empty() {
            // Only a row count is wanted (COUNT(*)): nothing to decode.
            push(vec![], selected.selected() as usize, &mut out)?;
            return Ok(out);
        }
        let positions: Vec<usize> = slice.columns.iter().map(|c| sorted.binary_search(c).expect("sorted holds every column")).collect();
        let chunks = FetchedChunks::new(spans, size, self.location.display(&self.location.child(object)));
        let mask = ProjectionMask::roots(meta.metadata().file_metadata().schema_descr(), sorted.iter().copied());
        let mut builder = ParquetRecordBatchReaderBuilder::new_with_metadata(chunks, meta.clone())
            .with_row_groups(vec![rg])
            .with_projection(mask)
            .with_batch_size(BATCH_ROWS);
        if !selected.is_all() {
            builder = builder.with_row_selection(selected.selection());
        }
        let reader = builder.build().map_err(|e| self.error(object, e))?;
        for batch in reader {
            let batch = batch.map_err(|e| self.error(object, e))?;
            let n = batch.num_rows();
            push(positions.iter().map(|p| batch.column(*p).clone()).collect(), n, &mut out)?;
        }
        Ok(out)
    }
}
