//! What a statement answers: [`QueryResult`] (rows collected, with what
//! the statement fetched, held and spilled), [`Answer`] (or rows streamed),
//! [`Described`] (what it will answer, before it runs) and [`Notice`]s.

use std::sync::Arc;
use std::time::{Duration, Instant};

use datafusion::arrow::array::{ArrayRef, Float64Array, RecordBatch, StringArray, UInt64Array};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::physical_plan::SendableRecordBatchStream;
use futures::TryStreamExt;

use crate::EngineError;
use crate::memory::format_bytes;
use crate::scan::ScanMetrics;
use crate::scheduler::Decision;


/// A message a statement sends beside its result, as PostgreSQL's
/// NoticeResponse does: the statement succeeded, and something about it
/// deserves the user's attention (BEGIN inside a transaction; COMMIT of an
/// aborted transaction, which rolled it back).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Notice {
    /// `WARNING` or `NOTICE`.
    pub severity: &'static str,
    /// PostgreSQL's code for it.
    pub sqlstate: &'static str,
    pub message: String,
}

/// What a statement held: the engine's budget and the process as a whole.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MemoryUse {
    /// Most bytes reserved in the engine's budget during the statement.
    pub pool_peak: u64,
    /// The budget's limit when the statement ran (`None`: unlimited).
    pub limit: Option<u64>,
    /// Peak resident set of the process during the statement (the kernel's
    /// figure; shared with statements running at the same time). `None`
    /// where the kernel does not tell.
    pub rss_peak: Option<u64>,
    /// Bytes the statement's operators wrote to spill files, and how often
    /// they spilled.
    pub spilled_bytes: u64,
    pub spills: u64,
}

impl MemoryUse {
    /// One line for people: "memory: budget peak 1.2 GiB of 12.0 GiB, process peak 1.5 GiB, spilled 300.0 MiB in 4 files".
    pub fn describe(&self) -> String {
        let limit = self.limit.map_or("no limit".to_string(), |l| format!("of {}", format_bytes(l)));
        let mut s = format!("budget peak {} {limit}", format_bytes(self.pool_peak));
        if let Some(rss) = self.rss_peak {
            s += &format!(", process peak {}", format_bytes(rss));
        }
        if self.spills > 0 {
            s += &format!(", spilled {} in {} file{}", format_bytes(self.spilled_bytes), self.spills, if self.spills == 1 { "" } else { "s" });
        }
        s
    }
}


/// What [`Engine::describe`] learns of a statement without running it.
#[derive(Debug, Clone)]
pub enum Described {
    /// A query (or EXPLAIN, or SHOW of a setting): the schema of its rows,
    /// and the types of its `$1`, `$2`, … parameters (`None`: not inferred).
    Rows { schema: SchemaRef, parameters: Vec<Option<DataType>> },
    /// A statement that returns no rows, only a count or nothing: DDL, DML,
    /// COPY, OPTIMIZE, SET, BEGIN / COMMIT / ROLLBACK, snapshots.
    Command { parameters: Vec<Option<DataType>> },
    /// One of blobhouse's own statements that returns rows (SHOW CACHE,
    /// SHOW SNAPSHOTS / VERSIONS / STORAGE, VACUUM … DRY RUN): the schema
    /// is known once it ran (they only read metadata).
    RowsWhenRun,
}

/// The outcome of one statement.
#[derive(Debug, Clone)]
pub struct QueryResult {
    /// Schema of the result rows.
    pub schema: SchemaRef,
    /// Result rows.
    pub batches: Vec<RecordBatch>,
    /// What the statement's scans fetched and skipped.
    pub scan: ScanMetrics,
    /// Wall-clock time of the statement.
    pub elapsed: Duration,
    /// The part of `elapsed` spent before execution: parsing, logical and
    /// physical planning (the scans' planning from the manifest included).
    /// A fixed cost per query that no cache or pushdown removes.
    pub planning: Duration,
    /// Each scan's table and the object scheduler's decisions in it.
    pub scheduler: Vec<(String, Vec<Decision>)>,
    /// What the statement held in memory and spilled.
    pub memory: MemoryUse,
    /// What its hybrid scans pushed to the storage node.
    pub pushdown: crate::hybrid::PushdownTotals,
    /// What each process of a cluster read for it (label, counters), when
    /// it ran on workers ([`crate::extension::RemoteRun`]); `scan` is their
    /// sum. Empty when it ran in this process.
    pub processes: Vec<(String, ScanMetrics)>,
    /// Warnings about a statement that succeeded (clients show them).
    pub notices: Vec<Notice>,
    /// A COMMIT that found its transaction aborted and rolled it back:
    /// PostgreSQL answers such a COMMIT with `ROLLBACK`, not an error.
    pub rolled_back: bool,
}

