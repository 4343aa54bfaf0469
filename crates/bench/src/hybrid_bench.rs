//! `blobhouse bench hybrid`: FlexPushdownDB's evaluation (§7) on SSB —
//! pull-up, caching-only, pushdown-only and hybrid execution against cache
//! size and against skew, and the caching policies on the
//! mixed-selectivity workload — on the testbed's `bottleneck` profile
//! (docs/pushdown.md), where the link to the store is slower than the
//! compute behind it.
//!
//! - Every configuration is a fresh engine with empty caches that runs the
//!   same seeded stream of generated queries ([`crate::ssb::QueryGenerator`]);
//!   the first half warms the caches, the second half is measured (the
//!   paper's method). Time and traffic are the second half's.
//! - Traffic is what crossed the link, from the kernel's counters on the
//!   shaped veth (store → compute and compute → store); without a link
//!   (local store) the bytes fetched plus the node's replies.
//! - Answers: every query's result is compared with the first
//!   configuration's result for the same query text; a difference is
//!   reported as WRONG and fails the command.
//! - Belady runs online from the trace the LFU configuration recorded (the
//!   same queries touch the same segments whatever the split).

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use blobhouse_cache::{Belady, PolicyKind};
use blobhouse_engine::hybrid::{PushdownMode, PushdownOptions};
use blobhouse_engine::{CacheOptions, Session};

use crate::answers::{compare, result_rows, Verdict};
use crate::plot::{self, Axes, Series};
use crate::ssb::{self, Workload};
use crate::tpch_bench::{BenchStore, Dataset, err, measured_options, open_measured, prepare_dataset, release_free_memory};

/// How the compute side reaches a storage node.
#[derive(Debug, Clone)]
pub enum NodeSetup {
    /// Start `exe storage-node` for the run: on the store side of the
    /// testbed's link when there is one, capped at `cpus` cores.
    Spawn { exe: PathBuf, cpus: f64 },
    /// A node that already serves the benchmark database (tests start one
    /// in their own process); `pid` for its CPU time, if known.
    Running { endpoint: String, token: String, pid: Option<u32> },
}

/// Which of the benchmark's experiments a run makes: each figure can be
/// reproduced on its own, in minutes rather than the whole run's quarter
/// hour.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Experiments {
    /// Against cache size, with pull-up and pushdown-only (Figures 6/7),
    /// and the crossover.
    pub size: bool,
    /// Against skew (Figure 8).
    pub skew: bool,
    /// The policies on the mixed-selectivity workload (Figure 11).
    pub policy: bool,
}

impl Experiments {
    /// All three.
    pub const ALL: Experiments = Experiments { size: true, skew: true, policy: true };

    /// A comma-separated list of `size`, `skew` and `policy` (any case).
    pub fn parse(list: &str) -> Result<Experiments, String> {
        let mut e = Experiments { size: false, skew: false, policy: false };
        for word in list.split(',').map(str::trim).filter(|w| !w.is_empty()) {
            match word.to_ascii_lowercase().as_str() {
                "size" => e.size = true,
                "skew" => e.skew = true,
                "policy" => e.policy = true,
                other => return Err(format!("unknown experiment '{other}': the experiments are size, skew and policy")),
            }
        }
        if e == (Experiments { size: false, skew: false, policy: false }) {
            return Err("no experiment named: give one or more of size, skew and policy".into());
        }
        Ok(e)
    }
}

/// What to run.
#[derive(Debug, Clone)]
pub struct HybridBenchOptions {
    pub experiments: Experiments,
    pub sf: f64,
    /// Target compressed size of a column chunk when loading.
    pub chunk_bytes: usize,
    /// Queries per configuration (half warm-up, half measured).
    pub queries: usize,
    pub seed: u64,
    /// Cache sizes of the size sweep, percent of the data.
    pub sizes: Vec<f64>,
    /// Skew of the size sweep.
    pub theta: f64,
    /// Skews of the skew sweep.
    pub thetas: Vec<f64>,
    /// Cache size of the skew sweep, percent.
    pub fixed_size: f64,
    /// Cache sizes of the policy experiment, percent. Weighted-LFU differs
    /// from LFU only while the cache holds less than both kinds of
    /// segments the workload reads and more than a few of either, so the
    /// experiment sweeps the size rather than betting on one.
    pub policy_sizes: Vec<f64>,
    /// Skew of the policy experiment (low: where Weighted-LFU matters).
    pub policy_theta: f64,
    /// The memory tier's [`CacheOptions::decoded_max_ratio`] (0: it holds
    /// every chunk compressed).
    pub decoded_max_ratio: f64,
    pub node: NodeSetup,
    pub request_bytes: u64,
    pub memory_limit: Option<usize>,
    pub out: PathBuf,
}

/// The execution modes compared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Everything fetched, nothing cached or pushed.
    PullUp,
    /// Caching tiers, no node.
    Caching,
    /// The node for everything, no caches.
    Pushdown,
    /// Cached row groups read locally, the rest split between the node and
    /// fetching by the measured rates (`auto`).
    Hybrid,
}

impl Mode {
    pub fn name(self) -> &'static str {
        match self {
            Mode::PullUp => "pull-up",
            Mode::Caching => "caching-only",
            Mode::Pushdown => "pushdown-only",
            Mode::Hybrid => "hybrid",
        }
    }
}

/// The memory tier's policy of a configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PolicyChoice {
    Online(PolicyKind),
    Belady,
}

impl PolicyChoice {
    pub fn name(self) -> &'static str {
        match self {
            PolicyChoice::Online(k) => k.name(),
            PolicyChoice::Belady => "belady",
        }
    }
}

/// One configuration's measured half.
#[derive(Debug, Clone)]
pub struct Run {
    pub experiment: &'static str,
    pub mode: Mode,
    pub policy: PolicyChoice,
    /// Cache size, percent of the data (0: no cache).
    pub percent: f64,
    pub theta: f64,
    pub seconds: f64,
    /// Bytes over the link towards the compute side (or fetched + replies).
    pub traffic: u64,
    pub bytes_fetched: u64,
    pub row_groups_cached: u64,
    pub row_groups_pushed: u64,
    pub row_groups_fetched: u64,
    pub row_groups_fallback: u64,
    /// The node's CPU seconds per measured query (None: unknown).
    pub node_cpu_per_query: Option<f64>,
    pub cache_byte_hit: f64,
    pub queries: usize,
    pub wrong: usize,
    /// Each measured query: what it took and how its row groups went.
    pub per_query: Vec<QueryFigures>,
}

