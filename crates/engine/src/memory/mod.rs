//! One memory budget per engine, and what the process really holds.
//!
//! Everything big an engine holds asks one pool for its bytes: DataFusion's
//! operators (hash tables, sorts, aggregates, repartition queues), the scans'
//! downloaded-but-undecoded row groups ([`crate::pipeline`]) and what scans
//! keep per data object ([`crate::scan::MetadataCache`]: decoded Parquet
//! footers and parsed zone maps). A request the pool cannot
//! grant fails with DataFusion's "Resources exhausted"; operators that can
//! spill then write to the spill directory, the others fail the query with
//! the consumers that held the most — the process is never killed for it.
//!
//! Why our own pool and not DataFusion's `GreedyMemoryPool` or
//! `FairSpillPool`: their size is fixed at construction, and `SET datafusion.runtime.memory_limit` replaces the
//! whole runtime, so reservations held across statements (the footer cache)
//! would stay in a pool nobody limits any more. [`BudgetPool`] is the same
//! greedy first-come rule with a limit that can change while reservations
//! live (first come first served for operators that cannot spill, fair
//! shares for those that can, as `FairSpillPool`), and a high-water mark
//! that is reset per statement, which is what `EXPLAIN ANALYZE`, the shell
//! and the benchmark report.
//!
//! Statements running at once share the budget through a
//! [`StatementPool`] each (see there): a statement may use memory nobody else
//! needs, but when the budget is spent, the statement holding more than its
//! share (the limit divided among the running statements) is refused, not
//! the ones within theirs — a statement over the limit fails alone.
//!
//! The pool bounds what is accounted, not the process: allocator overhead,
//! small batches between operators and the runtime itself are not in it.
//! [`process_memory`] reads the kernel's view (resident set and its peak), so
//! the gap between the two is visible per query (docs/memory.md).

use std::fmt;
use std::num::NonZeroUsize;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};

use datafusion::common::{DataFusionError, Result};
use datafusion::execution::memory_pool::{MemoryConsumer, MemoryLimit, MemoryPool, MemoryReservation, TrackConsumersPool};

mod process;
pub use process::{ProcessMemory, configure_allocator, process_memory, reset_peak_rss};

/// Consumers named in a "Resources exhausted" error.
const TOP_CONSUMERS: usize = 5;

/// Consumers the budget counts but does not refuse while they are small.
/// DataFusion 55's `RepartitionExec` spills its queues when refused, and that
/// path can park every thread of a query for good (apache/datafusion#24883:
/// "RepartitionExec deadlocks under a memory limit"; here a sort-merge join
/// under 128 MiB hung). Its queues are batches in transit, normally a few per
/// partition, so a queue is refused only beyond an eighth of the limit: a
/// consumer slower than its producer (TPC-H Q18 at SF 10: 2.5 GB queued
/// before the final aggregation) then spills instead of taking the budget.
const NEVER_REFUSED: &str = "RepartitionExec";
const QUEUE_DEN: usize = 8;

fn never_refused(consumer: &MemoryConsumer) -> bool {
    consumer.name().starts_with(NEVER_REFUSED)
}

/// Whether a consumer gets a fair share (it can spill and may be refused);
/// every other consumer's bytes count as unspillable.
fn shares(consumer: &MemoryConsumer) -> bool {
    consumer.can_spill() && !never_refused(consumer)
}

/// Memory held only to make later work faster (the caching tiers), given
/// back when a query needs it: the pool asks before it refuses anyone else.
pub trait Reclaim: Send + Sync + fmt::Debug {
    /// The consumer name of the reservation that holds the bytes.
    fn consumer(&self) -> &str;
    /// Bytes held now that could be given back. Called under the pool's
    /// lock: must not touch the pool, nor take a lock held while calling it.
    fn reclaimable(&self) -> usize;
    /// Gives back at least `bytes` if it can (through its reservation, so
    /// the pool sees it); returns what it gave back.
    fn reclaim(&self, bytes: usize) -> usize;
}

