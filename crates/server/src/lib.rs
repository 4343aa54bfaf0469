//! `blobhouse serve`: blobhouse as a shared, network-reachable database.
//!
//! One open [`Engine`] (its download manager, caches and memory pool) serves
//! every connection; each connection runs in its own session
//! ([`Engine::connect`]). This crate holds the endpoints only — the
//! PostgreSQL wire protocol (`pg`, on pgwire) and Arrow Flight SQL
//! (`flight`, on arrow-flight and tonic) — plus what they share: the
//! statement runner (`exec`), users ([`auth`]), TLS ([`tls`]) and metrics;
//! for PostgreSQL also its startup (`login`) and the encoding of results
//! (`respond`). Run-time parameters (SET, SHOW, `statement_timeout`) are the
//! engine session's, from the engine's one registry of settings.
//! It never falls back to plaintext and never starts on a non-loopback
//! address without users.

pub mod auth;
mod catalog;
mod copy;
mod cursors;
mod exec;
mod flight;
mod functions;
mod hangup;
mod login;
mod metrics;
mod params;
mod pg;
mod respond;
mod rest_catalog;

pub mod tls;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio::sync::Semaphore;

use blobhouse_engine::Engine;

pub use auth::{Users, hash_password};
pub use tls::TlsFiles;

/// What stops a server from starting.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("cannot listen on {addr}: {source} (is another server using the port? pick another with --pg-listen, --flight-listen or --metrics-listen)")]
    Bind { addr: SocketAddr, source: std::io::Error },
    #[error("TLS: {}: {message}; the server does not start without the TLS it was told to use", path.display())]
    Tls { path: PathBuf, message: String },
    #[error("users: {0}")]
    Users(String),
    #[error("cannot start the threads that run statements: {0}")]
    Runtime(String),
    #[error("cannot set up pg_catalog: {0}")]
    Catalog(String),
    #[error(
        "refusing to listen on {addr} without users: anyone who can reach it could read and change the data. Add a user (--user NAME with BLOBHOUSE_PASSWORD, or --users-file with hashes from `blobhouse hash-password`), or listen on 127.0.0.1"
    )]
    OpenWithoutUsers { addr: SocketAddr },
    #[error(
        "refusing to serve /metrics and /healthz on {addr} without a token: anyone who can reach it would see table names and load. Give one (--metrics-token-env VAR; scrapers send Authorization: Bearer <token>), or listen on 127.0.0.1"
    )]
    MetricsWithoutToken { addr: SocketAddr },
}

/// How to serve.
#[derive(Debug, Clone)]
pub struct ServerOptions {
    /// The PostgreSQL listener (port 0: any free port).
    pub pg_listen: SocketAddr,
    /// The Arrow Flight SQL listener, if any (port 0: any free port).
    pub flight_listen: Option<SocketAddr>,
    /// Certificate and key: clients must then use TLS.
    pub tls: Option<TlsFiles>,
    /// Who may log in. Empty: nobody (allowed on loopback only, where the
    /// server is of no use until users are added — never an open door).
    pub users: Users,
    /// Connections served at once; more wait for a free slot.
    pub max_connections: usize,
    /// Threads that run statements (0: the engine's partitions, one per
    /// core unless `--threads` says otherwise). They are not the
    /// threads that serve the protocol, so a busy engine still answers
    /// cancel requests and logins at once.
    pub execution_threads: usize,
    /// Statements running at once (0: twice the execution threads); more
    /// wait in a queue (`blobhouse_queries_queued`).
    pub max_queries: usize,
    /// Statements at least this long are logged with their text.
    pub slow_query: std::time::Duration,
    /// Where to serve `/metrics` and `/healthz` over HTTP (`None`: nowhere).
    pub metrics_listen: Option<SocketAddr>,
    /// The bearer token `/metrics` and `/healthz` callers must send;
    /// required off loopback (the server does not start without it).
    pub metrics_token: Option<String>,
    /// Files outside the database clients may read and write
    /// (`read_parquet`, external tables, COPY … FROM/TO a path or URL).
    /// Default: none — the server's files and credentials are not its
    /// clients' (`blobhouse serve --allow-files`). COPY … FROM STDIN and
    /// Flight SQL ingest still work: each connection spools into a
    /// directory of its own that only it may read.
    pub files: blobhouse_engine::FileAccess,
}

