//! The SSD tier (SAP IQ's object cache manager, §4): segments as files in
//! a local directory, bounded in size, surviving restarts, never trusted
//! without a checksum.
//!
//! **Layout.** A cache directory holds up to [`MAX_SLOTS`] slots
//! (`slot-0`, `slot-1`, …). A process owns one slot at a time through an
//! exclusive `flock` on `slot-N/lock`, taking the first free one; the lock
//! dies with the process. So processes running at once never share files
//! (each has its own size bound), and a process started after another
//! ended takes over its slot and its contents: restarts keep the cache.
//! Inside a slot, a segment is `<hh>/<xxh3-128 of its key>.seg`:
//!
//! ```text
//! magic "BHSEG001" | payload length u64 | payload xxh3-64 u64 |
//! key length u32 | start u64 | len u64 | object URL | payload
//! ```
//!
//! (little endian). An entry is written to `tmp-<random>` and renamed into
//! place, so a killed process leaves a temporary file (removed at the next
//! start) or a whole entry, never half of one at its name.
//!
//! **Trust.** Every read checks the header (magic, key, lengths) and the
//! payload's checksum; a corrupted or truncated entry is deleted and
//! reported as a miss, so the caller fetches from the store. Write errors
//! (a full disk, a read-only directory, I/O errors) drop the entry and are
//! reported once as a warning; the tier never fails a read of the store.
//!
//! The tier's API is synchronous (plain file I/O); callers on an async
//! runtime run it on a blocking thread.

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use bytes::Bytes;

use crate::framework::{BenefitCache, Touch};
use crate::key::SegmentKey;
use crate::policy::Policy;

/// How many processes may each have a slot of one cache directory.
pub const MAX_SLOTS: usize = 16;
/// Entry files start with this (format version in the last digits).
const MAGIC: &[u8; 8] = b"BHSEG001";
/// Fixed part of the header: magic, payload length, checksum, key length,
/// start, len.
const FIXED_HEADER: usize = 8 + 8 + 8 + 4 + 8 + 8;
/// The longest object URL an entry stores.
const MAX_KEY: usize = 4096;

/// Why the tier could not be opened (the engine then runs without it).
#[derive(Debug, thiserror::Error)]
pub enum SsdError {
    #[error("cache directory {dir}: {source} (check that it exists or can be created, and is writable; or turn the SSD cache off)")]
    Directory { dir: String, source: std::io::Error },
    #[error("cache directory {dir}: all {MAX_SLOTS} slots are in use by other processes")]
    NoFreeSlot { dir: String },
}

/// Counters of the tier since it was opened.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SsdStats {
    pub hits: u64,
    pub misses: u64,
    pub hit_bytes: u64,
    pub written: u64,
    pub written_bytes: u64,
    pub evicted: u64,
    /// Entries found damaged (checksum, header, length) and deleted.
    pub corrupt: u64,
    /// Writes that failed (full disk, read-only, I/O error).
    pub write_errors: u64,
    /// Entries found at opening (kept from an earlier process).
    pub recovered: u64,
    pub used: u64,
    pub capacity: u64,
}

struct Inner {
    framework: BenefitCache,
    /// Entries written (or recovered), as opposed to admitted and pending.
    written: std::collections::HashSet<SegmentKey>,
    stats: SsdStats,
    /// Warnings not yet taken by the caller, one per kind.
    warnings: Vec<String>,
    warned: std::collections::HashSet<&'static str>,
}

/// The SSD tier. Shared by every scan of an engine.
pub struct SsdTier {
    slot: PathBuf,
    /// Holds the slot's `flock` for the life of the tier.
    _lock: File,
    inner: Mutex<Inner>,
}

