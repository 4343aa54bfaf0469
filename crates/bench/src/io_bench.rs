//! `blobhouse bench io`: the download manager against object_store's reqwest
//! path, same requests, same server, same run.
//!
//! Both clients fetch ranges of the testbed's 16 MiB calibration objects
//! through the profile's HTTP endpoint (nginx, shaped by the profile), with
//! a fixed number of requests in flight, from a current-thread tokio
//! runtime: object_store runs its requests on that thread; the download
//! manager runs them on its one event-loop thread and answers the runtime's
//! futures. A third client, "download manager (model)", submits every
//! request at once and lets the latency model and the memory budget decide
//! how many are on the wire. CPU is the process's user + system time
//! (`getrusage(RUSAGE_SELF)`) over the run — the servers are other
//! processes, so it is the client's cost alone. Every body's length is
//! checked; the bytes themselves are checked by the crates' tests.
//!
//! Every run first warms its client with one window of requests that are
//! not measured (connections, the manager's buffer pool), as a long-lived
//! engine is warm. Each point is run `repeats` times, the clients interleaved, and reported
//! as medians. Throughput is reported for the whole run and for its steady
//! state (between the 10th and the 90th percentile of completions), which is
//! what the testbed's calibration measures too.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

pub use blobhouse_io::uring::Backend;
use blobhouse_io::uring::{ConcurrencyTarget, EventLoop, LoopOptions, Request};
use blobhouse_io::{DownloadManager, ManagerOptions};
use blobhouse_testbed::Testbed;
use futures::StreamExt;
use object_store::ObjectStoreExt;

use crate::plot::{Axes, Series, line_chart};

/// What to measure.
#[derive(Debug, Clone)]
pub struct IoBenchOptions {
    /// Requests per run.
    pub requests: usize,
    /// Request sizes in bytes (each ≤ 16 MiB).
    pub sizes: Vec<usize>,
    /// Requests in flight.
    pub in_flight: Vec<usize>,
    /// Runs per point (medians are reported).
    pub repeats: usize,
    /// Which clients to run.
    pub clients: Vec<Client>,
    /// The memory budget of the model-driven client, bytes.
    pub model_memory: u64,
    /// The link the model-driven client aims for, bytes/s.
    pub model_target: f64,
    /// The download manager's kernel interface.
    pub backend: blobhouse_io::uring::Backend,
    /// Pace request starts to this many bytes per second (both clients), so
    /// their CPU per GiB is compared at equal throughput; `None`: as fast
    /// as they go.
    pub rate: Option<f64>,
    /// The testbed's calibrated aggregate throughput (MiB/s), to report
    /// throughput as a share of it.
    pub calibrated_mib_s: Option<f64>,
    /// Where report.txt, io.csv and the plots go.
    pub out: PathBuf,
}

/// Which client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Client {
    /// The download manager with a fixed number of requests in flight.
    DownloadManager,
    /// The download manager, requests in flight from its latency model.
    DownloadManagerModel,
    ObjectStore,
}

impl Client {
    pub fn name(self) -> &'static str {
        match self {
            Client::DownloadManager => "download manager",
            Client::DownloadManagerModel => "download manager (model)",
            Client::ObjectStore => "object_store 0.13 (reqwest)",
        }
    }

    /// Parses `dm`, `dm-model`, `object-store`.
    pub fn parse(s: &str) -> Result<Client, String> {
        match s {
            "dm" => Ok(Client::DownloadManager),
            "dm-model" => Ok(Client::DownloadManagerModel),
            "object-store" => Ok(Client::ObjectStore),
            other => Err(format!("unknown client '{other}': use dm, dm-model or object-store")),
        }
    }
}

/// One measured run.
#[derive(Debug, Clone)]
pub struct IoRun {
    pub client: Client,
    pub size: usize,
    pub in_flight: usize,
    pub bytes: u64,
    pub seconds: f64,
    /// Seconds between the 10th and the 90th percentile of completions.
    pub steady_seconds: f64,
    pub cpu_seconds: f64,
    pub retries: u64,
    /// Most requests on the wire at once (download manager only).
    pub max_in_flight: usize,
    /// CPU of the event-loop threads alone (download manager only).
    pub loop_cpu_seconds: f64,
}

