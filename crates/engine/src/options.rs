//! [`EngineOptions`]: how an engine is opened — writes, scans, memory,
//! spill, caches and pushdown — and the DataFusion settings derived from them.

use std::path::PathBuf;
use std::time::Duration;

use blobhouse_io::ManagerOptions;
use blobhouse_storage::WriteOptions;

use crate::chunks::RequestPolicy;
use crate::memory;
use crate::scheduler::SchedulerOptions;


/// Engine settings.
#[derive(Debug, Clone)]
pub struct EngineOptions {
    /// How new data objects are written.
    pub write: WriteOptions,
    /// How scans cut their reads into requests.
    pub requests: RequestPolicy,
    /// How scans pace their downloads (the object scheduler).
    pub scan: SchedulerOptions,
    /// Parallelism of query execution (default: the number of cores).
    pub target_partitions: usize,
    /// Rows per record batch in execution.
    pub batch_size: usize,
    /// The download manager for data reads from object stores; `None`
    /// reads them through object_store.
    pub download: Option<ManagerOptions>,
    /// The engine's memory budget ([`crate::memory`]): everything big it
    /// holds — query operators (hash tables, sorts, aggregates, repartition
    /// queues), the scans' fetched-ahead row groups, decoded footers —
    /// shares this many bytes. Beyond it operators spill where DataFusion
    /// can, and otherwise the query fails with an error naming the largest
    /// consumers, rather than the kernel killing the process. Default: half
    /// the machine's memory; `None`: no limit (still accounted). Changed
    /// at run time by `SET memory_limit = '4G'`.
    pub memory_limit: Option<usize>,
    /// Where operators spill, and how much.
    pub spill: SpillOptions,
    /// How long this engine hands out object keys from one declared key
    /// block (`blobhouse_storage::keys`): crash recovery can collect a dead
    /// engine's uploads only after that. Default 10 minutes.
    pub key_block_ttl: Duration,
    /// The caching tiers (`crate::tiers`): a memory tier of a quarter of
    /// the memory limit by default, no SSD tier unless a directory is given.
    pub cache: crate::tiers::CacheOptions,
    /// The storage node scans push work to (`crate::hybrid`); `None`: no
    /// pushdown.
    pub pushdown: Option<crate::hybrid::PushdownOptions>,
    /// Create the database when its location holds none (default). A
    /// process that only serves an existing one (a cluster worker) says
    /// no: a mistyped URL then fails, naming it, instead of creating an
    /// empty database that answers every query with "no such table".
    pub create_missing: bool,
    /// Keep a log of every request sent for files queried in place
    /// ([`crate::Engine::file_requests`]): tests and benchmarks count them.
    /// Off by default (the log grows with every request).
    pub record_file_requests: bool,
}

/// The local directory that sorts, aggregations and sort-merge joins spill
/// to when the memory limit is reached.
#[derive(Debug, Clone)]
pub struct SpillOptions {
    /// Spill files go into a fresh subdirectory of this one, removed with
    /// the engine; each file is deleted as soon as its operator is done or
    /// dropped (a finished, failed or cancelled query leaves nothing).
    /// `None`: the system's temporary directory.
    pub dir: Option<PathBuf>,
    /// Most bytes of spill files at once; a query that would spill more
    /// fails with "Resources exhausted" naming the limit.
    pub max_bytes: u64,
    /// Whether an encrypted database may spill. Spill files hold rows in
    /// plaintext (DataFusion's Arrow IPC), so by default an encrypted
    /// database does not spill: a query that would fails naming its memory
    /// limit, and nothing of the data is written to local disk in the clear.
    pub allow_plaintext: bool,
}

impl Default for SpillOptions {
    fn default() -> Self {
        SpillOptions { dir: None, max_bytes: 100 << 30, allow_plaintext: false }
    }
}



impl Default for EngineOptions {
    fn default() -> Self {
        EngineOptions {
            write: WriteOptions::default(),
            requests: RequestPolicy::default(),
            scan: SchedulerOptions::default(),
            target_partitions: std::thread::available_parallelism().map(|n| n.get()).unwrap_or(2),
            batch_size: 8192,
            download: Some(scan_download_options()),
            memory_limit: Some(memory::default_limit()),
            spill: SpillOptions::default(),
            key_block_ttl: blobhouse_storage::keys::DEFAULT_BLOCK_TTL,
            cache: crate::tiers::CacheOptions::default(),
            pushdown: None,
            create_missing: true,
            record_file_requests: false,
        }
    }
}

