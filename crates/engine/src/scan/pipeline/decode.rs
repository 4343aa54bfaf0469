//! The partitions' side of a running scan: each partition's stream takes
//! whichever morsel arrived first and decodes it a batch at a time —
//! dropping deleted rows, applying the runtime filters, and copying rows
//! out of the chunks the memory tier holds decoded.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use datafusion::arrow::array::{ArrayRef, MutableArrayData, RecordBatch, RecordBatchOptions, make_array};
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::common::{DataFusionError, Result};
use datafusion::physical_plan::SendableRecordBatchStream;
use datafusion::physical_plan::metrics::Count;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use parquet::arrow::ProjectionMask;
use parquet::arrow::arrow_reader::{ParquetRecordBatchReader, ParquetRecordBatchReaderBuilder};
use roaring::RoaringBitmap;

use blobhouse_storage::StorageError;
use blobhouse_storage::rows::{Positions, RowRanges, drop_deleted, row_ids};

use crate::runtime_filter::RowFilter;
use crate::tiers::{ChunkPieces, DecodedChunk};

use super::Pipeline;
use super::morsel::{Fills, Landed, Morsel};

impl Pipeline {
    /// The stream of partition `partition`, holding `guard` until dropped.
    /// `projection`: the table column of each output column, where
    /// `row_id_column` stands for the row ids ([`crate::provider::ROW_ID_COLUMN`]).
    #[allow(clippy::too_many_arguments)]
    pub fn stream(
        self: &Arc<Self>,
        partition: usize,
        schema: SchemaRef,
        projection: Vec<usize>,
        row_id_column: usize,
        batch_size: usize,
        filter: Option<RowFilter>,
        morsels_taken: Count,
        guard: Box<dyn Send>,
    ) -> SendableRecordBatchStream {
        let consumer = Consumer {
            morsels_taken,
            filter,
            pipeline: self.clone(),
            partition,
            schema: schema.clone(),
            projection,
            row_id_column,
            batch_size,
            current: None,
            last_yield: None,
            busy: Duration::ZERO,
            done: false,
            _guard: guard,
        };
        let stream = futures::stream::unfold(consumer, |c| c.next());
        Box::pin(RecordBatchStreamAdapter::new(schema, stream))
    }
}

/// One partition's end of the queue.
struct Consumer {
    pipeline: Arc<Pipeline>,
    /// Morsels this partition decoded (the metric `morsels_decoded` of its
    /// partition: how evenly the scan spread its work).
    morsels_taken: Count,
    partition: usize,
    schema: SchemaRef,
    projection: Vec<usize>,
    row_id_column: usize,
    batch_size: usize,
    current: Option<Decoding>,
    /// The runtime filters, applied to each decoded batch.
    filter: Option<RowFilter>,
    /// When the last batch was handed on: the time until the next poll is
    /// the query's processing of it.
    last_yield: Option<Instant>,
    /// Busy time not yet reported.
    busy: Duration,
    done: bool,
    _guard: Box<dyn Send>,
}

impl Consumer {
    async fn next(mut self) -> Option<(Result<RecordBatch>, Consumer)> {
        if self.done {
            return None;
        }
        if let Some(t) = self.last_yield.take() {
            self.busy += t.elapsed();
        }
        let shared = self.pipeline.shared.clone();
        if !shared.polled.swap(true, Ordering::Relaxed) {
            shared.space.notify_one();
        }
        let m = &shared.counters;
        loop {
            if let Some(d) = &mut self.current {
                let t = Instant::now();
                // With a filter to follow, decoded rows are lent, not
                // copied: the filter copies the rows it keeps anyway.
                match d.next_batch(&self.schema, self.filter.is_some()) {
                    Some(Ok((batch, deleted, lent))) => {
                        m.rows_deleted.add(deleted);
                        let took = t.elapsed();
                        m.decode_time.add_duration(took);
                        let bytes = (batch.num_rows() as f64 * d.bytes_per_row) as u64;
                        let batch = match &mut self.filter {
                            Some(f) => {
                                let rows = batch.num_rows();
                                match f.apply(batch).and_then(|b| settle(b, rows, &lent).map_err(Into::into)) {
                                    Ok(b) => {
                                        m.rows_filtered.add(rows - b.num_rows());
                                        b
                                    }
                                    Err(e) => {
                                        self.done = true;
                                        return Some((Err(e), self));
                                    }
                                }
                            }
                            None => batch,
                        };
                        shared.processed(self.partition, bytes, self.busy + t.elapsed());
                        self.busy = Duration::ZERO;
                        if batch.num_rows() == 0 {
                            continue; // deletes or filters dropped every row
                        }
                        self.last_yield = Some(Instant::now());
                        return Some((Ok(batch), self));
                    }
                    Some(Err(e)) => {
                        self.done = true;
                        return Some((Err(e), self));
                    }
                    None => {
                        // The morsel is decoded; with the row group's last,
                        // its bytes are dropped.
                        let d = self.current.take().expect("decoding");
                        let held = d.held;
                        if d.landed.finished(d.piece, d.kept) {
                            shared.reservation.shrink(held.min(shared.reservation.size()));
                        }
                    }
                }
            }
            let wait = Instant::now();
            let item = self.pipeline.ready.take().await;
            m.query_wait_time.add_elapsed(wait);
            let morsel = match item {
                None => return None,
                Some(Err(e)) => {
                    self.done = true;
                    return Some((Err(e), self));
                }
                Some(Ok(a)) => a,
            };
            shared.ready_bytes.fetch_sub(morsel.bytes, Ordering::Relaxed);
            shared.ready_units.fetch_sub(1, Ordering::Relaxed);
            shared.space.notify_one();
            // The fetcher, just woken, waits in this worker's slot for
            // tokio's next turn here: give it that turn now rather than
            // after this morsel's decoding (tens of milliseconds in which
            // no download would start).
            tokio::task::yield_now().await;
            self.morsels_taken.add(1);
            if morsel.piece == 0 {
                m.row_groups_read.add(1);
                if morsel.landed.at < wait {
                    m.data_wait_time.add_duration(wait - morsel.landed.at);
                }
            }
            let t = Instant::now();
            match Decoding::new(morsel, &self.projection, self.row_id_column, self.batch_size) {
                Ok(d) => self.current = Some(d),
                Err(e) => {
                    self.done = true;
                    return Some((Err(e), self));
                }
            }
            self.busy += t.elapsed();
        }
    }
}

