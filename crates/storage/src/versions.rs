//! The version log of format 2: where database versions live, and how a
//! version is written as a checkpoint or as a cumulative delta over one and
//! read back. Pure functions; `crate::database` does the I/O.
//!
//! Why deltas: a version-1 commit rewrote every table's manifest, so its
//! cost grew with the table. Here a commit writes the manifest file of the
//! objects it adds and a version object that holds only what changed since
//! the last checkpoint (manifest keys, not footers). While that delta stays
//! under [`DELTA_LIMIT`] bytes (or a quarter of the checkpoint, whichever is
//! larger) it is written as is; beyond, the commit writes a new checkpoint.
//! A commit's metadata is thus bounded by the change plus the delta bound,
//! and the checkpoints' cost is spread over the commits between them.
//! Reading any version takes two objects: it and its checkpoint.
//!
//! Why no crate: the layout is blobhouse's own (Delta Lake's log and
//! checkpoints, Iceberg's manifest lists, under the rule that no object is
//! written twice, which rules out their `_last_checkpoint` pointer).

use std::sync::Arc;

use crate::error::{Result, StorageError};
use crate::format::*;
use crate::keys::object_name;

/// A delta larger than this (and than a quarter of its checkpoint) is
/// written as a checkpoint instead.
pub const DELTA_LIMIT: usize = 16 << 10;

/// Path of format-2 version `v`, relative to the database root.
pub fn log_path(v: u64) -> String {
    format!("{LOG_DIR}/{:017}/{v:020}.json", v / VERSIONS_PER_BUCKET)
}

/// Path of version `v` in the version-1 layout.
pub fn catalog_path(v: u64) -> String {
    format!("{CATALOG_DIR}/{v:020}.json")
}

/// Path of a manifest file.
pub fn manifest_path(m: &ManifestRef) -> String {
    object_name(m.key, MANIFEST_EXT)
}

/// Version `version` of a database in format 1, with each table's one
/// manifest as its only manifest file. It has no checkpoint: the next
/// commit writes one.
pub fn from_v1(location: &str, v1: V1CatalogVersion) -> Result<CatalogVersion> {
    let mut tables = std::collections::BTreeMap::new();
    for (name, t) in v1.tables {
        let key = manifest_key(&t.manifest).ok_or_else(|| StorageError::Corrupt {
            location: location.to_string(),
            reason: format!("table {name}'s manifest '{}' is not named by a key", t.manifest),
        })?;
        let manifest = ManifestRef { key, objects: t.objects, rows: t.rows, bytes: t.bytes, checksum: None };
        let entry = TableEntry {
            id: t.id,
            schema: t.schema,
            table_version: t.table_version,
            manifests: vec![manifest],
            extends_checkpoint: false,
            deletes: Default::default(),
            removed: Vec::new(),
            rows: t.rows,
            bytes: t.bytes,
            objects: t.objects,
        };
        tables.insert(name, entry);
    }
    Ok(CatalogVersion {
        format_version: v1.format_version,
        version: v1.version,
        committed_at_ms: v1.committed_at_ms,
        operation: v1.operation,
        tables,
        checkpoint: None,
        ..Default::default()
    })
}

/// The key in a manifest's name `objects/<hhhh>/<key:016x>.manifest.json`,
/// if the name is one [`manifest_path`] makes.
fn manifest_key(path: &str) -> Option<u64> {
    let name = path.rsplit('/').next()?;
    let key = u64::from_str_radix(name.strip_suffix(&format!(".{MANIFEST_EXT}"))?, 16).ok()?;
    (object_name(key, MANIFEST_EXT) == path).then_some(key)
}

