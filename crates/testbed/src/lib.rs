//! The object-store testbed: cloud storage behaviour reproduced on one machine.
//!
//! Three real servers on 127.0.0.1 — MinIO (the S3 API), nginx (plain HTTP
//! range reads at little CPU) and toxiproxy in front of both — shaped by a
//! named [`Profile`]. One call brings a profile up ([`Testbed::up`],
//! idempotent: a running testbed is re-shaped), one brings everything down
//! ([`Testbed::down`], and no process is left). The CLI's `blobhouse testbed`
//! and the test harness both use this crate; docs/testbed.md explains the
//! profiles.
//!
//! Why by hand: no crate starts and shapes these servers together; the
//! process handling is small and the shaping is toxiproxy's.

pub mod error;
pub mod link;
pub mod process;
pub mod profile;
pub mod toxiproxy;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde::{Deserialize, Serialize};

pub use error::{Result, TestbedError};
pub use link::Link;
pub use process::Lifetime;
pub use profile::Profile;
pub use toxiproxy::{Toxic, Toxiproxy};

/// Bucket for benchmarks and manual use.
pub const BUCKET: &str = "testbed";
/// Bucket the test suite uses (each test under its own prefix).
pub const TEST_BUCKET: &str = "blobhouse-test";
/// Credentials of the testbed's MinIO.
pub const ACCESS_KEY: &str = "blobhouse-test-user";
pub const SECRET_KEY: &str = "blobhouse-test-secret";
/// Region the testbed answers for.
pub const REGION: &str = "us-east-1";

/// Attempts to start the servers before `up` gives up.
const START_ATTEMPTS: usize = 3;

/// Objects nginx serves for calibration: (label, size, count).
pub const CALIBRATION_OBJECTS: [(&str, usize, usize); 4] = [("1k", 1 << 10, 4), ("1m", 1 << 20, 4), ("4m", 4 << 20, 4), ("16m", 16 << 20, 8)];

/// Where everything of a running testbed is: ports, pids, profile.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct State {
    pub profile: String,
    pub pids: Vec<u32>,
    pub minio_port: u16,
    pub nginx_port: u16,
    pub nginx_throttled_port: u16,
    pub toxiproxy_api_port: u16,
    pub minio_proxy_port: u16,
    pub nginx_proxy_port: u16,
    /// nginx over HTTPS (certificate from the testbed's own CA, see
    /// [`Testbed::tls_ca`]), unshaped.
    #[serde(default)]
    pub nginx_tls_port: u16,
    /// nginx in front of MinIO answering a share of S3 requests with 503
    /// SlowDown, as S3 does under load; the `s3` profile's S3 proxy leads
    /// here (0: a testbed started before this existed).
    #[serde(default)]
    pub nginx_s3_port: u16,
    /// MinIO runs on the store side of a shaped link ([`Link`]): the
    /// `bottleneck` profile.
    #[serde(default)]
    pub bottleneck: bool,
}

/// How clients reach the testbed under its current profile.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoints {
    /// S3 endpoint (through the proxy unless the profile is `lan`).
    pub s3: String,
    /// Base URL of the plain-HTTP server (same rule).
    pub http: String,
    /// MinIO without shaping.
    pub s3_direct: String,
    /// nginx without shaping.
    pub http_direct: String,
}

/// A running testbed.
#[derive(Debug)]
pub struct Testbed {
    dir: PathBuf,
    state: State,
}

/// The default state directory of the CLI's testbed.
pub fn default_dir() -> PathBuf {
    std::env::var_os("BLOBHOUSE_TESTBED_DIR").map(PathBuf::from).unwrap_or_else(|| std::env::temp_dir().join("blobhouse-testbed"))
}

impl Testbed {
    /// Brings `profile` up in `dir`. A testbed already running there is
    /// re-shaped to the profile; one that died half-way is cleaned up first.
    pub fn up(dir: &Path, profile: Profile, lifetime: Lifetime) -> Result<Testbed> {
        if let Some(mut running) = Testbed::status(dir)? {
            if running.state.bottleneck != (profile == Profile::Bottleneck) {
                return Err(TestbedError::TopologyChange { from: running.profile().name(), to: profile.name() });
            }
            running.apply(profile)?;
            return Ok(running);
        }
        // A start can fail when another process takes a port between our
        // choosing it and the server binding it; try again with fresh ports.
        let mut last = None;
        for _ in 0..START_ATTEMPTS {
            Testbed::down(dir)?;
            std::fs::create_dir_all(dir)?;
            match Testbed::start(dir, lifetime, profile == Profile::Bottleneck) {
                Ok(mut tb) => {
                    tb.apply(profile)?;
                    return Ok(tb);
                }
                Err(e @ TestbedError::MissingTool { .. }) => return Err(e),
                Err(e) => last = Some(e),
            }
        }
        Err(last.expect("at least one attempt"))
    }

