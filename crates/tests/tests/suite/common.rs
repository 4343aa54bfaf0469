//! Opening audited test databases on either backend.

use std::sync::Arc;

use blobhouse_engine::{EngineOptions, QueryResult, Session};
use blobhouse_storage::{Location, StoreOptions, open_location};
use blobhouse_testkit::{AuditStore, AzuriteServer, GcsServer, MinioServer};
use datafusion::arrow::util::pretty::pretty_format_batches;

/// Every read of a data object (`.parquet`) so far, from the audited store
/// (object_store path) and the engine's download manager (S3 path): the
/// object's path or URL and the range (`None` for an unbounded GET).
pub fn data_reads(db: &TestDb, e: &Session) -> Vec<(String, Option<std::ops::Range<u64>>)> {
    let mut out = Vec::new();
    for req in db.audit.requests() {
        if let blobhouse_testkit::Request::Get { path, range, .. } = req
            && path.ends_with(".parquet")
        {
            let range = match range {
                Some(object_store::GetRange::Bounded(r)) => Some(r),
                _ => None,
            };
            out.push((path, range));
        }
    }
    if let Some(dm) = e.engine().download_manager() {
        out.extend(dm.request_log().into_iter().filter(|r| r.url.ends_with(".parquet")).map(|r| (r.url, r.range)));
    }
    out
}

/// Where a test database lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Local,
    Minio,
    /// Azure Blob Storage's emulator (`az://` URLs, shared key).
    Azurite,
    /// fake-gcs-server behind its proxy (`gs://` URLs, a service account).
    Gcs,
    /// A local directory holding an encrypted database (a fresh master
    /// key in a file beside it).
    LocalEncrypted,
    /// MinIO holding an encrypted database.
    MinioEncrypted,
}

/// Generates, for each `async fn(Backend)` named, a module with one
/// `#[tokio::test]` per listed backend: `on_backends!([local => Local,
/// minio => Minio]; f, g)`.
#[macro_export]
macro_rules! on_backends {
    ($backends:tt; $($name:ident),* $(,)?) => {
        $( $crate::on_backends!(@one $backends $name); )*
    };
    (@one [$($test:ident => $backend:ident),*] $name:ident) => {
        mod $name {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $test() { super::$name($crate::common::Backend::$backend).await }
            )*
        }
    };
}

/// One test per backend — a local directory and MinIO — for each
/// `async fn(Backend)` named.
#[macro_export]
macro_rules! on_both_backends {
    ($($name:ident),* $(,)?) => {
        $crate::on_backends!([local => Local, minio => Minio]; $($name),*);
    };
}

/// [`on_every_store!`] and one test per encrypted database too (on a
/// local directory and on MinIO), for each `async fn(Backend)` named: the
/// suite that must hold whether or not a database is encrypted.
#[macro_export]
macro_rules! on_every_store_encrypted_too {
    ($($name:ident),* $(,)?) => {
        $crate::on_backends!([local => Local, minio => Minio, azurite => Azurite, gcs => Gcs, local_encrypted => LocalEncrypted, minio_encrypted => MinioEncrypted]; $($name),*);
    };
}

/// One test per store — a local directory, MinIO (S3), Azurite (Azure Blob
/// Storage) and fake-gcs-server (GCS) — for each `async fn(Backend)` named: the storage and SQL
/// suite that must hold on every cloud.
#[macro_export]
macro_rules! on_every_store {
    ($($name:ident),* $(,)?) => {
        $crate::on_backends!([local => Local, minio => Minio, azurite => Azurite, gcs => Gcs]; $($name),*);
    };
}

/// A database for one test: its URL, its audited store, and the options to
/// open more handles on it.
pub struct TestDb {
    pub url: String,
    pub store_options: StoreOptions,
    pub audit: AuditStore,
    pub location: Location,
    _dir: Option<tempfile::TempDir>,
}

