//! Every table readable as an Apache Iceberg table by other engines
//! (DuckDB, Spark, Trino, pyiceberg), with no data copied.
//!
//! After a commit lands, the tables it changed get Iceberg format-2
//! metadata that points at blobhouse's own Parquet objects by absolute
//! URI. Nothing is ever rewritten: every object below is created with
//! put-if-absent under a name used once, like everything else blobhouse
//! writes.
//!
//! ```text
//! iceberg/tables/<table id:016x>/metadata/v<version>.metadata.json   table metadata, snapshot <version>
//! iceberg/tables/<table id:016x>/metadata/snap-<version>.avro        its manifest list
//! iceberg/objects/<hhhh>/<manifest key:016x>.m.avro                  data manifest: the objects of one blobhouse manifest
//! iceberg/objects/<hhhh>/<manifest key:016x>-r<hash:016x>.m.avro     the same, less objects OPTIMIZE removed
//! iceberg/objects/<hhhh>/<vector key:016x>.pos.parquet               position delete file of one deletion vector
//! iceberg/objects/<hhhh>/<vector key:016x>.d.avro                    delete manifest listing it
//! ```
//!
//! - A blobhouse database version that changes a table is an Iceberg
//!   snapshot of it: snapshot id = sequence number = the version, time =
//!   the commit's, so `AT (VERSION => 12)` in DuckDB is blobhouse's version
//!   12 and `iceberg_scan(…, version => '12')` finds `v12.metadata.json`.
//! - Each manifest mirrors one blobhouse manifest file or one deletion
//!   vector, so a commit writes manifests only for what it added and the
//!   next snapshot's manifest list reuses the rest (carried over from the
//!   previous manifest list, which is read back when this process did not
//!   write it). Their objects live exactly as long as what they mirror:
//!   VACUUM deletes them with it.
//! - Column `i` has field id `i + 1` (no ALTER TABLE: ids are stable) and
//!   the table's `schema.name-mapping.default` maps names to ids for data
//!   objects written without Parquet field ids.
//! - The metadata is written after the commit, so it only ever names
//!   committed objects; a crash between the two leaves a version without
//!   Iceberg metadata, which the table's next commit (or `ALTER DATABASE
//!   SET iceberg = on`) covers. A failure to write it never fails the
//!   commit: it is kept as [`Publisher::last_error`] and shown by SHOW
//!   TABLES.
//!
//! Why no crate: iceberg-rust's releases need another arrow and DataFusion
//! than ours (arrow 58 / DataFusion 53), and what is written here is a
//! mapping of blobhouse's own layout — its manifests, deletion vectors and
//! versions — onto Iceberg's, which no library knows.

pub mod avro;
pub mod deletes;
pub mod schema;

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use futures::TryStreamExt;
use serde_json::{Value as Json, json};
use twox_hash::XxHash3_64;

use crate::database::Database;
use crate::error::{Result, StorageError};
use crate::format::{CatalogVersion, DataObject, TableEntry};
use crate::keys::object_name;
use avro::Value;

/// The folder of everything Iceberg under a database.
pub const DIR: &str = "iceberg";
/// Snapshots a table's metadata lists besides those VACUUM must keep: a
/// metadata file grows with each, and is written by every commit of the
/// table. Older snapshots stay readable through their own metadata file.
pub const MAX_SNAPSHOTS: usize = 20;

/// A table's Iceberg folder (its Iceberg `location`), under the database.
pub fn table_dir(table_id: u64) -> String {
    format!("{DIR}/tables/{table_id:016x}")
}

/// The metadata file of a table's snapshot `version`, under the database.
pub fn metadata_path(table_id: u64, version: u64) -> String {
    format!("{}/metadata/v{version}.metadata.json", table_dir(table_id))
}

fn list_path(table_id: u64, version: u64) -> String {
    format!("{}/metadata/snap-{version}.avro", table_dir(table_id))
}

