//! [`Engine`]: an open database plus a DataFusion session, and statement
//! dispatch. DataFusion plans and runs queries and INSERTs through our table
//! provider; the statements that change the catalog (CREATE TABLE [AS],
//! DROP TABLE) and `COPY … FROM` are intercepted here, because they must become
//! atomic commits on the store rather than changes to an in-memory catalog.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use datafusion::arrow::array::{Array, ArrayRef, RecordBatch, StringArray, TimestampMillisecondArray, UInt64Array};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};
use datafusion::common::{Column, DataFusionError};
use datafusion::dataframe::DataFrame;
use datafusion::execution::context::SessionContext;
use datafusion::execution::disk_manager::{DiskManagerBuilder, DiskManagerMode};
use datafusion::execution::runtime_env::RuntimeEnvBuilder;
use datafusion::execution::session_state::SessionStateBuilder;
use datafusion::catalog::{CatalogProvider, CatalogProviderList, MemoryCatalogProvider, MemoryCatalogProviderList};
use datafusion::logical_expr::{CreateMemoryTable, DdlStatement, DescribeTable, Expr, LogicalPlan, LogicalPlanBuilder, Statement, cast};
use datafusion::sql::parser::Statement as DFStatement;
use futures::{StreamExt, TryStreamExt};
use roaring::RoaringBitmap;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{ExecutionPlan, SendableRecordBatchStream, collect, execute_stream};
use datafusion::prelude::{CsvReadOptions, ParquetReadOptions, SessionConfig};

use blobhouse_storage::format::{CatalogVersion, DataObject};
use blobhouse_storage::{VersionSummary, Database, LiveObject, Location, StorageError, StoreOptions, TableWriter, Transaction, WriteOptions, open_location};

use crate::chunks::RequestPolicy;
use crate::scheduler::SchedulerOptions;
use crate::source::DataSource;
use blobhouse_io::{DownloadManager, ManagerOptions};
use crate::copy::{CopyFormat, CopyFrom, CopyTo, parse_copy_from, parse_copy_to};
use crate::memory::{self, MemoryBudget, format_bytes, parse_limit};
use crate::history::{self, History};
use crate::time_travel::{self, AsOf};
use crate::{dml, names, optimize};
use crate::provider::{BlobSchemaProvider, DML_SCHEMA, ROW_ID_COLUMN, Scope, write_stream};
use crate::selectivity;
use crate::scan::{MetadataCache, ScanMetrics, collect_scan_metrics, collect_scheduler_timelines};
use crate::scheduler::Decision;

/// An error of the engine: from the store, from query planning/execution, or
/// from a statement we do not support.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Storage(#[from] StorageError),
    #[error("{}", describe_df(.0))]
    Query(#[from] DataFusionError),
    #[error("COPY {table} FROM '{source_url}' failed: {message}")]
    Copy { table: String, source_url: String, message: String },
    #[error("COPY … TO '{target}' failed: {message}")]
    CopyTo { target: String, message: String },
    #[error("{0}")]
    Unsupported(String),
    /// A statement names a column its table does not have.
    #[error("{context}: the table has no column '{column}' (columns: {columns})")]
    UnknownColumn { context: String, column: String, columns: String },
    #[error("cannot start the download manager: {0} (set EngineOptions::download to None to read through object_store)")]
    DownloadManager(std::io::Error),
    #[error("cannot use spill directory {}: {source} (choose another with --spill-dir)", .dir.display())]
    SpillDir { dir: PathBuf, source: std::io::Error },
    #[error("cannot use the storage node: {0}")]
    Pushdown(#[source] blobhouse_pushdown::PushdownError),
    #[error("SET {variable}: {message}")]
    Setting { variable: String, message: String },
    /// A statement other than ROLLBACK (or COMMIT) after a statement of the
    /// same transaction failed — PostgreSQL's rule and words.
    #[error("current transaction is aborted, commands ignored until end of transaction block (ROLLBACK ends it; it failed at: {cause})")]
    TransactionAborted { cause: String },
    /// A statement that breaks a rule of transactions (VACUUM inside one,
    /// SAVEPOINT outside one, a read of a version VACUUM expired …); the
    /// rule says which, and gives the SQLSTATE.
    #[error("{message}")]
    Transaction { rule: TxnRule, message: String },
}

/// Which rule of transactions a statement broke ([`EngineError::Transaction`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TxnRule {
    /// It cannot run inside an open transaction (BEGIN through the API,
    /// VACUUM, CREATE SNAPSHOT of a transaction's changes).
    InProgress,
    /// It needs an open transaction (SAVEPOINT).
    NoTransaction,
    /// The transaction ended under it.
    Ended,
    /// The transaction was aborted by an earlier failed statement; nothing
    /// of it was committed.
    Aborted,
    /// The version it read was expired by a VACUUM while it ran.
    Expired,
}

impl EngineError {
    fn transaction(rule: TxnRule, message: impl Into<String>) -> EngineError {
        EngineError::Transaction { rule, message: message.into() }
    }
}

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

/// DataFusion wraps our storage errors as "External error: …"; show them plainly.
fn describe_df(e: &DataFusionError) -> String {
    let mut s = e.to_string();
    for prefix in ["External error: ", "Execution error: "] {
        while let Some(rest) = s.strip_prefix(prefix) {
            s = rest.to_string();
        }
    }
    s
}

/// Engine settings.
#[derive(Debug, Clone)]
pub struct EngineOptions {
    /// How new data objects are written.
    pub write: WriteOptions,
    /// How scans cut their reads into requests.
    pub requests: RequestPolicy,
    /// How scans pace their downloads (the object scheduler).
    pub scan: SchedulerOptions,
    /// Parallelism of query execution (default: the number of cores).
    pub target_partitions: usize,
    /// Rows per record batch in execution.
    pub batch_size: usize,
    /// The download manager for data reads from object stores; `None`
    /// reads them through object_store.
    pub download: Option<ManagerOptions>,
    /// The engine's memory budget ([`crate::memory`]): everything big it
    /// holds — query operators (hash tables, sorts, aggregates, repartition
    /// queues), the scans' fetched-ahead row groups, decoded footers —
    /// shares this many bytes. Beyond it operators spill where DataFusion
    /// can, and otherwise the query fails with an error naming the largest
    /// consumers, rather than the kernel killing the process. Default: half
    /// the machine's memory; `None`: no limit (still accounted). Changed
    /// at run time by `SET memory_limit = '4G'`.
    pub memory_limit: Option<usize>,
    /// Where operators spill, and how much.
    pub spill: SpillOptions,
    /// How long this engine hands out object keys from one declared key
    /// block (`blobhouse_storage::keys`): crash recovery can collect a dead
    /// engine's uploads only after that. Default 10 minutes.
    pub key_block_ttl: Duration,
    /// The caching tiers (`crate::tiers`): a memory tier of a quarter of
    /// the memory limit by default, no SSD tier unless a directory is given.
    pub cache: crate::tiers::CacheOptions,
    /// The storage node scans push work to (`crate::hybrid`); `None`: no
    /// pushdown.
    pub pushdown: Option<crate::hybrid::PushdownOptions>,
}

/// The local directory that sorts, aggregations and sort-merge joins spill
/// to when the memory limit is reached.
#[derive(Debug, Clone)]
pub struct SpillOptions {
    /// Spill files go into a fresh subdirectory of this one, removed with
    /// the engine; each file is deleted as soon as its operator is done or
    /// dropped (a finished, failed or cancelled query leaves nothing).
    /// `None`: the system's temporary directory.
    pub dir: Option<PathBuf>,
    /// Most bytes of spill files at once; a query that would spill more
    /// fails with "Resources exhausted" naming the limit.
    pub max_bytes: u64,
}

impl Default for SpillOptions {
    fn default() -> Self {
        SpillOptions { dir: None, max_bytes: 100 << 30 }
    }
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


impl Default for EngineOptions {
    fn default() -> Self {
        EngineOptions {
            write: WriteOptions::default(),
            requests: RequestPolicy::default(),
            scan: SchedulerOptions::default(),
            target_partitions: std::thread::available_parallelism().map(|n| n.get()).unwrap_or(2),
            batch_size: 8192,
            download: Some(scan_download_options()),
            memory_limit: Some(memory::default_limit()),
            spill: SpillOptions::default(),
            key_block_ttl: blobhouse_storage::keys::DEFAULT_BLOCK_TTL,
            cache: crate::tiers::CacheOptions::default(),
            pushdown: None,
        }
    }
}

/// The download manager as scans use it: the object scheduler decides the
/// bytes each scan keeps in flight from the scan's own view of retrieval
/// and processing, so the manager does not pace on top of it with its own
/// latency model and link probe (two controllers in series: the manager's
/// slow start held short queries to 16 requests for half a second). It
/// still caps requests in flight and memory, hedges and retries.
pub fn scan_download_options() -> ManagerOptions {
    let mut o = ManagerOptions::default();
    o.loop_options.concurrency = None;
    o.loop_options.max_in_flight = 512;
    o
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
    /// Rows in the result.
    pub fn rows(&self) -> usize {
        self.batches.iter().map(RecordBatch::num_rows).sum()
    }
}

/// An open database, ready for SQL.
pub struct Engine {
    db: Arc<Database>,
    ctx: SessionContext,
    options: Arc<EngineOptions>,
    store_options: StoreOptions,
    source: DataSource,
    memory: MemoryBudget,
    /// The tables, as the session's own context sees them; each statement
    /// gets a copy bound to its [`Scope`].
    tables: Arc<BlobSchemaProvider>,
    /// The storage node its scans push to, if any.
    pushdown: Option<Arc<crate::hybrid::Pushdown>>,
    /// The session's transaction, when one was begun explicitly.
    txn: std::sync::Mutex<TxnMode>,
}

/// Where the session is: each statement a transaction of its own, inside
/// BEGIN … COMMIT, or in a transaction that a failed statement aborted.
enum TxnMode {
    Autocommit,
    Explicit(TxnSlot),
    /// The transaction, and the error that aborted it.
    Aborted(TxnSlot, String),
}

/// A transaction shared by the session and the statement running in it
/// (the INSERT sink adds to it); `None` once it ended.
type TxnSlot = Arc<tokio::sync::Mutex<Option<Transaction>>>;

/// A statement, parsed: our own (COPY … FROM, OPTIMIZE) or SQL for DataFusion.
enum Parsed {
    History(History),
    Copy(CopyFrom),
    CopyTo(CopyTo),
    Optimize(String),
    Sql(DFStatement),
}

/// Transaction control statements.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Control {
    Begin,
    Commit,
    Rollback,
    /// SAVEPOINT or RELEASE SAVEPOINT: accepted inside a transaction, where
    /// they change nothing (a released savepoint's changes stay in the
    /// transaction anyway); drivers issue them around their own queries.
    /// ROLLBACK TO SAVEPOINT, which would need them, is refused.
    Savepoint,
}

impl Engine {
    /// Opens (creating if needed) the database at `url`.
    pub async fn open(url: &str, store_options: &StoreOptions, options: EngineOptions) -> Result<Engine, EngineError> {
        let loc = open_location(url, store_options)?;
        Self::open_location(loc, store_options.clone(), options).await
    }

