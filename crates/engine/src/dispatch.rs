//! One dispatch: every parsed statement goes through [`execute`], which
//! picks its family's entry point and the transaction it runs in.
//!
//! - transaction control → [`crate::transaction`];
//! - settings and SHOW CACHE → [`crate::settings`] (no transaction: they
//!   read and change the session and the engine, not the database);
//! - everything else runs in a [`Scope`]: inside BEGIN … COMMIT the
//!   session's transaction, otherwise one of its own, committed at its end
//!   (a query's simply ends) — queries and EXPLAIN, INSERT and DDL
//!   ([`crate::query`], [`crate::ddl`]), DELETE and UPDATE
//!   ([`crate::dml`]), COPY ([`crate::copy`]), history ([`crate::history`])
//!   and OPTIMIZE ([`crate::optimize`]).

use std::sync::{Arc, Mutex};
use std::time::Instant;

use datafusion::execution::context::SessionContext;
use datafusion::sql::parser::Statement as DFStatement;

use blobhouse_storage::Transaction;
use blobhouse_storage::format::CatalogVersion;

use crate::engine::Engine;
use crate::env::Env;
use crate::history::History;
use crate::parser::{Parsed, Statement};
use crate::provider::Scope;
use crate::query::{self, Planned};
use crate::result::{Answer, QueryResult, count_result, empty_result};
use crate::settings::Values;
use crate::transaction::{TxnSlot, TxnState};
use crate::{EngineError, TxnRule};

/// The session a statement runs for, as the dispatcher needs it.
pub(crate) struct Conn<'a> {
    pub engine: &'a Engine,
    /// The session's DataFusion context (its `datafusion.*` settings).
    pub ctx: &'a SessionContext,
    pub txn: &'a TxnState,
    pub values: &'a Mutex<Values>,
    /// The tables the session registered (seen beside the stored ones).
    pub registered: &'a crate::registered::Registered,
}

/// Runs a parsed statement; `sql` names it in messages. A query's rows
/// are streamed when `stream` asks for it.
pub(crate) async fn execute(conn: &Conn<'_>, sql: &str, parsed: Parsed, started: Instant, stream: bool) -> Result<Answer, EngineError> {
    match parsed.statement {
        Statement::Transaction(control) => conn.txn.run(conn.engine.database(), control, started).await.map(Answer::Done),
        Statement::Setting(statement) => {
            refuse_if_aborted(conn.txn)?;
            crate::settings::run(conn.engine, conn.values, statement, started).map(Answer::Done)
        }
        Statement::ShowCache => {
            refuse_if_aborted(conn.txn)?;
            Ok(Answer::Done(crate::result::show_cache(conn.engine.tiers().map(|t| t.describe()).unwrap_or_default(), started)))
        }
        _ => scoped(conn, sql, parsed, started, stream).await,
    }
}

fn refuse_if_aborted(txn: &TxnState) -> Result<(), EngineError> {
    match txn.aborted_by() {
        Some(cause) => Err(EngineError::TransactionAborted { cause }),
        None => Ok(()),
    }
}

