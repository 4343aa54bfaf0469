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
/// Version 3 seals every metadata object (`crate::seal`): its objects are
/// JSON as before, with one more member at the end.
pub const FORMAT_VERSION: u32 = 3;

/// The marker's `format_version` of an encrypted database: its metadata
/// objects are format [`FORMAT_VERSION`] inside their encryption, but a
/// build that knows no encryption must refuse the database ("upgrade
/// blobhouse") rather than take its ciphertext for damaged JSON.
pub const ENCRYPTED_FORMAT_VERSION: u32 = 4;

/// Name of the marker object at the root of every database.
pub const MARKER: &str = "blobhouse.json";
/// Folder of the version-1 database versions (and of the version that
/// upgraded a database to format 2).
pub const CATALOG_DIR: &str = "catalog";
/// Folder of the format-2 database versions, in buckets of
/// [`VERSIONS_PER_BUCKET`].
pub const LOG_DIR: &str = "log";
/// Versions per bucket of [`LOG_DIR`]: a bucket lists in one page (S3
/// returns 1,000 names per LIST), and so do the buckets of the first
/// million versions.
pub const VERSIONS_PER_BUCKET: u64 = 1000;
/// Extension of manifest files.
pub const MANIFEST_EXT: &str = "manifest.json";
/// Extension of deletion vectors.
pub const DV_EXT: &str = "dv";
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
    /// A random number drawn at creation: with the creation time, the
    /// database's identity, which seeds every seal (`crate::seal`) so that
    /// an object copied from another database is refused. `None` in
    /// databases created before format 3.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<u64>,
    /// Set in an encrypted database: the scheme
    /// ([`crate::encryption::SCHEME`]). Its keys are in the keyring objects
    /// (`encryption/`), wrapped; the marker holds no key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encryption: Option<String>,
    /// Whether commits write Iceberg metadata (`crate::iceberg`) until
    /// `ALTER DATABASE SET iceberg` says otherwise: `true` for plaintext
    /// databases on a store other engines can reach, created by a build
    /// that writes it; absent (off) in older databases.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub iceberg: Option<bool>,
}

/// One database version as the engine sees it: every table, resolved from
/// the version's object (a checkpoint, or a cumulative delta over one —
/// see `crate::versions`). Not stored as such.
#[derive(Debug, Clone, Default)]
pub struct CatalogVersion {
    /// Format version of the object this version was read from.
    pub format_version: u32,
    /// The version number; version 0 is the empty database and is not stored.
    pub version: u64,
    /// Commit time, milliseconds since the Unix epoch.
    pub committed_at_ms: u64,
    /// What the commit did, for people reading the history.
    pub operation: String,
    /// The tables of this version, by name (each with all its manifests).
    pub tables: BTreeMap<String, TableEntry>,
    /// External tables (`CREATE EXTERNAL TABLE`): files outside the
    /// database, read in place. Their names share the namespace of `tables`.
    pub external: BTreeMap<String, ExternalTable>,
    /// Named snapshots: versions kept readable until dropped.
    pub snapshots: BTreeMap<String, SnapshotEntry>,
    /// When this version is a RESTORE: the version it restored.
    pub restored_from: Option<u64>,
    /// Garbage collection's state: versions older than its horizon are
    /// expired (they cannot be read, restored or snapshotted).
    pub gc: GcState,
    /// RESTOREs committed after the GC horizon: the versions that may
    /// reference what older versions stopped referencing.
    pub restores: Vec<RestoreRecord>,
    /// What this version's commit stopped referencing.
    pub retired: Retired,
    /// `ALTER DATABASE SET iceberg = on|off`, once said: whether commits
    /// write Iceberg metadata (`None`: the marker's default).
    pub iceberg: Option<bool>,
    /// `ALTER DATABASE SET iceberg = v2|v3`: the Iceberg format version
    /// written (`None`: 2).
    pub iceberg_format: Option<u32>,
    /// The checkpoint the next commit writes its delta against; `None`
    /// makes the next commit write a checkpoint (a version-1 version, or
    /// the empty database).
    pub checkpoint: Option<std::sync::Arc<Checkpoint>>,
}

