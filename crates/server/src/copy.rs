//! `COPY table FROM STDIN`: the rows come over the connection (psql's
//! `\copy`, psycopg's `cursor.copy()`), not from a file the server reads.
//!
//! The data is spooled to a temporary file as it arrives, then loaded by
//! the engine's own `COPY … FROM 'file'` in the connection's session — so
//! it joins an open transaction, is parsed as the engine parses files
//! (PostgreSQL's text format by default, or CSV), and its errors name the
//! line. Nothing is committed until the client's CopyDone; a CopyFail or a
//! dropped connection leaves the table as it was.

use std::io::Write;

use datafusion::sql::sqlparser::ast::{CopyLegacyCsvOption, CopyLegacyOption, CopyOption, CopySource, CopyTarget, Ident, Statement};
use datafusion::sql::sqlparser::dialect::PostgreSqlDialect;
use datafusion::sql::sqlparser::parser::Parser;

/// A `COPY … FROM STDIN` statement, before its data.
#[derive(Debug)]
pub(crate) struct CopyIn {
    statement: Statement,
    /// The target table as written.
    pub(crate) table: String,
}

impl CopyIn {
    fn options(&self) -> (&[CopyOption], &[CopyLegacyOption]) {
        match &self.statement {
            Statement::Copy { options, legacy_options, .. } => (options, legacy_options),
            _ => (&[], &[]),
        }
    }

    /// Whether the statement names its format (else PostgreSQL's text).
    fn names_format(&self) -> bool {
        let (options, legacy) = self.options();
        options.iter().any(|o| matches!(o, CopyOption::Format(_))) || legacy.iter().any(|o| matches!(o, CopyLegacyOption::Csv(_) | CopyLegacyOption::Binary))
    }

    fn is_csv(&self) -> bool {
        let (options, legacy) = self.options();
        options.iter().any(|o| matches!(o, CopyOption::Format(f) if f.value.eq_ignore_ascii_case("csv"))) || legacy.iter().any(|o| matches!(o, CopyLegacyOption::Csv(_)))
    }
}

/// `Some` when `sql` is `COPY … FROM STDIN`.
pub(crate) fn parse(sql: &str) -> Option<CopyIn> {
    let trimmed = sql.trim_start();
    if trimmed.len() < 4 || !trimmed[..4].eq_ignore_ascii_case("copy") {
        return None;
    }
    let mut statements = Parser::parse_sql(&PostgreSqlDialect {}, sql).ok()?;
    if statements.len() != 1 {
        return None;
    }
    let statement = statements.remove(0);
    let Statement::Copy { source: CopySource::Table { table_name, .. }, to: false, target: CopyTarget::Stdin, .. } = &statement else { return None };
    let table = table_name.to_string();
    Some(CopyIn { statement, table })
}

/// The data of a `COPY … FROM STDIN` as it arrives.
pub(crate) struct Spool {
    copy: CopyIn,
    file: tempfile::NamedTempFile,
    bytes: u64,
}

impl Spool {
    /// A spool in `dir` (the connection's own spool directory).
    pub(crate) fn new(copy: CopyIn, dir: &std::path::Path) -> std::io::Result<Spool> {
        // The engine's CSV reader wants the extension.
        let suffix = if copy.is_csv() { ".csv" } else { ".txt" };
        Ok(Spool { copy, file: tempfile::Builder::new().prefix("blobhouse-copy-").suffix(suffix).tempfile_in(dir)?, bytes: 0 })
    }

    /// `message` (an error of the load) as the client knows the source: STDIN, not the spool.
    pub(crate) fn unspool(&self, message: &str) -> String {
        message.replace(&format!("'{}'", self.file.path().display()), "STDIN").replace(&format!("file://{}", self.file.path().display()), "STDIN").replace(&self.file.path().display().to_string(), "STDIN")
    }

    pub(crate) fn write(&mut self, data: &[u8]) -> std::io::Result<()> {
        self.bytes += data.len() as u64;
        self.file.write_all(data)
    }