/// What a statement answers when its rows may be streamed
/// ([`Engine::execute_streaming`]).
pub enum Answer {
    /// A finished statement: a command's outcome, or rows collected.
    Done(QueryResult),
    /// A query's rows, computed as they are read: the statement is still
    /// running, holds its memory reservations and reads its version's
    /// objects until the stream ends or is dropped (which stops it).
    Rows(RowStream),
}

/// A query's rows as they are computed.
pub struct RowStream {
    /// The rows' schema (every batch has it).
    pub schema: SchemaRef,
    /// The batches; an error in it is the statement's error.
    pub batches: SendableRecordBatchStream,
}

impl Answer {
    /// The whole answer, its rows collected.
    pub async fn collect(self, started: Instant) -> Result<QueryResult, EngineError> {
        match self {
            Answer::Done(result) => Ok(result),
            Answer::Rows(rows) => {
                let batches: Vec<RecordBatch> = rows.batches.try_collect().await?;
                Ok(QueryResult { batches, ..empty_result(started).with_schema(rows.schema) })
            }
        }
    }
}

impl QueryResult {
    /// The rows a DML statement or COPY changed, as its `count` column
    /// says (0 for any other result).
    pub fn changed_rows(&self) -> usize {
        match self.batches.first() {
            Some(b) if self.schema.fields().len() == 1 && self.schema.field(0).name() == "count" && b.num_rows() == 1 => {
                b.column(0).as_any().downcast_ref::<UInt64Array>().map_or(0, |a| a.value(0) as usize)
            }
            _ => 0,
        }
    }

    /// Rows in the result.
    pub fn rows(&self) -> usize {
        self.batches.iter().map(RecordBatch::num_rows).sum()
    }
}


impl QueryResult {
    pub(crate) fn with_schema(mut self, schema: SchemaRef) -> Self {
        self.schema = schema;
        self
    }
}



pub(crate) fn count_result(rows: u64, started: Instant) -> QueryResult {
    let schema = Arc::new(Schema::new(vec![Field::new("count", DataType::UInt64, false)]));
    let batch = RecordBatch::try_new(schema.clone(), vec![Arc::new(UInt64Array::from(vec![rows]))]).expect("count batch");
    QueryResult { batches: vec![batch], ..empty_result(started).with_schema(schema) }
}

pub(crate) fn empty_result(started: Instant) -> QueryResult {
    QueryResult {
        schema: Arc::new(Schema::empty()),
        batches: vec![],
        scan: ScanMetrics::default(),
        elapsed: started.elapsed(),
        planning: started.elapsed(),
        scheduler: Vec::new(),
        memory: MemoryUse::default(),
        pushdown: Default::default(),
        processes: Vec::new(),
        notices: Vec::new(),
        rolled_back: false,
    }
}

/// Splits a script into statements at `;`, ignoring semicolons inside quotes


pub(crate) fn setting_result(name: &str, value: &str, started: Instant) -> QueryResult {
    let schema = Arc::new(Schema::new(vec![Field::new("name", DataType::Utf8, false), Field::new("value", DataType::Utf8, false)]));
    let columns: Vec<ArrayRef> = vec![Arc::new(StringArray::from(vec![name])), Arc::new(StringArray::from(vec![value]))];
    let batch = RecordBatch::try_new(schema.clone(), columns).expect("setting batch");
    QueryResult { batches: vec![batch], ..empty_result(started).with_schema(schema) }
}

/// DESCRIBE's (column_name, data_type, is_nullable), with the types as SQL

