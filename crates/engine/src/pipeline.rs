//! The running scan: one fetcher downloads row groups under the object
//! scheduler's budget; the query's partitions take whichever row group
//! arrived first and decode it as they consume it.
//!
//! ```text
//!  planned units ──► fetcher ──(≤ target bytes in flight, ≤ memory undelivered)──► download manager
//!                       │ arrivals, in the order they complete
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
//! speed, and only one row group per partition is ever decoded at a time.
//!
//! Memory: what a scan holds — bytes in flight, row groups downloaded and
//! not yet taken, the row group each partition decodes — is a reservation
//! in the engine's budget ([`crate::memory`]), named `BlobScan[table]`.
//! A download starts only while the budget has room for it beyond a quarter
//! of the limit kept for the operators, so scans shrink what they fetch
//! ahead when hash tables and sorts need the memory, and the scheduler's
//! own cap ([`SchedulerOptions::memory`]) is a per-scan ceiling within it.
//! One row group may always be read, so a scan never stalls for good.
//!
//! Cancellation: dropping every partition stream (a LIMIT reached, an
//! error elsewhere) drops the fetcher, whose pending downloads are then
//! cancelled in the download manager.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use datafusion::arrow::array::{Array, ArrayRef, MutableArrayData, RecordBatch, RecordBatchOptions, make_array};
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::common::runtime::SpawnedTask;
use datafusion::common::{DataFusionError, Result};
use datafusion::execution::memory_pool::{MemoryConsumer, MemoryLimit, MemoryPool, MemoryReservation};
use datafusion::physical_plan::SendableRecordBatchStream;
use datafusion::physical_plan::metrics::{Count, ExecutionPlanMetricsSet, Gauge, MetricBuilder, MetricValue, Time};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use futures::StreamExt;
use futures::stream::FuturesUnordered;
use parquet::arrow::ProjectionMask;
use parquet::arrow::arrow_reader::{ParquetRecordBatchReader, ParquetRecordBatchReaderBuilder};
use roaring::RoaringBitmap;
use tokio::sync::{Notify, mpsc};

use blobhouse_storage::StorageError;
use blobhouse_storage::rows::{Positions, RowRanges, drop_deleted, row_ids};

use crate::chunks::{FetchedChunks, Span};
use crate::runtime_filter::{RowFilter, RuntimeFilters};
use crate::scan::ScanUnit;
use crate::zone_maps::ZoneMaps;
use crate::scheduler::{Controller, Decision, EpochStats, SchedulerOptions};
use crate::source::DataSource;
use crate::tiers::DecodedFills;

/// Counters of a scan, shared by its runs (global metrics of the plan node).
#[derive(Debug, Clone)]
pub(crate) struct ScanCounters {
    pub get_requests: Count,
    pub bytes_fetched: Count,
    pub row_groups_read: Count,
    pub retries: Count,
    pub hedged: Count,
    /// Sum of the requests' times to first byte.
    pub first_byte_time: Time,
    /// Sum of the row groups' download times (submit to last byte).
    pub fetch_time: Time,
    pub decode_time: Time,
    /// Rows the runtime filters dropped ([`crate::runtime_filter`]).
    pub rows_filtered: Count,
    /// Decoded rows dropped because a deletion vector deletes them.
    pub rows_deleted: Count,
    /// Row groups not downloaded because a runtime filter excludes them.
    pub row_groups_skipped: Count,
    /// Partitions waiting for a row group to arrive (the query waited on data).
    pub query_wait_time: Time,
    /// Row groups waiting for a partition to take them (data waited on the query).
    pub data_wait_time: Time,
    /// The download manager's CPU while the scan downloaded.
    pub download_cpu: Option<Time>,
    /// Bytes fetched per second of the scan's download phase (MiB/s).
    pub retrieval_mib_s: Gauge,
    pub in_flight_peak_mib: Gauge,
    pub in_flight_target_mib: Gauge,
    pub loop_threads: Gauge,
    pub scheduler_epochs: Count,
    /// Column chunks (and bytes) the memory and SSD tiers served, chunks
    /// they did not have, and store requests they saved.
    pub memory_hits: Count,
    pub memory_bytes: Count,
    pub ssd_hits: Count,
    pub ssd_bytes: Count,
    pub cache_misses: Count,
    pub gets_avoided: Count,
    /// Chunks the SSD held that the router read from the store instead.
    pub routed_to_store: Count,
    /// Decisions of the latest run, for plots.
    pub timeline: Arc<Mutex<Vec<Decision>>>,
}