/// A morsel being decoded, a batch at a time; rows that the object's
/// deletion vector deletes are dropped here, before any filter sees them.
/// Only the morsel's rows are decoded (a piece of its row group, and of
/// those only the ones the page index left), and their positions (for row
/// ids and deletes) follow from the selection ([`blobhouse_storage::rows`]).
/// Columns the memory tier holds decoded are not decoded at all: each batch
/// copies its rows out of them.
struct Decoding {
    /// The row group it is a piece of.
    landed: Arc<Landed>,
    piece: usize,
    /// Per column the memory tier waits for ([`Landed::assembled_columns`]):
    /// its position in the reader's output, and the arrays decoded so far.
    keep: Vec<usize>,
    kept: Vec<ChunkPieces>,
    /// The columns in Parquet form; `None` when no column is.
    reader: Option<ParquetRecordBatchReader>,
    /// Without a reader: selected rows not yet handed on.
    rows_left: usize,
    batch_size: usize,
    /// Where each output column comes from.
    columns: Vec<Column>,
    /// Where in the row group the next decoded rows are.
    rows_at: Positions,
    /// The row group's first row in its object.
    first_row: u64,
    /// The object's ordinal, the upper half of its row ids.
    ordinal: u32,
    deleted: Option<Arc<RoaringBitmap>>,
    location: String,
    bytes_per_row: f64,
    /// Bytes of the row group's chunks, reserved in the engine's budget
    /// until its last morsel is decoded.
    held: usize,
}

/// Where an output column of a [`Decoding`] comes from.
enum Column {
    /// The reader's output column at this position (file order).
    Reader(usize),
    /// A whole chunk, decoded: every row of the row group.
    Decoded(Arc<DecodedChunk>),
    /// The row ids.
    RowIds,
}