impl IoRun {
    fn gib(&self) -> f64 {
        self.bytes as f64 / (1u64 << 30) as f64
    }
    /// Throughput over the whole run.
    pub fn gib_per_s(&self) -> f64 {
        self.gib() / self.seconds
    }
    /// Throughput in the steady state (the middle 80 % of completions).
    pub fn steady_mib_per_s(&self) -> f64 {
        0.8 * self.bytes as f64 / (1u64 << 20) as f64 / self.steady_seconds
    }
    /// Client CPU per GiB.
    pub fn cpu_per_gib(&self) -> f64 {
        self.cpu_seconds / self.gib()
    }
}

const OBJECT: u64 = 16 << 20;
const OBJECTS: usize = 8;

/// Process CPU (user + system) seconds so far.
pub fn cpu_seconds() -> f64 {
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage writes into the struct we own.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) };
    let t = |tv: libc::timeval| tv.tv_sec as f64 + tv.tv_usec as f64 / 1e6;
    t(u.ru_utime) + t(u.ru_stime)
}

/// The i-th request: which object and which range of it.
fn request(i: usize, size: usize) -> (String, std::ops::Range<u64>) {
    let per_object = (OBJECT / size as u64).max(1);
    let start = ((i / OBJECTS) as u64 % per_object) * size as u64;
    (format!("cal/16m-{}", i % OBJECTS), start..start + size as u64)
}

/// Waits until request `i` may start under pacing at `rate` bytes/s.
async fn pace(t0: Instant, i: usize, size: usize, rate: Option<f64>) {
    if let Some(rate) = rate {
        tokio::time::sleep_until((t0 + Duration::from_secs_f64(i as f64 * size as f64 / rate)).into()).await;
    }
}

/// Seconds from the 10th to the 90th percentile of completion times.
fn steady(mut done: Vec<f64>) -> f64 {
    done.sort_by(f64::total_cmp);
    let at = |q: f64| done[((done.len() - 1) as f64 * q).round() as usize];
    (at(0.9) - at(0.1)).max(1e-9)
}

fn runtime() -> Result<tokio::runtime::Runtime, String> {
    tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| e.to_string())
}

/// What one measured batch of requests gave.
struct Measured {
    bytes: u64,
    seconds: f64,
    steady_seconds: f64,
    cpu_seconds: f64,
}

/// Runs `requests` fetches (`fetch(i)` returns the body length), `window`
/// at a time, paced to `rate`; checks every length.
async fn measure<F, Fut>(requests: usize, window: usize, size: usize, rate: Option<f64>, fetch: F) -> Result<Measured, String>
where
    F: Fn(usize) -> Fut,
    Fut: std::future::Future<Output = Result<usize, String>>,
{
    let (cpu0, t0) = (cpu_seconds(), Instant::now());
    let fetch = &fetch;
    let mut results = futures::stream::iter(0..requests)
        .map(|i| async move {
            pace(t0, i, size, rate).await;
            fetch(i).await
        })
        .buffer_unordered(window.max(1));
    let (mut bytes, mut done) = (0u64, Vec::with_capacity(requests));
    while let Some(r) = results.next().await {
        let len = r?;
        if len != size {
            return Err(format!("got {len} bytes, wanted {size}"));
        }
        bytes += len as u64;
        done.push(t0.elapsed().as_secs_f64());
    }
    Ok(Measured { bytes, seconds: t0.elapsed().as_secs_f64(), steady_seconds: steady(done), cpu_seconds: cpu_seconds() - cpu0 })
}

