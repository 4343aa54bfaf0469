//! `blobhouse bench tpch`: the 22 queries from memory and remote-only, per
//! query, on one testbed profile — the AnyBlob paper's Table 2 for this
//! machine — and optionally the same queries in DuckDB (httpfs) and
//! DataFusion-Python (object_store) on the same Parquet objects through the
//! same endpoint, interleaved query by query.
//!
//! - *preloaded*: blobhouse with every object of the database copied into
//!   an in-memory store first: the same scan, the same Parquet decoding, no
//!   network — the paper's in-memory version (data in buffers, same format).
//!   The remote/preloaded factor is what retrieval costs.
//! - *arrow*: every table decoded once into DataFusion `MemTable`s, same
//!   partitions and batch size: the engine with neither I/O nor decoding.
//! - *remote*: blobhouse reading only from the store, no cache, data
//!   through the download manager over the profile's shaped link.
//! - retrieval throughput: bytes fetched / remote time (a lower bound, as
//!   in the paper), against the profile's calibrated link throughput.
//! - cost: GET requests at the public S3 price.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use datafusion::datasource::MemTable;
use datafusion::prelude::{SessionConfig, SessionContext};
use object_store::ObjectStoreExt;
use object_store::path::Path as ObjectPath;

use blobhouse_engine::{Decision, EngineOptions, Session};
use blobhouse_storage::{StoreOptions, open_location};
use blobhouse_testbed::{ACCESS_KEY, BUCKET, SECRET_KEY, Testbed};

use crate::answers::{self, Verdict};
use crate::io_bench::cpu_seconds;
use crate::plot::{self, Axes, Series};
use crate::tpch;

/// Public S3 GET price in cents per request (the engine's [`blobhouse_engine::GET_PRICE_USD`]).
pub const S3_GET_CENTS: f64 = blobhouse_engine::GET_PRICE_USD * 100.0;

/// What to run.
#[derive(Debug, Clone)]
pub struct TpchBenchOptions {
    pub sf: f64,
    pub queries: Vec<usize>,
    /// Runs per query and system; the fastest is reported.
    pub repeats: usize,
    /// Also run DuckDB and DataFusion-Python (scripts/tpch-peers.py).
    pub peers: bool,
    /// The profile's calibrated link throughput, bytes/s (also given to
    /// the object scheduler as the link bandwidth).
    pub link: Option<f64>,
    /// Object scheduler on (default) or the fixed one-ahead policy.
    pub adaptive: bool,
    /// Largest range request of the remote runs (the smallest is half).
    pub request_bytes: u64,
    /// Also write each query's EXPLAIN ANALYZE (one more remote run) to
    /// `<out>/explain/qNN.txt`.
    pub explain: bool,
    /// Target compressed size of a column chunk in the loaded data (the
    /// writer's row-group size). Scaled with the request size, so that a
    /// row group is fetched by as many requests on a scaled profile as on
    /// the store it models.
    pub chunk_bytes: usize,
    /// Also decode every table into MemTables for the *arrow* column (needs
    /// memory for the whole decoded database).
    pub arrow: bool,
    /// Also run each query on the objects preloaded into memory (the
    /// *preloaded* column; holds the whole database in this process).
    pub preloaded: bool,
    /// The engine's memory limit in the measured runs, also given to the
    /// peers (DuckDB's memory_limit, DataFusion's runtime memory limit).
    pub memory_limit: Option<usize>,
    /// Which peers run with `peers`: duckdb, datafusion.
    pub peer_engines: Vec<String>,
    pub out: PathBuf,
}

/// Where the benchmark's database lives and how the measured runs read it.
pub enum BenchStore<'a> {
    /// The testbed's MinIO: loaded over the direct endpoint, read through
    /// the profile's shaped one by the download manager.
    Testbed(&'a Testbed),
    /// A local directory (one database per scale factor and layout under
    /// it), read through object_store: no network at all. The peers read
    /// the same Parquet files, hard-linked under `<dir>/peers/`.
    Local(PathBuf),
}

/// One query's figures.
#[derive(Debug, Clone)]
pub struct QueryFigures {
    pub query: usize,
    /// Decoded Arrow tables (MemTables), when run.
    pub arrow: Option<Duration>,
    /// Parquet objects preloaded into memory, read by the same scan (when run).
    pub memory: Option<Duration>,
    pub remote: Duration,
    /// The remote runs' peaks (the highest over repeats): the engine's
    /// memory budget, and this process's resident set (0 if unknown).
    pub pool_peak: u64,
    pub rss_peak: u64,
    /// Bytes the remote run spilled.
    pub spilled: u64,
    pub bytes: u64,
    pub gets: u64,
    pub verdict: String,
    /// Time partitions waited for data, summed over partitions.
    pub query_wait: Duration,
    /// Peer engine → its time (or the error).
    pub peers: BTreeMap<String, Result<Duration, String>>,
    /// Peer engine → its process's peak resident set in the query (the
    /// highest over repeats; one process per peer engine).
    pub peer_rss: BTreeMap<String, u64>,
    /// The scheduler's decisions in the remote run's largest scan.
    pub timeline: Vec<Decision>,
    /// CPU seconds (user + system) of this process in the fastest
    /// preloaded run and in the fastest remote run, and of the testbed's
    /// servers (MinIO, nginx, toxiproxy) in that remote run: on a small
    /// machine the servers compete with the query for the same cores.
    pub cpu_preloaded: f64,
    pub cpu_remote: f64,
    pub cpu_servers: f64,
    /// The download manager during the remote runs of this query (all
    /// repeats): hedges sent, attempts cut at their deadline, retries.
    pub hedges: u64,
    pub timeouts: u64,
    pub retries: u64,
}

