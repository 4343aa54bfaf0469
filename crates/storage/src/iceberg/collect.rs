//! VACUUM's part for Iceberg, and the check that no metadata in force
//! names a missing object (see the parent module for the rules).

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use bytes::Bytes;
use futures::TryStreamExt;
use serde_json::Value as Json;

use super::avro::{self, Value};
use super::*;
use crate::database::Database;
use crate::error::{Result, StorageError};
use crate::format::CatalogVersion;

/// VACUUM's part for Iceberg, by blobhouse's own rules: a table's
/// metadata (and manifest list) of snapshot N is deleted when N is before
/// the GC `horizon` and is not the table's snapshot current at a version
/// still readable (`protecting`: the horizon, restores, snapshots);
/// manifests and delete files mirroring a manifest or deletion vector go
/// with it (`dead`: the keys VACUUM deletes). Metadata goes first, so that
/// no metadata file ever names a deleted object. Returns what it deleted,
/// with why.
pub(crate) async fn collect(db: &Database, horizon: u64, protecting: &[Arc<CatalogVersion>], dead: &std::collections::HashSet<u64>) -> Result<Vec<(String, String)>> {
    let loc = db.location();
    let relative = |m: &object_store::ObjectMeta| loc.relative(&m.location);
    let list = |dir: String| async move {
        let path = loc.child(&dir);
        loc.store.list(Some(&path)).try_collect::<Vec<_>>().await.map_err(|e| StorageError::store("LIST", loc.display(&path), e))
    };
    let mut out = Vec::new();
    // Table metadata: (table id, snapshot) → its files.
    let mut snapshots: HashMap<u64, BTreeSet<u64>> = HashMap::new();
    for m in list(format!("{DIR}/tables")).await? {
        let rel = relative(&m);
        let mut parts = rel.split('/').skip(2);
        let (Some(table), Some("metadata"), Some(file)) = (parts.next(), parts.next(), parts.next()) else { continue };
        let Ok(table) = u64::from_str_radix(table, 16) else { continue };
        let snapshot = file.strip_prefix('v').and_then(|f| f.strip_suffix(".metadata.json")).or_else(|| file.strip_prefix("snap-").and_then(|f| f.strip_suffix(".avro")));
        if let Some(Ok(n)) = snapshot.map(str::parse::<u64>) {
            snapshots.entry(table).or_default().insert(n);
        }
    }
    let (mut metadata, mut lists) = (Vec::new(), Vec::new());
    for (table, ids) in &snapshots {
        let keep = in_force(db, *table, ids, horizon, protecting).await?;
        for n in ids.iter().filter(|n| **n < horizon && !keep.contains(n)) {
            metadata.push((metadata_path(*table, *n), format!("Iceberg metadata of snapshot {n}, expired (before {horizon})")));
            lists.push((list_path(*table, *n), format!("Iceberg manifest list of snapshot {n}, expired (before {horizon})")));
        }
    }
    // Mirrors of what VACUUM deletes: `<key:016x>[-r…].<ext>`.
    let mut mirrors = Vec::new();
    if !dead.is_empty() {
        for m in list(format!("{DIR}/objects")).await? {
            let rel = relative(&m);
            let Some(name) = rel.rsplit('/').next() else { continue };
            let Some(key) = name.get(..16).and_then(|k| u64::from_str_radix(k, 16).ok()) else { continue };
            if dead.contains(&key) {
                mirrors.push((rel.clone(), format!("Iceberg mirror of {key:016x}, which VACUUM deletes")));
            }
        }
    }
    for batch in [metadata, lists, mirrors] {
        let paths: Vec<String> = batch.iter().map(|(p, _)| p.clone()).collect();
        crate::gc::delete_paths(db, paths).await?;
        out.extend(batch);
    }
    Ok(out)
}

/// The metadata files (by snapshot) of table `table` still in force, of
/// those there are (`ids`): every one at or after the GC `horizon`, and
/// the one that shows the table as it is at each version of `protecting`
/// (the horizon, RESTOREs, snapshots) that has it — the newest at or
/// before that version, if it shows that table version: after commits
/// whose metadata was never written (a crash between a commit and its
/// metadata) it shows an older state, whose objects VACUUM may delete.
async fn in_force(db: &Database, table: u64, ids: &BTreeSet<u64>, horizon: u64, protecting: &[Arc<CatalogVersion>]) -> Result<BTreeSet<u64>> {
    let mut keep: BTreeSet<u64> = ids.range(horizon..).copied().collect();
    for v in protecting {
        let Some(entry) = v.tables.values().find(|t| t.id == table) else { continue };
        let Some(n) = ids.range(..=v.version).next_back().copied() else { continue };
        if keep.contains(&n) {
            continue;
        }
        let path = db.location().child(&metadata_path(table, n));
        let bytes = match db.get(&path).await {
            Ok(b) => b,
            Err(StorageError::Store { source: object_store::Error::NotFound { .. }, .. }) => continue,
            Err(e) => return Err(e),
        };
        let shows: Option<u64> = serde_json::from_slice::<Json>(&bytes).ok().and_then(|m| m["properties"]["blobhouse.table-version"].as_str()?.parse().ok());
        if shows == Some(entry.table_version) {
            keep.insert(n);
        }
    }
    Ok(keep)
}