impl TestDb {
    pub fn new(backend: Backend, name: &str) -> TestDb {
        if let Backend::LocalEncrypted | Backend::MinioEncrypted = backend {
            // The key lives outside the database, in a directory the
            // handle keeps (a local database goes inside it, beside the key).
            let keys = tempfile::tempdir().expect("tempdir");
            let key: [u8; 32] = rand::random();
            let path = keys.path().join("master.key");
            std::fs::write(&path, blobhouse_storage::encryption::hex(&key)).expect("write the key");
            let spec = Some(blobhouse_storage::encryption::KeySpec::File { path });
            let mut db = match backend {
                Backend::LocalEncrypted => {
                    let dir = keys.path().join("db");
                    let store_options = StoreOptions { encryption: spec.clone(), ..StoreOptions::default() };
                    TestDb::at(dir.to_string_lossy().to_string(), store_options, None)
                }
                _ => TestDb::new(Backend::Minio, name).with_key(spec.clone()),
            };
            db.location = db.location.clone().with_encryption(spec);
            db._dir = Some(keys);
            return db;
        }
        let (url, store_options, dir) = match backend {
            Backend::Local => {
                let dir = tempfile::tempdir().expect("tempdir");
                (dir.path().to_string_lossy().to_string(), StoreOptions::default(), Some(dir))
            }
            Backend::Minio => {
                let minio = MinioServer::shared();
                let opts = minio_options(minio);
                (minio.fresh_url(name), opts, None)
            }
            Backend::Azurite => {
                let azurite = AzuriteServer::shared();
                (azurite.fresh_url(name), azurite_options(azurite), None)
            }
            Backend::Gcs => {
                let gcs = GcsServer::shared();
                let options = StoreOptions {
                    endpoint: Some(gcs.endpoint.clone()),
                    config: [("google_service_account".to_string(), gcs.service_account.display().to_string())].into(),
                    ..Default::default()
                };
                (gcs.fresh_url(name), options, None)
            }
            Backend::LocalEncrypted | Backend::MinioEncrypted => unreachable!("handled above"),
        };
        TestDb::at(url, store_options, dir)
    }

    /// The database at `url`, audited.
    fn at(url: String, store_options: StoreOptions, dir: Option<tempfile::TempDir>) -> TestDb {
        let raw = open_location(&url, &store_options).expect("open location");
        let audit = AuditStore::new(raw.store.clone());
        let location = Location::from_store(Arc::new(audit.clone()), raw.prefix.clone(), raw.url.clone()).with_signer(raw.signer.clone());
        TestDb { url, store_options, audit, location, _dir: dir }
    }

    /// Another handle on the same database (the same audited store; the
    /// directory stays with `self`).
    pub fn handle(&self) -> TestDb {
        TestDb { url: self.url.clone(), store_options: self.store_options.clone(), audit: self.audit.clone(), location: self.location.clone(), _dir: None }
    }

    /// The same database opened (and created) with master key `spec`:
    /// an encrypted database.
    pub fn with_key(mut self, spec: Option<blobhouse_storage::encryption::KeySpec>) -> TestDb {
        self.store_options.encryption = spec.clone();
        self.location = self.location.clone().with_encryption(spec);
        self
    }

    /// A new engine handle on the database (its own key leases and caches);
    /// its download manager (on S3) keeps a request log for [`data_reads`].
    pub async fn engine(&self, mut options: EngineOptions) -> Session {
        if let Some(dm) = options.download.as_mut() {
            dm.record_requests = true;
        }
        Session::open_location(self.location.clone(), self.store_options.clone(), options).await.expect("open engine")
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            let o = self.audit.overwrites();
            assert!(o.is_empty(), "objects were overwritten: {o:?}");
        }
    }
}

