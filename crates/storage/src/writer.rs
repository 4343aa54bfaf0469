//! Cuts a stream of record batches into Parquet data objects sized for
//! retrieval, uploads each once under a fresh key, and describes each in the
//! form the manifest stores (byte ranges and zone maps per column chunk).
//!
//! Row groups are sized by bytes, not rows: the writer closes a row group when
//! its estimated compressed size reaches `target_chunk_bytes` × columns, i.e.
//! when the average column chunk reaches the target (8–16 MiB by default, the
//! cost/throughput optimum of AnyBlob §4.4). The estimate is corrected after
//! every row group by the ratio of real to estimated size. Larger chunks are
//! later fetched in several range requests; smaller ones are fetched whole.

use std::sync::Arc;

use base64::Engine as _;
use bytes::Bytes;
use datafusion::arrow::array::{Array, RecordBatch, StringArray};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use parquet::arrow::arrow_writer::ArrowWriterOptions;
use parquet::arrow::{ARROW_SCHEMA_META_KEY, ArrowWriter};
use parquet::arrow::arrow_reader::statistics::StatisticsConverter;
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::metadata::ParquetMetaData;
use parquet::file::metadata::KeyValue;
use parquet::file::properties::{EnabledStatistics, WriterProperties};
use tokio::task::JoinSet;

use crate::database::Database;
use crate::error::{Result, StorageError};
use crate::chunks::{page_index_range, with_page_index};
use crate::format::{ByteRange, ColumnChunkMeta, DataObject, RowGroupMeta};
use crate::histogram::Sampler;

/// Knobs of the writer. The defaults suit cloud object stores.
#[derive(Debug, Clone)]
pub struct WriteOptions {
    /// Target average compressed size of a column chunk (default 12 MiB).
    pub target_chunk_bytes: usize,
    /// Largest data object to write (default 512 MiB); a new object starts after.
    pub max_object_bytes: usize,
    /// Parquet compression codec (default ZSTD level 1).
    pub compression: Compression,
    /// Upper bound on rows per row group regardless of bytes (default none).
    pub max_row_group_rows: Option<usize>,
}

impl Default for WriteOptions {
    fn default() -> Self {
        WriteOptions {
            target_chunk_bytes: 12 << 20,
            max_object_bytes: 512 << 20,
            compression: Compression::ZSTD(ZstdLevel::try_new(1).expect("valid zstd level")),
            max_row_group_rows: None,
        }
    }
}

/// Most rows handed to the Parquet writer at a time. The writer hands fewer
/// when the row-group target is small, so a row group overshoots its byte
/// target by at most about a quarter.
const MAX_SLICE_ROWS: usize = 8192;
const MIN_SLICE_ROWS: usize = 64;
/// Most rows in a data page: the granularity of page-index pruning.
pub const PAGE_ROWS: usize = 20_000;
/// Uploads allowed to run while the next object is being encoded.
const MAX_PENDING_UPLOADS: usize = 2;

/// How data objects are encoded.
fn writer_properties(options: &WriteOptions) -> WriterProperties {
    WriterProperties::builder()
        .set_compression(options.compression)
        .set_dictionary_enabled(true)
        // Page statistics give every object a page index (the manifest
        // records where it lies): scans then decode only the pages whose
        // bounds pass their filters. Pages of at most 20 000 rows (Parquet's
        // default, pinned here) keep that selection fine-grained.
        .set_statistics_enabled(EnabledStatistics::Page)
        .set_data_page_row_count_limit(PAGE_ROWS)
        .set_max_row_group_row_count(None)
        .build()
}

/// Writes one table's new data objects. Call [`TableWriter::finish`] to get
/// their descriptions for a commit, or [`TableWriter::abort`] to delete them.
pub struct TableWriter {
    db: Arc<Database>,
    schema: SchemaRef,
    /// `schema` as the Parquet writer is given it (with field ids).
    file_schema: SchemaRef,
    options: WriteOptions,
    props: WriterProperties,
    current: Option<ArrowWriter<Vec<u8>>>,
    /// Learned ratio of actual to estimated row-group size.
    size_ratio: f64,
    /// Learned compressed bytes per row (0 until the first row group).
    bytes_per_row: f64,
    uploads: JoinSet<Result<DataObject>>,
    done: Vec<DataObject>,
    rows: u64,
    /// Samples the row group in progress for its histograms.
    sampler: Sampler,
    /// The histograms of the current object's finished row groups.
    histograms: Vec<Vec<Option<Vec<String>>>>,
}

