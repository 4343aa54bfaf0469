//! The event loop: many HTTP requests in flight on one thread, through
//! io_uring (AnyBlob §3.1).
//!
//! Each request is a small state machine (connect → send → receive head →
//! receive body) with at most one operation in the ring at a time; its slot
//! index and a generation form the operation's `user_data`. One iteration
//! starts waiting requests up to the in-flight limit, queues their next
//! operations, submits the whole batch with one `io_uring_enter`, and reaps
//! every completion. Bodies are received straight into the request's own
//! buffer (no copy; chunked framing is squeezed out in place). Connections
//! are kept alive per address. A 50 ms tick checks deadlines: a request past
//! its deadline is cancelled in the kernel (`IORING_OP_ASYNC_CANCEL`) and
//! retried on a fresh connection, as are resets, truncated bodies and 5xx
//! answers, with exponential back-off and jitter; 4xx and malformed responses
//! fail at once.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::ops::Range;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use io_uring::{IoUring, opcode, types};
use socket2::{Domain, SockAddr, Socket, Type};

use crate::buffers::BufferPool;
use crate::model::{LatencyModel, LinkProbe};
use crate::tls::TlsState;
use crate::stats::Histogram;
use crate::http::{BodyDecoder, Framing, HttpError, Limits, ResponseHead, parse_content_range, parse_head, range_header, write_request};

/// One HTTP request to run: a GET (optionally of a byte range) or a PUT.
#[derive(Debug)]
pub struct Request {
    /// Where to connect.
    pub addr: SocketAddr,
    /// The Host header.
    pub host: String,
    /// Path and query (a presigned URL's, for object stores).
    pub target: String,
    /// GET, or PUT with its body.
    pub method: Method,
    /// The bytes wanted; `None` for the whole object. GET only.
    pub range: Option<Range<u64>>,
    /// The buffer the response body is received into (reused by the caller).
    pub buffer: Vec<u8>,
    /// HTTPS: TLS on the connection (needs [`LoopOptions::tls`]).
    pub tls: bool,
}

/// The request's method.
#[derive(Debug, Clone)]
pub enum Method {
    Get,
    /// Uploads the body; shared, so retries and hedges send it without a copy.
    Put(Arc<[u8]>),
}

impl Request {
    /// A GET of `range` (or the whole object).
    pub fn get(addr: SocketAddr, host: impl Into<String>, target: impl Into<String>, range: Option<Range<u64>>) -> Request {
        Request { addr, host: host.into(), target: target.into(), method: Method::Get, range, buffer: Vec::new(), tls: false }
    }

    /// A PUT of `body`.
    pub fn put(addr: SocketAddr, host: impl Into<String>, target: impl Into<String>, body: Arc<[u8]>) -> Request {
        Request { addr, host: host.into(), target: target.into(), method: Method::Put(body), range: None, buffer: Vec::new(), tls: false }
    }

    /// The same request over TLS (`true`) or plain TCP.
    pub fn with_tls(mut self, tls: bool) -> Request {
        self.tls = tls;
        self
    }

    /// The host without the port: the TLS server name.
    fn server_name(&self) -> &str {
        match self.host.rsplit_once(':') {
            Some((h, p)) if !h.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) && !h.ends_with(':') => h,
            _ => &self.host,
        }
    }

    /// Body bytes the request sends (a PUT's body, else none).
    fn payload_sent(&self) -> usize {
        match &self.method {
            Method::Put(body) => body.len(),
            Method::Get => 0,
        }
    }

    /// Bytes the request moves: the range (or what the buffer can hold) for a
    /// GET, the body for a PUT.
    fn payload_bytes(&self) -> u64 {
        match &self.method {
            Method::Put(body) => body.len() as u64,
            Method::Get => self.range.as_ref().map(|r| r.end - r.start).unwrap_or(self.buffer.capacity() as u64),
        }
    }
}

/// A completed request.
#[derive(Debug)]
pub struct Fetched {
    pub status: u16,
    /// The response body, in the caller's buffer.
    pub body: Vec<u8>,
    /// Attempts it took (1 = no retry), hedges included.
    pub attempts: u32,
    /// The answer came from a hedge.
    pub hedged: bool,
    /// From the start of the successful attempt to the response head.
    pub first_byte: Duration,
    /// From the start of the first attempt (not of the wait for a slot) to
    /// the last byte.
    pub total: Duration,
}

/// Where the loop sends a request's outcome; called once, on the loop thread.
pub type Reply = Box<dyn FnOnce(Result<Fetched, FetchError>) + Send>;

/// Why a GET failed for good.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    #[error("{addr}: {source}")]
    Io { addr: SocketAddr, source: std::io::Error },
    #[error("{0}")]
    Http(#[from] HttpError),
    #[error("HTTP {status}{}", if .detail.is_empty() { String::new() } else { format!(": {}", .detail) })]
    Status { status: u16, detail: String },
    #[error("no complete response within {0:?}")]
    Timeout(Duration),
    #[error("the server ignored the Range header or answered another range ({0})")]
    WrongRange(String),
    #[error("{addr}: TLS: {reason}")]
    Tls { addr: SocketAddr, reason: String },
    #[error("gave up after {attempts} attempts; last error: {last}")]
    Exhausted { attempts: u32, last: Box<FetchError> },
    /// The caller no longer wants the answer (see [`EventLoop::submit_cancellable`]).
    #[error("cancelled by the caller")]
    Cancelled,
}

impl FetchError {
    fn retryable(&self) -> bool {
        match self {
            FetchError::Io { .. } | FetchError::Timeout(_) => true,
            FetchError::Http(HttpError::Truncated { .. }) => true,
            FetchError::Status { status, .. } => *status >= 500 || *status == 429,
            _ => false,
        }
    }
}

/// Knobs of the loop.
#[derive(Debug, Clone)]
pub struct LoopOptions {
    /// Submission queue entries.
    pub ring_entries: u32,
    /// Requests in flight at most (a hard cap; see `concurrency`).
    pub max_in_flight: usize,
    /// Keep only as many requests in flight as the latency model says a
    /// target throughput needs (AnyBlob §2.4); `None` keeps `max_in_flight`.
    pub concurrency: Option<ConcurrencyTarget>,
    /// Largest single receive into a body buffer.
    pub recv_bytes: usize,
    /// Deadline of one attempt.
    pub attempt_timeout: Duration,
    /// An attempt with no response head after this long (or four times the
    /// first-byte hedging deadline, if longer) is cut and retried (a lost
    /// request: the paper's stores drop some without notice). The hedge
    /// usually answers sooner; this bounds the wait when the hedge budget
    /// is spent.
    pub first_byte_timeout: Duration,
    /// Attempts per request, the first included.
    pub max_attempts: u32,
    /// First retry back-off (doubles each time, with jitter).
    pub backoff: Duration,
    /// Resend requests that are late against their expected latency.
    pub hedge: Option<HedgePolicy>,
    /// Keep connections open for the next request (default). Off, every
    /// request gets its own connection.
    pub keep_alive: bool,
    /// Which kernel interface drives the sockets.
    pub backend: Backend,
    /// TLS settings for HTTPS requests (see [`crate::tls::client_config`]).
    pub tls: Option<Arc<rustls::ClientConfig>>,
    /// Where a GET of a range without a buffer of its own gets one when it
    /// goes on the wire (not earlier: queued requests hold no memory).
    pub buffers: Option<Arc<BufferPool>>,
}

