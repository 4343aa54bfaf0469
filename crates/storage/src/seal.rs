//! Seals on metadata objects: every JSON object blobhouse writes (version
//! objects, manifests, GC lists, key leases) ends with a member
//! `"seal":"<16 hex digits>"`, an XXH3-64 of the bytes before it, seeded with
//! the database's identity and the object's own path.
//!
//! Why: a flipped byte inside a metadata object often still parses — a
//! zone map's bound, a row count, an object key — and would change answers
//! or, in a GC list, delete the wrong object. The seal makes every such
//! change an error that names the object. Seeding with the path and the
//! database catches what a plain checksum cannot: a valid object copied
//! over another one (a swapped manifest) and an object replayed from
//! another database or another version number. Parents hold their
//! children's seals too ([`crate::format::ManifestRef::checksum`], a delta's
//! checkpoint seal), so a child replaced by an older, validly sealed object
//! of the same path is caught as well.
//!
//! The member is appended to the serializer's output as text rather than
//! carried in the serde types, so the seal covers the exact bytes written
//! and readers that ignore it (`jq`, older builds reading the JSON) see an
//! ordinary object. XXH3 is not a MAC: the seal finds damage, not an
//! attacker who rewrites the bucket; encrypted databases authenticate
//! their metadata with AES-GCM instead (docs/security.md).
//!
//! No crate does this: it is a property of our own object layout (which
//! objects exist, what names them, what their parents record).

use twox_hash::XxHash3_64;

/// The first format version whose metadata objects must carry a seal.
/// Objects of older versions are read unsealed (and a seal on them, when
/// present, is still checked).
pub const SEALED_SINCE: u32 = 3;

const PREFIX: &[u8] = b",\"seal\":\"";
const HEX: usize = 16;
/// Bytes the seal adds to an object: `,"seal":"` + 16 hex digits + `"}`
/// replacing the closing `}`.
pub const SEAL_LEN: usize = PREFIX.len() + HEX + 2 - 1;

/// Seals and checks the metadata objects of one database.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sealer {
    /// The database's identity: its marker's creation time and random id.
    database: u64,
}

/// Why an object's seal did not check out.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SealError {
    /// The object carries a seal and its bytes do not match it.
    #[error("its seal {found:016x} does not match its {len} bytes (expected {expected:016x}): the object was damaged, or copied here from another path or database")]
    Mismatch { found: u64, expected: u64, len: usize },
    /// The object's format requires a seal and it has none (or it was cut).
    #[error("it has no seal, which its format version {format_version} requires: the object was damaged or truncated")]
    Missing { format_version: u32 },
    /// The parent that names the object recorded another seal.
    #[error("its seal {found:016x} is not the {expected:016x} its parent recorded: another valid object stands in its place")]
    Substituted { found: u64, expected: u64 },
}

impl Sealer {
    /// The sealer of the database whose marker says `created_at_ms` and
    /// `id` (`None` for databases created before markers had ids).
    pub fn new(created_at_ms: u64, id: Option<u64>) -> Sealer {
        let mut seed = [0u8; 17];
        seed[..8].copy_from_slice(&created_at_ms.to_le_bytes());
        if let Some(id) = id {
            seed[8..16].copy_from_slice(&id.to_le_bytes());
            seed[16] = 1;
        }
        Sealer { database: XxHash3_64::oneshot(&seed) }
    }

    /// The database's identity as one number (what seeds the seals): other
    /// names derived from the database, such as its tables' Iceberg UUIDs,
    /// use it too.
    pub fn identity(&self) -> u64 {
        self.database
    }

    fn seed(&self, relative: &str) -> u64 {
        XxHash3_64::oneshot_with_seed(self.database, relative.as_bytes())
    }

    /// Seals `json` (a serialized object, ending in `}`) to be written at
    /// `relative` (its path under the database root). Returns the bytes to
    /// write and the seal, for the parent to record.
    pub fn seal(&self, relative: &str, mut json: Vec<u8>) -> (Vec<u8>, u64) {
        assert!(json.len() > 2 && json.last() == Some(&b'}') && json.first() == Some(&b'{'), "only JSON objects are sealed");
        json.pop();
        let seal = XxHash3_64::oneshot_with_seed(self.seed(relative), &json);
        json.extend_from_slice(PREFIX);
        json.extend_from_slice(format!("{seal:016x}").as_bytes());
        json.extend_from_slice(b"\"}");
        (json, seal)
    }