impl ScanCounters {
    pub fn new(set: &ExecutionPlanMetricsSet, managed: bool) -> Self {
        let time = |name: &'static str| {
            let t = Time::new();
            MetricBuilder::new(set).build(MetricValue::Time { name: name.into(), time: t.clone() });
            t
        };
        let count = |name: &'static str| MetricBuilder::new(set).global_counter(name);
        let gauge = |name: &'static str| MetricBuilder::new(set).global_gauge(name);
        ScanCounters {
            get_requests: count("get_requests"),
            bytes_fetched: count("bytes_fetched"),
            row_groups_read: count("row_groups_read"),
            retries: count("retries"),
            hedged: count("hedged"),
            first_byte_time: time("first_byte_time"),
            fetch_time: time("fetch_time"),
            decode_time: time("decode_time"),
            rows_filtered: count("runtime_filter_rows_dropped"),
            rows_deleted: count("rows_deleted"),
            row_groups_skipped: count("runtime_filter_row_groups_skipped"),
            query_wait_time: time("query_wait_time"),
            data_wait_time: time("data_wait_time"),
            download_cpu: managed.then(|| time("download_cpu")),
            retrieval_mib_s: gauge("retrieval_mib_s"),
            in_flight_peak_mib: gauge("in_flight_peak_mib"),
            in_flight_target_mib: gauge("in_flight_target_mib"),
            loop_threads: gauge("loop_threads"),
            scheduler_epochs: count("scheduler_epochs"),
            memory_hits: count("cache_memory_hits"),
            memory_bytes: count("cache_memory_bytes"),
            ssd_hits: count("cache_ssd_hits"),
            ssd_bytes: count("cache_ssd_bytes"),
            cache_misses: count("cache_misses"),
            gets_avoided: count("cache_gets_avoided"),
            routed_to_store: count("cache_routed_to_store"),
            timeline: Arc::default(),
        }
    }
}

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
    /// (index in the unit's chunks, array) of those the memory tier held
    /// decoded.
    decoded: Vec<(usize, ArrayRef)>,
    /// Those the memory tier waits for decoded (their bytes are among
    /// `compressed`).
    fills: Option<DecodedFills>,
}

/// What the fetcher and the partitions share.
struct Shared {
    opts: SchedulerOptions,
    partitions: usize,
    in_flight: AtomicU64,
    /// Downloaded, not yet taken by a partition.
    ready_bytes: AtomicU64,
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
        (in_flight + bytes <= ctl.target_bytes() || in_flight == 0) && (held + bytes <= limit || held == 0) && (held == 0 || self.pool_has_room(bytes))
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
    ready: tokio::sync::Mutex<mpsc::UnboundedReceiver<Result<Arrived>>>,
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
        let (tx, rx) = mpsc::unbounded_channel();
        let skipper = runtime.map(|(filters, zone_maps)| Skipper { filters, zone_maps, generation: None, keep: None });
        let fetcher = SpawnedTask::spawn(fetch_all(units.into(), source, shared.clone(), tx, cpu, skipper));
        Pipeline { shared, ready: tokio::sync::Mutex::new(rx), _fetcher: fetcher }
    }

    /// The stream of partition `partition`, holding `guard` until dropped.
    /// `projection`: the table column of each output column, where
    /// `row_id_column` stands for the row ids ([`crate::provider::ROW_ID_COLUMN`]).
    #[allow(clippy::too_many_arguments)]
    pub fn stream(
        self: &Arc<Self>,
        partition: usize,
        schema: SchemaRef,
        projection: Vec<usize>,
        row_id_column: usize,
        batch_size: usize,
        filter: Option<RowFilter>,
        guard: Box<dyn Send>,
    ) -> SendableRecordBatchStream {
        let consumer = Consumer {
            filter,
            pipeline: self.clone(),
            partition,
            schema: schema.clone(),
            projection,
            row_id_column,
            batch_size,
            current: None,
            last_yield: None,
            busy: Duration::ZERO,
            done: false,
            _guard: guard,
        };
        let stream = futures::stream::unfold(consumer, |c| c.next());
        Box::pin(RecordBatchStreamAdapter::new(schema, stream))
    }
}