/// `SHOW CACHE`: a row per tier.
pub(crate) fn show_cache(rows: Vec<crate::tiers::TierRow>, started: Instant) -> QueryResult {
    let hit_rate = |h: u64, m: u64| if h + m == 0 { 0.0 } else { h as f64 / (h + m) as f64 };
    let schema = Arc::new(Schema::new(vec![
        Field::new("tier", DataType::Utf8, false),
        Field::new("policy", DataType::Utf8, false),
        Field::new("segments", DataType::UInt64, false),
        Field::new("bytes", DataType::UInt64, false),
        Field::new("capacity", DataType::UInt64, false),
        Field::new("hits", DataType::UInt64, false),
        Field::new("misses", DataType::UInt64, false),
        Field::new("hit_rate", DataType::Float64, false),
        Field::new("bytes_served", DataType::UInt64, false),
        Field::new("evicted", DataType::UInt64, false),
        Field::new("note", DataType::Utf8, false),
    ]));
    let u = |f: fn(&crate::tiers::TierRow) -> u64| -> ArrayRef { Arc::new(rows.iter().map(f).collect::<UInt64Array>()) };
    let columns: Vec<ArrayRef> = vec![
        Arc::new(rows.iter().map(|r| Some(r.tier)).collect::<StringArray>()),
        Arc::new(rows.iter().map(|r| Some(r.policy)).collect::<StringArray>()),
        u(|r| r.segments),
        u(|r| r.bytes),
        u(|r| r.capacity),
        u(|r| r.hits),
        u(|r| r.misses),
        Arc::new(rows.iter().map(|r| hit_rate(r.hits, r.misses)).collect::<Float64Array>()),
        u(|r| r.served),
        u(|r| r.evicted),
        Arc::new(rows.iter().map(|r| Some(r.note.as_str())).collect::<StringArray>()),
    ];
    let batch = RecordBatch::try_new(schema.clone(), columns).expect("SHOW CACHE batch");
    QueryResult { batches: vec![batch], ..empty_result(started).with_schema(schema) }
}

/// How a statement's completion is reported to a client: rows, or a
/// command with PostgreSQL's tag (and the rows it changed, for those that
/// count) — what the PostgreSQL server's CommandComplete and a DB-API
/// cursor's `description` and `rowcount` say.
#[derive(Debug, PartialEq, Eq)]
pub enum CommandKind {
    /// A statement that returns rows.
    Rows,
    /// BEGIN.
    Begin,
    /// COMMIT or ROLLBACK (the tag).
    End(&'static str),
    /// A tag with the count of rows it changed.
    Counted(String),
    /// A tag alone.
    Plain(String),
}

impl CommandKind {
    /// The kind of statement `sql` (one statement) is, by its first words.
    pub fn of(sql: &str) -> CommandKind {
        let words: Vec<String> = sql.split_whitespace().take(3).map(|w| w.trim_end_matches(';').to_ascii_uppercase()).collect();
        let w = |i: usize| words.get(i).map(String::as_str).unwrap_or("");
        let dry_run = sql.to_ascii_uppercase().contains("DRY RUN");
        match w(0) {
            "BEGIN" | "START" => CommandKind::Begin,
            "COMMIT" | "END" => CommandKind::End("COMMIT"),
            "ROLLBACK" | "ABORT" => CommandKind::End("ROLLBACK"),
            "INSERT" | "UPDATE" | "DELETE" | "COPY" | "OPTIMIZE" => CommandKind::Counted(w(0).to_string()),
            "CREATE" if w(1) == "TABLE" && sql.to_ascii_uppercase().contains(" AS ") => CommandKind::Counted("SELECT".into()),
            "CREATE" | "DROP" => CommandKind::Plain(format!("{} {}", w(0), w(1))),
            "VACUUM" if !dry_run => CommandKind::Plain("VACUUM".into()),
            "SET" | "RESET" | "RESTORE" | "SAVEPOINT" | "RELEASE" => CommandKind::Plain(w(0).to_string()),
            _ => CommandKind::Rows,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statements_complete_with_postgres_tags() {
        assert_eq!(CommandKind::of("select 1"), CommandKind::Rows);
        assert_eq!(CommandKind::of("  begin;"), CommandKind::Begin);
        assert_eq!(CommandKind::of("ROLLBACK"), CommandKind::End("ROLLBACK"));
        assert_eq!(CommandKind::of("insert into t values (1)"), CommandKind::Counted("INSERT".into()));
        assert_eq!(CommandKind::of("create table t as select 1"), CommandKind::Counted("SELECT".into()));
        assert_eq!(CommandKind::of("create table t (x int)"), CommandKind::Plain("CREATE TABLE".into()));
        assert_eq!(CommandKind::of("VACUUM DRY RUN"), CommandKind::Rows);
        assert_eq!(CommandKind::of("show tables"), CommandKind::Rows);
    }
}
