//! The fallback driver where io_uring is unavailable or forbidden: the same
//! operations (connect, send, recv) on non-blocking sockets, completed when
//! epoll reports readiness. It hands the event loop completions shaped like
//! io_uring's — (user_data, result or -errno) — so the request state machines
//! and everything above them are shared.

use std::collections::HashMap;
use std::os::fd::RawFd;
use std::time::{Duration, Instant};

/// One operation, with the buffers the event loop keeps alive until it completes.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Op {
    Connect { addr: *const libc::sockaddr, len: libc::socklen_t },
    Send { ptr: *const u8, len: usize },
    /// `wait_all`: complete only when `len` bytes arrived (io_uring
    /// retries partial receives in the kernel; readiness-driven epoll
    /// completes with what is there).
    Recv { ptr: *mut u8, len: usize, wait_all: bool },
}

#[derive(Debug)]
struct Pending {
    fd: RawFd,
    op: Op,
    /// A non-blocking connect was started and now waits for writability.
    connecting: bool,
}

/// Readiness-driven completion of operations.
pub(crate) struct EpollDriver {
    epfd: RawFd,
    pending: HashMap<u64, Pending>,
    by_fd: HashMap<RawFd, u64>,
    ready: Vec<(u64, i32)>,
    next_tick: Instant,
    /// An eventfd that wakes the loop, and the user_data to report it with.
    wake: Option<(RawFd, u64)>,
}

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO)
}

impl EpollDriver {
    pub(crate) fn new() -> std::io::Result<EpollDriver> {
        // SAFETY: plain syscall; the fd is closed in Drop.
        let epfd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if epfd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(EpollDriver { epfd, pending: HashMap::new(), by_fd: HashMap::new(), ready: Vec::new(), next_tick: Instant::now(), wake: None })
    }

    /// Starts `op` on `fd`; its completion is reported by [`EpollDriver::wait`].
    pub(crate) fn issue(&mut self, user_data: u64, fd: RawFd, op: Op) -> std::io::Result<()> {
        let mut p = Pending { fd, op, connecting: false };
        match Self::attempt(&mut p) {
            Some(result) => self.ready.push((user_data, result)),
            None => {
                let events = match op {
                    Op::Recv { .. } => libc::EPOLLIN,
                    Op::Connect { .. } | Op::Send { .. } => libc::EPOLLOUT,
                };
                self.arm(fd, events as u32)?;
                self.by_fd.insert(fd, user_data);
                self.pending.insert(user_data, p);
            }
        }
        Ok(())
    }

    /// Tries the operation once; `None` if it would block.
    fn attempt(p: &mut Pending) -> Option<i32> {
        // SAFETY: the pointers and lengths describe buffers the event loop
        // keeps alive and untouched until this operation completes.
        unsafe {
            match p.op {
                Op::Connect { addr, len } => {
                    if p.connecting {
                        let mut err: libc::c_int = 0;
                        let mut l = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
                        if libc::getsockopt(p.fd, libc::SOL_SOCKET, libc::SO_ERROR, &mut err as *mut _ as *mut libc::c_void, &mut l) < 0 {
                            return Some(-errno());
                        }
                        return Some(-err);
                    }
                    if libc::connect(p.fd, addr, len) == 0 {
                        return Some(0);
                    }
                    match errno() {
                        libc::EINPROGRESS | libc::EAGAIN => {
                            p.connecting = true;
                            None
                        }
                        e => Some(-e),
                    }
                }
                Op::Send { ptr, len } => {
                    let n = libc::send(p.fd, ptr as *const libc::c_void, len, libc::MSG_NOSIGNAL);
                    if n >= 0 { Some(n as i32) } else { Self::blocked_or(errno()) }
                }
                Op::Recv { ptr, len, .. } => {
                    let n = libc::recv(p.fd, ptr as *mut libc::c_void, len, 0);
                    if n >= 0 { Some(n as i32) } else { Self::blocked_or(errno()) }
                }
            }
        }
    }

    fn blocked_or(e: i32) -> Option<i32> {
        if e == libc::EAGAIN || e == libc::EWOULDBLOCK || e == libc::EINTR { None } else { Some(-e) }
    }

