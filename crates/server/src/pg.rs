//! The PostgreSQL wire protocol over engine sessions, on pgwire.
//!
//! pgwire does the protocol (startup, SCRAM, TLS, simple and extended
//! query, portals, cancel); datafusion-postgres's handlers share one
//! DataFusion context among all connections and hand SQL to DataFusion
//! directly, so blobhouse has its own: each connection that logged in
//! (`login`) gets an [`Engine::connect`] session — its own settings
//! (PostgreSQL's run-time parameters, started from the login's startup
//! parameters) and transaction — kept in the connection's session
//! extensions, and every statement goes through `Session::execute` — SET
//! and SHOW, DDL, DML, COPY, time travel and transactions included.
//! Results are encoded by `respond`.

use std::collections::HashMap;
use std::fmt::Debug;
use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use futures::{Sink, SinkExt, StreamExt, stream};
use pgwire::api::auth::StartupHandler;
use pgwire::api::auth::sasl::SASLAuthStartupHandler;
use pgwire::api::auth::sasl::scram::ScramAuth;
use pgwire::api::cancel::{CancelHandler, DefaultCancelHandler};
use pgwire::api::copy::CopyHandler;
use pgwire::api::portal::{Format, Portal};
use pgwire::api::query::{ExtendedQueryHandler, SimpleQueryHandler};
use pgwire::api::results::{CopyResponse, FieldInfo, Response, Tag};
use pgwire::api::stmt::QueryParser;
use pgwire::api::stmt::StoredStatement;
use pgwire::api::store::{MemPortalStore, PortalStore};
use pgwire::api::{ClientInfo, ClientPortalStore, ConnectionManager, PgWireServerHandlers, Type};
use pgwire::error::{ErrorInfo, PgWireError, PgWireResult};
use pgwire::messages::cancel::CancelRequest;
use pgwire::messages::copy::{CopyData, CopyDone, CopyFail};
use pgwire::messages::extendedquery::Execute;
use pgwire::messages::response::TransactionStatus;
use pgwire::messages::startup::ParameterStatus;
use pgwire::messages::PgWireBackendMessage;
use pgwire::types::format::FormatOptions;

use blobhouse_engine::{Described, Engine, EngineError, QueryResult, Session as EngineSession};

use crate::auth::{UserSource, Users};
use crate::catalog::Introspection;
use crate::copy::{self, CopyIn, Spool};
use crate::cursors::{self, Cursor, CursorStatement};
use crate::exec::{Output, Rows, Runner};
use crate::login::{LoggedIn, Parameters, Startup};
use crate::metrics::Metrics;
use crate::params;
use blobhouse_engine::result::CommandKind;
use crate::respond::{error_info, failure_info, fields, respond, rows, streamed, wire_schema};

/// A connection's engine session, its parameters and its COPY … FROM
/// STDIN in progress.
struct Session {
    engine: Arc<EngineSession>,
    user: String,
    spool: std::sync::Mutex<Option<Spool>>,
    /// The connection's own directory for spools: the only local files
    /// its statements may read unless the server allows more.
    spool_dir: tempfile::TempDir,
    /// Open SQL cursors by name (held across awaits: one connection's
    /// statements run one at a time).
    cursors: tokio::sync::Mutex<HashMap<String, Cursor>>,
    /// Cancels the statement whose rows are being sent, if any: pgwire's
    /// own cancel stops a statement only until its first row is ready.
    streaming: std::sync::Mutex<Option<tokio::sync::oneshot::Sender<()>>>,
    metrics: Arc<Metrics>,
}

impl Drop for Session {
    fn drop(&mut self) {
        self.metrics.session_closed();
    }
}

impl Session {
    /// Cancels the statement whose rows are being sent (a cancel request).
    fn cancel_streaming(&self) {
        if let Some(cancel) = self.streaming.lock().unwrap_or_else(|p| p.into_inner()).take() {
            let _ = cancel.send(());
        }
    }

    /// `rows`, stopped when this session's next cancel request comes.
    fn cancellable(&self, rows: Rows) -> Rows {
        let (tx, rx) = tokio::sync::oneshot::channel();
        *self.streaming.lock().unwrap_or_else(|p| p.into_inner()) = Some(tx);
        rows.cancelled_by(rx)
    }