impl QueryFigures {
    /// Remote / preloaded time (NaN without a preloaded run).
    pub fn factor(&self) -> f64 {
        self.memory.map_or(f64::NAN, |m| self.remote.as_secs_f64() / m.as_secs_f64().max(1e-9))
    }
    pub fn retrieval(&self) -> f64 {
        self.bytes as f64 / self.remote.as_secs_f64().max(1e-9)
    }
    /// Bytes per second the preloaded run consumed: the most a remote run
    /// could draw from the link, were download free and perfectly
    /// overlapped (retrieval cannot outrun the query that consumes it).
    pub fn consumption(&self) -> f64 {
        self.memory.map_or(f64::NAN, |m| self.bytes as f64 / m.as_secs_f64().max(1e-9))
    }
    /// The shortest the remote run could be on `cores` cores given the CPU
    /// it and the servers used: their CPU time spread over every core.
    /// Remote time near it means downloads were hidden behind processing.
    pub fn cpu_floor(&self, cores: f64) -> f64 {
        (self.cpu_remote + self.cpu_servers) / cores.max(1.0)
    }
}

/// Which database the peers read, and their memory limit.
pub(crate) struct PeersLayout {
    pub sf: f64,
    pub chunk_bytes: usize,
    pub memory_limit: Option<usize>,
}

/// A peer engine: a long-lived `scripts/tpch-peers.py` driven line by line,
/// one process per engine so that its peak resident set is its own.
pub(crate) struct Peers {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    pub(crate) engines: Vec<String>,
}

impl Peers {
    pub(crate) fn start(spec: &serde_json::Value, out: &Path, engines: Vec<String>, progress: &dyn Fn(&str)) -> Result<Peers, String> {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/tpch-peers.py");
        let mut spec = spec.clone();
        spec["engines"] = serde_json::json!(engines);
        let threads = spec["threads"].as_u64().unwrap_or(0);
        let spec_path = out.join(format!("peers-spec-{}-{threads}t.json", engines.join("-")));
        std::fs::write(&spec_path, serde_json::to_string_pretty(&spec).expect("json")).map_err(|e| format!("{}: {e}", spec_path.display()))?;
        let mut child = Command::new("python3")
            .arg(&script)
            .arg(&spec_path)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| format!("cannot start python3 {}: {e} (install the peers with scripts/install-bench-peers.sh)", script.display()))?;
        let stdin = child.stdin.take().expect("piped");
        let mut stdout = BufReader::new(child.stdout.take().expect("piped"));
        let mut failed = Vec::new();
        loop {
            let mut line = String::new();
            if stdout.read_line(&mut line).map_err(|e| e.to_string())? == 0 {
                return Err("tpch-peers.py exited before it was ready (run scripts/install-bench-peers.sh)".into());
            }
            let line = line.trim();
            if line == "READY" {
                break;
            }
            if let Some(rest) = line.strip_prefix("ERR setup ") {
                progress(&format!("peer setup failed: {rest}"));
                failed.push(rest.split_whitespace().next().unwrap_or("").to_string());
            }
        }
        let engines = engines.into_iter().filter(|e| !failed.contains(e)).collect();
        Ok(Peers { child, stdin, stdout, engines })
    }

    /// The query's time and the process's peak resident set in it.
    pub(crate) fn run(&mut self, engine: &str, q: usize) -> Result<(Duration, u64), String> {
        writeln!(self.stdin, "RUN {engine} {q}").and_then(|()| self.stdin.flush()).map_err(|e| format!("tpch-peers.py: {e}"))?;
        let mut line = String::new();
        self.stdout.read_line(&mut line).map_err(|e| e.to_string())?;
        let parts: Vec<&str> = line.split_whitespace().collect();
        match parts.as_slice() {
            ["OK", _, _, secs, rest @ ..] => {
                let rss = rest.get(1).and_then(|r| r.parse::<u64>().ok()).unwrap_or(0);
                secs.parse::<f64>().map(|s| (Duration::from_secs_f64(s), rss)).map_err(|e| e.to_string())
            }
            ["ERR", ..] => Err(line.trim().to_string()),
            _ => Err(format!("tpch-peers.py answered '{}'", line.trim())),
        }
    }
}

impl Drop for Peers {
    fn drop(&mut self) {
        let _ = writeln!(self.stdin, "QUIT");
        let _ = self.stdin.flush();
        let _ = self.child.wait();
    }
}

pub(crate) fn err(what: &str) -> impl Fn(blobhouse_engine::EngineError) -> String + '_ {
    move |e| format!("{what}: {e}")
}

/// Runs the benchmark on `store` (a testbed already shaped to its profile,
/// or a local directory). Returns the figures of the queries that ran and
/// the errors of those that failed.
pub(crate) fn s3_options(endpoint: &str) -> StoreOptions {
    StoreOptions {
        endpoint: Some(endpoint.to_string()),
        access_key_id: Some(ACCESS_KEY.into()),
        secret_access_key: Some(SECRET_KEY.into()),
        region: Some("us-east-1".into()),
        ..Default::default()
    }
}

/// The benchmark database of TPC-H at `sf` with column chunks of
/// `chunk_bytes`, loaded where missing (one per scale factor and layout,
/// kept for later runs): its URL, the unshaped store options that reach
/// it, and the engine that loaded it (caches off).
pub(crate) async fn prepare(store: &BenchStore<'_>, sf: f64, chunk_bytes: usize, progress: &dyn Fn(&str)) -> Result<(String, StoreOptions, Session), String> {
    prepare_dataset(store, Dataset::Tpch, sf, chunk_bytes, progress).await
}

/// A benchmark's data set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dataset {
    Tpch,
    /// SSB derived from TPC-H ([`crate::ssb`]).
    Ssb,
}

