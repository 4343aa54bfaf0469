//! Typed errors of the storage layer.
//!
//! Every variant names what failed — the object (as a full URL), the table, or
//! the endpoint — and, where we can tell, what the user should do about it.

use std::fmt;

/// Result alias of the storage layer.
pub type Result<T, E = StorageError> = std::result::Result<T, E>;

/// An error of the storage layer. Displays as one line a user can act on.
#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    /// The database URL could not be understood.
    #[error("invalid database URL '{url}': {reason}")]
    InvalidUrl { url: String, reason: String },

    /// A request to the object store failed. Displays the store's answer
    /// in short (`detail`: the error code and message of an XML or JSON
    /// reply, not the reply); `source` keeps it whole.
    #[error("{op} {location} failed: {detail}{hint}")]
    Store {
        op: &'static str,
        location: String,
        #[source]
        source: object_store::Error,
        detail: String,
        hint: Hint,
    },

    /// An object exists but its content is not what the format says it must be.
    #[error("corrupt object {location}: {reason}. The object may be truncated or was not written by blobhouse; restore it from a snapshot or drop the table")]
    Corrupt { location: String, reason: String },

    /// An encrypted database's keys are missing, wrong or unusable.
    #[error("cannot open the keys of database {location}: {reason}")]
    Keys { location: String, reason: String },

    /// The URL points at something that is not a blobhouse database.
    #[error("{location} is not a blobhouse database ({reason})")]
    NotADatabase { location: String, reason: String },

    /// The database was written by a newer version of blobhouse.
    #[error("database at {location} has format version {found}, this blobhouse reads versions up to {supported}; upgrade blobhouse")]
    UnsupportedFormat { location: String, found: u32, supported: u32 },

    /// A database version that is not on the store.
    #[error("database {location} has no version {version} (it was never committed, or garbage collection removed it)")]
    VersionNotFound { location: String, version: u64 },

    /// A version older than the garbage-collection horizon.
    #[error("version {version} has expired: VACUUM removed the versions before {horizon} (SHOW VERSIONS lists what is left; snapshots keep versions from expiring)")]
    VersionExpired { version: u64, horizon: u64 },

    /// Time travel to before the oldest version kept.
    #[error("no version was current at {} UTC: the oldest version kept is {oldest} (SHOW VERSIONS lists them)", crate::format::format_ms(*at_ms))]
    NoVersionAt { at_ms: u64, oldest: u64 },

    /// The version's PUT failed in a way that does not tell whether it
    /// landed (a lost response, a timeout).
    #[error("the commit of version {version} may or may not have happened ({cause}); its data was kept — SHOW VERSIONS tells, and VACUUM removes it if it did not")]
    CommitUnknown { version: u64, cause: String },

    /// A fail point made this step fail (fault-injection tests only).
    #[error("injected failure at fail point {0}")]
    Injected(String),

    /// A snapshot name already in use.
    #[error("snapshot '{0}' already exists (SHOW SNAPSHOTS lists them; DROP SNAPSHOT frees the name)")]
    SnapshotExists(String),

    /// No snapshot of that name.
    #[error("snapshot '{0}' does not exist (SHOW SNAPSHOTS lists them)")]
    SnapshotNotFound(String),

    /// A table that the operation needs does not exist.
    #[error("table '{0}' does not exist (SHOW TABLES lists the tables)")]
    TableNotFound(String),

    /// A table of that name already exists.
    #[error("table '{0}' already exists (use CREATE TABLE IF NOT EXISTS, or DROP TABLE first)")]
    TableExists(String),

    /// A concurrent transaction changed what this one depends on.
    #[error("commit conflict on table '{table}': {reason}; the statement had no effect, run it again")]
    Conflict { table: String, reason: String },

    /// Snapshot isolation refused the commit: a concurrent transaction
    /// deleted, updated or rewrote rows this one deletes or updates, and
    /// committed first (SQLSTATE 40001 in PostgreSQL's terms).
    #[error("serialization failure on table '{table}': {reason}; the transaction was rolled back, nothing of it is visible — run it again")]
    Serialization { table: String, reason: String },

    /// The commit kept losing the race for the next database version.
    #[error("could not commit after {attempts} attempts: other writers kept committing first; the statement had no effect, run it again")]
    TooManyRetries { attempts: u32 },

    /// Encoding or decoding Parquet failed.
    #[error("parquet error in {location}: {source}")]
    Parquet {
        location: String,
        #[source]
        source: parquet::errors::ParquetError,
    },

    /// Data given to a writer does not fit the table.
    #[error("{0}")]
    InvalidData(String),

    /// The Iceberg metadata of a table could not be written or read
    /// (`crate::iceberg`); blobhouse's own commit is not affected.
    #[error("Iceberg metadata of table '{table}': {reason}")]
    Iceberg { table: String, reason: String },
}