/// Downloads row groups as the scheduler allows and queues them as they
/// arrive. Ends when all arrived, a download failed, or nobody listens.
async fn fetch_all(mut queue: VecDeque<ScanUnit>, source: DataSource, shared: Arc<Shared>, tx: mpsc::UnboundedSender<Result<Arrived>>, cpu: Arc<CpuSpan>, mut skipper: Option<Skipper>) {
    let start = Instant::now();
    cpu.begin(&source);
    let dm = source.download_manager().cloned();
    let mut ctl = Controller::new(shared.opts.clone(), dm.as_ref().map_or(1, |d| d.threads()));
    let counters = shared.counters.clone();
    counters.timeline.lock().expect("not poisoned").clear();
    let adaptive = shared.opts.adaptive;
    let apply_threads = |n: usize| {
        if let (Some(dm), true) = (&dm, adaptive) {
            counters.loop_threads.set(dm.set_active_threads(n));
        }
    };
    apply_threads(ctl.threads());
    let mut running = FuturesUnordered::new();
    let (mut epoch_start, mut peak, mut fetched) = (start, 0u64, 0u64);
    let mut last_arrival = start;
    loop {
        while let Some(unit) = queue.front() {
            if let Some(s) = &mut skipper
                && !s.keeps(unit.index)
            {
                queue.pop_front();
                counters.row_groups_skipped.add(1);
                continue;
            }
            if !shared.may_start(&ctl, unit.bytes(), running.len()) {
                break;
            }
            let unit = queue.pop_front().expect("peeked");
            // Checked against the budget in may_start; held until the row
            // group is decoded (Consumer) or the pipeline is dropped.
            shared.reservation.grow(unit.bytes() as usize);
            let in_flight = shared.in_flight.fetch_add(unit.bytes(), Ordering::Relaxed) + unit.bytes();
            peak = peak.max(in_flight);
            let (source, counters) = (source.clone(), shared.counters.clone());
            running.push(async move {
                let t = Instant::now();
                let r = fetch_unit(&source, &unit, &counters).await;
                (unit, r, t.elapsed())
            });
        }
        if running.is_empty() && queue.is_empty() {
            break;
        }
        let next_epoch = epoch_start + shared.opts.epoch;
        tokio::select! {
            Some((unit, result, took)) = running.next(), if !running.is_empty() => {
                shared.in_flight.fetch_sub(unit.bytes(), Ordering::Relaxed);
                counters.fetch_time.add_duration(took);
                match result {
                    Ok((data, from_store)) => {
                        let bytes = unit.bytes();
                        fetched += from_store;
                        last_arrival = Instant::now();
                        // The scheduler models the store: a unit the caches
                        // served says nothing about its latency.
                        if from_store > 0 {
                            shared.epoch.retrieved.fetch_add(from_store, Ordering::Relaxed);
                            shared.epoch.requests.fetch_add(1, Ordering::Relaxed);
                            shared.epoch.request_nanos.fetch_add(took.as_nanos() as u64, Ordering::Relaxed);
                        }
                        shared.ready_bytes.fetch_add(bytes, Ordering::Relaxed);
                        shared.ready_units.fetch_add(1, Ordering::Relaxed);
                        if tx.send(Ok(Arrived { unit, data, at: last_arrival })).is_err() {
                            break; // every partition is gone
                        }
                    }
                    Err(e) => {
                        let _ = tx.send(Err(e));
                        break;
                    }
                }
            }
            _ = shared.space.notified() => {}
            _ = tokio::time::sleep_until(next_epoch.into()) => {}
        }
        let now = Instant::now();
        if now >= next_epoch {
            if adaptive {
                let decision = ctl.epoch(&shared.take_epoch(now - epoch_start), now - start);
                if decision.threads != counters.loop_threads.value() {
                    apply_threads(decision.threads);
                }
                counters.scheduler_epochs.add(1);
                counters.timeline.lock().expect("not poisoned").push(decision);
            }
            epoch_start = now;
        }
    }
    if adaptive {
        // The last, partial epoch: recorded (a scan shorter than an epoch
        // still shows what it saw), not acted on.
        let now = Instant::now();
        let decision = ctl.epoch(&shared.take_epoch(now - epoch_start), now - start);
        counters.timeline.lock().expect("not poisoned").push(decision);
    }
    let secs = last_arrival.duration_since(start).as_secs_f64();
    if secs > 0.0 {
        counters.retrieval_mib_s.set((fetched as f64 / secs / (1 << 20) as f64).round() as usize);
    }
    counters.in_flight_peak_mib.set((peak >> 20) as usize);
    counters.in_flight_target_mib.set((ctl.target_bytes() >> 20) as usize);
    if let Some(dm) = &dm
        && adaptive
    {
        // Other users of the manager start from all threads again.
        dm.set_active_threads(dm.threads());
    }
    cpu.end(&source, counters.download_cpu.as_ref());
}

/// Decides, with the runtime filters as they are now, which row groups
/// still need downloading.
struct Skipper {
    filters: RuntimeFilters,
    zone_maps: Arc<ZoneMaps>,
    /// The filters' generation `keep` was computed for.
    generation: Option<u64>,
    /// Per unit; `None`: every unit.
    keep: Option<Vec<bool>>,
}