    /// The testbed running in `dir`, if all its servers are alive.
    pub fn status(dir: &Path) -> Result<Option<Testbed>> {
        let path = dir.join("state.json");
        let Ok(text) = std::fs::read_to_string(&path) else { return Ok(None) };
        let state: State = serde_json::from_str(&text).map_err(|e| TestbedError::State { path: path.display().to_string(), message: e.to_string() })?;
        if state.pids.iter().all(|&p| process::alive(p)) {
            Ok(Some(Testbed { dir: dir.to_path_buf(), state }))
        } else {
            Ok(None)
        }
    }

    /// Stops every server of the testbed in `dir` and deletes its files.
    /// Returns the pids it stopped. Idempotent.
    pub fn down(dir: &Path) -> Result<Vec<u32>> {
        let path = dir.join("state.json");
        let mut stopped = Vec::new();
        if let Ok(text) = std::fs::read_to_string(&path) {
            if let Ok(state) = serde_json::from_str::<State>(&text) {
                for &pid in state.pids.iter().rev() {
                    if process::alive(pid) {
                        if !process::stop(pid, Duration::from_secs(5)) {
                            return Err(TestbedError::State { path: path.display().to_string(), message: format!("process {pid} did not stop") });
                        }
                        stopped.push(pid);
                    }
                }
                if state.bottleneck {
                    Link::for_port(state.minio_port).delete();
                }
            }
        }
        if dir.exists() {
            std::fs::remove_dir_all(dir)?;
        }
        Ok(stopped)
    }

    fn start(dir: &Path, lifetime: Lifetime, bottleneck: bool) -> Result<Testbed> {
        let minio = tools::minio()?;
        let toxiproxy = tools::toxiproxy()?;
        let nginx = tools::nginx()?;
        let state = State {
            profile: Profile::Lan.name().into(),
            pids: Vec::new(),
            minio_port: process::free_port()?,
            nginx_port: process::free_port()?,
            nginx_throttled_port: process::free_port()?,
            toxiproxy_api_port: process::free_port()?,
            minio_proxy_port: process::free_port()?,
            nginx_proxy_port: process::free_port()?,
            nginx_tls_port: process::free_port()?,
            nginx_s3_port: process::free_port()?,
            bottleneck,
        };
        let mut tb = Testbed { dir: dir.to_path_buf(), state };
        // Record the state before anything runs, so `down` can always clean up.
        tb.save()?;
        let result = tb.start_servers(&minio, &toxiproxy, &nginx, lifetime);
        if let Err(e) = result {
            let _ = Testbed::down(dir);
            return Err(e);
        }
        Ok(tb)
    }

