//! The engine's one error type: every failure a statement can meet, from
//! the store, from planning and execution, or from a statement blobhouse
//! refuses — each with the words a user acts on ([`crate::sqlstate`] gives
//! its PostgreSQL code).

use std::path::PathBuf;

use datafusion::common::DataFusionError;

use blobhouse_storage::StorageError;

/// An error of the engine: from the store, from query planning/execution, or
/// from a statement we do not support.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Storage(#[from] StorageError),
    #[error("{}", describe_df(.0))]
    Query(#[from] DataFusionError),
    #[error("COPY {table} FROM '{source_url}' failed: {message}")]
    Copy { table: String, source_url: String, message: String },
    #[error("COPY … TO '{target}' failed: {message}")]
    CopyTo { target: String, message: String },
    /// Files queried in place (`read_parquet`, external tables) could not
    /// be read as asked.
    #[error("files at '{location}': {message}")]
    Files { location: String, message: String },
    #[error("{0}")]
    Unsupported(String),
    /// A statement names a column its table does not have.
    #[error("{context}: the table has no column '{column}' (columns: {columns})")]
    UnknownColumn { context: String, column: String, columns: String },
    #[error("cannot start the download manager: {0} (set EngineOptions::download to None to read through object_store)")]
    DownloadManager(std::io::Error),
    #[error("cannot use spill directory {}: {source} (choose another with --spill-dir)", .dir.display())]
    SpillDir { dir: PathBuf, source: std::io::Error },
    #[error("cannot use the storage node: {0}")]
    Pushdown(#[source] blobhouse_pushdown::PushdownError),
    /// A statement about settings refused: why, and PostgreSQL's words.
    #[error("{message}")]
    Setting { fault: SettingFault, message: String },
    /// A statement other than ROLLBACK (or COMMIT) after a statement of the
    /// same transaction failed — PostgreSQL's rule and words.
    #[error("current transaction is aborted, commands ignored until end of transaction block (ROLLBACK ends it; it failed at: {cause})")]
    TransactionAborted { cause: String },
    /// A statement that breaks a rule of transactions (VACUUM inside one,
    /// SAVEPOINT outside one, a read of a version VACUUM expired …); the
    /// rule says which, and gives the SQLSTATE.
    #[error("{message}")]
    Transaction { rule: TxnRule, message: String },
}

/// Which rule of transactions a statement broke ([`EngineError::Transaction`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TxnRule {
    /// It cannot run inside an open transaction (BEGIN through the API,
    /// VACUUM, CREATE SNAPSHOT of a transaction's changes).
    InProgress,
    /// It needs an open transaction (SAVEPOINT).
    NoTransaction,
    /// The transaction ended under it.
    Ended,
    /// The transaction was aborted by an earlier failed statement; nothing
    /// of it was committed.
    Aborted,
    /// The version it read was expired by a VACUUM while it ran.
    Expired,
}

impl EngineError {
    pub(crate) fn transaction(rule: TxnRule, message: impl Into<String>) -> EngineError {
        EngineError::Transaction { rule, message: message.into() }
    }
}

/// DataFusion wraps our storage errors as "External error: …"; show them plainly.
pub(crate) fn describe_df(e: &DataFusionError) -> String {
    let mut s = e.to_string();
    for prefix in ["External error: ", "Execution error: "] {
        while let Some(rest) = s.strip_prefix(prefix) {
            s = rest.to_string();
        }
    }
    s
}

/// Why a setting statement was refused: PostgreSQL's SQLSTATE for each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SettingFault {
    /// A value the setting does not take (22023).
    Invalid,
    /// No setting has this name (42704).
    Unknown,
    /// A value or form blobhouse cannot honour (0A000).
    Unsupported,
    /// A setting that cannot be changed (55P02).
    ReadOnly,
    /// A schema that does not exist (3F000).
    NoSchema,
}

impl SettingFault {
    /// PostgreSQL's code for it.
    pub fn sqlstate(self) -> &'static str {
        match self {
            SettingFault::Invalid => "22023",
            SettingFault::Unknown => "42704",
            SettingFault::Unsupported => "0A000",
            SettingFault::ReadOnly => "55P02",
            SettingFault::NoSchema => "3F000",
        }
    }
}
