//! Encryption at rest: what an encrypted database puts in the store is
//! ciphertext, and what it reads back is authenticated before it is used.
//!
//! Keys, from the top (docs/security.md draws it):
//! - the **master key** lives with a [`KeyProvider`] (a local key, AWS KMS)
//!   and never reaches the store;
//! - the **database key**, 32 random bytes drawn at creation, is stored
//!   only wrapped by the master key, in a keyring object
//!   (`encryption/<n:020>.json`). Rotating the master key writes keyring
//!   `n + 1` (put-if-absent, like everything else): data and metadata stay
//!   as they are;
//! - two keys derived from the database key (HMAC-SHA256): the **metadata
//!   key**, with which every metadata object (versions, manifests with their
//!   zone maps, deletion vectors, GC lists, key leases) is sealed in
//!   AES-256-GCM, its path and the database's identity as associated data —
//!   a flipped, cut, swapped or replayed object does not open; and the
//!   **data wrapping key**, which wraps the data keys;
//! - **data keys**, random for each data object: one for its footer and
//!   one per column, used by Parquet Modular Encryption (AES-GCM). Each
//!   travels wrapped in the object's own key metadata, in the JSON that
//!   Parquet's key tools (parquet-mr, pyarrow's `parquet.encryption`) read,
//!   so a standard PME reader that is given the database key reads the
//!   objects (the test suite does it with pyarrow).
//!
//! Why here and by hand: the parquet crate encrypts pages and footers but
//! leaves keys to the caller; how keys are kept, wrapped and rotated, and
//! that metadata objects are sealed, is blobhouse's layout.

pub mod kms;
pub mod provider;

use std::sync::Arc;

use base64::Engine as _;
use datafusion::arrow::datatypes::Schema;
use futures::TryStreamExt as _;
use object_store::ObjectStoreExt as _;
use parquet::encryption::decrypt::{FileDecryptionProperties, KeyRetriever};
use parquet::encryption::encrypt::FileEncryptionProperties;
use ring::aead::LessSafeKey;
use ring::hmac;
use serde::{Deserialize, Serialize};

pub use provider::{KEY_LEN, KeyError, KeyProvider, KeySpec, LocalKey};

use crate::error::{Result, StorageError};
use crate::format::{DatabaseMarker, now_ms};
use crate::location::Location;

/// Folder of the keyring objects.
pub const KEYRING_DIR: &str = "encryption";
/// What the marker of an encrypted database says (`DatabaseMarker::encryption`).
pub const SCHEME: &str = "aes-256-gcm-v1";
// The marker of an encrypted database says format
// `crate::format::ENCRYPTED_FORMAT_VERSION`.
/// First bytes of every encrypted metadata object.
pub const MAGIC: &[u8; 4] = b"BHE1";

/// One keyring object: the database key, wrapped by a master key.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct KeyringFile {
    /// The keyring's number: the newest one of the database is used.
    pub number: u64,
    /// The database it belongs to (its identity, as the marker gives it):
    /// a keyring left by a creation that never wrote its marker is
    /// ignored.
    pub database: String,
    /// Which kind of provider holds the master key (`local`, `aws-kms`).
    pub provider: String,
    /// The master key's name ([`KeyProvider::key_id`]; never the key).
    pub master_key: String,
    /// The database key, wrapped (base64).
    pub wrapped: String,
    /// A short MAC of the database key: a provider that unwraps without
    /// authenticating still cannot hand back a wrong key unnoticed.
    pub check: String,
    /// When it was written, milliseconds since the Unix epoch.
    pub created_at_ms: u64,
}

/// The keys of one open, encrypted database.
pub struct Keyring {
    /// The keyring object the database key was unwrapped from.
    number: u64,
    master_key: String,
    /// The database's identity: associated data of every sealed object.
    identity: String,
    metadata: LessSafeKey,
    data_wrap: Arc<LessSafeKey>,
    database_key: Vec<u8>,
    decryption: Arc<FileDecryptionProperties>,
}

impl std::fmt::Debug for Keyring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Keyring").field("number", &self.number).field("master_key", &self.master_key).finish_non_exhaustive()
    }
}

/// The database's identity as the keys see it.
fn identity(marker: &DatabaseMarker) -> String {
    format!("{:016x}{:016x}", marker.created_at_ms, marker.id.unwrap_or(0))
}

