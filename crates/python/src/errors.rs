//! PEP 249's exception classes, and which one each engine error raises.
//!
//! Every error carries the engine's message — what failed and what to do —
//! and its SQLSTATE as `.sqlstate`, the code the PostgreSQL server sends
//! for the same failure ([`blobhouse_engine::sqlstate`]). The class follows
//! the SQLSTATE's class the way psycopg maps PostgreSQL's, so code written
//! against psycopg catches the same failures here.

use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;

use blobhouse_engine::EngineError;

create_exception!(blobhouse, Warning, PyException, "Important warnings, such as data truncation (PEP 249).");
create_exception!(blobhouse, Error, PyException, "The base of every blobhouse error (PEP 249).");
create_exception!(blobhouse, InterfaceError, Error, "An error of the Python interface rather than the database: a closed connection or cursor, a bad connect() option.");
create_exception!(blobhouse, DatabaseError, Error, "An error of the database.");
create_exception!(blobhouse, DataError, DatabaseError, "A value the data cannot hold: division by zero, a number out of range, a bad date (SQLSTATE class 22).");
create_exception!(blobhouse, OperationalError, DatabaseError, "A failure of the database's operation, not of the statement: the store unreachable, out of memory, a serialization failure to retry (classes 08, 40, 53, 57, 58).");
create_exception!(blobhouse, IntegrityError, DatabaseError, "A constraint broken: a NULL in a NOT NULL column (class 23).");
create_exception!(blobhouse, InternalError, DatabaseError, "The database found itself in a bad state: an aborted transaction, damaged data (classes 25, XX).");
create_exception!(blobhouse, ProgrammingError, DatabaseError, "A mistake in the statement: a syntax error, an unknown table or column, a wrong number of parameters (class 42).");
create_exception!(blobhouse, NotSupportedError, DatabaseError, "A feature blobhouse does not support (class 0A).");

/// Adds the classes to the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("Warning", py.get_type::<Warning>())?;
    m.add("Error", py.get_type::<Error>())?;
    m.add("InterfaceError", py.get_type::<InterfaceError>())?;
    m.add("DatabaseError", py.get_type::<DatabaseError>())?;
    m.add("DataError", py.get_type::<DataError>())?;
    m.add("OperationalError", py.get_type::<OperationalError>())?;
    m.add("IntegrityError", py.get_type::<IntegrityError>())?;
    m.add("InternalError", py.get_type::<InternalError>())?;
    m.add("ProgrammingError", py.get_type::<ProgrammingError>())?;
    m.add("NotSupportedError", py.get_type::<NotSupportedError>())?;
    Ok(())
}

/// The exception an engine error raises, with its message and SQLSTATE.
pub fn engine_error(py: Python<'_>, e: &EngineError) -> PyErr {
    with_sqlstate(py, e.sqlstate(), e.to_string())
}

/// The exception for SQLSTATE `code`, its `.sqlstate` set.
pub fn with_sqlstate(py: Python<'_>, code: &str, message: String) -> PyErr {
    let err = match code.get(..2).unwrap_or("") {
        "08" | "28" | "40" | "53" | "54" | "55" | "57" | "58" | "72" => OperationalError::new_err(message),
        "0A" => NotSupportedError::new_err(message),
        "22" => DataError::new_err(message),
        "23" => IntegrityError::new_err(message),
        "24" | "25" | "2D" | "XX" | "F0" => InternalError::new_err(message),
        "20" | "21" | "26" | "34" | "3D" | "3F" | "42" | "44" => ProgrammingError::new_err(message),
        _ => DatabaseError::new_err(message),
    };
    // A fresh exception object always takes a new attribute.
    let _ = err.value(py).setattr("sqlstate", code);
    err
}
