//! `blobhouse bench encryption`: what encryption at rest costs, measured
//! the way AnyBlob measured it (§2–3 of its paper: CPU per byte
//! retrieved): the same TPC-H data loaded into a plaintext and an encrypted
//! database, in the same run, on the same store (twice, alternating; the faster load of
//! each counts); then load time and CPU,
//! and per query the CPU seconds of this process per GiB fetched, with
//! the caches off so every byte is fetched and decrypted.
//!
//! CPU is `getrusage(RUSAGE_SELF)` (user + system) of this process: the
//! store (MinIO, the testbed's proxies) runs in other processes and is not
//! counted; what is counted is download, decryption, decompression, decoding
//! and the query.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use blobhouse_engine::{EngineOptions, Session};
use blobhouse_storage::StoreOptions;
use blobhouse_storage::encryption::KeySpec;

use crate::io_bench::cpu_seconds;
use crate::tpch;
use crate::tpch_bench::{BenchStore, err, measured_options, open_measured};

/// A scan of every column of lineitem: the query whose cost is mostly
/// retrieval and decoding (the rest are TPC-H queries, by number).
pub const FULL_SCAN: &str = "SELECT count(*), sum(l_orderkey), sum(l_partkey), sum(l_suppkey), sum(l_linenumber), sum(l_quantity), sum(l_extendedprice), sum(l_discount), sum(l_tax), \
    max(l_returnflag), max(l_linestatus), max(l_shipdate), max(l_commitdate), max(l_receiptdate), max(l_shipinstruct), max(l_shipmode), max(l_comment) FROM lineitem";

/// What to measure.
#[derive(Debug, Clone)]
pub struct EncryptionBenchOptions {
    pub sf: f64,
    /// TPC-H queries run after the full scan.
    pub queries: Vec<usize>,
    /// Runs per query and database; the fastest counts.
    pub repeats: usize,
    pub request_bytes: u64,
    pub chunk_bytes: usize,
    pub link: Option<f64>,
    /// Where the report, CSV and plot go (and the key file, removed after).
    pub out: PathBuf,
}

/// One database's figures.
#[derive(Debug, Clone)]
pub struct ModeFigures {
    pub encrypted: bool,
    pub load_wall: Duration,
    pub load_cpu: f64,
    pub load_bytes: u64,
    /// Per query: (label, wall of the fastest run, its CPU seconds, bytes fetched).
    pub queries: Vec<(String, Duration, f64, u64)>,
}

