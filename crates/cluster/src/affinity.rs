//! Which worker a row group belongs to: its *home*, whose memory and SSD
//! tiers hold its chunks, so that a repeated query reads them from there
//! and not from the store.
//!
//! Rendezvous (highest-random-weight) hashing: each worker scores each row
//! group by a hash of both; the highest score is the home, the next ones
//! are where to go when the home is busy or down. Adding a worker moves
//! only the row groups it now wins (about 1/n of them) and removing one
//! moves only its own; nothing else changes home, so caches stay warm.
//! Why not a hash ring: rendezvous needs no virtual nodes to balance and
//! its fallback order comes free; with tens of workers and a few thousand
//! row groups a query, scoring every pair costs microseconds.
//!
//! Scores must agree across processes and releases (the coordinator plans,
//! workers cache): the hash is xxh3 of fixed bytes, never `std`'s hasher,
//! whose algorithm is not promised to stay.

use twox_hash::XxHash3_64;

/// A worker's stable identity: the same after a restart (its name or
/// address), so that its share of row groups comes back to it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerKey {
    pub id: String,
    hash: u64,
}

impl WorkerKey {
    pub fn new(id: impl Into<String>) -> WorkerKey {
        let id = id.into();
        let hash = XxHash3_64::oneshot(id.as_bytes());
        WorkerKey { id, hash }
    }
}

/// A row group's identity: its object (never rewritten, so the name is
/// the content) and its index there.
pub fn row_group_key(object: &str, row_group: usize) -> u64 {
    let mut bytes = Vec::with_capacity(object.len() + 9);
    bytes.extend_from_slice(object.as_bytes());
    bytes.push(0); // no object name holds a NUL: names and indexes do not run together
    bytes.extend_from_slice(&(row_group as u64).to_le_bytes());
    XxHash3_64::oneshot(&bytes)
}

/// The score of `worker` for `key` (splitmix64's finaliser over both
/// hashes: every bit of each moves the score).
fn score(worker: &WorkerKey, key: u64) -> u64 {
    let mut z = worker.hash ^ key.rotate_left(32) ^ 0x9e37_79b9_7f4a_7c15;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The home of `key` among `workers` (its index); `None` with no workers.
/// Ties (equal scores) go to the lower id, so every process agrees.
pub fn home(key: u64, workers: &[WorkerKey]) -> Option<usize> {
    (0..workers.len()).max_by(|&a, &b| score(&workers[a], key).cmp(&score(&workers[b], key)).then_with(|| workers[b].id.cmp(&workers[a].id)))
}

/// Every worker's index in order of preference for `key`: the home first,
/// then where to read it when the home is busy or down.
pub fn ranked(key: u64, workers: &[WorkerKey]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..workers.len()).collect();
    order.sort_by(|&a, &b| score(&workers[b], key).cmp(&score(&workers[a], key)).then_with(|| workers[a].id.cmp(&workers[b].id)));
    order
}

#[cfg(test)]
mod tests {
    use super::*;

    fn workers(n: usize) -> Vec<WorkerKey> {
        (0..n).map(|i| WorkerKey::new(format!("worker-{i}"))).collect()
    }

    fn keys() -> Vec<u64> {
        (0..40).flat_map(|o| (0..250).map(move |rg| row_group_key(&format!("lineitem/{o:04}.parquet"), rg))).collect()
    }

    #[test]
    fn homes_are_spread_evenly_and_the_same_in_every_process() {
        let w = workers(3);
        let mut counts = [0usize; 3];
        for k in keys() {
            counts[home(k, &w).unwrap()] += 1;
        }
        for c in counts {
            assert!((2667..4000).contains(&c), "{counts:?} of 10000");
        }
        // Fixed inputs, fixed answers: a change of hash would move every cache.
        assert_eq!(row_group_key("lineitem/0000.parquet", 7), row_group_key("lineitem/0000.parquet", 7));
        assert_ne!(row_group_key("a1", 0), row_group_key("a", 1 << 56 | 0x31), "object and index do not run together");
        assert_eq!(home(row_group_key("orders/0001.parquet", 3), &w), home(row_group_key("orders/0001.parquet", 3), &workers(3)));
        assert_eq!(home(1, &[]), None);
    }

    #[test]
    fn a_new_worker_takes_about_its_share_and_nothing_else_moves() {
        let (three, four) = (workers(3), workers(4));
        let keys = keys();
        let mut moved = 0;
        for &k in &keys {
            let (before, after) = (home(k, &three).unwrap(), home(k, &four).unwrap());
            if before != after {
                moved += 1;
                assert_eq!(after, 3, "a row group moves only to the new worker");
            }
        }
        let share = moved as f64 / keys.len() as f64;
        assert!((0.15..=0.35).contains(&share), "{share} of row groups moved");
    }

    #[test]
    fn a_removed_worker_hands_on_only_its_own_to_their_next_choice() {
        let all = workers(4);
        let without: Vec<WorkerKey> = all.iter().filter(|w| w.id != "worker-2").cloned().collect();
        for k in keys() {
            let order = ranked(k, &all);
            assert_eq!(order[0], home(k, &all).unwrap(), "the home ranks first");
            let next = all[order.iter().copied().find(|&i| all[i].id != "worker-2").unwrap()].id.clone();
            assert_eq!(without[home(k, &without).unwrap()].id, next, "the fallback order is the new home");
        }
    }
}
