//! The stores of files read in place, as DataFusion's listing tables ask
//! for them: one [`FileStore`] per bucket (or the local file system),
//! opened on first use with the engine's store options and kept for the
//! engine's life ([`FileStores`], DataFusion's `ObjectStoreRegistry`).
//!
//! DataFusion's Parquet and CSV readers decide *what* to read (footers,
//! the row groups and columns left after pruning, CSV byte ranges); a
//! [`FileStore`] decides *how*: every ranged read goes through the engine's
//! caching tiers and then [`DataSource::get_ranges`] — the download manager
//! with presigned URLs where the credential presigns, as for the database's
//! own objects — so files in place and tables share one I/O stack, one
//! cache budget and one set of request counters. Listing, HEAD and
//! unranged reads of unknown objects stay on object_store, as do writes
//! (`COPY … TO` a bucket); external tables never write (`super::ReadOnly`).
//!
//! Why by hand: object_store's wrappers (throttling, prefixes) know nothing
//! of our download manager or tiers, and DataFusion's readers only know
//! object_store's trait; this adapter is the seam between the two.
//!
//! Unlike the database's objects, files in place can be rewritten under
//! the same name by whoever owns them. A cached range is therefore keyed
//! by the object's version as the statement's listing saw it (e_tag, else
//! last-modified, and size): a rewritten file has a new key, and a file
//! never listed (so of unknown version) is never served from the cache.

use std::collections::HashMap;
use std::fmt;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use async_trait::async_trait;
use bytes::Bytes;
use datafusion::execution::object_store::ObjectStoreRegistry;
use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetRange, GetResult, GetResultPayload, ListResult, MultipartUpload, ObjectMeta, ObjectStore, PutMultipartOptions,
    PutOptions, PutPayload, PutResult, RenameOptions, Result,
};
use url::Url;

use blobhouse_cache::SegmentKey;
use blobhouse_storage::{StoreOptions, open_location};

use crate::source::DataSource;
use crate::tiers::{DecodedSize, Tiers};

/// Objects whose version a store remembers from listings; past it the
/// memo starts over (a cache miss, never a wrong read).
const MAX_REMEMBERED: usize = 1 << 18;

/// A whole-object GET larger than this streams from object_store instead
/// of arriving as one buffer through the download manager (a large CSV
/// read by one partition).
const MAX_BUFFERED_GET: u64 = 64 << 20;

/// One request a [`FileStore`] sent to its store (not those the tiers
/// served), kept when the engine records them
/// ([`crate::EngineOptions::record_file_requests`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileRequest {
    /// `LIST`, `HEAD` or `GET`.
    pub method: &'static str,
    /// The object's (or the listed prefix's) full URL.
    pub url: String,
    /// A GET's byte range; `None` for the whole object.
    pub range: Option<Range<u64>>,
}

/// The request log shared by an engine's file stores.
pub type RequestLog = Arc<Mutex<Vec<FileRequest>>>;

/// What one statement's reads of files in place cost: requests to the
/// stores and bytes, and what the tiers served instead. Kept in the
/// statement's DataFusion configuration (an extension), so that its
/// result reports them beside its tables' scans.
#[derive(Debug, Default)]
pub struct FileCounters {
    pub lists: AtomicU64,
    pub gets: AtomicU64,
    pub bytes: AtomicU64,
    pub memory_hits: AtomicU64,
    pub memory_bytes: AtomicU64,
    pub ssd_hits: AtomicU64,
    pub ssd_bytes: AtomicU64,
}

impl FileCounters {
    fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    /// The counters as scan metrics (requests, bytes, tier hits).
    pub fn scan_metrics(&self) -> crate::scan::ScanMetrics {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        crate::scan::ScanMetrics {
            get_requests: get(&self.gets),
            bytes_fetched: get(&self.bytes),
            memory_hits: get(&self.memory_hits),
            memory_bytes: get(&self.memory_bytes),
            ssd_hits: get(&self.ssd_hits),
            ssd_bytes: get(&self.ssd_bytes),
            gets_avoided: get(&self.memory_hits) + get(&self.ssd_hits),
            ..Default::default()
        }
    }
}

/// One bucket (or the local file system) as the engine opened it, shared
/// by every statement that reads files there.
struct Opened {
    /// `scheme://host`, to name objects in URLs, cache keys and messages.
    base: String,
    inner: Arc<dyn ObjectStore>,
    source: DataSource,
    tiers: Option<Arc<Tiers>>,
    /// Each object's metadata as the newest listing or HEAD saw it.
    seen: Arc<Mutex<HashMap<Path, ObjectMeta>>>,
}

