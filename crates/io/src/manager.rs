//! The download manager: event-loop threads behind an async API.
//!
//! Callers (scan partitions on tokio) `await` a [`DownloadManager::get`];
//! the request goes through a queue to one of a few event-loop threads
//! (AnyBlob §3.1: a handful of threads hold hundreds of requests), which
//! wakes on an eventfd, runs it among all the others in flight, and answers
//! through a oneshot channel. The body arrives in a buffer of its own that
//! becomes the returned `Bytes` without a copy.
//!
//! Back-pressure: every request holds a share of a memory budget (its size)
//! from submission to delivery; callers wait when the budget is spent, so a
//! scan cannot ask for more than it may hold. Inside the loop, the latency
//! model sets how many of the submitted requests are on the wire.
//!
//! Endpoints are resolved once per host; requests are spread over a few of
//! its addresses, and a persistently slow one is swapped for another
//! ([`crate::resolver`]).

use std::collections::HashMap;
use std::net::{SocketAddr, ToSocketAddrs};
use std::ops::Range;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::sync::{Semaphore, oneshot};

use crate::buffers::BufferPool;
use crate::resolver::{Endpoint, MAX_ACTIVE};
use crate::uring::{Backend, ConcurrencyTarget, EventLoop, FetchError, Fetched, HedgePolicy, LoopOptions, LoopStats, Request};

/// How the manager runs.
#[derive(Debug, Clone)]
pub struct ManagerOptions {
    /// Event-loop threads. One holds hundreds of requests; more only help
    /// when a single core cannot keep up with the bytes.
    pub threads: usize,
    /// Options of each loop.
    pub loop_options: LoopOptions,
    /// Bytes of requests submitted and not yet delivered, at most; callers
    /// wait beyond it.
    pub memory: u64,
    /// Extra CA certificates (PEM) to trust for HTTPS besides the
    /// system's, e.g. a private S3-compatible store's.
    pub ca_file: Option<std::path::PathBuf>,
    /// Bytes of idle receive buffers kept for reuse (see [`BufferPool`]).
    pub buffer_pool: usize,
    /// Keep a log of every request (method, URL without query, range,
    /// outcome) for [`DownloadManager::request_log`]: tests and tracing.
    pub record_requests: bool,
}

/// One request as the log keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoggedRequest {
    pub method: &'static str,
    /// Without the query string.
    pub url: String,
    pub range: Option<Range<u64>>,
    /// The HTTP status of the answer, `None` if there was none.
    pub status: Option<u16>,
}

/// The log keeps at most this many requests (the newest are dropped).
const LOG_LIMIT: usize = 1 << 20;

impl Default for ManagerOptions {
    /// One loop thread, adaptive hedging (5 % budget), requests in flight
    /// from the latency model for a 10 Gbit/s link, and a memory budget of
    /// 1/8 of the machine's memory (at most 4 GiB).
    fn default() -> Self {
        let memory = (physical_memory() / 8).clamp(256 << 20, 4 << 30);
        ManagerOptions {
            threads: 1,
            loop_options: LoopOptions {
                max_in_flight: 512,
                concurrency: Some(ConcurrencyTarget { bytes_per_sec: 10e9 / 8.0, memory }),
                hedge: Some(HedgePolicy { adaptive: true, ..HedgePolicy::default() }),
                ..LoopOptions::default()
            },
            memory,
            buffer_pool: (memory / 4) as usize,
            ca_file: None,
            record_requests: false,
        }
    }
}

/// The machine's physical memory in bytes (8 GiB if it cannot be read):
/// the base of the default memory budgets here and in the engine.
pub fn physical_memory() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let (pages, size) = unsafe { (libc::sysconf(libc::_SC_PHYS_PAGES), libc::sysconf(libc::_SC_PAGESIZE)) };
    if pages > 0 && size > 0 { pages as u64 * size as u64 } else { 8 << 30 }
}