impl Skipper {
    fn keeps(&mut self, unit: usize) -> bool {
        let generation = self.filters.generation();
        if self.generation != Some(generation) {
            self.generation = Some(generation);
            // A filter that cannot be read prunes nothing: it is only an optimisation.
            self.keep = self.filters.current().ok().flatten().map(|p| self.zone_maps.prune(p));
        }
        self.keep.as_ref().is_none_or(|k| k.get(unit).copied().unwrap_or(true))
    }
}

/// A unit's column chunks: from the caching tiers where they have them,
/// else from the store. Also returns the bytes that came from the store.
async fn fetch_unit(source: &DataSource, unit: &ScanUnit, m: &ScanCounters) -> Result<(UnitData, u64)> {
    let compressed = |chunks| FetchedChunks::new(chunks, unit.object.size, unit.object.display.clone());
    let Some(tiers) = source.tiers() else {
        let spans = fetch_spans(source, unit, &unit.spans, m).await?;
        let from_store = spans.iter().map(|(_, b)| b.len() as u64).sum();
        return Ok((UnitData { compressed: compressed(spans), decoded: Vec::new(), fills: None }, from_store));
    };
    let mut served = tiers.lookup(unit.segments().collect()).await;
    // From here, admitted chunks that are not handed over are given back.
    let mut fills = DecodedFills::new(tiers.clone(), std::mem::take(&mut served.to_decode));
    m.memory_hits.add(served.memory_hits);
    m.memory_bytes.add(served.memory_bytes as usize);
    m.ssd_hits.add(served.ssd_hits);
    m.ssd_bytes.add(served.ssd_bytes as usize);
    m.cache_misses.add(served.missing.len() - served.routed_to_store);
    m.routed_to_store.add(served.routed_to_store);
    let planned: usize = unit.spans.iter().map(|s| s.requests.len()).sum();
    let mut from_store = 0;
    if !served.missing.is_empty() {
        let spans = match served.missing.len() == unit.chunks.len() {
            true => unit.spans.clone(),
            false => tiers.requests_for(&served.missing),
        };
        let issued: usize = spans.iter().map(|s| s.requests.len()).sum();
        m.gets_avoided.add(planned.saturating_sub(issued));
        let started = Instant::now();
        let fetched = match fetch_spans(source, unit, &spans, m).await {
            Ok(f) => FetchedChunks::new(f, unit.object.size, unit.object.display.clone()),
            Err(e) => {
                tiers.failed(&served.missing);
                return Err(e);
            }
        };
        let mut for_tiers = Vec::with_capacity(served.missing.len());
        for missing in std::mem::take(&mut served.missing) {
            use parquet::file::reader::ChunkReader;
            if missing.decode {
                fills.push(missing.index, missing.key.clone());
            }
            let range = &missing.range;
            let bytes = fetched.get_bytes(range.start, (range.end - range.start) as usize)?;
            from_store += bytes.len() as u64;
            served.chunks.push((range.start, bytes.clone()));
            for_tiers.push((missing, bytes));
        }
        tiers.observe_store(from_store, started.elapsed());
        tiers.fetched(&for_tiers);
    } else {
        m.gets_avoided.add(planned);
    }
    let fills = (!fills.is_empty()).then_some(fills);
    Ok((UnitData { compressed: compressed(served.chunks), decoded: served.decoded, fills }, from_store))
}

/// Issues the range requests of `spans` (of `unit`'s object) concurrently
/// and reassembles each span.
async fn fetch_spans(source: &DataSource, unit: &ScanUnit, spans: &[Span], m: &ScanCounters) -> Result<Vec<(u64, Bytes)>> {
    let object = &unit.object;
    let requests: Vec<std::ops::Range<u64>> = spans.iter().flat_map(|s| s.requests.iter().cloned()).collect();
    if requests.is_empty() {
        return Ok(Vec::new());
    }
    // Counted when issued: a cancelled request was still paid for.
    m.get_requests.add(requests.len());
    let got = source.get_ranges(&object.path, &object.display, &requests).await.map_err(|e| DataFusionError::External(Box::new(e)))?;
    let fetched = got.bytes;
    m.bytes_fetched.add(fetched.iter().map(Bytes::len).sum());
    m.retries.add(got.retries as usize);
    m.hedged.add(got.hedged as usize);
    m.first_byte_time.add_duration(got.first_byte);
    let mut parts = fetched.into_iter();
    let mut out = Vec::with_capacity(spans.len());
    for span in spans {
        let bytes = if span.requests.len() == 1 {
            parts.next().expect("one part per request")
        } else {
            let mut buf = BytesMut::with_capacity((span.range.end - span.range.start) as usize);
            for _ in &span.requests {
                buf.extend_from_slice(&parts.next().expect("one part per request"));
            }
            buf.freeze()
        };
        out.push((span.range.start, bytes));
    }
    Ok(out)
}