/// The name of an Iceberg object mirroring blobhouse object `key`.
fn mirror(key: u64, ext: &str) -> String {
    format!("{DIR}/{}", object_name(key, ext))
}

/// Writes the Iceberg metadata of what commits change, and remembers the
/// newest metadata of each table it wrote or read.
#[derive(Debug)]
pub struct Publisher {
    /// Whether a database whose versions never said otherwise writes it
    /// (its marker's `iceberg`).
    default_on: bool,
    tables: Mutex<HashMap<u64, Arc<TableState>>>,
    last_error: Mutex<Option<String>>,
}

impl Publisher {
    pub(crate) fn new(default_on: bool) -> Publisher {
        Publisher { default_on, tables: Mutex::new(HashMap::new()), last_error: Mutex::new(None) }
    }

    /// The last failure to write Iceberg metadata after a commit (the
    /// commit itself stood), until a later write succeeds.
    pub fn last_error(&self) -> Option<String> {
        self.last_error.lock().expect("iceberg error").clone()
    }
}

/// A table's Iceberg metadata at one snapshot, as written.
#[derive(Debug)]
pub struct TableState {
    /// The snapshot: the database version the metadata was written for.
    pub version: u64,
    /// The blobhouse table version it shows.
    pub table_version: u64,
    /// The metadata file, relative to the database.
    pub path: String,
    /// Its content.
    pub metadata: Json,
    list: Vec<ListEntry>,
}

/// One manifest of a manifest list.
#[derive(Debug, Clone)]
struct ListEntry {
    path: String,
    length: i64,
    /// 0: data, 1: deletes.
    content: i32,
    sequence: i64,
    added_snapshot: i64,
    files: i32,
    rows: i64,
}

impl ListEntry {
    fn to_avro(&self) -> Value {
        Value::Record(vec![
            Value::String(self.path.clone()),
            Value::Long(self.length),
            Value::Int(0),
            Value::Int(self.content),
            Value::Long(self.sequence),
            Value::Long(self.sequence),
            Value::Long(self.added_snapshot),
            Value::Int(self.files),
            Value::Int(0),
            Value::Int(0),
            Value::Long(self.rows),
            Value::Long(0),
            Value::Long(0),
            Value::some(Value::Array(Vec::new())),
            Value::none(),
        ])
    }

    fn from_avro(v: &Value) -> Option<ListEntry> {
        let Value::Record(f) = v else { return None };
        let int = |i: usize| f.get(i).and_then(Value::as_long);
        Some(ListEntry {
            path: f.first()?.as_str()?.to_string(),
            length: int(1)?,
            content: int(3)? as i32,
            sequence: int(4)?,
            added_snapshot: int(6)?,
            files: int(7)? as i32,
            rows: int(10)?,
        })
    }
}

impl Database {
    /// Whether commits on top of `version` write Iceberg metadata: as
    /// `ALTER DATABASE SET iceberg` last said, else the database's default;
    /// never for an encrypted database, whose objects other engines cannot
    /// read.
    pub fn iceberg_enabled(&self, version: &CatalogVersion) -> bool {
        self.keyring().is_none() && version.iceberg.unwrap_or(self.iceberg.default_on)
    }

    /// The last failure to write Iceberg metadata (see [`Publisher`]).
    pub fn iceberg_error(&self) -> Option<String> {
        self.iceberg.last_error()
    }

    /// The full URI of an object of the database, as Iceberg metadata
    /// names it.
    pub fn object_uri(&self, relative: &str) -> String {
        self.location().display(&self.location().child(relative))
    }
}

