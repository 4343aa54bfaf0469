//! The PostgreSQL wire protocol over engine sessions, on pgwire.
//!
//! pgwire does the protocol (startup, SCRAM, TLS, simple and extended
//! query, cancel); datafusion-postgres's handlers share one DataFusion
//! context among all connections and hand SQL to DataFusion directly, so
//! blobhouse has its own: each connection gets an [`Engine::new_session`]
//! (its own settings and transaction), kept in the connection's session
//! extensions, and every statement goes through `Engine::execute` — DDL,
//! DML, COPY, time travel and transactions included. Results are encoded
//! by arrow-pg.

use std::fmt::Debug;
use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::datatypes::{DataType, Schema, SchemaRef};
use futures::{Sink, SinkExt, stream};
use pgwire::api::auth::DefaultServerParameterProvider;
use pgwire::api::auth::StartupHandler;
use pgwire::api::auth::sasl::SASLAuthStartupHandler;
use pgwire::api::auth::sasl::scram::ScramAuth;
use pgwire::api::cancel::{CancelHandler, DefaultCancelHandler};
use pgwire::api::copy::CopyHandler;
use pgwire::api::portal::{Format, Portal};
use pgwire::api::query::{ExtendedQueryHandler, SimpleQueryHandler};
use pgwire::api::results::{CopyResponse, FieldInfo, QueryResponse, Response, Tag};
use pgwire::api::stmt::QueryParser;
use pgwire::api::store::PortalStore;
use pgwire::api::{ClientInfo, ClientPortalStore, ConnectionManager, PgWireServerHandlers, Type};
use pgwire::error::{ErrorInfo, PgWireError, PgWireResult};
use pgwire::messages::copy::{CopyData, CopyDone, CopyFail};
use pgwire::messages::startup::PasswordMessageFamily;
use pgwire::messages::{PgWireBackendMessage, PgWireFrontendMessage};
use pgwire::types::format::FormatOptions;

use blobhouse_engine::{Described, Engine, EngineError, QueryResult};

use crate::auth::{UserSource, Users};
use crate::catalog::Introspection;
use crate::exec::{Failure, Runner, changed_rows};
use crate::metrics::Metrics;
use crate::copy::{self, CopyIn, Spool};
use crate::params;

/// A connection's engine session, its user and its COPY … FROM STDIN in progress.
struct Session {
    engine: Arc<Engine>,
    user: String,
    spool: std::sync::Mutex<Option<Spool>>,
    metrics: Arc<Metrics>,
}

impl Drop for Session {
    fn drop(&mut self) {
        self.metrics.session_closed();
    }
}

impl Session {
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
        let spool = Spool::new(copy).map_err(|e| user_error("58030", format!("COPY FROM STDIN cannot open its spool file: {e}")))?;
        *self.spool() = Some(spool);
        Ok(Response::CopyIn(CopyResponse::new(0, columns, stream::empty())))
    }
}

/// What pgwire asks of a server, per connection.
pub(crate) struct Handlers {
    backend: Arc<Backend>,
    users: Arc<Users>,
    iterations: usize,
    parameters: Arc<DefaultServerParameterProvider>,
    connections: Arc<ConnectionManager>,
    /// TLS is configured: plaintext startups are refused.
    require_tls: bool,
}

