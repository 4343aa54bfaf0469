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
//!
//! Some credentials cannot presign: an Azure SAS token (a SAS cannot make
//! another), anonymous access, GCS without a key to sign with off Google's
//! metadata server. Reads then go through object_store, which sends the
//! credential itself with each request; the engine says so once
//! ([`DataSource::take_warnings`]) and keeps working.

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
    /// Why the credential cannot presign, once found: reads then go
    /// through object_store. The flag says whether it was reported.
    unsigned: Arc<std::sync::Mutex<Option<(String, bool)>>>,
    /// Set with `unsigned`: read on every range request, without a lock.
    cannot_sign: Arc<std::sync::atomic::AtomicBool>,
}

/// Whether a presigning error says the credential can never presign (not
/// that it failed this time).
fn cannot_presign(e: &object_store::Error) -> bool {
    let text = e.to_string();
    // An Azure OAuth token (managed identity, service principal) presigns
    // with a user delegation key, which an identity without the Storage
    // Blob Delegator role — or an emulator — is not given.
    ["SAS tokens auth is not supported", "while skipping signatures is not supported", "signBlob", "skip_signature", "NotImplemented", "requesting user delegation key"].iter().any(|n| text.contains(n))
        || matches!(e, object_store::Error::NotImplemented { .. } | object_store::Error::NotSupported { .. })
}

impl DataSource {
    /// Reads through `store` only.
    pub fn store(store: Arc<dyn ObjectStore>) -> Self {
        DataSource { store, managed: None, tiers: None, unsigned: Arc::default(), cannot_sign: Arc::default() }
    }

    /// Reads through `dm` with URLs presigned by `signer`.
    pub fn managed(store: Arc<dyn ObjectStore>, dm: DownloadManager, signer: Arc<dyn Signer>) -> Self {
        DataSource { store, managed: Some((dm, signer)), tiers: None, unsigned: Arc::default(), cannot_sign: Arc::default() }
    }

    /// Says once, if it came to that, that reads go through object_store
    /// because the credential cannot presign URLs.
    pub fn take_warnings(&self) -> Vec<String> {
        let mut unsigned = self.unsigned.lock().expect("not poisoned");
        match unsigned.as_mut() {
            Some((reason, reported @ false)) => {
                *reported = true;
                vec![format!("data reads go through the object-store client instead of the download manager: the credential cannot presign URLs ({reason})")]
            }
            _ => Vec::new(),
        }
    }

    /// Whether reads go through object_store because presigning cannot work.
    pub fn presigning_unavailable(&self) -> bool {
        self.cannot_sign.load(std::sync::atomic::Ordering::Relaxed)
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
        if let Some((dm, signer)) = self.managed.as_ref().filter(|_| !self.presigning_unavailable()) {
            match signer.signed_url(http::Method::GET, path, SIGNED_URL_LIFETIME).await {
                Ok(url) => return fetch_managed(dm, url.as_str(), location, ranges).await,
                Err(e) if cannot_presign(&e) => {
                    self.unsigned.lock().expect("not poisoned").get_or_insert_with(|| (e.to_string(), false));
                    self.cannot_sign.store(true, std::sync::atomic::Ordering::Relaxed);
                }
                Err(e) => return Err(StorageError::store("presign GET", location.to_string(), e).into()),
            }
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

#[cfg(test)]
mod tests {
    use super::*;
    use object_store::memory::InMemory;
    use object_store::PutPayload;

    /// A credential that cannot presign, as an Azure SAS token.
    #[derive(Debug)]
    struct SasOnly;

    #[async_trait::async_trait]
    impl Signer for SasOnly {
        async fn signed_url(&self, _: http::Method, _: &Path, _: Duration) -> object_store::Result<url::Url> {
            Err(object_store::Error::Generic { store: "MicrosoftAzure", source: "Generating SAS keys with SAS tokens auth is not supported".into() })
        }
    }

    #[tokio::test]
    async fn a_credential_that_cannot_presign_reads_through_the_store_and_says_so_once() {
        let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let path = Path::from("db/objects/x.parquet");
        store.put(&path, PutPayload::from_static(b"0123456789")).await.unwrap();
        let dm = DownloadManager::new(blobhouse_io::ManagerOptions::default()).unwrap();
        let source = DataSource::managed(store, dm, Arc::new(SasOnly));
        for _ in 0..2 {
            let read = source.get_ranges(&path, "az://c/db/objects/x.parquet", &[2..5, 7..10]).await.unwrap();
            assert_eq!(read.bytes, vec![Bytes::from_static(b"234"), Bytes::from_static(b"789")]);
        }
        assert!(source.presigning_unavailable());
        let warnings = source.take_warnings();
        assert!(warnings.len() == 1 && warnings[0].contains("cannot presign") && warnings[0].contains("SAS"), "{warnings:?}");
        assert!(source.take_warnings().is_empty(), "said once");
    }
}
