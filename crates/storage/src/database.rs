//! A database on the store: opening, the catalog's version history, and
//! commits.
//!
//! The catalog is a log of immutable versions (format 2:
//! `log/<bucket>/<n:020>.json`, checkpoints and cumulative deltas, see
//! `crate::versions`; format 1: `catalog/<n:020>.json`, read and upgraded
//! on the next commit). The newest is the current state (tables → schema +
//! manifest files). A commit reads the newest version `n`, writes the
//! manifest file of the objects it adds under a fresh key, and creates
//! version `n+1` with put-if-absent. Exactly one of several concurrent
//! committers wins version `n+1`; the others re-read and re-apply their
//! change on top of it (appends commute), or fail with a clear conflict
//! when the change no longer makes sense (e.g. the table was dropped).
//! Readers never see a half-written version because a version exists only
//! once its single PUT has completed. Old versions stay, which is what
//! snapshots and point-in-time restore will build on.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use bytes::Bytes;
use datafusion::execution::memory_pool::{MemoryConsumer, MemoryPool, MemoryReservation};
use futures::{StreamExt, TryStreamExt};
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload};
use rand::Rng;
use serde::Serialize;
use serde::de::DeserializeOwned;

use roaring::RoaringBitmap;

use crate::changes::{self, Change};
use crate::error::{Result, StorageError};
use crate::format::*;
use crate::keys::{KeyGenerator, object_name};
use crate::versions::{self, catalog_path, log_path, manifest_path};
use crate::location::Location;
use crate::seal::Sealer;

/// How many times a commit re-applies its change after losing the race.
pub const MAX_COMMIT_ATTEMPTS: u32 = 100;

/// A commit builds on the handle's newest version without listing the log
/// again when the handle saw that version to be the newest less than this
/// long ago (typically the refresh that began the statement). A base that
/// turned stale costs one refused put-if-absent, then a refresh.
///
/// Why this is safe: version `n+1` can be missing while newer versions
/// exist only after VACUUM expired it, and VACUUM deletes the object of
/// version `v` only once `v+1` was committed more than its GRACE period
/// ago (`crate::gc`). Version `n+2` was committed after the observation
/// that `n` was the newest, so that hole cannot appear while this base is
/// fresh plus the longest a put may be in flight (object_store's retry
/// timeout plus one request timeout, under a minute) — far less than any
/// sensible GRACE.
pub const FRESH_BASE: Duration = Duration::from_secs(1);

/// What a commit did.
#[derive(Debug, Clone)]
pub enum CommitOutcome {
    /// A new database version was committed.
    Committed(Arc<CatalogVersion>),
    /// Nothing to do (IF [NOT] EXISTS matched).
    NoOp,
}

/// An open database. Cheap to share (`Arc`); safe to use from many tasks.
#[derive(Debug)]
pub struct Database {
    loc: Location,
    keys: KeyGenerator,
    current: RwLock<Arc<CatalogVersion>>,
    /// The newest version the handle has seen to be the newest on the
    /// store, and when (a lower bound: when the request that showed it was
    /// sent). See [`FRESH_BASE`].
    observed: Mutex<(u64, Instant)>,
    /// Format the database was created with (its marker): a version-1
    /// database keeps its versions in `catalog/` until a commit upgrades it.
    created_format: u32,
    /// Seals and checks the metadata objects (seeded by the marker).
    sealer: Sealer,
    /// The keys of an encrypted database (`crate::encryption`): metadata
    /// objects are encrypted with them and data objects carry data keys
    /// wrapped by them. `None` for a plaintext database.
    keyring: Option<Arc<crate::encryption::Keyring>>,
    /// Whether versions go to `log/` (format 2) or, until the upgrade
    /// commit, to `catalog/`.
    upgraded: std::sync::atomic::AtomicBool,
    /// The newest checkpoint read, which deltas are read against.
    checkpoint: Mutex<Option<Arc<Checkpoint>>>,
    manifests: Mutex<HashMap<String, Arc<Manifest>>>,
    /// Deletion vectors read or written, by key (small: bytes per deleted row).
    vectors: Mutex<HashMap<u64, Arc<RoaringBitmap>>>,
    /// The manifest cache's bytes in the engine's memory budget, once the
    /// engine has given one ([`Database::account_caches_in`]).
    manifest_bytes: std::sync::OnceLock<MemoryReservation>,
    /// Told of every data object a writer of this handle uploads (the
    /// engine's caches: write-through), once set.
    upload_observer: std::sync::OnceLock<Arc<dyn UploadObserver>>,
    /// Writes the Iceberg metadata of what commits change
    /// (`crate::iceberg`), and remembers the last it wrote per table.
    pub(crate) iceberg: crate::iceberg::Publisher,
}

/// Hears of each data object once it is on the store, with its bytes: the
/// extension point for a cache above the storage layer to keep what a load
/// wrote (write-through) without the storage layer knowing of caches.
/// Called on the uploading task; must not block for long.
pub trait UploadObserver: Send + Sync + std::fmt::Debug {
    /// `object` (its path relative to the database, its chunk ranges) was
    /// uploaded with exactly `bytes`.
    fn uploaded(&self, object: &crate::format::DataObject, bytes: &Bytes);
}

impl Database {
    /// Opens the database at `loc`, creating it when `create` is set and the
    /// location holds nothing yet.
    pub async fn open(loc: Location, create: bool) -> Result<Arc<Database>> {
        Database::open_with(loc, create, crate::keys::DEFAULT_BLOCK_TTL).await
    }

