//! [`Connection`]: one session on an open database, for Python.
//!
//! Connections to the same URL with the same options share one engine —
//! its caches, memory budget and download manager — as a server's
//! connections do; each has its own session (settings, transaction,
//! registered tables). Databases at other URLs open engines of their own,
//! so one process may hold several. The engine closes with its last
//! connection.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

use pyo3::prelude::*;
use pyo3_arrow::PyRecordBatchReader;

use blobhouse_engine::result::CommandKind;
use blobhouse_engine::{Answer as EngineAnswer, Engine, EngineError, Session};

use crate::answer::{Answer, Rows};
use crate::errors::{InterfaceError, engine_error};
use crate::options::ConnectOptions;
use crate::{runtime, tables};

/// Open engines by URL and options: a connection joins a live one.
static ENGINES: Mutex<BTreeMap<String, Weak<Engine>>> = Mutex::new(BTreeMap::new());

/// Names of the hidden tables that `load()` streams from.
static LOADS: AtomicU64 = AtomicU64::new(0);

/// One session on an open database.
#[pyclass(module = "blobhouse._blobhouse", frozen)]
pub struct Connection {
    url: String,
    /// `None` once closed.
    session: Mutex<Option<Arc<Session>>>,
    /// Keeps the engine open while this connection lives.
    _engine: Arc<Engine>,
}

impl Connection {
    fn session(&self) -> PyResult<Arc<Session>> {
        self.session
            .lock()
            .map_err(|_| InterfaceError::new_err("a thread using this connection panicked"))?
            .clone()
            .ok_or_else(|| InterfaceError::new_err(format!("the connection to {} is closed", self.url)))
    }
}

#[pymethods]
impl Connection {
    /// Opens `url` (creating the database unless `create` is false) with
    /// the settings of `blobhouse.connect()`, all given as text.
    #[staticmethod]
    #[pyo3(signature = (url, settings, store_config, workers))]
    fn open(py: Python<'_>, url: String, settings: BTreeMap<String, String>, store_config: BTreeMap<String, String>, workers: Vec<String>) -> PyResult<Connection> {
        let key = format!("{url}\u{0}{settings:?}\u{0}{store_config:?}\u{0}{workers:?}");
        let options = ConnectOptions::read(&settings, store_config, workers).map_err(InterfaceError::new_err)?;
        let engines = || ENGINES.lock().map_err(|_| InterfaceError::new_err("a thread opening a database panicked"));
        let open = engines()?.get(&key).and_then(Weak::upgrade);
        let engine = match open {
            Some(engine) => engine,
            None => {
                // Opened without the lock held: the open waits on the store
                // with the GIL released, and another thread may connect
                // meanwhile (the first engine registered wins).
                let opened = Arc::new(open_engine(py, &url, options)?);
                let mut engines = engines()?;
                engines.retain(|_, e| e.strong_count() > 0);
                match engines.get(&key).and_then(Weak::upgrade) {
                    Some(engine) => engine,
                    None => {
                        engines.insert(key, Arc::downgrade(&opened));
                        opened
                    }
                }
            }
        };
        let session = Arc::new(engine.connect());
        Ok(Connection { url, session: Mutex::new(Some(session)), _engine: engine })
    }

    /// The database's URL.
    #[getter]
    fn url(&self) -> &str {
        &self.url
    }

    /// Whether the connection is closed.
    #[getter]
    fn closed(&self) -> bool {
        self.session.lock().map(|s| s.is_none()).unwrap_or(true)
    }

    /// Whether a transaction is open (BEGIN, or a statement with
    /// autocommit off).
    #[getter]
    fn in_transaction(&self) -> PyResult<bool> {
        Ok(self.session()?.in_transaction())
    }

    /// Runs one statement: a query's rows stream as they are read.
    fn execute(&self, py: Python<'_>, sql: &str) -> PyResult<Answer> {
        let session = self.session()?;
        let owned = sql.to_string();
        let answer = runtime::wait(py, async move { session.execute_streaming(&owned).await })?.map_err(|e| engine_error(py, &e))?;
        Ok(match answer {
            EngineAnswer::Rows(rows) => Answer::new(rows.schema, Rows::Streaming(rows.batches), true, -1, Vec::new()),
            EngineAnswer::Done(result) => {
                let notices = result.notices.iter().map(|n| (n.severity.to_string(), n.sqlstate.to_string(), n.message.clone())).collect();
                let (returns_rows, rowcount) = match CommandKind::of(sql) {
                    CommandKind::Rows => (true, result.rows() as i64),
                    CommandKind::Counted(_) => (false, result.changed_rows() as i64),
                    _ => (false, -1),
                };
                let schema = result.schema.clone();
                Answer::new(schema, Rows::Buffered(result.batches.into()), returns_rows, rowcount, notices)
            }
        })
    }

    /// Begins a transaction.
    fn begin(&self, py: Python<'_>) -> PyResult<()> {
        let session = self.session()?;
        runtime::wait(py, async move { session.begin().await })?.map_err(|e| engine_error(py, &e))
    }

    /// Commits the open transaction (nothing without one).
    fn commit(&self, py: Python<'_>) -> PyResult<()> {
        let session = self.session()?;
        runtime::wait(py, async move { session.commit().await })?.map_err(|e| engine_error(py, &e))
    }

    /// Rolls the open transaction back (nothing without one).
    fn rollback(&self, py: Python<'_>) -> PyResult<()> {
        let session = self.session()?;
        runtime::wait(py, async move { session.rollback().await })
    }

