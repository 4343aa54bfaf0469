//! The SQLSTATE of every engine error: the five-character class and code
//! that PostgreSQL clients, retry helpers and DB-API exception classes key
//! on (`40001` makes psycopg, SQLAlchemy, Spring and dbt retry a
//! transaction; `25P02` tells a client to roll back; `42P01` is an
//! unknown table). Every endpoint — the PostgreSQL wire protocol, Flight
//! SQL's gRPC status, the shell, the Python package — derives its code
//! from here, so one error reads the same through every client.
//!
//! The codes are PostgreSQL's (Appendix A of its manual). Where blobhouse
//! has no exact counterpart the closest class is used, never `XX000`
//! (internal error) for a mistake the user can fix.

use datafusion::arrow::error::ArrowError;
use datafusion::common::{DataFusionError, SchemaError};

use blobhouse_storage::StorageError;

use crate::{EngineError, TxnRule};

/// A transaction that may succeed if run again (serialization failure).
pub const SERIALIZATION_FAILURE: &str = "40001";

impl EngineError {
    /// The SQLSTATE PostgreSQL would report for this error.
    pub fn sqlstate(&self) -> &'static str {
        match self {
            EngineError::Storage(e) => storage(e),
            EngineError::Query(e) => query(e),
            EngineError::Copy { .. } => "22P04",
            EngineError::CopyTo { .. } => "58030",
            EngineError::Files { .. } => "58030",
            EngineError::Unsupported(_) => "0A000",
            EngineError::UnknownColumn { .. } => "42703",
            EngineError::DownloadManager(_) | EngineError::SpillDir { .. } => "58000",
            EngineError::Pushdown(_) => "08006",
            EngineError::Setting { fault, .. } => fault.sqlstate(),
            EngineError::TransactionAborted { .. } => "25P02",
            EngineError::Transaction { rule, .. } => rule.sqlstate(),
        }
    }

    /// Whether running the same transaction again may succeed: what retry
    /// helpers look for (SQLSTATE class 40).
    pub fn is_retryable(&self) -> bool {
        self.sqlstate().starts_with("40")
    }
}

impl TxnRule {
    /// The SQLSTATE of breaking this rule.
    pub fn sqlstate(self) -> &'static str {
        match self {
            TxnRule::InProgress => "25001",
            TxnRule::NoTransaction => "25P01",
            TxnRule::Ended => "25000",
            TxnRule::Aborted => "25P02",
            TxnRule::Expired => "72000",
        }
    }
}

fn storage(e: &StorageError) -> &'static str {
    match e {
        StorageError::Conflict { .. } | StorageError::Serialization { .. } | StorageError::TooManyRetries { .. } => SERIALIZATION_FAILURE,
        StorageError::CommitUnknown { .. } => "40003",
        StorageError::TableNotFound(_) => "42P01",
        StorageError::TableExists(_) => "42P07",
        StorageError::SnapshotNotFound(_) => "42704",
        StorageError::SnapshotExists(_) => "42710",
        StorageError::VersionNotFound { .. } | StorageError::NoVersionAt { .. } => "22023",
        StorageError::VersionExpired { .. } => "72000",
        StorageError::InvalidUrl { .. } => "22023",
        // invalid_authorization_specification: the key is missing or wrong.
        StorageError::Keys { .. } => "28000",
        StorageError::Store { .. } => "58030",
        StorageError::Corrupt { .. } | StorageError::Parquet { .. } | StorageError::NotADatabase { .. } => "XX001",
        StorageError::UnsupportedFormat { .. } => "0A000",
        StorageError::InvalidData(_) => "22000",
        StorageError::Injected(_) => "58000",
        // feature_not_supported: a table Iceberg cannot describe.
        StorageError::Iceberg { .. } => "0A000",
    }
}

fn query(e: &DataFusionError) -> &'static str {
    match e {
        // Our own errors travel through DataFusion as external errors
        // (a commit conflict in an INSERT's sink, a download that failed).
        DataFusionError::External(inner) => {
            if let Some(s) = inner.downcast_ref::<StorageError>() {
                return storage(s);
            }
            if let Some(e) = inner.downcast_ref::<EngineError>() {
                return e.sqlstate();
            }
            if let Some(e) = inner.downcast_ref::<DataFusionError>() {
                return query(e);
            }
            if let Some(e) = inner.downcast_ref::<ArrowError>() {
                return arrow(e);
            }
            text(&inner.to_string())
        }
        DataFusionError::Context(_, inner) => query(inner),
        DataFusionError::Diagnostic(_, inner) => query(inner),
        DataFusionError::Shared(inner) => query(inner),
        DataFusionError::Collection(all) => all.first().map_or("XX000", query),
        DataFusionError::SQL(..) => "42601",
        DataFusionError::NotImplemented(_) => "0A000",
        DataFusionError::ResourcesExhausted(_) => "53200",
        DataFusionError::SchemaError(e, _) => match e.as_ref() {
            SchemaError::FieldNotFound { .. } => "42703",
            SchemaError::AmbiguousReference { .. } => "42702",
            SchemaError::DuplicateQualifiedField { .. } | SchemaError::DuplicateUnqualifiedField { .. } => "42701",
        },
        DataFusionError::ArrowError(e, _) => arrow(e),
        DataFusionError::ParquetError(_) => "XX001",
        DataFusionError::ObjectStore(_) | DataFusionError::IoError(_) => "58030",
        DataFusionError::Plan(message) => plan(message),
        DataFusionError::Configuration(message) if message.contains("could not find config namespace") || message.contains("Unrecognized") => "42704",
        DataFusionError::Configuration(_) => "22023",
        DataFusionError::Execution(message) => text(message),
        _ => "XX000",
    }
}

