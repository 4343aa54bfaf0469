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
//! A lease that was taken but whose keys never reached a committed version is
//! garbage that the (later) garbage collector finds by comparing leases with
//! the keys referenced from the catalog.

use futures::TryStreamExt;
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
}

/// Hands out keys from leased ranges. One per open database handle.
#[derive(Debug)]
pub struct KeyGenerator {
    loc: Location,
    writer: String,
    state: Mutex<LeaseState>,
}

impl KeyGenerator {
    /// A generator that leases lazily, on the first key it hands out.
    pub fn new(loc: Location) -> Self {
        let writer = format!("pid {} on {}", std::process::id(), hostname());
        KeyGenerator { loc, writer, state: Mutex::new(LeaseState::default()) }
    }

    /// The next key; leases a new range when the current one is used up.
    pub async fn next(&self) -> Result<u64> {
        let mut st = self.state.lock().await;
        if st.next >= st.end {
            let lease = self.lease().await?;
            st.next = lease * LEASE_KEYS;
            st.end = st.next + LEASE_KEYS;
        }
        let key = st.next;
        st.next += 1;
        debug_assert!(key >= LEASE_KEYS, "lease 0 is reserved");
        Ok(key)
    }

    async fn lease(&self) -> Result<u64> {
        let dir = self.loc.child(KEYS_DIR);
        for _ in 0..MAX_LEASE_ATTEMPTS {
            let metas: Vec<_> = self
                .loc
                .store
                .list(Some(&dir))
                .try_collect()
                .await
                .map_err(|e| StorageError::store("LIST", self.loc.display(&dir), e))?;
            let newest = metas
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
            let path = self.loc.child(&format!("{KEYS_DIR}/{lease:020}.json"));
            let body = serde_json::to_vec_pretty(&record).expect("lease record serialises");
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
}
