//! Arrow Flight SQL over engine sessions, on arrow-flight's
//! `FlightSqlService` (the protocol, its messages and the metadata
//! builders are arrow-flight's; what a call means for blobhouse is here).
//!
//! Flight SQL is stateless per call, so a session is named by a bearer
//! token: the basic-auth handshake checks the user's password and opens an
//! [`Engine::connect`] (its own settings and transaction), and every
//! later call presents the token. Statements go through the same
//! [`Runner`] as PostgreSQL's: the same queue, metrics, logs and
//! cancellation, which here is the client cancelling its call (ADBC's
//! `adbc_cancel`): tonic drops the call's future and with it the
//! statement.
//!
//! * A query is planned at `GetFlightInfo` (its schema) and runs at
//!   `DoGet`, so a client that reads its results is the one that waits.
//!   A command (DDL, DML, COPY, SET) runs at `GetFlightInfo`, where an ADBC
//!   client's `execute` expects it to happen; its ticket then holds the
//!   result.
//! * Prepared statements accept `$n` or `?` placeholders; bound Arrow
//!   values become typed literals ([`params::arrow_literal`]), as the
//!   PostgreSQL endpoint does with its parameters.
//! * Bulk ingest (`CommandStatementIngest`, ADBC's `adbc_ingest`) spools
//!   the client's batches to a local Parquet file, then runs CREATE TABLE
//!   (when asked) and `COPY … FROM` it in the session, in one transaction,
//!   so an ingest is all or nothing and passes the checks every COPY does.

use std::collections::{BTreeMap, HashMap};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use arrow_flight::decode::FlightRecordBatchStream;
use arrow_flight::encode::FlightDataEncoderBuilder;
use arrow_flight::error::FlightError;
use arrow_flight::flight_service_server::FlightService;
use arrow_flight::sql::metadata::{GetTablesBuilder, SqlInfoData, SqlInfoDataBuilder};
use arrow_flight::sql::server::{FlightSqlService, PeekableFlightDataStream};
use arrow_flight::sql::{
    ActionBeginTransactionRequest, ActionBeginTransactionResult, ActionClosePreparedStatementRequest, ActionCreatePreparedStatementRequest,
    ActionCreatePreparedStatementResult, ActionEndTransactionRequest, CommandGetCatalogs, CommandGetDbSchemas, CommandGetSqlInfo, CommandGetTableTypes,
    CommandGetTables, CommandPreparedStatementQuery, CommandPreparedStatementUpdate, CommandStatementIngest, CommandStatementQuery, CommandStatementUpdate,
    DoPutPreparedStatementResult, EndTransaction, ProstMessageExt, SqlInfo, SqlSupportedTransaction, TableExistsOption, TableNotExistOption,
    TicketStatementQuery,
};
use arrow_flight::{Action, FlightDescriptor, FlightEndpoint, FlightInfo, HandshakeRequest, HandshakeResponse, IpcMessage, SchemaAsIpc, Ticket};
use base64::Engine as _;
use datafusion::arrow::array::{AsArray, RecordBatch};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::arrow::ipc::writer::IpcWriteOptions;
use futures::{Stream, TryStreamExt};
use prost::Message;
use tonic::metadata::MetadataValue;
use tonic::{Request, Response, Status, Streaming};

use blobhouse_engine::{Described, Engine, EngineError, QueryResult, Session};

use crate::auth::Users;
use crate::exec::{Failure, Runner};
use crate::metrics::Metrics;
use crate::params;

/// A session unused this long is closed (its transaction, if any, rolled
/// back): Flight SQL clients do not always say goodbye.
pub const SESSION_IDLE: Duration = Duration::from_secs(3600);

/// Tickets a session may hold that no `DoGet` has redeemed yet; the oldest
/// goes when a new one would pass this (a client that never reads its
/// results cannot grow the server without bound).
const MAX_TICKETS: usize = 64;

/// Prepared statements one session may hold open.
const MAX_PREPARED: usize = 1024;

/// Largest Flight message the server decodes (a batch of ingested rows).
pub const MAX_MESSAGE_BYTES: usize = 64 << 20;

/// What a ticket stands for until its `DoGet`.
enum Pending {
    /// A planned query, run when the ticket is redeemed; its rows are sent
    /// with the schema its FlightInfo announced.
    Query { sql: String, schema: SchemaRef },
    /// A statement that already ran (a command, or one whose rows are known
    /// only once it ran).
    Done(QueryResult),
}

/// A prepared statement and the parameter values last bound to it.
#[derive(Clone)]
struct Prepared {
    sql: String,
    /// Its rows' schema (`None`: a command, or rows known when run).
    schema: Option<SchemaRef>,
    parameters: Vec<Option<DataType>>,
    /// Rows of literals, one per bound row of parameter values.
    bound: Vec<Vec<String>>,
}

/// One client's session: what its token opens.
struct FlightSession {
    engine: Arc<Session>,
    user: String,
    /// The session's own directory for ingest spools (the only local
    /// files it may read unless the server allows more).
    spool_dir: tempfile::TempDir,
    metrics: Arc<Metrics>,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    last_used: Option<Instant>,
    next_handle: u64,
    tickets: BTreeMap<u64, Pending>,
    prepared: HashMap<u64, Prepared>,
    /// The id handed out by BeginTransaction, while it is open.
    transaction: Option<Vec<u8>>,
}

