//! `blobhouse bench cluster`: the TPC-H queries on one engine alone and on
//! clusters of 1, 2, 3 … local worker processes, each worker pinned to its
//! own share of the CPUs (`--workers N`), on the same database.
//!
//! Why a benchmark of its own: the cluster must give the answers one
//! engine gives, and say what it costs and what it buys. Per query and
//! configuration it runs the query on a fresh start — *cold* (caches
//! empty: every byte from the store) — then twice more, *warm* (the same
//! processes again: row groups go to the worker that cached them,
//! [`blobhouse_cluster::affinity`]; the faster of the two counts, the
//! larger GET count)
//! — and reports time, GETs and the share of bytes from the caching tiers,
//! and whether the answer equals one engine's. The coordinator is this
//! process (unpinned); the single engine uses every CPU this process may.
//! A third baseline, one engine planning as a coordinator does (without
//! the rules whose plans cannot leave a process), separates what those
//! rules are worth from what the cluster itself costs.
//!
//! On a machine with few CPUs the workers share them with the coordinator
//! and with each other's threads: the figures there show overhead, not
//! speedup. The deployment comparisons of the NUMA paper (one worker per
//! machine, per NUMA domain, per core) need a machine with the cores:
//! `scripts/bench-cluster-device.sh`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use blobhouse_cluster::{Cluster, ClusterToken, LocalSpec, LocalWorkers, MemBind, Topology, Workers};
use blobhouse_engine::{EngineOptions, QueryResult, Session};

use crate::answers::{self, Verdict};
use crate::plot::{self, Axes, Series};
use crate::tpch;
use crate::tpch_bench::{self, BenchStore, geomean};

/// What to run.
#[derive(Debug, Clone)]
pub struct ClusterBenchOptions {
    pub sf: f64,
    pub queries: Vec<usize>,
    /// Worker counts to run (each against the single engine).
    pub workers: Vec<usize>,
    /// Target compressed size of a column chunk in the loaded data (small
    /// chunks make many row groups for the workers to share).
    pub chunk_bytes: usize,
    /// The `blobhouse` binary the workers run.
    pub binary: PathBuf,
    /// Each worker's memory limit (default: half its share of memory).
    pub worker_memory_limit: Option<u64>,
    pub membind: MemBind,
    pub out: PathBuf,
}

/// One run of a query.
#[derive(Debug, Clone, Copy, Default)]
pub struct Run {
    pub time: Duration,
    pub gets: u64,
    /// Bytes from the store and from the caching tiers.
    pub store_bytes: u64,
    pub tier_bytes: u64,
}

impl Run {
    fn of(r: &QueryResult) -> Run {
        Run { time: r.elapsed, gets: r.scan.get_requests, store_bytes: r.scan.bytes_fetched, tier_bytes: r.scan.memory_bytes + r.scan.ssd_bytes }
    }

    /// The share of the bytes read that came from the tiers.
    pub fn tier_share(&self) -> f64 {
        self.tier_bytes as f64 / (self.tier_bytes + self.store_bytes).max(1) as f64
    }
}

/// What a query runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Config {
    /// One engine, every rule on: the baseline.
    Alone,
    /// One engine planning as a coordinator does (without the rules whose
    /// plans cannot leave a process, `extension::PROCESS_LOCAL_RULES`):
    /// what those rules are worth, apart from the cluster's own costs.
    AlonePortable,
    /// A coordinator and this many local workers.
    Workers(usize),
}

impl Config {
    fn label(self) -> String {
        match self {
            Config::Alone => "alone".to_string(),
            Config::AlonePortable => "alone, portable rules".to_string(),
            Config::Workers(1) => "on 1 worker".to_string(),
            Config::Workers(n) => format!("on {n} workers"),
        }
    }

    fn short(self) -> String {
        match self {
            Config::Alone => "alone".to_string(),
            Config::AlonePortable => "portable".to_string(),
            Config::Workers(n) => format!("{n}w"),
        }
    }
}