/// The throughput the loop aims for and the memory it may use for it.
#[derive(Debug, Clone, Copy)]
pub struct ConcurrencyTarget {
    /// Bytes per second wanted: the link's bandwidth, or what the consumer
    /// can process.
    pub bytes_per_sec: f64,
    /// Bytes of response buffers in flight at most.
    pub memory: u64,
}

/// The kernel interface of the loop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// io_uring where available, else epoll (default).
    Auto,
    /// io_uring, or fail.
    IoUring,
    /// epoll readiness on non-blocking sockets (the fallback).
    Epoll,
}

/// When a request is late enough to send a duplicate (AnyBlob §2: for S3,
/// fewer than 5 % of 16 MiB requests take over 600 ms, fewer than 5 % wait
/// over 200 ms for the first byte). The first complete answer wins; the
/// other attempt is cancelled.
#[derive(Debug, Clone, Copy)]
pub struct HedgePolicy {
    /// No response head after this long: hedge.
    pub first_byte: Duration,
    /// Not complete after `first_byte + bytes × per_mib`: hedge.
    pub per_mib: Duration,
    /// Hedges allowed, as a share of the requests started (plus two, so
    /// a loop's first requests can be hedged too).
    pub max_share: f64,
    /// Replace the two deadlines by twice the recent p95s (at most eight
    /// times the medians) once enough requests have completed (never
    /// below [`HEDGE_FLOOR`]); `per_mib` is then not used at all: no
    /// per-MiB hedging until a few requests have shown the store's speed
    /// (see `LatencyModel::hedge_deadlines`).
    pub adaptive: bool,
}

/// The earliest an adaptive policy hedges: first byte, per MiB. Below these
/// a fast network's noise would be hedged.
pub const HEDGE_FLOOR: (Duration, Duration) = (Duration::from_millis(20), Duration::from_millis(2));

impl Default for HedgePolicy {
    fn default() -> Self {
        HedgePolicy { first_byte: Duration::from_millis(200), per_mib: Duration::from_micros(37_500), max_share: 0.05, adaptive: false }
    }
}

impl Default for LoopOptions {
    fn default() -> Self {
        LoopOptions {
            ring_entries: 1024,
            max_in_flight: 256,
            concurrency: None,
            recv_bytes: 1 << 20,
            attempt_timeout: Duration::from_secs(30),
            first_byte_timeout: Duration::from_secs(2),
            max_attempts: 4,
            backoff: Duration::from_millis(20),
            hedge: None,
            keep_alive: true,
            backend: Backend::Auto,
            tls: None,
            buffers: None,
        }
    }
}

/// Counters of a loop.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LoopStats {
    /// Requests finished (successfully or not).
    pub requests: u64,
    /// Requests that failed for good.
    pub failures: u64,
    /// Attempts beyond the first.
    pub retries: u64,
    /// Attempts cancelled at their deadline.
    pub timeouts: u64,
    /// Kept-alive connections found closed when reused (requests resent at
    /// once, not counted as retries).
    pub stale_connections: u64,
    /// Connections closed instead of pooled because their response was
    /// far later than the hedging deadlines.
    pub slow_connections_dropped: u64,
    /// Requests dropped because their caller gave up on them (a query
    /// that finished early): never started, or stopped mid-body.
    pub cancelled: u64,
    /// Duplicate attempts sent for late requests.
    pub hedges: u64,
    /// Requests whose hedge answered first.
    pub hedges_won: u64,
    /// Body bytes received.
    pub body_bytes: u64,
    /// Response bytes as they arrived (heads, bodies, duplicates of hedges):
    /// what the link carried, without waiting for requests to complete.
    pub received_bytes: u64,
    /// Body bytes sent (PUT).
    pub sent_bytes: u64,
    /// Most requests in flight at once.
    pub max_in_flight: usize,
    /// `io_uring_enter` (or `epoll_wait`) calls.
    pub submits: u64,
    /// Completions reaped.
    pub completions: u64,
    /// Connections opened / reused from the pool.
    pub connects: u64,
    pub reuses: u64,
    /// Head of each successful request's answering attempt.
    pub first_byte: Histogram,
    /// Whole successful requests, from their first attempt.
    pub total: Histogram,
}

impl LoopStats {
    /// Adds another loop's counters (several loop threads, one report).
    pub fn merge(&mut self, o: &LoopStats) {
        self.requests += o.requests;
        self.failures += o.failures;
        self.retries += o.retries;
        self.timeouts += o.timeouts;
        self.cancelled += o.cancelled;
        self.stale_connections += o.stale_connections;
        self.slow_connections_dropped += o.slow_connections_dropped;
        self.hedges += o.hedges;
        self.hedges_won += o.hedges_won;
        self.body_bytes += o.body_bytes;
        self.received_bytes += o.received_bytes;
        self.sent_bytes += o.sent_bytes;
        self.max_in_flight += o.max_in_flight;
        self.submits += o.submits;
        self.completions += o.completions;
        self.connects += o.connects;
        self.reuses += o.reuses;
        self.first_byte.merge(&o.first_byte);
        self.total.merge(&o.total);
    }
}

const TICK: u64 = u64::MAX;
const WAKE: u64 = u64::MAX - 1;
/// A late hedge may itself be hedged, up to this many per request.
const MAX_HEDGES_PER_REQUEST: u8 = 4;
/// Hedges allowed beyond the share: a loop's first requests would otherwise
/// have a budget of one, and a lost request after one early hedge waited
/// for the attempt timeout (seen on the s3-scaled testbed: a 31 s query).
const HEDGE_ALLOWANCE: u64 = 2;
const CANCEL: u64 = 1 << 62;
const HEAD_BUFFER: usize = 64 << 10;
/// Ticks per epoch of the link probe (half a second).
const PROBE_TICKS: u32 = 10;
/// Requests in flight a model-driven loop starts with.
const INITIAL_RAMP: usize = 16;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Connect,
    /// TLS handshake (HTTPS only).
    Handshake,
    Send,
    RecvHead,
    RecvBody,
}

