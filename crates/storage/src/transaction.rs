//! A transaction: a snapshot, the changes made on top of it, and the
//! objects uploaded for them.
//!
//! Snapshot isolation the way SAP IQ and Delta Lake do it on immutable
//! objects: the transaction reads the database version it began with, plus
//! its own changes (its *view*); everything it writes is uploaded as it
//! goes under fresh keys that no version references yet; COMMIT applies its
//! changes to the newest version with the validation of
//! [`crate::changes::apply`] and creates the next version with
//! put-if-absent ([`Database::commit`]). Until then nothing of it is
//! visible, so ROLLBACK is deleting the uploads. A transaction dropped
//! without COMMIT or ROLLBACK (a session that went away) rolls back too.
//! What a killed process leaves is found through its key leases by garbage
//! collection (issue 13).
//!
//! A single statement outside BEGIN … COMMIT is a transaction of its own.

use std::sync::Arc;

use datafusion::arrow::datatypes::Schema;
use roaring::RoaringBitmap;

use crate::changes::{self, Change, RemovedObject, VectorChange};
use crate::database::{CommitOutcome, Database};
use crate::error::{Result, StorageError};
use crate::format::{CatalogVersion, DV_EXT, DataObject, DeleteRef, ManifestRef};
use crate::keys::object_name;
use crate::versions::manifest_path;

/// An open transaction (see the module docs).
#[derive(Debug)]
pub struct Transaction {
    db: Arc<Database>,
    snapshot: Arc<CatalogVersion>,
    view: Arc<CatalogVersion>,
    changes: Vec<Change>,
    /// Objects uploaded for the transaction, relative to the database root.
    uploaded: Vec<String>,
    finished: bool,
}

impl Transaction {
    /// A transaction reading `snapshot` (a version of `db`).
    pub fn begin(db: &Arc<Database>, snapshot: Arc<CatalogVersion>) -> Transaction {
        Transaction { db: db.clone(), view: snapshot.clone(), snapshot, changes: Vec::new(), uploaded: Vec::new(), finished: false }
    }

    /// The version the transaction began with.
    pub fn snapshot(&self) -> &Arc<CatalogVersion> {
        &self.snapshot
    }

    /// What the transaction reads: its snapshot with its own changes.
    pub fn view(&self) -> Arc<CatalogVersion> {
        self.view.clone()
    }

    /// Whether it changed anything yet.
    pub fn is_read_only(&self) -> bool {
        self.changes.is_empty()
    }

    /// Records objects uploaded for the transaction: deleted again unless
    /// it commits.
    pub fn record_uploads(&mut self, paths: impl IntoIterator<Item = String>) {
        self.uploaded.extend(paths);
    }

    /// Applies `change` to the view (validated against it, as COMMIT will
    /// validate it against the newest version) and keeps it for COMMIT.
    /// Returns whether it changed anything.
    pub fn stage(&mut self, change: Change) -> Result<bool> {
        let mut view = self.view.as_ref().clone();
        let base = view.version;
        if !changes::apply(&mut view, &change.on_base(base))? {
            return Ok(false);
        }
        view.operation = change.describe();
        self.view = Arc::new(view);
        self.changes.push(change);
        Ok(true)
    }

    /// Stages CREATE TABLE `name`, holding `objects` (uploaded already; they
    /// become the transaction's) when there are any.
    pub async fn create_table(&mut self, name: &str, schema: Schema, if_not_exists: bool, objects: Vec<DataObject>) -> Result<bool> {
        self.record_uploads(objects.iter().map(|o| o.path.clone()));
        if self.view.tables.contains_key(name) || self.view.external.contains_key(name) {
            return if if_not_exists { Ok(false) } else { Err(StorageError::TableExists(name.to_string())) };
        }
        let id = self.db.new_table_id().await?;
        let manifest = self.upload_manifest(id, 0, &objects).await?;
        self.stage(Change::CreateTable { name: name.to_string(), id, schema, if_not_exists, manifest })
    }