/// A refused request, and how many bytes more would have let it through
/// (`None`: freeing memory would not help — a fair share or a queue limit).
struct Refusal {
    error: DataFusionError,
    deficit: Option<usize>,
}

/// Of the limit, the share that operators which can spill may fill
/// together. The rest is for the ones that cannot and come later: a sort
/// reserves its merge buffer only when it starts merging, and with all of
/// the limit shared among eight sorts of a sort-merge join, the first merge
/// found nothing left.
const SPILLERS_NUM: usize = 3;
const SPILLERS_DEN: usize = 4;

/// The engine's pool: a limit that can change while reservations are held,
/// a high-water mark, and fair shares for the consumers that can spill.
///
/// Consumers that cannot spill (hash join build sides, merges, scans) take
/// what is free, first come first served. Each consumer that can spill
/// (sorts, hash aggregations) may hold at most an equal share of what the
/// others leave of three quarters of the limit: `(¾ limit − unspillable) /
/// spillable consumers` — DataFusion's `FairSpillPool` rule, with room kept
/// for the merges that follow a spill. Without it, the first of two sorts takes the whole
/// budget without spilling, and the merge that must follow it finds nothing
/// free (seen in this project's tests: a window over a sorted 130 MB input
/// failed under 96 MiB instead of spilling).
#[derive(Debug)]
pub struct BudgetPool {
    /// Bytes; `usize::MAX` is no limit.
    limit: AtomicUsize,
    state: Mutex<PoolState>,
    /// `spillable + unspillable`, readable without the lock.
    used: AtomicUsize,
    peak: AtomicUsize,
    /// Who gives memory back before a request is refused ([`Reclaim`]).
    reclaimer: OnceLock<Weak<dyn Reclaim>>,
    /// The statements running now, with what each holds.
    statements: Mutex<Vec<Weak<StatementShare>>>,
}

#[derive(Debug, Default)]
struct PoolState {
    spillable: usize,
    unspillable: usize,
    /// Registered consumers that can spill.
    spillers: usize,
}

impl BudgetPool {
    fn new(limit: Option<usize>) -> Self {
        BudgetPool {
            limit: AtomicUsize::new(limit.unwrap_or(usize::MAX)),
            state: Mutex::default(),
            used: AtomicUsize::new(0),
            peak: AtomicUsize::new(0),
            reclaimer: OnceLock::new(),
            statements: Mutex::default(),
        }
    }

