//! Google Cloud Storage for a test process: fake-gcs-server (installed
//! pinned by `scripts/install-test-deps.sh`) behind a small loopback proxy,
//! started on first use and tied to the process, with a bucket for the
//! tests.
//!
//! The proxy completes the two things fake-gcs-server v1.56.1 lacks and
//! blobhouse needs, and passes everything else through unchanged:
//! - uploads: object_store writes with the XML API's `PUT /{bucket}/{object}`,
//!   which the fake refuses ("invalid uploadType"); the proxy sends the
//!   bytes as the JSON API's media upload and answers with the `ETag` and
//!   `x-goog-generation` headers a PUT would have;
//! - create-only-if-absent (`x-goog-if-generation-match: 0`), which the
//!   fake ignores: the proxy answers 412 itself when the object exists,
//!   checking and uploading under one lock, so two racing writers cannot
//!   both create an object (the rule every commit relies on).
//!
//! blobhouse reaches it as it reaches GCS: `gs://` URLs, a service account
//! (a generated key, `disable_oauth`: object_store signs its own tokens and
//! URLs) and the base URL (`StoreOptions::endpoint`).

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use blobhouse_testbed::process::{Lifetime, free_port, spawn, wait_ready};

/// The bucket the tests' databases live in.
pub const BUCKET: &str = "blobhouse-test";

/// The running emulator and proxy of this test process.
#[derive(Debug)]
pub struct GcsServer {
    /// The proxy's base URL, `http://127.0.0.1:PORT` (what blobhouse is given).
    pub endpoint: String,
    /// The service-account file (JSON) blobhouse signs with.
    pub service_account: PathBuf,
    /// Its working directory.
    pub dir: PathBuf,
}

static SERVER: OnceLock<Result<GcsServer, String>> = OnceLock::new();

impl GcsServer {
    /// The process-wide emulator, started on first call. Panics with
    /// instructions when it is not installed.
    pub fn shared() -> &'static GcsServer {
        crate::shared(&SERVER, start)
    }

    /// A fresh `gs://` URL in the test bucket.
    pub fn fresh_url(&self, name: &str) -> String {
        format!("gs://{BUCKET}/{}", crate::unique(name))
    }
}

fn binary() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("FAKE_GCS_BIN") {
        return Some(PathBuf::from(p));
    }
    let mut candidates: Vec<PathBuf> = std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/blobhouse-tools/fake-gcs/fake-gcs-server")).into_iter().collect();
    if let Some(path) = std::env::var_os("PATH") {
        candidates.extend(std::env::split_paths(&path).map(|d| d.join("fake-gcs-server")));
    }
    candidates.into_iter().find(|p| p.is_file())
}

fn start() -> Result<GcsServer, String> {
    let bin = binary().ok_or("fake-gcs-server is not installed: run scripts/install-test-deps.sh")?;
    let dir = std::env::temp_dir().join(format!("blobhouse-gcs-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    // A bucket is a folder of the data directory.
    std::fs::create_dir_all(dir.join("data").join(BUCKET)).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let port = free_port().map_err(|e| e.to_string())?;
    let log = dir.join("fake-gcs.log");
    let mut cmd = std::process::Command::new(bin);
    cmd.args(["-scheme", "http", "-host", "127.0.0.1", "-port", &port.to_string(), "-public-host", &format!("127.0.0.1:{port}"), "-log-level", "warn", "-data"]).arg(dir.join("data"));
    spawn("fake-gcs-server", cmd, &log, Lifetime::TiedToThisProcess).map_err(|e| format!("cannot start fake-gcs-server: {e}"))?;
    wait_ready("fake-gcs-server", &log, 60, || std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()).map_err(|e| e.to_string())?;
    let service_account = dir.join("service-account.json");
    write_service_account(&dir, &service_account)?;
    let endpoint = proxy(format!("http://127.0.0.1:{port}"))?;
    Ok(GcsServer { endpoint, service_account, dir })
}

/// A service account with a fresh RSA key (openssl) and `disable_oauth`.
fn write_service_account(dir: &std::path::Path, path: &std::path::Path) -> Result<(), String> {
    let key = dir.join("key.pem");
    let out = std::process::Command::new("openssl").args(["genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048", "-out"]).arg(&key).output().map_err(|e| format!("openssl: {e}"))?;
    if !out.status.success() {
        return Err(format!("openssl genpkey: {}", String::from_utf8_lossy(&out.stderr)));
    }
    let pem = std::fs::read_to_string(&key).map_err(|e| e.to_string())?;
    let json = serde_json::json!({
        "type": "service_account",
        "project_id": "blobhouse-test",
        "private_key_id": "test",
        "private_key": pem,
        "client_email": "blobhouse@blobhouse-test.iam.gserviceaccount.com",
        "disable_oauth": true,
    });
    std::fs::write(path, json.to_string()).map_err(|e| e.to_string())
}

/// Starts the proxy in front of `upstream` on a thread of its own; returns
/// its base URL.
fn proxy(upstream: String) -> Result<String, String> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    listener.set_nonblocking(true).map_err(|e| e.to_string())?;
    std::thread::Builder::new()
        .name("fake-gcs-proxy".into())
        .spawn(move || {
            let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("proxy runtime");
            runtime.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).expect("proxy listener");
                let state = Arc::new(Proxy { upstream, client: reqwest::Client::new(), creating: tokio::sync::Mutex::new(()) });
                let app = axum::Router::new().fallback(move |req: axum::extract::Request| {
                    let state = state.clone();
                    async move { state.handle(req).await }
                });
                axum::serve(listener, app).await.expect("proxy serves");
            });
        })
        .map_err(|e| e.to_string())?;
    Ok(format!("http://{addr}"))
}