/// A finished download.
#[derive(Debug, Clone)]
pub struct Download {
    /// The response body.
    pub body: Bytes,
    /// Attempts it took, 1 without retries or hedges.
    pub attempts: u32,
    /// The answer came from a hedge.
    pub hedged: bool,
    /// From the answering attempt's start to the response head.
    pub first_byte: Duration,
    /// From the first attempt's start to the last byte.
    pub total: Duration,
}

/// Why a download failed. Messages name the object by its URL without the
/// query string, so a presigned signature never reaches a log.
#[derive(Debug, thiserror::Error)]
pub enum DownloadError {
    #[error("{method} {url}: {source}{}", hint(source))]
    Request { method: &'static str, url: String, source: FetchError },
    #[error("invalid URL {url}: {reason}")]
    Url { url: String, reason: String },
    #[error("cannot resolve {host}: {reason}")]
    Resolve { host: String, reason: String },
    #[error("the download manager has stopped{}", .0.as_ref().map(|e| format!(": {e}")).unwrap_or_default())]
    Stopped(Option<String>),
}

impl DownloadError {
    /// The HTTP status the store answered with, if it answered with an error.
    pub fn status(&self) -> Option<u16> {
        match self {
            DownloadError::Request { source: FetchError::Status { status, .. }, .. } => Some(*status),
            _ => None,
        }
    }
}

fn hint(e: &FetchError) -> &'static str {
    match e {
        FetchError::Status { status: 403, .. } => " — the store refused the request's credentials: check the access key, secret key and region (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION) and the clock",
        FetchError::Status { status: 404, .. } => " — no such object",
        _ => "",
    }
}

/// The URL without its query (signatures live there).
fn redact(url: &url::Url) -> String {
    let mut u = url.clone();
    u.set_query(None);
    u.to_string()
}

/// Counters of all loop threads.
#[derive(Debug, Clone, Default)]
pub struct ManagerStats {
    pub loops: LoopStats,
    /// CPU time the loop threads spent (user + system).
    pub cpu: Duration,
    /// Requests submitted and not yet answered, now.
    pub pending: usize,
    /// Requests on the wire now.
    pub in_flight: usize,
}

enum Command {
    Submit(Request, crate::uring::Reply, Arc<AtomicBool>),
}

/// Sets the request's cancel flag when the caller's future is dropped
/// before the answer came: the loop then stops the request.
struct CancelOnDrop(Arc<AtomicBool>);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        // Also set after a normal answer: the loop has forgotten the
        // request by then, so the flag is never read again.
        self.0.store(true, Ordering::Relaxed);
    }
}

#[derive(Default)]
struct Published {
    stats: LoopStats,
    cpu: Duration,
    pending: usize,
    in_flight: usize,
    failed: Option<String>,
}

struct LoopThread {
    tx: Mutex<Option<mpsc::Sender<Command>>>,
    wake: OwnedFd,
    published: Arc<Mutex<Published>>,
    join: Mutex<Option<JoinHandle<()>>>,
    backend: Backend,
}

impl LoopThread {
    fn spawn(index: usize, opts: LoopOptions) -> std::io::Result<LoopThread> {
        // SAFETY: eventfd returns a new descriptor we then own.
        let raw = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if raw < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: `raw` is a fresh descriptor owned by nobody else.
        let wake = unsafe { OwnedFd::from_raw_fd(raw) };
        let (tx, rx) = mpsc::channel();
        let published = Arc::new(Mutex::new(Published::default()));
        let shared = published.clone();
        // The loop is built on its thread: it holds raw pointers into its
        // own requests and never moves between threads.
        let (ready_tx, ready_rx) = mpsc::sync_channel(1);
        let join = std::thread::Builder::new().name(format!("blobhouse-io-{index}")).spawn(move || {
            let lp = EventLoop::new(opts).and_then(|mut lp| lp.wake_on(raw).map(|()| lp));
            match lp {
                Ok(lp) => {
                    let _ = ready_tx.send(Ok(lp.backend()));
                    run_loop(lp, rx, shared)
                }
                Err(e) => drop(ready_tx.send(Err(e))),
            }
        })?;
        let backend = ready_rx.recv().map_err(|_| std::io::Error::other("the event-loop thread died while starting"))??;
        Ok(LoopThread { tx: Mutex::new(Some(tx)), wake, published, join: Mutex::new(Some(join)), backend })
    }

