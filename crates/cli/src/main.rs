//! The `blobhouse` command: SQL over tables that live in object storage.

mod bench;
mod cluster;
mod config;
mod demo;
mod output;
mod shell;
mod testbed;

use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{Context, Result};
use clap::{Args, CommandFactory, FromArgMatches, Parser, Subcommand};
use indicatif::{MultiProgress, ProgressBar, ProgressStyle};

use blobhouse_engine::hybrid::{PushdownMode, PushdownOptions};
use blobhouse_engine::{Engine, EngineOptions};
use blobhouse_pushdown::{NodeOptions, StorageNode};

/// mimalloc instead of the system allocator, when built with the feature
/// (measured against it in docs/memory.md).
#[cfg(feature = "mimalloc")]
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;
use blobhouse_storage::StoreOptions;
use blobhouse_storage::encryption::KeySpec;

#[derive(Parser)]
#[command(name = "blobhouse", version, about = "An analytical SQL database whose tables live in object storage", long_about = None,
    after_help = "Examples:\n  blobhouse demo                                   # TPC-H SF 1 in ./blobhouse-demo, all 22 queries, verified\n  blobhouse sql --db ./mydb                        # interactive SQL shell on a local database\n  blobhouse sql --db s3://bucket/db -c 'SHOW TABLES'\n  blobhouse load tpch --sf 10 --db s3://bucket/tpch10 --endpoint http://127.0.0.1:9000")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Generate TPC-H in a local database, run the 22 queries, check every answer.
    #[command(after_help = "Examples:\n  blobhouse demo\n  blobhouse demo --sf 0.1 --dir /tmp/bh-demo\n  blobhouse demo --fresh        # reload the data instead of reusing it")]
    Demo(demo::DemoArgs),
    /// Run SQL against a database: an interactive shell, or -c / -f for scripts.
    #[command(after_help = "Examples:\n  blobhouse sql --db ./mydb\n  blobhouse sql --db ./mydb -c \"CREATE TABLE t AS SELECT 1 AS x; SELECT * FROM t\"\n  blobhouse sql --db s3://bucket/db -f queries.sql\n  blobhouse sql --db ./mydb --format csv -c \"SELECT * FROM t\" > t.csv\n  blobhouse sql --db ./mydb --memory-limit 4G --spill-dir /mnt/ssd/spill\n\nStatements: SELECT (all of DataFusion's SQL), EXPLAIN [ANALYZE], CREATE TABLE [AS SELECT],\nINSERT INTO … VALUES / SELECT, COPY t FROM 'file.csv|file.parquet' [WITH (FORMAT csv, HEADER true, DELIMITER '|')],\nDROP TABLE, DELETE, UPDATE, BEGIN / COMMIT / ROLLBACK, OPTIMIZE t, COPY (query) TO 'file',\nt AT(VERSION => n | TIMESTAMP => '…' | SNAPSHOT => 'name'), CREATE / DROP SNAPSHOT, SHOW SNAPSHOTS,\nSHOW VERSIONS, RESTORE DATABASE | TABLE t TO …, VACUUM [RETAIN '7 days'] [DRY RUN],\nSHOW TABLES, DESCRIBE t, SET memory_limit = '4G' | 'none', SHOW memory_limit.\n\nShell commands (also in -c and -f scripts): \\d [TABLE], \\dt [PATTERN], \\timing [on|off],\n\\pset format table|csv|json|markdown (or .mode csv), \\q. Ctrl-C cancels a running statement.")]
    Sql(SqlArgs),
    /// Garbage collection: delete what no retained version or snapshot references (VACUUM).
    #[command(after_help = "Keeps every version newer than --retain and every snapshot; deletes the data objects,\nmanifests and deletion vectors only older versions referenced, and expires those versions.\n--dry-run lists each path it would delete and why, and deletes nothing.\n\nExamples:\n  blobhouse gc --db ./mydb --dry-run\n  blobhouse gc --db s3://bucket/db --retain '30 days'\n  blobhouse gc --db ./mydb --retain 0s       # keep only the newest version and snapshots")]
    Gc(GcArgs),
    /// Check every object of a database against the checksums and seals written with it.
    #[command(after_help = "Reads every object the retained versions and snapshots reference: version objects,\nmanifests and GC lists by their seals, data objects whole by their checksums (and their\nfooters against the manifests), deletion vectors by checksum. Lists each damaged or\nmissing object with what is wrong; exits 1 when it finds any, 0 when all is intact.\n\nExamples:\n  blobhouse verify --db ./mydb\n  blobhouse verify --db s3://bucket/db")]
    Verify(VerifyArgs),
    /// Encryption keys: which master key a database needs, and rotating it.
    #[command(subcommand)]
    Keys(KeysCommand),
    /// Load a benchmark data set into a database.
    #[command(subcommand)]
    Load(LoadCommand),
    /// Benchmarks: tables on stdout, CSV and PNG plots on disk.
    #[command(subcommand)]
    Bench(bench::BenchCommand),
    /// Serve a database's data objects to compute processes: filters and partial aggregations run here, next to the store.
    #[command(after_help = "The node reads only the database's data objects, runs only separable plan fragments\n(projection, filter, partial aggregation), and serves only callers that present its token.\nRun it on a machine next to the store (same zone), then point compute processes at it.\n\nExamples:\n  export BLOBHOUSE_NODE_TOKEN=$(openssl rand -hex 16)\n  blobhouse storage-node --db s3://bucket/db --listen 0.0.0.0:50061 --tls-cert node.crt --tls-key node.key\n  blobhouse sql --db s3://bucket/db --storage-node https://node:50061 --storage-node-ca ca.crt --pushdown auto")]
    StorageNode(StorageNodeArgs),
    /// Serve a database to PostgreSQL clients (psql, psycopg, JDBC) and Arrow Flight SQL clients (ADBC): one engine, a session per connection.
    #[command(after_help = "Users log in with SCRAM-SHA-256 (PostgreSQL) or a password handshake that gives a token\n(Flight SQL; use TLS off loopback). On 127.0.0.1 a server may run without users (nobody can\nlog in then); on any other address it refuses to start without them.\n\nExamples:\n  BLOBHOUSE_PASSWORD=secret blobhouse serve --db ./mydb --user alice\n  psql \"host=127.0.0.1 port=5432 user=alice dbname=blobhouse\"\n  python3 -c 'import adbc_driver_flightsql.dbapi as f; c = f.connect(\"grpc://127.0.0.1:50051\", db_kwargs={\"username\": \"alice\", \"password\": \"secret\"})'\n  blobhouse hash-password < pw.txt    # prints a hash for a --users-file line  alice:<hash>\n  blobhouse serve --db s3://bucket/db --pg-listen 0.0.0.0:5432 --users-file users.txt \\\n      --tls-cert server.crt --tls-key server.key\n  blobhouse serve --db ./mydb --user alice --metrics-listen 127.0.0.1:9187 --slow-query-ms 500\n  blobhouse serve --config blobhouse.toml --pg-listen 127.0.0.1:5433   # flags win over the file\n\nConfig file (TOML): serve's flags as keys, and users' hashes:\n  db = \"s3://bucket/db\"\n  pg-listen = \"0.0.0.0:5432\"\n  [users]\n  alice = \"scram-sha-256$4096$…\"")]
    #[command(args_override_self = true)]
    Serve(ServeArgs),
    /// Serve a database to coordinators as a cluster worker: run the tasks of their statements.
    #[command(after_help = "A worker reads the database's data objects through its own download manager, memory\nbudget, spill directory and caches; it needs no catalog. Coordinators name it with --worker.\nIt answers only callers that present the cluster token ($BLOBHOUSE_CLUSTER_TOKEN, the same everywhere).\n\nExamples:\n  export BLOBHOUSE_CLUSTER_TOKEN=$(openssl rand -hex 16)\n  blobhouse worker --db s3://bucket/db --listen 127.0.0.1:50071 --memory-limit 8G\n  blobhouse worker --db s3://bucket/db --listen 127.0.0.1:50072 --memory-limit 8G\n  blobhouse sql --db s3://bucket/db --worker http://127.0.0.1:50071 --worker http://127.0.0.1:50072")]
    Worker(cluster::WorkerArgs),
    /// Print a SCRAM-SHA-256 hash of the password read from standard input (for --users-file).
    HashPassword,
    /// The object-store testbed: MinIO, nginx and toxiproxy on 127.0.0.1, shaped like a cloud store.
    #[command(subcommand)]
    Testbed(testbed::TestbedCommand),
}