/// One query on one configuration.
#[derive(Debug, Clone)]
pub struct Point {
    pub query: usize,
    pub config: Config,
    pub cold: Run,
    pub warm: Run,
    /// The most any worker's resident set reached (0 alone).
    pub worker_rss_peak: u64,
    /// Against the reference answers (alone) or the engine alone's answer.
    pub verdict: String,
}

/// The whole run: its points, and what was left out and why.
#[derive(Debug, Clone, Default)]
pub struct Outcome {
    pub points: Vec<Point>,
    /// Row groups of lineitem (what the workers share).
    pub lineitem_row_groups: u64,
    pub skipped: Vec<String>,
}

/// Runs the benchmark on the database under `data_dir` (loaded when
/// missing) and writes `cluster.csv` and `cluster.png` to the output.
pub async fn run(data_dir: &Path, opts: &ClusterBenchOptions, progress: &dyn Fn(&str)) -> Result<Outcome, String> {
    std::fs::create_dir_all(&opts.out).map_err(|e| format!("{}: {e}", opts.out.display()))?;
    let store = BenchStore::Local(data_dir.to_path_buf());
    let (url, direct, loader) = tpch_bench::prepare(&store, opts.sf, opts.chunk_bytes, progress).await?;
    let lineitem = loader.execute("SELECT sum(l_quantity) FROM lineitem").await.map_err(|e| format!("count lineitem's row groups: {e}"))?;
    drop(loader);
    let cpus = Topology::detect().map_err(|e| e.to_string())?.cpus.len();
    let mut outcome = Outcome { lineitem_row_groups: lineitem.scan.row_groups_read, ..Outcome::default() };
    progress(&format!("lineitem has {} row groups; this process may use {cpus} CPUs", outcome.lineitem_row_groups));
    let token = blobhouse_cluster::supervisor::random_token().map_err(|e| format!("cannot make a cluster token: {e}"))?;
    let mut configs = vec![Config::Alone, Config::AlonePortable];
    for &n in &opts.workers {
        match n <= cpus {
            true => configs.push(Config::Workers(n)),
            false => outcome.skipped.push(format!("{n} workers: each needs a CPU of its own and this process may use {cpus}")),
        }
    }
    // Warm-up: every query once on a throwaway engine, so the files are in
    // the OS page cache for every configuration alike ("cold" means our
    // caches, not the disk's) and the process's one-time costs are paid.
    {
        let warmup = Session::open(&url, &direct, EngineOptions::default()).await.map_err(|e| format!("open {url}: {e}"))?;
        for &q in &opts.queries {
            warmup.execute(tpch::query(q)).await.map_err(|e| format!("Q{q} warm-up: {e}"))?;
        }
        progress("warm-up done: every query once on a throwaway engine");
    }
    // The engine alone's answers, which the clusters' are compared with.
    let mut alone_rows: Vec<(usize, Vec<Vec<String>>)> = Vec::new();
    for &c in &configs {
        for &q in &opts.queries {
            let sql = tpch::query(q);
            let (session, workers) = open(&url, &direct, c, opts, &token).await?;
            // A failed run is reported (and fails the command at the end); the others still run.
            // Warm: the faster of two more runs. The memory tier turns a
            // chunk into decoded arrays on its first hit (docs/cache.md), so
            // the first warm run pays for that and the second is the steady state.
            let warm_twice = async {
                let first = session.execute(sql).await.map_err(|e| format!("warm run: {e}"))?;
                let second = session.execute(sql).await.map_err(|e| format!("second warm run: {e}"))?;
                let gets = first.scan.get_requests.max(second.scan.get_requests);
                let mut best = if second.elapsed < first.elapsed { second } else { first };
                best.scan.get_requests = gets;
                Ok::<_, String>(best)
            };
            let (cold, warm) = match session.execute(sql).await {
                Ok(cold) => (cold, warm_twice.await),
                Err(e) => {
                    let failed = Point { query: q, config: c, cold: Run::default(), warm: Run::default(), worker_rss_peak: 0, verdict: format!("FAILED cold run: {e}") };
                    progress(&format!("Q{q} {}: {}", c.label(), failed.verdict));
                    outcome.points.push(failed);
                    continue;
                }
            };
            let warm = match warm {
                Ok(warm) => warm,
                Err(e) => {
                    let failed = Point { query: q, config: c, cold: Run::of(&cold), warm: Run::default(), worker_rss_peak: 0, verdict: format!("FAILED {e}") };
                    progress(&format!("Q{q} {}: {}", c.label(), failed.verdict));
                    outcome.points.push(failed);
                    continue;
                }
            };
            let rss = workers.as_ref().map_or(0, |w| w.peaks().iter().filter_map(|(_, peak, _)| *peak).max().unwrap_or(0));
            drop(session);
            drop(workers);
            let verdict = match c {
                Config::Alone => describe(answers::verify(q, opts.sf, &cold)),
                _ => {
                    let alone = outcome.points.iter().find(|p| p.query == q && p.config == Config::Alone).map(|p| p.verdict.clone());
                    let expected = alone_rows.iter().find(|(m, _)| *m == q).map(|(_, rows)| rows.clone()).unwrap_or_default();
                    let same = answers::compare(&expected, &answers::result_rows(&cold.batches));
                    let warm_same = answers::compare(&answers::result_rows(&cold.batches), &answers::result_rows(&warm.batches));
                    match (same, warm_same, alone) {
                        (Verdict::Verified, Verdict::Verified, Some(v)) if v == "verified" => "verified".to_string(),
                        (Verdict::Verified, Verdict::Verified, _) => "same as alone".to_string(),
                        (Verdict::Mismatch(m), _, _) => format!("DIFFERS FROM ALONE: {m}"),
                        (_, Verdict::Mismatch(m), _) => format!("WARM RUN DIFFERS: {m}"),
                        _ => "not compared".to_string(),
                    }
                }
            };
            let point = Point { query: q, config: c, cold: Run::of(&cold), warm: Run::of(&warm), worker_rss_peak: rss, verdict };
            progress(&format!(
                "Q{q} {}: cold {:.3} s ({} GETs), warm {:.3} s ({} GETs, {:.0} % from tiers), {}",
                c.label(),
                point.cold.time.as_secs_f64(),
                point.cold.gets,
                point.warm.time.as_secs_f64(),
                point.warm.gets,
                point.warm.tier_share() * 100.0,
                point.verdict
            ));
            outcome.points.push(point);
            if c == Config::Alone {
                alone_rows.push((q, answers::result_rows(&cold.batches)));
            }
        }
    }
    write_outputs(opts, &outcome)?;
    Ok(outcome)
}