    fn start_servers(&mut self, minio: &Path, toxiproxy: &Path, nginx: &Path, lifetime: Lifetime) -> Result<()> {
        let dir = self.dir.clone();
        // MinIO serves top-level directories of its (single) drive as buckets.
        let data = dir.join("minio-data");
        for bucket in [BUCKET, TEST_BUCKET] {
            std::fs::create_dir_all(data.join(bucket))?;
        }
        // Under the bottleneck profile MinIO listens on the store side of
        // the link, inside the testbed's namespace.
        let (mut cmd, host) = match self.link() {
            Some(link) => {
                link.create(Link::configured_mbit()?)?;
                (link.store_side(minio), link.store_ip)
            }
            None => (Command::new(minio), "127.0.0.1".to_string()),
        };
        cmd.args(["server", "--quiet", "--address"])
            .arg(format!("{host}:{}", self.state.minio_port))
            .arg("--console-address")
            .arg(format!("{host}:{}", process::free_port()?))
            .arg(&data)
            .env("MINIO_ROOT_USER", ACCESS_KEY)
            .env("MINIO_ROOT_PASSWORD", SECRET_KEY)
            .env("MINIO_BROWSER", "off")
            .env("MINIO_UPDATE", "off");
        let log = dir.join("minio.log");
        self.state.pids.push(process::spawn("minio", cmd, &log, lifetime)?);
        self.save()?;

        std::fs::create_dir_all(dir.join("www"))?;
        std::fs::write(dir.join("www/health"), b"ok")?;
        std::fs::create_dir_all(dir.join("nginx-tmp"))?;
        make_certificates(&dir.join("tls"))?;
        let conf = dir.join("nginx.conf");
        std::fs::write(&conf, nginx_config(&dir, &self.state))?;
        let mut cmd = Command::new(nginx);
        cmd.arg("-c").arg(&conf).arg("-p").arg(&dir).arg("-e").arg(dir.join("nginx-error.log"));
        let nginx_log = dir.join("nginx.log");
        self.state.pids.push(process::spawn("nginx", cmd, &nginx_log, lifetime)?);
        self.save()?;

        let mut cmd = Command::new(toxiproxy);
        cmd.args(["-host", "127.0.0.1", "-port"]).arg(self.state.toxiproxy_api_port.to_string());
        let toxi_log = dir.join("toxiproxy.log");
        self.state.pids.push(process::spawn("toxiproxy", cmd, &toxi_log, lifetime)?);
        self.save()?;

        let minio_port = self.state.minio_port;
        let minio_host = self.link().map_or("127.0.0.1".to_string(), |l| l.store_ip);
        // `/minio/health/live` answers 200 as soon as the HTTP listener is up,
        // before the object layer is initialised; S3 requests then get 503
        // `XMinioServerNotInitialized` (a CI run failed that way). Wait for
        // readiness and for a real S3 request on the test bucket to be answered
        // by the object layer (403 for this unsigned request, never 503).
        process::wait_ready("MinIO", &log, 60, || {
            let ready = process::http_to(&minio_host, minio_port, "GET", "/minio/health/ready", None).is_ok_and(|(s, _)| s == 200);
            ready && process::http_to(&minio_host, minio_port, "GET", &format!("/{TEST_BUCKET}/"), None).is_ok_and(|(s, _)| s != 503 && s != 0)
        })?;
        let nginx_port = self.state.nginx_port;
        process::wait_ready("nginx", &nginx_log, 20, || process::http(nginx_port, "GET", "/health", None).is_ok_and(|(s, _)| s == 200))?;
        let api = self.toxiproxy();
        process::wait_ready("toxiproxy", &toxi_log, 20, || api.ready())?;
        api.proxy("minio", self.state.minio_proxy_port, self.state.minio_port)?;
        api.proxy("nginx", self.state.nginx_proxy_port, self.state.nginx_port)?;
        Ok(())
    }

    /// Shapes the proxies for `profile`.
    pub fn apply(&mut self, profile: Profile) -> Result<()> {
        let api = self.toxiproxy();
        for proxy in ["minio", "nginx"] {
            api.clear_toxics(proxy)?;
            for toxic in profile.toxics() {
                api.add_toxic(proxy, &toxic)?;
            }
        }
        let upstream = if profile.throttled() { self.state.nginx_throttled_port } else { self.state.nginx_port };
        api.set_upstream("nginx", upstream)?;
        let s3 = match profile.slows_down() && self.state.nginx_s3_port != 0 {
            true => self.state.nginx_s3_port,
            false => self.state.minio_port,
        };
        api.set_upstream("minio", s3)?;
        self.state.profile = profile.name().into();
        self.save()
    }

    fn save(&self) -> Result<()> {
        let path = self.dir.join("state.json");
        let tmp = self.dir.join("state.json.tmp");
        std::fs::write(&tmp, serde_json::to_vec_pretty(&self.state).expect("state serialises"))?;
        std::fs::rename(&tmp, &path)?;
        Ok(())
    }

    /// The current profile.
    pub fn profile(&self) -> Profile {
        Profile::parse(&self.state.profile).unwrap_or(Profile::Lan)
    }

    /// The shaped link to the store side (the `bottleneck` profile).
    pub fn link(&self) -> Option<Link> {
        self.state.bottleneck.then(|| Link::for_port(self.state.minio_port))
    }

    /// Ports and pids.
    pub fn state(&self) -> &State {
        &self.state
    }

    /// The state directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The toxiproxy API, for tests that inject their own faults.
    pub fn toxiproxy(&self) -> Toxiproxy {
        Toxiproxy { api_port: self.state.toxiproxy_api_port }
    }

    /// Writes the calibration objects nginx serves (`/cal/<label>-<i>`), once.
    pub fn ensure_calibration_objects(&self) -> Result<()> {
        write_calibration_objects(&self.dir.join("www"))
    }

    /// Where clients connect under the current profile.
    pub fn endpoints(&self) -> Endpoints {
        let url = |p: u16| format!("http://127.0.0.1:{p}");
        let s3_direct = match self.link() {
            Some(link) => format!("http://{}:{}", link.store_ip, self.state.minio_port),
            None => url(self.state.minio_port),
        };
        let http_direct = url(self.state.nginx_port);
        if self.profile().direct() {
            Endpoints { s3: s3_direct.clone(), http: http_direct.clone(), s3_direct, http_direct }
        } else {
            Endpoints { s3: url(self.state.minio_proxy_port), http: url(self.state.nginx_proxy_port), s3_direct, http_direct }
        }
    }