fn arrow(e: &ArrowError) -> &'static str {
    match e {
        ArrowError::DivideByZero => "22012",
        ArrowError::CastError(_) | ArrowError::ParseError(_) => "22P02",
        ArrowError::ArithmeticOverflow(_) => "22003",
        ArrowError::ExternalError(inner) => inner.downcast_ref::<StorageError>().map_or("XX000", storage),
        ArrowError::MemoryError(_) => "53200",
        ArrowError::IoError(..) => "58030",
        ArrowError::CsvError(_) | ArrowError::JsonError(_) => "22P04",
        // A NULL written to a NOT NULL column (arrow's batch check).
        ArrowError::InvalidArgumentError(m) if m.contains("non-nullable") && m.contains("null values") => "23502",
        _ => "XX000",
    }
}

/// A planning error: most are the statement's (a name or type that does
/// not fit), told apart by DataFusion's words.
fn plan(message: &str) -> &'static str {
    let lower = message.to_ascii_lowercase();
    if lower.contains("table") && (lower.contains("not found") || lower.contains("does not exist")) {
        "42P01"
    } else if lower.contains("no field named") || lower.contains("column") && lower.contains("not found") {
        "42703"
    } else if lower.contains("invalid function") || lower.contains("no function matches") || lower.contains("function") && lower.contains("not found") {
        "42883"
    } else if lower.contains("cannot") && lower.contains("coerce") || lower.contains("type") && lower.contains("mismatch") {
        "42804"
    } else {
        "42000"
    }
}

/// An error known only by its text (DataFusion's execution errors, and
/// errors of other crates boxed on their way here).
fn text(message: &str) -> &'static str {
    let lower = message.to_ascii_lowercase();
    if lower.contains("resources exhausted") || lower.contains("memory limit") {
        "53200"
    } else if lower.contains("divide by zero") || lower.contains("division by zero") {
        "22012"
    } else if lower.contains("overflow") {
        "22003"
    } else if lower.contains("cast error") || lower.contains("cannot cast") || lower.contains("invalid input syntax") {
        "22P02"
    } else {
        "XX000"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_carry_postgres_codes() {
        let conflict = EngineError::Storage(StorageError::Serialization { table: "acc".into(), reason: "x".into() });
        assert_eq!(conflict.sqlstate(), "40001");
        assert!(conflict.is_retryable());
        let wrapped = EngineError::Query(DataFusionError::External(Box::new(StorageError::Conflict { table: "t".into(), reason: "r".into() })));
        assert_eq!(wrapped.sqlstate(), "40001");
        let context = EngineError::Query(DataFusionError::Context("insert".into(), Box::new(DataFusionError::External(Box::new(StorageError::TableNotFound("t".into()))))));
        assert_eq!(context.sqlstate(), "42P01");
        assert_eq!(EngineError::Query(DataFusionError::ResourcesExhausted("x".into())).sqlstate(), "53200");
        assert_eq!(EngineError::Query(DataFusionError::Plan("table 'datafusion.public.nope' not found".into())).sqlstate(), "42P01");
        assert_eq!(EngineError::Query(DataFusionError::ArrowError(Box::new(ArrowError::DivideByZero), None)).sqlstate(), "22012");
        let not_null = ArrowError::InvalidArgumentError("Column 'x' is declared as non-nullable but contains null values".into());
        assert_eq!(EngineError::Query(DataFusionError::ArrowError(Box::new(not_null), None)).sqlstate(), "23502");
        assert_eq!(EngineError::Transaction { rule: TxnRule::InProgress, message: String::new() }.sqlstate(), "25001");
        assert_eq!(EngineError::TransactionAborted { cause: String::new() }.sqlstate(), "25P02");
        assert!(!EngineError::Unsupported(String::new()).is_retryable());
        assert_eq!(EngineError::UnknownColumn { context: "UPDATE t".into(), column: "x".into(), columns: "a".into() }.sqlstate(), "42703");
    }
}