/// The Parquet metadata key of the Arrow schema blobhouse reads its own
/// objects with (arrow-schema's serde JSON): the table's schema, string
/// views and all, while the standard `ARROW:schema` says plain strings so
/// that other readers (pyarrow, pyiceberg, pandas) get the types their
/// kernels support. [`reader_options`] reads it back.
pub const OWN_ARROW_SCHEMA_KEY: &str = "blobhouse:arrow_schema";

/// `schema` as other Parquet readers are told it (`ARROW:schema`): view
/// types as their plain forms, which every Arrow implementation handles.
fn shared_schema(schema: &Schema) -> Schema {
    let fields: Vec<Field> = schema
        .fields()
        .iter()
        .map(|f| {
            let t = match f.data_type() {
                DataType::Utf8View => DataType::Utf8,
                DataType::BinaryView => DataType::Binary,
                other => other.clone(),
            };
            f.as_ref().clone().with_data_type(t)
        })
        .collect();
    Schema::new_with_metadata(fields, schema.metadata().clone())
}

/// `schema` with each top-level column's stable id (`crate::iceberg::schema`:
/// column `i` is field `i + 1`) as its Parquet field id.
fn with_field_ids(schema: &Schema) -> Schema {
    let fields: Vec<Field> = schema
        .fields()
        .iter()
        .enumerate()
        .map(|(i, f)| {
            let mut metadata = f.metadata().clone();
            metadata.insert(crate::iceberg::schema::FIELD_ID_KEY.to_string(), (i + 1).to_string());
            f.as_ref().clone().with_metadata(metadata)
        })
        .collect();
    Schema::new_with_metadata(fields, schema.metadata().clone())
}

/// How blobhouse reads one of its data objects: with the Arrow schema kept
/// under [`OWN_ARROW_SCHEMA_KEY`] when the object has one (objects written
/// before it, and encrypted ones, are read by their `ARROW:schema`).
pub fn reader_options(meta: &ParquetMetaData) -> parquet::arrow::arrow_reader::ArrowReaderOptions {
    let options = parquet::arrow::arrow_reader::ArrowReaderOptions::new();
    let own = meta.file_metadata().key_value_metadata().and_then(|kv| kv.iter().find(|k| k.key == OWN_ARROW_SCHEMA_KEY)).and_then(|k| k.value.as_deref());
    match own.and_then(|json| serde_json::from_str::<Schema>(json).ok()) {
        Some(schema) => options.with_schema(Arc::new(schema)),
        None => options,
    }
}

impl TableWriter {
    /// A writer for a table with `schema`.
    pub fn new(db: Arc<Database>, schema: SchemaRef, options: WriteOptions) -> Self {
        let mut props = writer_properties(&options);
        // Plaintext objects: Parquet field ids for Iceberg readers, plain
        // string types for other Arrow readers, our own schema for us.
        // (Encrypted objects, which no other engine reads, keep the
        // standard embedded schema.)
        let file_schema = match db.keyring() {
            Some(_) => schema.clone(),
            None => {
                let own = serde_json::to_string(schema.as_ref()).expect("schemas serialise");
                let shared = parquet::arrow::encode_arrow_schema(&shared_schema(&schema));
                props = props
                    .into_builder()
                    .set_key_value_metadata(Some(vec![KeyValue::new(ARROW_SCHEMA_META_KEY.to_string(), shared), KeyValue::new(OWN_ARROW_SCHEMA_KEY.to_string(), own)]))
                    .build();
                Arc::new(with_field_ids(&schema))
            }
        };
        let sampler = Sampler::new(schema.fields().iter().map(|f| f.data_type().clone()));
        TableWriter {
            db,
            schema,
            file_schema,
            options,
            props,
            current: None,
            size_ratio: 1.0,
            bytes_per_row: 0.0,
            uploads: JoinSet::new(),
            done: Vec::new(),
            rows: 0,
            sampler,
            histograms: Vec::new(),
        }
    }

    /// Rows written so far.
    pub fn rows(&self) -> u64 {
        self.rows
    }