impl Run {
    /// The CSV columns that name the configuration: experiment, mode,
    /// policy, cache percent, θ.
    fn configuration(&self) -> String {
        format!("{},{},{},{},{}", self.experiment, self.mode.name(), self.policy.name(), self.percent, self.theta)
    }
}

/// One measured query of a run (queries.csv).
#[derive(Debug, Clone)]
pub struct QueryFigures {
    /// Its position in the generated stream (from 1).
    pub query: usize,
    pub seconds: f64,
    /// The part of `seconds` spent planning (the same in every mode).
    pub planning_seconds: f64,
    pub pushdown: blobhouse_engine::hybrid::PushdownTotals,
    pub bytes_fetched: u64,
    pub rows_skipped_by_page_index: u64,
    /// Its text, so that a slow one can be run again by hand.
    pub sql: String,
}

/// Everything one run measured.
#[derive(Debug, Clone)]
pub struct HybridBenchResult {
    pub data_bytes: u64,
    pub link: Option<String>,
    pub runs: Vec<Run>,
}

impl HybridBenchResult {
    /// The cache sizes of the size experiment, ascending: the swept ones
    /// and the crossover measured between two of them.
    pub fn sizes(&self) -> Vec<f64> {
        let mut sizes: Vec<f64> = self.runs.iter().filter(|r| r.experiment == "size" && r.percent > 0.0).map(|r| r.percent).collect();
        sizes.sort_by(f64::total_cmp);
        sizes.dedup();
        sizes
    }
}

/// A started node process, stopped on drop.
struct NodeProcess(std::process::Child);

impl Drop for NodeProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// CPU seconds (user + system) process `pid` has used.
fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which may hold spaces) start at ')'.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let (utime, stime): (u64, u64) = (fields.get(11)?.parse().ok()?, fields.get(12)?.parse().ok()?);
    // SAFETY: sysconf only reads a system constant.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    (ticks > 0).then(|| (utime + stime) as f64 / ticks as f64)
}