/// One attempt of a request (a request has several while a hedge races
/// the original, or one after another when retried).
struct Task {
    /// The request this attempt belongs to (index into `EventLoop::requests`).
    id: usize,
    req: Request,
    attempt: u32,
    /// This attempt runs on a kept-alive connection from the pool.
    reused: bool,
    first_started: Instant,
    attempt_started: Instant,
    deadline: Instant,
    not_before: Instant,
    socket: Option<Socket>,
    sockaddr: Box<SockAddr>,
    phase: Phase,
    head_out: Vec<u8>,
    sent: usize,
    head: Vec<u8>,
    filled: usize,
    response: Option<ResponseHead>,
    decoder: Option<BodyDecoder>,
    first_byte: Duration,
    cancelling: bool,
    /// Cancelled because a sibling attempt answered first: drop, never retry.
    abandoned: bool,
    /// This attempt is a hedge (a duplicate of a late one).
    is_hedge: bool,
    /// This attempt was late and has a hedge racing it already.
    spawned_hedge: bool,
    /// The TLS session of an HTTPS attempt.
    tls: Option<TlsState>,
}

/// A request across its attempts.
struct Pending {
    /// Taken when the outcome is decided.
    reply: Option<Reply>,
    /// Attempts alive (running or waiting to run).
    live: u8,
    hedges: u8,
    /// Set by the caller when it no longer wants the answer.
    cancel: Option<Arc<AtomicBool>>,
}

enum Driver {
    Uring(IoUring),
    Epoll(crate::epoll::EpollDriver),
}

/// A single-threaded event loop holding many requests in flight. Requests
/// are submitted with [`EventLoop::submit`] and run by [`EventLoop::turn`];
/// [`EventLoop::fetch_all`] does both for a batch. The download manager runs
/// one per thread, woken through an eventfd when requests arrive.
pub struct EventLoop {
    driver: Driver,
    opts: LoopOptions,
    /// Idle kept-alive connections by address and TLS.
    idle: HashMap<(SocketAddr, bool), Vec<(Socket, Option<Box<rustls::ClientConnection>>)>>,
    stats: LoopStats,
    limits: Limits,
    generation: u64,
    tick: Box<types::Timespec>,
    tick_armed: bool,
    rng: u64,
    /// Head buffers of finished requests, reused by the next ones.
    head_pool: Vec<Vec<u8>>,
    requests: Vec<Option<Pending>>,
    free_requests: Vec<usize>,
    /// Attempts waiting to start (new, retries after back-off, hedges).
    waiting: VecDeque<Box<Task>>,
    slots: Vec<Option<(u64, Box<Task>)>>,
    free_slots: Vec<usize>,
    in_flight: usize,
    /// Attempts started and hedges sent: the hedge budget is a share of them.
    started: u64,
    hedges_sent: u64,
    model: LatencyModel,
    probe: LinkProbe,
    /// Requests in flight allowed so far (doubles each epoch the link
    /// keeps up, so the probe sees each level on the way up).
    ramp: usize,
    /// Ticks, in-flight sum and body bytes at the start of the probe's epoch.
    epoch: (u32, usize, u64),
    /// The current hedging deadlines (from the policy or the model).
    hedge_deadlines: (Duration, Duration),
    wake: Option<Wake>,
}

/// An eventfd that other threads write to wake the loop, and the 8-byte
/// buffer the ring reads it into.
struct Wake {
    fd: RawFd,
    buf: Box<u64>,
    armed: bool,
}

impl EventLoop {
    /// A loop with its own ring (or epoll set, see [`Backend`]).
    pub fn new(opts: LoopOptions) -> std::io::Result<EventLoop> {
        let uring = || IoUring::builder().setup_cqsize(opts.ring_entries * 4).build(opts.ring_entries);
        let driver = match opts.backend {
            Backend::IoUring => Driver::Uring(uring()?),
            Backend::Epoll => Driver::Epoll(crate::epoll::EpollDriver::new()?),
            // io_uring may be missing (old kernel) or forbidden (seccomp,
            // kernel.io_uring_disabled): fall back to epoll.
            Backend::Auto => match uring() {
                Ok(ring) => Driver::Uring(ring),
                Err(_) => Driver::Epoll(crate::epoll::EpollDriver::new()?),
            },
        };
        let hedge_deadlines = opts.hedge.map(|h| (h.first_byte, h.per_mib)).unwrap_or_default();
        Ok(EventLoop {
            driver,
            opts,
            idle: HashMap::new(),
            stats: LoopStats::default(),
            limits: Limits::default(),
            generation: 0,
            tick: Box::new(types::Timespec::new().nsec(50_000_000)),
            tick_armed: false,
            rng: 0x2545_F491_4F6C_DD1D,
            head_pool: Vec::new(),
            requests: Vec::new(),
            free_requests: Vec::new(),
            waiting: VecDeque::new(),
            slots: Vec::new(),
            free_slots: Vec::new(),
            in_flight: 0,
            started: 0,
            hedges_sent: 0,
            model: LatencyModel::default(),
            probe: LinkProbe::default(),
            ramp: INITIAL_RAMP,
            epoch: (0, 0, 0),
            hedge_deadlines,
            wake: None,
        })
    }

    /// The kernel interface in use.
    pub fn backend(&self) -> Backend {
        match self.driver {
            Driver::Uring(_) => Backend::IoUring,
            Driver::Epoll(_) => Backend::Epoll,
        }
    }

    /// Counters so far.
    pub fn stats(&self) -> &LoopStats {
        &self.stats
    }

    /// The link probe's cap on requests in flight, if the link looked full.
    pub fn link_cap(&self) -> Option<usize> {
        self.probe.cap()
    }

    /// What the loop has learned about the store's latencies.
    pub fn model(&self) -> &LatencyModel {
        &self.model
    }

    /// Requests submitted and not yet answered.
    pub fn pending(&self) -> usize {
        self.requests.len() - self.free_requests.len()
    }

    /// Requests in flight now.
    pub fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// Lets [`EventLoop::turn`] return when `fd` (an eventfd) is written,
    /// even while requests are in flight. The caller owns the descriptor.
    pub fn wake_on(&mut self, fd: RawFd) -> std::io::Result<()> {
        if let Driver::Epoll(epoll) = &mut self.driver {
            epoll.watch(fd, WAKE)?;
        }
        self.wake = Some(Wake { fd, buf: Box::new(0), armed: false });
        Ok(())
    }

    /// Queues a request; `reply` gets its outcome from a later `turn`.
    pub fn submit(&mut self, req: Request, reply: Reply) {
        self.submit_cancellable(req, reply, None);
    }

