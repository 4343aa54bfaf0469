//! Typed errors of the storage layer.
//!
//! Every variant names what failed — the object (as a full URL), the table, or
//! the endpoint — and, where we can tell, what the user should do about it.

use std::fmt;

/// Result alias of the storage layer.
pub type Result<T, E = StorageError> = std::result::Result<T, E>;

/// An error of the storage layer. Displays as one line a user can act on.
#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    /// The database URL could not be understood.
    #[error("invalid database URL '{url}': {reason}")]
    InvalidUrl { url: String, reason: String },

    /// A request to the object store failed.
    #[error("{op} {location} failed: {source}{hint}")]
    Store {
        op: &'static str,
        location: String,
        #[source]
        source: object_store::Error,
        hint: Hint,
    },

    /// An object exists but its content is not what the format says it must be.
    #[error("corrupt object {location}: {reason}. The object may be truncated or was not written by blobhouse; restore it from a snapshot or drop the table")]
    Corrupt { location: String, reason: String },

    /// The URL points at something that is not a blobhouse database.
    #[error("{location} is not a blobhouse database ({reason})")]
    NotADatabase { location: String, reason: String },

    /// The database was written by a newer version of blobhouse.
    #[error("database at {location} has format version {found}, this blobhouse reads versions up to {supported}; upgrade blobhouse")]
    UnsupportedFormat { location: String, found: u32, supported: u32 },

    /// A database version that is not on the store.
    #[error("database {location} has no version {version} (it was never committed, or garbage collection removed it)")]
    VersionNotFound { location: String, version: u64 },

    /// A version older than the garbage-collection horizon.
    #[error("version {version} has expired: VACUUM removed the versions before {horizon} (SHOW VERSIONS lists what is left; snapshots keep versions from expiring)")]
    VersionExpired { version: u64, horizon: u64 },

    /// Time travel to before the oldest version kept.
    #[error("no version was current at {} UTC: the oldest version kept is {oldest} (SHOW VERSIONS lists them)", crate::format::format_ms(*at_ms))]
    NoVersionAt { at_ms: u64, oldest: u64 },

    /// The version's PUT failed in a way that does not tell whether it
    /// landed (a lost response, a timeout).
    #[error("the commit of version {version} may or may not have happened ({cause}); its data was kept — SHOW VERSIONS tells, and VACUUM removes it if it did not")]
    CommitUnknown { version: u64, cause: String },

    /// A fail point made this step fail (fault-injection tests only).
    #[error("injected failure at fail point {0}")]
    Injected(String),

    /// A snapshot name already in use.
    #[error("snapshot '{0}' already exists (SHOW SNAPSHOTS lists them; DROP SNAPSHOT frees the name)")]
    SnapshotExists(String),

    /// No snapshot of that name.
    #[error("snapshot '{0}' does not exist (SHOW SNAPSHOTS lists them)")]
    SnapshotNotFound(String),

    /// A table that the operation needs does not exist.
    #[error("table '{0}' does not exist (SHOW TABLES lists the tables)")]
    TableNotFound(String),

    /// A table of that name already exists.
    #[error("table '{0}' already exists (use CREATE TABLE IF NOT EXISTS, or DROP TABLE first)")]
    TableExists(String),

    /// A concurrent transaction changed what this one depends on.
    #[error("commit conflict on table '{table}': {reason}; the statement had no effect, run it again")]
    Conflict { table: String, reason: String },

    /// Snapshot isolation refused the commit: a concurrent transaction
    /// deleted, updated or rewrote rows this one deletes or updates, and
    /// committed first (SQLSTATE 40001 in PostgreSQL's terms).
    #[error("serialization failure on table '{table}': {reason}; the transaction was rolled back, nothing of it is visible — run it again")]
    Serialization { table: String, reason: String },

    /// The commit kept losing the race for the next database version.
    #[error("could not commit after {attempts} attempts: other writers kept committing first; the statement had no effect, run it again")]
    TooManyRetries { attempts: u32 },

    /// Encoding or decoding Parquet failed.
    #[error("parquet error in {location}: {source}")]
    Parquet {
        location: String,
        #[source]
        source: parquet::errors::ParquetError,
    },

    /// Data given to a writer does not fit the table.
    #[error("{0}")]
    InvalidData(String),
}

/// A remedy appended to a store error, derived from what the store answered.
#[derive(Debug, Default)]
pub struct Hint(pub Option<&'static str>);

impl fmt::Display for Hint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(h) => write!(f, ". Hint: {h}"),
            None => Ok(()),
        }
    }
}

impl Hint {
    /// Guesses a remedy from the text of an object-store error. The store's own
    /// message stays in the error; this only adds the likely fix.
    pub fn for_error(err: &object_store::Error) -> Self {
        // The full chain carries the HTTP status and the S3 error code.
        let mut text = err.to_string();
        let mut src = std::error::Error::source(err);
        while let Some(s) = src {
            text.push(' ');
            text.push_str(&s.to_string());
            src = s.source();
        }
        let t = text.to_ascii_lowercase();
        let any = |needles: &[&str]| needles.iter().any(|n| t.contains(n));
        // Match status lines and S3 error codes, never bare numbers: object
        // names are hex and may contain "403" or "404".
        let hint = if any(&["nosuchbucket", "bucket does not exist"]) {
            Some("the bucket does not exist; create it first or fix the bucket name in the URL")
        } else if any(&["invalidaccesskeyid", "signaturedoesnotmatch", "accessdenied", "access denied", "status 403", "403 forbidden", "invalidtoken", "expiredtoken"]) {
            Some("the store refused the credentials; check AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (or --access-key-id / --secret-access-key)")
        } else if any(&["connection refused", "error sending request", "dns error", "timed out", "connect error", "tcp connect"]) {
            Some("the endpoint did not answer; check AWS_ENDPOINT_URL / --endpoint and that the server is running")
        } else {
            None
        };
        Hint(hint)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn generic(msg: &str) -> object_store::Error {
        object_store::Error::Generic { store: "S3", source: msg.to_string().into() }
    }

    #[test]
    fn hints_follow_status_and_codes_not_digits_in_names() {
        assert!(Hint::for_error(&generic("Client error with status 403 Forbidden: <Code>InvalidAccessKeyId</Code>")).0.unwrap().contains("credentials"));
        assert!(Hint::for_error(&generic("<Code>NoSuchBucket</Code>")).0.unwrap().contains("bucket"));
        assert!(Hint::for_error(&generic("error sending request for url: Connection refused")).0.unwrap().contains("endpoint"));
        // An object named with "403" in it is no credential problem.
        assert!(Hint::for_error(&generic("object objects/a403/0000000000100403.parquet is bad")).0.is_none());
    }
}

impl StorageError {
    /// Wraps an object-store error with the operation and the object's URL.
    pub fn store(op: &'static str, location: impl Into<String>, source: object_store::Error) -> Self {
        let hint = Hint::for_error(&source);
        StorageError::Store { op, location: location.into(), source, hint }
    }

    /// True when the store said the object does not exist.
    pub fn is_not_found(&self) -> bool {
        matches!(self, StorageError::Store { source: object_store::Error::NotFound { .. }, .. })
    }
}
