//! From a database URL to an object store and a prefix inside it.
//!
//! A database is one URL: `file:///path` (or a plain path), `s3://bucket/prefix`,
//! `gs://bucket/prefix`, `az://container/prefix`, or `memory://`. S3 settings
//! follow the AWS conventions (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`,
//! `AWS_REGION`, `AWS_ENDPOINT_URL`, `AWS_ALLOW_HTTP`, …) read from the
//! environment; [`StoreOptions`] overrides them (the CLI's flags land here).
//! GCS and Azure read theirs (`GOOGLE_*`, `AZURE_*`) the same way, and
//! [`StoreOptions::config`] sets any of object_store's keys for the URL's
//! cloud. object_store does the actual talking; this module only configures
//! it.

use std::sync::Arc;

use object_store::ObjectStore;
use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};
use object_store::{ClientConfigKey, RetryConfig};
use object_store::azure::MicrosoftAzureBuilder;
use object_store::gcp::GoogleCloudStorageBuilder;
use object_store::local::LocalFileSystem;
use object_store::memory::InMemory;
use object_store::path::Path;
use object_store::signer::Signer;
use url::Url;

use crate::error::{Result, StorageError};

/// Overrides of the environment's object-store settings. `None` keeps the
/// environment's value (or the store's default).
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct StoreOptions {
    /// S3 access key id (overrides `AWS_ACCESS_KEY_ID`).
    pub access_key_id: Option<String>,
    /// S3 secret access key (overrides `AWS_SECRET_ACCESS_KEY`).
    pub secret_access_key: Option<String>,
    /// S3 region (overrides `AWS_REGION`).
    pub region: Option<String>,
    /// Endpoint of an S3-compatible store, e.g. `http://127.0.0.1:9000`
    /// (overrides `AWS_ENDPOINT_URL`). An `http://` endpoint implies `allow_http`.
    pub endpoint: Option<String>,
    /// Permit plain-HTTP connections (overrides `AWS_ALLOW_HTTP`).
    pub allow_http: Option<bool>,
    /// Use virtual-hosted-style requests (`bucket.host`) instead of path style.
    /// S3-compatible servers usually want path style, the default with an endpoint.
    pub virtual_hosted_style: Option<bool>,
    /// object_store settings by name for the URL's cloud, applied over the
    /// environment's (`aws_session_token`, `google_service_account`,
    /// `azure_storage_account_name`, `azure_storage_sas_token`, …; the
    /// keys of `AmazonS3ConfigKey`, `GoogleConfigKey`, `AzureConfigKey`).
    /// The CLI's `--store-option KEY=VALUE`. A key the URL's cloud does not
    /// know is an error naming it.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub config: std::collections::BTreeMap<String, String>,
    /// The master key of an encrypted database: creates the database
    /// encrypted, and opens one (`crate::encryption`). Not a store setting,
    /// but it travels with them to everything that opens the database
    /// (the engine, workers, the storage node).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encryption: Option<crate::encryption::KeySpec>,
}

impl StoreOptions {
    /// These settings for the database at `url` as the environment
    /// variables object_store reads (`AWS_*`, `AZURE_*`, `GOOGLE_*`): how a
    /// process this one starts (a local cluster worker) gets the same
    /// store without a secret on its command line.
    pub fn as_env(&self, url: &str) -> Vec<(String, String)> {
        let prefix = match url.split("://").next().unwrap_or_default() {
            "gs" => "GOOGLE",
            "az" | "abfs" | "abfss" | "azure" => "AZURE",
            _ => "AWS",
        };
        let mut env = Vec::new();
        let mut set = |k: &str, v: &str| env.push((k.to_string(), v.to_string()));
        if let Some(v) = &self.access_key_id {
            set("AWS_ACCESS_KEY_ID", v);
        }
        if let Some(v) = &self.secret_access_key {
            set("AWS_SECRET_ACCESS_KEY", v);
        }
        if let Some(v) = &self.region {
            set("AWS_REGION", v);
        }
        if let Some(ep) = &self.endpoint {
            set(match prefix { "GOOGLE" => "GOOGLE_BASE_URL", "AZURE" => "AZURE_STORAGE_ENDPOINT", _ => "AWS_ENDPOINT_URL" }, ep);
            if ep.starts_with("http://") {
                set(&format!("{prefix}_ALLOW_HTTP"), "true");
            }
        }
        if let Some(v) = self.allow_http {
            set(&format!("{prefix}_ALLOW_HTTP"), if v { "true" } else { "false" });
        }
        if let Some(v) = self.virtual_hosted_style {
            set("AWS_VIRTUAL_HOSTED_STYLE_REQUEST", if v { "true" } else { "false" });
        }
        for (k, v) in &self.config {
            set(&k.to_ascii_uppercase(), v);
        }
        if let Some(spec) = &self.encryption {
            env.extend(spec.as_env());
        }
        env
    }
}