    fn limit(&self) -> Option<usize> {
        match self.limit.load(Ordering::Relaxed) {
            usize::MAX => None,
            l => Some(l),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, PoolState> {
        // The state is a few counters updated in one step: a panic elsewhere
        // cannot leave it half-written.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn record(&self, s: &PoolState) {
        let used = s.spillable + s.unspillable;
        self.used.store(used, Ordering::Relaxed);
        self.peak.fetch_max(used, Ordering::Relaxed);
    }
}

impl MemoryPool for BudgetPool {
    fn name(&self) -> &str {
        "blobhouse"
    }

    fn register(&self, consumer: &MemoryConsumer) {
        if shares(consumer) {
            self.state().spillers += 1;
        }
    }

    fn unregister(&self, consumer: &MemoryConsumer) {
        if shares(consumer) {
            let mut s = self.state();
            debug_assert!(s.spillers > 0, "unregistered more spilling consumers than registered");
            s.spillers = s.spillers.saturating_sub(1);
        }
    }

    fn grow(&self, reservation: &MemoryReservation, additional: usize) {
        let mut s = self.state();
        if shares(reservation.consumer()) {
            s.spillable += additional;
        } else {
            s.unspillable += additional;
        }
        self.record(&s);
    }

    fn shrink(&self, reservation: &MemoryReservation, shrink: usize) {
        let mut s = self.state();
        let part = if shares(reservation.consumer()) { &mut s.spillable } else { &mut s.unspillable };
        debug_assert!(*part >= shrink, "pool shrunk below zero");
        *part = part.saturating_sub(shrink);
        self.record(&s);
    }

    fn try_grow(&self, reservation: &MemoryReservation, additional: usize) -> Result<()> {
        let reclaimer = self.reclaimer.get().and_then(Weak::upgrade).filter(|r| r.consumer() != reservation.consumer().name());
        match self.try_grow_once(reservation, additional, reclaimer.as_deref()) {
            Ok(()) => Ok(()),
            // The cache gives back what is missing (outside the pool's
            // lock: it shrinks its reservation), then the request is
            // decided again.
            Err(Refusal { deficit: Some(deficit), .. }) if reclaimer.as_ref().is_some_and(|r| r.reclaim(deficit) > 0) => {
                self.try_grow_once(reservation, additional, reclaimer.as_deref()).map_err(|r| r.error)
            }
            Err(r) => Err(r.error),
        }
    }

    fn reserved(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }

    fn memory_limit(&self) -> MemoryLimit {
        match self.limit() {
            Some(l) => MemoryLimit::Finite(l),
            None => MemoryLimit::Infinite,
        }
    }
}

impl BudgetPool {
    /// One decision on a request. `reclaimer`'s bytes count as free for the
    /// fair shares (they would be given back); a request beyond what is
    /// really free is refused with the deficit.
    fn try_grow_once(&self, reservation: &MemoryReservation, additional: usize, reclaimer: Option<&dyn Reclaim>) -> std::result::Result<(), Refusal> {
        let limit = self.limit.load(Ordering::Relaxed);
        let mut s = self.state();
        let used = s.spillable + s.unspillable;
        let free = limit.saturating_sub(used);
        let reclaimable = reclaimer.map_or(0, |r| r.reclaimable()).min(s.unspillable);
        let consumer = reservation.consumer();
        if never_refused(consumer) && reservation.size() + additional <= limit / QUEUE_DEN {
            // Counted (with the consumers that cannot spill), not refused
            // while the queue is small: see NEVER_REFUSED.
            s.unspillable += additional;
            self.record(&s);
            return Ok(());
        }
        let refuse = |what: String, deficit: Option<usize>| Refusal {
            deficit,
            error: DataFusionError::ResourcesExhausted(format!(
                "{} asked for {} more (it holds {}), but {what}; \
                 raise the limit with SET memory_limit = '…' or --memory-limit, or give the query less to hold",
                consumer.name(),
                format_bytes(additional as u64),
                format_bytes(reservation.size() as u64),
            )),
        };
        if never_refused(consumer) && additional <= free {
            // A queue beyond its allowance spills (DataFusion 55 spills
            // repartition queues when refused).
            return Err(refuse(
                format!(
                    "a repartition queue may hold at most {} (an eighth of the memory limit of {}) before it spills",
                    format_bytes((limit / QUEUE_DEN) as u64),
                    format_bytes(limit as u64)
                ),
                None,
            ));
        }
        if shares(consumer) {
            let share = (limit / SPILLERS_DEN * SPILLERS_NUM).saturating_sub(s.unspillable - reclaimable) / s.spillers.max(1);
            if reservation.size() + additional > share {
                return Err(refuse(
                    format!(
                        "its fair share is {} ({} spilling operators share what the others leave of the memory limit of {})",
                        format_bytes(share as u64),
                        s.spillers,
                        format_bytes(limit as u64)
                    ),
                    None,
                ));
            }
        }
        if additional > free {
            let deficit = (additional - free <= reclaimable).then_some(additional - free);
            return Err(refuse(format!("only {} of the memory limit of {} is free", format_bytes(free as u64), format_bytes(limit as u64)), deficit));
        }
        if shares(consumer) {
            s.spillable += additional;
        } else {
            s.unspillable += additional;
        }
        self.record(&s);
        Ok(())
    }
}

impl fmt::Display for BudgetPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let limit = self.limit().map_or("none".to_string(), |l| format_bytes(l as u64));
        write!(f, "blobhouse memory budget (used {}, limit {limit})", format_bytes(self.reserved() as u64))
    }
}