    /// The COPY in progress (the lock is never held across an await).
    fn spool(&self) -> std::sync::MutexGuard<'_, Option<Spool>> {
        self.spool.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Starts a COPY … FROM STDIN: checks the table, opens the spool, and
    /// answers CopyInResponse (PostgreSQL's text or CSV, one column per
    /// table column).
    async fn copy_in(&self, copy: CopyIn) -> PgWireResult<Response> {
        let columns = match self.engine.describe(&format!("SELECT * FROM {}", copy.table)).await.map_err(engine_error)? {
            Described::Rows { schema, .. } => schema.fields().len(),
            _ => 0,
        };
        let spool = Spool::new(copy, self.spool_dir.path()).map_err(|e| user_error("58030", format!("COPY FROM STDIN cannot open its spool file: {e}")))?;
        *self.spool() = Some(spool);
        Ok(Response::CopyIn(CopyResponse::new(0, columns, stream::empty())))
    }
}

/// What pgwire asks of a server, per connection.
pub(crate) struct Handlers {
    backend: Arc<Backend>,
    users: Arc<Users>,
    iterations: usize,
    parameters: Arc<Parameters>,
    connections: Arc<ConnectionManager>,
    /// TLS is configured: plaintext startups are refused.
    require_tls: bool,
}

impl Handlers {
    pub(crate) fn new(engine: Arc<Engine>, runner: Arc<Runner>, users: Arc<Users>, iterations: usize, require_tls: bool) -> Handlers {
        let sessions = Arc::new(Sessions { engine, runner: runner.clone(), by_key: std::sync::Mutex::new(HashMap::new()) });
        Handlers {
            backend: Arc::new(Backend { sessions: sessions.clone(), runner, parser: Arc::new(Parser { introspection: Introspection::new(), sessions }) }),
            users,
            iterations,
            parameters: Arc::new(Parameters { scram_iterations: iterations }),
            connections: Arc::new(ConnectionManager::new()),
            require_tls,
        }
    }
}

impl PgWireServerHandlers for Handlers {
    fn simple_query_handler(&self) -> Arc<impl SimpleQueryHandler> {
        self.backend.clone()
    }

    fn extended_query_handler(&self) -> Arc<impl ExtendedQueryHandler> {
        self.backend.clone()
    }

    fn startup_handler(&self) -> Arc<impl StartupHandler> {
        // SCRAM keeps per-connection state: one handler per connection.
        let mut scram = ScramAuth::new(Arc::new(UserSource::new(self.users.clone())));
        scram.set_iterations(self.iterations);
        let sasl = SASLAuthStartupHandler::new(self.parameters.clone()).with_scram(scram).with_connection_manager(self.connections.clone());
        Arc::new(Startup { sasl, require_tls: self.require_tls, initial_seen: std::sync::atomic::AtomicBool::new(false) })
    }

    fn copy_handler(&self) -> Arc<impl CopyHandler> {
        self.backend.clone()
    }

    fn cancel_handler(&self) -> Arc<impl CancelHandler> {
        Arc::new(Cancel { connections: DefaultCancelHandler::new(self.connections.clone()), sessions: self.backend.sessions.clone() })
    }
}

/// Opens each connection's session on its first statement — only on a
/// connection that logged in ([`LoggedIn`]).
struct Sessions {
    engine: Arc<Engine>,
    runner: Arc<Runner>,
    /// Each connection's session by its cancel key (process id and
    /// secret), for cancel requests, which come on a connection of their own.
    by_key: std::sync::Mutex<HashMap<(i32, Vec<u8>), std::sync::Weak<Session>>>,
}

impl Sessions {
    /// Cancels the statement whose rows the connection with this key is
    /// being sent.
    fn cancel(&self, pid: i32, secret: &[u8]) {
        let mut by_key = self.by_key.lock().unwrap_or_else(|p| p.into_inner());
        by_key.retain(|_, s| s.strong_count() > 0);
        if let Some(session) = by_key.get(&(pid, secret.to_vec())).and_then(std::sync::Weak::upgrade) {
            session.cancel_streaming();
        }
    }