    /// [`Database::open`], with writers using each declared key block for
    /// at most `block_ttl` (crash recovery waits that long before a dead
    /// writer's uploads can be collected; tests shorten it).
    pub async fn open_with(loc: Location, create: bool, block_ttl: Duration) -> Result<Arc<Database>> {
        let marker_path = loc.child(MARKER);
        let keys_error = |reason: String| StorageError::Keys { location: loc.url.clone(), reason };
        let provider = match &loc.encryption {
            Some(spec) => Some(spec.provider().map_err(|e| keys_error(e.to_string()))?),
            None => None,
        };
        let (created_format, sealer, keyring, iceberg_default) = match loc.store.get(&marker_path).await {
            Ok(r) => {
                let bytes = r.bytes().await.map_err(|e| StorageError::store("GET", loc.display(&marker_path), e))?;
                let marker: DatabaseMarker = parse_json(&loc, &marker_path, &bytes)?;
                if marker.format != "blobhouse" {
                    return Err(StorageError::NotADatabase {
                        location: loc.url.clone(),
                        reason: format!("{MARKER} says format '{}'", marker.format),
                    });
                }
                let newest = if marker.encryption.is_some() { ENCRYPTED_FORMAT_VERSION } else { FORMAT_VERSION };
                if marker.format_version > newest {
                    return Err(StorageError::UnsupportedFormat { location: loc.url.clone(), found: marker.format_version, supported: newest });
                }
                let keyring = match (&marker.encryption, &provider) {
                    (None, None) => None,
                    (Some(_), Some(provider)) => Some(Arc::new(crate::encryption::Keyring::open(&loc, &marker, provider.as_ref()).await?)),
                    (Some(scheme), None) => {
                        let needs = match crate::encryption::Keyring::newest(&loc, &marker).await {
                            Ok(Some(k)) => format!(" (its master key is {})", k.master_key),
                            _ => String::new(),
                        };
                        return Err(keys_error(format!(
                            "it is encrypted ({scheme}){needs} and no key was given: pass --encryption-key-file FILE, --encryption-key-env VAR or --kms-key-id KEY"
                        )));
                    }
                    (None, Some(_)) => {
                        return Err(keys_error("it is not encrypted, and an encryption key was given: a database is encrypted when it is created; copy its tables into a new, encrypted database to encrypt them".into()));
                    }
                };
                (marker.format_version, Sealer::new(marker.created_at_ms, marker.id), keyring, marker.iceberg.unwrap_or(false))
            }
            Err(object_store::Error::NotFound { .. }) => {
                if !create {
                    return Err(StorageError::NotADatabase {
                        location: loc.url.clone(),
                        reason: format!("no {MARKER} found"),
                    });
                }
                let marker = DatabaseMarker {
                    format: "blobhouse".into(),
                    format_version: if provider.is_some() { ENCRYPTED_FORMAT_VERSION } else { FORMAT_VERSION },
                    created_at_ms: now_ms(),
                    id: Some(rand::rng().random()),
                    encryption: provider.is_some().then(|| crate::encryption::SCHEME.to_string()),
                    // Other engines can read neither an encrypted database
                    // nor one in this process's memory.
                    iceberg: Some(provider.is_none() && !loc.url.starts_with("memory:")),
                };
                // The keyring before the marker: a marker that says
                // "encrypted" always has its keys beside it.
                let keyring = match &provider {
                    Some(provider) => match crate::encryption::Keyring::create(&loc, &marker, provider.as_ref()).await {
                        Ok(k) => Some(Arc::new(k)),
                        // Another process creating it took that keyring's
                        // number: its marker follows, or the next try takes
                        // the next number.
                        Err(StorageError::Store { source: object_store::Error::AlreadyExists { .. }, .. }) => {
                            tokio::time::sleep(Duration::from_millis(50)).await;
                            return Box::pin(Database::open_with(loc, true, block_ttl)).await;
                        }
                        Err(e) => return Err(e),
                    },
                    None => None,
                };
                match put_new(&loc, &marker_path, to_json(&marker)).await {
                    Ok(()) => (marker.format_version, Sealer::new(marker.created_at_ms, marker.id), keyring, marker.iceberg.unwrap_or(false)),
                    // Created by someone else meanwhile: open it as they made it.
                    Err(StorageError::Store { source: object_store::Error::AlreadyExists { .. }, .. }) => {
                        return Box::pin(Database::open_with(loc, false, block_ttl)).await;
                    }
                    Err(e) => return Err(e),
                }
            }
            Err(e) => return Err(StorageError::store("GET", loc.display(&marker_path), e)),
        };
        let db = Arc::new(Database {
            keys: KeyGenerator::new(loc.clone(), block_ttl, keyring.clone()),
            loc,
            current: RwLock::new(Arc::new(CatalogVersion { format_version: FORMAT_VERSION, ..Default::default() })),
            observed: Mutex::new((0, Instant::now())),
            created_format,
            sealer,
            keyring,
            upgraded: std::sync::atomic::AtomicBool::new(created_format >= 2),
            checkpoint: Mutex::new(None),
            manifests: Mutex::new(HashMap::new()),
            vectors: Mutex::new(HashMap::new()),
            manifest_bytes: std::sync::OnceLock::new(),
            upload_observer: std::sync::OnceLock::new(),
            iceberg: crate::iceberg::Publisher::new(iceberg_default),
        });
        db.refresh().await?;
        Ok(db)
    }

