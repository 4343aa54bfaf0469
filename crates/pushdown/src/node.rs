//! `blobhouse storage-node`: an Arrow Flight service next to the store that
//! runs pushed fragments on one database's data objects.
//!
//! Why our own service: S3 Select, which FlexPushdownDB pushed to, is closed
//! to new customers and never ran on Parquet well; no maintained crate runs
//! DataFusion fragments on object slices behind a token with a CPU budget.
//! Arrow Flight (arrow-flight + tonic) carries the results as Arrow IPC.
//!
//! Calls:
//! - `DoGet(ticket)`: the ticket is a [`crate::codec::Task`]; the answer is
//!   the fragment's output. The node admits at most `max_tasks` tasks at a
//!   time and queues at most `max_queued` more; beyond that it answers
//!   `RESOURCE_EXHAUSTED` at once, and the caller fetches the data itself
//!   (adaptive pushdown: a busy node never slows a query down).
//! - `DoAction("stats")`: the node's measured work as JSON ([`NodeStats`]),
//!   which the caller's cost model turns into scan and filter rates.
//!
//! Every call carries `authorization: Bearer <token>`; a node never starts
//! without a token. Malformed tickets and fragments are answered with
//! `INVALID_ARGUMENT` naming what is wrong; decoding runs under
//! `catch_unwind`, so not even a bug in a decoder takes the node down.

use std::net::SocketAddr;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use arrow_flight::encode::FlightDataEncoderBuilder;
use arrow_flight::error::FlightError;
use arrow_flight::flight_service_server::{FlightService, FlightServiceServer};
use arrow_flight::{
    Action, ActionType, Criteria, Empty, FlightData, FlightDescriptor, FlightInfo, HandshakeRequest, HandshakeResponse, PollInfo, PutResult, SchemaResult, Ticket,
};
use datafusion::execution::TaskContext;
use datafusion::physical_plan::{ExecutionPlan, ExecutionPlanProperties};
use datafusion::prelude::SessionContext;
use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};
use prost::Message;
use tokio::sync::Semaphore;
use tonic::{Request, Response, Status, Streaming};

use blobhouse_storage::Location;

use crate::codec::{SliceCodec, TASK_VERSION, Task, check_fragment};
use crate::slice::SliceReader;

/// The largest ticket a node accepts (a fragment with a deletion vector).
pub const MAX_TICKET_BYTES: usize = 16 * 1024 * 1024;

/// How a node is run.
#[derive(Clone)]
pub struct NodeOptions {
    /// The bearer token callers must present. Required.
    pub token: String,
    /// Tasks run at once: the node's CPU budget (default: its cores).
    pub max_tasks: usize,
    /// Tasks that may wait for a slot before the node refuses more.
    pub max_queued: usize,
    /// How replies are compressed on the wire.
    pub compression: ReplyCompression,
    /// Serve TLS only, with this certificate chain and key; `None`:
    /// plaintext (loopback or a private network).
    pub tls: Option<NodeTls>,
}

/// A node's TLS identity: its certificate chain and private key (PEM bytes).
#[derive(Clone)]
pub struct NodeTls {
    pub cert: Vec<u8>,
    pub key: Vec<u8>,
}

/// Never shows the key.
impl std::fmt::Debug for NodeTls {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.debug_struct("NodeTls").field("cert", &format!("{} bytes", self.cert.len())).field("key", &"<redacted>").finish()
    }
}

/// Parses the certificate chain and key the way the TLS stack will, so a
/// broken file stops the node at start rather than failing every handshake
/// later (tonic parses them only when a connection arrives).
fn check_identity(tls: &NodeTls) -> Result<(), String> {
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::{CertificateDer, PrivateKeyDer};
    let unusable = |what: String| format!("the storage node's TLS certificate or key is not usable: {what}; give a PEM certificate chain and its private key (it does not start without them)");
    let certs: Vec<CertificateDer> = CertificateDer::pem_slice_iter(&tls.cert).collect::<Result<_, _>>().map_err(|e| unusable(format!("the certificate does not parse: {e}")))?;
    if certs.is_empty() {
        return Err(unusable("the certificate file holds no certificate".into()));
    }
    PrivateKeyDer::from_pem_slice(&tls.key).map_err(|e| unusable(format!("the key does not parse: {e}")))?;
    Ok(())
}

