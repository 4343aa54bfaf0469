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
use datafusion::common::runtime::SpawnedTask;
use futures::stream::FuturesUnordered;
use futures::{StreamExt, TryStreamExt};
use object_store::{GetOptions, GetRange, ObjectStoreExt};
use parquet::arrow::ProjectionMask;
use parquet::arrow::arrow_reader::{ArrowReaderMetadata, ParquetRecordBatchReaderBuilder};
use parquet::file::metadata::{FooterTail, ParquetMetaDataReader};
use roaring::RoaringBitmap;

use blobhouse_storage::Location;
use blobhouse_storage::chunks::{FetchedChunks, page_index_range, selected_pages, with_page_index};
use blobhouse_storage::rows::{Positions, RowRanges, drop_deleted};

/// Rows per decoded batch on the node.
const BATCH_ROWS: usize = 8192;
/// The suffix read to find an object's footer: one GET for every footer
/// blobhouse writes (they are a few KiB to a few hundred KiB).
const FOOTER_GUESS: u64 = 256 * 1024;
/// Footers kept by a node; objects are never rewritten, so an entry never
/// goes stale, and past this many, or this many bytes decoded (page
/// indexes included), half of them are dropped.
const MAX_FOOTERS: usize = 4096;
const MAX_FOOTER_BYTES: usize = 256 << 20;

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
    /// What the manifest recorded of the object's bytes, for the node to
    /// check what it reads; `None` for objects written before checksums.
    pub checks: Option<SliceChecks>,
}

/// Checksums (`blobhouse_storage::format::chunk_checksum`) of what a node
/// reads of one object, as its manifest recorded them: a node reads the
/// footer and page index from the object itself and decodes by them, so
/// they are checked like the column chunks. A node fetches only the pages
/// of selected rows of a chunk whose single pages have checksums
/// (`blobhouse_storage::page_sums`), and other checked chunks whole; it
/// uses the page index only when its checksum is known.
#[derive(Debug, Clone, PartialEq)]
pub struct SliceChecks {
    /// Of the footer's bytes (thrift `FileMetaData`, as the manifest holds it).
    pub footer: u64,
    /// Of the page index's bytes, where the manifest points scans at one.
    pub page_index: Option<u64>,
    /// Per entry of `row_groups`, per entry of `columns`: the column
    /// chunk's checksum.
    pub chunks: Vec<Vec<u64>>,
    /// Shaped like `chunks`: the checksums of the chunk's single pages
    /// (`ColumnChunkMeta::pages`), where written; empty: none at all.
    pub pages: Vec<Vec<Option<String>>>,
}

