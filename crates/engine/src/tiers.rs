//! The engine's caching tiers (`blobhouse_cache`): which segments a scan
//! will read (the access the policies learn from), and where each of its
//! column chunks comes from — memory, SSD, or the store — with the bytes
//! from the store handed to the tiers that admitted them.
//!
//! A cache only ever serves the exact bytes of a column chunk of an object
//! that is never rewritten, so a hit is the same bytes a GET would return;
//! a tier that fails (a damaged SSD entry, a write error) is a miss, never
//! an error of the query.
//!
//! The memory tier holds a chunk in one of two forms ([`CachedChunk`]):
//! compressed, as fetched, or decoded into the Arrow arrays a scan makes
//! of it ([`decoded`]: the scan's batches as they came, decimals of up to
//! 18 digits in 64 bits). Decoded, a hit costs no decompression and no Parquet
//! decoding — the larger part of a cached query's CPU (docs/notes/
//! 2026-11-24-hybrid-bound.md) and the form FlexPushdownDB's cache keeps
//! (§5) — but takes more memory: a fixed width per value for numbers and
//! dates (2–20× their compressed bytes, 1000× for a sorted column), and
//! ten times and more the compressed bytes for dictionary-encoded strings.
//! So fixed-width columns are held decoded and variable-width ones only
//! when their arrays are small enough ([`CacheOptions::decoded_max_ratio`]).
//! A chunk
//! enters the memory tier compressed, as the bytes the scan fetched (no
//! copy); the next scan that reads it there decodes it anyway and hands the
//! arrays over in place of the bytes ([`DecodedFills`]), so a chunk read
//! once — every chunk of a one-shot `blobhouse sql -f` — is never decoded
//! for the tier: doing that on the first read made SF 1's Q6 in a fresh
//! process 2.5× slower and 3.5× larger in memory. The SSD tier keeps
//! compressed chunks.

use std::ops::Range;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use datafusion::execution::memory_pool::{MemoryConsumer, MemoryPool, MemoryReservation};

use blobhouse_cache::{Held, Lookup, MemoryTier, PolicyKind, Route, Router, RouterStats, SegmentKey, SsdTier, Touch};

use crate::chunks::{RequestPolicy, Span};

pub mod decoded;
pub use decoded::{ChunkPieces, DecodedChunk};
use crate::memory::Reclaim;

/// The memory tier's consumer name in the engine's budget.
const CONSUMER: &str = "SegmentCache";

/// How the tiers are set up.
#[derive(Debug, Clone)]
pub struct CacheOptions {
    /// Bytes of the memory tier; `None`: a quarter of the memory limit
    /// (64 MiB when there is no limit); `Some(0)`: no memory tier.
    pub memory: Option<u64>,
    /// Its policy.
    pub memory_policy: PolicyKind,
    /// Directory of the SSD tier; `None`: no SSD tier.
    pub ssd_dir: Option<PathBuf>,
    /// Bytes of the SSD tier.
    pub ssd_capacity: u64,
    /// Added to every SSD read: a disk slower than it is, for experiments
    /// on routing (`blobhouse bench cache`, tests). Zero normally.
    pub ssd_read_delay: std::time::Duration,
    /// Added per MiB read from the SSD, on top of `ssd_read_delay`, one
    /// read at a time: a disk with that little bandwidth left, shared by
    /// all reads. Zero normally.
    pub ssd_read_mib_delay: std::time::Duration,
    /// Route each read of what the SSD holds to the faster of SSD and
    /// store (default). Off: always the SSD — the baseline the routing is
    /// measured against.
    pub route_by_speed: bool,
    /// The memory tier holds a column chunk decoded (as an Arrow array)
    /// when its values have a fixed width (numbers, dates: 4–16 bytes a
    /// value), or when its array is estimated to take at most this many
    /// times its compressed bytes; else compressed. 0: every chunk
    /// compressed.
    pub decoded_max_ratio: f64,
}