    fn send(&self, cmd: Command) -> Result<(), DownloadError> {
        let guard = self.tx.lock().expect("not poisoned");
        let tx = guard.as_ref().ok_or(DownloadError::Stopped(None))?;
        tx.send(cmd).map_err(|_| DownloadError::Stopped(self.published.lock().expect("not poisoned").failed.clone()))?;
        self.poke();
        Ok(())
    }

    fn poke(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a u64 to our eventfd.
        unsafe { libc::write(self.wake.as_raw_fd(), &one as *const u64 as *const libc::c_void, 8) };
    }

    fn stop(&self) {
        self.tx.lock().expect("not poisoned").take();
        self.poke();
        if let Some(j) = self.join.lock().expect("not poisoned").take() {
            let _ = j.join();
        }
    }
}

fn run_loop(mut lp: EventLoop, rx: mpsc::Receiver<Command>, shared: Arc<Mutex<Published>>) {
    let mut last_publish = Instant::now();
    loop {
        let mut closed = false;
        loop {
            match rx.try_recv() {
                Ok(Command::Submit(req, reply, cancel)) => lp.submit_cancellable(req, reply, Some(cancel)),
                Err(mpsc::TryRecvError::Empty) => break,
                Err(mpsc::TryRecvError::Disconnected) => {
                    closed = true;
                    break;
                }
            }
        }
        if closed {
            // The manager is gone; outstanding replies are dropped with the loop.
            break;
        }
        if let Err(e) = lp.turn() {
            shared.lock().expect("not poisoned").failed = Some(e.to_string());
            break;
        }
        if lp.pending() == 0 || last_publish.elapsed() > Duration::from_millis(20) {
            last_publish = Instant::now();
            let mut p = shared.lock().expect("not poisoned");
            p.stats.clone_from(lp.stats());
            p.cpu = thread_cpu();
            p.pending = lp.pending();
            p.in_flight = lp.in_flight();
        }
    }
    let mut p = shared.lock().expect("not poisoned");
    p.stats.clone_from(lp.stats());
    p.cpu = thread_cpu();
    p.pending = 0;
    p.in_flight = 0;
}

/// CPU time of the calling thread.
fn thread_cpu() -> Duration {
    // SAFETY: getrusage fills the struct we pass.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut ru) };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// Units of the memory budget's semaphore (it counts in `u32`).
const BUDGET_UNIT: u64 = 4096;

/// Downloads (and uploads) through event-loop threads. Cheap to clone;
/// the threads stop when the last clone is dropped.
#[derive(Clone)]
pub struct DownloadManager {
    inner: Arc<Inner>,
}

struct Inner {
    loops: Vec<LoopThread>,
    next: AtomicUsize,
    /// New requests go to the first this many loops (see
    /// [`DownloadManager::set_active_threads`]).
    active: AtomicUsize,
    budget: Arc<Semaphore>,
    budget_units: u32,
    endpoints: Mutex<HashMap<(String, u16), Arc<Endpoint>>>,
    backend: Backend,
    log: Option<Mutex<Vec<LoggedRequest>>>,
    buffers: Arc<BufferPool>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        for l in &self.loops {
            l.stop();
        }
    }
}

impl std::fmt::Debug for DownloadManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DownloadManager").field("threads", &self.inner.loops.len()).field("backend", &self.inner.backend).finish()
    }
}

