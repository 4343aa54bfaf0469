//! Running one statement for any endpoint: the queue, the execution
//! runtime, cancellation by drop, and the statement's metrics and log line.
//!
//! The PostgreSQL and the Flight SQL endpoints both hand their statements
//! here, so a statement counts against the same limit, shows up in the same
//! metrics and logs the same way whichever protocol sent it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use blobhouse_engine::{EngineError, QueryResult, Session};

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
    /// It ran past its session's `statement_timeout` and was stopped.
    TimedOut(Duration),
    /// The client asked to cancel it (a cancel request) while its rows
    /// were being sent.
    Cancelled,
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Engine(e) => write!(f, "{e}"),
            Failure::ShuttingDown => write!(f, "the server is shutting down"),
            Failure::Crashed(why) => write!(f, "the statement stopped inside the engine: {why}"),
            Failure::Cancelled => write!(f, "canceling statement due to user request"),
            Failure::TimedOut(limit) => write!(f, "canceling statement due to statement timeout ({} ms; SET statement_timeout changes it)", limit.as_millis()),
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
    /// The files outside the database clients may reach.
    files: blobhouse_engine::FileAccess,
}

impl Runner {
    pub(crate) fn new(metrics: Arc<Metrics>, limits: Limits, exec: tokio::runtime::Handle, files: blobhouse_engine::FileAccess) -> Runner {
        Runner { metrics, limits, exec, files }
    }

    /// A client's session on `engine`: it reaches the files the server
    /// allows, and its own spool directory (COPY … FROM STDIN, ingest),
    /// which is removed with the returned handle.
    pub(crate) fn connect(&self, engine: &blobhouse_engine::Engine) -> std::io::Result<(blobhouse_engine::Session, tempfile::TempDir)> {
        let spool = tempfile::Builder::new().prefix("blobhouse-spool-").tempdir()?;
        let session = engine.connect();
        session.set_file_access(self.files.clone().and(&spool.path().to_string_lossy()));
        Ok((session, spool))
    }

