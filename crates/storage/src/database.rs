//! A database on the store: opening, the catalog's version history, and
//! commits.
//!
//! The catalog is a log of immutable versions `catalog/<n:020>.json`; the
//! newest is the current state (tables → schema + current manifest). A commit
//! reads the newest version `n`, writes any new manifests under fresh keys, and
//! creates `catalog/<n+1>.json` with put-if-absent. Exactly one of several
//! concurrent committers wins version `n+1`; the others re-read and re-apply
//! their change on top of it (appends commute), or fail with a clear conflict
//! when the change no longer makes sense (e.g. the table was dropped). Readers
//! never see a half-written version because a version exists only once its
//! single PUT has completed. Old versions stay, which is what snapshots and
//! point-in-time restore will build on.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use bytes::Bytes;
use datafusion::arrow::datatypes::Schema;
use datafusion::execution::memory_pool::{MemoryConsumer, MemoryPool, MemoryReservation};
use futures::TryStreamExt;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload};
use rand::Rng;
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::error::{Result, StorageError};
use crate::format::*;
use crate::keys::{KeyGenerator, object_name};
use crate::location::Location;

/// How many times a commit re-applies its change after losing the race.
pub const MAX_COMMIT_ATTEMPTS: u32 = 100;

/// A change to the database, applied atomically by [`Database::commit`].
#[derive(Debug, Clone)]
pub enum Change {
    /// Create a table, optionally with data already written (CTAS, loads).
    CreateTable {
        name: String,
        schema: Schema,
        if_not_exists: bool,
        objects: Vec<DataObject>,
    },
    /// Drop a table. Its objects stay until garbage collection.
    DropTable { name: String, if_exists: bool },
    /// Append data objects to a table (INSERT, COPY).
    Append {
        name: String,
        /// The id the writer saw; the commit fails if the table was replaced.
        table_id: u64,
        objects: Vec<DataObject>,
    },
}

impl Change {
    fn describe(&self) -> String {
        match self {
            Change::CreateTable { name, objects, .. } if objects.is_empty() => format!("CREATE TABLE {name}"),
            Change::CreateTable { name, objects, .. } => {
                format!("CREATE TABLE {name} with {} rows", objects.iter().map(|o| o.rows).sum::<u64>())
            }
            Change::DropTable { name, .. } => format!("DROP TABLE {name}"),
            Change::Append { name, objects, .. } => {
                format!("APPEND {} rows to {name}", objects.iter().map(|o| o.rows).sum::<u64>())
            }
        }
    }

    /// The data objects this change would add (deleted again if it fails).
    pub fn objects(&self) -> &[DataObject] {
        match self {
            Change::CreateTable { objects, .. } | Change::Append { objects, .. } => objects,
            Change::DropTable { .. } => &[],
        }
    }
}

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
    manifests: Mutex<HashMap<String, Arc<Manifest>>>,
    /// The manifest cache's bytes in the engine's memory budget, once the
    /// engine has given one ([`Database::account_caches_in`]).
    manifest_bytes: std::sync::OnceLock<MemoryReservation>,
}