/// Every store of files in place an engine has opened, by `scheme://host`.
pub struct FileStores {
    options: StoreOptions,
    /// The scheme of the database's cloud (`s3`, `gs`, `az`…), `None` for
    /// a local or in-memory database.
    cloud: Option<String>,
    /// The engine's reader: its download manager and tiers.
    source: DataSource,
    opened: RwLock<HashMap<String, Arc<Opened>>>,
    log: Option<RequestLog>,
}

impl fmt::Debug for FileStores {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FileStores").field("stores", &self.opened.read().expect("not poisoned").keys().collect::<Vec<_>>()).finish()
    }
}

impl FileStores {
    /// Stores opened with `options` (the database's at `database`,
    /// without its key: files in place are plaintext), read through
    /// `source`'s download manager and tiers; `log` keeps every request
    /// when given.
    pub fn new(database: &str, options: &StoreOptions, source: DataSource, log: Option<RequestLog>) -> FileStores {
        let options = StoreOptions { encryption: None, ..options.clone() };
        let cloud = database.split_once("://").map(|(s, _)| s.to_string()).filter(|s| !matches!(s.as_str(), "file" | "memory"));
        FileStores { options, cloud, source, opened: RwLock::default(), log }
    }

    /// The options a bucket of `scheme` is opened with: the database's,
    /// unless the database is on another cloud (its endpoint and keys
    /// would be wrong there; the environment's are used).
    fn options_for(&self, scheme: &str) -> StoreOptions {
        match &self.cloud {
            Some(cloud) if !same_cloud(cloud, scheme) => StoreOptions::default(),
            _ => self.options.clone(),
        }
    }

    /// The requests recorded so far (empty unless recording).
    pub fn requests(&self) -> Vec<FileRequest> {
        self.log.as_ref().map(|l| l.lock().expect("not poisoned").clone()).unwrap_or_default()
    }

    fn opened(&self, key: &str) -> datafusion::common::Result<Arc<Opened>> {
        if let Some(o) = self.opened.read().expect("not poisoned").get(key) {
            return Ok(o.clone());
        }
        let opened = if key.starts_with("file://") {
            // Local files: read directly (a cache of local disk is no gain).
            let local: Arc<dyn ObjectStore> = Arc::new(object_store::local::LocalFileSystem::new());
            Opened { base: key.to_string(), inner: local.clone(), source: DataSource::store(local), tiers: None, seen: Arc::default() }
        } else {
            let scheme = key.split_once("://").map_or("", |(s, _)| s);
            let loc = open_location(key, &self.options_for(scheme)).map_err(|e| datafusion::common::DataFusionError::External(Box::new(e)))?;
            let source = match (self.source.download_manager(), &loc.signer) {
                (Some(dm), Some(signer)) => DataSource::managed(loc.store.clone(), dm.clone(), signer.clone()),
                _ => DataSource::store(loc.store.clone()),
            };
            Opened { base: key.to_string(), inner: loc.store, source, tiers: self.source.tiers().cloned(), seen: Arc::default() }
        };
        Ok(self.opened.write().expect("not poisoned").entry(key.to_string()).or_insert(Arc::new(opened)).clone())
    }
}

/// One statement's stores of files in place: DataFusion's object store
/// registry of its context. The stores are the engine's
/// ([`FileStores`]); the counters are the statement's.
#[derive(Debug)]
pub struct StatementFiles {
    stores: Arc<FileStores>,
    counters: Arc<FileCounters>,
    /// The statement's listings, by `scheme://host` and prefix.
    listings: Listings,
    /// Stores an embedder registered for this statement (as they are).
    registered: RwLock<HashMap<String, Arc<dyn ObjectStore>>>,
}

impl StatementFiles {
    pub fn new(stores: Arc<FileStores>, counters: Arc<FileCounters>) -> StatementFiles {
        StatementFiles { stores, counters, listings: Listings::default(), registered: RwLock::default() }
    }
}

impl ObjectStoreRegistry for StatementFiles {
    fn register_store(&self, url: &Url, store: Arc<dyn ObjectStore>) -> Option<Arc<dyn ObjectStore>> {
        self.registered.write().expect("not poisoned").insert(url_key(url), store)
    }

