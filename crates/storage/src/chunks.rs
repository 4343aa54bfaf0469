//! Column-chunk bytes fetched by range requests, served to the Parquet
//! decoder.
//!
//! Readers of data objects (the engine's scan, a storage node) fetch only
//! the byte ranges of the column chunks they need; [`FetchedChunks`] then
//! serves the decoder from those bytes, so it never touches the object
//! store and never needs more of the file than was fetched. The page index
//! says which bytes those are when only some rows are wanted
//! ([`selected_pages`]).

use std::ops::Range;

use bytes::{Buf, Bytes};
use parquet::errors::ParquetError;
use parquet::file::metadata::{PageIndexPolicy, ParquetMetaData, ParquetMetaDataReader};
use parquet::file::reader::{ChunkReader, Length};

use crate::rows::RowRanges;

/// Where the column and offset indexes of every column chunk lie in the
/// object (Parquet writers put them in one stretch before the footer), as
/// the footer says; `None` when the file has neither.
pub fn page_index_range(meta: &ParquetMetaData) -> Option<Range<u64>> {
    let (mut start, mut end) = (u64::MAX, 0u64);
    for rg in meta.row_groups() {
        for c in rg.columns() {
            let indexes = [(c.column_index_offset(), c.column_index_length()), (c.offset_index_offset(), c.offset_index_length())];
            for (offset, length) in indexes {
                if let (Some(o), Some(l)) = (offset, length)
                    && o >= 0
                    && l > 0
                {
                    start = start.min(o as u64);
                    end = end.max(o as u64 + l as u64);
                }
            }
        }
    }
    (start < end).then_some(start..end)
}

/// `meta` with its page index decoded from `bytes`, which start at `offset`
/// in the object of `object_size` bytes named `object`.
pub fn with_page_index(meta: ParquetMetaData, offset: u64, bytes: Bytes, object_size: u64, object: &str) -> Result<ParquetMetaData, ParquetError> {
    let held = FetchedChunks::new(vec![(offset, bytes)], object_size, object.to_string());
    let mut reader = ParquetMetaDataReader::new_with_metadata(meta).with_page_index_policy(PageIndexPolicy::Required);
    reader.read_page_indexes_sized(&held, object_size)?;
    reader.finish()
}

/// The bytes of column chunk `column` of `row_group` that a decoder given
/// the row selection `selected` reads: the dictionary page, if any, and the
/// data pages holding selected rows, adjacent ranges merged. `None` when
/// the whole chunk is needed: no offset index in `meta`, every page
/// selected, or an index that does not fit the chunk (then reading the
/// whole chunk lets the decoder report what is wrong).
pub fn selected_pages(meta: &ParquetMetaData, row_group: usize, column: usize, selected: &RowRanges) -> Option<Vec<Range<u64>>> {
    let pages = meta.offset_index()?.get(row_group)?.get(column)?.page_locations();
    let (start, length) = meta.row_group(row_group).column(column).byte_range();
    let chunk = start..start + length;
    let rows = meta.row_group(row_group).num_rows() as u64;
    let first = pages.first()?.offset as u64;
    if !(chunk.start..=chunk.end).contains(&first) {
        return None;
    }
    let mut out: Vec<Range<u64>> = Vec::new();
    if first > chunk.start {
        out.push(chunk.start..first); // the dictionary page
    }
    let mut data_pages = 0;
    for (i, page) in pages.iter().enumerate() {
        let lo = page.first_row_index as u64;
        let hi = pages.get(i + 1).map_or(rows, |next| next.first_row_index as u64);
        if !selected.ranges().iter().any(|r| r.start < hi && lo < r.end) {
            continue;
        }
        let bytes = page.offset as u64..page.offset as u64 + page.compressed_page_size as u64;
        if page.offset < 0 || page.compressed_page_size <= 0 || bytes.start < first || bytes.end > chunk.end {
            return None;
        }
        data_pages += 1;
        match out.last_mut() {
            Some(last) if last.end == bytes.start => last.end = bytes.end,
            _ => out.push(bytes),
        }
    }
    (data_pages > 0 && data_pages < pages.len()).then_some(out)
}

/// The fetched spans of one object, served to the Parquet decoder.
///
/// A span fetched by several range requests is held as those requests'
/// buffers, not joined into one: joining copied every byte once more into
/// fresh memory (2 % of the CPU of TPC-H Q6 at SF 10, plus the page faults
/// of the copy). The decoder asks for a page at a time, so only a page
/// that straddles two requests is copied ([`FetchedChunks::get_bytes`]),
/// and a page header is read across them in place ([`PiecesReader`]).
#[derive(Debug, Clone)]
pub struct FetchedChunks {
    /// Pieces sorted by start offset: (start, bytes); adjacent pieces may
    /// continue one another.
    spans: Vec<(u64, Bytes)>,
    object_len: u64,
    object: String,
}