    /// Like [`EventLoop::submit`], and once `cancel` is set the request is
    /// dropped: not started if it still waits, its connection closed within
    /// a tick if it is on the wire. `reply` then gets
    /// [`FetchError::Cancelled`]. This is how a query that finishes early
    /// (LIMIT, an error elsewhere) stops paying for bytes it will not read.
    pub fn submit_cancellable(&mut self, req: Request, reply: Reply, cancel: Option<Arc<AtomicBool>>) {
        let now = Instant::now();
        self.model.submitted(req.payload_bytes());
        let pending = Pending { reply: Some(reply), live: 1, hedges: 0, cancel };
        let id = match self.free_requests.pop() {
            Some(id) => {
                self.requests[id] = Some(pending);
                id
            }
            None => {
                self.requests.push(Some(pending));
                self.requests.len() - 1
            }
        };
        self.waiting.push_back(Box::new(Task::fresh(id, req, now)));
    }

    /// Runs all `requests` to completion; results come back in their order.
    pub fn fetch_all(&mut self, requests: Vec<Request>) -> std::io::Result<Vec<Result<Fetched, FetchError>>> {
        let (tx, rx) = std::sync::mpsc::channel();
        let n = requests.len();
        for (i, req) in requests.into_iter().enumerate() {
            let tx = tx.clone();
            self.submit(req, Box::new(move |r| drop(tx.send((i, r)))));
        }
        drop(tx);
        while self.pending() > 0 {
            self.turn()?;
        }
        let mut results: Vec<Option<Result<Fetched, FetchError>>> = (0..n).map(|_| None).collect();
        for (i, r) in rx.try_iter() {
            results[i] = Some(r);
        }
        Ok(results.into_iter().map(|r| r.expect("every request is answered")).collect())
    }

    /// How many requests may be in flight now.
    fn limit(&self) -> usize {
        match self.opts.concurrency {
            None => self.opts.max_in_flight,
            Some(c) => self.model.in_flight(c.bytes_per_sec, c.memory, self.opts.max_in_flight).min(self.probe.cap().unwrap_or(usize::MAX)).min(self.ramp),
        }
    }

    /// One iteration: start what may start, submit, wait for at least one
    /// completion (or a tick, or a wake-up), and apply what completed.
    /// Returns at once when there is nothing to do and no wake-up is set.
    pub fn turn(&mut self) -> std::io::Result<()> {
        let now = Instant::now();
        let limit = self.limit();
        let mut deferred = VecDeque::new();
        let answered_before = self.stats.cancelled;
        while self.in_flight < limit {
            let Some(mut task) = self.waiting.pop_front() else { break };
            if self.cancelled(task.id) {
                self.decide_cancelled(task.id);
            }
            if self.decided(task.id) {
                // A hedge or retry whose sibling already answered.
                self.release(task.id);
                continue;
            }
            if task.not_before > now {
                deferred.push_back(task);
                continue;
            }
            if task.attempt == 0 {
                // A request's latency starts with its first attempt, not
                // with the time it waited for a slot.
                task.first_started = now;
            }
            if let (Some(pool), Some(range), 0) = (&self.opts.buffers, &task.req.range, task.req.buffer.capacity()) {
                task.req.buffer = pool.take((range.end - range.start) as usize);
            }
            task.attempt_started = now;
            task.deadline = now + self.opts.attempt_timeout;
            if let Err(e) = self.begin(&mut task) {
                // Could not even create a socket: fail this attempt.
                self.attempt_failed(task, e);
                continue;
            }
            let slot = self.free_slots.pop().unwrap_or_else(|| {
                self.slots.push(None);
                self.slots.len() - 1
            });
            self.generation += 1;
            let generation_id = self.generation & 0x3FFF_FFFF;
            self.slots[slot] = Some((generation_id, task));
            self.in_flight += 1;
            self.started += 1;
            self.stats.max_in_flight = self.stats.max_in_flight.max(self.in_flight);
            self.push_next(slot, generation_id)?;
        }
        self.waiting.extend(deferred);
        let busy = self.in_flight > 0 || !self.waiting.is_empty();
        // Nothing to wait for: return, also when requests were just
        // answered here (cancelled ones), so the caller sees the loop idle
        // before the next turn sleeps until woken.
        if !busy && (self.wake.is_none() || self.stats.cancelled != answered_before) {
            return Ok(());
        }
        let completions = self.wait(busy)?;
        self.stats.completions += completions.len() as u64;
        for (user_data, result) in completions {
            match user_data {
                TICK => self.on_tick()?,
                WAKE => {
                    if let Some(w) = &mut self.wake {
                        w.armed = false;
                    }
                }
                u if u & CANCEL != 0 => {}
                u => self.on_completion(u, result)?,
            }
        }
        Ok(())
    }

    /// Whether the caller of request `id` gave up on it.
    fn cancelled(&self, id: usize) -> bool {
        self.requests[id].as_ref().and_then(|p| p.cancel.as_ref()).is_some_and(|c| c.load(Ordering::Relaxed))
    }

    /// Answers a cancelled request (once); its attempts are then dropped.
    fn decide_cancelled(&mut self, id: usize) {
        if let Some(reply) = self.requests[id].as_mut().and_then(|p| p.reply.take()) {
            self.stats.cancelled += 1;
            reply(Err(FetchError::Cancelled));
        }
    }

    fn decided(&self, id: usize) -> bool {
        self.requests[id].as_ref().is_none_or(|p| p.reply.is_none())
    }

    /// An attempt of request `id` is gone; the request's slot is free once
    /// its last attempt is.
    fn release(&mut self, id: usize) {
        let p = self.requests[id].as_mut().expect("a live request");
        p.live -= 1;
        if p.live == 0 {
            debug_assert!(p.reply.is_none(), "a request with no attempts left must be answered");
            self.requests[id] = None;
            self.free_requests.push(id);
        }
    }

    /// Answers request `id`.
    fn decide(&mut self, id: usize, outcome: Result<Fetched, FetchError>) {
        let reply = self.requests[id].as_mut().and_then(|p| p.reply.take()).expect("decided once");
        self.stats.requests += 1;
        match &outcome {
            Ok(f) => {
                self.stats.first_byte.record(f.first_byte);
                self.stats.total.record(f.total);
            }
            Err(_) => self.stats.failures += 1,
        }
        reply(outcome);
    }

