//! The memory tier: segments' bytes in RAM, admitted and evicted by the
//! benefit-based framework.
//!
//! A scan tells the tier, once, every segment it will read
//! ([`MemoryTier::plan`]): that is the query's access for the policy, and
//! the framework admits some of them. Then, row group by row group, it
//! asks for each segment's bytes ([`MemoryTier::get`]); an admitted segment
//! it had to download is handed over with [`MemoryTier::fill`] (or given
//! up with [`MemoryTier::abandon`] when the download failed).
//!
//! What the tier keeps for a segment is the caller's choice ([`Held`]):
//! the bytes as they came from the store (compressed column chunks,
//! `Bytes`), or the engine's decoded form of them. The framework charges
//! each entry what it takes in memory; an entry admitted at an estimate is
//! charged its real size when it arrives ([`MemoryTier::fill`]). See
//! docs/cache.md for when each form pays.

use std::collections::HashMap;
use std::sync::Mutex;

use bytes::Bytes;

use crate::framework::{BenefitCache, Touch};
use crate::key::SegmentKey;
use crate::policy::Policy;

/// What the memory tier keeps for a segment.
pub trait Held: Clone + Send {
    /// Bytes it takes in memory: what the tier charges for it.
    fn memory_size(&self) -> u64;

    /// Whether it can be the whole content of segment `key`: a short read
    /// must never become a hit.
    fn is_whole(&self, key: &SegmentKey) -> bool;
}

/// A segment's bytes as the store returned them.
impl Held for Bytes {
    fn memory_size(&self) -> u64 {
        self.len() as u64
    }

    fn is_whole(&self, key: &SegmentKey) -> bool {
        self.len() as u64 == key.len
    }
}

/// What a lookup found.
#[derive(Debug, Clone, PartialEq)]
pub enum Lookup<V = Bytes> {
    /// The segment, from memory.
    Hit(V),
    /// Not here: fetch it. `fill`: the tier admitted it, so hand the bytes
    /// over with [`MemoryTier::fill`] once they arrive.
    Miss { fill: bool },
}

/// Counters of the tier since it was made.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MemoryStats {
    pub hits: u64,
    pub misses: u64,
    pub hit_bytes: u64,
    pub miss_bytes: u64,
    pub admitted: u64,
    pub rejected: u64,
    pub evicted: u64,
    /// Bytes held now (admitted segments still on their way included).
    pub used: u64,
    pub capacity: u64,
}

struct Inner<V> {
    framework: BenefitCache,
    /// The cached segments; `None` while an admitted one is on its way.
    bytes: HashMap<SegmentKey, Option<V>>,
    stats: MemoryStats,
}

/// The memory tier. Shared by every scan of an engine; cheap to call from
/// many tasks (one short critical section per call).
pub struct MemoryTier<V = Bytes> {
    inner: Mutex<Inner<V>>,
}