    /// Opens the database at an already-built location (tests wrap stores).
    pub async fn open_location(loc: Location, store_options: StoreOptions, options: EngineOptions) -> Result<Engine, EngineError> {
        let source = match (&options.download, &loc.signer) {
            (Some(dm), Some(signer)) => {
                let dm = DownloadManager::new(dm.clone()).map_err(EngineError::DownloadManager)?;
                DataSource::managed(loc.store.clone(), dm, signer.clone())
            }
            _ => DataSource::store(loc.store.clone()),
        };
        let db = Database::open_with(loc, true, options.key_block_ttl).await?;
        let options = Arc::new(options);
        let mut config = SessionConfig::new()
            .with_default_catalog_and_schema(CATALOG, "public")
            .with_information_schema(true)
            .with_target_partitions(options.target_partitions)
            .with_batch_size(options.batch_size);
        config.options_mut().execution.sort_spill_reservation_bytes = sort_merge_reservation(options.memory_limit);
        // Join sides are chosen with our filter estimates ([`crate::selectivity`]).
        config.options_mut().optimizer.use_statistics_registry = true;
        // A hash table up to this size is built once and shared by all
        // partitions (the probe side is then not repartitioned). DataFusion's
        // 1 MiB default came from compressed sizes; in decoded bytes SF 10's
        // `supplier` keys are 5 MiB, and sharing them made Q2, Q7 and Q11
        // 25–40 % faster (docs/notes/2026-11-23-join-estimates.md).
        config.options_mut().optimizer.hash_join_single_partition_threshold = COLLECT_LEFT_BYTES;
        let memory = MemoryBudget::new(options.memory_limit);
        let spill_mode = match &options.spill.dir {
            Some(dir) => {
                std::fs::create_dir_all(dir).map_err(|source| EngineError::SpillDir { dir: dir.clone(), source })?;
                DiskManagerMode::Directories(vec![dir.clone()])
            }
            None => DiskManagerMode::OsTmpDirectory,
        };
        let runtime = RuntimeEnvBuilder::new()
            .with_memory_pool(memory.pool())
            .with_disk_manager_builder(DiskManagerBuilder::default().with_mode(spill_mode).with_max_temp_directory_size(options.spill.max_bytes));
        let pushdown = match &options.pushdown {
            Some(p) => Some(crate::hybrid::Pushdown::new(p.clone()).map_err(EngineError::Pushdown)?),
            None => None,
        };
        let mut state = SessionStateBuilder::new()
            .with_config(config)
            .with_runtime_env(runtime.build_arc()?)
            .with_default_features()
            .with_statistics_registry(selectivity::registry());
        if let Some(p) = &pushdown {
            // Last, over the final plan: DataFusion's rules place the
            // filters and split the aggregations first.
            let mut rules = datafusion::physical_optimizer::optimizer::PhysicalOptimizer::new().rules;
            rules.push(Arc::new(crate::hybrid::HybridRule::new(p.clone())));
            rules.push(Arc::new(crate::bloom_join::BloomRule::new(p.clone())));
            state = state.with_physical_optimizer_rules(rules);
        }
        let state = state.build();
        let ctx = SessionContext::new_with_state(state);
        let tiers = crate::tiers::Tiers::new(&options.cache, options.memory_limit, &memory.pool(), options.requests.clone());
        if let Some(t) = &tiers {
            let weak: std::sync::Weak<dyn crate::memory::Reclaim> = Arc::downgrade(t) as std::sync::Weak<dyn crate::memory::Reclaim>;
            memory.set_reclaimer(weak);
            if t.ssd().is_some() {
                db.observe_uploads(Arc::new(crate::tiers::WriteThrough { tiers: t.clone(), location: db.location().clone() }));
            }
        }
        let source = source.with_tiers(tiers);
        let metadata = Arc::new(MetadataCache::new(&memory.pool()));
        db.account_caches_in(&memory.pool());
        let tables = Arc::new(BlobSchemaProvider::new(db.clone(), options.clone(), metadata, source.clone()));
        ctx.catalog(CATALOG)
            .expect("the default catalog exists")
            .register_schema("public", tables.clone())?;
        Ok(Engine { db, ctx, options, store_options, source, memory, tables, pushdown, txn: std::sync::Mutex::new(TxnMode::Autocommit) })
    }

    /// Another session on the same open database: it shares the download
    /// manager, the caching tiers, the memory pool, the footer cache and
    /// the storage node with this one (what a server's connections share),
    /// and has its own DataFusion settings and its own transaction. `SET`
    /// of blobhouse's engine-wide settings (memory_limit, cache_*,
    /// pushdown) still changes them for every session.
    pub fn new_session(&self) -> Engine {
        // SessionState's clone copies the settings and shares the runtime
        // (memory pool, disk manager) and the catalog list.
        let ctx = SessionContext::new_with_state(self.ctx.state());
        Engine {
            db: self.db.clone(),
            ctx,
            options: self.options.clone(),
            store_options: self.store_options.clone(),
            source: self.source.clone(),
            memory: self.memory.clone(),
            tables: self.tables.clone(),
            pushdown: self.pushdown.clone(),
            txn: std::sync::Mutex::new(TxnMode::Autocommit),
        }
    }

    /// What `sql` (one statement, `$1`… placeholders allowed) will return
    /// and which parameters it takes, without running it — what the
    /// PostgreSQL extended protocol's Describe asks before Execute. It
    /// reads the database version of now (or the open transaction's).
    pub async fn describe(&self, sql: &str) -> Result<Described, EngineError> {
        if words_are(sql, &["show", "cache"]) || is_show_memory_limit(sql) {
            return Ok(Described::RowsWhenRun);
        }
        let sql = if words_are(sql, &["show", "tables"]) { SHOW_TABLES } else { sql };
        let (rewritten, past) = match time_travel::rewrite(sql)? {
            Some((rewritten, past)) => (rewritten, past),
            None => (sql.to_string(), Vec::new()),
        };
        let sql = rewritten.as_str();
        if let Some(h) = history::parse(sql)? {
            return Ok(match h {
                History::ShowSnapshots | History::ShowStorage | History::ShowVersions { .. } | History::Vacuum { dry_run: true, .. } => Described::RowsWhenRun,
                _ => Described::Command { parameters: Vec::new() },
            });
        }
        if parse_copy_from(sql)?.is_some() || parse_copy_to(sql)?.is_some() || optimize::parse_optimize(sql).is_some() {
            return Ok(Described::Command { parameters: Vec::new() });
        }
        let state = self.ctx.state();
        let mut statement = state.sql_to_statement(sql, &state.config().options().sql_parser.dialect)?;
        let renames = names::plan_unique(&mut statement);
        if transaction_control(&statement)?.is_some() {
            return Ok(Described::Command { parameters: Vec::new() });
        }
        let view = match &*self.txn.lock().expect("txn lock") {
            TxnMode::Explicit(slot) | TxnMode::Aborted(slot, _) => slot.try_lock().ok().and_then(|t| t.as_ref().map(Transaction::view)),
            TxnMode::Autocommit => None,
        };
        let view = match view {
            Some(v) => v,
            None => self.db.refresh().await?,
        };
        let slot: TxnSlot = Arc::new(tokio::sync::Mutex::new(None));
        let ctx = self.statement_context(&Scope { view, txn: slot, past }).await?;
        // A statement that returns rows must plan here; one that does not
        // may be one DataFusion cannot plan but blobhouse runs (DELETE and
        // UPDATE are rewritten before planning).
        let returns_rows = match &statement {
            DFStatement::Statement(s) => matches!(**s, datafusion::sql::sqlparser::ast::Statement::Query(_)),
            DFStatement::Explain(_) => true,
            _ => false,
        };
        let plan = match ctx.state().statement_to_plan(statement).await {
            Ok(plan) => plan,
            Err(_) if !returns_rows => return Ok(Described::Command { parameters: Vec::new() }),
            Err(e) => return Err(e.into()),
        };
        let parameters = plan.get_parameter_types()?;
        let mut ordered: Vec<(usize, Option<DataType>)> =
            parameters.into_iter().filter_map(|(name, t)| name.trim_start_matches('$').parse::<usize>().ok().map(|i| (i, t))).collect();
        ordered.sort_by_key(|(i, _)| *i);
        let count = ordered.last().map_or(0, |(i, _)| *i);
        let mut parameters = vec![None; count];
        for (i, t) in ordered {
            if i >= 1 {
                parameters[i - 1] = t;
            }
        }
        Ok(match plan {
            LogicalPlan::Ddl(_) | LogicalPlan::Dml(_) | LogicalPlan::Statement(_) | LogicalPlan::Copy(_) => Described::Command { parameters },
            plan => Described::Rows { schema: renames.schema(&Arc::new(plan.schema().as_arrow().clone())), parameters },
        })
    }

    /// The engine's memory budget (limit, what is reserved, peaks).
    pub fn memory(&self) -> &MemoryBudget {
        &self.memory
    }

    /// Changes the memory limit of the running engine (what `SET
    /// memory_limit` does): the budget, and what sorts set aside for merging.
    pub fn set_memory_limit(&self, limit: Option<usize>) {
        self.memory.set_limit(limit);
        self.ctx.state_ref().write().config_mut().options_mut().execution.sort_spill_reservation_bytes = sort_merge_reservation(limit);
    }

    /// The directories spill files go to (created on first spill).
    pub fn spill_dirs(&self) -> Vec<PathBuf> {
        self.ctx.runtime_env().disk_manager.temp_dir_paths()
    }

    /// The download manager reading this database's data, if any (stores
    /// that presign to plain HTTP; see [`DataSource`]).
    pub fn download_manager(&self) -> Option<&DownloadManager> {
        self.source.download_manager()
    }

    /// `SET` / `RESET` (`value` `None`) of a cache setting.
    fn set_cache(&self, variable: &str, value: Option<&str>) -> Result<(), EngineError> {
        let setting = |message: String| EngineError::Setting { variable: variable.to_string(), message };
        let tiers = self.tiers().ok_or_else(|| setting("this engine has no caching tiers (it was opened with the caches off)".into()))?;
        let text = value.map(|v| v.trim().trim_matches('\'').to_string());
        match variable.trim_start_matches("blobhouse.") {
            "cache_memory" => {
                // 0 (or 'off') empties the tier and stops it admitting.
                let bytes = text.map(|t| crate::tiers::parse_cache_size(&t)).transpose().map_err(setting)?;
                tiers.set_memory_capacity(bytes).map_err(setting)
            }
            _ => {
                let policy = text.map(|t| blobhouse_cache::PolicyKind::parse(&t).ok_or_else(|| setting(format!("unknown policy '{t}': use 'lru', 'lfu' or 'wlfu'")))).transpose()?;
                tiers.set_memory_policy(policy).map_err(setting)
            }
        }
    }

