//! Request planning (AnyBlob §4.4): which range requests to send for the
//! byte ranges a reader wants from one object.
//!
//! Neighbouring ranges are merged when the gap between them is small (fewer
//! requests, which is what object stores charge for), but never so much
//! that the waste exceeds 1/16 of the useful bytes; a range larger than
//! `max_request_bytes` is split into equal parts so several requests fetch
//! it in parallel, and never into parts below `min_request_bytes`. The
//! defaults put requests in the 8–16 MiB band where the paper finds the
//! cost per byte flat and the throughput per request high.

use std::ops::Range;

/// How a scan cuts its reads into requests.
#[derive(Debug, Clone)]
pub struct RequestPolicy {
    /// Largest single range request (default 16 MiB).
    pub max_request_bytes: u64,
    /// Largest gap between two chunks that may be read through (default 1 MiB).
    pub coalesce_gap: u64,
    /// Smallest request a split produces (default 8 MiB): a range is cut
    /// into fewer, larger parts rather than parts below this. A range that
    /// is smaller to begin with is requested as it is.
    pub min_request_bytes: u64,
}

impl Default for RequestPolicy {
    fn default() -> Self {
        RequestPolicy { max_request_bytes: 16 << 20, coalesce_gap: 1 << 20, min_request_bytes: 8 << 20 }
    }
}

/// A group of requests whose bytes are reassembled into one contiguous span.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Span {
    /// The bytes of the object the span covers.
    pub range: Range<u64>,
    /// The requests that fetch it, in order, covering `range` exactly.
    pub requests: Vec<Range<u64>>,
}

impl RequestPolicy {
    /// Plans the requests for a set of chunk ranges of one object.
    pub fn plan(&self, chunks: &[Range<u64>]) -> Vec<Span> {
        let mut sorted: Vec<Range<u64>> = chunks.iter().filter(|r| r.end > r.start).cloned().collect();
        sorted.sort_by_key(|r| r.start);
        let useful: u64 = sorted.iter().map(|r| r.end - r.start).sum();
        let waste_budget = useful / 16;
        let mut waste = 0u64;
        let mut merged: Vec<Range<u64>> = Vec::new();
        for r in sorted {
            if let Some(last) = merged.last_mut() {
                if r.start <= last.end {
                    last.end = last.end.max(r.end);
                    continue;
                }
                let gap = r.start - last.end;
                if gap <= self.coalesce_gap && waste + gap <= waste_budget {
                    waste += gap;
                    last.end = r.end;
                    continue;
                }
            }
            merged.push(r);
        }
        merged
            .into_iter()
            .map(|range| {
                let len = range.end - range.start;
                let by_max = len.div_ceil(self.max_request_bytes.max(1));
                let by_floor = len / self.min_request_bytes.max(1);
                let parts = by_max.min(by_floor).max(1);
                let step = len.div_ceil(parts);
                let requests = (0..parts)
                    .map(|i| range.start + i * step..(range.start + (i + 1) * step).min(range.end))
                    .filter(|r| r.end > r.start)
                    .collect();
                Span { range, requests }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn splits_large_ranges_into_8_to_16_mib_requests() {
        let p = RequestPolicy::default();
        let spans = p.plan(&[0..40 * MIB]);
        assert_eq!(spans.len(), 1);
        let reqs = &spans[0].requests;
        assert_eq!(reqs.len(), 3);
        assert!(reqs.iter().all(|r| (8 * MIB..=16 * MIB).contains(&(r.end - r.start))));
        assert_eq!(reqs.first().unwrap().start, 0);
        assert_eq!(reqs.last().unwrap().end, 40 * MIB);
        assert!(reqs.windows(2).all(|w| w[0].end == w[1].start));
    }

    #[test]
    fn merges_small_gaps_but_bounds_waste() {
        let p = RequestPolicy::default();
        // Adjacent chunks always merge.
        assert_eq!(p.plan(&[0..100, 100..200]).len(), 1);
        // A gap of 10 bytes between 2x1000 useful bytes: 10 <= 2000/16, merged.
        assert_eq!(p.plan(&[0..1000, 1010..2010]).len(), 1);
        // A gap larger than 1/16 of the useful bytes is not read through.
        assert_eq!(p.plan(&[0..1000, 1500..2500]).len(), 2);
        // Never across a gap above coalesce_gap, however large the chunks.
        assert_eq!(p.plan(&[0..64 * MIB, 66 * MIB..130 * MIB]).len(), 2);
    }

    #[test]
    fn splits_never_go_below_the_floor() {
        let p = RequestPolicy { max_request_bytes: 16 * MIB, coalesce_gap: MIB, min_request_bytes: 12 * MIB };
        // 20 MiB would be two 10 MiB parts by the maximum; the floor keeps it whole.
        assert_eq!(p.plan(&[0..20 * MIB])[0].requests, vec![0..20 * MIB]);
        // 40 MiB: three parts of 13.3 MiB satisfy both.
        assert_eq!(p.plan(&[0..40 * MIB])[0].requests.len(), 3);
        // A small range is requested as it is.
        assert_eq!(p.plan(&[5..1000])[0].requests, vec![5..1000]);
    }
}
