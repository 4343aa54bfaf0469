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
    pub(crate) fn new(copy: CopyIn) -> std::io::Result<Spool> {
        // The engine's CSV reader wants the extension.
        let suffix = if copy.is_csv() { ".csv" } else { ".txt" };
        Ok(Spool { copy, file: tempfile::Builder::new().prefix("blobhouse-copy-").suffix(suffix).tempfile()?, bytes: 0 })
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
    /// it names none: the text format, no header line. The spool lives as long as
    /// `self`.
    pub(crate) fn statement(&mut self) -> std::io::Result<String> {
        self.file.flush()?;
        self.drop_end_marker()?;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stdin_copies_load_their_spool_in_the_format_they_name() {
        assert!(parse("COPY t FROM '/data/x.csv'").is_none());
        assert!(parse("COPY t TO STDOUT").is_none());
        assert!(parse("SELECT 1").is_none());
        let mut text = Spool::new(parse("copy t from stdin").expect("a stdin copy")).expect("a spool");
        text.write(b"1\tone\n").expect("written");
        let sql = text.statement().expect("flushed");
        assert!(sql.contains(&text.file.path().display().to_string()) && sql.to_ascii_lowercase().contains("format text"), "{sql}");
        assert_eq!(std::fs::read(text.file.path()).expect("spooled"), b"1\tone\n");
        let mut csv = Spool::new(parse("COPY t FROM STDIN WITH (FORMAT csv, HEADER true)").expect("a stdin copy")).expect("a spool");
        let sql = csv.statement().expect("flushed").to_ascii_lowercase();
        assert!(sql.contains("format csv") && !sql.contains("format text") && sql.contains(".csv'") && sql.contains("header") && !sql.contains("header false"), "{sql}");
        let sql = Spool::new(parse("COPY t FROM STDIN (FORMAT csv)").expect("a stdin copy")).expect("a spool").statement().expect("flushed").to_ascii_lowercase();
        assert!(sql.contains("header false"), "{sql}");
        assert_eq!(csv.unspool(&format!("COPY t FROM '{}' failed: line 2", csv.file.path().display())), "COPY t FROM STDIN failed: line 2");
        let mut marked = Spool::new(parse("COPY t FROM STDIN (FORMAT csv)").expect("a stdin copy")).expect("a spool");
        marked.write(b"1,a\n\\.\n").expect("written");
        marked.statement().expect("flushed");
        assert_eq!(std::fs::read(marked.file.path()).expect("spooled"), b"1,a\n");
        let mut data = Spool::new(parse("COPY t FROM STDIN (FORMAT csv)").expect("a stdin copy")).expect("a spool");
        data.write(b"1,x\\.\n").expect("written");
        data.statement().expect("flushed");
        assert_eq!(std::fs::read(data.file.path()).expect("spooled"), b"1,x\\.\n", "a value ending in \\. is data");
        assert_eq!(parse("COPY public.t FROM STDIN").expect("a stdin copy").table, "public.t");
    }
}
