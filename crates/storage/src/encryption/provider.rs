//! Key providers: where the master key of an encrypted database lives, and
//! the two operations blobhouse asks of it — wrap the database key when the
//! database is created (or its master key rotated), unwrap it when the
//! database is opened. The master key itself never reaches the store, and
//! with a KMS it never reaches this process either.
//!
//! One small trait, like object_store's `CredentialProvider`: a local key
//! (a file or an environment variable) and AWS KMS ([`super::kms`]) are its
//! two implementations; another KMS is one more.

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;

use ring::aead::{AES_256_GCM, Aad, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};
use ring::rand::{SecureRandom, SystemRandom};
use serde::{Deserialize, Serialize};

/// Length of every key blobhouse makes or accepts: AES-256.
pub const KEY_LEN: usize = 32;
/// Bytes AES-GCM adds to what it seals: the random nonce in front, the tag
/// behind.
pub const SEAL_OVERHEAD: usize = NONCE_LEN + 16;

/// Why a key could not be had or used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    /// The key given is not a usable key (its text, its length).
    #[error("{source_name}: {reason}")]
    Invalid { source_name: String, reason: String },
    /// Wrapped bytes did not unwrap with this key: another key wrapped
    /// them, or they were changed.
    #[error("the key {key_id} does not unwrap it: it was wrapped by another key, or its bytes were changed")]
    WrongKey { key_id: String },
    /// A KMS refused or could not be reached.
    #[error("{0}")]
    Kms(String),
}

/// Where a database's master key is. Chosen by the user (`--encryption-key-file`,
/// `--encryption-key-env`, `--kms-key-id`); recorded nowhere (the keyring
/// records the key's *name*, [`KeyProvider::key_id`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "provider", rename_all = "kebab-case")]
pub enum KeySpec {
    /// A 256-bit key in a file: 64 hex digits or 44 base64 characters
    /// (what `openssl rand -hex 32` prints), or the 32 bytes themselves.
    File { path: PathBuf },
    /// The same, in an environment variable.
    Env { var: String },
    /// A symmetric key of AWS KMS (its id, ARN or alias). `endpoint`
    /// overrides `https://kms.<region>.amazonaws.com` (and
    /// `AWS_ENDPOINT_URL_KMS`); the region comes from `region`, else
    /// `AWS_REGION`/`AWS_DEFAULT_REGION`, else us-east-1. Credentials come
    /// from the usual AWS chain (environment, profile, web identity,
    /// container, instance metadata).
    AwsKms {
        key_id: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        endpoint: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        region: Option<String>,
    },
}

impl KeySpec {
    /// The provider this spec names (reads a local key now; a KMS is asked
    /// only when a key is wrapped or unwrapped).
    pub fn provider(&self) -> Result<Arc<dyn KeyProvider>, KeyError> {
        match self {
            KeySpec::File { path } => {
                let name = format!("key file {}", path.display());
                let bytes = std::fs::read(path).map_err(|e| KeyError::Invalid { source_name: name.clone(), reason: format!("cannot read it ({e})") })?;
                Ok(Arc::new(LocalKey::from_bytes(&name, &bytes)?))
            }
            KeySpec::Env { var } => {
                let name = format!("environment variable {var}");
                let text = std::env::var(var).map_err(|_| KeyError::Invalid { source_name: name.clone(), reason: "it is not set".into() })?;
                Ok(Arc::new(LocalKey::from_bytes(&name, text.as_bytes())?))
            }
            KeySpec::AwsKms { key_id, endpoint, region } => Ok(Arc::new(super::kms::AwsKms::new(key_id, endpoint.as_deref(), region.as_deref())?)),
        }
    }

    /// These settings as the environment variables a process this one
    /// starts (a local cluster worker) reads them from: no key on a
    /// command line.
    pub fn as_env(&self) -> Vec<(String, String)> {
        vec![("BLOBHOUSE_ENCRYPTION".to_string(), serde_json::to_string(self).expect("key specs serialise"))]
    }

