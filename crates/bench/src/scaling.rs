//! `blobhouse bench scaling`: the TPC-H queries at every thread count of a
//! sweep (1, 2, 4, 8, 16 by default) on a local directory, and optionally
//! DuckDB at the same thread counts on the same Parquet files.
//!
//! Why a benchmark of its own: blobhouse once got *slower* with more cores
//! (a 16-core machine ran Q6 at SF 10 in 4.1 s with all cores and 2.4 s
//! pinned to two), and a machine with two cores cannot see that. The sweep
//! keeps it visible: per query, time and peak resident set at each thread
//! count, the speedup over two threads, and how much more the resident set
//! grows in the query than at two threads (growth, not peak: runs share
//! the process, and what earlier runs left in the allocator is not the
//! query's). On a two-core machine the columns above two threads measure
//! only oversubscription; run it where the cores are.
//!
//! Each thread count gets a tokio runtime of that many workers and an
//! engine with as many partitions, so one process measures the whole sweep
//! with nothing else sized from the machine. Two modes:
//! - *one-shot* (default): every run opens a fresh engine with the default
//!   options (caches on, nothing cached yet, no footer decoded): what
//!   `blobhouse sql --threads N -f qNN.sql` does in a new process, less the
//!   process start. Scripts and notebooks run that way.
//! - *warm* (`--warm`): one engine per thread count, caches off, as `bench
//!   tpch --profile local` measures: the steady-state scan.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use blobhouse_engine::{EngineOptions, Session};

use crate::answers::{self, Verdict};
use crate::plot::{self, Axes, Series};
use crate::tpch;
use crate::tpch_bench::{self, BenchStore, Peers, PeersLayout, geomean, release_free_memory};

/// What to run.
#[derive(Debug, Clone)]
pub struct ScalingOptions {
    pub sf: f64,
    pub queries: Vec<usize>,
    /// The thread counts of the sweep, ascending.
    pub threads: Vec<usize>,
    /// Runs per query and thread count; the fastest counts.
    pub repeats: usize,
    /// Target compressed size of a column chunk in the loaded data.
    pub chunk_bytes: usize,
    /// The engine's memory limit (default: half the machine's memory), also
    /// the peers'.
    pub memory_limit: Option<usize>,
    /// One engine per thread count, caches off, instead of a fresh engine
    /// per run.
    pub warm: bool,
    /// Peers to run at every thread count (`duckdb`, `datafusion`).
    pub peer_engines: Vec<String>,
    pub out: PathBuf,
}

/// One query at one thread count.
#[derive(Debug, Clone)]
pub struct Point {
    pub query: usize,
    pub threads: usize,
    /// The fastest run's statement time.
    pub time: Duration,
    /// The highest peak resident set over the runs.
    pub rss_peak: u64,
    /// The most the resident set grew in a run (its peak less the resident
    /// set when it started): what the query itself took, without what
    /// earlier runs in this process left in the allocator.
    pub rss_growth: u64,
    pub verdict: String,
    /// Peer → (fastest time, peak resident set), or its error.
    pub peers: BTreeMap<String, Result<(Duration, u64), String>>,
}

/// A multi-threaded runtime of `threads` workers (the machine's cores when
/// `None`).
fn runtime(threads: Option<usize>) -> Result<tokio::runtime::Runtime, String> {
    let mut b = tokio::runtime::Builder::new_multi_thread();
    if let Some(t) = threads {
        b.worker_threads(t);
    }
    b.enable_all().build().map_err(|e| format!("cannot start a runtime: {e}"))
}

/// The engine options of a run at `threads` threads.
fn engine_options(opts: &ScalingOptions, threads: usize) -> EngineOptions {
    let mut o = match opts.warm {
        true => tpch_bench::measured_options(16 << 20, None, true, opts.memory_limit),
        false => EngineOptions::default(),
    };
    o.memory_limit = opts.memory_limit.or(o.memory_limit);
    o.target_partitions = threads;
    o
}