/// Reads a format-2 version object (`bytes` of `file`, sealed with `seal`).
/// A delta needs the checkpoint it names; `checkpoint` must be that one.
pub fn resolve(location: &str, file: VersionFile, bytes: usize, seal: Option<u64>, checkpoint: Option<Arc<Checkpoint>>) -> Result<CatalogVersion> {
    let corrupt = |reason: String| StorageError::Corrupt { location: location.to_string(), reason };
    let (tables, checkpoint) = match file.checkpoint {
        None => {
            let own = Arc::new(Checkpoint { version: file.version, bytes, seal, tables: file.tables.clone() });
            (file.tables, own)
        }
        Some(c) => {
            let base = checkpoint.filter(|b| b.version == c).ok_or_else(|| corrupt(format!("its checkpoint, version {c}, was not given")))?;
            if let Some(expected) = file.checkpoint_seal.filter(|e| base.seal != Some(*e)) {
                return Err(corrupt(format!("it names checkpoint {c} sealed {expected:016x}, and the checkpoint read is not that object")));
            }
            let mut tables = base.tables.clone();
            for name in &file.dropped {
                tables.remove(name);
            }
            for (name, mut t) in file.tables {
                if t.extends_checkpoint {
                    let Some(old) = base.tables.get(&name).filter(|old| old.id == t.id) else {
                        return Err(corrupt(format!("table {name} extends checkpoint {c}, which does not have it")));
                    };
                    let mut manifests = old.manifests.clone();
                    manifests.append(&mut t.manifests);
                    t.manifests = manifests;
                    let mut removed = old.removed.clone();
                    removed.append(&mut t.removed);
                    t.removed = removed;
                    let mut deletes = old.deletes.clone();
                    deletes.append(&mut t.deletes);
                    t.deletes = deletes;
                    t.extends_checkpoint = false;
                }
                tables.insert(name, t);
            }
            (tables, base)
        }
    };
    Ok(CatalogVersion {
        format_version: file.format_version,
        version: file.version,
        committed_at_ms: file.committed_at_ms,
        operation: file.operation,
        tables,
        external: file.external,
        snapshots: file.snapshots,
        restored_from: file.restored_from,
        gc: file.gc, restores: file.restores, retired: file.retired, iceberg: file.iceberg, iceberg_format: file.iceberg_format,
        checkpoint: Some(checkpoint),
    })
}

/// `next` as a version object, sealed by `seal` (`crate::seal`): a delta
/// against `next.checkpoint` while it is small, else a checkpoint (then
/// `next.checkpoint` is updated to it).
/// `force_checkpoint`: the upgrade of a version-1 database.
pub fn encode(next: &mut CatalogVersion, force_checkpoint: bool, seal: &dyn Fn(Vec<u8>) -> (Vec<u8>, u64)) -> Vec<u8> {
    if let Some(base) = next.checkpoint.clone().filter(|_| !force_checkpoint) {
        let delta = delta(next, &base);
        let body = serde_json::to_vec(&delta).expect("format types always serialise");
        if body.len() + crate::seal::SEAL_LEN <= DELTA_LIMIT.max(base.bytes / 4) {
            return seal(body).0;
        }
    }
    let file = VersionFile {
        format_version: FORMAT_VERSION,
        version: next.version,
        committed_at_ms: next.committed_at_ms,
        operation: next.operation.clone(),
        checkpoint: None,
        checkpoint_seal: None,
        tables: next.tables.clone(),
        dropped: Vec::new(),
        external: next.external.clone(),
        snapshots: next.snapshots.clone(),
        restored_from: next.restored_from,
        gc: next.gc.clone(), restores: next.restores.clone(), retired: next.retired.clone(), iceberg: next.iceberg, iceberg_format: next.iceberg_format,
    };
    let (body, sealed) = seal(serde_json::to_vec(&file).expect("format types always serialise"));
    next.checkpoint = Some(Arc::new(Checkpoint { version: next.version, bytes: body.len(), seal: Some(sealed), tables: next.tables.clone() }));
    body
}

/// What changed in `next` since `base`, as a delta version object.
fn delta(next: &CatalogVersion, base: &Checkpoint) -> VersionFile {
    let mut tables = std::collections::BTreeMap::new();
    for (name, t) in &next.tables {
        match base.tables.get(name) {
            Some(old) if old == t => {}
            Some(old) if extends(old, t) => {
                let added = t.manifests[old.manifests.len()..].to_vec();
                let removed = t.removed[old.removed.len()..].to_vec();
                let deletes = t.deletes.iter().filter(|(k, d)| old.deletes.get(k) != Some(d)).map(|(k, d)| (*k, *d)).collect();
                tables.insert(name.clone(), TableEntry { manifests: added, removed, deletes, extends_checkpoint: true, ..t.clone() });
            }
            _ => {
                tables.insert(name.clone(), t.clone());
            }
        }
    }
    VersionFile {
        format_version: FORMAT_VERSION,
        version: next.version,
        committed_at_ms: next.committed_at_ms,
        operation: next.operation.clone(),
        checkpoint: Some(base.version),
        checkpoint_seal: base.seal,
        tables,
        dropped: base.tables.keys().filter(|n| !next.tables.contains_key(*n)).cloned().collect(),
        external: next.external.clone(),
        snapshots: next.snapshots.clone(),
        restored_from: next.restored_from,
        gc: next.gc.clone(), restores: next.restores.clone(), retired: next.retired.clone(), iceberg: next.iceberg, iceberg_format: next.iceberg_format,
    }
}