impl Decoding {
    fn new(morsel: Morsel, projection: &[usize], row_id_column: usize, batch_size: usize) -> Result<Decoding> {
        let Morsel { landed, piece, rows: selected, .. } = morsel;
        let unit = &landed.unit;
        let object = &unit.object;
        let bytes_per_row = if unit.rows == 0 { 0.0 } else { unit.bytes() as f64 / unit.rows as f64 };
        let held = unit.bytes() as usize;
        let wrap = |e: parquet::errors::ParquetError| DataFusionError::External(Box::new(StorageError::Parquet { location: object.display.clone(), source: e }));
        let corrupt = |reason: String| DataFusionError::External(Box::new(StorageError::Corrupt { location: object.display.clone(), reason }));
        // The unit's chunks are its data columns, in projection order.
        let data: Vec<usize> = projection.iter().copied().filter(|&c| c != row_id_column).collect();
        if data.len() != unit.chunks.len() {
            return Err(DataFusionError::Internal(format!("a scan of {} reads {} columns from {} chunks", object.display, data.len(), unit.chunks.len())));
        }
        let mut arrays: Vec<Option<Arc<DecodedChunk>>> = vec![None; data.len()];
        for (i, chunk) in &landed.decoded {
            arrays[*i] = Some(chunk.clone());
        }
        let reader = |columns: &[usize], rows: Option<&RowRanges>, batch: usize| {
            let mask = ProjectionMask::roots(object.reader.metadata().file_metadata().schema_descr(), columns.iter().copied());
            let mut builder = ParquetRecordBatchReaderBuilder::new_with_metadata(landed.compressed.clone(), object.reader.clone())
                .with_row_groups(vec![unit.row_group])
                .with_projection(mask)
                .with_batch_size(batch);
            if let Some(rows) = rows {
                builder = builder.with_row_selection(rows.selection());
            }
            builder.build().map_err(wrap)
        };
        // Chunks the memory tier waits for decoded, of a row group the page
        // index thinned out: every row, once, then read like the chunks it
        // held ([`Fills::Whole`]).
        let whole = match &landed.fills {
            Fills::Whole(f) => f.lock().expect("not poisoned").take(),
            _ => None,
        };
        if let Some(mut fills) = whole {
            let mut to_decode: Vec<(usize, usize)> = fills.indexes().map(|i| (data[i], i)).collect();
            to_decode.sort_unstable();
            let columns: Vec<usize> = to_decode.iter().map(|(c, _)| *c).collect();
            let mut pieces = vec![ChunkPieces::default(); to_decode.len()];
            for batch in reader(&columns, None, batch_size)? {
                let batch = batch.map_err(|e| corrupt(e.to_string()))?;
                for (position, p) in pieces.iter_mut().enumerate() {
                    p.push(batch.column(position));
                }
            }
            for ((_, i), p) in to_decode.iter().zip(pieces) {
                let Some(chunk) = DecodedChunk::join([p]) else { continue };
                let chunk = Arc::new(chunk);
                arrays[*i] = Some(chunk.clone());
                fills.fill(*i, chunk, unit.rows);
            }
        }
        // The rest in Parquet form; the reader returns them in file order.
        let mut parquet: Vec<usize> = data.iter().zip(&arrays).filter(|(_, a)| a.is_none()).map(|(c, _)| *c).collect();
        parquet.sort_unstable();
        // Those the memory tier waits for decoded: kept batch by batch.
        let keep: Vec<usize> = landed.assembled_columns().into_iter().map(|i| parquet.binary_search(&data[i]).expect("a chunk to fill is read from Parquet")).collect();
        // `arrays` follows the data columns, which follow the projection.
        let mut arrays = arrays.into_iter();
        let columns = projection
            .iter()
            .map(|c| match *c == row_id_column {
                true => Column::RowIds,
                false => match arrays.next().flatten() {
                    Some(array) => Column::Decoded(array),
                    None => Column::Reader(parquet.binary_search(c).expect("an undecoded data column is read")),
                },
            })
            .collect();
        let reader = match parquet.is_empty() {
            true => None,
            false => Some(reader(&parquet, (!selected.is_all()).then_some(selected.as_ref()), batch_size)?),
        };
        Ok(Decoding {
            kept: vec![ChunkPieces::default(); keep.len()],
            keep,
            reader,
            rows_left: selected.selected() as usize,
            batch_size,
            columns,
            rows_at: Positions::new(selected),
            first_row: unit.first_row,
            ordinal: object.ordinal,
            deleted: object.deleted.clone(),
            location: object.display.clone(),
            bytes_per_row,
            held,
            landed: landed.clone(),
            piece,
        })
    }

    /// The next batch, without deleted rows, how many rows were deleted,
    /// and which of its columns are lent: with `lend`, the rows of a
    /// decoded chunk that lie in one range are a slice of the chunk, not a
    /// copy, and the caller must [`settle`] the batch before handing it on.
    fn next_batch(&mut self, schema: &SchemaRef, lend: bool) -> Option<Result<(RecordBatch, usize, Vec<usize>)>> {
        let (decoded, rows) = match self.reader.as_mut() {
            None if self.rows_left == 0 => return None,
            None => {
                // Every column decoded already, or none wanted (COUNT(*)
                // and friends: the rows are counted, in one batch unless
                // columns are wanted).
                let rows = if self.columns.is_empty() { self.rows_left } else { self.rows_left.min(self.batch_size) };
                self.rows_left -= rows;
                (None, rows)
            }
            Some(reader) => match reader.next()? {
                Ok(b) => {
                    let rows = b.num_rows();
                    for (kept, &position) in self.kept.iter_mut().zip(&self.keep) {
                        kept.push(b.column(position));
                    }
                    (Some(b), rows)
                }
                Err(e) => return Some(Err(self.corrupt(e.to_string()))),
            },
        };
        let at = self.rows_at.take(rows);
        if at.iter().map(|r| r.end - r.start).sum::<u64>() != rows as u64 {
            return Some(Err(self.corrupt(format!("the decoder returned more rows than the {} selected", self.rows_at.selected()))));
        }
        let mut lent = Vec::new();
        let columns: Result<Vec<ArrayRef>, _> = self
            .columns
            .iter()
            .enumerate()
            .map(|(position, c)| match (c, &decoded) {
                (Column::Reader(i), Some(b)) => Ok(b.column(*i).clone()),
                (Column::Reader(_), None) => Err(datafusion::arrow::error::ArrowError::InvalidArgumentError(format!("a scan of {} lost its Parquet reader", self.location))),
                (Column::Decoded(chunk), _) => match (lend, at.as_slice()) {
                    (true, [one]) if let Some(slice) = chunk.lend(one) => {
                        lent.push(position);
                        Ok(slice)
                    }
                    _ => chunk.rows(&at),
                },
                (Column::RowIds, _) => Ok(Arc::new(row_ids(self.ordinal, self.first_row, &at)) as ArrayRef),
            })
            .collect();
        let columns = match columns {
            Ok(c) => c,
            Err(e) => return Some(Err(e.into())),
        };
        let opts = RecordBatchOptions::new().with_row_count(Some(rows));
        let batch = match RecordBatch::try_new_with_options(schema.clone(), columns, &opts) {
            Ok(b) => b,
            Err(e) => return Some(Err(e.into())),
        };
        Some(drop_deleted(batch, self.first_row, &at, self.deleted.as_deref()).map_err(Into::into).map(|(batch, deleted)| {
            if deleted > 0 {
                lent.clear(); // dropping rows copied every column
            }
            (batch, deleted, lent)
        }))
    }

