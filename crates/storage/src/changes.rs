//! What a transaction changes, and how a change is applied to a database
//! version — with the validation that makes concurrent commits safe.
//!
//! A [`Change`] refers only to objects its writer has already uploaded
//! (data objects, the manifest file listing them, deletion vectors), so
//! applying it is pure and cheap: a transaction applies its changes to its
//! snapshot as it goes (that is what its own statements read), and COMMIT
//! applies the same list again on top of the newest version, as often as
//! it loses the race for the next version number. [`apply`] is where the
//! conflict rules of snapshot isolation live (docs/transactions.md):
//!
//! - appends commute: they only need the table to still be the one the
//!   writer saw (same id);
//! - a change that deletes rows of a data object, or removes the object
//!   (OPTIMIZE), needs the object's deletion vector to be the very one its
//!   writer started from — otherwise a concurrent transaction deleted or
//!   updated rows of it first, and this one fails with a serialization
//!   error (first committer wins, as in SAP IQ and PostgreSQL's
//!   REPEATABLE READ);
//! - DDL needs the table's name to mean what it meant in the snapshot.

use std::collections::BTreeMap;

use datafusion::arrow::datatypes::Schema;

use crate::error::{Result, StorageError};
use crate::format::{CatalogVersion, DeleteRef, ExternalTable, GcState, ManifestRef, RestoreRecord, Retired, SnapshotEntry, TableEntry};

/// One change of a transaction. Every object it names is uploaded already.
#[derive(Debug, Clone)]
pub enum Change {
    /// Create a table (id from the key generator), optionally with data
    /// already written (CTAS, loads).
    CreateTable {
        name: String,
        id: u64,
        schema: Schema,
        if_not_exists: bool,
        manifest: Option<ManifestRef>,
    },
    /// Drop a table. Its objects stay until garbage collection.
    DropTable {
        name: String,
        /// The table the writer saw (`None`: whichever exists).
        id: Option<u64>,
        if_exists: bool,
    },
    /// Append the data objects of a manifest file (INSERT, COPY, UPDATE's
    /// new rows).
    Append { name: String, table_id: u64, manifest: ManifestRef },
    /// Delete rows: new deletion vectors for some data objects (DELETE,
    /// UPDATE's old rows).
    Delete { name: String, table_id: u64, vectors: Vec<VectorChange> },
    /// Replace data objects by others holding their live rows (OPTIMIZE).
    Rewrite {
        name: String,
        table_id: u64,
        removed: Vec<RemovedObject>,
        manifest: Option<ManifestRef>,
        /// Manifest files to stop listing: every object they list is
        /// removed (by this change or before). Scans then no longer read them.
        dropped_manifests: Vec<u64>,
        /// The keys of those manifests' objects, which `removed` then no
        /// longer needs to hold.
        forgotten: Vec<u64>,
    },
    /// Name version `version` as snapshot `name`; `None`: the version the
    /// commit builds on — the newest when it lands, which needs no read
    /// before it (see [`Change::on_base`]).
    CreateSnapshot { name: String, version: Option<u64>, created_at_ms: u64 },
    /// Forget snapshot `name`.
    DropSnapshot { name: String, if_exists: bool },
    /// Move the GC horizon (VACUUM): valid only if the GC state, the
    /// snapshots and the restores are still what the VACUUM computed its
    /// deletions from (`expected`).
    Vacuum { gc: GcState, expected: Box<(GcState, BTreeMap<String, SnapshotEntry>, Vec<RestoreRecord>)> },
    /// Make tables what they were at version `target` (RESTORE): `tables`
    /// are the target's entries of the tables restored (a name missing there
    /// is dropped), `expected` what each of those names was in the
    /// restoring transaction's snapshot (a concurrent change to one of them
    /// is a serialization failure).
    Restore {
        target: u64,
        tables: BTreeMap<String, Option<TableEntry>>,
        expected: BTreeMap<String, Expected>,
    },
    /// `ALTER DATABASE SET iceberg = on|off|v2|v3`: whether later commits
    /// write Iceberg metadata (`crate::iceberg`), and in which format
    /// version (`None`: unchanged).
    SetIceberg { on: bool, format: Option<u32> },
    /// `CREATE EXTERNAL TABLE`: a definition of files read in place; the
    /// name must be free among tables and external tables alike.
    CreateExternalTable { name: String, table: ExternalTable, if_not_exists: bool },
}