/// The engine's memory budget: the pool every consumer registers with,
/// wrapped so that errors name the largest consumers.
#[derive(Debug, Clone)]
pub struct MemoryBudget {
    pool: Arc<TrackConsumersPool<BudgetPool>>,
}

impl MemoryBudget {
    /// A budget of `limit` bytes (`None`: unlimited, still accounted).
    pub fn new(limit: Option<usize>) -> Self {
        let top = NonZeroUsize::new(TOP_CONSUMERS).expect("nonzero");
        MemoryBudget { pool: Arc::new(TrackConsumersPool::new(BudgetPool::new(limit), top)) }
    }

    /// The pool, for DataFusion's runtime and our own reservations.
    pub fn pool(&self) -> Arc<dyn MemoryPool> {
        self.pool.clone()
    }

    /// The limit in bytes, `None` if unlimited.
    pub fn limit(&self) -> Option<usize> {
        self.pool.inner().limit()
    }

    /// Changes the limit. Reservations already held stay; new requests see
    /// the new limit (a lower limit than what is held refuses every
    /// request until enough is released).
    pub fn set_limit(&self, limit: Option<usize>) {
        self.pool.inner().limit.store(limit.unwrap_or(usize::MAX), Ordering::Relaxed);
    }

    /// Bytes reserved now.
    pub fn reserved(&self) -> usize {
        self.pool.inner().reserved()
    }

    /// The most reserved at once since the last [`Self::reset_peak`].
    pub fn peak(&self) -> usize {
        self.pool.inner().peak.load(Ordering::Relaxed)
    }

    /// Makes `reclaimer` give memory back before the pool refuses anyone
    /// else (the first one given counts; held weakly).
    pub fn set_reclaimer(&self, reclaimer: Weak<dyn Reclaim>) {
        let _ = self.pool.inner().reclaimer.set(reclaimer);
    }

    /// Starts a new high-water mark from what is reserved now.
    pub fn reset_peak(&self) {
        let pool = self.pool.inner();
        pool.peak.store(pool.reserved(), Ordering::Relaxed);
    }

    /// A pool for one statement's operators: the budget's, with what the
    /// statement holds kept apart so that it can be told from the others
    /// when the budget is spent ([`StatementPool`]). The statement counts
    /// as running while the pool lives.
    pub fn statement_pool(&self) -> Arc<dyn MemoryPool> {
        let share = Arc::new(StatementShare::default());
        let mut statements = self.pool.inner().statements.lock().unwrap_or_else(|p| p.into_inner());
        statements.retain(|s| s.strong_count() > 0);
        statements.push(Arc::downgrade(&share));
        drop(statements);
        Arc::new(StatementPool { budget: self.pool.clone(), share })
    }
}

/// What one running statement holds of the budget.
#[derive(Debug, Default)]
struct StatementShare {
    held: AtomicUsize,
    /// Over its share when another statement needed the memory: refused
    /// while it stays over.
    evicted: AtomicBool,
}

/// One statement's view of the engine's budget.
///
/// Requests go to the budget as they would without it. When the budget
/// refuses a request of a statement that holds no more than its share —
/// the limit divided by the statements running — and another statement
/// holds more than its own, the request is granted all the same and that
/// other statement is marked: its requests are refused from then on until
/// it is back within its share. An operator that can spill then spills;
/// one that cannot fails its statement with an error that says why. So a
/// statement alone may use the whole limit, several share it, and the one
/// that takes more than its share when the others need it is the one that
/// fails. The granted bytes may put the budget over the limit until the
/// marked statement gives its memory back (at most the shares of the
/// statements within theirs). DataFusion's pools divide a budget among
/// operators, not statements, which is why this is ours.
#[derive(Debug)]
pub struct StatementPool {
    budget: Arc<TrackConsumersPool<BudgetPool>>,
    share: Arc<StatementShare>,
}