    /// Holds the manifest cache in `pool` (as `ManifestCache`, by the
    /// manifests' JSON size). When the pool refuses a manifest, the cache is
    /// emptied and tried once more; a manifest that still does not fit is
    /// used without being kept. Every table version's manifest would
    /// otherwise stay in memory for the life of the handle. Only the first
    /// pool given counts.
    pub fn account_caches_in(&self, pool: &Arc<dyn MemoryPool>) {
        let reservation = MemoryConsumer::new("ManifestCache").register(pool);
        if self.manifest_bytes.set(reservation).is_ok() {
            // What was cached before accounting started is not counted: drop it.
            self.manifests.lock().expect("manifest cache").clear();
        }
    }

    /// Tells `observer` of every data object uploaded through this handle
    /// from now on. Only the first observer given counts.
    pub fn observe_uploads(&self, observer: Arc<dyn UploadObserver>) {
        let _ = self.upload_observer.set(observer);
    }

    /// The observer of uploads, if one was given.
    pub fn upload_observer(&self) -> Option<&Arc<dyn UploadObserver>> {
        self.upload_observer.get()
    }

    /// Keeps `manifest` (of `size` JSON bytes) in the cache if the budget
    /// allows.
    fn cache_manifest(&self, key: &str, manifest: &Arc<Manifest>, size: usize) {
        let mut cache = self.manifests.lock().expect("manifest cache");
        if let Some(r) = self.manifest_bytes.get() {
            if r.try_grow(size).is_err() {
                cache.clear();
                r.free();
                if r.try_grow(size).is_err() {
                    return;
                }
            }
            if cache.contains_key(key) {
                // Two readers parsed the same manifest at once: one copy is kept.
                r.shrink(size);
                return;
            }
        }
        cache.insert(key.to_string(), manifest.clone());
    }

    /// The names version `v`'s object may have: `log/` only in a database
    /// created in format 2; `catalog/` too in an upgraded one.
    pub fn version_paths(&self, v: u64) -> Vec<String> {
        match self.created_format >= 2 {
            true => vec![log_path(v)],
            false => vec![log_path(v), catalog_path(v)],
        }
    }

    /// Where the database lives.
    pub fn location(&self) -> &Location {
        &self.loc
    }

    /// The object store holding the database.
    pub fn store(&self) -> &Arc<dyn ObjectStore> {
        &self.loc.store
    }

    /// The newest version this handle has seen (see [`Database::refresh`]).
    pub fn current(&self) -> Arc<CatalogVersion> {
        self.current.read().expect("catalog lock").clone()
    }

    /// Loads the newest committed version from the store: one LIST of
    /// the log after the known version on S3 and GCS (two elsewhere, and
    /// when opening: the log's buckets, then the newest bucket) and, when
    /// it changed, its two objects (the version and its checkpoint).
    pub async fn refresh(&self) -> Result<Arc<CatalogVersion>> {
        let known = self.current();
        let asked = Instant::now();
        match self.newest_version(known.version).await? {
            Some(v) if v > known.version => {
                let version = Arc::new(self.read_version(v).await?);
                self.observe(v, asked);
                let mut cur = self.current.write().expect("catalog lock");
                if cur.version < version.version {
                    *cur = version;
                }
                Ok(cur.clone())
            }
            _ => {
                self.observe(known.version, asked);
                Ok(known)
            }
        }
    }

    /// Records that version `v` was the newest on the store at `at`.
    fn observe(&self, v: u64, at: Instant) {
        let mut seen = self.observed.lock().expect("observation lock");
        if v > seen.0 || (v == seen.0 && at > seen.1) {
            *seen = (v, at);
        }
    }

    /// The handle's newest version, if it was seen to be the newest on the
    /// store less than [`FRESH_BASE`] ago.
    fn fresh(&self) -> Option<Arc<CatalogVersion>> {
        let current = self.current();
        let seen = *self.observed.lock().expect("observation lock");
        (seen.0 == current.version && seen.1.elapsed() < FRESH_BASE).then_some(current)
    }

    /// The newest version's number on the store (`None`: no version yet).
    async fn newest_version(&self, known: u64) -> Result<Option<u64>> {
        let number = |p: &Path| p.filename()?.strip_suffix(".json").unwrap_or(p.filename()?).parse::<u64>().ok();
        let log = self.loc.child(LOG_DIR);
        if known > 0 && self.upgraded.load(std::sync::atomic::Ordering::Relaxed) && self.loc.lists_after_offset() {
            // Version names sort by number, so the store lists exactly the
            // newer ones (whatever VACUUM expired before them).
            let after = self.loc.child(&log_path(known));
            let newer: Vec<_> = self.loc.store.list_with_offset(Some(&log), &after).try_collect().await.map_err(|e| StorageError::store("LIST", self.loc.display(&log), e))?;
            return Ok(newer.iter().filter_map(|m| number(&m.location)).max().or(Some(known)));
        }
        let buckets = self.loc.store.list_with_delimiter(Some(&log)).await.map_err(|e| StorageError::store("LIST", self.loc.display(&log), e))?;
        let newest_bucket = buckets.common_prefixes.iter().filter_map(|p| Some((number(p)?, p))).max_by_key(|(b, _)| *b);
        if let Some((_, bucket)) = newest_bucket {
            let listing = self.loc.store.list_with_delimiter(Some(bucket)).await.map_err(|e| StorageError::store("LIST", self.loc.display(bucket), e))?;
            if let Some(v) = listing.objects.iter().filter_map(|m| number(&m.location)).max() {
                self.upgraded.store(true, std::sync::atomic::Ordering::Relaxed);
                return Ok(Some(v));
            }
        }
        if self.created_format >= 2 {
            return Ok(None);
        }
        // A version-1 database (or one upgraded by its newest version, which
        // is then in catalog/ too).
        let dir = self.loc.child(CATALOG_DIR);
        let listing: Vec<_> = if known == 0 {
            self.loc.store.list(Some(&dir)).try_collect().await
        } else {
            self.loc.store.list_with_offset(Some(&dir), &self.loc.child(&catalog_path(known))).try_collect().await
        }
        .map_err(|e| StorageError::store("LIST", self.loc.display(&dir), e))?;
        Ok(listing.iter().filter_map(|m| number(&m.location)).max())
    }