    /// `SHOW CACHE`: a row per tier.
    fn show_cache(&self, started: Instant) -> QueryResult {
        let rows = self.tiers().map(|t| t.describe()).unwrap_or_default();
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
            Arc::new(rows.iter().map(|r| hit_rate(r.hits, r.misses)).collect::<datafusion::arrow::array::Float64Array>()),
            u(|r| r.served),
            u(|r| r.evicted),
            Arc::new(rows.iter().map(|r| Some(r.note.as_str())).collect::<StringArray>()),
        ];
        let batch = RecordBatch::try_new(schema.clone(), columns).expect("SHOW CACHE batch");
        QueryResult { batches: vec![batch], ..empty_result(started).with_schema(schema) }
    }

    /// The storage node its scans push work to, if any.
    pub fn pushdown(&self) -> Option<&Arc<crate::hybrid::Pushdown>> {
        self.pushdown.as_ref()
    }

    /// `SET pushdown = 'off' | 'on' | 'auto'` and `SET pushdown_bloom = on |
    /// off`; `RESET` (`None`) restores the configured mode (and Bloom
    /// probes on).
    fn set_pushdown(&self, variable: &str, value: Option<&str>) -> Result<(), EngineError> {
        let setting = |message: String| EngineError::Setting { variable: variable.to_string(), message };
        let p = self.pushdown.as_ref().ok_or_else(|| setting("this engine has no storage node (open it with --storage-node URL)".into()))?;
        if variable.trim_start_matches("blobhouse.") == "pushdown_bloom" {
            let on = match value.map(|v| v.trim().trim_matches('\'').to_ascii_lowercase()) {
                None => true,
                Some(v) if v == "on" || v == "true" => true,
                Some(v) if v == "off" || v == "false" => false,
                Some(v) => return Err(setting(format!("'{v}' is not on or off"))),
            };
            p.set_bloom(on);
            return Ok(());
        }
        let mode = match value {
            None => self.options.pushdown.as_ref().map_or(crate::hybrid::PushdownMode::Off, |o| o.mode),
            Some(v) => {
                let t = v.trim().trim_matches('\'');
                crate::hybrid::PushdownMode::parse(t).ok_or_else(|| setting(format!("unknown mode '{t}': use 'off', 'on' or 'auto'")))?
            }
        };
        p.set_mode(mode);
        Ok(())
    }

    /// The caching tiers its scans consult, if any.
    pub fn tiers(&self) -> Option<&Arc<crate::tiers::Tiers>> {
        self.source.tiers()
    }

    /// The storage handle.
    pub fn database(&self) -> &Arc<Database> {
        &self.db
    }

    /// The engine's settings.
    pub fn options(&self) -> &EngineOptions {
        &self.options
    }

    /// The DataFusion context every statement of this session starts
    /// from. Embedders extend it before opening sessions: functions they
    /// register are callable in every statement, and schemas they add to
    /// its default catalog (beside `public`, the tables) are visible to
    /// every statement — how the server adds PostgreSQL's `pg_catalog`.
    pub fn session(&self) -> &SessionContext {
        &self.ctx
    }

    /// Runs every statement of a script, in order; stops at the first error.
    pub async fn execute_script(&self, sql: &str) -> Result<Vec<QueryResult>, EngineError> {
        let mut out = Vec::new();
        for statement in split_statements(sql) {
            out.push(self.execute(&statement).await?);
        }
        Ok(out)
    }

    /// Runs one statement. Outside a transaction it sees every version
    /// committed before it started and commits on its own; inside BEGIN …
    /// COMMIT it sees the transaction's snapshot and own changes.
    pub async fn execute(&self, sql: &str) -> Result<QueryResult, EngineError> {
        let started = Instant::now();
        self.memory.reset_peak();
        memory::reset_peak_rss();
        let mut result = self.execute_statement(sql, started, false).await?.collect(started).await?;
        self.record_memory(&mut result);
        Ok(result)
    }

    /// Runs one statement as [`Engine::execute`] does, except that a
    /// query's rows are returned as they are computed rather than
    /// collected: a client can take the first rows while the rest are
    /// being computed, and a large result never sits in memory whole.
    /// Other statements answer [`Answer::Done`].
    pub async fn execute_streaming(&self, sql: &str) -> Result<Answer, EngineError> {
        let started = Instant::now();
        self.memory.reset_peak();
        memory::reset_peak_rss();
        match self.execute_statement(sql, started, true).await? {
            Answer::Done(mut result) => {
                self.record_memory(&mut result);
                Ok(Answer::Done(result))
            }
            rows => Ok(rows),
        }
    }

    /// Fills in what the statement held: the budget's and the process's peaks.
    fn record_memory(&self, result: &mut QueryResult) {
        result.memory.pool_peak = self.memory.peak() as u64;
        result.memory.limit = self.memory.limit().map(|l| l as u64);
        result.memory.rss_peak = memory::process_memory().map(|m| m.peak_rss);
    }

    /// Begins a transaction (what `BEGIN` does): later statements read the
    /// database version of now plus their own changes, and their changes
    /// become visible together at [`Engine::commit`].
    pub async fn begin(&self) -> Result<(), EngineError> {
        if !matches!(*self.txn.lock().expect("txn lock"), TxnMode::Autocommit) {
            return Err(EngineError::transaction(TxnRule::InProgress, "there is already a transaction in progress (COMMIT or ROLLBACK it first)"));
        }
        let snapshot = self.db.refresh().await?;
        let slot = Arc::new(tokio::sync::Mutex::new(Some(Transaction::begin(&self.db, snapshot))));
        *self.txn.lock().expect("txn lock") = TxnMode::Explicit(slot);
        Ok(())
    }

    /// Commits the transaction (`COMMIT`). A serialization failure or
    /// conflict rolls it back and is returned; so is an earlier failed
    /// statement (nothing is committed then). Without a transaction: nothing
    /// to do.
    pub async fn commit(&self) -> Result<(), EngineError> {
        let mode = std::mem::replace(&mut *self.txn.lock().expect("txn lock"), TxnMode::Autocommit);
        match mode {
            TxnMode::Autocommit => Ok(()),
            TxnMode::Explicit(slot) => {
                let txn = slot.lock().await.take();
                if let Some(txn) = txn {
                    txn.commit().await?;
                }
                Ok(())
            }
            TxnMode::Aborted(slot, cause) => {
                if let Some(txn) = slot.lock().await.take() {
                    txn.rollback().await;
                }
                Err(EngineError::transaction(TxnRule::Aborted, format!("the transaction was rolled back, not committed: a statement in it failed ({cause})")))
            }
        }
    }

    /// Rolls the transaction back (`ROLLBACK`): deletes what it uploaded.
    pub async fn rollback(&self) {
        let mode = std::mem::replace(&mut *self.txn.lock().expect("txn lock"), TxnMode::Autocommit);
        if let TxnMode::Explicit(slot) | TxnMode::Aborted(slot, _) = mode
            && let Some(txn) = slot.lock().await.take()
        {
            txn.rollback().await;
        }
    }

    /// Marks an open transaction aborted by `cause` (a refused control
    /// statement such as ROLLBACK TO SAVEPOINT: what it asked to undo is
    /// not undone, so nothing of the transaction may commit).
    fn abort_transaction(&self, cause: &EngineError) {
        let mut mode = self.txn.lock().expect("txn lock");
        if let TxnMode::Explicit(slot) = &*mode {
            *mode = TxnMode::Aborted(slot.clone(), cause.to_string());
        }
    }

    /// What aborted the open transaction, if one is open and aborted.
    fn aborted_by(&self) -> Option<String> {
        match &*self.txn.lock().expect("txn lock") {
            TxnMode::Aborted(_, cause) => Some(cause.clone()),
            _ => None,
        }
    }

    /// Whether the open transaction is aborted (a statement in it failed:
    /// only ROLLBACK or COMMIT, which rolls it back, are taken).
    pub fn in_aborted_transaction(&self) -> bool {
        self.aborted_by().is_some()
    }

    /// Whether a transaction begun with BEGIN is open (aborted or not).
    pub fn in_transaction(&self) -> bool {
        !matches!(*self.txn.lock().expect("txn lock"), TxnMode::Autocommit)
    }

    async fn execute_statement(&self, sql: &str, started: Instant, stream: bool) -> Result<Answer, EngineError> {
        if words_are(sql, &["show", "cache"]) {
            return Ok(Answer::Done(self.show_cache(started)));
        }
        if is_show_memory_limit(sql) {
            let value = self.memory.limit().map_or("none".to_string(), |l| format_bytes(l as u64));
            return Ok(Answer::Done(setting_result("memory_limit", &value, started)));
        }
        let sql = if words_are(sql, &["show", "tables"]) { SHOW_TABLES } else { sql };
        // Time travel is rewritten into schemas before anything parses the SQL.
        let (rewritten, past) = match time_travel::rewrite(sql)? {
            Some((rewritten, past)) => (rewritten, past),
            None => (sql.to_string(), Vec::new()),
        };
        let sql = rewritten.as_str();
        let parsed = match (history::parse(sql)?, parse_copy_from(sql)?, parse_copy_to(sql)?, optimize::parse_optimize(sql)) {
            (Some(h), _, _, _) => Parsed::History(h),
            (None, Some(copy), _, _) => Parsed::Copy(copy),
            (None, None, Some(copy), _) => Parsed::CopyTo(copy),
            (None, None, None, Some(table)) => Parsed::Optimize(table),
            (None, None, None, None) => Parsed::Sql(self.ctx.state().sql_to_statement(sql, &self.ctx.state().config().options().sql_parser.dialect)?),
        };
        let mut parsed = parsed;
        let renames = match &mut parsed {
            Parsed::Sql(statement) => names::plan_unique(statement),
            _ => names::Renames::default(),
        };
        let answer = self.run_parsed(sql, parsed, past, started, stream).await?;
        if renames.is_empty() {
            return Ok(answer);
        }
        Ok(match answer {
            Answer::Done(mut result) => {
                result.schema = renames.schema(&result.schema);
                result.batches = renames.batches(&result.schema, std::mem::take(&mut result.batches));
                Answer::Done(result)
            }
            Answer::Rows(rows) => {
                let schema = renames.schema(&rows.schema);
                let relabel = schema.clone();
                let batches = rows.batches.map_ok(move |b| RecordBatch::try_new(relabel.clone(), b.columns().to_vec()).unwrap_or(b));
                Answer::Rows(RowStream { batches: Box::pin(RecordBatchStreamAdapter::new(schema.clone(), batches)), schema })
            }
        })
    }

    /// Runs a parsed statement: transaction control, or a statement in
    /// the open transaction or in one of its own.
    async fn run_parsed(&self, sql: &str, parsed: Parsed, past: Vec<AsOf>, started: Instant, stream: bool) -> Result<Answer, EngineError> {
        if let Parsed::Sql(statement) = &parsed
            && let Some(control) = transaction_control(statement).inspect_err(|e| self.abort_transaction(e))?
        {
            let mut result = empty_result(started);
            match control {
                // PostgreSQL's answer to BEGIN inside a transaction: a
                // warning, and the transaction goes on. (An error here
                // would make retry loops that BEGIN again spin.)
                Control::Begin if self.aborted_by().is_some() => {
                    return Err(EngineError::TransactionAborted { cause: self.aborted_by().unwrap_or_default() });
                }
                Control::Begin if self.in_transaction() => result.notices.push(Notice {
                    severity: "WARNING",
                    sqlstate: "25001",
                    message: "there is already a transaction in progress".into(),
                }),
                Control::Begin => self.begin().await?,
                Control::Commit => match self.commit().await {
                    Ok(()) => {}
                    // COMMIT of an aborted transaction rolls it back and
                    // says so, as PostgreSQL does; it is not an error.
                    Err(EngineError::Transaction { rule: TxnRule::Aborted, message }) => {
                        result.rolled_back = true;
                        result.notices.push(Notice { severity: "WARNING", sqlstate: "25P02", message });
                    }
                    Err(e) => return Err(e),
                },
                Control::Rollback => self.rollback().await,
                Control::Savepoint => match &*self.txn.lock().expect("txn lock") {
                    TxnMode::Explicit(_) => {}
                    TxnMode::Aborted(_, cause) => {
                        return Err(EngineError::transaction(TxnRule::Aborted, format!("the transaction is aborted by an earlier failed statement ({cause}): ROLLBACK it")));
                    }
                    TxnMode::Autocommit => return Err(EngineError::transaction(TxnRule::NoTransaction, "SAVEPOINT can only be used inside BEGIN … COMMIT")),
                },
            }
            return Ok(Answer::Done(result));
        }
        // Inside BEGIN … COMMIT the statement joins the transaction, which
        // counts as aborted until the statement has succeeded (so a failed
        // or cancelled statement leaves it aborted).
        let explicit = {
            let mut mode = self.txn.lock().expect("txn lock");
            match &*mode {
                TxnMode::Autocommit => None,
                TxnMode::Aborted(_, cause) => return Err(EngineError::TransactionAborted { cause: cause.clone() }),
                TxnMode::Explicit(slot) => {
                    let slot = slot.clone();
                    *mode = TxnMode::Aborted(slot.clone(), format!("'{}' did not finish", abbreviate(sql)));
                    Some(slot)
                }
            }
        };
        match explicit {
            Some(slot) => {
                let view = slot.lock().await.as_ref().map(Transaction::view).ok_or_else(|| EngineError::transaction(TxnRule::Ended, "the transaction has ended"))?;
                let read = view.version;
                let result = self.run_in_scope_streaming(parsed, Scope { view, txn: slot.clone(), past }, started, stream).await;
                let result = self.explain_expiry(result, read).await;
                let mut mode = self.txn.lock().expect("txn lock");
                *mode = match &result {
                    Ok(_) => TxnMode::Explicit(slot),
                    Err(e) => TxnMode::Aborted(slot, e.to_string()),
                };
                result
            }
            None => {
                // CREATE SNAPSHOT of now reads nothing: it names the version
                // its commit builds on, and the commit decides on the newest
                // version (a handle that saw it a moment ago lists nothing).
                if let Parsed::History(History::CreateSnapshot { name, at: None }) = &parsed {
                    let change = blobhouse_storage::Change::CreateSnapshot { name: name.clone(), version: None, created_at_ms: blobhouse_storage::format::now_ms() };
                    self.db.commit(&[change]).await?;
                    return Ok(Answer::Done(empty_result(started)));
                }
                // A statement of its own: one transaction, committed at its end.
                let snapshot = match plain_query(&parsed) {
                    Some(statement) => match self.plan_while_refreshing(statement, &past, started, stream).await? {
                        Refreshed::Ran(result) => return result,
                        Refreshed::Newer(newest) => newest,
                    },
                    None => self.db.refresh().await?,
                };
                let slot: TxnSlot = Arc::new(tokio::sync::Mutex::new(Some(Transaction::begin(&self.db, snapshot.clone()))));
                let read = snapshot.version;
                if stream && plain_query(&parsed).is_some() {
                    // A query changes nothing: its transaction ends without a commit.
                    let result = self.run_in_scope_streaming(parsed, Scope { view: snapshot, txn: slot.clone(), past }, started, true).await;
                    if let Some(txn) = slot.lock().await.take() {
                        txn.rollback().await;
                    }
                    return self.explain_expiry(result, read).await;
                }
                let result = self.run_in_scope(parsed, Scope { view: snapshot, txn: slot.clone(), past }, started).await;
                let result = self.explain_expiry(result, read).await;
                let txn = slot.lock().await.take();
                match (result, txn) {
                    (Ok(mut r), Some(txn)) => {
                        txn.commit().await?;
                        // The statement's time includes its commit.
                        r.elapsed = started.elapsed();
                        Ok(Answer::Done(r))
                    }
                    (Ok(r), None) => Ok(Answer::Done(r)),
                    (Err(e), txn) => {
                        if let Some(txn) = txn {
                            txn.rollback().await;
                        }
                        Err(e)
                    }
                }
            }
        }
    }

    /// Runs a query of its own (autocommit) on the newest version, hiding
    /// the store's round trip that finds it: the query is planned on the
    /// newest version this handle knows while the store is asked for the
    /// newest (a LIST; ~1 ms over a LAN, where planning an SSB star join
    /// takes 4–6 ms). When no commit came in between, that plan is the
    /// plan of the newest version and runs; otherwise the newest version
    /// is returned, for the query to be planned again on it. Either way
    /// the query reads a version at least as new as every commit that
    /// finished before it started, as every statement does.
    async fn plan_while_refreshing(&self, statement: &DFStatement, past: &[AsOf], started: Instant, stream: bool) -> Result<Refreshed, EngineError> {
        let known = self.db.current();
        let slot: TxnSlot = Arc::new(tokio::sync::Mutex::new(Some(Transaction::begin(&self.db, known.clone()))));
        let scope = Scope { view: known.clone(), txn: slot.clone(), past: past.to_vec() };
        let (newest, planned) = tokio::join!(self.db.refresh(), self.plan_query(statement.clone(), &scope));
        let newest = newest?;
        if newest.version != known.version {
            return Ok(Refreshed::Newer(newest));
        }
        let result = match planned {
            Ok(Some(planned)) if stream => stream_planned(planned).map(Answer::Rows),
            Ok(Some(planned)) => run_planned(planned, started).await.map(Answer::Done).map_err(EngineError::Query),
            // Not a plain query after all (SELECT … INTO creates a table).
            Ok(None) => return Ok(Refreshed::Newer(newest)),
            Err(e) => Err(e),
        };
        let result = self.explain_expiry(result, known.version).await;
        // A query changes nothing: its transaction ends without a commit.
        if let Some(txn) = slot.lock().await.take() {
            txn.rollback().await;
        }
        Ok(Refreshed::Ran(result))
    }

    /// Plans a statement in `scope` down to the physical plan when it is a
    /// plain query (its plan reads and returns rows, nothing else);
    /// `None` otherwise.
    async fn plan_query(&self, statement: DFStatement, scope: &Scope) -> Result<Option<Planned>, EngineError> {
        let ctx = self.statement_context(scope).await?;
        let plan = ctx.state().statement_to_plan(statement).await?;
        if matches!(
            plan,
            LogicalPlan::Ddl(_) | LogicalPlan::Dml(_) | LogicalPlan::Statement(_) | LogicalPlan::DescribeTable(_) | LogicalPlan::Copy(_) | LogicalPlan::Explain(_) | LogicalPlan::Analyze(_)
        ) {
            return Ok(None);
        }
        let df = ctx.execute_logical_plan(plan).await?;
        Ok(Some(plan_physical(df).await?))
    }

    /// [`Engine::run_in_scope`], but a query's rows are streamed when
    /// `stream` asks for it.
    async fn run_in_scope_streaming(&self, parsed: Parsed, scope: Scope, started: Instant, stream: bool) -> Result<Answer, EngineError> {
        if stream
            && let Some(statement) = plain_query(&parsed)
            && let Some(planned) = self.plan_query(statement.clone(), &scope).await?
        {
            return stream_planned(planned).map(Answer::Rows);
        }
        self.run_in_scope(parsed, scope, started).await.map(Answer::Done)
    }

    /// An object that a statement reading version `read` needed was gone:
    /// when a VACUUM has since moved the horizon past `read`, say so (the
    /// statement outlived the retention), rather than report a missing
    /// object as if the database were damaged.
    async fn explain_expiry<T>(&self, result: Result<T, EngineError>, read: u64) -> Result<T, EngineError> {
        let Err(e) = result else { return result };
        let text = e.to_string();
        let missing = ["not found", "NotFound", "NoSuchKey", "404"].iter().any(|m| text.contains(m));
        match self.db.refresh().await {
            Ok(now) if missing && now.gc.horizon > read => Err(EngineError::transaction(TxnRule::Expired, format!(
                "this statement read version {read}, which a VACUUM expired while it ran (versions before {} are gone): run it again, and keep VACUUM's RETAIN longer than your longest statement or transaction ({text})",
                now.gc.horizon
            ))),
            _ => Err(e),
        }
    }

    /// A DataFusion session for one statement: the session's settings and
    /// functions, with the tables seen through `scope`.
    async fn statement_context(&self, scope: &Scope) -> Result<SessionContext, EngineError> {
        let catalog = MemoryCatalogProvider::new();
        let public = Arc::new(self.tables.scoped(scope.clone(), false));
        let dml = Arc::new(self.tables.scoped(scope.clone(), true));
        catalog.register_schema("public", public).expect("memory catalog registers");
        catalog.register_schema(DML_SCHEMA, dml).expect("memory catalog registers");
        // Schemas an embedder registered beside the tables (a server's
        // pg_catalog) are seen by every statement.
        let default_catalog = self.ctx.state().config().options().catalog.default_catalog.clone();
        if let Some(base) = self.ctx.catalog(&default_catalog) {
            for name in base.schema_names().into_iter().filter(|n| n != "public" && n != DML_SCHEMA) {
                if let Some(schema) = base.schema(&name) {
                    catalog.register_schema(&name, schema).expect("memory catalog registers");
                }
            }
        }
        for at in &scope.past {
            let version = self.past_version(scope, at).await?;
            catalog.register_schema(&at.schema(), Arc::new(self.tables.at(version))).expect("memory catalog registers");
        }
        let catalogs = MemoryCatalogProviderList::new();
        catalogs.register_catalog(default_catalog, Arc::new(catalog));
        // The statement's operators take from the engine's budget through a
        // pool of its own, so that one statement over its share of a spent
        // budget fails rather than the others (memory::StatementPool).
        let base = self.ctx.state();
        let runtime = RuntimeEnvBuilder::from_runtime_env(base.runtime_env()).with_memory_pool(self.memory.statement_pool()).build_arc()?;
        let state = SessionStateBuilder::new_from_existing(base).with_catalog_list(Arc::new(catalogs)).with_runtime_env(runtime).build();
        Ok(SessionContext::new_with_state(state))
    }

    /// The number of the version `at` names, as `scope` sees the history.
    async fn past_version_number(&self, scope: &Scope, at: &AsOf) -> Result<u64, EngineError> {
        let v = match at {
            AsOf::Version(v) => *v,
            AsOf::Timestamp(ms) => self.db.version_at(*ms).await?,
            AsOf::Snapshot(name) => scope.view.snapshots.get(name).ok_or_else(|| StorageError::SnapshotNotFound(name.clone()))?.version,
        };
        if v < scope.view.gc.horizon && !scope.view.snapshots.values().any(|s| s.version == v) {
            return Err(StorageError::VersionExpired { version: v, horizon: scope.view.gc.horizon }.into());
        }
        if v == 0 {
            return Err(EngineError::Unsupported("version 0 is the empty database; versions start at 1 (SHOW VERSIONS lists them)".into()));
        }
        Ok(v)
    }

    /// The version `at` names.
    async fn past_version(&self, scope: &Scope, at: &AsOf) -> Result<Arc<CatalogVersion>, EngineError> {
        let v = self.past_version_number(scope, at).await?;
        if v == scope.view.version {
            return Ok(scope.view.clone());
        }
        Ok(Arc::new(self.db.read_version(v).await?))
    }

    async fn run_in_scope(&self, parsed: Parsed, scope: Scope, started: Instant) -> Result<QueryResult, EngineError> {
        let statement = match parsed {
            Parsed::History(h) => return self.run_history(&scope, h, started).await,
            Parsed::Copy(copy) => {
                let rows = self.copy_from(&copy, &scope).await?;
                return Ok(count_result(rows, started));
            }
            Parsed::Optimize(table) => {
                let rows = self.optimize(&scope, &table).await?;
                return Ok(count_result(rows, started));
            }
            Parsed::CopyTo(copy) => {
                let rows = self.copy_to(&scope, &copy).await?;
                return Ok(count_result(rows, started));
            }
            Parsed::Sql(statement) => statement,
        };
        let ctx = self.statement_context(&scope).await?;
        if let DFStatement::Statement(s) = &statement {
            let columns = |t: &str| scope.view.tables.get(t).map(|e| e.schema.fields().iter().map(|f| f.name().clone()).collect());
            if let Some(dml) = dml::rewrite(s, columns)? {
                let rows = self.run_dml(&ctx, &scope, dml).await?;
                return Ok(count_result(rows, started));
            }
        }
        let plan = ctx.state().statement_to_plan(statement).await?;
        match plan {
            LogicalPlan::Ddl(DdlStatement::CreateMemoryTable(create)) => {
                let rows = self.create_table(&ctx, &scope, create).await?;
                Ok(count_result(rows, started))
            }
            LogicalPlan::Ddl(DdlStatement::DropTable(drop)) => {
                let name = table_name(&drop.name)?;
                stage(&scope, |t| t.drop_table(&name, drop.if_exists)).await?;
                Ok(empty_result(started))
            }
            LogicalPlan::Ddl(other) => Err(EngineError::Unsupported(format!(
                "{} is not supported yet; blobhouse supports CREATE TABLE [AS SELECT], DROP TABLE, INSERT, DELETE, UPDATE, COPY … FROM and queries",
                other.name()
            ))),
            LogicalPlan::Statement(Statement::SetVariable(set)) if is_cache_setting(&set.variable) => {
                self.set_cache(&set.variable, Some(set.value.as_str()))?;
                Ok(empty_result(started))
            }
            LogicalPlan::Statement(Statement::ResetVariable(reset)) if is_cache_setting(&reset.variable) => {
                self.set_cache(&reset.variable, None)?;
                Ok(empty_result(started))
            }
            LogicalPlan::Statement(Statement::SetVariable(set)) if is_pushdown_setting(&set.variable) => {
                self.set_pushdown(&set.variable, Some(set.value.as_str()))?;
                Ok(empty_result(started))
            }
            LogicalPlan::Statement(Statement::ResetVariable(reset)) if is_pushdown_setting(&reset.variable) => {
                self.set_pushdown(&reset.variable, None)?;
                Ok(empty_result(started))
            }
            LogicalPlan::Statement(Statement::SetVariable(set)) if is_memory_limit(&set.variable) => {
                self.set_memory_limit(parse_limit(&set.value).map_err(|message| EngineError::Setting { variable: set.variable.clone(), message })?);
                Ok(empty_result(started))
            }
            LogicalPlan::Statement(Statement::ResetVariable(reset)) if is_memory_limit(&reset.variable) => {
                self.set_memory_limit(self.options.memory_limit);
                Ok(empty_result(started))
            }
            LogicalPlan::DescribeTable(describe) => Ok(describe_result(&describe, started)),
            plan @ LogicalPlan::Statement(Statement::SetVariable(_) | Statement::ResetVariable(_)) => {
                // Settings are the session's: they outlive the statement.
                self.ctx.execute_logical_plan(plan).await?.collect().await?;
                Ok(empty_result(started))
            }
            plan => {
                let analyze = matches!(plan, LogicalPlan::Analyze(_));
                let df = ctx.execute_logical_plan(plan).await?;
                let result = run_plan(df, started).await.map_err(EngineError::Query);
                let mut result = result?;
                if analyze {
                    // EXPLAIN ANALYZE: one more row with what the query held.
                    self.record_memory(&mut result);
                    let text = result.memory.describe();
                    append_explain_row(&mut result, "Memory", &text);
                    if let Some(cache) = result.scan.cache_summary() {
                        append_explain_row(&mut result, "Cache", &cache);
                    }
                }
                Ok(result)
            }
        }
    }

    /// Runs a DELETE or UPDATE: its SELECT of row ids (and new values),
    /// then the deletion vectors and new data objects, staged in the
    /// statement's transaction. Returns the rows deleted or updated.
    async fn run_dml(&self, ctx: &SessionContext, scope: &Scope, dml: dml::DmlQuery) -> Result<u64, EngineError> {
        let entry = scope.view.tables.get(&dml.table).cloned().ok_or_else(|| StorageError::TableNotFound(dml.table.clone()))?;
        let data = self.db.table_data(&entry).await?;
        let table_schema = Arc::new(entry.schema.clone());
        let plan = ctx.state().create_logical_plan(&dml.sql).await?;
        // New values take the column's type, as INSERT's do.
        let mut exprs = vec![Expr::Column(Column::new_unqualified(ROW_ID_COLUMN))];
        if dml.kind == dml::DmlKind::Update {
            for (i, f) in table_schema.fields().iter().enumerate() {
                exprs.push(cast(Expr::Column(Column::new_unqualified(format!("__v{i}"))), f.data_type().clone()).alias(f.name()));
            }
        }
        let plan = LogicalPlanBuilder::from(plan).project(exprs)?.build()?;
        let mut stream = ctx.execute_logical_plan(plan).await?.execute_stream().await?;
        let mut deleted: std::collections::BTreeMap<u32, RoaringBitmap> = Default::default();
        let mut writer = (dml.kind == dml::DmlKind::Update).then(|| TableWriter::new(self.db.clone(), table_schema.clone(), self.options.write.clone()));
        let mut rows = 0u64;
        let outcome: Result<(), EngineError> = async {
            while let Some(batch) = stream.next().await {
                let batch = batch?;
                let ids = batch.column(0).as_any().downcast_ref::<UInt64Array>().expect("row ids are UInt64");
                for id in ids.values() {
                    let fresh = deleted.entry((id >> 32) as u32).or_default().insert(*id as u32);
                    if !fresh {
                        return Err(EngineError::Unsupported(format!("{} {}: a row matched twice; the statement had no effect", if writer.is_some() { "UPDATE" } else { "DELETE" }, dml.table)));
                    }
                }
                rows += batch.num_rows() as u64;
                if let Some(w) = writer.as_mut() {
                    let values = RecordBatch::try_new(table_schema.clone(), batch.columns()[1..].to_vec()).map_err(DataFusionError::from)?;
                    w.write(&values).await?;
                }
            }
            Ok(())
        }
        .await;
        if let Err(e) = outcome {
            if let Some(w) = writer {
                w.abort().await;
            }
            return Err(e);
        }
        let objects = match writer {
            Some(w) => w.finish().await?,
            None => Vec::new(),
        };
        let by_ordinal: std::collections::HashMap<u32, &LiveObject> = data.objects.iter().map(|l| (l.ordinal, l)).collect();
        let mut vectors = Vec::with_capacity(deleted.len());
        for (ordinal, new) in deleted {
            let live = by_ordinal.get(&ordinal).ok_or_else(|| EngineError::Unsupported(format!("{}: row id of unknown data object {ordinal}", dml.table)))?;
            let union = match &live.deleted {
                Some(old) => old.as_ref() | &new,
                None => new,
            };
            vectors.push((data.object(live).key, live.manifest, live.vector, union));
        }
        let mut slot = scope.txn.lock().await;
        let txn = joined(&self.db, &mut slot, &objects).await?;
        txn.record_uploads(objects.iter().map(|o| o.path.clone()));
        txn.delete(&dml.table, vectors).await?;
        if !objects.is_empty() {
            txn.append(&dml.table, entry.id, objects).await?;
        }
        Ok(rows)
    }

    /// Snapshots, SHOW VERSIONS and RESTORE ([`crate::history`]).
    async fn run_history(&self, scope: &Scope, h: History, started: Instant) -> Result<QueryResult, EngineError> {
        match h {
            History::CreateSnapshot { name, at } => {
                let version = match &at {
                    Some(at) => Some(self.past_version_number(scope, at).await?),
                    // (On its own, it does not come here: execute_statement.)
                    None => {
                        let read_only = scope.txn.lock().await.as_ref().is_none_or(Transaction::is_read_only);
                        if !read_only {
                            return Err(EngineError::transaction(TxnRule::InProgress, "CREATE SNAPSHOT inside a transaction that changed something would name a version without those changes; COMMIT first, or give AT(VERSION => n)"));
                        }
                        Some(scope.view.version)
                    }
                };
                if version == Some(0) {
                    return Err(EngineError::Unsupported("the database has no version yet to snapshot".into()));
                }
                stage(scope, |t| t.create_snapshot(&name, version)).await?;
                Ok(empty_result(started))
            }
            History::DropSnapshot { name, if_exists } => {
                stage(scope, |t| t.drop_snapshot(&name, if_exists)).await?;
                Ok(empty_result(started))
            }
            History::Restore { tables, to } => {
                let target = self.past_version(scope, &to).await?;
                stage(scope, |t| t.restore(&target, tables.as_deref())).await?;
                Ok(empty_result(started))
            }
            History::Vacuum { retain, grace, dry_run } => {
                if self.in_transaction() {
                    return Err(EngineError::transaction(TxnRule::InProgress, "VACUUM cannot run inside a transaction block; COMMIT or ROLLBACK first"));
                }
                let report = blobhouse_storage::gc::vacuum(&self.db, retain, grace, dry_run).await?;
                Ok(vacuum_result(&report, dry_run, started))
            }
            History::ShowVersions { limit } => {
                let newest = scope.view.version.max(self.db.current().version);
                let oldest = scope.view.gc.horizon.max(1);
                let wanted: Vec<u64> = (oldest..=newest).rev().take(limit).collect();
                let fetches: Vec<_> = wanted.iter().map(|v| self.db.version_summary(*v)).collect();
                let summaries: Vec<VersionSummary> = futures::stream::iter(fetches).buffered(16).try_collect().await?;
                let schema = Arc::new(Schema::new(vec![
                    Field::new("version", DataType::UInt64, false),
                    Field::new("committed_at", DataType::Timestamp(TimeUnit::Millisecond, Some("UTC".into())), false),
                    Field::new("operation", DataType::Utf8, false),
                ]));
                let columns: Vec<ArrayRef> = vec![
                    Arc::new(summaries.iter().map(|s| s.version).collect::<UInt64Array>()),
                    Arc::new(TimestampMillisecondArray::from(summaries.iter().map(|s| s.committed_at_ms as i64).collect::<Vec<_>>()).with_timezone("UTC")),
                    Arc::new(summaries.iter().map(|s| Some(s.operation.as_str())).collect::<StringArray>()),
                ];
                let batch = RecordBatch::try_new(schema.clone(), columns).map_err(DataFusionError::from)?;
                Ok(QueryResult { batches: vec![batch], ..empty_result(started).with_schema(schema) })
            }
            History::ShowStorage => {
                // (kind, name, objects, bytes)
                let mut rows: Vec<(&str, String, u64, u64)> = Vec::new();
                for (name, t) in &scope.view.tables {
                    rows.push(("table", name.clone(), t.objects, t.bytes));
                }
                for (name, s) in &scope.view.snapshots {
                    let (objects, bytes) = self.pinned(scope, s.version).await?;
                    rows.push(("snapshot", name.clone(), objects, bytes));
                }
                let (objects, bytes, other) = blobhouse_storage::gc::awaiting(&self.db).await?;
                rows.push(("awaiting vacuum", format!("data objects retired since version {}", scope.view.gc.horizon.max(1)), objects, bytes));
                rows.push(("awaiting vacuum", "manifests and deletion vectors".into(), other, 0));
                let schema = Arc::new(Schema::new(vec![
                    Field::new("kind", DataType::Utf8, false),
                    Field::new("name", DataType::Utf8, false),
                    Field::new("objects", DataType::UInt64, false),
                    Field::new("bytes", DataType::UInt64, false),
                ]));
                let columns: Vec<ArrayRef> = vec![
                    Arc::new(rows.iter().map(|r| Some(r.0)).collect::<StringArray>()),
                    Arc::new(rows.iter().map(|r| Some(r.1.as_str())).collect::<StringArray>()),
                    Arc::new(rows.iter().map(|r| r.2).collect::<UInt64Array>()),
                    Arc::new(rows.iter().map(|r| r.3).collect::<UInt64Array>()),
                ];
                let batch = RecordBatch::try_new(schema.clone(), columns).map_err(DataFusionError::from)?;
                Ok(QueryResult { batches: vec![batch], ..empty_result(started).with_schema(schema) })
            }
            History::ShowSnapshots => {
                let mut rows = Vec::new();
                for (name, s) in &scope.view.snapshots {
                    let (_, pinned) = self.pinned(scope, s.version).await?;
                    rows.push((name.clone(), s.version, s.created_at_ms, pinned));
                }
                let schema = Arc::new(Schema::new(vec![
                    Field::new("name", DataType::Utf8, false),
                    Field::new("version", DataType::UInt64, false),
                    Field::new("created_at", DataType::Timestamp(TimeUnit::Millisecond, Some("UTC".into())), false),
                    Field::new("bytes_pinned", DataType::UInt64, false),
                ]));
                let columns: Vec<ArrayRef> = vec![
                    Arc::new(rows.iter().map(|r| Some(r.0.as_str())).collect::<StringArray>()),
                    Arc::new(rows.iter().map(|r| r.1).collect::<UInt64Array>()),
                    Arc::new(TimestampMillisecondArray::from(rows.iter().map(|r| r.2 as i64).collect::<Vec<_>>()).with_timezone("UTC")),
                    Arc::new(rows.iter().map(|r| r.3).collect::<UInt64Array>()),
                ];
                let batch = RecordBatch::try_new(schema.clone(), columns).map_err(DataFusionError::from)?;
                Ok(QueryResult { batches: vec![batch], ..empty_result(started).with_schema(schema) })
            }
        }
    }

    /// The data objects (count, bytes) version `v` references that the
    /// current view does not: what a snapshot of `v` keeps from garbage
    /// collection.
    async fn pinned(&self, scope: &Scope, v: u64) -> Result<(u64, u64), EngineError> {
        let then = self.past_version(scope, &AsOf::Version(v)).await?;
        let mut live_now = std::collections::HashSet::new();
        for entry in scope.view.tables.values() {
            let data = self.db.table_data(entry).await?;
            live_now.extend(data.objects.iter().map(|l| data.object(l).key));
        }
        let (mut objects, mut bytes) = (0, 0);
        for entry in then.tables.values() {
            let data = self.db.table_data(entry).await?;
            for o in data.objects.iter().map(|l| data.object(l)).filter(|o| !live_now.contains(&o.key)) {
                objects += 1;
                bytes += o.size;
            }
        }
        Ok((objects, bytes))
    }

    /// COPY … TO: runs the query in the statement's scope (so it sees the
    /// transaction's own changes, and never a deleted row) and writes one
    /// Parquet or CSV file with DataFusion's writers, to a local path or any
    /// store URL `--db` accepts. Returns the rows written.
    async fn copy_to(&self, scope: &Scope, copy: &CopyTo) -> Result<u64, EngineError> {
        let fail = |message: String| EngineError::CopyTo { target: copy.target.clone(), message };
        let db_url = self.db.location().url.trim_end_matches('/');
        let db_url = db_url.strip_prefix("file://").unwrap_or(db_url).to_string();
        let target = copy.target.strip_prefix("file://").unwrap_or(&copy.target);
        if target == db_url || target.starts_with(&format!("{db_url}/")) {
            return Err(fail("the file would be inside the database, whose objects blobhouse never overwrites; export elsewhere".into()));
        }
        let ctx = self.statement_context(scope).await?;
        if let Some((scheme_host, _)) = split_url(&copy.target) {
            let loc = open_location(&scheme_host, &self.store_options)?;
            let url = url::Url::parse(&scheme_host).map_err(|e| fail(e.to_string()))?;
            ctx.register_object_store(&url, loc.store);
        }
        let df = ctx.sql(&copy.query).await?;
        let options = datafusion::dataframe::DataFrameWriteOptions::new().with_single_file_output(true);
        let written = match copy.format {
            CopyFormat::Parquet => df.write_parquet(&copy.target, options, None).await,
            CopyFormat::Csv => {
                let csv = datafusion::common::config::CsvOptions { has_header: Some(copy.header), delimiter: copy.delimiter, ..Default::default() };
                df.write_csv(&copy.target, options, Some(csv)).await
            }
            CopyFormat::Text => return Err(fail("FORMAT text is read only; export with FORMAT csv or parquet".into())),
        }
        .map_err(|e| fail(describe_df(&e)))?;
        let rows = written.first().and_then(|b| b.column(0).as_any().downcast_ref::<UInt64Array>()).map_or(0, |c| c.value(0));
        Ok(rows)
    }

    /// OPTIMIZE: rewrites the table's small and much-deleted objects
    /// ([`crate::optimize`]). Returns the rows rewritten.
    async fn optimize(&self, scope: &Scope, table: &str) -> Result<u64, EngineError> {
        let entry = scope.view.tables.get(table).cloned().ok_or_else(|| StorageError::TableNotFound(table.to_string()))?;
        let data = self.db.table_data(&entry).await?;
        let files = self.db.manifest_files(&entry).await?;
        let Some(plan) = optimize::plan(&entry, &data, &files, self.options.write.target_chunk_bytes) else { return Ok(0) };
        let ctx = self.statement_context(scope).await?;
        let provider = self.tables.table_over(table, &entry, plan.rewrite);
        let scan = datafusion::datasource::TableProvider::scan(&provider, &ctx.state(), None, &[], None).await?;
        let stream = execute_stream(scan, ctx.task_ctx())?;
        let schema = Arc::new(entry.schema.clone());
        let (rows, objects) = write_stream(&self.db, &schema, &self.options, stream).await?;
        let mut slot = scope.txn.lock().await;
        let txn = joined(&self.db, &mut slot, &objects).await?;
        txn.rewrite(table, entry.id, plan.removed, objects, plan.dropped_manifests, plan.forgotten).await?;
        Ok(rows)
    }

    async fn create_table(&self, ctx: &SessionContext, scope: &Scope, create: CreateMemoryTable) -> Result<u64, EngineError> {
        let name = table_name(&create.name)?;
        if !create.column_defaults.is_empty() {
            return Err(EngineError::Unsupported(format!("column DEFAULT values are not supported yet (table '{name}')")));
        }
        let exists = scope.view.tables.contains_key(&name);
        if exists && create.if_not_exists {
            return Ok(0);
        }
        if exists && !create.or_replace {
            return Err(StorageError::TableExists(name).into());
        }
        let schema: Schema = create.input.schema().as_arrow().clone();
        let mut seen = std::collections::HashSet::new();
        for f in schema.fields() {
            if !seen.insert(f.name()) {
                return Err(EngineError::Unsupported(format!("column '{}' appears twice in table '{name}'; give the columns distinct names (AS alias)", f.name())));
            }
            // Refused here, not at the first INSERT: the Parquet writer has no
            // interval type, so such a table could never hold a row.
            if matches!(f.data_type(), DataType::Interval(_)) {
                return Err(EngineError::Unsupported(format!(
                    "column '{}' of table '{name}': INTERVAL columns cannot be stored yet (Parquet has no interval type blobhouse can write); store the duration as BIGINT microseconds, or compute intervals in queries",
                    f.name()
                )));
            }
        }
        let schema = Arc::new(schema);
        let physical = ctx.state().create_physical_plan(&create.input).await?;
        let stream = execute_stream(physical, ctx.task_ctx())?;
        let (rows, objects) = write_stream(&self.db, &schema, &self.options, stream).await?;
        let mut slot = scope.txn.lock().await;
        let txn = joined(&self.db, &mut slot, &objects).await?;
        if create.or_replace && exists {
            txn.drop_table(&name, true)?;
        }
        txn.create_table(&name, schema.as_ref().clone(), create.if_not_exists, objects).await?;
        Ok(rows)
    }

    async fn copy_from(&self, copy: &CopyFrom, scope: &Scope) -> Result<u64, EngineError> {
        let entry = scope.view.tables.get(&copy.table).cloned().ok_or_else(|| StorageError::TableNotFound(copy.table.clone()))?;
        let fail = |message: String| EngineError::Copy { table: copy.table.clone(), source_url: copy.source.clone(), message };
        let schema = Arc::new(entry.schema.clone());
        if copy.format == CopyFormat::Text {
            let stream = text_stream(copy, &schema).map_err(fail)?;
            return self.append_stream(copy, scope, entry.id, &schema, stream).await;
        }
        // One partition, no splitting of files: errors keep whole-file line numbers.
        let config = SessionConfig::new().with_target_partitions(1).with_repartition_file_scans(false);
        let reader = SessionContext::new_with_config(config);
        if let Some((scheme_host, _)) = split_url(&copy.source) {
            let loc = open_location(&scheme_host, &self.store_options)?;
            let url = url::Url::parse(&scheme_host).map_err(|e| fail(e.to_string()))?;
            reader.register_object_store(&url, loc.store);
        }
        // CSV's columns are matched by position, Parquet's by name.
        let csv = copy.format == CopyFormat::Csv;
        let df = if csv {
            // Read strings as Utf8 (the CSV reader's native type), cast below.
            let read_schema = Schema::new(
                schema
                    .fields()
                    .iter()
                    .map(|f| match f.data_type() {
                        DataType::Utf8View | DataType::LargeUtf8 => Field::new(f.name(), DataType::Utf8, f.is_nullable()),
                        _ => f.as_ref().clone(),
                    })
                    .collect::<Vec<_>>(),
            );
            let opts = CsvReadOptions::new().schema(&read_schema).has_header(copy.header).delimiter(copy.delimiter);
            reader.read_csv(copy.source.as_str(), opts).await
        } else {
            reader.read_parquet(copy.source.as_str(), ParquetReadOptions::default()).await
        }
        .map_err(|e| fail(describe_df(&e)))?;
        let source_fields: Vec<String> = df.schema().fields().iter().map(|f| f.name().clone()).collect();
        let mut exprs = Vec::with_capacity(schema.fields().len());
        for (i, f) in schema.fields().iter().enumerate() {
            let source_name = if csv { source_fields.get(i).cloned() } else { source_fields.iter().find(|n| n.as_str() == f.name()).cloned() }
                .ok_or_else(|| fail(format!("the source has no column '{}'", f.name())))?;
            exprs.push(cast(Expr::Column(Column::new_unqualified(source_name)), f.data_type().clone()).alias(f.name()));
        }
        let df = df.select(exprs).map_err(|e| fail(describe_df(&e)))?;
        let stream = df.execute_stream().await.map_err(|e| fail(describe_df(&e)))?;
        self.append_stream(copy, scope, entry.id, &schema, stream).await
    }

    /// Writes the rows of `stream` as new objects of the COPY's table and
    /// adds them to the statement's transaction.
    async fn append_stream(&self, copy: &CopyFrom, scope: &Scope, table_id: u64, schema: &SchemaRef, stream: SendableRecordBatchStream) -> Result<u64, EngineError> {
        let (rows, objects) = write_stream(&self.db, schema, &self.options, stream).await.map_err(|e| EngineError::Copy {
            table: copy.table.clone(),
            source_url: copy.source.clone(),
            message: match copy.format {
                CopyFormat::Text => describe_df(&e),
                _ => file_line_numbers(&describe_df(&e)),
            },
        })?;
        let mut slot = scope.txn.lock().await;
        joined(&self.db, &mut slot, &objects).await?.append(&copy.table, table_id, objects).await?;
        Ok(rows)
    }
}

