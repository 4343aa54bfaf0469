//! What a segment is worth: the replacement policies of the benefit-based
//! framework (FlexPushdownDB §5.3). A policy only values segments; the
//! framework ([`crate::framework`]) admits and evicts by those values.

use std::collections::HashMap;

use crate::key::SegmentKey;

/// One read of a segment, as a policy records it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Access {
    /// Bytes the segment takes in the tier.
    pub size: u64,
    /// What a miss of it costs relative to fetching it, as estimated now
    /// (1.0 unless a policy is told otherwise).
    pub weight: f64,
    /// Reads whose miss cost is estimated together — a hybrid scan's
    /// chain shape, whose rates are measured as the engine runs. A later
    /// estimate for the class re-values its earlier reads (see
    /// [`Lfu::weighted`]). `None`: the weight stands as recorded.
    pub class: Option<u64>,
}

impl Access {
    /// A read of `size` bytes at weight 1, of no class.
    pub fn plain(size: u64) -> Access {
        Access { size, weight: 1.0, class: None }
    }
}

/// Values segments for the framework. One small trait so that policies
/// can be swapped per tier and new ones added (issue 15's Weighted-LFU is
/// one more implementation, whose access weight is the pushdown work a
/// cache hit saves).
pub trait Policy: Send {
    /// The policy's name, for `SHOW CACHE` and benchmark tables.
    fn name(&self) -> &'static str;

    /// Query number `query` (1, 2, … in order) reads `key`.
    fn record(&mut self, key: &SegmentKey, access: Access, query: u64);

    /// What keeping `key` is worth when query `now` runs; higher is
    /// better, 0 for a segment the policy knows nothing about.
    fn benefit(&self, key: &SegmentKey, now: u64) -> f64;

    /// The framework no longer tracks `key` (neither cached nor among the
    /// recently seen): its history may go.
    fn forget(&mut self, key: &SegmentKey);

    /// How much more benefit than a victim a newcomer of `size` bytes,
    /// read now at miss cost `weight`, must have before the victim is
    /// evicted for it. 0 (the paper's rule: any lead) unless the policy
    /// knows what a miss costs: see [`Lfu::weighted`].
    fn admission_margin(&self, _size: u64, _weight: f64) -> f64 {
        0.0
    }
}

/// A policy by name, as configured (`SET cache_policy = 'lfu'`). Belady
/// is not among them: it needs the future, and exists for benchmarks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PolicyKind {
    Lru,
    #[default]
    Lfu,
    /// Weighted-LFU (FlexPushdownDB §5.4): LFU whose accesses count by what
    /// a miss would cost given pushdown.
    WeightedLfu,
}

impl PolicyKind {
    /// Parses `lru`, `lfu` or `wlfu` (any case).
    pub fn parse(name: &str) -> Option<PolicyKind> {
        [PolicyKind::Lru, PolicyKind::Lfu, PolicyKind::WeightedLfu].into_iter().find(|k| k.name().eq_ignore_ascii_case(name))
    }

    /// Its name, as `parse` takes it and `SHOW CACHE` shows it.
    pub fn name(self) -> &'static str {
        match self {
            PolicyKind::Lru => "lru",
            PolicyKind::Lfu => "lfu",
            PolicyKind::WeightedLfu => "wlfu",
        }
    }

    /// A fresh policy of this kind.
    pub fn build(self) -> Box<dyn Policy> {
        match self {
            PolicyKind::Lru => Box::new(Lru::default()),
            PolicyKind::Lfu => Box::new(Lfu::default()),
            PolicyKind::WeightedLfu => Box::new(Lfu::weighted()),
        }
    }
}

/// Least recently used: a segment's benefit is the time of its last access
/// (a counter of accesses, so that order within a query counts too). Size
/// plays no part, as in FlexPushdownDB.
#[derive(Debug, Default)]
pub struct Lru {
    clock: u64,
    last: HashMap<SegmentKey, u64>,
}

impl Policy for Lru {
    fn name(&self) -> &'static str {
        "lru"
    }

    fn record(&mut self, key: &SegmentKey, _access: Access, _query: u64) {
        self.clock += 1;
        self.last.insert(key.clone(), self.clock);
    }

    fn benefit(&self, key: &SegmentKey, _now: u64) -> f64 {
        self.last.get(key).map_or(0.0, |t| *t as f64)
    }

    fn forget(&mut self, key: &SegmentKey) {
        self.last.remove(key);
    }
}