/// [`CacheOptions::decoded_max_ratio`] by default: it leaves out the
/// dictionary-encoded strings of SSB and TPC-H (flags, modes, names, whose
/// arrays are 10–140× their compressed bytes) and takes in free text,
/// whose arrays are 2–5× (docs/cache.md, "The memory tier").
pub const DECODED_MAX_RATIO: f64 = 5.0;

/// What a column chunk takes decoded, as planning estimates it from the
/// Parquet metadata.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DecodedSize {
    /// Bytes of the whole chunk's array.
    pub bytes: u64,
    /// Its values have a fixed width.
    pub fixed_width: bool,
}

impl Default for CacheOptions {
    fn default() -> Self {
        CacheOptions {
            memory: None,
            memory_policy: PolicyKind::default(),
            ssd_dir: None,
            ssd_capacity: 10 << 30,
            ssd_read_delay: std::time::Duration::ZERO,
            ssd_read_mib_delay: std::time::Duration::ZERO,
            route_by_speed: true,
            decoded_max_ratio: DECODED_MAX_RATIO,
        }
    }
}

/// A column chunk as the memory tier holds it.
#[derive(Debug, Clone)]
pub enum CachedChunk {
    /// The bytes as fetched.
    Compressed(Bytes),
    /// The whole chunk decoded: a value per row of the row group, in the
    /// pieces the scan that filled it decoded ([`DecodedChunk`]).
    Decoded(Arc<DecodedChunk>),
}

impl Held for CachedChunk {
    fn memory_size(&self) -> u64 {
        match self {
            CachedChunk::Compressed(b) => b.len() as u64,
            CachedChunk::Decoded(c) => c.memory_size(),
        }
    }

    /// A decoded chunk's rows were checked against its row group when it
    /// was made ([`DecodedFills::fill`]).
    fn is_whole(&self, key: &SegmentKey) -> bool {
        match self {
            CachedChunk::Compressed(b) => b.is_whole(key),
            CachedChunk::Decoded(_) => true,
        }
    }
}

/// A cache size as people write it: a size (`512M`, `2G`, `10%`), or `0` /
/// `off` for none. One parser for the CLI flag and `SET cache_memory`.
pub fn parse_cache_size(text: &str) -> Result<u64, String> {
    match text.trim().trim_matches('\'').trim().to_ascii_lowercase().as_str() {
        "0" | "off" => Ok(0),
        _ => crate::memory::parse_size(text),
    }
}

impl CacheOptions {
    /// No tier at all (benchmarks that measure reads from the store).
    pub fn off() -> CacheOptions {
        CacheOptions { memory: Some(0), ..CacheOptions::default() }
    }

    /// The memory tier's size under a memory limit of `limit` bytes.
    pub fn memory_bytes(&self, limit: Option<usize>) -> u64 {
        self.memory.unwrap_or_else(|| limit.map_or(64 << 20, |l| l as u64 / 4))
    }
}

/// The tiers of one engine, shared by all its scans.
pub struct Tiers {
    memory: Option<MemoryTier<CachedChunk>>,
    /// See [`CacheOptions::decoded_max_ratio`].
    decoded_max_ratio: f64,
    ssd: Option<Arc<SsdTier>>,
    /// The memory tier's bytes in the engine's budget, and their number
    /// readable without the lock (for the pool, see [`Reclaim`]).
    reservation: Mutex<MemoryReservation>,
    held: AtomicUsize,
    /// Warnings not yet shown (a tier that could not be opened, a failing disk).
    warnings: Mutex<Vec<String>>,
    /// How the chunks no tier has are cut into requests.
    policy: RequestPolicy,
    /// The memory tier as configured (what RESET goes back to).
    configured: (u64, PolicyKind),
    /// SSD or store for what the SSD holds.
    router: Router,
    ssd_read_delay: std::time::Duration,
    ssd_read_mib_delay: std::time::Duration,
    /// The slow disk's one device (see [`Tiers::slow_disk`]).
    ssd_device: Mutex<()>,
    route_by_speed: bool,
    /// Every scan's segments in order, while recording (for Belady).
    trace: Mutex<Option<Vec<Vec<SegmentKey>>>>,
}

