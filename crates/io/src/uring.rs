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
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use io_uring::{IoUring, opcode, types};
use socket2::{Domain, SockAddr, Socket, Type};

use crate::http::{BodyDecoder, Framing, HttpError, Limits, ResponseHead, parse_content_range, parse_head, range_header, write_request};

/// One GET to run.
#[derive(Debug)]
pub struct Get {
    /// Where to connect.
    pub addr: SocketAddr,
    /// The Host header.
    pub host: String,
    /// Path and query (a presigned URL's, for object stores).
    pub target: String,
    /// The bytes wanted; `None` for the whole object.
    pub range: Option<Range<u64>>,
    /// The buffer the body is received into (reused by the caller).
    pub buffer: Vec<u8>,
}

/// A completed GET.
#[derive(Debug)]
pub struct Fetched {
    pub status: u16,
    /// The body, in the caller's buffer.
    pub body: Vec<u8>,
    /// Attempts it took (1 = no retry).
    pub attempts: u32,
    /// From the start of the successful attempt to the response head.
    pub first_byte: Duration,
    /// From the start of the first attempt (not of the wait for a slot) to
    /// the last byte.
    pub total: Duration,
}

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
    #[error("gave up after {attempts} attempts; last error: {last}")]
    Exhausted { attempts: u32, last: Box<FetchError> },
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
    /// Requests in flight at most.
    pub max_in_flight: usize,
    /// Largest single receive into a body buffer.
    pub recv_bytes: usize,
    /// Deadline of one attempt.
    pub attempt_timeout: Duration,
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
    /// Hedges allowed, as a share of the requests started.
    pub max_share: f64,
}

impl Default for HedgePolicy {
    fn default() -> Self {
        HedgePolicy { first_byte: Duration::from_millis(200), per_mib: Duration::from_micros(37_500), max_share: 0.05 }
    }
}

impl Default for LoopOptions {
    fn default() -> Self {
        LoopOptions {
            ring_entries: 1024,
            max_in_flight: 256,
            recv_bytes: 1 << 20,
            attempt_timeout: Duration::from_secs(30),
            max_attempts: 4,
            backoff: Duration::from_millis(20),
            hedge: None,
            keep_alive: true,
            backend: Backend::Auto,
        }
    }
}

/// Counters of a loop.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LoopStats {
    /// GETs finished (successfully or not).
    pub requests: u64,
    /// Attempts beyond the first.
    pub retries: u64,
    /// Attempts cancelled at their deadline.
    pub timeouts: u64,
    /// Duplicate attempts sent for late requests.
    pub hedges: u64,
    /// Requests whose hedge answered first.
    pub hedges_won: u64,
    /// Body bytes received.
    pub body_bytes: u64,
    /// Most requests in flight at once.
    pub max_in_flight: usize,
    /// `io_uring_enter` calls.
    pub submits: u64,
    /// Completions reaped.
    pub completions: u64,
    /// Connections opened / reused from the pool.
    pub connects: u64,
    pub reuses: u64,
}

const TICK: u64 = u64::MAX;
/// A late hedge may itself be hedged, up to this many per request.
const MAX_HEDGES_PER_REQUEST: u8 = 4;
const CANCEL: u64 = 1 << 62;
const HEAD_BUFFER: usize = 64 << 10;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Connect,
    Send,
    RecvHead,
    RecvBody,
}

struct Task {
    index: usize,
    get: Get,
    attempt: u32,
    first_started: Instant,
    attempt_started: Instant,
    deadline: Instant,
    not_before: Instant,
    socket: Option<Socket>,
    sockaddr: Box<SockAddr>,
    phase: Phase,
    request: Vec<u8>,
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
    last_error: Option<FetchError>,
}

/// A single-threaded io_uring event loop.
enum Driver {
    Uring(IoUring),
    Epoll(crate::epoll::EpollDriver),
}

pub struct EventLoop {
    driver: Driver,
    opts: LoopOptions,
    idle: HashMap<SocketAddr, Vec<Socket>>,
    stats: LoopStats,
    limits: Limits,
    generation: u64,
    tick: Box<types::Timespec>,
    rng: u64,
    /// Head buffers of finished requests, reused by the next ones.
    head_pool: Vec<Vec<u8>>,
}