/// Runs the sweep. Call it on a plain thread: it starts a runtime per
/// thread count.
pub fn run(data_dir: &Path, opts: &ScalingOptions, progress: &dyn Fn(&str)) -> Result<Vec<Point>, String> {
    assert!(!opts.threads.is_empty() && opts.threads.iter().all(|t| *t >= 1), "thread counts are checked by the caller");
    std::fs::create_dir_all(&opts.out).map_err(|e| format!("{}: {e}", opts.out.display()))?;
    let store = BenchStore::Local(data_dir.to_path_buf());
    let (url, direct, spec) = runtime(None)?.block_on(async {
        let (url, direct, loader) = tpch_bench::prepare(&store, opts.sf, opts.chunk_bytes, progress).await?;
        let spec = match opts.peer_engines.is_empty() {
            true => None,
            false => {
                let layout = PeersLayout { sf: opts.sf, chunk_bytes: opts.chunk_bytes, memory_limit: opts.memory_limit };
                Some(tpch_bench::peers_spec(&store, &loader, &url, &direct, &layout).await?)
            }
        };
        Ok::<_, String>((url, direct, spec))
    })?;
    let mut points = Vec::new();
    for &threads in &opts.threads {
        let mut peers = Vec::new();
        if let Some(spec) = &spec {
            let mut spec = spec.clone();
            spec["threads"] = serde_json::json!(threads);
            for engine in &opts.peer_engines {
                peers.push(Peers::start(&spec, &opts.out, vec![engine.clone()], progress)?);
            }
        }
        let rt = runtime(Some(threads))?;
        rt.block_on(async {
            let options = engine_options(opts, threads);
            let warm = match opts.warm {
                true => Some(tpch_bench::open_measured(&store, &url, &direct, options.clone()).await?),
                false => None,
            };
            for &q in &opts.queries {
                let sql = tpch::query(q);
                let (mut best, mut rss_peak, mut rss_growth, mut verdict) = (None::<Duration>, 0u64, 0u64, String::new());
                for _ in 0..opts.repeats.max(1) {
                    let fresh;
                    let session: &Session = match &warm {
                        Some(s) => s,
                        None => {
                            fresh = tpch_bench::open_measured(&store, &url, &direct, options.clone()).await?;
                            &fresh
                        }
                    };
                    release_free_memory();
                    let resident = blobhouse_engine::memory::process_memory().map_or(0, |m| m.rss);
                    let r = session.execute(sql).await.map_err(|e| format!("Q{q} at {threads} threads: {e}"))?;
                    rss_peak = rss_peak.max(r.memory.rss_peak.unwrap_or(0));
                    rss_growth = rss_growth.max(r.memory.rss_peak.unwrap_or(0).saturating_sub(resident));
                    if best.is_none_or(|b| r.elapsed < b) {
                        best = Some(r.elapsed);
                        verdict = match answers::verify(q, opts.sf, &r) {
                            Verdict::Verified => "verified".to_string(),
                            Verdict::NoReference => "no reference".to_string(),
                            Verdict::Mismatch(m) => format!("MISMATCH: {m}"),
                        };
                    }
                }
                let mut peer_figures = BTreeMap::new();
                for p in peers.iter_mut() {
                    for engine in p.engines.clone() {
                        let mut got: Result<(Duration, u64), String> = Err("not run".into());
                        for _ in 0..opts.repeats.max(1) {
                            let run = p.run(&engine, q);
                            got = match (got, run) {
                                (Ok(old), Ok(new)) => Ok((old.0.min(new.0), old.1.max(new.1))),
                                (_, run) => run,
                            };
                        }
                        peer_figures.insert(engine, got);
                    }
                }
                let time = best.expect("at least one run");
                let shown: String = peer_figures.iter().map(|(p, r)| format!(", {p} {}", r.as_ref().map_or("failed".to_string(), |(d, _)| format!("{:.3} s", d.as_secs_f64())))).collect();
                let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
                progress(&format!("Q{q} at {threads} threads: {:.3} s (peak RSS {:.0} MiB, grew {:.0} MiB, {verdict}){shown}", time.as_secs_f64(), mib(rss_peak), mib(rss_growth)));
                points.push(Point { query: q, threads, time, rss_peak, rss_growth, verdict, peers: peer_figures });
            }
            Ok::<_, String>(())
        })?;
        drop(rt);
    }
    write_outputs(opts, &points)?;
    Ok(points)
}