/// The rows of a local file in PostgreSQL's text format, as `schema`.
fn text_stream(copy: &CopyFrom, schema: &SchemaRef) -> Result<SendableRecordBatchStream, String> {
    if split_url(&copy.source).is_some() {
        return Err("FORMAT text reads local files (and COPY … FROM STDIN through the server); for a URL use FORMAT csv or parquet".into());
    }
    let path = copy.source.strip_prefix("file://").unwrap_or(&copy.source);
    let file = std::fs::File::open(path).map_err(|e| format!("cannot open {path}: {e}"))?;
    let mut reader = crate::copy::TextReader::new(std::io::BufReader::new(file), schema.clone(), copy.delimiter, copy.header);
    let batches = std::iter::from_fn(move || match reader.next_batch() {
        Ok(Some(batch)) => Some(Ok(batch)),
        Ok(None) => None,
        Err(message) => Some(Err(DataFusionError::Execution(message))),
    })
    .fuse();
    Ok(Box::pin(RecordBatchStreamAdapter::new(schema.clone(), futures::stream::iter(batches))))
}

/// The statement's transaction. It has ended only if the session was torn
/// down under the statement; then the objects the statement `uploaded`
/// belong to nobody and are deleted.
async fn joined<'a>(db: &Database, slot: &'a mut Option<Transaction>, uploaded: &[DataObject]) -> Result<&'a mut Transaction, EngineError> {
    if slot.is_none() {
        db.delete_unreferenced(uploaded.iter().map(|o| o.path.clone()).collect()).await;
    }
    slot.as_mut().ok_or_else(|| EngineError::transaction(TxnRule::Ended, "the transaction has ended"))
}

