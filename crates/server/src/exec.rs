//! Running one statement for any endpoint: the queue, the execution
//! runtime, cancellation by drop, and the statement's metrics and log line.
//!
//! The PostgreSQL and the Flight SQL endpoints both hand their statements
//! here, so a statement counts against the same limit, shows up in the same
//! metrics and logs the same way whichever protocol sent it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use blobhouse_engine::{Engine, EngineError, QueryResult};

use crate::metrics::{Metrics, Outcome};

/// How many statements run at once, and which count as slow.
#[derive(Clone)]
pub(crate) struct Limits {
    pub(crate) queries: Arc<tokio::sync::Semaphore>,
    pub(crate) slow: Duration,
}

/// Why a statement produced no result.
#[derive(Debug)]
pub(crate) enum Failure {
    /// The engine refused or failed it (the user's to fix, mostly).
    Engine(EngineError),
    /// The server is stopping: the queue is closed.
    ShuttingDown,
    /// The statement's task ended without an answer (a panic inside the
    /// engine); the server and the other sessions go on.
    Crashed(String),
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Engine(e) => write!(f, "{e}"),
            Failure::ShuttingDown => write!(f, "the server is shutting down"),
            Failure::Crashed(why) => write!(f, "the statement stopped inside the engine: {why}"),
        }
    }
}

/// Runs statements on the execution runtime, one queue for all endpoints.
pub(crate) struct Runner {
    pub(crate) metrics: Arc<Metrics>,
    limits: Limits,
    /// Where statements run: not the runtime that serves the protocols, so
    /// a batch that takes a while to compute never delays a cancel request,
    /// a login or another client's messages.
    exec: tokio::runtime::Handle,
}

impl Runner {
    pub(crate) fn new(metrics: Arc<Metrics>, limits: Limits, exec: tokio::runtime::Handle) -> Runner {
        Runner { metrics, limits, exec }
    }

    /// Runs `sql` in the session `engine` once a slot in the queue is free.
    /// Dropping the returned future (a cancel request, a closed connection,
    /// a cancelled RPC) aborts the statement's task, and with it the
    /// DataFusion tasks and downloads under it, at their next yield; it is
    /// then logged and counted as cancelled.
    pub(crate) async fn run(&self, engine: &Arc<Engine>, user: &str, sql: String) -> Result<QueryResult, Failure> {
        let mut record = Record::new(&self.metrics, &self.limits, user, &sql);
        let permit = {
            let _waiting = Gauge::up(|d| self.metrics.queued(d));
            self.limits.queries.clone().acquire_owned().await.map_err(|_| Failure::ShuttingDown)?
        };
        let _running = Gauge::up(|d| self.metrics.running(d));
        let engine = engine.clone();
        let mut task = AbortOnDrop(self.exec.spawn(async move {
            let result = engine.execute(&sql).await;
            drop(permit);
            result
        }));
        let result = match (&mut task.0).await {
            Ok(result) => result.map_err(Failure::Engine),
            Err(e) => Err(Failure::Crashed(e.to_string())),
        };
        record.finish(&result);
        result
    }
}

/// The rows a DML statement, COPY or CREATE TABLE AS reports having
/// changed (its one `count` cell), 0 for anything else.
pub(crate) fn changed_rows(result: &QueryResult) -> usize {
    match result.batches.first() {
        Some(b) if result.schema.fields().len() == 1 && result.schema.field(0).name() == "count" && b.num_rows() == 1 => {
            b.column(0).as_any().downcast_ref::<datafusion::arrow::array::UInt64Array>().map_or(0, |a| a.value(0) as usize)
        }
        _ => 0,
    }
}

/// A gauge raised for as long as the value lives.
struct Gauge<F: Fn(i64)>(F);

impl<F: Fn(i64)> Gauge<F> {
    fn up(f: F) -> Gauge<F> {
        f(1);
        Gauge(f)
    }
}

impl<F: Fn(i64)> Drop for Gauge<F> {
    fn drop(&mut self) {
        (self.0)(-1)
    }
}

/// One statement's metrics and log line, written when it ends — also when
/// its future is dropped (a cancel, a disconnect), which counts as cancelled.
struct Record {
    metrics: Arc<Metrics>,
    id: u64,
    user: String,
    started: Instant,
    slow: Duration,
    sql: String,
    outcome: Outcome,
    rows: usize,
    error: Option<String>,
}

impl Record {
    fn new(metrics: &Arc<Metrics>, limits: &Limits, user: &str, sql: &str) -> Record {
        let id = metrics.query_id();
        tracing::debug!(query_id = id, user = %user, "statement started");
        Record {
            metrics: metrics.clone(),
            id,
            user: user.to_string(),
            started: Instant::now(),
            slow: limits.slow,
            sql: abbreviate(sql),
            outcome: Outcome::Cancelled,
            rows: 0,
            error: None,
        }
    }

    fn finish(&mut self, result: &Result<QueryResult, Failure>) {
        match result {
            Ok(r) => {
                self.outcome = Outcome::Ok;
                self.rows = r.rows();
            }
            Err(e) => {
                self.outcome = Outcome::Error;
                self.error = Some(e.to_string());
            }
        }
    }
}

impl Drop for Record {
    fn drop(&mut self) {
        let elapsed = self.started.elapsed();
        self.metrics.finished(self.outcome, elapsed);
        let ms = elapsed.as_secs_f64() * 1e3;
        let state = format!("{:?}", self.outcome).to_lowercase();
        match &self.error {
            Some(error) => tracing::info!(query_id = self.id, user = %self.user, state, elapsed_ms = ms, error = %error, "statement"),
            None => tracing::info!(query_id = self.id, user = %self.user, state, elapsed_ms = ms, rows = self.rows, "statement"),
        }
        if elapsed >= self.slow {
            tracing::warn!(query_id = self.id, user = %self.user, state, elapsed_ms = ms, sql = %self.sql, "slow statement");
        }
    }
}

/// The start of a statement, on one line, for the slow-statement log.
fn abbreviate(sql: &str) -> String {
    let one_line: String = sql.split_whitespace().collect::<Vec<_>>().join(" ");
    match one_line.char_indices().nth(200) {
        Some((at, _)) => format!("{}…", &one_line[..at]),
        None => one_line,
    }
}

/// Aborts the task when its future is dropped.
struct AbortOnDrop<T>(tokio::task::JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}