impl EngineOptions {
    /// The names [`EngineOptions::set`] takes: the CLI's flags without the
    /// dashes, the Python package's keyword arguments.
    pub const SETTABLE: [&'static str; 10] = [
        "threads", "memory_limit", "spill_dir", "spill_limit", "allow_plaintext_spill",
        "cache_memory", "cache_decoded_ratio", "cache_dir", "cache_ssd_size", "chunk_mib",
    ];

    /// Sets the option `name` (one of [`EngineOptions::SETTABLE`]; `-` may
    /// stand for `_`) from its text, as the CLI's flag of that name and
    /// the Python package's `connect(…, name=value)` give it — one parser,
    /// so both accept and refuse the same values. The error names the
    /// option and says what it takes.
    pub fn set(&mut self, name: &str, value: &str) -> Result<(), String> {
        let key = name.replace('-', "_");
        let bad = |why: String| format!("{key}: {why}");
        match key.as_str() {
            "threads" => {
                let n: usize = value.trim().parse().map_err(|_| bad(format!("'{value}' is not a number of threads")))?;
                if !(1..=1024).contains(&n) {
                    return Err(bad(format!("{n} threads: give 1 to 1024")));
                }
                self.target_partitions = n;
            }
            "memory_limit" => self.memory_limit = memory::parse_limit(value).map_err(bad)?,
            "spill_dir" => self.spill.dir = Some(PathBuf::from(value)),
            "spill_limit" => self.spill.max_bytes = memory::parse_size(value).map_err(bad)?,
            "allow_plaintext_spill" => self.spill.allow_plaintext = parse_switch(value).map_err(bad)?,
            "cache_memory" => self.cache.memory = Some(crate::tiers::parse_cache_size(value).map_err(bad)?),
            "cache_decoded_ratio" => {
                let ratio: f64 = value.trim().parse().map_err(|_| bad(format!("'{value}' is not a number")))?;
                if !(ratio.is_finite() && ratio >= 0.0) {
                    return Err(bad(format!("{ratio}: give a ratio of sizes, 0 or more (0: always compressed)")));
                }
                self.cache.decoded_max_ratio = ratio;
            }
            "cache_dir" => self.cache.ssd_dir = Some(PathBuf::from(value)),
            "cache_ssd_size" => self.cache.ssd_capacity = memory::parse_size(value).map_err(bad)?,
            "chunk_mib" => {
                let mib: usize = value.trim().parse().map_err(|_| bad(format!("'{value}' is not a number of MiB")))?;
                if mib == 0 {
                    return Err(bad("give at least 1 MiB".into()));
                }
                self.write.target_chunk_bytes = mib << 20;
            }
            _ => return Err(format!("unknown option '{name}'; the engine's options are {}", Self::SETTABLE.join(", "))),
        }
        Ok(())
    }
}

/// A switch's text: true/false, on/off, yes/no, 1/0.
fn parse_switch(value: &str) -> Result<bool, String> {
    match value.trim().to_ascii_lowercase().as_str() {
        "true" | "on" | "yes" | "1" => Ok(true),
        "false" | "off" | "no" | "0" => Ok(false),
        _ => Err(format!("'{value}' is not a switch: write true or false")),
    }
}

/// The download manager as scans use it: the object scheduler decides the
/// bytes each scan keeps in flight from the scan's own view of retrieval
/// and processing, so the manager does not pace on top of it with its own
/// latency model and link probe (two controllers in series: the manager's
/// slow start held short queries to 16 requests for half a second). It
/// still caps requests in flight and memory, hedges and retries.
pub fn scan_download_options() -> ManagerOptions {
    let mut o = ManagerOptions::default();
    o.loop_options.concurrency = None;
    o.loop_options.max_in_flight = 512;
    o
}