/// Applies `f` to the statement's transaction.
async fn stage(scope: &Scope, f: impl FnOnce(&mut Transaction) -> Result<bool, StorageError>) -> Result<bool, EngineError> {
    let mut slot = scope.txn.lock().await;
    let txn = slot.as_mut().ok_or_else(|| EngineError::transaction(TxnRule::Ended, "the transaction has ended"))?;
    Ok(f(txn)?)
}

/// BEGIN / START TRANSACTION, COMMIT / END, ROLLBACK / ABORT; `None` for
/// any other statement. Isolation is snapshot isolation: REPEATABLE READ
/// (and READ COMMITTED, which it is stronger than) are accepted,
/// SERIALIZABLE is refused rather than silently weakened.
fn transaction_control(statement: &DFStatement) -> Result<Option<Control>, EngineError> {
    use datafusion::sql::sqlparser::ast::{Statement as S, TransactionIsolationLevel as L, TransactionMode as M};
    let DFStatement::Statement(s) = statement else { return Ok(None) };
    Ok(Some(match s.as_ref() {
        S::StartTransaction { modes, .. } => {
            for m in modes {
                match m {
                    M::IsolationLevel(L::Serializable) => {
                        return Err(EngineError::Unsupported("SERIALIZABLE is not available: blobhouse transactions have snapshot isolation (REPEATABLE READ); see docs/transactions.md".into()));
                    }
                    M::IsolationLevel(_) => {}
                    M::AccessMode(_) => return Err(EngineError::Unsupported("READ ONLY / READ WRITE transaction modes are not supported; use BEGIN".into())),
                }
            }
            Control::Begin
        }
        S::Commit { chain: false, .. } => Control::Commit,
        S::Rollback { chain: false, savepoint: None } => Control::Rollback,
        S::Savepoint { .. } | S::ReleaseSavepoint { .. } => Control::Savepoint,
        S::Rollback { savepoint: Some(_), .. } => {
            return Err(EngineError::Unsupported(
                "ROLLBACK TO SAVEPOINT is not supported: savepoints are accepted and released, but a transaction rolls back only as a whole (ROLLBACK)".into(),
            ));
        }
        S::Commit { .. } | S::Rollback { .. } => {
            return Err(EngineError::Unsupported("AND CHAIN is not supported; use BEGIN, COMMIT and ROLLBACK".into()));
        }
        _ => return Ok(None),
    }))
}

