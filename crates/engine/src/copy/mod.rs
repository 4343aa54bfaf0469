//! `COPY table FROM 'file or URL' [WITH (FORMAT csv|parquet|text, HEADER b, DELIMITER 'c')]`
//! and `COPY (query) | table TO 'file or URL' [WITH (FORMAT parquet|csv, …)]`.
//!
//! Loading is ours (DataFusion has no COPY … FROM). Export is ours too,
//! with PostgreSQL's and DuckDB's syntax, because it must read the
//! statement's transaction view and open any store URL the way `--db`
//! does; DataFusion's writers do the writing. The statement is parsed by
//! [`crate::parser`] with sqlparser's COPY grammar, the source is read
//! with DataFusion's CSV or Parquet reader using the *table's* schema (CSV: no
//! inference, so a malformed line is reported with its line number), and the
//! rows are committed in one new table version, or not at all.

mod run;

pub(crate) use run::{copy_from, copy_to};

use datafusion::sql::sqlparser::ast::{CopyLegacyCsvOption, CopyLegacyOption, CopyOption, CopySource, CopyTarget, ObjectName, Query, Statement};

use std::io::BufRead;

use datafusion::arrow::array::{Array, ArrayRef, StringArray};
use datafusion::arrow::compute::{CastOptions, cast_with_options};
use datafusion::arrow::datatypes::{DataType, Field, SchemaRef};
use datafusion::arrow::record_batch::RecordBatch;

use crate::EngineError;

/// File formats COPY reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CopyFormat {
    Csv,
    Parquet,
    /// PostgreSQL's text format (its COPY's default, what `COPY … FROM
    /// STDIN` clients send): tab-separated, `\N` for NULL, backslash
    /// escapes — an empty field is an empty string, not NULL. Read only,
    /// from local files.
    Text,
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
    /// What is exported: a query's rows or a table's.
    pub query: CopyQuery,
    pub target: String,
    pub format: CopyFormat,
    pub header: bool,
    pub delimiter: u8,
}

/// What `COPY … TO` exports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CopyQuery {
    Table(ObjectName),
    Query(Box<Query>),
}

/// A COPY statement, either way.
pub(crate) enum Copy {
    From(CopyFrom),
    To(CopyTo),
}

