//! `blobhouse bench cache`: what the caching tiers (docs/cache.md) buy on
//! TPC-H read through a testbed profile — SAP IQ's TPC-H experiment (§4) on
//! this machine, with FlexPushdownDB's policies and Belady beside them.
//!
//! - Every configuration is a fresh engine that runs the queries in
//!   `rounds` rounds, each round in its own random order (the same orders
//!   for every configuration). Round 1 starts cold; rounds 2.. show the
//!   steady state the targets are about.
//! - Configurations: the caches off (the baseline, in the same run), then
//!   memory only, SSD only and both tiers, each at a share of the data
//!   (the bytes of every column chunk of the database): "both at 50 %"
//!   gives each tier 50 %.
//! - Belady: the first cached configuration records every scan's segments;
//!   the framework is then replayed on that trace with LRU, LFU and Belady
//!   at each size, the offline optimum beside the online policies.
//! - Routing (`--slow-ssd`): the SSD tier holds all the data but answers
//!   every read late (a delay per read and per MiB, `CacheOptions::
//!   ssd_read_delay`): routed by measured speed against always from the
//!   SSD, both as throughput against the caches off.
//! - Cost: GETs at S3's price ([`blobhouse_engine::GET_PRICE_USD`]).

use std::collections::HashSet;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use rand::SeedableRng;
use rand::seq::SliceRandom;

use blobhouse_cache::{Belady, BenefitCache, Policy, PolicyKind, SegmentKey, Touch};
use blobhouse_engine::{CacheOptions, GET_PRICE_USD, Session};

use crate::answers::{self, Verdict};
use crate::plot::{self, Axes, Series};
use crate::tpch;
use crate::tpch_bench::{BenchStore, err, geomean, measured_options, open_measured, prepare, release_free_memory};

/// Which tiers a configuration has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tier {
    Off,
    Memory,
    Ssd,
    Both,
}

impl Tier {
    /// Parses `memory`, `ssd` or `both`.
    pub fn parse(name: &str) -> Option<Tier> {
        match name {
            "memory" => Some(Tier::Memory),
            "ssd" => Some(Tier::Ssd),
            "both" => Some(Tier::Both),
            _ => None,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Tier::Off => "off",
            Tier::Memory => "memory",
            Tier::Ssd => "ssd",
            Tier::Both => "both",
        }
    }
}

/// A disk made slow for the routing experiment.
#[derive(Debug, Clone, Copy)]
pub struct SlowSsd {
    pub per_read: Duration,
    pub per_mib: Duration,
}

/// What to run.
#[derive(Debug, Clone)]
pub struct CacheBenchOptions {
    pub sf: f64,
    pub queries: Vec<usize>,
    pub rounds: usize,
    /// Seed of the rounds' query orders.
    pub seed: u64,
    /// The cached configurations' tiers (the caches-off baseline always runs).
    pub tiers: Vec<Tier>,
    /// Cache sizes, percent of the data.
    pub sizes: Vec<f64>,
    /// The memory tier's policy.
    pub policy: PolicyKind,
    /// Also the routing experiment, with this slow disk.
    pub slow_ssd: Option<SlowSsd>,
    /// Where the SSD tiers' directories go (one per configuration, deleted after).
    pub ssd_root: PathBuf,
    pub request_bytes: u64,
    pub chunk_bytes: usize,
    pub link: Option<f64>,
    pub memory_limit: Option<usize>,
    pub out: PathBuf,
}

/// One query run of one configuration.
#[derive(Debug, Clone)]
pub struct QueryRun {
    pub round: usize,
    pub query: usize,
    pub elapsed: Duration,
    pub gets: u64,
    pub bytes_from_store: u64,
    pub memory_hits: u64,
    pub memory_bytes: u64,
    pub ssd_hits: u64,
    pub ssd_bytes: u64,
    pub misses: u64,
    pub routed_to_store: u64,
    pub verified: bool,
}

/// One configuration's runs.
#[derive(Debug, Clone)]
pub struct Config {
    pub name: String,
    pub tier: Tier,
    /// Cache size, percent of the data (0 for off).
    pub percent: f64,
    pub runs: Vec<QueryRun>,
}

impl Config {
    fn runs_in(&self, rounds: std::ops::RangeInclusive<usize>) -> impl Iterator<Item = &QueryRun> {
        self.runs.iter().filter(move |r| rounds.contains(&r.round))
    }