impl std::fmt::Debug for Tiers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tiers").field("memory", &self.memory.as_ref().map(|m| m.stats())).field("ssd", &self.ssd.as_ref().map(|s| s.stats())).finish()
    }
}

fn no_memory_tier() -> String {
    "this engine has no memory tier (it was opened with the caches off); open it with a cache size".into()
}

/// One tier in `SHOW CACHE`.
#[derive(Debug, Clone)]
pub struct TierRow {
    pub tier: &'static str,
    pub policy: &'static str,
    pub segments: u64,
    pub bytes: u64,
    pub capacity: u64,
    pub hits: u64,
    pub misses: u64,
    /// Bytes the tier served.
    pub served: u64,
    pub evicted: u64,
    pub note: String,
}

/// Where one unit's chunks came from.
#[derive(Debug, Default)]
pub(crate) struct Served {
    /// (offset in the object, bytes) of every chunk served compressed.
    pub chunks: Vec<(u64, Bytes)>,
    /// (index in the unit's chunks, chunk) of every chunk served decoded.
    pub decoded: Vec<(usize, Arc<DecodedChunk>)>,
    /// Chunks the memory tier held compressed and would hold decoded: the
    /// scan decodes them anyway, and hands the arrays over
    /// ([`DecodedFills`]).
    pub to_decode: Vec<(usize, SegmentKey)>,
    pub memory_hits: usize,
    pub memory_bytes: u64,
    pub ssd_hits: usize,
    pub ssd_bytes: u64,
    /// The chunks still to fetch from the store.
    pub missing: Vec<Missing>,
    /// Of them, chunks the SSD held but the router sent to the store.
    pub routed_to_store: usize,
}

/// A chunk to fetch from the store.
#[derive(Debug, Clone)]
pub(crate) struct Missing {
    pub range: Range<u64>,
    pub key: SegmentKey,
    /// The memory tier admitted it and waits for its bytes (compressed:
    /// see [`Served::to_decode`] for the decoded form).
    pub fill_memory: bool,
    /// The SSD tier holds it already (the router chose the store): no write.
    pub on_ssd: bool,
}

impl Tiers {
    /// The tiers `options` ask for, the memory tier's bytes held in `pool`.
    /// An SSD directory that cannot be used leaves a warning and no SSD tier.
    pub fn new(options: &CacheOptions, memory_limit: Option<usize>, pool: &Arc<dyn MemoryPool>, policy: RequestPolicy) -> Option<Arc<Tiers>> {
        let memory_bytes = options.memory_bytes(memory_limit);
        let memory = (memory_bytes > 0).then(|| MemoryTier::new(memory_bytes, options.memory_policy.build()));
        assert!(options.decoded_max_ratio >= 0.0, "decoded_max_ratio is a ratio of sizes");
        let mut warnings = Vec::new();
        let ssd = options.ssd_dir.as_ref().and_then(|dir| match SsdTier::open(dir, options.ssd_capacity, PolicyKind::Lru.build()) {
            Ok(t) => Some(Arc::new(t)),
            Err(e) => {
                warnings.push(format!("SSD cache off: {e}"));
                None
            }
        });
        if memory.is_none() && ssd.is_none() && warnings.is_empty() {
            return None;
        }
        let reservation = Mutex::new(MemoryConsumer::new(CONSUMER).register(pool));
        let configured = (memory_bytes, options.memory_policy);
        Some(Arc::new(Tiers {
            memory,
            decoded_max_ratio: options.decoded_max_ratio,
            ssd,
            reservation,
            held: AtomicUsize::new(0),
            warnings: Mutex::new(warnings),
            policy,
            configured,
            router: Router::new(),
            ssd_read_delay: options.ssd_read_delay,
            ssd_read_mib_delay: options.ssd_read_mib_delay,
            ssd_device: Mutex::new(()),
            route_by_speed: options.route_by_speed,
            trace: Mutex::new(None),
        }))
    }