/// How a node compresses the Arrow IPC buffers of its replies. The link to
/// the compute side is what pushdown saves, and decoded Arrow is several
/// times larger than the Parquet it came from: uncompressed replies can
/// move more bytes than fetching would have.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ReplyCompression {
    None,
    /// Fastest; about half the ratio of zstd on our data.
    Lz4,
    /// zstd level 1 (arrow's default): the best ratio per CPU second.
    #[default]
    Zstd,
}

impl ReplyCompression {
    /// Parses `none`, `lz4` or `zstd`.
    pub fn parse(text: &str) -> Option<Self> {
        match text.trim().to_ascii_lowercase().as_str() {
            "none" => Some(ReplyCompression::None),
            "lz4" => Some(ReplyCompression::Lz4),
            "zstd" => Some(ReplyCompression::Zstd),
            _ => None,
        }
    }

    fn ipc(self) -> Option<datafusion::arrow::ipc::CompressionType> {
        match self {
            ReplyCompression::None => None,
            ReplyCompression::Lz4 => Some(datafusion::arrow::ipc::CompressionType::LZ4_FRAME),
            ReplyCompression::Zstd => Some(datafusion::arrow::ipc::CompressionType::ZSTD),
        }
    }
}

/// Never shows the token.
impl std::fmt::Debug for NodeOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.debug_struct("NodeOptions")
            .field("token", &"<redacted>")
            .field("max_tasks", &self.max_tasks)
            .field("max_queued", &self.max_queued)
            .field("compression", &self.compression)
            .field("tls", &self.tls)
            .finish()
    }
}

impl NodeOptions {
    /// A budget of one task per core and as many waiting.
    pub fn new(token: impl Into<String>) -> Self {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        NodeOptions { token: token.into(), max_tasks: cores, max_queued: cores, compression: ReplyCompression::default(), tls: None }
    }
}

/// The node's measured work since it started, as `DoAction("stats")`
/// reports it.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct NodeStats {
    pub tasks_done: u64,
    pub tasks_failed: u64,
    /// Tasks refused because the budget was full.
    pub tasks_refused: u64,
    /// Requests rejected (bad token, malformed ticket or fragment).
    pub requests_rejected: u64,
    pub tasks_running: u64,
    pub tasks_queued: u64,
    pub max_tasks: u64,
    /// Compressed column-chunk bytes read from the store.
    pub bytes_read: u64,
    /// Arrow bytes sent back (decoded, in memory).
    pub bytes_sent: u64,
    /// Bytes of the Flight messages sent back (compressed IPC): what the
    /// link carried.
    #[serde(default)]
    pub wire_bytes_sent: u64,
    pub rows_decoded: u64,
    pub rows_sent: u64,
    pub footer_reads: u64,
    /// Seconds spent fetching, decoding, and running tasks end to end.
    pub fetch_seconds: f64,
    pub decode_seconds: f64,
    pub task_seconds: f64,
}

impl NodeStats {
    /// Compressed bytes the node scans per second of one task slot
    /// (fetch + decode), `None` before it has scanned anything.
    pub fn scan_bytes_per_second(&self) -> Option<f64> {
        let t = self.fetch_seconds + self.decode_seconds;
        (t > 0.0 && self.bytes_read > 0).then(|| self.bytes_read as f64 / t)
    }

    /// Rows a task slot decodes and filters per second, end to end.
    pub fn rows_per_second(&self) -> Option<f64> {
        (self.task_seconds > 0.0 && self.rows_decoded > 0).then(|| self.rows_decoded as f64 / self.task_seconds)
    }
}

#[derive(Debug, Default)]
struct TaskCounters {
    done: AtomicU64,
    failed: AtomicU64,
    refused: AtomicU64,
    rejected: AtomicU64,
    running: AtomicUsize,
    queued: AtomicUsize,
    bytes_sent: AtomicU64,
    wire_bytes_sent: AtomicU64,
    rows_sent: AtomicU64,
    task_nanos: AtomicU64,
}

/// A storage node serving one database. Cheap to clone (one shared state).
#[derive(Debug, Clone)]
pub struct StorageNode {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    reader: Arc<SliceReader>,
    codec: SliceCodec,
    ctx: Arc<TaskContext>,
    opts: NodeOptions,
    slots: Arc<Semaphore>,
    counters: TaskCounters,
}

