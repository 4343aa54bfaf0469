//! The running scan: one fetcher downloads row groups under the object
//! scheduler's budget; the query's partitions take whichever row group
//! arrived first and decode it as they consume it.
//!
//! ```text
//!  planned units ──► fetcher ──(≤ target bytes in flight, ≤ memory undelivered)──► download manager
//!                       │ arrivals, in the order they complete
//!                       ▼
//!              cut into morsels (pieces of its rows, [`morsel`])
//!                       ▼
//!                 ready queue ──► partition 0: decode batch, hand on, decode …
//!                             ──► partition 1: …
//! ```
//!
//! Why one queue for all partitions: a slow request then delays only its
//! own row group, never a partition that has other data to work on (the
//! morsel-driven hand-off of Umbra). Why decode in the consumer's poll:
//! decoding is part of processing, so the time between two polls of a
//! partition is exactly what the scheduler needs to know about the query's
//! speed, and only one morsel per partition is ever decoded at a time. Why
//! morsels smaller than a row group: row groups are sized for the store's
//! requests, and a scan may have fewer of them than the machine has cores.
//!
//! Memory: what a scan holds — bytes in flight, row groups downloaded and
//! not yet taken, the row group each partition decodes — is a reservation
//! in the engine's budget ([`crate::memory`]), named `BlobScan[table]`.
//! A download starts only while the budget has room for it beyond a quarter
//! of the limit kept for the operators, so scans shrink what they fetch
//! ahead when hash tables and sorts need the memory, and the scheduler's
//! own cap ([`SchedulerOptions::memory`]) is a per-scan ceiling within it.
//! Beyond the bytes the scheduler wants in flight, a scan fetches ahead
//! only while fewer than two morsels per partition wait, so a store faster
//! than the query does not fill memory with data nobody is ready for; a
//! local or in-memory store, with no round trip to hide, reads at most one
//! row group per partition at a time.
//! One row group may always be read, so a scan never stalls for good.
//!
//! Cancellation: dropping every partition stream (a LIMIT reached, an
//! error elsewhere) drops the fetcher, whose pending downloads are then
//! cancelled in the download manager.

mod counters;
mod decode;
mod fetch;
mod morsel;
mod queue;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use datafusion::common::runtime::SpawnedTask;
use datafusion::execution::memory_pool::{MemoryConsumer, MemoryLimit, MemoryPool, MemoryReservation};
use tokio::sync::Notify;

use crate::chunks::FetchedChunks;
use crate::runtime_filter::RuntimeFilters;
use crate::scan::ScanUnit;
use crate::scheduler::{Controller, EpochStats, SchedulerOptions};
use crate::source::DataSource;
use crate::tiers::{DecodedChunk, DecodedFills};
use crate::zone_maps::ZoneMaps;

pub(crate) use counters::{CpuSpan, ScanCounters};
use fetch::{Skipper, fetch_all};
use queue::{Producer, ReadyQueue};

/// A downloaded row group waiting for a partition.
struct Arrived {
    unit: ScanUnit,
    data: UnitData,
    at: Instant,
}

/// A unit's column chunks as they came.
struct UnitData {
    /// Those in Parquet form, for the decoder.
    compressed: FetchedChunks,
    /// (index in the unit's chunks, chunk) of those the memory tier held
    /// decoded.
    decoded: Vec<(usize, Arc<DecodedChunk>)>,
    /// Those the memory tier waits for decoded (their bytes are among
    /// `compressed`).
    fills: Option<DecodedFills>,
}

/// What the fetcher and the partitions share.
struct Shared {
    opts: SchedulerOptions,
    partitions: usize,
    /// Reads go over a network (the download manager), where bytes in
    /// flight hide round trips; else a local or in-memory store.
    networked: bool,
    in_flight: AtomicU64,
    /// Downloaded, not yet taken by a partition (a row group's bytes are
    /// shared out among its morsels).
    ready_bytes: AtomicU64,
    /// Morsels downloaded and not yet taken.
    ready_units: AtomicUsize,
    /// A partition took a row group (budget freed), or asked for data for
    /// the first time (the prefetch limit lifted).
    space: Notify,
    /// Some partition has asked for data.
    polled: AtomicBool,
    epoch: EpochCounters,
    counters: ScanCounters,
    /// The engine's budget, and this scan's share of it: bytes in flight,
    /// ready, and being decoded.
    pool: Arc<dyn MemoryPool>,
    reservation: MemoryReservation,
}

/// Of the engine's memory limit, the share scans may fill with data fetched
/// ahead; the rest stays for the operators above them.
const SCAN_SHARE_NUM: usize = 3;
const SCAN_SHARE_DEN: usize = 4;

/// Morsels that may wait for each partition before the scan stops
/// fetching beyond the scheduler's target ([`Shared::few_morsels_waiting`]).
const WAITING_MORSELS_PER_PARTITION: usize = 2;

/// The current epoch's statistics, as atomics (updated per batch).
#[derive(Default)]
struct EpochCounters {
    retrieved: AtomicU64,
    processed: AtomicU64,
    processing_nanos: AtomicU64,
    requests: AtomicU64,
    request_nanos: AtomicU64,
    /// Bit i: partition i (mod 64) consumed something.
    partitions: AtomicU64,
}