/// After version `next` was committed on `base`: writes the Iceberg
/// metadata of every table whose content changed (of every table, when
/// this commit turned Iceberg on). Failures are kept, not returned: the
/// commit stands either way.
pub(crate) async fn publish_commit(db: &Database, base: &CatalogVersion, next: &CatalogVersion) {
    if !db.iceberg_enabled(next) {
        return;
    }
    let all = !db.iceberg_enabled(base);
    let mut failure = None;
    for (name, entry) in &next.tables {
        let same = base.tables.get(name).is_some_and(|b| b.id == entry.id && b.table_version == entry.table_version);
        if same && !all {
            continue;
        }
        if let Err(e) = publish_table(db, next, name, entry).await {
            failure = Some(e.to_string());
        }
    }
    *db.iceberg.last_error.lock().expect("iceberg error") = failure;
}

/// Writes the Iceberg metadata of every table of `version` that has none
/// for its current content (a database that had Iceberg off, or a crash
/// between a commit and its metadata). Returns each table with the path of
/// its metadata, or why it has none.
pub async fn publish_all(db: &Database, version: &CatalogVersion) -> Vec<(String, std::result::Result<String, String>)> {
    let mut out = Vec::new();
    for (name, entry) in &version.tables {
        let r = publish_table(db, version, name, entry).await.map(|s| db.object_uri(&s.path)).map_err(|e| e.to_string());
        out.push((name.clone(), r));
    }
    out
}

/// The Iceberg metadata of table `name` at `version`, if it was written
/// for the table's content at that version. `Err` says why it cannot have
/// any (a column without an Iceberg type).
pub async fn current(db: &Database, version: &CatalogVersion, name: &str) -> Result<Option<Arc<TableState>>> {
    let Some(entry) = version.tables.get(name) else { return Err(StorageError::TableNotFound(name.to_string())) };
    schema::table_schema(&entry.schema).map_err(|reason| StorageError::Iceberg { table: name.to_string(), reason })?;
    Ok(previous(db, entry.id, version.version + 1).await.filter(|s| s.table_version == entry.table_version))
}

