//! The on-store format: every object blobhouse writes, as serde types.
//!
//! `docs/storage-format.md` describes the same layout for people; the two must
//! agree. All metadata objects are JSON so that any tool can inspect a
//! database; data objects are standard Parquet.
//!
//! Compatibility rule: a reader accepts every `format_version` up to
//! [`FORMAT_VERSION`]; fields added later are optional (`#[serde(default)]`).

use std::collections::BTreeMap;

use datafusion::arrow::datatypes::Schema;
use serde::{Deserialize, Serialize};

/// The newest format version this build writes and the newest it reads.
pub const FORMAT_VERSION: u32 = 1;

/// Name of the marker object at the root of every database.
pub const MARKER: &str = "blobhouse.json";
/// Folder of the database versions (the catalog's commit log).
pub const CATALOG_DIR: &str = "catalog";
/// Folder of key-range leases.
pub const KEYS_DIR: &str = "keys";
/// Folder of data objects and manifests (under hashed sub-folders).
pub const OBJECTS_DIR: &str = "objects";

/// The marker object `blobhouse.json`: says "this prefix is a blobhouse
/// database" and which format it uses. Written once, at creation.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DatabaseMarker {
    /// Always `"blobhouse"`.
    pub format: String,
    /// Format version the database was created with.
    pub format_version: u32,
    /// Creation time, milliseconds since the Unix epoch.
    pub created_at_ms: u64,
}

/// One database version: `catalog/<version:020>.json`. The newest one is the
/// database's current state; committing means creating the next one with
/// put-if-absent, so exactly one writer can win each version number.
#[derive(Debug, Clone, Serialize, Deserialize, Default)]
pub struct CatalogVersion {
    /// Format version of this object.
    pub format_version: u32,
    /// The version number; version 0 is the empty database and is not stored.
    pub version: u64,
    /// Commit time, milliseconds since the Unix epoch.
    pub committed_at_ms: u64,
    /// What the commit did, for people reading the history.
    pub operation: String,
    /// The tables of this version, by name.
    pub tables: BTreeMap<String, TableEntry>,
}

/// A table as one database version sees it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TableEntry {
    /// Unique id (a key from the key generator): tells a re-created table of the
    /// same name apart from the dropped one.
    pub id: u64,
    /// The table's Arrow schema (arrow-schema's serde representation).
    pub schema: Schema,
    /// Version of the table's contents; 0 when created empty, +1 per change.
    pub table_version: u64,
    /// Path of the table version's [`Manifest`], relative to the database root.
    pub manifest: String,
    /// Rows in the table version.
    pub rows: u64,
    /// Bytes of all data objects of the table version.
    pub bytes: u64,
    /// Number of data objects.
    pub objects: u64,
}

/// A table version's manifest: every data object with the metadata a scan
/// needs to plan all its range requests without reading Parquet footers.
#[derive(Debug, Clone, Serialize, Deserialize, Default)]
pub struct Manifest {
    /// Format version of this object.
    pub format_version: u32,
    /// The table's id.
    pub table_id: u64,
    /// The table version this manifest describes.
    pub table_version: u64,
    /// The data objects, in the order they were added.
    pub objects: Vec<DataObject>,
}

/// One Parquet data object.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DataObject {
    /// Path relative to the database root.
    pub path: String,
    /// The object's key (from the key generator).
    pub key: u64,
    /// Size of the object in bytes.
    pub size: u64,
    /// Rows in the object.
    pub rows: u64,
    /// The Parquet footer (thrift `FileMetaData`), base64: lets a scan decode
    /// pages without GETting the footer from the object.
    pub footer: String,
    /// Row groups, in file order.
    pub row_groups: Vec<RowGroupMeta>,
}

/// One row group of a data object.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RowGroupMeta {
    /// Rows in the row group.
    pub rows: u64,
    /// One entry per top-level column of the table schema, in schema order.
    pub columns: Vec<ColumnChunkMeta>,
}

/// One column chunk: where its bytes are and its zone map.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ColumnChunkMeta {
    /// Byte offset of the chunk (dictionary page included) in the object.
    pub offset: u64,
    /// Length of the chunk in bytes.
    pub length: u64,
    /// Null values in the chunk, if known.
    pub nulls: Option<u64>,
    /// Smallest value (a lower bound), as text that casts back to the column's
    /// type; `None` when unknown.
    pub min: Option<String>,
    /// Largest value (an upper bound), same encoding as `min`.
    pub max: Option<String>,
}

impl ColumnChunkMeta {
    /// The chunk's byte range in its object.
    pub fn range(&self) -> std::ops::Range<u64> {
        self.offset..self.offset + self.length
    }
}

/// Milliseconds since the Unix epoch, now.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}
