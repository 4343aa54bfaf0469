//! [`AuditStore`]: records every request and refuses overwrites.

use std::fmt;
use std::ops::Range;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use futures::stream::BoxStream;
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetRange, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore, ObjectStoreExt,
    PutMode, PutMultipartOptions, PutOptions, PutPayload, PutResult, RenameOptions, Result,
};

/// One request seen by the store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    Get { path: String, range: Option<GetRange>, head: bool },
    /// `bytes`: the body's size (`None` for a multipart upload, whose parts
    /// are not seen here).
    Put { path: String, create: bool, bytes: Option<usize> },
    Delete { path: String },
    List { prefix: String },
}

#[derive(Debug, Default)]
struct Log {
    requests: Vec<Request>,
    overwrites: Vec<String>,
    /// See [`AuditStore::answer_exists_after_next_create`].
    echo: Option<String>,
}

/// Wraps a store; every write to an existing key fails the write and is
/// recorded as a violation (check [`AuditStore::overwrites`] at the end).
#[derive(Debug, Clone)]
pub struct AuditStore {
    inner: Arc<dyn ObjectStore>,
    log: Arc<Mutex<Log>>,
}

impl AuditStore {
    /// Wraps `inner`.
    pub fn new(inner: Arc<dyn ObjectStore>) -> Self {
        AuditStore { inner, log: Arc::default() }
    }

    /// Every request so far, in order.
    pub fn requests(&self) -> Vec<Request> {
        self.log.lock().unwrap().requests.clone()
    }

    /// Forgets the requests recorded so far (violations stay).
    pub fn clear_requests(&self) {
        self.log.lock().unwrap().requests.clear();
    }

    /// Keys somebody tried to write although they existed.
    pub fn overwrites(&self) -> Vec<String> {
        self.log.lock().unwrap().overwrites.clone()
    }

    /// The next put-if-absent whose path contains `part` stores its object
    /// and then answers "already exists" — what a client sees when it
    /// retried a PUT after a server error that came after the store had
    /// kept the object.
    pub fn answer_exists_after_next_create(&self, part: &str) {
        self.log.lock().unwrap().echo = Some(part.to_string());
    }

    fn record(&self, r: Request) {
        self.log.lock().unwrap().requests.push(r);
    }

    async fn refuse_if_exists(&self, location: &Path) -> Result<()> {
        match self.inner.head(location).await {
            Ok(_) => {
                self.log.lock().unwrap().overwrites.push(location.to_string());
                Err(object_store::Error::Generic {
                    store: "AuditStore",
                    source: format!("overwrite of existing object {location}: blobhouse must never write a key twice").into(),
                })
            }
            Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(e),
        }
    }
}

impl fmt::Display for AuditStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "AuditStore({})", self.inner)
    }
}

#[async_trait]
impl ObjectStore for AuditStore {
    async fn put_opts(&self, location: &Path, payload: PutPayload, opts: PutOptions) -> Result<PutResult> {
        let create = matches!(opts.mode, PutMode::Create);
        self.record(Request::Put { path: location.to_string(), create, bytes: Some(payload.content_length()) });
        if create {
            let echo = {
                let mut log = self.log.lock().unwrap();
                let hit = log.echo.as_deref().is_some_and(|part| location.as_ref().contains(part));
                if hit {
                    log.echo = None;
                }
                hit
            };
            // The store refuses atomically; an AlreadyExists answer is no overwrite.
            let put = self.inner.put_opts(location, payload, opts).await;
            return match put {
                Ok(_) if echo => Err(object_store::Error::AlreadyExists { path: location.to_string(), source: "the retried PUT found the object its first attempt stored".into() }),
                put => put,
            };
        }
        self.refuse_if_exists(location).await?;
        self.inner.put_opts(location, payload, opts).await
    }

    async fn put_multipart_opts(&self, location: &Path, opts: PutMultipartOptions) -> Result<Box<dyn MultipartUpload>> {
        self.record(Request::Put { path: location.to_string(), create: false, bytes: None });
        self.refuse_if_exists(location).await?;
        self.inner.put_multipart_opts(location, opts).await
    }

    async fn get_opts(&self, location: &Path, options: GetOptions) -> Result<GetResult> {
        self.record(Request::Get { path: location.to_string(), range: options.range.clone(), head: options.head });
        self.inner.get_opts(location, options).await
    }

    async fn get_ranges(&self, location: &Path, ranges: &[Range<u64>]) -> Result<Vec<bytes::Bytes>> {
        for r in ranges {
            self.record(Request::Get { path: location.to_string(), range: Some(GetRange::Bounded(r.clone())), head: false });
        }
        self.inner.get_ranges(location, ranges).await
    }

    fn delete_stream(&self, locations: BoxStream<'static, Result<Path>>) -> BoxStream<'static, Result<Path>> {
        let log = self.log.clone();
        let locations = futures::StreamExt::inspect(locations, move |p| {
            if let Ok(p) = p {
                log.lock().unwrap().requests.push(Request::Delete { path: p.to_string() });
            }
        });
        self.inner.delete_stream(Box::pin(locations))
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, Result<ObjectMeta>> {
        self.record(Request::List { prefix: prefix.map(|p| p.to_string()).unwrap_or_default() });
        self.inner.list(prefix)
    }

    fn list_with_offset(&self, prefix: Option<&Path>, offset: &Path) -> BoxStream<'static, Result<ObjectMeta>> {
        self.record(Request::List { prefix: prefix.map(|p| p.to_string()).unwrap_or_default() });
        self.inner.list_with_offset(prefix, offset)
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> Result<ListResult> {
        self.record(Request::List { prefix: prefix.map(|p| p.to_string()).unwrap_or_default() });
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy_opts(&self, from: &Path, to: &Path, options: CopyOptions) -> Result<()> {
        self.refuse_if_exists(to).await?;
        self.inner.copy_opts(from, to, options).await
    }

    async fn rename_opts(&self, from: &Path, to: &Path, options: RenameOptions) -> Result<()> {
        self.refuse_if_exists(to).await?;
        self.inner.rename_opts(from, to, options).await
    }
}