    fn get_store(&self, url: &Url) -> datafusion::common::Result<Arc<dyn ObjectStore>> {
        let key = url_key(url);
        if let Some(s) = self.registered.read().expect("not poisoned").get(&key) {
            return Ok(s.clone());
        }
        let opened = self.stores.opened(&key)?;
        Ok(Arc::new(FileStore { opened, counters: self.counters.clone(), listings: self.listings.clone(), log: self.stores.log.clone() }))
    }

    fn deregister_store(&self, url: &Url) -> datafusion::common::Result<Arc<dyn ObjectStore>> {
        let key = url_key(url);
        self.registered.write().expect("not poisoned").remove(&key).ok_or_else(|| datafusion::common::DataFusionError::Execution(format!("no store is registered for {key}")))
    }
}

/// One statement's recursive listings: (`scheme://host`, prefix) → the
/// objects below it.
#[derive(Debug, Clone, Default)]
struct Listings(Arc<Mutex<Vec<(String, Option<Path>, Arc<Vec<ObjectMeta>>)>>>);

impl Listings {
    /// The objects below `prefix`, if a listing of it or of a prefix
    /// above it was kept.
    fn below(&self, base: &str, prefix: Option<&Path>) -> Option<Vec<ObjectMeta>> {
        let kept = self.0.lock().expect("not poisoned");
        let (_, above, objects) = kept.iter().find(|(b, p, _)| b == base && is_within(prefix, p.as_ref()))?;
        if *above == prefix.cloned() {
            return Some(objects.as_ref().clone());
        }
        Some(objects.iter().filter(|m| is_within(Some(&m.location), prefix)).cloned().collect())
    }

    fn keep(&self, base: &str, prefix: Option<Path>, objects: &[ObjectMeta]) {
        self.0.lock().expect("not poisoned").push((base.to_string(), prefix, Arc::new(objects.to_vec())));
    }
}

/// Whether `path` is `prefix` or below it, on `/` boundaries.
fn is_within(path: Option<&Path>, prefix: Option<&Path>) -> bool {
    let Some(prefix) = prefix.map(|p| p.as_ref()).filter(|p| !p.is_empty()) else { return true };
    let path = path.map_or("", |p| p.as_ref());
    path == prefix || path.strip_prefix(prefix).is_some_and(|rest| rest.starts_with('/'))
}

/// Whether two URL schemes name the same cloud (`s3` and `s3a`; Azure's
/// several).
fn same_cloud(a: &str, b: &str) -> bool {
    fn family(s: &str) -> &str {
        match s {
            "s3" | "s3a" => "s3",
            "gs" | "gcs" => "gs",
            "az" | "azure" | "abfs" | "abfss" | "adl" => "az",
            other => other,
        }
    }
    family(a) == family(b)
}

/// `scheme://host[:port]`, as DataFusion keys its stores.
fn url_key(url: &Url) -> String {
    format!("{}://{}", url.scheme(), &url[url::Position::BeforeHost..url::Position::AfterPort])
}

/// One bucket's (or the local file system's) files as one statement reads
/// them: through the engine's tiers and download manager (see the module
/// docs), counted for the statement.
pub struct FileStore {
    opened: Arc<Opened>,
    counters: Arc<FileCounters>,
    listings: Listings,
    log: Option<RequestLog>,
}

impl fmt::Debug for FileStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "FileStore({})", self.opened.base)
    }
}

impl fmt::Display for FileStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "FileStore({}, {})", self.opened.base, self.opened.inner)
    }
}

impl FileStore {
    fn url(&self, path: &Path) -> String {
        format!("{}/{}", self.opened.base.trim_end_matches('/'), path)
    }

    fn record(&self, method: &'static str, path: &str, range: Option<Range<u64>>) {
        match method {
            "LIST" => FileCounters::add(&self.counters.lists, 1),
            _ => {
                FileCounters::add(&self.counters.gets, 1);
                FileCounters::add(&self.counters.bytes, range.as_ref().map_or(0, |r| r.end - r.start));
            }
        }
        if let Some(log) = &self.log {
            log.lock().expect("not poisoned").push(FileRequest { method, url: format!("{}/{}", self.opened.base.trim_end_matches('/'), path), range });
        }
    }

    fn remember(&self, meta: &ObjectMeta) {
        remember(&self.opened.seen, meta);
    }

    fn known(&self, path: &Path) -> Option<ObjectMeta> {
        self.opened.seen.lock().expect("not poisoned").get(path).cloned()
    }

