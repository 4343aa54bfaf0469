//! `blobhouse bench …`: benchmarks that print tables and write plots.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Subcommand;

use blobhouse_bench::calibrate::{CalibrateOptions, calibrate};
use blobhouse_bench::io_bench::{self, IoBenchOptions};
use blobhouse_bench::tpch_bench::{self, BenchStore, TpchBenchOptions};
use blobhouse_testbed::{Lifetime, Profile, Testbed, default_dir};

#[derive(Subcommand)]
pub enum BenchCommand {
    /// Measure a testbed profile: latency per request size, throughput against requests in flight, fitted model.
    #[command(after_help = "Writes report.txt, latency.csv, throughput.csv, latency.png and throughput.png to --out.\nUses the running testbed (re-shaped to the profile) or starts one for the run.\n\nExamples:\n  blobhouse bench calibrate --profile s3\n  blobhouse bench calibrate --profile s3-scaled --window-secs 10\n  blobhouse bench calibrate --profile lan --samples 100 --concurrency 1,4,16,64")]
    Calibrate {
        /// Testbed profile: lan, s3, s3-scaled, throttled.
        #[arg(long, default_value = "s3")]
        profile: String,
        /// Sequential samples per request size (1 KiB, 1 MiB, 4 MiB, 16 MiB).
        #[arg(long, default_value_t = 40)]
        samples: usize,
        /// Requests in flight for the throughput sweep.
        #[arg(long, value_delimiter = ',', default_value = "1,2,4,8,16,32,64,128,256,512")]
        concurrency: Vec<usize>,
        /// Seconds measured per concurrency level (after 2 s of warm-up).
        #[arg(long, default_value_t = 4.0)]
        window_secs: f64,
        /// Output directory (default bench-results/calibrate-<profile>).
        #[arg(long)]
        out: Option<PathBuf>,
        /// Testbed state directory.
        #[arg(long)]
        dir: Option<PathBuf>,
    },
    /// Download with blobhouse's io_uring download manager and with object_store, same requests, same run.
    #[command(after_help = "Fetches ranges of the testbed's 16 MiB objects from nginx, one client thread each,\nand reports throughput and client CPU-seconds per GiB (process user+sys time).\nWrites report.txt, io.csv and cpu-throughput.png to --out.\n\nExamples:\n  blobhouse bench io --profile lan\n  blobhouse bench io --profile lan --requests 400 --sizes-kib 1024,16384 --in-flight 8,32")]
    Io {
        /// Testbed profile: lan, s3, s3-scaled, throttled.
        #[arg(long, default_value = "lan")]
        profile: String,
        /// Requests per run.
        #[arg(long, default_value_t = 200)]
        requests: usize,
        /// Request sizes in KiB (at most 16384).
        #[arg(long, value_delimiter = ',', default_value = "1024,16384")]
        sizes_kib: Vec<usize>,
        /// Requests in flight.
        #[arg(long, value_delimiter = ',', default_value = "8,32")]
        in_flight: Vec<usize>,
        /// Runs per point; medians are reported.
        #[arg(long, default_value_t = 3)]
        repeats: usize,
        /// Clients: dm (download manager, fixed in-flight), dm-model (in-flight from the latency model), object-store.
        #[arg(long, value_delimiter = ',', default_value = "dm,object-store")]
        clients: Vec<String>,
        /// Memory budget of dm-model, GiB.
        #[arg(long, default_value_t = 4.0)]
        model_memory_gib: f64,
        /// Link bandwidth dm-model aims for, Gbit/s.
        #[arg(long, default_value_t = 10.0)]
        model_link_gbps: f64,
        /// The download manager's kernel interface: auto, io-uring or epoll.
        #[arg(long, default_value = "auto")]
        backend: String,
        /// Pace both clients' request starts to this rate (MiB/s), to compare CPU at equal throughput.
        #[arg(long)]
        rate_mib_s: Option<f64>,
        /// The testbed's calibrated aggregate throughput, MiB/s (default: the peak of docs/testbed/<profile>/throughput.csv if present).
        #[arg(long)]
        calibrated_mib_s: Option<f64>,
        /// Output directory (default bench-results/io-<profile>).
        #[arg(long)]
        out: Option<PathBuf>,
        /// Testbed state directory.
        #[arg(long)]
        dir: Option<PathBuf>,
    },
    /// TPC-H at every thread count of a sweep (1, 2, 4, 8, 16) on a local directory: time, speedup and peak memory per query, optionally beside DuckDB.
    #[command(after_help = "Each thread count gets a runtime of that many workers and an engine with as many partitions,
in one process. By default every run opens a fresh engine with the default options, as
`blobhouse sql --threads N -f q.sql` does; --warm keeps one engine per thread count, caches off.
On a 2-core machine the columns above 2 threads measure oversubscription only: run it where
the cores are. Writes report.txt, scaling.csv and scaling.png to --out.

Examples:
  blobhouse bench scaling --sf 10 --threads 1,2,4,8,16 --repeats 2
  blobhouse bench scaling --sf 10 --chunk-kib 1024 --peers duckdb
  blobhouse bench scaling --sf 1 --threads 1,2 --queries 1,6")]
    Scaling {
        /// Scale factor.
        #[arg(long, default_value_t = 10.0)]
        sf: f64,
        /// Thread counts to run.
        #[arg(long, value_delimiter = ',', default_value = "1,2,4,8,16")]
        threads: Vec<usize>,
        /// Queries to run.
        #[arg(long, value_delimiter = ',', default_value = "1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22")]
        queries: Vec<usize>,
        /// Runs per query and thread count; the fastest counts.
        #[arg(long, default_value_t = 2)]
        repeats: usize,
        /// Target compressed size of a column chunk in the loaded data, KiB (default: the writer's 12 MiB).
        #[arg(long)]
        chunk_kib: Option<u64>,
        /// The engine's memory limit (e.g. 8G), also the peers' (default: half the machine's memory).
        #[arg(long, value_name = "SIZE")]
        memory_limit: Option<String>,
        /// One engine per thread count with the caches off, instead of a fresh engine per run.
        #[arg(long)]
        warm: bool,
        /// Peers to run at every thread count on the same files: duckdb, datafusion (scripts/install-bench-peers.sh).
        #[arg(long, value_delimiter = ',')]
        peers: Vec<String>,
        /// The directory that holds the databases (one per scale factor and layout).
        #[arg(long, default_value = "bench-results/tpch-data")]
        data_dir: PathBuf,
        /// Output directory (default bench-results/scaling-sf<sf>).
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// TPC-H on one engine alone and on 1, 2, 3 … local worker processes, each pinned to its own CPUs: time, GETs and answers, cold and warm.
    #[command(after_help = "Loads TPC-H at --sf into a local directory with small column chunks (many row groups for the
workers to share; kept for later runs). Each query, on each configuration, runs on a fresh start:
cold (caches empty), then warm (the faster of two more runs on the same processes, each row group
sent to the worker that cached it; the first turns cached chunks into decoded arrays). Worker counts above the CPUs this process may use are skipped: each worker gets CPUs
of its own. The coordinator is this process. Answers are compared with the engine alone's (and
the reference answers where there are some); the command fails if one differs.
Writes report.txt, cluster.csv and cluster.png to --out.

