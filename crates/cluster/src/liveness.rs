//! Which of a cluster's workers are up: [`Liveness`]. A worker that a
//! failed statement could not reach is marked down for [`DOWN_FOR`]; new
//! statements plan on the others, and after that time it is tried again
//! (a restarted worker comes back by itself).
//!
//! Finding who is down after a failure: every worker that refuses a
//! connection, or closes it instead of answering an HTTP/2 preface
//! ([`PROBE_TIMEOUT`] bounds each step; a worker too busy to answer in
//! time is alive). Errors mid-stream ("broken pipe", an HTTP/2 error)
//! often name no worker, so the probe is what finds it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use url::Url;

/// How long a worker found down is left out of new statements.
pub const DOWN_FOR: Duration = Duration::from_secs(30);
/// How long a probe waits for a worker to accept a connection.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(1);

/// The workers and which are down (cheap to clone; clones share it).
#[derive(Debug, Clone)]
pub struct Liveness {
    all: Arc<[Url]>,
    down: Arc<Mutex<HashMap<Url, Instant>>>,
}

impl Liveness {
    /// Every worker up.
    pub fn new(all: Arc<[Url]>) -> Self {
        Liveness { all, down: Arc::default() }
    }

    /// The workers not marked down (in the cluster's order).
    pub fn up(&self) -> Vec<Url> {
        let mut down = self.down.lock().expect("not poisoned");
        down.retain(|_, since| since.elapsed() < DOWN_FOR);
        self.all.iter().filter(|u| !down.contains_key(*u)).cloned().collect()
    }

    /// Marks `url` down from now.
    pub fn mark_down(&self, url: &Url) {
        self.down.lock().expect("not poisoned").insert(url.clone(), Instant::now());
    }

    /// The up workers that do not answer now; each is marked down. An
    /// error that names a worker proves nothing by itself (a worker can be
    /// named by a TLS or token error while it serves): only the probe
    /// decides.
    pub async fn probe(&self) -> Vec<Url> {
        let mut found = Vec::new();
        for url in self.up() {
            if !accepts(&url).await {
                self.mark_down(&url);
                found.push(url);
            }
        }
        found
    }
}

/// Whether the worker at `url` is alive. Down: it refuses (or does not
/// complete) a connection within [`PROBE_TIMEOUT`], or for `http://` it
/// closes or resets the connection instead of answering the HTTP/2
/// preface — a process being killed can still complete a handshake, and
/// its socket is reset as it goes. Up: it answers with its SETTINGS, or
/// holds the connection without answering within the timeout (a worker
/// whose threads are all busy with a query answers late, and is alive).
async fn accepts(url: &Url) -> bool {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (Some(host), Some(port)) = (url.host_str(), url.port_or_known_default()) else { return false };
    let host = host.trim_start_matches('[').trim_end_matches(']').to_string();
    let Ok(Ok(mut s)) = tokio::time::timeout(PROBE_TIMEOUT, tokio::net::TcpStream::connect((host.as_str(), port))).await else { return false };
    if url.scheme() == "https" {
        return true;
    }
    // The client preface, then an empty SETTINGS frame.
    if s.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00").await.is_err() {
        return false;
    }
    let mut header = [0u8; 9];
    match tokio::time::timeout(PROBE_TIMEOUT, s.read_exact(&mut header)).await {
        // A frame of type 4 (SETTINGS) on stream 0.
        Ok(Ok(_)) => header[3] == 4 && header[5..9] == [0, 0, 0, 0],
        Ok(Err(_)) => false,
        Err(_) => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_worker_that_refuses_is_silent_or_is_named_is_down_for_a_while() {
        // An HTTP/2 server that answers the preface with its SETTINGS.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let up = Url::parse(&format!("http://{}", listener.local_addr().unwrap())).unwrap();
        tokio::spawn(async move {
            loop {
                let (mut s, _) = listener.accept().await.unwrap();
                tokio::spawn(async move {
                    use tokio::io::{AsyncReadExt, AsyncWriteExt};
                    let mut preface = [0u8; 33];
                    if s.read_exact(&mut preface).await.is_ok() {
                        let _ = s.write_all(&[0, 0, 0, 4, 0, 0, 0, 0, 0]).await;
                        let _ = s.read(&mut [0u8; 1]).await;
                    }
                });
            }
        });
        // A socket that holds the connection without answering: a busy
        // worker, up; once it is closed (the process went away), down.
        let silent_listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let silent = Url::parse(&format!("http://{}", silent_listener.local_addr().unwrap())).unwrap();
        let live = Liveness::new(vec![silent.clone()].into());
        assert!(live.probe().await.is_empty(), "a busy worker is up");
        let closing = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(200));
            drop(silent_listener);
        });
        assert_eq!(live.probe().await, vec![silent], "a worker whose socket goes away during the probe is down");
        closing.join().unwrap();
        let gone = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            Url::parse(&format!("http://{}", l.local_addr().unwrap())).unwrap()
        };
        let live = Liveness::new(vec![up.clone(), gone.clone()].into());
        assert_eq!(live.probe().await, vec![gone.clone()]);
        assert_eq!(live.up(), vec![up.clone()]);
        assert!(live.probe().await.is_empty(), "a serving worker stays up");
        live.mark_down(&up);
        assert!(live.up().is_empty());
    }
}