    /// Checks the seal of `bytes` read from `relative`: returns the seal
    /// (`None` for an unsealed object of a format before
    /// [`SEALED_SINCE`]). `format_version` tells what the object says of
    /// itself (asked only of objects without a seal: parsing costs);
    /// `expected` is what its parent recorded, if anything.
    pub fn check(&self, relative: &str, bytes: &[u8], format_version: impl FnOnce() -> u32, expected: Option<u64>) -> Result<Option<u64>, SealError> {
        let Some(found) = trailer(bytes) else {
            let format_version = format_version();
            if format_version >= SEALED_SINCE || expected.is_some() {
                return Err(SealError::Missing { format_version });
            }
            return Ok(None);
        };
        let body = &bytes[..bytes.len() - SEAL_LEN - 1];
        let computed = XxHash3_64::oneshot_with_seed(self.seed(relative), body);
        if computed != found {
            return Err(SealError::Mismatch { found, expected: computed, len: bytes.len() });
        }
        if let Some(expected) = expected.filter(|e| *e != found) {
            return Err(SealError::Substituted { found, expected });
        }
        Ok(Some(found))
    }
}

/// The seal at the end of `bytes`, if they end with one.
fn trailer(bytes: &[u8]) -> Option<u64> {
    let tail = bytes.len().checked_sub(SEAL_LEN + 1).map(|at| &bytes[at..])?;
    let hex = tail.strip_prefix(PREFIX)?.strip_suffix(b"\"}")?;
    if hex.len() != HEX || !hex.iter().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(b)) {
        return None;
    }
    u64::from_str_radix(std::str::from_utf8(hex).ok()?, 16).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn object() -> Vec<u8> {
        br#"{"format_version":3,"version":7,"tables":{"t":{"rows":100}}}"#.to_vec()
    }

    #[test]
    fn a_sealed_object_is_still_json_and_checks_out_where_it_was_written() {
        let sealer = Sealer::new(1, Some(2));
        let (bytes, seal) = sealer.seal("log/x.json", object());
        let parsed: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(parsed["version"], 7);
        assert_eq!(parsed["seal"], format!("{seal:016x}"));
        assert_eq!(bytes.len(), object().len() + SEAL_LEN);
        assert_eq!(sealer.check("log/x.json", &bytes, || 3, None), Ok(Some(seal)));
        assert_eq!(sealer.check("log/x.json", &bytes, || 3, Some(seal)), Ok(Some(seal)));
    }

    #[test]
    fn every_single_byte_flip_is_found() {
        let sealer = Sealer::new(1, Some(2));
        let (bytes, _) = sealer.seal("m", object());
        for at in 0..bytes.len() {
            for bit in 0..8 {
                let mut damaged = bytes.clone();
                damaged[at] ^= 1 << bit;
                // The object's format version may be damaged too; a reader
                // takes what the bytes say, or the newest when they say nothing.
                let claimed = if damaged.starts_with(br#"{"format_version":3"#) { 3 } else { 2 };
                let result = sealer.check("m", &damaged, || claimed, None);
                assert!(result.is_err(), "flip of bit {bit} at byte {at} passed: {}", String::from_utf8_lossy(&damaged));
            }
        }
    }

    #[test]
    fn a_valid_object_at_another_path_or_of_another_database_or_replacing_a_recorded_one_is_refused() {
        let sealer = Sealer::new(1, Some(2));
        let (bytes, seal) = sealer.seal("objects/0001/a.manifest.json", object());
        assert!(matches!(sealer.check("objects/0001/b.manifest.json", &bytes, || 3, None), Err(SealError::Mismatch { .. })));
        assert!(matches!(Sealer::new(1, Some(3)).check("objects/0001/a.manifest.json", &bytes, || 3, None), Err(SealError::Mismatch { .. })));
        assert!(matches!(Sealer::new(1, None).check("objects/0001/a.manifest.json", &bytes, || 3, None), Err(SealError::Mismatch { .. })));
        let (other, _) = sealer.seal("objects/0001/a.manifest.json", br#"{"format_version":3,"version":8}"#.to_vec());
        assert!(matches!(sealer.check("objects/0001/a.manifest.json", &other, || 3, Some(seal)), Err(SealError::Substituted { .. })));
    }

    #[test]
    fn unsealed_objects_of_older_formats_are_read_and_newer_ones_are_not() {
        let sealer = Sealer::new(1, None);
        assert_eq!(sealer.check("m", &object(), || 2, None), Ok(None));
        assert_eq!(sealer.check("m", &object(), || 3, None), Err(SealError::Missing { format_version: 3 }));
        assert_eq!(sealer.check("m", &object(), || 2, Some(5)), Err(SealError::Missing { format_version: 2 }));
        // A cut seal is a missing one.
        let (bytes, _) = sealer.seal("m", object());
        assert!(sealer.check("m", &bytes[..bytes.len() - 3], || 3, None).is_err());
    }
}