    /// GETs version `v`'s object from where it may be: `log/`, or
    /// `catalog/` (format 1, and the version that upgraded the database),
    /// and checks its seal.
    pub(crate) async fn version_object(&self, v: u64) -> Result<(Path, Bytes)> {
        self.sealed_version_object(v, None).await.map(|(path, bytes, _)| (path, bytes))
    }

    /// [`Database::version_object`], with the seal a parent recorded
    /// (`expected`), returning the object's seal.
    async fn sealed_version_object(&self, v: u64, expected: Option<u64>) -> Result<(Path, Bytes, Option<u64>)> {
        let mut places = [log_path(v), catalog_path(v)];
        if !self.upgraded.load(std::sync::atomic::Ordering::Relaxed) {
            places.reverse();
        }
        for place in places {
            let path = self.loc.child(&place);
            match self.loc.store.get(&path).await {
                Ok(r) => {
                    let bytes = r.bytes().await.map_err(|e| StorageError::store("GET", self.loc.display(&path), e))?;
                    let bytes = self.decrypt(&place, bytes)?;
                    let seal = self.check_seal(&place, &bytes, expected)?;
                    return Ok((path, bytes, seal));
                }
                Err(object_store::Error::NotFound { .. }) => continue,
                Err(e) => return Err(StorageError::store("GET", self.loc.display(&path), e)),
            }
        }
        Err(StorageError::VersionNotFound { location: self.loc.url.clone(), version: v })
    }

    /// Reads database version `v` (for time travel and for the newest state).
    pub async fn read_version(&self, v: u64) -> Result<CatalogVersion> {
        let (path, bytes, seal) = self.sealed_version_object(v, None).await?;
        let location = self.loc.display(&path);
        let header: FormatHeader = parse_json(&self.loc, &path, &bytes)?;
        check_version(&self.loc, header.format_version)?;
        let claims = |found: u64| {
            if found == v { Ok(()) } else { Err(StorageError::Corrupt { location: location.clone(), reason: format!("it claims to be version {found}") }) }
        };
        if header.format_version < 2 {
            let v1: V1CatalogVersion = parse_json(&self.loc, &path, &bytes)?;
            claims(v1.version)?;
            return versions::from_v1(&location, v1);
        }
        // A format-2 version anywhere means the database is upgraded.
        self.upgraded.store(true, std::sync::atomic::Ordering::Relaxed);
        let file: VersionFile = parse_json(&self.loc, &path, &bytes)?;
        claims(file.version)?;
        let checkpoint = match file.checkpoint {
            Some(c) => Some(self.read_checkpoint(c, file.checkpoint_seal).await?),
            None => None,
        };
        let version = versions::resolve(&location, file, bytes.len(), seal, checkpoint)?;
        if let Some(c) = &version.checkpoint {
            let mut cached = self.checkpoint.lock().expect("checkpoint cache");
            if cached.as_ref().is_none_or(|old| old.version < c.version) {
                *cached = Some(c.clone());
            }
        }
        Ok(version)
    }

    /// Version `v`'s number, time and operation (one GET; for history
    /// listings).
    pub async fn version_summary(&self, v: u64) -> Result<VersionSummary> {
        let (path, bytes) = self.version_object(v).await?;
        let summary: VersionSummary = parse_json(&self.loc, &path, &bytes)?;
        if summary.version != v {
            return Err(StorageError::Corrupt { location: self.loc.display(&path), reason: format!("it claims to be version {}", summary.version) });
        }
        Ok(summary)
    }

    /// The version that was current at `at_ms` (milliseconds since the
    /// epoch): the newest committed at or before it. Binary search over
    /// the dense version numbers, one GET per step.
    pub async fn version_at(&self, at_ms: u64) -> Result<u64> {
        let newest = self.refresh().await?;
        let (mut lo, mut hi) = (newest.gc.horizon.max(1), newest.version);
        if hi == 0 || self.version_summary(lo).await?.committed_at_ms > at_ms {
            return Err(StorageError::NoVersionAt { at_ms, oldest: lo });
        }
        // Invariant: version lo was committed at or before at_ms.
        while lo < hi {
            let mid = lo + (hi - lo).div_ceil(2);
            if self.version_summary(mid).await?.committed_at_ms <= at_ms {
                lo = mid;
            } else {
                hi = mid - 1;
            }
        }
        Ok(lo)
    }