Examples:
  blobhouse bench cluster --sf 1
  blobhouse bench cluster --sf 10 --workers 1,4,16 --chunk-kib 1024   (a 16-core machine)
  blobhouse bench cluster --sf 1 --workers 2 --queries 1,6")]
    Cluster {
        /// Scale factor.
        #[arg(long, default_value_t = 1.0)]
        sf: f64,
        /// Worker counts to run, each against the engine alone.
        #[arg(long, value_delimiter = ',', default_value = "1,2,3")]
        workers: Vec<usize>,
        /// Queries to run.
        #[arg(long, value_delimiter = ',', default_value = "1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22")]
        queries: Vec<usize>,
        /// Target compressed size of a column chunk in the loaded data, KiB (128: lineitem at SF 1 in more than 50 row groups).
        #[arg(long, default_value_t = 128)]
        chunk_kib: u64,
        /// Each worker's memory limit, e.g. 4G (default: half its share of the machine's memory).
        #[arg(long, value_name = "SIZE")]
        worker_memory_limit: Option<String>,
        /// How the workers' memory is bound to their NUMA nodes: strict or preferred.
        #[arg(long, default_value = "preferred")]
        membind: String,
        /// The directory that holds the databases (one per scale factor and layout).
        #[arg(long, default_value = "bench-results/tpch-data")]
        data_dir: PathBuf,
        /// Output directory (default bench-results/cluster-sf<sf>).
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// TPC-H from memory vs remote-only (no cache), per query, optionally against DuckDB and DataFusion-Python.
    #[command(after_help = "Loads TPC-H at --sf into the testbed's MinIO once (kept for later runs), reads every table\ninto memory for the baseline, then runs each query from memory and remote-only through the\nprofile's shaped link; with --peers also DuckDB (httpfs) and DataFusion-Python on copies of\nthe same Parquet objects through the same endpoint, interleaved query by query.\nWrites report.txt, tpch.csv, tpch.png and scheduler.png to --out.\n\nExamples:\n  blobhouse bench tpch --sf 1 --profile s3-scaled\n  blobhouse bench tpch --sf 1 --profile s3-scaled --peers   (after scripts/install-bench-peers.sh)\n  blobhouse bench tpch --sf 1 --queries 1,6,9,18,19 --repeats 3")]
    Tpch {
        /// Scale factor.
        #[arg(long, default_value_t = 1.0)]
        sf: f64,
        /// Testbed profile: lan, s3, s3-scaled, throttled; or local (a local directory, no testbed).
        #[arg(long, default_value = "s3-scaled")]
        profile: String,
        /// Queries to run.
        #[arg(long, value_delimiter = ',', default_value = "1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22")]
        queries: Vec<usize>,
        /// Runs per query and system; the fastest counts.
        #[arg(long, default_value_t = 1)]
        repeats: usize,
        /// Also run DuckDB (httpfs) and DataFusion-Python on the same objects (scripts/install-bench-peers.sh installs them).
        #[arg(long)]
        peers: bool,
        /// Use the fixed one-row-group-ahead policy instead of the object scheduler.
        #[arg(long)]
        fixed: bool,
        /// Largest range request, KiB (the smallest is half). Default 16384; on s3-scaled 1024, because that
        /// profile divides per-request bandwidth by ~23 (55 -> 2.4 MiB/s) and the request size scales with it,
        /// so a request takes as long as a 16 MiB one on S3.
        #[arg(long)]
        request_kib: Option<u64>,
        /// Target compressed size of a column chunk in the loaded data, KiB (sets the row-group size).
        /// Default: three quarters of --request-kib (12 MiB for 16 MiB requests, the writer's default), so a
        /// row group takes as many requests on s3-scaled as on S3. Each layout is loaded once, under its own prefix.
        #[arg(long)]
        chunk_kib: Option<u64>,
        /// Decode every table into DataFusion MemTables for the arrow reference column. Default: on up to
        /// SF 5 (SF 10 decoded needs more memory than this machine's 24 GiB leaves beside the testbed).
        #[arg(long, conflicts_with = "no_arrow")]
        arrow: bool,
        /// Skip the arrow reference column.
        #[arg(long)]
        no_arrow: bool,
        /// Also write each query's EXPLAIN ANALYZE (remote) to <out>/explain/qNN.txt.
        #[arg(long)]
        explain: bool,
        /// The engine's memory limit in the measured runs (e.g. 4G), also DuckDB's memory_limit and
        /// DataFusion-Python's. Implies --no-preloaded and --no-arrow: their copies of the database
        /// would sit in this process's resident set, which the RSS columns measure.
        #[arg(long, value_name = "SIZE")]
        memory_limit: Option<String>,
        /// Skip the preloaded (objects in memory) runs.
        #[arg(long)]
        no_preloaded: bool,
        /// Peers to run with --peers (each in its own process): duckdb, datafusion.
        #[arg(long, value_delimiter = ',', default_value = "duckdb,datafusion")]
        peer_engines: Vec<String>,
        /// With --profile local: the directory that holds the databases (one per scale factor and layout).
        #[arg(long, default_value = "bench-results/tpch-data")]
        data_dir: PathBuf,
        /// The link's throughput, MiB/s (default: the peak of docs/testbed/<profile>/throughput.csv if present).
        #[arg(long)]
        link_mib_s: Option<f64>,
        /// Output directory (default bench-results/tpch-<profile>-sf<sf>).
        #[arg(long)]
        out: Option<PathBuf>,
        /// Testbed state directory.
        #[arg(long)]
        dir: Option<PathBuf>,
    },
    /// Many psycopg and ADBC clients on one server against the same TPC-H queries one at a time: throughput, p50/p99, peak RSS.
    #[command(after_help = "Loads TPC-H at --sf into the testbed's MinIO once (kept for later runs) and serves it from this\nprocess (PostgreSQL wire and Flight SQL on 127.0.0.1, caches off, reads through the profile's\nshaped link). Serial: each query once through psycopg, then once through ADBC. Concurrent:\n--clients clients (psycopg and ADBC alternately) loop over the queries for --duration seconds.\nEvery statement's row count is checked against the serial run. Needs python3 with psycopg and\nadbc-driver-flightsql (scripts/install-test-deps.sh). Build with --profile optimised for figures\nworth comparing. Writes report.txt, serve.csv and serve.png to --out.\n\nExamples:\n  blobhouse bench serve --sf 1 --profile s3 --clients 32 --duration 120\n  blobhouse bench serve --sf 0.1 --profile local --clients 8 --duration 20 --queries 1,3,6")]
    Serve {
        /// Scale factor.
        #[arg(long, default_value_t = 1.0)]
        sf: f64,
        /// Testbed profile: lan, s3, s3-scaled, throttled; or local (a local directory, no testbed).
        #[arg(long, default_value = "s3")]
        profile: String,
        /// Concurrent clients, alternately psycopg and ADBC.
        #[arg(long, default_value_t = 32)]
        clients: usize,
        /// Seconds the concurrent clients start statements.
        #[arg(long, default_value_t = 120)]
        duration: u64,
        /// Queries to run.
        #[arg(long, value_delimiter = ',', default_value = "1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22")]
        queries: Vec<usize>,
        /// The server's limit on statements running at once (default: twice the cores, as `serve`).
        #[arg(long, default_value_t = 0, hide_default_value = true)]
        max_queries: usize,
        /// With --profile local: the directory that holds the databases.
        #[arg(long, default_value = "bench-results/tpch-data")]
        data_dir: PathBuf,
        /// Output directory (default bench-results/serve-<profile>-sf<sf>).
        #[arg(long)]
        out: Option<PathBuf>,
        /// Testbed state directory.
        #[arg(long)]
        dir: Option<PathBuf>,
    },
    /// TPC-H through the caching tiers: cache off vs memory vs SSD vs both, at several cache sizes, 3 rounds.
    #[command(after_help = "Loads TPC-H at --sf into the testbed's MinIO once (kept for later runs), then runs the\nqueries in --rounds rounds (each in its own random order, the same for every configuration)\nwith the caches off, then with each of --tiers at each of --sizes (percent of the data's\ncolumn chunks; \"both\" gives each tier that size), each a fresh engine with empty caches.\nThe first cached configuration records its scans' segments; LRU, LFU and Belady are\nreplayed on that trace. With a slow SSD (--slow-ssd, default on) two more configurations\nhold all data on a disk made slow: routed by measured speed, and always from the SSD.\nBuild with --profile optimised for figures worth comparing. Writes report.txt, cache.csv,\ntime.png and gets.png to --out.\n\nExamples:\n  blobhouse bench cache --sf 1\n  blobhouse bench cache --sf 5 --tiers both --sizes 50 --no-slow-ssd\n  blobhouse bench cache --sf 0.1 --profile lan --rounds 2 --queries 1,6,14")]
    Cache {
        /// Scale factor.
        #[arg(long, default_value_t = 1.0)]
        sf: f64,
        /// Testbed profile: lan, s3, s3-scaled, throttled; or local (a local directory, no testbed).
        #[arg(long, default_value = "s3")]
        profile: String,
        /// Queries to run.
        #[arg(long, value_delimiter = ',', default_value = "1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22")]
        queries: Vec<usize>,
        /// Rounds per configuration (round 1 starts with empty caches).
        #[arg(long, default_value_t = 3)]
        rounds: usize,
        /// Seed of the rounds' query orders.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Cached configurations: memory, ssd, both (none: only the baseline and the routing experiment).
        #[arg(long, value_delimiter = ',', default_value = "memory,ssd,both")]
        tiers: Vec<String>,
        /// Cache sizes, percent of the data.
        #[arg(long, value_delimiter = ',', default_value = "10,25,50,100")]
        sizes: Vec<f64>,
        /// The memory tier's policy: lru, lfu or wlfu.
        #[arg(long, default_value = "lfu")]
        policy: String,
        /// The routing experiment's slow disk: milliseconds per read and per MiB read.
        #[arg(long, value_delimiter = ',', default_value = "60,40")]
        slow_ssd: Vec<f64>,
        /// Skip the routing experiment.
        #[arg(long)]
        no_slow_ssd: bool,
        /// Where the SSD tiers' directories go (one per configuration, deleted after): put it on the disk to measure.
        #[arg(long, default_value = "bench-results/cache-ssd")]
        ssd_dir: PathBuf,
        /// With --profile local: the directory that holds the databases.
        #[arg(long, default_value = "bench-results/tpch-data")]
        data_dir: PathBuf,
        /// The engine's memory limit for the queries (the memory tier gets its size on top).
        #[arg(long, value_name = "SIZE")]
        memory_limit: Option<String>,
        /// Output directory (default bench-results/cache-<profile>-sf<sf>).
        #[arg(long)]
        out: Option<PathBuf>,
        /// Testbed state directory.
        #[arg(long)]
        dir: Option<PathBuf>,
    },
    /// SSB with hybrid pushdown and caching: pull-up, caching-only, pushdown-only and hybrid against cache size and skew; the caching policies.
    #[command(after_help = "Derives SSB at --sf from TPC-H into the testbed's MinIO once (kept for later runs), starts\na storage node next to the store (on the store side of the link under the bottleneck\nprofile, capped at --node-cpus cores), then runs fresh engines on the same seeded\nstream of generated queries: the first half warms the caches, the second is measured.\nExperiments: against cache size (--sizes, skew --theta), against skew (--thetas, cache\n--fixed-size), and LRU / LFU / Weighted-LFU / Belady on the mixed-selectivity workload\n(--policy-theta, caches --policy-sizes); --experiments makes only some of them. Traffic is what crossed the link (the kernel's counters). Every answer\nis compared with the first configuration's. Writes report.txt, hybrid.csv, queries.csv (each\nmeasured query), time-vs-cache.png, traffic-vs-cache.png, time-vs-skew.png and policies-vs-cache.png to --out.\n\nExamples:\n  blobhouse testbed up bottleneck && blobhouse bench hybrid\n  blobhouse bench hybrid --sf 0.1 --queries 20 --sizes 25 --thetas 2 --profile local")]
    Hybrid {
        /// Scale factor of the TPC-H data SSB is derived from.
        #[arg(long, default_value_t = 1.0)]
        sf: f64,
        /// Testbed profile (bottleneck is the one the figures are about), or local (a local directory, no testbed).
        #[arg(long, default_value = "bottleneck")]
        profile: String,
        /// The experiments to make, any of size (Figures 6/7 and the crossover), skew (Figure 8) and policy (Figure 11).
        #[arg(long, default_value = "size,skew,policy")]
        experiments: String,
        /// Generated queries per configuration (half warm-up, half measured: the paper's 50 and 50).
        #[arg(long, default_value_t = 100)]
        queries: usize,
        /// Seed of the generated queries.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Cache sizes of the size sweep, percent of the data.
        #[arg(long, value_delimiter = ',', default_value = "2,5,7.5,10,20,40,80")]
        sizes: Vec<f64>,
        /// Zipf skew of the size sweep.
        #[arg(long, default_value_t = 2.0)]
        theta: f64,
        /// Skews of the skew sweep.
        #[arg(long, value_delimiter = ',', default_value = "0,0.5,1,1.5,2,2.5")]
        thetas: Vec<f64>,
        /// Cache size of the skew sweep, percent of the data.
        #[arg(long, default_value_t = 10.0)]
        fixed_size: f64,
        /// Cache sizes of the policy experiment, percent of the data. With decoded chunks in memory the workload's
        /// columns take about 1.7 times the data's compressed size; Weighted-LFU matters where the cache holds
        /// about one kind of its queries' columns (docs/pushdown.md).
        #[arg(long, value_delimiter = ',', default_value = "20,40,60,80,100")]
        policy_sizes: Vec<f64>,
        /// Skew of the policy experiment.
        #[arg(long, default_value_t = 0.3)]
        policy_theta: f64,
        /// The memory cache holds numbers and dates decoded, and strings when their arrays take at most RATIO times their compressed bytes (0: every chunk compressed).
        #[arg(long, value_name = "RATIO", default_value_t = blobhouse_engine::DECODED_MAX_RATIO)]
        cache_decoded_ratio: f64,
        /// CPU cores the storage node may use (bottleneck profile).
        #[arg(long, default_value_t = 1.0)]
        node_cpus: f64,
        /// Target compressed size of a column chunk when loading, KiB.
        #[arg(long, default_value_t = 1024)]
        chunk_kib: usize,
        /// With --profile local: the directory that holds the databases.
        #[arg(long, default_value = "bench-results/tpch-data")]
        data_dir: PathBuf,
        /// The engine's memory limit for the queries (the cache gets its size on top).
        #[arg(long, value_name = "SIZE")]
        memory_limit: Option<String>,
        /// Output directory (default bench-results/hybrid-<profile>-sf<sf>).
        #[arg(long)]
        out: Option<PathBuf>,
        /// Testbed state directory.
        #[arg(long)]
        dir: Option<PathBuf>,
    },
    /// Transactions under concurrency: writer processes move money between accounts while readers check the total.
    #[command(after_help = "Each transfer is one transaction: two UPDATEs and an INSERT into the transfer log.\nReaders check that the balances always sum to the initial total and each account\nappears once; at the end every committed transfer must be in the log exactly once\nand every balance must match the log. Serialization failures are counted.\nWithout --db, the run uses a fresh database on the testbed's MinIO (profile lan).\n\nExamples:\n  blobhouse bench bank\n  blobhouse bench bank --writers 8 --transfers 500 --accounts 64\n  blobhouse bench bank --db /tmp/bank-db")]
    Bank {
        /// Database URL (must not exist yet); default: the testbed's MinIO.
        #[arg(long)]
        db: Option<String>,
        #[arg(long, default_value_t = 4)]
        writers: u32,
        #[arg(long, default_value_t = 2)]
        readers: u32,
        /// Transfers each writer attempts.
        #[arg(long, default_value_t = 200)]
        transfers: u32,
        #[arg(long, default_value_t = 16)]
        accounts: u32,
        /// Where report.txt goes (default bench-results/bank).
        #[arg(long)]
        out: Option<PathBuf>,
        /// Testbed state directory.
        #[arg(long)]
        dir: Option<PathBuf>,
    },
    /// What encryption at rest costs: TPC-H loaded plaintext and encrypted in the same run; load time and CPU, CPU-s per GiB fetched per query.
    #[command(after_help = "Examples:\n  blobhouse bench encryption --profile s3 --sf 1\n  blobhouse bench encryption --profile local --sf 0.1 --queries 1,6")]
    Encryption {
        /// Scale factor.
        #[arg(long, default_value_t = 1.0)]
        sf: f64,
        /// Testbed profile: lan, s3, s3-scaled, throttled; or local (a local directory, no testbed).
        #[arg(long, default_value = "s3")]
        profile: String,
        /// TPC-H queries run after the full lineitem scan.
        #[arg(long, value_delimiter = ',', default_value = "1,6,12,14,19")]
        queries: Vec<usize>,
        /// Runs per query and database; the fastest counts.
        #[arg(long, default_value_t = 3)]
        repeats: usize,
        /// Where local databases go (--profile local).
        #[arg(long, default_value = "bench-results/data")]
        data_dir: PathBuf,
        /// Output directory (default bench-results/encryption-<profile>-sf<sf>).
        #[arg(long)]
        out: Option<PathBuf>,
        /// Testbed directory.
        #[arg(long)]
        dir: Option<PathBuf>,
    },
    /// DELETE with deletion vectors against copy-on-write, on TPC-H lineitem in a local database.
    #[command(after_help = "Loads lineitem into a fresh local database, then runs DELETEs of 1 row, ~0.1 % and\n~1 % of the rows both ways and reports bytes written, time, and a full scan afterwards.\nBuild with --profile optimised for figures worth comparing.\n\nExamples:\n  blobhouse bench dml\n  blobhouse bench dml --sf 0.1 --out /tmp/dml")]
    Dml {
        /// TPC-H scale factor of lineitem.
        #[arg(long, default_value_t = 1.0)]
        sf: f64,
        /// Where the temporary database goes.
        #[arg(long, default_value = "bench-results")]
        dir: PathBuf,
        /// Where report.txt goes (default bench-results/dml).
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Crash safety: random operations, each in a writer process that a fail point or kill -9 stops, checked against an oracle.
    #[command(after_help = "Each trial runs one INSERT, COPY, DELETE, UPDATE, OPTIMIZE, VACUUM, CREATE SNAPSHOT or\nRESTORE in a new process and crashes it at a named fail point, fails a step, kills it with\nSIGKILL at a random moment, or lets it finish. The harness then checks the table against\nits oracle, and every --check-every trials runs a recovery VACUUM and checks that the store\nholds exactly what the catalog references.\n\nExamples:\n  blobhouse bench crash --trials 1000\n  blobhouse bench crash --trials 200 --db s3://bucket/crash --endpoint http://127.0.0.1:9000")]
    Crash {
        #[arg(long, default_value_t = 1000)]
        trials: usize,
        #[arg(long, default_value_t = 1)]
        seed: u64,
        #[arg(long, default_value_t = 25)]
        check_every: usize,
        /// Database URL (must not exist yet); default: a fresh local directory under bench-results.
        #[arg(long)]
        db: Option<String>,
        #[command(flatten)]
        store: crate::StoreArgs,
        /// Where report.txt goes (default bench-results/crash).
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// What one VACUUM costs on many objects with a little garbage, beside listing them all.
    #[command(after_help = "Writes --objects one-row data objects into --tables tables of a fresh local database,\ndrops one table (its objects are the garbage) and runs VACUUM RETAIN '0 seconds' GRACE '0 seconds'.\n\nExamples:\n  blobhouse bench vacuum\n  blobhouse bench vacuum --objects 10000 --tables 10")]
    Vacuum {
        #[arg(long, default_value_t = 100_000)]
        objects: u64,
        #[arg(long, default_value_t = 100)]
        tables: u64,
        /// Where the temporary database goes.
        #[arg(long, default_value = "bench-results")]
        dir: PathBuf,
        /// Where report.txt goes (default bench-results/vacuum).
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// A worker process of `bench crash` (started by it).
    #[command(hide = true)]
    CrashWorker,
    /// A worker process of `bench bank` (started by it).
    #[command(hide = true)]
    BankWorker,
    /// Request latency with and without hedging through the download manager.
    #[command(after_help = "Runs the same requests twice through the io_uring event loop, without and with the\ndefault hedging policy, and prints latency percentiles and the share of extra requests.\n\nExamples:\n  blobhouse bench hedge --profile s3\n  blobhouse bench hedge --profile s3 --requests 2000 --size-kib 16384 --in-flight 32")]
    Hedge {
        /// Testbed profile (s3 has the stalls and lost requests hedging is for).
        #[arg(long, default_value = "s3")]
        profile: String,
        /// Requests per run.
        #[arg(long, default_value_t = 1000)]
        requests: usize,
        /// Request size in KiB (at most 16384).
        #[arg(long, default_value_t = 4096)]
        size_kib: usize,
        /// Requests in flight (keep their sum of bandwidth below the testbed's aggregate cap).
        #[arg(long, default_value_t = 8)]
        in_flight: usize,
        /// Where report.txt goes (default bench-results/hedge-<profile>).
        #[arg(long)]
        out: Option<PathBuf>,
        /// Testbed state directory.
        #[arg(long)]
        dir: Option<PathBuf>,
    },
}

/// The testbed a benchmark runs on: a running one is reused (re-shaped to the
/// profile, and left running); otherwise one is started for this run only.
/// Where a TPC-H benchmark runs and how its data is laid out: the testbed
/// (none for `--profile local`), the output directory, the profile's
/// calibrated link, and request and column-chunk sizes for the profile.
struct TpchSetup {
    bench: Option<BenchTestbed>,
    profile_name: &'static str,
    out: PathBuf,
    link: Option<f64>,
    request_kib: u64,
    chunk_kib: u64,
}

impl TpchSetup {
    fn new(bench_name: &str, profile: &str, sf: f64, out: Option<PathBuf>, dir: Option<PathBuf>) -> Result<TpchSetup> {
        let local = profile == "local";
        let bench = if local { None } else { Some(BenchTestbed::up(profile, dir)?) };
        let profile_name = bench.as_ref().map_or("local", |b| b.profile.name());
        let out = out.unwrap_or_else(|| PathBuf::from(format!("bench-results/{bench_name}-{profile_name}-sf{sf}")));
        let link = if local { None } else { calibrated_peak(&PathBuf::from(format!("docs/testbed/{profile_name}/throughput.csv"))).map(|m| m * (1u64 << 20) as f64) };
        let request_kib: u64 = if profile_name == "s3-scaled" { 1024 } else { 16384 };
        let chunk_kib = if local { (blobhouse_storage::WriteOptions::default().target_chunk_bytes >> 10) as u64 } else { request_kib * 3 / 4 };
        Ok(TpchSetup { bench, profile_name, out, link, request_kib, chunk_kib })
    }
}

struct BenchTestbed {
    tb: Testbed,
    profile: Profile,
    owned: bool,
}

impl BenchTestbed {
    fn up(profile: &str, dir: Option<PathBuf>) -> Result<BenchTestbed> {
        let profile = Profile::parse(profile)?;
        let dir = dir.unwrap_or_else(default_dir);
        let owned = Testbed::status(&dir)?.is_none();
        let lifetime = if owned { Lifetime::TiedToThisProcess } else { Lifetime::Detached };
        let tb = Testbed::up(&dir, profile, lifetime).with_context(|| format!("testbed up in {}", dir.display()))?;
        Ok(BenchTestbed { tb, profile, owned })
    }

    fn down(self) -> Result<()> {
        if self.owned {
            Testbed::down(self.tb.dir())?;
        }
        Ok(())
    }
}

/// Writes a benchmark's report to `<out>/report.txt`, prints it, and says
/// which files (comma-separated names in `out`) the run wrote.
fn publish(out: &std::path::Path, text: &str, files: &str) -> Result<()> {
    let path = out.join("report.txt");
    std::fs::write(&path, text).with_context(|| format!("cannot write {}", path.display()))?;
    println!("{text}");
    if files.contains(',') {
        println!("wrote {}/{{{files}}}", out.display());
    } else {
        println!("wrote {}/{files}", out.display());
    }
    Ok(())
}

/// `--memory-limit SIZE` of the TPC-H benchmarks.
fn parse_memory_limit(text: Option<&str>) -> Result<Option<usize>> {
    text.map(|m| blobhouse_engine::memory::parse_size(m).map(|b| b as usize).map_err(|e| anyhow::anyhow!("--memory-limit: {e}"))).transpose()
}

/// Where a TPC-H benchmark's data is: the testbed when one runs, else
/// `data_dir` (profile local).
fn store_of(bench: &Option<BenchTestbed>, data_dir: PathBuf) -> BenchStore<'_> {
    match bench {
        Some(b) => BenchStore::Testbed(&b.tb),
        None => BenchStore::Local(data_dir),
    }
}

pub async fn run(cmd: BenchCommand) -> Result<()> {
    match cmd {
        BenchCommand::Calibrate { profile, samples, concurrency, window_secs, out, dir } => {
            anyhow::ensure!(samples > 0, "--samples must be at least 1");
            anyhow::ensure!(concurrency.iter().all(|&c| c > 0), "--concurrency levels must be at least 1");
            anyhow::ensure!(window_secs > 0.0, "--window-secs must be positive");
            let bench = BenchTestbed::up(&profile, dir)?;
            let out = out.unwrap_or_else(|| PathBuf::from(format!("bench-results/calibrate-{}", bench.profile.name())));
            let opts = CalibrateOptions { samples, concurrency, window: Duration::from_secs_f64(window_secs), out: out.clone() };
            let result = calibrate(&bench.tb, &opts, &|step| eprintln!("calibrate: {step}")).await;
            bench.down()?;
            let cal = result.map_err(anyhow::Error::msg)?;
            println!("{}", cal.report());
            println!("wrote {}/{{report.txt,latency.csv,throughput.csv,latency.png,throughput.png}}", out.display());
        }
        BenchCommand::Io { profile, requests, sizes_kib, in_flight, repeats, clients, model_memory_gib, model_link_gbps, backend, rate_mib_s, calibrated_mib_s, out, dir } => {
            anyhow::ensure!(requests > 0, "--requests must be at least 1");
            anyhow::ensure!(in_flight.iter().all(|&c| c > 0), "--in-flight levels must be at least 1");
            let clients = clients.iter().map(|c| io_bench::Client::parse(c)).collect::<Result<Vec<_>, _>>().map_err(anyhow::Error::msg)?;
            let bench = BenchTestbed::up(&profile, dir)?;
            let out = out.unwrap_or_else(|| PathBuf::from(format!("bench-results/io-{}", bench.profile.name())));
            let calibrated_mib_s = calibrated_mib_s.or_else(|| calibrated_peak(&PathBuf::from(format!("docs/testbed/{}/throughput.csv", bench.profile.name()))));
            let opts = IoBenchOptions {
                requests,
                sizes: sizes_kib.iter().map(|k| k << 10).collect(),
                in_flight,
                repeats,
                clients,
                model_memory: (model_memory_gib * (1u64 << 30) as f64) as u64,
                model_target: model_link_gbps * 1e9 / 8.0,
                backend: match backend.as_str() {
                    "auto" => blobhouse_bench::io_bench::Backend::Auto,
                    "io-uring" => blobhouse_bench::io_bench::Backend::IoUring,
                    "epoll" => blobhouse_bench::io_bench::Backend::Epoll,
                    other => anyhow::bail!("unknown --backend '{other}': use auto, io-uring or epoll"),
                },
                rate: rate_mib_s.map(|r| r * (1u64 << 20) as f64),
                calibrated_mib_s,
                out: out.clone(),
            };
            // The benchmark drives its own event loop and runtime on a plain
            // thread of its own, outside this command's tokio runtime.
            let result = std::thread::scope(|s| s.spawn(|| io_bench::run(&bench.tb, &opts, &|step| eprintln!("bench io: {step}"))).join())
                .map_err(|_| anyhow::anyhow!("the I/O benchmark thread panicked"))?;
            let profile = bench.profile;
            bench.down()?;
            let runs = result.map_err(anyhow::Error::msg)?;
            println!("{}", io_bench::report(profile.name(), &opts, &runs));
            println!("wrote {}/{{report.txt,io.csv,cpu-throughput.png,throughput-concurrency.png}}", out.display());
        }
        BenchCommand::Tpch {
            sf,
            profile,
            queries,
            repeats,
            peers,
            fixed,
            request_kib,
            chunk_kib,
            arrow,
            no_arrow,
            explain,
            memory_limit,
            no_preloaded,
            peer_engines,
            data_dir,
            link_mib_s,
            out,
            dir,
        } => {
            anyhow::ensure!(sf > 0.0 && sf.is_finite(), "--sf must be a positive number");
            anyhow::ensure!(queries.iter().all(|q| (1..=22).contains(q)), "--queries are TPC-H query numbers, 1 to 22");
            if let Some(p) = peer_engines.iter().find(|p| !["duckdb", "datafusion"].contains(&p.as_str())) {
                anyhow::bail!("--peer-engines: unknown peer '{p}' (duckdb, datafusion)");
            }
            let memory_limit = parse_memory_limit(memory_limit.as_deref())?;
            let local = profile == "local";
            let bench = if local { None } else { Some(BenchTestbed::up(&profile, dir)?) };
            let profile_name = bench.as_ref().map_or("local", |b| b.profile.name());
            let out = out.unwrap_or_else(|| PathBuf::from(format!("bench-results/tpch-{profile_name}-sf{sf}")));
            let link = if local { None } else { link_mib_s.or_else(|| calibrated_peak(&PathBuf::from(format!("docs/testbed/{profile_name}/throughput.csv")))).map(|m| m * (1u64 << 20) as f64) };
            let request_kib = request_kib.unwrap_or(if profile_name == "s3-scaled" { 1024 } else { 16384 });
            anyhow::ensure!(request_kib >= 64, "--request-kib must be at least 64");
            // Local data is laid out as the demo's (the writer's default chunks) unless asked otherwise.
            let chunk_kib = chunk_kib.unwrap_or(if local { (blobhouse_storage::WriteOptions::default().target_chunk_bytes >> 10) as u64 } else { request_kib * 3 / 4 });
            anyhow::ensure!((64..=1 << 20).contains(&chunk_kib), "--chunk-kib must be between 64 and 1048576");
            if memory_limit.is_some() && (arrow || (!no_preloaded && !no_arrow)) {
                eprintln!("bench tpch: --memory-limit measures peak memory, so the preloaded and arrow runs (whole-database copies in this process) are skipped");
            }
            let arrow = memory_limit.is_none() && (arrow || (!no_arrow && sf <= 5.0));
            let preloaded = memory_limit.is_none() && !no_preloaded;
            let opts = TpchBenchOptions {
                sf,
                queries,
                repeats,
                peers,
                link,
                adaptive: !fixed,
                request_bytes: request_kib << 10,
                explain,
                chunk_bytes: (chunk_kib << 10) as usize,
                arrow,
                preloaded,
                memory_limit,
                peer_engines,
                out: out.clone(),
            };
            let result = tpch_bench::run(&store_of(&bench, data_dir), &opts, &|step| eprintln!("bench tpch: {step}")).await;
            if let Some(b) = bench {
                b.down()?;
            }
            let (figures, failed) = result.map_err(anyhow::Error::msg)?;
            let text = tpch_bench::report(profile_name, &opts, &figures, &failed);
            publish(&out, &text, "report.txt,tpch.csv,tpch.png,memory.png,scheduler.png")?;
            anyhow::ensure!(failed.is_empty(), "{} of the queries failed (see the report)", failed.len());
        }
        BenchCommand::Scaling { sf, threads, queries, repeats, chunk_kib, memory_limit, warm, peers, data_dir, out } => {
            use blobhouse_bench::scaling::{self, ScalingOptions};
            anyhow::ensure!(sf > 0.0 && sf.is_finite(), "--sf must be a positive number");
            anyhow::ensure!(!queries.is_empty() && queries.iter().all(|q| (1..=22).contains(q)), "--queries are TPC-H query numbers, 1 to 22");
            anyhow::ensure!(!threads.is_empty() && threads.iter().all(|t| (1..=1024).contains(t)), "--threads are thread counts, 1 to 1024");
            if let Some(p) = peers.iter().find(|p| !["duckdb", "datafusion"].contains(&p.as_str())) {
                anyhow::bail!("--peers: unknown peer '{p}' (duckdb, datafusion)");
            }
            let chunk_kib = chunk_kib.unwrap_or((blobhouse_storage::WriteOptions::default().target_chunk_bytes >> 10) as u64);
            anyhow::ensure!((64..=1 << 20).contains(&chunk_kib), "--chunk-kib must be between 64 and 1048576");
            let mut threads = threads;
            threads.sort_unstable();
            threads.dedup();
            let out = out.unwrap_or_else(|| PathBuf::from(format!("bench-results/scaling-sf{sf}")));
            let opts = ScalingOptions {
                sf,
                queries,
                threads,
                repeats,
                chunk_bytes: (chunk_kib << 10) as usize,
                memory_limit: parse_memory_limit(memory_limit.as_deref())?,
                warm,
                peer_engines: peers,
                out: out.clone(),
            };
            // Each thread count runs on a runtime of its own, outside this command's.
            let result = std::thread::scope(|s| s.spawn(|| scaling::run(&data_dir, &opts, &|step| eprintln!("bench scaling: {step}"))).join())
                .map_err(|_| anyhow::anyhow!("the scaling benchmark thread panicked"))?;
            let points = result.map_err(anyhow::Error::msg)?;
            publish(&out, &scaling::report(&opts, &points), "report.txt,scaling.csv,scaling.png")?;
        }
        BenchCommand::Cluster { sf, workers, queries, chunk_kib, worker_memory_limit, membind, data_dir, out } => {
            use blobhouse_bench::cluster_bench::{self, ClusterBenchOptions};
            anyhow::ensure!(sf > 0.0 && sf.is_finite(), "--sf must be a positive number");
            anyhow::ensure!(!queries.is_empty() && queries.iter().all(|q| (1..=22).contains(q)), "--queries are TPC-H query numbers, 1 to 22");
            anyhow::ensure!(!workers.is_empty() && workers.iter().all(|w| (1..=1024).contains(w)), "--workers are worker counts, 1 to 1024");
            anyhow::ensure!((64..=1 << 20).contains(&chunk_kib), "--chunk-kib must be between 64 and 1048576");
            let membind = match membind.as_str() {
                "strict" => blobhouse_cluster::MemBind::Strict,
                "preferred" => blobhouse_cluster::MemBind::Preferred,
                other => anyhow::bail!("--membind {other:?}: expected strict or preferred"),
            };
            let mut workers = workers;
            workers.sort_unstable();
            workers.dedup();
            let out = out.unwrap_or_else(|| PathBuf::from(format!("bench-results/cluster-sf{sf}")));
            let opts = ClusterBenchOptions {
                sf,
                queries,
                workers,
                chunk_bytes: (chunk_kib << 10) as usize,
                binary: std::env::current_exe().context("cannot find this program to start workers")?,
                worker_memory_limit: parse_memory_limit(worker_memory_limit.as_deref())?.map(|b| b as u64),
                membind,
                out: out.clone(),
            };
            let outcome = cluster_bench::run(&data_dir, &opts, &|step| eprintln!("bench cluster: {step}")).await.map_err(anyhow::Error::msg)?;
            publish(&out, &cluster_bench::report(&opts, &outcome), "report.txt,cluster.csv,cluster.png")?;
            anyhow::ensure!(cluster_bench::all_right(&outcome), "an answer on the cluster differs from the engine alone's (see the report)");
        }
        BenchCommand::Serve { sf, profile, clients, duration, queries, max_queries, data_dir, out, dir } => {
            use blobhouse_bench::serve_bench::{self, ServeBenchOptions};
            anyhow::ensure!(sf > 0.0 && sf.is_finite(), "--sf must be a positive number");
            anyhow::ensure!(!queries.is_empty() && queries.iter().all(|q| (1..=22).contains(q)), "--queries are TPC-H query numbers, 1 to 22");
            anyhow::ensure!((1..=1000).contains(&clients), "--clients must be between 1 and 1000");
            anyhow::ensure!(duration >= 1, "--duration must be at least 1 second");
            let TpchSetup { bench, profile_name, out, link, request_kib, chunk_kib } = TpchSetup::new("serve", &profile, sf, out, dir)?;
            let opts = ServeBenchOptions {
                sf,
                queries,
                clients,
                duration: Duration::from_secs(duration),
                max_queries,
                request_bytes: request_kib << 10,
                chunk_bytes: (chunk_kib << 10) as usize,
                link,
                out: out.clone(),
            };
            let result = serve_bench::run(&store_of(&bench, data_dir), &opts, &|step| eprintln!("bench serve: {step}")).await;
            if let Some(b) = bench {
                b.down()?;
            }
            let figures = result.map_err(anyhow::Error::msg)?;
            publish(&out, &serve_bench::report(profile_name, &opts, &figures), "report.txt,serve.csv,serve.png")?;
            anyhow::ensure!(figures.errors.is_empty(), "{} statements failed or returned a wrong row count (see the report)", figures.errors.len());
        }
        BenchCommand::Cache { sf, profile, queries, rounds, seed, tiers, sizes, policy, slow_ssd, no_slow_ssd, ssd_dir, data_dir, memory_limit, out, dir } => {
            use blobhouse_bench::cache_bench::{self, CacheBenchOptions, SlowSsd, Tier};
            anyhow::ensure!(sf > 0.0 && sf.is_finite(), "--sf must be a positive number");
            anyhow::ensure!(!queries.is_empty() && queries.iter().all(|q| (1..=22).contains(q)), "--queries are TPC-H query numbers, 1 to 22");
            anyhow::ensure!(rounds >= 1, "--rounds must be at least 1");
            anyhow::ensure!(sizes.iter().all(|p| *p > 0.0 && *p <= 1000.0), "--sizes are percentages of the data, above 0");
            let tiers = tiers.iter().filter(|t| t.as_str() != "none").map(|t| Tier::parse(t).ok_or_else(|| anyhow::anyhow!("--tiers: unknown tier '{t}' (memory, ssd, both, none)"))).collect::<Result<Vec<_>>>()?;
            let policy = blobhouse_cache::PolicyKind::parse(&policy).ok_or_else(|| anyhow::anyhow!("--policy: unknown policy '{policy}' (lru, lfu)"))?;
            anyhow::ensure!(slow_ssd.len() == 2 && slow_ssd.iter().all(|v| *v >= 0.0 && v.is_finite()), "--slow-ssd: two non-negative numbers, ms per read and ms per MiB");
            let slow_ssd = (!no_slow_ssd).then(|| SlowSsd { per_read: Duration::from_secs_f64(slow_ssd[0] / 1e3), per_mib: Duration::from_secs_f64(slow_ssd[1] / 1e3) });
            let memory_limit = parse_memory_limit(memory_limit.as_deref())?;
            let TpchSetup { bench, profile_name, out, link, request_kib, chunk_kib } = TpchSetup::new("cache", &profile, sf, out, dir)?;
            let opts = CacheBenchOptions {
                sf,
                queries,
                rounds,
                seed,
                tiers,
                sizes,
                policy,
                slow_ssd,
                ssd_root: ssd_dir,
                request_bytes: request_kib << 10,
                chunk_bytes: (chunk_kib << 10) as usize,
                link,
                memory_limit,
                out: out.clone(),
            };
            let result = cache_bench::run(&store_of(&bench, data_dir), &opts, &|step| eprintln!("bench cache: {step}")).await;
            if let Some(b) = bench {
                b.down()?;
            }
            let result = result.map_err(anyhow::Error::msg)?;
            let text = cache_bench::report(profile_name, &opts, &result);
            publish(&out, &text, "report.txt,cache.csv,time.png,gets.png")?;
            let wrong: usize = result.configs.iter().chain(&result.routing).map(|c| c.wrong_answers()).sum();
            anyhow::ensure!(wrong == 0, "{wrong} answers were wrong (see the report)");
        }
        BenchCommand::Hybrid { sf, profile, experiments, queries, seed, sizes, theta, thetas, fixed_size, policy_sizes, policy_theta, cache_decoded_ratio, node_cpus, chunk_kib, data_dir, memory_limit, out, dir } => {
            use blobhouse_bench::hybrid_bench::{self, Experiments, HybridBenchOptions, NodeSetup};
            let experiments = Experiments::parse(&experiments).map_err(|e| anyhow::anyhow!("--experiments: {e}"))?;
            anyhow::ensure!(sf > 0.0 && sf.is_finite(), "--sf must be a positive number");
            anyhow::ensure!(queries >= 2, "--queries must be at least 2 (half warm up, half are measured)");
            anyhow::ensure!(sizes.iter().chain(&policy_sizes).chain([&fixed_size]).all(|p| *p > 0.0 && *p <= 1000.0), "--sizes, --policy-sizes and --fixed-size are percentages of the data, above 0");
            anyhow::ensure!(thetas.iter().chain([&theta, &policy_theta]).all(|t| *t >= 0.0 && t.is_finite()), "skews (θ) are finite and at least 0");
            anyhow::ensure!(node_cpus > 0.0 && node_cpus.is_finite(), "--node-cpus must be positive");
            anyhow::ensure!(chunk_kib >= 16, "--chunk-kib must be at least 16");
            anyhow::ensure!(cache_decoded_ratio >= 0.0 && cache_decoded_ratio.is_finite(), "--cache-decoded-ratio is a ratio of sizes, 0 or more (0: always compressed)");
            let memory_limit = parse_memory_limit(memory_limit.as_deref())?;
            let local = profile == "local";
            let bench = if local { None } else { Some(BenchTestbed::up(&profile, dir)?) };
            let profile_name = bench.as_ref().map_or("local", |b| b.profile.name());
            if profile_name != "bottleneck" {
                eprintln!("bench hybrid: note: the figures are about the bottleneck profile (`blobhouse testbed up bottleneck`); this run uses {profile_name}");
            }
            let out = out.unwrap_or_else(|| PathBuf::from(format!("bench-results/hybrid-{profile_name}-sf{sf}")));
            let exe = std::env::current_exe().context("find the blobhouse executable")?;
            let opts = HybridBenchOptions {
                experiments,
                sf,
                chunk_bytes: chunk_kib << 10,
                queries,
                seed,
                sizes,
                theta,
                thetas,
                fixed_size,
                policy_sizes,
                policy_theta,
                decoded_max_ratio: cache_decoded_ratio,
                node: NodeSetup::Spawn { exe, cpus: node_cpus },
                request_bytes: 16 << 20,
                memory_limit,
                out: out.clone(),
            };
            let result = hybrid_bench::run(&store_of(&bench, data_dir), &opts, &|step| eprintln!("bench hybrid: {step}")).await;
            if let Some(b) = bench {
                b.down()?;
            }
            let result = result.map_err(anyhow::Error::msg)?;
            let text = hybrid_bench::report(profile_name, &opts, &result);
            let files = ["report.txt"].into_iter().chain(hybrid_bench::output_files(&opts)).collect::<Vec<_>>().join(",");
            publish(&out, &text, &files)?;
            anyhow::ensure!(result.wrong() == 0, "{} answers differed between configurations (see the report)", result.wrong());
        }
        BenchCommand::Bank { db, writers, readers, transfers, accounts, out, dir } => {
            anyhow::ensure!(writers > 0 && accounts >= 2, "--writers must be at least 1 and --accounts at least 2");
            let options = blobhouse_bench::bank::BankOptions { accounts, writers, readers, transfers, ..Default::default() };
            let (bench, url, store) = match db {
                Some(url) => (None, url, blobhouse_storage::StoreOptions::default()),
                None => {
                    let bench = BenchTestbed::up("lan", dir)?;
                    let stamp = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis()).unwrap_or(0);
                    let url = format!("s3://{}/bank-{stamp}", blobhouse_testbed::BUCKET);
                    let store = blobhouse_storage::StoreOptions {
                        endpoint: Some(bench.tb.endpoints().s3_direct),
                        access_key_id: Some(blobhouse_testbed::ACCESS_KEY.into()),
                        secret_access_key: Some(blobhouse_testbed::SECRET_KEY.into()),
                        region: Some("us-east-1".into()),
                        ..Default::default()
                    };
                    (Some(bench), url, store)
                }
            };
            let exe = std::env::current_exe().context("find the blobhouse executable")?;
            let command = move || {
                let mut c = std::process::Command::new(&exe);
                c.args(["bench", "bank-worker"]);
                c
            };
            let report = blobhouse_bench::bank::run(&url, &store, &options, &command, &|step| eprintln!("bench bank: {step}")).await.map_err(anyhow::Error::msg);
            if let Some(b) = bench {
                b.down()?;
            }
            let report = report?;
            let text = report.describe(&options);
            let out = out.unwrap_or_else(|| PathBuf::from("bench-results/bank"));
            std::fs::create_dir_all(&out).with_context(|| format!("create {}", out.display()))?;
            std::fs::write(out.join("report.txt"), &text).with_context(|| format!("write {}/report.txt", out.display()))?;
            println!("{text}");
            println!("wrote {}/report.txt", out.display());
            anyhow::ensure!(report.violations.is_empty() && report.broken_reads.is_empty(), "the bank's invariants were violated (see the report)");
        }
        BenchCommand::Encryption { sf, profile, queries, repeats, data_dir, out, dir } => {
            use blobhouse_bench::encryption_bench::{self, EncryptionBenchOptions};
            anyhow::ensure!(sf > 0.0 && sf.is_finite(), "--sf must be a positive number");
            anyhow::ensure!(queries.iter().all(|q| (1..=22).contains(q)), "--queries are TPC-H query numbers, 1 to 22");
            let TpchSetup { bench, profile_name, out, link, request_kib, chunk_kib } = TpchSetup::new("encryption", &profile, sf, out, dir)?;
            let opts = EncryptionBenchOptions { sf, queries, repeats, request_bytes: request_kib << 10, chunk_bytes: (chunk_kib << 10) as usize, link, out: out.clone() };
            let result = encryption_bench::run(&store_of(&bench, data_dir), &opts, &|step| eprintln!("bench encryption: {step}")).await;
            if let Some(b) = bench {
                b.down()?;
            }
            let figures = result.map_err(|e| anyhow::anyhow!("bench encryption: {e}"))?;
            encryption_bench::write_files(&opts, &figures).map_err(|e| anyhow::anyhow!("bench encryption: {e}"))?;
            publish(&out, &encryption_bench::describe(&opts, profile_name, &figures), "report.txt,figures.csv,cpu-per-gib.png")?;
        }
        BenchCommand::Dml { sf, dir, out } => {
            anyhow::ensure!(sf > 0.0, "--sf must be positive");
            std::fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
            let figures = blobhouse_bench::dml_bench::run(&dir, sf, &|step| eprintln!("bench dml: {step}")).await.context("bench dml")?;
            let text = blobhouse_bench::dml_bench::describe(sf, &figures);
            let out = out.unwrap_or_else(|| PathBuf::from("bench-results/dml"));
            std::fs::create_dir_all(&out).with_context(|| format!("create {}", out.display()))?;
            std::fs::write(out.join("report.txt"), &text).with_context(|| format!("write {}/report.txt", out.display()))?;
            println!("{text}");
            println!("wrote {}/report.txt", out.display());
        }
        BenchCommand::Crash { trials, seed, check_every, db, store, out } => {
            anyhow::ensure!(trials > 0 && check_every > 0, "--trials and --check-every must be at least 1");
            let stamp = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis()).unwrap_or(0);
            let scratch = std::env::temp_dir().join(format!("blobhouse-crash-{stamp}"));
            let url = db.unwrap_or_else(|| format!("bench-results/crash-db-{stamp}"));
            let exe = std::env::current_exe().context("find the blobhouse executable")?;
            let command = move || {
                let mut c = std::process::Command::new(&exe);
                c.args(["bench", "crash-worker"]);
                c
            };
            let options = blobhouse_bench::crash::CrashOptions { trials, seed, check_every, scratch: scratch.clone() };
            let report = blobhouse_bench::crash::run(&url, &store.options(), &options, &command, &|step| eprintln!("bench crash: {step}")).await.map_err(anyhow::Error::msg)?;
            let _ = std::fs::remove_dir_all(&scratch);
            let text = report.describe();
            let out = out.unwrap_or_else(|| PathBuf::from("bench-results/crash"));
            std::fs::create_dir_all(&out).with_context(|| format!("create {}", out.display()))?;
            std::fs::write(out.join("report.txt"), &text).with_context(|| format!("write {}/report.txt", out.display()))?;
            println!("{text}");
            println!("database: {url}\nwrote {}/report.txt", out.display());
            anyhow::ensure!(report.violations.is_empty(), "the crash harness found violations (see the report)");
        }
        BenchCommand::Vacuum { objects, tables, dir, out } => {
            anyhow::ensure!(tables >= 1 && objects >= tables, "--objects must be at least --tables, which must be at least 1");
            std::fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
            let figures = blobhouse_bench::vacuum_bench::run(&dir, objects, tables, &|step| eprintln!("bench vacuum: {step}")).await.context("bench vacuum")?;
            let text = blobhouse_bench::vacuum_bench::describe(&figures);
            let out = out.unwrap_or_else(|| PathBuf::from("bench-results/vacuum"));
            std::fs::create_dir_all(&out).with_context(|| format!("create {}", out.display()))?;
            std::fs::write(out.join("report.txt"), &text).with_context(|| format!("write {}/report.txt", out.display()))?;
            println!("{text}");
            println!("wrote {}/report.txt", out.display());
        }
        BenchCommand::CrashWorker => match blobhouse_bench::crash::worker_from_env().await {
            Some(result) => result.map_err(anyhow::Error::msg)?,
            None => anyhow::bail!("bench crash-worker is started by `blobhouse bench crash`, which sets {}", blobhouse_bench::crash::WORKER_ENV),
        },
        BenchCommand::BankWorker => match blobhouse_bench::bank::worker_from_env().await {
            Some(result) => result.map_err(anyhow::Error::msg)?,
            None => anyhow::bail!("bench bank-worker is started by `blobhouse bench bank`, which sets {}", blobhouse_bench::bank::WORKER_ENV),
        },
        BenchCommand::Hedge { profile, requests, size_kib, in_flight, out, dir } => {
            anyhow::ensure!(requests > 0 && in_flight > 0, "--requests and --in-flight must be at least 1");
            let bench = BenchTestbed::up(&profile, dir)?;
            let out = out.unwrap_or_else(|| PathBuf::from(format!("bench-results/hedge-{}", bench.profile.name())));
            let size = size_kib << 10;
            let result = std::thread::scope(|s| s.spawn(|| io_bench::hedging(&bench.tb, requests, size, in_flight)).join())
                .map_err(|_| anyhow::anyhow!("the hedging benchmark thread panicked"))?;
            let profile = bench.profile;
            bench.down()?;
            let runs = result.map_err(anyhow::Error::msg)?;
            let text = io_bench::hedging_report(profile.name(), size, in_flight, &runs);
            std::fs::create_dir_all(&out).with_context(|| format!("cannot create {}", out.display()))?;
            publish(&out, &text, "report.txt")?;
        }
    }
    Ok(())
}

/// The peak measured throughput of a calibration's throughput.csv.
fn calibrated_peak(csv: &std::path::Path) -> Option<f64> {
    let text = std::fs::read_to_string(csv).ok()?;
    text.lines().skip(1).filter_map(|l| l.split(',').nth(1)?.parse::<f64>().ok()).reduce(f64::max)
}