impl StorageNode {
    /// A node over the database at `location`. Fails without a token.
    pub fn new(location: Location, opts: NodeOptions) -> Result<StorageNode, String> {
        if opts.token.trim().is_empty() {
            return Err("a storage node needs a token (set one with --token-env); it never serves unauthenticated callers".into());
        }
        if opts.max_tasks == 0 {
            return Err("a storage node needs at least one task slot (--max-tasks)".into());
        }
        if let Some(tls) = &opts.tls {
            check_identity(tls)?;
        }
        let reader = Arc::new(SliceReader::new(location));
        let ctx = SessionContext::new().task_ctx();
        let slots = Arc::new(Semaphore::new(opts.max_tasks));
        let codec = SliceCodec::for_node(reader.clone());
        Ok(StorageNode { inner: Arc::new(Inner { reader, codec, ctx, opts, slots, counters: TaskCounters::default() }) })
    }

    /// Its measured work so far.
    pub fn stats(&self) -> NodeStats {
        let c = &self.inner.counters;
        let r = &self.inner.reader.counters;
        let secs = |a: &AtomicU64| Duration::from_nanos(a.load(Ordering::Relaxed)).as_secs_f64();
        NodeStats {
            tasks_done: c.done.load(Ordering::Relaxed),
            tasks_failed: c.failed.load(Ordering::Relaxed),
            tasks_refused: c.refused.load(Ordering::Relaxed),
            requests_rejected: c.rejected.load(Ordering::Relaxed),
            tasks_running: c.running.load(Ordering::Relaxed) as u64,
            tasks_queued: c.queued.load(Ordering::Relaxed) as u64,
            max_tasks: self.inner.opts.max_tasks as u64,
            bytes_read: r.bytes_read.load(Ordering::Relaxed),
            bytes_sent: c.bytes_sent.load(Ordering::Relaxed),
            wire_bytes_sent: c.wire_bytes_sent.load(Ordering::Relaxed),
            rows_decoded: r.rows_decoded.load(Ordering::Relaxed),
            rows_sent: c.rows_sent.load(Ordering::Relaxed),
            footer_reads: r.footer_reads.load(Ordering::Relaxed),
            fetch_seconds: secs(&r.fetch_nanos),
            decode_seconds: secs(&r.decode_nanos),
            task_seconds: secs(&c.task_nanos),
        }
    }

    /// Serves on `listener` until `shutdown` completes.
    pub async fn serve(self, listener: tokio::net::TcpListener, shutdown: impl Future<Output = ()> + Send + 'static) -> Result<(), String> {
        // No Nagle: a reply ends in small frames (the last data, the
        // trailers) that Nagle would hold until the caller's delayed ACK,
        // adding up to 40 ms to every task (measured: a pushed query whose
        // node work takes ~8 ms took 48 ms).
        let incoming = tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
        let mut builder = tonic::transport::Server::builder();
        if let Some(tls) = &self.inner.opts.tls {
            // TLS only: a plaintext caller fails its handshake.
            let identity = tonic::transport::Identity::from_pem(&tls.cert, &tls.key);
            builder = builder.tls_config(tonic::transport::ServerTlsConfig::new().identity(identity)).map_err(|e| format!("the storage node's TLS does not start: {e}"))?;
        }
        builder
            .add_service(FlightServiceServer::new(self).max_decoding_message_size(MAX_TICKET_BYTES))
            .serve_with_incoming_shutdown(incoming, shutdown)
            .await
            .map_err(|e| format!("storage node stopped: {e}"))
    }