    /// Checkpoint `c`, sealed `expected` when the delta recorded it: from
    /// the cache when it is the newest one read.
    async fn read_checkpoint(&self, c: u64, expected: Option<u64>) -> Result<Arc<Checkpoint>> {
        let cached = self.checkpoint.lock().expect("checkpoint cache").as_ref().filter(|k| k.version == c && (expected.is_none() || k.seal == expected)).cloned();
        if let Some(cached) = cached {
            return Ok(cached);
        }
        let (path, bytes, seal) = self.sealed_version_object(c, expected).await?;
        let file: VersionFile = parse_json(&self.loc, &path, &bytes)?;
        check_version(&self.loc, file.format_version)?;
        let location = self.loc.display(&path);
        if file.version != c || file.checkpoint.is_some() {
            return Err(StorageError::Corrupt { location, reason: format!("a delta names it as its checkpoint, version {c}, but it is not one") });
        }
        let resolved = versions::resolve(&location, file, bytes.len(), seal, None)?;
        Ok(resolved.checkpoint.expect("a checkpoint resolves to itself"))
    }

    /// All data objects of a table version, from its manifest files (fetched
    /// 16 at a time; each file is immutable and cached for the life of the
    /// handle, and so is the combined list of a table version).
    pub async fn manifest(&self, entry: &TableEntry) -> Result<Arc<Manifest>> {
        if let [only] = entry.manifests.as_slice() {
            return self.manifest_file(entry.id, *only).await;
        }
        // Named by the list of files (a transaction's own view of a table
        // may share a table version number with a committed one).
        let combined_key = {
            use std::hash::{Hash, Hasher};
            let mut h = std::collections::hash_map::DefaultHasher::new();
            entry.manifests.hash(&mut h);
            format!("table {} files {} hash {:016x}", entry.id, entry.manifests.len(), h.finish())
        };
        if let Some(m) = self.manifests.lock().expect("manifest cache").get(&combined_key) {
            return Ok(m.clone());
        }
        let fetches: Vec<_> = entry.manifests.iter().map(|m| self.manifest_file(entry.id, *m)).collect();
        let files: Vec<Arc<Manifest>> = futures::stream::iter(fetches).buffered(16).try_collect().await?;
        let combined = Arc::new(Manifest {
            format_version: FORMAT_VERSION,
            table_id: entry.id,
            table_version: entry.table_version,
            objects: files.iter().flat_map(|f| f.objects.iter().cloned()).collect(),
        });
        let size = combined
            .objects
            .iter()
            .map(|o| o.footer.len() + o.page_index.as_ref().map_or(0, |p| p.bytes.len()) + o.path.len() + 64 * o.row_groups.len() * o.row_groups.first().map_or(0, |r| r.columns.len()))
            .sum();
        self.cache_manifest(&combined_key, &combined, size);
        Ok(combined)
    }

    /// Each manifest file of a table version, with its reference.
    pub async fn manifest_files(&self, entry: &TableEntry) -> Result<Vec<(ManifestRef, Arc<Manifest>)>> {
        let fetches: Vec<_> = entry.manifests.iter().map(|m| async move { Ok::<_, StorageError>((*m, self.manifest_file(entry.id, *m).await?)) }).collect();
        futures::stream::iter(fetches).buffered(16).try_collect().await
    }

    /// One manifest file of table `table_id`, its seal and its reference
    /// checked.
    pub async fn manifest_file(&self, table_id: u64, m: ManifestRef) -> Result<Arc<Manifest>> {
        let relative = manifest_path(&m);
        if let Some(cached) = self.manifests.lock().expect("manifest cache").get(&relative) {
            return Ok(cached.clone());
        }
        let path = self.loc.child(&relative);
        let bytes = self.decrypt(&relative, self.get(&path).await?)?;
        self.check_seal(&relative, &bytes, m.checksum)?;
        let manifest: Manifest = parse_json(&self.loc, &path, &bytes)?;
        check_version(&self.loc, manifest.format_version)?;
        if manifest.table_id != table_id || manifest.objects.len() as u64 != m.objects {
            return Err(StorageError::Corrupt {
                location: self.loc.display(&path),
                reason: format!("manifest does not match its reference (table {table_id}, {} objects)", m.objects),
            });
        }
        let manifest = Arc::new(manifest);
        self.cache_manifest(&relative, &manifest, bytes.len());
        Ok(manifest)
    }

    /// The keys of an encrypted database; `None` for a plaintext one.
    pub fn keyring(&self) -> Option<&Arc<crate::encryption::Keyring>> {
        self.keyring.as_ref()
    }

    /// How this database's data objects are decrypted (`None`: plaintext).
    pub fn decryption(&self) -> Option<&Arc<parquet::encryption::decrypt::FileDecryptionProperties>> {
        self.keyring.as_ref().map(|k| k.decryption())
    }

    /// The bytes to store for metadata object `relative`: encrypted in an
    /// encrypted database, as they are otherwise.
    pub fn encrypt(&self, relative: &str, plaintext: Vec<u8>) -> Vec<u8> {
        match &self.keyring {
            Some(k) => k.seal(relative, plaintext),
            None => plaintext,
        }
    }

    /// The plaintext of metadata object `relative` as read from the store:
    /// decrypted and authenticated in an encrypted database (an error
    /// naming the object when that fails), as read otherwise.
    pub fn decrypt(&self, relative: &str, bytes: Bytes) -> Result<Bytes> {
        match &self.keyring {
            Some(k) => k.open_object(relative, &bytes).map(Bytes::from).map_err(|reason| StorageError::Corrupt { location: self.loc.display(&self.loc.child(relative)), reason }),
            None => Ok(bytes),
        }
    }