impl ServerOptions {
    /// Loopback on PostgreSQL's port, no Flight SQL, no TLS, no users, 64
    /// connections.
    pub fn new() -> ServerOptions {
        ServerOptions {
            pg_listen: SocketAddr::from(([127, 0, 0, 1], 5432)),
            flight_listen: None,
            tls: None,
            users: Users::new(), max_connections: 64,
            execution_threads: 0,
            max_queries: 0,
            slow_query: std::time::Duration::from_secs(1),
            metrics_listen: None,
            metrics_token: None,
            files: blobhouse_engine::FileAccess::only(Vec::<String>::new()),
        }
    }
}

impl Default for ServerOptions {
    fn default() -> Self {
        ServerOptions::new()
    }
}

/// A running server.
pub struct Server {
    pg_addr: SocketAddr,
    flight_addr: Option<SocketAddr>,
    flight_task: Option<tokio::task::JoinHandle<()>>,
    metrics_addr: Option<SocketAddr>,
    metrics_task: Option<tokio::task::JoinHandle<()>>,
    engine: Arc<Engine>,
    /// Runs the statements; shut down (without waiting) with the server.
    execution: Option<tokio::runtime::Runtime>,
    accept: tokio::task::JoinHandle<()>,
}

impl Server {
    /// Checks the options, sets up TLS and binds the listeners; the server
    /// then runs on the current tokio runtime until dropped or [`Server::wait`] ends.
    pub async fn start(engine: Engine, options: ServerOptions) -> Result<Server, ServerError> {
        for addr in std::iter::once(options.pg_listen).chain(options.flight_listen) {
            if options.users.is_empty() && !addr.ip().is_loopback() {
                return Err(ServerError::OpenWithoutUsers { addr });
            }
        }
        if let Some(addr) = options.metrics_listen.filter(|a| !a.ip().is_loopback() && options.metrics_token.is_none()) {
            return Err(ServerError::MetricsWithoutToken { addr });
        }
        let iterations = options.users.iterations()?;
        let acceptor = options.tls.as_ref().map(tls::acceptor).transpose()?;
        let listener = TcpListener::bind(options.pg_listen).await.map_err(|source| ServerError::Bind { addr: options.pg_listen, source })?;
        let pg_addr = listener.local_addr().map_err(|source| ServerError::Bind { addr: options.pg_listen, source })?;
        let users_count = options.users.names().len();
        let users = Arc::new(options.users);
        catalog::install(&engine, users.clone())?;
        let engine = Arc::new(engine);
        let threads = match options.execution_threads {
            // As many as the engine's partitions (`--threads`, default the cores).
            0 => engine.options().target_partitions.max(1),
            n => n,
        };
        let execution = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads)
            .thread_name("blobhouse-exec")
            .enable_all()
            .build()
            .map_err(|e| ServerError::Runtime(e.to_string()))?;
        let metrics = Arc::new(metrics::Metrics::default());
        let (metrics_addr, metrics_task) = match options.metrics_listen {
            Some(addr) => {
                let listener = TcpListener::bind(addr).await.map_err(|source| ServerError::Bind { addr, source })?;
                let bound = listener.local_addr().map_err(|source| ServerError::Bind { addr, source })?;
                (Some(bound), Some(tokio::spawn(metrics::serve(listener, metrics.clone(), engine.clone(), options.metrics_token.clone()))))
            }
            None => (None, None),
        };
        let max_queries = if options.max_queries == 0 { 2 * threads } else { options.max_queries };
        let limits = exec::Limits { queries: Arc::new(Semaphore::new(max_queries)), slow: options.slow_query };
        let runner = Arc::new(exec::Runner::new(metrics, limits, execution.handle().clone(), options.files.clone()));
        let (flight_addr, flight_task) = match options.flight_listen {
            Some(addr) => {
                let service = flight::FlightSql::new(engine.clone(), runner.clone(), users.clone(), options.max_connections);
                let (bound, task) = serve_flight(addr, service, options.tls.as_ref()).await?;
                (Some(bound), Some(task))
            }
            None => (None, None),
        };
        let handlers = Arc::new(pg::Handlers::new(engine.clone(), runner, users, iterations, acceptor.is_some()));
        let slots = Arc::new(Semaphore::new(options.max_connections.max(1)));
        let accept = tokio::spawn(async move {
            loop {
                let Ok(permit) = slots.clone().acquire_owned().await else { return };
                let (socket, _) = match listener.accept().await {
                    Ok(s) => s,
                    // Out of descriptors and the like: wait, then go on.
                    Err(_) => {
                        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                        continue;
                    }
                };
                // No Nagle (PostgreSQL sets TCP_NODELAY too): a reply's
                // last small messages would otherwise wait for the
                // client's delayed ACK.
                let _ = socket.set_nodelay(true);
                let (handlers, acceptor) = (handlers.clone(), acceptor.clone());
                let peer = socket.peer_addr().ok();
                tokio::spawn(async move {
                    // A connection's protocol errors end that connection
                    // only. So does a panic: pgwire 0.41's decoder panics on
                    // some malformed messages (a Parse whose fields run
                    // past its length, found by the fuzz test); that
                    // connection is dropped and logged, the server goes on.
                    use futures::FutureExt;
                    use std::os::fd::AsRawFd;
                    let fd = socket.as_raw_fd();
                    let served = std::panic::AssertUnwindSafe(pgwire::tokio::process_socket(socket, acceptor, handlers)).catch_unwind();
                    // A client that hangs up mid-statement stops the
                    // statement: the connection, and the statement's
                    // future in it, are dropped (the socket with them, so
                    // only after the watch on its descriptor has ended).
                    tokio::select! {
                        served = served => if served.is_err() {
                            tracing::warn!(peer = ?peer, "a malformed PostgreSQL message made the protocol decoder fail; the connection was closed");
                        },
                        _ = hangup::peer_gone(fd) => tracing::debug!(peer = ?peer, "the client hung up; its connection and any statement it was running were stopped"),
                    }
                    drop(permit);
                });
            }
        });
        tracing::info!(pg = %pg_addr, flight = ?flight_addr, metrics = ?metrics_addr, tls = options.tls.is_some(), users = users_count, max_queries, "serving");
        Ok(Server { pg_addr, flight_addr, flight_task, metrics_addr, engine, execution: Some(execution), accept, metrics_task })
    }

    /// Where the PostgreSQL listener is.
    pub fn pg_addr(&self) -> SocketAddr {
        self.pg_addr
    }

    /// Where Arrow Flight SQL is served, if anywhere.
    pub fn flight_addr(&self) -> Option<SocketAddr> {
        self.flight_addr
    }

    /// Where `/metrics` and `/healthz` are served, if anywhere.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics_addr
    }

    /// The engine every connection's session shares (its download
    /// manager, caches and memory pool: what metrics report).
    pub fn engine(&self) -> &Arc<Engine> {
        &self.engine
    }

    /// Runs until the accept loop ends (it does not on its own).
    pub async fn wait(mut self) {
        let _ = (&mut self.accept).await;
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.accept.abort();
        for task in [&self.metrics_task, &self.flight_task].into_iter().flatten() {
            task.abort();
        }
        if let Some(execution) = self.execution.take() {
            execution.shutdown_background();
        }
    }
}

