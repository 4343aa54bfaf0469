//! `COPY table FROM 'file or URL' [WITH (FORMAT csv|parquet, HEADER b, DELIMITER 'c')]`
//! and `COPY (query) | table TO 'file or URL' [WITH (FORMAT parquet|csv, …)]`.
//!
//! Loading is ours (DataFusion has no COPY … FROM). Export is ours too,
//! with PostgreSQL's and DuckDB's syntax, because it must read the
//! statement's transaction view and open any store URL the way `--db`
//! does; DataFusion's writers do the writing. The statement is parsed
//! with sqlparser's PostgreSQL dialect (its COPY grammar), the source is read
//! with DataFusion's CSV or Parquet reader using the *table's* schema (CSV: no
//! inference, so a malformed line is reported with its line number), and the
//! rows are committed in one new table version, or not at all.

use datafusion::sql::sqlparser::ast::{CopyLegacyCsvOption, CopyLegacyOption, CopyOption, CopySource, CopyTarget, Statement};
use datafusion::sql::sqlparser::dialect::PostgreSqlDialect;
use datafusion::sql::sqlparser::parser::Parser;

use crate::EngineError;

/// File formats COPY reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CopyFormat {
    Csv,
    Parquet,
}

/// A parsed `COPY … FROM` statement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CopyFrom {
    pub table: String,
    pub source: String,
    pub format: CopyFormat,
    pub header: bool,
    pub delimiter: u8,
}

/// A parsed `COPY … TO` statement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CopyTo {
    /// The query whose rows are exported (a table becomes `SELECT * FROM` it).
    pub query: String,
    pub target: String,
    pub format: CopyFormat,
    pub header: bool,
    pub delimiter: u8,
}

/// Parses `sql` if it is a `COPY … FROM` statement; `Ok(None)` for anything else.
pub fn parse_copy_from(sql: &str) -> Result<Option<CopyFrom>, EngineError> {
    match parse_copy(sql)? {
        Some(Copy::From(c)) => Ok(Some(c)),
        _ => Ok(None),
    }
}

/// Parses `sql` if it is a `COPY … TO` statement; `Ok(None)` for anything else.
pub fn parse_copy_to(sql: &str) -> Result<Option<CopyTo>, EngineError> {
    match parse_copy(sql)? {
        Some(Copy::To(c)) => Ok(Some(c)),
        _ => Ok(None),
    }
}

enum Copy {
    From(CopyFrom),
    To(CopyTo),
}