/// What a RESTORE expects of a table it replaces: absent, or this id at
/// this table version (as in the restoring transaction's snapshot).
pub type Expected = Option<(u64, u64)>;

/// A data object's new deletion vector.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VectorChange {
    /// The data object's key.
    pub object: u64,
    /// The manifest file that lists it (OPTIMIZE may stop listing it).
    pub manifest: u64,
    /// The vector the writer read the object with (`None`: no deleted
    /// rows). Committing needs it unchanged.
    pub base: Option<DeleteRef>,
    /// The new vector: `base` and the rows deleted now.
    pub vector: DeleteRef,
}

/// A data object that a rewrite replaces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RemovedObject {
    /// The data object's key.
    pub object: u64,
    /// The manifest file that lists it.
    pub manifest: u64,
    /// Its deletion vector when it was read (must be unchanged at commit).
    pub base: Option<DeleteRef>,
    /// Its live rows (all rows less the deleted ones) and its bytes.
    pub live_rows: u64,
    pub bytes: u64,
}

impl Change {
    /// The change as applied on version `base`: a snapshot of "the version
    /// the commit builds on" names `base`. Everything else is as staged.
    pub fn on_base(&self, base: u64) -> std::borrow::Cow<'_, Change> {
        match self {
            Change::CreateSnapshot { name, version: None, created_at_ms } => {
                std::borrow::Cow::Owned(Change::CreateSnapshot { name: name.clone(), version: Some(base), created_at_ms: *created_at_ms })
            }
            _ => std::borrow::Cow::Borrowed(self),
        }
    }

    /// For people reading the history: "DELETE 3 rows from t".
    pub fn describe(&self) -> String {
        match self {
            Change::CreateTable { name, manifest: None, .. } => format!("CREATE TABLE {name}"),
            Change::CreateTable { name, manifest: Some(m), .. } => format!("CREATE TABLE {name} with {} rows", m.rows),
            Change::DropTable { name, .. } => format!("DROP TABLE {name}"),
            Change::Append { name, manifest, .. } => format!("APPEND {} rows to {name}", manifest.rows),
            Change::Delete { name, vectors, .. } => {
                let rows: u64 = vectors.iter().map(|v| v.vector.rows - v.base.map_or(0, |b| b.rows)).sum();
                format!("DELETE {rows} rows from {name}")
            }
            Change::Rewrite { name, removed, .. } => format!("OPTIMIZE {name}: {} objects rewritten", removed.len()),
            Change::CreateSnapshot { name, version: Some(v), .. } => format!("CREATE SNAPSHOT {name} of version {v}"),
            Change::CreateSnapshot { name, version: None, .. } => format!("CREATE SNAPSHOT {name} of the version before"),
            Change::Vacuum { gc, .. } => format!("VACUUM: versions before {} expire", gc.horizon),
            Change::DropSnapshot { name, .. } => format!("DROP SNAPSHOT {name}"),
            Change::Restore { target, tables, .. } => {
                let names: Vec<&str> = tables.keys().map(String::as_str).collect();
                format!("RESTORE {} TO VERSION {target}", names.join(", "))
            }
            Change::SetIceberg { on: false, .. } => "ALTER DATABASE SET iceberg = off".into(),
            Change::SetIceberg { on: true, format: None } => "ALTER DATABASE SET iceberg = on".into(),
            Change::SetIceberg { on: true, format: Some(f) } => format!("ALTER DATABASE SET iceberg = v{f}"),
            Change::CreateExternalTable { name, table, .. } => format!("CREATE EXTERNAL TABLE {name} at {}", table.location),
        }
    }
}

