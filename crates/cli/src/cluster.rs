//! `blobhouse worker`, and `--worker URL` on the commands that run
//! statements: the command line of the cluster (`blobhouse_cluster`).

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::Args;

use blobhouse_cluster::supervisor::random_token;
use blobhouse_cluster::{Cluster, ClusterToken, LocalSpec, LocalWorkers, MemBind, WorkerServer, WorkerTls, Workers};
use blobhouse_engine::Engine;

use crate::DbArgs;

/// `blobhouse worker`'s flags.
#[derive(Args)]
pub struct WorkerArgs {
    #[command(flatten)]
    db: DbArgs,
    /// Address to listen on for coordinators.
    #[arg(long, default_value = "127.0.0.1:50071")]
    listen: std::net::SocketAddr,
    /// The environment variable holding the cluster's token, which every caller must present.
    #[arg(long, value_name = "VAR", default_value = "BLOBHOUSE_CLUSTER_TOKEN")]
    token_env: String,
    /// Serve over TLS only, with this certificate chain (PEM); the worker does not start if it does not load.
    #[arg(long, requires = "tls_key", value_name = "PEM")]
    tls_cert: Option<PathBuf>,
    /// The private key of --tls-cert (PEM).
    #[arg(long, requires = "tls_cert", value_name = "PEM")]
    tls_key: Option<PathBuf>,
    /// The CA that signed the other workers' certificates (shuffles between https:// workers).
    #[arg(long, value_name = "PEM")]
    tls_ca: Option<PathBuf>,
}

/// The workers a command runs its statements on.
#[derive(Args, Clone, Default)]
pub struct ClusterArgs {
    /// Run statements on this worker (`blobhouse worker`), as many times as there are workers.
    /// This process stays the coordinator: it parses, plans, commits and keeps the catalog.
    #[arg(long = "worker", value_name = "URL", conflicts_with = "local_workers")]
    workers: Vec<String>,
    /// Start worker processes on this machine and run statements on them: one per machine,
    /// per NUMA node (CPUs and memory bound to it), per physical core, or N.
    #[arg(long = "workers", value_name = "machine|numa|core|N")]
    local_workers: Option<String>,
    /// How the memory of --workers numa|core|N workers is bound to their nodes:
    /// strict (never elsewhere; a worker that outgrows its nodes is killed) or preferred.
    #[arg(long, value_name = "strict|preferred", default_value = "preferred", value_parser = parse_membind)]
    membind: MemBind,
    /// Memory limit of each --workers worker, e.g. 4G (default: half its NUMA node's or share's memory).
    #[arg(long, value_name = "SIZE", requires = "local_workers")]
    worker_memory_limit: Option<String>,
    /// The environment variable holding the cluster's token (the workers' own).
    #[arg(long, value_name = "VAR", default_value = "BLOBHOUSE_CLUSTER_TOKEN")]
    cluster_token_env: String,
    /// The CA that signed the certificates of https:// workers (PEM).
    #[arg(long, value_name = "PEM")]
    worker_ca: Option<PathBuf>,
}