/// A remedy appended to a store error, derived from what the store answered.
#[derive(Debug, Default)]
pub struct Hint(pub Option<&'static str>);

impl fmt::Display for Hint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(h) => write!(f, ". Hint: {h}"),
            None => Ok(()),
        }
    }
}

/// The cloud behind a database URL: hints name its settings, not another's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cloud {
    S3,
    Gcs,
    Azure,
    /// Local directories, memory, HTTP.
    Other,
}

impl Cloud {
    /// The cloud of a URL (or of an object's URL), by its scheme.
    pub fn of(url: &str) -> Cloud {
        match url.split("://").next().unwrap_or_default() {
            "s3" | "s3a" => Cloud::S3,
            "gs" => Cloud::Gcs,
            "az" | "abfs" | "abfss" | "azure" => Cloud::Azure,
            _ => Cloud::Other,
        }
    }

    fn missing_bucket(self) -> &'static str {
        match self {
            Cloud::Azure => "create the container first, or fix the container name in the URL",
            _ => "create the bucket first, or fix the bucket name in the URL",
        }
    }

    fn refused(self) -> &'static str {
        match self {
            Cloud::S3 | Cloud::Other => "the store refused the credentials; check AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (or --access-key-id / --secret-access-key), or the profile or role the credential chain found",
            Cloud::Gcs => "the store refused the credentials; check GOOGLE_APPLICATION_CREDENTIALS (or GOOGLE_SERVICE_ACCOUNT: a service-account JSON file) or the application default credentials (gcloud auth application-default login), and the account's roles on the bucket",
            Cloud::Azure => "the store refused the credentials; check AZURE_STORAGE_ACCOUNT_NAME with AZURE_STORAGE_ACCOUNT_KEY or AZURE_STORAGE_SAS_TOKEN (or AZURE_CLIENT_ID / AZURE_TENANT_ID / AZURE_CLIENT_SECRET for a service principal), and its role on the container",
        }
    }

    /// When the error came from the last source of the cloud's credential
    /// chain (a metadata service), the chain found nothing: what it tried.
    fn no_credentials(self, lower: &str) -> Option<&'static str> {
        match self {
            // IMDS's paths (its address can be moved: AWS_METADATA_ENDPOINT),
            // or the ECS agent's address.
            Cloud::S3 | Cloud::Other if lower.contains("/latest/api/token") || lower.contains("/latest/meta-data") || lower.contains("169.254.170.2") => Some(
                "no AWS credentials found: none in the environment or flags (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, --access-key-id / --secret-access-key), no web identity (AWS_WEB_IDENTITY_TOKEN_FILE with AWS_ROLE_ARN), no container credentials (AWS_CONTAINER_CREDENTIALS_RELATIVE_URI or _FULL_URI), and the EC2 instance metadata service gave none",
            ),
            Cloud::Gcs if lower.contains("computemetadata") || lower.contains("metadata.google.internal") => Some(
                "no GCS credentials found: no service account (GOOGLE_APPLICATION_CREDENTIALS, GOOGLE_SERVICE_ACCOUNT or GOOGLE_SERVICE_ACCOUNT_KEY), no application default credentials, and the GCE metadata server gave none",
            ),
            Cloud::Azure if lower.contains("metadata/identity") => Some(
                "no Azure credentials found: no account key, SAS token or service principal (AZURE_STORAGE_ACCOUNT_KEY, AZURE_STORAGE_SAS_TOKEN, AZURE_CLIENT_ID with AZURE_TENANT_ID), no workload identity, and the managed identity endpoint gave none",
            ),
            _ => None,
        }
    }

    fn unreachable(self) -> &'static str {
        match self {
            Cloud::S3 | Cloud::Other => "the endpoint did not answer; check AWS_ENDPOINT_URL / --endpoint and that the server is running",
            Cloud::Gcs => "the endpoint did not answer; check GOOGLE_BASE_URL (set for an emulator) and the network path to storage.googleapis.com",
            Cloud::Azure => "the endpoint did not answer; check AZURE_STORAGE_ENDPOINT (or AZURE_STORAGE_USE_EMULATOR / AZURITE_BLOB_STORAGE_URL for Azurite) and the network path to the account",
        }
    }
}

/// The whole text of an object-store error and its causes.
fn chain_text(err: &object_store::Error) -> String {
    let mut text = err.to_string();
    let mut src = std::error::Error::source(err);
    while let Some(s) = src {
        let more = s.to_string();
        if !text.contains(&more) {
            text.push(' ');
            text.push_str(&more);
        }
        src = s.source();
    }
    text
}