/// Starts the node and returns (endpoint, token, pid, guard).
async fn start_node(store: &BenchStore<'_>, url: &str, setup: &NodeSetup, out: &std::path::Path) -> Result<(String, String, Option<u32>, Option<NodeProcess>), String> {
    let (exe, cpus) = match setup {
        NodeSetup::Running { endpoint, token, pid } => return Ok((endpoint.clone(), token.clone(), *pid, None)),
        NodeSetup::Spawn { exe, cpus } => (exe, *cpus),
    };
    let token = format!("bench-{:016x}", rand::random::<u64>());
    let log = out.join("storage-node.log");
    let log_file = std::fs::File::create(&log).map_err(|e| format!("{}: {e}", log.display()))?;
    let port = blobhouse_testbed::process::free_port().map_err(|e| e.to_string())?;
    let (mut cmd, host, link) = match store {
        BenchStore::Testbed(tb) => match tb.link() {
            Some(link) => (link.store_side(exe), link.store_ip.clone(), Some(link)),
            None => (std::process::Command::new(exe), "127.0.0.1".to_string(), None),
        },
        BenchStore::Local(_) => (std::process::Command::new(exe), "127.0.0.1".to_string(), None),
    };
    cmd.args(["storage-node", "--db", url, "--listen", &format!("{host}:{port}")]).env("BLOBHOUSE_NODE_TOKEN", &token);
    if let BenchStore::Testbed(tb) = store {
        // Next to the store: the node reads MinIO directly (inside the
        // namespace under the bottleneck profile), not through the link.
        for (k, v) in tb.env() {
            cmd.env(k, v);
        }
        cmd.env("AWS_ENDPOINT_URL", tb.endpoints().s3_direct);
    }
    cmd.stdout(log_file.try_clone().map_err(|e| e.to_string())?).stderr(log_file);
    // The node dies with the benchmark, however the benchmark ends.
    // SAFETY: prctl is async-signal-safe; nothing else runs in the child.
    unsafe {
        use std::os::unix::process::CommandExt;
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let child = cmd.spawn().map_err(|e| format!("cannot start {} storage-node: {e}", exe.display()))?;
    let pid = child.id();
    let guard = NodeProcess(child);
    if let Some(link) = &link {
        link.limit_cpu(pid, cpus).map_err(|e| e.to_string())?;
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::net::TcpStream::connect((host.as_str(), port)).is_err() {
        if Instant::now() > deadline {
            return Err(format!("the storage node did not listen on {host}:{port} within 30 s; its log: {}", log.display()));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok((format!("http://{host}:{port}"), token, Some(pid), Some(guard)))
}

/// Runs the benchmark.
pub async fn run(store: &BenchStore<'_>, opts: &HybridBenchOptions, progress: &dyn Fn(&str)) -> Result<HybridBenchResult, String> {
    assert!(opts.queries >= 2, "half the queries warm up, half are measured");
    std::fs::create_dir_all(&opts.out).map_err(|e| format!("{}: {e}", opts.out.display()))?;
    let (url, direct, loader) = prepare_dataset(store, Dataset::Ssb, opts.sf, opts.chunk_bytes, progress).await?;
    let data = crate::cache_bench::data_bytes(&loader, &ssb::TABLES).await?;
    drop(loader);
    progress(&format!("data: {:.1} MiB of column chunks", data as f64 / 1048576.0));
    let (endpoint, token, node_pid, _node) = start_node(store, &url, &opts.node, &opts.out).await?;
    let link = match store {
        BenchStore::Testbed(tb) => tb.link(),
        BenchStore::Local(_) => None,
    };
    let mut bench = Bench { store, url, direct, data, opts, endpoint, token, node_pid, link: link.clone(), answers: HashMap::new(), trace: None };
    let mut runs = Vec::new();
    let lfu = PolicyChoice::Online(PolicyKind::Lfu);
    let lru = PolicyChoice::Online(PolicyKind::Lru);
    if opts.experiments.size {
        size_sweep(&mut bench, &mut runs, progress).await?;
    }
    // Figure 8: against skew.
    if opts.experiments.skew {
        for &theta in &opts.thetas {
            for mode in [Mode::Caching, Mode::Pushdown, Mode::Hybrid] {
                let p = if mode == Mode::Pushdown { 0.0 } else { opts.fixed_size };
                runs.push(bench.config("skew", mode, lfu, p, theta, Workload::Skewed, progress).await?);
            }
        }
    }
    // Figure 11: the policies on the mixed-selectivity workload.
    let wlfu = PolicyChoice::Online(PolicyKind::WeightedLfu);
    for &p in opts.policy_sizes.iter().filter(|_| opts.experiments.policy) {
        // LFU before Belady: Belady replays the trace LFU's run records.
        for policy in [lru, lfu, wlfu, PolicyChoice::Belady] {
            runs.push(bench.config("policy", Mode::Hybrid, policy, p, opts.policy_theta, Workload::MixedSelectivity, progress).await?);
        }
    }
    let result = HybridBenchResult { data_bytes: data, link: link.map(|l| format!("{} ↔ {}", l.host_ip, l.store_ip)), runs };
    write_outputs(opts, &result)?;
    Ok(result)
}

/// Figures 6/7: pull-up and pushdown-only, then caching-only and hybrid at
/// each cache size, then at the crossover.
async fn size_sweep(bench: &mut Bench<'_>, runs: &mut Vec<Run>, progress: &dyn Fn(&str)) -> Result<(), String> {
    let opts = bench.opts;
    let lfu = PolicyChoice::Online(PolicyKind::Lfu);
    let lru = PolicyChoice::Online(PolicyKind::Lru);
    runs.push(bench.config("size", Mode::PullUp, lfu, 0.0, opts.theta, Workload::Skewed, progress).await?);
    runs.push(bench.config("size", Mode::Pushdown, lfu, 0.0, opts.theta, Workload::Skewed, progress).await?);
    for &p in &opts.sizes {
        for (mode, policy) in [(Mode::Caching, lru), (Mode::Caching, lfu), (Mode::Hybrid, lfu)] {
            runs.push(bench.config("size", mode, policy, p, opts.theta, Workload::Skewed, progress).await?);
        }
    }
    // The crossover lies between two of the sizes: measure there too, so
    // that the target's ratio is a measurement, not a reading between
    // points. Caching-only's curve is convex, so a straight line between
    // two sizes misses: measure again between the closer pair, up to
    // [`CROSSOVER_STEPS`] times, until caching-only is within a tenth of
    // pushdown-only.
    for _ in 0..CROSSOVER_STEPS {
        let Some((below, above, p)) = crossover(runs, opts.theta) else { break };
        progress(&format!("crossover of caching-only and pushdown-only between {below}% and {above}%, at about {p}%: measuring there"));
        for (mode, policy) in [(Mode::Caching, lru), (Mode::Caching, lfu), (Mode::Hybrid, lfu)] {
            runs.push(bench.config("size", mode, policy, p, opts.theta, Workload::Skewed, progress).await?);
        }
        if close_to_pushdown(runs, p, opts.theta) {
            break;
        }
    }
    Ok(())
}

/// Caching-only's time at `percent` (its better policy there) in `runs`.
fn caching_seconds(runs: &[Run], percent: f64, theta: f64) -> Option<f64> {
    runs.iter()
        .filter(|r| r.experiment == "size" && r.mode == Mode::Caching && (r.percent - percent).abs() < 1e-9 && (r.theta - theta).abs() < 1e-9)
        .map(|r| r.seconds)
        .min_by(f64::total_cmp)
}

/// Where caching-only (falling with the cache size) meets pushdown-only
/// (flat): the two measured sizes around the meeting point, and the point
/// by linear interpolation, to 0.1 %. `None` when the curves do not cross
/// between two sizes or the point is a size already measured.
fn crossover(runs: &[Run], theta: f64) -> Option<(f64, f64, f64)> {
    let b = bracket(runs, theta)?;
    let p = (b.crossing() * 10.0).round() / 10.0;
    (p > b.below && p < b.above).then_some((b.below, b.above, p))
}

/// The two adjacent measured sizes between which caching-only (its better
/// policy) falls to pushdown-only's time or below.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Bracket {
    below: f64,
    above: f64,
    /// Caching-only's seconds at `below` (slower than pushdown-only) and at
    /// `above` (as fast or faster).
    caching_below: f64,
    caching_above: f64,
    pushdown: f64,
}

impl Bracket {
    /// The size where the straight line between the two measurements meets
    /// pushdown-only.
    fn crossing(&self) -> f64 {
        self.below + (self.above - self.below) * (self.caching_below - self.pushdown) / (self.caching_below - self.caching_above)
    }
}

fn bracket(runs: &[Run], theta: f64) -> Option<Bracket> {
    let pushdown = runs.iter().find(|r| r.experiment == "size" && r.mode == Mode::Pushdown)?.seconds;
    let mut sizes: Vec<f64> = runs.iter().filter(|r| r.experiment == "size" && r.mode == Mode::Caching).map(|r| r.percent).collect();
    sizes.sort_by(f64::total_cmp);
    sizes.dedup();
    for pair in sizes.windows(2) {
        let (a, b) = (pair[0], pair[1]);
        let (ca, cb) = (caching_seconds(runs, a, theta)?, caching_seconds(runs, b, theta)?);
        if ca > pushdown && cb <= pushdown {
            return Some(Bracket { below: a, above: b, caching_below: ca, caching_above: cb, pushdown });
        }
    }
    None
}

/// The crossover target's figure, at the crossing itself.
///
/// There caching-only and pushdown-only take the same time by definition,
/// so the better of the two is pushdown-only's measured time. Hybrid is
/// measured on both sides of the crossing and read off the straight line
/// between them at the crossing's size. Reading the ratio at a measured
/// size instead depends on which side of the crossing the bisection
/// stopped: just past it caching-only falls steeply while hybrid barely
/// moves (one run stopped at 51.8 %, where caching-only took 1.53 s against
/// pushdown-only's 1.92 s and the ratio read 2.10x; its crossing, at 48.7 %
/// between 40 % and 51.8 %, gives 1.92 s against hybrid's 0.79 s: 2.42x).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Crossing {
    /// The measured sizes around it and the interpolated size, in percent.
    pub below: f64,
    pub above: f64,
    pub at: f64,
    /// Pushdown-only's seconds, which caching-only equals there.
    pub baseline: f64,
    /// Hybrid's seconds at `below` and `above`, and interpolated at `at`.
    pub hybrid_below: f64,
    pub hybrid_above: f64,
    pub hybrid: f64,
}

impl Crossing {
    /// How many times faster hybrid is than the better of the two.
    pub fn speedup(&self) -> f64 {
        self.baseline / self.hybrid
    }
}

/// The crossing of caching-only and pushdown-only in the size experiment,
/// when both sides of it were measured.
fn crossing(runs: &[Run], theta: f64) -> Option<Crossing> {
    let b = bracket(runs, theta)?;
    let hybrid = |p: f64| find_run(runs, "size", Mode::Hybrid, None, p, theta).map(|r| r.seconds);
    let (hb, ha) = (hybrid(b.below)?, hybrid(b.above)?);
    let at = b.crossing();
    let share = (at - b.below) / (b.above - b.below);
    assert!((0.0..=1.0).contains(&share), "the crossing {at} lies between {} and {}", b.below, b.above);
    Some(Crossing { below: b.below, above: b.above, at, baseline: b.pushdown, hybrid_below: hb, hybrid_above: ha, hybrid: hb + (ha - hb) * share })
}

/// Most measurements spent locating the crossover. Two left a run at a
/// size where caching-only was 20 % below pushdown-only (1.53 s against
/// 1.92 s): past the crossover, where the ratio reads low.
const CROSSOVER_STEPS: usize = 3;

/// Whether caching-only at `percent` is within a tenth of pushdown-only.
fn close_to_pushdown(runs: &[Run], percent: f64, theta: f64) -> bool {
    let pushdown = runs.iter().find(|r| r.experiment == "size" && r.mode == Mode::Pushdown).map(|r| r.seconds);
    match (caching_seconds(runs, percent, theta), pushdown) {
        (Some(c), Some(p)) if p > 0.0 => (c / p - 1.0).abs() <= 0.1,
        _ => true,
    }
}

/// The state shared by a run's configurations.
struct Bench<'a> {
    store: &'a BenchStore<'a>,
    url: String,
    direct: blobhouse_storage::StoreOptions,
    data: u64,
    opts: &'a HybridBenchOptions,
    endpoint: String,
    token: String,
    node_pid: Option<u32>,
    link: Option<blobhouse_testbed::Link>,
    /// The first answer to each query text.
    answers: HashMap<String, Vec<Vec<String>>>,
    /// Segments per scan of the policy experiment's LFU run.
    trace: Option<Vec<Vec<blobhouse_cache::SegmentKey>>>,
}

impl Bench<'_> {
    #[allow(clippy::too_many_arguments)]
    async fn config(
        &mut self,
        experiment: &'static str,
        mode: Mode,
        policy: PolicyChoice,
        percent: f64,
        theta: f64,
        workload: Workload,
        progress: &dyn Fn(&str),
    ) -> Result<Run, String> {
        let opts = self.opts;
        let size = (self.data as f64 * percent / 100.0) as u64;
        let kind = match policy {
            PolicyChoice::Online(k) => k,
            PolicyChoice::Belady => PolicyKind::Lfu,
        };
        let cached = matches!(mode, Mode::Caching | Mode::Hybrid) && size > 0;
        let mut options = measured_options(opts.request_bytes, None, true, opts.memory_limit);
        options.cache = if cached { CacheOptions { memory: Some(size), memory_policy: kind, decoded_max_ratio: opts.decoded_max_ratio, ..CacheOptions::default() } } else { CacheOptions::off() };
        if let (Some(limit), true) = (options.memory_limit, cached) {
            options.memory_limit = Some(limit + size as usize);
        }
        if matches!(mode, Mode::Pushdown | Mode::Hybrid) {
            let mut p = PushdownOptions::new(&self.endpoint, &self.token);
            p.mode = if mode == Mode::Pushdown { PushdownMode::On } else { PushdownMode::Auto };
            options.pushdown = Some(p);
        }
        let engine = open_measured(self.store, &self.url, &self.direct, options).await?;
        let name = format!("{experiment}: {} {}{} θ={theta}", mode.name(), if cached { format!("{} ", policy.name()) } else { String::new() }, if cached { format!("{percent}%") } else { String::new() });
        let recording = experiment == "policy" && policy == PolicyChoice::Online(PolicyKind::Lfu);
        if let Some(t) = engine.engine().tiers() {
            if recording {
                t.record_trace();
            }
            if policy == PolicyChoice::Belady {
                let trace = self.trace.as_ref().ok_or("Belady needs the LFU run's trace first")?;
                t.memory().ok_or("Belady needs a memory tier")?.set_policy(Box::new(Belady::from_trace(trace)));
            }
        }
        let queries = ssb::generate(workload, theta, opts.seed, opts.queries);
        let warm = queries.len() / 2;
        let mut measured = Measure::default();
        let mut wrong = 0;
        for (i, sql) in queries.iter().enumerate() {
            if i == warm {
                measured = Measure::start(&engine, self.link.as_ref(), self.node_pid);
            }
            let r = engine.execute(sql).await.map_err(err(&format!("{name}: query {}", i + 1)))?;
            if i >= warm {
                measured.add(i + 1, sql, &r);
            }
            let rows = result_rows(&r.batches);
            match self.answers.get(sql) {
                Some(first) if compare(first, &rows) != Verdict::Verified => {
                    wrong += 1;
                    progress(&format!("{name}: query {} answered WRONG: {sql}", i + 1));
                }
                Some(_) => {}
                None => {
                    self.answers.insert(sql.clone(), rows);
                }
            }
        }
        let run = measured.finish(&engine, self.link.as_ref(), self.node_pid, queries.len() - warm)?;
        if let Some(w) = engine.engine().pushdown().map(|p| p.take_warnings()).filter(|w| !w.is_empty()) {
            progress(&format!("{name}: the node failed at times ({}); those row groups were fetched", w.join("; ")));
        }
        if recording {
            self.trace = engine.engine().tiers().map(|t| t.take_trace());
        }
        let run = Run { experiment, mode, policy, percent: if cached { percent } else { 0.0 }, theta, wrong, ..run };
        progress(&format!(
            "{name}: {:.2} s, {:.1} MiB over the link, row groups cached/pushed/fetched {}/{}/{}{}",
            run.seconds,
            run.traffic as f64 / 1048576.0,
            run.row_groups_cached,
            run.row_groups_pushed,
            run.row_groups_fetched,
            if wrong > 0 { format!(", {wrong} WRONG") } else { String::new() }
        ));
        drop(engine);
        release_free_memory();
        Ok(run)
    }
}