    /// The database's sealer (`crate::seal`), for tools that check objects.
    pub fn sealer(&self) -> &Sealer {
        &self.sealer
    }

    /// Checks the seal of `bytes`, read from `relative` (see
    /// [`Sealer::check`]): the object's format version is what its JSON
    /// says (unparsable JSON fails later, naming the object).
    pub(crate) fn check_seal(&self, relative: &str, bytes: &[u8], expected: Option<u64>) -> Result<Option<u64>> {
        let format_version = || serde_json::from_slice::<FormatHeader>(bytes).map_or(FORMAT_VERSION, |h| h.format_version);
        self.sealer
            .check(relative, bytes, format_version, expected)
            .map_err(|e| StorageError::Corrupt { location: self.loc.display(&self.loc.child(relative)), reason: e.to_string() })
    }

    /// Writes `value` as a new sealed JSON object at `relative`; returns
    /// the seal for its parent to record.
    pub async fn put_sealed<T: Serialize>(&self, relative: &str, value: &T) -> Result<u64> {
        let (body, seal) = self.sealer.seal(relative, serde_json::to_vec(value).expect("format types always serialise"));
        self.put_new(relative, Bytes::from(self.encrypt(relative, body))).await?;
        Ok(seal)
    }

    /// Reads the sealed JSON object at `relative` (recorded as `expected`
    /// by its parent, if it was).
    pub async fn get_sealed<T: DeserializeOwned>(&self, relative: &str, expected: Option<u64>) -> Result<T> {
        let path = self.loc.child(relative);
        let bytes = self.decrypt(relative, self.get(&path).await?)?;
        self.check_seal(relative, &bytes, expected)?;
        parse_json(&self.loc, &path, &bytes)
    }

    /// A fresh key and the path of a new object with extension `ext`.
    pub async fn new_object(&self, ext: &str) -> Result<(u64, String)> {
        let key = self.keys.next().await?;
        Ok((key, object_name(key, ext)))
    }

    /// Creates an object that must not exist yet (every object blobhouse
    /// writes goes through here: nothing is ever overwritten).
    pub async fn put_new(&self, relative: &str, body: Bytes) -> Result<()> {
        put_new(&self.loc, &self.loc.child(relative), body).await
    }

    /// GETs a whole object.
    pub async fn get(&self, path: &Path) -> Result<Bytes> {
        let r = self.loc.store.get(path).await.map_err(|e| StorageError::store("GET", self.loc.display(path), e))?;
        r.bytes().await.map_err(|e| StorageError::store("GET", self.loc.display(path), e))
    }

    /// Deletes objects that no committed version references (rollback of a
    /// failed write). Best effort: what is left is found by garbage collection.
    pub async fn delete_unreferenced(&self, relative_paths: Vec<String>) {
        for rel in relative_paths {
            let _ = self.loc.store.delete(&self.loc.child(&rel)).await;
        }
    }

