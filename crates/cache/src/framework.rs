//! The benefit-based caching framework (FlexPushdownDB §5.2, Algorithm 1),
//! over segment sizes only; the tiers keep the bytes.
//!
//! For each query: every segment it reads gains benefit (the policy's
//! `record`); then the segments it reads that are not cached are taken in
//! decreasing benefit. One that fits is admitted; otherwise the cached
//! segment of least benefit is evicted if it is worth less than the
//! newcomer (by more than the policy's admission margin, 0 but for
//! Weighted-LFU), else the newcomer stays out. A margin is a cost of the
//! admission itself, so it is charged into free space too: there, the
//! newcomer must be worth more than the margin alone. Two rules the paper leaves open:
//! a query never evicts a segment it reads itself (its bytes are in use),
//! and a segment larger than the whole tier is never admitted. Admission is
//! eager and greedy, as in the paper. One rule the paper does not need:
//! segments useful only together (a unit, [`Touch::unit`]) are admitted all
//! or none.

use std::collections::{HashMap, HashSet};

use crate::key::SegmentKey;
use crate::policy::{Access, Policy};

/// How many segments the framework remembers beyond those cached (their
/// policy history: an LFU counter that grows until it beats a victim).
/// Past it, the history of uncached segments is dropped. An explicit
/// limit: each entry is about a hundred bytes.
pub const HISTORY_LIMIT: usize = 1 << 18;

/// One segment a query reads.
#[derive(Debug, Clone, PartialEq)]
pub struct Touch {
    pub key: SegmentKey,
    /// Bytes it takes in the tier.
    pub size: u64,
    /// What a miss costs relative to a plain fetch (1.0; see [`Policy::record`]).
    pub weight: f64,
    /// Segments of one query with the same unit are useful only together
    /// (the column chunks of a row group that a hybrid scan reads here only
    /// when all are cached, and otherwise pushes down whole): the missing
    /// ones are admitted all or none, valued by their bytes' mean benefit.
    /// `None`: a segment on its own.
    pub unit: Option<u64>,
    /// Reads whose weight is estimated together ([`Access::class`]).
    pub class: Option<u64>,
}

impl Touch {
    /// A segment of `key.len` bytes, weight 1, on its own.
    pub fn of(key: SegmentKey) -> Touch {
        Touch { size: key.len, key, weight: 1.0, unit: None, class: None }
    }
}

/// What Algorithm 1 considers admitting at once: one segment, or the
/// missing segments of one unit.
struct Candidate<'a> {
    benefit: f64,
    margin: f64,
    size: u64,
    touches: Vec<&'a Touch>,
}

/// What the framework decided for one query.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Decision {
    /// Read segments that were cached.
    pub hits: Vec<SegmentKey>,
    /// Read segments now admitted (their bytes are still to come).
    pub admitted: Vec<SegmentKey>,
    /// Read segments left out.
    pub rejected: Vec<SegmentKey>,
    /// Cached segments evicted to make room.
    pub evicted: Vec<SegmentKey>,
}

/// The framework: a policy, a capacity in bytes, and what is cached.
pub struct BenefitCache {
    policy: Box<dyn Policy>,
    capacity: u64,
    used: u64,
    cached: HashMap<SegmentKey, u64>,
    /// Segments the policy has a history of (cached ones included).
    tracked: HashSet<SegmentKey>,
    query: u64,
}

impl BenefitCache {
    /// An empty cache of `capacity` bytes valuing segments by `policy`.
    pub fn new(capacity: u64, policy: Box<dyn Policy>) -> BenefitCache {
        BenefitCache { policy, capacity, used: 0, cached: HashMap::new(), tracked: HashSet::new(), query: 0 }
    }