    fn of<C: ClientInfo>(&self, client: &C) -> PgWireResult<Arc<Session>> {
        let Some(login) = client.session_extensions().get::<LoggedIn>() else {
            return Err(PgWireError::UserError(Box::new(ErrorInfo::new("FATAL".into(), "28000".into(), "the connection has not logged in".into()))));
        };
        if let Some(session) = client.session_extensions().get::<Session>() {
            return Ok(session);
        }
        let (engine, spool_dir) = self.runner.connect(&self.engine).map_err(|e| user_error("58030", format!("cannot create the connection's spool directory: {e}")))?;
        let session = client.session_extensions().get_or_insert_with(|| {
            self.runner.metrics.session_opened();
            engine.set_settings(login.settings.clone());
            Session {
                engine: Arc::new(engine),
                user: login.user.clone(),
                spool: std::sync::Mutex::new(None),
                spool_dir,
                cursors: tokio::sync::Mutex::new(HashMap::new()),
                streaming: std::sync::Mutex::new(None),
                metrics: self.runner.metrics.clone(),
            }
        });
        let (pid, secret) = client.pid_and_secret_key();
        self.by_key.lock().unwrap_or_else(|p| p.into_inner()).insert((pid, secret.to_bytes().to_vec()), Arc::downgrade(&session));
        Ok(session)
    }
}

/// A cancel request: stops the connection's statement while it computes
/// (pgwire's handler) and while its rows are sent (the session's).
struct Cancel {
    connections: DefaultCancelHandler,
    sessions: Arc<Sessions>,
}

#[async_trait]
impl CancelHandler for Cancel {
    async fn on_cancel_request(&self, request: CancelRequest) {
        let (pid, secret) = (request.pid, request.secret_key.to_bytes().to_vec());
        self.connections.on_cancel_request(request).await;
        self.sessions.cancel(pid, &secret);
    }
}

/// Runs statements for every connection, each in its own session.
pub(crate) struct Backend {
    sessions: Arc<Sessions>,
    runner: Arc<Runner>,
    parser: Arc<Parser>,
}

/// One statement to answer, as the protocol brought it.
#[derive(Clone, Copy)]
struct Asked<'a> {
    /// The statement to run (parameters bound).
    sql: &'a str,
    /// The statement as the client wrote it: its command tag.
    kind_of: &'a str,
    /// The schema the client was told at Describe, which the rows then have.
    described: Option<&'a SchemaRef>,
    /// Text or binary, per column.
    format: &'a Format,
    delivery: Delivery,
}

/// How a query's rows reach the client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Delivery {
    /// Collected, then sent (a statement that is not the last of a simple
    /// query: pgwire sends responses only once all statements ran).
    Collect,
    /// As a row stream pgwire sends as it is read (the simple protocol's
    /// last statement) or hands out a fetch size at a time (a portal
    /// executed with a row limit: cursors, JDBC's setFetchSize).
    Stream,
    /// Fed to the client here as they are computed (a portal executed
    /// with no row limit, which pgwire would gather whole first).
    Feed,
}

impl Backend {
    /// [`Backend::run`] with a query's rows streamed; with `timed`, the
    /// session's `statement_timeout` covers the rows too (not for a
    /// cursor's query, whose rows are read by later statements).
    async fn run_streaming(&self, session: &Arc<Session>, sql: String, timed: bool) -> Result<Output, ErrorInfo> {
        let timeout = session.engine.statement_timeout().filter(|_| timed);
        let started = tokio::time::Instant::now();
        let output = within(timeout, self.runner.run_streaming(&session.engine, &session.user, sql)).await?;
        Ok(match (output, timeout) {
            (Output::Rows(rows), Some(limit)) => Output::Rows(rows.with_deadline(started, limit)),
            (output, _) => output,
        })
    }

    /// Runs `sql` in `session` (see [`Runner::run`]: queued, on the
    /// execution runtime, aborted when pgwire drops the future on a cancel
    /// request or a closed connection), within the session's
    /// `statement_timeout`.
    async fn run(&self, session: &Arc<Session>, sql: String) -> Result<QueryResult, ErrorInfo> {
        let timeout = session.engine.statement_timeout();
        within(timeout, self.runner.run(&session.engine, &session.user, sql)).await
    }