impl Handlers {
    pub(crate) fn new(engine: Arc<Engine>, runner: Arc<Runner>, users: Arc<Users>, iterations: usize, require_tls: bool) -> Handlers {
        let mut parameters = DefaultServerParameterProvider::default();
        parameters.server_version = format!("16.0 (blobhouse {})", env!("CARGO_PKG_VERSION"));
        parameters.scram_iterations = iterations;
        Handlers {
            backend: Arc::new(Backend { engine, metrics: runner.metrics.clone(), runner, parser: Arc::new(Parser { introspection: Introspection::new() }) }),
            users,
            iterations,
            parameters: Arc::new(parameters),
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
        let mut scram = ScramAuth::new(Arc::new(UserSource(self.users.clone())));
        scram.set_iterations(self.iterations);
        let sasl = SASLAuthStartupHandler::new(self.parameters.clone()).with_scram(scram).with_connection_manager(self.connections.clone());
        Arc::new(Startup { sasl, require_tls: self.require_tls, initial_seen: std::sync::atomic::AtomicBool::new(false) })
    }

    fn copy_handler(&self) -> Arc<impl CopyHandler> {
        self.backend.clone()
    }

    fn cancel_handler(&self) -> Arc<impl CancelHandler> {
        Arc::new(DefaultCancelHandler::new(self.connections.clone()))
    }
}

/// SCRAM authentication, behind a TLS check.
///
/// pgwire serves a client that skips the SSLRequest in plaintext even when
/// it has a TLS acceptor; a server told to use TLS must not, so the first
/// startup message of a plaintext connection is answered with a FATAL
/// error (the connection closes before any password is exchanged).
struct Startup {
    sasl: SASLAuthStartupHandler<DefaultServerParameterProvider>,
    require_tls: bool,
    /// Whether the connection's SASLInitialResponse has come (its first
    /// password message; later ones are SASL responses).
    initial_seen: std::sync::atomic::AtomicBool,
}

/// Whether a SASLInitialResponse body is what PostgreSQL's protocol says:
/// a mechanism name ending in NUL, then a length (-1, or at most the bytes
/// that follow) and the data. pgwire 0.41 decodes it without checking and
/// panics on a short one (found by `server_fuzz`), so it is checked here.
fn sasl_initial_is_well_formed(body: &[u8]) -> bool {
    let Some(nul) = body.iter().position(|b| *b == 0) else { return false };
    let rest = &body[nul + 1..];
    let Some(length) = rest.get(..4) else { return false };
    let length = i32::from_be_bytes([length[0], length[1], length[2], length[3]]);
    length == -1 || usize::try_from(length).is_ok_and(|n| n <= rest.len() - 4)
}

#[async_trait]
impl StartupHandler for Startup {
    async fn on_startup<C>(&self, client: &mut C, message: PgWireFrontendMessage) -> PgWireResult<()>
    where
        C: ClientInfo + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        if self.require_tls && !client.is_secure() {
            return Err(PgWireError::UserError(Box::new(ErrorInfo::new(
                "FATAL".into(),
                "28000".into(),
                "this server accepts TLS connections only: connect with sslmode=require (or verify-full)".into(),
            ))));
        }
        if let PgWireFrontendMessage::PasswordMessageFamily(PasswordMessageFamily::Raw(body)) = &message
            && !self.initial_seen.swap(true, std::sync::atomic::Ordering::Relaxed)
            && !sasl_initial_is_well_formed(body)
        {
            return Err(PgWireError::UserError(Box::new(ErrorInfo::new("FATAL".into(), "08P01".into(), "malformed SASLInitialResponse message".into()))));
        }
        self.sasl.on_startup(client, message).await
    }
}

/// Runs statements for every connection, each in its own session.
pub(crate) struct Backend {
    engine: Arc<Engine>,
    metrics: Arc<Metrics>,
    runner: Arc<Runner>,
    parser: Arc<Parser>,
}

impl Backend {
    /// Runs `sql` in `session` (see [`Runner::run`]: queued, on the
    /// execution runtime, aborted when pgwire drops the future on a cancel
    /// request or a closed connection).
    async fn run(&self, session: &Arc<Session>, sql: String) -> Result<QueryResult, ErrorInfo> {
        self.runner.run(&session.engine, &session.user, sql).await.map_err(|f| failure_info(&f))
    }

    fn session<C: ClientInfo>(&self, client: &C) -> Arc<Session> {
        client.session_extensions().get_or_insert_with(|| {
            self.metrics.session_opened();
            let user = client.metadata().get(pgwire::api::METADATA_USER).cloned().unwrap_or_default();
            Session { engine: Arc::new(self.engine.new_session()), user, spool: std::sync::Mutex::new(None), metrics: self.metrics.clone() }
        })
    }
}

/// A parsed (described) statement of the extended protocol.
#[derive(Debug, Clone)]
pub(crate) struct Prepared {
    sql: String,
    /// The rows' schema (`None`: a command).
    schema: Option<SchemaRef>,
    parameters: Vec<Option<DataType>>,
}

pub(crate) struct Parser {
    introspection: Introspection,
}

#[async_trait]
impl QueryParser for Parser {
    type Statement = Prepared;