/// Binds `addr` and serves Flight SQL on it (over TLS when `tls` is set:
/// tonic then accepts TLS connections only) in the background.
async fn serve_flight(addr: SocketAddr, service: flight::FlightSql, tls: Option<&TlsFiles>) -> Result<(SocketAddr, tokio::task::JoinHandle<()>), ServerError> {
    use arrow_flight::flight_service_server::FlightServiceServer;
    let mut builder = tonic::transport::Server::builder();
    if let Some(files) = tls {
        let read = |path: &PathBuf| std::fs::read(path).map_err(|e| ServerError::Tls { path: path.clone(), message: format!("cannot read: {e}") });
        let identity = tonic::transport::Identity::from_pem(read(&files.cert)?, read(&files.key)?);
        builder = builder
            .tls_config(tonic::transport::ServerTlsConfig::new().identity(identity))
            .map_err(|e| ServerError::Tls { path: files.cert.clone(), message: format!("Flight SQL TLS setup: {e}") })?;
    }
    let listener = TcpListener::bind(addr).await.map_err(|source| ServerError::Bind { addr, source })?;
    let bound = listener.local_addr().map_err(|source| ServerError::Bind { addr, source })?;
    // No Nagle, as PostgreSQL does: a reply's last small frames would
    // otherwise wait for the client's delayed ACK (up to 40 ms).
    let incoming = tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
    let service = FlightServiceServer::new(service).max_decoding_message_size(flight::MAX_MESSAGE_BYTES);
    let task = tokio::spawn(async move {
        if let Err(e) = builder.add_service(service).serve_with_incoming(incoming).await {
            tracing::error!(error = %e, "the Flight SQL listener stopped");
        }
    });
    Ok((bound, task))
}
