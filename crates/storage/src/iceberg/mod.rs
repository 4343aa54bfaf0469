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
//!   commit: it is kept ([`Database::iceberg_failure`]), the statement's
//!   client is warned, and SHOW TABLES shows no metadata for the table.
//!
//! Why no crate: iceberg-rust's releases need another arrow and DataFusion
//! than ours (arrow 58 / DataFusion 53), and what is written here is a
//! mapping of blobhouse's own layout — its manifests, deletion vectors and
//! versions — onto Iceberg's, which no library knows.

pub mod avro;
mod collect;
pub mod deletes;
mod publish;
pub mod puffin;
pub mod schema;

pub use collect::dangling;
pub(crate) use collect::collect;
pub use publish::publish_all;
pub(crate) use publish::publish_commit;

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use futures::TryStreamExt;
use serde_json::Value as Json;
use twox_hash::XxHash3_64;

use crate::database::Database;
use crate::error::{Result, StorageError};
use crate::format::CatalogVersion;
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
    /// The version whose Iceberg metadata the last commit failed to write,
    /// and why.
    last_error: Mutex<Option<(u64, String)>>,
}

impl Publisher {
    pub(crate) fn new(default_on: bool) -> Publisher {
        Publisher { default_on, tables: Mutex::new(HashMap::new()), last_error: Mutex::new(None) }
    }

    /// The last failure to write Iceberg metadata after a commit (the
    /// commit itself stood): its version and why; cleared by the next
    /// commit that writes it.
    pub fn last_error(&self) -> Option<(u64, String)> {
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
    /// Format 3: the row id of the manifest's first row (data manifests).
    first_row_id: Option<i64>,
}

impl ListEntry {
    fn to_avro(&self, format: u32) -> Value {
        let mut fields = vec![
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
        ];
        if format >= 3 {
            fields.push(self.first_row_id.map_or_else(Value::none, |r| Value::some(Value::Long(r))));
        }
        Value::Record(fields)
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
            first_row_id: int(15),
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

    /// The Iceberg format version commits on top of `version` write (2
    /// unless `ALTER DATABASE SET iceberg = v3` said otherwise).
    pub fn iceberg_format(&self, version: &CatalogVersion) -> u32 {
        version.iceberg_format.unwrap_or(2)
    }

    /// Why the Iceberg metadata of committed version `version` could not
    /// be written (`None`: it was, or Iceberg is off): what a client is
    /// warned of after its commit.
    pub fn iceberg_failure(&self, version: u64) -> Option<String> {
        self.iceberg.last_error().filter(|(v, _)| *v == version).map(|(_, why)| why)
    }

    /// The full URI of an object of the database, as Iceberg metadata
    /// names it.
    pub fn object_uri(&self, relative: &str) -> String {
        self.location().display(&self.location().child(relative))
    }
}

/// The Iceberg metadata of table `name` at `version`, if it was written
/// for the table's content at that version. `Err` says why it cannot have
/// any (a column without an Iceberg type).
pub async fn current(db: &Database, version: &CatalogVersion, name: &str) -> Result<Option<Arc<TableState>>> {
    let Some(entry) = version.tables.get(name) else { return Err(StorageError::TableNotFound(name.to_string())) };
    schema::table_schema(&entry.schema, db.iceberg_format(version)).map_err(|reason| StorageError::Iceberg { table: name.to_string(), reason })?;
    Ok(previous(db, entry.id, version.version + 1).await.filter(|s| s.table_version == entry.table_version))
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
    let (_, records) = avro::read_file(&list_bytes).ok()?;
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