    async fn parse_sql<C>(&self, client: &C, sql: &str, _types: &[Option<Type>]) -> PgWireResult<Option<Prepared>>
    where
        C: ClientInfo + Unpin + Send + Sync,
    {
        let Some(session) = client.session_extensions().get::<Session>() else {
            return Err(user_error("08003", "the connection has no session (it did not finish its startup)".into()));
        };
        let sql = sql.trim().trim_end_matches(';').trim();
        if sql.is_empty() {
            return Ok(None);
        }
        let sql = self.introspection.rewrite(sql).into_owned();
        let prepared = match session.engine.describe(&sql).await.map_err(engine_error)? {
            Described::Rows { schema, parameters } => Prepared { sql, schema: Some(schema), parameters },
            Described::Command { parameters } => Prepared { sql, schema: None, parameters },
            Described::RowsWhenRun => {
                // Metadata statements: run once for their schema.
                let result = session.engine.execute(&sql).await.map_err(engine_error)?;
                Prepared { sql, schema: Some(result.schema), parameters: Vec::new() }
            }
        };
        Ok(Some(prepared))
    }

    fn get_parameter_types(&self, stmt: &Prepared) -> PgWireResult<Vec<Type>> {
        Ok(stmt.parameters.iter().map(|t| t.as_ref().and_then(|t| arrow_pg::datatypes::into_pg_type(t).ok()).unwrap_or(Type::TEXT)).collect())
    }

