//! blobhouse's storage layer: how a database lives in an object store.
//!
//! - [`location`]: database URL → object store + prefix.
//! - [`credentials`]: AWS named profiles and `credential_process`.
//! - [`keys`]: unique, monotonic object keys leased from the store itself.
//! - [`format`]: the serde types of every metadata object (see
//!   `docs/storage-format.md`).
//! - [`versions`]: the version log of format 2 — checkpoints and deltas.
//! - [`changes`]: what a transaction changes, and the validation that
//!   makes concurrent commits safe (snapshot isolation).
//! - [`database`]: the catalog's version log and atomic commits.
//! - [`transaction`]: a snapshot, its changes and its uploads.
//! - [`gc`]: VACUUM — what no retained version references is deleted.
//! - [`verify`]: checks every object a database references (`blobhouse
//!   verify`).
//! - [`writer`]: record batches → Parquet data objects with zone maps.
//! - [`encryption`]: encrypted databases — master keys, the keyring,
//!   sealed metadata, Parquet Modular Encryption of data objects.
//! - [`seal`]: seals on metadata objects: damage, swaps and replays are
//!   refused, naming the object.
//! - [`page_sums`]: checksums of single pages, for reads of some pages.
//! - [`iceberg`]: every table readable as an Iceberg table by other
//!   engines: metadata written after each commit, over the same objects.
//! - [`rows`]: which rows of a row group are decoded (page-index row
//!   selections) and where each decoded row sits in its object.
//!
//! Invariant of the whole layer: no object is ever written twice. Every PUT
//! uses put-if-absent; commits are the creation of the next catalog version.

pub mod changes;
pub mod chunks;
pub mod credentials;
pub mod database;
pub mod encryption;
pub mod error;
pub mod failpoint;
pub mod format;
pub mod gc;
pub mod histogram;
pub mod iceberg;
pub mod keys;
pub mod location;
pub mod page_sums;
pub mod rows;
pub mod seal;
pub mod transaction;
pub mod verify;
pub mod versions;
pub mod writer;

pub use changes::{Change, RemovedObject, VectorChange};
pub use database::{CommitOutcome, Database, LiveObject, TableData, UploadObserver, VersionSummary};
pub use transaction::Transaction;
pub use error::{Result, StorageError};
pub use location::{Location, StoreOptions, open_location};
pub use writer::{TableWriter, WriteOptions};
