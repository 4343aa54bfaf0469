//! A minimal client of toxiproxy's HTTP API (proxies and toxics).
//!
//! Toxiproxy is driven over 127.0.0.1 with a handful of JSON calls; a plain
//! HTTP/1.1 exchange is all it needs, so no HTTP client crate is pulled in.

use serde::Serialize;
use serde_json::json;

use crate::error::{Result, TestbedError};
use crate::process::http;

/// One toxic: a behaviour applied to a fraction (`toxicity`) of the
/// connections through a proxy, on one direction.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Toxic {
    /// Unique name within the proxy.
    pub name: String,
    /// toxiproxy's toxic type: latency, bandwidth, timeout, reset_peer, limit_data, slicer.
    #[serde(rename = "type")]
    pub kind: String,
    /// "downstream" shapes responses, "upstream" requests.
    pub stream: String,
    /// Probability that a new connection gets this toxic.
    pub toxicity: f32,
    /// Type-specific parameters (e.g. `{"latency": 30, "jitter": 5}`).
    pub attributes: serde_json::Value,
}

impl Toxic {
    /// A downstream toxic.
    pub fn new(name: &str, kind: &str, toxicity: f32, attributes: serde_json::Value) -> Toxic {
        Toxic { name: name.into(), kind: kind.into(), stream: "downstream".into(), toxicity, attributes }
    }

    /// An upstream toxic: it acts on what clients send.
    pub fn upstream(name: &str, kind: &str, toxicity: f32, attributes: serde_json::Value) -> Toxic {
        Toxic { stream: "upstream".into(), ..Toxic::new(name, kind, toxicity, attributes) }
    }
}

/// Handle on a running toxiproxy server.
#[derive(Debug, Clone, Copy)]
pub struct Toxiproxy {
    /// Port of the HTTP API on 127.0.0.1.
    pub api_port: u16,
}

/// Attempts of one API call. Under load (a benchmark's queries and the
/// servers on two cores) toxiproxy once closed a connection without an
/// answer, and re-shaping the testbed failed.
const ATTEMPTS: u32 = 3;

impl Toxiproxy {
    fn call(&self, method: &str, path: &str, body: Option<serde_json::Value>) -> Result<String> {
        let text = body.map(|b| b.to_string());
        let request = format!("{method} {path}");
        let mut attempt = 0;
        loop {
            attempt += 1;
            let (status, response) = match http(self.api_port, method, path, text.as_deref()) {
                // No answer at all (status 0: nothing parseable came back): try again.
                Ok((0, _)) | Err(_) if attempt < ATTEMPTS => {
                    std::thread::sleep(std::time::Duration::from_millis(100 * u64::from(attempt)));
                    continue;
                }
                Ok(answer) => answer,
                Err(e) => return Err(TestbedError::Toxiproxy { request, message: e.to_string() }),
            };
            // A creation whose answer was lost and that is then found to
            // exist was done by the first attempt.
            if status == 409 && method == "POST" && attempt > 1 {
                return Ok(response);
            }
            if !(200..300).contains(&status) {
                return Err(TestbedError::Toxiproxy { request, message: format!("HTTP {status}: {response}") });
            }
            return Ok(response);
        }
    }

    /// True when the API answers.
    pub fn ready(&self) -> bool {
        http(self.api_port, "GET", "/version", None).is_ok_and(|(s, _)| s == 200)
    }

    /// Creates (or replaces) proxy `name` listening on `listen_port`, forwarding to `upstream_port`.
    pub fn proxy(&self, name: &str, listen_port: u16, upstream_port: u16) -> Result<()> {
        let _ = self.call("DELETE", &format!("/proxies/{name}"), None);
        self.call(
            "POST",
            "/proxies",
            Some(json!({"name": name, "listen": format!("127.0.0.1:{listen_port}"), "upstream": format!("127.0.0.1:{upstream_port}"), "enabled": true})),
        )?;
        Ok(())
    }