#[derive(Subcommand)]
enum LoadCommand {
    /// Generate TPC-H (tpchgen, identical to dbgen) and load its eight tables.
    #[command(after_help = "Examples:\n  blobhouse load tpch --sf 1 --db ./tpch1\n  AWS_ENDPOINT_URL=http://127.0.0.1:9000 blobhouse load tpch --sf 10 --db s3://bucket/tpch10")]
    Tpch {
        /// Scale factor (1 = 6 million lineitem rows, about 0.25 GB of Parquet).
        #[arg(long, default_value_t = 1.0)]
        sf: f64,
        #[command(flatten)]
        db: DbArgs,
    },
    /// The Star Schema Benchmark: derived from TPC-H in SQL (lineorder
    /// clustered on its date); see docs/pushdown.md.
    #[command(after_help = "Examples:\n  blobhouse load ssb --sf 1 --db ./ssb1\n  blobhouse sql --db ./ssb1 -f crates/bench/ssb/queries/q1.1.sql")]
    Ssb {
        /// Scale factor (1 = 6 million lineorder rows).
        #[arg(long, default_value_t = 1.0)]
        sf: f64,
        #[command(flatten)]
        db: DbArgs,
    },
}

/// Where the database is and how to reach it.
#[derive(Args, Clone)]
pub struct DbArgs {
    /// Database URL: a path, file:///path, s3://bucket/prefix, gs://…, az://…, or memory://
    #[arg(long, env = "BLOBHOUSE_DB")]
    db: String,
    #[command(flatten)]
    store: StoreArgs,
    /// Target average size of a column chunk in MiB when writing (default 12).
    #[arg(long, value_name = "MIB")]
    chunk_mib: Option<usize>,
    #[command(flatten)]
    engine: EngineArgs,
}

impl DbArgs {
    /// The store settings given as flags.
    pub fn store_options(&self) -> StoreOptions {
        self.store.options()
    }

    /// The spill directory given, if any.
    fn spill_dir(&self) -> Option<std::path::PathBuf> {
        self.engine.spill_dir.clone()
    }
}