impl StatementPool {
    /// The limit divided among the running statements, and their number.
    fn fair_share(&self, limit: usize) -> (usize, usize) {
        let statements = self.budget.inner().statements.lock().unwrap_or_else(|p| p.into_inner());
        let running = statements.iter().filter(|s| s.strong_count() > 0).count().max(1);
        (limit / running, running)
    }

    /// Marks the statement that holds the most beyond its share, if this
    /// one (after `additional` more) is within its own: whether the request
    /// may then be granted over the limit.
    fn make_room(&self, additional: usize) -> bool {
        let Some(limit) = self.budget.inner().limit() else { return false };
        let (share, _) = self.fair_share(limit);
        if self.share.held.load(Ordering::Relaxed) + additional > share {
            return false;
        }
        let statements = self.budget.inner().statements.lock().unwrap_or_else(|p| p.into_inner());
        let borrower = statements
            .iter()
            .filter_map(Weak::upgrade)
            .filter(|s| !Arc::ptr_eq(s, &self.share) && s.held.load(Ordering::Relaxed) > share)
            .max_by_key(|s| s.held.load(Ordering::Relaxed));
        match borrower {
            Some(b) => {
                b.evicted.store(true, Ordering::Relaxed);
                true
            }
            None => false,
        }
    }
}

impl fmt::Display for StatementPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "a statement holding {} of the {}", format_bytes(self.share.held.load(Ordering::Relaxed) as u64), self.budget.inner())
    }
}

impl MemoryPool for StatementPool {
    fn name(&self) -> &str {
        "blobhouse statement"
    }

    fn register(&self, consumer: &MemoryConsumer) {
        self.budget.register(consumer)
    }

    fn unregister(&self, consumer: &MemoryConsumer) {
        self.budget.unregister(consumer)
    }

    fn grow(&self, reservation: &MemoryReservation, additional: usize) {
        self.budget.grow(reservation, additional);
        self.share.held.fetch_add(additional, Ordering::Relaxed);
    }

    fn shrink(&self, reservation: &MemoryReservation, shrink: usize) {
        self.budget.shrink(reservation, shrink);
        // A statement frees only what it took; saturating in one step all the same.
        let _ = self.share.held.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |held| Some(held.saturating_sub(shrink)));
    }

    fn try_grow(&self, reservation: &MemoryReservation, additional: usize) -> Result<()> {
        if self.share.evicted.load(Ordering::Relaxed)
            && let Some(limit) = self.budget.inner().limit()
        {
            let held = self.share.held.load(Ordering::Relaxed);
            let (share, running) = self.fair_share(limit);
            if held + additional > share {
                return Err(DataFusionError::ResourcesExhausted(format!(
                    "{} asked for {} more, but its statement holds {} and other statements need the memory: with {running} statements running, \
                     each may hold {} of the memory limit of {}; run it when fewer statements run, \
                     raise the limit with SET memory_limit = '…' or --memory-limit, or give the query less to hold",
                    reservation.consumer().name(),
                    format_bytes(additional as u64),
                    format_bytes(held as u64),
                    format_bytes(share as u64),
                    format_bytes(limit as u64),
                )));
            }
            self.share.evicted.store(false, Ordering::Relaxed);
        }
        match self.budget.try_grow(reservation, additional) {
            Ok(()) => {}
            Err(e) => {
                if !self.make_room(additional) {
                    return Err(e);
                }
                // Within its share while another statement is over its own:
                // granted, and the other is refused until it gives back.
                self.budget.grow(reservation, additional);
            }
        }
        self.share.held.fetch_add(additional, Ordering::Relaxed);
        Ok(())
    }

    fn reserved(&self) -> usize {
        self.budget.reserved()
    }

    fn memory_limit(&self) -> MemoryLimit {
        self.budget.memory_limit()
    }
}