fn describe(v: Verdict) -> String {
    match v {
        Verdict::Verified => "verified".to_string(),
        Verdict::NoReference => "no reference".to_string(),
        Verdict::Mismatch(m) => format!("MISMATCH: {m}"),
    }
}

/// A fresh coordinator (or engine alone) with empty caches, and its
/// freshly started workers.
async fn open(url: &str, direct: &blobhouse_storage::StoreOptions, config: Config, opts: &ClusterBenchOptions, token: &str) -> Result<(Session, Option<LocalWorkers>), String> {
    let session = Session::open(url, direct, EngineOptions::default()).await.map_err(|e| format!("open {url}: {e}"))?;
    let workers = match config {
        Config::Alone => return Ok((session, None)),
        Config::AlonePortable => {
            session.engine().set_statement_extension(Some(std::sync::Arc::new(PortableOnly)));
            return Ok((session, None));
        }
        Config::Workers(n) => n,
    };
    let spec = LocalSpec {
        binary: opts.binary.clone(),
        db: url.to_string(),
        // The benchmark's databases are local directories.
        store_env: Vec::new(),
        workers: Workers::Count(workers),
        membind: opts.membind,
        spill_dir: None,
        memory_limit: opts.worker_memory_limit,
        token_env: "BLOBHOUSE_CLUSTER_TOKEN".into(),
        token: token.to_string(),
    };
    let local = LocalWorkers::start(&spec).await.map_err(|e| format!("start {workers} workers: {e}"))?;
    let urls: Vec<String> = local.urls().iter().map(|u| u.to_string()).collect();
    let cluster = Cluster::new(&urls, ClusterToken::new(token).map_err(|e| e.to_string())?, None).map_err(|e| e.to_string())?;
    let down = cluster.probe().await;
    if !down.is_empty() {
        return Err(format!("workers {down:?} do not answer"));
    }
    cluster.install(session.engine());
    Ok((session, Some(local)))
}