/// The engine's memory and spilling.
#[derive(Args, Clone, Default)]
pub struct EngineArgs {
    /// Threads that run queries: the query's partitions and the runtime's workers (default: the machine's cores).
    #[arg(long, value_name = "N", env = "BLOBHOUSE_THREADS", value_parser = clap::value_parser!(u16).range(1..=1024))]
    threads: Option<u16>,
    /// Memory for everything the engine holds (operators, scan buffers, caches): 4G, 512MB, 60%, or none.
    /// Beyond it operators spill, or the query fails with "Resources exhausted". Default: half the machine's memory.
    #[arg(long, value_name = "SIZE", env = "BLOBHOUSE_MEMORY_LIMIT")]
    memory_limit: Option<String>,
    /// Directory for spill files of sorts, aggregations and sort-merge joins (default: the system's temporary directory).
    #[arg(long, value_name = "DIR", env = "BLOBHOUSE_SPILL_DIR")]
    spill_dir: Option<std::path::PathBuf>,
    /// Most disk space spill files may take at once, e.g. 50G (default 100G).
    #[arg(long, value_name = "SIZE")]
    spill_limit: Option<String>,
    /// Size of the in-memory cache of column chunks, within the memory limit (default: a quarter of it; 0: off).
    #[arg(long, value_name = "SIZE", env = "BLOBHOUSE_CACHE_MEMORY")]
    cache_memory: Option<String>,
    /// The in-memory cache holds column chunks decoded (Arrow arrays: no decompression or decoding on a hit):
    /// numbers and dates always, strings when their arrays take at most RATIO times their compressed bytes
    /// (default 5; 0: every chunk compressed, the least memory).
    #[arg(long, value_name = "RATIO")]
    cache_decoded_ratio: Option<f64>,
    /// Directory of the SSD cache of column chunks (default: no SSD cache). Kept across restarts; processes running at once get separate slots in it.
    #[arg(long, value_name = "DIR", env = "BLOBHOUSE_CACHE_DIR")]
    cache_dir: Option<std::path::PathBuf>,
    /// Most disk space the SSD cache may take, e.g. 50G (default 10G).
    #[arg(long, value_name = "SIZE", env = "BLOBHOUSE_CACHE_SSD_SIZE")]
    cache_ssd_size: Option<String>,
    /// A `blobhouse storage-node` serving the same database, e.g. http://10.0.0.5:50061: scans push
    /// filters and partial aggregations to it for row groups the caches do not hold (docs/pushdown.md).
    #[arg(long, value_name = "URL", env = "BLOBHOUSE_STORAGE_NODE")]
    storage_node: Option<String>,
    /// The environment variable holding the storage node's token (a token is never given on the command line).
    #[arg(long, value_name = "VAR", default_value = "BLOBHOUSE_NODE_TOKEN")]
    storage_node_token_env: String,
    /// The CA certificate (PEM) that signed an https:// storage node's certificate.
    #[arg(long, value_name = "FILE")]
    storage_node_ca: Option<std::path::PathBuf>,
    /// When to push work to the storage node: off, on (every uncached row group), auto (by measured speed).
    #[arg(long, value_name = "MODE", default_value = "auto")]
    pushdown: String,
    /// Let an encrypted database spill to disk: spill files hold rows in plaintext (by default an
    /// encrypted database does not spill, and a query that needs to fails naming its memory limit).
    #[arg(long)]
    allow_plaintext_spill: bool,
}

impl EngineArgs {
    /// Applies the flags to `options` (parsed by [`EngineOptions::set`],
    /// as the Python package's keyword arguments are).
    pub fn apply(&self, options: &mut EngineOptions) -> Result<()> {
        let path = |p: &Option<std::path::PathBuf>| p.as_ref().map(|p| p.to_string_lossy().into_owned());
        let flags = [
            ("threads", self.threads.map(|n| n.to_string())),
            ("memory-limit", self.memory_limit.clone()),
            ("spill-dir", path(&self.spill_dir)),
            ("spill-limit", self.spill_limit.clone()),
            ("allow-plaintext-spill", Some(self.allow_plaintext_spill.to_string())),
            ("cache-memory", self.cache_memory.clone()),
            ("cache-decoded-ratio", self.cache_decoded_ratio.map(|r| r.to_string())),
            ("cache-dir", path(&self.cache_dir)),
            ("cache-ssd-size", self.cache_ssd_size.clone()),
        ];
        for (flag, value) in flags {
            if let Some(value) = value {
                options.set(flag, &value).map_err(|e| anyhow::anyhow!("--{flag}: {}", e.split_once(": ").map_or(e.as_str(), |(_, why)| why)))?;
            }
        }
        let mode = PushdownMode::parse(&self.pushdown).ok_or_else(|| anyhow::anyhow!("--pushdown {}: use off, on or auto", self.pushdown))?;
        if let Some(endpoint) = &self.storage_node {
            let token = node_token(&self.storage_node_token_env)?;
            let mut p = PushdownOptions::new(endpoint.clone(), token);
            p.mode = mode;
            if let Some(ca) = &self.storage_node_ca {
                p.ca = Some(std::fs::read(ca).with_context(|| format!("cannot read --storage-node-ca {}", ca.display()))?);
            }
            options.pushdown = Some(p);
        }
        Ok(())
    }
}

/// Overrides of the AWS_* environment for S3 and S3-compatible stores.
#[derive(Args, Clone, Default)]
pub struct StoreArgs {
    /// Endpoint of the store: S3-compatible (http://127.0.0.1:9000; default AWS_ENDPOINT_URL,
    /// else AWS), an Azure account (http://127.0.0.1:10000/devstoreaccount1 for Azurite;
    /// default AZURE_STORAGE_ENDPOINT) or a GCS base URL (an emulator's).
    #[arg(long)]
    endpoint: Option<String>,
    /// S3 access key id (default: AWS_ACCESS_KEY_ID).
    #[arg(long)]
    access_key_id: Option<String>,
    /// S3 secret access key (default: AWS_SECRET_ACCESS_KEY).
    #[arg(long)]
    secret_access_key: Option<String>,
    /// S3 region (default: AWS_REGION; us-east-1 with a custom endpoint).
    #[arg(long)]
    region: Option<String>,
    /// Allow plain HTTP (implied by an http:// endpoint).
    #[arg(long)]
    allow_http: bool,
    /// Use virtual-hosted-style requests instead of path style.
    #[arg(long)]
    virtual_hosted_style: bool,
    /// An object_store setting for the URL's cloud, KEY=VALUE (repeatable), e.g.
    /// azure_storage_account_name=acct, azure_storage_sas_token=…, google_service_account=key.json,
    /// aws_session_token=…; overrides the environment.
    #[arg(long = "store-option", value_name = "KEY=VALUE", value_parser = parse_store_option)]
    store_options: Vec<(String, String)>,
    #[command(flatten)]
    key: KeyArgs,
}

/// The master key of an encrypted database: given when it is created, it
/// makes the database encrypted; given when it is opened, it unlocks it.
#[derive(Args, Clone, Default)]
pub struct KeyArgs {
    /// Encrypt (at creation) or open an encrypted database with the 256-bit master key in FILE
    /// (64 hex digits, e.g. `openssl rand -hex 32 > FILE`, or base64).
    #[arg(long, value_name = "FILE", conflicts_with_all = ["encryption_key_env", "kms_key_id"])]
    encryption_key_file: Option<std::path::PathBuf>,
    /// The same, the key held in environment variable VAR.
    #[arg(long, value_name = "VAR", conflicts_with = "kms_key_id")]
    encryption_key_env: Option<String>,
    /// The same, the master key being AWS KMS key KEY (id, ARN or alias/NAME); credentials from
    /// the AWS chain, region from AWS_REGION.
    #[arg(long, value_name = "KEY")]
    kms_key_id: Option<String>,
    /// The KMS endpoint (default AWS_ENDPOINT_URL_KMS, else the region's).
    #[arg(long, value_name = "URL", requires = "kms_key_id")]
    kms_endpoint: Option<String>,
}