/// The start of a statement, for messages.
fn abbreviate(sql: &str) -> String {
    let one_line = sql.split_whitespace().collect::<Vec<_>>().join(" ");
    match one_line.char_indices().nth(60) {
        Some((i, _)) => format!("{}…", &one_line[..i]),
        None => one_line,
    }
}

/// The CSV reader numbers the file's records from 0, the header included
/// when there is one (so the first record of a file without a header is
/// "line 0"); a user looks for the line in the file, counted from 1.
fn file_line_numbers(message: &str) -> String {
    const MARK: &str = "at line ";
    let Some(pos) = message.find(MARK) else { return message.to_string() };
    let start = pos + MARK.len();
    let digits: String = message[start..].chars().take_while(char::is_ascii_digit).collect();
    match digits.parse::<u64>() {
        Ok(n) => format!("{}{MARK}{}{}", &message[..pos], n + 1, &message[start + digits.len()..]),
        Err(_) => message.to_string(),
    }
}

/// `scheme://host` and the rest, for URLs other than file://.
fn split_url(source: &str) -> Option<(String, String)> {
    let (scheme, rest) = source.split_once("://")?;
    if scheme == "file" {
        return None;
    }
    let (host, path) = rest.split_once('/').unwrap_or((rest, ""));
    Some((format!("{scheme}://{host}"), path.to_string()))
}