    /// Applies `changes`, in order, atomically on top of the newest version:
    /// validates them against it ([`crate::changes::apply`]) and creates the
    /// next version with put-if-absent, re-applying on the newer version when
    /// another writer committed first. Every object the changes name must be
    /// uploaded already; on failure the caller deletes them (see
    /// [`crate::Transaction`]).
    pub async fn commit(&self, changes: &[Change]) -> Result<CommitOutcome> {
        // `listed`: whether `base` was listed for this commit, or is the
        // handle's fresh newest version (see FRESH_BASE).
        let (mut base, mut listed) = match self.fresh() {
            Some(base) => (base, false),
            None => (self.refresh().await?, true),
        };
        for attempt in 0..MAX_COMMIT_ATTEMPTS {
            let changes: Vec<Change> = changes.iter().map(|c| c.on_base(base.version).into_owned()).collect();
            let changes = changes.as_slice();
            let mut next = CatalogVersion {
                format_version: FORMAT_VERSION,
                version: base.version + 1,
                committed_at_ms: now_ms(),
                operation: describe(changes),
                tables: base.tables.clone(),
                external: base.external.clone(),
                snapshots: base.snapshots.clone(),
                restored_from: None,
                gc: base.gc.clone(), restores: base.restores.clone(), retired: Retired::default(), iceberg: base.iceberg, iceberg_format: base.iceberg_format,
                checkpoint: base.checkpoint.clone(),
            };
            let mut changed = false;
            let mut refused = None;
            for change in changes {
                match changes::apply(&mut next, change) {
                    Ok(c) => changed |= c,
                    Err(e) => {
                        refused = Some(e);
                        break;
                    }
                }
            }
            // A refusal or a no-op decided on a version not listed for this
            // commit may be stale (a snapshot dropped a moment ago by
            // another writer): it is decided again on the newest version.
            if !listed && (refused.is_some() || !changed) {
                base = self.refresh().await?;
                listed = true;
                continue;
            }
            if let Some(e) = refused {
                return Err(e);
            }
            if !changed {
                return Ok(CommitOutcome::NoOp);
            }
            next.retired = changes::retired(&base, &next, changes);
            // The first commit on a version-1 database upgrades it: a
            // checkpoint in catalog/, where version-1 readers and writers
            // look (and then refuse to go on), and log/ from then on.
            let upgrade = !self.upgraded.load(std::sync::atomic::Ordering::Relaxed);
            let place = if upgrade { catalog_path(next.version) } else { log_path(next.version) };
            let body = versions::encode(&mut next, upgrade, &|json| self.sealer.seal(&place, json));
            let body = self.encrypt(&place, body);
            let path = self.loc.child(&place);
            crate::failpoint::hit("commit.before")?;
            let body = Bytes::from(body);
            let sent = Instant::now();
            // The fail point after the PUT stands for a response lost on
            // the way back: the version is there, the writer got an error.
            let put = match put_new(&self.loc, &path, body.clone()).await {
                Ok(()) => crate::failpoint::hit("commit.after"),
                Err(e) => Err(e),
            };
            let won = match put {
                Ok(()) => true,
                // Usually another writer's version; but when the client
                // retried our PUT after a server error that came after the
                // store had kept it, the version there is ours — taking it
                // for a lost race would commit the changes twice.
                Err(e @ StorageError::Store { source: object_store::Error::AlreadyExists { .. }, .. }) => {
                    let there = match self.loc.store.get(&path).await {
                        Ok(r) => r.bytes().await.ok(),
                        Err(_) => None,
                    };
                    match there {
                        Some(there) => there == body,
                        None => return Err(StorageError::CommitUnknown { version: next.version, cause: e.to_string() }),
                    }
                }
                // The PUT's outcome is unknown: look at what is there.
                Err(e) => match self.loc.store.get(&path).await {
                    Ok(r) => match r.bytes().await {
                        Ok(there) => there == body,
                        Err(_) => return Err(StorageError::CommitUnknown { version: next.version, cause: e.to_string() }),
                    },
                    // Not there (yet): the PUT may still land, so nothing it
                    // references may be deleted; GC collects it if not.
                    Err(_) => return Err(StorageError::CommitUnknown { version: next.version, cause: e.to_string() }),
                },
            };
            if won {
                self.upgraded.store(true, std::sync::atomic::Ordering::Relaxed);
                // No writer puts n+2 before it has seen n+1.
                self.observe(next.version, sent);
                if let Some(c) = &next.checkpoint {
                    *self.checkpoint.lock().expect("checkpoint cache") = Some(c.clone());
                }
                let next = Arc::new(next);
                {
                    let mut cur = self.current.write().expect("catalog lock");
                    if cur.version < next.version {
                        *cur = next.clone();
                    }
                }
                // A crash here leaves the version without Iceberg metadata;
                // an injected error skips writing it.
                if crate::failpoint::hit("commit.before_iceberg").is_ok() {
                    crate::iceberg::publish_commit(self, &base, &next).await;
                }
                return Ok(CommitOutcome::Committed(next));
            }
            let backoff = Duration::from_millis(rand::rng().random_range(1..=(5 + 5 * attempt.min(20) as u64)));
            tokio::time::sleep(backoff).await;
            base = self.refresh().await?;
            listed = true;
        }
        Err(StorageError::TooManyRetries { attempts: MAX_COMMIT_ATTEMPTS })
    }

    /// A fresh table id (a key: unique for the life of the database).
    pub async fn new_table_id(&self) -> Result<u64> {
        Ok(self.new_object("table").await?.0)
    }

    /// Writes the manifest file of `objects`, added to table `table_id`
    /// (whose version the writer expects to be `table_version`; for
    /// people reading the file).
    pub async fn write_manifest(&self, table_id: u64, table_version: u64, objects: &[DataObject]) -> Result<ManifestRef> {
        let (key, path) = self.new_object(MANIFEST_EXT).await?;
        crate::failpoint::hit("upload.manifest")?;
        let manifest = Manifest { format_version: FORMAT_VERSION, table_id, table_version, objects: objects.to_vec() };
        let seal = self.put_sealed(&path, &manifest).await?;
        Ok(ManifestRef {
            key,
            objects: objects.len() as u64,
            rows: objects.iter().map(|o| o.rows).sum(),
            bytes: objects.iter().map(|o| o.size).sum(),
            checksum: Some(seal),
        })
    }

    /// Writes a deletion vector (see [`DeleteRef`]).
    pub async fn write_deletion_vector(&self, deleted: &RoaringBitmap) -> Result<DeleteRef> {
        let (key, path) = self.new_object(DV_EXT).await?;
        crate::failpoint::hit("upload.vector")?;
        let mut body = Vec::with_capacity(deleted.serialized_size());
        deleted.serialize_into(&mut body).expect("writing to a Vec cannot fail");
        let body = self.encrypt(&path, body);
        let checksum = Some(crate::format::chunk_checksum(&body));
        self.put_new(&path, Bytes::from(body)).await?;
        let vector = DeleteRef { key, rows: deleted.len(), checksum };
        self.vectors.lock().expect("vector cache").insert(key, Arc::new(deleted.clone()));
        Ok(vector)
    }