/// The longest store answer shown in full; longer ones are cut.
const MAX_DETAIL: usize = 300;

/// The store's answer in one short line: for a missing bucket or container
/// one sentence; for an XML (S3, Azure) or JSON (GCS) error reply its code
/// and message instead of the document; otherwise the text, cut at
/// [`MAX_DETAIL`] characters.
pub fn summarize(err: &object_store::Error, cloud: Cloud) -> String {
    let text = chain_text(err);
    let lower = text.to_ascii_lowercase();
    if let Some(tried) = cloud.no_credentials(&lower) {
        return tried.to_string();
    }
    if ["nosuchbucket", "bucket does not exist", "containernotfound", "container does not exist"].iter().any(|n| lower.contains(n)) {
        return match cloud {
            Cloud::Azure => "the container does not exist".to_string(),
            _ => "the bucket does not exist".to_string(),
        };
    }
    let between = |open: &str, close: &str| -> Option<String> {
        let start = text.find(open)? + open.len();
        let end = text[start..].find(close)? + start;
        Some(text[start..end].trim().to_string())
    };
    let status = ["status ", "Status "].iter().find_map(|p| {
        let at = text.find(p)? + p.len();
        let code: String = text[at..].chars().take_while(|c| c.is_ascii_digit()).collect();
        (code.len() == 3).then_some(code)
    });
    let (code, message) = match (between("<Code>", "</Code>"), between("<Message>", "</Message>")) {
        (Some(c), m) => (Some(c), m),
        _ => (None, between("\"message\": \"", "\"").or_else(|| between("\"message\":\"", "\""))),
    };
    if code.is_some() || (message.is_some() && text.len() > MAX_DETAIL) {
        let mut out = String::new();
        if let Some(s) = status {
            out.push_str(&format!("HTTP {s} "));
        }
        if let Some(c) = code {
            out.push_str(&c);
            out.push_str(": ");
        }
        out.push_str(message.as_deref().unwrap_or("(no message)"));
        // Azure appends request ids and times to its messages; the hint
        // that may follow brings its own full stop.
        return out.lines().next().unwrap_or_default().trim_end_matches('.').to_string();
    }
    if text.chars().count() > MAX_DETAIL {
        let cut: String = text.chars().take(MAX_DETAIL).collect();
        return format!("{cut}…");
    }
    text
}

