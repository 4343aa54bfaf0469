//! `blobhouse bench serve`: many clients on one server, against the same
//! queries run one at a time.
//!
//! The server (`blobhouse_server`, in this process) serves TPC-H from the
//! testbed's store through the profile's shaped link, caches off (every
//! statement reads the store, so the two phases do the same work). Clients
//! are real drivers in separate processes' threads (`serve/clients.py`):
//! psycopg over the PostgreSQL wire protocol and ADBC over Arrow Flight SQL,
//! alternating.
//!
//! 1. *serial*: one psycopg client, then one ADBC client, each running the
//!    queries once, one at a time; a query's serial time is the faster of
//!    the two (the first pass also warms the footer cache);
//! 2. *concurrent*: `clients` clients for `duration`, each looping over the
//!    queries from its own starting point.
//!
//! Every statement's row count is checked against the serial run's; an
//! error or a different count is an error of the run. Reported: throughput
//! (statements per minute) of both phases and their ratio, per query the
//! serial time and the concurrent p50 and p99 (which include the time a
//! statement waited in the server's queue), and the server's peak resident
//! set in each phase.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use blobhouse_engine::memory::{format_bytes, process_memory, reset_peak_rss};
use blobhouse_server::{Server, ServerOptions, Users};

use crate::plot::{self, Axes, Series};
use crate::tpch;
use crate::tpch_bench::{BenchStore, measured_options, open_measured, prepare};

/// The clients' driver, written next to the results when the benchmark runs.
const CLIENTS_PY: &str = include_str!("serve/clients.py");

/// What to run.
#[derive(Debug, Clone)]
pub struct ServeBenchOptions {
    pub sf: f64,
    pub queries: Vec<usize>,
    /// Concurrent clients, alternately psycopg and ADBC.
    pub clients: usize,
    /// How long the concurrent clients start statements.
    pub duration: Duration,
    /// The server's limit on statements running at once (0: its default,
    /// twice the cores).
    pub max_queries: usize,
    /// Largest range request (the smallest is half).
    pub request_bytes: u64,
    /// Column chunk size of the loaded data.
    pub chunk_bytes: usize,
    /// The profile's link throughput, bytes/s, for the object scheduler.
    pub link: Option<f64>,
    pub out: PathBuf,
}

/// One statement as a client saw it.
#[derive(Debug, Clone, serde::Deserialize)]
pub struct Record {
    pub client: usize,
    pub kind: String,
    pub query: usize,
    /// Seconds from the start of the phase.
    pub start: f64,
    pub seconds: f64,
    pub rows: Option<u64>,
    pub error: Option<String>,
}

#[derive(Debug, serde::Deserialize)]
struct ClientsOutput {
    records: Vec<Record>,
    connect_errors: Vec<String>,
}

/// One phase's statements and what the server held meanwhile.
#[derive(Debug, Clone)]
pub struct Phase {
    pub records: Vec<Record>,
    /// Wall time from the start to the last statement's end.
    pub wall: Duration,
    /// The server process's peak resident set in the phase (0: unknown).
    pub rss_peak: u64,
}

/// The benchmark's results.
#[derive(Debug, Clone)]
pub struct ServeFigures {
    pub serial: Phase,
    pub concurrent: Phase,
    /// Per query, the serial run's row count (the expected one).
    pub expected_rows: BTreeMap<usize, u64>,
    /// Statements of the concurrent phase that failed or returned another
    /// row count, as "Qn (kind): what".
    pub errors: Vec<String>,
    pub clients: usize,
    pub max_queries: usize,
}

impl Phase {
    /// Statements per minute.
    pub fn throughput(&self) -> f64 {
        self.records.len() as f64 * 60.0 / self.wall.as_secs_f64().max(1e-9)
    }

    /// The `p`-th percentile (0–100) of query `q`'s times, nearest rank.
    pub fn percentile(&self, q: usize, p: f64) -> Option<f64> {
        let mut times: Vec<f64> = self.records.iter().filter(|r| r.query == q).map(|r| r.seconds).collect();
        if times.is_empty() {
            return None;
        }
        times.sort_by(f64::total_cmp);
        let rank = ((p / 100.0) * times.len() as f64).ceil().max(1.0) as usize;
        Some(times[rank.min(times.len()) - 1])
    }

    pub fn count(&self, q: usize) -> usize {
        self.records.iter().filter(|r| r.query == q).count()
    }
}