    /// Makes `data` (anything with `__arrow_c_stream__`) readable as
    /// `name` in this connection's statements.
    fn register(&self, py: Python<'_>, name: &str, data: PyRecordBatchReader) -> PyResult<()> {
        let session = self.session()?;
        let partitions = session.engine().options().target_partitions;
        let table = tables::memory_table(data.into_reader()?, partitions).map_err(|e| crate::errors::with_sqlstate(py, "22000", format!("cannot read the data registered as {name}: {e}")))?;
        let owned = name.to_string();
        runtime::wait(py, async move { session.register_table(&owned, table).await })?.map_err(|e| engine_error(py, &e))
    }

    /// Forgets a registered name; whether there was one.
    fn unregister(&self, name: &str) -> PyResult<bool> {
        Ok(self.session()?.deregister_table(name))
    }

    /// The names registered on this connection.
    fn registered(&self) -> PyResult<Vec<String>> {
        Ok(self.session()?.registered_tables())
    }

    /// Appends `data` to `table` (created from the data's schema when it
    /// does not exist), streaming it once; the rows loaded.
    fn load(&self, py: Python<'_>, table: &str, data: PyRecordBatchReader) -> PyResult<u64> {
        let session = self.session()?;
        let source = tables::once_table(data.into_reader()?).map_err(|e| crate::errors::with_sqlstate(py, "22000", format!("cannot read the data to load into {table}: {e}")))?;
        let hidden = format!("__blobhouse_load_{}", LOADS.fetch_add(1, Ordering::Relaxed));
        let quoted = format!("\"{}\"", table.replace('"', "\"\""));
        let (table_name, hidden_name, loader) = (table.to_string(), hidden.clone(), session.clone());
        let loaded = runtime::wait(py, async move {
            let (table, hidden, session) = (table_name, hidden_name, loader);
            let exists = session.engine().database().refresh().await?.tables.contains_key(&table);
            session.register_table(&hidden, source).await?;
            let sql = if exists { format!("INSERT INTO {quoted} SELECT * FROM {hidden}") } else { format!("CREATE TABLE {quoted} AS SELECT * FROM {hidden}") };
            Ok::<_, EngineError>(session.execute(&sql).await?.changed_rows() as u64)
        });
        // Also after an error or an interrupt (the task was aborted).
        session.deregister_table(&hidden);
        loaded?.map_err(|e| engine_error(py, &e))
    }

    /// Closes the connection: rolls back an open transaction and forgets
    /// registered tables. Closing twice does nothing.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        let session = self.session.lock().map_err(|_| InterfaceError::new_err("a thread using this connection panicked"))?.take();
        if let Some(session) = session {
            runtime::wait(py, async move { session.rollback().await })?;
        }
        Ok(())
    }
}

/// Opens the engine, and makes it a coordinator of `options.workers` (the
/// cluster's settings are checked first: a missing token fails before the
/// database is opened).
fn open_engine(py: Python<'_>, url: &str, options: ConnectOptions) -> PyResult<Engine> {
    let ConnectOptions { store, engine, workers, cluster_token_env, worker_ca } = options;
    let cluster = if workers.is_empty() {
        None
    } else {
        let token = blobhouse_cluster::ClusterToken::from_env(&cluster_token_env).map_err(|e| InterfaceError::new_err(format!("workers: {e}")))?;
        Some(blobhouse_cluster::Cluster::new(&workers, token, worker_ca.as_deref()).map_err(|e| InterfaceError::new_err(format!("workers: {e}")))?)
    };
    let owned = url.to_string();
    let engine = runtime::wait(py, async move { Engine::open(&owned, &store, engine).await })?
        .map_err(|e| crate::errors::with_sqlstate(py, e.sqlstate(), format!("cannot open database {url}: {e}")))?;
    if let Some(cluster) = cluster {
        let probe = cluster.clone();
        let down = runtime::wait(py, async move { probe.probe().await })?;
        if !down.is_empty() {
            let names: Vec<String> = down.iter().map(|u| u.to_string()).collect();
            let warnings = py.import("warnings")?;
            warnings.call_method1("warn", (format!("workers {} do not answer; statements run on the others until they do", names.join(", ")),))?;
        }
        cluster.install(&engine);
    }
    Ok(engine)
}

/// Each row of `parameters` (one column per placeholder) bound into `sql`:
/// `?` placeholders are numbered `$1`, `$2`, … first. Too few or too many
/// values is an error naming the counts.
#[pyfunction]
pub fn bind(sql: &str, parameters: pyo3_arrow::PyRecordBatch) -> PyResult<Vec<String>> {
    use blobhouse_engine::placeholders::{arrow_literal, highest_placeholder, number_qmarks, substitute};
    use crate::errors::ProgrammingError;
    let batch = parameters.into_inner();
    let numbered = number_qmarks(sql);
    let wanted = highest_placeholder(&numbered);
    if wanted != batch.num_columns() {
        return Err(ProgrammingError::new_err(format!("the statement takes {wanted} parameter(s) but {} were given", batch.num_columns())));
    }
    // A batch of no columns says nothing of rows: no values, one statement.
    let rows = if batch.num_columns() == 0 { 1 } else { batch.num_rows() };
    (0..rows)
        .map(|row| {
            let literals = batch
                .columns()
                .iter()
                .enumerate()
                .map(|(i, column)| arrow_literal(column.as_ref(), row).map_err(|e| ProgrammingError::new_err(format!("parameter {}: {e}", i + 1))))
                .collect::<PyResult<Vec<String>>>()?;
            substitute(&numbered, &literals).map_err(ProgrammingError::new_err)
        })
        .collect()
}
