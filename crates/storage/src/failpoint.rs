//! Named fail points for fault injection: places in the write path, the
//! commit, rollback and garbage collection where a test can make the
//! process crash (abort, as `kill -9` would leave it) or the step fail.
//!
//! Configured by `BLOBHOUSE_FAILPOINTS="name=crash,other=error"` (read
//! once) or [`configure`]. Unconfigured, [`hit`] is one relaxed atomic
//! load. The crash harness (`blobhouse bench crash`) drives them; the
//! names are in [`POINTS`].
//!
//! Why no crate: the `fail` crate needs a cargo feature at every call
//! site's crate and a global registry we would wrap anyway; this is 60 lines.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Once, RwLock};

use crate::error::{Result, StorageError};

/// Every fail point, in the order a statement meets them.
pub const POINTS: [&str; 10] = [
    "upload.data",          // before a data object's PUT
    "upload.manifest",      // before a manifest file's PUT
    "upload.vector",        // before a deletion vector's PUT
    "commit.before",        // before the version's PUT
    "commit.after",         // after the version's PUT succeeded
    "rollback.delete",      // before a rollback deletes the uploads
    "gc.after_commit",      // after VACUUM committed its plan, before deleting
    "gc.between_deletes",   // after VACUUM deleted data, before the manifests
    "commit.before_iceberg", // after the version's PUT, before its Iceberg metadata
    "iceberg.before_metadata", // after the Iceberg manifests, before the metadata file
];

/// What a fail point does when hit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Abort the process on the spot.
    Crash,
    /// Fail the step with [`StorageError::Injected`].
    Error,
}

static ANY: AtomicBool = AtomicBool::new(false);
static FROM_ENV: Once = Once::new();
static ACTIONS: RwLock<Option<HashMap<String, Action>>> = RwLock::new(None);

/// Sets the fail points from a spec like `commit.after=crash,upload.data=error`
/// (empty: none). Unknown names and actions are an error.
pub fn configure(spec: &str) -> std::result::Result<(), String> {
    let mut map = HashMap::new();
    for item in spec.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let (name, action) = item.split_once('=').ok_or_else(|| format!("fail point '{item}': write name=crash or name=error"))?;
        if !POINTS.contains(&name) {
            return Err(format!("unknown fail point '{name}' (known: {})", POINTS.join(", ")));
        }
        let action = match action {
            "crash" => Action::Crash,
            "error" => Action::Error,
            other => return Err(format!("fail point {name}: unknown action '{other}' (crash or error)")),
        };
        map.insert(name.to_string(), action);
    }
    ANY.store(!map.is_empty(), Ordering::Relaxed);
    *ACTIONS.write().expect("fail point lock") = Some(map);
    Ok(())
}

/// Passes fail point `name`: crashes, fails, or (almost always) nothing.
pub fn hit(name: &'static str) -> Result<()> {
    FROM_ENV.call_once(|| {
        if let Ok(spec) = std::env::var("BLOBHOUSE_FAILPOINTS")
            && let Err(e) = configure(&spec)
        {
            eprintln!("BLOBHOUSE_FAILPOINTS: {e}");
            std::process::exit(2);
        }
    });
    if !ANY.load(Ordering::Relaxed) {
        return Ok(());
    }
    let action = ACTIONS.read().expect("fail point lock").as_ref().and_then(|m| m.get(name).copied());
    match action {
        Some(Action::Crash) => {
            eprintln!("fail point {name}: crashing");
            std::process::abort();
        }
        Some(Action::Error) => Err(StorageError::Injected(name.to_string())),
        None => Ok(()),
    }
}