    /// The cache's name for `meta`'s version of the object.
    fn cache_name(&self, meta: &ObjectMeta) -> String {
        let version = meta.e_tag.clone().unwrap_or_else(|| meta.last_modified.timestamp_micros().to_string());
        format!("{}#{}:{}", self.url(&meta.location), version, meta.size)
    }

    /// `ranges` of the object, from the tiers where they hold them and
    /// from the store (through the download manager) otherwise.
    async fn read(&self, path: &Path, ranges: &[Range<u64>]) -> Result<Vec<Bytes>> {
        let location = self.url(path);
        let source = &self.opened.source;
        let failed = |e: crate::source::ReadError| object_store::Error::Generic { store: "blobhouse files", source: Box::new(e) };
        let meta = self.known(path);
        let (Some(tiers), Some(meta)) = (self.opened.tiers.as_ref(), meta) else {
            for r in ranges {
                self.record("GET", path.as_ref(), Some(r.clone()));
            }
            return source.get_ranges(path, &location, ranges).await.map(|r| r.bytes).map_err(failed);
        };
        let name: Arc<str> = Arc::from(self.cache_name(&meta));
        // Held as fetched, never decoded: DataFusion's reader decodes
        // (an unbounded decoded size says so to the tiers).
        let never_decoded = DecodedSize { bytes: u64::MAX, fixed_width: false };
        let chunks: Vec<(SegmentKey, DecodedSize)> = ranges.iter().map(|r| (SegmentKey::new(name.clone(), r.start, r.end - r.start), never_decoded)).collect();
        // One read is one access for the tiers' policies (what a scan's
        // plan is for the database's objects): they admit what they value.
        tiers.plan(&chunks);
        let served = tiers.lookup(chunks).await;
        FileCounters::add(&self.counters.memory_hits, served.memory_hits as u64);
        FileCounters::add(&self.counters.memory_bytes, served.memory_bytes);
        FileCounters::add(&self.counters.ssd_hits, served.ssd_hits as u64);
        FileCounters::add(&self.counters.ssd_bytes, served.ssd_bytes);
        let mut found: HashMap<(u64, u64), Bytes> = served.chunks.into_iter().map(|(start, b)| ((start, b.len() as u64), b)).collect();
        let missing: Vec<_> = served.missing.into_iter().filter(|m| !found.contains_key(&(m.range.start, m.range.end - m.range.start))).collect();
        if !missing.is_empty() {
            let wanted: Vec<Range<u64>> = missing.iter().map(|m| m.range.clone()).collect();
            for r in &wanted {
                self.record("GET", path.as_ref(), Some(r.clone()));
            }
            match source.get_ranges(path, &location, &wanted).await {
                Ok(read) => {
                    let fetched: Vec<_> = missing.into_iter().zip(read.bytes).collect();
                    tiers.fetched(&fetched);
                    for (m, b) in fetched {
                        found.insert((m.range.start, m.range.end - m.range.start), b);
                    }
                }
                Err(e) => {
                    tiers.failed(&missing);
                    return Err(failed(e));
                }
            }
        }
        let mut out = Vec::with_capacity(ranges.len());
        for r in ranges {
            match found.get(&(r.start, r.end - r.start)) {
                Some(b) => out.push(b.clone()),
                // Served decoded (only our own scans cache so): read it.
                None => {
                    self.record("GET", path.as_ref(), Some(r.clone()));
                    let read = source.get_ranges(path, &location, std::slice::from_ref(r)).await.map_err(failed)?;
                    out.extend(read.bytes);
                }
            }
        }
        Ok(out)
    }
}

#[async_trait]
impl ObjectStore for FileStore {
    async fn put_opts(&self, location: &Path, payload: PutPayload, opts: PutOptions) -> Result<PutResult> {
        self.opened.inner.put_opts(location, payload, opts).await
    }

    async fn put_multipart_opts(&self, location: &Path, opts: PutMultipartOptions) -> Result<Box<dyn MultipartUpload>> {
        self.opened.inner.put_multipart_opts(location, opts).await
    }