/// The thread count the speedups are measured against: two (the smallest
/// machine we run on) when swept with more, else the smallest swept.
fn base_threads(opts: &ScalingOptions) -> usize {
    let top = opts.threads.iter().copied().max().unwrap_or(1);
    if opts.threads.contains(&2) && top > 2 { 2 } else { opts.threads.iter().copied().min().unwrap_or(1) }
}

fn point(points: &[Point], query: usize, threads: usize) -> Option<&Point> {
    points.iter().find(|p| p.query == query && p.threads == threads)
}

/// The report: per query, time at each thread count, the speedup of the
/// most threads over the base, and peak memory against the base's.
pub fn report(opts: &ScalingOptions, points: &[Point]) -> String {
    let base = base_threads(opts);
    let top = *opts.threads.iter().max().expect("threads swept");
    let peers: Vec<String> = opts.peer_engines.clone();
    let mode = if opts.warm { "warm (one engine per thread count, caches off)" } else { "one-shot (a fresh engine per run, default options)" };
    let mut out = format!(
        "TPC-H SF {} on a local directory, column chunks of ~{} KiB, {mode}, best of {}; threads {:?}\n(speedup: time at {base} threads / time at {top}; RSS: how much the resident set grew in the query at {top} threads, MiB, and that against {base} threads)\n",
        opts.sf,
        opts.chunk_bytes >> 10,
        opts.repeats.max(1),
        opts.threads
    );
    out += &format!("{:>4}", "q");
    for t in &opts.threads {
        out += &format!(" {:>9}", format!("{t}t s"));
    }
    out += &format!(" {:>8} {:>8} {:>9}", format!("{top}/{base}"), "RSS MiB", "RSS ratio");
    for p in &peers {
        for t in &opts.threads {
            out += &format!(" {:>11}", format!("{p} {t}t"));
        }
        out += &format!(" {:>8}", format!("{p} {top}/{base}"));
    }
    out += "  answers\n";
    let speedup = |q: usize, time: &dyn Fn(&Point) -> Option<Duration>| -> Option<f64> {
        let b = time(point(points, q, base)?)?;
        let t = time(point(points, q, top)?)?;
        Some(b.as_secs_f64() / t.as_secs_f64().max(1e-9))
    };
    let ours = |p: &Point| Some(p.time);
    for &q in &opts.queries {
        out += &format!("{:>4}", format!("Q{q}"));
        for &t in &opts.threads {
            out += &format!(" {:>9}", point(points, q, t).map_or("-".to_string(), |p| format!("{:.3}", p.time.as_secs_f64())));
        }
        let rss = point(points, q, base).zip(point(points, q, top)).map(|(b, t)| t.rss_growth as f64 / b.rss_growth.max(1) as f64);
        let grew = point(points, q, top).map_or("-".to_string(), |p| format!("{:.0}", p.rss_growth as f64 / (1u64 << 20) as f64));
        out += &format!(" {:>8} {:>8} {:>9}", speedup(q, &ours).map_or("-".to_string(), |s| format!("{s:.2}x")), grew, rss.map_or("-".to_string(), |r| format!("{r:.2}")));
        for peer in &peers {
            let theirs = |p: &Point| p.peers.get(peer).and_then(|r| r.as_ref().ok()).map(|(d, _)| *d);
            for &t in &opts.threads {
                out += &format!(" {:>11}", point(points, q, t).and_then(theirs).map_or("-".to_string(), |d| format!("{:.3}", d.as_secs_f64())));
            }
            out += &format!(" {:>8}", speedup(q, &theirs).map_or("-".to_string(), |s| format!("{s:.2}x")));
        }
        let verdicts: Vec<&str> = opts.threads.iter().filter_map(|&t| point(points, q, t)).map(|p| p.verdict.as_str()).collect();
        let all_verified = !verdicts.is_empty() && verdicts.iter().all(|v| *v == "verified");
        out += &format!("  {}\n", if all_verified { "verified".to_string() } else { verdicts.join(" / ") });
    }
    out += &format!("{:>4}", "geo");
    for &t in &opts.threads {
        out += &format!(" {:>9}", format!("{:.3}", geomean(points.iter().filter(|p| p.threads == t).map(|p| p.time.as_secs_f64()))));
    }
    let speedups = geomean(opts.queries.iter().filter_map(|&q| speedup(q, &ours)));
    out += &format!(" {:>8}\n", format!("{speedups:.2}x"));
    let slow: Vec<String> = opts.queries.iter().filter(|&&q| speedup(q, &ours).is_some_and(|s| s < 5.0)).map(|q| format!("Q{q}")).collect();
    if top >= 16 && base == 2 {
        out += &format!("queries under 5x from {base} to {top} threads: {}\n", if slow.is_empty() { "none".to_string() } else { slow.join(", ") });
    }
    out
}