    /// Deletion vector `d` (cached: vectors are immutable).
    pub async fn deletion_vector(&self, d: DeleteRef) -> Result<Arc<RoaringBitmap>> {
        if let Some(v) = self.vectors.lock().expect("vector cache").get(&d.key) {
            return Ok(v.clone());
        }
        let path = self.loc.child(&object_name(d.key, DV_EXT));
        let corrupt = |reason: String| StorageError::Corrupt { location: self.loc.display(&path), reason };
        let matches = |bytes: &Bytes| d.checksum.is_none_or(|sum| crate::format::chunk_checksum(bytes) == sum);
        let mut bytes = self.get(&path).await?;
        if !matches(&bytes) {
            // Once more, in case the transfer damaged it.
            bytes = self.get(&path).await?;
            if !matches(&bytes) {
                return Err(corrupt(format!(
                    "its {} bytes do not match the checksum written with them (read twice): the deletion vector is damaged, and reading through it would return deleted rows",
                    bytes.len()
                )));
            }
        }
        let bytes = self.decrypt(&object_name(d.key, DV_EXT), bytes)?;
        let bitmap = RoaringBitmap::deserialize_from(&bytes[..]).map_err(|e| corrupt(format!("not a Roaring bitmap ({e})")))?;
        if bitmap.len() != d.rows {
            return Err(corrupt(format!("it deletes {} rows, the table version says {}", bitmap.len(), d.rows)));
        }
        let bitmap = Arc::new(bitmap);
        self.vectors.lock().expect("vector cache").insert(d.key, bitmap.clone());
        Ok(bitmap)
    }

    /// A table version's live data: its data objects (less those rewritten
    /// away) with their deletion vectors.
    pub async fn table_data(&self, entry: &TableEntry) -> Result<TableData> {
        let manifest = self.manifest(entry).await?;
        let removed: std::collections::HashSet<u64> = entry.removed.iter().copied().collect();
        let fetches: Vec<_> = entry.deletes.iter().map(|(object, d)| async move { Ok::<_, StorageError>((*object, *d, self.deletion_vector(*d).await?)) }).collect();
        let vectors: Vec<(u64, DeleteRef, Arc<RoaringBitmap>)> = futures::stream::iter(fetches).buffer_unordered(16).try_collect().await?;
        let mut deletes: HashMap<u64, (DeleteRef, Arc<RoaringBitmap>)> = vectors.into_iter().map(|(o, d, b)| (o, (d, b))).collect();
        let mut objects = Vec::with_capacity(manifest.objects.len());
        // The combined list is the files' lists one after the other.
        let listed_by = entry.manifests.iter().flat_map(|m| std::iter::repeat_n(m.key, m.objects as usize));
        for ((ordinal, o), manifest_key) in manifest.objects.iter().enumerate().zip(listed_by) {
            if removed.contains(&o.key) {
                continue;
            }
            let (vector, deleted) = deletes.remove(&o.key).map_or((None, None), |(d, b)| (Some(d), Some(b)));
            objects.push(LiveObject { ordinal: ordinal as u32, manifest: manifest_key, vector, deleted });
        }
        if let Some(object) = deletes.keys().next() {
            return Err(StorageError::Corrupt {
                location: self.loc.url.clone(),
                reason: format!("table {} has a deletion vector for data object {object:016x}, which it does not list", entry.id),
            });
        }
        Ok(TableData { manifest, objects })
    }
}

/// A version's number, time and operation, without its tables.
#[derive(Debug, Clone, serde::Deserialize)]
pub struct VersionSummary {
    pub version: u64,
    pub committed_at_ms: u64,
    pub operation: String,
}

/// A table version's data as scans and DML read it.
#[derive(Debug, Clone)]
pub struct TableData {
    /// Every data object its manifest files list, including rewritten ones.
    pub manifest: Arc<Manifest>,
    /// The live objects, in manifest order.
    pub objects: Vec<LiveObject>,
}

/// A live data object of a [`TableData`].
#[derive(Debug, Clone)]
pub struct LiveObject {
    /// Its position in [`TableData::manifest`]: the upper half of the row
    /// ids that DELETE and UPDATE work with (the row position is the lower
    /// half; an object has fewer than 2^32 rows).
    pub ordinal: u32,
    /// The manifest file that lists it.
    pub manifest: u64,
    /// Its deletion vector, if rows of it are deleted.
    pub vector: Option<DeleteRef>,
    pub deleted: Option<Arc<RoaringBitmap>>,
}

impl TableData {
    /// The data object of `live`.
    pub fn object(&self, live: &LiveObject) -> &DataObject {
        &self.manifest.objects[live.ordinal as usize]
    }

    /// Live rows.
    pub fn rows(&self) -> u64 {
        self.objects.iter().map(|l| self.object(l).rows - l.vector.map_or(0, |v| v.rows)).sum()
    }
}

fn describe(changes: &[Change]) -> String {
    let parts: Vec<String> = changes.iter().map(Change::describe).collect();
    parts.join("; ")
}

pub(crate) async fn put_new(loc: &Location, path: &Path, body: Bytes) -> Result<()> {
    let opts = PutOptions { mode: PutMode::Create, ..Default::default() };
    loc.store
        .put_opts(path, PutPayload::from_bytes(body), opts)
        .await
        .map(|_| ())
        .map_err(|e| StorageError::store("PUT", loc.display(path), e))
}

fn to_json<T: Serialize>(value: &T) -> Bytes {
    Bytes::from(serde_json::to_vec(value).expect("format types always serialise"))
}

fn parse_json<T: DeserializeOwned>(loc: &Location, path: &Path, bytes: &[u8]) -> Result<T> {
    serde_json::from_slice(bytes).map_err(|e| StorageError::Corrupt { location: loc.display(path), reason: format!("invalid JSON ({e})") })
}

fn check_version(loc: &Location, found: u32) -> Result<()> {
    if found > FORMAT_VERSION {
        return Err(StorageError::UnsupportedFormat { location: loc.url.clone(), found, supported: FORMAT_VERSION });
    }
    Ok(())
}