/// Whether `bytes` are what `expected` says.
fn intact(bytes: &[u8], expected: u64) -> bool {
    blobhouse_storage::format::chunk_checksum(bytes) == expected
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

/// The decoded footers a node keeps, and their bytes.
#[derive(Debug, Default)]
struct Footers {
    by_object: HashMap<String, (ArrowReaderMetadata, u64)>,
    bytes: usize,
}

impl Footers {
    /// Keeps `meta`, first dropping half of the footers when it would pass
    /// [`MAX_FOOTERS`] or [`MAX_FOOTER_BYTES`].
    fn insert(&mut self, object: &str, meta: ArrowReaderMetadata, size: u64) {
        let bytes = meta.metadata().memory_size();
        if self.by_object.len() >= MAX_FOOTERS || self.bytes + bytes > MAX_FOOTER_BYTES {
            let drop: Vec<String> = self.by_object.keys().take(self.by_object.len().div_ceil(2)).cloned().collect();
            for k in drop {
                self.remove(&k);
            }
        }
        // Two tasks may have read the same footer at once: one copy is kept.
        self.remove(object);
        self.bytes += bytes;
        self.by_object.insert(object.to_string(), (meta, size));
    }

    fn remove(&mut self, object: &str) {
        if let Some((m, _)) = self.by_object.remove(object) {
            self.bytes -= m.metadata().memory_size();
        }
    }
}

/// Reads slices of data objects on a storage node, from the database's
/// location only. Objects are never rewritten, so decoded footers are
/// kept and never go stale.
#[derive(Debug)]
pub struct SliceReader {
    location: Location,
    footers: Mutex<Footers>,
    pub(crate) counters: ReadCounters,
    /// The database's keys, opened on the first encrypted object met
    /// (`None` inside: the database is not encrypted).
    keyring: tokio::sync::OnceCell<Option<Arc<blobhouse_storage::encryption::Keyring>>>,
}

impl SliceReader {
    /// A reader of the database at `location`.
    pub fn new(location: Location) -> Self {
        SliceReader { location, footers: Mutex::default(), counters: ReadCounters::default(), keyring: tokio::sync::OnceCell::new() }
    }

    /// How the database's data objects are decrypted: its keyring, opened
    /// once with the key the node was started with.
    async fn decryption(&self, object: &str) -> Result<Arc<parquet::encryption::decrypt::FileDecryptionProperties>> {
        let keyring = self
            .keyring
            .get_or_try_init(|| async { blobhouse_storage::encryption::Keyring::for_location(&self.location).await.map(|k| k.map(Arc::new)) })
            .await
            .map_err(|e| self.error(object, format!("the object is encrypted: {e} (start the storage node with the database's key)")))?;
        match keyring {
            Some(k) => Ok(k.decryption().clone()),
            None => Err(self.error(object, "the object is encrypted (it ends in PARE), and its database's marker says the database is not: the object was not written by this database")),
        }
    }

    fn error(&self, object: &str, what: impl fmt::Display) -> DataFusionError {
        let path = self.location.child(object);
        DataFusionError::Execution(format!("storage node reading {}: {what}", self.location.display(&path)))
    }

    /// `what` (bytes `at`) of `object` did not match its manifest's
    /// checksum, read twice.
    fn damaged(&self, object: &str, at: &std::ops::Range<u64>, what: &str) -> DataFusionError {
        let path = self.location.child(object);
        DataFusionError::Execution(format!(
            "storage node: data object {} is damaged: bytes {}..{} ({what}) do not match the checksum written with them, read twice from the store; restore the object from a copy of the bucket",
            self.location.display(&path),
            at.start,
            at.end
        ))
    }

    /// The object's footer and size: from the cache, or with one suffix GET
    /// (two when the footer is larger than the guess). With `checks`, the
    /// footer and page index are checked, and a page index without a
    /// recorded checksum is not read.
    async fn footer(&self, object: &str, checks: Option<&SliceChecks>) -> Result<(ArrowReaderMetadata, u64)> {
        if let Some(f) = self.footers.lock().expect("footers").by_object.get(object) {
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
        let mut meta_bytes: Bytes = if len + 8 <= tail.len() as u64 {
            tail.slice(tail.len() - 8 - len as usize..tail.len() - 8)
        } else {
            store.get_range(&path, size - 8 - len..size - 8).await.map_err(|e| self.error(object, e))?
        };
        let footer_at = size - 8 - len..size - 8;
        if let Some(c) = checks
            && !intact(&meta_bytes, c.footer)
        {
            // Once more, in case the transfer damaged it.
            meta_bytes = store.get_range(&path, footer_at.clone()).await.map_err(|e| self.error(object, e))?;
            if !intact(&meta_bytes, c.footer) {
                return Err(self.damaged(object, &footer_at, "its footer"));
            }
        }
        let mut meta = if footer.is_encrypted_footer() {
            let decryption = self.decryption(object).await?;
            blobhouse_storage::format::decode_footer(&meta_bytes, true, Some(&decryption)).map_err(|e| self.error(object, e))?
        } else {
            ParquetMetaDataReader::decode_metadata(&meta_bytes).map_err(|e| self.error(object, e))?
        };
        // The page index, which lies just before the footer: from the same
        // suffix when it fits there (it usually does), else one more GET.
        // With it, a row group of which the compute side selected some
        // rows is fetched and decoded only in the pages holding them.
        let page_index = match checks {
            Some(c) => c.page_index.and_then(|sum| page_index_range(&meta).map(|at| (at, Some(sum)))),
            None => page_index_range(&meta).map(|at| (at, None)),
        };
        if let Some((at, sum)) = page_index {
            if at.end > size - 8 - len {
                return Err(self.error(object, format!("its page index ({at:?}) overlaps its footer")));
            }
            let tail_start = size - tail.len() as u64;
            let mut bytes = if at.start >= tail_start {
                tail.slice((at.start - tail_start) as usize..(at.end - tail_start) as usize)
            } else {
                store.get_range(&path, at.clone()).await.map_err(|e| self.error(object, e))?
            };
            if let Some(sum) = sum
                && !intact(&bytes, sum)
            {
                bytes = store.get_range(&path, at.clone()).await.map_err(|e| self.error(object, e))?;
                if !intact(&bytes, sum) {
                    return Err(self.damaged(object, &at, "its page index"));
                }
            }
            let display = self.location.display(&path);
            meta = with_page_index(meta, at.start, bytes, size, &display).map_err(|e| self.error(object, format!("its page index does not decode: {e}")))?;
        }
        let options = blobhouse_storage::writer::reader_options(&meta);
        let meta = ArrowReaderMetadata::try_new(Arc::new(meta), options).map_err(|e| self.error(object, e))?;
        self.counters.footer_reads.fetch_add(1, Ordering::Relaxed);
        self.footers.lock().expect("footers").insert(object, meta.clone(), size);
        Ok((meta, size))
    }

    /// Decodes the `i`-th row group of the slice: the projected columns of
    /// its selected rows, without deleted rows, in `schema`.
    async fn read_row_group(&self, slice: &ObjectSlice, i: usize, schema: &SchemaRef) -> Result<Vec<RecordBatch>> {
        let object = slice.object.as_str();
        let rg = slice.row_groups[i];
        let (meta, size) = self.footer(object, slice.checks.as_ref()).await?;
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

        // The projected column chunks: one GET each, all under way at once,
        // each decoded as soon as its bytes are in while the others arrive.
        // One pushed task is latency-bound on an idle node, so its decoding
        // hides behind its own fetching. (A single coalesced GET would also
        // read the chunks of unwanted columns between wanted ones.) With a
        // row selection, only the selected pages of a chunk and its
        // dictionary page are read (a GET per run of adjacent pages).
        let mut sorted = slice.columns.clone();
        sorted.sort_unstable();
        sorted.dedup();
        let path = self.location.child(object);
        // Per sorted column: its chunk's checksum, and its pages' where
        // the node can check single pages (their checksums and a checked
        // page index).
        let expected: Vec<Option<(u64, Option<Vec<u32>>)>> = match &slice.checks {
            Some(c) => {
                let sums = c.chunks.get(i).filter(|s| s.len() == slice.columns.len()).ok_or_else(|| self.error(object, "the slice's checksums do not match its row groups and columns"))?;
                let pages = c.pages.get(i);
                sorted
                    .iter()
                    .map(|col| {
                        let j = slice.columns.iter().position(|x| x == col)?;
                        let page_sums = pages.and_then(|p| p.get(j)).cloned().flatten().filter(|_| file.offset_index().is_some()).and_then(|t| blobhouse_storage::page_sums::decode(&t));
                        Some((sums[j], page_sums))
                    })
                    .collect()
            }
            None => vec![None; sorted.len()],
        };
        let mut fetches: FuturesUnordered<_> = sorted
            .iter()
            .enumerate()
            .map(|(k, c)| {
                let (start, len) = file.row_group(rg).column(*c).byte_range();
                let whole = selected.is_all() || expected[k].as_ref().is_some_and(|(_, pages)| pages.is_none());
                let ranges = match whole {
                    true => None,
                    false => selected_pages(file, rg, *c, &selected),
                }
                .unwrap_or_else(|| vec![start..start + len]);
                let (store, path) = (self.location.store.clone(), path.clone());
                SpawnedTask::spawn(async move {
                    let bytes = futures::future::try_join_all(ranges.iter().map(|r| store.get_range(&path, r.clone()))).await;
                    (k, bytes.map(|b| ranges.iter().map(|r| r.start).zip(b).collect::<Vec<_>>()))
                })
                .join()
            })
            .collect();
        let mut decoded: Vec<Option<Vec<ArrayRef>>> = vec![None; sorted.len()];
        let (mut waited, mut decoding) = (std::time::Duration::ZERO, std::time::Duration::ZERO);
        loop {
            let t = Instant::now();
            let Some(done) = fetches.next().await else { break };
            waited += t.elapsed();
            let (k, spans) = done.map_err(|e| self.error(object, format!("its fetch was lost: {e}")))?;
            let mut spans = spans.map_err(|e| self.error(object, e))?;
            if let Some((sum, page_sums)) = &expected[k] {
                let (start, len) = file.row_group(rg).column(sorted[k]).byte_range();
                let whole = spans.len() == 1 && spans[0].0 == start && spans[0].1.len() as u64 == len;
                let pages = page_sums.as_ref().and_then(|sums| Some((blobhouse_storage::page_sums::page_ranges(file, rg, sorted[k])?, sums)));
                let check = |spans: &[(u64, Bytes)]| -> Result<(), std::ops::Range<u64>> {
                    match (&pages, whole) {
                        (_, true) => if intact(&spans[0].1, *sum) { Ok(()) } else { Err(start..start + len) },
                        (Some((ranges, sums)), false) => blobhouse_storage::page_sums::check(spans, ranges, sums),
                        (None, false) => Err(start..start + len),
                    }
                };
                if let Err(bad) = check(&spans) {
                    // Once more, in case the transfer damaged it.
                    let asked: Vec<std::ops::Range<u64>> = spans.iter().map(|(at, b)| *at..*at + b.len() as u64).collect();
                    let again = futures::future::try_join_all(asked.iter().map(|r| self.location.store.get_range(&path, r.clone()))).await.map_err(|e| self.error(object, e))?;
                    spans = asked.iter().map(|r| r.start).zip(again).collect();
                    if check(&spans).is_err() {
                        let what = if bad == (start..start + len) { format!("a column chunk of row group {rg}") } else { format!("a page of a column chunk of row group {rg}") };
                        return Err(self.damaged(object, &bad, &what));
                    }
                }
            }
            self.counters.bytes_read.fetch_add(spans.iter().map(|(_, b)| b.len() as u64).sum(), Ordering::Relaxed);
            let t = Instant::now();
            decoded[k] = Some(self.decode_column(object, &meta, size, rg, &selected, sorted[k], spans)?);
            decoding += t.elapsed();
        }
        // Every fetch ended in a decoded column or returned its error above.
        let Some(decoded) = decoded.into_iter().collect::<Option<Vec<_>>>() else {
            return Err(self.error(object, format!("a column chunk of row group {rg} never arrived")));
        };
        let t = Instant::now();
        let out = self.assemble(slice, &selected, first_row, &sorted, decoded, schema);
        decoding += t.elapsed();
        self.counters.fetch_nanos.fetch_add(waited.as_nanos() as u64, Ordering::Relaxed);
        self.counters.rows_decoded.fetch_add(selected.selected(), Ordering::Relaxed);
        self.counters.decode_nanos.fetch_add(decoding.as_nanos() as u64, Ordering::Relaxed);
        out
    }

    /// The selected rows of one column chunk of row group `rg`, decoded
    /// from `spans` (its fetched bytes, each with where it starts in the
    /// object): one array per batch.
    #[allow(clippy::too_many_arguments)]
    fn decode_column(&self, object: &str, meta: &ArrowReaderMetadata, size: u64, rg: usize, selected: &RowRanges, column: usize, spans: Vec<(u64, Bytes)>) -> Result<Vec<ArrayRef>> {
        let chunks = FetchedChunks::new(spans, size, self.location.display(&self.location.child(object)));
        let mask = ProjectionMask::roots(meta.metadata().file_metadata().schema_descr(), [column]);
        let mut builder = ParquetRecordBatchReaderBuilder::new_with_metadata(chunks, meta.clone())
            .with_row_groups(vec![rg])
            .with_projection(mask)
            .with_batch_size(BATCH_ROWS);
        if !selected.is_all() {
            builder = builder.with_row_selection(selected.selection());
        }
        let reader = builder.build().map_err(|e| self.error(object, e))?;
        reader.map(|b| b.map(|b| b.column(0).clone()).map_err(|e| self.error(object, e))).collect()
    }

    /// The batches of one row group from its decoded columns (`columns[k]`:
    /// the batches of file column `sorted[k]`), in the slice's column
    /// order, without deleted rows.
    fn assemble(&self, slice: &ObjectSlice, selected: &Arc<RowRanges>, first_row: u64, sorted: &[usize], columns: Vec<Vec<ArrayRef>>, schema: &SchemaRef) -> Result<Vec<RecordBatch>> {
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
        let batches = columns[0].len();
        for i in 0..batches {
            let n = columns[0][i].len();
            if columns.iter().any(|c| c.len() != batches || c[i].len() != n) {
                return Err(self.error(object, "its columns decoded to different row counts"));
            }
            push(positions.iter().map(|p| columns[*p][i].clone()).collect(), n, &mut out)?;
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::{Array, Int64Array};
    use datafusion::arrow::datatypes::{DataType, Field, Schema};
    use futures::stream::BoxStream;
    use object_store::memory::InMemory;
    use object_store::path::Path;
    use object_store::{CopyOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore, PutMultipartOptions, PutOptions, PutPayload, PutResult};
    use parquet::arrow::ArrowWriter;

    /// A store that records the ranges it is asked for and, like the S3
    /// client, leaves `get_ranges` to object_store's default, which merges
    /// ranges less than 1 MiB apart into one GET.
    #[derive(Debug, Default)]
    struct Recording {
        inner: InMemory,
        gets: Mutex<Vec<Option<GetRange>>>,
    }

    impl Recording {
        /// The bounded range GETs so far, by start: every read but the
        /// suffix read of the footer (and the page index before it).
        fn bounded_gets(&self) -> Vec<std::ops::Range<u64>> {
            let mut gets: Vec<std::ops::Range<u64>> = self
                .gets
                .lock()
                .unwrap()
                .iter()
                .filter_map(|g| match g {
                    Some(GetRange::Bounded(r)) => Some(r.clone()),
                    _ => None,
                })
                .collect();
            gets.sort_by_key(|r| r.start);
            gets
        }
    }

    impl fmt::Display for Recording {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            write!(f, "Recording")
        }
    }

    #[async_trait::async_trait]
    impl ObjectStore for Recording {
        async fn put_opts(&self, location: &Path, payload: PutPayload, opts: PutOptions) -> object_store::Result<PutResult> {
            self.inner.put_opts(location, payload, opts).await
        }
        async fn put_multipart_opts(&self, location: &Path, opts: PutMultipartOptions) -> object_store::Result<Box<dyn MultipartUpload>> {
            self.inner.put_multipart_opts(location, opts).await
        }
        async fn get_opts(&self, location: &Path, options: GetOptions) -> object_store::Result<GetResult> {
            self.gets.lock().unwrap().push(options.range.clone());
            self.inner.get_opts(location, options).await
        }
        fn delete_stream(&self, locations: BoxStream<'static, object_store::Result<Path>>) -> BoxStream<'static, object_store::Result<Path>> {
            self.inner.delete_stream(locations)
        }
        fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
            self.inner.list(prefix)
        }
        async fn list_with_delimiter(&self, prefix: Option<&Path>) -> object_store::Result<ListResult> {
            self.inner.list_with_delimiter(prefix).await
        }
        async fn copy_opts(&self, from: &Path, to: &Path, options: CopyOptions) -> object_store::Result<()> {
            self.inner.copy_opts(from, to, options).await
        }
    }

    #[tokio::test]
    async fn a_row_group_read_gets_only_the_chunks_of_its_columns() {
        let rows = 20_000i64;
        let schema = Arc::new(Schema::new(["a", "b", "c"].map(|n| Field::new(n, DataType::Int64, false)).to_vec()));
        let column = |k: i64| Arc::new(Int64Array::from_iter_values((0..rows).map(move |i| i * 3 + k))) as ArrayRef;
        let batch = RecordBatch::try_new(schema.clone(), vec![column(0), column(1), column(2)]).unwrap();
        let mut file = Vec::new();
        let mut writer = ArrowWriter::try_new(&mut file, schema.clone(), None).unwrap();
        writer.write(&batch).unwrap();
        let meta = writer.close().unwrap();
        let chunk = |c: usize| {
            let (start, len) = meta.row_group(0).column(c).byte_range();
            start..start + len
        };
        // The unwanted middle chunk is well under object_store's 1 MiB
        // merge distance: a merged read would fetch it too.
        assert!(chunk(1).end - chunk(1).start < 1024 * 1024);

        let store = Arc::new(Recording::default());
        store.put(&Path::from("db/objects/t/1.parquet"), file.into()).await.unwrap();
        let reader = SliceReader::new(Location::from_store(store.clone(), Path::from("db"), "memory://db"));
        let slice = ObjectSlice { object: "objects/t/1.parquet".into(), row_groups: vec![0], columns: vec![2, 0], deleted: None, selections: vec![], checks: None };
        let out_schema = Arc::new(schema.project(&[2, 0]).unwrap());
        let batches = reader.read_row_group(&slice, 0, &out_schema).await.unwrap();

        let got = |c: usize| -> Vec<i64> { batches.iter().flat_map(|b| b.column(c).as_any().downcast_ref::<Int64Array>().unwrap().values().to_vec()).collect() };
        assert_eq!(got(0), (0..rows).map(|i| i * 3 + 2).collect::<Vec<_>>(), "column c, in the slice's order");
        assert_eq!(got(1), (0..rows).map(|i| i * 3).collect::<Vec<_>>(), "column a");
        assert!(batches.iter().all(|b| b.num_rows() <= BATCH_ROWS && b.column(0).len() == b.column(1).len()));

        let data_gets = store.bounded_gets();
        assert_eq!(data_gets, vec![chunk(0), chunk(2)], "one GET per wanted chunk, none spanning the unwanted one");
        assert_eq!(reader.counters.bytes_read.load(Ordering::Relaxed), (chunk(0).end - chunk(0).start) + (chunk(2).end - chunk(2).start));
    }

    #[tokio::test]
    async fn a_row_selection_fetches_only_the_pages_holding_its_rows() {
        // Three pages of 20 000 rows per column; `a` plain, `b` dictionary
        // encoded (a dictionary page first, then pages of indexes).
        let rows = 60_000i64;
        let schema = Arc::new(Schema::new(["a", "b"].map(|n| Field::new(n, DataType::Int64, false)).to_vec()));
        let batch = RecordBatch::try_new(
            schema.clone(),
            vec![Arc::new(Int64Array::from_iter_values(0..rows)) as ArrayRef, Arc::new(Int64Array::from_iter_values((0..rows).map(|i| i % 7))) as ArrayRef],
        )
        .unwrap();
        let props = parquet::file::properties::WriterProperties::builder()
            .set_statistics_enabled(parquet::file::properties::EnabledStatistics::Page)
            .set_data_page_row_count_limit(20_000)
            .set_write_batch_size(1024)
            .set_column_dictionary_enabled("a".into(), false)
            .build();
        let mut file = Vec::new();
        let mut writer = ArrowWriter::try_new(&mut file, schema.clone(), Some(props)).unwrap();
        writer.write(&batch).unwrap();
        writer.close().unwrap();
        let whole: u64 = {
            let meta = ParquetMetaDataReader::new().parse_and_finish(&Bytes::from(file.clone())).unwrap();
            (0..2).map(|c| meta.row_group(0).column(c).byte_range().1).sum()
        };

        let store = Arc::new(Recording::default());
        store.put(&Path::from("db/objects/t/2.parquet"), file.into()).await.unwrap();
        let reader = SliceReader::new(Location::from_store(store.clone(), Path::from("db"), "memory://db"));
        // Rows of the second page only.
        let wanted = 25_000u64..26_000;
        let selection = Arc::new(RowRanges::try_new(vec![wanted.clone()], rows as u64).unwrap());
        let slice = ObjectSlice { object: "objects/t/2.parquet".into(), row_groups: vec![0], columns: vec![0, 1], deleted: None, selections: vec![Some(selection)], checks: None };
        let batches = reader.read_row_group(&slice, 0, &schema).await.unwrap();
        let got = |c: usize| -> Vec<i64> { batches.iter().flat_map(|b| b.column(c).as_any().downcast_ref::<Int64Array>().unwrap().values().to_vec()).collect() };
        assert_eq!(got(0), wanted.clone().map(|i| i as i64).collect::<Vec<_>>());
        assert_eq!(got(1), wanted.map(|i| i as i64 % 7).collect::<Vec<_>>());

        let meta = reader.footer("objects/t/2.parquet", None).await.unwrap().0;
        let (meta, offsets) = (meta.metadata(), meta.metadata().offset_index().expect("the node keeps the page index"));
        let mut expected: Vec<std::ops::Range<u64>> = (0..2)
            .flat_map(|c| {
                let (start, _) = meta.row_group(0).column(c).byte_range();
                let pages = offsets[0][c].page_locations();
                assert_eq!(pages.len(), 3);
                let second = &pages[1];
                let dictionary = (pages[0].offset as u64 > start).then_some(start..pages[0].offset as u64);
                dictionary.into_iter().chain([second.offset as u64..(second.offset + second.compressed_page_size as i64) as u64])
            })
            .collect();
        expected.sort_by_key(|r| r.start);
        let data_gets = store.bounded_gets();
        assert_eq!(expected.len(), 3, "b has a dictionary page, a none");
        assert_eq!(data_gets, expected, "the dictionary page and the second data page of each column");
        let read = reader.counters.bytes_read.load(Ordering::Relaxed);
        assert!(read * 2 < whole, "read {read} of the chunks' {whole} bytes");
    }

    /// With the manifest's checksums the node checks the footer, the page
    /// index and what it decodes — single pages by their own checksums,
    /// chunks without them whole — and names what is damaged.
    #[tokio::test]
    async fn with_checksums_a_node_checks_what_it_reads_and_names_damage() {
        let rows = 60_000i64;
        let schema = Arc::new(Schema::new(vec![Field::new("a", DataType::Int64, false)]));
        let batch = RecordBatch::try_new(schema.clone(), vec![Arc::new(Int64Array::from_iter_values(0..rows)) as ArrayRef]).unwrap();
        let props = parquet::file::properties::WriterProperties::builder()
            .set_statistics_enabled(parquet::file::properties::EnabledStatistics::Page)
            .set_data_page_row_count_limit(20_000)
            .set_write_batch_size(1024)
            .build();
        let mut file = Vec::new();
        let mut writer = ArrowWriter::try_new(&mut file, schema.clone(), Some(props)).unwrap();
        writer.write(&batch).unwrap();
        writer.close().unwrap();
        let meta = ParquetMetaDataReader::new().with_page_index_policy(parquet::file::metadata::PageIndexPolicy::Required).parse_and_finish(&Bytes::from(file.clone())).unwrap();
        let page_ranges = blobhouse_storage::page_sums::page_ranges(&meta, 0, 0).unwrap();
        assert_eq!(page_ranges.len(), 4, "a dictionary page and three data pages");
        let (start, len) = meta.row_group(0).column(0).byte_range();
        let chunk = start..start + len;
        let index = page_index_range(&meta).expect("a page index");
        let n = file.len();
        let footer_len = u32::from_le_bytes(file[n - 8..n - 4].try_into().unwrap()) as usize;
        let sum = |r: std::ops::Range<usize>| blobhouse_storage::format::chunk_checksum(&file[r]);
        let whole = SliceChecks {
            footer: sum(n - 8 - footer_len..n - 8),
            page_index: Some(sum(index.start as usize..index.end as usize)),
            chunks: vec![vec![sum(chunk.start as usize..chunk.end as usize)]],
            pages: vec![vec![None]],
        };
        let paged = SliceChecks { pages: vec![vec![Some(blobhouse_storage::page_sums::encode(&file, &page_ranges))]], ..whole.clone() };
        let wanted = 25_000u64..26_000;
        let slice = |name: &str, checks: SliceChecks| ObjectSlice {
            object: format!("objects/t/{name}.parquet"),
            row_groups: vec![0],
            columns: vec![0],
            deleted: None,
            selections: vec![Some(Arc::new(RowRanges::try_new(vec![wanted.clone()], rows as u64).unwrap()))],
            checks: Some(checks),
        };
        let store = Arc::new(Recording::default());
        let reader = SliceReader::new(Location::from_store(store.clone(), Path::from("db"), "memory://db"));

        let values = |batches: Vec<RecordBatch>| -> Vec<i64> { batches.iter().flat_map(|b| b.column(0).as_any().downcast_ref::<Int64Array>().unwrap().values().to_vec()).collect() };
        let expected: Vec<i64> = wanted.clone().map(|i| i as i64).collect();
        store.put(&Path::from("db/objects/t/intact.parquet"), file.clone().into()).await.unwrap();
        assert_eq!(values(reader.read_row_group(&slice("intact", whole.clone()), 0, &schema).await.unwrap()), expected);
        assert!(store.bounded_gets().contains(&chunk), "without page checksums a checked chunk is fetched whole: {:?}", store.bounded_gets());
        let before = store.bounded_gets().len();
        assert_eq!(values(reader.read_row_group(&slice("intact", paged.clone()), 0, &schema).await.unwrap()), expected);
        let fetched = store.bounded_gets()[before..].to_vec();
        assert!(!fetched.contains(&chunk) && fetched.iter().all(|r| r.end - r.start < chunk.end - chunk.start), "with them only the pages: {fetched:?}");

        let second_page = page_ranges[2].clone();
        for (name, at, checks, what) in [
            ("chunk", (chunk.start + chunk.end) / 2, whole.clone(), "a column chunk of row group 0"),
            ("page", (second_page.start + second_page.end) / 2, paged.clone(), "a page of a column chunk of row group 0"),
            ("index", index.start + 1, paged.clone(), "its page index"),
            ("footer", (n - 8 - footer_len / 2) as u64, paged.clone(), "its footer"),
        ] {
            let mut damaged = file.clone();
            damaged[at as usize] ^= 0x10;
            store.put(&Path::from(format!("db/objects/t/{name}.parquet")), damaged.into()).await.unwrap();
            let err = reader.read_row_group(&slice(name, checks), 0, &schema).await.unwrap_err().to_string();
            assert!(err.contains(&format!("objects/t/{name}.parquet is damaged")) && err.contains(what), "{name}: {err}");
        }
        // Damage in a page no selected row is on is never read.
        let third_page = page_ranges[3].clone();
        let mut damaged = file.clone();
        damaged[((third_page.start + third_page.end) / 2) as usize] ^= 0x10;
        store.put(&Path::from("db/objects/t/unread.parquet"), damaged.into()).await.unwrap();
        assert_eq!(values(reader.read_row_group(&slice("unread", paged), 0, &schema).await.unwrap()), expected);
    }
}