impl SsdTier {
    /// Opens a slot of `dir` (created if needed) holding at most
    /// `capacity` bytes, valuing entries by `policy`, and takes over what
    /// an earlier process left in it.
    pub fn open(dir: &Path, capacity: u64, policy: Box<dyn Policy>) -> Result<SsdTier, SsdError> {
        let err = |source| SsdError::Directory { dir: dir.display().to_string(), source };
        fs::create_dir_all(dir).map_err(err)?;
        for n in 0..MAX_SLOTS {
            let slot = dir.join(format!("slot-{n}"));
            fs::create_dir_all(&slot).map_err(err)?;
            let lock = OpenOptions::new().create(true).truncate(false).write(true).open(slot.join("lock")).map_err(err)?;
            // SAFETY: flock on a descriptor this function owns.
            if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
                continue;
            }
            let mut framework = BenefitCache::new(capacity, policy);
            let written: std::collections::HashSet<SegmentKey> = recover(&slot, &mut framework).into_iter().collect();
            let stats = SsdStats { recovered: written.len() as u64, used: framework.used(), capacity, ..Default::default() };
            let inner = Inner { framework, written, stats, warnings: Vec::new(), warned: Default::default() };
            return Ok(SsdTier { slot, _lock: lock, inner: Mutex::new(inner) });
        }
        Err(SsdError::NoFreeSlot { dir: dir.display().to_string() })
    }

    /// The slot directory this process owns.
    pub fn slot(&self) -> &Path {
        &self.slot
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn path_of(&self, key: &SegmentKey) -> PathBuf {
        entry_path(&self.slot, key)
    }

    /// One query's access (Algorithm 1): returns the keys of `touched`
    /// the tier admitted (to be written with [`SsdTier::write`]); evicted
    /// entries' files are deleted.
    pub fn plan(&self, touched: &[Touch]) -> Vec<SegmentKey> {
        let mut inner = self.lock();
        let decision = inner.framework.on_query(touched);
        inner.stats.evicted += decision.evicted.len() as u64;
        inner.stats.used = inner.framework.used();
        for key in &decision.evicted {
            inner.written.remove(key);
        }
        drop(inner);
        for key in &decision.evicted {
            let _ = fs::remove_file(self.path_of(key));
        }
        decision.admitted
    }

    /// The bytes of `key` if the tier has them, checked; a damaged entry is
    /// deleted and reported as a miss.
    pub fn read(&self, key: &SegmentKey) -> Option<Bytes> {
        {
            let mut inner = self.lock();
            if !inner.framework.contains(key) {
                inner.stats.misses += 1;
                return None;
            }
        }
        let path = self.path_of(key);
        match read_entry(&path, key) {
            Ok(bytes) => {
                let mut inner = self.lock();
                inner.stats.hits += 1;
                inner.stats.hit_bytes += bytes.len() as u64;
                Some(bytes)
            }
            // Admitted but not written yet (or deleted behind our back): a
            // miss; the caller's fetch writes it.
            Err(EntryProblem::Gone) => {
                self.lock().stats.misses += 1;
                None
            }
            Err(EntryProblem::Damaged(why)) => {
                let _ = fs::remove_file(&path);
                let mut inner = self.lock();
                inner.framework.remove(key);
                inner.written.remove(key);
                inner.stats.used = inner.framework.used();
                inner.stats.misses += 1;
                inner.stats.corrupt += 1;
                let text = format!("SSD cache entry {} for {key} was damaged ({why}); deleted, read from the store instead", path.display());
                warn(&mut inner, "corrupt", text);
                None
            }
        }
    }

    /// Stores an admitted segment's bytes (read-through fill, or a newly
    /// written object). A failure drops the entry and warns once.
    pub fn write(&self, key: &SegmentKey, bytes: &[u8]) {
        if bytes.len() as u64 != key.len || !self.lock().framework.contains(key) {
            return;
        }
        let path = self.path_of(key);
        match write_entry(&self.slot, &path, key, bytes) {
            Ok(()) => {
                let mut inner = self.lock();
                inner.written.insert(key.clone());
                inner.stats.written += 1;
                inner.stats.written_bytes += bytes.len() as u64;
            }
            Err(e) => {
                let mut inner = self.lock();
                inner.framework.remove(key);
                inner.written.remove(key);
                inner.stats.used = inner.framework.used();
                inner.stats.write_errors += 1;
                let kind = if e.raw_os_error() == Some(libc::ENOSPC) { "full" } else { "write" };
                let text = format!("SSD cache {}: cannot write entries ({e}); reading from the store instead", self.slot.display());
                warn(&mut inner, kind, text);
            }
        }
    }

    /// Write-through of a newly written object's segments: they count as
    /// one access (a load leaves its data hot, SAP IQ §4), and what the
    /// policy admits is written at once. Runs on the caller's thread.
    pub fn write_through(&self, segments: &[(SegmentKey, Bytes)]) {
        let touched: Vec<Touch> = segments.iter().map(|(k, _)| Touch::of(k.clone())).collect();
        let admitted: std::collections::HashSet<SegmentKey> = self.plan(&touched).into_iter().collect();
        for (key, bytes) in segments.iter().filter(|(k, _)| admitted.contains(k)) {
            self.write(key, bytes);
        }
    }

    /// An admitted segment that will not be written: its space is given back.
    pub fn abandon(&self, key: &SegmentKey) {
        let mut inner = self.lock();
        inner.framework.remove(key);
        inner.written.remove(key);
        inner.stats.used = inner.framework.used();
    }

    /// Gives back the space of `key` if it was admitted but not written
    /// (a hybrid scan pushed its row group down, so its bytes will not
    /// come); a written entry stays.
    pub fn abandon_unwritten(&self, key: &SegmentKey) {
        let mut inner = self.lock();
        if !inner.written.contains(key) && inner.framework.remove(key) {
            inner.stats.used = inner.framework.used();
        }
    }

    /// A new capacity; the least valuable entries go until the rest fit.
    pub fn set_capacity(&self, capacity: u64) {
        let mut inner = self.lock();
        let evicted = inner.framework.set_capacity(capacity);
        inner.stats.evicted += evicted.len() as u64;
        inner.stats.used = inner.framework.used();
        inner.stats.capacity = capacity;
        for key in &evicted {
            inner.written.remove(key);
        }
        drop(inner);
        for key in &evicted {
            let _ = fs::remove_file(self.path_of(key));
        }
    }

    /// Whether it holds `key`, written (not just admitted).
    pub fn holds(&self, key: &SegmentKey) -> bool {
        self.lock().written.contains(key)
    }

    /// How many entries it holds (or has admitted and is writing).
    pub fn segments(&self) -> usize {
        self.lock().framework.entries().len()
    }

    /// The counters.
    pub fn stats(&self) -> SsdStats {
        self.lock().stats
    }

    /// Warnings since the last call (at most one per kind for the life of
    /// the tier: a full disk is said once, not per segment).
    pub fn take_warnings(&self) -> Vec<String> {
        std::mem::take(&mut self.lock().warnings)
    }
}

