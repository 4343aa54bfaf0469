//! `OPTIMIZE t`: compaction. Rewrites a table's small data objects (left by
//! many small INSERTs) and objects with many deleted rows into well-sized
//! ones, and stops listing the manifest files whose objects are all gone —
//! so the next scan reads few objects and few manifests.
//!
//! Readers are never blocked: the rewrite is one commit ([`Change::Rewrite`])
//! like any other, and versions before it keep their objects. Concurrent
//! appends land beside it; a concurrent DELETE or UPDATE on an object it
//! rewrites is a serialization failure for whichever commits second
//! (`blobhouse_storage::changes`).
//!
//! [`Change::Rewrite`]: blobhouse_storage::Change::Rewrite

use std::collections::HashSet;
use std::sync::Arc;

use datafusion::physical_plan::execute_stream;

use crate::env::Env;
use crate::provider::write_stream;
use crate::transaction::joined;
use crate::EngineError;
use blobhouse_storage::StorageError;

use blobhouse_storage::format::TableEntry;
use blobhouse_storage::{LiveObject, RemovedObject, TableData};

/// An object is small when its column chunks average under this fraction
/// of the chunk target.
const SMALL_FRACTION: u64 = 4;
/// An object is rewritten when more than this share of its rows is deleted.
const DELETED_SHARE: f64 = 0.2;

/// OPTIMIZE: rewrites the table's small and much-deleted objects
/// ([`crate::optimize`]). Returns the rows rewritten.
pub(crate) async fn run(env: &Env<'_>, table: &str) -> Result<u64, EngineError> {
    let (scope, db, options) = (&env.scope, env.engine.database(), env.engine.options());
    let entry = scope.view.tables.get(table).cloned().ok_or_else(|| StorageError::TableNotFound(table.to_string()))?;
    let data = db.table_data(&entry).await?;
    let files = db.manifest_files(&entry).await?;
    let Some(plan) = plan(&entry, &data, &files, options.write.target_chunk_bytes) else { return Ok(0) };
    let ctx = &env.ctx;
    let provider = env.engine.tables().table_over(table, &entry, plan.rewrite);
    let scan = datafusion::datasource::TableProvider::scan(&provider, &ctx.state(), None, &[], None).await?;
    let stream = execute_stream(scan, ctx.task_ctx())?;
    let schema = Arc::new(entry.schema.clone());
    let (rows, objects) = write_stream(db, &schema, options, stream).await?;
    let mut slot = scope.txn.lock().await;
    let txn = joined(db, &mut slot, &objects).await?;
    txn.rewrite(table, entry.id, plan.removed, objects, plan.dropped_manifests, plan.forgotten).await?;
    Ok(rows)
}

/// What OPTIMIZE rewrites in a table version.
#[derive(Debug)]
pub(crate) struct Plan {
    /// The objects to read and replace (a [`TableData`] of only them).
    pub rewrite: TableData,
    pub removed: Vec<RemovedObject>,
    /// Manifest files all of whose objects are then removed, and those objects.
    pub dropped_manifests: Vec<u64>,
    pub forgotten: Vec<u64>,
}

/// Chooses the objects to rewrite: the small ones (when there are two or
/// more to merge, or one with deleted rows) and those with more than a
/// fifth of their rows deleted. `None`: nothing worth doing.
pub(crate) fn plan(entry: &TableEntry, data: &TableData, files: &[(blobhouse_storage::format::ManifestRef, std::sync::Arc<blobhouse_storage::format::Manifest>)], target_chunk_bytes: usize) -> Option<Plan> {
    let columns = entry.schema.fields().len().max(1) as u64;
    let small_bytes = target_chunk_bytes as u64 * columns / SMALL_FRACTION;
    let is_small = |l: &LiveObject| data.object(l).size < small_bytes;
    let deleted_share = |l: &LiveObject| l.vector.map_or(0.0, |v| v.rows as f64 / data.object(l).rows.max(1) as f64);
    let smalls = data.objects.iter().filter(|l| is_small(l)).count();
    let picked: Vec<LiveObject> = data
        .objects
        .iter()
        .filter(|l| deleted_share(l) > DELETED_SHARE || (is_small(l) && (smalls >= 2 || l.vector.is_some())))
        .cloned()
        .collect();
    if picked.is_empty() {
        return None;
    }
    let removed: Vec<RemovedObject> = picked
        .iter()
        .map(|l| {
            let o = data.object(l);
            RemovedObject { object: o.key, manifest: l.manifest, base: l.vector, live_rows: o.rows - l.vector.map_or(0, |v| v.rows), bytes: o.size }
        })
        .collect();
    let gone: HashSet<u64> = entry.removed.iter().copied().chain(removed.iter().map(|r| r.object)).collect();
    let (mut dropped_manifests, mut forgotten) = (Vec::new(), Vec::new());
    for (m, file) in files {
        if file.objects.iter().all(|o| gone.contains(&o.key)) {
            dropped_manifests.push(m.key);
            forgotten.extend(file.objects.iter().map(|o| o.key));
        }
    }
    Some(Plan { rewrite: TableData { manifest: data.manifest.clone(), objects: picked }, removed, dropped_manifests, forgotten })
}