/// Counters at the start of the measured half, and what it added up.
#[derive(Default)]
struct Measure {
    link: (u64, u64),
    node_cpu: Option<f64>,
    totals: blobhouse_engine::hybrid::PushdownTotals,
    bytes_fetched: u64,
    hit_bytes: u64,
    elapsed: Duration,
    per_query: Vec<QueryFigures>,
}

impl Measure {
    fn start(engine: &Session, link: Option<&blobhouse_testbed::Link>, pid: Option<u32>) -> Measure {
        Measure {
            link: link.and_then(|l| l.bytes_carried().ok()).unwrap_or_default(),
            node_cpu: pid.and_then(cpu_seconds),
            totals: engine.engine().pushdown().map(|p| p.totals()).unwrap_or_default(),
            ..Measure::default()
        }
    }

    fn add(&mut self, query: usize, sql: &str, r: &blobhouse_engine::QueryResult) {
        self.bytes_fetched += r.scan.bytes_fetched;
        self.hit_bytes += r.scan.memory_bytes + r.scan.ssd_bytes;
        self.elapsed += r.elapsed;
        self.per_query.push(QueryFigures {
            query,
            seconds: r.elapsed.as_secs_f64(),
            planning_seconds: r.planning.as_secs_f64(),
            pushdown: r.pushdown.clone(),
            bytes_fetched: r.scan.bytes_fetched,
            rows_skipped_by_page_index: r.scan.rows_skipped_by_page_index,
            sql: sql.to_string(),
        });
    }