/// A checkpoint version's tables, kept so that later versions can be
/// written and read as changes against it.
#[derive(Debug, Clone, PartialEq)]
pub struct Checkpoint {
    /// The checkpoint's version number.
    pub version: u64,
    /// Size of its object: a delta is written only while it stays small
    /// beside it.
    pub bytes: usize,
    /// Its object's seal (`crate::seal`), which deltas record; `None` for
    /// checkpoints written before format 3.
    pub seal: Option<u64>,
    /// Every table of the checkpoint.
    pub tables: BTreeMap<String, TableEntry>,
}

/// Database version `v` as stored (format 2):
/// `log/<v / 1000:017>/<v:020>.json`, or `catalog/<v:020>.json` for the
/// one version that upgraded a version-1 database. Either a **checkpoint**
/// (`checkpoint` is `None`, `tables` holds every table) or a **delta**: the
/// tables created, replaced or changed since checkpoint `checkpoint` and
/// the checkpoint's tables since dropped, cumulatively — reading any version
/// takes two objects.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct VersionFile {
    /// Format version of this object.
    pub format_version: u32,
    /// The version number.
    pub version: u64,
    /// Commit time, milliseconds since the Unix epoch.
    pub committed_at_ms: u64,
    /// What the commit did, for people reading the history.
    pub operation: String,
    /// The checkpoint this delta applies to; `None` for a checkpoint.
    #[serde(default)]
    pub checkpoint: Option<u64>,
    /// Delta only: the checkpoint object's seal, so that a checkpoint
    /// replaced by another validly sealed object is refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint_seal: Option<u64>,
    /// Tables: all of them (checkpoint), or those changed since the
    /// checkpoint (delta).
    pub tables: BTreeMap<String, TableEntry>,
    /// Delta only: tables of the checkpoint that no longer exist.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dropped: Vec<String>,
    /// External tables, all of them (checkpoint and delta alike: the list
    /// is small). Absent in databases that never had one.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub external: BTreeMap<String, ExternalTable>,
    /// Named snapshots, all of them (checkpoint and delta alike: the list
    /// is small).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub snapshots: BTreeMap<String, SnapshotEntry>,
    /// This version restored the tables of that version (RESTORE).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restored_from: Option<u64>,
    /// Garbage collection's state (whole, in checkpoints and deltas).
    #[serde(default, skip_serializing_if = "GcState::is_empty")]
    pub gc: GcState,
    /// RESTOREs after the GC horizon (whole, in checkpoints and deltas).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub restores: Vec<RestoreRecord>,
    /// What this version's commit stopped referencing (this version only).
    #[serde(default, skip_serializing_if = "Retired::is_empty")]
    pub retired: Retired,
    /// `ALTER DATABASE SET iceberg` (whole, in checkpoints and deltas).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub iceberg: Option<bool>,
    /// Its format version, when `v2` or `v3` was said.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub iceberg_format: Option<u32>,
}

/// Garbage collection's state in the catalog (see `crate::gc`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GcState {
    /// Versions before this one are expired.
    pub horizon: u64,
    /// When the horizon was last moved (milliseconds since the epoch).
    pub at_ms: u64,
    /// Key of the newest VACUUM's list object (`objects/…/<key>.gc.json`):
    /// what it deletes and what it defers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub list: Option<u64>,
    /// The list object's seal (`crate::seal`): a damaged list would delete
    /// what it should keep.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub list_seal: Option<u64>,
}

impl GcState {
    fn is_empty(&self) -> bool {
        *self == GcState::default()
    }
}

/// A RESTORE: version `version` brought back the tables of `target`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RestoreRecord {
    pub version: u64,
    pub target: u64,
}

/// What one commit stopped referencing (SAP IQ's roll-forward bitmap):
/// candidates for garbage collection once no retained version, snapshot or
/// restore references them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Retired {
    /// Manifest files no longer listed, with every data object they list.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub manifests: Vec<u64>,
    /// Data objects no longer part of their table, each with the manifest
    /// file that lists it (0: unknown).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub objects: Vec<[u64; 2]>,
    /// Deletion vectors replaced or dropped.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub vectors: Vec<u64>,
}

