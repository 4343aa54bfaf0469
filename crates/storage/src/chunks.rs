//! Column-chunk bytes fetched by range requests, served to the Parquet
//! decoder.
//!
//! Readers of data objects (the engine's scan, a storage node) fetch only
//! the byte ranges of the column chunks they need; [`FetchedChunks`] then
//! serves the decoder from those bytes, so it never touches the object
//! store and never needs more of the file than was fetched.

use bytes::{Buf, Bytes};
use parquet::errors::ParquetError;
use parquet::file::reader::{ChunkReader, Length};

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
            "reading {}: the Parquet decoder asked for bytes {start}..{} that were not fetched (the manifest's column-chunk ranges do not match the data object)",
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