fn table_name(r: &datafusion::common::TableReference) -> Result<String, EngineError> {
    match r.schema() {
        None | Some("public") => Ok(r.table().to_string()),
        Some(s) => Err(EngineError::Unsupported(format!("schema '{s}' does not exist; blobhouse tables live in the default schema"))),
    }
}

/// Plans and runs a query to the end.
async fn run_plan(df: DataFrame, started: Instant) -> Result<QueryResult, DataFusionError> {
    run_planned(plan_physical(df).await?, started).await
}

/// A query planned down to the physical plan, ready to run.
struct Planned {
    task: Arc<datafusion::execution::TaskContext>,
    physical: Arc<dyn ExecutionPlan>,
}

/// How [`Engine::plan_while_refreshing`] ended.
enum Refreshed {
    /// The plan was of the newest version and ran (or, streaming, started).
    Ran(Result<Answer, EngineError>),
    /// The store had a newer version (or the statement was not a plain
    /// query): plan on this one.
    Newer(Arc<CatalogVersion>),
}

/// The statement, when it may be a plain query (see [`Engine::plan_query`]).
fn plain_query(parsed: &Parsed) -> Option<&DFStatement> {
    match parsed {
        Parsed::Sql(statement @ DFStatement::Statement(s)) if matches!(**s, datafusion::sql::sqlparser::ast::Statement::Query(_)) => Some(statement),
        _ => None,
    }
}

async fn plan_physical(df: DataFrame) -> Result<Planned, DataFusionError> {
    let task = Arc::new(df.task_ctx());
    let physical = df.create_physical_plan().await?;
    Ok(Planned { task, physical })
}

/// Starts a planned query; its rows come as they are computed.
fn stream_planned(planned: Planned) -> Result<RowStream, EngineError> {
    let Planned { task, physical } = planned;
    let schema = physical.schema();
    let batches = execute_stream(physical, task)?;
    Ok(RowStream { schema, batches })
}

/// Runs a planned query to the end; what came before it (planning, and
/// finding the newest version) counts as its planning time.
async fn run_planned(planned: Planned, started: Instant) -> Result<QueryResult, DataFusionError> {
    let Planned { task, physical } = planned;
    let planning = started.elapsed();
    let schema = physical.schema();
    let batches = collect(physical.clone(), task).await?;
    let (spilled_bytes, spills) = spill_totals(&physical);
    Ok(QueryResult {
        schema,
        batches,
        scan: collect_scan_metrics(&physical),
        elapsed: started.elapsed(),
        planning,
        scheduler: collect_scheduler_timelines(&physical),
        memory: MemoryUse { spilled_bytes, spills, ..MemoryUse::default() },
        pushdown: crate::hybrid::collect_pushdown(&physical),
        notices: Vec::new(),
        rolled_back: false,
    })
}

