//! Checksums of the single pages of a column chunk
//! ([`crate::format::ColumnChunkMeta::pages`]).
//!
//! A scan fetches column chunks whole and checks them by their chunk
//! checksum. A storage node, under a row selection, fetches only the
//! dictionary page and the data pages holding selected rows; a whole-chunk
//! checksum cannot cover those, so each page has its own. They are written
//! only for chunks of several pages (objects whose manifest points at a
//! page index), 4 bytes a page: XXH3-64 of the page's bytes (header
//! included) cut to its low 32 bits — damage detection, not a MAC, like
//! every checksum of a plaintext database.
//!
//! Parquet's own page CRC would serve, but parquet-rs 59 does not write it.

use std::ops::Range;

use base64::Engine as _;
use bytes::Bytes;
use parquet::file::metadata::ParquetMetaData;

/// The pages of column `column` of `row_group`, as byte ranges in file
/// order: the dictionary page (if any), then each data page, by the offset
/// index. `None` without an offset index or with one that does not tile
/// the chunk.
pub fn page_ranges(meta: &ParquetMetaData, row_group: usize, column: usize) -> Option<Vec<Range<u64>>> {
    let pages = meta.offset_index()?.get(row_group)?.get(column)?.page_locations();
    let (start, length) = meta.row_group(row_group).column(column).byte_range();
    let mut out = Vec::with_capacity(pages.len() + 1);
    let first = pages.first()?.offset;
    if first < 0 || (first as u64) < start {
        return None;
    }
    if first as u64 > start {
        out.push(start..first as u64);
    }
    for p in pages {
        if p.offset < 0 || p.compressed_page_size <= 0 {
            return None;
        }
        out.push(p.offset as u64..p.offset as u64 + p.compressed_page_size as u64);
    }
    // The pages must tile the chunk exactly.
    let tiles = out.windows(2).all(|w| w[0].end == w[1].start) && out.last().is_some_and(|l| l.end == start + length);
    tiles.then_some(out)
}

/// The checksum of one page's bytes.
pub fn page_sum(bytes: &[u8]) -> u32 {
    crate::format::chunk_checksum(bytes) as u32
}

/// The pages' checksums of a chunk, for the manifest: `object` is the whole
/// object, `pages` its [`page_ranges`].
pub fn encode(object: &[u8], pages: &[Range<u64>]) -> String {
    let sums: Vec<u8> = pages.iter().flat_map(|p| page_sum(&object[p.start as usize..p.end as usize]).to_le_bytes()).collect();
    base64::engine::general_purpose::STANDARD.encode(sums)
}

/// The checksums again; `None` when the text is not what [`encode`] makes.
pub fn decode(text: &str) -> Option<Vec<u32>> {
    let bytes = base64::engine::general_purpose::STANDARD.decode(text).ok()?;
    (bytes.len() % 4 == 0).then(|| bytes.chunks_exact(4).map(|c| u32::from_le_bytes(c.try_into().expect("4 bytes"))).collect())
}

/// Checks fetched `spans` (where each starts in the object, its bytes) of
/// a chunk whose pages are `pages` with checksums `sums`: every span must
/// be whole pages, each matching its checksum. Returns the first page (or
/// span) that does not.
pub fn check(spans: &[(u64, Bytes)], pages: &[Range<u64>], sums: &[u32]) -> Result<(), Range<u64>> {
    if pages.len() != sums.len() {
        return Err(spans.first().map_or(0..0, |(at, b)| *at..*at + b.len() as u64));
    }
    for (at, bytes) in spans {
        let span = *at..*at + bytes.len() as u64;
        let mut covered = span.start;
        for (page, sum) in pages.iter().zip(sums).filter(|(p, _)| p.start >= span.start && p.end <= span.end) {
            if page.start != covered {
                return Err(span);
            }
            if page_sum(&bytes[(page.start - span.start) as usize..(page.end - span.start) as usize]) != *sum {
                return Err(page.clone());
            }
            covered = page.end;
        }
        if covered != span.end {
            return Err(span);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_of_whole_pages_check_and_any_flip_or_misfit_is_named() {
        let object: Vec<u8> = (0..100u32).map(|i| (i * 7 % 251) as u8).collect();
        let pages = vec![10..20, 20..45, 45..60, 60..90];
        let sums = decode(&encode(&object, &pages)).unwrap();
        assert_eq!(sums.len(), 4);
        let span = |r: Range<u64>, data: &[u8]| (r.start, Bytes::copy_from_slice(&data[r.start as usize..r.end as usize]));
        // The dictionary page and the third page, as a node fetches them.
        assert_eq!(check(&[span(10..20, &object), span(45..60, &object)], &pages, &sums), Ok(()));
        assert_eq!(check(&[span(20..60, &object)], &pages, &sums), Ok(()));
        let mut damaged = object.clone();
        damaged[50] ^= 1;
        assert_eq!(check(&[span(20..60, &damaged)], &pages, &sums), Err(45..60));
        // A span that is not whole pages cannot be checked.
        assert_eq!(check(&[span(20..50, &object)], &pages, &sums), Err(20..50));
        assert_eq!(check(&[span(15..20, &object)], &pages, &sums), Err(15..20));
        assert!(decode("not base64!").is_none() && decode("AAA=").is_none());
    }
}