/// The largest hash-join build side (decoded bytes) that is built once
/// and shared by all partitions rather than built per partition: 64 MiB
/// divided by the partitions, never under 8 MiB.
///
/// A shared table is built by one thread while the partitions wait for it;
/// a partitioned join builds in parallel but first repartitions both sides
/// — hashing and copying every probe row — and its runtime filter is a
/// `CASE` over the partition of each probe row. The fewer the partitions,
/// the larger each one's share of that repartitioning and the fewer cores
/// sit idle during a shared build. Measured on 2 threads, TPC-H SF 10,
/// one-shot (docs/performance.md): 32 MiB against 8 MiB made the 22
/// queries 0.90× as long (geomean; Q22 0.60, Q4 0.71, Q17 0.78, none
/// slower by more than 2 %). From 8 partitions on it is 8 MiB, the value
/// the 16-core sweep was measured with; 4 partitions (16 MiB) are
/// interpolated, not yet measured on a 4-core machine.
pub(crate) fn collect_left_bytes(partitions: usize) -> usize {
    (COLLECT_LEFT_SHARED_BYTES / partitions.max(1)).max(COLLECT_LEFT_MIN_BYTES)
}

const COLLECT_LEFT_SHARED_BYTES: usize = 64 << 20;
const COLLECT_LEFT_MIN_BYTES: usize = 8 << 20;

/// The share of its input rows a partial aggregation's groups may reach
/// before it stops aggregating (DataFusion's
/// `skip_partial_aggregation_probe_ratio_threshold`, 0.8 by default): see
/// where the engine sets it.
pub(crate) const SKIP_PARTIAL_AGGREGATION_RATIO: f64 = 0.1;

/// The name of the database's DataFusion catalog (its tables are
/// `blobhouse.public.name`): what PostgreSQL clients see as the database.
pub const CATALOG: &str = "blobhouse";

/// What each sort sets aside to merge its spill files: DataFusion's 10 MiB,
/// less under a small limit (a 64th of it, at least 1 MiB). A sort-merge
/// join sorts both inputs in every partition at once, so at 10 MiB each a
/// 96 MiB limit had no room left to sort anything.
pub(crate) fn sort_merge_reservation(limit: Option<usize>) -> usize {
    const DATAFUSION_DEFAULT: usize = 10 << 20;
    limit.map_or(DATAFUSION_DEFAULT, |l| (l / 64).clamp(1 << 20, DATAFUSION_DEFAULT))
}

#[cfg(test)]
mod tests {
    use super::{EngineOptions, collect_left_bytes};

    #[test]
    fn options_are_set_by_name_and_mistakes_are_named() {
        let mut o = EngineOptions::default();
        o.set("threads", "3").unwrap();
        o.set("memory-limit", "2G").unwrap();
        o.set("chunk_mib", "4").unwrap();
        o.set("allow_plaintext_spill", "on").unwrap();
        assert_eq!((o.target_partitions, o.memory_limit, o.write.target_chunk_bytes, o.spill.allow_plaintext), (3, Some(2 << 30), 4 << 20, true));
        o.set("memory_limit", "none").unwrap();
        assert_eq!(o.memory_limit, None);
        assert!(o.set("threads", "0").unwrap_err().starts_with("threads: 0 threads"));
        assert!(o.set("memory_limit", "lots").unwrap_err().starts_with("memory_limit: 'lots' is not a size"));
        assert!(o.set("cache_decoded_ratio", "-1").unwrap_err().contains("0 or more"));
        let unknown = o.set("memroy_limit", "1G").unwrap_err();
        assert!(unknown.contains("unknown option 'memroy_limit'") && unknown.contains("memory_limit"), "{unknown}");
    }

    #[test]
    fn shared_hash_tables_shrink_with_the_partitions_to_a_floor() {
        assert_eq!(collect_left_bytes(0), 64 << 20);
        assert_eq!(collect_left_bytes(1), 64 << 20);
        assert_eq!(collect_left_bytes(2), 32 << 20);
        assert_eq!(collect_left_bytes(4), 16 << 20);
        assert_eq!(collect_left_bytes(8), 8 << 20);
        assert_eq!(collect_left_bytes(64), 8 << 20);
    }
}