    /// The memory tier, if any.
    pub fn memory(&self) -> Option<&MemoryTier<CachedChunk>> {
        self.memory.as_ref()
    }

    /// The SSD tier, if any.
    pub fn ssd(&self) -> Option<&SsdTier> {
        self.ssd.as_deref()
    }

    /// `SET cache_memory`: the memory tier's size (`None`: as configured).
    /// Errors when the engine has no memory tier.
    pub fn set_memory_capacity(&self, bytes: Option<u64>) -> Result<(), String> {
        let m = self.memory.as_ref().ok_or_else(no_memory_tier)?;
        m.set_capacity(bytes.unwrap_or(self.configured.0));
        self.account();
        Ok(())
    }

    /// `SET cache_policy`: the memory tier's policy (`None`: as configured).
    pub fn set_memory_policy(&self, policy: Option<PolicyKind>) -> Result<(), String> {
        let m = self.memory.as_ref().ok_or_else(no_memory_tier)?;
        m.set_policy(policy.unwrap_or(self.configured.1).build());
        Ok(())
    }

    /// What `SHOW CACHE` lists, a row per tier: (tier, policy, segments,
    /// bytes, capacity, hits, misses, bytes served, evicted, note).
    pub fn describe(&self) -> Vec<TierRow> {
        let mut rows = Vec::new();
        if let Some(m) = &self.memory {
            let s = m.stats();
            let decoded = self.decoded_segments();
            let note = format!("admitted {}, rejected {}; {} held decoded ({:.1} MiB)", s.admitted, s.rejected, decoded.0, decoded.1 as f64 / 1048576.0);
            rows.push(TierRow { tier: "memory", policy: m.policy_name(), segments: m.contents().len() as u64, bytes: s.used, capacity: s.capacity, hits: s.hits, misses: s.misses, served: s.hit_bytes, evicted: s.evicted, note });
        }
        if let Some(d) = &self.ssd {
            let s = d.stats();
            let r = self.router.stats();
            let ms = |v: Option<f64>| v.map_or("?".to_string(), |s| format!("{:.1} ms", s * 1e3));
            let note = format!(
                "{}; recovered {}, written {}, damaged {}, write errors {}; 1 MiB from SSD {}, from the store {}, {} reads routed to the store",
                d.slot().display(),
                s.recovered,
                s.written,
                s.corrupt,
                s.write_errors,
                ms(r.ssd_mib_secs),
                ms(r.store_mib_secs),
                r.routed_to_store
            );
            rows.push(TierRow { tier: "ssd", policy: "lru", segments: d.segments() as u64, bytes: s.used, capacity: s.capacity, hits: s.hits, misses: s.misses, served: s.hit_bytes, evicted: s.evicted, note });
        }
        rows
    }

    /// Segments the memory tier holds decoded, and the bytes they take.
    pub fn decoded_segments(&self) -> (usize, u64) {
        let held = self.memory.as_ref().map(|m| m.held()).unwrap_or_default();
        held.iter().filter(|c| matches!(c, CachedChunk::Decoded(_))).fold((0, 0), |(n, b), c| (n + 1, b + c.memory_size()))
    }

    /// Warnings since the last call: each said once.
    pub fn take_warnings(&self) -> Vec<String> {
        let mut out = std::mem::take(&mut *self.warnings.lock().expect("not poisoned"));
        if let Some(ssd) = &self.ssd {
            out.extend(ssd.take_warnings());
        }
        out
    }