fn derive(key: &[u8], label: &str) -> Vec<u8> {
    hmac::sign(&hmac::Key::new(hmac::HMAC_SHA256, key), label.as_bytes()).as_ref().to_vec()
}

fn keyring_path(number: u64) -> String {
    format!("{KEYRING_DIR}/{number:020}.json")
}

impl Keyring {
    fn from_key(number: u64, master_key: String, marker: &DatabaseMarker, database_key: Vec<u8>) -> Keyring {
        let identity = identity(marker);
        let data_wrap = Arc::new(provider::aead_key(&derive(&database_key, "blobhouse data keys v1")));
        let retriever = DataKeys { wrap: data_wrap.clone(), master_key_id: master_key_id(&identity) };
        let decryption = FileDecryptionProperties::with_key_retriever(Arc::new(retriever)).build().expect("a retriever alone is valid");
        Keyring {
            number,
            master_key,
            metadata: provider::aead_key(&derive(&database_key, "blobhouse metadata v1")),
            data_wrap,
            identity,
            database_key,
            decryption,
        }
    }

    /// Draws the database key of a new database and writes keyring 1,
    /// wrapped by `provider`.
    pub async fn create(loc: &Location, marker: &DatabaseMarker, provider: &dyn KeyProvider) -> Result<Keyring> {
        // After any keyring a creation that died before its marker left.
        let number = Keyring::numbers(loc).await?.into_iter().max().unwrap_or(0) + 1;
        let keyring = Keyring::from_key(number, provider.key_id(), marker, provider::random::<KEY_LEN>().to_vec());
        keyring.write(loc, number, provider).await?;
        Ok(keyring)
    }

    /// Wraps the database key with `provider` into keyring object `number`.
    async fn write(&self, loc: &Location, number: u64, provider: &dyn KeyProvider) -> Result<()> {
        let wrapped = provider.wrap(&self.database_key, &self.identity).await.map_err(|e| keys_error(loc, e.to_string()))?;
        let file = KeyringFile {
            number,
            database: self.identity.clone(),
            provider: provider.kind().to_string(),
            master_key: provider.key_id(),
            wrapped: base64::engine::general_purpose::STANDARD.encode(wrapped),
            check: check(&self.database_key),
            created_at_ms: now_ms(),
        };
        let body = serde_json::to_vec_pretty(&file).expect("keyrings serialise");
        crate::database::put_new(loc, &loc.child(&keyring_path(number)), bytes::Bytes::from(body)).await
    }

    /// The numbers of the keyring objects there are.
    async fn numbers(loc: &Location) -> Result<Vec<u64>> {
        let dir = loc.child(KEYRING_DIR);
        let listed: Vec<_> = loc.store.list(Some(&dir)).try_collect().await.map_err(|e| StorageError::store("LIST", loc.display(&dir), e))?;
        Ok(listed.iter().filter_map(|m| m.location.filename()?.strip_suffix(".json")?.parse::<u64>().ok()).collect())
    }

    /// The newest keyring object of the database `marker` describes.
    pub async fn newest(loc: &Location, marker: &DatabaseMarker) -> Result<Option<KeyringFile>> {
        Keyring::newest_of(loc, &identity(marker)).await
    }

    async fn newest_of(loc: &Location, identity: &str) -> Result<Option<KeyringFile>> {
        let mut numbers = Keyring::numbers(loc).await?;
        numbers.sort_unstable_by(|a, b| b.cmp(a));
        for number in numbers {
            let path = loc.child(&keyring_path(number));
            let bytes = loc.store.get(&path).await.map_err(|e| StorageError::store("GET", loc.display(&path), e))?.bytes().await.map_err(|e| StorageError::store("GET", loc.display(&path), e))?;
            let file: KeyringFile = serde_json::from_slice(&bytes).map_err(|e| StorageError::Corrupt { location: loc.display(&path), reason: format!("not a keyring ({e})") })?;
            if file.number != number {
                return Err(StorageError::Corrupt { location: loc.display(&path), reason: format!("it claims to be keyring {}", file.number) });
            }
            if file.database == identity {
                return Ok(Some(file));
            }
        }
        Ok(None)
    }