    /// Answers one statement: a parameter statement from the session's
    /// settings, a cursor statement from its cursors, anything else from
    /// the engine.
    async fn answer<C>(&self, client: &mut C, session: &Arc<Session>, asked: Asked<'_>) -> PgWireResult<Response>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let response = self.answer_statement(client, session, &asked).await;
        if matches!(CommandKind::of(asked.kind_of), CommandKind::End(_)) {
            // The transaction ended (committed, rolled back or refused):
            // its cursors go with it, as in PostgreSQL; WITH HOLD ones stay.
            let mut cursors = session.cursors.lock().await;
            let ended: Vec<String> = cursors.iter().filter(|(_, c)| !c.hold).map(|(n, _)| n.clone()).collect();
            for name in ended {
                cursors.remove(&name);
                client.portal_store().rm_portal(&name);
            }
        }
        response
    }

    async fn answer_statement<C>(&self, client: &mut C, session: &Arc<Session>, asked: &Asked<'_>) -> PgWireResult<Response>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let Asked { sql, kind_of, described, format, delivery } = *asked;
        let options = Arc::new(FormatOptions::from_client_metadata(client.metadata()));
        if let Some(statement) = cursors::parse(sql) {
            let options = Arc::new(FormatOptions::from_client_metadata(client.metadata()));
            return self.cursor(client, session, statement.map_err(cursor_error)?, format, options).await;
        }
        let sql = self.parser.introspection.rewrite(sql).into_owned();
        // A SET or RESET of a reported parameter is answered with its new
        // value (ParameterStatus), as PostgreSQL does.
        let reported = matches!(CommandKind::of(&sql), CommandKind::Plain(ref w) if w == "SET" || w == "RESET").then(|| session.engine.reported_settings());
        let output = match delivery {
            Delivery::Collect => self.run(session, sql).await.map(Output::Done),
            Delivery::Stream | Delivery::Feed => self.run_streaming(session, sql, true).await,
        };
        let result = match output.map_err(|info| PgWireError::UserError(Box::new(info)))? {
            Output::Done(result) => result,
            Output::Rows(rows) => {
                let response = streamed(session.cancellable(rows), described, format, options)?;
                if delivery == Delivery::Stream {
                    return Ok(Response::Query(response));
                }
                // Sent here as they come; pgwire would gather them all first.
                let mut data = response.data_rows;
                let mut sent = 0;
                while let Some(row) = data.next().await {
                    client.feed(PgWireBackendMessage::DataRow(row?)).await?;
                    sent += 1;
                }
                return Ok(Response::Execution(Tag::new("SELECT").with_rows(sent)));
            }
        };
        if let Some(before) = reported {
            for (name, value) in session.engine.reported_settings() {
                if !before.iter().any(|(n, v)| *n == name && *v == value) {
                    client.feed(PgWireBackendMessage::ParameterStatus(ParameterStatus::new(name.to_string(), value))).await?;
                }
            }
        }
        for notice in &result.notices {
            let mut info = ErrorInfo::new(notice.severity.into(), notice.sqlstate.into(), notice.message.clone());
            info.severity_nonlocalized = Some(notice.severity.into());
            client.feed(PgWireBackendMessage::NoticeResponse(info.into())).await?;
        }
        respond(kind_of, result, described, format, options)
    }
}