/// Runs `requests` GETs through the download manager: `in_flight` at a time
/// from the caller, or (`model`) all at once with the model deciding. The
/// first `warmup` requests (connections, buffer pool) are not measured.
#[allow(clippy::too_many_arguments)]
pub fn run_download_manager(base: &str, size: usize, in_flight: usize, requests: usize, warmup: usize, model: Option<(f64, u64)>, rate: Option<f64>, backend: blobhouse_io::uring::Backend) -> Result<IoRun, String> {
    let mut opts = ManagerOptions::default();
    opts.loop_options.backend = backend;
    opts.loop_options.hedge = None;
    opts.loop_options.attempt_timeout = Duration::from_secs(60);
    match model {
        None => {
            opts.loop_options.concurrency = None;
            opts.loop_options.max_in_flight = in_flight;
            opts.memory = (in_flight as u64 + 1) * size as u64;
        }
        Some((target, memory)) => {
            opts.loop_options.concurrency = Some(ConcurrencyTarget { bytes_per_sec: target, memory });
            opts.loop_options.max_in_flight = 1024;
            opts.memory = memory;
        }
    }
    opts.buffer_pool = opts.memory as usize;
    let dm = DownloadManager::new(opts).map_err(|e| format!("download manager: {e}"))?;
    let window = if model.is_some() { requests } else { in_flight };
    let fetch = |i: usize| {
        let dm = &dm;
        async move {
            let (target, range) = request(i, size);
            dm.get(&format!("{base}/{target}"), Some(range)).await.map(|d| d.body.len()).map_err(|e| e.to_string())
        }
    };
    let rt = runtime()?;
    let (m, before) = rt.block_on(async {
        measure(warmup, window.min(warmup.max(1)), size, None, fetch).await?;
        let before = dm.stats();
        Ok::<_, String>((measure(requests, window, size, rate, fetch).await?, before))
    })?;
    let stats = dm.stats();
    let client = if model.is_some() { Client::DownloadManagerModel } else { Client::DownloadManager };
    Ok(IoRun {
        client,
        size,
        in_flight,
        bytes: m.bytes,
        seconds: m.seconds,
        steady_seconds: m.steady_seconds,
        cpu_seconds: m.cpu_seconds,
        retries: stats.loops.retries - before.loops.retries,
        max_in_flight: stats.loops.max_in_flight,
        loop_cpu_seconds: stats.cpu.saturating_sub(before.cpu).as_secs_f64(),
    })
}

/// Runs object_store's HTTP store on a current-thread runtime; the first
/// `warmup` requests (connections) are not measured.
pub fn run_object_store(base: &str, size: usize, in_flight: usize, requests: usize, warmup: usize, rate: Option<f64>) -> Result<IoRun, String> {
    let rt = runtime()?;
    let store = object_store::http::HttpBuilder::new()
        .with_url(base)
        .with_client_options(object_store::ClientOptions::new().with_allow_http(true).with_timeout(Duration::from_secs(60)))
        .build()
        .map_err(|e| e.to_string())?;
    let fetch = |i: usize| {
        let store = &store;
        async move {
            let (target, range) = request(i, size);
            store.get_range(&object_store::path::Path::from(target), range).await.map(|b| b.len()).map_err(|e| e.to_string())
        }
    };
    let m = rt.block_on(async {
        measure(warmup, in_flight.min(warmup.max(1)), size, None, fetch).await?;
        measure(requests, in_flight, size, rate, fetch).await
    })?;
    Ok(IoRun { client: Client::ObjectStore, size, in_flight, bytes: m.bytes, seconds: m.seconds, steady_seconds: m.steady_seconds, cpu_seconds: m.cpu_seconds, retries: 0, max_in_flight: in_flight, loop_cpu_seconds: 0.0 })
}

/// Runs every (size, in-flight) point with every client, interleaved, `repeats` times.
pub fn run(tb: &Testbed, opts: &IoBenchOptions, progress: &dyn Fn(&str)) -> Result<Vec<IoRun>, String> {
    tb.ensure_calibration_objects().map_err(|e| e.to_string())?;
    let base = tb.endpoints().http;
    let mut runs = Vec::new();
    for &size in &opts.sizes {
        if size == 0 || size as u64 > OBJECT {
            return Err(format!("request size {size} must be between 1 byte and 16 MiB"));
        }
        for &c in &opts.in_flight {
            for rep in 0..opts.repeats.max(1) {
                progress(&format!("{} requests of {} KiB, {c} in flight, run {} of {}", opts.requests, size >> 10, rep + 1, opts.repeats.max(1)));
                for &client in &opts.clients {
                    // Each run warms its own client (connections, buffers) with
                    // one window of requests before measuring, as a long-lived
                    // engine would be warm.
                    let (n, warm) = (opts.requests, c.min(opts.requests));
                    runs.push(match client {
                        Client::DownloadManager => run_download_manager(&base, size, c, n, warm, None, opts.rate, opts.backend)?,
                        Client::DownloadManagerModel => run_download_manager(&base, size, c, n, warm, Some((opts.model_target, opts.model_memory)), opts.rate, opts.backend)?,
                        Client::ObjectStore => run_object_store(&base, size, c, n, warm, opts.rate)?,
                    });
                }
            }
        }
    }
    write_outputs(tb, opts, &runs)?;
    Ok(runs)
}

