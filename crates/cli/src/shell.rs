//! The SQL shell: interactive (history, multi-line statements, Ctrl-C
//! cancels the running statement) and scripted (`-c`, `-f`), with output
//! modes and psql/DuckDB-style commands (`\d`, `\dt`, `\timing`,
//! `\pset format`, `.mode`).

use anyhow::{Result, bail};
use rustyline::DefaultEditor;
use futures::FutureExt;
use rustyline::error::ReadlineError;
use tokio::signal::unix::{Signal, SignalKind, signal};

use blobhouse_engine::{EngineError, QueryResult, Session, split_complete_statements};

use crate::output::{Format, render};

/// What the shell prints a result with and whether it says how each
/// statement went; one engine session underneath.
pub struct Shell<'a> {
    engine: &'a Session,
    format: Format,
    /// The line after each statement (rows, time, GETs, bytes; on stderr).
    timing: bool,
    /// SIGINT, in the interactive shell: it cancels the running statement
    /// instead of ending the process.
    interrupts: Option<Signal>,
}

/// What a shell command asks of the loop.
enum Flow {
    Continue,
    Quit,
}

const HELP: &str = "\
SQL statements end with ';' (SHOW TABLES; DESCRIBE t; EXPLAIN ANALYZE SELECT …;).
  \\d [TABLE]          list the tables, or a table's columns and SQL types
  \\dt [PATTERN]       list the tables (PATTERN: * and ? wildcards)
  \\timing [on|off]    the line after each statement: rows, time, GETs, bytes
  \\pset format MODE   output mode: table, csv, json or markdown (also .mode MODE)
  \\q                  quit (Ctrl-D too)
Ctrl-C cancels the running statement and its downloads, and keeps the shell.";

impl<'a> Shell<'a> {
    pub fn new(engine: &'a Session, format: Format) -> Self {
        Shell { engine, format, timing: true, interrupts: None }
    }

    /// Runs a script's statements and commands in order; stops at the first
    /// error and returns it with the statement's number and line. A
    /// transaction the script leaves open is rolled back.
    pub async fn run_script(&mut self, text: &str) -> Result<()> {
        let outcome = self.script(text).await;
        roll_back_open_transaction(self.engine).await;
        outcome
    }

    async fn script(&mut self, text: &str) -> Result<()> {
        let mut buffer = String::new();
        let mut statement = 0;
        let mut started_at = 1;
        // Where a statement of a script of several lines failed.
        let multi_line = text.trim_end().contains('\n');
        let failed = |statement: usize, started_at: usize, e: EngineError| match multi_line {
            true => anyhow::anyhow!("statement {statement} failed (line {started_at}): {e}"),
            false => anyhow::anyhow!("statement {statement} failed: {e}"),
        };
        for (i, line) in text.lines().enumerate() {
            if buffer.trim().is_empty() {
                if let Some(command) = shell_command(line) {
                    match self.command(command).await {
                        Ok(Flow::Continue) => {}
                        Ok(Flow::Quit) => return Ok(()),
                        Err(e) => bail!("line {}: {e}", i + 1),
                    }
                    buffer.clear();
                    continue;
                }
                started_at = i + 1;
            }
            buffer.push_str(line);
            buffer.push('\n');
            // Only a line with a ';' can end a statement: a statement of many
            // lines (a long INSERT … VALUES) is split once, not once a line.
            if !line.contains(';') {
                continue;
            }
            let (complete, rest) = split_complete_statements(&buffer);
            for sql in complete {
                statement += 1;
                self.statement(&sql).await.map_err(|e| failed(statement, started_at, e))?;
            }
            buffer = rest.to_string();
        }
        if !buffer.trim().is_empty() {
            statement += 1;
            self.statement(buffer.trim()).await.map_err(|e| failed(statement, started_at, e))?;
        }
        Ok(())
    }

