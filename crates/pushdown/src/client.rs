//! The compute side's handle on a storage node.
//!
//! One [`NodeClient`] per node, shared by every query of a process: it holds
//! one HTTP/2 connection (opened on first use, reopened after a failure) on
//! which all tasks are multiplexed.

use std::sync::Arc;
use std::time::Duration;

use arrow_flight::flight_service_client::FlightServiceClient;
use arrow_flight::decode::DecodedPayload;
use arrow_flight::{Action, FlightClient, Ticket};
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::physical_plan::ExecutionPlan;
use futures::TryStreamExt;
use tonic::transport::{Channel, Endpoint};

use crate::codec::encode_task;
use crate::error::PushdownError;
use crate::node::NodeStats;

/// A task's output.
#[derive(Debug)]
pub struct NodeReply {
    pub batches: Vec<RecordBatch>,
    /// Bytes of the Flight messages that carried it (compressed Arrow IPC).
    pub wire_bytes: u64,
}

/// How long to wait for a connection to a node.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// A connection to one storage node.
#[derive(Clone)]
pub struct NodeClient {
    endpoint: String,
    auth: String,
    channel: Channel,
}

/// Never shows the token.
impl std::fmt::Debug for NodeClient {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.debug_struct("NodeClient").field("endpoint", &self.endpoint).field("auth", &"Bearer <redacted>").finish_non_exhaustive()
    }
}

impl NodeClient {
    /// A client of the node at `endpoint` (`http://host:port`) presenting
    /// `token`. Connects lazily: an unreachable node shows up as
    /// [`PushdownError::Unavailable`] on the first task, and the caller
    /// fetches instead. Call it inside a Tokio runtime (the connection
    /// lives on it).
    pub fn new(endpoint: &str, token: &str) -> Result<NodeClient, PushdownError> {
        NodeClient::with_ca(endpoint, token, None)
    }

    /// [`NodeClient::new`] for a node that may serve TLS: an `https://`
    /// endpoint is reached over TLS, verifying the node's certificate
    /// against `ca` (PEM), which it then needs.
    pub fn with_ca(endpoint: &str, token: &str, ca: Option<&[u8]>) -> Result<NodeClient, PushdownError> {
        let bad = |reason: String| PushdownError::BadEndpoint { endpoint: endpoint.to_string(), reason };
        let mut e = Endpoint::from_shared(endpoint.to_string()).map_err(|e| bad(e.to_string()))?;
        if endpoint.starts_with("https://") {
            let ca = ca.ok_or_else(|| bad("an https:// storage node needs the CA that signed its certificate (--storage-node-ca FILE)".into()))?;
            let tls = tonic::transport::ClientTlsConfig::new().ca_certificate(tonic::transport::Certificate::from_pem(ca));
            e = e.tls_config(tls).map_err(|e| bad(format!("TLS: {e}")))?;
        } else if ca.is_some() {
            return Err(bad("a CA was given for a plaintext endpoint; use https:// to reach a node that serves TLS".into()));
        }
        let channel = e.connect_timeout(CONNECT_TIMEOUT).tcp_nodelay(true).connect_lazy();
        Ok(NodeClient { endpoint: endpoint.to_string(), auth: format!("Bearer {token}"), channel })
    }

    /// The node's address, for messages and EXPLAIN.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    fn flight(&self) -> Result<FlightClient, PushdownError> {
        let inner = FlightServiceClient::new(self.channel.clone()).max_decoding_message_size(usize::MAX);
        let mut client = FlightClient::new_from_inner(inner);
        client
            .add_header("authorization", &self.auth)
            .map_err(|e| PushdownError::Rejected { endpoint: self.endpoint.clone(), reason: format!("the token cannot be sent as a header: {e}") })?;
        Ok(client)
    }

    fn classify(&self, e: arrow_flight::error::FlightError) -> PushdownError {
        use arrow_flight::error::FlightError;
        match e {
            FlightError::Tonic(status) => PushdownError::from_status(&self.endpoint, &status),
            other => PushdownError::Failed { endpoint: self.endpoint.clone(), reason: other.to_string() },
        }
    }

    /// Runs `fragment` (separable operators over one
    /// [`crate::ObjectSliceExec`]) on the node and returns its whole output.
    /// All or nothing: the caller can fall back to fetching on any error
    /// without having passed on part of the rows.
    pub async fn run(&self, fragment: Arc<dyn ExecutionPlan>) -> Result<NodeReply, PushdownError> {
        let expected: SchemaRef = fragment.schema();
        let ticket = encode_task(fragment).map_err(PushdownError::Encode)?;
        let mut client = self.flight()?;
        let mut messages = client.do_get(Ticket { ticket: ticket.into() }).await.map_err(|e| self.classify(e))?.into_inner();
        let mut reply = NodeReply { batches: Vec::new(), wire_bytes: 0 };
        while let Some(m) = messages.try_next().await.map_err(|e| self.classify(e))? {
            reply.wire_bytes += (m.inner.data_header.len() + m.inner.data_body.len()) as u64;
            if let DecodedPayload::RecordBatch(b) = m.payload {
                // The node encodes in the fragment's own schema; check
                // rather than trust, since the merge above expects exactly it.
                if b.schema().fields() != expected.fields() {
                    return Err(PushdownError::Failed {
                        endpoint: self.endpoint.clone(),
                        reason: format!("the node answered in schema {:?}, the fragment's is {:?}", b.schema(), expected),
                    });
                }
                reply.batches.push(b.with_schema(expected.clone()).expect("same fields"));
            }
        }
        Ok(reply)
    }

    /// The node's measured work.
    pub async fn stats(&self) -> Result<NodeStats, PushdownError> {
        let mut client = self.flight()?;
        let mut results = client.do_action(Action { r#type: "stats".into(), body: Default::default() }).await.map_err(|e| self.classify(e))?;
        let body = results
            .try_next()
            .await
            .map_err(|e| self.classify(e))?
            .ok_or_else(|| PushdownError::Failed { endpoint: self.endpoint.clone(), reason: "the stats action returned nothing".into() })?;
        serde_json::from_slice(&body).map_err(|e| PushdownError::Failed { endpoint: self.endpoint.clone(), reason: format!("the stats do not parse: {e}") })
    }
}