    /// Points proxy `name` at another upstream port.
    pub fn set_upstream(&self, name: &str, upstream_port: u16) -> Result<()> {
        self.call("POST", &format!("/proxies/{name}"), Some(json!({"upstream": format!("127.0.0.1:{upstream_port}")})))?;
        Ok(())
    }

    /// Adds a toxic to proxy `name`.
    pub fn add_toxic(&self, proxy: &str, toxic: &Toxic) -> Result<()> {
        self.call("POST", &format!("/proxies/{proxy}/toxics"), Some(serde_json::to_value(toxic).expect("toxic serialises")))?;
        Ok(())
    }

    /// Removes every toxic of proxy `name`.
    pub fn clear_toxics(&self, proxy: &str) -> Result<()> {
        let listing = self.call("GET", &format!("/proxies/{proxy}/toxics"), None)?;
        let toxics: Vec<serde_json::Value> = serde_json::from_str(&listing).unwrap_or_default();
        for t in toxics {
            if let Some(name) = t.get("name").and_then(|n| n.as_str()) {
                self.call("DELETE", &format!("/proxies/{proxy}/toxics/{name}"), None)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::net::TcpListener;

    use super::*;

    /// Reads a whole request (headers and Content-Length body): closing a
    /// socket with unread bytes resets it, which can lose the answer.
    fn read_request(s: &mut std::net::TcpStream) {
        let mut got = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            let n = s.read(&mut buf).unwrap_or(0);
            got.extend_from_slice(&buf[..n]);
            let text = String::from_utf8_lossy(&got);
            if let Some((head, body)) = text.split_once("\r\n\r\n") {
                let length = head.lines().find_map(|l| l.strip_prefix("Content-Length: ")).and_then(|v| v.trim().parse::<usize>().ok()).unwrap_or(0);
                if body.len() >= length {
                    return;
                }
            }
            if n == 0 {
                return;
            }
        }
    }

    /// A server that closes its first `dropped` connections unanswered,
    /// then answers `status`; returns its port and how many it accepted.
    fn flaky_server(dropped: usize, status: u16) -> (u16, std::thread::JoinHandle<usize>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let handle = std::thread::spawn(move || {
            let mut accepted = 0;
            for stream in listener.incoming() {
                let mut s = stream.unwrap();
                accepted += 1;
                read_request(&mut s);
                if accepted > dropped {
                    write!(s, "HTTP/1.1 {status} X\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{{}}").unwrap();
                    return accepted;
                }
            }
            accepted
        });
        (port, handle)
    }

    #[test]
    fn a_call_left_unanswered_is_tried_again() {
        let (port, server) = flaky_server(1, 200);
        let t = Toxiproxy { api_port: port };
        assert_eq!(t.call("GET", "/version", None).unwrap(), "{}");
        assert_eq!(server.join().unwrap(), 2);
    }

    #[test]
    fn a_creation_found_existing_on_the_retry_is_done() {
        let (port, server) = flaky_server(1, 409);
        let t = Toxiproxy { api_port: port };
        assert!(t.add_toxic("p", &Toxic::new("t", "latency", 1.0, json!({}))).is_ok());
        assert_eq!(server.join().unwrap(), 2);
        // On a first attempt a conflict is an error.
        let (port, server) = flaky_server(0, 409);
        let err = Toxiproxy { api_port: port }.add_toxic("p", &Toxic::new("t", "latency", 1.0, json!({}))).unwrap_err();
        assert!(err.to_string().contains("HTTP 409"), "{err}");
        server.join().unwrap();
    }

    #[test]
    fn a_server_that_never_answers_fails_after_the_attempts() {
        let (port, server) = flaky_server(ATTEMPTS as usize, 200);
        let err = Toxiproxy { api_port: port }.call("GET", "/version", None).unwrap_err();
        assert!(err.to_string().contains("GET /version"), "{err}");
        // Unblock the server's last accept.
        let _ = http(port, "GET", "/", None);
        assert_eq!(server.join().unwrap(), ATTEMPTS as usize + 1);
    }
}