/// The default memory limit: half the machine's memory. The rest is for the
/// kernel's page cache, other processes, and what the pool does not see
/// (allocator overhead, batches in transit, the runtime), which docs/memory.md
/// measures.
pub fn default_limit() -> usize {
    (blobhouse_io::manager::physical_memory() / 2) as usize
}

/// A size as people write it: `4G`, `4GB`, `4 GiB`, `512M`, `1.5g`,
/// `1073741824` (bytes), or a share of the machine's memory (`60%`). Units
/// are powers of 1024, as DuckDB and DataFusion read them.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim().trim_matches('\'').trim();
    let bad = || format!("'{text}' is not a size: write e.g. 4G, 512MB, 1.5GiB, 60% (of the machine's memory) or a number of bytes");
    if let Some(pct) = t.strip_suffix('%') {
        let p: f64 = pct.trim().parse().map_err(|_| bad())?;
        if !(p > 0.0 && p <= 100.0) {
            return Err(format!("'{text}': a share of memory must be above 0% and at most 100%"));
        }
        return Ok((blobhouse_io::manager::physical_memory() as f64 * p / 100.0) as u64);
    }
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let n: f64 = number.parse().map_err(|_| bad())?;
    let shift = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        _ => return Err(bad()),
    };
    let bytes = n * (1u64 << shift) as f64;
    if !bytes.is_finite() || bytes < 1.0 {
        return Err(format!("'{text}': a size must be at least one byte"));
    }
    Ok(bytes as u64)
}

/// A memory limit as `SET memory_limit` and `--memory-limit` take it: a
/// size or share of memory ([`parse_size`]), or `none` / `unlimited`.
pub fn parse_limit(text: &str) -> Result<Option<usize>, String> {
    match text.trim().trim_matches('\'').trim().to_ascii_lowercase().as_str() {
        "none" | "unlimited" => Ok(None),
        _ => parse_size(text).map(|b| Some(b as usize)),
    }
}