impl KeyArgs {
    /// The key these flags name, else the one a parent process passed
    /// (`BLOBHOUSE_ENCRYPTION`, how local workers get it).
    fn spec(&self) -> Option<KeySpec> {
        if let Some(path) = &self.encryption_key_file {
            return Some(KeySpec::File { path: path.clone() });
        }
        if let Some(var) = &self.encryption_key_env {
            return Some(KeySpec::Env { var: var.clone() });
        }
        if let Some(key_id) = &self.kms_key_id {
            return Some(KeySpec::AwsKms { key_id: key_id.clone(), endpoint: self.kms_endpoint.clone(), region: None });
        }
        KeySpec::from_env().ok().flatten()
    }
}

fn parse_store_option(s: &str) -> std::result::Result<(String, String), String> {
    let (k, v) = s.split_once('=').ok_or_else(|| format!("'{s}': expected KEY=VALUE, e.g. azure_storage_account_name=myaccount"))?;
    let k = k.trim().to_ascii_lowercase();
    if k.is_empty() {
        return Err(format!("'{s}': the key is empty"));
    }
    Ok((k, v.to_string()))
}

impl StoreArgs {
    fn options(&self) -> StoreOptions {
        StoreOptions {
            access_key_id: self.access_key_id.clone(),
            secret_access_key: self.secret_access_key.clone(),
            region: self.region.clone(),
            endpoint: self.endpoint.clone(),
            allow_http: self.allow_http.then_some(true),
            virtual_hosted_style: self.virtual_hosted_style.then_some(true),
            config: self.store_options.iter().cloned().collect(),
            encryption: self.key.spec(),
        }
    }
}

#[derive(Args)]
struct StorageNodeArgs {
    /// Database URL: a path, file:///path, s3://bucket/prefix, gs://…, az://…
    #[arg(long, env = "BLOBHOUSE_DB")]
    db: String,
    #[command(flatten)]
    store: StoreArgs,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:50061")]
    listen: std::net::SocketAddr,
    /// The environment variable holding the token callers must present.
    #[arg(long, value_name = "VAR", default_value = "BLOBHOUSE_NODE_TOKEN")]
    token_env: String,
    /// Tasks run at once: the node's CPU budget (default: its cores). Beyond it and the queue, callers fetch instead.
    #[arg(long)]
    max_tasks: Option<usize>,
    /// Tasks that may wait for a slot (default: as many as --max-tasks).
    #[arg(long)]
    max_queued: Option<usize>,
    /// How replies are compressed on the wire: zstd, lz4 or none.
    #[arg(long, default_value = "zstd", value_parser = parse_compression)]
    compression: blobhouse_pushdown::ReplyCompression,
    /// Serve TLS only, with this certificate chain (PEM); needs --tls-key. A file that does not
    /// parse stops the node: it never falls back to plaintext.
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    tls_cert: Option<std::path::PathBuf>,
    /// The certificate's private key (PEM).
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    tls_key: Option<std::path::PathBuf>,
}

fn parse_compression(text: &str) -> Result<blobhouse_pushdown::ReplyCompression, String> {
    blobhouse_pushdown::ReplyCompression::parse(text).ok_or_else(|| format!("{text:?} is not a reply compression (zstd, lz4 or none)"))
}

/// A listener's address, or none (`off`).
#[derive(Clone, Copy, Debug)]
struct Listener(Option<std::net::SocketAddr>);

fn parse_listener(text: &str) -> Result<Listener, String> {
    if text.eq_ignore_ascii_case("off") {
        return Ok(Listener(None));
    }
    text.parse().map(|a| Listener(Some(a))).map_err(|_| format!("{text:?} is not an address like 127.0.0.1:50051 (or off)"))
}

#[derive(Args)]
struct ServeArgs {
    #[command(flatten)]
    db: DbArgs,
    #[command(flatten)]
    cluster: cluster::ClusterArgs,
    /// Settings from a TOML file: serve's flags as keys (pg-listen = "0.0.0.0:5432") and a
    /// [users] table of SCRAM hashes. Flags on the command line win over the file.
    #[arg(long, value_name = "FILE", env = "BLOBHOUSE_CONFIG")]
    config: Option<std::path::PathBuf>,
    /// Address of the PostgreSQL listener.
    #[arg(long, default_value = "127.0.0.1:5432")]
    pg_listen: std::net::SocketAddr,
    /// Address of the Arrow Flight SQL listener (ADBC, JDBC's Flight SQL driver), or `off`.
    #[arg(long, default_value = "127.0.0.1:50051", value_name = "ADDR|off", value_parser = parse_listener)]
    flight_listen: Listener,
    /// A user who logs in with the password in $BLOBHOUSE_PASSWORD.
    #[arg(long)]
    user: Option<String>,
    /// A file of users, one `name:hash` per line (hashes from `blobhouse hash-password`; # comments).
    #[arg(long, value_name = "FILE")]
    users_file: Option<std::path::PathBuf>,
    /// TLS certificate chain (PEM): clients must then use TLS. Needs --tls-key.
    #[arg(long, requires = "tls_key", value_name = "PEM")]
    tls_cert: Option<std::path::PathBuf>,
    /// TLS private key (PEM). Needs --tls-cert.
    #[arg(long, requires = "tls_cert", value_name = "PEM")]
    tls_key: Option<std::path::PathBuf>,
    /// Connections served at once; more wait.
    #[arg(long, default_value_t = 64)]
    max_connections: usize,
    /// Statements running at once (default: twice the cores); more wait in a queue.
    #[arg(long, default_value_t = 0, hide_default_value = true)]
    max_queries: usize,
    /// Serve HTTP here, e.g. 127.0.0.1:9187: Prometheus metrics (/metrics), a health check
    /// (/healthz) and a read-only Iceberg REST catalog of the tables (/v1/…; DuckDB:
    /// ATTACH 'blobhouse' AS c (TYPE iceberg, ENDPOINT 'http://ADDR', AUTHORIZATION_TYPE 'none')).
    #[arg(long, value_name = "ADDR", alias = "http-listen")]
    metrics_listen: Option<std::net::SocketAddr>,
    /// The environment variable holding the token HTTP callers (/metrics, /healthz, the Iceberg
    /// catalog) must send (Authorization: Bearer <token>); required when --metrics-listen is not loopback.
    #[arg(long, value_name = "VAR", requires = "metrics_listen")]
    metrics_token_env: Option<String>,
    /// Let clients read and write files outside the database under this directory, bucket
    /// or bucket prefix (read_parquet, read_csv, CREATE EXTERNAL TABLE, COPY … FROM/TO a
    /// path or URL), e.g. s3://lake/exports/ (repeatable; `*`: anywhere this process can
    /// reach). Default: nowhere — the server's files and credentials are not its clients'.
    #[arg(long, value_name = "PREFIX")]
    allow_files: Vec<String>,
    /// Log statements that take at least this many milliseconds, with their text.
    #[arg(long, default_value_t = 1000, value_name = "MS")]
    slow_query_ms: u64,
    /// Log level on standard error: error, warn, info (a line per statement) or debug.
    #[arg(long, default_value = "info", value_name = "LEVEL")]
    log_level: tracing_subscriber::filter::LevelFilter,
}