/// Writes the metadata of table `name` (`entry`) as snapshot
/// `version.version`, unless its newest metadata already shows this
/// content.
async fn publish_table(db: &Database, version: &CatalogVersion, name: &str, entry: &TableEntry) -> Result<Arc<TableState>> {
    let fail = |reason: String| StorageError::Iceberg { table: name.to_string(), reason };
    let table_schema = schema::table_schema(&entry.schema).map_err(&fail)?;
    let v = version.version;
    let prev = previous(db, entry.id, v + 1).await;
    if let Some(p) = &prev
        && (p.table_version == entry.table_version || p.version == v)
    {
        return Ok(p.clone());
    }
    let carried: HashMap<&str, &ListEntry> = prev.iter().flat_map(|p| p.list.iter().map(|e| (e.path.as_str(), e))).collect();
    let header = |content: &str| {
        vec![
            ("schema", table_schema.to_string()),
            ("schema-id", "0".to_string()),
            ("partition-spec", "[]".to_string()),
            ("partition-spec-id", "0".to_string()),
            ("format-version", "2".to_string()),
            ("content", content.to_string()),
        ]
    };
    let entry_schema = avro::parse_schema(schema::MANIFEST_ENTRY).map_err(|e| fail(e.to_string()))?;
    let data = db.table_data(entry).await?;
    let seq = v as i64;
    let mut list = Vec::new();
    let (mut added_files, mut added_deletes) = (0, 0);

    // Data: one manifest per blobhouse manifest file with live objects.
    let mut live: HashMap<u64, Vec<&DataObject>> = HashMap::new();
    for l in &data.objects {
        live.entry(l.manifest).or_default().push(data.object(l));
    }
    for m in &entry.manifests {
        let Some(objects) = live.get(&m.key) else { continue };
        let rel = if objects.len() as u64 == m.objects {
            mirror(m.key, "m.avro")
        } else {
            let keys: Vec<u8> = objects.iter().flat_map(|o| o.key.to_le_bytes()).collect();
            let name = object_name(m.key, "m.avro");
            format!("{DIR}/{}-r{:016x}.m.avro", name.trim_end_matches(".m.avro"), XxHash3_64::oneshot(&keys))
        };
        let uri = db.object_uri(&rel);
        if let Some(e) = carried.get(uri.as_str()) {
            list.push((*e).clone());
            continue;
        }
        let records: Vec<Value> = objects.iter().map(|o| data_file_entry(0, &db.object_uri(&o.path), o.rows as i64, o.size as i64, None)).collect();
        let bytes = avro::write_file(schema::MANIFEST_ENTRY, &entry_schema, &header("data"), &records, sync_marker(&rel)).map_err(|e| fail(e.to_string()))?;
        let length = put_derived(db, &rel, bytes).await?;
        added_files += objects.len();
        list.push(ListEntry { path: uri, length, content: 0, sequence: seq, added_snapshot: seq, files: objects.len() as i32, rows: objects.iter().map(|o| o.rows as i64).sum() });
    }

    // Deletes: a position delete file and its manifest per deletion vector.
    for l in &data.objects {
        let (Some(d), Some(deleted)) = (l.vector, &l.deleted) else { continue };
        let rel = mirror(d.key, "d.avro");
        let uri = db.object_uri(&rel);
        if let Some(e) = carried.get(uri.as_str()) {
            list.push((*e).clone());
            continue;
        }
        let target = db.object_uri(&data.object(l).path);
        let file = deletes::position_delete_file(&target, deleted).map_err(|e| fail(format!("position delete file: {e}")))?;
        let file_rel = mirror(d.key, "pos.parquet");
        let size = put_derived(db, &file_rel, file).await?;
        let record = data_file_entry(1, &db.object_uri(&file_rel), deleted.len() as i64, size, Some(&target));
        let bytes = avro::write_file(schema::MANIFEST_ENTRY, &entry_schema, &header("deletes"), &[record], sync_marker(&rel)).map_err(|e| fail(e.to_string()))?;
        let length = put_derived(db, &rel, bytes).await?;
        added_deletes += 1;
        list.push(ListEntry { path: uri, length, content: 1, sequence: seq, added_snapshot: seq, files: 1, rows: deleted.len() as i64 });
    }

    // The manifest list.
    let parent = prev.as_ref().map(|p| p.version);
    let list_rel = list_path(entry.id, v);
    let list_schema = avro::parse_schema(schema::MANIFEST_FILE).map_err(|e| fail(e.to_string()))?;
    let list_header = vec![
        ("snapshot-id", v.to_string()),
        ("parent-snapshot-id", parent.map_or("null".to_string(), |p| p.to_string())),
        ("sequence-number", v.to_string()),
        ("format-version", "2".to_string()),
    ];
    let records: Vec<Value> = list.iter().map(ListEntry::to_avro).collect();
    let bytes = avro::write_file(schema::MANIFEST_FILE, &list_schema, &list_header, &records, sync_marker(&list_rel)).map_err(|e| fail(e.to_string()))?;
    put_derived(db, &list_rel, bytes).await?;

    // The table metadata.
    let operation = match (added_files > 0, added_deletes > 0) {
        (true, false) => "append",
        (false, true) => "delete",
        _ => "overwrite",
    };
    let live_rows: i64 = data.rows() as i64;
    let snapshot = json!({
        "snapshot-id": v,
        "sequence-number": v,
        "timestamp-ms": version.committed_at_ms,
        "manifest-list": db.object_uri(&list_rel),
        "summary": {
            "operation": operation,
            "added-data-files": added_files.to_string(),
            "added-position-delete-files": added_deletes.to_string(),
            "total-records": (live_rows + data.objects.iter().map(|l| l.vector.map_or(0, |d| d.rows as i64)).sum::<i64>()).to_string(),
            "total-data-files": data.objects.len().to_string(),
            "total-position-deletes": data.objects.iter().map(|l| l.vector.map_or(0, |d| d.rows)).sum::<u64>().to_string(),
            "blobhouse-version": v.to_string(),
            "blobhouse-live-rows": live_rows.to_string(),
        },
        "schema-id": 0,
    });
    let mut snapshot = snapshot;
    if let Some(p) = parent {
        snapshot["parent-snapshot-id"] = json!(p);
    }
    let mut snapshots: Vec<Json> = prev.as_ref().and_then(|p| p.metadata["snapshots"].as_array().cloned()).unwrap_or_default();
    snapshots.push(snapshot);
    let ids: Vec<u64> = snapshots.iter().filter_map(|s| s["snapshot-id"].as_u64()).collect();
    let pins: Vec<u64> = version.snapshots.values().map(|s| s.version).chain([version.gc.horizon]).collect();
    let keep = kept(&ids, version.gc.horizon, &pins, MAX_SNAPSHOTS);
    snapshots.retain(|s| s["snapshot-id"].as_u64().is_some_and(|id| keep.contains(&id)));
    let log: Vec<Json> = snapshots.iter().map(|s| json!({"snapshot-id": s["snapshot-id"], "timestamp-ms": s["timestamp-ms"]})).collect();
    let metadata = json!({
        "format-version": 2,
        "table-uuid": table_uuid(db, entry.id),
        "location": db.object_uri(&table_dir(entry.id)),
        "last-sequence-number": v,
        "last-updated-ms": version.committed_at_ms,
        "last-column-id": entry.schema.fields().len(),
        "current-schema-id": 0,
        "schemas": [table_schema],
        "default-spec-id": 0,
        "partition-specs": [{"spec-id": 0, "fields": []}],
        "last-partition-id": 999,
        "default-sort-order-id": 0,
        "sort-orders": [{"order-id": 0, "fields": []}],
        "properties": {
            "schema.name-mapping.default": schema::name_mapping(&entry.schema),
            "blobhouse.table": name,
            "blobhouse.table-id": entry.id.to_string(),
            "blobhouse.table-version": entry.table_version.to_string(),
        },
        "current-snapshot-id": v,
        "refs": {"main": {"snapshot-id": v, "type": "branch"}},
        "snapshots": snapshots,
        "snapshot-log": log,
        "metadata-log": [],
    });
    crate::failpoint::hit("iceberg.before_metadata")?;
    let path = metadata_path(entry.id, v);
    let body = serde_json::to_vec(&metadata).expect("JSON values serialise");
    put_derived(db, &path, body).await?;
    let state = Arc::new(TableState { version: v, table_version: entry.table_version, path, metadata, list });
    let mut tables = db.iceberg.tables.lock().expect("iceberg tables");
    if tables.get(&entry.id).is_none_or(|s| s.version < v) {
        tables.insert(entry.id, state.clone());
    }
    Ok(state)
}

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
    let root = loc.prefix.to_string();
    let relative = |m: &object_store::ObjectMeta| {
        let p = m.location.to_string();
        if root.is_empty() { p } else { p.strip_prefix(&format!("{root}/")).map(str::to_string).unwrap_or(p) }
    };
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
/// missing, each with the metadata naming it: of every metadata file, the
/// snapshots at or after the GC horizon and those still in force
/// ([`in_force`]) — the manifest list, its manifests, their data and
/// delete files. Other snapshots are expired, as blobhouse's own versions
/// before the horizon are. Empty when other engines can read every snapshot they
/// may ask for.
pub async fn dangling(db: &Database) -> Result<Vec<String>> {
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
    let entry_schema = avro::parse_schema(schema::MANIFEST_ENTRY).map_err(|e| StorageError::InvalidData(e.to_string()))?;
    let list_schema = avro::parse_schema(schema::MANIFEST_FILE).map_err(|e| StorageError::InvalidData(e.to_string()))?;
    let mut missing = Vec::new();
    let mut seen: std::collections::HashSet<String> = std::collections::HashSet::new();
    // The bytes at `uri`, or `None` (noted as missing) when it is not there.
    async fn fetch(db: &Database, base: &str, uri: &str, named_by: &str, missing: &mut Vec<String>) -> Result<Option<Bytes>> {
        let relative = uri.strip_prefix(base).unwrap_or(uri);
        match db.get(&db.location().child(relative)).await {
            Ok(b) => Ok(Some(b)),
            Err(StorageError::Store { source: object_store::Error::NotFound { .. }, .. }) => {
                missing.push(format!("{uri}, named by {named_by}"));
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
            let (_, manifests) = avro::read_file(&list, &list_schema).map_err(|e| StorageError::Corrupt { location: list_uri.to_string(), reason: e.to_string() })?;
            for manifest in manifests.iter().filter_map(ListEntry::from_avro) {
                if !seen.insert(manifest.path.clone()) {
                    continue;
                }
                let Some(bytes) = fetch(db, &base, &manifest.path, list_uri, &mut missing).await? else { continue };
                let (_, entries) = avro::read_file(&bytes, &entry_schema).map_err(|e| StorageError::Corrupt { location: manifest.path.clone(), reason: e.to_string() })?;
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
                        Err(object_store::Error::NotFound { .. }) => missing.push(format!("{path}, named by {}", manifest.path)),
                        Err(e) => return Err(StorageError::store("HEAD", loc.display(&at), e)),
                    }
                }
            }
        }
    }
    Ok(missing)
}

