//! Unique, strictly increasing 64-bit object keys, and object names.
//!
//! SAP IQ (§3.1–3.2) never writes an object twice: every object gets a key that
//! was never used before, handed out from ranges that each writer leases. We
//! lease ranges on the store itself: range `n` is ours once we created
//! `keys/<n:020>.json` with put-if-absent, so two writers (threads, processes
//! or machines) can never lease the same range and no coordination service is
//! needed. Keys within a lease are handed out in increasing order, and leases
//! are taken in increasing order, so keys of later leases are always larger.
//!
//! Object names carry a hashed prefix (`objects/<hhhh>/<key:016x>…`) so that a
//! store which partitions its request rate by key prefix spreads our load.
//!
//! **Key blocks, for crash recovery.** Before handing out keys, a writer
//! declares the block they come from (256 keys) by creating
//! `keys/<lease:020>/<first key:016x>-<usable until, ms>.json`, and it stops
//! using a block once that time has passed. A writer killed inside a
//! transaction leaves uploads that no version references; they can only be
//! under keys of blocks declared this way, so garbage collection finds them
//! by listing `keys/` — the blocks of the last grace period, not the whole
//! bucket — and deleting the names of the block's keys that no retained
//! version references (`crate::gc`).

use object_store::{ObjectStore, PutMode, PutOptions, PutPayload};
use serde::{Deserialize, Serialize};
use tokio::sync::Mutex;

use crate::error::{Result, StorageError};
use crate::format::{KEYS_DIR, OBJECTS_DIR, now_ms};
use crate::location::Location;

/// Keys per lease. 2^20 keys per lease leaves 2^44 leases.
pub const LEASE_KEYS: u64 = 1 << 20;

/// How often a writer retries leasing when others keep winning the next range.
const MAX_LEASE_ATTEMPTS: u32 = 64;

/// Keys per declared block.
pub const BLOCK_KEYS: u64 = 256;

/// How long a writer keeps handing out keys of one declared block, by default.
pub const DEFAULT_BLOCK_TTL: std::time::Duration = std::time::Duration::from_secs(600);

#[derive(Debug, Serialize, Deserialize)]
struct LeaseRecord {
    lease: u64,
    first_key: u64,
    keys: u64,
    leased_at_ms: u64,
    writer: String,
}

#[derive(Debug, Default)]
struct LeaseState {
    next: u64,
    end: u64,
    /// The declared block: keys below `block_end`, until `block_until_ms`.
    block_end: u64,
    block_until_ms: u64,
}

/// A declared key block, as named under `keys/`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyBlock {
    pub lease: u64,
    pub first_key: u64,
    /// Keys are not handed out from it after this time (ms since the epoch).
    pub usable_until_ms: u64,
}

impl KeyBlock {
    /// The block's name relative to the database root.
    pub fn path(&self) -> String {
        format!("{KEYS_DIR}/{:020}/{:016x}-{}.json", self.lease, self.first_key, self.usable_until_ms)
    }

    /// Parses a name made by [`KeyBlock::path`] (relative to `keys/`'s parent).
    pub fn parse(relative: &str) -> Option<KeyBlock> {
        let rest = relative.strip_prefix(&format!("{KEYS_DIR}/"))?;
        let (lease, name) = rest.split_once('/')?;
        let (first, until) = name.strip_suffix(".json")?.split_once('-')?;
        Some(KeyBlock { lease: lease.parse().ok()?, first_key: u64::from_str_radix(first, 16).ok()?, usable_until_ms: until.parse().ok()? })
    }

    /// Its keys.
    pub fn keys(&self) -> std::ops::Range<u64> {
        self.first_key..self.first_key + BLOCK_KEYS
    }
}

/// Hands out keys from leased ranges. One per open database handle.
#[derive(Debug)]
pub struct KeyGenerator {
    loc: Location,
    writer: String,
    block_ttl: std::time::Duration,
    state: Mutex<LeaseState>,
    /// An encrypted database's keys: lease and block records are encrypted
    /// like every metadata object (they name the writing host).
    keyring: Option<std::sync::Arc<crate::encryption::Keyring>>,
}

impl KeyGenerator {
    /// A generator that leases lazily, on the first key it hands out, and
    /// uses each declared block for at most `block_ttl`.
    pub fn new(loc: Location, block_ttl: std::time::Duration, keyring: Option<std::sync::Arc<crate::encryption::Keyring>>) -> Self {
        let writer = format!("pid {} on {}", std::process::id(), hostname());
        KeyGenerator { loc, writer, block_ttl, state: Mutex::new(LeaseState::default()), keyring }
    }

    /// A record's bytes as stored at `relative`.
    fn record(&self, relative: &str, body: Vec<u8>) -> Vec<u8> {
        match &self.keyring {
            Some(k) => k.seal(relative, body),
            None => body,
        }
    }