/// Medians of the runs of one (client, size, in-flight) point.
#[derive(Debug, Clone)]
pub struct Point {
    pub client: Client,
    pub size: usize,
    pub in_flight: usize,
    pub runs: usize,
    pub gib_per_s: f64,
    pub steady_mib_per_s: f64,
    pub cpu_per_gib: f64,
    /// Spread of CPU-s/GiB over the runs (max − min).
    pub cpu_spread: f64,
    /// The event-loop threads' share of `cpu_per_gib`.
    pub loop_cpu_per_gib: f64,
    pub retries: u64,
    pub max_in_flight: usize,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 { v[n / 2] } else { (v[n / 2 - 1] + v[n / 2]) / 2.0 }
}

/// The runs summarised per point, in the order first measured.
pub fn points(runs: &[IoRun]) -> Vec<Point> {
    let mut keys: Vec<(Client, usize, usize)> = Vec::new();
    for r in runs {
        let k = (r.client, r.size, r.in_flight);
        if !keys.contains(&k) {
            keys.push(k);
        }
    }
    keys.into_iter()
        .map(|(client, size, in_flight)| {
            let rs: Vec<&IoRun> = runs.iter().filter(|r| (r.client, r.size, r.in_flight) == (client, size, in_flight)).collect();
            let cpu: Vec<f64> = rs.iter().map(|r| r.cpu_per_gib()).collect();
            Point {
                client,
                size,
                in_flight,
                runs: rs.len(),
                gib_per_s: median(rs.iter().map(|r| r.gib_per_s()).collect()),
                steady_mib_per_s: median(rs.iter().map(|r| r.steady_mib_per_s()).collect()),
                cpu_per_gib: median(cpu.clone()),
                cpu_spread: cpu.iter().cloned().fold(f64::MIN, f64::max) - cpu.iter().cloned().fold(f64::MAX, f64::min),
                loop_cpu_per_gib: median(rs.iter().map(|r| r.loop_cpu_seconds / r.gib()).collect()),
                retries: rs.iter().map(|r| r.retries).sum(),
                max_in_flight: rs.iter().map(|r| r.max_in_flight).max().unwrap_or(0),
            }
        })
        .collect()
}

/// The download manager's CPU-s/GiB at `gib_per_s`, interpolated on its
/// throughput–CPU curve for one request size (`None` outside the curve).
fn dm_cpu_at(points: &[Point], size: usize, gib_per_s: f64) -> Option<f64> {
    let mut curve: Vec<(f64, f64)> = points.iter().filter(|p| p.client == Client::DownloadManager && p.size == size).map(|p| (p.gib_per_s, p.cpu_per_gib)).collect();
    curve.sort_by(|a, b| a.0.total_cmp(&b.0));
    curve.windows(2).find(|w| w[0].0 <= gib_per_s && gib_per_s <= w[1].0).map(|w| {
        let t = (gib_per_s - w[0].0) / (w[1].0 - w[0].0).max(1e-12);
        w[0].1 + t * (w[1].1 - w[0].1)
    })
}

