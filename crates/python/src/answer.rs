//! [`Answer`]: what one statement returned, to Python — a query's rows as
//! the engine computes them, or a command's outcome.
//!
//! Rows leave in two ways, both one batch at a time, so that a result of
//! any size never sits in memory whole:
//! - `next_batch()`, what the cursor's `fetch*`, `.arrow()` and `.pl()`
//!   use: each call computes the next batch with the GIL released and
//!   raises `KeyboardInterrupt` itself on Ctrl-C;
//! - `__arrow_c_stream__`, the Arrow PyCapsule interface, for consumers
//!   that pull batches themselves (pyarrow, Polars, DuckDB): zero-copy, each
//!   batch computed when the consumer asks for it.
//!
//! Dropping the answer, closing it, or an interrupt drops the engine's
//! stream, which stops the statement and its downloads.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use datafusion::arrow::array::{ArrayRef, RecordBatch, RecordBatchReader, StructArray};
use datafusion::arrow::datatypes::{Field, SchemaRef};
use datafusion::arrow::error::ArrowError;
use datafusion::execution::SendableRecordBatchStream;
use futures::StreamExt;
use pyo3::exceptions::PyKeyboardInterrupt;
use pyo3::prelude::*;
use pyo3::types::PyCapsule;
use pyo3_arrow::ffi::{ArrayIterator, to_stream_pycapsule};
use pyo3_arrow::{PyRecordBatch, PySchema};

use crate::errors::{InterfaceError, engine_error};
use crate::runtime;

/// Where an answer's rows come from.
pub enum Rows {
    /// Computed as they are read.
    Streaming(SendableRecordBatchStream),
    /// Already computed (a command's count, SHOW …).
    Buffered(VecDeque<RecordBatch>),
}

/// What one statement returned.
#[pyclass(module = "blobhouse._blobhouse", frozen)]
pub struct Answer {
    schema: SchemaRef,
    /// `None` once read to the end, closed, or handed to a consumer.
    rows: Mutex<Option<Rows>>,
    returns_rows: bool,
    rowcount: i64,
    notices: Vec<(String, String, String)>,
}

impl Answer {
    /// An answer of `schema`. `returns_rows`: whether it is a result set
    /// (a DB-API `description`); `rowcount`: rows changed or returned,
    /// -1 when not known before they are read.
    pub fn new(schema: SchemaRef, rows: Rows, returns_rows: bool, rowcount: i64, notices: Vec<(String, String, String)>) -> Answer {
        Answer { schema, rows: Mutex::new(Some(rows)), returns_rows, rowcount, notices }
    }

    /// The rows, taken out: a thread reading them holds no lock while the
    /// engine computes (another thread asking meanwhile is told so).
    fn take(&self) -> PyResult<Option<Rows>> {
        Ok(self.rows.lock().map_err(|_| InterfaceError::new_err("a thread reading this result panicked"))?.take())
    }

    fn put(&self, rows: Rows) {
        if let Ok(mut slot) = self.rows.lock() {
            *slot = Some(rows);
        }
    }
}