    async fn get_opts(&self, location: &Path, options: GetOptions) -> Result<GetResult> {
        let plain = options.if_match.is_none() && options.if_none_match.is_none() && options.if_modified_since.is_none() && options.if_unmodified_since.is_none() && options.version.is_none();
        let meta = self.known(location);
        let range = match (&options.range, &meta) {
            _ if options.head || !plain => None,
            (Some(GetRange::Bounded(r)), Some(_)) => Some(r.clone()),
            (Some(GetRange::Suffix(n)), Some(m)) => Some(m.size.saturating_sub(*n)..m.size),
            (Some(GetRange::Offset(o)), Some(m)) => Some(*o..m.size),
            (None, Some(m)) if m.size <= MAX_BUFFERED_GET => Some(0..m.size),
            _ => None,
        };
        let (Some(range), Some(meta)) = (range, meta) else {
            self.record(if options.head { "HEAD" } else { "GET" }, location.as_ref(), match &options.range {
                Some(GetRange::Bounded(r)) => Some(r.clone()),
                _ => None,
            });
            let got = self.opened.inner.get_opts(location, options).await?;
            self.remember(&got.meta);
            return Ok(got);
        };
        let range = range.start.min(meta.size)..range.end.min(meta.size);
        let bytes = if range.is_empty() { Bytes::new() } else { self.read(location, std::slice::from_ref(&range)).await?.remove(0) };
        let stream = futures::stream::once(async move { Ok(bytes) }).boxed();
        Ok(GetResult { payload: GetResultPayload::Stream(stream), meta, range, attributes: Default::default() })
    }

    async fn get_ranges(&self, location: &Path, ranges: &[Range<u64>]) -> Result<Vec<Bytes>> {
        self.read(location, ranges).await
    }

    fn delete_stream(&self, locations: BoxStream<'static, Result<Path>>) -> BoxStream<'static, Result<Path>> {
        self.opened.inner.delete_stream(locations)
    }

    /// A recursive listing, done once per statement: a later listing of
    /// the same prefix, or of one below a prefix listed already, is
    /// answered from it. (DataFusion's own list-files cache always lists
    /// a table's whole location, which would undo the listing of only the
    /// partitions a filter keeps; it is off in statements.)
    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, Result<ObjectMeta>> {
        if let Some(known) = self.listings.below(&self.opened.base, prefix) {
            return futures::stream::iter(known.into_iter().map(Ok)).boxed();
        }
        let listing = if self.opened.base.starts_with("file://") {
            self.record("LIST", prefix.map_or("", |p| p.as_ref()), None);
            let seen = self.opened.seen.clone();
            self.opened.inner.list(prefix).inspect(move |m| if let Ok(m) = m { remember(&seen, m) }).boxed()
        } else {
            let log = self.log.clone().map(|l| (l, self.opened.base.trim_end_matches('/').to_string()));
            walk(self.opened.inner.clone(), prefix.cloned(), self.opened.seen.clone(), self.counters.clone(), log)
        };
        let (listings, base, prefix) = (self.listings.clone(), self.opened.base.clone(), prefix.cloned());
        futures::stream::once(async move {
            let all: Vec<ObjectMeta> = listing.try_collect().await?;
            listings.keep(&base, prefix, &all);
            Ok::<_, object_store::Error>(futures::stream::iter(all.into_iter().map(Ok)))
        })
        .try_flatten()
        .boxed()
    }

    fn list_with_offset(&self, prefix: Option<&Path>, offset: &Path) -> BoxStream<'static, Result<ObjectMeta>> {
        self.record("LIST", prefix.map_or("", |p| p.as_ref()), None);
        let seen = self.opened.seen.clone();
        self.opened.inner.list_with_offset(prefix, offset).inspect(move |m| if let Ok(m) = m { remember(&seen, m) }).boxed()
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> Result<ListResult> {
        self.record("LIST", prefix.map_or("", |p| p.as_ref()), None);
        let listed = self.opened.inner.list_with_delimiter(prefix).await?;
        for m in &listed.objects {
            self.remember(m);
        }
        Ok(listed)
    }

    async fn copy_opts(&self, from: &Path, to: &Path, options: CopyOptions) -> Result<()> {
        self.opened.inner.copy_opts(from, to, options).await
    }

    async fn rename_opts(&self, from: &Path, to: &Path, options: RenameOptions) -> Result<()> {
        self.opened.inner.rename_opts(from, to, options).await
    }
}

fn remember(seen: &Mutex<HashMap<Path, ObjectMeta>>, meta: &ObjectMeta) {
    let mut seen = seen.lock().expect("not poisoned");
    if seen.len() >= MAX_REMEMBERED {
        seen.clear();
    }
    seen.insert(meta.location.clone(), meta.clone());
}

/// Directories listed at once by a [`FileStore`]'s recursive listing.
const LIST_CONCURRENCY: usize = 16;

/// A recursive listing of `prefix` as a walk of its directories, up to
/// [`LIST_CONCURRENCY`] listed at once: a store pages one recursive
/// LIST sequentially (1,000 keys a page on S3), while a hive dataset's
/// partition directories can be listed side by side. Objects come in no
/// particular order.
fn walk(inner: Arc<dyn ObjectStore>, prefix: Option<Path>, seen: Arc<Mutex<HashMap<Path, ObjectMeta>>>, counters: Arc<FileCounters>, log: Option<(RequestLog, String)>) -> BoxStream<'static, Result<ObjectMeta>> {
    type Listing = futures::future::BoxFuture<'static, Result<ListResult>>;
    struct Walk {
        inner: Arc<dyn ObjectStore>,
        queue: std::collections::VecDeque<Option<Path>>,
        running: futures::stream::FuturesUnordered<Listing>,
        ready: std::collections::VecDeque<ObjectMeta>,
        seen: Arc<Mutex<HashMap<Path, ObjectMeta>>>,
        counters: Arc<FileCounters>,
        log: Option<(RequestLog, String)>,
    }
    let state = Walk { inner, queue: [prefix].into(), running: Default::default(), ready: Default::default(), seen, counters, log };
    futures::stream::unfold(state, |mut w| async move {
        loop {
            if let Some(m) = w.ready.pop_front() {
                return Some((Ok(m), w));
            }
            while w.running.len() < LIST_CONCURRENCY {
                let Some(dir) = w.queue.pop_front() else { break };
                FileCounters::add(&w.counters.lists, 1);
                if let Some((log, base)) = &w.log {
                    let at = dir.as_ref().map_or(String::new(), |d| d.to_string());
                    log.lock().expect("not poisoned").push(FileRequest { method: "LIST", url: format!("{base}/{at}"), range: None });
                }
                let inner = w.inner.clone();
                w.running.push(Box::pin(async move { inner.list_with_delimiter(dir.as_ref()).await }));
            }
            match w.running.next().await? {
                Ok(listed) => {
                    for m in &listed.objects {
                        remember(&w.seen, m);
                    }
                    w.ready.extend(listed.objects);
                    w.queue.extend(listed.common_prefixes.into_iter().map(Some));
                }
                Err(e) => {
                    // One error ends the walk.
                    w.queue.clear();
                    w.running = Default::default();
                    return Some((Err(e), w));
                }
            }
        }
    })
    .boxed()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(path: &str) -> ObjectMeta {
        ObjectMeta { location: Path::from(path), last_modified: Default::default(), size: 1, e_tag: None, version: None }
    }