/// A `manifest_entry` record: an added data file (`content` 0) or position
/// delete file (1) whose sequence numbers and snapshot come from its
/// manifest's entry in the manifest list.
fn data_file_entry(content: i32, path: &str, rows: i64, size: i64, referenced: Option<&str>) -> Value {
    Value::Record(vec![
        Value::Int(1),
        Value::none(),
        Value::none(),
        Value::none(),
        Value::Record(vec![
            Value::Int(content),
            Value::String(path.to_string()),
            Value::String("PARQUET".into()),
            Value::Record(Vec::new()),
            Value::Long(rows),
            Value::Long(size),
            Value::none(),
            Value::none(),
            Value::none(),
            Value::none(),
            referenced.map_or_else(Value::none, |r| Value::some(Value::String(r.to_string()))),
        ]),
    ])
}

/// The snapshots of `ids` a table's new metadata file lists: the newest
/// `max` that have not expired (at or after the GC `horizon`), and the one
/// current at each of `pins` (the horizon, snapshots) — what readers may
/// still ask for through the newest file. A file grows with what it lists
/// and every commit of the table writes one; each older snapshot stays
/// readable through its own `v<n>.metadata.json` until VACUUM.
pub fn kept(ids: &[u64], horizon: u64, pins: &[u64], max: usize) -> BTreeSet<u64> {
    let sorted: BTreeSet<u64> = ids.iter().copied().collect();
    let current_at = |v: u64| sorted.range(..=v).next_back().copied();
    let mut keep: BTreeSet<u64> = sorted.range(horizon..).rev().take(max).copied().collect();
    keep.extend(pins.iter().filter_map(|p| current_at(*p)));
    keep
}

