//! [`Session`]: one connection to an [`Engine`] — its settings, its open
//! transaction, and the statements it runs one at a time. The shell, each
//! server connection and each benchmark client is a session; what they
//! share (the store, caches, memory, download manager) is the engine's.
//!
//! A statement's path: its text is parsed once ([`crate::parser`]), the
//! session's settings are read into it (`current_setting()`), repeated
//! output names are planned apart ([`crate::names`]), and the dispatcher
//! ([`crate::dispatch`]) runs it.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::DataType;
use datafusion::execution::context::SessionContext;
use datafusion::logical_expr::LogicalPlan;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::sql::parser::Statement as DFStatement;
use futures::TryStreamExt;

use crate::dispatch::{self, Conn};
use crate::engine::Engine;
use crate::parser::{self, Parsed, Statement};
use crate::provider::Scope;
use crate::result::{Answer, Described, QueryResult, RowStream};
use crate::settings::{self, Values};
use crate::transaction::{TxnSlot, TxnState};
use crate::{EngineError, names};

/// One connection's settings, transaction and statements.
pub struct Session {
    engine: Engine,
    /// The session's DataFusion state: the engine's, with this session's
    /// `datafusion.*` settings.
    ctx: SessionContext,
    txn: TxnState,
    values: Mutex<Values>,
    /// Tables registered from the embedder's memory ([`Session::register_table`]).
    registered: crate::registered::Registered,
}

impl Engine {
    /// A new session on this database: its own settings and transaction,
    /// everything else shared (what a server gives each connection).
    pub fn connect(&self) -> Session {
        // SessionState's clone copies the settings and shares the runtime
        // (memory pool, disk manager), the functions and the catalogs.
        let ctx = SessionContext::new_with_state(self.base_context().state());
        Session { engine: self.clone(), ctx, txn: TxnState::default(), values: Mutex::new(Values::default()), registered: Default::default() }
    }
}

impl Session {
    /// Opens the database at `url` and connects one session to it: for a
    /// program with one connection (the shell, a benchmark client, a
    /// test). More sessions connect through [`Session::engine`].
    pub async fn open(url: &str, store_options: &blobhouse_storage::StoreOptions, options: crate::EngineOptions) -> Result<Session, EngineError> {
        Ok(Engine::open(url, store_options, options).await?.connect())
    }

    /// [`Session::open`] at an already-built location (tests wrap stores).
    pub async fn open_location(loc: blobhouse_storage::Location, store_options: blobhouse_storage::StoreOptions, options: crate::EngineOptions) -> Result<Session, EngineError> {
        Ok(Engine::open_location(loc, store_options, options).await?.connect())
    }

    /// The engine it is a session of.
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// Limits the files outside the database this session's statements
    /// may read and write (`read_parquet`, external tables, COPY): a
    /// server's clients get only what its operator allows
    /// ([`crate::files::FileAccess`]).
    pub fn set_file_access(&self, access: crate::files::FileAccess) {
        self.ctx.state_ref().write().config_mut().set_extension(std::sync::Arc::new(access));
    }

    /// The session's own DataFusion context (its `datafusion.*` settings).
    pub fn context(&self) -> &SessionContext {
        &self.ctx
    }