/// Settings to reach the harness's MinIO without touching the environment.
pub fn minio_options(minio: &MinioServer) -> StoreOptions {
    StoreOptions {
        access_key_id: Some(blobhouse_testkit::minio::ACCESS_KEY.into()),
        secret_access_key: Some(blobhouse_testkit::minio::SECRET_KEY.into()),
        region: Some("us-east-1".into()),
        endpoint: Some(minio.endpoint.clone()),
        allow_http: Some(true),
        virtual_hosted_style: None,
        ..Default::default()
    }
}

/// Settings to reach the harness's Azurite as a real account is reached:
/// its endpoint, name and shared key (no process environment).
pub fn azurite_options(azurite: &AzuriteServer) -> StoreOptions {
    StoreOptions {
        endpoint: Some(azurite.endpoint.clone()),
        allow_http: Some(true),
        config: [
            ("azure_storage_account_name".to_string(), blobhouse_testkit::azurite::ACCOUNT.to_string()),
            ("azure_storage_account_key".to_string(), blobhouse_testkit::azurite::ACCOUNT_KEY.to_string()),
        ]
        .into(),
        ..Default::default()
    }
}

/// Runs SQL that must succeed.
pub async fn run(engine: &Session, sql: &str) -> QueryResult {
    match engine.execute(sql).await {
        Ok(r) => r,
        Err(e) => panic!("{sql}\nfailed: {e}"),
    }
}

/// Runs SQL that must fail, returning the error text.
pub async fn fail(engine: &Session, sql: &str) -> String {
    match engine.execute(sql).await {
        Ok(r) => panic!("{sql}\nshould have failed but returned {} rows", r.rows()),
        Err(e) => e.to_string(),
    }
}

/// The result as text lines (pretty table).
pub fn text(r: &QueryResult) -> String {
    pretty_format_batches(&r.batches).expect("format").to_string()
}

/// The single value of a one-row, one-column result, as text.
pub fn scalar(r: &QueryResult) -> String {
    let rows = blobhouse_bench::answers::result_rows(&r.batches);
    assert_eq!(rows.len(), 1, "expected one row, got {}", rows.len());
    rows[0][0].clone()
}

/// The result's rows, each as its values joined by `|`.
pub fn lines(r: &QueryResult) -> Vec<String> {
    blobhouse_bench::answers::result_rows(&r.batches).into_iter().map(|row| row.join("|")).collect()
}

/// Options with small row groups, so that small test tables still have many.
pub fn small_chunks(target_chunk_bytes: usize) -> EngineOptions {
    let mut o = EngineOptions::default();
    o.write.target_chunk_bytes = target_chunk_bytes;
    o
}

/// A process running the ignored test `test` of this binary: how the suite
/// starts worker processes (bank, crash harness, killed sessions) without
/// a binary of their own. The worker reads its task from the environment.
pub fn worker_command(test: &str) -> std::process::Command {
    let mut c = std::process::Command::new(std::env::current_exe().expect("the test binary"));
    c.args(["--ignored", "--exact", test, "--nocapture", "--test-threads=1"]);
    c
}

/// Runs scripts/duckdb-oracle.py with `args` (see its doc) and returns the
/// sections it prints, one per query or statement, each "<marker>\n<header>\n<rows>".
pub fn duckdb_oracle(args: &[&std::ffi::OsStr]) -> Vec<String> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let out = std::process::Command::new("python3").arg(root.join("scripts/duckdb-oracle.py")).args(args).output().expect("python3 runs");
    assert!(out.status.success(), "DuckDB failed (run scripts/install-test-deps.sh): {}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    text.split("==> ").filter(|s| !s.is_empty()).map(str::to_string).collect()
}

/// The first node named `name` in `plan`, depth first.
pub fn find(plan: &Arc<dyn datafusion::physical_plan::ExecutionPlan>, name: &str) -> Option<Arc<dyn datafusion::physical_plan::ExecutionPlan>> {
    if plan.name() == name {
        return Some(plan.clone());
    }
    plan.children().into_iter().find_map(|c| find(c, name))
}