fn parse_copy(sql: &str) -> Result<Option<Copy>, EngineError> {
    let trimmed = sql.trim_start();
    if trimmed.len() < 4 || !trimmed[..4].eq_ignore_ascii_case("copy") {
        return Ok(None);
    }
    let Ok(mut statements) = Parser::parse_sql(&PostgreSqlDialect {}, sql) else {
        // Not our grammar (e.g. DataFusion's COPY … TO options): leave it to DataFusion.
        return Ok(None);
    };
    if statements.len() != 1 {
        return Ok(None);
    }
    let Statement::Copy { source, to, target, options, legacy_options, .. } = statements.remove(0) else {
        return Ok(None);
    };
    let verb = if to { "TO" } else { "FROM" };
    let bad = |message: String| EngineError::Unsupported(format!("COPY … {verb}: {message}"));
    let query = match (source, to) {
        (CopySource::Table { columns, .. }, _) if !columns.is_empty() => {
            return Err(bad("a column list is not supported; COPY (SELECT columns FROM t) TO … selects columns".into()));
        }
        (CopySource::Table { table_name, .. }, true) => format!("SELECT * FROM {table_name}"),
        (CopySource::Query(q), true) => q.to_string(),
        (CopySource::Table { table_name, .. }, false) => table_name.to_string(),
        (CopySource::Query(_), false) => return Err(bad("the target must be a table".into())),
    };
    let CopyTarget::File { filename } = target else {
        return Err(bad("the file must be a quoted path or URL".into()));
    };
    let lower = filename.to_ascii_lowercase();
    let csv_name = lower.ends_with(".csv") || lower.ends_with(".tbl") || lower.ends_with(".txt");
    let parquet_name = lower.ends_with(".parquet") || lower.ends_with(".pq");
    // Reading guesses CSV, exporting Parquet (the format that keeps types).
    let mut format = if parquet_name || (to && !csv_name) { CopyFormat::Parquet } else { CopyFormat::Csv };
    let mut header = true;
    let mut delimiter = if lower.ends_with(".tbl") { b'|' } else { b',' };
    if lower.ends_with(".tbl") {
        header = false;
    }
    for o in options {
        match o {
            CopyOption::Format(f) => {
                format = match f.value.to_ascii_lowercase().as_str() {
                    "csv" => CopyFormat::Csv,
                    "parquet" => CopyFormat::Parquet,
                    other => return Err(bad(format!("unknown FORMAT '{other}'; use csv or parquet"))),
                }
            }
            CopyOption::Header(h) => header = h,
            CopyOption::Delimiter(d) => delimiter = ascii(d).map_err(bad)?,
            other => return Err(bad(format!("option '{other}' is not supported"))),
        }
    }
    for o in legacy_options {
        match o {
            CopyLegacyOption::Csv(csv) => {
                format = CopyFormat::Csv;
                for c in csv {
                    match c {
                        CopyLegacyCsvOption::Header => header = true,
                        other => return Err(bad(format!("option '{other}' is not supported"))),
                    }
                }
            }
            CopyLegacyOption::Delimiter(d) => delimiter = ascii(d).map_err(bad)?,
            CopyLegacyOption::Header => header = true,
            other => return Err(bad(format!("option '{other}' is not supported"))),
        }
    }
    if to {
        return Ok(Some(Copy::To(CopyTo { query, target: filename, format, header, delimiter })));
    }
    let table = query.rsplit('.').next().unwrap_or_default().to_string();
    let table = if table.starts_with('"') { table.trim_matches('"').to_string() } else { table.to_ascii_lowercase() };
    Ok(Some(Copy::From(CopyFrom { table, source: filename, format, header, delimiter })))
}

fn ascii(c: char) -> Result<u8, String> {
    u8::try_from(c).ok().filter(u8::is_ascii).ok_or_else(|| format!("DELIMITER must be one ASCII character, not '{c}'"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_options_and_defaults() {
        let c = parse_copy_from("COPY t FROM '/x/y.csv' WITH (FORMAT csv, HEADER false, DELIMITER '|')").unwrap().unwrap();
        assert_eq!(c, CopyFrom { table: "t".into(), source: "/x/y.csv".into(), format: CopyFormat::Csv, header: false, delimiter: b'|' });
        let p = parse_copy_from("copy Lineitem from 's3://b/l.parquet'").unwrap().unwrap();
        assert_eq!((p.table.as_str(), p.format), ("lineitem", CopyFormat::Parquet));
        assert!(parse_copy_from("SELECT 1").unwrap().is_none());
        assert!(parse_copy_from("COPY t TO 'out.csv'").unwrap().is_none());
        let t = parse_copy_to("COPY (SELECT a FROM t WHERE a > 1) TO 's3://b/x' WITH (FORMAT csv, HEADER false)").unwrap().unwrap();
        assert_eq!((t.query.as_str(), t.target.as_str(), t.format, t.header), ("SELECT a FROM t WHERE a > 1", "s3://b/x", CopyFormat::Csv, false));
        let t = parse_copy_to("COPY t TO '/tmp/t.out'").unwrap().unwrap();
        assert_eq!((t.query.as_str(), t.format), ("SELECT * FROM t", CopyFormat::Parquet));
        assert!(parse_copy_from("COPY t FROM 'a.csv' WITH (FORMAT orc)").is_err());
    }
}