    /// Bytes of the objects finished so far.
    pub fn bytes(&self) -> u64 {
        self.done.iter().map(|o| o.size).sum()
    }

    /// Adds a batch. Its columns must have the table's types; non-nullable
    /// columns must not contain nulls.
    pub async fn write(&mut self, batch: &RecordBatch) -> Result<()> {
        let batch = RecordBatch::try_new(self.schema.clone(), batch.columns().to_vec())
            .map_err(|e| StorageError::InvalidData(format!("data does not fit the table's schema: {e}")))?;
        let mut offset = 0;
        while offset < batch.num_rows() {
            let len = self.slice_rows().min(batch.num_rows() - offset);
            self.write_slice(&batch.slice(offset, len)).await?;
            offset += len;
        }
        Ok(())
    }

    fn slice_rows(&self) -> usize {
        let rows = if self.bytes_per_row <= 0.0 {
            MIN_SLICE_ROWS.max(1024)
        } else {
            let target_rg = (self.options.target_chunk_bytes * self.schema.fields().len().max(1)) as f64;
            ((target_rg / self.bytes_per_row / 4.0) as usize).clamp(MIN_SLICE_ROWS, MAX_SLICE_ROWS)
        };
        // A row-count limit below a slice is honoured: row groups are cut
        // between slices.
        self.options.max_row_group_rows.map_or(rows, |m| rows.min(m.max(1)))
    }

    async fn write_slice(&mut self, slice: &RecordBatch) -> Result<()> {
        if self.current.is_none() {
            // An encrypted database: fresh data keys for every object.
            let props = match self.db.keyring() {
                Some(keyring) => {
                    let encryption = keyring.new_object(&self.schema).map_err(|e| self.parquet_err(e))?;
                    self.props.clone().into_builder().with_file_encryption_properties(encryption).build()
                }
                None => self.props.clone(),
            };
            let own_schema = self.db.keyring().is_none();
            let options = ArrowWriterOptions::new().with_properties(props).with_skip_arrow_metadata(own_schema);
            let w = ArrowWriter::try_new_with_options(Vec::with_capacity(self.options.max_object_bytes.min(64 << 20)), self.file_schema.clone(), options)
                .map_err(|e| self.parquet_err(e))?;
            self.current = Some(w);
        }
        let w = self.current.as_mut().expect("writer just created");
        w.write(slice).map_err(|e| StorageError::Parquet { location: "new data object".into(), source: e })?;
        self.sampler.add(slice.columns());
        self.rows += slice.num_rows() as u64;

        let ncols = self.schema.fields().len().max(1);
        let target_rg = (self.options.target_chunk_bytes * ncols) as f64;
        let estimate = w.in_progress_size() as f64 * self.size_ratio;
        let rows_full = self.options.max_row_group_rows.is_some_and(|m| w.in_progress_rows() >= m);
        if estimate >= target_rg || rows_full {
            let before = w.bytes_written();
            let estimated = w.in_progress_size().max(1);
            let rows = w.in_progress_rows().max(1);
            w.flush().map_err(|e| StorageError::Parquet { location: "new data object".into(), source: e })?;
            self.histograms.push(self.sampler.finish_row_group());
            let actual = w.bytes_written() - before;
            // Smooth the correction so one odd row group does not swing it.
            self.size_ratio = 0.5 * self.size_ratio + 0.5 * (actual as f64 / estimated as f64);
            self.bytes_per_row = actual as f64 / rows as f64;
            if w.bytes_written() + (target_rg as usize) > self.options.max_object_bytes {
                self.finish_object().await?;
            }
        }
        Ok(())
    }