#[pymethods]
impl Answer {
    /// The rows' schema, as a `pyarrow.Schema`.
    #[getter]
    fn schema<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        PySchema::new(self.schema.clone()).into_pyarrow(py)
    }

    /// Each column's SQL type name, as DESCRIBE says it (`BIGINT`,
    /// `DECIMAL(15,2)`, `TIMESTAMP`): the cursor's DB-API type codes.
    #[getter]
    fn type_names(&self) -> Vec<String> {
        self.schema.fields().iter().map(|f| blobhouse_engine::types::sql_type_name(f.data_type())).collect()
    }

    /// Whether the statement returns rows (a query, SHOW, EXPLAIN).
    #[getter]
    fn returns_rows(&self) -> bool {
        self.returns_rows
    }

    /// Rows changed by INSERT, UPDATE, DELETE, COPY or CREATE TABLE AS;
    /// rows of a result known before reading; otherwise -1.
    #[getter]
    fn rowcount(&self) -> i64 {
        self.rowcount
    }

    /// Warnings about a statement that succeeded: (severity, SQLSTATE, message).
    #[getter]
    fn notices(&self) -> Vec<(String, String, String)> {
        self.notices.clone()
    }

    /// The next batch of rows as a `pyarrow.RecordBatch`, computed now with
    /// the GIL released; `None` after the last. Ctrl-C raises
    /// `KeyboardInterrupt` and stops the statement.
    fn next_batch<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
        let Some(rows) = self.take()? else { return Ok(None) };
        let (rows, next) = match rows {
            Rows::Buffered(mut batches) => {
                let next = batches.pop_front();
                (Some(Rows::Buffered(batches)), next.map(Ok))
            }
            Rows::Streaming(mut stream) => {
                // An interrupt drops the stream here: the statement stops.
                let next = runtime::wait(py, async move {
                    let next = stream.next().await;
                    (stream, next)
                })?;
                let (stream, next) = next;
                (Some(Rows::Streaming(stream)), next)
            }
        };
        match next {
            Some(Ok(batch)) => {
                if let Some(rows) = rows {
                    self.put(rows);
                }
                Ok(Some(PyRecordBatch::new(batch).into_pyarrow(py)?))
            }
            Some(Err(e)) => Err(engine_error(py, &e.into())),
            None => Ok(None),
        }
    }

    /// Stops the statement (if still running) and drops what is left.
    fn close(&self) -> PyResult<()> {
        drop(self.take()?);
        Ok(())
    }

    /// The schema through the Arrow PyCapsule interface.
    fn __arrow_c_schema__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyCapsule>> {
        Ok(pyo3_arrow::ffi::to_schema_pycapsule(py, self.schema.as_ref())?)
    }

    /// The rows not read yet, as an Arrow C stream (PyCapsule interface):
    /// each batch is computed when the consumer asks for it. One stream per
    /// answer — a second call finds the rows gone.
    #[pyo3(signature = (requested_schema = None))]
    fn __arrow_c_stream__<'py>(&self, py: Python<'py>, requested_schema: Option<Bound<'py, PyCapsule>>) -> PyResult<Bound<'py, PyCapsule>> {
        let Some(rows) = self.take()? else {
            return Err(InterfaceError::new_err("this result was read already: run the statement again (con.sql() relations run it anew for each reader)"));
        };
        let reader = Reader { schema: self.schema.clone(), rows: Some(rows) };
        let schema = self.schema.clone();
        let arrays = reader.map(|batch| batch.map(|b| Arc::new(StructArray::from(b)) as ArrayRef));
        let field = Field::new_struct("", schema.fields().clone(), false).with_metadata(schema.metadata().clone());
        Ok(to_stream_pycapsule(py, Box::new(ArrayIterator::new(arrays, field.into())), requested_schema)?)
    }
}

/// An answer's rows as an Arrow reader, for consumers on any thread.
pub struct Reader {
    pub schema: SchemaRef,
    pub rows: Option<Rows>,
}

impl Iterator for Reader {
    type Item = Result<RecordBatch, ArrowError>;

    fn next(&mut self) -> Option<Self::Item> {
        let mut stream = match self.rows.take()? {
            Rows::Buffered(mut batches) => {
                let next = batches.pop_front();
                self.rows = Some(Rows::Buffered(batches));
                return next.map(Ok);
            }
            Rows::Streaming(stream) => stream,
        };
        match runtime::wait_anywhere(async move {
            let next = stream.next().await;
            (stream, next)
        }) {
            Ok((stream, Some(batch))) => {
                self.rows = Some(Rows::Streaming(stream));
                Some(batch.map_err(|e| ArrowError::ExternalError(Box::new(e))))
            }
            Ok((_, None)) => None,
            Err(interrupt) => {
                // The statement stopped with the stream (dropped by the
                // aborted task). Let Python raise the interrupt once the
                // consumer returns: the consumer can only report an Arrow
                // error.
                let was_interrupt = Python::attach(|py| interrupt.is_instance_of::<PyKeyboardInterrupt>(py));
                if was_interrupt {
                    // SAFETY: marks SIGINT pending; Python raises it at its next check.
                    unsafe { pyo3::ffi::PyErr_SetInterruptEx(libc::SIGINT) };
                    return Some(Err(ArrowError::ExternalError("interrupted (Ctrl-C): the blobhouse statement was stopped".into())));
                }
                Some(Err(ArrowError::ExternalError(interrupt.to_string().into())))
            }
        }
    }
}

impl RecordBatchReader for Reader {
    fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }
}