    /// Every 50 ms: cancel attempts past their deadline, hedge late ones,
    /// and every half second let the link probe see what arrived.
    fn on_tick(&mut self) -> std::io::Result<()> {
        self.tick_armed = false;
        let now = Instant::now();
        if self.opts.concurrency.is_some() {
            // Only epochs in which the limit held requests back say
            // anything about the link; others are reset.
            if self.waiting.is_empty() {
                self.epoch = (0, 0, self.stats.received_bytes);
            } else {
                self.epoch.0 += 1;
                self.epoch.1 += self.in_flight;
                if self.epoch.0 == PROBE_TICKS {
                    let secs = PROBE_TICKS as f64 * 0.05;
                    let rate = (self.stats.received_bytes - self.epoch.2) as f64 / secs;
                    if self.probe.epoch(self.epoch.1 / PROBE_TICKS as usize, rate).is_none() {
                        // The limit held requests back and the link took
                        // all it was given: allow twice as many.
                        self.ramp = self.ramp.saturating_mul(2);
                    }
                    self.epoch = (0, 0, self.stats.received_bytes);
                }
            }
        }
        if let Some(policy) = self.opts.hedge
            && policy.adaptive
        {
            self.hedge_deadlines = self.model.hedge_deadlines((policy.first_byte, policy.per_mib), HEDGE_FLOOR);
        }
        let mut hedges = Vec::new();
        let mut cancels = Vec::new();
        let mut given_up = Vec::new();
        // Never below four times the first-byte hedging deadline: when the
        // store answers slowly across the board (a burst of hundreds of
        // requests to a loaded server), cutting heads that are merely late
        // only adds load; the timeout is for requests that are lost.
        let first_byte_timeout = self.opts.first_byte_timeout.max(self.hedge_deadlines.0 * 4);
        let mut live_hedges = self.slots.iter().flatten().filter(|(_, t)| t.is_hedge && !t.cancelling).count() as u64 + self.waiting.iter().filter(|t| t.is_hedge).count() as u64;
        for (slot, entry) in self.slots.iter_mut().enumerate() {
            let Some((generation_id, task)) = entry else { continue };
            if task.cancelling {
                continue;
            }
            let caller_gone = self.requests[task.id].as_ref().and_then(|p| p.cancel.as_ref()).is_some_and(|c| c.load(Ordering::Relaxed));
            if caller_gone {
                task.cancelling = true;
                task.abandoned = true;
                given_up.push(task.id);
                cancels.push(user_data_of(slot, *generation_id));
                continue;
            }
            let headless = task.response.is_none() && now.duration_since(task.attempt_started) > first_byte_timeout;
            if now > task.deadline || headless {
                task.cancelling = true;
                cancels.push(user_data_of(slot, *generation_id));
                continue;
            }
            let Some(policy) = self.opts.hedge else { continue };
            // No hedge storms: when everything is late at once (the store
            // slowed down, not one connection), hedges cannot win.
            if live_hedges >= (policy.max_share * self.in_flight as f64).ceil() as u64 + HEDGE_ALLOWANCE {
                continue;
            }
            let budget = (policy.max_share * self.started as f64).floor() as u64 + if policy.max_share > 0.0 { HEDGE_ALLOWANCE } else { 0 };
            let pending = self.requests[task.id].as_mut().expect("a running attempt's request");
            if !task.spawned_hedge && pending.hedges < MAX_HEDGES_PER_REQUEST && self.hedges_sent < budget && task.is_late(self.hedge_deadlines, now) {
                task.spawned_hedge = true;
                pending.hedges += 1;
                pending.live += 1;
                self.hedges_sent += 1;
                self.stats.hedges += 1;
                live_hedges += 1;
                hedges.push(task.hedge_of(now));
            }
        }
        for id in given_up {
            self.decide_cancelled(id);
        }
        for c in cancels {
            self.cancel(c)?;
        }
        // Hedges go first: they are late already.
        for h in hedges {
            self.waiting.push_front(Box::new(h));
        }
        Ok(())
    }

    fn on_completion(&mut self, user_data: u64, result: i32) -> std::io::Result<()> {
        let (slot, generation_id) = split_user_data(user_data);
        let Some(Some((slot_gen, _))) = self.slots.get(slot) else { return Ok(()) };
        if *slot_gen != generation_id {
            return Ok(());
        }
        let (_, mut task) = self.slots[slot].take().expect("checked");
        match self.advance(&mut task, result) {
            Step::Continue => {
                self.slots[slot] = Some((generation_id, task));
                self.push_next(slot, generation_id)?;
            }
            Step::Done(outcome) => {
                self.in_flight -= 1;
                self.free_slots.push(slot);
                let id = task.id;
                let decided = self.decided(id);
                let others_alive = self.requests[id].as_ref().is_some_and(|p| p.live > 1);
                match outcome {
                    Ok(fetched) if !decided => {
                        self.head_pool.push(std::mem::take(&mut task.head));
                        self.stats.body_bytes += fetched.body.len() as u64;
                        if let Method::Put(body) = &task.req.method {
                            self.stats.sent_bytes += body.len() as u64;
                        }
                        if task.is_hedge {
                            self.stats.hedges_won += 1;
                        }
                        self.model.observe(task.req.payload_bytes(), fetched.first_byte, task.attempt_started.elapsed());
                        self.decide(id, Ok(fetched));
                        self.release(id);
                        // Cancel the siblings still racing for this request.
                        let mut cancels = Vec::new();
                        for (other, entry) in self.slots.iter_mut().enumerate() {
                            if let Some((generation_id, t)) = entry
                                && t.id == id
                                && !t.cancelling
                            {
                                t.cancelling = true;
                                t.abandoned = true;
                                cancels.push(user_data_of(other, *generation_id));
                            }
                        }
                        for c in cancels {
                            self.cancel(c)?;
                        }
                    }
                    // The loser of a race, or a failed attempt whose sibling
                    // is still running: nothing more to do for it.
                    _ if decided || task.abandoned || others_alive => {
                        self.head_pool.push(std::mem::take(&mut task.head));
                        self.release(id);
                    }
                    Ok(_) => unreachable!("an undecided success is handled above"),
                    Err(e) => self.attempt_failed(task, e),
                }
            }
        }
        Ok(())
    }