    /// Closes the current object and starts its upload.
    async fn finish_object(&mut self) -> Result<()> {
        let Some(writer) = self.current.take() else { return Ok(()) };
        if writer.in_progress_rows() == 0 && writer.flushed_row_groups().is_empty() {
            return Ok(());
        }
        if writer.in_progress_rows() > 0 {
            self.histograms.push(self.sampler.finish_row_group());
        }
        let histograms = std::mem::take(&mut self.histograms);
        let buf = writer.into_inner().map_err(|e| StorageError::Parquet { location: "new data object".into(), source: e })?;
        let (key, path) = self.db.new_object("parquet").await?;
        let mut object = describe_object(&self.schema, key, &path, &buf, self.db.decryption())?;
        // One entry per row group, or none at all (never misattributed).
        if histograms.len() == object.row_groups.len() {
            for (rg, columns) in object.row_groups.iter_mut().zip(histograms) {
                for (chunk, quantiles) in rg.columns.iter_mut().zip(columns) {
                    chunk.quantiles = quantiles;
                }
            }
        }
        while self.uploads.len() >= MAX_PENDING_UPLOADS {
            self.collect_one().await?;
        }
        let db = self.db.clone();
        let body = Bytes::from(buf);
        self.uploads.spawn(async move {
            crate::failpoint::hit("upload.data")?;
            db.put_new(&object.path, body.clone()).await?;
            if let Some(observer) = db.upload_observer() {
                observer.uploaded(&object, &body);
            }
            Ok(object)
        });
        Ok(())
    }

    async fn collect_one(&mut self) -> Result<()> {
        if let Some(joined) = self.uploads.join_next().await {
            let object = joined.map_err(|e| StorageError::InvalidData(format!("upload task failed: {e}")))??;
            self.done.push(object);
        }
        Ok(())
    }

    /// Finishes the last object, waits for all uploads, and returns the
    /// objects in write order. Nothing is committed yet.
    pub async fn finish(mut self) -> Result<Vec<DataObject>> {
        let result = async {
            self.finish_object().await?;
            while !self.uploads.is_empty() {
                self.collect_one().await?;
            }
            Ok(())
        }
        .await;
        if let Err(e) = result {
            self.abort().await;
            return Err(e);
        }
        self.done.sort_by_key(|o| o.key);
        Ok(self.done)
    }

    /// Deletes whatever this writer uploaded; used when the statement fails.
    pub async fn abort(mut self) {
        while let Some(joined) = self.uploads.join_next().await {
            if let Ok(Ok(o)) = joined {
                self.done.push(o);
            }
        }
        self.db.delete_unreferenced(self.done.drain(..).map(|o| o.path).collect()).await;
    }

    fn parquet_err(&self, e: parquet::errors::ParquetError) -> StorageError {
        StorageError::Parquet { location: "new data object".into(), source: e }
    }
}

/// Builds the manifest entry of a finished Parquet object from its bytes:
/// footer, and per row group and column the byte range and zone map. An
/// encrypted object (`PARE`) is described through `decryption`.
pub fn describe_object(
    schema: &SchemaRef,
    key: u64,
    path: &str,
    buf: &[u8],
    decryption: Option<&Arc<parquet::encryption::decrypt::FileDecryptionProperties>>,
) -> Result<DataObject> {
    let corrupt = |reason: String| StorageError::Corrupt { location: path.to_string(), reason };
    let encrypted = buf.len() >= 12 && &buf[buf.len() - 4..] == b"PARE";
    if buf.len() < 12 || (&buf[buf.len() - 4..] != b"PAR1" && !encrypted) {
        return Err(corrupt("not a Parquet file".into()));
    }
    let footer_len = u32::from_le_bytes(buf[buf.len() - 8..buf.len() - 4].try_into().expect("4 bytes")) as usize;
    let footer_start = buf.len().checked_sub(8 + footer_len).ok_or_else(|| corrupt("footer longer than file".into()))?;
    let footer = &buf[footer_start..buf.len() - 8];
    let described = DataObject {
        path: path.to_string(),
        key,
        size: buf.len() as u64,
        rows: 0,
        footer: String::new(),
        page_index: None,
        page_index_at: None,
        row_groups: Vec::new(),
        checksum: None,
        footer_checksum: None,
        encrypted,
    };
    let meta = described.decode_footer(footer, decryption).map_err(|e| StorageError::Parquet { location: path.to_string(), source: e })?;
    let mut row_groups = zone_maps(schema, &meta).map_err(|e| StorageError::Parquet { location: path.to_string(), source: e })?;
    for chunk in row_groups.iter_mut().flat_map(|rg| rg.columns.iter_mut()) {
        let bytes = buf.get(chunk.offset as usize..(chunk.offset + chunk.length) as usize).ok_or_else(|| corrupt(format!("column chunk {}..{} lies outside the object", chunk.offset, chunk.offset + chunk.length)))?;
        chunk.checksum = Some(crate::format::chunk_checksum(bytes));
    }
    let rows = meta.file_metadata().num_rows() as u64;
    let page_index_at = match page_index_range(&meta) {
        Some(r) if r.end > footer_start as u64 => {
            return Err(corrupt(format!("its page index ({}..{}) overlaps its footer (from {footer_start})", r.start, r.end)));
        }
        Some(r) => {
            let flat = meta.file_metadata().schema_descr().num_columns() == schema.fields().len();
            let (at, indexed) = pages_beyond_zone_maps(meta, path, buf, r)?;
            // Checksums of single pages, for a storage node that fetches
            // only some (`crate::page_sums`).
            if let Some(indexed) = indexed.filter(|_| at.is_some() && flat) {
                for (rg, group) in row_groups.iter_mut().enumerate() {
                    for (c, chunk) in group.columns.iter_mut().enumerate() {
                        chunk.pages = crate::page_sums::page_ranges(&indexed, rg, c).filter(|p| p.len() > 1).map(|p| crate::page_sums::encode(buf, &p));
                    }
                }
            }
            at
        }
        None => None,
    };
    Ok(DataObject {
        rows,
        footer: base64::engine::general_purpose::STANDARD.encode(footer),
        page_index_at,
        row_groups,
        checksum: Some(crate::format::chunk_checksum(buf)),
        footer_checksum: Some(crate::format::chunk_checksum(footer)),
        ..described
    })
}