#[derive(Args)]
struct SqlArgs {
    #[command(flatten)]
    db: DbArgs,
    /// Run these statements (separated by ';') and exit.
    #[arg(short = 'c', long = "command", conflicts_with = "file")]
    command: Option<String>,
    /// Run the statements in this file and exit.
    #[arg(short = 'f', long = "file")]
    file: Option<std::path::PathBuf>,
    /// How results are printed (in the shell, `\pset format MODE` or `.mode MODE` switches).
    #[arg(long, value_enum, default_value = "table")]
    format: output::Format,
    #[command(flatten)]
    cluster: cluster::ClusterArgs,
}

#[derive(Args)]
struct GcArgs {
    #[command(flatten)]
    db: DbArgs,
    /// Keep versions newer than this: '7 days', '12h', '0s'.
    #[arg(long, default_value = "7 days")]
    retain: String,
    /// The longest a transaction may stay open: uploads of writers that stopped longer than
    /// retain + grace ago and that no kept version references are collected as a crashed writer's.
    #[arg(long, default_value = "1 day")]
    grace: String,
    /// List what would be deleted and why; delete nothing.
    #[arg(long)]
    dry_run: bool,
}

#[derive(Args)]
struct VerifyArgs {
    #[command(flatten)]
    db: DbArgs,
}

/// `blobhouse keys`.
#[derive(Subcommand)]
enum KeysCommand {
    /// Say whether a database is encrypted, and by which master key (never the key).
    Show {
        #[command(flatten)]
        db: DbArgs,
    },
    /// Rotate an encrypted database's master key: its database key is wrapped by the new master
    /// key into a new keyring object; no data or metadata object is rewritten.
    #[command(after_help = "Examples:\n  openssl rand -hex 32 > new.key\n  blobhouse keys rotate --db ./mydb --encryption-key-file old.key --new-key-file new.key\n  blobhouse keys rotate --db s3://bucket/db --kms-key-id alias/old --new-kms-key-id alias/new")]
    Rotate {
        #[command(flatten)]
        db: DbArgs,
        /// The new master key, in FILE.
        #[arg(long, value_name = "FILE", conflicts_with_all = ["new_key_env", "new_kms_key_id"])]
        new_key_file: Option<std::path::PathBuf>,
        /// The new master key, in environment variable VAR.
        #[arg(long, value_name = "VAR", conflicts_with = "new_kms_key_id")]
        new_key_env: Option<String>,
        /// The new master key: AWS KMS key KEY.
        #[arg(long, value_name = "KEY")]
        new_kms_key_id: Option<String>,
        /// The new KMS key's endpoint (default: --kms-endpoint, AWS_ENDPOINT_URL_KMS, the region's).
        #[arg(long, value_name = "URL")]
        new_kms_endpoint: Option<String>,
    },
}

/// The storage node's token from the environment variable `var`.
fn node_token(var: &str) -> Result<String> {
    match std::env::var(var) {
        Ok(t) if !t.trim().is_empty() => Ok(t),
        _ => anyhow::bail!("the storage node's token is not set: export {var}=<token> (the same on the node and its callers)"),
    }
}

/// Opens the database: one engine, which the shell and the benchmarks
/// connect one session to and the server one per connection.
async fn open(db: &DbArgs) -> Result<Engine> {
    open_with(db, EngineOptions::default()).await
}

/// [`open`] starting from `options` (a worker's: never creates a database).
async fn open_with(db: &DbArgs, mut options: EngineOptions) -> Result<Engine> {
    if let Some(mib) = db.chunk_mib {
        options.set("chunk-mib", &mib.to_string()).map_err(|e| anyhow::anyhow!("--{e}"))?;
    }
    db.engine.apply(&mut options)?;
    Engine::open(&db.db, &db.store.options(), options).await.with_context(|| format!("cannot open database {}", db.db))
}