/// Bytes for people: `512 B`, `3.2 MiB`, `4.0 GiB`.
pub fn format_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes as f64;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    if unit == 0 { format!("{bytes} B") } else { format!("{v:.1} {}", UNITS[unit]) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::execution::memory_pool::MemoryConsumer;

    /// A cache of bytes held in the pool, giving them back on request.
    #[derive(Debug)]
    struct FakeCache {
        reservation: Mutex<MemoryReservation>,
    }

    impl Reclaim for FakeCache {
        fn consumer(&self) -> &str {
            "FakeCache"
        }
        fn reclaimable(&self) -> usize {
            // (A real reclaimer reads an atomic here; the test's lock is never
            // held while the pool calls.)
            self.reservation.lock().unwrap().size()
        }
        fn reclaim(&self, bytes: usize) -> usize {
            let r = self.reservation.lock().unwrap();
            let give = bytes.min(r.size());
            r.shrink(give);
            give
        }
    }

    /// Memory held by a cache is given back before anyone else is refused,
    /// counts as free for the spilling operators' fair shares, and the
    /// cache itself is never refused by taking from itself.
    #[test]
    fn a_cache_gives_its_memory_back_before_a_query_is_refused() {
        let mib = 1 << 20;
        let budget = MemoryBudget::new(Some(100 * mib));
        let pool = budget.pool();
        let cache = Arc::new(FakeCache { reservation: Mutex::new(MemoryConsumer::new("FakeCache").register(&pool)) });
        cache.reservation.lock().unwrap().try_grow(80 * mib).unwrap();
        let join = MemoryConsumer::new("HashJoinInput").register(&pool);
        // Without a reclaimer: refused (20 MiB free).
        assert!(join.try_grow(50 * mib).is_err());
        budget.set_reclaimer(Arc::downgrade(&cache) as Weak<dyn Reclaim>);
        join.try_grow(50 * mib).unwrap();
        assert_eq!(cache.reservation.lock().unwrap().size(), 50 * mib, "the cache gave back exactly the 30 MiB missing");
        // A spilling operator's share ignores what the cache holds.
        let sort = MemoryConsumer::new("ExternalSorter").with_can_spill(true).register(&pool);
        sort.try_grow(20 * mib).unwrap();
        assert_eq!(cache.reservation.lock().unwrap().size(), 30 * mib);
        // Beyond what the cache could give: refused as before.
        assert!(join.try_grow(40 * mib).is_err());
        // The cache growing never takes from itself.
        assert!(cache.reservation.lock().unwrap().try_grow(mib).is_err());
        assert_eq!(cache.reservation.lock().unwrap().size(), 30 * mib);
    }

    #[test]
    fn sizes_parse_like_duckdb_and_datafusion_write_them() {
        assert_eq!(parse_size("4G"), Ok(4 << 30));
        assert_eq!(parse_size("'4GB'"), Ok(4 << 30));
        assert_eq!(parse_size("4 GiB"), Ok(4 << 30));
        assert_eq!(parse_size("1.5g"), Ok(3 << 29));
        assert_eq!(parse_size("512MB"), Ok(512 << 20));
        assert_eq!(parse_size("1000"), Ok(1000));
        assert_eq!(parse_limit("'none'"), Ok(None));
        assert_eq!(parse_limit("Unlimited"), Ok(None));
        assert_eq!(parse_limit("2G"), Ok(Some(2 << 30)));
        assert!(parse_size("50%").unwrap() > 0);
        for bad in ["", "G", "4X", "-1G", "0", "0%", "150%", "four"] {
            let e = parse_size(bad).unwrap_err();
            assert!(e.contains(bad) || e.contains("at least") || e.contains("share"), "{bad}: {e}");
        }
    }

    #[test]
    fn the_budget_refuses_beyond_its_limit_names_the_consumer_and_follows_a_new_limit() {
        let budget = MemoryBudget::new(Some(1000));
        let pool = budget.pool();
        let a = MemoryConsumer::new("HashJoinInput[0]").register(&pool);
        a.try_grow(600).unwrap();
        let b = MemoryConsumer::new("BlobScan[lineitem]").register(&pool);
        let e = b.try_grow(500).unwrap_err().to_string();
        assert!(e.contains("Resources exhausted"), "{e}");
        assert!(e.contains("BlobScan[lineitem]") && e.contains("HashJoinInput[0]"), "names the asking and the largest consumers: {e}");
        assert!(e.contains("1000 B") && e.contains("memory_limit"), "names the limit and how to raise it: {e}");
        assert_eq!(budget.reserved(), 600, "a refused request reserves nothing");
        budget.set_limit(Some(2000));
        b.try_grow(500).unwrap();
        assert_eq!(budget.peak(), 1100);
        a.shrink(600);
        budget.reset_peak();
        assert_eq!(budget.peak(), 500, "a new mark starts from what is held");
        budget.set_limit(Some(100));
        assert!(a.try_grow(1).is_err(), "a limit below what is held refuses every request");
        budget.set_limit(None);
        a.try_grow(1 << 40).unwrap();
        assert_eq!(budget.limit(), None);
    }

    #[test]
    fn spilling_consumers_get_fair_shares_of_what_the_others_leave() {
        let budget = MemoryBudget::new(Some(1000));
        let pool = budget.pool();
        let join = MemoryConsumer::new("HashJoinInput[0]").register(&pool);
        join.try_grow(200).unwrap();
        let sort_a = MemoryConsumer::new("ExternalSorter[0]").with_can_spill(true).register(&pool);
        let sort_b = MemoryConsumer::new("ExternalSorter[1]").with_can_spill(true).register(&pool);
        // 550 left by the join of three quarters, two sorts: 275 each.
        sort_a.try_grow(275).unwrap();
        let e = sort_a.try_grow(1).unwrap_err().to_string();
        assert!(e.contains("fair share") && e.contains("ExternalSorter[0]"), "{e}");
        sort_b.try_grow(275).unwrap();
        assert_eq!(budget.reserved(), 750);
        // What the sorts leave is for operators that cannot spill.
        join.try_grow(250).unwrap();
        assert!(join.try_grow(1).is_err(), "the limit holds for everyone");
        join.shrink(250);
        drop(sort_b);
        // One sort left: it may have all that the join leaves of three quarters.
        sort_a.try_grow(275).unwrap();
        assert!(sort_a.try_grow(1).is_err());
        assert_eq!(budget.reserved(), 750);
        assert_eq!(budget.peak(), 1000);
    }

    #[test]
    fn repartition_queues_are_not_refused_until_an_eighth_of_the_limit() {
        let budget = MemoryBudget::new(Some(800));
        let pool = budget.pool();
        let sort = MemoryConsumer::new("ExternalSorter[0]").with_can_spill(true).register(&pool);
        sort.try_grow(600).unwrap();
        let queue = MemoryConsumer::new("RepartitionExec[0]").with_can_spill(true).register(&pool);
        queue.try_grow(100).unwrap();
        let e = queue.try_grow(1).unwrap_err().to_string();
        assert!(e.contains("repartition queue") && e.contains("100 B"), "beyond its eighth the queue spills: {e}");
        let join = MemoryConsumer::new("HashJoinInput[0]").register(&pool);
        join.try_grow(100).unwrap();
        // The budget is spent; a small queue still gets its bytes (no hang).
        let other = MemoryConsumer::new("RepartitionExec[1]").with_can_spill(true).register(&pool);
        other.try_grow(50).unwrap();
        assert_eq!(budget.reserved(), 850);
        assert!(join.try_grow(1).is_err(), "the others see the budget spent");
        queue.shrink(100);
        other.shrink(50);
        assert_eq!(budget.reserved(), 700);
    }

    /// Two statements share a spent budget: the one within its half is
    /// granted, the one over its half is refused until it is back within
    /// it; a statement alone may use all of the limit.
    #[test]
    fn the_statement_over_its_share_is_refused_not_the_others() {
        let budget = MemoryBudget::new(Some(1000));
        let hog_pool = budget.statement_pool();
        let hog = MemoryConsumer::new("AggregateStream[0]").register(&hog_pool);
        hog.try_grow(950).unwrap();
        {
            let small_pool = budget.statement_pool();
            let small = MemoryConsumer::new("HashJoinInput[0]").register(&small_pool);
            // Spent budget, but 200 is within the small one's half: granted.
            small.try_grow(200).unwrap();
            assert_eq!(budget.reserved(), 1150, "granted over the limit until the hog gives back");
            let e = hog.try_grow(10).unwrap_err().to_string();
            assert!(e.contains("AggregateStream[0]") && e.contains("2 statements running") && e.contains("500 B"), "{e}");
            // Beyond its own half the small one is refused as usual.
            assert!(small.try_grow(400).is_err());
            // Back within its half, the hog may grow again (up to its share).
            hog.shrink(600);
            hog.try_grow(10).unwrap();
        }
        // Alone again: the whole limit.
        hog.try_grow(600).unwrap();
        assert_eq!(budget.reserved(), 960);
    }

    #[test]
    fn the_kernel_reports_the_resident_set_and_its_peak_resets() {
        let Some(before) = process_memory() else { return };
        assert!(before.rss > 0 && before.peak_rss >= before.rss);
        // Touch 64 MiB, free it, reset: the peak comes back down.
        let big = vec![1u8; 64 << 20];
        std::hint::black_box(&big);
        let touched = process_memory().unwrap();
        assert!(touched.peak_rss >= before.rss + (60 << 20), "{before:?} {touched:?}");
        drop(big);
        if reset_peak_rss() {
            let after = process_memory().unwrap();
            assert!(after.peak_rss < touched.peak_rss, "{touched:?} {after:?}");
        }
    }
}