/// Loads TPC-H at `opts.sf` into a fresh plaintext and a fresh encrypted
/// database on `store` and runs the queries on each.
pub async fn run(store: &BenchStore<'_>, opts: &EncryptionBenchOptions, progress: &dyn Fn(&str)) -> Result<Vec<ModeFigures>, String> {
    std::fs::create_dir_all(&opts.out).map_err(|e| format!("{}: {e}", opts.out.display()))?;
    let key_path = opts.out.join("bench-master.key");
    let key: [u8; 32] = rand::random();
    std::fs::write(&key_path, blobhouse_storage::encryption::hex(&key)).map_err(|e| e.to_string())?;
    let mut out: Vec<ModeFigures> = Vec::new();
    // Two rounds, alternating: the first load of a process pays one-time
    // costs (thread pools, the generator's tables) that the second does
    // not; each mode keeps its faster load, and the queries run on the
    // second round's databases.
    for (round, encrypted) in [(0, false), (0, true), (1, false), (1, true)] {
        let name = if encrypted { "encrypted" } else { "plain" };
        let prefix = format!("encryption-bench-{name}-sf{}-{}-{}", opts.sf, std::process::id(), blobhouse_storage::format::now_ms());
        let (url, mut direct) = match store {
            BenchStore::Testbed(tb) => (format!("s3://{}/{prefix}", blobhouse_testbed::BUCKET), crate::tpch_bench::s3_options(&tb.endpoints().s3_direct)),
            BenchStore::Local(dir) => {
                std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
                (dir.join(&prefix).to_string_lossy().to_string(), StoreOptions::default())
            }
        };
        direct.encryption = encrypted.then(|| KeySpec::File { path: key_path.clone() });
        let mut load_options = EngineOptions { cache: blobhouse_engine::CacheOptions::off(), ..EngineOptions::default() };
        load_options.write.target_chunk_bytes = opts.chunk_bytes;
        progress(&format!("loading TPC-H SF {} into a {name} database ({url})", opts.sf));
        let (cpu, started) = (cpu_seconds(), Instant::now());
        let loader = Session::open(&url, &direct, load_options).await.map_err(err("open the benchmark database"))?;
        let loads = tpch::load(&loader, opts.sf, Arc::new(|_, _, _| {})).await.map_err(err("load TPC-H"))?;
        let (load_wall, load_cpu) = (started.elapsed(), cpu_seconds() - cpu);
        let load_bytes = loads.iter().map(|l| l.bytes).sum();
        drop(loader);
        progress(&format!("{name} load: {:.2} s, {load_cpu:.2} CPU-s", load_wall.as_secs_f64()));
        if round == 0 {
            out.push(ModeFigures { encrypted, load_wall, load_cpu, load_bytes, queries: Vec::new() });
            continue;
        }

        let e = open_measured(store, &url, &direct, measured_options(opts.request_bytes, opts.link, true, None)).await?;
        let mut queries = Vec::new();
        let work: Vec<(String, String)> = std::iter::once(("lineitem scan".to_string(), FULL_SCAN.to_string())).chain(opts.queries.iter().map(|q| (format!("Q{q}"), tpch::query(*q).to_string()))).collect();
        for (label, sql) in work {
            let mut best: Option<(Duration, f64, u64)> = None;
            for _ in 0..opts.repeats.max(1) {
                let cpu = cpu_seconds();
                let r = e.execute(&sql).await.map_err(err(&label))?;
                let run = (r.elapsed, cpu_seconds() - cpu, r.scan.bytes_fetched);
                if best.is_none_or(|b| run.0 < b.0) {
                    best = Some(run);
                }
            }
            let (wall, cpu, bytes) = best.expect("one run at least");
            progress(&format!("{name} {label}: {:.2} s, {cpu:.2} CPU-s, {:.1} MiB", wall.as_secs_f64(), bytes as f64 / (1 << 20) as f64));
            queries.push((label, wall, cpu, bytes));
        }
        let figures = out.iter_mut().find(|f| f.encrypted == encrypted).expect("round 0 measured both");
        if load_wall < figures.load_wall {
            (figures.load_wall, figures.load_cpu) = (load_wall, load_cpu);
        }
        figures.queries = queries;
    }
    let _ = std::fs::remove_file(&key_path);
    Ok(out)
}

fn per_gib(cpu: f64, bytes: u64) -> f64 {
    if bytes == 0 { f64::NAN } else { cpu / (bytes as f64 / (1u64 << 30) as f64) }
}