    fn get_result_schema(&self, stmt: &Prepared, format: Option<&Format>) -> PgWireResult<Vec<FieldInfo>> {
        match &stmt.schema {
            Some(schema) => arrow_pg::datatypes::arrow_schema_to_pg_fields(schema, format.unwrap_or(&Format::UnifiedText), None),
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
        let session = self.session(client);
        let options = Arc::new(FormatOptions::from_client_metadata(client.metadata()));
        let mut out = Vec::new();
        for statement in blobhouse_engine::split_statements(query) {
            if statement.trim().is_empty() {
                continue;
            }
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
            match self.run(&session, self.parser.introspection.rewrite(&statement).into_owned()).await {
                Ok(result) => out.push(respond(&statement, result, &Format::UnifiedText, options.clone())?),
                Err(info) => {
                    // The rest of the query string is skipped, as PostgreSQL does.
                    out.push(Response::Error(Box::new(info)));
                    break;
                }
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

    async fn do_query<C>(&self, client: &mut C, portal: &Portal<Prepared>, _max_rows: usize) -> PgWireResult<Response>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore<Statement = Self::Statement>,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let session = self.session(client);
        let prepared = &portal.statement.statement;
        if let Some(copy) = copy::parse(&prepared.sql) {
            return session.copy_in(copy).await;
        }
        let sql = params::bind(portal, &prepared.sql, &prepared.parameters)?;
        let result = self.run(&session, sql).await.map_err(|info| PgWireError::UserError(Box::new(info)))?;
        let options = Arc::new(FormatOptions::from_client_metadata(client.metadata()));
        respond(&prepared.sql, result, &portal.result_column_format, options)
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
        let session = self.session(client);
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
        let session = self.session(client);
        let spool = session.spool().take();
        let Some(mut spool) = spool else { return Err(user_error("08P01", "CopyDone without a COPY … FROM STDIN".into())) };
        let sql = spool.statement().map_err(|e| user_error("58030", format!("COPY FROM STDIN: the spool file: {e}")))?;
        let result = self.run(&session, sql).await.map_err(|mut info| {
            info.message = spool.unspool(&info.message);
            PgWireError::UserError(Box::new(info))
        })?;
        drop(spool);
        let rows = changed_rows(&result);
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
        self.session(client).spool().take();
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

/// The response to one statement's result: rows, or a command tag.
fn respond(sql: &str, result: QueryResult, format: &Format, options: Arc<FormatOptions>) -> PgWireResult<Response> {
    let kind = CommandKind::of(sql);
    Ok(match kind {
        CommandKind::Rows => rows(result.schema.clone(), result.batches, format, options)?,
        CommandKind::Begin => Response::TransactionStart(Tag::new("BEGIN")),
        CommandKind::End(word) => Response::TransactionEnd(Tag::new(word)),
        CommandKind::Counted(word) if word == "INSERT" => Response::Execution(Tag::new("INSERT").with_oid(0).with_rows(changed_rows(&result))),
        CommandKind::Counted(word) => Response::Execution(Tag::new(&word).with_rows(changed_rows(&result))),
        CommandKind::Plain(word) => Response::Execution(Tag::new(&word)),
    })
}

fn rows(schema: SchemaRef, batches: Vec<datafusion::arrow::record_batch::RecordBatch>, format: &Format, options: Arc<FormatOptions>) -> PgWireResult<Response> {
    let schema: &Schema = &schema;
    let fields = Arc::new(arrow_pg::datatypes::arrow_schema_to_pg_fields(schema, format, Some(options))?);
    let encoded = fields.clone();
    let rows = batches.into_iter().flat_map(move |b| arrow_pg::datatypes::encode_recordbatch(encoded.clone(), b));
    Ok(Response::Query(QueryResponse::new(fields, stream::iter(rows))))
}

/// How a statement's completion is reported.
#[derive(Debug, PartialEq, Eq)]
enum CommandKind {
    Rows,
    Begin,
    End(&'static str),
    /// A tag with the count of rows it changed.
    Counted(String),
    Plain(String),
}

impl CommandKind {
    fn of(sql: &str) -> CommandKind {
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

/// An engine error as PostgreSQL reports it, with the closest SQLSTATE.
fn error_info(e: &EngineError) -> ErrorInfo {
    let text = e.to_string();
    let code = match e {
        EngineError::TransactionAborted { .. } => "25P02",
        EngineError::Transaction(_) => "40001",
        EngineError::Unsupported(_) => "0A000",
        EngineError::Setting { .. } => "22023",
        _ if text.contains("Resources exhausted") => "53200",
        _ if text.contains("SQL error") || text.contains("ParserError") => "42601",
        _ if text.contains("not found") && text.contains("table") => "42P01",
        _ => "XX000",
    };
    ErrorInfo::new("ERROR".into(), code.into(), text)
}

/// A statement's failure as PostgreSQL reports it.
fn failure_info(f: &Failure) -> ErrorInfo {
    match f {
        Failure::Engine(e) => error_info(e),
        Failure::ShuttingDown => ErrorInfo::new("FATAL".into(), "57P01".into(), f.to_string()),
        Failure::Crashed(_) => ErrorInfo::new("ERROR".into(), "XX000".into(), f.to_string()),
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
    fn statements_complete_with_postgres_tags() {
        assert_eq!(CommandKind::of("select 1"), CommandKind::Rows);
        assert_eq!(CommandKind::of("  begin;"), CommandKind::Begin);
        assert_eq!(CommandKind::of("ROLLBACK"), CommandKind::End("ROLLBACK"));
        assert_eq!(CommandKind::of("insert into t values (1)"), CommandKind::Counted("INSERT".into()));
        assert_eq!(CommandKind::of("create table t as select 1"), CommandKind::Counted("SELECT".into()));
        assert_eq!(CommandKind::of("create table t (x int)"), CommandKind::Plain("CREATE TABLE".into()));
        assert_eq!(CommandKind::of("VACUUM DRY RUN"), CommandKind::Rows);
        assert_eq!(CommandKind::of("show tables"), CommandKind::Rows);
        assert_eq!(deallocate("DEALLOCATE ALL"), Some(None));
        assert_eq!(deallocate("deallocate prepare \"_pg3_0\";"), Some(Some("_pg3_0".into())));
        assert_eq!(deallocate("SELECT 1"), None);
    }

    #[test]
    fn short_sasl_initial_responses_are_refused_before_pgwire_decodes_them() {
        assert!(sasl_initial_is_well_formed(b"SCRAM-SHA-256\0\0\0\0\x03abc"));
        assert!(sasl_initial_is_well_formed(b"SCRAM-SHA-256\0\xff\xff\xff\xff"));
        for bad in [&b""[..], b"SCRAM-SHA-256", b"SCRAM-SHA-256\0\0\0", b"SCRAM-SHA-256\0\0\0\0\x09abc", b"x\0\x80\0\0\0"] {
            assert!(!sasl_initial_is_well_formed(bad), "{bad:?}");
        }
    }
}