/// Least frequently used, normalised by size: each access adds `1 / size`
/// to a segment's counter, so of two segments read equally often the
/// smaller is worth more per byte of cache.
///
/// Weighted (FlexPushdownDB §5.4's Weighted-LFU, [`Lfu::weighted`]), an
/// access adds `weight / size`, where the weight is what a miss of the
/// segment costs relative to fetching it: a segment a storage node filters
/// cheaply (a miss is pushed down and moves little) weighs less than one
/// read whole, so the cache keeps what pushdown cannot make cheap. The
/// weights come from the hybrid scan's measured rates
/// (`blobhouse_engine::hybrid`). Plain LFU ignores them, as the paper's
/// baseline does.
///
/// A weight is an estimate, and the estimates improve as the engine runs:
/// before a scan's kind was ever pushed its weight is a default (0.5, or
/// more), later the measured ratio of two rates. A counter that summed the
/// weights as they were recorded would keep the early guesses forever —
/// measured: reads of a cheaply filtered column chunk made at 0.8 in the
/// first queries still held it in the cache against chunks now worth four
/// times as much. So reads of a class ([`Access::class`]) are counted per
/// class and valued at the class's latest weight: a segment's value is
/// its reads × what the engine now estimates a hit saves, the issue's
/// definition with the rates as they stand.
///
/// Weighted-LFU also charges an admission its fill. Admitting a segment
/// that a hybrid scan would otherwise push down means fetching it whole
/// now: `(1 - weight) × size` more bytes than the push it replaces. So a
/// newcomer is admitted only when its counter leads the victim's — or,
/// into free space, nothing — by more than that extra cost in the
/// counter's own unit, `(1 - weight) / size` (one access of full weight is
/// `1 / size`). Without it, measured weights that drift by a few percent
/// from query to query made equal segments evict each other, each swap a
/// whole fetch, and a segment a node filters cheaply was admitted on its
/// first read at the price of a full fetch (measured: 70 % more link
/// traffic than LFU on the mixed-selectivity workload). A segment read
/// whole on a miss (weight 1) is charged nothing, so plain LFU and
/// unweighted scans behave as in the paper.
#[derive(Debug, Default)]
pub struct Lfu {
    counts: HashMap<SegmentKey, Counts>,
    /// The latest weight of each class (at most [`MAX_CLASSES`]).
    latest: HashMap<u64, f64>,
    weighted: bool,
}

/// Classes Weighted-LFU keeps a latest weight for. An explicit limit: a
/// class is a hybrid scan's chain shape, and an engine sees few. Past it a
/// class is forgotten, and its reads are valued at their recorded weights.
pub const MAX_CLASSES: usize = 1024;

/// Classes counted apart per segment; reads of further classes are
/// valued at their recorded weights.
const CLASSES_PER_SEGMENT: usize = 8;

/// One segment's reads.
#[derive(Debug, Default)]
struct Counts {
    /// Σ weight / size over the reads of no class (plain LFU: all reads,
    /// at weight 1).
    fixed: f64,
    by_class: Vec<ClassReads>,
}

/// A segment's reads of one class.
#[derive(Debug)]
struct ClassReads {
    class: u64,
    /// Σ 1 / size: the counter at weight 1.
    per_byte: f64,
    /// Σ weight / size as recorded: the value if the class is forgotten.
    recorded: f64,
}

impl Lfu {
    /// Weighted-LFU.
    pub fn weighted() -> Lfu {
        Lfu { weighted: true, ..Lfu::default() }
    }
}

impl Policy for Lfu {
    fn name(&self) -> &'static str {
        if self.weighted { "wlfu" } else { "lfu" }
    }

    fn record(&mut self, key: &SegmentKey, access: Access, _query: u64) {
        let size = access.size.max(1) as f64;
        let counts = self.counts.entry(key.clone()).or_default();
        // A weight that is not a positive number counts as a plain access,
        // of no class.
        let valid = self.weighted && access.weight.is_finite() && access.weight > 0.0;
        let weight = if valid { access.weight } else { 1.0 };
        let Some(class) = access.class.filter(|_| valid) else {
            counts.fixed += weight / size;
            return;
        };
        if !self.latest.contains_key(&class) && self.latest.len() >= MAX_CLASSES {
            let victim = *self.latest.keys().next().expect("the map is full");
            self.latest.remove(&victim);
        }
        self.latest.insert(class, weight);
        debug_assert!(self.latest.len() <= MAX_CLASSES);
        let at = counts.by_class.iter().position(|c| c.class == class);
        match at {
            Some(i) => {
                counts.by_class[i].per_byte += 1.0 / size;
                counts.by_class[i].recorded += weight / size;
            }
            None if counts.by_class.len() < CLASSES_PER_SEGMENT => counts.by_class.push(ClassReads { class, per_byte: 1.0 / size, recorded: weight / size }),
            None => counts.fixed += weight / size,
        }
    }

    fn benefit(&self, key: &SegmentKey, _now: u64) -> f64 {
        let Some(counts) = self.counts.get(key) else { return 0.0 };
        let classed: f64 = counts.by_class.iter().map(|c| self.latest.get(&c.class).map_or(c.recorded, |w| w * c.per_byte)).sum();
        counts.fixed + classed
    }

    fn forget(&mut self, key: &SegmentKey) {
        self.counts.remove(key);
    }

    fn admission_margin(&self, size: u64, weight: f64) -> f64 {
        if !self.weighted || !weight.is_finite() || weight <= 0.0 {
            return 0.0;
        }
        (1.0 - weight).max(0.0) / size.max(1) as f64
    }
}