    /// Stages CREATE EXTERNAL TABLE `name`: a definition only, no object
    /// is written.
    pub fn create_external_table(&mut self, name: &str, table: crate::format::ExternalTable, if_not_exists: bool) -> Result<bool> {
        self.stage(Change::CreateExternalTable { name: name.to_string(), table, if_not_exists })
    }

    /// Stages DROP TABLE `name` (the table of that name in the view, or
    /// the external table).
    pub fn drop_table(&mut self, name: &str, if_exists: bool) -> Result<bool> {
        let id = match self.view.tables.get(name) {
            Some(t) => Some(t.id),
            None if self.view.external.contains_key(name) => None,
            None if if_exists => return Ok(false),
            None => return Err(StorageError::TableNotFound(name.to_string())),
        };
        self.stage(Change::DropTable { name: name.to_string(), id, if_exists })
    }

    /// Stages appending `objects` (uploaded already) to table `name`, which
    /// must still be the table with id `table_id` that the rows were
    /// planned for.
    pub async fn append(&mut self, name: &str, table_id: u64, objects: Vec<DataObject>) -> Result<bool> {
        self.record_uploads(objects.iter().map(|o| o.path.clone()));
        let entry = self.view.tables.get(name).ok_or_else(|| StorageError::TableNotFound(name.to_string()))?;
        if entry.id != table_id {
            return Err(StorageError::Conflict { table: name.to_string(), reason: "the table was dropped and re-created since the statement began".into() });
        }
        let (id, table_version) = (entry.id, entry.table_version + 1);
        match self.upload_manifest(id, table_version, &objects).await? {
            Some(manifest) => self.stage(Change::Append { name: name.to_string(), table_id: id, manifest }),
            None => Ok(false),
        }
    }

    /// Stages deleting rows of table `name`: for each data object (key, and
    /// the manifest file listing it), the vector it was read with and the
    /// new one (that vector and the rows deleted now), uploaded here.
    pub async fn delete(&mut self, name: &str, vectors: Vec<(u64, u64, Option<DeleteRef>, RoaringBitmap)>) -> Result<bool> {
        let table_id = self.view.tables.get(name).ok_or_else(|| StorageError::TableNotFound(name.to_string()))?.id;
        let mut changes = Vec::with_capacity(vectors.len());
        for (object, manifest, base, deleted) in vectors {
            let vector = self.db.write_deletion_vector(&deleted).await?;
            self.uploaded.push(object_name(vector.key, DV_EXT));
            changes.push(VectorChange { object, manifest, base, vector });
        }
        self.stage(Change::Delete { name: name.to_string(), table_id, vectors: changes })
    }

    /// Stages replacing the data objects `removed` of table `name` by
    /// `objects` (uploaded already), and no longer listing the manifest
    /// files `dropped_manifests`, all of whose objects (`forgotten`) are
    /// removed.
    pub async fn rewrite(&mut self, name: &str, table_id: u64, removed: Vec<RemovedObject>, objects: Vec<DataObject>, dropped_manifests: Vec<u64>, forgotten: Vec<u64>) -> Result<bool> {
        self.record_uploads(objects.iter().map(|o| o.path.clone()));
        let table_version = self.view.tables.get(name).map_or(0, |t| t.table_version + 1);
        let manifest = self.upload_manifest(table_id, table_version, &objects).await?;
        self.stage(Change::Rewrite { name: name.to_string(), table_id, removed, manifest, dropped_manifests, forgotten })
    }

    /// Stages CREATE SNAPSHOT `name` of version `version`; `None`: of the
    /// version the commit builds on (the newest when it lands).
    pub fn create_snapshot(&mut self, name: &str, version: Option<u64>) -> Result<bool> {
        self.stage(Change::CreateSnapshot { name: name.to_string(), version, created_at_ms: crate::format::now_ms() })
    }

    /// Stages DROP SNAPSHOT `name`.
    pub fn drop_snapshot(&mut self, name: &str, if_exists: bool) -> Result<bool> {
        self.stage(Change::DropSnapshot { name: name.to_string(), if_exists })
    }