impl Retired {
    pub fn is_empty(&self) -> bool {
        self.manifests.is_empty() && self.objects.is_empty() && self.vectors.is_empty()
    }

    /// Adds `other`'s items.
    pub fn extend(&mut self, other: &Retired) {
        self.manifests.extend(&other.manifests);
        self.objects.extend(&other.objects);
        self.vectors.extend(&other.vectors);
    }
}

/// An external table: files somewhere else (a local directory, any
/// bucket), read in place by every statement that names it. The database
/// holds only this definition — never the files, which other writers may
/// change between two statements (each statement lists them anew).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExternalTable {
    /// Where the files are: a directory (ending in `/`), one file, or a
    /// glob (`s3://bucket/sales/*.parquet`).
    pub location: String,
    /// `parquet` or `csv`.
    pub format: String,
    /// The format's options as given (`header`, `delimiter`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub options: BTreeMap<String, String>,
    /// The columns: those in the files, then the partition columns.
    pub schema: Schema,
    /// How many of the schema's last columns come from the path
    /// (`year=2024/…`, hive partitioning) rather than the files.
    #[serde(default)]
    pub partition_columns: usize,
    /// When it was created, milliseconds since the Unix epoch.
    pub created_at_ms: u64,
}

/// A named snapshot: a version kept readable (and restorable) until the
/// snapshot is dropped. Creating one copies nothing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotEntry {
    /// The version it names.
    pub version: u64,
    /// When it was created, milliseconds since the Unix epoch.
    pub created_at_ms: u64,
}

/// A table in a database version.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TableEntry {
    /// Unique id (a key from the key generator): tells a re-created table of the
    /// same name apart from the dropped one.
    pub id: u64,
    /// The table's Arrow schema (arrow-schema's serde representation).
    pub schema: Schema,
    /// Version of the table's contents; 0 when created, +1 per change.
    pub table_version: u64,
    /// The manifest files that list the table's data objects, oldest first:
    /// each commit that adds objects adds one.
    pub manifests: Vec<ManifestRef>,
    /// In a delta only: `manifests` are those added since the checkpoint,
    /// after the checkpoint's own for the same table id.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub extends_checkpoint: bool,
    /// Data objects with deleted rows: object key → its current deletion
    /// vector. In a delta that extends the checkpoint, only the entries
    /// added or replaced since the checkpoint.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub deletes: BTreeMap<u64, DeleteRef>,
    /// Keys of data objects listed by `manifests` that are no longer part
    /// of the table (rewritten by OPTIMIZE), in the order they were
    /// removed. In a delta that extends the checkpoint, only those removed
    /// since the checkpoint.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub removed: Vec<u64>,
    /// Live rows in the table version (rows of its objects less deleted rows).
    pub rows: u64,
    /// Bytes of all data objects of the table version.
    pub bytes: u64,
    /// Number of data objects.
    pub objects: u64,
}

/// A manifest file of a table, named by its key
/// (`objects/<hhhh>/<key:016x>.manifest.json`), with its totals.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ManifestRef {
    /// The file's key.
    pub key: u64,
    /// Data objects it lists.
    pub objects: u64,
    /// Their rows.
    pub rows: u64,
    /// Their bytes.
    pub bytes: u64,
    /// The manifest file's seal (`crate::seal`), checked when it is read:
    /// another manifest in its place, even a validly sealed one, is
    /// refused. `None` for manifests written before format 3.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checksum: Option<u64>,
}

/// A deletion vector: the object `objects/<hhhh>/<key:016x>.dv` holding the
/// positions of one data object's deleted rows as a Roaring bitmap
/// (portable serialization). A later DELETE on the same object writes a new
/// vector (the union) under a new key; none is ever modified.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeleteRef {
    /// The vector's key.
    pub key: u64,
    /// Rows it deletes.
    pub rows: u64,
    /// XXH3-64 of the vector's bytes as written ([`chunk_checksum`]): a
    /// damaged vector still decodes, with the same row count, into other
    /// rows, which would bring deleted rows back. `None` for vectors
    /// written before checksums were kept (checked by row count only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checksum: Option<u64>,
}