impl Backend {
    /// DECLARE, FETCH or CLOSE of a SQL cursor (see `cursors`).
    async fn cursor<C>(&self, client: &mut C, session: &Arc<Session>, statement: CursorStatement, format: &Format, options: Arc<FormatOptions>) -> PgWireResult<Response>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore,
    {
        match statement {
            CursorStatement::Declare { name, query, hold, binary } => {
                if !hold && !session.engine.in_transaction() {
                    return Err(user_error("25P01", "DECLARE CURSOR can only be used in transaction blocks (BEGIN first, or DECLARE … CURSOR WITH HOLD)".into()));
                }
                if session.cursors.lock().await.contains_key(&name) {
                    return Err(user_error("42P03", format!("cursor \"{name}\" already exists")));
                }
                if binary {
                    return Err(user_error("0A000", "BINARY cursors are not supported: ask for binary results in the FETCH's Bind".into()));
                }
                let query = self.parser.introspection.rewrite(&query).into_owned();
                let rows = match self.run_streaming(session, query.clone(), false).await.map_err(|info| PgWireError::UserError(Box::new(info)))? {
                    Output::Rows(rows) => rows,
                    Output::Done(result) => Rows::ready(result.schema, result.batches),
                };
                let cursor = Cursor::new(rows, hold);
                // The cursor is also a protocol portal of that name, for
                // clients that Describe it (psycopg does, for its columns).
                if let Some(store) = client.portal_store().as_any().downcast_ref::<MemPortalStore<Prepared>>() {
                    let prepared = Prepared { sql: query, schema: Some(cursor.schema.clone()), parameters: Vec::new(), cursor: true };
                    let statement = Arc::new(StoredStatement::new(name.clone(), prepared, Vec::new()));
                    store.put_portal(Arc::new(Portal::new_cursor(name.clone(), statement)));
                }
                session.cursors.lock().await.insert(name, cursor);
                Ok(Response::Execution(Tag::new("DECLARE CURSOR")))
            }
            CursorStatement::Fetch { name, count } => {
                let mut cursors = session.cursors.lock().await;
                let cursor = cursors.get_mut(&name).ok_or_else(|| user_error("34000", format!("cursor \"{name}\" does not exist")))?;
                let batches = cursor.fetch(count).await.map_err(|f| PgWireError::UserError(Box::new(failure_info(&f))))?;
                let mut response = rows(cursor.schema.clone(), batches, format, options)?;
                if let Response::Query(q) = &mut response {
                    q.set_command_tag("FETCH");
                }
                Ok(response)
            }
            CursorStatement::Close { name } => {
                let mut cursors = session.cursors.lock().await;
                let names: Vec<String> = match name {
                    Some(name) if cursors.contains_key(&name) => vec![name],
                    Some(name) => return Err(user_error("34000", format!("cursor \"{name}\" does not exist"))),
                    None => cursors.keys().cloned().collect(),
                };
                for name in names {
                    cursors.remove(&name);
                    client.portal_store().rm_portal(&name);
                }
                Ok(Response::Execution(Tag::new("CLOSE CURSOR")))
            }
        }
    }
}

/// Describes `sql` with the parameter types the client declared: planned
/// with them as casts where it can be (`true`: bind into the typed text,
/// [`params::declare`]), else as written, else — a statement that cannot
/// be planned with placeholders, `range($1)` — with sample values of the
/// declared types standing in.
async fn describe_declared(engine: &EngineSession, sql: &str, types: &[Option<Type>]) -> PgWireResult<(bool, Described)> {
    if let Some(typed) = params::declare_for_describe(sql, types)
        && let Ok(described) = engine.describe(&typed).await
    {
        return Ok((true, described));
    }
    match engine.describe(sql).await {
        Ok(described) => Ok((false, described)),
        Err(e) => {
            let Some(sampled) = params::with_samples(sql, types) else { return Err(engine_error(e)) };
            let unknown = vec![None; types.len()];
            match engine.describe(&sampled).await.map_err(|_| engine_error(e))? {
                Described::Rows { schema, .. } => Ok((false, Described::Rows { schema, parameters: unknown })),
                Described::Command { .. } => Ok((false, Described::Command { parameters: unknown })),
                Described::RowsWhenRun => Ok((false, Described::RowsWhenRun)),
            }
        }
    }
}

/// `schema` with columns of no type (a parameter nothing gave a type to,
/// as in `SELECT $1`) as text: PostgreSQL resolves an unknown to text, and
/// the value is bound as a string.
fn unknown_as_text(schema: SchemaRef) -> SchemaRef {
    if !schema.fields().iter().any(|f| f.data_type() == &DataType::Null) {
        return schema;
    }
    let fields: Vec<Field> = schema.fields().iter().map(|f| if f.data_type() == &DataType::Null { f.as_ref().clone().with_data_type(DataType::Utf8) } else { f.as_ref().clone() }).collect();
    Arc::new(Schema::new_with_metadata(fields, schema.metadata().clone()))
}

/// A refused cursor statement.
fn cursor_error(e: cursors::CursorError) -> PgWireError {
    user_error(e.sqlstate, e.message)
}

/// `run`'s outcome, or the timeout's error once `limit` has passed:
/// dropping the statement's future stops it and its downloads, as a cancel
/// request does.
async fn within<T>(limit: Option<std::time::Duration>, run: impl std::future::Future<Output = Result<T, crate::exec::Failure>>) -> Result<T, ErrorInfo> {
    let result = match limit {
        Some(limit) => tokio::time::timeout(limit, run).await.map_err(|_| timed_out(limit))?,
        None => run.await,
    };
    result.map_err(|f| failure_info(&f))
}