fn warn(inner: &mut Inner, kind: &'static str, text: String) {
    if inner.warned.insert(kind) {
        inner.warnings.push(text);
    }
}

/// Where `key`'s entry lives in `slot`.
fn entry_path(slot: &Path, key: &SegmentKey) -> PathBuf {
    let name = format!("{:032x}", twox_hash::XxHash3_128::oneshot(&encode_key(key)));
    slot.join(&name[..2]).join(format!("{name}.seg"))
}

fn encode_key(key: &SegmentKey) -> Vec<u8> {
    let mut v = Vec::with_capacity(key.object.len() + 16);
    v.extend_from_slice(key.object.as_bytes());
    v.extend_from_slice(&key.start.to_le_bytes());
    v.extend_from_slice(&key.len.to_le_bytes());
    v
}

fn header(key: &SegmentKey, payload: &[u8]) -> Vec<u8> {
    let mut h = Vec::with_capacity(FIXED_HEADER + key.object.len());
    h.extend_from_slice(MAGIC);
    h.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    h.extend_from_slice(&twox_hash::XxHash3_64::oneshot(payload).to_le_bytes());
    h.extend_from_slice(&(key.object.len() as u32).to_le_bytes());
    h.extend_from_slice(&key.start.to_le_bytes());
    h.extend_from_slice(&key.len.to_le_bytes());
    h.extend_from_slice(key.object.as_bytes());
    h
}