    /// The spec a parent process left in `BLOBHOUSE_ENCRYPTION` ([`KeySpec::as_env`]).
    pub fn from_env() -> Result<Option<KeySpec>, KeyError> {
        match std::env::var("BLOBHOUSE_ENCRYPTION") {
            Ok(text) => serde_json::from_str(&text)
                .map(Some)
                .map_err(|e| KeyError::Invalid { source_name: "environment variable BLOBHOUSE_ENCRYPTION".into(), reason: e.to_string() }),
            Err(_) => Ok(None),
        }
    }
}

/// A master key: wraps and unwraps the (small) database key. `context`
/// binds the wrapped bytes to one database: they unwrap only with the same
/// context (AES-GCM's associated data; KMS's encryption context).
#[async_trait::async_trait]
pub trait KeyProvider: Send + Sync + fmt::Debug {
    /// The key's name as the keyring records it: never the key, enough to
    /// tell the user which key a database needs.
    fn key_id(&self) -> String;
    /// Which kind of provider, as the keyring records it (`local`, `aws-kms`).
    fn kind(&self) -> &'static str;
    /// Encrypts `key` under the master key.
    async fn wrap(&self, key: &[u8], context: &str) -> Result<Vec<u8>, KeyError>;
    /// Decrypts what [`KeyProvider::wrap`] returned.
    async fn unwrap(&self, wrapped: &[u8], context: &str) -> Result<Vec<u8>, KeyError>;
}

/// A master key held locally (a file, an environment variable).
pub struct LocalKey {
    key: LessSafeKey,
    id: String,
}

impl fmt::Debug for LocalKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LocalKey").field("id", &self.id).finish_non_exhaustive()
    }
}

impl LocalKey {
    /// Reads a key from `bytes`: 64 hex digits, base64 of 32 bytes (either
    /// with surrounding white space), or exactly 32 raw bytes. `name` says
    /// where it came from, for errors.
    pub fn from_bytes(name: &str, bytes: &[u8]) -> Result<LocalKey, KeyError> {
        let invalid = |reason: &str| KeyError::Invalid {
            source_name: name.to_string(),
            reason: format!("{reason}; a key is 32 random bytes, written as 64 hex digits (`openssl rand -hex 32`) or in base64"),
        };
        let text = std::str::from_utf8(bytes).ok().map(str::trim);
        let (key, read_as) = match text {
            Some(t) if t.len() == 2 * KEY_LEN && t.bytes().all(|b| b.is_ascii_hexdigit()) => {
                ((0..KEY_LEN).map(|i| u8::from_str_radix(&t[2 * i..2 * i + 2], 16).expect("hex digits")).collect::<Vec<_>>(), "hex")
            }
            Some(t) if !t.is_empty() && bytes.len() != KEY_LEN => {
                use base64::Engine as _;
                (base64::engine::general_purpose::STANDARD.decode(t).map_err(|_| invalid("it is neither 64 hex digits nor base64"))?, "base64")
            }
            _ => (bytes.to_vec(), "raw bytes"),
        };
        if key.len() != KEY_LEN {
            return Err(invalid(&format!("read as {read_as}, it holds {} bytes, not {KEY_LEN}", key.len())));
        }
        if key.iter().all(|b| *b == key[0]) {
            return Err(invalid("it is one byte repeated, not a random key"));
        }
        Ok(LocalKey::new(&key))
    }

    /// A local master key of exactly [`KEY_LEN`] bytes.
    pub fn new(key: &[u8]) -> LocalKey {
        assert_eq!(key.len(), KEY_LEN, "AES-256 keys only");
        let digest = ring::hmac::sign(&ring::hmac::Key::new(ring::hmac::HMAC_SHA256, key), b"blobhouse key id");
        let id = format!("local:{}", super::hex(&digest.as_ref()[..8]));
        LocalKey { key: aead_key(key), id }
    }
}

#[async_trait::async_trait]
impl KeyProvider for LocalKey {
    fn key_id(&self) -> String {
        self.id.clone()
    }

    fn kind(&self) -> &'static str {
        "local"
    }

    async fn wrap(&self, key: &[u8], context: &str) -> Result<Vec<u8>, KeyError> {
        Ok(seal(&self.key, context.as_bytes(), key.to_vec()))
    }

    async fn unwrap(&self, wrapped: &[u8], context: &str) -> Result<Vec<u8>, KeyError> {
        open(&self.key, context.as_bytes(), wrapped).ok_or_else(|| KeyError::WrongKey { key_id: self.id.clone() })
    }
}