/// Where the object's page index lies, when it says more than the zone maps:
/// some column chunk has several pages. With one page per chunk each page's
/// bounds are the chunk's, so the index could only repeat the zone maps and
/// a scan would GET it for nothing (a table filled by one-row INSERTs has
/// thousands of such objects).
/// Also returns `meta` with its page index decoded.
fn pages_beyond_zone_maps(meta: ParquetMetaData, path: &str, buf: &[u8], at: std::ops::Range<u64>) -> Result<(Option<ByteRange>, Option<ParquetMetaData>)> {
    let bytes = Bytes::copy_from_slice(&buf[at.start as usize..at.end as usize]);
    let meta = with_page_index(meta, at.start, bytes, buf.len() as u64, path).map_err(|source| StorageError::Parquet { location: path.to_string(), source })?;
    let several = meta.offset_index().is_some_and(|rgs| rgs.iter().flatten().any(|chunk| chunk.page_locations().len() > 1));
    let checksum = Some(crate::format::chunk_checksum(&buf[at.start as usize..at.end as usize]));
    Ok((several.then_some(ByteRange { offset: at.start, length: at.end - at.start, checksum }), Some(meta)))
}

fn zone_maps(schema: &SchemaRef, meta: &ParquetMetaData) -> parquet::errors::Result<Vec<RowGroupMeta>> {
    let parquet_schema = meta.file_metadata().schema_descr();
    let rgs = meta.row_groups();
    // Per top-level field: its leaf columns, and its min/max/null arrays over
    // all row groups (primitive fields only).
    let mut per_field = Vec::with_capacity(schema.fields().len());
    for field in schema.fields() {
        let leaves: Vec<usize> = (0..parquet_schema.num_columns())
            .filter(|&j| parquet_schema.column(j).path().parts().first().map(String::as_str) == Some(field.name().as_str()))
            .collect();
        let stats = if leaves.len() == 1 && !field.data_type().is_nested() {
            StatisticsConverter::try_new(field.name(), schema, parquet_schema).ok().map(|conv| {
                let mins = conv.row_group_mins(rgs.iter()).ok().and_then(|a| to_text(&a));
                let maxes = conv.row_group_maxes(rgs.iter()).ok().and_then(|a| to_text(&a));
                let nulls = conv.row_group_null_counts(rgs.iter()).ok();
                (mins, maxes, nulls)
            })
        } else {
            None
        };
        per_field.push((leaves, stats));
    }
    let mut out = Vec::with_capacity(rgs.len());
    for (i, rg) in rgs.iter().enumerate() {
        let mut columns = Vec::with_capacity(per_field.len());
        for (leaves, stats) in &per_field {
            let (mut start, mut end) = (u64::MAX, 0u64);
            for &j in leaves {
                let (s, len) = rg.column(j).byte_range();
                start = start.min(s);
                end = end.max(s + len);
            }
            if leaves.is_empty() {
                start = 0;
            }
            let (min, max, nulls) = match stats {
                Some((mins, maxes, nulls)) => (
                    mins.as_ref().and_then(|a| a.is_valid(i).then(|| a.value(i).to_string())),
                    maxes.as_ref().and_then(|a| a.is_valid(i).then(|| a.value(i).to_string())),
                    nulls.as_ref().and_then(|a| a.is_valid(i).then(|| a.value(i))),
                ),
                None => (None, None, None),
            };
            columns.push(ColumnChunkMeta { offset: start, length: end.saturating_sub(start), nulls, min, max, quantiles: None, checksum: None, pages: None });
        }
        out.push(RowGroupMeta { rows: rg.num_rows() as u64, columns });
    }
    Ok(out)
}