/// `blobhouse verify`: checks the whole database, with a progress bar on a
/// terminal; exit 1 when anything is damaged.
/// `blobhouse keys show|rotate`.
async fn keys(cmd: KeysCommand) -> Result<ExitCode> {
    match cmd {
        KeysCommand::Show { db } => {
            let location = blobhouse_storage::open_location(&db.db, &db.store_options()).with_context(|| format!("cannot open database {}", db.db))?;
            let marker = blobhouse_storage::encryption::Keyring::marker(&location).await.with_context(|| format!("cannot open database {}", db.db))?;
            match blobhouse_storage::encryption::Keyring::newest(&location, &marker).await? {
                None => println!("{} is not encrypted", db.db),
                Some(k) => println!(
                    "{} is encrypted (AES-256-GCM): keyring {} of {}, database key wrapped by the {} master key {}",
                    db.db,
                    k.number,
                    blobhouse_storage::format::format_ms(k.created_at_ms),
                    k.provider,
                    k.master_key
                ),
            }
            Ok(ExitCode::SUCCESS)
        }
        KeysCommand::Rotate { db, new_key_file, new_key_env, new_kms_key_id, new_kms_endpoint } => {
            let new = match (new_key_file, new_key_env, new_kms_key_id) {
                (Some(path), _, _) => KeySpec::File { path },
                (_, Some(var), _) => KeySpec::Env { var },
                (_, _, Some(key_id)) => KeySpec::AwsKms { key_id, endpoint: new_kms_endpoint.or_else(|| db.store.key.kms_endpoint.clone()), region: None },
                _ => anyhow::bail!("name the new master key: --new-key-file FILE, --new-key-env VAR or --new-kms-key-id KEY"),
            };
            let engine = open_with(&db, EngineOptions { create_missing: false, ..EngineOptions::default() }).await?;
            let keyring = engine.database().keyring().ok_or_else(|| anyhow::anyhow!("{} is not encrypted: there is no key to rotate", db.db))?;
            let provider = new.provider().with_context(|| "the new master key".to_string())?;
            let number = keyring.rotate(engine.database().location(), provider.as_ref()).await.with_context(|| format!("cannot rotate the key of {}", db.db))?;
            println!("{}: keyring {number} wraps the database key with {} (was {}); open it with the new key from now on", db.db, provider.key_id(), keyring.master_key());
            Ok(ExitCode::SUCCESS)
        }
    }
}

async fn verify(args: &VerifyArgs) -> Result<ExitCode> {
    use std::io::IsTerminal;
    let engine = open_with(&args.db, EngineOptions { create_missing: false, ..EngineOptions::default() }).await?;
    let bar = if std::io::stderr().is_terminal() { ProgressBar::new(0) } else { ProgressBar::hidden() };
    bar.set_style(ProgressStyle::with_template("  verify [{bar:30}] {pos}/{len} objects {msg}").expect("valid template").progress_chars("=> "));
    let progress = |p: blobhouse_storage::verify::VerifyProgress| {
        bar.set_length(p.total);
        bar.set_position(p.done);
        bar.set_message(format!("{:.1} MiB read", p.bytes as f64 / (1 << 20) as f64));
    };
    let report = blobhouse_storage::verify::verify(engine.database(), &progress).await.with_context(|| format!("cannot verify {}", args.db.db))?;
    bar.finish_and_clear();
    println!(
        "checked {} versions, {} GC lists, {} manifests, {} deletion vectors and {} data objects ({:.1} MiB) of {}",
        report.versions,
        report.gc_lists,
        report.manifests,
        report.vectors,
        report.data_objects,
        report.bytes as f64 / (1 << 20) as f64,
        args.db.db
    );
    if report.unchecked > 0 {
        println!("{} objects were written before checksums were kept: only their structure was checked", report.unchecked);
    }
    if report.damaged.is_empty() {
        println!("no damage found");
        return Ok(ExitCode::SUCCESS);
    }
    for d in &report.damaged {
        println!("DAMAGED {}: {}", d.object, d.reason);
    }
    println!(
        "{} damaged or missing objects: queries that read them fail. Restore them from a copy of the bucket (or a snapshot's versions), or drop the tables that reference them",
        report.damaged.len()
    );
    Ok(ExitCode::from(1))
}

/// Progress bars for a TPC-H load, one per table.
pub fn load_progress() -> (MultiProgress, blobhouse_bench::tpch::Progress) {
    let multi = MultiProgress::new();
    let style = ProgressStyle::with_template("  {prefix:>9} [{bar:30}] {pos:>10}/{len:10} rows {msg}").expect("valid template").progress_chars("=> ");
    let bars: std::collections::HashMap<&'static str, ProgressBar> = blobhouse_bench::tpch::TABLES
        .iter()
        .map(|t| {
            let b = multi.add(ProgressBar::new(0));
            b.set_style(style.clone());
            b.set_prefix(*t);
            (*t, b)
        })
        .collect();
    let progress: blobhouse_bench::tpch::Progress = Arc::new(move |table: &str, done: u64, total: u64| {
        if let Some(b) = bars.get(table) {
            b.set_length(total);
            b.set_position(done);
            if done == total && total > 0 {
                b.finish_with_message("committed");
            }
        }
    });
    (multi, progress)
}

