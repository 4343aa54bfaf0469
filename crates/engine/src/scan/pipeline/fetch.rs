//! The fetcher of a running scan: downloads the scan's row groups as the
//! object scheduler and the memory budget allow — from the caching tiers
//! where they hold the chunks, else from the store — skips those the
//! runtime filters exclude, and queues them in the order they arrive, cut
//! into morsels.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use bytes::Bytes;
use datafusion::common::{DataFusionError, Result};
use futures::StreamExt;
use futures::stream::FuturesUnordered;

use crate::chunks::{FetchedChunks, Span};
use crate::runtime_filter::RuntimeFilters;
use crate::scan::ScanUnit;
use crate::scheduler::Controller;
use crate::source::DataSource;
use crate::tiers::DecodedFills;
use crate::zone_maps::ZoneMaps;

use super::counters::{CpuSpan, ScanCounters};
use super::morsel::Landed;
use super::queue::Producer;
use super::{Arrived, Shared, UnitData};

/// Downloads row groups as the scheduler allows and queues them as they
/// arrive. Ends when all arrived, a download failed, or nobody listens.
pub(super) async fn fetch_all(mut queue: VecDeque<ScanUnit>, source: DataSource, shared: Arc<Shared>, ready: Producer, cpu: Arc<CpuSpan>, mut skipper: Option<Skipper>) {
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
    let (mut epoch_start, mut peak, mut ahead_peak, mut fetched) = (start, 0u64, 0u64, 0u64);
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
            ahead_peak = ahead_peak.max(in_flight + shared.ready_bytes.load(Ordering::Relaxed));
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
                        let morsels = Landed::cut(Arrived { unit, data, at: last_arrival });
                        shared.ready_bytes.fetch_add(bytes, Ordering::Relaxed);
                        shared.ready_units.fetch_add(morsels.len(), Ordering::Relaxed);
                        ready.push_all(morsels.into_iter().map(Ok));
                    }
                    Err(e) => {
                        ready.push_all([Err(e)]);
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
    counters.ahead_peak_mib.set((ahead_peak >> 20) as usize);
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
pub(super) struct Skipper {
    pub(super) filters: RuntimeFilters,
    pub(super) zone_maps: Arc<ZoneMaps>,
    /// The filters' generation `keep` was computed for.
    pub(super) generation: Option<u64>,
    /// Per unit; `None`: every unit.
    pub(super) keep: Option<Vec<bool>>,
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
        let spans = fetch_checked(source, unit, &unit.spans, m).await?;
        let from_store = spans.iter().map(|(_, b)| b.len() as u64).sum();
        return Ok((UnitData { compressed: compressed(spans), decoded: Vec::new(), fills: None }, from_store));
    };
    let mut served = tiers.lookup(unit.segments().collect()).await;
    // From here, admitted chunks that are not handed over are given back.
    let fills = DecodedFills::new(tiers.clone(), std::mem::take(&mut served.to_decode));
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
        let fetched = match fetch_checked(source, unit, &spans, m).await {
            Ok(f) => FetchedChunks::new(f, unit.object.size, unit.object.display.clone()),
            Err(e) => {
                tiers.failed(&served.missing);
                return Err(e);
            }
        };
        let mut for_tiers = Vec::with_capacity(served.missing.len());
        for missing in std::mem::take(&mut served.missing) {
            use parquet::file::reader::ChunkReader;
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

/// [`fetch_spans`], with every column chunk the requests cover checked
/// against the checksum it was written with. A chunk that does not match
/// is fetched once more, with the rest of `spans` (a transfer may have
/// damaged it); one that still does not fails the scan, naming the object
/// and the byte range. Objects written before checksums were kept are
/// not checked.
async fn fetch_checked(source: &DataSource, unit: &ScanUnit, spans: &[Span], m: &ScanCounters) -> Result<Vec<(u64, Bytes)>> {
    let first = fetch_spans(source, unit, spans, m).await?;
    let Some(_) = damaged(unit, &first) else { return Ok(first) };
    m.retries.add(1);
    let second = fetch_spans(source, unit, spans, m).await?;
    match damaged(unit, &second) {
        None => Ok(second),
        Some(range) => Err(DataFusionError::Execution(format!(
            "data object {} is damaged: bytes {}..{} (a column chunk of row group {}) do not match the checksum written with them, read twice from the store; \
             restore the object from a copy of the bucket (queries that do not read this chunk still work)",
            unit.object.display, range.start, range.end, unit.row_group
        ))),
    }
}

/// The first column chunk of `unit` that `pieces` hold whole and whose
/// bytes do not match its checksum.
fn damaged(unit: &ScanUnit, pieces: &[(u64, Bytes)]) -> Option<std::ops::Range<u64>> {
    use parquet::file::reader::ChunkReader;
    let sums = unit.checksums.as_ref()?;
    let fetched = FetchedChunks::new(pieces.to_vec(), unit.object.size, unit.object.display.clone());
    unit.chunks.iter().zip(sums).find_map(|(range, sum)| {
        // A chunk these requests do not cover (a cached one) is not theirs to check.
        let bytes = fetched.get_bytes(range.start, (range.end - range.start) as usize).ok()?;
        (blobhouse_storage::format::chunk_checksum(&bytes) != *sum).then(|| range.clone())
    })
}

/// Issues the range requests of `spans` (of `unit`'s object) concurrently.
/// Each request's bytes are one piece: the decoder reads across pieces
/// that continue one another ([`FetchedChunks`]), so a span is never joined
/// into one buffer.
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
    if fetched.len() != requests.len() {
        return Err(DataFusionError::Internal(format!("{} requests to {} returned {} parts", requests.len(), object.display, fetched.len())));
    }
    Ok(requests.iter().map(|r| r.start).zip(fetched).collect())
}
