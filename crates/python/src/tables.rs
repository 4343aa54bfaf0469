//! Python data as tables a statement reads: anything with
//! `__arrow_c_stream__` (pyarrow tables and readers, pandas ≥ 2.2 and
//! Polars DataFrames, DuckDB relations), imported through the Arrow C
//! stream interface without copying its buffers.
//!
//! - [`memory_table`]: `con.register(name, df)` — the batches are kept
//!   (the foreign buffers, not copies) and spread over the engine's
//!   partitions, so the table can be scanned any number of times.
//! - [`once_table`]: `con.load(table, data)` — the stream is read once, as
//!   the INSERT consumes it, so a load larger than memory never sits in
//!   memory whole.

use std::sync::{Arc, Mutex};

use datafusion::arrow::array::{RecordBatch, RecordBatchReader};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::arrow::error::ArrowError;
use datafusion::catalog::TableProvider;
use datafusion::catalog::streaming::StreamingTable;
use datafusion::datasource::MemTable;
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::streaming::PartitionStream;

/// The reader's batches, kept as a table of `partitions` partitions.
pub fn memory_table(reader: Box<dyn RecordBatchReader + Send>, partitions: usize) -> Result<Arc<dyn TableProvider>, ArrowError> {
    let schema = reader.schema();
    let mut parts: Vec<Vec<RecordBatch>> = vec![Vec::new(); partitions.max(1)];
    for (i, batch) in reader.enumerate() {
        let n = parts.len();
        parts[i % n].push(batch?);
    }
    Ok(Arc::new(MemTable::try_new(schema, parts).map_err(|e| ArrowError::ExternalError(Box::new(e)))?))
}

/// A table that streams `reader` once, its strings and binaries in the
/// types blobhouse stores (`large_string` and `string_view` as `string`).
pub fn once_table(reader: Box<dyn RecordBatchReader + Send>) -> Result<Arc<dyn TableProvider>, ArrowError> {
    let stored = Arc::new(Schema::new_with_metadata(
        reader.schema().fields().iter().map(|f| Field::new(f.name(), storable(f.data_type()), f.is_nullable())).collect::<Vec<_>>(),
        reader.schema().metadata().clone(),
    ));
    let once = Arc::new(OnceStream { schema: stored.clone(), reader: Mutex::new(Some(reader)) });
    Ok(Arc::new(StreamingTable::try_new(stored, vec![once]).map_err(|e| ArrowError::ExternalError(Box::new(e)))?))
}

/// The type a column of `t` is stored as.
fn storable(t: &DataType) -> DataType {
    match t {
        DataType::LargeUtf8 | DataType::Utf8View => DataType::Utf8,
        DataType::LargeBinary | DataType::BinaryView => DataType::Binary,
        other => other.clone(),
    }
}

/// One read of a foreign stream.
struct OnceStream {
    schema: SchemaRef,
    reader: Mutex<Option<Box<dyn RecordBatchReader + Send>>>,
}

impl std::fmt::Debug for OnceStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OnceStream").field("schema", &self.schema).finish_non_exhaustive()
    }
}

impl PartitionStream for OnceStream {
    fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    fn execute(&self, _ctx: Arc<TaskContext>) -> SendableRecordBatchStream {
        let reader = self.reader.lock().unwrap_or_else(|p| p.into_inner()).take();
        let schema = self.schema.clone();
        let batches = futures::stream::unfold((reader, schema.clone()), |(reader, schema)| async move {
            let mut reader = match reader {
                Some(r) => r,
                None => {
                    let e = datafusion::error::DataFusionError::Execution("the data given to load() was read already: a stream can be loaded once".into());
                    return Some((Err(e), (None, schema)));
                }
            };
            // The producer may be Python code (a generator behind a
            // pyarrow reader) that takes the GIL: read off the runtime's
            // worker threads.
            let (reader, next) = tokio::task::spawn_blocking(move || {
                let next = reader.next();
                (reader, next)
            })
            .await
            .ok()?;
            let batch = next?.and_then(|b| conform(b, &schema)).map_err(|e| datafusion::error::DataFusionError::ArrowError(Box::new(e), None));
            Some((batch, (Some(reader), schema)))
        });
        Box::pin(RecordBatchStreamAdapter::new(schema, batches))
    }
}

/// `batch` in `schema`'s types (the stored ones).
fn conform(batch: RecordBatch, schema: &SchemaRef) -> Result<RecordBatch, ArrowError> {
    if batch.schema().fields().iter().zip(schema.fields()).all(|(a, b)| a.data_type() == b.data_type()) {
        return RecordBatch::try_new(schema.clone(), batch.columns().to_vec());
    }
    let columns = batch.columns().iter().zip(schema.fields()).map(|(c, f)| cast(c, f.data_type())).collect::<Result<Vec<_>, _>>()?;
    RecordBatch::try_new(schema.clone(), columns)
}
