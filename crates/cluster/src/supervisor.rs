//! [`LocalWorkers`]: worker processes a coordinator starts on its own
//! machine, one per [`Placement`] (`--workers machine|numa|core|N`), each
//! bound to its CPUs and memory nodes before it starts a thread
//! ([`crate::bind`]), and stopped with the coordinator.
//!
//! Each worker is this same binary run as `blobhouse worker` on a loopback
//! port, with as many threads as it has CPUs and a memory limit of half
//! its placement's memory (the engine's default rule, applied to the
//! worker's share rather than to the machine). Children die with the
//! coordinator even when it is killed (`PR_SET_PDEATHSIG`), and the
//! coordinator waits until each answers before it plans on it.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use url::Url;

use crate::bind::{BindError, MemBind, bind, check};
use crate::deploy::{DeployError, Placement, Workers, plan};
use crate::liveness::Liveness;
use crate::topology::{Topology, TopologyError, format_list};

/// How long a started worker may take to answer.
pub const START_TIMEOUT: Duration = Duration::from_secs(60);

/// What the local workers are started with.
#[derive(Debug, Clone)]
pub struct LocalSpec {
    /// The `blobhouse` binary (normally this process's own).
    pub binary: PathBuf,
    /// The database URL; store settings reach the workers through the
    /// environment they inherit (AWS_*, GOOGLE_*, AZURE_*) and `store_env`.
    pub db: String,
    /// Store settings given to this process as flags, as environment
    /// variables for the workers (`StoreOptions::as_env`): no secret goes on
    /// a worker's command line.
    pub store_env: Vec<(String, String)>,
    pub workers: Workers,
    pub membind: MemBind,
    /// Where each worker's spill directory goes (a subdirectory each).
    pub spill_dir: Option<PathBuf>,
    /// Each worker's memory limit; `None`: half its placement's memory.
    pub memory_limit: Option<u64>,
    /// The cluster token, given to the workers in their environment.
    pub token_env: String,
    pub token: String,
}

/// Local workers that could not be started.
#[derive(Debug, thiserror::Error)]
pub enum SuperviseError {
    #[error(transparent)]
    Topology(#[from] TopologyError),
    #[error(transparent)]
    Deploy(#[from] DeployError),
    #[error(transparent)]
    Bind(#[from] BindError),
    #[error("cannot start worker {index} ({binary}): {source}")]
    Spawn { index: usize, binary: String, source: std::io::Error },
    #[error("worker {index} (CPUs {cpus}) exited before it served ({status}); run `blobhouse worker` by hand to see why")]
    Exited { index: usize, cpus: String, status: String },
    #[error("worker {index} on {url} did not answer within {secs} s")]
    Timeout { index: usize, url: Url, secs: u64 },
    #[error("no free loopback port: {0}")]
    Port(std::io::Error),
}

/// Worker processes on this machine (stopped when dropped).
#[derive(Debug)]
pub struct LocalWorkers {
    children: Vec<(Child, Url, Placement)>,
    limit: Option<u64>,
}

impl LocalWorkers {
    /// Plans the workers on this machine's topology and starts them.
    pub async fn start(spec: &LocalSpec) -> Result<LocalWorkers, SuperviseError> {
        let topology = Topology::detect()?;
        let placements = plan(&topology, spec.workers)?;
        let mut started = LocalWorkers { children: Vec::new(), limit: spec.memory_limit };
        for (index, p) in placements.into_iter().enumerate() {
            check(&topology, &p)?;
            let port = std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map_err(SuperviseError::Port)?.port();
            let url = Url::parse(&format!("http://127.0.0.1:{port}")).expect("a loopback URL");
            let mut cmd = worker_command(spec, &p, index, port);
            bind(&mut cmd, &p, spec.membind)?;
            // SAFETY: prctl is async-signal-safe; it only marks this child
            // to receive SIGKILL when its parent thread exits.
            unsafe {
                cmd.pre_exec(|| {
                    if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
            let child = cmd.spawn().map_err(|source| SuperviseError::Spawn { index, binary: spec.binary.display().to_string(), source })?;
            started.children.push((child, url, p));
        }
        started.wait_serving().await?;
        Ok(started)
    }

    /// Their URLs, in placement order.
    pub fn urls(&self) -> Vec<Url> {
        self.children.iter().map(|(_, u, _)| u.clone()).collect()
    }

    /// Their process ids and placements.
    pub fn processes(&self) -> Vec<(u32, &Placement)> {
        self.children.iter().map(|(c, _, p)| (c.id(), p)).collect()
    }

    /// Each worker's peak resident set so far (`VmHWM`, bytes) and the
    /// memory limit it was given: what `--workers` reports at exit.
    pub fn peaks(&self) -> Vec<(u32, Option<u64>, u64)> {
        self.children
            .iter()
            .map(|(c, _, p)| {
                let status = std::fs::read_to_string(format!("/proc/{}/status", c.id())).unwrap_or_default();
                let peak = status.lines().find_map(|l| l.strip_prefix("VmHWM:")).and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok()).map(|kb| kb << 10);
                (c.id(), peak, memory_limit(p, self.limit))
            })
            .collect()
    }

    async fn wait_serving(&mut self) -> Result<(), SuperviseError> {
        let started = Instant::now();
        for (index, (child, url, p)) in self.children.iter_mut().enumerate() {
            let live = Liveness::new(vec![url.clone()].into());
            loop {
                if let Ok(Some(status)) = child.try_wait() {
                    return Err(SuperviseError::Exited { index, cpus: format_list(&p.cpus), status: status.to_string() });
                }
                if live.probe().await.is_empty() {
                    break;
                }
                if started.elapsed() > START_TIMEOUT {
                    return Err(SuperviseError::Timeout { index, url: url.clone(), secs: START_TIMEOUT.as_secs() });
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        Ok(())
    }
}

impl Drop for LocalWorkers {
    fn drop(&mut self) {
        for (child, _, _) in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn worker_command(spec: &LocalSpec, p: &Placement, index: usize, port: u16) -> Command {
    let mut cmd = Command::new(&spec.binary);
    cmd.arg("worker")
        .args(["--db", &spec.db])
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .args(["--threads", &p.cpus.len().max(1).to_string()])
        .args(["--memory-limit", &format!("{}M", memory_limit(p, spec.memory_limit) >> 20)])
        .envs(spec.store_env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .env(&spec.token_env, &spec.token)
        .args(["--token-env", &spec.token_env])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    if let Some(dir) = &spec.spill_dir {
        cmd.args(["--spill-dir", &Path::new(dir).join(format!("worker-{index}")).to_string_lossy()]);
    }
    cmd
}

/// A worker's memory limit: the one given, or half its placement's
/// memory; at least 64 MiB.
fn memory_limit(p: &Placement, given: Option<u64>) -> u64 {
    given.unwrap_or(p.memory / 2).max(64 << 20)
}

/// A fresh random token (hex) for workers this process starts itself.
pub fn random_token() -> std::io::Result<String> {
    use std::io::Read;
    let mut bytes = [0u8; 16];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}