/// The newest Iceberg metadata of table `table_id` before version
/// `before`: remembered, or found by listing the table's folder and read
/// back with its manifest list. `None` when there is none or it cannot be
/// read (the next snapshot is then written from scratch).
async fn previous(db: &Database, table_id: u64, before: u64) -> Option<Arc<TableState>> {
    if let Some(s) = db.iceberg.tables.lock().expect("iceberg tables").get(&table_id)
        && s.version < before
    {
        return Some(s.clone());
    }
    let loc = db.location();
    let folder = loc.child(&format!("{}/metadata", table_dir(table_id)));
    let names: Vec<object_store::ObjectMeta> = loc.store.list(Some(&folder)).try_collect().await.ok()?;
    let newest = names
        .iter()
        .filter_map(|m| m.location.filename()?.strip_prefix('v')?.strip_suffix(".metadata.json")?.parse::<u64>().ok())
        .filter(|v| *v < before)
        .max()?;
    let path = metadata_path(table_id, newest);
    let metadata: Json = serde_json::from_slice(&db.get(&loc.child(&path)).await.ok()?).ok()?;
    let table_version = metadata["properties"]["blobhouse.table-version"].as_str()?.parse().ok()?;
    let list_bytes = db.get(&loc.child(&list_path(table_id, newest))).await.ok()?;
    let list_schema = avro::parse_schema(schema::MANIFEST_FILE).ok()?;
    let (_, records) = avro::read_file(&list_bytes, &list_schema).ok()?;
    let list = records.iter().map(ListEntry::from_avro).collect::<Option<Vec<_>>>()?;
    let state = Arc::new(TableState { version: newest, table_version, path, metadata, list });
    let mut tables = db.iceberg.tables.lock().expect("iceberg tables");
    if tables.get(&table_id).is_none_or(|s| s.version < newest) {
        tables.insert(table_id, state.clone());
    }
    Some(state)
}