async fn run(cli: Cli, config_users: Vec<(String, String, usize)>) -> Result<ExitCode> {
    match cli.command {
        Command::Demo(args) => demo::run(args).await,
        Command::Sql(args) => {
            let engine = open(&args.db).await?;
            let _workers = args.cluster.install(&engine, &args.db).await?;
            let session = engine.connect();
            let mut shell = shell::Shell::new(&session, args.format);
            if let Some(sql) = &args.command {
                shell.run_script(sql).await?;
            } else if let Some(file) = &args.file {
                let sql = std::fs::read_to_string(file).with_context(|| format!("cannot read {}", file.display()))?;
                shell.run_script(&sql).await.with_context(|| format!("{}", file.display()))?;
            } else {
                shell.interactive(&args.db.db).await?;
            }
            if let Some(workers) = &_workers {
                cluster::report_peaks(workers);
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Gc(args) => {
            blobhouse_storage::gc::parse_interval(&args.retain).map_err(|e| anyhow::anyhow!("--retain: {e}"))?;
            blobhouse_storage::gc::parse_interval(&args.grace).map_err(|e| anyhow::anyhow!("--grace: {e}"))?;
            let session = open(&args.db).await?.connect();
            let quoted = |s: &str| s.replace('\'', "");
            let sql = format!("VACUUM RETAIN '{}' GRACE '{}'{}", quoted(&args.retain), quoted(&args.grace), if args.dry_run { " DRY RUN" } else { "" });
            shell::Shell::new(&session, output::Format::Table).run_script(&sql).await?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Verify(args) => verify(&args).await,
        Command::Keys(cmd) => keys(cmd).await,
        Command::Bench(cmd) => {
            bench::run(cmd).await?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Serve(args) => {
            let mut users = blobhouse_server::Users::new();
            if let Some(name) = &args.user {
                let password = std::env::var("BLOBHOUSE_PASSWORD").map_err(|_| anyhow::anyhow!("--user {name}: set the password in the environment variable BLOBHOUSE_PASSWORD"))?;
                users.add_password(name, &password)?;
            }
            for (name, hash, line) in &config_users {
                let file = args.config.as_deref().unwrap_or(std::path::Path::new("the config file"));
                users.add_hash(name, hash).with_context(|| format!("config file {} line {line}", file.display()))?;
            }
            if let Some(file) = &args.users_file {
                let text = std::fs::read_to_string(file).with_context(|| format!("cannot read the users file {}", file.display()))?;
                for (n, line) in text.lines().enumerate() {
                    let line = line.trim();
                    if line.is_empty() || line.starts_with('#') {
                        continue;
                    }
                    let (name, hash) = line.split_once(':').ok_or_else(|| anyhow::anyhow!("{} line {}: expected name:hash", file.display(), n + 1))?;
                    users.add_hash(name.trim(), hash).with_context(|| format!("{} line {}", file.display(), n + 1))?;
                }
            }
            let tls = match (&args.tls_cert, &args.tls_key) {
                (Some(cert), Some(key)) => Some(blobhouse_server::TlsFiles { cert: cert.clone(), key: key.clone() }),
                _ => None,
            };
            use std::io::IsTerminal;
            // blobhouse's own events at the chosen level; the libraries under
            // it (h2, tonic, hyper) only warn: their debug output is frames.
            use tracing_subscriber::layer::SubscriberExt;
            use tracing_subscriber::util::SubscriberInitExt;
            let filter = tracing_subscriber::filter::Targets::new()
                .with_target("blobhouse", args.log_level)
                .with_default(args.log_level.min(tracing_subscriber::filter::LevelFilter::WARN));
            let format = tracing_subscriber::fmt::layer().with_writer(std::io::stderr).with_ansi(std::io::stderr().is_terminal()).with_target(false);
            tracing_subscriber::registry().with(filter).with(format).init();
            let options = blobhouse_server::ServerOptions {
                pg_listen: args.pg_listen,
                flight_listen: args.flight_listen.0,
                tls: tls.clone(),
                users,
                max_connections: args.max_connections,
                execution_threads: 0,
                max_queries: args.max_queries,
                slow_query: std::time::Duration::from_millis(args.slow_query_ms),
                metrics_listen: args.metrics_listen,
                metrics_token: match &args.metrics_token_env {
                    Some(var) => match std::env::var(var) {
                        Ok(t) if !t.trim().is_empty() => Some(t.trim().to_string()),
                        _ => anyhow::bail!("--metrics-token-env {var}: the variable is not set; export {var}=<token> (the one your scraper sends)"),
                    },
                    None => None,
                },
                files: match args.allow_files.iter().any(|p| p == "*") {
                    true => blobhouse_engine::FileAccess::anywhere(),
                    false => blobhouse_engine::FileAccess::only(&args.allow_files),
                },
            };
            let engine = open(&args.db).await?;
            let _workers = args.cluster.install(&engine, &args.db).await?;
            let server = blobhouse_server::Server::start(engine, options).await?;
            eprintln!(
                "serving {} to PostgreSQL clients on {}{}{}{}; Ctrl-C stops it",
                args.db.db,
                server.pg_addr(),
                server.flight_addr().map_or(String::new(), |a| format!(", Flight SQL clients on grpc{}://{a}", if tls.is_some() { "+tls" } else { "" })),
                if tls.is_some() { " (TLS required)" } else { "" },
                server.metrics_addr().map_or(String::new(), |a| format!(", metrics on http://{a}/metrics"))
            );
            tokio::select! {
                _ = server.wait() => {}
                _ = tokio::signal::ctrl_c() => eprintln!("stopping"),
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::HashPassword => {
            let mut password = String::new();
            std::io::stdin().read_line(&mut password).context("cannot read the password from standard input")?;
            let password = password.trim_end_matches(['\r', '\n']);
            if password.is_empty() {
                anyhow::bail!("the password on standard input is empty");
            }
            println!("{}", blobhouse_server::hash_password(password));
            Ok(ExitCode::SUCCESS)
        }
        Command::StorageNode(args) => {
            let location = blobhouse_storage::open_location(&args.db, &args.store.options()).with_context(|| format!("cannot open database {}", args.db))?;
            let mut opts = NodeOptions::new(node_token(&args.token_env)?);
            if let Some(n) = args.max_tasks {
                opts.max_tasks = n;
            }
            opts.max_queued = args.max_queued.unwrap_or(opts.max_tasks);
            opts.compression = args.compression;
            if let (Some(cert), Some(key)) = (&args.tls_cert, &args.tls_key) {
                let read = |f: &std::path::Path| std::fs::read(f).with_context(|| format!("cannot read {}", f.display()));
                opts.tls = Some(blobhouse_pushdown::NodeTls { cert: read(cert)?, key: read(key)? });
            }
            let node = StorageNode::new(location, opts.clone()).map_err(|e| anyhow::anyhow!(e))?;
            let listener = tokio::net::TcpListener::bind(args.listen).await.with_context(|| format!("cannot listen on {}", args.listen))?;
            if opts.tls.is_none() && !args.listen.ip().is_loopback() {
                eprintln!("warning: serving plaintext on {}: the token and the rows travel unencrypted; give --tls-cert and --tls-key", args.listen);
            }
            eprintln!(
                "storage node for {} on {}://{} ({} task slots, {} queued, replies {:?}); Ctrl-C stops it",
                args.db,
                if opts.tls.is_some() { "https" } else { "http" },
                listener.local_addr()?,
                opts.max_tasks,
                opts.max_queued,
                opts.compression
            );
            node.serve(listener, async {
                let _ = tokio::signal::ctrl_c().await;
            })
            .await
            .map_err(|e| anyhow::anyhow!(e))?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Worker(args) => cluster::worker(args).await,
        Command::Testbed(cmd) => {
            testbed::run(cmd)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Load(LoadCommand::Tpch { sf, db }) => {
            let engine = open(&db).await?;
            eprintln!("Loading TPC-H SF {sf} into {}", engine.database().location().url);
            let session = engine.connect();
            let (_multi, progress) = load_progress();
            let started = std::time::Instant::now();
            let loads = blobhouse_bench::tpch::load(&session, sf, progress).await.context("TPC-H load failed; no partially loaded table was committed")?;
            let bytes: u64 = loads.iter().map(|l| l.bytes).sum();
            let rows: u64 = loads.iter().map(|l| l.rows).sum();
            eprintln!("Loaded {rows} rows, {:.1} MiB of Parquet, in {:.1} s", bytes as f64 / 1048576.0, started.elapsed().as_secs_f64());
            Ok(ExitCode::SUCCESS)
        }
        Command::Load(LoadCommand::Ssb { sf, db }) => {
            let engine = open(&db).await?;
            eprintln!("Loading SSB SF {sf} into {}", engine.database().location().url);
            let session = engine.connect();
            let (_multi, progress) = load_progress();
            let started = std::time::Instant::now();
            blobhouse_bench::ssb::load(&session, sf, progress).await.context("SSB load failed: the database may hold some of its tables; load into a new database")?;
            eprintln!("Loaded SSB's {} tables in {:.1} s", blobhouse_bench::ssb::TABLES.len(), started.elapsed().as_secs_f64());
            Ok(ExitCode::SUCCESS)
        }
    }
}

fn main() -> ExitCode {
    let (argv, config) = match with_serve_config(std::env::args_os().collect()) {
        Ok(expanded) => expanded,
        Err(e) => {
            eprintln!("error: {e:#}");
            return ExitCode::FAILURE;
        }
    };
    let parsed = Cli::command().try_get_matches_from(argv).and_then(|m| Cli::from_arg_matches(&m).map(|cli| (cli, threads_of(&m))));
    let (cli, threads) = match parsed {
        Ok(parsed) => parsed,
        Err(e) => {
            // A bad value may have come from the file: say where to look.
            if let Some(path) = config.as_ref().map(|c| &c.path).filter(|_| e.use_stderr()) {
                eprintln!("note: serve's settings include those of the config file {}", path.display());
            }
            e.exit()
        }
    };
    let users = config.map(|c| c.users).unwrap_or_default();
    // Opt-in: resident memory down by half between queries, ~7 % slower
    // warm (docs/memory.md, "Freed memory").
    if std::env::var("BLOBHOUSE_RETURN_FREED_MEMORY").is_ok_and(|v| v == "1" || v.eq_ignore_ascii_case("true")) {
        blobhouse_engine::memory::configure_allocator();
    }
    let mut runtime = tokio::runtime::Builder::new_multi_thread();
    if let Some(threads) = threads {
        // --threads sizes the runtime too, so nothing runs on more cores than asked.
        runtime.worker_threads(threads);
    }
    let runtime = runtime.enable_all().build().expect("tokio runtime");
    match runtime.block_on(run(cli, users)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {}", report(&e));
            ExitCode::FAILURE
        }
    }
}

/// An error and its causes on one line, as anyhow's `{:#}` prints them,
/// but ending at a store error: it already shows the store's answer in
/// short, and its causes (object_store's retry error, reqwest's, hyper's)
/// would repeat the URL and the reply several times over.
fn report(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if !out.contains(&text) {
            if !out.is_empty() {
                out.push_str(": ");
            }
            out.push_str(&text);
        }
        let storage = cause.downcast_ref::<blobhouse_storage::StorageError>().or_else(|| match cause.downcast_ref::<blobhouse_engine::EngineError>() {
            Some(blobhouse_engine::EngineError::Storage(s)) => Some(s),
            _ => None,
        });
        if matches!(storage, Some(blobhouse_storage::StorageError::Store { .. })) {
            break;
        }
    }
    out
}

/// The `--threads` of whichever command was given (its engine's flags).
fn threads_of(matches: &clap::ArgMatches) -> Option<usize> {
    let own = matches.try_get_one::<u16>("threads").ok().flatten().map(|t| usize::from(*t));
    own.or_else(|| matches.subcommand().and_then(|(_, sub)| threads_of(sub)))
}

/// `blobhouse serve --config FILE`: the file's settings as flags placed
/// before the command line's (so that the command line's win), and its
/// users. Done before parsing, so that a setting required on the command
/// line (`--db`) may come from the file.
fn with_serve_config(mut argv: Vec<std::ffi::OsString>) -> Result<(Vec<std::ffi::OsString>, Option<config::ServeConfig>)> {
    if argv.get(1).is_none_or(|a| a != "serve") {
        return Ok((argv, None));
    }
    let given = argv.iter().enumerate().skip(2).find_map(|(i, a)| {
        let a = a.to_str()?;
        match a.strip_prefix("--config") {
            Some("") => argv.get(i + 1).map(std::path::PathBuf::from),
            Some(rest) => rest.strip_prefix('=').map(std::path::PathBuf::from),
            None => None,
        }
    });
    let Some(path) = given.or_else(|| std::env::var_os("BLOBHOUSE_CONFIG").filter(|v| !v.is_empty()).map(std::path::PathBuf::from)) else {
        return Ok((argv, None));
    };
    let serve = Cli::command().find_subcommand("serve").expect("serve is a subcommand").clone();
    let flags: Vec<(String, bool)> = serve.get_arguments().filter_map(|a| Some((a.get_long()?.to_string(), a.get_action().takes_values()))).collect();
    let mut config = config::load(&path, &flags)?;
    if let Some(w) = &config.warning {
        eprintln!("warning: {w}");
    }
    argv.splice(2..2, std::mem::take(&mut config.args));
    Ok((argv, Some(config)))
}