    fn arm(&mut self, fd: RawFd, events: u32) -> std::io::Result<()> {
        let mut ev = libc::epoll_event { events: events | libc::EPOLLONESHOT as u32, u64: fd as u64 };
        // SAFETY: plain syscalls on descriptors we own.
        unsafe {
            if libc::epoll_ctl(self.epfd, libc::EPOLL_CTL_MOD, fd, &mut ev) == 0 {
                return Ok(());
            }
            if libc::epoll_ctl(self.epfd, libc::EPOLL_CTL_ADD, fd, &mut ev) == 0 {
                return Ok(());
            }
        }
        Err(std::io::Error::last_os_error())
    }

    /// Reports `user_data` whenever the eventfd `fd` is written (it is
    /// drained each time).
    pub(crate) fn watch(&mut self, fd: RawFd, user_data: u64) -> std::io::Result<()> {
        let mut ev = libc::epoll_event { events: libc::EPOLLIN as u32, u64: fd as u64 };
        // SAFETY: plain syscall on a descriptor the caller keeps open.
        if unsafe { libc::epoll_ctl(self.epfd, libc::EPOLL_CTL_ADD, fd, &mut ev) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        self.wake = Some((fd, user_data));
        Ok(())
    }

    /// Abandons an operation: it completes with `-ECANCELED`, like io_uring's.
    pub(crate) fn cancel(&mut self, user_data: u64) {
        if let Some(p) = self.pending.remove(&user_data) {
            self.by_fd.remove(&p.fd);
            self.ready.push((user_data, -libc::ECANCELED));
        }
    }

    /// Completions, waiting for at most `tick` (without a tick, until an
    /// operation completes or the wake-up fd is written); reports
    /// `tick_user_data` each time a tick has passed.
    pub(crate) fn wait(&mut self, tick: Option<Duration>, tick_user_data: u64) -> std::io::Result<Vec<(u64, i32)>> {
        let now = Instant::now();
        // Round up: a timeout truncated to 0 ms would return at once, again
        // and again, until the tick is due.
        let timeout = match tick {
            _ if !self.ready.is_empty() => 0,
            None => -1,
            Some(_) => self.next_tick.saturating_duration_since(now).as_micros().div_ceil(1000).min(i32::MAX as u128) as i32,
        };
        let mut events = [libc::epoll_event { events: 0, u64: 0 }; 256];
        // SAFETY: the buffer holds `events.len()` entries.
        let n = unsafe { libc::epoll_wait(self.epfd, events.as_mut_ptr(), events.len() as i32, timeout) };
        if n < 0 && errno() != libc::EINTR {
            return Err(std::io::Error::last_os_error());
        }
        for ev in events.iter().take(n.max(0) as usize) {
            let fd = ev.u64 as RawFd;
            if let Some((wake_fd, wake_data)) = self.wake
                && wake_fd == fd
            {
                let mut counter = 0u64;
                // SAFETY: reads 8 bytes into a u64 from an eventfd.
                unsafe { libc::read(fd, &mut counter as *mut u64 as *mut libc::c_void, 8) };
                self.ready.push((wake_data, 0));
                continue;
            }
            let Some(&user_data) = self.by_fd.get(&fd) else { continue };
            let Some(mut p) = self.pending.remove(&user_data) else { continue };
            match Self::attempt(&mut p) {
                Some(result) => {
                    self.by_fd.remove(&fd);
                    self.ready.push((user_data, result));
                }
                None => {
                    let events = if matches!(p.op, Op::Recv { .. }) { libc::EPOLLIN } else { libc::EPOLLOUT };
                    self.arm(fd, events as u32)?;
                    self.pending.insert(user_data, p);
                }
            }
        }
        let mut out = std::mem::take(&mut self.ready);
        if let Some(tick) = tick
            && Instant::now() >= self.next_tick
        {
            self.next_tick = Instant::now() + tick;
            out.push((tick_user_data, 0));
        }
        Ok(out)
    }
}

impl Drop for EpollDriver {
    fn drop(&mut self) {
        // SAFETY: we own the epoll descriptor.
        unsafe { libc::close(self.epfd) };
    }
}