    /// Binds `addr` and serves in the background; returns the bound address
    /// (tests bind port 0).
    pub async fn spawn(self, addr: SocketAddr) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<Result<(), String>>)> {
        let listener = tokio::net::TcpListener::bind(addr).await?;
        let bound = listener.local_addr()?;
        Ok((bound, tokio::spawn(self.serve(listener, std::future::pending()))))
    }

    fn authenticate<T>(&self, request: &Request<T>) -> Result<(), Status> {
        let given = request.metadata().get("authorization").and_then(|v| v.to_str().ok()).and_then(|v| v.strip_prefix("Bearer "));
        match given {
            Some(t) if constant_time_eq(t.as_bytes(), self.inner.opts.token.as_bytes()) => Ok(()),
            _ => {
                self.inner.counters.rejected.fetch_add(1, Ordering::Relaxed);
                Err(Status::unauthenticated("storage node: missing or wrong bearer token (give the compute process the node's token)"))
            }
        }
    }

    fn reject(&self, reason: String) -> Status {
        self.inner.counters.rejected.fetch_add(1, Ordering::Relaxed);
        Status::invalid_argument(format!("storage node: {reason}"))
    }

    /// Decodes and checks a ticket into a runnable fragment.
    fn fragment(&self, ticket: &[u8]) -> Result<Arc<dyn ExecutionPlan>, Status> {
        let task = Task::decode(ticket).map_err(|e| self.reject(format!("the ticket is not a pushdown task: {e}")))?;
        if task.version != TASK_VERSION {
            return Err(self.reject(format!("task version {} is not supported (this node runs version {TASK_VERSION}); upgrade the older side", task.version)));
        }
        let node = datafusion_proto::protobuf::PhysicalPlanNode::decode(&task.fragment[..]).map_err(|e| self.reject(format!("the fragment does not decode: {e}")))?;
        check_fragment(&node).map_err(|e| self.reject(format!("fragment refused: {e}")))?;
        let decoded = std::panic::catch_unwind(AssertUnwindSafe(|| {
            datafusion_proto::bytes::physical_plan_from_bytes_with_extension_codec(&task.fragment, &self.inner.ctx, &self.inner.codec)
        }));
        match decoded {
            Ok(Ok(plan)) if plan.output_partitioning().partition_count() == 1 => Ok(plan),
            Ok(Ok(_)) => Err(self.reject("the fragment must have exactly one partition".into())),
            Ok(Err(e)) => Err(self.reject(format!("the fragment does not decode: {e}"))),
            Err(_) => Err(self.reject("the fragment crashed the decoder; it was dropped".into())),
        }
    }

    /// Waits for a task slot, or refuses when the queue is full.
    async fn admit(&self) -> Result<tokio::sync::OwnedSemaphorePermit, Status> {
        let inner = &self.inner;
        if let Ok(p) = inner.slots.clone().try_acquire_owned() {
            return Ok(p);
        }
        let queued = inner.counters.queued.fetch_add(1, Ordering::SeqCst);
        if queued >= inner.opts.max_queued {
            inner.counters.queued.fetch_sub(1, Ordering::SeqCst);
            inner.counters.refused.fetch_add(1, Ordering::Relaxed);
            return Err(Status::resource_exhausted(format!(
                "storage node busy: {} tasks running and {queued} waiting (limits {} and {}); fetch the data instead",
                inner.counters.running.load(Ordering::Relaxed),
                inner.opts.max_tasks,
                inner.opts.max_queued
            )));
        }
        let permit = inner.slots.clone().acquire_owned().await;
        inner.counters.queued.fetch_sub(1, Ordering::SeqCst);
        permit.map_err(|_| Status::unavailable("storage node is shutting down"))
    }
}

/// Compares two secrets in time that depends only on their lengths.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Counts a task while it runs; on drop, its time and outcome.
struct Running {
    node: StorageNode,
    started: Instant,
    failed: bool,
    _permit: tokio::sync::OwnedSemaphorePermit,
}

impl Drop for Running {
    fn drop(&mut self) {
        let c = &self.node.inner.counters;
        c.running.fetch_sub(1, Ordering::SeqCst);
        c.task_nanos.fetch_add(self.started.elapsed().as_nanos() as u64, Ordering::Relaxed);
        if self.failed { &c.failed } else { &c.done }.fetch_add(1, Ordering::Relaxed);
    }
}

fn unimplemented<T>(what: &str) -> Result<T, Status> {
    Err(Status::unimplemented(format!("a storage node does not serve {what}; it runs DoGet tickets and the \"stats\" action")))
}

#[tonic::async_trait]
impl FlightService for StorageNode {
    type HandshakeStream = BoxStream<'static, Result<HandshakeResponse, Status>>;
    type ListFlightsStream = BoxStream<'static, Result<FlightInfo, Status>>;
    type DoGetStream = BoxStream<'static, Result<FlightData, Status>>;
    type DoPutStream = BoxStream<'static, Result<PutResult, Status>>;
    type DoExchangeStream = BoxStream<'static, Result<FlightData, Status>>;
    type DoActionStream = BoxStream<'static, Result<arrow_flight::Result, Status>>;
    type ListActionsStream = BoxStream<'static, Result<ActionType, Status>>;

    async fn handshake(&self, _: Request<Streaming<HandshakeRequest>>) -> Result<Response<Self::HandshakeStream>, Status> {
        unimplemented("Handshake (send the token as a bearer header on each call)")
    }

    async fn list_flights(&self, _: Request<Criteria>) -> Result<Response<Self::ListFlightsStream>, Status> {
        unimplemented("ListFlights")
    }

