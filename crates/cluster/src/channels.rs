//! [`Channels`]: the connections from a coordinator (or a worker) to the
//! cluster's workers, one per worker URL, reused by every statement.
//!
//! datafusion-distributed's default keeps connections per DataFusion
//! runtime, and blobhouse builds a runtime per statement (its memory pool),
//! so every statement would connect anew. These are the engine's: made
//! once, lazily (a worker that is down fails the statement that needs it,
//! naming it, not the start), with explicit bounds on how long a connect
//! may take and how long a silent peer is believed alive.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use datafusion::common::DataFusionError;
use datafusion_distributed::{ChannelResolver, WorkerChannel, grpc};
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint};
use url::Url;

use crate::token::{ClusterToken, WithToken};

/// Longest a connection to a worker may take to open.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How often a connection is probed (HTTP/2 PING), and how long the answer
/// may take before the peer is taken for gone: a worker whose machine
/// vanishes without closing its connections (power, network) fails the
/// statement within about their sum, rather than hanging. A killed worker
/// process is noticed at once: its kernel resets the connections.
///
/// The timeout is long because a busy process answers late: DataFusion's
/// operators hold the runtime threads that also answer PINGs, and with 3 s
/// `bench cluster` lost Q18 on two workers of a 2-core machine to
/// `KeepAliveTimedOut` while both were alive and working.
pub const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(2);
pub const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(20);

/// Connections to workers, by URL (cheap to clone; clones share them).
/// Every request on them carries the cluster's token.
#[derive(Clone)]
pub struct Channels {
    open: Arc<Mutex<HashMap<Url, grpc::BoxCloneSyncChannel>>>,
    token: ClusterToken,
    /// The CA that signed the workers' certificates (`https://` workers).
    ca: Option<Certificate>,
}

impl std::fmt::Debug for Channels {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let urls: Vec<String> = self.open.lock().expect("not poisoned").keys().map(Url::to_string).collect();
        f.debug_struct("Channels").field("open", &urls).finish()
    }
}

impl Channels {
    /// No connection yet; each will carry `token`, and connections to
    /// `https://` workers trust only `ca` (PEM).
    pub fn new(token: ClusterToken, ca: Option<&[u8]>) -> Self {
        Channels { open: Arc::default(), token, ca: ca.map(Certificate::from_pem) }
    }

    fn channel(&self, url: &Url) -> Result<grpc::BoxCloneSyncChannel, DataFusionError> {
        let mut open = self.open.lock().expect("not poisoned");
        if let Some(c) = open.get(url) {
            return Ok(c.clone());
        }
        let endpoint = Endpoint::from_shared(url.to_string())
            .map_err(|e| DataFusionError::Configuration(format!("worker URL {url} is not a valid endpoint: {e}")))?
            .connect_timeout(CONNECT_TIMEOUT)
            .http2_keep_alive_interval(KEEPALIVE_INTERVAL)
            .keep_alive_timeout(KEEPALIVE_TIMEOUT)
            .keep_alive_while_idle(true)
            .tcp_nodelay(true);
        let endpoint = match (url.scheme(), &self.ca) {
            ("https", Some(ca)) => endpoint
                .tls_config(ClientTlsConfig::new().ca_certificate(ca.clone()))
                .map_err(|e| DataFusionError::Configuration(format!("TLS to worker {url}: {e}")))?,
            ("https", None) => return Err(DataFusionError::Configuration(format!("worker {url} is https: give the CA of its certificate (--worker-ca)"))),
            _ => endpoint,
        };
        let channel = grpc::BoxCloneSyncChannel::new(WithToken { inner: endpoint.connect_lazy(), token: self.token.clone() });
        open.insert(url.clone(), channel.clone());
        Ok(channel)
    }
}

#[async_trait]
impl ChannelResolver for Channels {
    async fn get_worker_client_for_url(&self, url: &Url) -> Result<Box<dyn WorkerChannel>, DataFusionError> {
        Ok(grpc::create_worker_client(self.channel(url)?))
    }
}