/// A statement stopped by `statement_timeout`: PostgreSQL's words and code.
fn timed_out(limit: std::time::Duration) -> ErrorInfo {
    ErrorInfo::new("ERROR".into(), "57014".into(), format!("canceling statement due to statement timeout ({} ms; SET statement_timeout changes it)", limit.as_millis()))
}

/// A parsed (described) statement of the extended protocol.
#[derive(Debug, Clone)]
pub(crate) struct Prepared {
    /// The text parameters are bound into.
    sql: String,
    /// The rows' schema (`None`: a command).
    schema: Option<SchemaRef>,
    parameters: Vec<Option<DataType>>,
    /// The statement of a SQL cursor's portal: its rows come from FETCH.
    cursor: bool,
}

pub(crate) struct Parser {
    introspection: Introspection,
    sessions: Arc<Sessions>,
}

#[async_trait]
impl QueryParser for Parser {
    type Statement = Prepared;

    async fn parse_sql<C>(&self, client: &C, sql: &str, types: &[Option<Type>]) -> PgWireResult<Option<Prepared>>
    where
        C: ClientInfo + Unpin + Send + Sync,
    {
        // Parse may come first on a new connection (psycopg in autocommit).
        let session = self.sessions.of(client)?;
        let sql = sql.trim().trim_end_matches(';').trim();
        if sql.is_empty() {
            return Ok(None);
        }
        match cursors::parse(sql) {
            Some(Err(e)) => return Err(cursor_error(e)),
            // DECLARE takes its query's parameters; its rows come by FETCH.
            Some(Ok(CursorStatement::Declare { query, .. })) => {
                let query = self.introspection.rewrite(&query).into_owned();
                let (typed, described) = describe_declared(&session.engine, &query, types).await?;
                let bound = if typed { params::declare(sql, types).unwrap_or_else(|| sql.to_string()) } else { sql.to_string() };
                let parameters = match described {
                    Described::Rows { parameters, .. } | Described::Command { parameters } => parameters,
                    Described::RowsWhenRun => Vec::new(),
                };
                return Ok(Some(Prepared { sql: bound, schema: None, parameters, cursor: false }));
            }
            Some(Ok(CursorStatement::Fetch { name, .. })) => {
                let schema = session.cursors.lock().await.get(&name).map(|c| c.schema.clone()).ok_or_else(|| user_error("34000", format!("cursor \"{name}\" does not exist")))?;
                return Ok(Some(Prepared { sql: sql.to_string(), schema: Some(schema), parameters: Vec::new(), cursor: false }));
            }
            Some(Ok(CursorStatement::Close { .. })) => return Ok(Some(Prepared { sql: sql.to_string(), schema: None, parameters: Vec::new(), cursor: false })),
            None => {}
        }
        let sql = self.introspection.rewrite(sql).into_owned();
        // Types the client declared fix the statement's types; a statement
        // that cannot be planned so (a LIMIT of a cast) is planned as written.
        let (typed, described) = describe_declared(&session.engine, &sql, types).await?;
        let sql = if typed { params::declare(&sql, types).unwrap_or(sql) } else { sql };
        let cast = |mut parameters: Vec<Option<DataType>>| {
            for (n, t) in params::cast_types(&sql) {
                if let Some(slot @ None) = parameters.get_mut(n - 1) {
                    *slot = Some(t);
                }
            }
            parameters
        };
        let prepared = match described {
            Described::Rows { schema, parameters } => Prepared { schema: Some(unknown_as_text(schema)), parameters: cast(parameters), sql, cursor: false },
            Described::Command { parameters } => Prepared { parameters: cast(parameters), sql, schema: None, cursor: false },
            Described::RowsWhenRun => {
                // Metadata statements: run once for their schema.
                let result = session.engine.execute(&sql).await.map_err(engine_error)?;
                Prepared { sql, schema: Some(result.schema), parameters: Vec::new(), cursor: false }
            }
        };
        Ok(Some(prepared))
    }