impl Drop for FlightSession {
    fn drop(&mut self) {
        self.metrics.session_closed();
    }
}

impl FlightSession {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn add_ticket(&self, pending: Pending) -> Vec<u8> {
        let mut state = self.state();
        state.next_handle += 1;
        let handle = state.next_handle;
        state.tickets.insert(handle, pending);
        while state.tickets.len() > MAX_TICKETS {
            state.tickets.pop_first();
        }
        handle.to_be_bytes().to_vec()
    }

    fn take_ticket(&self, handle: &[u8]) -> Result<Pending, Status> {
        let key = decode_handle(handle, "ticket")?;
        self.state().tickets.remove(&key).ok_or_else(|| {
            Status::not_found("this ticket was already read or has expired (a session keeps its last 64 unread tickets): run the statement again")
        })
    }

    fn prepared(&self, handle: &[u8]) -> Result<Prepared, Status> {
        let key = decode_handle(handle, "prepared statement handle")?;
        self.state().prepared.get(&key).cloned().ok_or_else(|| Status::not_found("no such prepared statement in this session (closed, or prepared in another session)"))
    }

    /// A command's transaction id must be the session's open transaction.
    fn check_transaction(&self, id: Option<&[u8]>) -> Result<(), Status> {
        match (id, &self.state().transaction) {
            (None, _) => Ok(()),
            (Some(id), Some(open)) if id == open.as_slice() => Ok(()),
            (Some(_), _) => Err(Status::failed_precondition("the transaction id is not this session's open transaction (it ended, or belongs to another session)")),
        }
    }
}

fn decode_handle(handle: &[u8], what: &str) -> Result<u64, Status> {
    <[u8; 8]>::try_from(handle).map(u64::from_be_bytes).map_err(|_| Status::invalid_argument(format!("malformed {what}: {} bytes, expected 8", handle.len())))
}

/// The open sessions by token.
struct Sessions {
    by_token: Mutex<HashMap<String, Arc<FlightSession>>>,
    max: usize,
}