    /// The marker of the database at `loc`.
    pub async fn marker(loc: &Location) -> Result<DatabaseMarker> {
        let path = loc.child(crate::format::MARKER);
        let bytes = loc.store.get(&path).await.map_err(|e| StorageError::store("GET", loc.display(&path), e))?.bytes().await.map_err(|e| StorageError::store("GET", loc.display(&path), e))?;
        serde_json::from_slice(&bytes).map_err(|e| StorageError::Corrupt { location: loc.display(&path), reason: format!("invalid JSON ({e})") })
    }

    /// Opens the keys of the encrypted database `marker` describes, with
    /// the master key `provider` holds.
    pub async fn open(loc: &Location, marker: &DatabaseMarker, provider: &dyn KeyProvider) -> Result<Keyring> {
        let file = Keyring::newest(loc, marker).await?.ok_or_else(|| keys_error(loc, format!("its marker says it is encrypted, and {KEYRING_DIR}/ holds no keyring: the database key is lost")))?;
        let path = loc.display(&loc.child(&keyring_path(file.number)));
        let given = provider.key_id();
        let wrong_key = || {
            keys_error(
                loc,
                format!("its database key (keyring {path}) is wrapped by the master key {}, and the key given is {given}; give that key (a rotated database needs its newest master key)", file.master_key),
            )
        };
        // Another kind of key, or another local key, cannot unwrap it: say
        // so without asking (a KMS judges its own key ids: aliases, ARNs).
        if file.provider != provider.kind() || (file.provider == "local" && file.master_key != given) {
            return Err(wrong_key());
        }
        let wrapped = base64::engine::general_purpose::STANDARD.decode(&file.wrapped).map_err(|e| StorageError::Corrupt { location: path.clone(), reason: format!("its wrapped key is not base64 ({e})") })?;
        let database_key = match provider.unwrap(&wrapped, &identity(marker)).await {
            Ok(k) => k,
            Err(KeyError::WrongKey { .. }) => return Err(wrong_key()),
            Err(e) => return Err(keys_error(loc, format!("its database key (keyring {path}) is wrapped by the master key {}, and unwrapping it failed: {e}", file.master_key))),
        };
        if database_key.len() != KEY_LEN || check(&database_key) != file.check {
            return Err(StorageError::Corrupt { location: path, reason: "the key it unwraps to fails its check: the keyring was changed".into() });
        }
        Ok(Keyring::from_key(file.number, file.master_key, marker, database_key))
    }

    /// The keys of the database at `loc` for a reader that has only its
    /// location (a storage node, a worker): `None` when the database is
    /// not encrypted; an error naming what to pass when it is and no key
    /// was given.
    pub async fn for_location(loc: &Location) -> Result<Option<Keyring>> {
        let marker = Keyring::marker(loc).await?;
        if marker.encryption.is_none() {
            return Ok(None);
        }
        let spec = loc.encryption.as_ref().ok_or_else(|| keys_error(loc, "it is encrypted and no key was given: pass --encryption-key-file FILE, --encryption-key-env VAR or --kms-key-id KEY".into()))?;
        let provider = spec.provider().map_err(|e| keys_error(loc, e.to_string()))?;
        Keyring::open(loc, &marker, provider.as_ref()).await.map(Some)
    }

    /// Wraps the database key with `new` as the next keyring object: from
    /// then on the database opens with `new`'s master key. Nothing else is
    /// rewritten. Returns the new keyring's number.
    pub async fn rotate(&self, loc: &Location, new: &dyn KeyProvider) -> Result<u64> {
        let newest = Keyring::newest_of(loc, &self.identity).await?.map_or(0, |f| f.number);
        if newest != self.number {
            return Err(keys_error(loc, format!("keyring {newest} was written after this handle opened keyring {}: open the database again and retry", self.number)));
        }
        let next = Keyring::numbers(loc).await?.into_iter().max().unwrap_or(0) + 1;
        self.write(loc, next, new).await?;
        Ok(next)
    }

    /// The number of the keyring object in use.
    pub fn number(&self) -> u64 {
        self.number
    }

    /// The master key's name.
    pub fn master_key(&self) -> &str {
        &self.master_key
    }