/// Runs both phases against a server on `store`'s TPC-H database.
pub async fn run(store: &BenchStore<'_>, opts: &ServeBenchOptions, progress: &dyn Fn(&str)) -> Result<ServeFigures, String> {
    assert!(opts.clients >= 1 && !opts.queries.is_empty(), "at least one client and one query");
    std::fs::create_dir_all(&opts.out).map_err(|e| format!("{}: {e}", opts.out.display()))?;
    let (url, direct, loader) = prepare(store, opts.sf, opts.chunk_bytes, progress).await?;
    drop(loader);
    let engine = open_measured(store, &url, &direct, measured_options(opts.request_bytes, opts.link, true, None)).await?;
    let password: String = {
        use rand::Rng;
        let mut rng = rand::rng();
        (0..24).map(|_| rng.sample(rand::distr::Alphanumeric) as char).collect()
    };
    let mut users = Users::new();
    users.add_password("bench", &password).map_err(|e| e.to_string())?;
    let server_options = ServerOptions {
        pg_listen: "127.0.0.1:0".parse().expect("an address"),
        flight_listen: Some("127.0.0.1:0".parse().expect("an address")),
        users,
        max_connections: opts.clients + 8,
        max_queries: opts.max_queries,
        // The benchmark's statements are all slow by the server's default.
        slow_query: Duration::from_secs(3600),
        ..ServerOptions::new()
    };
    let server = Server::start(engine.engine().clone(), server_options).await.map_err(|e| format!("start the server: {e}"))?;
    let script = opts.out.join("serve-clients.py");
    std::fs::write(&script, CLIENTS_PY).map_err(|e| format!("{}: {e}", script.display()))?;
    let queries: BTreeMap<String, String> = opts.queries.iter().map(|q| (q.to_string(), tpch::query(*q).to_string())).collect();
    let phase = |name: &str, clients: Vec<(&str, Vec<usize>)>, duration: Duration| {
        let config = serde_json::json!({
            "pg_port": server.pg_addr().port(),
            "flight_port": server.flight_addr().map_or(0, |a| a.port()),
            "user": "bench",
            "password": password,
            "queries": queries,
            "clients": clients,
            "duration": duration.as_secs_f64(),
        });
        let path = opts.out.join(format!("serve-{name}.json"));
        let script = script.clone();
        async move {
            std::fs::write(&path, config.to_string()).map_err(|e| format!("{}: {e}", path.display()))?;
            reset_peak_rss();
            let out = tokio::task::spawn_blocking(move || Command::new("python3").arg(&script).arg(&path).output())
                .await
                .map_err(|e| e.to_string())?
                .map_err(|e| format!("python3: {e} (scripts/install-test-deps.sh installs psycopg and ADBC)"))?;
            let rss_peak = process_memory().map_or(0, |m| m.peak_rss);
            if !out.status.success() {
                return Err(format!("the clients failed: {}", String::from_utf8_lossy(&out.stderr)));
            }
            let parsed: ClientsOutput = serde_json::from_slice(&out.stdout).map_err(|e| format!("the clients' output: {e}"))?;
            if !parsed.connect_errors.is_empty() {
                return Err(format!("clients could not connect: {}", parsed.connect_errors.join("; ")));
            }
            let end = parsed.records.iter().map(|r| r.start + r.seconds).fold(0.0, f64::max);
            Ok::<Phase, String>(Phase { records: parsed.records, wall: Duration::from_secs_f64(end), rss_peak })
        }
    };
    progress(&format!("serial: the {} queries one at a time through psycopg, then through ADBC", opts.queries.len()));
    let mut serial = phase("serial-psycopg", vec![("psycopg", opts.queries.clone())], Duration::ZERO).await?;
    let adbc = phase("serial-adbc", vec![("adbc", opts.queries.clone())], Duration::ZERO).await?;
    let mut expected_rows = BTreeMap::new();
    let mut errors = Vec::new();
    for r in serial.records.iter().chain(&adbc.records) {
        match (&r.error, r.rows) {
            (Some(e), _) => errors.push(format!("Q{} ({}, serial): {e}", r.query, r.kind)),
            (None, Some(rows)) => {
                if let Some(previous) = expected_rows.insert(r.query, rows)
                    && previous != rows
                {
                    errors.push(format!("Q{}: {previous} rows through psycopg, {rows} through ADBC", r.query));
                }
            }
            (None, None) => {}
        }
    }
    // A query's serial time: the faster of its two runs.
    for r in &mut serial.records {
        if let Some(other) = adbc.records.iter().find(|a| a.query == r.query) {
            r.seconds = r.seconds.min(other.seconds);
        }
    }
    serial.wall = Duration::from_secs_f64(serial.records.iter().map(|r| r.seconds).sum());
    serial.rss_peak = serial.rss_peak.max(adbc.rss_peak);
    progress(&format!("concurrent: {} clients (psycopg and ADBC alternately) for {:.0} s", opts.clients, opts.duration.as_secs_f64()));
    let clients: Vec<(&str, Vec<usize>)> = (0..opts.clients)
        .map(|i| {
            let mut order = opts.queries.clone();
            let n = order.len();
            order.rotate_left((i * 7) % n);
            (if i % 2 == 0 { "psycopg" } else { "adbc" }, order)
        })
        .collect();
    let concurrent = phase("concurrent", clients, opts.duration).await?;
    for r in &concurrent.records {
        match (&r.error, r.rows, expected_rows.get(&r.query)) {
            (Some(e), ..) => errors.push(format!("Q{} ({}): {e}", r.query, r.kind)),
            (None, Some(rows), Some(&expected)) if rows != expected => errors.push(format!("Q{} ({}): {rows} rows, {expected} expected", r.query, r.kind)),
            _ => {}
        }
    }
    let max_queries = if opts.max_queries == 0 { 2 * std::thread::available_parallelism().map_or(1, |n| n.get()) } else { opts.max_queries };
    drop(server);
    let figures = ServeFigures { serial, concurrent, expected_rows, errors, clients: opts.clients, max_queries };
    write_outputs(opts, &figures)?;
    Ok(figures)
}