/// A `config` key that the URL's cloud does not know.
fn unknown_key(url: &str, key: &str, cloud: &str) -> StorageError {
    StorageError::InvalidUrl { url: url.to_string(), reason: format!("unknown store option '{key}' for {cloud} (object_store's {cloud} configuration keys are accepted, e.g. {})", match cloud {
        "S3" => "aws_session_token, aws_region",
        "GCS" => "google_service_account, google_base_url",
        _ => "azure_storage_account_name, azure_storage_account_key, azure_storage_sas_token, azure_storage_endpoint",
    }) }
}

/// An opened location: the store, the prefix of the database inside it, and
/// the URL for messages.
#[derive(Debug, Clone)]
pub struct Location {
    /// The object store holding the database.
    pub store: Arc<dyn ObjectStore>,
    /// The database's prefix inside the store; every object lives under it.
    pub prefix: Path,
    /// The URL the user gave, normalised, for error messages and display.
    pub url: String,
    /// Presigns requests for the store (S3, GCS, Azure), so the download
    /// manager can fetch data ranges without holding credentials itself;
    /// `None` for local and in-memory stores, which object_store reads.
    pub signer: Option<Arc<dyn Signer>>,
    /// Where the master key of the database is, if one was given
    /// ([`StoreOptions::encryption`]).
    pub encryption: Option<crate::encryption::KeySpec>,
}

impl Location {
    /// Wraps an existing store (tests wrap stores to observe or police requests).
    pub fn from_store(store: Arc<dyn ObjectStore>, prefix: Path, url: impl Into<String>) -> Self {
        Location { store, prefix, url: url.into(), signer: None, encryption: None }
    }

    /// The same location, opening the database with the master key `spec`.
    pub fn with_encryption(mut self, spec: Option<crate::encryption::KeySpec>) -> Self {
        self.encryption = spec;
        self
    }

    /// The same location with a signer for presigned data reads (tests
    /// wrap a store and keep the original's signer).
    pub fn with_signer(mut self, signer: Option<Arc<dyn Signer>>) -> Self {
        self.signer = signer;
        self
    }

    /// The path of `relative` inside the database.
    pub fn child(&self, relative: &str) -> Path {
        let mut p = self.prefix.clone();
        for part in relative.split('/').filter(|s| !s.is_empty()) {
            p = p.clone().join(part);
        }
        p
    }

    /// Whether the store lists from an offset on the server (S3's
    /// `start-after`, GCS's `startOffset`), so that listing what follows a
    /// name costs one request however much precedes it. object_store
    /// emulates the offset elsewhere by listing everything (Azure, HTTP),
    /// and a local directory is walked whole either way.
    pub fn lists_after_offset(&self) -> bool {
        matches!(self.url.split("://").next(), Some("s3" | "s3a" | "gs"))
    }

    /// The path of a stored object relative to the database (as listed:
    /// `objects/…`, `iceberg/…`), the inverse of [`Location::child`].
    pub fn relative(&self, path: &Path) -> String {
        let p = path.to_string();
        let root = self.prefix.as_ref();
        if root.is_empty() { p } else { p.strip_prefix(&format!("{root}/")).map(str::to_string).unwrap_or(p) }
    }

    /// A full URL of an object, for messages.
    pub fn display(&self, path: &Path) -> String {
        let base = self.url.trim_end_matches('/');
        let rel = path.as_ref().strip_prefix(self.prefix.as_ref()).unwrap_or(path.as_ref());
        format!("{base}/{}", rel.trim_start_matches('/'))
    }
}

/// How long to wait for a TCP connection before counting the attempt failed.
const CONNECT_TIMEOUT: &str = "5s";

/// Retries of control-plane requests. object_store's default keeps retrying for
/// three minutes, which makes a wrong endpoint look like a hang; a few quick
/// retries cover transient errors and then the user gets a clear error.
fn retry_config() -> RetryConfig {
    RetryConfig { max_retries: 3, retry_timeout: std::time::Duration::from_secs(20), ..Default::default() }
}

/// Opens the object store behind a database URL (with the master key the
/// options name, for an encrypted database).
pub fn open_location(url: &str, options: &StoreOptions) -> Result<Location> {
    open_store(url, options).map(|l| l.with_encryption(options.encryption.clone()))
}

