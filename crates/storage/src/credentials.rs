//! AWS named profiles: `~/.aws/credentials` and `~/.aws/config`, as the AWS
//! CLI and SDKs read them — static keys (with a session token) and
//! `credential_process`, the command through which SSO users and credential
//! helpers hand out short-lived keys.
//!
//! object_store resolves environment keys, web identity, container
//! credentials and instance metadata, but no profiles. The AWS SDK's
//! `aws-config` would, at the price of some forty crates and a C build
//! (aws-lc); a profile is two small INI files and a child process, so this
//! module reads them itself and hands object_store a credential provider.
//! Order, as the SDKs have it: keys in the environment or flags, then the
//! profile, then object_store's chain (web identity, container, IMDS).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use object_store::aws::AwsCredential;
use object_store::{CredentialProvider, StaticCredentialProvider};

/// Credentials from a `credential_process` are run again this long before
/// they expire.
pub const REFRESH_BEFORE_EXPIRY: Duration = Duration::from_secs(300);
/// The longest a `credential_process` may run.
const PROCESS_TIMEOUT: Duration = Duration::from_secs(60);

/// What a profile says about credentials.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProfileCredentials {
    /// Keys written in the profile.
    Static { key_id: String, secret_key: String, token: Option<String> },
    /// A command that prints them (JSON, `Version: 1`).
    Process { command: String },
}

/// A profile's settings blobhouse uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Profile {
    pub name: String,
    pub credentials: Option<ProfileCredentials>,
    pub region: Option<String>,
}

/// Where the files are: `AWS_SHARED_CREDENTIALS_FILE` / `AWS_CONFIG_FILE`,
/// else under `~/.aws`.
fn files() -> (Option<PathBuf>, Option<PathBuf>) {
    let home = std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".aws"));
    let pick = |var: &str, name: &str| std::env::var_os(var).map(PathBuf::from).or_else(|| home.as_ref().map(|h| h.join(name)));
    (pick("AWS_SHARED_CREDENTIALS_FILE", "credentials"), pick("AWS_CONFIG_FILE", "config"))
}

/// The sections of an INI file: name → key → value.
fn parse_ini(text: &str) -> HashMap<String, HashMap<String, String>> {
    let mut out: HashMap<String, HashMap<String, String>> = HashMap::new();
    let mut section: Option<String> = None;
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            section = Some(name.trim().to_string());
            out.entry(name.trim().to_string()).or_default();
            continue;
        }
        if let (Some(s), Some((k, v))) = (&section, line.split_once('=')) {
            out.entry(s.clone()).or_default().insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
        }
    }
    out
}

/// The profile to use: `AWS_PROFILE` (an error when no file has it), else
/// `default` if a file has it. `None`: no profile applies.
pub fn profile() -> Result<Option<Profile>, String> {
    let named = std::env::var("AWS_PROFILE").ok().filter(|p| !p.is_empty());
    let name = named.clone().unwrap_or_else(|| "default".to_string());
    let (credentials_file, config_file) = files();
    let read = |f: &Option<PathBuf>| f.as_ref().and_then(|p| std::fs::read_to_string(p).ok()).map(|t| parse_ini(&t)).unwrap_or_default();
    let credentials = read(&credentials_file);
    let config = read(&config_file);
    // In config, profiles other than the default are `[profile NAME]`.
    let in_config = config.get(&format!("profile {name}")).or_else(|| (name == "default").then(|| config.get("default")).flatten());
    let in_credentials = credentials.get(&name);
    if in_config.is_none() && in_credentials.is_none() {
        return match named {
            Some(n) => Err(format!(
                "AWS_PROFILE is '{n}', and no such profile is in {} or {}",
                credentials_file.map_or("the credentials file".into(), |p| p.display().to_string()),
                config_file.map_or("the config file".into(), |p| p.display().to_string())
            )),
            None => Ok(None),
        };
    }
    // Keys in the credentials file win over the config file's.
    let get = |key: &str| in_credentials.and_then(|s| s.get(key)).or_else(|| in_config.and_then(|s| s.get(key))).cloned();
    let credentials = match (get("aws_access_key_id"), get("aws_secret_access_key"), get("credential_process")) {
        (Some(key_id), Some(secret_key), _) => Some(ProfileCredentials::Static { key_id, secret_key, token: get("aws_session_token") }),
        (_, _, Some(command)) => Some(ProfileCredentials::Process { command }),
        _ => None,
    };
    Ok(Some(Profile { name, credentials, region: get("region") }))
}

/// The provider for a profile's credentials.
pub fn provider(profile: &Profile) -> Option<Arc<dyn CredentialProvider<Credential = AwsCredential>>> {
    match profile.credentials.as_ref()? {
        ProfileCredentials::Static { key_id, secret_key, token } => Some(Arc::new(StaticCredentialProvider::new(AwsCredential { key_id: key_id.clone(), secret_key: secret_key.clone(), token: token.clone() }))),
        ProfileCredentials::Process { command } => Some(Arc::new(ProcessProvider { profile: profile.name.clone(), command: command.clone(), cached: tokio::sync::Mutex::new(None) })),
    }
}

/// Runs a profile's `credential_process` and keeps what it printed until
/// [`REFRESH_BEFORE_EXPIRY`] before its `Expiration` (for ever without one).
#[derive(Debug)]
pub struct ProcessProvider {
    profile: String,
    command: String,
    cached: tokio::sync::Mutex<Option<(Arc<AwsCredential>, Option<SystemTime>)>>,
}