    /// Prepares an attempt: a pooled connection or a new socket, the request bytes.
    fn begin(&mut self, task: &mut Task) -> Result<(), FetchError> {
        task.attempt += 1;
        task.cancelling = false;
        task.sent = 0;
        task.filled = 0;
        task.response = None;
        task.decoder = None;
        task.head_out.clear();
        let range = task.req.range.as_ref().map(range_header);
        let headers: Vec<(&str, &str)> = range.as_deref().map(|r| vec![("Range", r)]).unwrap_or_default();
        let (method, length) = match &task.req.method {
            Method::Get => ("GET", None),
            Method::Put(body) => ("PUT", Some(body.len() as u64)),
        };
        write_request(&mut task.head_out, method, &task.req.host, &task.req.target, &headers, length)?;
        if task.head.len() < HEAD_BUFFER {
            task.head = self.head_pool.pop().unwrap_or_else(|| vec![0; HEAD_BUFFER]);
        }
        // Retries always use a fresh connection: the old one may be the problem.
        let pooled = if task.attempt == 1 { self.idle.get_mut(&(task.req.addr, task.req.tls)).and_then(Vec::pop) } else { None };
        task.tls = None;
        match pooled {
            Some((socket, conn)) => {
                self.stats.reuses += 1;
                task.reused = true;
                task.socket = Some(socket);
                task.tls = conn.map(TlsState::new);
                task.phase = Phase::Send;
            }
            None => {
                task.reused = false;
                let addr = task.req.addr;
                if task.req.tls {
                    let config = self.opts.tls.as_ref().ok_or_else(|| FetchError::Tls { addr, reason: "an https request, but the loop has no TLS configuration".into() })?;
                    let conn = crate::tls::connect(config, task.req.server_name()).map_err(|reason| FetchError::Tls { addr, reason })?;
                    task.tls = Some(TlsState::new(conn));
                }
                let io = |source| FetchError::Io { addr, source };
                let socket = Socket::new(Domain::for_address(addr), Type::STREAM.cloexec(), None).map_err(io)?;
                let _ = socket.set_tcp_nodelay(true);
                if matches!(self.driver, Driver::Epoll(_)) {
                    socket.set_nonblocking(true).map_err(io)?;
                }
                self.stats.connects += 1;
                task.socket = Some(socket);
                task.phase = Phase::Connect;
            }
        }
        Ok(())
    }

    fn push(&mut self, entry: &io_uring::squeue::Entry) -> std::io::Result<()> {
        let Driver::Uring(ring) = &mut self.driver else { unreachable!("io_uring entries only go to a ring") };
        loop {
            // SAFETY: every buffer an entry points to lives in a boxed task
            // (or the loop) until its completion is reaped.
            if unsafe { ring.submission().push(entry) }.is_ok() {
                return Ok(());
            }
            ring.submit()?;
            self.stats.submits += 1;
        }
    }

    /// Submits what is queued and returns completions, ticks (when `tick`)
    /// and wake-ups.
    fn wait(&mut self, tick: bool) -> std::io::Result<Vec<(u64, i32)>> {
        if let Driver::Epoll(epoll) = &mut self.driver {
            self.stats.submits += 1;
            return epoll.wait(tick.then_some(Duration::from_millis(50)), TICK);
        }
        if tick && !self.tick_armed {
            let entry = opcode::Timeout::new(&*self.tick as *const types::Timespec).build().user_data(TICK);
            self.push(&entry)?;
            self.tick_armed = true;
        }
        if let Some(w) = &self.wake
            && !w.armed
        {
            let entry = opcode::Read::new(types::Fd(w.fd), &*w.buf as *const u64 as *mut u8, 8).build().user_data(WAKE);
            self.push(&entry)?;
            self.wake.as_mut().expect("checked").armed = true;
        }
        let Driver::Uring(ring) = &mut self.driver else { unreachable!() };
        ring.submit_and_wait(1)?;
        self.stats.submits += 1;
        Ok(ring.completion().map(|c| (c.user_data(), c.result())).collect())
    }

    /// Cancels the operation tagged `user_data`; it completes with -ECANCELED.
    fn cancel(&mut self, user_data: u64) -> std::io::Result<()> {
        match &mut self.driver {
            Driver::Epoll(epoll) => {
                epoll.cancel(user_data);
                Ok(())
            }
            Driver::Uring(_) => self.push(&opcode::AsyncCancel::new(user_data).build().user_data(CANCEL)),
        }
    }

    fn push_next(&mut self, slot: usize, generation_id: u64) -> std::io::Result<()> {
        use crate::epoll::Op;
        let recv_bytes = self.opts.recv_bytes;
        let task = self.slots[slot].as_mut().map(|(_, t)| t.as_mut()).expect("a running attempt");
        let raw = task.socket.as_ref().expect("attempt has a socket").as_raw_fd();
        let op = match task.phase {
            Phase::Connect => Op::Connect { addr: task.sockaddr.as_ptr() as *const libc::sockaddr, len: task.sockaddr.len() },
            _ if task.tls.is_some() => Self::tls_op(task),
            Phase::Handshake => unreachable!("only TLS attempts shake hands"),
            Phase::Send => {
                // The head, then (PUT) the body straight from the caller's bytes.
                let rest = match &task.req.method {
                    _ if task.sent < task.head_out.len() => &task.head_out[task.sent..],
                    Method::Put(body) => &body[task.sent - task.head_out.len()..],
                    Method::Get => unreachable!("a GET is sent once its head is"),
                };
                Op::Send { ptr: rest.as_ptr(), len: rest.len().min(recv_bytes) }
            }
            Phase::RecvHead => {
                let spare = &mut task.head[task.filled..];
                Op::Recv { ptr: spare.as_mut_ptr(), len: spare.len(), wait_all: false }
            }
            Phase::RecvBody => {
                let body = &mut task.req.buffer;
                // With a known length, ask for the whole rest (up to
                // `recv_bytes`) and let the kernel complete only when it is
                // all there: one completion per `recv_bytes`, not one per
                // batch of TCP segments.
                let (want, wait_all) = match task.response.as_ref().map(|h| h.framing) {
                    Some(Framing::Length(n)) => ((n as usize).saturating_sub(body.len()).max(1), true),
                    _ => (recv_bytes, false),
                };
                let want = want.min(recv_bytes);
                body.reserve(want);
                let spare = body.spare_capacity_mut();
                let len = if wait_all { want } else { spare.len().min(recv_bytes) };
                Op::Recv { ptr: spare.as_mut_ptr() as *mut u8, len, wait_all }
            }
        };
        let user_data = user_data_of(slot, generation_id);
        if let Driver::Epoll(epoll) = &mut self.driver {
            return epoll.issue(user_data, raw, op);
        }
        let fd = types::Fd(raw);
        let entry = match op {
            Op::Connect { addr, len } => opcode::Connect::new(fd, addr, len).build(),
            Op::Send { ptr, len } => opcode::Send::new(fd, ptr, len as u32).flags(libc::MSG_NOSIGNAL).build(),
            Op::Recv { ptr, len, wait_all } => opcode::Recv::new(fd, ptr, len as u32).flags(if wait_all { libc::MSG_WAITALL } else { 0 }).build(),
        };
        self.push(&entry.user_data(user_data))
    }