    /// The next key; declares a new block when the current one is used up
    /// or too old, and leases a new range when the lease is used up.
    pub async fn next(&self) -> Result<u64> {
        let mut st = self.state.lock().await;
        let now = now_ms();
        if st.next >= st.block_end || now >= st.block_until_ms {
            // The rest of an expired block is never used: its keys may
            // already be collected as a dead writer's.
            let start = st.next.div_ceil(BLOCK_KEYS) * BLOCK_KEYS;
            st.next = start;
            if st.next >= st.end {
                let lease = self.lease().await?;
                st.next = lease * LEASE_KEYS;
                st.end = st.next + LEASE_KEYS;
            }
            let block = KeyBlock { lease: st.next / LEASE_KEYS, first_key: st.next, usable_until_ms: now + self.block_ttl.as_millis() as u64 };
            let path = self.loc.child(&block.path());
            let opts = PutOptions { mode: PutMode::Create, ..Default::default() };
            let body = format!("{{\"writer\": {:?}, \"declared_at_ms\": {now}}}", self.writer);
            let body = self.record(&block.path(), body.into_bytes());
            self.loc.store.put_opts(&path, PutPayload::from(body), opts).await.map_err(|e| StorageError::store("PUT", self.loc.display(&path), e))?;
            st.block_end = st.next + BLOCK_KEYS;
            st.block_until_ms = block.usable_until_ms;
        }
        let key = st.next;
        st.next += 1;
        debug_assert!(key >= LEASE_KEYS, "lease 0 is reserved");
        Ok(key)
    }

    async fn lease(&self) -> Result<u64> {
        let dir = self.loc.child(KEYS_DIR);
        for _ in 0..MAX_LEASE_ATTEMPTS {
            // Lease records only (blocks are in the leases' folders).
            let listing = self.loc.store.list_with_delimiter(Some(&dir)).await.map_err(|e| StorageError::store("LIST", self.loc.display(&dir), e))?;
            let newest = listing
                .objects
                .iter()
                .filter_map(|m| m.location.filename()?.strip_suffix(".json")?.parse::<u64>().ok())
                .max()
                .unwrap_or(0);
            let lease = newest + 1;
            let record = LeaseRecord {
                lease,
                first_key: lease * LEASE_KEYS,
                keys: LEASE_KEYS,
                leased_at_ms: now_ms(),
                writer: self.writer.clone(),
            };
            let relative = format!("{KEYS_DIR}/{lease:020}.json");
            let path = self.loc.child(&relative);
            let body = self.record(&relative, serde_json::to_vec_pretty(&record).expect("lease record serialises"));
            let opts = PutOptions { mode: PutMode::Create, ..Default::default() };
            match self.loc.store.put_opts(&path, PutPayload::from(body), opts).await {
                Ok(_) => return Ok(lease),
                Err(object_store::Error::AlreadyExists { .. }) => continue,
                Err(e) => return Err(StorageError::store("PUT", self.loc.display(&path), e)),
            }
        }
        Err(StorageError::TooManyRetries { attempts: MAX_LEASE_ATTEMPTS })
    }
}

/// The object name of `key`: `objects/<hhhh>/<key:016x>.<ext>`, where `hhhh`
/// is a hash of the key so consecutive keys land in different prefixes.
pub fn object_name(key: u64, ext: &str) -> String {
    format!("{OBJECTS_DIR}/{:04x}/{key:016x}.{ext}", key_hash(key) >> 48)
}

/// The key of a name made by [`object_name`] with extension `ext`; `None`
/// for any other name. A storage node reads only names that parse, so a
/// request can never make it read a manifest, a key block or a path outside
/// the database.
pub fn parse_object_name(name: &str, ext: &str) -> Option<u64> {
    let rest = name.strip_prefix(OBJECTS_DIR)?.strip_prefix('/')?;
    let (_, file) = rest.split_once('/')?;
    let hex = file.strip_suffix(ext)?.strip_suffix('.')?;
    if hex.len() != 16 || !hex.bytes().all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()) {
        return None;
    }
    let key = u64::from_str_radix(hex, 16).ok()?;
    (object_name(key, ext) == name).then_some(key)
}

/// SplitMix64's finaliser: a cheap, well-mixing hash of a key.
fn key_hash(key: u64) -> u64 {
    let mut z = key.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown-host".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn object_names_spread_consecutive_keys_over_prefixes() {
        let prefixes: std::collections::HashSet<String> =
            (LEASE_KEYS..LEASE_KEYS + 64).map(|k| object_name(k, "parquet")[..12].to_string()).collect();
        assert!(prefixes.len() > 60, "hashed prefixes collide too often: {}", prefixes.len());
        assert_eq!(object_name(0x100001, "parquet").len(), "objects/0000/0000000000100001.parquet".len());
        assert!(object_name(0x100001, "parquet").ends_with("/0000000000100001.parquet"));
    }

    #[test]
    fn only_names_of_data_objects_parse() {
        let name = object_name(0x100001, "parquet");
        assert_eq!(parse_object_name(&name, "parquet"), Some(0x100001));
        assert_eq!(parse_object_name(&name, "json"), None);
        for bad in [
            "objects/0000/0000000000100001.parquet".to_string(), // wrong hash prefix
            format!("../{name}"),
            format!("/{name}"),
            name.replace("objects/", "objects/../"),
            name.to_uppercase(),
            "catalog/00000000000000000001.json".into(),
            format!("{name}/x"),
            String::new(),
        ] {
            assert_eq!(parse_object_name(&bad, "parquet"), None, "{bad:?} parsed");
        }
    }
}