/// The report: totals, then a line per query.
pub fn report(profile: &str, opts: &ServeBenchOptions, f: &ServeFigures) -> String {
    let mut out = String::new();
    let (s, c) = (&f.serial, &f.concurrent);
    out += &format!(
        "blobhouse bench serve: TPC-H SF {} on the {profile} profile, caches off; {} clients (psycopg and ADBC alternately) for {:.0} s, {} statements running at most\n\n",
        opts.sf,
        f.clients,
        opts.duration.as_secs_f64(),
        f.max_queries
    );
    out += &format!("{:<28} {:>12} {:>12} {:>8}\n", "", "serial", "concurrent", "ratio");
    out += &format!("{:<28} {:>12.1} {:>12.1} {:>7.2}×\n", "statements per minute", s.throughput(), c.throughput(), c.throughput() / s.throughput().max(1e-9));
    out += &format!("{:<28} {:>12} {:>12}\n", "statements", s.records.len(), c.records.len());
    out += &format!("{:<28} {:>12} {:>12}\n", "server peak RSS", format_bytes(s.rss_peak), format_bytes(c.rss_peak));
    out += &format!("{:<28} {:>12} {:>12}\n\n", "errors", "", f.errors.len());
    out += &format!("{:>5} {:>10} {:>6} {:>10} {:>10} {:>10}\n", "query", "serial s", "runs", "p50 s", "p99 s", "p50/serial");
    for &q in &opts.queries {
        let serial = s.percentile(q, 50.0);
        let (p50, p99) = (c.percentile(q, 50.0), c.percentile(q, 99.0));
        let cell = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.3}"));
        let ratio = match (p50, serial) {
            (Some(a), Some(b)) if b > 0.0 => format!("{:.1}", a / b),
            _ => "-".into(),
        };
        out += &format!("{q:>5} {:>10} {:>6} {:>10} {:>10} {ratio:>10}\n", cell(serial), c.count(q), cell(p50), cell(p99));
    }
    out += "\nConcurrent times include the wait in the server's queue (--max-queries). Serial: the faster of a\npsycopg and an ADBC run of each query; throughput serial = 60 s / the sum of those times.\n";
    if !f.errors.is_empty() {
        out += "\nErrors:\n";
        for e in f.errors.iter().take(20) {
            out += &format!("  {e}\n");
        }
    }
    out
}

/// serve.csv (a line per statement of both phases) and serve.png (per
/// query: serial time, concurrent p50 and p99).
fn write_outputs(opts: &ServeBenchOptions, f: &ServeFigures) -> Result<(), String> {
    let mut csv = String::from("phase,client,kind,query,start_s,seconds,rows,error\n");
    for (phase, records) in [("serial", &f.serial.records), ("concurrent", &f.concurrent.records)] {
        for r in records {
            let error = r.error.as_deref().unwrap_or("").replace(['"', '\n'], "'");
            csv += &format!("{phase},{},{},{},{:.4},{:.4},{},\"{error}\"\n", r.client, r.kind, r.query, r.start, r.seconds, r.rows.map_or(String::new(), |n| n.to_string()));
        }
    }
    let path = opts.out.join("serve.csv");
    std::fs::write(&path, csv).map_err(|e| format!("{}: {e}", path.display()))?;
    let points = |phase: &Phase, p: f64| opts.queries.iter().filter_map(|&q| phase.percentile(q, p).map(|v| (q as f64, v))).collect::<Vec<_>>();
    let series = [
        Series { label: "serial (one at a time)".into(), points: points(&f.serial, 50.0), markers: true },
        Series { label: format!("{} clients, p50", f.clients), points: points(&f.concurrent, 50.0), markers: true },
        Series { label: format!("{} clients, p99", f.clients), points: points(&f.concurrent, 99.0), markers: true },
    ];
    let axes = Axes { title: format!("TPC-H SF {} through the server", opts.sf), x_label: "TPC-H query".into(), y_label: "seconds".into(), log_x: false, legend_lower_right: false };
    plot::line_chart(&opts.out.join("serve.png"), &axes, &series)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_nearest_rank() {
        let records = (1..=100).map(|i| Record { client: 0, kind: "psycopg".into(), query: 1, start: 0.0, seconds: i as f64, rows: Some(1), error: None }).collect();
        let phase = Phase { records, wall: Duration::from_secs(60), rss_peak: 0 };
        assert_eq!(phase.percentile(1, 50.0), Some(50.0));
        assert_eq!(phase.percentile(1, 99.0), Some(99.0));
        assert_eq!(phase.percentile(1, 100.0), Some(100.0));
        assert_eq!(phase.percentile(2, 50.0), None);
        assert_eq!(phase.throughput(), 100.0);
    }
}