    /// The policy's name.
    pub fn policy_name(&self) -> &'static str {
        self.policy.name()
    }

    /// Bytes the cached segments take (admitted ones included).
    pub fn used(&self) -> u64 {
        self.used
    }

    /// The bound on [`BenefitCache::used`].
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Whether `key` is cached (or admitted and on its way).
    pub fn contains(&self, key: &SegmentKey) -> bool {
        self.cached.contains_key(key)
    }

    /// The cached segments with their size and current benefit.
    pub fn entries(&self) -> Vec<(SegmentKey, u64, f64)> {
        let now = self.query;
        self.cached.iter().map(|(k, s)| (k.clone(), *s, self.policy.benefit(k, now))).collect()
    }

    /// Algorithm 1 for one query reading `touched` (duplicates count once).
    pub fn on_query(&mut self, touched: &[Touch]) -> Decision {
        self.query += 1;
        let now = self.query;
        let mut seen = HashSet::new();
        let unique: Vec<&Touch> = touched.iter().filter(|t| seen.insert(&t.key)).collect();
        for t in &unique {
            self.policy.record(&t.key, Access { size: t.size, weight: t.weight, class: t.class }, now);
            self.tracked.insert(t.key.clone());
        }
        let mut decision = Decision::default();
        let mut missing: Vec<(f64, &Touch)> = Vec::new();
        for t in &unique {
            if self.cached.contains_key(&t.key) {
                decision.hits.push(t.key.clone());
            } else {
                missing.push((self.policy.benefit(&t.key, now), t));
            }
        }
        let mut candidates: Vec<Candidate> = Vec::new();
        let mut of_unit: HashMap<u64, usize> = HashMap::new();
        for (benefit, t) in missing {
            let margin = self.policy.admission_margin(t.size, t.weight);
            match t.unit.and_then(|u| of_unit.get(&u).copied()) {
                Some(i) => {
                    // Byte-weighted sums for now, per byte below.
                    let c = &mut candidates[i];
                    if c.touches.len() == 1 {
                        c.benefit *= c.size as f64;
                        c.margin *= c.size as f64;
                    }
                    c.benefit += benefit * t.size as f64;
                    c.margin += margin * t.size as f64;
                    c.size += t.size;
                    c.touches.push(t);
                }
                None => {
                    if let Some(u) = t.unit {
                        of_unit.insert(u, candidates.len());
                    }
                    candidates.push(Candidate { benefit, margin, size: t.size, touches: vec![t] });
                }
            }
        }
        for c in candidates.iter_mut().filter(|c| c.touches.len() > 1) {
            c.benefit /= c.size.max(1) as f64;
            c.margin /= c.size.max(1) as f64;
        }
        candidates.sort_by(|a, b| b.benefit.total_cmp(&a.benefit).then_with(|| a.touches[0].key.cmp(&b.touches[0].key)));
        // Victims: cached segments this query does not read, least benefit first.
        let mut victims: Vec<(f64, SegmentKey)> =
            self.cached.keys().filter(|k| !seen.contains(k)).map(|k| (self.policy.benefit(k, now), k.clone())).collect();
        victims.sort_by(|a, b| a.0.total_cmp(&b.0).then_with(|| a.1.cmp(&b.1)));
        let mut next_victim = 0;
        for c in candidates {
            let admitted = if c.size > self.capacity || (c.margin > 0.0 && c.benefit <= c.margin) {
                // Too large, or not worth its fill even into free space.
                false
            } else if c.touches.len() == 1 {
                // Algorithm 1: evict while the victim is worth less.
                loop {
                    if self.used + c.size <= self.capacity {
                        break true;
                    }
                    match victims.get(next_victim) {
                        Some((victim_benefit, victim)) if *victim_benefit + c.margin < c.benefit => {
                            self.used -= self.cached.remove(victim).expect("victims are cached");
                            decision.evicted.push(victim.clone());
                            next_victim += 1;
                        }
                        _ => break false,
                    }
                }
            } else {
                // A unit: evict only if that makes room for all of it.
                let (mut end, mut freed) = (next_victim, 0);
                while self.used - freed + c.size > self.capacity
                    && let Some((victim_benefit, victim)) = victims.get(end)
                    && *victim_benefit + c.margin < c.benefit
                {
                    freed += self.cached[victim];
                    end += 1;
                }
                let fits = self.used - freed + c.size <= self.capacity;
                if fits {
                    for (_, victim) in &victims[next_victim..end] {
                        self.used -= self.cached.remove(victim).expect("victims are cached");
                        decision.evicted.push(victim.clone());
                    }
                    next_victim = end;
                }
                fits
            };
            for t in c.touches {
                if admitted {
                    self.used += t.size;
                    self.cached.insert(t.key.clone(), t.size);
                    decision.admitted.push(t.key.clone());
                } else {
                    decision.rejected.push(t.key.clone());
                }
            }
        }
        self.bound_history();
        debug_assert!(self.used <= self.capacity);
        decision
    }

    /// A segment that is cached already (an SSD tier's entries found after
    /// a restart), kept if it fits; later calls count as more recent.
    pub fn insert(&mut self, key: SegmentKey, size: u64) -> bool {
        if self.cached.contains_key(&key) {
            return true;
        }
        if self.used + size > self.capacity {
            return false;
        }
        self.policy.record(&key, Access::plain(size), self.query);
        self.tracked.insert(key.clone());
        self.cached.insert(key, size);
        self.used += size;
        true
    }

    /// Drops `key` (an admitted segment whose bytes never came, or one a
    /// tier lost); its history stays.
    pub fn remove(&mut self, key: &SegmentKey) -> bool {
        match self.cached.remove(key) {
            Some(size) => {
                self.used -= size;
                true
            }
            None => false,
        }
    }

    /// Charges cached segment `key` `size` bytes from now on (it was
    /// admitted at an estimate, and its real size is known). When the
    /// cache then overflows, the least valuable segments are evicted until
    /// it fits again — `key` too, when it is the least valuable — and
    /// returned. Not cached: nothing happens.
    pub fn resize(&mut self, key: &SegmentKey, size: u64) -> Vec<SegmentKey> {
        let Some(old) = self.cached.get_mut(key) else { return Vec::new() };
        self.used = self.used - *old + size;
        *old = size;
        if self.used <= self.capacity {
            return Vec::new();
        }
        self.evict_to(self.capacity)
    }

    /// Evicts the least valuable segments until `used` is at most `bytes`.
    fn evict_to(&mut self, bytes: u64) -> Vec<SegmentKey> {
        let now = self.query;
        let mut by_benefit: Vec<(f64, SegmentKey)> = self.cached.keys().map(|k| (self.policy.benefit(k, now), k.clone())).collect();
        by_benefit.sort_by(|a, b| a.0.total_cmp(&b.0).then_with(|| a.1.cmp(&b.1)));
        let mut evicted = Vec::new();
        for (_, key) in by_benefit {
            if self.used <= bytes {
                break;
            }
            self.remove(&key);
            evicted.push(key);
        }
        evicted
    }

    /// Values segments by `policy` from now on. The cached segments stay,
    /// each recorded once with the new policy; other history is dropped.
    pub fn set_policy(&mut self, policy: Box<dyn Policy>) {
        self.policy = policy;
        self.tracked = self.cached.keys().cloned().collect();
        let mut cached: Vec<(&SegmentKey, &u64)> = self.cached.iter().collect();
        cached.sort();
        for (key, size) in cached {
            self.policy.record(key, Access::plain(*size), self.query);
        }
    }

    /// A new capacity; evicts the least valuable segments until they fit.
    pub fn set_capacity(&mut self, capacity: u64) -> Vec<SegmentKey> {
        self.capacity = capacity;
        if self.used <= capacity {
            return Vec::new();
        }
        self.evict_to(capacity)
    }

    fn bound_history(&mut self) {
        if self.tracked.len() <= HISTORY_LIMIT {
            return;
        }
        let cached = &self.cached;
        let policy = &mut self.policy;
        self.tracked.retain(|k| {
            let keep = cached.contains_key(k);
            if !keep {
                policy.forget(k);
            }
            keep
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::{Belady, Lfu, Lru};

    fn k(name: &str) -> SegmentKey {
        SegmentKey::new(name, 0, 100)
    }

    fn q(names: &[&str]) -> Vec<Touch> {
        names.iter().map(|n| Touch::of(k(n))).collect()
    }

    /// Replays `trace` (one query per entry) and counts the segments each
    /// query found cached.
    fn hits(trace: &[Vec<SegmentKey>], capacity: u64, policy: Box<dyn Policy>) -> usize {
        let mut cache = BenefitCache::new(capacity, policy);
        trace.iter().map(|query| cache.on_query(&query.iter().cloned().map(Touch::of).collect::<Vec<_>>()).hits.len()).sum()
    }

    #[test]
    fn a_segment_charged_more_than_its_estimate_evicts_the_least_valuable() {
        let mut c = BenefitCache::new(300, Box::new(Lru::default()));
        for name in ["a", "b", "c"] {
            c.on_query(&q(&[name]));
        }
        assert_eq!(c.used(), 300);
        // Smaller than admitted: room, nothing goes.
        assert!(c.resize(&k("c"), 50).is_empty());
        assert_eq!(c.used(), 250);
        // Larger: the least recently used go until it fits.
        assert_eq!(c.resize(&k("c"), 180), vec![k("a")]);
        assert_eq!((c.used(), c.contains(&k("b")), c.contains(&k("c"))), (280, true, true));
        // Larger than the cache, and the least valuable: it goes itself.
        assert_eq!(c.resize(&k("b"), 400), vec![k("b")]);
        assert_eq!((c.used(), c.contains(&k("c"))), (180, true));
        assert!(c.resize(&k("zz"), 10).is_empty(), "not cached: nothing to charge");
        assert_eq!(c.used(), 180);
    }

    #[test]
    fn lru_evicts_the_least_recently_used() {
        let mut c = BenefitCache::new(200, Box::new(Lru::default()));
        assert_eq!(c.on_query(&q(&["a"])).admitted, vec![k("a")]);
        assert_eq!(c.on_query(&q(&["b"])).admitted, vec![k("b")]);
        let d = c.on_query(&q(&["c"]));
        assert_eq!((d.admitted, d.evicted), (vec![k("c")], vec![k("a")]));
        let d = c.on_query(&q(&["b"]));
        assert_eq!(d.hits, vec![k("b")]);
        let d = c.on_query(&q(&["a"]));
        assert_eq!(d.evicted, vec![k("c")], "c was used less recently than b");
    }

    #[test]
    fn lfu_admits_a_newcomer_only_once_it_is_read_more_often_than_the_victim() {
        let mut c = BenefitCache::new(200, Box::new(Lfu::default()));
        for _ in 0..3 {
            c.on_query(&q(&["a"]));
        }
        c.on_query(&q(&["b"]));
        // c is as frequent as b (once): a tie keeps the incumbent.
        let d = c.on_query(&q(&["c"]));
        assert_eq!((d.rejected.clone(), d.evicted.len()), (vec![k("c")], 0));
        // Read twice, c beats b (read once), never a (read three times).
        let d = c.on_query(&q(&["c"]));
        assert_eq!((d.admitted, d.evicted), (vec![k("c")], vec![k("b")]));
        assert!(c.contains(&k("a")));
    }

    /// Weighted-LFU: a segment a node filters cheaply (weight 0.3) must
    /// lead by 0.7 of an access before it evicts anything — its fill would
    /// fetch whole what a push moves less than a third of — while plain
    /// LFU takes any lead; and two segments whose weights differ by a few
    /// percent do not evict each other.
    #[test]
    fn weighted_lfu_charges_an_admission_its_fill() {
        let touch = |name: &str, weight: f64| Touch { weight, ..Touch::of(k(name)) };
        let mut c = BenefitCache::new(100, Box::new(Lfu::weighted()));
        c.on_query(&[touch("dear", 1.0)]);
        // "dear": 1/100. "cheap" gains 0.3/100 a read: it leads from the
        // fourth read (1.2/100) but by more than 0.7/100 only from the
        // sixth (1.8/100 > 1.7/100).
        for i in 1..=5 {
            let d = c.on_query(&[touch("cheap", 0.3)]);
            assert!(d.evicted.is_empty(), "read {i}: {d:?}");
        }
        let d = c.on_query(&[touch("cheap", 0.3)]);
        assert_eq!(d.evicted, vec![k("dear")]);
        // Equal segments with drifting weights keep the incumbent.
        let mut c = BenefitCache::new(100, Box::new(Lfu::weighted()));
        c.on_query(&[touch("a", 0.90)]);
        let d = c.on_query(&[touch("b", 0.93)]);
        assert_eq!((d.rejected, d.evicted.len()), (vec![k("b")], 0));
        // Plain LFU takes any lead, whatever the weights.
        let mut c = BenefitCache::new(100, Box::new(Lfu::default()));
        c.on_query(&[touch("dear", 1.0)]);
        c.on_query(&[touch("cheap", 0.3)]);
        assert_eq!(c.on_query(&[touch("cheap", 0.3)]).evicted, vec![k("dear")]);
    }

    /// Free space does not make a Weighted-LFU admission free: a segment a
    /// node filters cheaply (weight 0.2) is fetched whole only once its
    /// reads are worth more than that fill (0.8 of an access), while a
    /// segment read whole on a miss comes in on its first read, as with
    /// plain LFU.
    #[test]
    fn weighted_lfu_charges_the_fill_into_free_space_too() {
        let touch = |name: &str, weight: f64| Touch { weight, ..Touch::of(k(name)) };
        let mut c = BenefitCache::new(1000, Box::new(Lfu::weighted()));
        for read in 1..=4 {
            let d = c.on_query(&[touch("cheap", 0.2)]);
            assert_eq!(d.rejected, vec![k("cheap")], "read {read}: 0.{}/100 is not above 0.8/100", read * 2);
        }
        assert_eq!(c.on_query(&[touch("cheap", 0.2)]).admitted, vec![k("cheap")], "1.0/100 > 0.8/100");
        assert_eq!(c.on_query(&[touch("dear", 1.0)]).admitted, vec![k("dear")]);
        let mut lfu = BenefitCache::new(1000, Box::new(Lfu::default()));
        assert_eq!(lfu.on_query(&[touch("cheap", 0.2)]).admitted, vec![k("cheap")]);
    }

    /// The missing segments of one unit are admitted all or none: never a
    /// part that fits while the rest does not, and victims are evicted only
    /// when the whole unit then fits.
    #[test]
    fn a_unit_is_admitted_whole_or_not_at_all() {
        let unit = |name: &str, u: u64| Touch { unit: Some(u), ..Touch::of(k(name)) };
        let mut c = BenefitCache::new(150, Box::new(Lfu::default()));
        let d = c.on_query(&[unit("a", 1), unit("b", 1)]);
        assert_eq!((d.admitted.len(), d.rejected.len(), c.used()), (0, 2, 0), "200 bytes never fit in 150");
        let mut c = BenefitCache::new(250, Box::new(Lfu::default()));
        c.on_query(&q(&["x", "y"]));
        c.on_query(&q(&["y"]));
        // Read once like x: no lead, so nothing is evicted for the unit.
        let d = c.on_query(&[unit("a", 7), unit("b", 7)]);
        assert_eq!((d.admitted.len(), d.evicted.len()), (0, 0), "{d:?}");
        // Read twice, the unit beats x (once) but not y (twice): evicting x
        // alone leaves 150 bytes free for 200, so nothing moves.
        let d = c.on_query(&[unit("a", 7), unit("b", 7)]);
        assert_eq!((d.admitted.len(), d.evicted.len()), (0, 0), "{d:?}");
        // Read a third time it beats y too: both go, the unit comes whole.
        let d = c.on_query(&[unit("a", 7), unit("b", 7)]);
        assert_eq!((d.admitted.len(), d.evicted.len()), (2, 2), "{d:?}");
        assert!(c.contains(&k("a")) && c.contains(&k("b")) && c.used() == 200);
    }

    #[test]
    fn lfu_prefers_small_segments_read_as_often() {
        let mut c = BenefitCache::new(1000, Box::new(Lfu::default()));
        let big = SegmentKey::new("big", 0, 1000);
        let small: Vec<SegmentKey> = (0..5).map(|i| SegmentKey::new(format!("s{i}"), 0, 200)).collect();
        c.on_query(&[Touch::of(big.clone())]);
        let d = c.on_query(&small.iter().cloned().map(Touch::of).collect::<Vec<_>>());
        assert_eq!(d.evicted, vec![big], "five 200-byte segments read once are worth more than one 1000-byte one read once");
        assert_eq!(d.admitted.len(), 5);
    }

    #[test]
    fn a_query_never_evicts_what_it_reads_and_nothing_exceeds_the_capacity() {
        let mut c = BenefitCache::new(250, Box::new(Lru::default()));
        let d = c.on_query(&q(&["a", "b", "c"]));
        assert_eq!(d.admitted.len(), 2);
        assert_eq!(d.rejected.len(), 1);
        assert!(d.evicted.is_empty(), "{d:?}");
        assert!(c.used() <= 250);
        // Too large for the tier: never admitted, nothing evicted for it.
        let d = c.on_query(&[Touch::of(SegmentKey::new("huge", 0, 1000))]);
        assert_eq!((d.rejected.len(), d.evicted.len()), (1, 0));
        // Read twice in one query: once.
        let d = c.on_query(&q(&["x", "x"]));
        assert_eq!(d.admitted.len() + d.rejected.len(), 1);
    }

    #[test]
    fn capacity_changes_evict_the_least_valuable_and_removal_frees_space() {
        let mut c = BenefitCache::new(300, Box::new(Lru::default()));
        c.on_query(&q(&["a", "b", "c"]));
        c.on_query(&q(&["c"]));
        let gone = c.set_capacity(100);
        assert_eq!(gone.len(), 2);
        assert!(c.contains(&k("c")), "the most recently used stays");
        assert!(c.remove(&k("c")) && c.used() == 0 && !c.remove(&k("c")));
    }

    #[test]
    fn a_new_policy_keeps_what_is_cached() {
        let mut c = BenefitCache::new(200, Box::new(Lru::default()));
        c.on_query(&q(&["a", "b"]));
        c.set_policy(Box::new(Lfu::default()));
        assert_eq!(c.policy_name(), "lfu");
        assert!(c.contains(&k("a")) && c.contains(&k("b")));
        assert_eq!(c.on_query(&q(&["a"])).hits, vec![k("a")]);
        // Under LFU, a (read twice since) outranks b, so c replaces b.
        c.on_query(&q(&["c"]));
        let d = c.on_query(&q(&["c"]));
        assert_eq!(d.evicted, vec![k("b")]);
    }

    /// A loop over one segment more than fits: LRU evicts each segment just
    /// before it is needed and never hits; Belady keeps all but one.
    #[test]
    fn a_cyclic_trace_defeats_lru_but_not_belady() {
        let names = ["a", "b", "c", "d"];
        let trace: Vec<Vec<SegmentKey>> = (0..40).map(|i| vec![k(names[i % 4])]).collect();
        assert_eq!(hits(&trace, 300, Box::new(Lru::default())), 0);
        let belady = hits(&trace, 300, Box::new(Belady::from_trace(&trace)));
        assert!(belady >= 20, "Belady hit {belady} of 40");
    }

    /// On a skewed random trace of equal-size segments, Belady's hit count
    /// is at least every online policy's, at several capacities.
    #[test]
    fn belady_hits_at_least_as_often_as_lru_and_lfu() {
        let mut seed = 0x2545_F491_4F6C_DD1Du64;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        // 200 queries of 1–4 segments out of 50, skewed towards low numbers.
        let trace: Vec<Vec<SegmentKey>> = (0..200)
            .map(|_| {
                let n = 1 + next() % 4;
                (0..n).map(|_| k(&format!("s{}", (next() % 50) * (next() % 50) / 50))).collect()
            })
            .collect();
        for capacity in [500, 1000, 2000] {
            let lru = hits(&trace, capacity, Box::new(Lru::default()));
            let lfu = hits(&trace, capacity, Box::new(Lfu::default()));
            let belady = hits(&trace, capacity, Box::new(Belady::from_trace(&trace)));
            assert!(belady >= lru && belady >= lfu, "capacity {capacity}: belady {belady}, lru {lru}, lfu {lfu}");
            assert!(belady > 0);
        }
    }

    #[test]
    fn history_of_uncached_segments_is_bounded() {
        let mut c = BenefitCache::new(100, Box::new(Lfu::default()));
        for i in 0..(HISTORY_LIMIT + 10) {
            c.on_query(&[Touch::of(SegmentKey::new(format!("o{i}"), 0, 100))]);
        }
        assert!(c.tracked.len() <= HISTORY_LIMIT);
    }
}