    /// The next socket operation of a TLS attempt: send what rustls has to
    /// send, feed it the next piece of the request, or receive ciphertext.
    fn tls_op(task: &mut Task) -> crate::epoll::Op {
        use crate::epoll::Op;
        let plain_total = task.head_out.len() + task.req.payload_sent();
        let tls = task.tls.as_mut().expect("a TLS attempt");
        let send = |tls: &mut TlsState| {
            tls.sending = true;
            let rest = &tls.buf[tls.sent..];
            Op::Send { ptr: rest.as_ptr(), len: rest.len() }
        };
        if tls.sending && tls.sent < tls.buf.len() {
            return send(tls);
        }
        tls.sending = false;
        if task.phase == Phase::Send && task.sent < plain_total {
            // Hand rustls the next piece of the request; send its records.
            let piece = match &task.req.method {
                _ if task.sent < task.head_out.len() => &task.head_out[task.sent..],
                Method::Put(body) => &body[task.sent - task.head_out.len()..],
                Method::Get => unreachable!("a GET is sent once its head is"),
            };
            let piece = &piece[..piece.len().min(crate::tls::TLS_SEND)];
            if let Ok(n) = std::io::Write::write(&mut tls.conn.writer(), piece) {
                task.sent += n;
            }
        }
        if tls.fill_outgoing() {
            return send(tls);
        }
        tls.buf.resize(crate::tls::TLS_RECV, 0);
        Op::Recv { ptr: tls.buf.as_mut_ptr(), len: tls.buf.len(), wait_all: false }
    }

    /// Applies one completion of a TLS attempt (after Connect).
    fn advance_tls(&mut self, task: &mut Task, n: usize) -> Step {
        let addr = task.req.addr;
        let plain_total = task.head_out.len() + task.req.payload_sent();
        let tls = task.tls.as_mut().expect("a TLS attempt");
        if tls.sending {
            tls.sent += n;
            if tls.sent == tls.buf.len() {
                tls.sending = false;
                if task.phase == Phase::Send && task.sent == plain_total && !tls.conn.wants_write() {
                    task.phase = Phase::RecvHead;
                }
            }
            return Step::Continue;
        }
        if n == 0 {
            if task.phase == Phase::Handshake {
                return Step::Done(Err(FetchError::Tls { addr, reason: "the server closed the connection during the handshake".into() }));
            }
            return self.received(task, 0);
        }
        // Feed the ciphertext to rustls and move the plaintext out as it
        // comes: rustls holds only a little plaintext at a time.
        let cipher = std::mem::take(&mut tls.buf);
        let mut rest = &cipher[..n];
        let mut step = Step::Continue;
        'feed: while !rest.is_empty() {
            let tls = task.tls.as_mut().expect("a TLS attempt");
            if let Err(e) = tls.conn.read_tls(&mut rest) {
                step = Step::Done(Err(FetchError::Tls { addr, reason: e.to_string() }));
                break;
            }
            if let Err(e) = tls.conn.process_new_packets() {
                step = Step::Done(Err(FetchError::Tls { addr, reason: e.to_string() }));
                break;
            }
            if task.phase == Phase::Handshake {
                if !tls.conn.is_handshaking() {
                    task.phase = Phase::Send;
                }
                continue;
            }
            loop {
                let k = match task.phase {
                    Phase::RecvHead => {
                        let spare = &mut task.head[task.filled..];
                        std::io::Read::read(&mut task.tls.as_mut().expect("TLS").conn.reader(), spare)
                    }
                    Phase::RecvBody => {
                        let body = &mut task.req.buffer;
                        let old = body.len();
                        body.resize(old + (64 << 10), 0);
                        let r = std::io::Read::read(&mut task.tls.as_mut().expect("TLS").conn.reader(), &mut body[old..]);
                        // `received` takes the new bytes from beyond the length.
                        body.truncate(old);
                        r
                    }
                    _ => break,
                };
                match k {
                    Ok(0) => {
                        step = self.received(task, 0);
                        break 'feed;
                    }
                    Ok(k) => {
                        if let Step::Done(outcome) = self.received(task, k) {
                            step = Step::Done(outcome);
                            break 'feed;
                        }
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                        step = self.received(task, 0);
                        break 'feed;
                    }
                    Err(e) => {
                        step = Step::Done(Err(FetchError::Tls { addr, reason: e.to_string() }));
                        break 'feed;
                    }
                }
            }
        }
        if let Some(tls) = task.tls.as_mut() {
            tls.buf = cipher;
        }
        step
    }

    /// Applies one completion to a task.
    fn advance(&mut self, task: &mut Task, result: i32) -> Step {
        let addr = task.req.addr;
        if task.cancelling {
            // Abandoned (deadline passed, or a sibling answered first),
            // whether or not the cancel won the race with the operation.
            if !task.abandoned {
                self.stats.timeouts += 1;
            }
            return Step::Done(Err(FetchError::Timeout(self.opts.attempt_timeout)));
        }
        if result < 0 {
            return Step::Done(Err(FetchError::Io { addr, source: std::io::Error::from_raw_os_error(-result) }));
        }
        let n = result as usize;
        match task.phase {
            Phase::Connect => {
                task.phase = if task.tls.is_some() { Phase::Handshake } else { Phase::Send };
                Step::Continue
            }
            _ if task.tls.is_some() => self.advance_tls(task, n),
            Phase::Handshake => unreachable!("only TLS attempts shake hands"),
            Phase::Send => {
                task.sent += n;
                let body = match &task.req.method {
                    Method::Put(b) => b.len(),
                    Method::Get => 0,
                };
                if task.sent == task.head_out.len() + body {
                    task.phase = Phase::RecvHead;
                }
                Step::Continue
            }
            Phase::RecvHead | Phase::RecvBody => self.received(task, n),
        }
    }

    /// `n` bytes of the response arrived in place (head buffer or body
    /// spare capacity); `n == 0` is the end of the stream.
    fn received(&mut self, task: &mut Task, n: usize) -> Step {
        let addr = task.req.addr;
        match task.phase {
            Phase::Connect | Phase::Handshake | Phase::Send => unreachable!("nothing is received before the request is sent"),
            Phase::RecvHead => {
                if n == 0 {
                    return Step::Done(Err(FetchError::Io { addr, source: std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "connection closed before the response") }));
                }
                task.filled += n;
                self.stats.received_bytes += n as u64;
                let parsed = match parse_head(&task.head[..task.filled], &self.limits, false) {
                    Ok(p) => p,
                    Err(e) => return Step::Done(Err(e.into())),
                };
                let Some((head, used)) = parsed else {
                    return Step::Continue;
                };
                task.first_byte = task.attempt_started.elapsed();
                let mut decoder = BodyDecoder::new(head.framing);
                let body = &mut task.req.buffer;
                body.clear();
                if let Framing::Length(len) = head.framing {
                    body.reserve(len as usize);
                }
                let extra = task.filled - used;
                body.extend_from_slice(&task.head[used..task.filled]);
                match decoder.decode(&mut body[..]) {
                    Ok(d) if d.consumed < extra => return Step::Done(Err(HttpError::Malformed("bytes after the end of the body".into()).into())),
                    Ok(d) => body.truncate(d.payload),
                    Err(e) => return Step::Done(Err(e.into())),
                }
                task.response = Some(head);
                let done = decoder.is_done();
                task.decoder = Some(decoder);
                if done {
                    Step::Done(self.finish(task))
                } else {
                    task.phase = Phase::RecvBody;
                    Step::Continue
                }
            }
            Phase::RecvBody => {
                let decoder = task.decoder.as_mut().expect("head parsed");
                let body = &mut task.req.buffer;
                if n == 0 {
                    return match decoder.finish_at_eof() {
                        Ok(()) => Step::Done(self.finish(task)),
                        Err(e) => Step::Done(Err(e.into())),
                    };
                }
                let old = body.len();
                // SAFETY: the kernel wrote `n` bytes into the spare capacity
                // this recv was given.
                unsafe { body.set_len(old + n) };
                self.stats.received_bytes += n as u64;
                match decoder.decode(&mut body[old..]) {
                    Ok(d) if d.consumed < n => return Step::Done(Err(HttpError::Malformed("bytes after the end of the body".into()).into())),
                    Ok(d) => body.truncate(old + d.payload),
                    Err(e) => return Step::Done(Err(e.into())),
                }
                if decoder.is_done() { Step::Done(self.finish(task)) } else { Step::Continue }
            }
        }
    }

    /// A whole response arrived: pool the connection, check status and range.
    fn finish(&mut self, task: &mut Task) -> Result<Fetched, FetchError> {
        let head = task.response.as_ref().expect("head parsed");
        let socket = task.socket.take().expect("attempt has a socket");
        let conn = task.tls.take().map(|t| t.conn);
        // A connection that served this response far slower than the store
        // usually answers is not kept: a slow connection (a stalled path, a
        // slow server behind the balancer) stays slow, and pooled it would
        // make every later request on it late too.
        let (first_byte, per_mib) = self.hedge_deadlines;
        let slow = self.opts.hedge.is_some() && task.is_late((first_byte * 2, per_mib * 2), Instant::now());
        if slow {
            self.stats.slow_connections_dropped += 1;
        }
        if head.keep_alive && self.opts.keep_alive && !slow {
            self.idle.entry((task.req.addr, task.req.tls)).or_default().push((socket, conn));
        }
        let status = head.status;
        if !(200..300).contains(&status) {
            let detail = String::from_utf8_lossy(&task.req.buffer[..task.req.buffer.len().min(300)]).trim().to_string();
            return Err(FetchError::Status { status, detail });
        }
        if let Some(range) = &task.req.range {
            let got = head.header("content-range").map(parse_content_range);
            match got {
                Some(Ok((r, _))) if status == 206 && r == *range && task.req.buffer.len() as u64 == range.end - range.start => {}
                Some(Ok((r, _))) => return Err(FetchError::WrongRange(format!("asked {range:?}, got {r:?} with {} bytes", task.req.buffer.len()))),
                Some(Err(e)) => return Err(e.into()),
                None => return Err(FetchError::WrongRange(format!("status {status} without Content-Range"))),
            }
        }
        Ok(Fetched {
            status,
            body: std::mem::take(&mut task.req.buffer),
            attempts: task.attempt,
            hedged: task.is_hedge,
            first_byte: task.first_byte,
            total: task.first_started.elapsed(),
        })
    }

    /// An attempt failed and no sibling is racing it: retry later on a fresh
    /// connection, or answer the request with the error.
    fn attempt_failed(&mut self, mut task: Box<Task>, err: FetchError) {
        task.socket = None; // closes the connection
        if task.reused && task.response.is_none() && !matches!(err, FetchError::Timeout(_)) {
            // A kept-alive connection the server (or a proxy) closed while it
            // sat in the pool: not the request's fault. Again at once, on the
            // next pooled connection or a new one, without back-off and
            // without using up an attempt.
            self.stats.stale_connections += 1;
            task.attempt -= 1;
            task.not_before = Instant::now();
            self.waiting.push_front(task);
            return;
        }
        if err.retryable() && task.attempt < self.opts.max_attempts {
            self.stats.retries += 1;
            self.rng ^= self.rng << 13;
            self.rng ^= self.rng >> 7;
            self.rng ^= self.rng << 17;
            let base = self.opts.backoff * (1 << (task.attempt - 1).min(6));
            let jitter = Duration::from_nanos(self.rng % (base.as_nanos() as u64 + 1));
            task.not_before = Instant::now() + base / 2 + jitter;
            self.waiting.push_back(task);
        } else {
            self.head_pool.push(std::mem::take(&mut task.head));
            let err = if task.attempt > 1 { FetchError::Exhausted { attempts: task.attempt, last: Box::new(err) } } else { err };
            self.decide(task.id, Err(err));
            self.release(task.id);
        }
    }
}

