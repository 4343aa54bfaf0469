//! A worker: runs the tasks a coordinator sends, reading through its own
//! [`Engine`] — its download manager, memory budget, spill directory,
//! caching tiers and footer cache — with no session and no catalog.
//!
//! The worker is datafusion-distributed's `Worker` service (plans arrive
//! encoded, partitions stream back as Arrow Flight). What blobhouse adds
//! is the session each task runs in ([`EngineSessions`]): the engine's
//! execution options, its functions, our scan's codec bound to the
//! engine, and the engine's runtime (memory pool, disk manager), so a
//! worker's operators spill and fail within its own budget.

use std::net::SocketAddr;
use std::sync::Arc;

use async_trait::async_trait;
use datafusion::common::DataFusionError;
use datafusion::common::config::ExecutionOptions;
use datafusion::execution::SessionState;
use datafusion::logical_expr::ScalarUDF;
use datafusion_distributed::{DistributedExt, Worker, WorkerQueryContext, WorkerSessionBuilder};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Identity, Server, ServerTlsConfig};
use tonic::transport::server::TcpIncoming;

use blobhouse_engine::Engine;
use blobhouse_engine::scan::{ScanCodec, ScanTally};

use crate::channels::Channels;
use crate::token::ClusterToken;

/// Builds the session of each task a worker runs (see the module docs).
#[derive(Clone)]
pub struct EngineSessions {
    execution: ExecutionOptions,
    functions: Vec<Arc<ScalarUDF>>,
    codec: Arc<ScanCodec>,
    channels: Channels,
}

impl EngineSessions {
    /// Sessions over `engine`; with `tally`, every scan the worker decodes
    /// is added to it. Calls to other workers (shuffles) carry `token` and
    /// trust `ca` for `https://` workers.
    pub fn new(engine: &Engine, token: ClusterToken, ca: Option<&[u8]>, tally: Option<Arc<ScanTally>>) -> Self {
        let base = engine.base_context().state();
        let mut codec = engine.scan_codec();
        if let Some(t) = tally {
            codec = codec.with_tally(t);
        }
        EngineSessions {
            execution: base.config().options().execution.clone(),
            functions: base.scalar_functions().values().cloned().collect(),
            codec: Arc::new(codec),
            channels: Channels::new(token, ca),
        }
    }
}

#[async_trait]
impl WorkerSessionBuilder for EngineSessions {
    async fn build_session_state(&self, ctx: WorkerQueryContext) -> Result<SessionState, DataFusionError> {
        let mut builder = ctx.builder;
        // In place: the config already holds the task's place in its stage.
        if let Some(config) = builder.config().as_mut() {
            config.options_mut().execution = self.execution.clone();
        }
        Ok(builder
            .with_scalar_functions(self.functions.clone())
            .with_distributed_user_codec_arc(self.codec.clone())
            .with_distributed_channel_resolver(self.channels.clone())
            .build())
    }
}

/// datafusion-distributed's worker service over `engine`.
pub fn worker(engine: &Engine, token: ClusterToken, tls: Option<&WorkerTls>, tally: Option<Arc<ScanTally>>) -> Worker {
    Worker::from_session_builder(EngineSessions::new(engine, token, tls.and_then(|t| t.ca.as_deref()), tally))
        .with_runtime_env(engine.base_context().runtime_env())
        .with_version(concat!("blobhouse ", env!("CARGO_PKG_VERSION")))
}

/// A worker's TLS: its certificate chain and key, and the CA it trusts
/// when it calls other `https://` workers (PEM bytes, read by the caller).
#[derive(Clone)]
pub struct WorkerTls {
    pub cert: Vec<u8>,
    pub key: Vec<u8>,
    pub ca: Option<Vec<u8>>,
}

/// A worker that cannot serve.
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    #[error("cannot serve on {addr}: {source}")]
    Listen { addr: String, source: std::io::Error },
    #[error("the worker's TLS certificate or key is not usable: {0}; give a PEM certificate chain and its private key (it does not start without them)")]
    Tls(String),
}

/// A worker serving on a TCP address until it is stopped or dropped.
#[derive(Debug)]
pub struct WorkerServer {
    addr: SocketAddr,
    https: bool,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<Result<(), tonic::transport::Error>>>,
}

impl WorkerServer {
    /// Serves `engine`'s worker on `listener` (bind port 0 for any) to
    /// callers that present `token`; over TLS only, when `tls` is given.
    /// A certificate or key that does not load fails here: the worker does
    /// not start.
    pub fn start(engine: &Engine, listener: tokio::net::TcpListener, token: ClusterToken, tls: Option<&WorkerTls>, tally: Option<Arc<ScanTally>>) -> Result<WorkerServer, WorkerError> {
        let addr = listener.local_addr().map_err(|source| WorkerError::Listen { addr: "a listener".into(), source })?;
        let check = token.clone();
        let service = InterceptedService::new(worker(engine, token, tls, tally).into_worker_server(), move |r: tonic::Request<()>| check.check(&r).map(|_| r));
        let mut builder = Server::builder();
        if let Some(t) = tls {
            check_identity(&t.cert, &t.key)?;
            builder = builder.tls_config(ServerTlsConfig::new().identity(Identity::from_pem(&t.cert, &t.key))).map_err(|e| WorkerError::Tls(e.to_string()))?;
        }
        let (stop, stopped) = oneshot::channel::<()>();
        let incoming = TcpIncoming::from(listener).with_nodelay(Some(true));
        let task = tokio::spawn(builder.add_service(service).serve_with_incoming_shutdown(incoming, async {
            let _ = stopped.await;
        }));
        Ok(WorkerServer { addr, https: tls.is_some(), stop: Some(stop), task: Some(task) })
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Its URL for a coordinator.
    pub fn url(&self) -> url::Url {
        let scheme = if self.https { "https" } else { "http" };
        url::Url::parse(&format!("{scheme}://{}", self.addr)).expect("a socket address makes a URL")
    }

    /// Stops serving and waits for the server to end.
    pub async fn stop(mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.task.take() {
            let _ = t.await;
        }
    }
}

impl Drop for WorkerServer {
    fn drop(&mut self) {
        if let Some(t) = self.task.take() {
            t.abort();
        }
    }
}

/// Parses the certificate chain and key the way the TLS stack will, so a
/// broken file stops the worker at start rather than failing every
/// handshake later (tonic parses them only when a connection arrives).
fn check_identity(cert: &[u8], key: &[u8]) -> Result<(), WorkerError> {
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::{CertificateDer, PrivateKeyDer};
    let certs: Vec<CertificateDer> = CertificateDer::pem_slice_iter(cert).collect::<Result<_, _>>().map_err(|e| WorkerError::Tls(format!("the certificate does not parse: {e}")))?;
    if certs.is_empty() {
        return Err(WorkerError::Tls("the certificate file holds no certificate".into()));
    }
    PrivateKeyDer::from_pem_slice(key).map_err(|e| WorkerError::Tls(format!("the key does not parse: {e}")))?;
    Ok(())
}
