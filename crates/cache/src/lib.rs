//! Caching tiers for data that is never rewritten.
//!
//! blobhouse writes every object once under a fresh key, so a cached byte
//! range can never go stale: there is nothing to invalidate, only the
//! question of what is worth keeping. The unit is the **segment** — one
//! column chunk of one row group of one data object (FlexPushdownDB §4),
//! keyed by the object's URL and the chunk's byte range ([`SegmentKey`]).
//!
//! - [`policy`]: what a segment is worth — the [`Policy`] trait and LRU,
//!   LFU and Belady (FlexPushdownDB §5.3).
//! - [`framework`]: the benefit-based caching framework (FlexPushdownDB
//!   §5.2, Algorithm 1) — admission and eviction by benefit, over sizes.
//! - [`memory`]: the memory tier — the framework plus the bytes.
//! - [`ssd`]: the SSD tier (SAP IQ's object cache manager) — checksummed
//!   files in a local directory, surviving restarts.
//! - [`router`]: SSD or store for a segment the SSD holds, by the speed
//!   each has shown lately.
//!
//! Why not a cache crate: foyer, moka and quick_cache each fix their policy
//! (S3-FIFO, TinyLFU, CLOCK-Pro) and have no admission hook that weighs a
//! newcomer against its victim, which is what the framework is; and
//! Weighted-LFU (issue 15) values a segment by the pushdown work a hit
//! saves, which only blobhouse knows. Design: docs/cache.md.

pub mod framework;
pub mod key;
pub mod memory;
pub mod policy;
pub mod router;
pub mod ssd;

pub use framework::{BenefitCache, Decision, Touch};
pub use key::SegmentKey;
pub use memory::{Held, Lookup, MemoryStats, MemoryTier};
pub use policy::{Belady, Lfu, Lru, Policy, PolicyKind};
pub use router::{Route, Router, RouterStats};
pub use ssd::{SsdError, SsdStats, SsdTier};