impl EventLoop {
    /// A loop with its own ring. Fails where io_uring is unavailable.
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
        Ok(EventLoop {
            driver,
            opts,
            idle: HashMap::new(),
            stats: LoopStats::default(),
            limits: Limits::default(),
            generation: 0,
            tick: Box::new(types::Timespec::new().nsec(50_000_000)),
            rng: 0x2545_F491_4F6C_DD1D,
            head_pool: Vec::new(),
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

    /// Runs all `gets` to completion, at most `max_in_flight` at a time;
    /// results come back in the order of `gets`.
    pub fn fetch_all(&mut self, gets: Vec<Get>) -> std::io::Result<Vec<Result<Fetched, FetchError>>> {
        let now = Instant::now();
        let mut results: Vec<Option<Result<Fetched, FetchError>>> = (0..gets.len()).map(|_| None).collect();
        let mut waiting: VecDeque<Box<Task>> = gets.into_iter().enumerate().map(|(index, get)| Box::new(self.new_task(index, get, now))).collect();
        let mut slots: Vec<Option<(u64, Box<Task>)>> = Vec::new();
        let mut free: Vec<usize> = Vec::new();
        let mut in_flight = 0usize;
        let mut tick_armed = false;
        // Live attempts per request (2 while a hedge races the original).
        let mut live: Vec<u8> = vec![1; results.len()];
        let mut hedge_count: Vec<u8> = vec![0; results.len()];
        let mut started = 0u64;
        let mut hedges_sent = 0u64;
        loop {
            // Start what may start.
            let now = Instant::now();
            let mut deferred = VecDeque::new();
            while in_flight < self.opts.max_in_flight {
                let Some(mut task) = waiting.pop_front() else { break };
                if results[task.index].is_some() {
                    // A hedge whose sibling already answered.
                    live[task.index] -= 1;
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
                task.attempt_started = now;
                task.deadline = now + self.opts.attempt_timeout;
                let slot = free.pop().unwrap_or_else(|| {
                    slots.push(None);
                    slots.len() - 1
                });
                self.generation += 1;
                let generation_id = self.generation & 0x3FFF_FFFF;
                let first = self.begin(&mut task);
                if let Err(e) = first {
                    // Could not even create a socket: fail this attempt.
                    self.fail(task, e, &mut waiting, &mut results);
                    free.push(slot);
                    continue;
                }
                slots[slot] = Some((generation_id, task));
                in_flight += 1;
                started += 1;
                self.stats.max_in_flight = self.stats.max_in_flight.max(in_flight);
                self.push_next(slot, generation_id, slots[slot].as_mut().map(|(_, t)| t.as_mut()).expect("just placed"))?;
            }
            waiting.extend(deferred);
            if in_flight == 0 && waiting.is_empty() {
                break;
            }
            let completions = self.wait(&mut tick_armed)?;
            self.stats.completions += completions.len() as u64;
            for (user_data, result) in completions {
                if user_data == TICK {
                    tick_armed = false;
                    let now = Instant::now();
                    let mut hedges = Vec::new();
                    for (slot, entry) in slots.iter_mut().enumerate() {
                        if let Some((generation_id, task)) = entry {
                            if !task.cancelling && now > task.deadline {
                                task.cancelling = true;
                                self.cancel(user_data_of(slot, *generation_id))?;
                            } else if let Some(policy) = self.opts.hedge {
                                let budget = (policy.max_share * started as f64).floor() as u64;
                                if !task.cancelling
                                    && !task.spawned_hedge
                                    && hedge_count[task.index] < MAX_HEDGES_PER_REQUEST
                                    && hedges_sent < budget.max(u64::from(policy.max_share > 0.0))
                                    && task.is_late(&policy, now)
                                {
                                    task.spawned_hedge = true;
                                    hedge_count[task.index] += 1;
                                    live[task.index] += 1;
                                    hedges_sent += 1;
                                    self.stats.hedges += 1;
                                    hedges.push(task.hedge_of(now));
                                }
                            }
                        }
                    }
                    // Hedges go first: they are late already.
                    for h in hedges {
                        waiting.push_front(Box::new(h));
                    }
                    continue;
                }
                if user_data & CANCEL != 0 {
                    continue;
                }
                let (slot, generation_id) = split_user_data(user_data);
                let Some(Some((slot_gen, _))) = slots.get(slot) else { continue };
                if *slot_gen != generation_id {
                    continue;
                }
                let (_, mut task) = slots[slot].take().expect("checked");
                match self.advance(&mut task, result) {
                    Step::Continue => {
                        slots[slot] = Some((generation_id, task));
                        self.push_next(slot, generation_id, slots[slot].as_mut().map(|(_, t)| t.as_mut()).expect("just placed"))?;
                    }
                    Step::Done(outcome) => {
                        in_flight -= 1;
                        free.push(slot);
                        let index = task.index;
                        live[index] -= 1;
                        let decided = results[index].is_some();
                        match outcome {
                            Ok(fetched) if !decided => {
                                self.head_pool.push(std::mem::take(&mut task.head));
                                self.stats.requests += 1;
                                self.stats.body_bytes += fetched.body.len() as u64;
                                if task.is_hedge {
                                    self.stats.hedges_won += 1;
                                }
                                results[index] = Some(Ok(fetched));
                                // Cancel the sibling still racing for this request.
                                for (other, entry) in slots.iter_mut().enumerate() {
                                    if let Some((generation_id, t)) = entry {
                                        if t.index == index && !t.cancelling {
                                            t.cancelling = true;
                                            t.abandoned = true;
                                            self.cancel(user_data_of(other, *generation_id))?;
                                        }
                                    }
                                }
                            }
                            // The loser of a race, or a failed attempt whose sibling
                            // is still running: nothing more to do for it.
                            _ if decided || task.abandoned || live[index] > 0 => {
                                self.head_pool.push(std::mem::take(&mut task.head));
                            }
                            Ok(_) => unreachable!("an undecided success is handled above"),
                            Err(e) => {
                                live[index] += 1; // a retry is a live attempt again
                                if !self.fail(task, e, &mut waiting, &mut results) {
                                    live[index] -= 1;
                                }
                            }
                        }
                    }
                }
            }
        }
        Ok(results.into_iter().map(|r| r.expect("every request finishes")).collect())
    }

    fn new_task(&self, index: usize, get: Get, now: Instant) -> Task {
        Task::fresh(index, get, now)
    }

    /// Prepares an attempt: a pooled connection or a new socket, the request bytes.
    fn begin(&mut self, task: &mut Task) -> Result<(), FetchError> {
        task.attempt += 1;
        task.cancelling = false;
        task.sent = 0;
        task.filled = 0;
        task.response = None;
        task.decoder = None;
        task.request.clear();
        let range = task.get.range.as_ref().map(range_header);
        let headers: Vec<(&str, &str)> = range.as_deref().map(|r| vec![("Range", r)]).unwrap_or_default();
        write_request(&mut task.request, "GET", &task.get.host, &task.get.target, &headers, None)?;
        if task.head.len() < HEAD_BUFFER {
            task.head = self.head_pool.pop().unwrap_or_else(|| vec![0; HEAD_BUFFER]);
        }
        // Retries always use a fresh connection: the old one may be the problem.
        let pooled = if task.attempt == 1 { self.idle.get_mut(&task.get.addr).and_then(Vec::pop) } else { None };
        match pooled {
            Some(socket) => {
                self.stats.reuses += 1;
                task.socket = Some(socket);
                task.phase = Phase::Send;
            }
            None => {
                let socket = Socket::new(Domain::for_address(task.get.addr), Type::STREAM.cloexec(), None).map_err(|source| FetchError::Io { addr: task.get.addr, source })?;
                let _ = socket.set_tcp_nodelay(true);
                if matches!(self.driver, Driver::Epoll(_)) {
                    socket.set_nonblocking(true).map_err(|source| FetchError::Io { addr: task.get.addr, source })?;
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

    /// Submits what is queued and returns completions (and ticks).
    fn wait(&mut self, tick_armed: &mut bool) -> std::io::Result<Vec<(u64, i32)>> {
        if let Driver::Epoll(epoll) = &mut self.driver {
            self.stats.submits += 1;
            return epoll.wait(Duration::from_millis(50), TICK);
        }
        if !*tick_armed {
            let entry = opcode::Timeout::new(&*self.tick as *const types::Timespec).build().user_data(TICK);
            self.push(&entry)?;
            *tick_armed = true;
        }
        let Driver::Uring(ring) = &mut self.driver else { unreachable!() };
        ring.submit_and_wait(1)?;
        self.stats.submits += 1;
        let completions: Vec<(u64, i32)> = ring.completion().map(|c| (c.user_data(), c.result())).collect();
        if completions.iter().any(|c| c.0 == TICK) {
            *tick_armed = false;
        }
        Ok(completions)
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

    fn push_next(&mut self, slot: usize, generation_id: u64, task: &mut Task) -> std::io::Result<()> {
        use crate::epoll::Op;
        let raw = task.socket.as_ref().expect("attempt has a socket").as_raw_fd();
        let op = match task.phase {
            Phase::Connect => Op::Connect { addr: task.sockaddr.as_ptr() as *const libc::sockaddr, len: task.sockaddr.len() },
            Phase::Send => {
                let rest = &task.request[task.sent..];
                Op::Send { ptr: rest.as_ptr(), len: rest.len() }
            }
            Phase::RecvHead => {
                let spare = &mut task.head[task.filled..];
                Op::Recv { ptr: spare.as_mut_ptr(), len: spare.len() }
            }
            Phase::RecvBody => {
                let body = &mut task.get.buffer;
                let want = match task.response.as_ref().map(|h| h.framing) {
                    Some(Framing::Length(n)) => (n as usize).saturating_sub(body.len()).max(1),
                    _ => self.opts.recv_bytes,
                }
                .min(self.opts.recv_bytes);
                body.reserve(want);
                let spare = body.spare_capacity_mut();
                let len = spare.len().min(self.opts.recv_bytes);
                Op::Recv { ptr: spare.as_mut_ptr() as *mut u8, len }
            }
        };
        let user_data = user_data_of(slot, generation_id);
        if let Driver::Epoll(epoll) = &mut self.driver {
            return epoll.issue(user_data, raw, op);
        }
        let fd = types::Fd(raw);
        let entry = match op {
            Op::Connect { addr, len } => opcode::Connect::new(fd, addr, len).build(),
            Op::Send { ptr, len } => opcode::Send::new(fd, ptr, len as u32).build(),
            Op::Recv { ptr, len } => opcode::Recv::new(fd, ptr, len as u32).build(),
        };
        self.push(&entry.user_data(user_data))
    }

    /// Applies one completion to a task.
    fn advance(&mut self, task: &mut Task, result: i32) -> Step {
        let addr = task.get.addr;
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
                task.phase = Phase::Send;
                Step::Continue
            }
            Phase::Send => {
                task.sent += n;
                if task.sent == task.request.len() {
                    task.phase = Phase::RecvHead;
                }
                Step::Continue
            }
            Phase::RecvHead => {
                if n == 0 {
                    return Step::Done(Err(FetchError::Io { addr, source: std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "connection closed before the response") }));
                }
                task.filled += n;
                let parsed = match parse_head(&task.head[..task.filled], &self.limits, false) {
                    Ok(p) => p,
                    Err(e) => return Step::Done(Err(e.into())),
                };
                let Some((head, used)) = parsed else {
                    return Step::Continue;
                };
                task.first_byte = task.attempt_started.elapsed();
                let mut decoder = BodyDecoder::new(head.framing);
                let body = &mut task.get.buffer;
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
                if done { Step::Done(self.finish(task)) } else {
                    task.phase = Phase::RecvBody;
                    Step::Continue
                }
            }
            Phase::RecvBody => {
                let decoder = task.decoder.as_mut().expect("head parsed");
                let body = &mut task.get.buffer;
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
        if head.keep_alive && self.opts.keep_alive {
            self.idle.entry(task.get.addr).or_default().push(socket);
        }
        let status = head.status;
        if !(200..300).contains(&status) {
            let detail = String::from_utf8_lossy(&task.get.buffer[..task.get.buffer.len().min(300)]).trim().to_string();
            return Err(FetchError::Status { status, detail });
        }
        if let Some(range) = &task.get.range {
            let got = head.header("content-range").map(parse_content_range);
            match got {
                Some(Ok((r, _))) if status == 206 && r == *range && task.get.buffer.len() as u64 == range.end - range.start => {}
                Some(Ok((r, _))) => return Err(FetchError::WrongRange(format!("asked {range:?}, got {r:?} with {} bytes", task.get.buffer.len()))),
                Some(Err(e)) => return Err(e.into()),
                None => return Err(FetchError::WrongRange(format!("status {status} without Content-Range"))),
            }
        }
        Ok(Fetched {
            status,
            body: std::mem::take(&mut task.get.buffer),
            attempts: task.attempt,
            first_byte: task.first_byte,
            total: task.first_started.elapsed(),
        })
    }

    /// An attempt failed: retry later on a fresh connection (returns true),
    /// or give up and record the error (false).
    fn fail(&mut self, mut task: Box<Task>, err: FetchError, waiting: &mut VecDeque<Box<Task>>, results: &mut [Option<Result<Fetched, FetchError>>]) -> bool {
        task.socket = None; // closes the connection
        if err.retryable() && task.attempt < self.opts.max_attempts {
            self.stats.retries += 1;
            self.rng ^= self.rng << 13;
            self.rng ^= self.rng >> 7;
            self.rng ^= self.rng << 17;
            let base = self.opts.backoff * (1 << (task.attempt - 1).min(6));
            let jitter = Duration::from_nanos(self.rng % (base.as_nanos() as u64 + 1));
            task.not_before = Instant::now() + base / 2 + jitter;
            task.last_error = Some(err);
            waiting.push_back(task);
            true
        } else {
            self.stats.requests += 1;
            self.head_pool.push(std::mem::take(&mut task.head));
            let err = if task.attempt > 1 { FetchError::Exhausted { attempts: task.attempt, last: Box::new(err) } } else { err };
            results[task.index] = Some(Err(err));
            false
        }
    }
}

impl Task {
    /// Whether this attempt is late against the hedging policy.
    fn is_late(&self, policy: &HedgePolicy, now: Instant) -> bool {
        let elapsed = now.duration_since(self.attempt_started);
        if self.response.is_none() {
            return elapsed > policy.first_byte;
        }
        let bytes = self.get.range.as_ref().map(|r| r.end - r.start).unwrap_or(self.get.buffer.capacity() as u64);
        elapsed > policy.first_byte + policy.per_mib.mul_f64(bytes as f64 / (1u64 << 20) as f64)
    }

    /// A duplicate of this request, to start now on a fresh connection.
    fn hedge_of(&self, now: Instant) -> Task {
        let get = Get { addr: self.get.addr, host: self.get.host.clone(), target: self.get.target.clone(), range: self.get.range.clone(), buffer: Vec::new() };
        let mut hedge = Task::fresh(self.index, get, now);
        // Counted as a retry would be, so it never takes a pooled connection.
        hedge.attempt = 1;
        hedge.first_started = self.first_started;
        hedge.is_hedge = true;
        hedge
    }

    /// A request that has not started an attempt yet.
    fn fresh(index: usize, get: Get, now: Instant) -> Task {
        let sockaddr = Box::new(SockAddr::from(get.addr));
        Task {
            index,
            get,
            attempt: 0,
            first_started: now,
            attempt_started: now,
            deadline: now,
            not_before: now,
            socket: None,
            sockaddr,
            phase: Phase::Connect,
            request: Vec::new(),
            sent: 0,
            head: Vec::new(),
            filled: 0,
            response: None,
            decoder: None,
            first_byte: Duration::ZERO,
            cancelling: false,
            abandoned: false,
            is_hedge: false,
            spawned_hedge: false,
            last_error: None,
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