/// An AES-256-GCM key.
pub(crate) fn aead_key(key: &[u8]) -> LessSafeKey {
    LessSafeKey::new(UnboundKey::new(&AES_256_GCM, key).expect("AES-256 keys are 32 bytes"))
}

/// `nonce ‖ ciphertext ‖ tag` of `plaintext` under `key`, authenticating
/// `aad` too. The nonce is random: every key here seals few enough
/// messages (a metadata key: one per metadata object) that 96 random bits
/// do not repeat.
pub(crate) fn seal(key: &LessSafeKey, aad: &[u8], mut plaintext: Vec<u8>) -> Vec<u8> {
    let nonce = random::<NONCE_LEN>();
    key.seal_in_place_append_tag(Nonce::assume_unique_for_key(nonce), Aad::from(aad), &mut plaintext).expect("AES-GCM seals any message under 64 GiB");
    let mut out = Vec::with_capacity(NONCE_LEN + plaintext.len());
    out.extend_from_slice(&nonce);
    out.extend_from_slice(&plaintext);
    out
}

/// The plaintext of what [`seal`] returned, if `key` and `aad` are the
/// ones it was sealed with and not one bit of it changed.
pub(crate) fn open(key: &LessSafeKey, aad: &[u8], sealed: &[u8]) -> Option<Vec<u8>> {
    if sealed.len() < SEAL_OVERHEAD {
        return None;
    }
    let nonce = Nonce::try_assume_unique_for_key(&sealed[..NONCE_LEN]).ok()?;
    let mut buf = sealed[NONCE_LEN..].to_vec();
    let plain = key.open_in_place(nonce, Aad::from(aad), &mut buf).ok()?.len();
    buf.truncate(plain);
    Some(buf)
}

/// `N` bytes from the operating system's random source.
pub(crate) fn random<const N: usize>() -> [u8; N] {
    let mut out = [0u8; N];
    SystemRandom::new().fill(&mut out).expect("the OS random source works");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_local_key_wraps_for_one_context_and_refuses_other_keys_and_contexts() {
        let key = LocalKey::from_bytes("t", b"000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f\n").unwrap();
        let wrapped = key.wrap(b"database key", "db 1").await.unwrap();
        assert_eq!(wrapped.len(), 12 + SEAL_OVERHEAD);
        assert_eq!(key.unwrap(&wrapped, "db 1").await.unwrap(), b"database key");
        assert!(matches!(key.unwrap(&wrapped, "db 2").await, Err(KeyError::WrongKey { .. })));
        let other = LocalKey::new(&random::<KEY_LEN>());
        assert!(matches!(other.unwrap(&wrapped, "db 1").await, Err(KeyError::WrongKey { .. })));
        for at in 0..wrapped.len() {
            let mut bad = wrapped.clone();
            bad[at] ^= 0x10;
            assert!(key.unwrap(&bad, "db 1").await.is_err(), "flip at {at} unwrapped");
        }
        assert_ne!(key.key_id(), other.key_id());
        assert!(key.key_id().starts_with("local:") && key.key_id().len() == 6 + 16);
    }

    #[test]
    fn keys_are_read_as_hex_base64_or_raw_bytes_and_anything_else_is_named() {
        let raw = random::<KEY_LEN>();
        use base64::Engine as _;
        let b64 = base64::engine::general_purpose::STANDARD.encode(raw);
        let hex = super::super::hex(&raw);
        let ids: Vec<String> = [raw.to_vec(), b64.into_bytes(), format!("  {hex}\n").into_bytes()]
            .iter()
            .map(|b| LocalKey::from_bytes("k", b).unwrap().key_id())
            .collect();
        assert!(ids.iter().all(|id| *id == ids[0]));
        for bad in [&b"short"[..], b"", &[7u8; 32]] {
            let e = LocalKey::from_bytes("key file /k", bad).unwrap_err().to_string();
            assert!(e.starts_with("key file /k: ") && e.contains("openssl rand -hex 32"), "{e}");
        }
    }
}