    /// The interactive shell: statements end with ';', commands start with
    /// '\' or '.'.
    pub async fn interactive(&mut self, url: &str) -> Result<()> {
        let mut editor = DefaultEditor::new()?;
        self.interrupts = Some(signal(SignalKind::interrupt())?);
        let history = std::env::var("HOME").map(|h| std::path::PathBuf::from(h).join(".blobhouse_history")).ok();
        if let Some(h) = &history {
            let _ = editor.load_history(h);
        }
        eprintln!("blobhouse {} — connected to {url}", env!("CARGO_PKG_VERSION"));
        eprintln!("End statements with ';'. \\? lists the commands, \\q quits; Ctrl-C cancels a running statement.");
        let mut buffer = String::new();
        loop {
            // Inside BEGIN … COMMIT the prompt says so, as psql's `=*>` does.
            let prompt = match (buffer.trim().is_empty(), self.engine.in_transaction()) {
                (true, false) => "blobhouse> ",
                (true, true) => "blobhouse*> ",
                (false, _) => "      ...> ",
            };
            match editor.readline(prompt) {
                Ok(line) => {
                    if buffer.trim().is_empty() {
                        if let Some(command) = shell_command(&line).or_else(|| bare_word_command(&line)) {
                            let _ = editor.add_history_entry(line.trim());
                            match self.command(command).await {
                                Ok(Flow::Continue) => {}
                                Ok(Flow::Quit) => break,
                                Err(e) => eprintln!("error: {e}"),
                            }
                            buffer.clear();
                            continue;
                        }
                    }
                    buffer.push_str(&line);
                    buffer.push('\n');
                    let (complete, rest) = split_complete_statements(&buffer);
                    if !complete.is_empty() {
                        let entered = buffer[..buffer.len() - rest.len()].trim().to_string();
                        let _ = editor.add_history_entry(entered);
                    }
                    let rest = rest.to_string();
                    for sql in complete {
                        if let Err(e) = self.statement(&sql).await {
                            eprintln!("error: {e}");
                        }
                    }
                    buffer = rest;
                }
                // At the prompt Ctrl-C drops what was typed, as psql does.
                Err(ReadlineError::Interrupted) => buffer.clear(),
                Err(ReadlineError::Eof) => break,
                Err(e) => return Err(e.into()),
            }
        }
        if let Some(h) = &history {
            let _ = editor.save_history(h);
        }
        roll_back_open_transaction(self.engine).await;
        Ok(())
    }

    /// Runs one statement and prints its result. In the interactive shell
    /// Ctrl-C stops it (dropping the statement stops its plan and its
    /// downloads) and the shell goes on.
    async fn statement(&mut self, sql: &str) -> Result<(), EngineError> {
        // Ending a transaction is not interrupted half-way: whether it
        // committed would then be unknown to the user.
        let interrupts = self.interrupts.as_mut().filter(|_| !ends_transaction(sql));
        let result = if let Some(interrupts) = interrupts {
            // A Ctrl-C typed before the statement began is not for it.
            while let Some(Some(())) = interrupts.recv().now_or_never() {}
            tokio::select! {
                result = self.engine.execute(sql) => result,
                _ = interrupts.recv() => {
                    eprintln!("cancelled: the statement was stopped and nothing of it was committed");
                    if self.engine.in_transaction() {
                        eprintln!("note: the transaction is aborted by the cancelled statement; ROLLBACK it");
                    }
                    return Ok(());
                }
            }
        } else {
            self.engine.execute(sql).await
        }?;
        self.print(&result);
        for notice in &result.notices {
            eprintln!("{}: {}", notice.severity.to_lowercase(), notice.message);
        }
        print_warnings(self.engine);
        Ok(())
    }

    /// A result's rows in the output mode; with timing on, the line that
    /// says what the statement cost.
    fn print(&self, r: &QueryResult) {
        if !r.schema.fields().is_empty() {
            match render(self.format, &r.schema, &r.batches) {
                Ok(text) => print!("{text}"),
                Err(e) => eprintln!("cannot format result: {e}"),
            }
        }
        if self.timing {
            print_summary(r);
        }
    }

    /// A shell command (`\d`, `.mode csv`, …).
    async fn command(&mut self, command: &str) -> Result<Flow> {
        let mut words = command.split_whitespace();
        let name = words.next().unwrap_or_default();
        let args: Vec<&str> = words.collect();
        match (name, args.as_slice()) {
            ("\\q" | "\\quit" | ".quit" | ".exit", []) => return Ok(Flow::Quit),
            ("\\?" | "\\h" | "\\help" | ".help", _) => eprintln!("{HELP}"),
            ("\\d" | "\\dt" | ".tables", []) => self.show("SHOW TABLES").await?,
            ("\\dt" | ".tables", [pattern]) => {
                let like = pattern.replace('\'', "''").replace('*', "%").replace('?', "_");
                self.show(&format!("SELECT table_name AS name FROM information_schema.tables WHERE table_schema = 'public' AND table_name LIKE '{like}' ORDER BY table_name")).await?
            }
            ("\\d" | ".schema", [table]) => {
                if !table.chars().all(|c| c.is_alphanumeric() || matches!(c, '_' | '.' | '"')) {
                    bail!("{name} {table}: not a table name (write it as in SQL, quoted if it has other characters)");
                }
                self.show(&format!("DESCRIBE {table}")).await?
            }
            ("\\timing" | ".timer", []) => self.timing = !self.timing,
            ("\\timing" | ".timer", [on]) => {
                self.timing = match on.to_ascii_lowercase().as_str() {
                    "on" | "true" | "1" => true,
                    "off" | "false" | "0" => false,
                    other => bail!("{name} {other}: say on or off"),
                }
            }
            ("\\pset", ["format"]) | (".mode", []) => {
                eprintln!("Output format is {}.", self.format.name());
                return Ok(Flow::Continue);
            }
            ("\\pset", ["format", mode]) | (".mode", [mode]) => {
                self.format = Format::parse(mode).ok_or_else(|| anyhow::anyhow!("{name}: no output mode '{mode}'; the modes are table, csv, json and markdown"))?;
                eprintln!("Output format is {}.", self.format.name());
                return Ok(Flow::Continue);
            }
            _ => bail!("{command}: unknown command or wrong arguments; \\? lists the commands"),
        }
        if matches!(name, "\\timing" | ".timer") {
            eprintln!("Timing is {}.", if self.timing { "on" } else { "off" });
        }
        Ok(Flow::Continue)
    }