    /// The engine statement that loads the spooled data: the client's
    /// statement reading the spool file, with PostgreSQL's defaults where
    /// it names none: the text format, no header line. CSV is first
    /// rewritten into the text format by PostgreSQL's CSV rules
    /// ([`csv_to_text`]). The spool lives as long as `self`.
    pub(crate) fn statement(&mut self) -> std::io::Result<String> {
        self.file.flush()?;
        self.drop_end_marker()?;
        if self.copy.is_csv() {
            return self.csv_statement();
        }
        let Statement::Copy { source, to, options, legacy_options, values, .. } = &self.copy.statement else {
            unreachable!("a CopyIn holds a COPY statement")
        };
        let mut options = options.clone();
        if !self.copy.names_format() {
            options.push(CopyOption::Format(Ident::new("text")));
        }
        // PostgreSQL's default, which the engine's (a header, for files) is not.
        let names_header = options.iter().any(|o| matches!(o, CopyOption::Header(_))) || legacy_options.iter().any(|o| matches!(o, CopyLegacyOption::Header) || matches!(o, CopyLegacyOption::Csv(c) if c.iter().any(|c| matches!(c, CopyLegacyCsvOption::Header))));
        if !names_header {
            options.push(CopyOption::Header(false));
        }
        let statement = Statement::Copy {
            source: source.clone(),
            to: *to,
            target: CopyTarget::File { filename: self.file.path().display().to_string() },
            options,
            legacy_options: legacy_options.clone(),
            values: values.clone(),
        };
        Ok(statement.to_string())
    }

    /// The CSV spool rewritten into the text format (the same file, so
    /// error messages name it as before), and the statement loading that.
    fn csv_statement(&mut self) -> std::io::Result<String> {
        let Statement::Copy { source, to, options, legacy_options, values, .. } = &self.copy.statement else {
            unreachable!("a CopyIn holds a COPY statement")
        };
        let mut csv = CsvRules::default();
        let mut kept = Vec::new();
        for o in options {
            match o {
                CopyOption::Format(_) => {}
                CopyOption::Delimiter(c) => csv.delimiter = *c as u8,
                CopyOption::Quote(c) => csv.quote = *c as u8,
                CopyOption::Escape(c) => csv.escape = Some(*c as u8),
                CopyOption::Null(n) => csv.null = n.clone(),
                CopyOption::Header(h) => csv.header = *h,
                other => kept.push(other.clone()),
            }
        }
        for o in legacy_options {
            match o {
                CopyLegacyOption::Delimiter(c) => csv.delimiter = *c as u8,
                CopyLegacyOption::Header => csv.header = true,
                CopyLegacyOption::Csv(list) => {
                    for c in list {
                        match c {
                            CopyLegacyCsvOption::Header => csv.header = true,
                            CopyLegacyCsvOption::Quote(q) => csv.quote = *q as u8,
                            CopyLegacyCsvOption::Escape(e) => csv.escape = Some(*e as u8),
                            other => return Err(std::io::Error::other(format!("COPY option '{other}' is not supported"))),
                        }
                    }
                }
                CopyLegacyOption::Null(n) => csv.null = n.clone(),
                other => return Err(std::io::Error::other(format!("COPY option '{other}' is not supported"))),
            }
        }
        let dir = self.file.path().parent().unwrap_or(std::path::Path::new("."));
        let mut text = tempfile::Builder::new().prefix("blobhouse-copy-").suffix(".txt").tempfile_in(dir)?;
        {
            let input = std::io::BufReader::new(self.file.reopen()?);
            let mut out = std::io::BufWriter::new(text.as_file_mut());
            csv_to_text(input, &mut out, &csv).map_err(std::io::Error::other)?;
            out.flush()?;
        }
        // The text file takes the spool's place (and name, for messages).
        std::fs::rename(text.path(), self.file.path())?;
        kept.push(CopyOption::Format(Ident::new("text")));
        // The header line, if any, was kept: line numbers stay the CSV's.
        kept.push(CopyOption::Header(csv.header));
        let statement = Statement::Copy {
            source: source.clone(),
            to: *to,
            target: CopyTarget::File { filename: self.file.path().display().to_string() },
            options: kept,
            legacy_options: Vec::new(),
            values: values.clone(),
        };
        Ok(statement.to_string())
    }

    /// Removes PostgreSQL's end-of-data line (`\.`), which some clients
    /// (psql reading a script) send as data; it ends the data in every format.
    fn drop_end_marker(&mut self) -> std::io::Result<()> {
        use std::io::{Read, Seek, SeekFrom};
        let len = self.file.as_file().metadata()?.len();
        // The longest marker with the byte before it.
        let mut tail = vec![0; len.min(5) as usize];
        let mut f = self.file.reopen()?;
        f.seek(SeekFrom::Start(len - tail.len() as u64))?;
        f.read_exact(&mut tail)?;
        let Some(marker) = [&b"\\.\r\n"[..], b"\\.\n", b"\\."].into_iter().find(|m| tail.ends_with(m)) else { return Ok(()) };
        let keep = len - marker.len() as u64;
        // Only a line of its own: at the start, or after a newline.
        if keep == 0 || tail[tail.len() - marker.len() - 1] == b'\n' {
            self.file.as_file().set_len(keep)?;
        }
        Ok(())
    }