    /// A scan will read `chunks` of the objects named, each with the
    /// estimate of its decoded size: each tier updates its policy and
    /// admits what it decides (FlexPushdownDB's Algorithm 1, one scan = one
    /// access).
    pub fn plan(&self, chunks: &[(SegmentKey, DecodedSize)]) {
        let touched: Vec<(Touch, DecodedSize)> = chunks.iter().map(|(k, d)| (Touch::of(k.clone()), *d)).collect();
        self.plan_touches(&touched);
    }

    /// Whether the memory tier holds a chunk of `len` compressed bytes,
    /// `decoded` as an array, decoded.
    fn holds_decoded(&self, len: u64, decoded: DecodedSize) -> bool {
        self.decoded_max_ratio > 0.0 && (decoded.fixed_width || decoded.bytes as f64 <= self.decoded_max_ratio * len as f64)
    }

    /// [`Tiers::plan`] with each segment's weight: what a miss of it costs
    /// (a hybrid scan weighs segments by the pushdown work they save, which
    /// Weighted-LFU values). The touches' sizes are the compressed bytes;
    /// the memory tier is told the size of the form it would hold.
    pub fn plan_touches(&self, touched: &[(Touch, DecodedSize)]) {
        if let Some(trace) = self.trace.lock().expect("not poisoned").as_mut() {
            trace.push(touched.iter().map(|(t, _)| t.key.clone()).collect());
        }
        if let Some(m) = &self.memory {
            let sized: Vec<Touch> = touched.iter().map(|(t, d)| Touch { size: if self.holds_decoded(t.size, *d) { d.bytes } else { t.size }, ..t.clone() }).collect();
            m.plan(&sized);
            self.account();
        }
        if let Some(s) = &self.ssd {
            let touched: Vec<Touch> = touched.iter().map(|(t, _)| t.clone()).collect();
            s.plan(&touched);
        }
    }

    /// A hybrid scan pushed down a unit with these `chunks` of `object`:
    /// those the tiers admitted for it will not be fetched, so their space
    /// is given back (chunks already here stay). Without this, a row group
    /// of which only some chunks were admitted left the others' space
    /// taken by bytes that never came — measured: hybrid's byte hit rate
    /// was half caching-only's at the same cache size.
    pub(crate) fn release_unfilled(&self, object: &str, chunks: &[Range<u64>]) {
        let object: Arc<str> = Arc::from(object);
        for r in chunks {
            let key = SegmentKey { object: object.clone(), start: r.start, len: r.end - r.start };
            if let Some(m) = &self.memory {
                m.abandon(&key);
            }
            if let Some(s) = &self.ssd {
                s.abandon_unwritten(&key);
            }
        }
        self.account();
    }

    /// Bytes of `chunks` of `object` (its display name) that are neither in
    /// a tier nor admitted to one: what reading the unit here would still
    /// fetch (0: a hybrid scan reads the unit itself).
    pub(crate) fn missing_bytes(&self, object: &str, chunks: &[Range<u64>]) -> u64 {
        let object: Arc<str> = Arc::from(object);
        chunks
            .iter()
            .filter(|r| {
                let key = SegmentKey { object: object.clone(), start: r.start, len: r.end - r.start };
                !(self.memory.as_ref().is_some_and(|m| m.holds(&key)) || self.ssd.as_ref().is_some_and(|s| s.holds(&key)))
            })
            .map(|r| r.end - r.start)
            .sum()
    }

    /// Starts recording every scan's segments (what an offline policy such
    /// as Belady needs), dropping what was recorded before.
    pub fn record_trace(&self) {
        *self.trace.lock().expect("not poisoned") = Some(Vec::new());
    }

    /// The accesses recorded since [`Tiers::record_trace`], one per scan;
    /// recording stops.
    pub fn take_trace(&self) -> Vec<Vec<SegmentKey>> {
        self.trace.lock().expect("not poisoned").take().unwrap_or_default()
    }