fn write_entry(slot: &Path, path: &Path, key: &SegmentKey, payload: &[u8]) -> std::io::Result<()> {
    if key.object.len() > MAX_KEY {
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidInput, "object URL too long for an entry"));
    }
    fs::create_dir_all(path.parent().expect("entries live in a subdirectory"))?;
    let tmp = slot.join(format!("tmp-{:016x}", rand::random::<u64>()));
    let result = (|| {
        let mut f = File::create(&tmp)?;
        f.write_all(&header(key, payload))?;
        f.write_all(payload)?;
        fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

/// Why an entry could not be served.
enum EntryProblem {
    /// No file (evicted by a concurrent call, or deleted by someone).
    Gone,
    /// The file is there but wrong.
    Damaged(String),
}

/// Reads and checks the entry at `path`; `expected`: the key it must hold
/// (`None`: whatever its header says, at recovery).
fn read_entry(path: &Path, expected: &SegmentKey) -> Result<Bytes, EntryProblem> {
    let mut file = File::open(path).map_err(|_| EntryProblem::Gone)?;
    let mut all = Vec::new();
    file.read_to_end(&mut all).map_err(|e| EntryProblem::Damaged(e.to_string()))?;
    let (key, payload_at) = parse_header(&all, all.len()).map_err(EntryProblem::Damaged)?;
    if key != *expected {
        return Err(EntryProblem::Damaged(format!("holds {key}")));
    }
    let payload = &all[payload_at..];
    let checksum = u64::from_le_bytes(all[16..24].try_into().expect("8 bytes"));
    if twox_hash::XxHash3_64::oneshot(payload) != checksum {
        return Err(EntryProblem::Damaged("checksum mismatch".into()));
    }
    let all = Bytes::from(all);
    Ok(all.slice(payload_at..))
}

/// The key in an entry's header and where its payload starts, from the
/// first bytes of the file (`head`, the whole file or at least its header)
/// and the file's length, which must be exactly what the header says.
fn parse_header(head: &[u8], file_len: usize) -> Result<(SegmentKey, usize), String> {
    if head.len() < FIXED_HEADER || &head[..8] != MAGIC {
        return Err("not an entry (header)".into());
    }
    let u64_at = |i: usize| u64::from_le_bytes(head[i..i + 8].try_into().expect("8 bytes"));
    let (payload_len, start, len) = (u64_at(8), u64_at(28), u64_at(36));
    let key_len = u32::from_le_bytes(head[24..28].try_into().expect("4 bytes")) as usize;
    if key_len > MAX_KEY || head.len() < FIXED_HEADER + key_len {
        return Err("truncated header".into());
    }
    let object = std::str::from_utf8(&head[FIXED_HEADER..FIXED_HEADER + key_len]).map_err(|_| "key is not UTF-8".to_string())?;
    let payload_at = FIXED_HEADER + key_len;
    if file_len as u64 != payload_at as u64 + payload_len || payload_len != len {
        return Err(format!("{} payload bytes, {payload_len} expected", file_len.saturating_sub(payload_at)));
    }
    Ok((SegmentKey::new(object, start, len), payload_at))
}

/// Takes over a slot's entries (oldest first, so the newest are the most
/// recent for the policy) and removes temporary files; returns the entries
/// kept. Entries beyond the capacity, or whose header is
/// unreadable, are deleted; checksums are checked when an entry is read.
fn recover(slot: &Path, framework: &mut BenefitCache) -> Vec<SegmentKey> {
    let mut found: Vec<(std::time::SystemTime, PathBuf, SegmentKey)> = Vec::new();
    let Ok(dirs) = fs::read_dir(slot) else { return Vec::new() };
    for dir in dirs.flatten() {
        let path = dir.path();
        let name = dir.file_name().to_string_lossy().to_string();
        if name.starts_with("tmp-") {
            let _ = fs::remove_file(&path);
            continue;
        }
        if !path.is_dir() {
            continue;
        }
        let Ok(entries) = fs::read_dir(&path) else { continue };
        for entry in entries.flatten() {
            let p = entry.path();
            let mut head = vec![0u8; FIXED_HEADER + MAX_KEY];
            // Only the header is read here; checksums are checked on reads.
            let parsed = File::open(&p).ok().and_then(|mut f| {
                let n = read_up_to(&mut f, &mut head).ok()?;
                let (key, _) = parse_header(&head[..n], f.metadata().ok()?.len() as usize).ok()?;
                Some((entry.metadata().ok()?.modified().ok()?, key))
            });
            match parsed {
                // Only an entry at its key's name can ever be read.
                Some((mtime, key)) if entry_path(slot, &key) == p => found.push((mtime, p, key)),
                Some(_) => {
                    let _ = fs::remove_file(&p);
                }
                None => {
                    let _ = fs::remove_file(&p);
                }
            }
        }
    }
    found.sort_by_key(|f| f.0);
    // Newest first decides what fits; then they are inserted oldest first.
    let mut kept = Vec::new();
    let mut room = framework.capacity();
    for (_, path, key) in found.into_iter().rev() {
        if key.len <= room {
            room -= key.len;
            kept.push(key);
        } else {
            let _ = fs::remove_file(path);
        }
    }
    kept.reverse();
    for key in &kept {
        framework.insert(key.clone(), key.len);
    }
    kept
}

fn read_up_to(f: &mut File, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match f.read(&mut buf[n..])? {
            0 => break,
            k => n += k,
        }
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::Lru;

    fn key(i: u64) -> SegmentKey {
        SegmentKey::new("s3://bucket/db/objects/00/0000000000000001.parquet", i * 100, 100)
    }

    fn payload(i: u64) -> Vec<u8> {
        (0..100u64).map(|b| (b * 7 + i) as u8).collect()
    }

    fn put(tier: &SsdTier, i: u64) {
        let admitted = tier.plan(&[Touch::of(key(i))]);
        assert_eq!(admitted, vec![key(i)]);
        tier.write(&key(i), &payload(i));
    }

    #[test]
    fn entries_round_trip_and_survive_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let tier = SsdTier::open(dir.path(), 1000, Box::new(Lru::default())).unwrap();
        for i in 0..3 {
            put(&tier, i);
        }
        assert_eq!(tier.read(&key(1)).as_deref(), Some(&payload(1)[..]));
        assert_eq!(tier.stats().written, 3);
        let slot = tier.slot().to_path_buf();
        drop(tier);
        // A later process takes over the slot and its entries.
        let again = SsdTier::open(dir.path(), 1000, Box::new(Lru::default())).unwrap();
        assert_eq!(again.slot(), slot);
        assert_eq!(again.stats().recovered, 3);
        for i in 0..3 {
            assert_eq!(again.read(&key(i)).as_deref(), Some(&payload(i)[..]));
        }
        assert_eq!(again.stats().hits, 3);
    }

    /// A pushed-down row group's admitted entries give their space back;
    /// written ones stay.
    #[test]
    fn unwritten_admissions_can_be_given_back() {
        let dir = tempfile::tempdir().unwrap();
        let tier = SsdTier::open(dir.path(), 1000, Box::new(Lru::default())).unwrap();
        put(&tier, 0);
        assert_eq!(tier.plan(&[Touch::of(key(1))]), vec![key(1)]);
        assert_eq!(tier.stats().used, 200);
        tier.abandon_unwritten(&key(0));
        tier.abandon_unwritten(&key(1));
        assert_eq!(tier.stats().used, 100);
        assert!(tier.holds(&key(0)) && tier.read(&key(0)).is_some());
        // The bytes of an abandoned admission are no longer taken.
        tier.write(&key(1), &payload(1));
        assert!(!tier.holds(&key(1)));
    }

    #[test]
    fn processes_at_once_get_their_own_slots() {
        let dir = tempfile::tempdir().unwrap();
        let a = SsdTier::open(dir.path(), 1000, Box::new(Lru::default())).unwrap();
        let b = SsdTier::open(dir.path(), 1000, Box::new(Lru::default())).unwrap();
        assert_ne!(a.slot(), b.slot());
        put(&a, 0);
        assert_eq!(b.read(&key(0)), None, "slots do not share entries");
    }

    #[test]
    fn corrupted_and_truncated_entries_are_deleted_and_missed() {
        let dir = tempfile::tempdir().unwrap();
        let tier = SsdTier::open(dir.path(), 1000, Box::new(Lru::default())).unwrap();
        put(&tier, 0);
        put(&tier, 1);
        // Flip one payload byte of entry 0, cut entry 1 short.
        let p0 = tier.path_of(&key(0));
        let mut bytes = fs::read(&p0).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 0xff;
        fs::write(&p0, bytes).unwrap();
        let p1 = tier.path_of(&key(1));
        let bytes = fs::read(&p1).unwrap();
        fs::write(&p1, &bytes[..bytes.len() - 10]).unwrap();
        assert_eq!(tier.read(&key(0)), None);
        assert_eq!(tier.read(&key(1)), None);
        assert!(!p0.exists() && !p1.exists(), "damaged entries are deleted");
        let s = tier.stats();
        assert_eq!((s.corrupt, s.used), (2, 0));
        let warnings = tier.take_warnings();
        assert_eq!(warnings.len(), 1, "one warning per kind: {warnings:?}");
        assert!(warnings[0].contains("damaged"), "{warnings:?}");
        // Written again, served again.
        put(&tier, 0);
        assert_eq!(tier.read(&key(0)).as_deref(), Some(&payload(0)[..]));
    }

    #[test]
    fn a_killed_writer_leaves_nothing_served_wrong() {
        let dir = tempfile::tempdir().unwrap();
        let tier = SsdTier::open(dir.path(), 1000, Box::new(Lru::default())).unwrap();
        put(&tier, 0);
        let slot = tier.slot().to_path_buf();
        let p0 = tier.path_of(&key(0));
        drop(tier);
        // What a kill leaves: a temporary file; and, say, an entry cut
        // short by a crashed disk.
        fs::write(slot.join("tmp-00000000deadbeef"), b"half an entry").unwrap();
        let bytes = fs::read(&p0).unwrap();
        fs::write(&p0, &bytes[..bytes.len() / 2]).unwrap();
        let again = SsdTier::open(dir.path(), 1000, Box::new(Lru::default())).unwrap();
        assert_eq!(again.stats().recovered, 0);
        assert!(!slot.join("tmp-00000000deadbeef").exists());
        assert_eq!(again.read(&key(0)), None);
    }

    #[test]
    fn the_size_bound_evicts_files() {
        let dir = tempfile::tempdir().unwrap();
        let tier = SsdTier::open(dir.path(), 250, Box::new(Lru::default())).unwrap();
        put(&tier, 0);
        put(&tier, 1);
        put(&tier, 2);
        assert!(!tier.path_of(&key(0)).exists(), "the least recently used entry's file is gone");
        assert!(tier.path_of(&key(2)).exists());
        assert!(tier.stats().used <= 250);
        tier.set_capacity(0);
        assert!(!tier.path_of(&key(2)).exists());
        // Restart with a smaller bound keeps only what fits, newest first.
        let tier = SsdTier::open(dir.path(), 1000, Box::new(Lru::default())).unwrap();
        put(&tier, 3);
        put(&tier, 4);
        drop(tier);
        let small = SsdTier::open(dir.path(), 100, Box::new(Lru::default())).unwrap();
        assert_eq!(small.stats().recovered, 1);
    }

    #[test]
    fn an_unwritable_directory_is_an_error_at_open_and_failed_writes_warn_once() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("not-a-dir");
        fs::write(&file, b"x").unwrap();
        let err = SsdTier::open(&file, 1000, Box::new(Lru::default())).err().expect("a file is no directory");
        assert!(err.to_string().contains("not-a-dir"), "{err}");
        // Writes into a slot whose directory became a file (as good as a
        // read-only or failing disk, and testable as root) fail, drop the
        // entry and warn once.
        let tier = SsdTier::open(&dir.path().join("cache"), 1000, Box::new(Lru::default())).unwrap();
        fs::remove_dir_all(tier.slot()).unwrap();
        fs::write(tier.slot(), b"in the way").unwrap();
        put(&tier, 0);
        put(&tier, 1);
        let s = tier.stats();
        assert_eq!((s.write_errors, s.used, s.written), (2, 0, 0));
        assert_eq!(tier.take_warnings().len(), 1);
        assert_eq!(tier.read(&key(0)), None);
    }
}