    pub(crate) fn bytes(&self) -> u64 {
        self.bytes
    }
}

/// PostgreSQL's CSV options (its defaults: comma, double quote, the
/// quote as its own escape, an unquoted empty field as NULL).
#[derive(Debug, Clone)]
pub(crate) struct CsvRules {
    pub(crate) delimiter: u8,
    pub(crate) quote: u8,
    /// `None`: the quote character.
    pub(crate) escape: Option<u8>,
    /// The unquoted text that is NULL.
    pub(crate) null: String,
    pub(crate) header: bool,
}

impl Default for CsvRules {
    fn default() -> Self {
        CsvRules { delimiter: b',', quote: b'"', escape: None, null: String::new(), header: false }
    }
}

/// Rewrites CSV into PostgreSQL's text format, one record a line, by
/// PostgreSQL's CSV rules — which a general CSV reader does not follow:
/// an unquoted field equal to the NULL string (by default empty) is NULL,
/// a quoted one never is (`""` is the empty string); quoted fields may
/// hold delimiters, quotes (doubled, or after ESCAPE) and line breaks.
/// Values are then typed by the text reader (`t`/`f` are booleans there).
pub(crate) fn csv_to_text(input: impl std::io::BufRead, out: &mut impl Write, rules: &CsvRules) -> Result<(), String> {
    let escape = rules.escape.unwrap_or(rules.quote);
    let mut record: Vec<Option<Vec<u8>>> = Vec::new();
    let mut field: Vec<u8> = Vec::new();
    let mut quoted = false;
    let (mut in_quotes, mut line, mut started) = (false, 1u64, false);
    let write_err = |e: std::io::Error| format!("writing the converted data: {e}");
    let finish_field = |field: &mut Vec<u8>, quoted: &mut bool, record: &mut Vec<Option<Vec<u8>>>| {
        let value = std::mem::take(field);
        let is_null = !*quoted && value == rules.null.as_bytes();
        record.push(if is_null { None } else { Some(value) });
        *quoted = false;
    };
    let mut bytes = input.bytes().peekable();
    while let Some(b) = bytes.next() {
        let b = b.map_err(|e| format!("line {line}: {e}"))?;
        if in_quotes {
            if b == escape && bytes.peek().is_some_and(|n| n.as_ref().is_ok_and(|n| *n == rules.quote || (escape != rules.quote && *n == escape))) {
                let next = bytes.next().expect("peeked").map_err(|e| format!("line {line}: {e}"))?;
                field.push(next);
            } else if b == rules.quote {
                in_quotes = false;
            } else {
                if b == b'\n' {
                    line += 1;
                }
                field.push(b);
            }
            continue;
        }
        started = true;
        match b {
            _ if b == rules.quote => {
                in_quotes = true;
                quoted = true;
            }
            _ if b == rules.delimiter => finish_field(&mut field, &mut quoted, &mut record),
            b'\r' if bytes.peek().is_some_and(|n| n.as_ref().is_ok_and(|n| *n == b'\n')) => {}
            b'\n' | b'\r' => {
                finish_field(&mut field, &mut quoted, &mut record);
                write_record(out, &record).map_err(write_err)?;
                record.clear();
                line += 1;
                started = false;
            }
            _ => field.push(b),
        }
    }
    if in_quotes {
        return Err(format!("line {line}: unterminated CSV quoted field"));
    }
    if started {
        finish_field(&mut field, &mut quoted, &mut record);
        write_record(out, &record).map_err(write_err)?;
    }
    Ok(())
}