/// A parsed COPY statement as blobhouse runs it.
pub(crate) fn from_ast(statement: Statement) -> Result<Copy, EngineError> {
    let Statement::Copy { source, to, target, options, legacy_options, .. } = statement else {
        return Err(EngineError::Unsupported(format!("'{statement}' is not a COPY statement")));
    };
    let verb = if to { "TO" } else { "FROM" };
    let bad = |message: String| EngineError::Unsupported(format!("COPY … {verb}: {message}"));
    let query = match (source, to) {
        (CopySource::Table { columns, .. }, _) if !columns.is_empty() => {
            return Err(bad("a column list is not supported; COPY (SELECT columns FROM t) TO … selects columns".into()));
        }
        (CopySource::Table { table_name, .. }, true) => CopyQuery::Table(table_name),
        (CopySource::Query(q), true) => CopyQuery::Query(q),
        (CopySource::Table { table_name, .. }, false) => CopyQuery::Table(table_name),
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
    let (mut explicit_delimiter, mut explicit_header) = (false, false);
    if lower.ends_with(".tbl") {
        header = false;
    }
    for o in options {
        match o {
            CopyOption::Format(f) => {
                format = match f.value.to_ascii_lowercase().as_str() {
                    "csv" => CopyFormat::Csv,
                    "parquet" => CopyFormat::Parquet,
                    "text" if !to => CopyFormat::Text,
                    other => return Err(bad(format!("unknown FORMAT '{other}'; use csv or parquet{}", if to { "" } else { " (or text)" }))),
                }
            }
            CopyOption::Header(h) => {
                header = h;
                explicit_header = true;
            }
            CopyOption::Delimiter(d) => {
                delimiter = ascii(d).map_err(bad)?;
                explicit_delimiter = true;
            }
            other => return Err(bad(format!("option '{other}' is not supported"))),
        }
    }
    for o in legacy_options {
        match o {
            CopyLegacyOption::Csv(csv) => {
                format = CopyFormat::Csv;
                for c in csv {
                    match c {
                        CopyLegacyCsvOption::Header => {
                            header = true;
                            explicit_header = true;
                        }
                        other => return Err(bad(format!("option '{other}' is not supported"))),
                    }
                }
            }
            CopyLegacyOption::Delimiter(d) => {
                delimiter = ascii(d).map_err(bad)?;
                explicit_delimiter = true;
            }
            CopyLegacyOption::Header => {
                header = true;
                explicit_header = true;
            }
            other => return Err(bad(format!("option '{other}' is not supported"))),
        }
    }
    // PostgreSQL's defaults for its own format.
    if format == CopyFormat::Text {
        delimiter = if explicit_delimiter { delimiter } else { b'\t' };
        header = explicit_header && header;
    }
    if to {
        return Ok(Copy::To(CopyTo { query, target: filename, format, header, delimiter }));
    }
    let CopyQuery::Table(name) = query else { unreachable!("COPY … FROM reads into a table") };
    let table = match name.0.last().and_then(|p| p.as_ident()) {
        Some(id) if id.quote_style.is_some() => id.value.clone(),
        Some(id) => id.value.to_ascii_lowercase(),
        None => return Err(bad(format!("'{name}' is not a table name"))),
    };
    Ok(Copy::From(CopyFrom { table, source: filename, format, header, delimiter }))
}

fn ascii(c: char) -> Result<u8, String> {
    u8::try_from(c).ok().filter(u8::is_ascii).ok_or_else(|| format!("DELIMITER must be one ASCII character, not '{c}'"))
}

/// Rows per batch read from a text file.
const TEXT_BATCH_ROWS: usize = 8192;

/// Reads PostgreSQL's text format into batches of `schema` (values are
/// parsed as strings, then cast to the column types). Errors name the
/// line, the column and the value.
pub(crate) struct TextReader<R> {
    lines: std::io::Split<R>,
    schema: SchemaRef,
    delimiter: u8,
    /// Lines read so far (1-based numbers in errors).
    line: u64,
    skip_header: bool,
    done: bool,
}

impl<R: BufRead> TextReader<R> {
    pub(crate) fn new(input: R, schema: SchemaRef, delimiter: u8, header: bool) -> Self {
        TextReader { lines: input.split(b'\n'), schema, delimiter, line: 0, skip_header: header, done: false }
    }

    /// The next batch, `None` at the end of the data (or at PostgreSQL's `\.` end marker).
    pub(crate) fn next_batch(&mut self) -> Result<Option<RecordBatch>, String> {
        let width = self.schema.fields().len();
        if width == 0 {
            return Err("the table has no columns".into());
        }
        let mut columns: Vec<Vec<Option<String>>> = vec![Vec::with_capacity(TEXT_BATCH_ROWS); width];
        // Each row's line number, for errors.
        let mut row_lines: Vec<u64> = Vec::with_capacity(TEXT_BATCH_ROWS);
        while !self.done && columns[0].len() < TEXT_BATCH_ROWS {
            let Some(line) = self.lines.next() else {
                self.done = true;
                break;
            };
            let mut line = line.map_err(|e| format!("line {}: {e}", self.line + 1))?;
            self.line += 1;
            if line.last() == Some(&b'\r') {
                line.pop();
            }
            if std::mem::take(&mut self.skip_header) {
                continue;
            }
            if line == b"\\." {
                self.done = true;
                break;
            }
            let fields = split_text_line(&line, self.delimiter).map_err(|e| format!("line {}: {e}", self.line))?;
            if fields.len() != width {
                return Err(format!("line {}: {} field{} where the table has {width} column{}", self.line, fields.len(), if fields.len() == 1 { "" } else { "s" }, if width == 1 { "" } else { "s" }));
            }
            for (column, value) in columns.iter_mut().zip(fields) {
                column.push(value);
            }
            row_lines.push(self.line);
        }
        if columns[0].is_empty() {
            return Ok(None);
        }
        let mut arrays: Vec<ArrayRef> = Vec::with_capacity(width);
        for (field, values) in self.schema.fields().iter().zip(columns) {
            if matches!(field.data_type(), DataType::Binary | DataType::LargeBinary | DataType::BinaryView) {
                arrays.push(bytea_column(field, &values, &row_lines)?);
                continue;
            }
            let text = StringArray::from(values);
            let options = CastOptions { safe: true, ..Default::default() };
            let typed = cast_with_options(&text, field.data_type(), &options).map_err(|e| format!("column {}: {e}", field.name()))?;
            // A value the cast could not read became NULL: report its line.
            if typed.null_count() > text.null_count()
                && let Some(i) = (0..text.len()).find(|&i| text.is_valid(i) && typed.is_null(i))
            {
                return Err(format!("line {}, column {}: '{}' is not a valid {}", row_lines[i], field.name(), text.value(i), field.data_type()));
            }
            if !field.is_nullable()
                && let Some(i) = (0..typed.len()).find(|&i| typed.is_null(i))
            {
                return Err(format!("line {}, column {}: NULL (\\N) in a NOT NULL column", row_lines[i], field.name()));
            }
            arrays.push(typed);
        }
        RecordBatch::try_new(self.schema.clone(), arrays).map(Some).map_err(|e| e.to_string())
    }
}

/// A BYTEA column of the text format: PostgreSQL's hex form (`\x00ff`),
/// or the bytes as written.
fn bytea_column(field: &Field, values: &[Option<String>], row_lines: &[u64]) -> Result<ArrayRef, String> {
    let mut bytes: Vec<Option<Vec<u8>>> = Vec::with_capacity(values.len());
    for (i, v) in values.iter().enumerate() {
        bytes.push(match v {
            None => None,
            Some(s) => match s.strip_prefix("\\x") {
                Some(hex) => Some(
                    (0..hex.len())
                        .step_by(2)
                        .map(|at| hex.get(at..at + 2).and_then(|h| u8::from_str_radix(h, 16).ok()))
                        .collect::<Option<Vec<u8>>>()
                        .ok_or_else(|| format!("line {}, column {}: '{s}' is not valid hex for a BYTEA", row_lines[i], field.name()))?,
                ),
                None => Some(s.as_bytes().to_vec()),
            },
        });
        if bytes[i].is_none() && !field.is_nullable() {
            return Err(format!("line {}, column {}: NULL (\\N) in a NOT NULL column", row_lines[i], field.name()));
        }
    }
    let array = datafusion::arrow::array::BinaryArray::from_iter(bytes);
    cast_with_options(&array, field.data_type(), &CastOptions::default()).map_err(|e| format!("column {}: {e}", field.name()))
}

/// One line of the text format: its fields, `None` for `\N`.
fn split_text_line(line: &[u8], delimiter: u8) -> Result<Vec<Option<String>>, String> {
    let mut fields = Vec::new();
    let mut field: Vec<u8> = Vec::new();
    // `\N` only as a whole field.
    let mut null = false;
    let mut i = 0;
    let finish = |field: &mut Vec<u8>, null: &mut bool| -> Result<Option<String>, String> {
        let value = if std::mem::take(null) && field.is_empty() { None } else { Some(String::from_utf8(std::mem::take(field)).map_err(|_| "not valid UTF-8".to_string())?) };
        Ok(value)
    };
    while i < line.len() {
        let b = line[i];
        i += 1;
        if b == delimiter {
            fields.push(finish(&mut field, &mut null)?);
            continue;
        }
        if b != b'\\' {
            field.push(b);
            continue;
        }
        let Some(&e) = line.get(i) else { return Err("a backslash ends the line".into()) };
        i += 1;
        match e {
            b'N' if field.is_empty() && line.get(i).is_none_or(|&n| n == delimiter) => null = true,
            b'b' => field.push(8),
            b'f' => field.push(12),
            b'n' => field.push(b'\n'),
            b'r' => field.push(b'\r'),
            b't' => field.push(b'\t'),
            b'v' => field.push(11),
            b'0'..=b'7' => {
                let mut v = u32::from(e - b'0');
                for _ in 0..2 {
                    match line.get(i) {
                        Some(&d @ b'0'..=b'7') => {
                            v = v * 8 + u32::from(d - b'0');
                            i += 1;
                        }
                        _ => break,
                    }
                }
                field.push((v & 0xff) as u8);
            }
            b'x' if line.get(i).is_some_and(u8::is_ascii_hexdigit) => {
                let mut v = 0u8;
                for _ in 0..2 {
                    match line.get(i).and_then(|d| (*d as char).to_digit(16)) {
                        Some(d) => {
                            v = v * 16 + d as u8;
                            i += 1;
                        }
                        None => break,
                    }
                }
                field.push(v);
            }
            other => field.push(other),
        }
    }
    fields.push(finish(&mut field, &mut null)?);
    Ok(fields)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_copy_from(sql: &str) -> Result<Option<CopyFrom>, EngineError> {
        match crate::parser::parse(sql, "generic", 50)?.statement {
            crate::parser::Statement::CopyFrom(c) => Ok(Some(c)),
            _ => Ok(None),
        }
    }

    fn parse_copy_to(sql: &str) -> Result<Option<CopyTo>, EngineError> {
        match crate::parser::parse(sql, "generic", 50)?.statement {
            crate::parser::Statement::CopyTo(c) => Ok(Some(c)),
            _ => Ok(None),
        }
    }

    #[test]
    fn parses_options_and_defaults() {
        let c = parse_copy_from("COPY t FROM '/x/y.csv' WITH (FORMAT csv, HEADER false, DELIMITER '|')").unwrap().unwrap();
        assert_eq!(c, CopyFrom { table: "t".into(), source: "/x/y.csv".into(), format: CopyFormat::Csv, header: false, delimiter: b'|' });
        let p = parse_copy_from("copy Lineitem from 's3://b/l.parquet'").unwrap().unwrap();
        assert_eq!((p.table.as_str(), p.format), ("lineitem", CopyFormat::Parquet));
        assert!(parse_copy_from("SELECT 1").unwrap().is_none());
        assert!(parse_copy_from("COPY t TO 'out.csv'").unwrap().is_none());
        let t = parse_copy_to("COPY (SELECT a FROM t WHERE a > 1) TO 's3://b/x' WITH (FORMAT csv, HEADER false)").unwrap().unwrap();
        assert!(matches!(&t.query, CopyQuery::Query(q) if q.to_string() == "SELECT a FROM t WHERE a > 1"));
        assert_eq!((t.target.as_str(), t.format, t.header), ("s3://b/x", CopyFormat::Csv, false));
        let t = parse_copy_to("COPY t TO '/tmp/t.out'").unwrap().unwrap();
        assert!(matches!(&t.query, CopyQuery::Table(n) if n.to_string() == "t"));
        assert_eq!(t.format, CopyFormat::Parquet);
        assert!(parse_copy_from("COPY t FROM 'a.csv' WITH (FORMAT orc)").is_err());
    }

    #[test]
    fn text_format_unescapes_and_tells_null_from_empty() {
        let f = split_text_line(b"1\t\\N\t\ta\\tb\\\\c\\n\t\\101\\x42\tN\\N", b'\t').unwrap();
        let want = [Some("1"), None, Some(""), Some("a\tb\\c\n"), Some("AB"), Some("NN")];
        assert_eq!(f, want.iter().map(|v| v.map(String::from)).collect::<Vec<_>>());
        assert!(split_text_line(b"a\\", b'\t').is_err());
        let c = parse_copy_from("COPY t FROM '/x/data' WITH (FORMAT text)").unwrap().unwrap();
        assert_eq!((c.delimiter, c.header), (b'\t', false));
        assert!(parse_copy_to("COPY t TO '/x/out' WITH (FORMAT text)").is_err());
    }

    #[test]
    fn text_reader_casts_to_the_table_and_names_the_bad_line() {
        use datafusion::arrow::datatypes::{DataType, Field, Schema};
        use std::sync::Arc;
        let schema = Arc::new(Schema::new(vec![Field::new("id", DataType::Int32, false), Field::new("price", DataType::Decimal128(10, 2), true)]));
        let data = "id\tprice\n1\t2.50\n2\t\\N\n\\.\nignored\n";
        let mut r = TextReader::new(data.as_bytes(), schema.clone(), b'\t', true);
        let batch = r.next_batch().unwrap().unwrap();
        assert_eq!((batch.num_rows(), batch.column(1).null_count()), (2, 1));
        assert!(r.next_batch().unwrap().is_none());
        let mut bad = TextReader::new("1\t2\n2\tabc\n".as_bytes(), schema.clone(), b'\t', false);
        let e = bad.next_batch().unwrap_err();
        assert!(e.contains("line 2") && e.contains("price") && e.contains("'abc'"), "{e}");
        let mut short = TextReader::new("1\n".as_bytes(), schema.clone(), b'\t', false);
        assert!(short.next_batch().unwrap_err().contains("1 field where the table has 2 columns"));
        let mut null = TextReader::new("\\N\t1\n".as_bytes(), schema, b'\t', false);
        assert!(null.next_batch().unwrap_err().contains("NOT NULL"));
    }
}