/// Applies `change` to `version`, validating it against it. Returns whether
/// anything changed (`false`: IF [NOT] EXISTS matched, or nothing to
/// append). On a conflict `version` may be half changed: callers apply to a
/// copy.
pub fn apply(version: &mut CatalogVersion, change: &Change) -> Result<bool> {
    let tables = &mut version.tables;
    let external = &mut version.external;
    match change {
        Change::CreateExternalTable { name, table, if_not_exists } => {
            if tables.contains_key(name) || external.contains_key(name) {
                return if *if_not_exists { Ok(false) } else { Err(StorageError::TableExists(name.clone())) };
            }
            external.insert(name.clone(), table.clone());
            Ok(true)
        }
        // An external table is dropped by name (it has no id to tell a
        // re-created one apart: it holds no data).
        Change::DropTable { name, id: None, .. } if !tables.contains_key(name) && external.contains_key(name) => {
            external.remove(name);
            Ok(true)
        }
        Change::CreateTable { name, id, schema, if_not_exists, manifest } => {
            if tables.contains_key(name) || external.contains_key(name) {
                return if *if_not_exists { Ok(false) } else { Err(StorageError::TableExists(name.clone())) };
            }
            let mut entry = TableEntry {
                id: *id,
                schema: schema.clone(),
                table_version: 0,
                manifests: Vec::new(),
                extends_checkpoint: false,
                deletes: BTreeMap::new(),
                removed: Vec::new(),
                rows: 0,
                bytes: 0,
                objects: 0,
            };
            if let Some(m) = manifest {
                add_manifest(&mut entry, *m);
            }
            tables.insert(name.clone(), entry);
            Ok(true)
        }
        Change::DropTable { name, id, if_exists } => match (tables.get(name), id) {
            (None, None) if *if_exists => Ok(false),
            (None, None) => Err(StorageError::TableNotFound(name.clone())),
            (None, Some(_)) if *if_exists => Ok(false),
            (None, Some(_)) => Err(dropped(name)),
            (Some(t), Some(id)) if t.id != *id => Err(recreated(name)),
            (Some(_), _) => {
                tables.remove(name);
                Ok(true)
            }
        },
        Change::Append { name, table_id, manifest } => {
            let entry = same_table(tables, name, *table_id)?;
            if manifest.objects == 0 {
                return Ok(false);
            }
            add_manifest(entry, *manifest);
            entry.table_version += 1;
            Ok(true)
        }
        Change::Delete { name, table_id, vectors } => {
            let entry = same_table(tables, name, *table_id)?;
            if vectors.is_empty() {
                return Ok(false);
            }
            for v in vectors {
                unchanged_since_read(entry, name, v.object, v.manifest, v.base)?;
                let before = v.base.map_or(0, |b| b.rows);
                assert!(v.vector.rows >= before, "a deletion vector only grows");
                entry.rows -= v.vector.rows - before;
                entry.deletes.insert(v.object, v.vector);
            }
            entry.table_version += 1;
            Ok(true)
        }
        Change::Rewrite { name, table_id, removed, manifest, dropped_manifests, forgotten } => {
            let entry = same_table(tables, name, *table_id)?;
            if removed.is_empty() && manifest.is_none() && dropped_manifests.is_empty() {
                return Ok(false);
            }
            for r in removed {
                unchanged_since_read(entry, name, r.object, r.manifest, r.base)?;
                entry.deletes.remove(&r.object);
                entry.removed.push(r.object);
                entry.rows -= r.live_rows;
                entry.bytes -= r.bytes;
                entry.objects -= 1;
            }
            for key in dropped_manifests {
                let Some(i) = entry.manifests.iter().position(|m| m.key == *key) else {
                    return Err(StorageError::Serialization {
                        table: name.clone(),
                        reason: format!("manifest file {key:016x} was merged away by a concurrent OPTIMIZE"),
                    });
                };
                entry.manifests.remove(i);
            }
            let forgotten: std::collections::HashSet<u64> = forgotten.iter().copied().collect();
            let before = entry.removed.len();
            entry.removed.retain(|k| !forgotten.contains(k));
            assert_eq!(before - entry.removed.len(), forgotten.len(), "only removed objects are forgotten");
            if let Some(m) = manifest {
                add_manifest(entry, *m);
            }
            entry.table_version += 1;
            Ok(true)
        }
        Change::CreateSnapshot { name, version: v, created_at_ms } => {
            let Some(v) = *v else {
                return Err(StorageError::InvalidData(format!("snapshot {name}: the version it names was not resolved (Change::on_base)")));
            };
            if v == 0 {
                return Err(StorageError::InvalidData(format!("snapshot {name}: the database has no version yet to snapshot")));
            }
            if version.snapshots.contains_key(name) {
                return Err(StorageError::SnapshotExists(name.clone()));
            }
            not_expired(version, v)?;
            version.snapshots.insert(name.clone(), SnapshotEntry { version: v, created_at_ms: *created_at_ms });
            Ok(true)
        }
        Change::DropSnapshot { name, if_exists } => match version.snapshots.remove(name) {
            Some(_) => Ok(true),
            None if *if_exists => Ok(false),
            None => Err(StorageError::SnapshotNotFound(name.clone())),
        },
        Change::Restore { target, tables: restored, expected } => {
            let tables = {
                not_expired(version, *target)?;
                &mut version.tables
            };
            for (name, want) in expected {
                let now = tables.get(name).map(|t| (t.id, t.table_version));
                if now != *want {
                    return Err(StorageError::Serialization {
                        table: name.clone(),
                        reason: "the table was changed by a concurrent transaction since the RESTORE began".into(),
                    });
                }
            }
            for (name, entry) in restored {
                let current = tables.remove(name);
                if let Some(mut e) = entry.clone() {
                    // Table versions only grow, so readers never see one twice.
                    e.table_version = e.table_version.max(current.map_or(0, |c| c.table_version)) + 1;
                    tables.insert(name.clone(), e);
                }
            }
            version.restored_from = Some(*target);
            version.restores.push(RestoreRecord { version: version.version, target: *target });
            Ok(true)
        }
        Change::Vacuum { gc, expected } => {
            let (old_gc, snapshots, restores) = expected.as_ref();
            if version.gc != *old_gc || version.snapshots != *snapshots || version.restores != *restores {
                return Err(StorageError::Conflict {
                    table: "(database)".into(),
                    reason: "a concurrent VACUUM, snapshot or RESTORE committed while this VACUUM planned; run VACUUM again".into(),
                });
            }
            if gc.horizon < old_gc.horizon {
                return Err(StorageError::InvalidData(format!("VACUUM cannot move the horizon back from {} to {}", old_gc.horizon, gc.horizon)));
            }
            version.gc = gc.clone();
            version.restores.retain(|r| r.version > gc.horizon);
            Ok(true)
        }
        Change::SetIceberg { on, format } => {
            let changed = version.iceberg != Some(*on) || (format.is_some() && version.iceberg_format != *format);
            version.iceberg = Some(*on);
            if format.is_some() {
                version.iceberg_format = *format;
            }
            Ok(changed)
        }
    }
}