/// One partition's end of the queue.
struct Consumer {
    pipeline: Arc<Pipeline>,
    partition: usize,
    schema: SchemaRef,
    projection: Vec<usize>,
    row_id_column: usize,
    batch_size: usize,
    current: Option<Decoding>,
    /// The runtime filters, applied to each decoded batch.
    filter: Option<RowFilter>,
    /// When the last batch was handed on: the time until the next poll is
    /// the query's processing of it.
    last_yield: Option<Instant>,
    /// Busy time not yet reported.
    busy: Duration,
    done: bool,
    _guard: Box<dyn Send>,
}

impl Consumer {
    async fn next(mut self) -> Option<(Result<RecordBatch>, Consumer)> {
        if self.done {
            return None;
        }
        if let Some(t) = self.last_yield.take() {
            self.busy += t.elapsed();
        }
        let shared = self.pipeline.shared.clone();
        if !shared.polled.swap(true, Ordering::Relaxed) {
            shared.space.notify_one();
        }
        let m = &shared.counters;
        loop {
            if let Some(d) = &mut self.current {
                let t = Instant::now();
                // With a filter to follow, decoded rows are lent, not
                // copied: the filter copies the rows it keeps anyway.
                match d.next_batch(&self.schema, self.filter.is_some()) {
                    Some(Ok((batch, deleted, lent))) => {
                        m.rows_deleted.add(deleted);
                        let took = t.elapsed();
                        m.decode_time.add_duration(took);
                        let bytes = (batch.num_rows() as f64 * d.bytes_per_row) as u64;
                        let batch = match &mut self.filter {
                            Some(f) => {
                                let rows = batch.num_rows();
                                match f.apply(batch).and_then(|b| settle(b, rows, &lent).map_err(Into::into)) {
                                    Ok(b) => {
                                        m.rows_filtered.add(rows - b.num_rows());
                                        b
                                    }
                                    Err(e) => {
                                        self.done = true;
                                        return Some((Err(e), self));
                                    }
                                }
                            }
                            None => batch,
                        };
                        shared.processed(self.partition, bytes, self.busy + t.elapsed());
                        self.busy = Duration::ZERO;
                        if batch.num_rows() == 0 {
                            continue; // deletes or filters dropped every row
                        }
                        self.last_yield = Some(Instant::now());
                        return Some((Ok(batch), self));
                    }
                    Some(Err(e)) => {
                        self.done = true;
                        return Some((Err(e), self));
                    }
                    None => {
                        // The row group's bytes are decoded and dropped.
                        shared.reservation.shrink(d.held.min(shared.reservation.size()));
                        self.current = None;
                    }
                }
            }
            let wait = Instant::now();
            let item = self.pipeline.ready.lock().await.recv().await;
            m.query_wait_time.add_elapsed(wait);
            let arrived = match item {
                None => return None,
                Some(Err(e)) => {
                    self.done = true;
                    return Some((Err(e), self));
                }
                Some(Ok(a)) => a,
            };
            shared.ready_bytes.fetch_sub(arrived.unit.bytes(), Ordering::Relaxed);
            shared.ready_units.fetch_sub(1, Ordering::Relaxed);
            shared.space.notify_one();
            m.row_groups_read.add(1);
            if arrived.at < wait {
                m.data_wait_time.add_duration(wait - arrived.at);
            }
            let t = Instant::now();
            match Decoding::new(arrived, &self.projection, self.row_id_column, self.batch_size) {
                Ok(d) => self.current = Some(d),
                Err(e) => {
                    self.done = true;
                    return Some((Err(e), self));
                }
            }
            self.busy += t.elapsed();
        }
    }
}