    async fn get_flight_info(&self, _: Request<FlightDescriptor>) -> Result<Response<FlightInfo>, Status> {
        unimplemented("GetFlightInfo")
    }

    async fn poll_flight_info(&self, _: Request<FlightDescriptor>) -> Result<Response<PollInfo>, Status> {
        unimplemented("PollFlightInfo")
    }

    async fn get_schema(&self, _: Request<FlightDescriptor>) -> Result<Response<SchemaResult>, Status> {
        unimplemented("GetSchema")
    }

    async fn do_get(&self, request: Request<Ticket>) -> Result<Response<Self::DoGetStream>, Status> {
        self.authenticate(&request)?;
        let plan = self.fragment(&request.get_ref().ticket)?;
        let permit = self.admit().await?;
        self.inner.counters.running.fetch_add(1, Ordering::SeqCst);
        let mut running = Running { node: self.clone(), started: Instant::now(), failed: false, _permit: permit };
        let schema = plan.schema();
        let batches = match plan.execute(0, self.inner.ctx.clone()) {
            Ok(s) => s,
            Err(e) => {
                running.failed = true;
                return Err(Status::internal(format!("storage node: the fragment does not start: {e}")));
            }
        };
        let node = self.clone();
        // The stream owns `running`: the slot is held until the last batch
        // is sent or the caller goes away.
        let counted = batches.map(move |b| {
            let r = &mut running;
            match &b {
                Ok(batch) => {
                    let c = &node.inner.counters;
                    c.rows_sent.fetch_add(batch.num_rows() as u64, Ordering::Relaxed);
                    c.bytes_sent.fetch_add(batch.get_array_memory_size() as u64, Ordering::Relaxed);
                }
                Err(_) => r.failed = true,
            }
            b.map_err(|e| FlightError::ExternalError(Box::new(e)))
        });
        let options = datafusion::arrow::ipc::writer::IpcWriteOptions::default()
            .try_with_compression(self.inner.opts.compression.ipc())
            .map_err(|e| Status::internal(format!("storage node: reply compression: {e}")))?;
        let wire = self.clone();
        let encoded = FlightDataEncoderBuilder::new().with_schema(schema).with_options(options).build(counted).map_err(Status::from).inspect_ok(move |d: &FlightData| {
            wire.inner.counters.wire_bytes_sent.fetch_add((d.data_header.len() + d.data_body.len()) as u64, Ordering::Relaxed);
        });
        Ok(Response::new(encoded.boxed()))
    }

    async fn do_put(&self, _: Request<Streaming<FlightData>>) -> Result<Response<Self::DoPutStream>, Status> {
        unimplemented("DoPut (a storage node never writes)")
    }

    async fn do_exchange(&self, _: Request<Streaming<FlightData>>) -> Result<Response<Self::DoExchangeStream>, Status> {
        unimplemented("DoExchange")
    }

    async fn do_action(&self, request: Request<Action>) -> Result<Response<Self::DoActionStream>, Status> {
        self.authenticate(&request)?;
        match request.get_ref().r#type.as_str() {
            "stats" => {
                let body = serde_json::to_vec(&self.stats()).map_err(|e| Status::internal(e.to_string()))?;
                let one = arrow_flight::Result { body: body.into() };
                Ok(Response::new(futures::stream::once(async move { Ok(one) }).boxed()))
            }
            other => Err(self.reject(format!("unknown action {other:?} (a storage node serves \"stats\")"))),
        }
    }

    async fn list_actions(&self, _: Request<Empty>) -> Result<Response<Self::ListActionsStream>, Status> {
        let stats = ActionType { r#type: "stats".into(), description: "the node's measured work as JSON".into() };
        Ok(Response::new(futures::stream::once(async move { Ok(stats) }).boxed()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn tokens_never_show_in_debug_output() {
        let opts = NodeOptions::new("s3cr3t-token");
        assert!(!format!("{opts:?}").contains("s3cr3t"));
        let client = crate::NodeClient::new("http://127.0.0.1:1", "s3cr3t-token").unwrap();
        assert!(!format!("{client:?}").contains("s3cr3t"));
    }

    #[test]
    fn tokens_compare_whole() {
        assert!(constant_time_eq(b"secret", b"secret"));
        assert!(!constant_time_eq(b"secret", b"secreT"));
        assert!(!constant_time_eq(b"secret", b"secret2"));
        assert!(!constant_time_eq(b"", b"x"));
    }
}