/// Every object that Iceberg metadata still in force names and that is
/// missing, each with the metadata naming it (both full URIs): of every metadata file, the
/// snapshots at or after the GC horizon and those still in force
/// ([`in_force`]) — the manifest list, its manifests, their data and
/// delete files. Other snapshots are expired, as blobhouse's own versions
/// before the horizon are. Empty when other engines can read every snapshot they
/// may ask for.
pub async fn dangling(db: &Database) -> Result<Vec<(String, String)>> {
    let version = db.refresh().await?;
    let horizon = version.gc.horizon;
    // What VACUUM protects: the horizon, RESTOREs after it, snapshots.
    let mut protecting = Vec::new();
    let pinned = version.snapshots.values().map(|s| s.version).chain(version.restores.iter().map(|r| r.version).filter(|v| *v > horizon));
    for v in [horizon].into_iter().filter(|h| *h > 0).chain(pinned) {
        protecting.push(Arc::new(if v == version.version { (*version).clone() } else { db.read_version(v).await? }));
    }
    let mut in_force_by_table: HashMap<u64, BTreeSet<u64>> = HashMap::new();
    let loc = db.location();
    let base = db.object_uri("");
    let dir = loc.child(&format!("{DIR}/tables"));
    let metas: Vec<object_store::ObjectMeta> = loc.store.list(Some(&dir)).try_collect().await.map_err(|e| StorageError::store("LIST", loc.display(&dir), e))?;
    let mut missing = Vec::new();
    let mut seen: std::collections::HashSet<String> = std::collections::HashSet::new();
    // The bytes at `uri`, or `None` (noted as missing) when it is not there.
    async fn fetch(db: &Database, base: &str, uri: &str, named_by: &str, missing: &mut Vec<(String, String)>) -> Result<Option<Bytes>> {
        let relative = uri.strip_prefix(base).unwrap_or(uri);
        match db.get(&db.location().child(relative)).await {
            Ok(b) => Ok(Some(b)),
            Err(StorageError::Store { source: object_store::Error::NotFound { .. }, .. }) => {
                missing.push((uri.to_string(), named_by.to_string()));
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }
    let mut files: HashMap<u64, BTreeSet<u64>> = HashMap::new();
    for m in metas.iter().filter(|m| m.location.as_ref().ends_with(".metadata.json")) {
        let mut parts = m.location.as_ref().rsplit('/');
        let (Some(file), Some(_), Some(table)) = (parts.next(), parts.next(), parts.next()) else { continue };
        if let (Ok(table), Some(Ok(n))) = (u64::from_str_radix(table, 16), file.strip_prefix('v').and_then(|f| f.strip_suffix(".metadata.json")).map(str::parse::<u64>)) {
            files.entry(table).or_default().insert(n);
        }
    }
    for (table, ids) in &files {
        in_force_by_table.insert(*table, in_force(db, *table, ids, horizon, &protecting).await?);
    }
    for m in metas.iter().filter(|m| m.location.as_ref().ends_with(".metadata.json")) {
        let meta_uri = loc.display(&m.location);
        let bytes = db.get(&m.location).await?;
        let metadata: Json = serde_json::from_slice(&bytes).map_err(|e| StorageError::Corrupt { location: meta_uri.clone(), reason: e.to_string() })?;
        let table: Option<u64> = metadata["properties"]["blobhouse.table-id"].as_str().and_then(|t| t.parse().ok());
        let in_force = table.and_then(|t| in_force_by_table.get(&t));
        for snapshot in metadata["snapshots"].as_array().into_iter().flatten() {
            let id = snapshot["snapshot-id"].as_u64().unwrap_or(0);
            if id < horizon && !in_force.is_some_and(|k| k.contains(&id)) {
                continue;
            }
            let Some(list_uri) = snapshot["manifest-list"].as_str() else { continue };
            if !seen.insert(list_uri.to_string()) {
                continue;
            }
            let Some(list) = fetch(db, &base, list_uri, &meta_uri, &mut missing).await? else { continue };
            let (_, manifests) = avro::read_file(&list).map_err(|e| StorageError::Corrupt { location: list_uri.to_string(), reason: e.to_string() })?;
            for manifest in manifests.iter().filter_map(ListEntry::from_avro) {
                if !seen.insert(manifest.path.clone()) {
                    continue;
                }
                let Some(bytes) = fetch(db, &base, &manifest.path, list_uri, &mut missing).await? else { continue };
                let (_, entries) = avro::read_file(&bytes).map_err(|e| StorageError::Corrupt { location: manifest.path.clone(), reason: e.to_string() })?;
                for entry in &entries {
                    let Value::Record(fields) = entry else { continue };
                    let Some(Value::Record(file)) = fields.get(4) else { continue };
                    let Some(path) = file.get(1).and_then(Value::as_str) else { continue };
                    if !seen.insert(path.to_string()) {
                        continue;
                    }
                    let relative = path.strip_prefix(&base).unwrap_or(path);
                    let at = loc.child(relative);
                    match object_store::ObjectStoreExt::head(loc.store.as_ref(), &at).await {
                        Ok(_) => {}
                        Err(object_store::Error::NotFound { .. }) => missing.push((path.to_string(), manifest.path.clone())),
                        Err(e) => return Err(StorageError::store("HEAD", loc.display(&at), e)),
                    }
                }
            }
        }
    }
    Ok(missing)
}
