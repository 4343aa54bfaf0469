//! The per-object metadata scans keep: Parquet footers (with their page
//! indexes) decoded from the manifest, and parsed zone maps, held in the
//! engine's memory budget.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use base64::Engine as _;
use datafusion::common::{DataFusionError, Result};
use datafusion::execution::memory_pool::{MemoryConsumer, MemoryPool, MemoryReservation};
use parquet::arrow::arrow_reader::ArrowReaderMetadata;
use parquet::file::metadata::ParquetMetaData;

use blobhouse_storage::chunks::with_page_index;
use blobhouse_storage::format::DataObject;
use blobhouse_storage::{Database, StorageError};

use crate::source::DataSource;
use crate::zone_maps::BoundsCache;

/// What scans decode from the manifest once per data object and keep:
/// Parquet footers by object path, and zone maps parsed into typed values
/// ([`BoundsCache`]). Objects are never rewritten, so an entry never goes
/// stale. Entries are held in the engine's memory budget (`FooterCache`,
/// `BoundsCache`); one the budget refuses is used for the scan at hand and
/// not kept.
#[derive(Debug)]
pub struct MetadataCache {
    footers: Mutex<HashMap<String, ArrowReaderMetadata>>,
    reservation: MemoryReservation,
    bounds: BoundsCache,
}

impl MetadataCache {
    /// An empty cache accounted in `pool`.
    pub fn new(pool: &Arc<dyn MemoryPool>) -> Self {
        MetadataCache { footers: Mutex::default(), reservation: MemoryConsumer::new("FooterCache").register(pool), bounds: BoundsCache::new(pool) }
    }

    /// The parsed zone maps.
    pub fn bounds(&self) -> &BoundsCache {
        &self.bounds
    }

    /// The object's footer as the manifest holds it, decoded once: with the
    /// page index when the manifest carries its bytes (older objects), else
    /// without (until [`MetadataCache::footer_with_page_index`] reads it).
    pub(super) fn footer(&self, db: &Database, object: &DataObject) -> Result<ArrowReaderMetadata> {
        if let Some(m) = self.footers.lock().expect("footer cache").get(&object.path) {
            return Ok(m.clone());
        }
        let location = db.location().display(&db.location().child(&object.path));
        let footer = base64::engine::general_purpose::STANDARD
            .decode(&object.footer)
            .map_err(|e| corrupt(&location, format!("footer is not base64: {e}")))?;
        let mut meta = object.decode_footer(&footer, db.decryption()).map_err(|e| corrupt(&location, format!("footer does not decode: {e}")))?;
        if meta.num_row_groups() != object.row_groups.len() {
            return Err(corrupt(&location, "footer and manifest disagree on the row groups".into()));
        }
        if let Some(index) = &object.page_index {
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(&index.bytes)
                .map_err(|e| corrupt(&location, format!("page index is not base64: {e}")))?;
            meta = with_page_index(meta, index.offset, bytes.into(), object.size, &location).map_err(|e| corrupt(&location, format!("page index does not decode: {e}")))?;
        }
        self.keep(&object.path, &location, meta)
    }

    /// The object's footer with its page index. When the manifest says only
    /// where the index lies, it is read from the object (one range GET) the
    /// first time and kept: `true` then. Objects without a page index come
    /// back as [`MetadataCache::footer`] gives them.
    pub(super) async fn footer_with_page_index(&self, db: &Database, source: &DataSource, object: &DataObject) -> Result<(ArrowReaderMetadata, bool)> {
        let footer = self.footer(db, object)?;
        let Some(at) = object.page_index_at else { return Ok((footer, false)) };
        if footer.metadata().offset_index().is_some() {
            return Ok((footer, false));
        }
        let path = db.location().child(&object.path);
        let location = db.location().display(&path);
        // What the manifest says about the index, or the index itself, is wrong.
        let damaged = |reason: String| DataFusionError::External(Box::new(StorageError::Corrupt { location: location.clone(), reason }));
        if at.range().end > object.size {
            return Err(damaged(format!("the manifest puts its page index at {:?}, past the object's {} bytes", at.range(), object.size)));
        }
        let read_index = || async {
            let read = source.get_ranges(&path, &location, &[at.range()]).await.map_err(|e| DataFusionError::External(Box::new(e)))?;
            Ok::<_, DataFusionError>(read.bytes.into_iter().next().expect("one range asked, one returned"))
        };
        let intact = |bytes: &bytes::Bytes| at.checksum.is_none_or(|sum| blobhouse_storage::format::chunk_checksum(bytes) == sum);
        let mut bytes = read_index().await?;
        if !intact(&bytes) {
            // Once more, in case the transfer damaged it.
            bytes = read_index().await?;
            if !intact(&bytes) {
                return Err(damaged(format!(
                    "its page index (bytes {}..{}) does not match the checksum written with it (read twice): the object is damaged, and pruning pages by it could skip matching rows",
                    at.offset,
                    at.offset + at.length
                )));
            }
        }
        let meta = with_page_index(footer.metadata().as_ref().clone(), at.offset, bytes, object.size, &location)
            .map_err(|e| damaged(format!("its page index (bytes {:?}, where the manifest puts it) does not decode: {e}", at.range())))?;
        Ok((self.keep(&object.path, &location, meta)?, true))
    }

    /// The footer of the object named `name` as a worker was sent it (a
    /// file tail, [`decode`] parsing it), decoded once and kept like the
    /// manifest's.
    pub(super) fn footer_from_tail(&self, name: &str, location: &str, decode: impl FnOnce() -> parquet::errors::Result<ParquetMetaData>) -> Result<ArrowReaderMetadata> {
        if let Some(m) = self.footers.lock().expect("footer cache").get(name) {
            return Ok(m.clone());
        }
        let meta = decode().map_err(|e| corrupt(location, format!("the footer sent with the scan does not decode: {e}")))?;
        self.keep(name, location, meta)
    }

    /// Keeps `meta` for `path` (replacing what was kept) if the memory
    /// budget allows, and returns it ready for the Arrow reader.
    fn keep(&self, path: &str, location: &str, meta: ParquetMetaData) -> Result<ArrowReaderMetadata> {
        let options = blobhouse_storage::writer::reader_options(&meta);
        let meta = ArrowReaderMetadata::try_new(Arc::new(meta), options).map_err(|e| corrupt(location, e.to_string()))?;
        if self.reservation.try_grow(meta.metadata().memory_size()).is_ok() {
            let old = self.footers.lock().expect("footer cache").insert(path.to_string(), meta.clone());
            if let Some(old) = old {
                // Two scans decoded the same footer at once, or the page
                // index was added: one copy is kept.
                self.reservation.shrink(old.metadata().memory_size());
            }
        }
        Ok(meta)
    }
}

/// A corrupt manifest entry or page index of the object at `location`.
fn corrupt(location: &str, reason: String) -> DataFusionError {
    DataFusionError::External(Box::new(StorageError::Corrupt { location: format!("manifest entry for {location}"), reason }))
}
