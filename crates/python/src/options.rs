//! `blobhouse.connect(url, **options)`: the keyword arguments, read into
//! the same settings the CLI's flags give — the store's
//! ([`StoreOptions`]), the engine's ([`EngineOptions::set`], one parser
//! for both), a storage node's and a cluster's. The Python layer hands
//! every value over as text (paths through `os.fspath`, switches as
//! `true`/`false`), so what a value may be is decided here, once.

use std::collections::BTreeMap;

use blobhouse_engine::EngineOptions;
use blobhouse_engine::hybrid::{PushdownMode, PushdownOptions};
use blobhouse_storage::StoreOptions;
use blobhouse_storage::encryption::KeySpec;

/// What `connect()`'s keyword arguments ask for.
pub struct ConnectOptions {
    pub store: StoreOptions,
    pub engine: EngineOptions,
    /// Worker URLs to run statements on, and the cluster's token and CA.
    pub workers: Vec<String>,
    pub cluster_token_env: String,
    pub worker_ca: Option<Vec<u8>>,
}

/// The store's keyword arguments (the CLI's store flags).
const STORE: [&str; 10] = [
    "endpoint", "access_key_id", "secret_access_key", "region", "allow_http", "virtual_hosted_style",
    "encryption_key_file", "encryption_key_env", "kms_key_id", "kms_endpoint",
];

/// A storage node's and a cluster's.
const REMOTE: [&str; 7] = ["storage_node", "storage_node_token_env", "storage_node_ca", "pushdown", "cluster_token_env", "worker_ca", "create"];

impl ConnectOptions {
    /// Reads `settings` (keyword → text), `store_config` (object_store's
    /// keys, the CLI's `--store-option`) and `workers`. A name that is no
    /// option is refused with the list of those that are.
    pub fn read(settings: &BTreeMap<String, String>, store_config: BTreeMap<String, String>, workers: Vec<String>) -> Result<ConnectOptions, String> {
        let get = |k: &str| settings.get(k).cloned();
        let switch = |k: &str| -> Result<Option<bool>, String> {
            match settings.get(k).map(|v| v.to_ascii_lowercase()) {
                None => Ok(None),
                Some(v) if v == "true" => Ok(Some(true)),
                Some(v) if v == "false" => Ok(Some(false)),
                Some(v) => Err(format!("{k}: '{v}' is not a switch: pass True or False")),
            }
        };
        let mut engine = EngineOptions::default();
        for (name, value) in settings {
            if EngineOptions::SETTABLE.contains(&name.as_str()) {
                engine.set(name, value)?;
            } else if !STORE.contains(&name.as_str()) && !REMOTE.contains(&name.as_str()) {
                let mut known: Vec<&str> = STORE.iter().chain(REMOTE.iter()).chain(EngineOptions::SETTABLE.iter()).copied().collect();
                known.extend(["store_options", "workers", "autocommit"]);
                known.sort_unstable();
                return Err(format!("connect() has no option '{name}'; the options are {}", known.join(", ")));
            }
        }
        if let Some(create) = switch("create")? {
            engine.create_missing = create;
        }
        let encryption = match (get("encryption_key_file"), get("encryption_key_env"), get("kms_key_id")) {
            (Some(path), None, None) => Some(KeySpec::File { path: path.into() }),
            (None, Some(var), None) => Some(KeySpec::Env { var }),
            (None, None, Some(key_id)) => Some(KeySpec::AwsKms { key_id, endpoint: get("kms_endpoint"), region: None }),
            (None, None, None) => KeySpec::from_env().ok().flatten(),
            _ => return Err("give one of encryption_key_file, encryption_key_env and kms_key_id, not several".into()),
        };
        let store = StoreOptions {
            access_key_id: get("access_key_id"),
            secret_access_key: get("secret_access_key"),
            region: get("region"),
            endpoint: get("endpoint"),
            allow_http: switch("allow_http")?,
            virtual_hosted_style: switch("virtual_hosted_style")?,
            config: store_config.into_iter().map(|(k, v)| (k.to_ascii_lowercase(), v)).collect(),
            encryption,
        };
        if let Some(endpoint) = get("storage_node") {
            let token_env = get("storage_node_token_env").unwrap_or_else(|| "BLOBHOUSE_NODE_TOKEN".into());
            let token = match std::env::var(&token_env) {
                Ok(t) if !t.trim().is_empty() => t,
                _ => return Err(format!("storage_node: the storage node's token is not set: set os.environ[{token_env:?}] (the same on the node and its callers)")),
            };
            let mut p = PushdownOptions::new(endpoint, token);
            let mode = get("pushdown").unwrap_or_else(|| "auto".into());
            p.mode = PushdownMode::parse(&mode).ok_or_else(|| format!("pushdown: '{mode}': use off, on or auto"))?;
            if let Some(ca) = get("storage_node_ca") {
                p.ca = Some(std::fs::read(&ca).map_err(|e| format!("storage_node_ca: cannot read {ca}: {e}"))?);
            }
            engine.pushdown = Some(p);
        }
        let worker_ca = match get("worker_ca") {
            Some(ca) => Some(std::fs::read(&ca).map_err(|e| format!("worker_ca: cannot read {ca}: {e}"))?),
            None => None,
        };
        Ok(ConnectOptions {
            store,
            engine,
            workers,
            cluster_token_env: get("cluster_token_env").unwrap_or_else(|| "BLOBHOUSE_CLUSTER_TOKEN".into()),
            worker_ca,
        })
    }
}
