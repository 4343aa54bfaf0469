//! Iceberg format-3 deletion vectors: blobhouse's Roaring bitmaps in
//! Puffin files (`deletion-vector-v1` blobs).
//!
//! A blobhouse deletion vector is the portable serialization of a 32-bit
//! Roaring bitmap of row positions (docs/storage-format.md). Iceberg's
//! `deletion-vector-v1` blob holds a 64-bit "portable" Roaring bitmap —
//! a count of 32-bit bitmaps, then each with its high 32 bits as a key —
//! framed by a length, a magic number and a CRC. Since an object has
//! fewer than 2^32 rows, the 64-bit bitmap is our one 32-bit bitmap under
//! key 0: our bytes with a 12-byte prefix, not a re-encoding.
//!
//! One blob per Puffin file: DuckDB 1.5.5 reads only that reliably
//! (docs/notes/2026-11-28-issue47-research.md §2).

use roaring::RoaringBitmap;
use serde_json::json;

/// Puffin's magic, at the start and end of a file and before the footer.
const MAGIC: &[u8; 4] = b"PFA1";
/// The magic that opens a `deletion-vector-v1` blob's content.
const DV_MAGIC: [u8; 4] = [0xD1, 0xD3, 0x39, 0x64];
/// Iceberg's reserved field id of the row position (`_pos`).
const ROW_POSITION_FIELD: i64 = 2147483645;

/// A Puffin file holding one deletion vector, and where its blob lies.
pub struct PuffinFile {
    pub bytes: Vec<u8>,
    /// The blob's offset and length (a manifest entry's `content_offset`
    /// and `content_size_in_bytes`).
    pub offset: u64,
    pub length: u64,
}

/// The Puffin file of the deletion vector `positions` of the data file
/// `data_file` (its URI as manifests name it).
pub fn deletion_vector_file(data_file: &str, positions: &RoaringBitmap) -> PuffinFile {
    let mut vector = Vec::with_capacity(12 + positions.serialized_size());
    vector.extend_from_slice(&1u64.to_le_bytes());
    vector.extend_from_slice(&0u32.to_le_bytes());
    positions.serialize_into(&mut vector).expect("writing to a Vec cannot fail");
    let mut content = Vec::with_capacity(4 + vector.len());
    content.extend_from_slice(&DV_MAGIC);
    content.extend_from_slice(&vector);
    let crc = crc32fast::hash(&content);
    let mut blob = Vec::with_capacity(8 + content.len());
    blob.extend_from_slice(&(content.len() as u32).to_be_bytes());
    blob.extend_from_slice(&content);
    blob.extend_from_slice(&crc.to_be_bytes());

    let offset = MAGIC.len() as u64;
    let length = blob.len() as u64;
    let footer = json!({
        "blobs": [{
            "type": "deletion-vector-v1",
            "fields": [ROW_POSITION_FIELD],
            "snapshot-id": -1,
            "sequence-number": -1,
            "offset": offset,
            "length": length,
            "properties": {"referenced-data-file": data_file, "cardinality": positions.len().to_string()},
        }],
        "properties": {"created-by": "blobhouse"},
    })
    .to_string();
    let mut bytes = Vec::with_capacity(offset as usize + blob.len() + footer.len() + 16);
    bytes.extend_from_slice(MAGIC);
    bytes.extend_from_slice(&blob);
    bytes.extend_from_slice(MAGIC);
    bytes.extend_from_slice(footer.as_bytes());
    bytes.extend_from_slice(&(footer.len() as i32).to_le_bytes());
    bytes.extend_from_slice(&[0, 0, 0, 0]);
    bytes.extend_from_slice(MAGIC);
    PuffinFile { bytes, offset, length }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_vector_is_our_bitmap_framed_with_a_length_magic_and_crc() {
        let positions: RoaringBitmap = [1u32, 3, 70_000].into_iter().collect();
        let f = deletion_vector_file("file:///db/objects/x.parquet", &positions);
        let b = &f.bytes;
        assert_eq!(&b[..4], MAGIC);
        assert_eq!(&b[b.len() - 4..], MAGIC);
        let blob = &b[f.offset as usize..(f.offset + f.length) as usize];
        let len = u32::from_be_bytes(blob[..4].try_into().unwrap()) as usize;
        assert_eq!(len + 8, blob.len());
        assert_eq!(&blob[4..8], DV_MAGIC);
        // Our portable bitmap, after one bitmap under key 0.
        assert_eq!(&blob[8..20], &[1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(RoaringBitmap::deserialize_from(&blob[20..blob.len() - 4]).unwrap(), positions);
        let crc = u32::from_be_bytes(blob[blob.len() - 4..].try_into().unwrap());
        assert_eq!(crc, crc32fast::hash(&blob[4..blob.len() - 4]));
        // The footer: its length before the flags and the closing magic.
        let footer_len = i32::from_le_bytes(b[b.len() - 12..b.len() - 8].try_into().unwrap()) as usize;
        let footer: serde_json::Value = serde_json::from_slice(&b[b.len() - 12 - footer_len..b.len() - 12]).unwrap();
        assert_eq!(footer["blobs"][0]["properties"]["cardinality"], "3");
        assert_eq!(&b[b.len() - 16 - footer_len..b.len() - 12 - footer_len], MAGIC);
    }
}