/// Creates a derived object; when it exists already (written by another
/// process for the same content, or before a crash), its size is what the
/// store says. Returns its size.
async fn put_derived(db: &Database, relative: &str, body: Vec<u8>) -> Result<i64> {
    let len = body.len() as i64;
    match db.put_new(relative, Bytes::from(body)).await {
        Ok(()) => Ok(len),
        Err(StorageError::Store { source: object_store::Error::AlreadyExists { .. }, .. }) => {
            let path = db.location().child(relative);
            let meta = object_store::ObjectStoreExt::head(db.store().as_ref(), &path).await.map_err(|e| StorageError::store("HEAD", db.location().display(&path), e))?;
            Ok(meta.size as i64)
        }
        Err(e) => Err(e),
    }
}

/// A file's Avro sync marker, from its name: the same content always gives
/// the same bytes.
fn sync_marker(relative: &str) -> [u8; 16] {
    let a = XxHash3_64::oneshot_with_seed(1, relative.as_bytes());
    let b = XxHash3_64::oneshot_with_seed(2, relative.as_bytes());
    let mut s = [0u8; 16];
    s[..8].copy_from_slice(&a.to_le_bytes());
    s[8..].copy_from_slice(&b.to_le_bytes());
    s
}

/// A table's Iceberg UUID: the same for the life of the table (its id) in
/// this database (its identity), a version-4-shaped UUID.
fn table_uuid(db: &Database, table_id: u64) -> String {
    let seed = db.sealer().identity();
    let hi = XxHash3_64::oneshot_with_seed(seed, &table_id.to_le_bytes());
    let lo = XxHash3_64::oneshot_with_seed(seed ^ 0x5bd1_e995, &table_id.to_le_bytes());
    let mut b = [0u8; 16];
    b[..8].copy_from_slice(&hi.to_be_bytes());
    b[8..].copy_from_slice(&lo.to_be_bytes());
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!("{}-{}-{}-{}-{}", &h[..8], &h[8..12], &h[12..16], &h[16..20], &h[20..])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kept_snapshots_are_those_readers_may_ask_for() {
        let ids = [1, 3, 5, 8, 9];
        // No VACUUM yet: the newest `max`.
        assert_eq!(kept(&ids, 0, &[], 3), BTreeSet::from([5, 8, 9]));
        // Horizon 6: 8, 9; pinned at 6 (the table exists there): 5; a snapshot at version 4 pins 3.
        assert_eq!(kept(&ids, 6, &[6, 4], 20), BTreeSet::from([3, 5, 8, 9]));
        // A table dropped before the horizon: nothing pins it.
        assert_eq!(kept(&ids, 10, &[], 20), BTreeSet::new());
    }
}