/// A statement extension that changes nothing: installed, it makes the
/// engine plan as a coordinator does, in this process.
#[derive(Debug)]
struct PortableOnly;

impl blobhouse_engine::StatementExtension for PortableOnly {
    fn extend(&self, builder: datafusion::execution::session_state::SessionStateBuilder) -> datafusion::execution::session_state::SessionStateBuilder {
        builder
    }
}

fn point(outcome: &Outcome, q: usize, config: Config) -> Option<&Point> {
    outcome.points.iter().find(|p| p.query == q && p.config == config)
}

/// The configurations that ran, the engine alone first.
fn configs(outcome: &Outcome) -> Vec<Config> {
    let mut c: Vec<Config> = outcome.points.iter().map(|p| p.config).collect();
    c.sort_unstable();
    c.dedup();
    c
}

/// The report: per query and configuration, cold and warm time (and their
/// ratio to the engine alone), GETs cold and warm, and the answers.
pub fn report(opts: &ClusterBenchOptions, outcome: &Outcome) -> String {
    let configs = configs(outcome);
    let mut out = format!(
        "TPC-H SF {} on a local directory, column chunks of ~{} KiB, lineitem in {} row groups.\nAfter a warm-up run of every query (files in the OS page cache for all), each query on a fresh start: cold (our caches empty), then warm (the faster of two more runs on the same processes; GETs: the larger).\nTimes in s; x: time against the engine alone in the same run; GETs cold/warm; tiers: share of the warm run's bytes from the caching tiers.\n",
        opts.sf,
        opts.chunk_bytes >> 10,
        outcome.lineitem_row_groups
    );
    for s in &outcome.skipped {
        out += &format!("skipped: {s}\n");
    }
    out += &format!("{:>4}", "q");
    for &c in &configs {
        out += &format!(" | {:>21} {:>11} {:>5}", format!("{} cold/warm s", c.short()), "GETs", "tiers");
    }
    out += " | answers\n";
    for &q in &opts.queries {
        out += &format!("{:>4}", format!("Q{q}"));
        let alone = point(outcome, q, Config::Alone);
        for &c in &configs {
            let Some(p) = point(outcome, q, c) else {
                out += &format!(" | {:>21} {:>11} {:>5}", "-", "-", "-");
                continue;
            };
            let ratio = |t: Duration, base: Option<Duration>| match (c, base) {
                (Config::Alone, _) | (_, None) => String::new(),
                (_, Some(b)) => format!(" {:.1}x", t.as_secs_f64() / b.as_secs_f64().max(1e-9)),
            };
            let times = format!(
                "{:.2}{}/{:.2}{}",
                p.cold.time.as_secs_f64(),
                ratio(p.cold.time, alone.map(|a| a.cold.time)),
                p.warm.time.as_secs_f64(),
                ratio(p.warm.time, alone.map(|a| a.warm.time))
            );
            out += &format!(" | {:>21} {:>11} {:>4.0}%", times, format!("{}/{}", p.cold.gets, p.warm.gets), p.warm.tier_share() * 100.0);
        }
        let verdicts: Vec<String> = configs.iter().filter_map(|&c| point(outcome, q, c)).map(|p| p.verdict.clone()).collect();
        let fine = verdicts.iter().all(|v| v == "verified" || v == "same as alone");
        out += &format!(" | {}\n", if fine { verdicts.first().cloned().unwrap_or_default() } else { verdicts.join(" / ") });
    }
    out += &format!("{:>4}", "geo");
    for &c in &configs {
        let g = |f: &dyn Fn(&Point) -> f64| geomean(outcome.points.iter().filter(|p| p.config == c).map(f));
        let (cold, warm) = (g(&|p| p.cold.time.as_secs_f64()), g(&|p| p.warm.time.as_secs_f64()));
        let gets: u64 = outcome.points.iter().filter(|p| p.config == c).map(|p| p.cold.gets).sum();
        let warm_gets: u64 = outcome.points.iter().filter(|p| p.config == c).map(|p| p.warm.gets).sum();
        out += &format!(" | {:>21} {:>11} {:>5}", format!("{cold:.3}/{warm:.3}"), format!("{gets}/{warm_gets}"), "sum");
    }
    out += "\n";
    for &c in configs.iter().filter(|c| matches!(c, Config::Workers(_))) {
        let peak = outcome.points.iter().filter(|p| p.config == c).map(|p| p.worker_rss_peak).max().unwrap_or(0);
        out += &format!("{}: largest worker peak RSS {} MiB\n", c.label(), peak >> 20);
    }
    let wrong = outcome.points.iter().filter(|p| !(p.verdict == "verified" || p.verdict == "same as alone" || p.verdict == "no reference")).count();
    out += &format!("answers: {} of {} runs equal the engine alone's (and the reference where there is one)\n", outcome.points.len() - wrong, outcome.points.len());
    out
}