/// The benchmark database of `dataset` at `sf`, loaded unless it already
/// is: (its URL, the store options of the direct endpoint, a loader engine).
pub async fn prepare_dataset(store: &BenchStore<'_>, dataset: Dataset, sf: f64, chunk_bytes: usize, progress: &dyn Fn(&str)) -> Result<(String, StoreOptions, Session), String> {
    let prefix = match dataset {
        Dataset::Tpch => data_prefix(sf, chunk_bytes),
        Dataset::Ssb => format!("ssb-{}", data_prefix(sf, chunk_bytes).trim_start_matches("tpch-")),
    };
    let (url, direct) = match store {
        BenchStore::Testbed(tb) => (format!("s3://{BUCKET}/{prefix}"), s3_options(&tb.endpoints().s3_direct)),
        BenchStore::Local(dir) => {
            std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
            let dir = dir.canonicalize().map_err(|e| format!("{}: {e}", dir.display()))?;
            (dir.join(prefix).to_string_lossy().to_string(), StoreOptions::default())
        }
    };
    let mut load_options = EngineOptions { cache: blobhouse_engine::CacheOptions::off(), ..EngineOptions::default() };
    load_options.write.target_chunk_bytes = chunk_bytes;
    let loader = Session::open(&url, &direct, load_options).await.map_err(err("open the benchmark database"))?;
    let have = loader.engine().database().refresh().await.map_err(|e| e.to_string())?;
    match dataset {
        Dataset::Tpch => {
            let missing: Vec<&str> = tpch::TABLES.iter().copied().filter(|t| !have.tables.contains_key(*t)).collect();
            if !missing.is_empty() {
                progress(&format!("loading TPC-H SF {sf} ({} tables) into {url}", missing.len()));
                let started = Instant::now();
                tpch::load_tables(&loader, sf, &missing, Arc::new(|_, _, _| {})).await.map_err(err("load TPC-H"))?;
                progress(&format!("loaded in {:.1} s", started.elapsed().as_secs_f64()));
            }
        }
        Dataset::Ssb => {
            let complete = have.tables.len() == crate::ssb::TABLES.len() && crate::ssb::TABLES.iter().all(|t| have.tables.contains_key(*t));
            if !complete {
                if !have.tables.is_empty() {
                    return Err(format!("{url} holds tables other than SSB's five: an interrupted SSB load? Delete the prefix and run again"));
                }
                progress(&format!("generating TPC-H SF {sf} and deriving SSB into {url}"));
                let started = Instant::now();
                crate::ssb::load(&loader, sf, crate::ssb::quiet()).await.map_err(err("derive SSB"))?;
                progress(&format!("loaded in {:.1} s", started.elapsed().as_secs_f64()));
            }
        }
    }
    Ok((url, direct, loader))
}

/// The engine of the measured runs on `url`: on the testbed it reads
/// through the profile's shaped endpoint (catalog and manifests direct).
pub(crate) async fn open_measured(store: &BenchStore<'_>, url: &str, direct: &StoreOptions, options: EngineOptions) -> Result<Session, String> {
    match store {
        BenchStore::Testbed(tb) => {
            let shaped = open_location(url, &s3_options(&tb.endpoints().s3)).map_err(|e| e.to_string())?;
            let direct_location = open_location(url, direct).map_err(|e| e.to_string())?;
            Session::open_location(direct_location.with_signer(shaped.signer), direct.clone(), options).await.map_err(err("open the remote engine"))
        }
        BenchStore::Local(_) => Session::open(url, direct, options).await.map_err(err("open the local engine")),
    }
}

/// The engine options of the measured runs: the request sizes for the
/// profile, the scheduler and the link.
pub(crate) fn measured_options(request_bytes: u64, link: Option<f64>, adaptive: bool, memory_limit: Option<usize>) -> EngineOptions {
    let mut o = EngineOptions { cache: blobhouse_engine::CacheOptions::off(), ..EngineOptions::default() };
    o.memory_limit = memory_limit.or(o.memory_limit);
    o.scan.adaptive = adaptive;
    o.scan.link_bytes_per_sec = link;
    o.requests.max_request_bytes = request_bytes;
    o.requests.min_request_bytes = request_bytes / 2;
    o.requests.coalesce_gap = o.requests.coalesce_gap.min(request_bytes / 16);
    o
}

