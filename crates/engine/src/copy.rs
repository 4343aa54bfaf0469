//! `COPY table FROM 'file or URL' [WITH (FORMAT csv|parquet, HEADER b, DELIMITER 'c')]`.
//!
//! DataFusion only knows `COPY … TO`; loading is ours. The statement is parsed
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

/// Parses `sql` if it is a `COPY … FROM` statement; `Ok(None)` for anything else.
pub fn parse_copy_from(sql: &str) -> Result<Option<CopyFrom>, EngineError> {
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
    let Statement::Copy { source, to: false, target, options, legacy_options, .. } = statements.remove(0) else {
        return Ok(None);
    };
    let bad = |message: String| EngineError::Unsupported(format!("COPY … FROM: {message}"));
    let CopySource::Table { table_name, columns } = source else {
        return Err(bad("the target must be a table".into()));
    };
    if !columns.is_empty() {
        return Err(bad("a column list is not supported yet; the source must have all the table's columns in order".into()));
    }
    let CopyTarget::File { filename } = target else {
        return Err(bad("the source must be a quoted file path or URL".into()));
    };
    let lower = filename.to_ascii_lowercase();
    let mut format = if lower.ends_with(".parquet") || lower.ends_with(".pq") { CopyFormat::Parquet } else { CopyFormat::Csv };
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
    let table = table_name.0.last().map(|p| p.to_string()).unwrap_or_default();
    let table = if table.starts_with('"') { table.trim_matches('"').to_string() } else { table.to_ascii_lowercase() };
    Ok(Some(CopyFrom { table, source: filename, format, header, delimiter }))
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
        assert!(parse_copy_from("COPY t FROM 'a.csv' WITH (FORMAT orc)").is_err());
    }
}