/// The points as tables: per point, then the CPU ratios to object_store.
pub fn report(profile: &str, opts: &IoBenchOptions, runs: &[IoRun]) -> String {
    let pts = points(runs);
    let mut s = format!(
        "I/O benchmark on profile '{profile}': {} requests per run, medians of {} runs; one event-loop thread ({:?}); CPU = client process user+sys{}\n\n",
        opts.requests,
        opts.repeats.max(1),
        opts.backend,
        opts.rate.map(|r| format!("; request starts paced to {:.0} MiB/s", r / (1u64 << 20) as f64)).unwrap_or_default()
    );
    s.push_str("client                       size KiB  in flight  max on wire   GiB/s  steady MiB/s  CPU-s/GiB (spread)  of it loop  retries\n");
    for p in &pts {
        s.push_str(&format!(
            "{:<28} {:>8} {:>10} {:>12} {:>7.2} {:>13.1} {:>9.3} ({:>6.3}) {:>10} {:>8}\n",
            p.client.name(),
            p.size >> 10,
            p.in_flight,
            p.max_in_flight,
            p.gib_per_s,
            p.steady_mib_per_s,
            p.cpu_per_gib,
            p.cpu_spread,
            if p.client == Client::ObjectStore { "-".to_string() } else { format!("{:.3}", p.loop_cpu_per_gib) },
            p.retries
        ));
    }
    if let Some(cal) = opts.calibrated_mib_s {
        s.push_str(&format!("\nsteady throughput as a share of the calibrated aggregate ({cal:.1} MiB/s):\n"));
        for p in pts.iter().filter(|p| p.client != Client::ObjectStore) {
            s.push_str(&format!("  {:<26} {:>6} KiB x {:>4}: {:>5.1} %\n", p.client.name(), p.size >> 10, p.in_flight, 100.0 * p.steady_mib_per_s / cal));
        }
    }
    let os: Vec<&Point> = pts.iter().filter(|p| p.client == Client::ObjectStore).collect();
    if !os.is_empty() && pts.iter().any(|p| p.client == Client::DownloadManager) {
        s.push_str("\nCPU-s/GiB of the download manager / object_store\nsize KiB  in flight   same in flight (throughput ratio)   at object_store's throughput\n");
        for o in os {
            let same = pts.iter().find(|p| p.client == Client::DownloadManager && p.size == o.size && p.in_flight == o.in_flight);
            let at = dm_cpu_at(&pts, o.size, o.gib_per_s);
            s.push_str(&format!(
                "{:>8} {:>10} {:>20} {:>36}\n",
                o.size >> 10,
                o.in_flight,
                same.map(|d| format!("{:.2} ({:.2})", d.cpu_per_gib / o.cpu_per_gib, d.gib_per_s / o.gib_per_s)).unwrap_or_else(|| "-".into()),
                at.map(|c| format!("{:.2}", c / o.cpu_per_gib)).unwrap_or_else(|| "outside the measured curve".into()),
            ));
        }
    }
    s
}

fn write_outputs(tb: &Testbed, opts: &IoBenchOptions, runs: &[IoRun]) -> Result<(), String> {
    let out = &opts.out;
    std::fs::create_dir_all(out).map_err(|e| format!("{}: {e}", out.display()))?;
    let mut csv = String::from("client,size_bytes,in_flight,bytes,seconds,steady_seconds,cpu_seconds,loop_cpu_seconds,retries,max_in_flight\n");
    for r in runs {
        csv.push_str(&format!("{},{},{},{},{:.4},{:.4},{:.4},{:.4},{},{}\n", r.client.name(), r.size, r.in_flight, r.bytes, r.seconds, r.steady_seconds, r.cpu_seconds, r.loop_cpu_seconds, r.retries, r.max_in_flight));
    }
    std::fs::write(out.join("io.csv"), csv).map_err(|e| e.to_string())?;
    let profile = tb.profile().name();
    std::fs::write(out.join("report.txt"), report(profile, opts, runs)).map_err(|e| e.to_string())?;
    let pts = points(runs);
    let clients = [Client::DownloadManager, Client::DownloadManagerModel, Client::ObjectStore];
    let curves = |x: &dyn Fn(&Point) -> f64, y: &dyn Fn(&Point) -> f64| -> Vec<Series> {
        let mut series = Vec::new();
        for c in clients {
            for &size in &opts.sizes {
                let mut points: Vec<(f64, f64)> = pts.iter().filter(|p| p.client == c && p.size == size).map(|p| (x(p), y(p))).collect();
                if points.is_empty() {
                    continue;
                }
                points.sort_by(|a, b| a.0.total_cmp(&b.0));
                series.push(Series { label: format!("{}, {} KiB", c.name(), size >> 10), points, markers: true });
            }
        }
        series
    };
    // The paper's Figure 12: throughput against CPU cost, one point per (size, in flight).
    line_chart(
        &out.join("cpu-throughput.png"),
        &Axes { title: format!("Throughput against client CPU, profile {profile}"), x_label: "CPU-seconds per GiB".into(), y_label: "GiB/s".into(), log_x: false, legend_lower_right: false },
        &curves(&|p| p.cpu_per_gib, &|p| p.gib_per_s),
    )?;
    line_chart(
        &out.join("throughput-concurrency.png"),
        &Axes { title: format!("Steady throughput against requests in flight, profile {profile}"), x_label: "requests in flight (caller's window)".into(), y_label: "MiB/s".into(), log_x: true, legend_lower_right: true },
        &curves(&|p| p.in_flight as f64, &|p| p.steady_mib_per_s),
    )
}