impl<V: Held> MemoryTier<V> {
    /// An empty tier of `capacity` bytes valuing segments by `policy`.
    pub fn new(capacity: u64, policy: Box<dyn Policy>) -> MemoryTier<V> {
        let stats = MemoryStats { capacity, ..Default::default() };
        MemoryTier { inner: Mutex::new(Inner { framework: BenefitCache::new(capacity, policy), bytes: HashMap::new(), stats }) }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner<V>> {
        // A panic while holding the lock leaves counters, not bytes, half
        // updated: the cache stays usable.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// One query's access to `touched` (Algorithm 1): benefits update, some
    /// segments are admitted, others evicted to make room.
    pub fn plan(&self, touched: &[Touch]) {
        let mut inner = self.lock();
        let decision = inner.framework.on_query(touched);
        for key in &decision.evicted {
            inner.bytes.remove(key);
        }
        for key in &decision.admitted {
            inner.bytes.insert(key.clone(), None);
        }
        inner.stats.admitted += decision.admitted.len() as u64;
        inner.stats.rejected += decision.rejected.len() as u64;
        inner.stats.evicted += decision.evicted.len() as u64;
        inner.stats.used = inner.framework.used();
    }

    /// Whether `key` is here or admitted (its bytes come with the fetch
    /// of the scan that admitted it). Counts nothing: planners ask this.
    pub fn holds(&self, key: &SegmentKey) -> bool {
        self.lock().bytes.contains_key(key)
    }

    /// The segment `key`, if here.
    pub fn get(&self, key: &SegmentKey) -> Lookup<V> {
        let mut inner = self.lock();
        let found = inner.bytes.get(key).cloned();
        match found {
            Some(Some(bytes)) => {
                inner.stats.hits += 1;
                inner.stats.hit_bytes += key.len;
                Lookup::Hit(bytes)
            }
            Some(None) => {
                inner.stats.misses += 1;
                inner.stats.miss_bytes += key.len;
                Lookup::Miss { fill: true }
            }
            None => {
                inner.stats.misses += 1;
                inner.stats.miss_bytes += key.len;
                Lookup::Miss { fill: false }
            }
        }
    }

    /// An admitted segment arrived. Ignored unless it is still admitted
    /// and waiting, and `value` is the whole segment. It is charged its
    /// [`Held::memory_size`] from now on: when that is more than it was
    /// admitted at and the tier overflows, the least valuable segments go
    /// (this one too, when it is the least valuable).
    pub fn fill(&self, key: &SegmentKey, value: V) {
        if !value.is_whole(key) {
            self.abandon(key);
            return;
        }
        let size = value.memory_size();
        let mut inner = self.lock();
        let Some(slot @ None) = inner.bytes.get_mut(key) else { return };
        *slot = Some(value);
        let evicted = inner.framework.resize(key, size);
        for key in &evicted {
            inner.bytes.remove(key);
        }
        inner.stats.evicted += evicted.len() as u64;
        inner.stats.used = inner.framework.used();
    }

    /// A segment held here takes another form (the engine's decoded
    /// form of bytes it held compressed). Ignored unless the segment is
    /// held and `value` is whole. Charged as [`MemoryTier::fill`] charges.
    pub fn replace(&self, key: &SegmentKey, value: V) {
        if !value.is_whole(key) {
            return;
        }
        let size = value.memory_size();
        let mut inner = self.lock();
        let Some(slot @ Some(_)) = inner.bytes.get_mut(key) else { return };
        *slot = Some(value);
        let evicted = inner.framework.resize(key, size);
        for key in &evicted {
            inner.bytes.remove(key);
        }
        inner.stats.evicted += evicted.len() as u64;
        inner.stats.used = inner.framework.used();
    }

    /// An admitted segment's bytes will not come: its space is given back.
    pub fn abandon(&self, key: &SegmentKey) {
        let mut inner = self.lock();
        if let Some(None) = inner.bytes.get(key) {
            inner.bytes.remove(key);
            inner.framework.remove(key);
            inner.stats.used = inner.framework.used();
        }
    }

    /// A new capacity (`SET cache_memory = …`); the least valuable segments
    /// go until the rest fit.
    pub fn set_capacity(&self, capacity: u64) {
        let mut inner = self.lock();
        let evicted = inner.framework.set_capacity(capacity);
        for key in &evicted {
            inner.bytes.remove(key);
        }
        inner.stats.evicted += evicted.len() as u64;
        inner.stats.used = inner.framework.used();
        inner.stats.capacity = capacity;
    }

    /// Values segments by `policy` from now on (`SET cache_policy`).
    pub fn set_policy(&self, policy: Box<dyn Policy>) {
        self.lock().framework.set_policy(policy);
    }

    /// The counters.
    pub fn stats(&self) -> MemoryStats {
        self.lock().stats
    }

    /// The policy's name.
    pub fn policy_name(&self) -> &'static str {
        self.lock().framework.policy_name()
    }

    /// What the tier holds now (not the segments still on their way).
    pub fn held(&self) -> Vec<V> {
        self.lock().bytes.values().flatten().cloned().collect()
    }

    /// The cached segments (size, benefit, whether the bytes are here), most
    /// valuable first, for `SHOW CACHE`.
    pub fn contents(&self) -> Vec<(SegmentKey, u64, f64, bool)> {
        let inner = self.lock();
        let mut out: Vec<_> = inner
            .framework
            .entries()
            .into_iter()
            .map(|(k, size, benefit)| {
                let here = matches!(inner.bytes.get(&k), Some(Some(_)));
                (k, size, benefit, here)
            })
            .collect();
        out.sort_by(|a, b| b.2.total_cmp(&a.2).then_with(|| a.0.cmp(&b.0)));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::Lru;

    fn k(name: &str) -> SegmentKey {
        SegmentKey::new(name, 0, 4)
    }

    #[test]
    fn admitted_segments_are_filled_then_hit() {
        let tier = MemoryTier::new(8, Box::new(Lru::default()));
        tier.plan(&[Touch::of(k("a")), Touch::of(k("b")), Touch::of(k("c"))]);
        let s = tier.stats();
        assert_eq!((s.admitted, s.rejected, s.used), (2, 1, 8));
        let admitted: Vec<SegmentKey> = ["a", "b", "c"].iter().map(|n| k(n)).filter(|key| tier.get(key) == Lookup::Miss { fill: true }).collect();
        assert_eq!(admitted.len(), 2);
        tier.fill(&admitted[0], Bytes::from_static(b"wxyz"));
        assert_eq!(tier.get(&admitted[0]), Lookup::Hit(Bytes::from_static(b"wxyz")));
        // Wrong length: never kept (a short read must not become a hit).
        tier.fill(&admitted[1], Bytes::from_static(b"xy"));
        assert_eq!(tier.get(&admitted[1]), Lookup::Miss { fill: false });
        assert_eq!(tier.stats().used, 4, "the abandoned segment's space is back");
        let s = tier.stats();
        assert_eq!((s.hits, s.hit_bytes), (1, 4));
    }

    /// A form of a segment larger than its bytes (as the engine's decoded
    /// chunks are).
    #[derive(Debug, Clone, PartialEq)]
    struct Big(u64);

    impl Held for Big {
        fn memory_size(&self) -> u64 {
            self.0
        }

        fn is_whole(&self, _: &SegmentKey) -> bool {
            true
        }
    }

    #[test]
    fn a_fill_is_charged_its_memory_size() {
        let tier: MemoryTier<Big> = MemoryTier::new(10, Box::new(Lru::default()));
        tier.plan(&[Touch::of(k("a")), Touch::of(k("b"))]);
        assert_eq!(tier.stats().used, 8);
        tier.fill(&k("a"), Big(3));
        assert_eq!(tier.stats().used, 7);
        assert_eq!(tier.get(&k("a")), Lookup::Hit(Big(3)));
        // b arrives at 9 bytes: 12 > 10, so the older a goes.
        tier.fill(&k("b"), Big(9));
        let s = tier.stats();
        assert_eq!((s.used, s.evicted), (9, 1));
        assert_eq!(tier.get(&k("a")), Lookup::Miss { fill: false });
        assert_eq!(tier.get(&k("b")), Lookup::Hit(Big(9)));
        // A second fill of a segment already here changes nothing.
        tier.fill(&k("b"), Big(1));
        assert_eq!((tier.stats().used, tier.get(&k("b"))), (9, Lookup::Hit(Big(9))));
    }

    #[test]
    fn eviction_drops_the_bytes_and_capacity_can_shrink() {
        let tier = MemoryTier::new(8, Box::new(Lru::default()));
        for name in ["a", "b"] {
            tier.plan(&[Touch::of(k(name))]);
            tier.fill(&k(name), Bytes::from_static(b"1234"));
        }
        tier.plan(&[Touch::of(k("c"))]);
        assert_eq!(tier.get(&k("a")), Lookup::Miss { fill: false }, "a was least recently used");
        assert!(matches!(tier.get(&k("b")), Lookup::Hit(_)));
        tier.set_capacity(0);
        assert_eq!(tier.stats().used, 0);
        assert_eq!(tier.get(&k("b")), Lookup::Miss { fill: false });
        assert!(tier.contents().is_empty());
    }
}