impl DownloadManager {
    /// Starts the loop threads.
    pub fn new(mut opts: ManagerOptions) -> std::io::Result<DownloadManager> {
        assert!(opts.threads >= 1, "a download manager needs a loop thread");
        let buffers = BufferPool::new(opts.buffer_pool);
        opts.loop_options.buffers = Some(buffers.clone());
        if opts.loop_options.tls.is_none() {
            opts.loop_options.tls = Some(crate::tls::client_config(opts.ca_file.as_deref()).map_err(std::io::Error::other)?);
        }
        let mut loops = Vec::with_capacity(opts.threads);
        for i in 0..opts.threads {
            loops.push(LoopThread::spawn(i, opts.loop_options.clone())?);
        }
        let backend = loops[0].backend;
        let budget_units = (opts.memory / BUDGET_UNIT).clamp(1, u32::MAX as u64 >> 4) as u32;
        Ok(DownloadManager {
            inner: Arc::new(Inner {
                active: AtomicUsize::new(loops.len()),
                loops,
                next: AtomicUsize::new(0),
                budget: Arc::new(Semaphore::new(budget_units as usize)),
                budget_units,
                endpoints: Mutex::new(HashMap::new()),
                backend,
                log: opts.record_requests.then(|| Mutex::new(Vec::new())),
                buffers,
            }),
        })
    }

    /// The event-loop threads started ([`ManagerOptions::threads`]).
    pub fn threads(&self) -> usize {
        self.inner.loops.len()
    }

    /// Sends new requests to the first `n` loop threads only (1 ..=
    /// [`DownloadManager::threads`]); the others finish what they hold and
    /// then sleep on their eventfd, costing no CPU. The scan's object
    /// scheduler lowers this when the query, not the network, is the
    /// bottleneck (AnyBlob §4.3: fewer retrieval threads, more processing).
    pub fn set_active_threads(&self, n: usize) -> usize {
        let n = n.clamp(1, self.inner.loops.len());
        self.inner.active.store(n, Ordering::Relaxed);
        n
    }

    /// The loop threads that take new requests now.
    pub fn active_threads(&self) -> usize {
        self.inner.active.load(Ordering::Relaxed).clamp(1, self.inner.loops.len())
    }

    /// The kernel interface the loops use.
    pub fn backend(&self) -> Backend {
        self.inner.backend
    }

    /// GETs `range` of the object at `url` (a plain or presigned `http://`
    /// or `https://` URL).
    pub async fn get(&self, url: &str, range: Option<Range<u64>>) -> Result<Download, DownloadError> {
        let size = range.as_ref().map(|r| r.end - r.start).unwrap_or(0);
        self.run(url, size, |addr, host, target| Request::get(addr, host, target, range)).await
    }

    /// PUTs `body` to `url` (a plain or presigned `http://` or `https://` URL).
    pub async fn put(&self, url: &str, body: Bytes) -> Result<Download, DownloadError> {
        let size = body.len() as u64;
        let body: Arc<[u8]> = Arc::from(body.as_ref());
        self.run(url, size, |addr, host, target| Request::put(addr, host, target, body)).await
    }