/// Latency distribution of one hedging run.
#[derive(Debug, Clone)]
pub struct HedgeRun {
    pub hedging: bool,
    pub requests: usize,
    pub failed: usize,
    /// Per-request total latency, sorted, milliseconds.
    pub latencies_ms: Vec<f64>,
    pub hedges: u64,
    pub hedges_won: u64,
    pub retries: u64,
}

impl HedgeRun {
    /// The `p`-quantile of the request latency, ms.
    pub fn percentile(&self, p: f64) -> f64 {
        if self.latencies_ms.is_empty() {
            return f64::NAN;
        }
        self.latencies_ms[((self.latencies_ms.len() - 1) as f64 * p).round() as usize]
    }
}

/// The same requests with and without hedging through the event loop.
pub fn hedging(tb: &Testbed, requests: usize, size: usize, in_flight: usize) -> Result<[HedgeRun; 2], String> {
    tb.ensure_calibration_objects().map_err(|e| e.to_string())?;
    if size == 0 || size as u64 > OBJECT {
        return Err(format!("request size {size} must be between 1 byte and 16 MiB"));
    }
    let base = tb.endpoints().http;
    let url = base.strip_prefix("http://").ok_or("needs an http:// endpoint")?.to_string();
    let addr: SocketAddr = url.parse().map_err(|e| format!("{url}: {e}"))?;
    let run = |hedge: Option<blobhouse_io::uring::HedgePolicy>| -> Result<HedgeRun, String> {
        // A connection per request: the testbed draws its faults per
        // connection, S3's tail hits individual requests.
        let opts = LoopOptions { max_in_flight: in_flight, hedge, attempt_timeout: Duration::from_secs(5), keep_alive: false, ..Default::default() };
        let mut lp = EventLoop::new(opts).map_err(|e| format!("io_uring: {e}"))?;
        let gets = (0..requests)
            .map(|i| {
                let (target, range) = request(i, size);
                Request::get(addr, url.clone(), format!("/{target}"), Some(range))
            })
            .collect();
        let results = lp.fetch_all(gets).map_err(|e| e.to_string())?;
        let failed = results.iter().filter(|r| r.is_err()).count();
        let mut latencies_ms: Vec<f64> = results.iter().filter_map(|r| r.as_ref().ok()).map(|f| f.total.as_secs_f64() * 1e3).collect();
        latencies_ms.sort_by(f64::total_cmp);
        let s = lp.stats();
        Ok(HedgeRun { hedging: hedge.is_some(), requests, failed, latencies_ms, hedges: s.hedges, hedges_won: s.hedges_won, retries: s.retries })
    };
    Ok([run(None)?, run(Some(blobhouse_io::uring::HedgePolicy::default()))?])
}

/// The hedging comparison as a table.
pub fn hedging_report(profile: &str, size: usize, in_flight: usize, runs: &[HedgeRun; 2]) -> String {
    let mut s = format!("Hedging on profile '{profile}': {} requests of {} KiB, {in_flight} in flight, a connection per request, default policy (200 ms first byte, 37.5 ms/MiB, <= 5 % extra)\n\n", runs[0].requests, size >> 10);
    s.push_str("hedging  failed  p50 ms  p90 ms  p99 ms   max ms  retries  hedges (share of requests)  hedges won\n");
    for r in runs {
        s.push_str(&format!(
            "{:<8} {:>6} {:>7.1} {:>7.1} {:>7.1} {:>8.1} {:>8} {:>8} ({:>5.2} %) {:>17}\n",
            if r.hedging { "on" } else { "off" },
            r.failed,
            r.percentile(0.5),
            r.percentile(0.9),
            r.percentile(0.99),
            r.percentile(1.0),
            r.retries,
            r.hedges,
            100.0 * r.hedges as f64 / r.requests as f64,
            r.hedges_won
        ));
    }
    s.push_str(&format!("\np99 without / with hedging: {:.2}x\n", runs[0].percentile(0.99) / runs[1].percentile(0.99)));
    s
}