    fn finish(self, engine: &Session, link: Option<&blobhouse_testbed::Link>, pid: Option<u32>, queries: usize) -> Result<Run, String> {
        let now = engine.engine().pushdown().map(|p| p.totals()).unwrap_or_default();
        let t = &self.totals;
        let received = now.bytes_received - t.bytes_received;
        let traffic = match link {
            Some(l) => l.bytes_carried().map_err(|e| e.to_string())?.0 - self.link.0,
            None => self.bytes_fetched + received,
        };
        let node_cpu = match (self.node_cpu, pid.and_then(cpu_seconds)) {
            (Some(a), Some(b)) => Some((b - a) / queries as f64),
            _ => None,
        };
        let read = self.hit_bytes + self.bytes_fetched + (now.bytes_pushed - t.bytes_pushed);
        Ok(Run {
            experiment: "",
            mode: Mode::PullUp,
            policy: PolicyChoice::Online(PolicyKind::Lfu),
            percent: 0.0,
            theta: 0.0,
            seconds: self.elapsed.as_secs_f64(),
            traffic,
            bytes_fetched: self.bytes_fetched,
            row_groups_cached: now.row_groups_cached - t.row_groups_cached,
            row_groups_pushed: now.row_groups_pushed - t.row_groups_pushed,
            row_groups_fetched: now.row_groups_fetched - t.row_groups_fetched,
            row_groups_fallback: now.row_groups_fallback - t.row_groups_fallback,
            node_cpu_per_query: node_cpu,
            cache_byte_hit: if read == 0 { 0.0 } else { self.hit_bytes as f64 / read as f64 },
            queries,
            wrong: 0,
            per_query: self.per_query,
        })
    }
}

/// The run of `experiment` in `mode` (with `policy`, when given) at cache
/// `percent` and skew `theta`.
fn find_run<'a>(runs: &'a [Run], experiment: &str, mode: Mode, policy: Option<PolicyChoice>, percent: f64, theta: f64) -> Option<&'a Run> {
    runs.iter().find(|r| r.experiment == experiment && r.mode == mode && policy.is_none_or(|p| p == r.policy) && (r.percent - percent).abs() < 1e-9 && (r.theta - theta).abs() < 1e-9)
}

impl HybridBenchResult {
    fn find(&self, experiment: &str, mode: Mode, policy: Option<PolicyChoice>, percent: f64, theta: f64) -> Option<&Run> {
        find_run(&self.runs, experiment, mode, policy, percent, theta)
    }

    /// Wrong answers over every configuration.
    pub fn wrong(&self) -> usize {
        self.runs.iter().map(|r| r.wrong).sum()
    }
}