/// A row group being decoded, a batch at a time; rows that the object's
/// deletion vector deletes are dropped here, before any filter sees them.
/// When the page index ruled pages out, only the unit's selected rows are
/// decoded, and their positions (for row ids and deletes) follow from the
/// selection ([`blobhouse_storage::rows`]). Columns the memory tier holds
/// decoded are not decoded at all: each batch copies its rows out of them.
struct Decoding {
    /// The columns in Parquet form; `None` when no column is.
    reader: Option<ParquetRecordBatchReader>,
    /// Without a reader: selected rows not yet handed on.
    rows_left: usize,
    batch_size: usize,
    /// Where each output column comes from.
    columns: Vec<Column>,
    /// Where in the row group the next decoded rows are.
    rows_at: Positions,
    /// The row group's first row in its object.
    first_row: u64,
    /// The object's ordinal, the upper half of its row ids.
    ordinal: u32,
    deleted: Option<Arc<RoaringBitmap>>,
    location: String,
    bytes_per_row: f64,
    /// Bytes of the row group's chunks, reserved in the engine's budget.
    held: usize,
}

/// Where an output column of a [`Decoding`] comes from.
enum Column {
    /// The reader's output column at this position (file order).
    Reader(usize),
    /// A whole chunk, decoded: every row of the row group.
    Decoded(ArrayRef),
    /// The row ids.
    RowIds,
}

impl Decoding {
    fn new(a: Arrived, projection: &[usize], row_id_column: usize, batch_size: usize) -> Result<Decoding> {
        let Arrived { unit, data: chunks, .. } = a;
        let object = &unit.object;
        let bytes_per_row = if unit.rows == 0 { 0.0 } else { unit.bytes() as f64 / unit.rows as f64 };
        let held = unit.bytes() as usize;
        let wrap = |e: parquet::errors::ParquetError| DataFusionError::External(Box::new(StorageError::Parquet { location: object.display.clone(), source: e }));
        let corrupt = |reason: String| DataFusionError::External(Box::new(StorageError::Corrupt { location: object.display.clone(), reason }));
        // The unit's chunks are its data columns, in projection order.
        let data: Vec<usize> = projection.iter().copied().filter(|&c| c != row_id_column).collect();
        if data.len() != unit.chunks.len() {
            return Err(DataFusionError::Internal(format!("a scan of {} reads {} columns from {} chunks", object.display, data.len(), unit.chunks.len())));
        }
        let mut arrays: Vec<Option<ArrayRef>> = vec![None; data.len()];
        for (i, array) in chunks.decoded {
            arrays[i] = Some(array);
        }
        let reader = |columns: &[usize], rows: Option<&RowRanges>, batch: usize| {
            let mask = ProjectionMask::roots(object.reader.metadata().file_metadata().schema_descr(), columns.iter().copied());
            let mut builder = ParquetRecordBatchReaderBuilder::new_with_metadata(chunks.compressed.clone(), object.reader.clone())
                .with_row_groups(vec![unit.row_group])
                .with_projection(mask)
                .with_batch_size(batch);
            if let Some(rows) = rows {
                builder = builder.with_row_selection(rows.selection());
            }
            builder.build().map_err(wrap)
        };
        // Chunks the memory tier waits for decoded: every row, once, then
        // read like the chunks it held.
        if let Some(mut fills) = chunks.fills {
            let mut to_decode: Vec<(usize, usize)> = fills.indexes().map(|i| (data[i], i)).collect();
            to_decode.sort_unstable();
            let columns: Vec<usize> = to_decode.iter().map(|(c, _)| *c).collect();
            let batches = reader(&columns, None, (unit.rows as usize).max(1))?.collect::<Result<Vec<RecordBatch>, _>>().map_err(|e| corrupt(e.to_string()))?;
            for (position, (_, i)) in to_decode.iter().enumerate() {
                let array = match batches.as_slice() {
                    [one] => one.column(position).clone(),
                    _ => datafusion::arrow::compute::concat(&batches.iter().map(|b| b.column(position).as_ref()).collect::<Vec<&dyn Array>>())?,
                };
                fills.fill(*i, array.clone(), unit.rows);
                arrays[*i] = Some(array);
            }
        }
        let selected = unit.selection.clone().unwrap_or_else(|| Arc::new(RowRanges::all(unit.rows)));
        // The rest in Parquet form; the reader returns them in file order.
        let mut parquet: Vec<usize> = data.iter().zip(&arrays).filter(|(_, a)| a.is_none()).map(|(c, _)| *c).collect();
        parquet.sort_unstable();
        // `arrays` follows the data columns, which follow the projection.
        let mut arrays = arrays.into_iter();
        let columns = projection
            .iter()
            .map(|c| match *c == row_id_column {
                true => Column::RowIds,
                false => match arrays.next().flatten() {
                    Some(array) => Column::Decoded(array),
                    None => Column::Reader(parquet.binary_search(c).expect("an undecoded data column is read")),
                },
            })
            .collect();
        let reader = match parquet.is_empty() {
            true => None,
            false => Some(reader(&parquet, unit.selection.as_deref(), batch_size)?),
        };
        Ok(Decoding {
            reader,
            rows_left: selected.selected() as usize,
            batch_size,
            columns,
            rows_at: Positions::new(selected),
            first_row: unit.first_row,
            ordinal: object.ordinal,
            deleted: object.deleted.clone(),
            location: object.display.clone(),
            bytes_per_row,
            held,
        })
    }