#[derive(serde::Deserialize)]
#[serde(rename_all = "PascalCase")]
struct ProcessOutput {
    version: u32,
    access_key_id: String,
    secret_access_key: String,
    session_token: Option<String>,
    expiration: Option<String>,
}

impl ProcessProvider {
    fn error(&self, what: impl std::fmt::Display) -> object_store::Error {
        object_store::Error::Generic { store: "S3", source: format!("the credential_process of AWS profile '{}' (`{}`) {what}", self.profile, self.command).into() }
    }

    async fn run(&self) -> object_store::Result<(Arc<AwsCredential>, Option<SystemTime>)> {
        let child = tokio::process::Command::new("sh").arg("-c").arg(&self.command).stdin(std::process::Stdio::null()).kill_on_drop(true).output();
        let out = tokio::time::timeout(PROCESS_TIMEOUT, child).await.map_err(|_| self.error(format!("did not finish in {} s", PROCESS_TIMEOUT.as_secs())))?.map_err(|e| self.error(format!("could not start: {e}")))?;
        if !out.status.success() {
            let stderr = String::from_utf8_lossy(&out.stderr);
            return Err(self.error(format!("failed ({}): {}", out.status, stderr.trim().lines().last().unwrap_or("no output"))));
        }
        let parsed: ProcessOutput = serde_json::from_slice(&out.stdout).map_err(|e| self.error(format!("printed no credentials JSON ({e}); it must print {{\"Version\": 1, \"AccessKeyId\": …, \"SecretAccessKey\": …}}")))?;
        if parsed.version != 1 {
            return Err(self.error(format!("printed Version {}, only 1 is known", parsed.version)));
        }
        let expires = match &parsed.expiration {
            Some(t) => Some(
                chrono::DateTime::parse_from_rfc3339(t)
                    .map(|d| SystemTime::UNIX_EPOCH + Duration::from_secs(d.timestamp().max(0) as u64))
                    .map_err(|e| self.error(format!("printed an Expiration that is not RFC 3339 ({t}: {e})")))?,
            ),
            None => None,
        };
        let credential = AwsCredential { key_id: parsed.access_key_id, secret_key: parsed.secret_access_key, token: parsed.session_token };
        Ok((Arc::new(credential), expires))
    }
}

#[async_trait::async_trait]
impl CredentialProvider for ProcessProvider {
    type Credential = AwsCredential;

    async fn get_credential(&self) -> object_store::Result<Arc<AwsCredential>> {
        let mut cached = self.cached.lock().await;
        if let Some((credential, expires)) = cached.as_ref() {
            let fresh = expires.is_none_or(|at| SystemTime::now() + REFRESH_BEFORE_EXPIRY < at);
            if fresh {
                return Ok(credential.clone());
            }
        }
        let (credential, expires) = self.run().await?;
        *cached = Some((credential.clone(), expires));
        Ok(credential)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ini_sections_keys_and_comments() {
        let ini = parse_ini("# c\n[default]\naws_access_key_id = AK\n; c\n[profile dev]\nCredential_Process = /bin/x --flag=1\nregion=eu-west-1\n");
        assert_eq!(ini["default"]["aws_access_key_id"], "AK");
        assert_eq!(ini["profile dev"]["credential_process"], "/bin/x --flag=1");
        assert_eq!(ini["profile dev"]["region"], "eu-west-1");
    }

    #[tokio::test]
    async fn a_process_is_run_again_only_when_its_credentials_near_expiry() {
        let dir = tempfile::tempdir().unwrap();
        let count = dir.path().join("runs");
        let in_an_hour = chrono_like_rfc3339(SystemTime::now() + Duration::from_secs(3600));
        let in_a_minute = chrono_like_rfc3339(SystemTime::now() + Duration::from_secs(60));
        let script = |expiration: &str| format!("echo x >> {}; printf '{{\"Version\": 1, \"AccessKeyId\": \"AK\", \"SecretAccessKey\": \"SK\", \"SessionToken\": \"T\", \"Expiration\": \"{expiration}\"}}'", count.display());
        let runs = || std::fs::read_to_string(&count).map_or(0, |t| t.lines().count());

        let lasting = ProcessProvider { profile: "p".into(), command: script(&in_an_hour), cached: Default::default() };
        for _ in 0..3 {
            let c = lasting.get_credential().await.unwrap();
            assert_eq!((c.key_id.as_str(), c.token.as_deref()), ("AK", Some("T")));
        }
        assert_eq!(runs(), 1, "cached while an hour remains");
        // Inside the refresh margin: every call runs it again.
        let expiring = ProcessProvider { profile: "p".into(), command: script(&in_a_minute), cached: Default::default() };
        expiring.get_credential().await.unwrap();
        expiring.get_credential().await.unwrap();
        assert_eq!(runs(), 3);

        let failing = ProcessProvider { profile: "sso".into(), command: "echo 'token expired, run aws sso login' >&2; exit 3".into(), cached: Default::default() };
        let e = failing.get_credential().await.unwrap_err().to_string();
        assert!(e.contains("profile 'sso'") && e.contains("aws sso login"), "{e}");
    }

    /// `t` as RFC 3339 in UTC.
    fn chrono_like_rfc3339(t: SystemTime) -> String {
        let secs = t.duration_since(SystemTime::UNIX_EPOCH).unwrap().as_secs() as i64;
        datafusion::arrow::temporal_conversions::timestamp_s_to_datetime(secs).unwrap().format("%Y-%m-%dT%H:%M:%SZ").to_string()
    }
}
