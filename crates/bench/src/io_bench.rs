//! `blobhouse bench io`: the download manager against object_store's reqwest
//! path, same requests, same server, same run.
//!
//! Both clients fetch the testbed's 16 MiB calibration objects from nginx in
//! ranges of the given size with the given number of requests in flight, on
//! one client thread each (the event loop runs on the calling thread;
//! object_store runs on a current-thread tokio runtime). CPU is the process's
//! user + system time (`getrusage(RUSAGE_SELF)`) over the run: the servers are
//! other processes, so it is the client's cost alone. Every body's length is
//! checked; the bytes themselves are checked by the crates' tests.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use blobhouse_io::uring::{EventLoop, LoopOptions, Request};
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
    /// Where report.txt, io.csv and the plot go.
    pub out: PathBuf,
}

/// Which client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Client {
    DownloadManager,
    ObjectStore,
}

impl Client {
    fn name(self) -> &'static str {
        match self {
            Client::DownloadManager => "download manager (io_uring)",
            Client::ObjectStore => "object_store 0.13 (reqwest)",
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
    pub cpu_seconds: f64,
    pub retries: u64,
}

impl IoRun {
    fn gib(&self) -> f64 {
        self.bytes as f64 / (1u64 << 30) as f64
    }
    /// Throughput.
    pub fn gib_per_s(&self) -> f64 {
        self.gib() / self.seconds
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

/// Runs the event loop: batches of 2 × in-flight requests, buffers reused.
pub fn run_download_manager(base: &str, size: usize, in_flight: usize, requests: usize) -> Result<IoRun, String> {
    let url = base.strip_prefix("http://").ok_or("the download manager benchmark needs an http:// endpoint")?;
    let addr: SocketAddr = url.parse().map_err(|e| format!("{url}: {e}"))?;
    let opts = LoopOptions { max_in_flight: in_flight, attempt_timeout: Duration::from_secs(60), ..Default::default() };
    let mut lp = EventLoop::new(opts).map_err(|e| format!("io_uring: {e}"))?;
    let mut buffers: Vec<Vec<u8>> = Vec::new();
    let batch = (2 * in_flight).max(1);
    let (cpu0, t0) = (cpu_seconds(), Instant::now());
    let mut bytes = 0u64;
    let mut next = 0;
    while next < requests {
        let n = batch.min(requests - next);
        let gets = (next..next + n)
            .map(|i| {
                let (target, range) = request(i, size);
                Request { buffer: buffers.pop().unwrap_or_default(), ..Request::get(addr, url.to_string(), format!("/{target}"), Some(range)) }
            })
            .collect();
        for r in lp.fetch_all(gets).map_err(|e| e.to_string())? {
            let f = r.map_err(|e| e.to_string())?;
            if f.body.len() != size {
                return Err(format!("got {} bytes, wanted {size}", f.body.len()));
            }
            bytes += f.body.len() as u64;
            buffers.push(f.body);
        }
        next += n;
    }
    Ok(IoRun { client: Client::DownloadManager, size, in_flight, bytes, seconds: t0.elapsed().as_secs_f64(), cpu_seconds: cpu_seconds() - cpu0, retries: lp.stats().retries })
}

/// Runs object_store's HTTP store on a current-thread runtime.
pub fn run_object_store(base: &str, size: usize, in_flight: usize, requests: usize) -> Result<IoRun, String> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| e.to_string())?;
    let store = object_store::http::HttpBuilder::new()
        .with_url(base)
        .with_client_options(object_store::ClientOptions::new().with_allow_http(true))
        .build()
        .map_err(|e| e.to_string())?;
    rt.block_on(async {
        let (cpu0, t0) = (cpu_seconds(), Instant::now());
        let mut results = futures::stream::iter(0..requests)
            .map(|i| {
                let store = &store;
                async move {
                    let (target, range) = request(i, size);
                    store.get_range(&object_store::path::Path::from(target), range).await
                }
            })
            .buffer_unordered(in_flight);
        let mut bytes = 0u64;
        while let Some(r) = results.next().await {
            let body = r.map_err(|e| e.to_string())?;
            if body.len() != size {
                return Err(format!("got {} bytes, wanted {size}", body.len()));
            }
            bytes += body.len() as u64;
        }
        Ok(IoRun { client: Client::ObjectStore, size, in_flight, bytes, seconds: t0.elapsed().as_secs_f64(), cpu_seconds: cpu_seconds() - cpu0, retries: 0 })
    })
}

/// Runs every (size, in-flight) point with both clients, interleaved.
pub fn run(tb: &Testbed, opts: &IoBenchOptions, progress: &dyn Fn(&str)) -> Result<Vec<IoRun>, String> {
    tb.ensure_calibration_objects().map_err(|e| e.to_string())?;
    let base = tb.endpoints().http;
    let mut runs = Vec::new();
    for &size in &opts.sizes {
        if size == 0 || size as u64 > OBJECT {
            return Err(format!("request size {size} must be between 1 byte and 16 MiB"));
        }
        for &c in &opts.in_flight {
            progress(&format!("{} requests of {} KiB, {c} in flight", opts.requests, size >> 10));
            // Warm both (connections, page cache), then measure.
            run_download_manager(&base, size, c, c.min(opts.requests))?;
            runs.push(run_download_manager(&base, size, c, opts.requests)?);
            run_object_store(&base, size, c, c.min(opts.requests))?;
            runs.push(run_object_store(&base, size, c, opts.requests)?);
        }
    }
    write_outputs(tb, &runs, &opts.out)?;
    Ok(runs)
}

/// The runs as a table, with the download manager's CPU ratio to object_store.
pub fn report(profile: &str, runs: &[IoRun]) -> String {
    let mut s = format!("I/O benchmark on profile '{profile}' (one client thread each; CPU = client process user+sys)\n\n");
    s.push_str("client                        size KiB  in flight   GiB   seconds  GiB/s  CPU-s  CPU-s/GiB  retries\n");
    for r in runs {
        s.push_str(&format!(
            "{:<29} {:>8} {:>10} {:>5.2} {:>9.2} {:>6.2} {:>6.2} {:>10.3} {:>8}\n",
            r.client.name(),
            r.size >> 10,
            r.in_flight,
            r.gib(),
            r.seconds,
            r.gib_per_s(),
            r.cpu_seconds,
            r.cpu_per_gib(),
            r.retries
        ));
    }
    s.push_str("\nsize KiB  in flight  CPU-s/GiB ratio (download manager / object_store)  throughput ratio\n");
    for pair in runs.chunks(2) {
        if let [dm, os] = pair {
            s.push_str(&format!("{:>8} {:>10} {:>47.2} {:>17.2}\n", dm.size >> 10, dm.in_flight, dm.cpu_per_gib() / os.cpu_per_gib(), dm.gib_per_s() / os.gib_per_s()));
        }
    }
    s
}

fn write_outputs(tb: &Testbed, runs: &[IoRun], out: &Path) -> Result<(), String> {
    std::fs::create_dir_all(out).map_err(|e| format!("{}: {e}", out.display()))?;
    let mut csv = String::from("client,size_bytes,in_flight,bytes,seconds,cpu_seconds,retries\n");
    for r in runs {
        csv.push_str(&format!("{},{},{},{},{:.4},{:.4},{}\n", r.client.name(), r.size, r.in_flight, r.bytes, r.seconds, r.cpu_seconds, r.retries));
    }
    std::fs::write(out.join("io.csv"), csv).map_err(|e| e.to_string())?;
    std::fs::write(out.join("report.txt"), report(tb.profile().name(), runs)).map_err(|e| e.to_string())?;
    // The paper's Figure 12: throughput against CPU cost, one point per run.
    let series: Vec<Series> = [Client::DownloadManager, Client::ObjectStore]
        .into_iter()
        .map(|c| {
            let mut points: Vec<(f64, f64)> = runs.iter().filter(|r| r.client == c).map(|r| (r.cpu_per_gib(), r.gib_per_s())).collect();
            points.sort_by(|a, b| a.0.total_cmp(&b.0));
            Series { label: c.name().into(), points, markers: true }
        })
        .collect();
    line_chart(
        &out.join("cpu-throughput.png"),
        &Axes { title: format!("Throughput against client CPU, profile {}", tb.profile().name()), x_label: "CPU-seconds per GiB".into(), y_label: "GiB/s".into(), log_x: false, legend_lower_right: false },
        &series,
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
