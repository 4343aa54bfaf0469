//! Column-chunk bytes fetched by range requests, and how requests are cut.
//!
//! A scan asks for the byte ranges of the column chunks it needs. Requests are
//! planned the AnyBlob way (§4.4): neighbouring chunks of one row group are
//! merged when the gap between them is small (fewer requests, which is what
//! object stores charge for), but never so much that the waste exceeds 1/16
//! of the useful bytes; a range larger than `max_request_bytes` is split into
//! equal parts of 8–16 MiB so several requests fetch it in parallel.
//!
//! [`FetchedChunks`] then serves the Parquet decoder from those bytes, so the
//! decoder never touches the object store and never needs the file's footer.

use std::ops::Range;

use bytes::{Buf, Bytes};
use parquet::errors::ParquetError;
use parquet::file::reader::{ChunkReader, Length};

/// How a scan cuts its reads into requests.
#[derive(Debug, Clone)]
pub struct RequestPolicy {
    /// Largest single range request (default 16 MiB).
    pub max_request_bytes: u64,
    /// Largest gap between two chunks that may be read through (default 1 MiB).
    pub coalesce_gap: u64,
}

impl Default for RequestPolicy {
    fn default() -> Self {
        RequestPolicy { max_request_bytes: 16 << 20, coalesce_gap: 1 << 20 }
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
                let parts = len.div_ceil(self.max_request_bytes.max(1)).max(1);
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

/// The fetched spans of one object, served to the Parquet decoder.
#[derive(Debug, Clone)]
pub struct FetchedChunks {
    /// Spans sorted by start offset: (start, bytes).
    spans: Vec<(u64, Bytes)>,
    object_len: u64,
    object: String,
}

impl FetchedChunks {
    /// Wraps fetched spans of an object of `object_len` bytes named `object`.
    pub fn new(mut spans: Vec<(u64, Bytes)>, object_len: u64, object: String) -> Self {
        spans.sort_by_key(|(s, _)| *s);
        FetchedChunks { spans, object_len, object }
    }

    fn find(&self, start: u64, len: u64) -> Result<Bytes, ParquetError> {
        let idx = self.spans.partition_point(|(s, _)| *s <= start);
        if idx > 0 {
            let (s, bytes) = &self.spans[idx - 1];
            let off = (start - s) as usize;
            if off as u64 + len <= bytes.len() as u64 {
                return Ok(bytes.slice(off..off + len as usize));
            }
        }
        Err(ParquetError::General(format!(
            "blobhouse scan of {}: decoder asked for bytes {start}..{} that the scan did not fetch (the manifest's column-chunk ranges do not match the data object)",
            self.object,
            start + len
        )))
    }
}

impl Length for FetchedChunks {
    fn len(&self) -> u64 {
        self.object_len
    }
}

impl ChunkReader for FetchedChunks {
    type T = bytes::buf::Reader<Bytes>;

    fn get_read(&self, start: u64) -> Result<Self::T, ParquetError> {
        let idx = self.spans.partition_point(|(s, _)| *s <= start);
        if idx > 0 {
            let (s, bytes) = &self.spans[idx - 1];
            let off = (start - s) as usize;
            if off <= bytes.len() {
                return Ok(bytes.slice(off..).reader());
            }
        }
        self.find(start, 1).map(|b| b.reader())
    }

    fn get_bytes(&self, start: u64, length: usize) -> Result<Bytes, ParquetError> {
        self.find(start, length as u64)
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
    fn fetched_chunks_serve_only_fetched_bytes() {
        let c = FetchedChunks::new(vec![(100, Bytes::from_static(b"abcdef"))], 1000, "o".into());
        assert_eq!(&c.get_bytes(102, 3).unwrap()[..], b"cde");
        assert!(c.get_bytes(104, 5).is_err());
        assert!(c.get_bytes(10, 2).is_err());
        let mut s = String::new();
        std::io::Read::read_to_string(&mut c.get_read(103).unwrap(), &mut s).unwrap();
        assert_eq!(s, "def");
    }
}
