//! A minimal client of toxiproxy's HTTP API (proxies and toxics).
//!
//! Toxiproxy is driven over 127.0.0.1 with a handful of JSON calls; a plain
//! HTTP/1.1 exchange is all it needs, so no HTTP client crate is pulled in.

use serde::Serialize;
use serde_json::json;

use crate::error::{Result, TestbedError};
use crate::process::http;

/// One toxic: a behaviour applied to a fraction (`toxicity`) of the
/// connections through a proxy, on the server-to-client direction.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Toxic {
    /// Unique name within the proxy.
    pub name: String,
    /// toxiproxy's toxic type: latency, bandwidth, timeout, reset_peer, limit_data, slicer.
    #[serde(rename = "type")]
    pub kind: String,
    /// Always "downstream": responses are shaped, requests pass.
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
}

/// Handle on a running toxiproxy server.
#[derive(Debug, Clone, Copy)]
pub struct Toxiproxy {
    /// Port of the HTTP API on 127.0.0.1.
    pub api_port: u16,
}

impl Toxiproxy {
    fn call(&self, method: &str, path: &str, body: Option<serde_json::Value>) -> Result<String> {
        let text = body.map(|b| b.to_string());
        let request = format!("{method} {path}");
        let (status, response) = http(self.api_port, method, path, text.as_deref())
            .map_err(|e| TestbedError::Toxiproxy { request: request.clone(), message: e.to_string() })?;
        if !(200..300).contains(&status) {
            return Err(TestbedError::Toxiproxy { request, message: format!("HTTP {status}: {response}") });
        }
        Ok(response)
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