    fn corrupt(&self, reason: String) -> DataFusionError {
        DataFusionError::External(Box::new(StorageError::Corrupt { location: self.location.clone(), reason }))
    }
}

/// A batch whose columns `lent` are slices of whole decoded chunks, after
/// a filter that started from `rows_in` rows: when the filter dropped
/// rows it copied the ones it kept, so nothing is lent any more; when it
/// kept them all (or let the batch pass), the lent columns are copied now,
/// for the reason [`DecodedChunk::lend`] gives.
fn settle(batch: RecordBatch, rows_in: usize, lent: &[usize]) -> Result<RecordBatch, datafusion::arrow::error::ArrowError> {
    if lent.is_empty() || batch.num_rows() < rows_in {
        return Ok(batch);
    }
    let mut columns = batch.columns().to_vec();
    for &i in lent {
        columns[i] = copy_ranges(&columns[i], &[0..columns[i].len() as u64])?;
    }
    RecordBatch::try_new_with_options(batch.schema(), columns, &RecordBatchOptions::new().with_row_count(Some(batch.num_rows())))
}

/// The rows `at` of `array` in buffers of their own.
fn copy_ranges(array: &ArrayRef, at: &[std::ops::Range<u64>]) -> Result<ArrayRef, datafusion::arrow::error::ArrowError> {
    let data = array.to_data();
    let rows = at.iter().map(|r| (r.end - r.start) as usize).sum();
    let mut out = MutableArrayData::new(vec![&data], false, rows);
    for r in at {
        out.try_extend(0, r.start as usize, r.end as usize)?;
    }
    Ok(make_array(out.freeze()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::Int32Array;

    #[test]
    fn lent_rows_are_copied_unless_a_filter_copied_them() {
        use datafusion::arrow::datatypes::{DataType, Field, Schema};
        let chunk: ArrayRef = Arc::new(Int32Array::from((0..1000).collect::<Vec<i32>>()));
        let schema = Arc::new(Schema::new(vec![Field::new("a", DataType::Int32, false), Field::new("b", DataType::Int32, false)]));
        let lent = RecordBatch::try_new(schema.clone(), vec![chunk.slice(100, 10), Arc::new(Int32Array::from((0..10).collect::<Vec<i32>>()))]).unwrap();
        let whole = chunk.get_array_memory_size();
        assert_eq!(lent.column(0).get_array_memory_size(), whole, "a slice counts the whole chunk");

        // The filter kept every row (or let the batch pass): the lent column is copied.
        let kept_all = settle(lent.clone(), 10, &[0]).unwrap();
        assert_eq!(kept_all.column(0).as_any().downcast_ref::<Int32Array>().unwrap().values(), &(100..110).collect::<Vec<i32>>()[..]);
        assert!(kept_all.column(0).get_array_memory_size() < whole / 10, "copied: only its rows");
        assert!(Arc::ptr_eq(kept_all.column(1), lent.column(1)), "columns not lent are left alone");

        // The filter dropped rows, so it copied the rest: nothing to do.
        let filtered = lent.slice(0, 5);
        let settled = settle(filtered.clone(), 10, &[0]).unwrap();
        assert!(Arc::ptr_eq(settled.column(0), filtered.column(0)));
        // Nothing lent: nothing to do.
        assert!(Arc::ptr_eq(settle(lent.clone(), 10, &[]).unwrap().column(0), lent.column(0)));
    }
}