impl Task {
    /// Whether this attempt is late against the hedging deadlines
    /// (first byte, per MiB after it).
    fn is_late(&self, (first_byte, per_mib): (Duration, Duration), now: Instant) -> bool {
        let elapsed = now.duration_since(self.attempt_started);
        if self.response.is_none() {
            return elapsed > first_byte;
        }
        elapsed > first_byte + per_mib.mul_f64(self.req.payload_bytes() as f64 / (1u64 << 20) as f64)
    }

    /// A duplicate of this request, to start now on a fresh connection.
    fn hedge_of(&self, now: Instant) -> Task {
        let req = Request { addr: self.req.addr, host: self.req.host.clone(), target: self.req.target.clone(), method: self.req.method.clone(), range: self.req.range.clone(), buffer: Vec::new(), tls: self.req.tls };
        let mut hedge = Task::fresh(self.id, req, now);
        // Counted as a retry would be, so it never takes a pooled connection.
        hedge.attempt = 1;
        hedge.first_started = self.first_started;
        hedge.is_hedge = true;
        hedge
    }

    /// A request that has not started an attempt yet.
    fn fresh(id: usize, req: Request, now: Instant) -> Task {
        let sockaddr = Box::new(SockAddr::from(req.addr));
        Task {
            id,
            req,
            attempt: 0,
            first_started: now,
            attempt_started: now,
            deadline: now,
            not_before: now,
            socket: None,
            sockaddr,
            phase: Phase::Connect,
            head_out: Vec::new(),
            sent: 0,
            head: Vec::new(),
            filled: 0,
            response: None,
            decoder: None,
            first_byte: Duration::ZERO,
            cancelling: false,
            abandoned: false,
            reused: false,
            is_hedge: false,
            spawned_hedge: false,
            tls: None,
        }
    }
}

enum Step {
    Continue,
    Done(Result<Fetched, FetchError>),
}

fn user_data_of(slot: usize, generation_id: u64) -> u64 {
    ((generation_id & 0x3FFF_FFFF) << 32) | slot as u64
}

fn split_user_data(user_data: u64) -> (usize, u64) {
    ((user_data & 0xFFFF_FFFF) as usize, (user_data >> 32) & 0x3FFF_FFFF)
}