    async fn run(&self, url: &str, size: u64, make: impl FnOnce(SocketAddr, String, String) -> Request) -> Result<Download, DownloadError> {
        let parsed = url::Url::parse(url).map_err(|e| DownloadError::Url { url: strip_query(url), reason: e.to_string() })?;
        let shown = redact(&parsed);
        let tls = match parsed.scheme() {
            "http" => false,
            "https" => true,
            other => return Err(DownloadError::Url { url: shown, reason: format!("the download manager speaks http and https, not '{other}'") }),
        };
        let host = parsed.host_str().ok_or_else(|| DownloadError::Url { url: shown.clone(), reason: "no host".into() })?.to_string();
        let port = parsed.port_or_known_default().unwrap_or(if tls { 443 } else { 80 });
        let endpoint = self.endpoint(&host, port)?;
        let addr = endpoint.pick();
        let host_header = if parsed.port().is_some() { format!("{host}:{port}") } else { host };
        let target = match parsed.query() {
            Some(q) => format!("{}?{q}", parsed.path()),
            None => parsed.path().to_string(),
        };
        let request = make(addr, host_header, target).with_tls(tls);
        let logged = self.inner.log.as_ref().map(|_| (shown.clone(), request.range.clone()));
        let method = if matches!(request.method, crate::uring::Method::Put(_)) { "PUT" } else { "GET" };
        // Hold the request's share of the memory budget until it is
        // delivered. (The loop takes its buffer from the pool only when it
        // puts the request on the wire.)
        let units = (size.div_ceil(BUDGET_UNIT) as u32).clamp(1, self.inner.budget_units);
        let _permit = self.inner.budget.clone().acquire_many_owned(units).await.map_err(|_| DownloadError::Stopped(None))?;
        let (tx, rx) = oneshot::channel::<Result<Fetched, FetchError>>();
        let active = self.inner.active.load(Ordering::Relaxed).clamp(1, self.inner.loops.len());
        let n = self.inner.next.fetch_add(1, Ordering::Relaxed) % active;
        let lp = &self.inner.loops[n];
        let cancel = CancelOnDrop(Arc::new(AtomicBool::new(false)));
        lp.send(Command::Submit(request, Box::new(move |r| drop(tx.send(r))), cancel.0.clone()))?;
        let fetched = rx.await.map_err(|_| DownloadError::Stopped(lp.published.lock().expect("not poisoned").failed.clone()))?;
        if let (Some(log), Some((url, range))) = (&self.inner.log, logged) {
            let status = match &fetched {
                Ok(f) => Some(f.status),
                Err(FetchError::Status { status, .. }) => Some(*status),
                Err(_) => None,
            };
            let mut log = log.lock().expect("not poisoned");
            if log.len() < LOG_LIMIT {
                log.push(LoggedRequest { method, url, range, status });
            }
        }
        let f = fetched.map_err(|source| DownloadError::Request { method, url: shown, source })?;
        endpoint.record(addr, (f.body.len() as u64).max(size), f.total);
        Ok(Download { body: self.inner.buffers.freeze(f.body), attempts: f.attempts, hedged: f.hedged, first_byte: f.first_byte, total: f.total })
    }

    /// The endpoint of `host:port`, resolved once.
    fn endpoint(&self, host: &str, port: u16) -> Result<Arc<Endpoint>, DownloadError> {
        let key = (host.to_string(), port);
        let endpoint = {
            let mut map = self.inner.endpoints.lock().expect("not poisoned");
            match map.get(&key) {
                Some(e) => e.clone(),
                None => {
                    let addrs: Vec<SocketAddr> = (host, port).to_socket_addrs().map_err(|e| DownloadError::Resolve { host: format!("{host}:{port}"), reason: e.to_string() })?.collect();
                    if addrs.is_empty() {
                        return Err(DownloadError::Resolve { host: format!("{host}:{port}"), reason: "no addresses".into() });
                    }
                    let e = Arc::new(Endpoint::new(addrs, MAX_ACTIVE));
                    map.insert(key, e.clone());
                    e
                }
            }
        };
        Ok(endpoint)
    }

    /// The requests so far, if [`ManagerOptions::record_requests`] is set.
    pub fn request_log(&self) -> Vec<LoggedRequest> {
        self.inner.log.as_ref().map(|l| l.lock().expect("not poisoned").clone()).unwrap_or_default()
    }

    /// Counters of all loops so far.
    pub fn stats(&self) -> ManagerStats {
        let mut s = ManagerStats::default();
        for l in &self.inner.loops {
            let p = l.published.lock().expect("not poisoned");
            s.loops.merge(&p.stats);
            s.cpu += p.cpu;
            s.pending += p.pending;
            s.in_flight += p.in_flight;
        }
        s
    }
}

fn strip_query(url: &str) -> String {
    url.split('?').next().unwrap_or(url).to_string()
}