    /// The next batch, without deleted rows, how many rows were deleted,
    /// and which of its columns are lent: with `lend`, the rows of a
    /// decoded chunk that lie in one range are a slice of the chunk, not a
    /// copy, and the caller must [`settle`] the batch before handing it on.
    fn next_batch(&mut self, schema: &SchemaRef, lend: bool) -> Option<Result<(RecordBatch, usize, Vec<usize>)>> {
        let (decoded, rows) = match self.reader.as_mut() {
            None if self.rows_left == 0 => return None,
            None => {
                // Every column decoded already, or none wanted (COUNT(*)
                // and friends: the rows are counted, in one batch unless
                // columns are wanted).
                let rows = if self.columns.is_empty() { self.rows_left } else { self.rows_left.min(self.batch_size) };
                self.rows_left -= rows;
                (None, rows)
            }
            Some(reader) => match reader.next()? {
                Ok(b) => {
                    let rows = b.num_rows();
                    (Some(b), rows)
                }
                Err(e) => return Some(Err(self.corrupt(e.to_string()))),
            },
        };
        let at = self.rows_at.take(rows);
        if at.iter().map(|r| r.end - r.start).sum::<u64>() != rows as u64 {
            return Some(Err(self.corrupt(format!("the decoder returned more rows than the {} selected", self.rows_at.selected()))));
        }
        let mut lent = Vec::new();
        let columns: Result<Vec<ArrayRef>, _> = self
            .columns
            .iter()
            .enumerate()
            .map(|(position, c)| match (c, &decoded) {
                (Column::Reader(i), Some(b)) => Ok(b.column(*i).clone()),
                (Column::Reader(_), None) => Err(datafusion::arrow::error::ArrowError::InvalidArgumentError(format!("a scan of {} lost its Parquet reader", self.location))),
                (Column::Decoded(array), _) => match (lend, at.as_slice()) {
                    (true, [one]) if (one.end - one.start) < array.len() as u64 => {
                        lent.push(position);
                        Ok(array.slice(one.start as usize, (one.end - one.start) as usize))
                    }
                    _ => copy_rows(array, &at),
                },
                (Column::RowIds, _) => Ok(Arc::new(row_ids(self.ordinal, self.first_row, &at)) as ArrayRef),
            })
            .collect();
        let columns = match columns {
            Ok(c) => c,
            Err(e) => return Some(Err(e.into())),
        };
        let opts = RecordBatchOptions::new().with_row_count(Some(rows));
        let batch = match RecordBatch::try_new_with_options(schema.clone(), columns, &opts) {
            Ok(b) => b,
            Err(e) => return Some(Err(e.into())),
        };
        Some(drop_deleted(batch, self.first_row, &at, self.deleted.as_deref()).map_err(Into::into).map(|(batch, deleted)| {
            if deleted > 0 {
                lent.clear(); // dropping rows copied every column
            }
            (batch, deleted, lent)
        }))
    }

    fn corrupt(&self, reason: String) -> DataFusionError {
        DataFusionError::External(Box::new(StorageError::Corrupt { location: self.location.clone(), reason }))
    }
}

/// The rows `at` of a whole decoded chunk, copied into an array of their
/// own. Copied, not sliced: a slice would keep (and, in the operators'
/// memory accounting, count) the whole chunk's buffers for each batch.
/// All of them (a small row group in one batch): the array itself, which
/// is then exactly what a copy would be.
fn copy_rows(array: &ArrayRef, at: &[std::ops::Range<u64>]) -> Result<ArrayRef, datafusion::arrow::error::ArrowError> {
    if let [whole] = at
        && whole.start == 0
        && whole.end == array.len() as u64
    {
        return Ok(array.clone());
    }
    copy_ranges(array, at)
}

/// A batch whose columns `lent` are slices of whole decoded chunks, after
/// a filter that started from `rows_in` rows: when the filter dropped
/// rows it copied the ones it kept, so nothing is lent any more; when it
/// kept them all (or let the batch pass), the lent columns are copied now,
/// for the reason [`copy_rows`] gives.
fn settle(batch: RecordBatch, rows_in: usize, lent: &[usize]) -> Result<RecordBatch, datafusion::arrow::error::ArrowError> {
    if lent.is_empty() || batch.num_rows() < rows_in {
        return Ok(batch);
    }
    let mut columns = batch.columns().to_vec();
    for &i in lent {
        columns[i] = copy_ranges(&columns[i], &[0..columns[i].len() as u64])?;
    }
    RecordBatch::try_new_with_options(batch.schema(), columns, &RecordBatchOptions::new().with_row_count(Some(batch.num_rows())))
}