impl Sessions {
    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<FlightSession>>> {
        self.by_token.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Opens a session for `user`, after closing the idle ones.
    fn open(&self, session: FlightSession) -> Result<String, Status> {
        let mut map = self.map();
        map.retain(|_, s| s.state().last_used.is_some_and(|t| t.elapsed() < SESSION_IDLE));
        if map.len() >= self.max {
            return Err(Status::resource_exhausted(format!(
                "the server has {} open Flight SQL sessions, its limit (--max-connections): close a connection or try again later",
                map.len()
            )));
        }
        let token = random_token();
        session.state().last_used = Some(Instant::now());
        map.insert(token.clone(), Arc::new(session));
        Ok(token)
    }

    fn get(&self, token: &str) -> Option<Arc<FlightSession>> {
        let session = self.map().get(token).cloned()?;
        session.state().last_used = Some(Instant::now());
        Some(session)
    }

}

/// 256 random bits, hex: a token nobody guesses.
fn random_token() -> String {
    let bytes: [u8; 32] = rand::random();
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The Flight SQL service.
pub(crate) struct FlightSql {
    engine: Arc<Engine>,
    runner: Arc<Runner>,
    users: Arc<Users>,
    sessions: Arc<Sessions>,
    info: Arc<SqlInfoData>,
}

impl FlightSql {
    pub(crate) fn new(engine: Arc<Engine>, runner: Arc<Runner>, users: Arc<Users>, max_sessions: usize) -> FlightSql {
        FlightSql {
            engine,
            runner,
            users,
            sessions: Arc::new(Sessions { by_token: Mutex::new(HashMap::new()), max: max_sessions.max(1) }),
            info: Arc::new(sql_info()),
        }
    }

    /// The session of the call's bearer token.
    fn session<T>(&self, request: &Request<T>) -> Result<Arc<FlightSession>, Status> {
        let token = bearer(request).ok_or_else(|| {
            Status::unauthenticated("log in first: Flight SQL's handshake with basic authentication (ADBC: the username and password options) gives the token every call must carry")
        })?;
        self.sessions.get(token).ok_or_else(|| Status::unauthenticated("the bearer token is unknown or its session expired (idle for an hour, or closed): log in again"))
    }

    async fn run(&self, session: &FlightSession, sql: String) -> Result<QueryResult, Status> {
        self.runner.run(&session.engine, &session.user, sql).await.map_err(|f| failure_status(&f))
    }

    /// What GetFlightInfo answers for `sql`: its schema and a ticket.
    async fn plan(&self, session: &FlightSession, sql: String) -> Result<(SchemaRef, Pending), Status> {
        match session.engine.describe(&sql).await.map_err(|e| engine_status(&e))? {
            Described::Rows { parameters, .. } | Described::Command { parameters } if !parameters.is_empty() => {
                Err(Status::invalid_argument(format!("the statement takes {} parameter(s): prepare it and bind their values", parameters.len())))
            }
            Described::Rows { schema, .. } => {
                let schema = plain_types(&schema);
                Ok((schema.clone(), Pending::Query { sql, schema }))
            }
            Described::Command { .. } | Described::RowsWhenRun => {
                let result = self.run(session, sql).await?;
                Ok((plain_types(&result.schema), Pending::Done(result)))
            }
        }
    }

    /// A FlightInfo with one endpoint whose ticket is `ticket`.
    fn info(schema: &Schema, ticket: Vec<u8>, descriptor: FlightDescriptor) -> Result<Response<FlightInfo>, Status> {
        let info = FlightInfo::new()
            .try_with_schema(schema)
            .map_err(|e| Status::internal(format!("cannot encode the result schema: {e}")))?
            .with_endpoint(FlightEndpoint::new().with_ticket(Ticket::new(ticket)))
            .with_descriptor(descriptor);
        Ok(Response::new(info))
    }

    /// A metadata command's FlightInfo: the command is its own ticket.
    fn metadata_info(&self, schema: SchemaRef, command: impl ProstMessageExt, request: Request<FlightDescriptor>) -> Result<Response<FlightInfo>, Status> {
        self.session(&request)?;
        FlightSql::info(&schema, command.as_any().encode_to_vec(), request.into_inner())
    }

    /// A statement's ticket: its handle in the session.
    fn statement_info(session: &FlightSession, schema: &Schema, pending: Pending, descriptor: FlightDescriptor) -> Result<Response<FlightInfo>, Status> {
        let handle = session.add_ticket(pending);
        let ticket = TicketStatementQuery { statement_handle: handle.into() }.as_any().encode_to_vec();
        FlightSql::info(schema, ticket, descriptor)
    }

    /// Runs `prepared` once per bound row (once if it takes no parameters)
    /// and returns every result.
    async fn run_prepared(&self, session: &FlightSession, prepared: &Prepared) -> Result<Vec<QueryResult>, Status> {
        if prepared.bound.is_empty() {
            if !prepared.parameters.is_empty() {
                return Err(Status::invalid_argument(format!("bind values for the statement's {} parameter(s) first", prepared.parameters.len())));
            }
            return Ok(vec![self.run(session, prepared.sql.clone()).await?]);
        }
        let mut results = Vec::with_capacity(prepared.bound.len());
        for row in &prepared.bound {
            let sql = params::substitute(&prepared.sql, row).map_err(Status::invalid_argument)?;
            results.push(self.run(session, sql).await?);
        }
        Ok(results)
    }

    /// Tables (and views) the session sees: (catalog, schema, name, type).
    async fn tables(&self, session: &FlightSession) -> Result<Vec<[String; 4]>, Status> {
        let sql = "SELECT table_catalog, table_schema, table_name, table_type FROM information_schema.tables ORDER BY 1, 2, 3";
        let result = session.engine.execute(sql).await.map_err(|e| engine_status(&e))?;
        let mut out = Vec::new();
        for batch in &result.batches {
            let columns: Vec<_> = (0..4).map(|i| datafusion::arrow::compute::cast(batch.column(i), &DataType::Utf8)).collect::<Result<_, _>>().map_err(|e| Status::internal(e.to_string()))?;
            for row in 0..batch.num_rows() {
                out.push(std::array::from_fn(|i| columns[i].as_string::<i32>().value(row).to_string()));
            }
        }
        Ok(out)
    }

    /// Bulk ingest: see the module docs.
    async fn ingest(&self, session: &FlightSession, command: CommandStatementIngest, data: PeekableFlightDataStream) -> Result<i64, Status> {
        let table = command.table.clone();
        let context = |m: String| format!("ingest into '{table}': {m}");
        if command.temporary {
            return Err(Status::unimplemented(context("temporary tables are not supported; ingest into a table".into())));
        }
        for (what, given, ours) in [("catalog", &command.catalog, blobhouse_engine::CATALOG), ("schema", &command.schema, "public")] {
            if let Some(given) = given.as_deref().filter(|g| !g.is_empty() && *g != ours) {
                return Err(Status::not_found(context(format!("{what} '{given}' does not exist (tables live in {what} '{ours}')"))));
            }
        }
        session.check_transaction(command.transaction_id.as_deref())?;
        // Spool the batches as they arrive.
        let spool = tempfile::Builder::new().prefix("blobhouse-ingest-").suffix(".parquet").tempfile_in(session.spool_dir.path()).map_err(|e| Status::internal(context(format!("cannot open a spool file: {e}"))))?;
        let mut batches = FlightRecordBatchStream::new_from_flight_data(data.map_err(FlightError::from));
        let mut writer: Option<(datafusion::parquet::arrow::ArrowWriter<std::fs::File>, SchemaRef)> = None;
        let mut rows = 0;
        while let Some(batch) = batches.try_next().await.map_err(|e| Status::invalid_argument(context(format!("the data stream: {e}"))))? {
            rows += batch.num_rows();
            let (w, _) = match &mut writer {
                Some(w) => w,
                None => {
                    let file = spool.reopen().map_err(|e| Status::internal(context(e.to_string())))?;
                    let w = datafusion::parquet::arrow::ArrowWriter::try_new(file, batch.schema(), None).map_err(|e| Status::internal(context(e.to_string())))?;
                    writer.insert((w, batch.schema()))
                }
            };
            w.write(&batch).map_err(|e| Status::invalid_argument(context(format!("spooling row {rows}: {e}"))))?;
        }
        let schema = match (writer, batches.schema()) {
            (Some((w, schema)), _) => {
                w.close().map_err(|e| Status::internal(context(e.to_string())))?;
                Some(schema)
            }
            (None, Some(schema)) => Some(schema.clone()),
            (None, None) => None,
        };
        let schema = schema.ok_or_else(|| Status::invalid_argument(context("the request carries no schema and no rows".into())))?;
        let options = command.table_definition_options.unwrap_or_default();
        let quoted = quote(&table);
        let exists = session.engine.describe(&format!("SELECT * FROM {quoted}")).await.is_ok();
        let create = match (exists, options.if_exists(), options.if_not_exist()) {
            (true, TableExistsOption::Append, _) => None,
            (true, TableExistsOption::Replace, _) => Some(format!("CREATE OR REPLACE TABLE {quoted} ({})", columns(&schema).map_err(|m| Status::invalid_argument(context(m)))?)),
            (true, _, _) => return Err(Status::already_exists(context("the table exists (ingest in append or replace mode to add to it or replace it)".into()))),
            (false, _, TableNotExistOption::Create) => Some(format!("CREATE TABLE {quoted} ({})", columns(&schema).map_err(|m| Status::invalid_argument(context(m)))?)),
            (false, _, _) => return Err(Status::not_found(context("the table does not exist (ingest in create or create_append mode to create it)".into()))),
        };
        let own = if session.engine.in_transaction() {
            None
        } else {
            session.engine.begin().await.map_err(|e| engine_status(&e))?;
            Some(OwnTransaction(Some(session.engine.clone())))
        };
        let mut statements: Vec<String> = create.into_iter().collect();
        if rows > 0 {
            let path = spool.path().display().to_string().replace('\'', "''");
            statements.push(format!("COPY {quoted} FROM '{path}' WITH (FORMAT parquet)"));
        }
        let mut loaded = 0;
        for sql in statements {
            match self.run(session, sql).await {
                Ok(result) => loaded = result.changed_rows(),
                Err(status) => {
                    if let Some(own) = own {
                        own.rollback().await;
                    }
                    return Err(Status::new(status.code(), context(status.message().replace(&spool.path().display().to_string(), "the client's data"))));
                }
            }
        }
        if let Some(own) = own {
            own.commit().await.map_err(|e| engine_status(&e))?;
        }
        Ok(loaded as i64)
    }
}

/// A transaction an ingest began for itself. If the ingest's call is
/// dropped half-way (the client cancelled or went away), it is rolled back
/// rather than left open in the session for the client's next statements.
struct OwnTransaction(Option<Arc<Session>>);

impl OwnTransaction {
    async fn commit(mut self) -> Result<(), EngineError> {
        let engine = self.0.take().expect("an open transaction");
        engine.commit().await
    }

    async fn rollback(mut self) {
        let engine = self.0.take().expect("an open transaction");
        engine.rollback().await;
    }
}

impl Drop for OwnTransaction {
    fn drop(&mut self) {
        if let Some(engine) = self.0.take() {
            tokio::spawn(async move { engine.rollback().await });
        }
    }
}

/// `name` as a quoted SQL identifier.
fn quote(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// The column list of a CREATE TABLE for `schema`.
fn columns(schema: &Schema) -> Result<String, String> {
    let mut out = Vec::with_capacity(schema.fields().len());
    for f in schema.fields() {
        let sql = sql_type(f.data_type()).ok_or_else(|| format!("column '{}' has type {}, which a table cannot store yet; cast it first", f.name(), f.data_type()))?;
        out.push(format!("{} {sql}{}", quote(f.name()), if f.is_nullable() { "" } else { " NOT NULL" }));
    }
    if out.is_empty() {
        return Err("the data has no columns".into());
    }
    Ok(out.join(", "))
}

/// The SQL type of an ingested column (`None`: a type tables cannot store).
fn sql_type(t: &DataType) -> Option<String> {
    use DataType::*;
    let storable = matches!(
        t,
        Boolean | Int8 | Int16 | Int32 | Int64 | UInt8 | UInt16 | UInt32 | UInt64 | Float32 | Float64 | Decimal128(..) | Utf8 | LargeUtf8 | Utf8View | Binary | LargeBinary | BinaryView | Date32 | Date64 | Timestamp(_, None)
    );
    storable.then(|| blobhouse_engine::types::sql_type_name(t))
}

/// The `authorization: Bearer …` token of a call.
fn bearer<T>(request: &Request<T>) -> Option<&str> {
    let value = request.metadata().get("authorization")?.to_str().ok()?;
    value.strip_prefix("Bearer ").or_else(|| value.strip_prefix("bearer "))
}

/// `schema` with the view types DataFusion computes with (Utf8View,
/// BinaryView) as the plain types a table's VARCHAR and BYTEA columns are:
/// what a client ingested as `string` reads back as `string`, not as
/// `string_view`, which many Arrow consumers do not take.
fn plain_types(schema: &SchemaRef) -> SchemaRef {
    let plain = |t: &DataType| match t {
        DataType::Utf8View => Some(DataType::Utf8),
        DataType::BinaryView => Some(DataType::Binary),
        _ => None,
    };
    if !schema.fields().iter().any(|f| plain(f.data_type()).is_some()) {
        return schema.clone();
    }
    let fields: Vec<Field> = schema.fields().iter().map(|f| plain(f.data_type()).map_or_else(|| f.as_ref().clone(), |t| f.as_ref().clone().with_data_type(t))).collect();
    Arc::new(Schema::new_with_metadata(fields, schema.metadata().clone()))
}

/// `schema` as the IPC message Flight SQL's prepared-statement results carry.
fn ipc_schema(schema: &Schema) -> Result<bytes::Bytes, Status> {
    let IpcMessage(bytes) = SchemaAsIpc::new(schema, &IpcWriteOptions::default()).try_into().map_err(|e: datafusion::arrow::error::ArrowError| Status::internal(e.to_string()))?;
    Ok(bytes)
}

/// `batches` as a DoGet stream under `schema` (what the FlightInfo said);
/// a batch whose schema differs only in names, nullability or metadata is
/// relabelled, one of other types is cast (a value that does not fit is
/// an error, not a NULL).
fn stream(schema: SchemaRef, batches: Vec<RecordBatch>) -> Result<Response<<FlightSql as FlightService>::DoGetStream>, Status> {
    let mut conformed = Vec::with_capacity(batches.len());
    for batch in batches {
        if batch.schema() == schema {
            conformed.push(batch);
            continue;
        }
        let columns = crate::exec::conform(batch, &schema)
            .and_then(|b| RecordBatch::try_new(schema.clone(), b.columns().to_vec()))
            .map_err(|e| Status::internal(format!("the result does not fit the schema announced for it: {e}")))?;
        conformed.push(columns);
    }
    let encoded = FlightDataEncoderBuilder::new().with_schema(schema).build(futures::stream::iter(conformed.into_iter().map(Ok))).map_err(Status::from);
    Ok(Response::new(Box::pin(encoded)))
}

/// A metadata batch as a DoGet stream.
fn metadata_stream(batch: Result<RecordBatch, impl std::fmt::Display>) -> Result<Response<<FlightSql as FlightService>::DoGetStream>, Status> {
    let batch = batch.map_err(|e| Status::internal(format!("building the metadata: {e}")))?;
    stream(batch.schema(), vec![batch])
}

/// What GetSqlInfo reports (ADBC's `get_info`).
fn sql_info() -> SqlInfoData {
    let mut b = SqlInfoDataBuilder::new();
    b.append(SqlInfo::FlightSqlServerName, "blobhouse");
    b.append(SqlInfo::FlightSqlServerVersion, env!("CARGO_PKG_VERSION"));
    b.append(SqlInfo::FlightSqlServerArrowVersion, "59");
    b.append(SqlInfo::FlightSqlServerReadOnly, false);
    b.append(SqlInfo::FlightSqlServerSql, true);
    b.append(SqlInfo::FlightSqlServerSubstrait, false);
    b.append(SqlInfo::FlightSqlServerTransaction, SqlSupportedTransaction::Transaction as i32);
    b.append(SqlInfo::FlightSqlServerCancel, true);
    b.append(SqlInfo::FlightSqlServerBulkIngestion, true);
    b.append(SqlInfo::FlightSqlServerIngestTransactionsSupported, true);
    b.append(SqlInfo::FlightSqlServerStatementTimeout, 0i32);
    b.append(SqlInfo::FlightSqlServerTransactionTimeout, 0i32);
    b.append(SqlInfo::SqlIdentifierQuoteChar, "\"");
    b.append(SqlInfo::SqlDdlCatalog, false);
    b.append(SqlInfo::SqlDdlSchema, false);
    b.append(SqlInfo::SqlDdlTable, true);
    b.append(SqlInfo::SqlTransactionsSupported, true);
    b.build().expect("the server's fixed SqlInfo values build")
}

/// A failed statement as a gRPC status.
fn failure_status(f: &Failure) -> Status {
    match f {
        Failure::Engine(e) => engine_status(e),
        Failure::ShuttingDown => Status::unavailable(f.to_string()),
        Failure::Crashed(_) => Status::internal(f.to_string()),
        Failure::TimedOut(_) => Status::deadline_exceeded(f.to_string()),
        Failure::Cancelled => Status::cancelled(f.to_string()),
    }
}

/// An engine error with the gRPC code of its SQLSTATE's class (a
/// serialization failure is `Aborted`, which ADBC clients retry; the
/// SQLSTATE itself leads the message, as ADBC's drivers show it).
fn engine_status(e: &EngineError) -> Status {
    let code = e.sqlstate();
    let text = format!("[SQLSTATE {code}] {e}");
    match code {
        c if c.starts_with("40") => Status::aborted(text),
        c if c.starts_with("25") => Status::failed_precondition(text),
        "0A000" => Status::unimplemented(text),
        "42P01" | "42704" => Status::not_found(text),
        "42P07" | "42710" => Status::already_exists(text),
        c if c.starts_with("53") => Status::resource_exhausted(text),
        "57014" => Status::cancelled(text),
        c if c.starts_with("42") || c.starts_with("22") => Status::invalid_argument(text),
        c if c.starts_with("58") || c.starts_with("08") => Status::unavailable(text),
        _ => Status::internal(text),
    }
}

type Boxed<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

#[tonic::async_trait]
impl FlightSqlService for FlightSql {
    type FlightService = FlightSql;

    async fn do_handshake(&self, request: Request<Streaming<HandshakeRequest>>) -> Result<Response<Boxed<HandshakeResponse>>, Status> {
        let refuse = || Status::unauthenticated("log in with basic authentication: a user name and password (ADBC: the username and password options)");
        let header = request.metadata().get("authorization").and_then(|v| v.to_str().ok()).ok_or_else(refuse)?;
        let encoded = header.strip_prefix("Basic ").or_else(|| header.strip_prefix("basic ")).ok_or_else(refuse)?;
        // Padding optional: Go's Flight client (under ADBC) sends none.
        let lenient = base64::engine::GeneralPurpose::new(
            &base64::alphabet::STANDARD,
            base64::engine::GeneralPurposeConfig::new().with_decode_padding_mode(base64::engine::DecodePaddingMode::Indifferent),
        );
        let decoded = lenient.decode(encoded.trim()).ok().and_then(|b| String::from_utf8(b).ok()).ok_or_else(refuse)?;
        let (user, password) = decoded.split_once(':').ok_or_else(refuse)?;
        let (users, name, password) = (self.users.clone(), user.to_string(), password.to_string());
        let ok = tokio::task::spawn_blocking(move || users.verify(&name, &password)).await.unwrap_or(false);
        if !ok {
            tracing::info!(user = %user, protocol = "flight", "login refused");
            return Err(Status::unauthenticated(format!("password authentication failed for user \"{user}\"")));
        }
        self.runner.metrics.session_opened();
        let (engine, spool_dir) = self.runner.connect(&self.engine).map_err(|e| Status::internal(format!("cannot create the session's spool directory: {e}")))?;
        let session = FlightSession { engine: Arc::new(engine), user: user.to_string(), spool_dir, metrics: self.runner.metrics.clone(), state: Mutex::default() };
        let token = self.sessions.open(session)?;
        let value = MetadataValue::try_from(format!("Bearer {token}")).map_err(|_| Status::internal("the token is not a header value"))?;
        let answer = HandshakeResponse { protocol_version: 0, payload: token.into_bytes().into() };
        let mut response = Response::new(Box::pin(futures::stream::iter([Ok(answer)])) as Boxed<HandshakeResponse>);
        response.metadata_mut().insert("authorization", value);
        Ok(response)
    }

    async fn get_flight_info_statement(&self, query: CommandStatementQuery, request: Request<FlightDescriptor>) -> Result<Response<FlightInfo>, Status> {
        let session = self.session(&request)?;
        session.check_transaction(query.transaction_id.as_deref())?;
        let (schema, pending) = self.plan(&session, query.query).await?;
        FlightSql::statement_info(&session, &schema, pending, request.into_inner())
    }

    async fn do_get_statement(&self, ticket: TicketStatementQuery, request: Request<Ticket>) -> Result<Response<<Self as FlightService>::DoGetStream>, Status> {
        let session = self.session(&request)?;
        match session.take_ticket(&ticket.statement_handle)? {
            Pending::Query { sql, schema } => {
                let result = self.run(&session, sql).await?;
                stream(schema, result.batches)
            }
            Pending::Done(result) => stream(plain_types(&result.schema), result.batches),
        }
    }

    async fn do_put_statement_update(&self, command: CommandStatementUpdate, request: Request<PeekableFlightDataStream>) -> Result<i64, Status> {
        let session = self.session(&request)?;
        session.check_transaction(command.transaction_id.as_deref())?;
        let result = self.run(&session, command.query).await?;
        Ok(result.changed_rows() as i64)
    }

    async fn do_action_create_prepared_statement(&self, query: ActionCreatePreparedStatementRequest, request: Request<Action>) -> Result<ActionCreatePreparedStatementResult, Status> {
        let session = self.session(&request)?;
        session.check_transaction(query.transaction_id.as_deref())?;
        let sql = params::number_qmarks(query.query.trim().trim_end_matches(';'));
        let (schema, parameters) = match session.engine.describe(&sql).await.map_err(|e| engine_status(&e))? {
            Described::Rows { schema, parameters } => (Some(plain_types(&schema)), parameters),
            Described::Command { parameters } => (None, parameters),
            Described::RowsWhenRun => (None, Vec::new()),
        };
        let parameter_schema = Schema::new(parameters.iter().enumerate().map(|(i, t)| Field::new(format!("${}", i + 1), t.clone().unwrap_or(DataType::Null), true)).collect::<Vec<_>>());
        let dataset_schema = ipc_schema(schema.as_deref().unwrap_or(&Schema::empty()))?;
        let mut state = session.state();
        if state.prepared.len() >= MAX_PREPARED {
            return Err(Status::resource_exhausted(format!("this session holds {MAX_PREPARED} prepared statements: close some")));
        }
        state.next_handle += 1;
        let handle = state.next_handle;
        state.prepared.insert(handle, Prepared { sql, schema, parameters, bound: Vec::new() });
        Ok(ActionCreatePreparedStatementResult { prepared_statement_handle: handle.to_be_bytes().to_vec().into(), dataset_schema, parameter_schema: ipc_schema(&parameter_schema)? })
    }

    async fn do_action_close_prepared_statement(&self, query: ActionClosePreparedStatementRequest, request: Request<Action>) -> Result<(), Status> {
        let session = self.session(&request)?;
        let key = decode_handle(&query.prepared_statement_handle, "prepared statement handle")?;
        session.state().prepared.remove(&key);
        Ok(())
    }

    async fn do_put_prepared_statement_query(&self, query: CommandPreparedStatementQuery, request: Request<PeekableFlightDataStream>) -> Result<DoPutPreparedStatementResult, Status> {
        let session = self.session(&request)?;
        let key = decode_handle(&query.prepared_statement_handle, "prepared statement handle")?;
        let bound = bound_rows(request.into_inner()).await?;
        let mut state = session.state();
        let prepared = state.prepared.get_mut(&key).ok_or_else(|| Status::not_found("no such prepared statement in this session"))?;
        prepared.bound = bound;
        Ok(DoPutPreparedStatementResult { prepared_statement_handle: Some(query.prepared_statement_handle) })
    }

    async fn get_flight_info_prepared_statement(&self, query: CommandPreparedStatementQuery, request: Request<FlightDescriptor>) -> Result<Response<FlightInfo>, Status> {
        let session = self.session(&request)?;
        let prepared = session.prepared(&query.prepared_statement_handle)?;
        let descriptor = request.into_inner();
        match &prepared.schema {
            Some(schema) => {
                let sql = match prepared.bound.as_slice() {
                    [] if prepared.parameters.is_empty() => prepared.sql.clone(),
                    [] => return Err(Status::invalid_argument(format!("bind values for the query's {} parameter(s) first", prepared.parameters.len()))),
                    [row] => params::substitute(&prepared.sql, row).map_err(Status::invalid_argument)?,
                    rows => return Err(Status::invalid_argument(format!("a query runs with one row of parameter values; {} rows were bound", rows.len()))),
                };
                FlightSql::statement_info(&session, schema, Pending::Query { sql, schema: schema.clone() }, descriptor)
            }
            None => {
                let result = self.run_prepared(&session, &prepared).await?.pop().expect("at least one run");
                FlightSql::statement_info(&session, &plain_types(&result.schema), Pending::Done(result), descriptor)
            }
        }
    }

    async fn do_put_prepared_statement_update(&self, query: CommandPreparedStatementUpdate, request: Request<PeekableFlightDataStream>) -> Result<i64, Status> {
        let session = self.session(&request)?;
        let mut prepared = session.prepared(&query.prepared_statement_handle)?;
        let sent = bound_rows(request.into_inner()).await?;
        if !sent.is_empty() {
            prepared.bound = sent;
        }
        let results = self.run_prepared(&session, &prepared).await?;
        Ok(results.iter().map(QueryResult::changed_rows).sum::<usize>() as i64)
    }

    async fn do_put_statement_ingest(&self, command: CommandStatementIngest, request: Request<PeekableFlightDataStream>) -> Result<i64, Status> {
        let session = self.session(&request)?;
        self.ingest(&session, command, request.into_inner()).await
    }

    async fn do_action_begin_transaction(&self, _query: ActionBeginTransactionRequest, request: Request<Action>) -> Result<ActionBeginTransactionResult, Status> {
        let session = self.session(&request)?;
        session.engine.begin().await.map_err(|e| engine_status(&e))?;
        let id: [u8; 16] = rand::random();
        session.state().transaction = Some(id.to_vec());
        Ok(ActionBeginTransactionResult { transaction_id: id.to_vec().into() })
    }

    async fn do_action_end_transaction(&self, query: ActionEndTransactionRequest, request: Request<Action>) -> Result<(), Status> {
        let session = self.session(&request)?;
        session.check_transaction(Some(&query.transaction_id))?;
        session.state().transaction = None;
        match query.action() {
            EndTransaction::Commit => session.engine.commit().await.map_err(|e| engine_status(&e)),
            EndTransaction::Rollback => {
                session.engine.rollback().await;
                Ok(())
            }
            EndTransaction::Unspecified => Err(Status::invalid_argument("EndTransaction needs an action: commit or rollback")),
        }
    }

    async fn get_flight_info_catalogs(&self, query: CommandGetCatalogs, request: Request<FlightDescriptor>) -> Result<Response<FlightInfo>, Status> {
        self.metadata_info(query.clone().into_builder().schema(), query, request)
    }

    async fn do_get_catalogs(&self, query: CommandGetCatalogs, request: Request<Ticket>) -> Result<Response<<Self as FlightService>::DoGetStream>, Status> {
        self.session(&request)?;
        let mut builder = query.into_builder();
        builder.append(blobhouse_engine::CATALOG);
        metadata_stream(builder.build())
    }

    async fn get_flight_info_schemas(&self, query: CommandGetDbSchemas, request: Request<FlightDescriptor>) -> Result<Response<FlightInfo>, Status> {
        self.metadata_info(query.clone().into_builder().schema(), query, request)
    }

    async fn do_get_schemas(&self, query: CommandGetDbSchemas, request: Request<Ticket>) -> Result<Response<<Self as FlightService>::DoGetStream>, Status> {
        let session = self.session(&request)?;
        let mut schemas: Vec<(String, String)> = self.tables(&session).await?.into_iter().map(|[c, s, _, _]| (c, s)).collect();
        schemas.dedup();
        let mut builder = query.into_builder();
        for (catalog, schema) in schemas {
            builder.append(catalog, schema);
        }
        metadata_stream(builder.build())
    }

    async fn get_flight_info_tables(&self, query: CommandGetTables, request: Request<FlightDescriptor>) -> Result<Response<FlightInfo>, Status> {
        self.metadata_info(query.clone().into_builder().schema(), query, request)
    }

    async fn do_get_tables(&self, query: CommandGetTables, request: Request<Ticket>) -> Result<Response<<Self as FlightService>::DoGetStream>, Status> {
        let session = self.session(&request)?;
        let tables = self.tables(&session).await?;
        if !query.include_schema {
            let mut builder = query.into_builder();
            for [catalog, schema, name, kind] in &tables {
                builder.append(catalog, schema, name, kind, &Schema::empty()).map_err(|e| Status::internal(e.to_string()))?;
            }
            return metadata_stream(builder.build());
        }
        // Describe only the tables the filters keep.
        let mut filter = GetTablesBuilder::new(query.catalog.clone(), query.db_schema_filter_pattern.clone(), query.table_name_filter_pattern.clone(), query.table_types.clone(), false);
        for [catalog, schema, name, kind] in &tables {
            filter.append(catalog, schema, name, kind, &Schema::empty()).map_err(|e| Status::internal(e.to_string()))?;
        }
        let kept = filter.build().map_err(|e| Status::internal(e.to_string()))?;
        let mut builder = query.into_builder();
        let text = |i: usize| kept.column(i).as_string::<i32>().clone();
        let (catalogs, schemas, names, kinds) = (text(0), text(1), text(2), text(3));
        for row in 0..kept.num_rows() {
            let (catalog, schema, name, kind) = (catalogs.value(row), schemas.value(row), names.value(row), kinds.value(row));
            let described = session.engine.describe(&format!("SELECT * FROM {}.{}.{}", quote(catalog), quote(schema), quote(name))).await;
            let columns = match described {
                Ok(Described::Rows { schema, .. }) => schema,
                _ => Arc::new(Schema::empty()),
            };
            builder.append(catalog, schema, name, kind, &columns).map_err(|e| Status::internal(e.to_string()))?;
        }
        metadata_stream(builder.build())
    }

    async fn get_flight_info_table_types(&self, query: CommandGetTableTypes, request: Request<FlightDescriptor>) -> Result<Response<FlightInfo>, Status> {
        self.metadata_info(query.clone().into_builder().schema(), query, request)
    }

    async fn do_get_table_types(&self, query: CommandGetTableTypes, request: Request<Ticket>) -> Result<Response<<Self as FlightService>::DoGetStream>, Status> {
        self.session(&request)?;
        let mut builder = query.into_builder();
        for kind in ["BASE TABLE", "VIEW"] {
            builder.append(kind);
        }
        metadata_stream(builder.build())
    }

    async fn get_flight_info_sql_info(&self, query: CommandGetSqlInfo, request: Request<FlightDescriptor>) -> Result<Response<FlightInfo>, Status> {
        self.metadata_info(self.info.schema(), query, request)
    }

    async fn do_get_sql_info(&self, query: CommandGetSqlInfo, request: Request<Ticket>) -> Result<Response<<Self as FlightService>::DoGetStream>, Status> {
        self.session(&request)?;
        metadata_stream(query.into_builder(&self.info).build())
    }

    async fn register_sql_info(&self, _id: i32, _result: &SqlInfo) {}
}

/// The parameter rows a DoPut carries, as literals (row-major).
async fn bound_rows(data: PeekableFlightDataStream) -> Result<Vec<Vec<String>>, Status> {
    let batches: Vec<RecordBatch> = FlightRecordBatchStream::new_from_flight_data(data.map_err(FlightError::from))
        .try_collect()
        .await
        .map_err(|e| Status::invalid_argument(format!("the parameter values: {e}")))?;
    let mut rows = Vec::new();
    for batch in &batches {
        for row in 0..batch.num_rows() {
            let literals = batch
                .columns()
                .iter()
                .enumerate()
                .map(|(i, c)| params::arrow_literal(c.as_ref(), row).map_err(|e| Status::invalid_argument(format!("parameter ${}: {e}", i + 1))))
                .collect::<Result<Vec<_>, _>>()?;
            rows.push(literals);
        }
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::datatypes::TimeUnit;

    #[test]
    fn ingested_columns_get_sql_types_or_a_clear_refusal() {
        let schema = Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("Name", DataType::Utf8, true),
            Field::new("price", DataType::Decimal128(12, 2), true),
            Field::new("at", DataType::Timestamp(TimeUnit::Microsecond, None), true),
        ]);
        assert_eq!(columns(&schema).unwrap(), r#""id" BIGINT NOT NULL, "Name" VARCHAR, "price" DECIMAL(12,2), "at" TIMESTAMP(6)"#);
        let nested = Schema::new(vec![Field::new("tags", DataType::List(Arc::new(Field::new("item", DataType::Utf8, true))), true)]);
        assert!(columns(&nested).unwrap_err().contains("'tags'"));
        assert_eq!(quote("a\"b"), "\"a\"\"b\"");
    }

    #[test]
    fn handles_are_checked_before_use() {
        assert_eq!(decode_handle(&7u64.to_be_bytes(), "ticket").unwrap(), 7);
        assert!(decode_handle(b"abc", "ticket").unwrap_err().message().contains("3 bytes"));
    }
}