impl ClusterArgs {
    /// Makes `engine` a coordinator of the workers given, if any — or of
    /// workers it starts here (`--workers`, returned: they stop when it is
    /// dropped); says which of them are down now (statements leave them
    /// out until they answer again).
    pub async fn install(&self, engine: &Engine, db: &crate::DbArgs) -> Result<Option<LocalWorkers>> {
        let mut local = None;
        let (urls, token) = match &self.local_workers {
            Some(mode) => {
                let workers: Workers = mode.parse()?;
                let token = match std::env::var(&self.cluster_token_env) {
                    Ok(t) if !t.trim().is_empty() => t,
                    _ => random_token().context("cannot make a cluster token")?,
                };
                let spec = LocalSpec {
                    binary: std::env::current_exe().context("cannot find this program to start workers")?,
                    db: db.db.clone(),
                    store_env: db.store_options().as_env(&db.db),
                    workers,
                    membind: self.membind,
                    spill_dir: db.spill_dir(),
                    memory_limit: match &self.worker_memory_limit {
                        Some(text) => blobhouse_engine::memory::parse_limit(text).map_err(|e| anyhow::anyhow!("--worker-memory-limit: {e}"))?.map(|b| b as u64),
                        None => None,
                    },
                    token_env: self.cluster_token_env.clone(),
                    token: token.clone(),
                };
                let started = LocalWorkers::start(&spec).await?;
                for (pid, p) in started.processes() {
                    eprintln!("worker pid {pid}: {p}");
                }
                let urls: Vec<String> = started.urls().iter().map(|u| u.to_string()).collect();
                local = Some(started);
                (urls, ClusterToken::new(&token)?)
            }
            None if self.workers.is_empty() => return Ok(None),
            None => (self.workers.clone(), ClusterToken::from_env(&self.cluster_token_env)?),
        };
        let ca = self.worker_ca.as_ref().map(|p| read(p, "--worker-ca")).transpose()?;
        let cluster = Cluster::new(&urls, token, ca.as_deref()).context("--worker")?;
        // Workers given by URL are probed once here; local ones were just
        // waited for until each served (`LocalWorkers::start`), and probing
        // them again only adds a moment in which a busy machine can miss
        // an answer and mark a serving worker down.
        if local.is_none() {
            for url in cluster.probe().await {
                eprintln!("warning: worker {url} does not answer; statements run on the others until it does");
            }
        }
        cluster.install(engine);
        Ok(local)
    }
}

/// Serves a worker until Ctrl-C.
pub async fn worker(args: WorkerArgs) -> Result<ExitCode> {
    let token = ClusterToken::from_env(&args.token_env)?;
    // A worker serves a database the coordinator made: a wrong --db fails here.
    let options = blobhouse_engine::EngineOptions { create_missing: false, ..Default::default() };
    let engine = crate::open_with(&args.db, options).await.context("a worker serves an existing database: check --db, or create it first (blobhouse sql --db …)")?;
    let listener = tokio::net::TcpListener::bind(args.listen).await.with_context(|| format!("cannot listen on {}", args.listen))?;
    let tls = match (&args.tls_cert, &args.tls_key) {
        (Some(cert), Some(key)) => Some(WorkerTls { cert: read(cert, "--tls-cert")?, key: read(key, "--tls-key")?, ca: args.tls_ca.as_ref().map(|p| read(p, "--tls-ca")).transpose()? }),
        _ => None,
    };
    let server = WorkerServer::start(&engine, listener, token, tls.as_ref(), None).with_context(|| format!("the worker on {} did not start", args.listen))?;
    eprintln!(
        "worker for {} on {} ({} threads, memory limit {}); Ctrl-C stops it",
        args.db.db,
        server.url(),
        engine.options().target_partitions,
        engine.options().memory_limit.map_or("none".to_string(), |l| format!("{} MiB", l >> 20)),
    );
    let _ = tokio::signal::ctrl_c().await;
    server.stop().await;
    Ok(ExitCode::SUCCESS)
}

fn read(path: &Path, flag: &str) -> Result<Vec<u8>> {
    std::fs::read(path).with_context(|| format!("{flag}: cannot read {}", path.display()))
}

fn parse_membind(text: &str) -> Result<MemBind, String> {
    match text {
        "strict" => Ok(MemBind::Strict),
        "preferred" => Ok(MemBind::Preferred),
        _ => Err(format!("{text:?}: expected strict or preferred")),
    }
}

/// Says each local worker's peak resident set against its memory limit.
pub fn report_peaks(workers: &LocalWorkers) {
    for (pid, peak, limit) in workers.peaks() {
        let peak = peak.map_or("unknown".to_string(), |b| format!("{} MiB", b >> 20));
        eprintln!("worker pid {pid}: peak RSS {peak}, memory limit {} MiB", limit >> 20);
    }
}
