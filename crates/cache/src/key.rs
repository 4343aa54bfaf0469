//! What a cache entry is called.

use std::fmt;
use std::sync::Arc;

/// One segment: the bytes `start .. start + len` of the object at `object`
/// (its full URL, so that two databases in one process never share a key).
/// The object is never rewritten, so the key names the same bytes forever.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SegmentKey {
    pub object: Arc<str>,
    pub start: u64,
    pub len: u64,
}

impl SegmentKey {
    pub fn new(object: impl Into<Arc<str>>, start: u64, len: u64) -> SegmentKey {
        SegmentKey { object: object.into(), start, len }
    }

    /// The byte range in the object.
    pub fn range(&self) -> std::ops::Range<u64> {
        self.start..self.start + self.len
    }
}

impl fmt::Display for SegmentKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}[{}..{}]", self.object, self.start, self.start + self.len)
    }
}