    /// Geometric mean of the query times in `rounds`, seconds.
    pub fn geomean(&self, rounds: std::ops::RangeInclusive<usize>) -> f64 {
        geomean(self.runs_in(rounds).map(|r| r.elapsed.as_secs_f64()))
    }

    /// Total time of `rounds`, seconds.
    pub fn total(&self, rounds: std::ops::RangeInclusive<usize>) -> f64 {
        self.runs_in(rounds).map(|r| r.elapsed.as_secs_f64()).sum()
    }

    /// Share of chunks served by a tier in `rounds` (a chunk the SSD held
    /// but the router sent to the store counts as not served).
    pub fn hit_rate(&self, rounds: std::ops::RangeInclusive<usize>) -> f64 {
        let (hits, asked) =
            self.runs_in(rounds).fold((0, 0), |(h, a), r| (h + r.memory_hits + r.ssd_hits, a + r.memory_hits + r.ssd_hits + r.misses + r.routed_to_store));
        if asked == 0 { 0.0 } else { hits as f64 / asked as f64 }
    }

    /// Share of the bytes read that came from a tier in `rounds`.
    pub fn byte_hit_rate(&self, rounds: std::ops::RangeInclusive<usize>) -> f64 {
        let (hit, store) = self.runs_in(rounds).fold((0, 0), |(h, s), r| (h + r.memory_bytes + r.ssd_bytes, s + r.bytes_from_store));
        if hit + store == 0 { 0.0 } else { hit as f64 / (hit + store) as f64 }
    }

    pub fn gets(&self, rounds: std::ops::RangeInclusive<usize>) -> u64 {
        self.runs_in(rounds).map(|r| r.gets).sum()
    }

    pub fn bytes_from_store(&self, rounds: std::ops::RangeInclusive<usize>) -> u64 {
        self.runs_in(rounds).map(|r| r.bytes_from_store).sum()
    }

    pub fn routed(&self, rounds: std::ops::RangeInclusive<usize>) -> u64 {
        self.runs_in(rounds).map(|r| r.routed_to_store).sum()
    }

    pub fn wrong_answers(&self) -> usize {
        self.runs.iter().filter(|r| !r.verified).count()
    }
}