/// Statistics as text that casts back to the column type; `None` for types
/// whose values have no faithful text form (binary).
fn to_text(values: &dyn Array) -> Option<StringArray> {
    if matches!(values.data_type(), DataType::Binary | DataType::LargeBinary | DataType::BinaryView | DataType::FixedSizeBinary(_)) {
        return None;
    }
    let text = cast(values, &DataType::Utf8).ok()?;
    text.as_any().downcast_ref::<StringArray>().cloned()
}

#[cfg(test)]
mod tests {
    use datafusion::arrow::array::Int64Array;
    use datafusion::arrow::datatypes::{Field, Schema};

    use super::*;

    /// One object of `rows` rows (0, 1, …) of one BIGINT column, as the
    /// table writer encodes it.
    fn object(rows: i64) -> (SchemaRef, Vec<u8>) {
        let schema: SchemaRef = Arc::new(Schema::new(vec![Field::new("x", DataType::Int64, false)]));
        let batch = RecordBatch::try_new(schema.clone(), vec![Arc::new(Int64Array::from_iter_values(0..rows))]).unwrap();
        let mut w = ArrowWriter::try_new(Vec::new(), schema.clone(), Some(writer_properties(&WriteOptions::default()))).unwrap();
        w.write(&batch).unwrap();
        (schema, w.into_inner().unwrap())
    }

    #[test]
    fn the_manifest_records_where_a_page_index_lies_and_only_when_it_says_more_than_the_zone_maps() {
        let (schema, buf) = object(3 * PAGE_ROWS as i64);
        let o = describe_object(&schema, 1, "o.parquet", &buf, None).unwrap();
        let at = o.page_index_at.expect("three pages: the index is worth reading");
        assert!(o.page_index.is_none(), "no page-index bytes in the manifest");
        let footer_len = base64::engine::general_purpose::STANDARD.decode(&o.footer).unwrap().len() as u64;
        assert!(at.length > 0 && at.range().end <= buf.len() as u64 - 8 - footer_len, "{at:?} lies before the footer");
        // The bytes there are the page index: decoded, it has three pages.
        let meta = parquet::file::metadata::ParquetMetaDataReader::new()
            .with_page_index_policy(parquet::file::metadata::PageIndexPolicy::Required)
            .parse_and_finish(&Bytes::from(buf.clone()))
            .unwrap();
        assert_eq!(meta.offset_index().unwrap()[0][0].page_locations().len(), 3);
        // Each page has its checksum, and together they are the chunk.
        let chunk = &o.row_groups[0].columns[0];
        let pages = crate::page_sums::page_ranges(&meta, 0, 0).unwrap();
        assert_eq!((pages.first().unwrap().start, pages.last().unwrap().end), (chunk.offset, chunk.offset + chunk.length));
        let spans = [(chunk.offset, Bytes::copy_from_slice(&buf[chunk.range().start as usize..chunk.range().end as usize]))];
        assert_eq!(crate::page_sums::check(&spans, &pages, &crate::page_sums::decode(chunk.pages.as_deref().unwrap()).unwrap()), Ok(()));

        let (schema, buf) = object(100);
        let o = describe_object(&schema, 2, "p.parquet", &buf, None).unwrap();
        assert_eq!((o.page_index_at, o.page_index.is_none()), (None, true), "one page per chunk: the zone maps say it all");
        assert!(o.row_groups[0].columns.iter().all(|c| c.pages.is_none()), "one page: the chunk checksum covers it");
    }
}