    /// nginx over HTTPS, unshaped (`https://127.0.0.1:<port>`).
    pub fn https_endpoint(&self) -> String {
        format!("https://127.0.0.1:{}", self.state.nginx_tls_port)
    }

    /// The PEM file of the CA that signed the HTTPS endpoint's certificate.
    pub fn tls_ca(&self) -> PathBuf {
        self.dir.join("tls/ca.pem")
    }

    /// AWS_* settings that point S3 clients at the testbed.
    pub fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("AWS_ENDPOINT_URL", self.endpoints().s3),
            ("AWS_ACCESS_KEY_ID", ACCESS_KEY.into()),
            ("AWS_SECRET_ACCESS_KEY", SECRET_KEY.into()),
            ("AWS_REGION", REGION.into()),
            ("AWS_ALLOW_HTTP", "true".into()),
        ]
    }
}

/// A CA of the testbed's own and a server certificate it signed for
/// 127.0.0.1 and localhost, made with the openssl command-line tool (clients
/// trust the CA through [`Testbed::tls_ca`]; tests of other TLS servers use
/// them too): `ca.pem`, `cert.pem` and `key.pem` in `tls`.
pub fn make_certificates(tls: &Path) -> Result<()> {
    if tls.join("cert.pem").exists() {
        return Ok(());
    }
    std::fs::create_dir_all(tls)?;
    std::fs::write(tls.join("leaf.ext"), "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n")?;
    let ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"];
    let steps: [Vec<&str>; 3] = [
        [&["req", "-x509"][..], &ec, &["-keyout", "ca.key", "-out", "ca.pem", "-days", "30", "-subj", "/CN=blobhouse testbed CA", "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign"]].concat(),
        [&["req"][..], &ec, &["-keyout", "key.pem", "-out", "leaf.csr", "-subj", "/CN=localhost"]].concat(),
        vec!["x509", "-req", "-in", "leaf.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial", "-out", "cert.pem", "-days", "30", "-extfile", "leaf.ext"],
    ];
    for args in steps {
        let out = Command::new("openssl").args(&args).current_dir(tls).output().map_err(|e| TestbedError::Tool { tool: "openssl".into(), message: format!("{e} (install it: apt-get install openssl, or run scripts/install-test-deps.sh)") })?;
        if !out.status.success() {
            return Err(TestbedError::Tool { tool: "openssl".into(), message: format!("openssl {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim()) });
        }
    }
    Ok(())
}

fn nginx_config(dir: &Path, state: &State) -> String {
    let d = dir.display();
    let (port, throttled_port, tls_port) = (state.nginx_port, state.nginx_throttled_port, state.nginx_tls_port);
    let (s3_port, minio_port) = (state.nginx_s3_port, state.minio_port);
    let (rate, burst) = (profile::THROTTLE_RATE, profile::THROTTLE_BURST);
    let slowdown = format!("{:.2}%", profile::SLOWDOWN_SHARE * 100.0);
    format!(
        r#"# Generated by blobhouse-testbed. One process, no daemon: the testbed owns it.
daemon off;
master_process off;
user root;
pid {d}/nginx.pid;
error_log {d}/nginx-error.log warn;
events {{ worker_connections 8192; }}
http {{
  access_log off;
  sendfile on;
  tcp_nopush on;
  keepalive_requests 1000000;
  keepalive_timeout 300s;
  client_body_temp_path {d}/nginx-tmp/body;
  proxy_temp_path {d}/nginx-tmp/proxy;
  fastcgi_temp_path {d}/nginx-tmp/fastcgi;
  uwsgi_temp_path {d}/nginx-tmp/uwsgi;
  scgi_temp_path {d}/nginx-tmp/scgi;
  limit_req_zone $server_port zone=throttle:1m rate={rate}r/s;
  server {{
    listen 127.0.0.1:{port};
    root {d}/www;
    # Uploads (plain-HTTP PUT tests of the download manager).
    location /upload/ {{ dav_methods PUT; create_full_put_path on; client_max_body_size 0; }}
  }}
  server {{
    listen 127.0.0.1:{tls_port} ssl;
    ssl_certificate {d}/tls/cert.pem;
    ssl_certificate_key {d}/tls/key.pem;
    root {d}/www;
    location /upload/ {{ dav_methods PUT; create_full_put_path on; client_max_body_size 0; }}
  }}
  server {{
    listen 127.0.0.1:{throttled_port};
    root {d}/www;
    limit_req zone=throttle burst={burst} nodelay;
    limit_req_status 503;
  }}
  # S3 through nginx: a random share of requests is answered 503 SlowDown
  # before reaching MinIO; the rest pass unchanged (Host and URI as signed,
  # bodies streamed both ways).
  split_clients "${{request_id}}" $s3_slowdown {{ {slowdown} 1; * ""; }}
  upstream minio {{ server 127.0.0.1:{minio_port}; keepalive 64; }}
  server {{
    listen 127.0.0.1:{s3_port};
    client_max_body_size 0;
    if ($s3_slowdown) {{
      return 503 '<?xml version="1.0" encoding="UTF-8"?><Error><Code>SlowDown</Code><Message>Please reduce your request rate. (blobhouse testbed)</Message></Error>';
    }}
    location / {{
      proxy_pass http://minio;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_set_header Host $http_host;
      proxy_request_buffering off;
      proxy_buffering off;
      proxy_read_timeout 300s;
    }}
  }}
}}
"#
    )
}

/// Deterministic, incompressible calibration objects under `www/cal/`.
fn write_calibration_objects(www: &Path) -> Result<()> {
    let cal = www.join("cal");
    let (last_label, last_size, last_count) = CALIBRATION_OBJECTS[CALIBRATION_OBJECTS.len() - 1];
    if std::fs::metadata(cal.join(format!("{last_label}-{}", last_count - 1))).is_ok_and(|m| m.len() == last_size as u64) {
        return Ok(());
    }
    std::fs::create_dir_all(&cal)?;
    let mut seed = 0x9E37_79B9_7F4A_7C15u64;
    for (label, size, count) in CALIBRATION_OBJECTS {
        for i in 0..count {
            let mut bytes = Vec::with_capacity(size);
            while bytes.len() < size {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                bytes.extend_from_slice(&seed.to_le_bytes());
            }
            bytes.truncate(size);
            std::fs::write(cal.join(format!("{label}-{i}")), bytes)?;
        }
    }
    Ok(())
}

/// Where the servers' binaries are.
pub mod tools {
    use std::path::PathBuf;

    use crate::error::{Result, TestbedError};

    const INSTALL: &str = "run scripts/install-test-deps.sh";

    fn find(env: &str, candidates: Vec<PathBuf>, path_names: &[&str]) -> Option<PathBuf> {
        if let Some(p) = std::env::var_os(env) {
            return Some(PathBuf::from(p));
        }
        let mut all = candidates;
        if let Some(path) = std::env::var_os("PATH") {
            for dir in std::env::split_paths(&path) {
                all.extend(path_names.iter().map(|n| dir.join(n)));
            }
        }
        all.into_iter().find(|p| p.is_file())
    }

    fn home(rel: &str) -> Vec<PathBuf> {
        std::env::var_os("HOME").map(|h| vec![PathBuf::from(h).join(rel)]).unwrap_or_default()
    }

    /// The MinIO server (MINIO_BIN, GOBIN, GOPATH/bin, ~/go/bin, PATH).
    pub fn minio() -> Result<PathBuf> {
        let mut c = Vec::new();
        for var in ["GOBIN"] {
            if let Some(p) = std::env::var_os(var) {
                c.push(PathBuf::from(p).join("minio"));
            }
        }
        if let Some(p) = std::env::var_os("GOPATH") {
            c.push(PathBuf::from(p).join("bin/minio"));
        }
        c.extend(home("go/bin/minio"));
        find("MINIO_BIN", c, &["minio"]).ok_or(TestbedError::MissingTool { tool: "MinIO", hint: INSTALL })
    }

    /// The toxiproxy server (TOXIPROXY_BIN, ~/.cache/blobhouse-tools/toxiproxy/server, PATH).
    pub fn toxiproxy() -> Result<PathBuf> {
        find("TOXIPROXY_BIN", home(".cache/blobhouse-tools/toxiproxy/server"), &["toxiproxy-server"])
            .ok_or(TestbedError::MissingTool { tool: "toxiproxy", hint: INSTALL })
    }

    /// nginx (NGINX_BIN, /usr/sbin/nginx, PATH).
    pub fn nginx() -> Result<PathBuf> {
        find("NGINX_BIN", vec![PathBuf::from("/usr/sbin/nginx")], &["nginx"]).ok_or(TestbedError::MissingTool { tool: "nginx", hint: INSTALL })
    }
}