/// Only the format version of a metadata object, read first to choose how
/// to parse the rest (0 for objects without one: GC lists before format 3).
#[derive(Debug, Deserialize)]
pub struct FormatHeader {
    /// Format version of the object.
    #[serde(default)]
    pub format_version: u32,
}

/// A version-1 database version, `catalog/<version:020>.json` (read only).
#[derive(Debug, Clone, Deserialize)]
pub struct V1CatalogVersion {
    /// Always 1.
    pub format_version: u32,
    /// The version number.
    pub version: u64,
    /// Commit time, milliseconds since the Unix epoch.
    pub committed_at_ms: u64,
    /// What the commit did.
    pub operation: String,
    /// The tables, by name.
    pub tables: BTreeMap<String, V1TableEntry>,
}

/// A table in a version-1 database version: one manifest with every object.
#[derive(Debug, Clone, Deserialize)]
pub struct V1TableEntry {
    /// The table's id.
    pub id: u64,
    /// The table's Arrow schema.
    pub schema: Schema,
    /// Version of the table's contents.
    pub table_version: u64,
    /// Path of the table version's manifest, relative to the database root.
    pub manifest: String,
    /// Rows in the table version.
    pub rows: u64,
    /// Bytes of its data objects.
    pub bytes: u64,
    /// Number of data objects.
    pub objects: u64,
}

/// A manifest file: data objects with the metadata a scan needs to plan all
/// its range requests without reading Parquet footers. In format 2 a file
/// lists the objects one commit added (the table's objects are those of all
/// its files); a version-1 manifest listed all of a table version's objects
/// and is read as one such file.
#[derive(Debug, Clone, Serialize, Deserialize, Default)]
pub struct Manifest {
    /// Format version of this object.
    pub format_version: u32,
    /// The table's id.
    pub table_id: u64,
    /// The table version that added these objects (format 1: the table
    /// version it describes).
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
    /// The object's page index held in the manifest (per page: row range and
    /// min/max; Parquet keeps it outside the footer). Written by the builds
    /// of the fifteenth to twenty-third sessions; still honoured, so those
    /// databases keep their page pruning without a GET. Newer writers keep
    /// only [`DataObject::page_index_at`]: the bytes cost 0.13 % of the
    /// data in every manifest, read whenever a table version is opened.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub page_index: Option<PageIndex>,
    /// Where the object's page index lies: a scan whose filters can prune
    /// pages reads it from the object once (one range GET) and keeps it
    /// with the footer in the engine's metadata cache. `None` when no
    /// column chunk has more than one page (the zone maps then say all the
    /// page index would) and in objects written before it existed. Older
    /// builds ignore the field and decode such objects' row groups whole.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub page_index_at: Option<ByteRange>,
    /// Row groups, in file order.
    pub row_groups: Vec<RowGroupMeta>,
    /// XXH3-64 of the whole object ([`chunk_checksum`]): scans check each
    /// column chunk they read by its own checksum; this one lets
    /// `blobhouse verify` find damage anywhere, footer and page index
    /// included. `None` for objects written before it was kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checksum: Option<u64>,
    /// XXH3-64 of the footer's bytes (what `footer` holds, decoded): a
    /// storage node reads the footer from the object and decodes by it,
    /// so it checks it against this. `None` when written before.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub footer_checksum: Option<u64>,
    /// Whether the object is encrypted (Parquet Modular Encryption, an
    /// encrypted footer: the file ends in `PARE`, and `footer` holds its
    /// crypto metadata and encrypted footer).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub encrypted: bool,
}

impl DataObject {
    /// The object's footer decoded from the manifest's copy (`footer`,
    /// base64-decoded), decrypted with `decryption` when the object is
    /// encrypted; without the page index.
    pub fn decode_footer(&self, footer: &[u8], decryption: Option<&std::sync::Arc<parquet::encryption::decrypt::FileDecryptionProperties>>) -> parquet::errors::Result<parquet::file::metadata::ParquetMetaData> {
        decode_footer(footer, self.encrypted, decryption)
    }
}