impl Database {
    /// Opens the database at `loc`, creating it when `create` is set and the
    /// location holds nothing yet.
    pub async fn open(loc: Location, create: bool) -> Result<Arc<Database>> {
        let marker_path = loc.child(MARKER);
        match loc.store.get(&marker_path).await {
            Ok(r) => {
                let bytes = r.bytes().await.map_err(|e| StorageError::store("GET", loc.display(&marker_path), e))?;
                let marker: DatabaseMarker = parse_json(&loc, &marker_path, &bytes)?;
                if marker.format != "blobhouse" {
                    return Err(StorageError::NotADatabase {
                        location: loc.url.clone(),
                        reason: format!("{MARKER} says format '{}'", marker.format),
                    });
                }
                check_version(&loc, marker.format_version)?;
            }
            Err(object_store::Error::NotFound { .. }) => {
                if !create {
                    return Err(StorageError::NotADatabase {
                        location: loc.url.clone(),
                        reason: format!("no {MARKER} found"),
                    });
                }
                let marker = DatabaseMarker { format: "blobhouse".into(), format_version: FORMAT_VERSION, created_at_ms: now_ms() };
                match put_new(&loc, &marker_path, to_json(&marker)).await {
                    Ok(()) | Err(StorageError::Store { source: object_store::Error::AlreadyExists { .. }, .. }) => {}
                    Err(e) => return Err(e),
                }
            }
            Err(e) => return Err(StorageError::store("GET", loc.display(&marker_path), e)),
        }
        let db = Arc::new(Database {
            keys: KeyGenerator::new(loc.clone()),
            loc,
            current: RwLock::new(Arc::new(CatalogVersion { format_version: FORMAT_VERSION, ..Default::default() })),
            manifests: Mutex::new(HashMap::new()),
            manifest_bytes: std::sync::OnceLock::new(),
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

    /// Loads the newest committed version from the store.
    pub async fn refresh(&self) -> Result<Arc<CatalogVersion>> {
        let known = self.current();
        let dir = self.loc.child(CATALOG_DIR);
        let offset = self.loc.child(&format!("{CATALOG_DIR}/{:020}.json", known.version));
        let listing: Vec<_> = if known.version == 0 {
            self.loc.store.list(Some(&dir)).try_collect().await
        } else {
            self.loc.store.list_with_offset(Some(&dir), &offset).try_collect().await
        }
        .map_err(|e| StorageError::store("LIST", self.loc.display(&dir), e))?;
        let newest = listing
            .iter()
            .filter_map(|m| m.location.filename()?.strip_suffix(".json")?.parse::<u64>().ok())
            .max();
        match newest {
            Some(v) if v > known.version => {
                let version = Arc::new(self.read_version(v).await?);
                let mut cur = self.current.write().expect("catalog lock");
                if cur.version < version.version {
                    *cur = version;
                }
                Ok(cur.clone())
            }
            _ => Ok(known),
        }
    }

    /// Reads database version `v` (for time travel and for the newest state).
    pub async fn read_version(&self, v: u64) -> Result<CatalogVersion> {
        let path = self.loc.child(&format!("{CATALOG_DIR}/{v:020}.json"));
        let bytes = self.get(&path).await?;
        let version: CatalogVersion = parse_json(&self.loc, &path, &bytes)?;
        check_version(&self.loc, version.format_version)?;
        if version.version != v {
            return Err(StorageError::Corrupt {
                location: self.loc.display(&path),
                reason: format!("it claims to be version {}", version.version),
            });
        }
        Ok(version)
    }

    /// The manifest of a table version. Manifests never change, so they are
    /// cached for the life of the handle.
    pub async fn manifest(&self, entry: &TableEntry) -> Result<Arc<Manifest>> {
        if let Some(m) = self.manifests.lock().expect("manifest cache").get(&entry.manifest) {
            return Ok(m.clone());
        }
        let path = self.loc.child(&entry.manifest);
        let bytes = self.get(&path).await?;
        let manifest: Manifest = parse_json(&self.loc, &path, &bytes)?;
        check_version(&self.loc, manifest.format_version)?;
        if manifest.table_id != entry.id || manifest.table_version != entry.table_version {
            return Err(StorageError::Corrupt {
                location: self.loc.display(&path),
                reason: "manifest does not belong to the table version that references it".into(),
            });
        }
        let manifest = Arc::new(manifest);
        self.cache_manifest(&entry.manifest, &manifest, bytes.len());
        Ok(manifest)
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

    /// Applies `change` atomically on top of the newest version. Retries when
    /// another writer committed first; fails with a conflict error when the
    /// change no longer applies. On any failure, the change's data objects
    /// are deleted again, so nothing half-written stays behind.
    pub async fn commit(&self, change: Change) -> Result<CommitOutcome> {
        let result = self.commit_inner(&change).await;
        if !matches!(result, Ok(CommitOutcome::Committed(_))) {
            let written: Vec<String> = change.objects().iter().map(|o| o.path.clone()).collect();
            self.delete_unreferenced(written).await;
        }
        result
    }

    async fn commit_inner(&self, change: &Change) -> Result<CommitOutcome> {
        let mut base = self.refresh().await?;
        for attempt in 0..MAX_COMMIT_ATTEMPTS {
            let Some((next, new_manifest)) = self.apply(&base, change).await? else {
                return Ok(CommitOutcome::NoOp);
            };
            let path = self.loc.child(&format!("{CATALOG_DIR}/{:020}.json", next.version));
            match put_new(&self.loc, &path, to_json(&next)).await {
                Ok(()) => {
                    let next = Arc::new(next);
                    let mut cur = self.current.write().expect("catalog lock");
                    if cur.version < next.version {
                        *cur = next.clone();
                    }
                    return Ok(CommitOutcome::Committed(next));
                }
                Err(StorageError::Store { source: object_store::Error::AlreadyExists { .. }, .. }) => {
                    // Lost the race: this attempt's manifest is unreferenced.
                    if let Some(m) = new_manifest {
                        self.delete_unreferenced(vec![m]).await;
                    }
                    let backoff = Duration::from_millis(rand::rng().random_range(1..=(5 + 5 * attempt.min(20) as u64)));
                    tokio::time::sleep(backoff).await;
                    base = self.refresh().await?;
                }
                Err(e) => {
                    if let Some(m) = new_manifest {
                        self.delete_unreferenced(vec![m]).await;
                    }
                    return Err(e);
                }
            }
        }
        Err(StorageError::TooManyRetries { attempts: MAX_COMMIT_ATTEMPTS })
    }

    /// Builds the version after `base` with `change` applied; writes the new
    /// manifest it needs. Returns `None` when the change is a no-op.
    async fn apply(&self, base: &CatalogVersion, change: &Change) -> Result<Option<(CatalogVersion, Option<String>)>> {
        let mut next = CatalogVersion {
            format_version: FORMAT_VERSION,
            version: base.version + 1,
            committed_at_ms: now_ms(),
            operation: change.describe(),
            tables: base.tables.clone(),
        };
        let manifest_path = match change {
            Change::CreateTable { name, schema, if_not_exists, objects } => {
                if base.tables.contains_key(name) {
                    return if *if_not_exists { Ok(None) } else { Err(StorageError::TableExists(name.clone())) };
                }
                let (id, _) = self.new_object("table").await?;
                let manifest = Manifest { format_version: FORMAT_VERSION, table_id: id, table_version: 0, objects: objects.clone() };
                let path = self.write_manifest(&manifest).await?;
                next.tables.insert(name.clone(), entry_for(id, schema.clone(), &manifest, path.clone()));
                Some(path)
            }
            Change::DropTable { name, if_exists } => {
                if next.tables.remove(name).is_none() {
                    return if *if_exists { Ok(None) } else { Err(StorageError::TableNotFound(name.clone())) };
                }
                None
            }
            Change::Append { name, table_id, objects } => {
                let Some(entry) = base.tables.get(name) else {
                    return Err(StorageError::Conflict { table: name.clone(), reason: "the table was dropped by a concurrent transaction".into() });
                };
                if entry.id != *table_id {
                    return Err(StorageError::Conflict { table: name.clone(), reason: "the table was dropped and re-created by a concurrent transaction".into() });
                }
                if objects.is_empty() {
                    return Ok(None);
                }
                let old = self.manifest(entry).await?;
                let mut all = old.objects.clone();
                all.extend(objects.iter().cloned());
                let manifest = Manifest { format_version: FORMAT_VERSION, table_id: entry.id, table_version: entry.table_version + 1, objects: all };
                let path = self.write_manifest(&manifest).await?;
                next.tables.insert(name.clone(), entry_for(entry.id, entry.schema.clone(), &manifest, path.clone()));
                Some(path)
            }
        };
        Ok(Some((next, manifest_path)))
    }

    async fn write_manifest(&self, manifest: &Manifest) -> Result<String> {
        let (_, path) = self.new_object("manifest.json").await?;
        self.put_new(&path, to_json(manifest)).await?;
        Ok(path)
    }
}

fn entry_for(id: u64, schema: Schema, manifest: &Manifest, path: String) -> TableEntry {
    TableEntry {
        id,
        schema,
        table_version: manifest.table_version,
        manifest: path,
        rows: manifest.objects.iter().map(|o| o.rows).sum(),
        bytes: manifest.objects.iter().map(|o| o.size).sum(),
        objects: manifest.objects.len() as u64,
    }
}

async fn put_new(loc: &Location, path: &Path, body: Bytes) -> Result<()> {
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