/// Bytes spilled and spill files written by every operator of an executed plan.
fn spill_totals(plan: &Arc<dyn ExecutionPlan>) -> (u64, u64) {
    let (mut bytes, mut count) = plan.metrics().map_or((0, 0), |m| (m.spilled_bytes().unwrap_or(0) as u64, m.spill_count().unwrap_or(0) as u64));
    for child in plan.children() {
        let (b, c) = spill_totals(child);
        bytes += b;
        count += c;
    }
    (bytes, count)
}

/// What each sort sets aside to merge its spill files: DataFusion's 10 MiB,
/// less under a small limit (a 64th of it, at least 1 MiB). A sort-merge
/// join sorts both inputs in every partition at once, so at 10 MiB each a
/// 96 MiB limit had no room left to sort anything.
/// Largest hash-join build side that is built once and shared by the
/// partitions (see `Engine::open_location`).
const COLLECT_LEFT_BYTES: usize = 8 << 20;

/// The name of the database's DataFusion catalog (its tables are
/// `blobhouse.public.name`): what PostgreSQL clients see as the database.
pub const CATALOG: &str = "blobhouse";

fn sort_merge_reservation(limit: Option<usize>) -> usize {
    const DATAFUSION_DEFAULT: usize = 10 << 20;
    limit.map_or(DATAFUSION_DEFAULT, |l| (l / 64).clamp(1 << 20, DATAFUSION_DEFAULT))
}

/// `memory_limit`, also under DataFusion's name (which would otherwise
/// replace the engine's budget with a pool of its own).
/// Whether `SET name` / `SHOW name` is one of the engine's settings
/// (blobhouse's memory, cache and pushdown settings, DataFusion's
/// `datafusion.*`) — what a server passes on to the engine rather than
/// answering itself.
pub fn is_engine_setting(name: &str) -> bool {
    let name = name.trim().to_ascii_lowercase();
    name.starts_with("datafusion.") || is_memory_limit(&name) || is_cache_setting(&name) || is_pushdown_setting(&name)
}

fn is_memory_limit(variable: &str) -> bool {
    matches!(variable, "memory_limit" | "blobhouse.memory_limit" | "datafusion.runtime.memory_limit")
}

fn is_show_memory_limit(sql: &str) -> bool {
    words_are(sql, &["show", "memory_limit"])
}

/// What `SHOW TABLES` runs: the database's tables, not the catalogs and
/// views DataFusion and the server add beside them.
const SHOW_TABLES: &str = "SELECT table_name AS name FROM information_schema.tables WHERE table_schema = 'public' ORDER BY table_name";

/// Whether `sql` is exactly these words (any case, a trailing ';' allowed).
fn words_are(sql: &str, expected: &[&str]) -> bool {
    let words: Vec<String> = sql.trim().trim_end_matches(';').split_whitespace().map(str::to_ascii_lowercase).collect();
    words == expected
}

/// The caching tiers' settings (docs/cache.md).
fn is_cache_setting(variable: &str) -> bool {
    matches!(variable.trim_start_matches("blobhouse."), "cache_memory" | "cache_policy")
}

/// The hybrid scans' mode (docs/pushdown.md).
fn is_pushdown_setting(variable: &str) -> bool {
    matches!(variable.trim_start_matches("blobhouse."), "pushdown" | "pushdown_bloom")
}

fn setting_result(name: &str, value: &str, started: Instant) -> QueryResult {
    let schema = Arc::new(Schema::new(vec![Field::new("name", DataType::Utf8, false), Field::new("value", DataType::Utf8, false)]));
    let columns: Vec<ArrayRef> = vec![Arc::new(StringArray::from(vec![name])), Arc::new(StringArray::from(vec![value]))];
    let batch = RecordBatch::try_new(schema.clone(), columns).expect("setting batch");
    QueryResult { batches: vec![batch], ..empty_result(started).with_schema(schema) }
}

/// DESCRIBE's (column_name, data_type, is_nullable), with the types as SQL
/// names (`INTEGER`, `VARCHAR`) rather than Arrow's (`Int32`, `Utf8View`).
fn describe_result(describe: &DescribeTable, started: Instant) -> QueryResult {
    let schema: SchemaRef = Arc::new(describe.output_schema.as_arrow().clone());
    let fields = describe.schema.fields();
    let names: Vec<&str> = fields.iter().map(|f| f.name().as_str()).collect();
    let types: Vec<String> = fields.iter().map(|f| crate::types::sql_type_name(f.data_type())).collect();
    let nullable: Vec<&str> = fields.iter().map(|f| if f.is_nullable() { "YES" } else { "NO" }).collect();
    let columns: Vec<ArrayRef> = vec![Arc::new(StringArray::from(names)), Arc::new(StringArray::from(types)), Arc::new(StringArray::from(nullable))];
    let batch = RecordBatch::try_new(schema.clone(), columns).expect("DESCRIBE's output schema is three strings");
    QueryResult { batches: vec![batch], ..empty_result(started).with_schema(schema) }
}

/// Adds a row to EXPLAIN ANALYZE's (plan_type, plan) output.
fn append_explain_row(result: &mut QueryResult, plan_type: &str, text: &str) {
    let columns: Result<Vec<ArrayRef>, _> = [plan_type, text]
        .iter()
        .zip(result.schema.fields())
        .map(|(v, f)| datafusion::arrow::compute::cast(&StringArray::from(vec![*v]), f.data_type()))
        .collect();
    if let Ok(batch) = columns.and_then(|c| RecordBatch::try_new(result.schema.clone(), c)) {
        result.batches.push(batch);
    }
}

impl QueryResult {
    fn with_schema(mut self, schema: SchemaRef) -> Self {
        self.schema = schema;
        self
    }
}

/// VACUUM's answer: what it would delete and why (dry run), or what it did.
fn vacuum_result(r: &blobhouse_storage::gc::VacuumReport, dry_run: bool, started: Instant) -> QueryResult {
    let (schema, columns): (Schema, Vec<ArrayRef>) = if dry_run {
        (
            Schema::new(vec![Field::new("path", DataType::Utf8, false), Field::new("reason", DataType::Utf8, false)]),
            vec![
                Arc::new(r.deleted.iter().map(|(p, _)| Some(p.as_str())).collect::<StringArray>()),
                Arc::new(r.deleted.iter().map(|(_, why)| Some(why.as_str())).collect::<StringArray>()),
            ],
        )
    } else {
        let names = ["previous_horizon", "horizon", "versions_scanned", "candidates", "kept", "deferred", "deleted", "gets", "deletes"];
        let values = [r.previous_horizon, r.horizon, r.versions_scanned, r.candidates, r.kept, r.deferred, r.deleted.len() as u64, r.gets, r.deletes];
        (
            Schema::new(names.iter().map(|n| Field::new(*n, DataType::UInt64, false)).collect::<Vec<_>>()),
            values.iter().map(|v| Arc::new(UInt64Array::from(vec![*v])) as ArrayRef).collect(),
        )
    };
    let schema = Arc::new(schema);
    let batch = RecordBatch::try_new(schema.clone(), columns).expect("vacuum batch");
    QueryResult { batches: vec![batch], ..empty_result(started).with_schema(schema) }
}

fn count_result(rows: u64, started: Instant) -> QueryResult {
    let schema = Arc::new(Schema::new(vec![Field::new("count", DataType::UInt64, false)]));
    let batch = RecordBatch::try_new(schema.clone(), vec![Arc::new(UInt64Array::from(vec![rows]))]).expect("count batch");
    QueryResult { batches: vec![batch], ..empty_result(started).with_schema(schema) }
}

fn empty_result(started: Instant) -> QueryResult {
    QueryResult {
        schema: Arc::new(Schema::empty()),
        batches: vec![],
        scan: ScanMetrics::default(),
        elapsed: started.elapsed(),
        planning: started.elapsed(),
        scheduler: Vec::new(),
        memory: MemoryUse::default(),
        pushdown: Default::default(),
        notices: Vec::new(),
        rolled_back: false,
    }
}

/// Splits a script into statements at `;`, ignoring semicolons inside quotes
/// and comments. Empty statements are dropped; a last statement without its
/// `;` is kept.
pub fn split_statements(sql: &str) -> Vec<String> {
    let (mut out, rest) = split_complete_statements(sql);
    if !rest.trim().is_empty() {
        out.extend(split_complete_statements(&format!("{rest};")).0);
    }
    out
}

/// The statements of `sql` that its `;`s end, and the text after the last
/// of them as written: what a shell keeps reading lines into until the
/// statement is complete (a `;` inside a quote or comment ends nothing).
pub fn split_complete_statements(sql: &str) -> (Vec<String>, &str) {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut rest_from = 0;
    let mut chars = sql.char_indices().peekable();
    while let Some((_, c)) = chars.next() {
        match c {
            '\'' | '"' => {
                cur.push(c);
                while let Some((_, d)) = chars.next() {
                    cur.push(d);
                    if d == c {
                        if chars.peek().map(|p| p.1) == Some(c) {
                            cur.push(chars.next().expect("peeked").1);
                        } else {
                            break;
                        }
                    }
                }
            }
            '-' if chars.peek().map(|p| p.1) == Some('-') => {
                for (_, d) in chars.by_ref() {
                    if d == '\n' {
                        cur.push('\n');
                        break;
                    }
                }
            }
            '/' if chars.peek().map(|p| p.1) == Some('*') => {
                chars.next();
                let mut prev = ' ';
                for (_, d) in chars.by_ref() {
                    if prev == '*' && d == '/' {
                        break;
                    }
                    prev = d;
                }
                cur.push(' ');
            }
            ';' => {
                if !cur.trim().is_empty() {
                    out.push(cur.trim().to_string());
                }
                cur.clear();
                rest_from = chars.peek().map_or(sql.len(), |p| p.0);
            }
            _ => cur.push(c),
        }
    }
    (out, &sql[rest_from..])
}

#[cfg(test)]
mod tests {
    use super::split_statements;

    #[test]
    fn csv_errors_name_the_file_line() {
        let m = "Parser error: Error while parsing value 'x' as type 'Int32' for column 0 at line 7. Row data: '[x]'";
        assert!(super::file_line_numbers(m).contains("at line 8. Row data"));
        // The first record is the reader's line 0: the file's line 1.
        assert!(super::file_line_numbers(&m.replace("line 7", "line 0")).contains("at line 1. Row data"));
        assert_eq!(super::file_line_numbers("no line here"), "no line here");
    }

    #[test]
    fn splits_scripts_outside_quotes_and_comments() {
        let s = split_statements("select ';' as a; -- c;\n select 2 /* ; */;;\n insert into t values ('it''s;')");
        assert_eq!(s, vec!["select ';' as a", "select 2", "insert into t values ('it''s;')"]);
    }

    #[test]
    fn keeps_an_unfinished_statement_as_written() {
        let (done, rest) = super::split_complete_statements("select 1; select 'a;\nb' /* ; */; select /* x;");
        assert_eq!(done, vec!["select 1", "select 'a;\nb'"]);
        assert_eq!(rest, " select /* x;");
        let (done, rest) = super::split_complete_statements("select 'it;");
        assert!(done.is_empty());
        assert_eq!(rest, "select 'it;");
        assert_eq!(super::split_complete_statements("select 2;\n").1, "\n");
    }
}
