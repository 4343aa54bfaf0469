//! Which of a cluster's workers are up: [`Liveness`]. A worker that a
//! failed statement could not reach is marked down for [`DOWN_FOR`]; new
//! statements plan on the others, and after that time it is tried again
//! (a restarted worker comes back by itself).
//!
//! Finding who is down after a failure: every worker that does not answer
//! an HTTP/2 connection preface within
//! [`PROBE_TIMEOUT`] (a killed process refuses or stays silent; a hung
//! machine times out). Errors mid-stream ("broken pipe", an HTTP/2 error)
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

/// Whether the worker at `url` is serving: for `http://`, it answers the
/// HTTP/2 connection preface with its SETTINGS frame; for `https://`, it
/// accepts a connection. Accepting alone is not enough: a process being
/// killed can still have its listening socket open while its threads are
/// gone (the kernel completes the handshake), which is exactly when a
/// statement's streams from it break.
async fn accepts(url: &Url) -> bool {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (Some(host), Some(port)) = (url.host_str(), url.port_or_known_default()) else { return false };
    let host = host.trim_start_matches('[').trim_end_matches(']').to_string();
    let https = url.scheme() == "https";
    let probe = async move {
        let mut s = tokio::net::TcpStream::connect((host.as_str(), port)).await?;
        if https {
            return Ok::<bool, std::io::Error>(true);
        }
        // The client preface, then an empty SETTINGS frame.
        s.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00").await?;
        let mut header = [0u8; 9];
        s.read_exact(&mut header).await?;
        // A frame of type 4 (SETTINGS) on stream 0.
        Ok(header[3] == 4 && header[5..9] == [0, 0, 0, 0])
    };
    matches!(tokio::time::timeout(PROBE_TIMEOUT, probe).await, Ok(Ok(true)))
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
        // A socket that accepts but never answers (a process being killed).
        let silent_listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let silent = Url::parse(&format!("http://{}", silent_listener.local_addr().unwrap())).unwrap();
        let live = Liveness::new(vec![silent.clone()].into());
        assert_eq!(live.probe().await, vec![silent], "a silent worker is down");
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
