//! Where a scan's bytes come from.
//!
//! Data ranges of object stores go through the download manager
//! (`blobhouse_io`): the engine presigns a URL per object with the store's
//! own `Signer` (object_store's S3 / GCS / Azure signing, no hand-written
//! crypto) and the manager fetches the ranges on its event loops, over HTTP
//! or HTTPS as the store's endpoint says. Local and in-memory stores are
//! read through object_store. Everything
//! else — listing, manifests, conditional puts, deletes — stays on
//! object_store in any case.

use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use blobhouse_io::{DownloadError, DownloadManager};
use blobhouse_storage::StorageError;
use bytes::Bytes;
use object_store::path::Path;
use object_store::signer::Signer;
use object_store::{ObjectStore, ObjectStoreExt};

/// How long a presigned URL stays valid. Scans sign per object and use the
/// URL within the scan; an hour covers the longest.
const SIGNED_URL_LIFETIME: Duration = Duration::from_secs(3600);

/// A failed range read, naming the object as the database knows it.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error(transparent)]
    Store(#[from] StorageError),
    #[error("reading {location}: {source}")]
    Download { location: String, source: DownloadError },
    #[error("{location}: range {start}..{end} returned {got} bytes; the object is truncated")]
    Short { location: String, start: u64, end: u64, got: usize },
}

/// The bytes of some ranges, and how hard they were to get.
#[derive(Debug, Default)]
pub struct Ranges {
    pub bytes: Vec<Bytes>,
    /// Attempts beyond the first, hedges included.
    pub retries: u64,
    /// Ranges answered by a hedge.
    pub hedged: u64,
    /// Sum of the requests' times to first byte.
    pub first_byte: Duration,
}

/// The reader of data ranges for one database.
#[derive(Debug, Clone)]
pub struct DataSource {
    store: Arc<dyn ObjectStore>,
    managed: Option<(DownloadManager, Arc<dyn Signer>)>,
    /// The caching tiers scans consult before the store (`crate::tiers`).
    tiers: Option<Arc<crate::tiers::Tiers>>,
}

impl DataSource {
    /// Reads through `store` only.
    pub fn store(store: Arc<dyn ObjectStore>) -> Self {
        DataSource { store, managed: None, tiers: None }
    }

    /// Reads through `dm` with URLs presigned by `signer`.
    pub fn managed(store: Arc<dyn ObjectStore>, dm: DownloadManager, signer: Arc<dyn Signer>) -> Self {
        DataSource { store, managed: Some((dm, signer)), tiers: None }
    }

    /// The same reader, with scans consulting `tiers` first.
    pub fn with_tiers(mut self, tiers: Option<Arc<crate::tiers::Tiers>>) -> Self {
        self.tiers = tiers;
        self
    }

    /// The caching tiers, if any.
    pub fn tiers(&self) -> Option<&Arc<crate::tiers::Tiers>> {
        self.tiers.as_ref()
    }

    /// The download manager, if reads go through one.
    pub fn download_manager(&self) -> Option<&DownloadManager> {
        self.managed.as_ref().map(|(dm, _)| dm)
    }

    /// Reads `ranges` of the object at `path` (`location` names it in
    /// errors), all concurrently; every range comes back whole or not at all.
    pub async fn get_ranges(&self, path: &Path, location: &str, ranges: &[Range<u64>]) -> Result<Ranges, ReadError> {
        if let Some((dm, signer)) = &self.managed {
            let url = signer
                .signed_url(http::Method::GET, path, SIGNED_URL_LIFETIME)
                .await
                .map_err(|e| StorageError::store("presign GET", location.to_string(), e))?;
            return fetch_managed(dm, url.as_str(), location, ranges).await;
        }
        let store = &self.store;
        let bytes = futures::future::try_join_all(ranges.iter().map(|r| async move {
            let bytes = store.get_range(path, r.clone()).await.map_err(|e| StorageError::store("GET", location.to_string(), e))?;
            check_length(location, r, bytes)
        }))
        .await?;
        Ok(Ranges { bytes, ..Ranges::default() })
    }
}

async fn fetch_managed(dm: &DownloadManager, url: &str, location: &str, ranges: &[Range<u64>]) -> Result<Ranges, ReadError> {
    let downloads = futures::future::try_join_all(ranges.iter().map(|r| async move {
        let d = dm.get(url, Some(r.clone())).await.map_err(|source| ReadError::Download { location: location.to_string(), source })?;
        let body = check_length(location, r, d.body.clone())?;
        Ok::<_, ReadError>((body, d))
    }))
    .await?;
    let mut out = Ranges::default();
    for (body, d) in downloads {
        out.bytes.push(body);
        out.retries += u64::from(d.attempts.saturating_sub(1));
        out.hedged += u64::from(d.hedged);
        out.first_byte += d.first_byte;
    }
    Ok(out)
}

fn check_length(location: &str, r: &Range<u64>, bytes: Bytes) -> Result<Bytes, ReadError> {
    if bytes.len() as u64 != r.end - r.start {
        return Err(ReadError::Short { location: location.to_string(), start: r.start, end: r.end, got: bytes.len() });
    }
    Ok(bytes)
}