    fn get_parameter_types(&self, stmt: &Prepared) -> PgWireResult<Vec<Type>> {
        Ok(stmt.parameters.iter().map(|t| t.as_ref().and_then(|t| arrow_pg::datatypes::into_pg_type(t).ok()).unwrap_or(Type::TEXT)).collect())
    }

    fn get_result_schema(&self, stmt: &Prepared, format: Option<&Format>) -> PgWireResult<Vec<FieldInfo>> {
        match &stmt.schema {
            Some(schema) => fields(&wire_schema(schema), format.unwrap_or(&Format::UnifiedText), None),
            None => Ok(Vec::new()),
        }
    }
}

#[async_trait]
impl SimpleQueryHandler for Backend {
    async fn do_query<C>(&self, client: &mut C, query: &str) -> PgWireResult<Vec<Response>>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let session = self.sessions.of(client)?;
        let mut out = Vec::new();
        let statements: Vec<String> = blobhouse_engine::split_statements(query).into_iter().filter(|s| !s.trim().is_empty()).collect();
        let last = statements.len().saturating_sub(1);
        for (i, statement) in statements.into_iter().enumerate() {
            if let Some(name) = deallocate(&statement) {
                // Protocol-level prepared statements are pgwire's; psycopg
                // drops them with SQL. ALL cannot be enumerated in pgwire's
                // store: they go with the connection (names are reused).
                if let Some(name) = name {
                    client.portal_store().rm_statement(&name);
                }
                out.push(Response::Execution(Tag::new("DEALLOCATE")));
                continue;
            }
            if let Some(copy) = copy::parse(&statement) {
                // The data follows; pgwire sends nothing after CopyInResponse.
                match session.copy_in(copy).await {
                    Ok(response) => out.push(response),
                    Err(PgWireError::UserError(info)) => out.push(Response::Error(info)),
                    Err(e) => return Err(e),
                }
                break;
            }
            // pgwire sends the responses after every statement ran: only
            // the last one's rows can stream without running ahead of them.
            let delivery = if i == last { Delivery::Stream } else { Delivery::Collect };
            let asked = Asked { sql: &statement, kind_of: &statement, described: None, format: &Format::UnifiedText, delivery };
            match self.answer(client, &session, asked).await {
                Ok(response) => out.push(response),
                Err(PgWireError::UserError(info)) => {
                    // A failed COMMIT ended its transaction (rolled back):
                    // pgwire derives the status byte from the responses,
                    // and an error alone would leave it "in a failed
                    // transaction".
                    // pgwire keeps the status it had before this query
                    // string unless do_query fails as a whole, so a COMMIT
                    // that fails first in its string says so that way.
                    if matches!(CommandKind::of(&statement), CommandKind::End(_)) && !session.engine.in_transaction() && out.is_empty() {
                        client.set_transaction_status(TransactionStatus::Idle);
                        return Err(PgWireError::UserError(info));
                    }
                    // The rest of the query string is skipped, as PostgreSQL does.
                    out.push(Response::Error(info));
                    break;
                }
                Err(e) => return Err(e),
            }
        }
        if out.is_empty() {
            out.push(Response::EmptyQuery);
        }
        Ok(out)
    }
}

#[async_trait]
impl ExtendedQueryHandler for Backend {
    type Statement = Prepared;
    type QueryParser = Parser;

    fn query_parser(&self) -> Arc<Parser> {
        self.parser.clone()
    }