/// The report: load, then per query CPU-s per GiB, plain and encrypted,
/// with ratios (encrypted / plain).
pub fn describe(opts: &EncryptionBenchOptions, profile: &str, figures: &[ModeFigures]) -> String {
    use std::fmt::Write as _;
    let (plain, enc) = (&figures[0], &figures[1]);
    let mut t = String::new();
    let _ = writeln!(t, "bench encryption: TPC-H SF {} on the {profile} profile, plaintext vs encrypted database (AES-256-GCM: Parquet Modular Encryption, sealed metadata), caches off, fastest of {} runs", opts.sf, opts.repeats);
    let _ = writeln!(t, "CPU is this process's (user + system); the store runs elsewhere.\n");
    let _ = writeln!(t, "{:<16} {:>10} {:>10} {:>8}", "load", "plain", "encrypted", "ratio");
    let _ = writeln!(t, "{:<16} {:>9.2}s {:>9.2}s {:>7.2}x", "wall", plain.load_wall.as_secs_f64(), enc.load_wall.as_secs_f64(), enc.load_wall.as_secs_f64() / plain.load_wall.as_secs_f64());
    let _ = writeln!(t, "{:<16} {:>9.2}s {:>9.2}s {:>7.2}x", "CPU", plain.load_cpu, enc.load_cpu, enc.load_cpu / plain.load_cpu);
    let _ = writeln!(t, "{:<16} {:>8.1}Mi {:>8.1}Mi {:>7.3}x\n", "bytes written", plain.load_bytes as f64 / (1 << 20) as f64, enc.load_bytes as f64 / (1 << 20) as f64, enc.load_bytes as f64 / plain.load_bytes as f64);
    let _ = writeln!(t, "{:<14} {:>9} {:>9} {:>12} {:>12} {:>8} {:>8}", "query", "plain s", "enc s", "plain CPU/GiB", "enc CPU/GiB", "CPU x", "wall x");
    let (mut cp, mut ce, mut bp, mut be) = (0.0, 0.0, 0u64, 0u64);
    for ((label, wp, cpu_p, bytes_p), (_, we, cpu_e, bytes_e)) in plain.queries.iter().zip(&enc.queries) {
        let _ = writeln!(
            t,
            "{label:<14} {:>9.3} {:>9.3} {:>12.2} {:>12.2} {:>7.2}x {:>7.2}x",
            wp.as_secs_f64(),
            we.as_secs_f64(),
            per_gib(*cpu_p, *bytes_p),
            per_gib(*cpu_e, *bytes_e),
            per_gib(*cpu_e, *bytes_e) / per_gib(*cpu_p, *bytes_p),
            we.as_secs_f64() / wp.as_secs_f64()
        );
        (cp, ce, bp, be) = (cp + cpu_p, ce + cpu_e, bp + bytes_p, be + bytes_e);
    }
    let _ = writeln!(t, "{:<14} {:>9} {:>9} {:>12.2} {:>12.2} {:>7.2}x", "all", "", "", per_gib(cp, bp), per_gib(ce, be), per_gib(ce, be) / per_gib(cp, bp));
    let ratios: Vec<f64> = plain.queries.iter().zip(&enc.queries).map(|(p, e)| per_gib(e.2, e.3) / per_gib(p.2, p.3)).filter(|r| r.is_finite() && *r > 0.0).collect();
    if !ratios.is_empty() {
        let geomean = (ratios.iter().map(|r| r.ln()).sum::<f64>() / ratios.len() as f64).exp();
        let _ = writeln!(t, "{:<14} {:>9} {:>9} {:>12} {:>12} {:>7.2}x", "geomean", "", "", "", "", geomean);
    }
    t
}

/// `figures.csv` and `cpu-per-gib.png` in `opts.out`.
pub fn write_files(opts: &EncryptionBenchOptions, figures: &[ModeFigures]) -> Result<(), String> {
    let mut csv = String::from("mode,query,wall_s,cpu_s,bytes_fetched,cpu_s_per_gib\n");
    let mut series = Vec::new();
    for f in figures {
        let mode = if f.encrypted { "encrypted" } else { "plain" };
        csv.push_str(&format!("{mode},load,{:.4},{:.4},{},\n", f.load_wall.as_secs_f64(), f.load_cpu, f.load_bytes));
        let mut points = Vec::new();
        for (i, (label, wall, cpu, bytes)) in f.queries.iter().enumerate() {
            csv.push_str(&format!("{mode},{label},{:.4},{cpu:.4},{bytes},{:.4}\n", wall.as_secs_f64(), per_gib(*cpu, *bytes)));
            points.push((i as f64, per_gib(*cpu, *bytes)));
        }
        series.push(crate::plot::Series { label: mode.to_string(), points, markers: true });
    }
    std::fs::write(opts.out.join("figures.csv"), csv).map_err(|e| e.to_string())?;
    let axes = crate::plot::Axes {
        title: format!("CPU-s per GiB fetched, TPC-H SF {} (0 = lineitem scan, then the queries in order)", opts.sf),
        x_label: "query".into(),
        y_label: "CPU-s / GiB".into(),
        log_x: false,
        legend_lower_right: false,
    };
    crate::plot::line_chart(&opts.out.join("cpu-per-gib.png"), &axes, &series)
}