impl Shared {
    /// Whether a row group of `bytes` may start downloading now.
    fn may_start(&self, ctl: &Controller, bytes: u64, running: usize) -> bool {
        let in_flight = self.in_flight.load(Ordering::Relaxed);
        let held = in_flight + self.ready_bytes.load(Ordering::Relaxed);
        if !self.opts.adaptive {
            // Fixed policy: one row group ahead per partition.
            return running + self.ready_units.load(Ordering::Relaxed) < self.partitions;
        }
        // Until the query asks for this scan, only a head start.
        let limit = if self.polled.load(Ordering::Relaxed) { self.opts.memory } else { self.opts.prefetch.min(self.opts.memory) };
        // Always allow one, so a row group larger than the budget still runs.
        let room = (held + bytes <= limit || held == 0) && (held == 0 || self.pool_has_room(bytes));
        if !self.networked {
            // A local or in-memory store has no round trip to hide: a read
            // takes as long as its bytes take to copy, and reads beyond one
            // per partition only queue behind each other, each measured
            // "latency" growing with the bytes in flight (so Little's law
            // would ask for ever more). Data beyond the morsels waiting for
            // the partitions is memory spent early.
            return room && running < self.partitions && (held == 0 || self.few_morsels_waiting());
        }
        room && (in_flight + bytes <= ctl.target_bytes() || in_flight == 0) && (held + bytes <= ctl.target_bytes() || self.few_morsels_waiting())
    }

    /// Whether fewer than two morsels per partition wait: each partition
    /// finds its next one, and the one after it. Beyond the bytes the
    /// scheduler wants in flight to keep the link busy, data that arrived
    /// and waits for a partition is memory spent before it is needed; when
    /// the store is faster than the query (a local disk, a warm cache) the
    /// ready queue would otherwise grow to the scan's memory cap — at TPC-H
    /// SF 10 all of Q1's 400 MB, each row group waiting 0.6 s on average for
    /// a partition.
    fn few_morsels_waiting(&self) -> bool {
        self.ready_units.load(Ordering::Relaxed) < WAITING_MORSELS_PER_PARTITION * self.partitions
    }

    /// Whether the engine's budget has room for `bytes` more of fetched-ahead
    /// data, leaving the operators their share of the limit.
    fn pool_has_room(&self, bytes: u64) -> bool {
        match self.pool.memory_limit() {
            MemoryLimit::Finite(limit) => self.pool.reserved().saturating_add(bytes as usize) <= limit / SCAN_SHARE_DEN * SCAN_SHARE_NUM,
            MemoryLimit::Infinite | MemoryLimit::Unknown => true,
        }
    }

    fn processed(&self, partition: usize, bytes: u64, busy: Duration) {
        self.epoch.processed.fetch_add(bytes, Ordering::Relaxed);
        self.epoch.processing_nanos.fetch_add(busy.as_nanos() as u64, Ordering::Relaxed);
        self.epoch.partitions.fetch_or(1 << (partition % 64), Ordering::Relaxed);
    }

    fn take_epoch(&self, elapsed: Duration) -> EpochStats {
        let e = &self.epoch;
        EpochStats {
            elapsed,
            retrieved_bytes: e.retrieved.swap(0, Ordering::Relaxed),
            processed_bytes: e.processed.swap(0, Ordering::Relaxed),
            processing_time: Duration::from_nanos(e.processing_nanos.swap(0, Ordering::Relaxed)),
            partitions: e.partitions.swap(0, Ordering::Relaxed).count_ones() as usize,
            requests: e.requests.swap(0, Ordering::Relaxed),
            request_time: Duration::from_nanos(e.request_nanos.swap(0, Ordering::Relaxed)),
        }
    }
}

/// What a scan hands to [`Pipeline::start`].
pub(crate) struct ScanToRun<'a> {
    pub table: &'a str,
    pub units: Vec<ScanUnit>,
    /// The caching tiers already saw this access (a hybrid scan told them).
    pub tiers_planned: bool,
    pub partitions: usize,
    pub source: DataSource,
    pub opts: SchedulerOptions,
    pub counters: ScanCounters,
    pub cpu: Arc<CpuSpan>,
    /// With them, row groups the runtime filters exclude by their zone
    /// maps are skipped when their turn to download comes.
    pub runtime: Option<(RuntimeFilters, Arc<ZoneMaps>)>,
}

/// One execution of a scan: the fetcher and the queue its partitions read.
pub(crate) struct Pipeline {
    shared: Arc<Shared>,
    ready: Arc<ReadyQueue>,
    /// Dropping it aborts the fetcher and so cancels its downloads.
    _fetcher: SpawnedTask<()>,
}

impl Pipeline {
    /// Starts downloading the scan's units (in plan order) for its
    /// partitions, in `pool`.
    pub fn start(scan: ScanToRun<'_>, pool: &Arc<dyn MemoryPool>) -> Pipeline {
        let ScanToRun { table, units, tiers_planned, partitions, source, opts, counters, cpu, runtime } = scan;
        let reservation = MemoryConsumer::new(format!("BlobScan[{table}]")).register(pool);
        let shared = Arc::new(Shared {
            opts,
            partitions: partitions.max(1),
            networked: source.download_manager().is_some(),
            in_flight: AtomicU64::new(0),
            ready_bytes: AtomicU64::new(0),
            ready_units: AtomicUsize::new(0),
            space: Notify::new(),
            polled: AtomicBool::new(false),
            epoch: EpochCounters::default(),
            counters,
            pool: pool.clone(),
            reservation,
        });
        if let Some(tiers) = source.tiers().filter(|_| !tiers_planned) {
            // The scan's access, for the tiers' policies (one scan = one access).
            let keys: Vec<(blobhouse_cache::SegmentKey, crate::tiers::DecodedSize)> = units.iter().flat_map(ScanUnit::segments).collect();
            tiers.plan(&keys);
        }
        let ready = Arc::new(ReadyQueue::default());
        let skipper = runtime.map(|(filters, zone_maps)| Skipper { filters, zone_maps, generation: None, keep: None });
        let fetcher = SpawnedTask::spawn(fetch_all(units.into(), source, shared.clone(), Producer(ready.clone()), cpu, skipper));
        Pipeline { shared, ready, _fetcher: fetcher }
    }
}