    /// Write-through: the column chunks of an object just uploaded go to
    /// the SSD tier (as one access, on a blocking thread), so a load leaves
    /// its data on local disk. The memory tier is left alone: a large load
    /// would push out what queries keep reading. An object whose commit
    /// never comes leaves entries no scan asks for, which age out: object
    /// keys are never reused.
    fn write_through(&self, object: &str, chunks: &[Range<u64>], bytes: &Bytes) {
        let Some(ssd) = self.ssd.clone() else { return };
        let object: Arc<str> = Arc::from(object);
        let segments: Vec<(SegmentKey, Bytes)> = chunks
            .iter()
            .filter(|r| r.end > r.start && r.end <= bytes.len() as u64)
            .map(|r| (SegmentKey { object: object.clone(), start: r.start, len: r.end - r.start }, bytes.slice(r.start as usize..r.end as usize)))
            .collect();
        if segments.is_empty() {
            return;
        }
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => {
                rt.spawn_blocking(move || ssd.write_through(&segments));
            }
            Err(_) => ssd.write_through(&segments),
        }
    }

    /// Keeps the reservation equal to the memory tier's bytes; when the
    /// budget refuses, the tier shrinks to what it has.
    fn account(&self) {
        let Some(m) = &self.memory else { return };
        let used = m.stats().used as usize;
        let r = self.reservation.lock().expect("not poisoned");
        if r.try_resize(used).is_err() {
            // Only what is free: shrink to what is held, then back to the
            // configured size (it refills into free memory only).
            let capacity = m.stats().capacity;
            m.set_capacity(r.size() as u64);
            m.set_capacity(capacity);
            let used = m.stats().used as usize;
            r.resize(used.min(r.size()));
        }
        self.held.store(r.size(), Ordering::Relaxed);
    }

    /// Looks a unit's `chunks` (with their decoded-size estimates) up in
    /// memory, then on SSD (on a blocking thread) unless the router finds
    /// the store faster for it now; what neither serves is listed as
    /// missing.
    pub(crate) async fn lookup(self: &Arc<Self>, chunks: Vec<(SegmentKey, DecodedSize)>) -> Served {
        let mut served = Served::default();
        let mut not_in_memory = Vec::new();
        for (index, (key, decoded)) in chunks.into_iter().enumerate() {
            let fill_memory = match self.memory.as_ref().map(|m| m.get(&key)) {
                Some(Lookup::Hit(chunk)) => {
                    served.memory_hits += 1;
                    served.memory_bytes += key.len;
                    match chunk {
                        CachedChunk::Compressed(bytes) => {
                            // Read a second time: worth its decoded form,
                            // which this scan makes anyway.
                            if self.holds_decoded(key.len, decoded) {
                                served.to_decode.push((index, key.clone()));
                            }
                            served.chunks.push((key.start, bytes))
                        }
                        CachedChunk::Decoded(chunk) => served.decoded.push((index, chunk)),
                    }
                    continue;
                }
                Some(Lookup::Miss { fill }) => fill,
                None => false,
            };
            not_in_memory.push(Missing { range: key.range(), key, fill_memory, on_ssd: false });
        }
        let Some(ssd) = self.ssd.clone() else {
            served.missing = not_in_memory;
            return served;
        };
        // What the SSD holds goes to the SSD or the store, as routed.
        let mut from_ssd = Vec::new();
        for mut m in not_in_memory {
            if ssd.holds(&m.key) {
                let route = if self.route_by_speed { self.router.route(m.key.len) } else { Route::Ssd { ahead: 0 } };
                match route {
                    Route::Ssd { ahead } => {
                        from_ssd.push((m, ahead));
                        continue;
                    }
                    Route::Store => {
                        m.on_ssd = true;
                        served.routed_to_store += 1;
                    }
                }
            }
            served.missing.push(m);
        }
        if from_ssd.is_empty() {
            return served;
        }
        // One blocking read per chunk, all at once: an SSD serves many
        // reads in parallel (its queue depth), as the store does requests.
        let reads = from_ssd.iter().map(|(m, ahead)| {
            let (ssd, key, tiers, ahead) = (ssd.clone(), m.key.clone(), self.clone(), *ahead);
            tokio::task::spawn_blocking(move || {
                let started = std::time::Instant::now();
                tiers.slow_disk(key.len);
                let bytes = ssd.read(&key);
                if tiers.route_by_speed {
                    tiers.router.ssd_finished(key.len, ahead, bytes.as_ref().map(|_| started.elapsed()));
                }
                bytes
            })
        });
        let found: Vec<Option<Bytes>> = futures::future::join_all(reads).await.into_iter().map(|r| r.ok().flatten()).collect();
        for (i, (m, _)) in from_ssd.into_iter().enumerate() {
            match found.get(i).cloned().flatten() {
                Some(bytes) => {
                    served.ssd_hits += 1;
                    served.ssd_bytes += bytes.len() as u64;
                    if m.fill_memory
                        && let Some(mem) = &self.memory
                    {
                        mem.fill(&m.key, CachedChunk::Compressed(bytes.clone()));
                    }
                    served.chunks.push((m.range.start, bytes));
                }
                None => served.missing.push(m),
            }
        }
        served
    }

    /// The slowdown of an SSD made slow for experiments: a delay per read,
    /// and a delay per MiB taken one read at a time (one device whose
    /// bandwidth all reads share, so a saturated disk shows as queueing).
    fn slow_disk(&self, bytes: u64) {
        if !self.ssd_read_delay.is_zero() {
            std::thread::sleep(self.ssd_read_delay);
        }
        if !self.ssd_read_mib_delay.is_zero() {
            let _device = self.ssd_device.lock().unwrap_or_else(|e| e.into_inner());
            std::thread::sleep(self.ssd_read_mib_delay.mul_f64(bytes as f64 / 1048576.0));
        }
    }

    /// A fetch of `bytes` from the store took `took` (for the router).
    pub(crate) fn observe_store(&self, bytes: u64, took: std::time::Duration) {
        if self.ssd.is_some() {
            self.router.observe_store(bytes, took);
        }
    }

    /// The router's estimates and decisions.
    pub fn router(&self) -> RouterStats {
        self.router.stats()
    }

    /// The requests for `missing` chunks.
    pub(crate) fn requests_for(&self, missing: &[Missing]) -> Vec<Span> {
        let ranges: Vec<Range<u64>> = missing.iter().map(|m| m.range.clone()).collect();
        self.policy.plan(&ranges)
    }

    /// Chunks fetched from the store: to the memory tier when it waits for
    /// them (compressed, the bytes as fetched), and written to the SSD tier
    /// in the background when it admitted them (read-through, filled
    /// asynchronously).
    pub(crate) fn fetched(&self, chunks: &[(Missing, Bytes)]) {
        if let Some(mem) = &self.memory {
            for (m, bytes) in chunks {
                if m.fill_memory {
                    mem.fill(&m.key, CachedChunk::Compressed(bytes.clone()));
                }
            }
            self.account();
        }
        if let Some(ssd) = &self.ssd {
            let ssd = ssd.clone();
            let chunks: Vec<(SegmentKey, Bytes)> = chunks.iter().filter(|(m, _)| !m.on_ssd).map(|(m, b)| (m.key.clone(), b.clone())).collect();
            tokio::task::spawn_blocking(move || {
                for (key, bytes) in chunks {
                    ssd.write(&key, &bytes);
                }
            });
        }
    }

    /// Decoded chunks a scan made for the memory tier, in place of the
    /// compressed bytes it held.
    fn fill_decoded(&self, key: &SegmentKey, chunk: Arc<DecodedChunk>) {
        if let Some(mem) = &self.memory {
            mem.replace(key, CachedChunk::Decoded(chunk));
            self.account();
        }
    }

    /// Admitted chunks that will not come: their space is given back.
    fn abandon(&self, keys: impl Iterator<Item = SegmentKey>) {
        if let Some(mem) = &self.memory {
            for key in keys {
                mem.abandon(&key);
            }
            self.account();
        }
    }

    /// Chunks whose download failed: the memory tier stops waiting for them.
    pub(crate) fn failed(&self, missing: &[Missing]) {
        self.abandon(missing.iter().filter(|m| m.fill_memory).map(|m| m.key.clone()));
    }
}