/// Runs a statement in the open transaction, or in one of its own.
async fn scoped(conn: &Conn<'_>, sql: &str, parsed: Parsed, started: Instant, stream: bool) -> Result<Answer, EngineError> {
    let engine = conn.engine;
    if let Some(slot) = conn.txn.join(&abbreviate(sql))? {
        let result = async {
            let (view, snapshot) = {
                let txn = slot.lock().await;
                let txn = txn.as_ref().ok_or_else(|| EngineError::transaction(TxnRule::Ended, "the transaction has ended"))?;
                (txn.view(), txn.snapshot().clone())
            };
            let read = view.version;
            let scope = Scope { view, snapshot, txn: slot.clone(), past: parsed.past.clone(), files: parsed.files.clone() };
            let result = run_streaming(conn, parsed, scope, started, stream).await;
            engine.explain_expiry(result, read).await
        }
        .await;
        conn.txn.finish(slot, result.as_ref().err());
        return result;
    }
    // CREATE SNAPSHOT of now reads nothing: it names the version its
    // commit builds on, and the commit decides on the newest version (a
    // handle that saw it a moment ago lists nothing).
    if let Statement::History(History::CreateSnapshot { name, at: None }) = &parsed.statement {
        let change = blobhouse_storage::Change::CreateSnapshot { name: name.clone(), version: None, created_at_ms: blobhouse_storage::format::now_ms() };
        engine.database().commit(&[change]).await?;
        return Ok(Answer::Done(empty_result(started)));
    }
    // A statement of its own: one transaction, committed at its end.
    let query = parsed.is_query();
    let snapshot = if query {
        match plan_while_refreshing(conn, &parsed, started, stream).await? {
            Refreshed::Ran(result) => return result,
            Refreshed::Newer(newest) => newest,
        }
    } else {
        engine.database().refresh().await?
    };
    let slot: TxnSlot = Arc::new(tokio::sync::Mutex::new(Some(Transaction::begin(engine.database(), snapshot.clone()))));
    let read = snapshot.version;
    let scope = Scope { view: snapshot.clone(), snapshot, txn: slot.clone(), past: parsed.past.clone(), files: parsed.files.clone() };
    if stream && query {
        // A query changes nothing: its transaction ends without a commit.
        let result = run_streaming(conn, parsed, scope, started, true).await;
        if let Some(txn) = slot.lock().await.take() {
            txn.rollback().await;
        }
        return engine.explain_expiry(result, read).await;
    }
    let result = in_scope(conn, parsed.statement, scope, started).await;
    let result = engine.explain_expiry(result, read).await;
    let txn = slot.lock().await.take();
    match (result, txn) {
        (Ok(mut r), Some(txn)) => {
            if let blobhouse_storage::CommitOutcome::Committed(v) = txn.commit().await? {
                r.notices.extend(crate::interop::iceberg_notice(engine.database(), v.version));
            }
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

/// How [`plan_while_refreshing`] ended.
enum Refreshed {
    /// The plan was of the newest version and ran (or, streaming, started).
    Ran(Result<Answer, EngineError>),
    /// The store had a newer version (or the statement was not a plain
    /// query): plan on this one.
    Newer(Arc<CatalogVersion>),
}

/// Runs a query of its own (autocommit) on the newest version, hiding
/// the store's round trip that finds it: the query is planned on the
/// newest version this handle knows while the store is asked for the
/// newest (a LIST; ~1 ms over a LAN, where planning an SSB star join
/// takes 4–6 ms). When no commit came in between, that plan is the plan
/// of the newest version and runs; otherwise the newest version is
/// returned, for the query to be planned again on it. Either way the
/// query reads a version at least as new as every commit that finished
/// before it started, as every statement does.
async fn plan_while_refreshing(conn: &Conn<'_>, parsed: &Parsed, started: Instant, stream: bool) -> Result<Refreshed, EngineError> {
    let engine = conn.engine;
    let Statement::Sql(statement) = &parsed.statement else { return Ok(Refreshed::Newer(engine.database().refresh().await?)) };
    let known = engine.database().current();
    let slot: TxnSlot = Arc::new(tokio::sync::Mutex::new(Some(Transaction::begin(engine.database(), known.clone()))));
    let scope = Scope { view: known.clone(), snapshot: known.clone(), txn: slot.clone(), past: parsed.past.clone(), files: parsed.files.clone() };
    let (newest, planned) = tokio::join!(engine.database().refresh(), plan(conn, (**statement).clone(), &scope));
    let newest = newest?;
    if newest.version != known.version {
        return Ok(Refreshed::Newer(newest));
    }
    let result = match planned {
        Ok(Some(planned)) if stream => query::stream_planned(planned).map(Answer::Rows),
        Ok(Some(planned)) => query::run_planned(planned, started).await.map(Answer::Done).map_err(EngineError::Query),
        // Not a plain query after all (SELECT … INTO creates a table).
        Ok(None) => return Ok(Refreshed::Newer(newest)),
        Err(e) => Err(e),
    };
    let result = engine.explain_expiry(result, known.version).await;
    // A query changes nothing: its transaction ends without a commit.
    if let Some(txn) = slot.lock().await.take() {
        txn.rollback().await;
    }
    Ok(Refreshed::Ran(result))
}

/// Plans a plain query in `scope`.
async fn plan(conn: &Conn<'_>, statement: DFStatement, scope: &Scope) -> Result<Option<Planned>, EngineError> {
    let ctx = conn.engine.statement_context(&conn.ctx.state(), scope, conn.registered).await?;
    let in_transaction = conn.txn.in_transaction();
    let keep = conn.engine.statement_extension().is_some();
    Ok(query::plan_query(&ctx, statement, keep).await?.map(|p| p.with_cluster(conn.engine, !in_transaction)))
}

/// [`in_scope`], but a query's rows are streamed when `stream` asks for it.
async fn run_streaming(conn: &Conn<'_>, parsed: Parsed, scope: Scope, started: Instant, stream: bool) -> Result<Answer, EngineError> {
    if stream
        && parsed.is_query()
        && let Statement::Sql(statement) = &parsed.statement
        && let Some(planned) = plan(conn, (**statement).clone(), &scope).await?
    {
        return query::stream_planned(planned).map(Answer::Rows);
    }
    in_scope(conn, parsed.statement, scope, started).await.map(Answer::Done)
}

/// Runs a statement in `scope`: the family's entry point.
async fn in_scope(conn: &Conn<'_>, statement: Statement, scope: Scope, started: Instant) -> Result<QueryResult, EngineError> {
    let ctx = conn.engine.statement_context(&conn.ctx.state(), &scope, conn.registered).await?;
    let external = scope.view.external.keys().cloned().collect::<Vec<_>>();
    let env = Env { engine: conn.engine, ctx, scope, started, in_transaction: conn.txn.in_transaction() };
    family(conn, statement, env).await.map_err(|e| read_only_external(e, &external))
}

/// A change to an external table was refused as "no such table" (its
/// name is not among the stored tables): say what it is instead.
fn read_only_external(e: EngineError, external: &[String]) -> EngineError {
    match &e {
        EngineError::Storage(blobhouse_storage::StorageError::TableNotFound(name)) if external.contains(name) => EngineError::Unsupported(crate::files::read_only(name)),
        _ => e,
    }
}

/// The family's entry point for `statement`.
async fn family(conn: &Conn<'_>, statement: Statement, env: Env<'_>) -> Result<QueryResult, EngineError> {
    let started = env.started;
    let count = |rows: u64| count_result(rows, started);
    match statement {
        Statement::Sql(statement) => query::run(&env, *statement, conn.ctx).await,
        Statement::ShowTables => match crate::parser::parse(query::SHOW_TABLES, "generic", 50)?.statement {
            Statement::Sql(statement) => {
                let names = query::run(&env, *statement, conn.ctx).await?;
                crate::interop::show_tables(&env, names).await
            }
            other => unreachable!("SHOW TABLES is a query, not {other:?}"),
        },
        Statement::Dml(statement) => match crate::dml::run(&env, &statement).await {
            Ok(rows) => Ok(count(rows)),
            Err(e) => Err(query::name_failed_workers(conn.engine, e).await),
        },
        Statement::CopyFrom(copy) => crate::copy::copy_from(&env, &copy).await.map(count),
        Statement::CopyTo(copy) => match crate::copy::copy_to(&env, &copy).await {
            Ok(rows) => Ok(count(rows)),
            Err(e) => Err(query::name_failed_workers(conn.engine, e).await),
        },
        Statement::History(h) => crate::history::run(&env, h).await,
        Statement::Optimize { table } => crate::optimize::run(&env, &table).await.map(count),
        Statement::Transaction(_) | Statement::Setting(_) | Statement::ShowCache => unreachable!("dispatched before a scope is taken"),
    }
}

/// The start of a statement, for messages.
fn abbreviate(sql: &str) -> String {
    let one_line = sql.split_whitespace().collect::<Vec<_>>().join(" ");
    match one_line.char_indices().nth(60) {
        Some((i, _)) => format!("{}…", &one_line[..i]),
        None => one_line,
    }
}