/// Whether `t` is `old` with things added only (manifests and removed
/// objects appended, deletion vectors added or replaced): then a delta
/// holds just the additions.
fn extends(old: &TableEntry, t: &TableEntry) -> bool {
    old.id == t.id
        && t.manifests.starts_with(&old.manifests)
        && t.removed.starts_with(&old.removed)
        && old.deletes.keys().all(|k| t.deletes.contains_key(k))
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::datatypes::{DataType, Field, Schema};

    fn table(id: u64, manifests: &[u64]) -> TableEntry {
        TableEntry {
            id,
            schema: Schema::new(vec![Field::new("x", DataType::Int64, false)]),
            table_version: manifests.len() as u64,
            manifests: manifests.iter().map(|&key| ManifestRef { key, objects: 1, rows: 1, bytes: 100, checksum: None }).collect(),
            extends_checkpoint: false,
            deletes: Default::default(),
            removed: Vec::new(),
            rows: manifests.len() as u64,
            bytes: 100 * manifests.len() as u64,
            objects: manifests.len() as u64,
        }
    }

    fn version(v: u64, tables: &[(&str, TableEntry)], checkpoint: Option<Arc<Checkpoint>>) -> CatalogVersion {
        CatalogVersion {
            format_version: FORMAT_VERSION,
            version: v,
            committed_at_ms: v,
            operation: format!("v{v}"),
            tables: tables.iter().map(|(n, t)| (n.to_string(), t.clone())).collect(),
            checkpoint,
            ..Default::default()
        }
    }

    fn sealer() -> crate::seal::Sealer {
        crate::seal::Sealer::new(1, Some(1))
    }

    fn encode(next: &mut CatalogVersion, force_checkpoint: bool) -> Vec<u8> {
        super::encode(next, force_checkpoint, &|body| sealer().seal("v", body))
    }

    fn resolve(location: &str, file: VersionFile, bytes: usize, checkpoint: Option<Arc<Checkpoint>>) -> Result<CatalogVersion> {
        super::resolve(location, file, bytes, None, checkpoint)
    }

    /// Writes and reads back `next`: what a reader of the store resolves.
    fn round_trip(next: &mut CatalogVersion) -> (CatalogVersion, usize) {
        let base = next.checkpoint.clone();
        let body = encode(next, false);
        let seal = sealer().check("v", &body, || FORMAT_VERSION, None).unwrap();
        let file: VersionFile = serde_json::from_slice(&body).unwrap();
        let given = if file.checkpoint.is_some() { base } else { None };
        (super::resolve("test", file, body.len(), seal, given).unwrap(), body.len())
    }

    #[test]
    fn the_first_version_is_a_checkpoint_and_later_ones_deltas_that_read_back_whole() {
        let mut v1 = version(1, &[("a", table(7, &[1])), ("b", table(8, &[2]))], None);
        let (read, _) = round_trip(&mut v1);
        assert_eq!(read.tables, v1.tables);
        assert_eq!(read.checkpoint.as_ref().unwrap().version, 1, "a checkpoint");

        // Append to a, drop b, create c.
        let mut v2 = version(2, &[("a", table(7, &[1, 3])), ("c", table(9, &[4]))], v1.checkpoint.clone());
        let base = v2.checkpoint.clone();
        let body = encode(&mut v2, false);
        let file: VersionFile = serde_json::from_slice(&body).unwrap();
        assert_eq!(file.checkpoint, Some(1));
        assert_eq!(file.dropped, vec!["b".to_string()]);
        assert_eq!(file.tables["a"].manifests.len(), 1, "only the manifest added since the checkpoint");
        assert!(file.tables["a"].extends_checkpoint);
        let read = resolve("test", file, body.len(), base).unwrap();
        assert_eq!(read.tables, v2.tables);
    }

    #[test]
    fn deltas_carry_only_the_deletion_vectors_and_removals_since_the_checkpoint() {
        let mut with_deletes = table(7, &[1, 2]);
        with_deletes.deletes.insert(100, DeleteRef { key: 500, rows: 3, checksum: None });
        let mut v1 = version(1, &[("a", with_deletes.clone())], None);
        round_trip(&mut v1);
        let mut changed = with_deletes.clone();
        changed.deletes.insert(100, DeleteRef { key: 501, rows: 4, checksum: None });
        changed.deletes.insert(101, DeleteRef { key: 502, rows: 1, checksum: None });
        changed.removed.push(102);
        changed.manifests.push(ManifestRef { key: 3, objects: 1, rows: 1, bytes: 100, checksum: None });
        let mut v2 = version(2, &[("a", changed.clone())], v1.checkpoint.clone());
        let base = v2.checkpoint.clone();
        let body = encode(&mut v2, false);
        let file: VersionFile = serde_json::from_slice(&body).unwrap();
        let a = &file.tables["a"];
        assert!(a.extends_checkpoint);
        assert_eq!(a.deletes.len(), 2, "the replaced and the new vector, not the unchanged ones");
        assert_eq!(a.removed, vec![102]);
        assert_eq!(resolve("test", file, body.len(), base).unwrap().tables["a"], changed);

        // A vector that disappears (its object was rewritten) cannot be
        // written as an addition: the entry is written whole.
        let mut dropped = changed.clone();
        dropped.deletes.remove(&100);
        let mut v3 = version(3, &[("a", dropped.clone())], v1.checkpoint.clone());
        let base = v3.checkpoint.clone();
        let body = encode(&mut v3, false);
        let file: VersionFile = serde_json::from_slice(&body).unwrap();
        assert!(!file.tables["a"].extends_checkpoint);
        assert_eq!(resolve("test", file, body.len(), base).unwrap().tables["a"], dropped);
    }

    #[test]
    fn a_table_replaced_under_the_same_name_is_written_whole() {
        let mut v1 = version(1, &[("a", table(7, &[1, 2]))], None);
        round_trip(&mut v1);
        let mut v2 = version(2, &[("a", table(8, &[5]))], v1.checkpoint.clone());
        let (read, _) = round_trip(&mut v2);
        assert_eq!(read.tables["a"], table(8, &[5]));
    }

    #[test]
    fn deltas_stay_bounded_because_a_large_one_becomes_a_checkpoint() {
        let mut current = version(1, &[("t", table(7, &[]))], None);
        round_trip(&mut current);
        let mut checkpoints = 0;
        for v in 2..=3000u64 {
            let manifests: Vec<u64> = (1..v).collect();
            let mut next = version(v, &[("t", table(7, &manifests))], current.checkpoint.clone());
            let before = next.checkpoint.as_ref().unwrap().version;
            let (read, bytes) = round_trip(&mut next);
            assert_eq!(read.tables, next.tables, "version {v}");
            let is_checkpoint = next.checkpoint.as_ref().unwrap().version != before;
            if is_checkpoint {
                checkpoints += 1;
            } else {
                assert!(bytes <= DELTA_LIMIT.max(next.checkpoint.as_ref().unwrap().bytes / 4), "version {v}: a delta of {bytes} bytes");
            }
            current = next;
        }
        // Checkpoints grow with the table, so they come rarer as it grows.
        assert!((3..60).contains(&checkpoints), "{checkpoints} checkpoints in 3000 commits");
    }

    #[test]
    fn manifest_keys_are_read_back_from_version_1_names() {
        let path = manifest_path(&ManifestRef { key: 0x100005, objects: 0, rows: 0, bytes: 0, checksum: None });
        assert_eq!(manifest_key(&path), Some(0x100005));
        assert_eq!(manifest_key("objects/0000/elsewhere.manifest.json"), None);
    }
}