/// Whether every answer was right.
pub fn all_right(outcome: &Outcome) -> bool {
    outcome.points.iter().all(|p| p.verdict == "verified" || p.verdict == "same as alone" || p.verdict == "no reference")
}

/// `cluster.csv` and `cluster.png` (geometric-mean time, cold and warm, per
/// configuration) in the output directory.
fn write_outputs(opts: &ClusterBenchOptions, outcome: &Outcome) -> Result<(), String> {
    let mut csv = String::from("query,config,cold_seconds,cold_gets,cold_store_bytes,warm_seconds,warm_gets,warm_store_bytes,warm_tier_bytes,worker_rss_peak_bytes,verdict\n");
    for p in &outcome.points {
        csv += &format!(
            "{},{},{:.6},{},{},{:.6},{},{},{},{},{}\n",
            p.query,
            p.config.short(),
            p.cold.time.as_secs_f64(),
            p.cold.gets,
            p.cold.store_bytes,
            p.warm.time.as_secs_f64(),
            p.warm.gets,
            p.warm.store_bytes,
            p.warm.tier_bytes,
            p.worker_rss_peak,
            p.verdict.replace(',', ";")
        );
    }
    std::fs::write(opts.out.join("cluster.csv"), csv).map_err(|e| e.to_string())?;
    let configs = configs(outcome);
    let line = |label: &str, f: &dyn Fn(&Point) -> f64, filter: &dyn Fn(&Point) -> bool| Series {
        label: label.to_string(),
        points: configs
            .iter()
            .filter_map(|&c| {
                let x = match c {
                    Config::Alone => 0.0,
                    Config::AlonePortable => return None,
                    Config::Workers(n) => n as f64,
                };
                let g = geomean(outcome.points.iter().filter(|p| p.config == c && filter(p)).map(f));
                (!g.is_nan()).then_some((x, g))
            })
            .collect(),
        markers: true,
    };
    let mut series = vec![line("cold, geomean", &|p| p.cold.time.as_secs_f64(), &|_| true), line("warm, geomean", &|p| p.warm.time.as_secs_f64(), &|_| true)];
    for q in [1, 6, 9, 18].into_iter().filter(|q| opts.queries.contains(q)) {
        series.push(line(&format!("Q{q} cold"), &|p| p.cold.time.as_secs_f64(), &move |p| p.query == q));
    }
    let axes = Axes {
        title: format!("TPC-H SF {}: time per query alone (0) and on N local workers", opts.sf),
        x_label: "workers (0: one engine alone)".into(),
        y_label: "seconds".into(),
        log_x: false,
        legend_lower_right: false,
    };
    plot::line_chart(&opts.out.join("cluster.png"), &axes, &series)
}