    /// Stages RESTORE of `tables` (all of the database's when `None`) to
    /// what they were in `target`: tables created since are dropped,
    /// dropped ones come back, nothing is copied.
    pub fn restore(&mut self, target: &CatalogVersion, tables: Option<&[String]>) -> Result<bool> {
        let names: Vec<String> = match tables {
            Some(names) => {
                if let Some(missing) = names.iter().find(|n| !target.tables.contains_key(*n)) {
                    return Err(StorageError::InvalidData(format!("table '{missing}' did not exist at version {}; RESTORE TABLE brings back tables that existed then", target.version)));
                }
                names.to_vec()
            }
            None => self.view.tables.keys().chain(target.tables.keys()).cloned().collect::<std::collections::BTreeSet<_>>().into_iter().collect(),
        };
        let restored = names.iter().map(|n| (n.clone(), target.tables.get(n).cloned())).collect();
        let expected = names.iter().map(|n| (n.clone(), self.view.tables.get(n).map(|t| (t.id, t.table_version)))).collect();
        self.stage(Change::Restore { target: target.version, tables: restored, expected })
    }

    async fn upload_manifest(&mut self, table_id: u64, table_version: u64, objects: &[DataObject]) -> Result<Option<ManifestRef>> {
        if objects.is_empty() {
            return Ok(None);
        }
        let m = self.db.write_manifest(table_id, table_version, objects).await?;
        self.uploaded.push(manifest_path(&m));
        Ok(Some(m))
    }

    /// Commits: one new database version with every change, or nothing.
    /// On failure (a serialization error, a conflict, the store) the
    /// uploads are deleted and the error returned.
    pub async fn commit(mut self) -> Result<CommitOutcome> {
        self.finished = true;
        if self.changes.is_empty() {
            self.delete_uploads().await;
            return Ok(CommitOutcome::NoOp);
        }
        match self.db.commit(&self.changes).await {
            Ok(outcome) => {
                self.delete_superseded(&outcome).await;
                Ok(outcome)
            }
            // Maybe committed: what it uploaded may be referenced.
            Err(e @ StorageError::CommitUnknown { .. }) => {
                self.uploaded.clear();
                Err(e)
            }
            Err(e) => {
                self.delete_uploads().await;
                Err(e)
            }
        }
    }

    /// Rolls back: deletes every object uploaded for the transaction.
    pub async fn rollback(mut self) {
        self.finished = true;
        self.delete_uploads().await;
    }

    async fn delete_uploads(&mut self) {
        if crate::failpoint::hit("rollback.delete").is_err() {
            return; // an injected failure: the uploads stay, for GC
        }
        let paths = std::mem::take(&mut self.uploaded);
        self.db.delete_unreferenced(paths).await;
    }

    /// Deletion vectors that a later statement of the same transaction
    /// replaced were never visible to anyone: delete them.
    async fn delete_superseded(&mut self, outcome: &CommitOutcome) {
        let CommitOutcome::Committed(version) = outcome else { return };
        let referenced: std::collections::HashSet<String> =
            version.tables.values().flat_map(|t| t.deletes.values().map(|d| object_name(d.key, DV_EXT))).collect();
        let suffix = format!(".{DV_EXT}");
        let superseded: Vec<String> = self.uploaded.drain(..).filter(|p| p.ends_with(&suffix) && !referenced.contains(p)).collect();
        self.db.delete_unreferenced(superseded).await;
    }
}

impl Drop for Transaction {
    /// A transaction nobody committed or rolled back (its session went
    /// away, or a statement failed half-way) rolls back.
    fn drop(&mut self) {
        if self.finished || self.uploaded.is_empty() {
            return;
        }
        let paths = std::mem::take(&mut self.uploaded);
        let db = self.db.clone();
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            handle.spawn(async move { db.delete_unreferenced(paths).await });
        }
    }
}