/// The report: the three experiments as tables, with the ratios the
/// targets are about.
pub fn report(profile: &str, opts: &HybridBenchOptions, r: &HybridBenchResult) -> String {
    let mib = 1048576.0;
    let mut out = format!(
        "SSB SF {} on the {profile} profile{}: {} generated queries per configuration (first half warms up, second half measured), seed {}; data {:.1} MiB of column chunks; memory cache: {}\n",
        opts.sf,
        r.link.as_ref().map_or(String::new(), |l| format!(" (link {l}, {} Mbit/s)", blobhouse_testbed::Link::configured_mbit().unwrap_or_default())),
        opts.queries,
        opts.seed,
        r.data_bytes as f64 / mib,
        match opts.decoded_max_ratio {
            0.0 => "compressed chunks".to_string(),
            ratio => format!("numbers and dates decoded, strings when at most {ratio}x their compressed bytes"),
        }
    );
    let row = |run: &Run| {
        format!(
            "{:>14} {:>7} {:>6} {:>5} {:>9.2} {:>10.1} {:>7.0}% {:>17} {:>9} {:>8}\n",
            run.mode.name(),
            if run.percent > 0.0 { run.policy.name() } else { "-" },
            if run.percent > 0.0 { format!("{}%", run.percent) } else { "-".into() },
            run.theta,
            run.seconds,
            run.traffic as f64 / mib,
            100.0 * run.cache_byte_hit,
            format!("{}/{}/{}", run.row_groups_cached, run.row_groups_pushed, run.row_groups_fetched + run.row_groups_fallback),
            run.node_cpu_per_query.map_or("-".into(), |c| format!("{:.3}", c)),
            if run.wrong == 0 { "exact".to_string() } else { format!("{} WRONG", run.wrong) },
        )
    };
    let header = format!(
        "{:>14} {:>7} {:>6} {:>5} {:>9} {:>10} {:>8} {:>17} {:>9} {:>8}\n",
        "mode", "policy", "cache", "θ", "seconds", "link MiB", "cached", "rg cache/push/get", "node cpu", "answers"
    );
    let e = opts.experiments;
    for (made, experiment, title) in [
        (e.size, "size", format!("\nagainst cache size (θ = {}; Figures 6/7)\n", opts.theta)),
        (e.skew, "skew", format!("\nagainst skew (cache {}%; Figure 8)\n", opts.fixed_size)),
        (e.policy, "policy", format!("\npolicies on the mixed-selectivity workload (hybrid, θ = {}; Figure 11)\n", opts.policy_theta)),
    ] {
        if !made {
            continue;
        }
        out += &title;
        out += &header;
        for run in r.runs.iter().filter(|x| x.experiment == experiment) {
            out += &row(run);
        }
    }
    // The ratios the targets are about.
    out += "\nratios (seconds of the measured halves)\n";
    let lfu = Some(PolicyChoice::Online(PolicyKind::Lfu));
    let pushdown = r.find("size", Mode::Pushdown, None, 0.0, opts.theta);
    let mut best: Option<(f64, f64, f64)> = None;
    for p in r.sizes() {
        // Caching-only at its better policy at this size.
        let lru = Some(PolicyChoice::Online(PolicyKind::Lru));
        let caching = [r.find("size", Mode::Caching, lfu, p, opts.theta), r.find("size", Mode::Caching, lru, p, opts.theta)];
        let c = caching.into_iter().flatten().min_by(|a, b| a.seconds.total_cmp(&b.seconds));
        let (Some(c), Some(h), Some(pd)) = (c, r.find("size", Mode::Hybrid, lfu, p, opts.theta), pushdown) else { continue };
        let better = c.seconds.min(pd.seconds);
        let speedup = better / h.seconds;
        out += &format!(
            "  cache {p:>5}%: hybrid {:.2}x the better of caching-only ({}, {:.2} s) and pushdown-only ({:.2} s); link traffic {:+.0}% against that caching-only\n",
            speedup,
            c.policy.name(),
            c.seconds,
            pd.seconds,
            100.0 * (h.traffic as f64 / c.traffic.max(1) as f64 - 1.0)
        );
        // The crossover: where caching-only and pushdown-only are closest.
        let gap = (c.seconds / pd.seconds).ln().abs();
        if best.is_none_or(|(g, _, _)| gap < g) {
            best = Some((gap, p, speedup));
        }
    }
    if let Some((_, p, speedup)) = best {
        out += &format!("  measured size nearest the crossover: cache {p}%, where hybrid is {speedup:.2}x the better\n");
    }
    if let Some(c) = crossing(&r.runs, opts.theta) {
        out += &format!(
            "  crossover of caching-only and pushdown-only: cache {:.1}% (between the measured {}% and {}%), where both take {:.2} s and hybrid {:.2} s (its {:.2} s and {:.2} s on either side): hybrid {:.2}x the better (target ≥ 2.5x)\n",
            c.at, c.below, c.above, c.baseline, c.hybrid, c.hybrid_below, c.hybrid_above, c.speedup()
        );
    }
    for &p in &opts.policy_sizes {
        let policy = |k: PolicyChoice| r.find("policy", Mode::Hybrid, Some(k), p, opts.policy_theta);
        if let (Some(w), Some(l)) = (policy(PolicyChoice::Online(PolicyKind::WeightedLfu)), policy(PolicyChoice::Online(PolicyKind::Lfu))) {
            out += &format!(
                "  cache {p:>5}%: Weighted-LFU {:.2}x LFU (target ≥ 1.5x); link traffic {:+.0}%; byte hits {:.0}% vs {:.0}%{}\n",
                l.seconds / w.seconds,
                100.0 * (w.traffic as f64 / l.traffic.max(1) as f64 - 1.0),
                100.0 * w.cache_byte_hit,
                100.0 * l.cache_byte_hit,
                policy(PolicyChoice::Belady).map_or(String::new(), |b| format!("; Belady {:.2}x LFU", l.seconds / b.seconds))
            );
        }
    }
    out
}

/// The files a run with `opts` writes to its output directory, besides
/// report.txt: the plots of the experiments it made, where a plot needs at
/// least two points on its x axis, so a run with one skew or one policy
/// size draws no such plot.
pub fn output_files(opts: &HybridBenchOptions) -> Vec<&'static str> {
    let e = opts.experiments;
    let mut files = vec!["hybrid.csv", "queries.csv"];
    if e.size {
        files.extend(["time-vs-cache.png", "traffic-vs-cache.png"]);
    }
    if e.skew && opts.thetas.len() > 1 {
        files.push("time-vs-skew.png");
    }
    if e.policy && opts.policy_sizes.len() > 1 {
        files.push("policies-vs-cache.png");
    }
    files
}

