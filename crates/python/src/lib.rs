//! blobhouse as a Python extension module, `blobhouse._blobhouse`: the
//! engine embedded in the Python process. `python/blobhouse/` builds the
//! public API on it (DB-API 2.0 connections and cursors, relations,
//! conversions to pandas and Polars); this crate is the part that must be
//! native:
//!
//! - [`connection`]: sessions on open engines, statements, transactions,
//!   registered and loaded Python data, parameter binding;
//! - [`answer`]: a statement's rows, streamed batch by batch to Python and
//!   through the Arrow PyCapsule interface;
//! - [`tables`]: Python data (anything with `__arrow_c_stream__`) as
//!   tables statements read;
//! - [`options`]: `connect()`'s keyword arguments as the engine's, store's
//!   and cluster's settings;
//! - [`errors`]: PEP 249's exception classes, chosen by SQLSTATE;
//! - [`runtime`]: the process's tokio runtime; waiting with the GIL
//!   released and Ctrl-C live.
//!
//! Written here rather than taken from a crate because it is the seam
//! between our engine and Python: pyo3 does the bindings and pyo3-arrow
//! the Arrow C interfaces; what a session, a streamed answer or a
//! cancelled statement is, only the engine knows.

mod answer;
mod connection;
mod errors;
mod options;
mod runtime;
mod tables;

use pyo3::prelude::*;

/// The module: its classes, exceptions and version.
#[pymodule]
fn _blobhouse(m: &Bound<'_, PyModule>) -> PyResult<()> {
    // The package's version is the engine's: both come from the workspace.
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_class::<connection::Connection>()?;
    m.add_class::<answer::Answer>()?;
    m.add_function(wrap_pyfunction!(connection::bind, m)?)?;
    errors::register(m)?;
    Ok(())
}