/// `scaling.csv` and `scaling.png` (speedup over the base thread count, per
/// query, with the ideal line) in the output directory.
fn write_outputs(opts: &ScalingOptions, points: &[Point]) -> Result<(), String> {
    let mut csv = String::from("query,threads,seconds,rss_peak_bytes,rss_growth_bytes,verdict,peer,peer_seconds,peer_rss_peak_bytes\n");
    for p in points {
        let base = format!("{},{},{:.6},{},{},{}", p.query, p.threads, p.time.as_secs_f64(), p.rss_peak, p.rss_growth, p.verdict.replace(',', ";"));
        if p.peers.is_empty() {
            csv += &format!("{base},,,\n");
        }
        for (peer, r) in &p.peers {
            csv += &match r {
                Ok((d, rss)) => format!("{base},{peer},{:.6},{rss}\n", d.as_secs_f64()),
                Err(_) => format!("{base},{peer},,\n"),
            };
        }
    }
    std::fs::write(opts.out.join("scaling.csv"), csv).map_err(|e| e.to_string())?;
    let base = base_threads(opts);
    let speedups = |time: &dyn Fn(&Point) -> Option<Duration>| -> Vec<(f64, f64)> {
        opts.threads
            .iter()
            .filter_map(|&t| {
                let ratios = opts.queries.iter().filter_map(|&q| Some(time(point(points, q, base)?)?.as_secs_f64() / time(point(points, q, t)?)?.as_secs_f64().max(1e-9)));
                let g = geomean(ratios);
                (!g.is_nan()).then_some((t as f64, g))
            })
            .collect()
    };
    let mut series = vec![Series { label: "blobhouse (geomean of the queries)".into(), points: speedups(&|p| Some(p.time)), markers: true }];
    for peer in &opts.peer_engines {
        series.push(Series { label: format!("{peer} (geomean)"), points: speedups(&|p| p.peers.get(peer).and_then(|r| r.as_ref().ok()).map(|(d, _)| *d)), markers: true });
    }
    for &q in opts.queries.iter().filter(|q| [1, 6, 9, 18].contains(*q)) {
        series.push(Series { label: format!("blobhouse Q{q}"), points: speedups(&|p| (p.query == q).then_some(p.time)), markers: true });
    }
    series.push(Series { label: "linear".into(), points: opts.threads.iter().map(|&t| (t as f64, t as f64 / base as f64)).collect(), markers: false });
    let axes = Axes {
        title: format!("TPC-H SF {}: speedup over {base} threads", opts.sf),
        x_label: "threads".into(),
        y_label: format!("time at {base} threads / time"),
        log_x: true,
        legend_lower_right: false,
    };
    plot::line_chart(&opts.out.join("scaling.png"), &axes, &series)
}