/// Belady's policy: a segment's benefit is 1 / (queries until its next
/// access), 0 if it is never read again. It knows the future because it
/// is built from a recorded trace — the optimum online policies are
/// measured against (optimal for equal sizes and costs).
#[derive(Debug, Default)]
pub struct Belady {
    /// For every segment, the queries that read it, ascending.
    accesses: HashMap<SegmentKey, Vec<u64>>,
}

impl Belady {
    /// From the segments each query reads, in order: query 1 is
    /// `trace[0]`, and so on (the numbering the framework uses).
    pub fn from_trace(trace: &[Vec<SegmentKey>]) -> Belady {
        let mut accesses: HashMap<SegmentKey, Vec<u64>> = HashMap::new();
        for (i, query) in trace.iter().enumerate() {
            for key in query {
                let list = accesses.entry(key.clone()).or_default();
                let q = i as u64 + 1;
                if list.last() != Some(&q) {
                    list.push(q);
                }
            }
        }
        Belady { accesses }
    }

    /// The first query after `now` that reads `key`.
    fn next_access(&self, key: &SegmentKey, now: u64) -> Option<u64> {
        let list = self.accesses.get(key)?;
        let i = list.partition_point(|q| *q <= now);
        list.get(i).copied()
    }
}

impl Policy for Belady {
    fn name(&self) -> &'static str {
        "belady"
    }

    fn record(&mut self, _key: &SegmentKey, _access: Access, _query: u64) {}

    fn benefit(&self, key: &SegmentKey, now: u64) -> f64 {
        self.next_access(key, now).map_or(0.0, |next| 1.0 / (next - now) as f64)
    }

    fn forget(&mut self, _key: &SegmentKey) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    fn k(name: &str) -> SegmentKey {
        SegmentKey::new(name, 0, 100)
    }

    #[test]
    fn lru_values_the_latest_access_highest() {
        let mut p = Lru::default();
        p.record(&k("a"), Access::plain(100), 1);
        p.record(&k("b"), Access::plain(100), 1);
        assert!(p.benefit(&k("b"), 1) > p.benefit(&k("a"), 1));
        p.record(&k("a"), Access::plain(100), 2);
        assert!(p.benefit(&k("a"), 2) > p.benefit(&k("b"), 2));
        assert_eq!(p.benefit(&k("never"), 2), 0.0);
        p.forget(&k("a"));
        assert_eq!(p.benefit(&k("a"), 2), 0.0);
    }

    #[test]
    fn lfu_counts_accesses_per_byte() {
        let mut p = Lfu::default();
        let (small, big) = (SegmentKey::new("s", 0, 10), SegmentKey::new("b", 0, 1000));
        for q in 1..=3 {
            p.record(&small, Access::plain(10), q);
            p.record(&big, Access::plain(1000), q);
        }
        assert!((p.benefit(&small, 3) - 0.3).abs() < 1e-12);
        assert!((p.benefit(&big, 3) - 0.003).abs() < 1e-12);
        // LFU ignores weights.
        p.record(&big, Access { size: 1000, weight: 1000.0, class: None }, 4);
        assert!((p.benefit(&big, 4) - 0.004).abs() < 1e-12);
    }

    #[test]
    fn weighted_lfu_prefers_what_pushdown_cannot_make_cheap() {
        // `cheap` is read three times but each miss is pushed down cheaply
        // (weight 0.2); `dear` twice, read whole on a miss (weight 1).
        let (cheap, dear) = (SegmentKey::new("cheap", 0, 100), SegmentKey::new("dear", 0, 100));
        let (mut lfu, mut wlfu) = (Lfu::default(), Lfu::weighted());
        for q in 1..=3 {
            lfu.record(&cheap, Access { size: 100, weight: 0.2, class: None }, q);
            wlfu.record(&cheap, Access { size: 100, weight: 0.2, class: None }, q);
        }
        for q in 1..=2 {
            lfu.record(&dear, Access::plain(100), q);
            wlfu.record(&dear, Access::plain(100), q);
        }
        assert!(lfu.benefit(&cheap, 3) > lfu.benefit(&dear, 3));
        assert!(wlfu.benefit(&dear, 3) > wlfu.benefit(&cheap, 3));
        assert!((wlfu.benefit(&cheap, 3) - 0.006).abs() < 1e-12);
        // A bad weight counts as a plain access.
        wlfu.record(&cheap, Access { size: 100, weight: f64::NAN, class: None }, 4);
        assert!((wlfu.benefit(&cheap, 4) - 0.016).abs() < 1e-12);
    }

    /// Reads of a class are valued at the class's latest weight: early
    /// guesses do not stick. Reads of no class, and of a class the policy
    /// had to forget, keep the weight they were recorded at.
    #[test]
    fn weighted_lfu_values_earlier_reads_at_their_class_s_latest_weight() {
        let (a, b) = (SegmentKey::new("a", 0, 100), SegmentKey::new("b", 0, 100));
        let read = |weight: f64, class: Option<u64>| Access { size: 100, weight, class };
        let mut p = Lfu::weighted();
        for q in 1..=3 {
            p.record(&a, read(0.8, Some(1)), q);
        }
        p.record(&b, read(0.5, Some(2)), 3);
        assert!((p.benefit(&a, 3) - 0.024).abs() < 1e-12);
        // Class 1's estimate falls to 0.1: all four reads of `a` are worth
        // 0.1 each now; `b`'s class is untouched.
        p.record(&a, read(0.1, Some(1)), 4);
        assert!((p.benefit(&a, 4) - 0.004).abs() < 1e-12, "{}", p.benefit(&a, 4));
        assert!((p.benefit(&b, 4) - 0.005).abs() < 1e-12);
        // A read of no class stands as recorded, beside the classed ones.
        p.record(&a, read(0.6, None), 5);
        assert!((p.benefit(&a, 5) - 0.010).abs() < 1e-12);
        // A later read of `b`'s class by another segment re-values `b`.
        p.record(&SegmentKey::new("c", 0, 100), read(1.0, Some(2)), 6);
        assert!((p.benefit(&b, 6) - 0.010).abs() < 1e-12);
        // Plain LFU counts every read once, whatever its class.
        let mut lfu = Lfu::default();
        lfu.record(&a, read(0.8, Some(1)), 1);
        lfu.record(&a, read(0.1, Some(1)), 2);
        assert!((lfu.benefit(&a, 2) - 0.02).abs() < 1e-12);
    }

    /// Past the per-segment and engine-wide class limits, reads are
    /// valued at their recorded weights rather than lost.
    #[test]
    fn weighted_lfu_bounds_the_classes_it_tracks() {
        let a = SegmentKey::new("a", 0, 100);
        let mut p = Lfu::weighted();
        for class in 0..(CLASSES_PER_SEGMENT as u64 + 4) {
            p.record(&a, Access { size: 100, weight: 0.5, class: Some(class) }, 1);
        }
        assert_eq!(p.counts[&a].by_class.len(), CLASSES_PER_SEGMENT);
        assert!((p.benefit(&a, 1) - 0.06).abs() < 1e-12);
        for class in 0..(MAX_CLASSES as u64 + 10) {
            p.record(&SegmentKey::new("b", class, 1), Access { size: 100, weight: 0.5, class: Some(1000 + class) }, 2);
        }
        assert_eq!(p.latest.len(), MAX_CLASSES);
        // Whichever of a's classes were forgotten, each read still counts 0.5.
        assert!((p.benefit(&a, 2) - 0.06).abs() < 1e-12);
    }

    #[test]
    fn belady_values_the_sooner_reuse_higher() {
        let trace = vec![vec![k("a"), k("b")], vec![k("b")], vec![k("c")], vec![k("a")]];
        let p = Belady::from_trace(&trace);
        // After query 1: b is read again at 2 (distance 1), a at 4 (distance 3).
        assert_eq!(p.benefit(&k("b"), 1), 1.0);
        assert!((p.benefit(&k("a"), 1) - 1.0 / 3.0).abs() < 1e-12);
        // After query 2, b is never read again.
        assert_eq!(p.benefit(&k("b"), 2), 0.0);
        assert_eq!(p.benefit(&k("zzz"), 1), 0.0);
    }

    #[test]
    fn policies_by_name() {
        assert_eq!(PolicyKind::parse("LRU"), Some(PolicyKind::Lru));
        assert_eq!(PolicyKind::parse("lfu").map(|p| p.build().name()), Some("lfu"));
        assert_eq!(PolicyKind::parse("WLFU").map(|p| p.build().name()), Some("wlfu"));
        assert_eq!(PolicyKind::parse("belady"), None);
    }
}