    /// A command's own query: its rows in the output mode, no summary line.
    async fn show(&self, sql: &str) -> Result<()> {
        let result = self.engine.execute(sql).await?;
        print!("{}", render(self.format, &result.schema, &result.batches)?);
        Ok(())
    }
}

/// `line` as a shell command, if it is one: `\…`, or `.` and a letter (a
/// statement never starts so).
fn shell_command(line: &str) -> Option<&str> {
    let t = line.trim().trim_end_matches(';').trim_end();
    let dot_command = t.starts_with('.') && t[1..].starts_with(|c: char| c.is_ascii_alphabetic());
    (t.starts_with('\\') || dot_command).then_some(t)
}

/// The words the interactive shell takes alone on a line as commands.
fn bare_word_command(line: &str) -> Option<&'static str> {
    match line.trim() {
        "quit" | "exit" => Some("\\q"),
        "help" => Some("\\?"),
        _ => None,
    }
}

/// COMMIT, ROLLBACK and their synonyms.
fn ends_transaction(sql: &str) -> bool {
    let first = sql.split_whitespace().next().unwrap_or_default().trim_end_matches(';').to_ascii_lowercase();
    matches!(first.as_str(), "commit" | "end" | "rollback" | "abort")
}

/// How a statement went: rows, time, GETs and bytes, what the caches and
/// the storage node did (stderr, so that stdout holds only results).
fn print_summary(r: &QueryResult) {
    let mib = r.scan.bytes_fetched as f64 / 1048576.0;
    // The caches, when they served anything: hit rate, bytes by tier, GETs and dollars saved.
    let cache = match r.scan.memory_hits + r.scan.ssd_hits {
        0 => String::new(),
        _ => r.scan.cache_summary().map_or(String::new(), |c| format!("; cache: {c}")),
    };
    // The storage node, when the statement pushed anything to it.
    let p = &r.pushdown;
    let pushed = match p.row_groups_pushed + p.row_groups_fallback {
        0 => String::new(),
        _ => format!(
            "; pushed {} row group{} ({:.2} MiB scanned at the node, {:.2} MiB back{})",
            p.row_groups_pushed,
            if p.row_groups_pushed == 1 { "" } else { "s" },
            p.bytes_pushed as f64 / 1048576.0,
            p.bytes_received as f64 / 1048576.0,
            if p.row_groups_fallback > 0 { format!(", {} fetched after the node failed", p.row_groups_fallback) } else { String::new() }
        ),
    };
    eprintln!(
        "{} row{} in {:.3} s ({} GET{}, {mib:.2} MiB fetched{cache}{pushed})",
        r.rows(),
        if r.rows() == 1 { "" } else { "s" },
        r.elapsed.as_secs_f64(),
        r.scan.get_requests,
        if r.scan.get_requests == 1 { "" } else { "s" },
    );
    // On a cluster: what each worker read (EXPLAIN ANALYZE says it too).
    if r.processes.len() > 1 {
        for (who, m) in &r.processes {
            eprintln!("  {who}: {}", m.describe_reads());
        }
    }
    // Memory only when it is worth a look: a large peak, or spilling.
    let large = r.memory.rss_peak.is_some_and(|b| b >= LARGE_RSS) || r.memory.pool_peak >= LARGE_POOL || r.memory.spills > 0;
    if large {
        eprintln!("memory: {}", r.memory.describe());
    }
}

/// What the caching tiers have to say (a cache directory that cannot be
/// used, damaged entries, a full disk) and the storage node's failures the
/// statement survived by fetching: each said once.
fn print_warnings(engine: &Session) {
    let tiers = engine.engine().tiers().map(|t| t.take_warnings()).unwrap_or_default();
    let pushdown = engine.engine().pushdown().map(|p| p.take_warnings()).unwrap_or_default();
    let reads = engine.engine().source().take_warnings();
    for w in tiers.into_iter().chain(pushdown).chain(reads) {
        eprintln!("warning: {w}");
    }
}

/// A statement's memory is printed from these peaks on.
const LARGE_RSS: u64 = 1 << 30;
const LARGE_POOL: u64 = 256 << 20;

/// A session that ends inside BEGIN … COMMIT commits nothing: say so.
pub async fn roll_back_open_transaction(engine: &Session) {
    if engine.in_transaction() {
        engine.rollback().await;
        eprintln!("note: the open transaction was rolled back (end it with COMMIT to keep its changes)");
    }
}