/// Chunks of one unit the memory tier holds compressed and would hold
/// decoded, which the scan decodes from those bytes and hands over. Dropped
/// with some still pending (the query ended first, or decoding failed),
/// those stay compressed: [`Tiers::abandon`] gives back only the space of
/// admitted chunks still waiting for their bytes.
#[derive(Debug)]
pub(crate) struct DecodedFills {
    tiers: Arc<Tiers>,
    /// (index in the unit's chunks, key) of those not yet handed over.
    pending: Vec<(usize, SegmentKey)>,
}

impl DecodedFills {
    pub(crate) fn new(tiers: Arc<Tiers>, pending: Vec<(usize, SegmentKey)>) -> DecodedFills {
        DecodedFills { tiers, pending }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }

    /// The indexes (in the unit's chunks) still to decode.
    pub(crate) fn indexes(&self) -> impl Iterator<Item = usize> + '_ {
        self.pending.iter().map(|(i, _)| *i)
    }

    /// Chunk `index`, decoded into `chunk` of `rows` values (every row of
    /// its row group), goes to the memory tier. Any other length is a
    /// decoder fault and is not kept.
    pub(crate) fn fill(&mut self, index: usize, chunk: Arc<DecodedChunk>, rows: u64) {
        let Some(at) = self.pending.iter().position(|(i, _)| *i == index) else { return };
        let (_, key) = self.pending.swap_remove(at);
        match chunk.len() == rows {
            true => self.tiers.fill_decoded(&key, chunk),
            false => self.tiers.abandon(std::iter::once(key)),
        }
    }
}