    #[test]
    fn a_statement_answers_a_listing_below_one_it_made() {
        let p = |s: &str| Some(Path::from(s));
        assert!(is_within(p("a/b/c").as_ref(), p("a/b").as_ref()) && is_within(p("a/b").as_ref(), p("a/b").as_ref()) && is_within(p("x").as_ref(), None));
        assert!(!is_within(p("a/bc").as_ref(), p("a/b").as_ref()) && !is_within(p("a").as_ref(), p("a/b").as_ref()));
        let listings = Listings::default();
        let objects = [meta("t/year=1/a.parquet"), meta("t/year=2/b.parquet"), meta("t/year=10/c.parquet")];
        listings.keep("s3://b", p("t"), &objects);
        let below = listings.below("s3://b", p("t/year=1").as_ref()).expect("answered from the listing of t");
        assert_eq!(below.iter().map(|m| m.location.to_string()).collect::<Vec<_>>(), ["t/year=1/a.parquet"]);
        assert_eq!(listings.below("s3://b", p("t").as_ref()).map(|v| v.len()), Some(3));
        assert!(listings.below("s3://b", p("u").as_ref()).is_none() && listings.below("s3://other", p("t/year=1").as_ref()).is_none());
    }

    #[test]
    fn another_clouds_bucket_is_not_opened_with_the_databases_endpoint() {
        let options = StoreOptions { endpoint: Some("http://127.0.0.1:9000".into()), ..Default::default() };
        let source = DataSource::store(Arc::new(object_store::memory::InMemory::new()));
        let on_s3 = FileStores::new("s3://bucket/db", &options, source.clone(), None);
        assert_eq!(on_s3.options_for("s3a").endpoint, options.endpoint);
        assert_eq!(on_s3.options_for("gs").endpoint, None);
        let local = FileStores::new("file:///data/db", &options, source, None);
        assert_eq!(local.options_for("s3").endpoint, options.endpoint, "flags given with a local database are for the files");
    }
}