/// Hit rates of the policies replayed on the recorded trace at one size.
#[derive(Debug, Clone)]
pub struct Replay {
    pub percent: f64,
    /// (policy, share of chunks hit, share of bytes hit), LRU, LFU, Belady.
    pub policies: Vec<(&'static str, f64, f64)>,
}

/// Everything one run measured.
#[derive(Debug, Clone)]
pub struct CacheBenchResult {
    /// Bytes of every column chunk of the database.
    pub data_bytes: u64,
    pub configs: Vec<Config>,
    /// The routing experiment: routed, then always from the SSD.
    pub routing: Vec<Config>,
    pub replay: Vec<Replay>,
    /// Scans in the recorded trace.
    pub trace_scans: usize,
}

/// Bytes of every column chunk of `tables`.
pub(crate) async fn data_bytes(e: &Session, tables: &[&str]) -> Result<u64, String> {
    let db = e.engine().database();
    let catalog = db.refresh().await.map_err(|e| e.to_string())?;
    let mut total = 0;
    for &t in tables {
        let entry = catalog.tables.get(&t.to_string()).ok_or_else(|| format!("table {t} missing"))?;
        let data = db.table_data(entry).await.map_err(|e| e.to_string())?;
        for live in &data.objects {
            total += data.object(live).row_groups.iter().flat_map(|rg| rg.columns.iter().map(|c| c.length)).sum::<u64>();
        }
    }
    Ok(total)
}

/// Runs the benchmark.
pub async fn run(store: &BenchStore<'_>, opts: &CacheBenchOptions, progress: &dyn Fn(&str)) -> Result<CacheBenchResult, String> {
    assert!(opts.rounds >= 1 && !opts.queries.is_empty());
    std::fs::create_dir_all(&opts.out).map_err(|e| format!("{}: {e}", opts.out.display()))?;
    let (url, direct, loader) = prepare(store, opts.sf, opts.chunk_bytes, progress).await?;
    let data = data_bytes(&loader, &tpch::TABLES).await?;
    drop(loader);
    progress(&format!("data: {:.1} MiB of column chunks", data as f64 / 1048576.0));
    let orders: Vec<Vec<usize>> = (0..opts.rounds)
        .map(|r| {
            let mut q = opts.queries.clone();
            q.shuffle(&mut rand::rngs::StdRng::seed_from_u64(opts.seed.wrapping_add(r as u64)));
            q
        })
        .collect();

    let mut plan: Vec<(Tier, f64, Option<SlowSsd>, bool)> = vec![(Tier::Off, 0.0, None, true)];
    for &p in &opts.sizes {
        for &t in &opts.tiers {
            plan.push((t, p, None, true));
        }
    }
    if let Some(slow) = opts.slow_ssd {
        plan.push((Tier::Ssd, 100.0, Some(slow), true));
        plan.push((Tier::Ssd, 100.0, Some(slow), false));
    }
    let mut result = CacheBenchResult { data_bytes: data, configs: Vec::new(), routing: Vec::new(), replay: Vec::new(), trace_scans: 0 };
    let mut trace: Option<Vec<Vec<SegmentKey>>> = None;
    for (i, &(tier, percent, slow, routed)) in plan.iter().enumerate() {
        let size = (data as f64 * percent / 100.0) as u64;
        let name = match (tier, slow) {
            (Tier::Off, _) => "off".to_string(),
            (_, None) => format!("{} {percent}%", tier.name()),
            (_, Some(_)) => format!("slow ssd: {}", if routed { "routed" } else { "always ssd" }),
        };
        let ssd_dir = opts.ssd_root.join(format!("config-{i}"));
        let _ = std::fs::remove_dir_all(&ssd_dir);
        let mut cache = CacheOptions { memory: Some(0), memory_policy: opts.policy, route_by_speed: routed, ..CacheOptions::default() };
        if matches!(tier, Tier::Memory | Tier::Both) {
            cache.memory = Some(size.max(1));
        }
        if matches!(tier, Tier::Ssd | Tier::Both) {
            cache.ssd_dir = Some(ssd_dir.clone());
            cache.ssd_capacity = size.max(1);
        }
        if let Some(s) = slow {
            cache.ssd_read_delay = s.per_read;
            cache.ssd_read_mib_delay = s.per_mib;
        }
        let mut options = measured_options(opts.request_bytes, opts.link, true, opts.memory_limit);
        options.cache = cache;
        // The memory tier lives in the engine's budget: room for it and the queries.
        if let (Some(limit), Tier::Memory | Tier::Both) = (options.memory_limit, tier) {
            options.memory_limit = Some(limit + size as usize);
        }
        let engine = open_measured(store, &url, &direct, options).await?;
        if let Some(w) = engine.engine().tiers().map(|t| t.take_warnings()).filter(|w| !w.is_empty()) {
            return Err(format!("{name}: the caches could not be set up: {}", w.join("; ")));
        }
        let recording = trace.is_none() && slow.is_none() && engine.engine().tiers().is_some();
        if recording {
            engine.engine().tiers().expect("checked").record_trace();
        }
        let mut config = Config { name: name.clone(), tier, percent, runs: Vec::new() };
        let started = Instant::now();
        for (round, order) in orders.iter().enumerate() {
            for &q in order {
                let r = engine.execute(tpch::query(q)).await.map_err(err(&format!("{name}: Q{q}")))?;
                let verified = matches!(answers::verify(q, opts.sf, &r), Verdict::Verified | Verdict::NoReference);
                if !verified {
                    progress(&format!("{name}: Q{q} answered WRONG in round {}", round + 1));
                }
                let s = &r.scan;
                config.runs.push(QueryRun {
                    round: round + 1,
                    query: q,
                    elapsed: r.elapsed,
                    gets: s.get_requests,
                    bytes_from_store: s.bytes_fetched,
                    memory_hits: s.memory_hits,
                    memory_bytes: s.memory_bytes,
                    ssd_hits: s.ssd_hits,
                    ssd_bytes: s.ssd_bytes,
                    misses: s.cache_misses,
                    routed_to_store: s.routed_to_store,
                    verified,
                });
            }
            let r = round + 1;
            progress(&format!(
                "{name}: round {r}: geomean {:.3} s, {:.0}% of chunks from cache, {} GETs, {:.1} MiB from the store",
                config.geomean(r..=r),
                100.0 * config.hit_rate(r..=r),
                config.gets(r..=r),
                config.bytes_from_store(r..=r) as f64 / 1048576.0
            ));
        }
        if recording {
            trace = Some(engine.engine().tiers().expect("checked").take_trace());
        }
        progress(&format!("{name}: done in {:.0} s", started.elapsed().as_secs_f64()));
        drop(engine);
        let _ = std::fs::remove_dir_all(&ssd_dir);
        release_free_memory();
        match slow {
            Some(_) => result.routing.push(config),
            None => result.configs.push(config),
        }
    }
    if let Some(trace) = trace {
        result.trace_scans = trace.len();
        result.replay = opts.sizes.iter().map(|&p| replay(&trace, (data as f64 * p / 100.0) as u64, p)).collect();
    }
    write_outputs(opts, &result)?;
    Ok(result)
}

/// The framework replayed on `trace` with each policy at `capacity`.
pub fn replay(trace: &[Vec<SegmentKey>], capacity: u64, percent: f64) -> Replay {
    let policies: Vec<Box<dyn Policy>> = vec![PolicyKind::Lru.build(), PolicyKind::Lfu.build(), Box::new(Belady::from_trace(trace))];
    let policies = policies
        .into_iter()
        .map(|policy| {
            let name = policy.name();
            let mut cache = BenefitCache::new(capacity, policy);
            let (mut hits, mut asked, mut hit_bytes, mut bytes) = (0u64, 0u64, 0u64, 0u64);
            for access in trace {
                let touched: Vec<Touch> = access.iter().cloned().map(Touch::of).collect();
                let decision = cache.on_query(&touched);
                let hit: HashSet<&SegmentKey> = decision.hits.iter().collect();
                let mut seen = HashSet::new();
                for k in access.iter().filter(|k| seen.insert(*k)) {
                    asked += 1;
                    bytes += k.len;
                    if hit.contains(k) {
                        hits += 1;
                        hit_bytes += k.len;
                    }
                }
            }
            let share = |a: u64, b: u64| if b == 0 { 0.0 } else { a as f64 / b as f64 };
            (name, share(hits, asked), share(hit_bytes, bytes))
        })
        .collect();
    Replay { percent, policies }
}

/// The report: a row per configuration, the routing experiment, the replay.
pub fn report(profile: &str, opts: &CacheBenchOptions, r: &CacheBenchResult) -> String {
    let mib = 1048576.0;
    let last = opts.rounds;
    let steady = 2.min(last)..=last;
    let mut out = format!(
        "TPC-H SF {} on the {profile} profile: {} queries × {} rounds, each round in its own random order (seed {}); data {:.1} MiB of column chunks; memory policy {}\n",
        opts.sf,
        opts.queries.len(),
        opts.rounds,
        opts.seed,
        r.data_bytes as f64 / mib,
        opts.policy.name(),
    );
    out += &format!("(steady: rounds {}-{last}; hit: chunks from a tier; cost: GETs at ${:.4} per 1,000; speedup: geomean of cache off / geomean, both over the steady rounds)\n", steady.start(), GET_PRICE_USD * 1000.0);
    out += &format!(
        "{:>14} {:>9} {:>10} {:>8} {:>8} {:>9} {:>8} {:>10} {:>9} {:>8}\n",
        "config", "round 1 s", "steady s", "speedup", "hit", "byte hit", "GETs", "store MiB", "cost $", "answers"
    );
    let off = r.configs.iter().find(|c| c.tier == Tier::Off);
    let base = off.map(|o| o.geomean(steady.clone()));
    for c in &r.configs {
        let g = c.geomean(steady.clone());
        out += &format!(
            "{:>14} {:>9.3} {:>10.3} {:>7.2}x {:>7.0}% {:>8.0}% {:>8} {:>10.1} {:>9.6} {:>8}\n",
            c.name,
            c.geomean(1..=1),
            g,
            base.map_or(f64::NAN, |b| b / g),
            100.0 * c.hit_rate(steady.clone()),
            100.0 * c.byte_hit_rate(steady.clone()),
            c.gets(steady.clone()),
            c.bytes_from_store(steady.clone()) as f64 / mib,
            c.gets(steady.clone()) as f64 * GET_PRICE_USD,
            if c.wrong_answers() == 0 { "exact".to_string() } else { format!("{} WRONG", c.wrong_answers()) },
        );
    }
    if let (Some(off), Some(slow)) = (off, opts.slow_ssd) {
        out += &format!(
            "\nrouting: an SSD tier holding all the data, made slow ({:.0} ms per read + {:.0} ms per MiB); throughput over the steady rounds against the caches off\n",
            slow.per_read.as_secs_f64() * 1e3,
            slow.per_mib.as_secs_f64() * 1e3
        );
        let n = |c: &Config| c.runs_in(steady.clone()).count() as f64;
        let tput = |c: &Config| 60.0 * n(c) / c.total(steady.clone());
        out += &format!("{:>26} {:>12} {:>10} {:>12} {:>9}\n", "config", "queries/min", "of off", "SSD reads", "to store");
        out += &format!("{:>26} {:>12.1} {:>9.0}% {:>12} {:>9}\n", "off", tput(off), 100.0, 0, 0);
        for c in &r.routing {
            let ssd: u64 = c.runs_in(steady.clone()).map(|q| q.ssd_hits).sum();
            out += &format!("{:>26} {:>12.1} {:>9.0}% {:>12} {:>9}\n", c.name, tput(c), 100.0 * tput(c) / tput(off), ssd, c.routed(steady.clone()));
        }
    }
    if !r.replay.is_empty() {
        out += &format!("\nreplay of the recorded trace ({} scans, all rounds) through the framework: chunks hit / bytes hit\n", r.trace_scans);
        out += &format!("{:>8} {:>16} {:>16} {:>16}\n", "size", "lru", "lfu", "belady");
        for rp in &r.replay {
            let cells: Vec<String> = rp.policies.iter().map(|(_, c, b)| format!("{:.0}% / {:.0}%", 100.0 * c, 100.0 * b)).collect();
            out += &format!("{:>7}% {:>16} {:>16} {:>16}\n", rp.percent, cells[0], cells[1], cells[2]);
        }
    }
    out
}

/// cache.csv (every query run) and the plots: steady geomean and GETs
/// against cache size, a line per tier, cache off as a flat line.
fn write_outputs(opts: &CacheBenchOptions, r: &CacheBenchResult) -> Result<(), String> {
    let mut csv = String::from("config,tier,percent,round,query,seconds,gets,bytes_from_store,memory_hits,memory_bytes,ssd_hits,ssd_bytes,misses,routed_to_store,verified\n");
    for c in r.configs.iter().chain(&r.routing) {
        for q in &c.runs {
            csv += &format!(
                "{},{},{},{},{},{:.6},{},{},{},{},{},{},{},{},{}\n",
                c.name,
                c.tier.name(),
                c.percent,
                q.round,
                q.query,
                q.elapsed.as_secs_f64(),
                q.gets,
                q.bytes_from_store,
                q.memory_hits,
                q.memory_bytes,
                q.ssd_hits,
                q.ssd_bytes,
                q.misses,
                q.routed_to_store,
                q.verified
            );
        }
    }
    let path = opts.out.join("cache.csv");
    std::fs::write(&path, csv).map_err(|e| format!("{}: {e}", path.display()))?;
    let last = opts.rounds;
    let steady = 2.min(last)..=last;
    let Some(off) = r.configs.iter().find(|c| c.tier == Tier::Off) else { return Ok(()) };
    let (x0, x1) = (opts.sizes.iter().copied().fold(f64::MAX, f64::min), opts.sizes.iter().copied().fold(0.0, f64::max));
    let series = |f: &dyn Fn(&Config) -> f64| -> Vec<Series> {
        let mut s: Vec<Series> = opts
            .tiers
            .iter()
            .map(|&t| Series { label: t.name().to_string(), points: r.configs.iter().filter(|c| c.tier == t).map(|c| (c.percent, f(c))).collect(), markers: true })
            .collect();
        s.push(Series { label: "cache off".into(), points: vec![(x0, f(off)), (x1, f(off))], markers: false });
        s
    };
    let axes = |title: &str, y: &str| Axes { title: title.into(), x_label: "cache size, % of the data (each tier)".into(), y_label: y.into(), log_x: false, legend_lower_right: false };
    plot::line_chart(&opts.out.join("time.png"), &axes(&format!("TPC-H SF {}: geomean query time, rounds 2-{last}", opts.sf), "seconds"), &series(&|c| c.geomean(steady.clone())))?;
    plot::line_chart(&opts.out.join("gets.png"), &axes(&format!("TPC-H SF {}: GET requests, rounds 2-{last}", opts.sf), "GETs"), &series(&|c| c.gets(steady.clone()) as f64))?;
    Ok(())
}