impl Drop for DecodedFills {
    fn drop(&mut self) {
        if !self.pending.is_empty() {
            self.tiers.abandon(self.pending.drain(..).map(|(_, k)| k));
        }
    }
}

/// The memory tier gives its bytes back to queries: the least valuable
/// segments are evicted until `bytes` are free; its size stays what was
/// configured, so it refills as memory frees up.
impl Reclaim for Tiers {
    fn consumer(&self) -> &str {
        CONSUMER
    }

    fn reclaimable(&self) -> usize {
        self.held.load(Ordering::Relaxed)
    }

    fn reclaim(&self, bytes: usize) -> usize {
        let Some(m) = &self.memory else { return 0 };
        let r = self.reservation.lock().expect("not poisoned");
        let before = r.size();
        let capacity = m.stats().capacity;
        m.set_capacity(before.saturating_sub(bytes) as u64);
        m.set_capacity(capacity);
        r.resize((m.stats().used as usize).min(before));
        self.held.store(r.size(), Ordering::Relaxed);
        before - r.size()
    }
}

/// Hands every data object the database's writers upload to the tiers
/// (write-through), keyed as the scans will ask for its column chunks.
#[derive(Debug)]
pub(crate) struct WriteThrough {
    pub tiers: Arc<Tiers>,
    pub location: blobhouse_storage::Location,
}

impl blobhouse_storage::UploadObserver for WriteThrough {
    fn uploaded(&self, object: &blobhouse_storage::format::DataObject, bytes: &Bytes) {
        let display = self.location.display(&self.location.child(&object.path));
        let chunks: Vec<Range<u64>> = object.row_groups.iter().flat_map(|rg| rg.columns.iter().map(|c| c.range())).collect();
        self.tiers.write_through(&display, &chunks, bytes);
    }
}
