//! The SQL shell: interactive (history, multi-line statements, timing) and
//! scripted (`-c`, `-f`).

use anyhow::Result;
use datafusion::arrow::util::pretty::pretty_format_batches;
use rustyline::DefaultEditor;
use rustyline::error::ReadlineError;

use blobhouse_engine::{Engine, QueryResult, split_statements};

fn print_result(r: &QueryResult) {
    if !r.batches.is_empty() && r.schema.fields().len() > 0 {
        match pretty_format_batches(&r.batches) {
            Ok(t) => println!("{t}"),
            Err(e) => eprintln!("cannot format result: {e}"),
        }
    }
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
    // Memory only when it is worth a look: a large peak, or spilling.
    let large = r.memory.rss_peak.is_some_and(|b| b >= LARGE_RSS) || r.memory.pool_peak >= LARGE_POOL || r.memory.spills > 0;
    if large {
        eprintln!("memory: {}", r.memory.describe());
    }
}

/// What the caching tiers have to say (a cache directory that cannot be
/// used, damaged entries, a full disk) and the storage node's failures the
/// statement survived by fetching: each said once.
fn print_warnings(engine: &Engine) {
    let tiers = engine.tiers().map(|t| t.take_warnings()).unwrap_or_default();
    let pushdown = engine.pushdown().map(|p| p.take_warnings()).unwrap_or_default();
    for w in tiers.into_iter().chain(pushdown) {
        eprintln!("warning: {w}");
    }
}

/// A statement's memory is printed from these peaks on.
const LARGE_RSS: u64 = 1 << 30;
const LARGE_POOL: u64 = 256 << 20;

/// Runs each statement; stops at the first error and returns it.
pub async fn run_script(engine: &Engine, sql: &str) -> Result<()> {
    for (i, statement) in split_statements(sql).iter().enumerate() {
        match engine.execute(statement).await {
            Ok(r) => {
                print_result(&r);
                print_warnings(engine);
            }
            Err(e) => {
                roll_back_open_transaction(engine).await;
                return Err(anyhow::anyhow!("statement {} failed: {e}", i + 1));
            }
        }
    }
    roll_back_open_transaction(engine).await;
    Ok(())
}

/// The interactive shell. Statements end with ';'.
pub async fn interactive(engine: &Engine, url: &str) -> Result<()> {
    let mut editor = DefaultEditor::new()?;
    let history = std::env::var("HOME").map(|h| std::path::PathBuf::from(h).join(".blobhouse_history")).ok();
    if let Some(h) = &history {
        let _ = editor.load_history(h);
    }
    eprintln!("blobhouse {} — connected to {url}", env!("CARGO_PKG_VERSION"));
    eprintln!("End statements with ';'. \\q quits, \\? helps.");
    let mut buffer = String::new();
    loop {
        // Inside BEGIN … COMMIT the prompt says so, as psql's `=*>` does.
        let prompt = match (buffer.is_empty(), engine.in_transaction()) {
            (true, false) => "blobhouse> ",
            (true, true) => "blobhouse*> ",
            (false, _) => "      ...> ",
        };
        match editor.readline(prompt) {
            Ok(line) => {
                let trimmed = line.trim();
                if buffer.is_empty() {
                    match trimmed {
                        "" => continue,
                        "\\q" | "quit" | "exit" | ".quit" | ".exit" => break,
                        "\\?" | "help" | ".help" => {
                            eprintln!("SQL statements end with ';'. Try: SHOW TABLES; DESCRIBE t; EXPLAIN ANALYZE SELECT …;\n\\q quits.");
                            continue;
                        }
                        _ => {}
                    }
                }
                buffer.push_str(&line);
                buffer.push('\n');
                if trimmed.ends_with(';') {
                    let _ = editor.add_history_entry(buffer.trim());
                    for statement in split_statements(&buffer) {
                        match engine.execute(&statement).await {
                            Ok(r) => {
                                print_result(&r);
                                print_warnings(engine);
                            }
                            Err(e) => eprintln!("error: {e}"),
                        }
                    }
                    buffer.clear();
                }
            }
            Err(ReadlineError::Interrupted) => buffer.clear(),
            Err(ReadlineError::Eof) => break,
            Err(e) => return Err(e.into()),
        }
    }
    if let Some(h) = &history {
        let _ = editor.save_history(h);
    }
    roll_back_open_transaction(engine).await;
    Ok(())
}

/// A session that ends inside BEGIN … COMMIT commits nothing: say so.
pub async fn roll_back_open_transaction(engine: &Engine) {
    if engine.in_transaction() {
        engine.rollback().await;
        eprintln!("note: the open transaction was rolled back (end it with COMMIT to keep its changes)");
    }
}