    /// Seals a metadata object to be written at `relative`.
    pub fn seal(&self, relative: &str, plaintext: Vec<u8>) -> Vec<u8> {
        let sealed = provider::seal(&self.metadata, &self.aad(relative), plaintext);
        let mut out = Vec::with_capacity(MAGIC.len() + sealed.len());
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&sealed);
        out
    }

    /// The plaintext of the metadata object read from `relative`, or why
    /// it is not to be trusted.
    pub fn open_object(&self, relative: &str, bytes: &[u8]) -> std::result::Result<Vec<u8>, String> {
        let Some(sealed) = bytes.strip_prefix(MAGIC) else {
            return Err("it is not encrypted, and every metadata object of this encrypted database is: it was put there by something other than blobhouse".into());
        };
        provider::open(&self.metadata, &self.aad(relative), sealed).ok_or_else(|| {
            format!("its {} bytes fail authentication (AES-GCM): the object was damaged, cut, or copied here from another path or database", bytes.len())
        })
    }

    fn aad(&self, relative: &str) -> Vec<u8> {
        format!("blobhouse {} {relative}", self.identity).into_bytes()
    }

    /// The encryption of a new data object of `schema`: fresh keys for its
    /// footer and each column, wrapped into their key metadata.
    pub fn new_object(&self, schema: &Schema) -> parquet::errors::Result<Arc<FileEncryptionProperties>> {
        let parquet = parquet::arrow::ArrowSchemaConverter::new().convert(schema)?;
        let id = master_key_id(&self.identity);
        let (footer_key, footer_meta) = self.data_key(&id, true);
        let mut builder = FileEncryptionProperties::builder(footer_key).with_footer_key_metadata(footer_meta);
        for column in parquet.columns() {
            let (key, meta) = self.data_key(&id, false);
            builder = builder.with_column_key_and_metadata(&column.path().string(), key, meta);
        }
        builder.build()
    }

    /// A fresh data key and its key metadata (Parquet key tools' "key
    /// material", stored internally: the wrapped key, single wrapping).
    fn data_key(&self, master_key_id: &str, footer: bool) -> (Vec<u8>, Vec<u8>) {
        let key = provider::random::<KEY_LEN>().to_vec();
        let wrapped = provider::seal(&self.data_wrap, master_key_id.as_bytes(), key.clone());
        let mut material = serde_json::json!({
            "keyMaterialType": "PKMT1",
            "internalStorage": true,
            "isFooterKey": footer,
            "masterKeyID": master_key_id,
            "wrappedDEK": base64::engine::general_purpose::STANDARD.encode(wrapped),
            "doubleWrapping": false,
        });
        if footer {
            material["kmsInstanceID"] = "DEFAULT".into();
            material["kmsInstanceURL"] = "DEFAULT".into();
        }
        (key, serde_json::to_vec(&material).expect("JSON serialises"))
    }

    /// How data objects of this database are decrypted (keys unwrapped
    /// from each object's key metadata).
    pub fn decryption(&self) -> &Arc<FileDecryptionProperties> {
        &self.decryption
    }
}

/// The name data keys are wrapped under (Parquet key material's
/// `masterKeyID`): the database, not the master key, which can rotate.
fn master_key_id(identity: &str) -> String {
    format!("blobhouse-database-{identity}")
}

fn check(database_key: &[u8]) -> String {
    hex(&derive(database_key, "blobhouse key check")[..8])
}

fn keys_error(loc: &Location, reason: String) -> StorageError {
    StorageError::Keys { location: loc.url.clone(), reason }
}

/// Unwraps data keys from the key metadata of this database's objects.
struct DataKeys {
    wrap: Arc<LessSafeKey>,
    master_key_id: String,
}

impl KeyRetriever for DataKeys {
    fn retrieve_key(&self, key_metadata: &[u8]) -> parquet::errors::Result<Vec<u8>> {
        let refuse = |why: &str| parquet::errors::ParquetError::General(format!("cannot unwrap the object's data key: {why}"));
        let material: serde_json::Value = serde_json::from_slice(key_metadata).map_err(|_| refuse("its key metadata is not key material"))?;
        if material["masterKeyID"].as_str() != Some(self.master_key_id.as_str()) {
            return Err(refuse("it was wrapped for another database"));
        }
        let wrapped = material["wrappedDEK"].as_str().and_then(|w| base64::engine::general_purpose::STANDARD.decode(w).ok()).ok_or_else(|| refuse("no wrapped key in its key metadata"))?;
        provider::open(&self.wrap, self.master_key_id.as_bytes(), &wrapped).ok_or_else(|| refuse("it fails authentication (the object was damaged, or wrapped by another database key)"))
    }
}

/// Lower-case hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