pub async fn run(store: &BenchStore<'_>, opts: &TpchBenchOptions, progress: &dyn Fn(&str)) -> Result<(Vec<QueryFigures>, Vec<(usize, String)>), String> {
    std::fs::create_dir_all(&opts.out).map_err(|e| format!("{}: {e}", opts.out.display()))?;
    let (url, direct, loader) = prepare(store, opts.sf, opts.chunk_bytes, progress).await?;

    // The reference: every table read once into MemTables.
    let options = EngineOptions::default();
    let config = SessionConfig::new().with_target_partitions(options.target_partitions).with_batch_size(options.batch_size);
    let memory = SessionContext::new_with_config(config);
    let mut decoded_bytes = 0;
    for &t in tpch::TABLES.iter().filter(|_| opts.arrow) {
        let r = loader.execute(&format!("SELECT * FROM {t}")).await.map_err(err(&format!("read {t} into memory")))?;
        decoded_bytes += r.batches.iter().map(|b| b.get_array_memory_size()).sum::<usize>();
        let n = options.target_partitions.max(1);
        let mut parts: Vec<Vec<_>> = vec![Vec::new(); n];
        for (i, b) in r.batches.into_iter().enumerate() {
            parts[i % n].push(b);
        }
        let table = MemTable::try_new(r.schema.clone(), parts).map_err(|e| e.to_string())?;
        memory.register_table(t, Arc::new(table)).map_err(|e| e.to_string())?;
    }
    if opts.arrow {
        // Against the compressed column chunks: what a cache of decoded
        // arrays would hold per byte (docs/cache.md, the memory tier).
        let compressed = crate::cache_bench::data_bytes(&loader, &tpch::TABLES).await?;
        progress(&format!(
            "tables decoded into memory: {:.1} MiB of Arrow arrays from {:.1} MiB of compressed column chunks ({:.2}x)",
            decoded_bytes as f64 / 1048576.0,
            compressed as f64 / 1048576.0,
            decoded_bytes as f64 / compressed as f64
        ));
    }

    // The same database, every object copied into an in-memory store.
    let preloaded = if opts.preloaded { Some(preload(&loader, &url, &direct, progress).await?) } else { None };

    // Peers read the same Parquet objects: copies (S3) or hard links (local)
    // under one prefix per table, which is what a listing table wants.
    let mut peers = Vec::new();
    if opts.peers {
        let layout = PeersLayout { sf: opts.sf, chunk_bytes: opts.chunk_bytes, memory_limit: opts.memory_limit };
        let spec = peers_spec(store, &loader, &url, &direct, &layout).await?;
        progress(&format!("starting {} (scripts/tpch-peers.py, one process each)", opts.peer_engines.join(" and ")));
        for engine in &opts.peer_engines {
            peers.push(Peers::start(&spec, &opts.out, vec![engine.clone()], progress)?);
        }
    }

    // The measured engine: remote-only through the shaped endpoint, or the local files.
    // Every run reads from the store (the caches are measured by `bench cache`).
    let remote_options = measured_options(opts.request_bytes, opts.link, opts.adaptive, opts.memory_limit);
    let remote = open_measured(store, &url, &direct, remote_options).await?;
    let server_pids = match store {
        BenchStore::Testbed(tb) => tb.state().pids.clone(),
        BenchStore::Local(_) => Vec::new(),
    };
    drop(loader);
    // What loading and decoding left in the allocator's free lists is not
    // the queries' memory: give it back before measuring peaks.
    release_free_memory();

    let (mut figures, mut failed) = (Vec::new(), Vec::new());
    for &q in &opts.queries {
        // A query that fails (out of memory, a store error) is reported
        // and the benchmark goes on with the next.
        let one: Result<QueryFigures, String> = async {
            let sql = tpch::query(q);
            let (mut best_arrow, mut best_mem, mut best_remote) = (None::<Duration>, None::<Duration>, None::<blobhouse_engine::QueryResult>);
            let (mut cpu_preloaded, mut cpu_remote, mut cpu_servers) = (0.0, 0.0, 0.0);
            let (mut pool_peak, mut rss_peak) = (0u64, 0u64);
            let mut peer_best: BTreeMap<String, Result<Duration, String>> = BTreeMap::new();
            let mut peer_rss: BTreeMap<String, u64> = BTreeMap::new();
            let dm_before = remote.engine().download_manager().map(|d| d.stats().loops).unwrap_or_default();
            for _ in 0..opts.repeats.max(1) {
                if opts.arrow {
                    let t = Instant::now();
                    memory.sql(sql).await.map_err(|e| format!("Q{q} in memory: {e}"))?.collect().await.map_err(|e| format!("Q{q} in memory: {e}"))?;
                    best_arrow = Some(best_arrow.map_or(t.elapsed(), |b| b.min(t.elapsed())));
                }
                if let Some(preloaded) = &preloaded {
                    let cpu = cpu_seconds();
                    let r = preloaded.execute(sql).await.map_err(err(&format!("Q{q} preloaded")))?;
                    if best_mem.is_none_or(|b| r.elapsed < b) {
                        best_mem = Some(r.elapsed);
                        cpu_preloaded = cpu_seconds() - cpu;
                    }
                }
                let (cpu, servers) = (cpu_seconds(), servers_cpu_seconds(&server_pids));
                let r = remote.execute(sql).await.map_err(err(&format!("Q{q} remote")))?;
                pool_peak = pool_peak.max(r.memory.pool_peak);
                rss_peak = rss_peak.max(r.memory.rss_peak.unwrap_or(0));
                if best_remote.as_ref().is_none_or(|b| r.elapsed < b.elapsed) {
                    best_remote = Some(r);
                    cpu_remote = cpu_seconds() - cpu;
                    cpu_servers = servers_cpu_seconds(&server_pids) - servers;
                }
                for p in peers.iter_mut() {
                    for engine in p.engines.clone() {
                        let got = p.run(&engine, q);
                        if let Ok((_, rss)) = &got {
                            let e = peer_rss.entry(engine.clone()).or_default();
                            *e = (*e).max(*rss);
                        }
                        let got = got.map(|(d, _)| d);
                        let entry = peer_best.entry(engine).or_insert_with(|| got.clone());
                        if let (Ok(new), Ok(old)) = (&got, &*entry)
                            && new < old
                        {
                            *entry = got;
                        }
                    }
                }
            }
            let r = best_remote.expect("at least one run");
            if opts.explain {
                let dir = opts.out.join("explain");
                std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
                let e = remote.execute(&format!("EXPLAIN ANALYZE {sql}")).await.map_err(err(&format!("EXPLAIN ANALYZE Q{q}")))?;
                let text = datafusion::arrow::util::pretty::pretty_format_batches(&e.batches).map_err(|e| e.to_string())?.to_string();
                std::fs::write(dir.join(format!("q{q:02}.txt")), text).map_err(|e| e.to_string())?;
            }
            let dm_after = remote.engine().download_manager().map(|d| d.stats().loops).unwrap_or_default();
            let verdict = match answers::verify(q, opts.sf, &r) {
                Verdict::Verified => "verified".to_string(),
                Verdict::NoReference => "no reference".to_string(),
                Verdict::Mismatch(m) => format!("MISMATCH: {m}"),
            };
            let timeline = r.scheduler.iter().max_by_key(|(_, d)| d.len()).map(|(_, d)| d.clone()).unwrap_or_default();
            let f = QueryFigures {
                query: q,
                arrow: best_arrow,
                memory: best_mem,
                remote: r.elapsed,
                pool_peak,
                rss_peak,
                spilled: r.memory.spilled_bytes,
                bytes: r.scan.bytes_fetched,
                gets: r.scan.get_requests,
                verdict,
                query_wait: Duration::from_nanos(r.scan.query_wait),
                peers: peer_best,
                peer_rss,
                timeline,
                cpu_preloaded,
                cpu_remote,
                cpu_servers,
                hedges: dm_after.hedges - dm_before.hedges,
                timeouts: dm_after.timeouts - dm_before.timeouts,
                retries: dm_after.retries - dm_before.retries,
            };
            let arrow = f.arrow.map_or(String::new(), |a| format!("arrow {:.3} s, ", a.as_secs_f64()));
            let pre = f.memory.map_or(String::new(), |m| format!("preloaded {:.3} s, ", m.as_secs_f64()));
            let peers: String = f.peers.iter().map(|(p, t)| format!(", {p} {}", t.as_ref().map_or("failed".to_string(), |d| format!("{:.3} s", d.as_secs_f64())))).collect();
            progress(&format!(
                "Q{q}: {arrow}{pre}{} {:.3} s (peak RSS {:.0} MiB){peers}",
                run_label(store),
                f.remote.as_secs_f64(),
                f.rss_peak as f64 / (1u64 << 20) as f64
            ));
            Ok(f)
        }
        .await;
        match one {
            Ok(f) => figures.push(f),
            Err(e) => {
                progress(&format!("Q{q} FAILED: {e}"));
                failed.push((q, e));
            }
        }
        release_free_memory();
    }
    drop(peers);
    if let Some(dm) = remote.engine().download_manager() {
        let s = dm.stats().loops;
        progress(&format!(
            "download manager: {} requests, {} retries, {} hedges ({} won), {} attempts cut at their deadline, {} cancelled, {} failed",
            s.requests, s.retries, s.hedges, s.hedges_won, s.timeouts, s.cancelled, s.failures
        ));
    }
    write_outputs(opts, &figures)?;
    Ok((figures, failed))
}