    /// Runs `sql` in the session `engine` once a slot in the queue is free.
    /// Dropping the returned future (a cancel request, a closed connection,
    /// a cancelled RPC) aborts the statement's task, and with it the
    /// DataFusion tasks and downloads under it, at their next yield; it is
    /// then logged and counted as cancelled.
    pub(crate) async fn run(&self, engine: &Arc<Session>, user: &str, sql: String) -> Result<QueryResult, Failure> {
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

/// What a statement run with [`Runner::run_streaming`] answers.
pub(crate) enum Output {
    /// A finished statement.
    Done(QueryResult),
    /// A query whose rows are still being computed.
    Rows(Rows),
}

/// A running query's rows, computed on the execution runtime and handed
/// over a short queue: the query runs ahead of its reader by at most
/// [`ROWS_AHEAD`] batches, so a slow client bounds the server's memory
/// instead of the result's size. Dropping it stops the query (and its
/// downloads) at its next yield.
pub(crate) struct Rows {
    pub(crate) schema: datafusion::arrow::datatypes::SchemaRef,
    batches: tokio::sync::mpsc::Receiver<Result<datafusion::arrow::record_batch::RecordBatch, Failure>>,
    _task: Option<AbortOnDrop<()>>,
    /// When the statement must have ended (its `statement_timeout`).
    deadline: Option<(std::pin::Pin<Box<tokio::time::Sleep>>, Duration)>,
    /// Fires when the client cancels the statement.
    cancel: Option<tokio::sync::oneshot::Receiver<()>>,
}

impl Rows {
    /// Rows already computed, as a stream.
    pub(crate) fn ready(schema: datafusion::arrow::datatypes::SchemaRef, batches: Vec<datafusion::arrow::record_batch::RecordBatch>) -> Rows {
        let (tx, rx) = tokio::sync::mpsc::channel(batches.len().max(1));
        for batch in batches {
            tx.try_send(Ok(batch)).expect("the queue holds every batch");
        }
        Rows { schema, batches: rx, _task: None, deadline: None, cancel: None }
    }

    /// These rows, stopped with [`Failure::Cancelled`] when `cancel` fires.
    pub(crate) fn cancelled_by(mut self, cancel: tokio::sync::oneshot::Receiver<()>) -> Rows {
        self.cancel = Some(cancel);
        self
    }

    /// Stops the query (dropping its task stops it); the stream ends
    /// after the error it returns now.
    fn stop(&mut self) {
        self.deadline = None;
        self.cancel = None;
        self._task = None;
        self.batches = tokio::sync::mpsc::channel(1).1;
    }

    /// These rows, stopped with [`Failure::TimedOut`] once `limit` has
    /// passed since `started`.
    pub(crate) fn with_deadline(mut self, started: tokio::time::Instant, limit: Duration) -> Rows {
        self.deadline = Some((Box::pin(tokio::time::sleep_until(started + limit)), limit));
        self
    }
}

/// Batches a streaming query computes ahead of its reader.
pub(crate) const ROWS_AHEAD: usize = 2;

impl futures::Stream for Rows {
    type Item = Result<datafusion::arrow::record_batch::RecordBatch, Failure>;

    fn poll_next(mut self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<Option<Self::Item>> {
        use std::future::Future;
        if let Some(cancel) = self.cancel.as_mut() {
            match std::pin::Pin::new(cancel).poll(cx) {
                std::task::Poll::Ready(Ok(())) => {
                    self.stop();
                    return std::task::Poll::Ready(Some(Err(Failure::Cancelled)));
                }
                // Nobody can cancel any more.
                std::task::Poll::Ready(Err(_)) => self.cancel = None,
                std::task::Poll::Pending => {}
            }
        }
        if let Some((sleep, limit)) = self.deadline.as_mut()
            && sleep.as_mut().poll(cx).is_ready()
        {
            let limit = *limit;
            self.stop();
            return std::task::Poll::Ready(Some(Err(Failure::TimedOut(limit))));
        }
        self.batches.poll_recv(cx)
    }
}

impl Runner {
    /// Runs `sql` as [`Runner::run`] does, but a query's rows are handed
    /// over as they are computed. The statement keeps its place in the
    /// queue, and counts as running, until its last row is read or the
    /// rows are dropped.
    pub(crate) async fn run_streaming(&self, engine: &Arc<Session>, user: &str, sql: String) -> Result<Output, Failure> {
        let mut record = Record::new(&self.metrics, &self.limits, user, &sql);
        let permit = {
            let _waiting = Gauge::up(|d| self.metrics.queued(d));
            self.limits.queries.clone().acquire_owned().await.map_err(|_| Failure::ShuttingDown)?
        };
        let running = Gauge::up({
            let metrics = self.metrics.clone();
            move |d| metrics.running(d)
        });
        let engine = engine.clone();
        // The statement's first answer (a finished result, or the schema
        // of rows to come), then its batches.
        let (first_tx, first_rx) = tokio::sync::oneshot::channel::<Result<Result<QueryResult, datafusion::arrow::datatypes::SchemaRef>, Failure>>();
        let (tx, rx) = tokio::sync::mpsc::channel(ROWS_AHEAD);
        let task = AbortOnDrop(self.exec.spawn(async move {
            let answer = match engine.execute_streaming(&sql).await {
                Ok(blobhouse_engine::Answer::Rows(rows)) => rows,
                Ok(blobhouse_engine::Answer::Done(result)) => {
                    let done = Ok(result);
                    record.finish(&done);
                    drop((permit, running));
                    let _ = first_tx.send(done.map(Ok));
                    return;
                }
                Err(e) => {
                    let failed = Err(Failure::Engine(e));
                    record.finish(&failed);
                    drop((permit, running));
                    let _ = first_tx.send(failed.map(Ok));
                    return;
                }
            };
            let _ = first_tx.send(Ok(Err(answer.schema.clone())));
            use futures::StreamExt;
            let mut batches = answer.batches;
            let mut rows = 0;
            let mut failed = None;
            while let Some(batch) = batches.next().await {
                let batch = batch.map_err(|e| Failure::Engine(blobhouse_engine::EngineError::Query(e)));
                match &batch {
                    Ok(b) => rows += b.num_rows(),
                    Err(e) => failed = Some(e.to_string()),
                }
                if tx.send(batch).await.is_err() || failed.is_some() {
                    // The reader is gone (a cancel, a hang-up, a closed
                    // cursor: counted as cancelled) or the query failed.
                    break;
                }
            }
            record.streamed(rows, failed, tx.is_closed());
            drop((permit, running, record));
        }));
        match first_rx.await {
            Ok(Ok(Ok(result))) => Ok(Output::Done(result)),
            Ok(Ok(Err(schema))) => Ok(Output::Rows(Rows { schema, batches: rx, _task: Some(task), deadline: None, cancel: None })),
            Ok(Err(failure)) => Err(failure),
            Err(_) => Err(Failure::Crashed("the statement's task ended without an answer".into())),
        }
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

    /// A streamed query's end: `rows` sent, its error if it failed, and
    /// whether its reader left first (a cancel, a closed cursor).
    fn streamed(&mut self, rows: usize, failed: Option<String>, reader_gone: bool) {
        self.rows = rows;
        match failed {
            Some(error) => {
                self.outcome = Outcome::Error;
                self.error = Some(error);
            }
            None if !reader_gone => self.outcome = Outcome::Ok,
            None => {}
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

/// `batch` under `schema` (the one its client was told): relabelled when
/// only names, nullability or metadata differ, each column of another type
/// cast to the announced one. A value the announced type cannot hold is an
/// error — never a NULL or a truncated number in its place.
pub(crate) fn conform(batch: datafusion::arrow::record_batch::RecordBatch, schema: &datafusion::arrow::datatypes::SchemaRef) -> Result<datafusion::arrow::record_batch::RecordBatch, datafusion::arrow::error::ArrowError> {
    use datafusion::arrow::compute::{CastOptions, cast_with_options};
    use datafusion::arrow::error::ArrowError;
    if batch.schema() == *schema {
        return Ok(batch);
    }
    if batch.num_columns() != schema.fields().len() {
        return Err(ArrowError::SchemaError(format!("{} columns where {} were described", batch.num_columns(), schema.fields().len())));
    }
    let strict = CastOptions { safe: false, ..CastOptions::default() };
    let columns = batch
        .columns()
        .iter()
        .zip(schema.fields())
        .map(|(c, f)| if c.data_type() == f.data_type() { Ok(c.clone()) } else { cast_with_options(c, f.data_type(), &strict) })
        .collect::<Result<Vec<_>, _>>()?;
    let options = datafusion::arrow::record_batch::RecordBatchOptions::new().with_row_count(Some(batch.num_rows()));
    // Described columns may say NOT NULL where the run's are nullable (or
    // the reverse): the description's nullability is advisory, the data's
    // is what it is.
    let relaxed = std::sync::Arc::new(datafusion::arrow::datatypes::Schema::new_with_metadata(
        schema.fields().iter().map(|f| f.as_ref().clone().with_nullable(true)).collect::<Vec<_>>(),
        schema.metadata().clone(),
    ));
    datafusion::arrow::record_batch::RecordBatch::try_new_with_options(relaxed, columns, &options)
}
