//! A MinIO server for the tests of one process.
//!
//! Started on first use on a free 127.0.0.1 port with a fresh data directory.
//! Buckets are created by making top-level directories before start (MinIO's
//! single-drive mode serves them as buckets), so no admin client is needed.
//! The child gets `PR_SET_PDEATHSIG`, from a thread that lives as long as the
//! process: when the test process exits, the kernel kills MinIO.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The bucket every test uses (each test under its own prefix).
pub const TEST_BUCKET: &str = "blobhouse-test";
/// Credentials of the test server.
pub const ACCESS_KEY: &str = "blobhouse-test-user";
pub const SECRET_KEY: &str = "blobhouse-test-secret";

/// A running MinIO.
#[derive(Debug)]
pub struct MinioServer {
    /// `http://127.0.0.1:PORT`
    pub endpoint: String,
    /// The server's data directory.
    pub data_dir: PathBuf,
}

static SERVER: OnceLock<Result<MinioServer, String>> = OnceLock::new();

impl MinioServer {
    /// The process-wide server, started on first call. Panics with
    /// instructions when MinIO is not installed: the S3 tests must not be
    /// silently skipped.
    pub fn shared() -> &'static MinioServer {
        match SERVER.get_or_init(start) {
            Ok(s) => s,
            Err(e) => panic!("{e}"),
        }
    }

    /// A fresh `s3://` URL under the test bucket.
    pub fn fresh_url(&self, name: &str) -> String {
        static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        format!("s3://{TEST_BUCKET}/{name}-{}-{n}", std::process::id())
    }

    /// Environment-free settings to reach this server.
    pub fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("AWS_ACCESS_KEY_ID", ACCESS_KEY.to_string()),
            ("AWS_SECRET_ACCESS_KEY", SECRET_KEY.to_string()),
            ("AWS_REGION", "us-east-1".to_string()),
            ("AWS_ENDPOINT_URL", self.endpoint.clone()),
            ("AWS_ALLOW_HTTP", "true".to_string()),
        ]
    }
}

fn minio_binary() -> Option<PathBuf> {
    if let Ok(p) = std::env::var("MINIO_BIN") {
        return Some(PathBuf::from(p));
    }
    let mut candidates = Vec::new();
    if let Ok(gobin) = std::env::var("GOBIN") {
        candidates.push(PathBuf::from(gobin).join("minio"));
    }
    if let Ok(gopath) = std::env::var("GOPATH") {
        candidates.push(PathBuf::from(gopath).join("bin/minio"));
    }
    if let Ok(home) = std::env::var("HOME") {
        candidates.push(PathBuf::from(home).join("go/bin/minio"));
    }
    if let Ok(path) = std::env::var("PATH") {
        candidates.extend(std::env::split_paths(&path).map(|p| p.join("minio")));
    }
    candidates.into_iter().find(|p| p.is_file())
}

fn free_port() -> std::io::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

fn start() -> Result<MinioServer, String> {
    let bin = minio_binary().ok_or_else(|| {
        "MinIO is not installed: run scripts/install-test-deps.sh (go install of the pinned MinIO), or set MINIO_BIN".to_string()
    })?;
    remove_stale_data_dirs();
    let data_dir = std::env::temp_dir().join(format!("blobhouse-minio-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&data_dir);
    std::fs::create_dir_all(data_dir.join(TEST_BUCKET)).map_err(|e| format!("cannot create MinIO data dir: {e}"))?;
    let port = free_port().map_err(|e| e.to_string())?;
    let console = free_port().map_err(|e| e.to_string())?;
    let log_path = data_dir.with_extension("log");
    let log = std::fs::File::create(&log_path).map_err(|e| e.to_string())?;
    let (tx, rx) = std::sync::mpsc::channel();
    let dir = data_dir.clone();
    // The spawning thread must outlive the tests: PDEATHSIG fires when the
    // thread that forked the child exits.
    std::thread::Builder::new()
        .name("minio-parent".into())
        .spawn(move || {
            let mut cmd = Command::new(&bin);
            cmd.arg("server")
                .arg("--quiet")
                .arg("--address")
                .arg(format!("127.0.0.1:{port}"))
                .arg("--console-address")
                .arg(format!("127.0.0.1:{console}"))
                .arg(&dir)
                .env("MINIO_ROOT_USER", ACCESS_KEY)
                .env("MINIO_ROOT_PASSWORD", SECRET_KEY)
                .env("MINIO_BROWSER", "off")
                .env("MINIO_UPDATE", "off")
                .stdin(Stdio::null())
                .stdout(log.try_clone().expect("log handle"))
                .stderr(log);
            unsafe {
                use std::os::unix::process::CommandExt;
                cmd.pre_exec(|| {
                    if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
            match cmd.spawn() {
                Ok(mut child) => {
                    let _ = tx.send(Ok(()));
                    let _ = child.wait();
                }
                Err(e) => {
                    let _ = tx.send(Err(format!("cannot start {}: {e}", bin.display())));
                }
            }
            // Keep this thread alive until the process exits.
            loop {
                std::thread::park();
            }
        })
        .map_err(|e| e.to_string())?;
    rx.recv().map_err(|e| e.to_string())??;
    let endpoint = format!("http://127.0.0.1:{port}");
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        if health_ok(port) {
            return Ok(MinioServer { endpoint, data_dir });
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let log = std::fs::read_to_string(&log_path).unwrap_or_default();
    Err(format!("MinIO did not become ready on port {port} within 60 s; its log:\n{log}"))
}

/// Data directories of test processes that no longer run (their MinIO died
/// with them) are deleted, so repeated runs do not fill the disk.
fn remove_stale_data_dirs() {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else { return };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().to_string();
        let Some(pid) = name.strip_prefix("blobhouse-minio-").map(|p| p.trim_end_matches(".log")) else { continue };
        let Ok(pid) = pid.parse::<u32>() else { continue };
        if pid != std::process::id() && !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            let p = entry.path();
            let _ = if p.is_dir() { std::fs::remove_dir_all(&p) } else { std::fs::remove_file(&p) };
        }
    }
}

fn health_ok(port: u16) -> bool {
    let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else { return false };
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    if s.write_all(b"GET /minio/health/live HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n").is_err() {
        return false;
    }
    let mut buf = [0u8; 16];
    matches!(s.read(&mut buf), Ok(n) if n >= 12 && &buf[9..12] == b"200")
}