/// One record in PostgreSQL's text format: tab-separated, `\N` for NULL,
/// backslash escapes.
fn write_record(out: &mut impl Write, record: &[Option<Vec<u8>>]) -> std::io::Result<()> {
    for (i, value) in record.iter().enumerate() {
        if i > 0 {
            out.write_all(b"\t")?;
        }
        match value {
            None => out.write_all(b"\\N")?,
            Some(v) => {
                for &b in v {
                    match b {
                        b'\\' => out.write_all(b"\\\\")?,
                        b'\t' => out.write_all(b"\\t")?,
                        b'\n' => out.write_all(b"\\n")?,
                        b'\r' => out.write_all(b"\\r")?,
                        _ => out.write_all(&[b])?,
                    }
                }
            }
        }
    }
    out.write_all(b"\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spool(copy: CopyIn) -> std::io::Result<Spool> {
        Spool::new(copy, &std::env::temp_dir())
    }

    #[test]
    fn stdin_copies_load_their_spool_in_the_format_they_name() {
        assert!(parse("COPY t FROM '/data/x.csv'").is_none());
        assert!(parse("COPY t TO STDOUT").is_none());
        assert!(parse("SELECT 1").is_none());
        let mut text = spool(parse("copy t from stdin").expect("a stdin copy")).expect("a spool");
        text.write(b"1\tone\n").expect("written");
        let sql = text.statement().expect("flushed");
        assert!(sql.contains(&text.file.path().display().to_string()) && sql.to_ascii_lowercase().contains("format text"), "{sql}");
        assert_eq!(std::fs::read(text.file.path()).expect("spooled"), b"1\tone\n");
        // CSV is rewritten into the text format by PostgreSQL's CSV rules,
        // in the same file (its header line kept, so line numbers stay).
        let mut csv = spool(parse("COPY t FROM STDIN WITH (FORMAT csv, HEADER true)").expect("a stdin copy")).expect("a spool");
        csv.write(b"id,name\n1,\"a,b\"\n").expect("written");
        let sql = csv.statement().expect("flushed").to_ascii_lowercase();
        assert!(sql.contains("format text") && !sql.contains("format csv") && sql.contains(".csv'") && sql.contains("header") && !sql.contains("header false"), "{sql}");
        assert_eq!(std::fs::read(csv.file.path()).expect("converted"), b"id\tname\n1\ta,b\n");
        let sql = spool(parse("COPY t FROM STDIN (FORMAT csv)").expect("a stdin copy")).expect("a spool").statement().expect("flushed").to_ascii_lowercase();
        assert!(sql.contains("header false"), "{sql}");
        assert_eq!(csv.unspool(&format!("COPY t FROM '{}' failed: line 2", csv.file.path().display())), "COPY t FROM STDIN failed: line 2");
        let mut marked = spool(parse("COPY t FROM STDIN (FORMAT csv)").expect("a stdin copy")).expect("a spool");
        marked.write(b"1,a\n\\.\n").expect("written");
        marked.statement().expect("flushed");
        assert_eq!(std::fs::read(marked.file.path()).expect("spooled"), b"1\ta\n");
        let mut data = spool(parse("COPY t FROM STDIN (FORMAT csv)").expect("a stdin copy")).expect("a spool");
        data.write(b"1,x\\.\n").expect("written");
        data.statement().expect("flushed");
        assert_eq!(std::fs::read(data.file.path()).expect("spooled"), b"1\tx\\\\.\n", "a value ending in \\. is data");
        assert_eq!(parse("COPY public.t FROM STDIN").expect("a stdin copy").table, "public.t");
    }

    #[test]
    fn csv_follows_postgres_rules_for_null_quotes_and_line_breaks() {
        let convert = |csv: &str, rules: &CsvRules| {
            let mut out = Vec::new();
            csv_to_text(csv.as_bytes(), &mut out, rules).map(|()| String::from_utf8(out).expect("utf8"))
        };
        let d = CsvRules::default();
        // Unquoted empty: NULL; quoted empty: the empty string.
        assert_eq!(convert("1,,\"\"\n", &d).unwrap(), "1\t\\N\t\n");
        // Doubled quotes, delimiters and line breaks inside quotes; tabs and backslashes escaped.
        assert_eq!(convert("\"a,\"\"b\"\"\",\"x\ny\",t\\\tz\r\n", &d).unwrap(), "a,\"b\"\tx\\ny\tt\\\\\\tz\n");
        // No final newline; another NULL string and delimiter.
        let rules = CsvRules { delimiter: b';', null: "NULL".into(), ..CsvRules::default() };
        assert_eq!(convert("f;NULL;\"NULL\"", &rules).unwrap(), "f\t\\N\tNULL\n");
        assert!(convert("\"open", &d).unwrap_err().contains("unterminated"));
    }
}