impl FetchedChunks {
    /// Wraps fetched pieces of an object of `object_len` bytes named `object`.
    pub fn new(mut spans: Vec<(u64, Bytes)>, object_len: u64, object: String) -> Self {
        spans.sort_by_key(|(s, _)| *s);
        FetchedChunks { spans, object_len, object }
    }

    /// The piece holding byte `start`, and `start`'s offset in it.
    fn locate(&self, start: u64) -> Option<(usize, usize)> {
        let idx = self.spans.partition_point(|(s, _)| *s <= start);
        let (s, bytes) = &self.spans[idx.checked_sub(1)?];
        let off = (start - s) as usize;
        (off < bytes.len()).then_some((idx - 1, off))
    }

    /// The pieces from `first` on that continue one another without a gap.
    fn contiguous(&self, first: usize) -> impl Iterator<Item = &Bytes> {
        let mut end = self.spans[first].0;
        self.spans[first..].iter().take_while(move |(s, b)| {
            let continues = *s == end;
            end = s + b.len() as u64;
            continues
        }).map(|(_, b)| b)
    }

    fn find(&self, start: u64, len: u64) -> Result<Bytes, ParquetError> {
        if len == 0 {
            return Ok(Bytes::new());
        }
        if let Some((idx, off)) = self.locate(start) {
            let bytes = &self.spans[idx].1;
            if off as u64 + len <= bytes.len() as u64 {
                return Ok(bytes.slice(off..off + len as usize));
            }
            // Across pieces that continue one another: these bytes only, copied.
            let mut out = Vec::with_capacity(len as usize);
            let mut skip = off;
            for piece in self.contiguous(idx) {
                let want = len as usize - out.len();
                let part = &piece[skip..];
                out.extend_from_slice(&part[..want.min(part.len())]);
                skip = 0;
                if out.len() == len as usize {
                    return Ok(Bytes::from(out));
                }
            }
        }
        Err(ParquetError::General(format!(
            "reading {}: the Parquet decoder asked for bytes {start}..{} that were not fetched (the manifest's column-chunk ranges do not match the data object)",
            self.object,
            start + len
        )))
    }
}

/// Reads the pieces that continue one another from a position on, in
/// place: what the decoder reads a page header through.
pub struct PiecesReader {
    pieces: std::collections::VecDeque<Bytes>,
}

impl std::io::Read for PiecesReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        while let Some(front) = self.pieces.front_mut() {
            if front.is_empty() {
                self.pieces.pop_front();
                continue;
            }
            let n = buf.len().min(front.len());
            front.copy_to_slice(&mut buf[..n]);
            return Ok(n);
        }
        Ok(0)
    }
}

impl Length for FetchedChunks {
    fn len(&self) -> u64 {
        self.object_len
    }
}

impl ChunkReader for FetchedChunks {
    type T = PiecesReader;

    fn get_read(&self, start: u64) -> Result<Self::T, ParquetError> {
        let Some((idx, off)) = self.locate(start) else {
            // Just past a piece: nothing left to read there (an empty reader,
            // as a slice at the end would be); anywhere else was not fetched.
            if self.spans.iter().any(|(s, b)| s + b.len() as u64 == start) {
                return Ok(PiecesReader { pieces: Default::default() });
            }
            return self.find(start, 1).map(|b| PiecesReader { pieces: [b].into() });
        };
        let mut pieces: std::collections::VecDeque<Bytes> = self.contiguous(idx).cloned().collect();
        if let Some(first) = pieces.front_mut() {
            first.advance(off);
        }
        Ok(PiecesReader { pieces })
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

    #[test]
    fn pieces_that_continue_one_another_serve_ranges_across_them() {
        let a = Bytes::from_static(b"abcdef");
        let c = FetchedChunks::new(vec![(106, Bytes::from_static(b"ghij")), (100, a.clone()), (110, Bytes::from_static(b"kl")), (200, Bytes::from_static(b"xyz"))], 1000, "o".into());
        let inside = c.get_bytes(101, 4).unwrap();
        assert_eq!(&inside[..], b"bcde");
        assert_eq!(inside.as_ptr(), a[1..].as_ptr(), "within one piece: a slice, not a copy");
        assert_eq!(&c.get_bytes(104, 8).unwrap()[..], b"efghijkl", "across three pieces");
        assert!(c.get_bytes(110, 3).is_err(), "past the last contiguous piece");
        assert!(c.get_bytes(111, 90).is_err(), "across a gap");
        assert_eq!(&c.get_bytes(201, 2).unwrap()[..], b"yz");
        let mut s = String::new();
        std::io::Read::read_to_string(&mut c.get_read(104).unwrap(), &mut s).unwrap();
        assert_eq!(s, "efghijkl", "a header is read on across pieces, up to a gap");
        assert!(c.get_read(150).is_err());
        let mut s = String::new();
        std::io::Read::read_to_string(&mut c.get_read(112).unwrap(), &mut s).unwrap();
        assert_eq!(s, "", "at the end of the fetched bytes: an empty reader");
    }
}