    fn values(&self) -> MutexGuard<'_, Values> {
        self.values.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn conn(&self) -> Conn<'_> {
        Conn { engine: &self.engine, ctx: &self.ctx, txn: &self.txn, values: &self.values, registered: &self.registered }
    }

    /// The value of setting `name` as this session sees it (`None`: no such setting).
    pub fn setting(&self, name: &str) -> Option<String> {
        settings::value(&self.engine, &self.values(), name)
    }

    /// The session's reported settings: what a PostgreSQL client is sent
    /// at startup and when one changes.
    pub fn reported_settings(&self) -> Vec<(&'static str, String)> {
        self.values().reported()
    }

    /// The session's statement timeout (`statement_timeout`; `None`: none).
    pub fn statement_timeout(&self) -> Option<Duration> {
        self.values().statement_timeout()
    }

    /// Replaces the session's settings: a server starts each connection's
    /// from its login ([`Values::for_user`], [`Values::startup`]).
    pub fn set_settings(&self, values: Values) {
        *self.values() = values;
    }

    /// Parses `sql` in the session's dialect, with its settings read in.
    fn parse(&self, sql: &str) -> Result<Parsed, EngineError> {
        let state = self.ctx.state();
        let options = &state.config().options().sql_parser;
        let mut parsed = parser::parse(sql, &options.dialect.to_string(), options.recursion_limit.get())?;
        let get = |name: &str| self.setting(name);
        match &mut parsed.statement {
            Statement::Sql(s) => settings::inline_current_setting(s, get),
            Statement::Dml(s) => settings::inline_current_setting_in(s, &get),
            _ => {}
        }
        Ok(parsed)
    }

    /// Runs every statement of a script, in order; stops at the first error.
    pub async fn execute_script(&self, sql: &str) -> Result<Vec<QueryResult>, EngineError> {
        let mut out = Vec::new();
        for statement in crate::script::split_statements(sql) {
            out.push(self.execute(&statement).await?);
        }
        Ok(out)
    }

    /// Runs one statement. Outside a transaction it sees every version
    /// committed before it started and commits on its own; inside BEGIN …
    /// COMMIT it sees the transaction's snapshot and own changes.
    pub async fn execute(&self, sql: &str) -> Result<QueryResult, EngineError> {
        let started = Instant::now();
        self.engine.memory().reset_peak();
        crate::memory::reset_peak_rss();
        let mut result = self.execute_statement(sql, started, false).await?.collect(started).await?;
        crate::query::record_memory(&self.engine, &mut result);
        Ok(result)
    }

    /// Runs one statement as [`Session::execute`] does, except that a
    /// query's rows are returned as they are computed rather than
    /// collected: a client can take the first rows while the rest are
    /// being computed, and a large result never sits in memory whole.
    /// Other statements answer [`Answer::Done`].
    pub async fn execute_streaming(&self, sql: &str) -> Result<Answer, EngineError> {
        let started = Instant::now();
        self.engine.memory().reset_peak();
        crate::memory::reset_peak_rss();
        match self.execute_statement(sql, started, true).await? {
            Answer::Done(mut result) => {
                crate::query::record_memory(&self.engine, &mut result);
                Ok(Answer::Done(result))
            }
            rows => Ok(rows),
        }
    }

    async fn execute_statement(&self, sql: &str, started: Instant, stream: bool) -> Result<Answer, EngineError> {
        let mut parsed = self.parse(sql)?;
        let renames = match &mut parsed.statement {
            Statement::Sql(statement) => names::plan_unique(statement),
            _ => names::Renames::default(),
        };
        let answer = dispatch::execute(&self.conn(), sql, parsed, started, stream).await?;
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

    /// What `sql` (one statement, `$1`… placeholders allowed) will return
    /// and which parameters it takes, without running it — what the
    /// PostgreSQL extended protocol's Describe asks before Execute. It
    /// reads the database version of now (or the open transaction's).
    pub async fn describe(&self, sql: &str) -> Result<Described, EngineError> {
        let mut parsed = self.parse(sql)?;
        let command = Described::Command { parameters: Vec::new() };
        let statement = match &mut parsed.statement {
            Statement::Setting(settings::SettingStatement::Show(_) | settings::SettingStatement::ShowAll) | Statement::ShowCache => return Ok(Described::RowsWhenRun),
            Statement::History(h) if h.returns_rows() => return Ok(Described::RowsWhenRun),
            Statement::Setting(_) | Statement::History(_) | Statement::CopyFrom(_) | Statement::CopyTo(_) | Statement::Optimize { .. } | Statement::Transaction(_) => return Ok(command),
            // Its rows gain a column computed when it runs (crate::interop).
            Statement::ShowTables => return Ok(Described::RowsWhenRun),
            Statement::Dml(s) => DFStatement::Statement(s.clone()),
            Statement::Sql(s) => (**s).clone(),
        };
        let mut statement = statement;
        let renames = names::plan_unique(&mut statement);
        let view = match self.txn.open_slot() {
            Some(slot) => slot.try_lock().ok().and_then(|t| t.as_ref().map(|t| (t.view(), t.snapshot().clone()))),
            None => None,
        };
        let (view, snapshot) = match view {
            Some(v) => v,
            None => {
                let v = self.engine.database().refresh().await?;
                (v.clone(), v)
            }
        };
        let slot: TxnSlot = Arc::new(tokio::sync::Mutex::new(None));
        let ctx = self.engine.statement_context(&self.ctx.state(), &Scope { view, snapshot, txn: slot, past: parsed.past, files: parsed.files }, &self.registered).await?;
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
            Err(_) if !returns_rows => return Ok(command),
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

    /// Begins a transaction (what `BEGIN` does): later statements read the
    /// database version of now plus their own changes, and their changes
    /// become visible together at [`Session::commit`].
    pub async fn begin(&self) -> Result<(), EngineError> {
        self.txn.begin(self.engine.database()).await
    }

    /// Commits the transaction (`COMMIT`). A serialization failure or
    /// conflict rolls it back and is returned; so is an earlier failed
    /// statement (nothing is committed then). Without a transaction: nothing
    /// to do.
    pub async fn commit(&self) -> Result<(), EngineError> {
        self.txn.commit().await.map(|_| ())
    }

    /// Rolls the transaction back (`ROLLBACK`): deletes what it uploaded.
    pub async fn rollback(&self) {
        self.txn.rollback().await
    }

    /// Whether the open transaction is aborted (a statement in it failed:
    /// only ROLLBACK or COMMIT, which rolls it back, are taken).
    pub fn in_aborted_transaction(&self) -> bool {
        self.txn.aborted_by().is_some()
    }

    /// Makes `table` (rows in the embedder's memory, e.g. a Python
    /// DataFrame) readable as `name` in this session's statements, beside
    /// the stored tables, until [`Session::deregister_table`]; a table
    /// registered before under that name is replaced. A stored table's
    /// name is refused: the two would be indistinguishable in SQL.
    pub async fn register_table(&self, name: &str, table: Arc<dyn datafusion::datasource::TableProvider>) -> Result<(), EngineError> {
        if name.is_empty() {
            return Err(EngineError::Unsupported("a registered table needs a name".into()));
        }
        if self.engine.database().refresh().await?.tables.contains_key(name) {
            return Err(blobhouse_storage::StorageError::TableExists(name.to_string()).into());
        }
        self.registered.insert(name, table);
        Ok(())
    }

    /// Forgets a table registered as `name`; whether there was one.
    pub fn deregister_table(&self, name: &str) -> bool {
        self.registered.remove(name).is_some()
    }

    /// The names of the tables this session registered.
    pub fn registered_tables(&self) -> Vec<String> {
        self.registered.names()
    }

    /// Whether a transaction begun with BEGIN is open (aborted or not).
    pub fn in_transaction(&self) -> bool {
        self.txn.in_transaction()
    }
}