/// A Parquet footer (the bytes before the length and magic) decoded,
/// without the page index: an encrypted one (`encrypted`: the file ends in
/// `PARE`) through `decryption`, or an error saying no key was given.
pub fn decode_footer(
    footer: &[u8],
    encrypted: bool,
    decryption: Option<&std::sync::Arc<parquet::encryption::decrypt::FileDecryptionProperties>>,
) -> parquet::errors::Result<parquet::file::metadata::ParquetMetaData> {
    if !encrypted {
        return parquet::file::metadata::ParquetMetaDataReader::decode_metadata(footer);
    }
    let decryption = decryption.ok_or_else(|| parquet::errors::ParquetError::General("the object is encrypted, and no key of its database was given".into()))?;
    let mut tail = Vec::with_capacity(footer.len() + 8);
    tail.extend_from_slice(footer);
    tail.extend_from_slice(&(footer.len() as u32).to_le_bytes());
    tail.extend_from_slice(b"PARE");
    parquet::file::metadata::ParquetMetaDataReader::new()
        .with_page_index_policy(parquet::file::metadata::PageIndexPolicy::Skip)
        .with_decryption_properties(Some(decryption.clone()))
        .parse_and_finish(&bytes::Bytes::from(tail))
}

/// The bytes of a data object's page index (its column indexes and offset
/// indexes, which Parquet writes together just before the footer).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PageIndex {
    /// Where the bytes start in the object.
    pub offset: u64,
    /// The bytes, base64.
    pub bytes: String,
}

/// A stretch of a data object's bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ByteRange {
    /// Where it starts in the object.
    pub offset: u64,
    /// How many bytes.
    pub length: u64,
    /// XXH3-64 of the bytes ([`chunk_checksum`]), checked when they are
    /// read: a damaged page index would prune pages that hold matching
    /// rows. `None` when written before checksums were kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checksum: Option<u64>,
}

impl ByteRange {
    /// As a range of offsets.
    pub fn range(&self) -> std::ops::Range<u64> {
        self.offset..self.offset + self.length
    }
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
    /// The inner boundaries of an equi-depth histogram of the chunk's
    /// values (same encoding as `min`), for the optimizer's row estimates
    /// ([`crate::histogram`]). `None` for types without a numeric order and
    /// for objects written before histograms were kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quantiles: Option<Vec<String>>,
    /// XXH3-64 of the chunk's bytes as written ([`chunk_checksum`]): every
    /// read from the store is checked against it, so a damaged byte fails
    /// the query naming the object and range instead of decoding into
    /// wrong values. `None` for objects written before checksums were
    /// kept (they are read unchecked).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checksum: Option<u64>,
    /// Checksums of the chunk's single pages (`crate::page_sums`, base64):
    /// a storage node fetching only the pages of selected rows checks
    /// them. Written for chunks of several pages; `None` otherwise and in
    /// objects written before.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pages: Option<String>,
}

impl ColumnChunkMeta {
    /// The chunk's byte range in its object.
    pub fn range(&self) -> std::ops::Range<u64> {
        self.offset..self.offset + self.length
    }
}

/// The checksum of a column chunk's bytes ([`ColumnChunkMeta::checksum`]).
/// XXH3-64: a few percent of the cost of decoding the same bytes, and the
/// hash the SSD tier already checks its entries with.
pub fn chunk_checksum(bytes: &[u8]) -> u64 {
    twox_hash::XxHash3_64::oneshot(bytes)
}

/// `ms` (since the Unix epoch) as `2026-11-23 05:00:00.000`, UTC.
pub fn format_ms(ms: u64) -> String {
    datafusion::arrow::temporal_conversions::timestamp_ms_to_datetime(ms as i64).map_or_else(|| format!("{ms} ms"), |t| t.format("%Y-%m-%d %H:%M:%S%.3f").to_string())
}

/// Milliseconds since the Unix epoch, now.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}