impl Hint {
    /// Guesses a remedy from the text of an object-store error on `cloud`,
    /// naming that cloud's settings. The store's own message stays in the
    /// error; this only adds the likely fix.
    pub fn for_error(err: &object_store::Error, cloud: Cloud) -> Self {
        let t = chain_text(err).to_ascii_lowercase();
        let any = |needles: &[&str]| needles.iter().any(|n| t.contains(n));
        // Match status lines and error codes, never bare numbers: object
        // names are hex and may contain "403" or "404".
        let hint = if cloud.no_credentials(&t).is_some() {
            Some(match cloud {
                Cloud::Gcs => "point GOOGLE_APPLICATION_CREDENTIALS at a service-account key file (or run gcloud auth application-default login), or run on GCP with a service account attached",
                Cloud::Azure => "set AZURE_STORAGE_ACCOUNT_NAME with AZURE_STORAGE_ACCOUNT_KEY or AZURE_STORAGE_SAS_TOKEN (or --store-option), or run on Azure with a managed identity",
                _ => "set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or --access-key-id / --secret-access-key), or run where a role is attached (EC2 instance profile, ECS task role, EKS IRSA)",
            })
        } else if any(&["nosuchbucket", "bucket does not exist", "containernotfound", "container does not exist"]) {
            Some(cloud.missing_bucket())
        } else if any(&[
            "invalidaccesskeyid",
            "signaturedoesnotmatch",
            "accessdenied",
            "access denied",
            "status 403",
            "403 forbidden",
            "status 401",
            "401 unauthorized",
            "invalidtoken",
            "expiredtoken",
            "authenticationfailed",
            "authorizationfailure",
            "authorizationpermissionmismatch",
        ]) {
            Some(cloud.refused())
        } else if any(&["connection refused", "error sending request", "dns error", "timed out", "connect error", "tcp connect"]) {
            Some(cloud.unreachable())
        } else {
            None
        };
        Hint(hint)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn generic(msg: &str) -> object_store::Error {
        object_store::Error::Generic { store: "S3", source: msg.to_string().into() }
    }

    #[test]
    fn hints_follow_status_and_codes_not_digits_in_names() {
        assert!(Hint::for_error(&generic("Client error with status 403 Forbidden: <Code>InvalidAccessKeyId</Code>"), Cloud::S3).0.unwrap().contains("credentials"));
        assert!(Hint::for_error(&generic("<Code>NoSuchBucket</Code>"), Cloud::S3).0.unwrap().contains("bucket"));
        assert!(Hint::for_error(&generic("error sending request for url: Connection refused"), Cloud::S3).0.unwrap().contains("endpoint"));
        // An object named with "403" in it is no credential problem.
        assert!(Hint::for_error(&generic("object objects/a403/0000000000100403.parquet is bad"), Cloud::S3).0.is_none());
    }

    #[test]
    fn hints_name_the_settings_of_the_cloud_in_the_url() {
        let refused = generic("Client error with status 403 Forbidden: <Code>AuthenticationFailed</Code>");
        let gcs = Hint::for_error(&refused, Cloud::of("gs://b/db")).0.unwrap();
        let azure = Hint::for_error(&refused, Cloud::of("az://c/db")).0.unwrap();
        assert!(gcs.contains("GOOGLE_APPLICATION_CREDENTIALS") && !gcs.contains("AWS_"), "{gcs}");
        assert!(azure.contains("AZURE_STORAGE_ACCOUNT_KEY") && !azure.contains("AWS_"), "{azure}");
        let down = generic("error sending request for url: Connection refused");
        assert!(!Hint::for_error(&down, Cloud::Azure).0.unwrap().contains("AWS_"));
        assert!(Hint::for_error(&generic("<Code>ContainerNotFound</Code>"), Cloud::Azure).0.unwrap().contains("container"));
    }

    #[test]
    fn a_store_answer_is_shown_short() {
        let xml = format!(
            "Client error with status 404 Not Found: <?xml version=\"1.0\" encoding=\"utf-8\"?><Error><Code>ContainerNotFound</Code><Message>The specified container does not exist.\nRequestId:{}\nTime:2026-11-28</Message></Error>",
            "x".repeat(1500)
        );
        assert_eq!(summarize(&generic(&xml), Cloud::Azure), "the container does not exist");
        let denied = "Client error with status 403 Forbidden: <?xml version=\"1.0\"?><Error><Code>AccessDenied</Code><Message>Access Denied.</Message><Resource>/b/db</Resource></Error>";
        assert_eq!(summarize(&generic(denied), Cloud::S3), "HTTP 403 AccessDenied: Access Denied");
        let json = format!("Client error with status 401 Unauthorized: {{\"error\": {{\"code\": 401, \"message\": \"Invalid Credentials\", \"errors\": [{}]}}}}", "{}".repeat(200));
        assert_eq!(summarize(&generic(&json), Cloud::Gcs), "HTTP 401 Invalid Credentials");
        let long = "y".repeat(2000);
        assert!(summarize(&generic(&long), Cloud::S3).chars().count() <= MAX_DETAIL + 1);
        assert_eq!(summarize(&generic("short"), Cloud::S3), "Generic S3 error: short");
    }

    #[test]
    fn a_credential_chain_that_found_nothing_says_what_it_tried_once() {
        let imds = generic("Error performing PUT http://169.254.169.254/latest/api/token in 3.9ms - Server returned non-2xx status code: 403 Forbidden");
        let detail = summarize(&imds, Cloud::S3);
        assert!(detail.starts_with("no AWS credentials found") && detail.contains("AWS_WEB_IDENTITY_TOKEN_FILE") && !detail.contains("169.254"), "{detail}");
        assert!(Hint::for_error(&imds, Cloud::S3).0.unwrap().contains("AWS_ACCESS_KEY_ID"));
        let gce = generic("error sending request for url (http://metadata.google.internal/computeMetadata/v1/instance/service-accounts/default/token)");
        assert!(summarize(&gce, Cloud::Gcs).starts_with("no GCS credentials found"));
        assert!(Hint::for_error(&gce, Cloud::Gcs).0.unwrap().contains("GOOGLE_APPLICATION_CREDENTIALS"));
        let msi = generic("error sending request for url (http://169.254.169.254/metadata/identity/oauth2/token?api-version=2019-08-01)");
        assert!(summarize(&msi, Cloud::Azure).starts_with("no Azure credentials found"));
    }
}

impl StorageError {
    /// Wraps an object-store error with the operation and the object's URL.
    pub fn store(op: &'static str, location: impl Into<String>, source: object_store::Error) -> Self {
        let location = location.into();
        let cloud = Cloud::of(&location);
        let hint = Hint::for_error(&source, cloud);
        let detail = summarize(&source, cloud);
        StorageError::Store { op, location, source, detail, hint }
    }

    /// True when the store said the object does not exist.
    pub fn is_not_found(&self) -> bool {
        matches!(self, StorageError::Store { source: object_store::Error::NotFound { .. }, .. })
    }
}
