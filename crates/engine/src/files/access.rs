//! Which files outside the database a session may read or write:
//! `read_parquet`/`read_csv`, external tables, `COPY … FROM` and
//! `COPY … TO`. An embedded engine (the shell, the Python package) may
//! reach anything its process can; a server's clients are other people,
//! and the server's files (its configuration, its cloud credentials, its
//! users' home directories) and buckets are not theirs — `blobhouse serve`
//! lets them reach only the locations its `--allow-files` names (as
//! PostgreSQL keeps server files to `pg_read_server_files`, and DuckDB has
//! `enable_external_access`).
//!
//! The rule is a list of location prefixes, compared as normalised URLs
//! (`/data/x` is `file:///data/x`) on `/` boundaries; a location with a
//! `..` segment is refused under a list (it could climb out of a prefix).
//! It lives in the session's DataFusion configuration, so every statement
//! context of the session carries it.

use datafusion::prelude::SessionConfig;

use crate::EngineError;

/// Where a session's statements may read and write files in place.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FileAccess {
    /// `None`: anywhere the process can reach. Otherwise the normalised
    /// prefixes, each ending in `/` unless it names one file.
    only: Option<Vec<String>>,
}

impl FileAccess {
    /// Anywhere the process can reach (the default).
    pub fn anywhere() -> FileAccess {
        FileAccess { only: None }
    }

    /// Only under these directories, buckets or bucket prefixes (none:
    /// nowhere).
    pub fn only<S: AsRef<str>>(prefixes: impl IntoIterator<Item = S>) -> FileAccess {
        FileAccess { only: Some(prefixes.into_iter().map(|p| directory(p.as_ref())).collect()) }
    }

    /// The same rule, also allowing `prefix` (a server's own spool directory).
    pub fn and(mut self, prefix: &str) -> FileAccess {
        if let Some(only) = self.only.as_mut() {
            only.push(directory(prefix));
        }
        self
    }

    /// Whether `location` (a path, URL or glob) may be reached.
    pub fn allows(&self, location: &str) -> bool {
        let Some(only) = &self.only else { return true };
        let location = normalise(location);
        if location.split('/').any(|s| s == "..") {
            return false;
        }
        only.iter().any(|p| location == p.trim_end_matches('/') || location.starts_with(p.as_str()))
    }

    /// Fails, naming the location and what to do, unless it may be reached.
    pub(crate) fn check(&self, location: &str) -> Result<(), EngineError> {
        if self.allows(location) {
            return Ok(());
        }
        let allowed = self.only.as_deref().unwrap_or_default();
        Err(EngineError::Files {
            location: location.to_string(),
            message: if allowed.is_empty() {
                "this server reads and writes no files outside its database for clients; its operator allows locations with `blobhouse serve --allow-files <prefix>`".into()
            } else {
                format!("outside the locations this server allows ({}); its operator allows more with `blobhouse serve --allow-files <prefix>`", allowed.join(", "))
            },
        })
    }

    /// The rule a statement's configuration carries (anywhere when none
    /// was set).
    pub(crate) fn of(config: &SessionConfig) -> FileAccess {
        config.get_extension::<FileAccess>().map(|a| a.as_ref().clone()).unwrap_or_default()
    }
}

/// A prefix as a directory: normalised, ending in `/`.
fn directory(prefix: &str) -> String {
    let p = normalise(prefix);
    if p.ends_with('/') { p } else { format!("{p}/") }
}

/// `location` as a URL: paths become absolute `file://` URLs; a location
/// that names a directory keeps its trailing `/`.
fn normalise(location: &str) -> String {
    if location.contains("://") {
        return location.to_string();
    }
    let absolute = std::path::absolute(location).map(|p| p.to_string_lossy().to_string()).unwrap_or_else(|_| location.to_string());
    let slash = if location.ends_with('/') && !absolute.ends_with('/') { "/" } else { "" };
    format!("file://{absolute}{slash}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_list_allows_what_is_under_it_and_nothing_else() {
        assert!(FileAccess::anywhere().allows("/etc/passwd"));
        let none = FileAccess::only(Vec::<String>::new());
        assert!(!none.allows("/tmp/x.csv") && !none.allows("s3://b/x"));
        let some = FileAccess::only(["s3://lake/sales", "/data/"]).and("/tmp/spool-1");
        for ok in ["s3://lake/sales/year=2024/x.parquet", "s3://lake/sales/*.parquet", "/data/t.csv", "file:///data/t.csv", "/tmp/spool-1/a.txt", "/data/"] {
            assert!(some.allows(ok), "{ok}");
        }
        for refused in ["s3://lake/salesman/x", "s3://lake/", "/database/x", "/data/../etc/passwd", "/tmp/spool-2/a.txt", "gs://lake/sales/x"] {
            assert!(!some.allows(refused), "{refused}");
        }
        let e = some.check("/etc/passwd").unwrap_err().to_string();
        assert!(e.contains("/etc/passwd") && e.contains("--allow-files") && e.contains("s3://lake/sales/"), "{e}");
        assert!(none.check("/etc/passwd").unwrap_err().to_string().contains("no files outside its database"));
    }
}