/// Fails unless version `v` is still kept: at or after the
/// garbage-collection horizon, or named by a snapshot.
fn not_expired(version: &CatalogVersion, v: u64) -> Result<()> {
    if v < version.gc.horizon && !version.snapshots.values().any(|s| s.version == v) {
        return Err(StorageError::VersionExpired { version: v, horizon: version.gc.horizon });
    }
    Ok(())
}

fn add_manifest(entry: &mut TableEntry, m: ManifestRef) {
    entry.manifests.push(m);
    entry.rows += m.rows;
    entry.bytes += m.bytes;
    entry.objects += m.objects;
}

fn dropped(name: &str) -> StorageError {
    StorageError::Conflict { table: name.to_string(), reason: "the table was dropped by a concurrent transaction".into() }
}

fn recreated(name: &str) -> StorageError {
    StorageError::Conflict { table: name.to_string(), reason: "the table was dropped and re-created by a concurrent transaction".into() }
}

/// The table `name`, if it is still the one with id `id`.
fn same_table<'a>(tables: &'a mut BTreeMap<String, TableEntry>, name: &str, id: u64) -> Result<&'a mut TableEntry> {
    match tables.get_mut(name) {
        None => Err(dropped(name)),
        Some(t) if t.id != id => Err(recreated(name)),
        Some(t) => Ok(t),
    }
}