    /// pgwire's Execute, then the transaction status as the engine has it:
    /// pgwire derives it from the response alone, and a failed COMMIT has
    /// ended its transaction (ReadyForQuery must then say idle, or drivers
    /// answer the next statement with a savepoint).
    async fn on_execute<C>(&self, client: &mut C, message: Execute) -> PgWireResult<()>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore<Statement = Self::Statement>,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let result = self._on_execute(client, message).await;
        if let Some(session) = client.session_extensions().get::<Session>() {
            // An error (handled after this) turns an open transaction's
            // status into "failed" and leaves "idle" as it is.
            let status = match (session.engine.in_transaction(), session.engine.in_aborted_transaction()) {
                (false, _) => TransactionStatus::Idle,
                (true, false) => TransactionStatus::Transaction,
                (true, true) => TransactionStatus::Error,
            };
            client.set_transaction_status(status);
        }
        result
    }

    async fn do_query<C>(&self, client: &mut C, portal: &Portal<Prepared>, max_rows: usize) -> PgWireResult<Response>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore<Statement = Self::Statement>,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        // With a row limit pgwire keeps the returned row stream in the
        // portal and hands it out max_rows at a time (PortalSuspended
        // between); without one the rows are fed as they come.
        let session = self.sessions.of(client)?;
        let prepared = &portal.statement.statement;
        if prepared.cursor {
            return Err(user_error("0A000", format!("portal \"{}\" is a SQL cursor: read it with FETCH", portal.name)));
        }
        if let Some(copy) = copy::parse(&prepared.sql) {
            return session.copy_in(copy).await;
        }
        let sql = params::bind(portal, &prepared.sql, &prepared.parameters)?;
        let delivery = if max_rows > 0 { Delivery::Stream } else { Delivery::Feed };
        let asked = Asked { sql: &sql, kind_of: &prepared.sql, described: prepared.schema.as_ref(), format: &portal.result_column_format, delivery };
        self.answer(client, &session, asked).await
    }
}

#[async_trait]
impl CopyHandler for Backend {
    async fn on_copy_data<C>(&self, client: &mut C, data: CopyData) -> PgWireResult<()>
    where
        C: ClientInfo + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let session = self.sessions.of(client)?;
        let mut spool = session.spool();
        let Some(spool) = spool.as_mut() else { return Err(user_error("08P01", "COPY data without a COPY … FROM STDIN".into())) };
        spool.write(&data.data).map_err(|e| user_error("58030", format!("COPY FROM STDIN: writing the spool file failed after {} bytes: {e}", spool.bytes())))
    }

    async fn on_copy_done<C>(&self, client: &mut C, _done: CopyDone) -> PgWireResult<()>
    where
        C: ClientInfo + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let session = self.sessions.of(client)?;
        let spool = session.spool().take();
        let Some(mut spool) = spool else { return Err(user_error("08P01", "CopyDone without a COPY … FROM STDIN".into())) };
        let sql = spool.statement().map_err(|e| user_error("58030", format!("COPY FROM STDIN: the spool file: {e}")))?;
        let result = self.run(&session, sql).await.map_err(|mut info| {
            info.message = spool.unspool(&info.message);
            PgWireError::UserError(Box::new(info))
        })?;
        drop(spool);
        let rows = result.changed_rows();
        client.send(PgWireBackendMessage::CommandComplete(Tag::new("COPY").with_rows(rows).into())).await?;
        Ok(())
    }

    async fn on_copy_fail<C>(&self, client: &mut C, fail: CopyFail) -> PgWireError
    where
        C: ClientInfo + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        // The spool (and nothing else: no row was loaded) is dropped.
        if let Ok(session) = self.sessions.of(client) {
            session.spool().take();
        }
        user_error("57014", format!("COPY FROM STDIN failed on the client's side: {}", fail.message))
    }
}

/// `DEALLOCATE [PREPARE] name | ALL`: `Some(Some(name))`, `Some(None)` for ALL.
fn deallocate(sql: &str) -> Option<Option<String>> {
    let words: Vec<&str> = sql.trim().trim_end_matches(';').split_whitespace().collect();
    let rest = match words.as_slice() {
        [d, p, rest @ ..] if d.eq_ignore_ascii_case("deallocate") && p.eq_ignore_ascii_case("prepare") => rest,
        [d, rest @ ..] if d.eq_ignore_ascii_case("deallocate") => rest,
        _ => return None,
    };
    match rest {
        [all] if all.eq_ignore_ascii_case("all") => Some(None),
        [name] => Some(Some(name.trim_matches('"').to_string())),
        _ => None,
    }
}

fn engine_error(e: EngineError) -> PgWireError {
    PgWireError::UserError(Box::new(error_info(&e)))
}

pub(crate) fn user_error(code: &str, message: String) -> PgWireError {
    PgWireError::UserError(Box::new(ErrorInfo::new("ERROR".into(), code.into(), message)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deallocate_names_one_statement_or_all() {
        assert_eq!(deallocate("DEALLOCATE ALL"), Some(None));
        assert_eq!(deallocate("deallocate prepare \"_pg3_0\";"), Some(Some("_pg3_0".into())));
        assert_eq!(deallocate("SELECT 1"), None);
    }
}