/// What the measured runs are called in the report: remote (testbed) or local.
pub fn run_label(store: &BenchStore<'_>) -> &'static str {
    match store {
        BenchStore::Testbed(_) => "remote",
        BenchStore::Local(_) => "local",
    }
}

/// Returns the allocator's free memory to the kernel (glibc keeps freed
/// memory in its arenas), so a query's peak resident set is not the
/// leftovers of loading or of the query before.
pub(crate) fn release_free_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only returns free pages of the heap to the kernel.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Every object of the database copied into an in-memory store, opened as
/// an engine.
async fn preload(loader: &Session, url: &str, direct: &StoreOptions, progress: &dyn Fn(&str)) -> Result<Session, String> {
    let preloaded_store: Arc<dyn object_store::ObjectStore> = Arc::new(object_store::memory::InMemory::new());
    let source = loader.engine().database().location().clone();
    let mut listing = source.store.list(Some(&source.prefix));
    let mut copied = 0u64;
    while let Some(meta) = futures::StreamExt::next(&mut listing).await {
        let meta = meta.map_err(|e| format!("list {url}: {e}"))?;
        let bytes = source.store.get(&meta.location).await.map_err(|e| format!("read {}: {e}", meta.location))?.bytes().await.map_err(|e| e.to_string())?;
        copied += bytes.len() as u64;
        preloaded_store.put(&meta.location, bytes.into()).await.map_err(|e| e.to_string())?;
    }
    let engine = Session::open_location(
        blobhouse_storage::Location::from_store(preloaded_store, source.prefix.clone(), format!("{url} (preloaded in memory)")),
        direct.clone(),
        EngineOptions { cache: blobhouse_engine::CacheOptions::off(), ..EngineOptions::default() },
    )
    .await
    .map_err(err("open the preloaded engine"))?;
    progress(&format!("{:.0} MiB of objects preloaded into memory", copied as f64 / (1u64 << 20) as f64));
    Ok(engine)
}

/// The peers' spec (scripts/tpch-peers.py): the same objects as the
/// database's, one prefix per table — copies in the testbed's bucket, hard
/// links on a local disk.
pub(crate) async fn peers_spec(store: &BenchStore<'_>, loader: &Session, url: &str, direct: &StoreOptions, opts: &PeersLayout) -> Result<serde_json::Value, String> {
    let version = loader.engine().database().refresh().await.map_err(|e| e.to_string())?;
    let location = loader.engine().database().location().clone();
    let mut tables = serde_json::Map::new();
    // Outside the database's prefix, in the same bucket: the store root is the bucket.
    let root = match store {
        BenchStore::Testbed(_) => Some(open_location(&format!("s3://{BUCKET}"), direct).map_err(|e| e.to_string())?),
        BenchStore::Local(_) => None,
    };
    let local_peers = match store {
        BenchStore::Testbed(_) => None,
        BenchStore::Local(dir) => Some(dir.canonicalize().map_err(|e| format!("{}: {e}", dir.display()))?.join("peers").join(data_prefix(opts.sf, opts.chunk_bytes))),
    };
    for t in tpch::TABLES {
        let manifest = loader.engine().database().manifest(&version.tables[t]).await.map_err(|e| e.to_string())?;
        let mut keys = Vec::new();
        let prefix = match &local_peers {
            None => format!("peers/{}/{t}/", data_prefix(opts.sf, opts.chunk_bytes)),
            Some(dir) => dir.join(t).to_string_lossy().to_string() + "/",
        };
        for (i, o) in manifest.objects.iter().enumerate() {
            let key = format!("{prefix}{i}.parquet");
            match &root {
                Some(root) => {
                    let target = ObjectPath::from(key.as_str());
                    if root.store.head(&target).await.is_err() {
                        let source = location.child(&o.path);
                        root.store.copy(&source, &target).await.map_err(|e| format!("copy {source} for the peers: {e}"))?;
                    }
                }
                None => {
                    let source = Path::new(url).join(&o.path);
                    std::fs::create_dir_all(&prefix).map_err(|e| format!("{prefix}: {e}"))?;
                    if !Path::new(&key).exists() {
                        std::fs::hard_link(&source, &key).or_else(|_| std::fs::copy(&source, &key).map(|_| ())).map_err(|e| format!("link {} for the peers: {e}", source.display()))?;
                    }
                }
            }
            keys.push(serde_json::Value::String(key));
        }
        tables.insert(t.to_string(), serde_json::json!({ "prefix": prefix, "keys": keys }));
    }
    let endpoint = match store {
        BenchStore::Testbed(tb) => tb.endpoints().s3.clone(),
        BenchStore::Local(_) => String::new(),
    };
    Ok(serde_json::json!({
        "local": matches!(store, BenchStore::Local(_)),
        "endpoint": endpoint,
        "bucket": BUCKET,
        "region": "us-east-1",
        "access_key": ACCESS_KEY,
        "secret_key": SECRET_KEY,
        "queries_dir": Path::new(env!("CARGO_MANIFEST_DIR")).join("tpch/queries"),
        "threads": EngineOptions::default().target_partitions,
        "memory_limit_bytes": opts.memory_limit,
        "tables": tables,
    }))
}

/// CPU seconds (user + system) the processes `pids` have used so far, from
/// /proc (0 for a process that is gone).
fn servers_cpu_seconds(pids: &[u32]) -> f64 {
    // SAFETY: sysconf has no preconditions.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    pids.iter()
        .filter_map(|pid| std::fs::read_to_string(format!("/proc/{pid}/stat")).ok())
        .filter_map(|stat| {
            // Fields after the command name (which may hold spaces): state is
            // field 3, utime and stime are fields 14 and 15.
            let rest = &stat[stat.rfind(')')? + 2..];
            let fields: Vec<&str> = rest.split_whitespace().collect();
            Some(fields.get(11)?.parse::<f64>().ok()? + fields.get(12)?.parse::<f64>().ok()?)
        })
        .sum::<f64>()
        / ticks
}

/// Where the benchmark's database lives in the bucket: one per scale
/// factor and data layout, so a run never reads data laid out for another.
fn data_prefix(sf: f64, chunk_bytes: usize) -> String {
    if chunk_bytes == blobhouse_storage::WriteOptions::default().target_chunk_bytes {
        format!("tpch-sf{sf}")
    } else {
        format!("tpch-sf{sf}-chunk{}k", chunk_bytes >> 10)
    }
}

pub(crate) fn geomean(xs: impl Iterator<Item = f64>) -> f64 {
    let (sum, n) = xs.filter(|x| *x > 0.0).fold((0.0, 0usize), |(s, n), x| (s + x.ln(), n + 1));
    if n == 0 { f64::NAN } else { (sum / n as f64).exp() }
}

/// The report: per query and geometric means.
pub fn report(profile: &str, opts: &TpchBenchOptions, figures: &[QueryFigures], failed: &[(usize, String)]) -> String {
    let mib = (1u64 << 20) as f64;
    let local = profile == "local";
    let ours = if local { "local" } else { "remote" };
    let peers: Vec<String> = figures.iter().flat_map(|f| f.peers.keys().cloned()).collect::<std::collections::BTreeSet<_>>().into_iter().collect();
    let limit = opts.memory_limit.map_or("the default memory limit (half the machine's memory)".to_string(), |l| format!("a memory limit of {} MiB (peers too)", l >> 20));
    let mut out = if local {
        format!(
            "TPC-H SF {} on a local directory (object_store, no network), column chunks of ~{} KiB, {limit}, {} threads\n(preloaded: objects in memory, same scan; pool: peak of the engine's memory budget; RSS: peak resident set of the process in the query; ratio: peer / blobhouse local)\n",
            opts.sf,
            opts.chunk_bytes >> 10,
            EngineOptions::default().target_partitions
        )
    } else {
        format!(
            "TPC-H SF {} on the {profile} profile: preloaded (objects in memory, same scan) vs remote-only (no cache), column chunks of ~{} KiB, requests of {}-{} KiB, scheduler {}; link {}; {limit}\n(arrow: decoded tables in DataFusion MemTables; factor: remote / preloaded; retr: bytes / remote time; bound: bytes / preloaded time, the most a remote run can draw; CPU: this process in the preloaded and remote runs, and the testbed servers in the remote run; floor: (remote + servers CPU) / cores; pool: peak of the engine's memory budget; RSS: peak resident set of the process in the query; ratio: peer / blobhouse remote)\n",
            opts.sf,
            opts.chunk_bytes >> 10,
            opts.request_bytes / 2 >> 10,
            opts.request_bytes >> 10,
            if opts.adaptive { "adaptive" } else { "fixed one-ahead" },
            opts.link.map_or("unknown".to_string(), |l| format!("{:.1} MiB/s (calibrated)", l / mib))
        )
    };
    let secs = |d: Option<Duration>| d.map_or("-".to_string(), |d| format!("{:.3}", d.as_secs_f64()));
    let num = |x: f64, prec: usize| if x.is_nan() { "-".to_string() } else { format!("{x:.prec$}") };
    out += &format!("{:>4} {:>8} {:>9} {:>9} {:>7}", "q", "arrow s", "preload s", format!("{ours} s"), "factor");
    if !local {
        out += &format!(
            " {:>10} {:>7} {:>11} {:>7} {:>6} {:>8} {:>8} {:>6} {:>5} {:>17} {:>7} {:>6}",
            "retr MiB/s", "of link", "bound MiB/s", "of link", "GETs", "cost ¢", "waited s", "hedges", "t/o", "CPU s pre/rem/srv", "floor s", "÷floor"
        );
    }
    out += &format!(" {:>8} {:>8} {:>9}", "pool MiB", "RSS MiB", "spill MiB");
    for p in &peers {
        out += &format!(" {:>10} {:>7} {:>8} {:>7}", format!("{p} s"), "ratio", "RSS MiB", "ratio");
    }
    out += "  answer\n";
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
    for f in figures {
        let of_link = |rate: f64| opts.link.filter(|_| !rate.is_nan()).map_or("-".to_string(), |l| format!("{:.0}%", 100.0 * rate / l));
        out += &format!(
            "{:>4} {:>8} {:>9} {:>9.3} {:>7}",
            format!("Q{}", f.query),
            secs(f.arrow),
            secs(f.memory),
            f.remote.as_secs_f64(),
            num(f.factor(), 2)
        );
        if !local {
            out += &format!(
                " {:>10.1} {:>7} {:>11} {:>7} {:>6} {:>8.4} {:>8.2} {:>6} {:>5} {:>17} {:>7.3} {:>6.2}",
                f.retrieval() / mib,
                of_link(f.retrieval()),
                num(f.consumption() / mib, 1),
                of_link(f.consumption()),
                f.gets,
                f.gets as f64 * S3_GET_CENTS,
                f.query_wait.as_secs_f64(),
                f.hedges,
                f.timeouts,
                format!("{:.1}/{:.1}/{:.1}", f.cpu_preloaded, f.cpu_remote, f.cpu_servers),
                f.cpu_floor(cores),
                f.remote.as_secs_f64() / f.cpu_floor(cores).max(1e-9)
            );
        }
        out += &format!(" {:>8.0} {:>8.0} {:>9.0}", f.pool_peak as f64 / mib, f.rss_peak as f64 / mib, f.spilled as f64 / mib);
        for p in &peers {
            let rss = f.peer_rss.get(p).copied().unwrap_or(0);
            let rss_ratio = if rss == 0 || f.rss_peak == 0 { "-".to_string() } else { format!("{:.2}", f.rss_peak as f64 / rss as f64) };
            match f.peers.get(p) {
                Some(Ok(d)) => out += &format!(" {:>10.3} {:>7.2} {:>8.0} {:>7}", d.as_secs_f64(), d.as_secs_f64() / f.remote.as_secs_f64().max(1e-9), rss as f64 / mib, rss_ratio),
                _ => out += &format!(" {:>10} {:>7} {:>8} {:>7}", "failed", "-", "-", "-"),
            }
        }
        out += &format!("  {}\n", f.verdict);
    }
    out += &format!("(peer ratio columns: time is peer / blobhouse, so above 1 blobhouse is faster; RSS is blobhouse / peer, so above 1 blobhouse holds more)\n");
    for (q, e) in failed {
        out += &format!("{:>4} FAILED: {e}\n", format!("Q{q}"));
    }
    if !failed.is_empty() {
        out += &format!("({} of {} queries failed; the means below are over the rest)\n", failed.len(), failed.len() + figures.len());
    }
    let gm_arrow = geomean(figures.iter().filter_map(|f| f.arrow.map(|a| a.as_secs_f64())));
    let gm_mem = geomean(figures.iter().filter_map(|f| f.memory.map(|m| m.as_secs_f64())));
    let gm_remote = geomean(figures.iter().map(|f| f.remote.as_secs_f64()));
    let arrow = if gm_arrow.is_nan() { String::new() } else { format!("arrow {gm_arrow:.3} s, ") };
    let pre = if gm_mem.is_nan() { String::new() } else { format!("preloaded {gm_mem:.3} s, ") };
    out += &format!("geomean: {arrow}{pre}{ours} {gm_remote:.3} s");
    if !gm_mem.is_nan() {
        out += &format!(", factor {:.2}x", gm_remote / gm_mem);
    }
    let max_rss = figures.iter().map(|f| f.rss_peak).max().unwrap_or(0);
    out += &format!("; highest peak RSS {:.0} MiB", max_rss as f64 / mib);
    if let Some(l) = opts.memory_limit {
        let over: Vec<String> = figures.iter().filter(|f| f.rss_peak > l as u64 + (1 << 30)).map(|f| format!("Q{}", f.query)).collect();
        out += &format!(" ({} above the limit + 1 GiB{})", over.len(), if over.is_empty() { String::new() } else { format!(": {}", over.join(", ")) });
    }
    if !local {
        let total_gets: u64 = figures.iter().map(|f| f.gets).sum();
        out += &format!("; {total_gets} GETs = {:.4} ¢\n", total_gets as f64 * S3_GET_CENTS);
        let sum = |get: &dyn Fn(&QueryFigures) -> f64| figures.iter().map(get).sum::<f64>();
        let (remote_s, cpu_remote, cpu_servers) = (sum(&|f| f.remote.as_secs_f64()), sum(&|f| f.cpu_remote), sum(&|f| f.cpu_servers));
        let gm_floor = geomean(figures.iter().map(|f| f.remote.as_secs_f64() / f.cpu_floor(cores).max(1e-9)));
        out += &format!(
            "CPU over the remote runs: blobhouse {cpu_remote:.1} s, testbed servers {cpu_servers:.1} s, in {remote_s:.1} s on {cores} cores ({:.0}% of the machine busy, {:.0}% of it the servers); remote time / CPU floor: geomean {gm_floor:.2}\n",
            100.0 * (cpu_remote + cpu_servers) / (remote_s * cores).max(1e-9),
            100.0 * cpu_servers / (remote_s * cores).max(1e-9)
        );
    } else {
        out += "\n";
    }
    for p in &peers {
        // Over the queries both finished, so a failure does not flatter anyone.
        let both: Vec<(f64, f64)> = figures.iter().filter_map(|f| f.peers.get(p)?.as_ref().ok().map(|d| (d.as_secs_f64(), f.remote.as_secs_f64()))).collect();
        let failed = figures.len() - both.len();
        let gm_peer = geomean(both.iter().map(|b| b.0));
        let gm_ours = geomean(both.iter().map(|b| b.1));
        let worst = figures
            .iter()
            .filter_map(|f| Some((f.query, f.remote.as_secs_f64() / f.peers.get(p)?.as_ref().ok()?.as_secs_f64().max(1e-9))))
            .max_by(|a, b| a.1.total_cmp(&b.1));
        out += &format!(
            "geomean vs {p}: {p} {gm_peer:.3} s, blobhouse {gm_ours:.3} s over {} queries → blobhouse {:.2}x faster ({:.2}x the time){}{}\n",
            both.len(),
            gm_peer / gm_ours,
            gm_ours / gm_peer,
            worst.map_or(String::new(), |(q, r)| format!("; slowest relative to {p}: Q{q} at {r:.2}x its time")),
            if failed > 0 { format!(" ({failed} failed in {p})") } else { String::new() }
        );
    }
    out
}

fn write_outputs(opts: &TpchBenchOptions, figures: &[QueryFigures]) -> Result<(), String> {
    let mut csv = String::from("query,arrow_s,preloaded_s,remote_s,factor,bytes,retrieval_mib_s,gets,cost_cents,query_wait_s,cpu_preloaded_s,cpu_remote_s,cpu_servers_s,pool_peak_bytes,rss_peak_bytes,spilled_bytes,peer,peer_s,peer_rss_peak_bytes\n");
    for f in figures {
        let base = format!(
            "{},{},{},{:.6},{:.4},{},{:.1},{},{:.6},{:.4},{:.2},{:.2},{:.2},{},{},{}",
            f.query,
            f.arrow.map_or(String::new(), |a| format!("{:.6}", a.as_secs_f64())),
            f.memory.map_or(String::new(), |m| format!("{:.6}", m.as_secs_f64())),
            f.remote.as_secs_f64(),
            f.factor(),
            f.bytes,
            f.retrieval() / (1u64 << 20) as f64,
            f.gets,
            f.gets as f64 * S3_GET_CENTS,
            f.query_wait.as_secs_f64(),
            f.cpu_preloaded,
            f.cpu_remote,
            f.cpu_servers,
            f.pool_peak,
            f.rss_peak,
            f.spilled
        );
        if f.peers.is_empty() {
            csv += &format!("{base},,,\n");
        }
        for (p, t) in &f.peers {
            let rss = f.peer_rss.get(p).copied().unwrap_or(0);
            csv += &format!("{base},{p},{},{rss}\n", t.as_ref().map_or(String::new(), |d| format!("{:.6}", d.as_secs_f64())));
        }
    }
    std::fs::write(opts.out.join("tpch.csv"), csv).map_err(|e| e.to_string())?;
    let points = |get: &dyn Fn(&QueryFigures) -> Option<f64>| figures.iter().filter_map(|f| Some((f.query as f64, get(f)?))).collect::<Vec<_>>();
    let mut series = vec![
        Series { label: "arrow (decoded, DataFusion MemTables)".into(), points: points(&|f| f.arrow.map(|a| a.as_secs_f64())), markers: true },
        Series { label: "preloaded (objects in memory, same scan)".into(), points: points(&|f| f.memory.map(|m| m.as_secs_f64())), markers: true },
        Series { label: "remote-only (blobhouse)".into(), points: points(&|f| Some(f.remote.as_secs_f64())), markers: true },
    ];
    let peers: std::collections::BTreeSet<String> = figures.iter().flat_map(|f| f.peers.keys().cloned()).collect();
    for p in &peers {
        series.push(Series { label: format!("same objects ({p})"), points: points(&|f| f.peers.get(p)?.as_ref().ok().map(Duration::as_secs_f64)), markers: true });
    }
    let axes = Axes { title: format!("TPC-H SF {}: time per query", opts.sf), x_label: "query".into(), y_label: "seconds".into(), log_x: false, legend_lower_right: false };
    series.retain(|s| !s.points.is_empty());
    plot::line_chart(&opts.out.join("tpch.png"), &axes, &series)?;
    // The scheduler over time in the largest scan of each of a few queries.
    let mut timeline = Vec::new();
    for f in figures.iter().filter(|f| [1, 6, 9, 18, 19].contains(&f.query) && !f.timeline.is_empty()) {
        timeline.push(Series {
            label: format!("Q{} bytes in flight allowed (MiB)", f.query),
            points: f.timeline.iter().map(|d| (d.at.as_secs_f64(), d.target_bytes as f64 / (1u64 << 20) as f64)).collect(),
            markers: false,
        });
    }
    if !timeline.is_empty() {
        let axes = Axes { title: "Object scheduler: bytes in flight over a scan".into(), x_label: "seconds since the scan started".into(), y_label: "MiB".into(), log_x: false, legend_lower_right: false };
        plot::line_chart(&opts.out.join("scheduler.png"), &axes, &timeline)?;
    }
    // Peak resident set per query, blobhouse against the peers.
    let gib = (1u64 << 30) as f64;
    let mut rss = vec![Series { label: "blobhouse peak RSS".into(), points: points(&|f| (f.rss_peak > 0).then(|| f.rss_peak as f64 / gib)), markers: true }];
    for p in &peers {
        rss.push(Series { label: format!("{p} peak RSS"), points: points(&|f| f.peer_rss.get(p).filter(|r| **r > 0).map(|r| *r as f64 / gib)), markers: true });
    }
    if let Some(l) = opts.memory_limit {
        rss.push(Series { label: "memory limit".into(), points: figures.iter().map(|f| (f.query as f64, l as f64 / gib)).collect(), markers: false });
    }
    rss.retain(|s| !s.points.is_empty());
    if !rss.is_empty() {
        let axes = Axes { title: format!("TPC-H SF {}: peak resident memory per query", opts.sf), x_label: "query".into(), y_label: "GiB".into(), log_x: false, legend_lower_right: false };
        plot::line_chart(&opts.out.join("memory.png"), &axes, &rss)?;
    }
    Ok(())
}