/// The rows `at` of `array` in buffers of their own.
fn copy_ranges(array: &ArrayRef, at: &[std::ops::Range<u64>]) -> Result<ArrayRef, datafusion::arrow::error::ArrowError> {
    let data = array.to_data();
    let rows = at.iter().map(|r| (r.end - r.start) as usize).sum();
    let mut out = MutableArrayData::new(vec![&data], false, rows);
    for r in at {
        out.try_extend(0, r.start as usize, r.end as usize)?;
    }
    Ok(make_array(out.freeze()))
}

/// The CPU time the download manager's loop threads spent while a scan
/// downloaded. The loops serve every query of the engine, so concurrent
/// scans share it.
#[derive(Debug, Default)]
pub(crate) struct CpuSpan {
    start: std::sync::OnceLock<Duration>,
    reported: Mutex<Duration>,
}

impl CpuSpan {
    fn begin(&self, source: &DataSource) {
        if let Some(dm) = source.download_manager() {
            self.start.get_or_init(|| dm.stats().cpu);
        }
    }

    /// Adds to `metric` the CPU spent since the start and not yet reported.
    fn end(&self, source: &DataSource, metric: Option<&Time>) {
        let (Some(dm), Some(start), Some(metric)) = (source.download_manager(), self.start.get(), metric) else { return };
        let total = dm.stats().cpu.saturating_sub(*start);
        let mut reported = self.reported.lock().expect("not poisoned");
        if total > *reported {
            metric.add_duration(total - *reported);
            *reported = total;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::Int32Array;

    #[test]
    fn decoded_rows_are_copied_unless_all_are_wanted() {
        let array: ArrayRef = Arc::new(Int32Array::from((0..1000).collect::<Vec<i32>>()));
        let some = copy_rows(&array, &[1..3, 7..9]).unwrap();
        assert_eq!(some.as_any().downcast_ref::<Int32Array>().unwrap().values(), &[1, 2, 7, 8]);
        assert!(some.get_array_memory_size() < array.get_array_memory_size(), "a copy holds only its rows");
        let all = copy_rows(&array, &[0..1000]).unwrap();
        assert!(Arc::ptr_eq(&all, &array), "all rows: the array itself");
        let split = copy_rows(&array, &[0..500, 500..1000]).unwrap();
        assert_eq!(split.len(), 1000);
        assert!(copy_rows(&array, &[]).unwrap().is_empty());
    }

    #[test]
    fn lent_rows_are_copied_unless_a_filter_copied_them() {
        use datafusion::arrow::datatypes::{DataType, Field, Schema};
        let chunk: ArrayRef = Arc::new(Int32Array::from((0..1000).collect::<Vec<i32>>()));
        let schema = Arc::new(Schema::new(vec![Field::new("a", DataType::Int32, false), Field::new("b", DataType::Int32, false)]));
        let lent = RecordBatch::try_new(schema.clone(), vec![chunk.slice(100, 10), Arc::new(Int32Array::from((0..10).collect::<Vec<i32>>()))]).unwrap();
        let whole = chunk.get_array_memory_size();
        assert_eq!(lent.column(0).get_array_memory_size(), whole, "a slice counts the whole chunk");

        // The filter kept every row (or let the batch pass): the lent column is copied.
        let kept_all = settle(lent.clone(), 10, &[0]).unwrap();
        assert_eq!(kept_all.column(0).as_any().downcast_ref::<Int32Array>().unwrap().values(), &(100..110).collect::<Vec<i32>>()[..]);
        assert!(kept_all.column(0).get_array_memory_size() < whole / 10, "copied: only its rows");
        assert!(Arc::ptr_eq(kept_all.column(1), lent.column(1)), "columns not lent are left alone");

        // The filter dropped rows, so it copied the rest: nothing to do.
        let filtered = lent.slice(0, 5);
        let settled = settle(filtered.clone(), 10, &[0]).unwrap();
        assert!(Arc::ptr_eq(settled.column(0), filtered.column(0)));
        // Nothing lent: nothing to do.
        assert!(Arc::ptr_eq(settle(lent.clone(), 10, &[]).unwrap().column(0), lent.column(0)));
    }
}