struct Proxy {
    upstream: String,
    client: reqwest::Client,
    /// Held from the existence check to the upload of a create-only PUT.
    creating: tokio::sync::Mutex<()>,
}

type Reply = axum::response::Response;

fn reply(status: u16, headers: &[(&str, String)], body: Vec<u8>) -> Reply {
    let mut r = axum::response::Response::builder().status(status);
    for (k, v) in headers {
        r = r.header(*k, v);
    }
    r.body(axum::body::Body::from(body)).expect("a valid response")
}

impl Proxy {
    async fn handle(&self, req: axum::extract::Request) -> Reply {
        let (parts, body) = req.into_parts();
        let body = match axum::body::to_bytes(body, usize::MAX).await {
            Ok(b) => b,
            Err(e) => return reply(400, &[], e.to_string().into_bytes()),
        };
        let path = parts.uri.path().to_string();
        let query = parts.uri.query().map(str::to_string);
        // An XML-API upload: PUT /{bucket}/{object}, no multipart query.
        let object = path.strip_prefix('/').and_then(|p| p.split_once('/')).filter(|(b, o)| !b.is_empty() && !o.is_empty() && *b != "storage" && *b != "upload");
        if parts.method == axum::http::Method::PUT && query.is_none() && object.is_some() {
            let (bucket, object) = object.expect("checked");
            let create_only = parts.headers.get("x-goog-if-generation-match").is_some_and(|v| v == "0");
            return self.upload(bucket, object, create_only, body.to_vec()).await;
        }
        if parts.method == axum::http::Method::DELETE && query.is_none() && let Some((bucket, object)) = object {
            return self.forward(axum::http::Method::DELETE, &format!("/storage/v1/b/{bucket}/o/{object}"), None, &parts.headers, Vec::new()).await;
        }
        self.forward(parts.method, &path, query.as_deref(), &parts.headers, body.to_vec()).await
    }

    async fn upload(&self, bucket: &str, object: &str, create_only: bool, body: Vec<u8>) -> Reply {
        let _held = match create_only {
            true => Some(self.creating.lock().await),
            false => None,
        };
        if create_only {
            let there = self.client.get(format!("{}/storage/v1/b/{bucket}/o/{object}", self.upstream)).send().await;
            match there {
                Ok(r) if r.status().is_success() => {
                    return reply(412, &[], b"<Error><Code>PreconditionFailed</Code><Message>At least one of the pre-conditions you specified did not hold.</Message></Error>".to_vec());
                }
                Ok(_) => {}
                Err(e) => return reply(502, &[], e.to_string().into_bytes()),
            }
        }
        let name = percent_decode(object);
        let url = format!("{}/upload/storage/v1/b/{bucket}/o", self.upstream);
        let sent = self.client.post(url).query(&[("uploadType", "media"), ("name", name.as_str())]).body(body).send().await;
        let r = match sent {
            Ok(r) => r,
            Err(e) => return reply(502, &[], e.to_string().into_bytes()),
        };
        let status = r.status().as_u16();
        let text = r.bytes().await.map(|b| b.to_vec()).unwrap_or_default();
        if status != 200 {
            return reply(status, &[], text);
        }
        // The upload's object resource: its etag and generation are what a
        // PUT answers in headers.
        let resource: serde_json::Value = serde_json::from_slice(&text).unwrap_or_default();
        let field = |name: &str| resource.get(name).and_then(|v| v.as_str().map(str::to_string).or_else(|| v.as_i64().map(|n| n.to_string())));
        let etag = field("etag").unwrap_or_else(|| "\"0\"".into());
        let generation = field("generation").unwrap_or_else(|| "1".into());
        reply(200, &[("etag", etag), ("x-goog-generation", generation)], Vec::new())
    }

    async fn forward(&self, method: axum::http::Method, path: &str, query: Option<&str>, headers: &axum::http::HeaderMap, body: Vec<u8>) -> Reply {
        let url = match query {
            Some(q) => format!("{}{path}?{q}", self.upstream),
            None => format!("{}{path}", self.upstream),
        };
        let method = reqwest::Method::from_bytes(method.as_str().as_bytes()).expect("an HTTP method");
        let mut request = self.client.request(method, url).body(body);
        for (k, v) in headers {
            if k != "host" && k != "content-length" {
                request = request.header(k.as_str(), v.as_bytes());
            }
        }
        match request.send().await {
            Ok(r) => {
                let status = r.status().as_u16();
                let headers: Vec<(String, String)> = r.headers().iter().filter(|(k, _)| *k != "transfer-encoding" && *k != "content-length" && *k != "connection").map(|(k, v)| (k.to_string(), v.to_str().unwrap_or_default().to_string())).collect();
                let body = r.bytes().await.map(|b| b.to_vec()).unwrap_or_default();
                let headers: Vec<(&str, String)> = headers.iter().map(|(k, v)| (k.as_str(), v.clone())).collect();
                reply(status, &headers, body)
            }
            Err(e) => reply(502, &[], e.to_string().into_bytes()),
        }
    }
}

/// `%XX` escapes decoded (object names as object_store encodes them).
fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 3 <= bytes.len() && let Ok(b) = u8::from_str_radix(&s[i + 1..i + 3], 16) {
            out.push(b);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).to_string()
}
