//! Starting and stopping the testbed's server processes.
//!
//! Each server runs in its own session (`setsid`), so stopping it means
//! signalling its whole process group. Servers of a CLI-started testbed
//! outlive the CLI and are found again through their pids in the state file;
//! servers started for tests are additionally tied to the test process with
//! `PR_SET_PDEATHSIG`, so a crashed test run leaves nothing behind.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::error::{Result, TestbedError};

/// Whether servers outlive the process that started them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lifetime {
    /// Until `down` (the CLI's `blobhouse testbed up`).
    Detached,
    /// Until `down` or the end of this process (tests).
    TiedToThisProcess,
}

/// Starts `cmd` in a new session with output to `log`; returns its pid.
pub fn spawn(what: &str, mut cmd: Command, log: &Path, lifetime: Lifetime) -> Result<u32> {
    let out = std::fs::File::create(log)?;
    cmd.stdin(Stdio::null()).stdout(out.try_clone()?).stderr(out);
    let tie = lifetime == Lifetime::TiedToThisProcess;
    unsafe {
        use std::os::unix::process::CommandExt;
        cmd.pre_exec(move || {
            if libc::setsid() < 0 {
                return Err(std::io::Error::last_os_error());
            }
            if tie && libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let what = what.to_string();
    if !tie {
        let child = cmd.spawn().map_err(|source| TestbedError::Spawn { what, source })?;
        return Ok(child.id());
    }
    // PDEATHSIG fires when the *thread* that forked the child exits, so the
    // child is forked from a thread that lives (reaping it) as long as it does.
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::Builder::new().name(format!("testbed-{what}")).spawn(move || match cmd.spawn() {
        Ok(mut child) => {
            let _ = tx.send(Ok(child.id()));
            let _ = child.wait();
        }
        Err(source) => {
            let _ = tx.send(Err(TestbedError::Spawn { what, source }));
        }
    })?;
    rx.recv().map_err(|e| TestbedError::Io(std::io::Error::other(e)))?
}

/// True while `pid` exists and is not a zombie.
pub fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat.rsplit(')').next().and_then(|s| s.split_whitespace().next()).is_some_and(|state| state != "Z"),
        Err(_) => false,
    }
}

/// Stops the process group of `pid`: SIGTERM, then SIGKILL after `grace`.
/// Returns whether the process is gone.
pub fn stop(pid: u32, grace: Duration) -> bool {
    let pgid = -(pid as i32);
    unsafe {
        libc::kill(pgid, libc::SIGTERM);
    }
    let deadline = Instant::now() + grace;
    while Instant::now() < deadline {
        if !alive(pid) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    unsafe {
        libc::kill(pgid, libc::SIGKILL);
    }
    let deadline = Instant::now() + Duration::from_secs(2);
    while Instant::now() < deadline {
        if !alive(pid) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    !alive(pid)
}

/// A free TCP port on 127.0.0.1.
pub fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// Waits until `ready()` holds, or fails with the tail of the server's log.
pub fn wait_ready(what: &str, log: &Path, secs: u64, mut ready: impl FnMut() -> bool) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while Instant::now() < deadline {
        if ready() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let tail: Vec<&str> = text.lines().rev().take(20).collect();
    Err(TestbedError::NotReady {
        what: what.to_string(),
        secs,
        log: log.display().to_string(),
        tail: tail.into_iter().rev().collect::<Vec<_>>().join("\n"),
    })
}

/// Sends one HTTP/1.1 request on a fresh connection and returns (status, body).
/// Only for the testbed's own control and health checks on 127.0.0.1.
pub fn http(port: u16, method: &str, path: &str, body: Option<&str>) -> std::io::Result<(u16, String)> {
    http_to("127.0.0.1", port, method, path, body)
}

/// [`http`] to another of the testbed's own addresses (the store side of
/// the `bottleneck` profile's link).
pub fn http_to(host: &str, port: u16, method: &str, path: &str, body: Option<&str>) -> std::io::Result<(u16, String)> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect((host, port))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    let body = body.unwrap_or("");
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )?;
    let mut response = String::new();
    s.read_to_string(&mut response)?;
    let status = response.get(9..12).and_then(|c| c.parse().ok()).unwrap_or(0);
    let body = response.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default();
    Ok((status, body))
}