fn open_store(url: &str, options: &StoreOptions) -> Result<Location> {
    let invalid = |reason: String| StorageError::InvalidUrl { url: url.to_string(), reason };
    if url.is_empty() {
        return Err(invalid("empty URL".into()));
    }
    // A plain path is a local directory.
    if !url.contains("://") {
        let abs = std::path::absolute(url).map_err(|e| invalid(e.to_string()))?;
        return open_local(&abs, url);
    }
    let parsed = Url::parse(url).map_err(|e| invalid(e.to_string()))?;
    let key_prefix = || Path::from(parsed.path().trim_matches('/'));
    match parsed.scheme() {
        "file" => {
            let p = parsed.to_file_path().map_err(|_| invalid("not a local path".into()))?;
            open_local(&p, url)
        }
        "memory" => Ok(Location::from_store(Arc::new(InMemory::new()), key_prefix(), url)),
        "s3" | "s3a" => {
            let bucket = parsed.host_str().filter(|b| !b.is_empty()).ok_or_else(|| invalid("missing bucket name".into()))?;
            let mut b = AmazonS3Builder::from_env().with_bucket_name(bucket);
            for (k, v) in &options.config {
                b = b.with_config(k.parse().map_err(|_| unknown_key(url, k, "S3"))?, v);
            }
            // A named profile, where no keys are given (crate::credentials).
            let keys_given = options.access_key_id.is_some() || std::env::var_os("AWS_ACCESS_KEY_ID").is_some() || options.config.contains_key("aws_access_key_id");
            if !keys_given && let Some(profile) = crate::credentials::profile().map_err(invalid)? {
                if let Some(provider) = crate::credentials::provider(&profile) {
                    b = b.with_credentials(provider);
                }
                if let Some(region) = profile.region.filter(|_| std::env::var_os("AWS_REGION").is_none() && std::env::var_os("AWS_DEFAULT_REGION").is_none()) {
                    b = b.with_region(region);
                }
            }
            if let Some(v) = &options.access_key_id { b = b.with_access_key_id(v); }
            if let Some(v) = &options.secret_access_key { b = b.with_secret_access_key(v); }
            if let Some(v) = &options.region { b = b.with_region(v); }
            let endpoint = options.endpoint.clone().or_else(|| std::env::var("AWS_ENDPOINT_URL").ok()).or_else(|| std::env::var("AWS_ENDPOINT").ok());
            if let Some(ep) = &endpoint {
                b = b.with_endpoint(ep);
                if ep.starts_with("http://") && options.allow_http.is_none() && std::env::var("AWS_ALLOW_HTTP").is_err() {
                    b = b.with_allow_http(true);
                }
                if std::env::var("AWS_REGION").is_err() && std::env::var("AWS_DEFAULT_REGION").is_err() && options.region.is_none() {
                    b = b.with_region("us-east-1");
                }
            }
            if let Some(v) = options.allow_http { b = b.with_allow_http(v); }
            if let Some(v) = options.virtual_hosted_style { b = b.with_virtual_hosted_style_request(v); }
            b = b
                .with_retry(retry_config())
                .with_config(AmazonS3ConfigKey::Client(ClientConfigKey::ConnectTimeout), CONNECT_TIMEOUT);
            let store = Arc::new(b.build().map_err(|e| invalid(e.to_string()))?);
            Ok(Location::from_store(store.clone(), key_prefix(), url).with_signer(Some(store)))
        }
        "gs" => {
            let mut b = GoogleCloudStorageBuilder::from_env().with_url(url);
            for (k, v) in &options.config {
                b = b.with_config(k.parse().map_err(|_| unknown_key(url, k, "GCS"))?, v);
            }
            if let Some(ep) = &options.endpoint {
                b = b.with_config(object_store::gcp::GoogleConfigKey::BaseUrl, ep);
                if ep.starts_with("http://") {
                    b = b.with_config(object_store::gcp::GoogleConfigKey::Client(ClientConfigKey::AllowHttp), "true");
                }
            }
            let store = Arc::new(b.with_retry(retry_config()).build().map_err(|e| invalid(e.to_string()))?);
            Ok(Location::from_store(store.clone(), key_prefix(), url).with_signer(Some(store)))
        }
        "az" | "abfs" | "abfss" | "azure" => {
            let mut b = MicrosoftAzureBuilder::from_env().with_url(url);
            for (k, v) in &options.config {
                b = b.with_config(k.parse().map_err(|_| unknown_key(url, k, "Azure"))?, v);
            }
            if let Some(ep) = &options.endpoint {
                b = b.with_endpoint(ep.clone());
                if ep.starts_with("http://") || options.allow_http == Some(true) {
                    b = b.with_allow_http(true);
                }
            }
            let store = Arc::new(b.with_retry(retry_config()).build().map_err(|e| invalid(e.to_string()))?);
            Ok(Location::from_store(store.clone(), key_prefix(), url).with_signer(Some(store)))
        }
        other => Err(invalid(format!("unsupported scheme '{other}'; use file://, s3://, gs://, az:// or memory://"))),
    }
}

fn open_local(dir: &std::path::Path, original: &str) -> Result<Location> {
    std::fs::create_dir_all(dir).map_err(|e| StorageError::InvalidUrl {
        url: original.to_string(),
        reason: format!("cannot create directory {}: {e}", dir.display()),
    })?;
    let store = LocalFileSystem::new_with_prefix(dir).map_err(|e| StorageError::InvalidUrl {
        url: original.to_string(),
        reason: e.to_string(),
    })?;
    Ok(Location::from_store(Arc::new(store), Path::default(), format!("file://{}", dir.display())))
}