/// hybrid.csv (every configuration), queries.csv and the plots.
fn write_outputs(opts: &HybridBenchOptions, r: &HybridBenchResult) -> Result<(), String> {
    let mut csv = String::from("experiment,mode,policy,percent,theta,seconds,link_bytes,bytes_fetched,cache_byte_hit,rg_cached,rg_pushed,rg_fetched,rg_fallback,node_cpu_per_query,queries,wrong\n");
    for x in &r.runs {
        csv += &format!(
            "{},{:.4},{},{},{:.4},{},{},{},{},{},{},{}\n",
            x.configuration(),
            x.seconds,
            x.traffic,
            x.bytes_fetched,
            x.cache_byte_hit,
            x.row_groups_cached,
            x.row_groups_pushed,
            x.row_groups_fetched,
            x.row_groups_fallback,
            x.node_cpu_per_query.map_or(String::new(), |c| format!("{c:.4}")),
            x.queries,
            x.wrong
        );
    }
    let path = opts.out.join("hybrid.csv");
    std::fs::write(&path, csv).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut csv = String::from("experiment,mode,policy,percent,theta,query,seconds,planning_seconds,rg_cached,rg_pushed,rg_fetched,rg_fallback,bytes_fetched,bytes_received,rows_skipped_by_page_index,sql\n");
    for x in &r.runs {
        for q in &x.per_query {
            let p = &q.pushdown;
            csv += &format!(
                "{},{},{:.4},{:.4},{},{},{},{},{},{},{},\"{}\"\n",
                x.configuration(),
                q.query,
                q.seconds,
                q.planning_seconds,
                p.row_groups_cached,
                p.row_groups_pushed,
                p.row_groups_fetched,
                p.row_groups_fallback,
                q.bytes_fetched,
                p.bytes_received,
                q.rows_skipped_by_page_index,
                q.sql.replace('"', "\"\"")
            );
        }
    }
    let path = opts.out.join("queries.csv");
    std::fs::write(&path, csv).map_err(|e| format!("{}: {e}", path.display()))?;
    let lfu = PolicyChoice::Online(PolicyKind::Lfu);
    let lru = PolicyChoice::Online(PolicyKind::Lru);
    let sizes = r.sizes();
    let (x0, x1) = (sizes.iter().copied().fold(f64::MAX, f64::min), sizes.iter().copied().fold(0.0, f64::max));
    let flat = |mode: Mode, f: &dyn Fn(&Run) -> f64| {
        r.find("size", mode, None, 0.0, opts.theta).map(|run| Series { label: mode.name().into(), points: vec![(x0, f(run)), (x1, f(run))], markers: false })
    };
    let line = |label: &str, mode: Mode, policy: PolicyChoice, f: &dyn Fn(&Run) -> f64| Series {
        label: label.into(),
        points: sizes.iter().filter_map(|&p| r.find("size", mode, Some(policy), p, opts.theta).map(|run| (p, f(run)))).collect(),
        markers: true,
    };
    let size_series = |f: &dyn Fn(&Run) -> f64| -> Vec<Series> {
        let mut s: Vec<Series> = [flat(Mode::PullUp, f), flat(Mode::Pushdown, f)].into_iter().flatten().collect();
        s.push(line("caching-only (LRU)", Mode::Caching, lru, f));
        s.push(line("caching-only (LFU)", Mode::Caching, lfu, f));
        s.push(line("hybrid (LFU)", Mode::Hybrid, lfu, f));
        s
    };
    let axes = |title: String, x: &str, y: &str| Axes { title, x_label: x.into(), y_label: y.into(), log_x: false, legend_lower_right: false };
    let secs = |run: &Run| run.seconds;
    let traffic = |run: &Run| run.traffic as f64 / 1048576.0;
    let files = output_files(opts);
    if files.contains(&"time-vs-cache.png") {
        plot::line_chart(&opts.out.join("time-vs-cache.png"), &axes(format!("SSB SF {}, θ = {}: time of the measured half", opts.sf, opts.theta), "cache size, % of the data", "seconds"), &size_series(&secs))?;
        plot::line_chart(&opts.out.join("traffic-vs-cache.png"), &axes(format!("SSB SF {}, θ = {}: bytes over the link", opts.sf, opts.theta), "cache size, % of the data", "MiB"), &size_series(&traffic))?;
    }
    if files.contains(&"time-vs-skew.png") {
        let skew = |mode: Mode| Series {
            label: mode.name().into(),
            points: opts.thetas.iter().filter_map(|&t| r.runs.iter().find(|x| x.experiment == "skew" && x.mode == mode && (x.theta - t).abs() < 1e-9).map(|x| (t, x.seconds))).collect(),
            markers: true,
        };
        let series = vec![skew(Mode::Caching), skew(Mode::Pushdown), skew(Mode::Hybrid)];
        plot::line_chart(&opts.out.join("time-vs-skew.png"), &axes(format!("SSB SF {}, cache {}%: time against skew", opts.sf, opts.fixed_size), "Zipf θ", "seconds"), &series)?;
    }
    if files.contains(&"policies-vs-cache.png") {
        let wlfu = PolicyChoice::Online(PolicyKind::WeightedLfu);
        let series: Vec<Series> = [(lru, "LRU"), (lfu, "LFU"), (wlfu, "Weighted-LFU"), (PolicyChoice::Belady, "Belady")]
            .into_iter()
            .map(|(policy, label)| Series {
                label: label.into(),
                points: opts.policy_sizes.iter().filter_map(|&p| r.find("policy", Mode::Hybrid, Some(policy), p, opts.policy_theta).map(|x| (p, x.seconds))).collect(),
                markers: true,
            })
            .collect();
        let title = format!("SSB SF {}, mixed selectivity, θ = {}: hybrid, time by policy", opts.sf, opts.policy_theta);
        plot::line_chart(&opts.out.join("policies-vs-cache.png"), &axes(title, "cache size, % of the data", "seconds"), &series)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plot_with_one_point_on_its_axis_is_neither_drawn_nor_listed() {
        let mut opts = HybridBenchOptions {
            experiments: Experiments::ALL,
            sf: 1.0,
            chunk_bytes: 1 << 20,
            queries: 100,
            seed: 1,
            sizes: vec![5.0, 10.0],
            theta: 2.0,
            thetas: vec![2.0],
            fixed_size: 10.0,
            policy_sizes: vec![10.0],
            policy_theta: 0.3,
            decoded_max_ratio: blobhouse_engine::DECODED_MAX_RATIO,
            node: NodeSetup::Running { endpoint: "http://127.0.0.1:1".into(), token: "t".into(), pid: None },
            request_bytes: 16 << 20,
            memory_limit: None,
            out: std::path::PathBuf::from("unused"),
        };
        assert_eq!(output_files(&opts), ["hybrid.csv", "queries.csv", "time-vs-cache.png", "traffic-vs-cache.png"]);
        opts.thetas = vec![0.0, 2.0];
        opts.policy_sizes = vec![10.0, 20.0];
        assert!(output_files(&opts).ends_with(&["time-vs-skew.png", "policies-vs-cache.png"]));
        // Only the experiments a run makes draw plots.
        opts.experiments = Experiments::parse("policy").unwrap();
        assert_eq!(output_files(&opts), ["hybrid.csv", "queries.csv", "policies-vs-cache.png"]);
        opts.experiments = Experiments::parse(" Size,skew ").unwrap();
        assert_eq!(output_files(&opts), ["hybrid.csv", "queries.csv", "time-vs-cache.png", "traffic-vs-cache.png", "time-vs-skew.png"]);
    }

    #[test]
    fn experiments_are_named_and_unknown_or_missing_ones_are_refused() {
        assert_eq!(Experiments::parse("size,skew,policy"), Ok(Experiments::ALL));
        assert_eq!(Experiments::parse("POLICY"), Ok(Experiments { size: false, skew: false, policy: true }));
        let unknown = Experiments::parse("size,sizes").unwrap_err();
        assert!(unknown.contains("unknown experiment 'sizes'") && unknown.contains("size, skew and policy"), "{unknown}");
        assert!(Experiments::parse(" , ").unwrap_err().contains("no experiment named"));
    }

    fn run(mode: Mode, policy: PolicyKind, percent: f64, seconds: f64) -> Run {
        Run {
            experiment: "size",
            mode,
            policy: PolicyChoice::Online(policy),
            percent,
            theta: 2.0,
            seconds,
            traffic: 0,
            bytes_fetched: 0,
            row_groups_cached: 0,
            row_groups_pushed: 0,
            row_groups_fetched: 0,
            row_groups_fallback: 0,
            node_cpu_per_query: None,
            cache_byte_hit: 0.0,
            queries: 50,
            wrong: 0,
            per_query: Vec::new(),
        }
    }

    #[test]
    fn the_crossover_is_found_between_the_sizes_where_caching_overtakes_pushdown() {
        let mut runs = vec![run(Mode::Pushdown, PolicyKind::Lfu, 0.0, 3.0)];
        for (p, lru, lfu) in [(5.0, 9.0, 8.0), (7.5, 5.5, 5.0), (10.0, 3.0, 2.0), (20.0, 1.5, 1.4)] {
            runs.push(run(Mode::Caching, PolicyKind::Lru, p, lru));
            runs.push(run(Mode::Caching, PolicyKind::Lfu, p, lfu));
        }
        // The better caching-only: 5.0 s at 7.5 %, 2.0 s at 10 %; 3.0 s is
        // two thirds of the way.
        assert_eq!(crossover(&runs, 2.0), Some((7.5, 10.0, 9.2)));
        // Pushdown-only faster than caching-only everywhere: no crossing.
        runs[0].seconds = 1.0;
        assert_eq!(crossover(&runs, 2.0), None);
        // Exactly at a measured size: nothing more to measure.
        runs[0].seconds = 2.0;
        assert_eq!(crossover(&runs, 2.0), None);
        // A first guess that overshoots (the curve is convex) narrows the
        // bracket for the next one, which stops once it is close.
        runs[0].seconds = 3.0;
        runs.push(run(Mode::Caching, PolicyKind::Lfu, 9.2, 2.2));
        assert!(!close_to_pushdown(&runs, 9.2, 2.0));
        assert_eq!(crossover(&runs, 2.0), Some((7.5, 9.2, 8.7)));
        runs.push(run(Mode::Caching, PolicyKind::Lfu, 8.7, 3.2));
        assert!(close_to_pushdown(&runs, 8.7, 2.0));
    }

    #[test]
    fn the_crossover_ratio_is_read_at_the_crossing_not_at_a_size_past_it() {
        // One run's numbers: pushdown-only 1.92 s; caching-only (better
        // policy) 3.01 s at 40 % and 1.53 s at 51.8 %; hybrid 0.97 s and
        // 0.73 s there.
        let mut runs = vec![run(Mode::Pushdown, PolicyKind::Lfu, 0.0, 1.92)];
        for (p, lru, lfu, hybrid) in [(40.0, 3.93, 3.01, 0.97), (51.8, 2.01, 1.53, 0.73), (60.9, 1.63, 1.08, 0.91)] {
            runs.push(run(Mode::Caching, PolicyKind::Lru, p, lru));
            runs.push(run(Mode::Caching, PolicyKind::Lfu, p, lfu));
            runs.push(run(Mode::Hybrid, PolicyKind::Lfu, p, hybrid));
        }
        let c = crossing(&runs, 2.0).expect("the curves cross between 40 % and 51.8 %");
        assert_eq!((c.below, c.above), (40.0, 51.8));
        // 3.01 - 1.92 = 1.09 of the 1.48 s caching-only falls over the
        // bracket: 73.6 % of the way.
        assert!((c.at - 48.69).abs() < 0.01, "{c:?}");
        assert!((c.hybrid - (0.97 - 0.24 * 1.09 / 1.48)).abs() < 1e-9, "{c:?}");
        assert_eq!(c.baseline, 1.92);
        assert!((c.speedup() - 2.42).abs() < 0.01, "{c:?}");
        // Read at 51.8 % instead, the better of the two is caching-only's
        // 1.53 s, and the ratio looks lower than it is.
        assert!(1.53 / 0.73 < c.speedup() - 0.3);
        // Without hybrid measured on both sides there is no crossing figure.
        runs.retain(|r| !(r.mode == Mode::Hybrid && r.percent == 40.0));
        assert_eq!(crossing(&runs, 2.0), None);
        // Nor when caching-only never gets as fast as pushdown-only.
        runs[0].seconds = 0.5;
        assert_eq!(crossing(&runs, 2.0), None);
    }
}