/// Fails with a serialization error unless data object `object` (listed by
/// manifest file `manifest`) is still in the table with the deletion vector
/// `base` its writer read it with.
fn unchanged_since_read(entry: &TableEntry, name: &str, object: u64, manifest: u64, base: Option<DeleteRef>) -> Result<()> {
    let serialization = |what: &str| StorageError::Serialization {
        table: name.to_string(),
        reason: format!("data object {object:016x} {what} by a concurrent transaction since this transaction's snapshot"),
    };
    if entry.removed.contains(&object) || !entry.manifests.iter().any(|m| m.key == manifest) {
        return Err(serialization("was rewritten"));
    }
    if entry.deletes.get(&object).copied() != base {
        return Err(serialization("had rows deleted or updated"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::datatypes::{DataType, Field};

    fn create(id: u64) -> Change {
        let schema = Schema::new(vec![Field::new("x", DataType::Int64, false)]);
        let manifest = Some(ManifestRef { key: 10, objects: 2, rows: 100, bytes: 1000, checksum: None });
        Change::CreateTable { name: "t".into(), id, schema, if_not_exists: false, manifest }
    }

    fn delete(base: Option<DeleteRef>, key: u64, rows: u64) -> Change {
        Change::Delete { name: "t".into(), table_id: 1, vectors: vec![VectorChange { object: 5, manifest: 10, base, vector: DeleteRef { key, rows, checksum: None } }] }
    }

    #[test]
    fn appends_commute_but_two_deletes_from_one_object_do_not() {
        let mut v = CatalogVersion::default();
        assert!(apply(&mut v, &create(1)).unwrap());
        let append = |key| Change::Append { name: "t".into(), table_id: 1, manifest: ManifestRef { key, objects: 1, rows: 7, bytes: 70, checksum: None } };
        // Two transactions from the same snapshot: both appends land.
        apply(&mut v, &append(11)).unwrap();
        apply(&mut v, &append(12)).unwrap();
        assert_eq!(v.tables["t"].rows, 114);
        // Both delete from object 5, starting from no vector: the first wins.
        apply(&mut v, &delete(None, 20, 3)).unwrap();
        assert_eq!(v.tables["t"].rows, 111);
        let err = apply(&mut v, &delete(None, 21, 1)).unwrap_err();
        assert!(matches!(err, StorageError::Serialization { .. }), "{err}");
        assert!(err.to_string().contains("table 't'"), "{err}");
        // A delete that read the winner's vector goes on top of it.
        apply(&mut v, &delete(Some(DeleteRef { key: 20, rows: 3, checksum: None }), 22, 5)).unwrap();
        assert_eq!(v.tables["t"].rows, 109);
    }

    #[test]
    fn a_commit_retires_what_it_stops_referencing() {
        let mut base = CatalogVersion::default();
        apply(&mut base, &create(1)).unwrap();
        apply(&mut base, &delete(None, 20, 3)).unwrap();
        let mut next = base.clone();
        let later = delete(Some(DeleteRef { key: 20, rows: 3, checksum: None }), 21, 4);
        apply(&mut next, &later).unwrap();
        assert_eq!(retired(&base, &next, &[later]), Retired { vectors: vec![20], ..Default::default() });
        let rewrite = Change::Rewrite {
            name: "t".into(),
            table_id: 1,
            removed: vec![RemovedObject { object: 5, manifest: 10, base: Some(DeleteRef { key: 21, rows: 4, checksum: None }), live_rows: 46, bytes: 500 }],
            manifest: None,
            dropped_manifests: vec![10],
            forgotten: vec![5],
        };
        let mut optimized = next.clone();
        apply(&mut optimized, &rewrite).unwrap();
        let r = retired(&next, &optimized, &[rewrite]);
        assert_eq!((r.manifests, r.vectors), (vec![10], vec![21]));
        let mut dropped = next.clone();
        let drop = Change::DropTable { name: "t".into(), id: None, if_exists: false };
        apply(&mut dropped, &drop).unwrap();
        assert_eq!(retired(&next, &dropped, &[drop]), Retired { manifests: vec![10], vectors: vec![21], objects: vec![] });
    }

    #[test]
    fn a_restore_conflicts_with_a_concurrent_change_and_expired_versions_are_refused() {
        let mut v = CatalogVersion::default();
        apply(&mut v, &create(1)).unwrap();
        let target = v.clone();
        let expected: BTreeMap<String, Expected> = [("t".to_string(), Some((1, 0)))].into();
        let restore = Change::Restore { target: 1, tables: target.tables.iter().map(|(n, t)| (n.clone(), Some(t.clone()))).collect(), expected };
        // Someone appended since the restorer's snapshot.
        let mut moved = v.clone();
        apply(&mut moved, &Change::Append { name: "t".into(), table_id: 1, manifest: ManifestRef { key: 11, objects: 1, rows: 1, bytes: 1, checksum: None } }).unwrap();
        assert!(matches!(apply(&mut moved, &restore), Err(StorageError::Serialization { .. })));
        apply(&mut v.clone(), &restore).unwrap();
        v.gc.horizon = 2;
        assert!(matches!(apply(&mut v.clone(), &restore), Err(StorageError::VersionExpired { version: 1, horizon: 2 })));
        let snapshot = Change::CreateSnapshot { name: "s".into(), version: Some(1), created_at_ms: 0 };
        assert!(matches!(apply(&mut v, &snapshot), Err(StorageError::VersionExpired { .. })));
    }

    #[test]
    fn a_rewrite_conflicts_with_a_delete_and_a_recreated_table_with_everything() {
        let mut v = CatalogVersion::default();
        apply(&mut v, &create(1)).unwrap();
        apply(&mut v, &delete(None, 20, 3)).unwrap();
        let rewrite = Change::Rewrite {
            name: "t".into(),
            table_id: 1,
            removed: vec![RemovedObject { object: 5, manifest: 10, base: None, live_rows: 50, bytes: 500 }],
            manifest: None,
            dropped_manifests: Vec::new(),
            forgotten: Vec::new(),
        };
        assert!(matches!(apply(&mut v.clone(), &rewrite), Err(StorageError::Serialization { .. })));
        let drop = Change::DropTable { name: "t".into(), id: Some(1), if_exists: false };
        apply(&mut v, &drop).unwrap();
        apply(&mut v, &create(2)).unwrap();
        assert!(matches!(apply(&mut v, &delete(None, 30, 1)), Err(StorageError::Conflict { .. })));
        assert!(matches!(apply(&mut v, &drop), Err(StorageError::Conflict { .. })));
    }
}

/// What `next` stopped referencing that `base` referenced; `changes` name
/// the manifest file of each object a rewrite removed.
pub fn retired(base: &CatalogVersion, next: &CatalogVersion, changes: &[Change]) -> Retired {
    let mut out = Retired::default();
    let listing: std::collections::HashMap<u64, u64> = changes
        .iter()
        .flat_map(|c| match c {
            Change::Rewrite { removed, .. } => removed.iter().map(|r| (r.object, r.manifest)).collect::<Vec<_>>(),
            _ => Vec::new(),
        })
        .collect();
    for (name, old) in &base.tables {
        let new = next.tables.get(name).filter(|t| t.id == old.id);
        let keep_manifests: std::collections::HashSet<u64> = new.map(|t| t.manifests.iter().map(|m| m.key).collect()).unwrap_or_default();
        let keep_vectors: std::collections::HashSet<u64> = new.map(|t| t.deletes.values().map(|d| d.key).collect()).unwrap_or_default();
        out.manifests.extend(old.manifests.iter().map(|m| m.key).filter(|k| !keep_manifests.contains(k)));
        out.vectors.extend(old.deletes.values().map(|d| d.key).filter(|k| !keep_vectors.contains(k)));
        if let Some(new) = new {
            let before: std::collections::HashSet<u64> = old.removed.iter().copied().collect();
            out.objects.extend(new.removed.iter().filter(|k| !before.contains(k)).map(|k| [*k, listing.get(k).copied().unwrap_or(0)]));
        }
    }
    out
}
