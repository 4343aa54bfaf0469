//! Statements about the database's history: snapshots, versions,
//! RESTORE, VACUUM and SHOW STORAGE (docs/lifecycle.md). The parser reads
//! them ([`crate::parser`]); this module runs them in the statement's
//! transaction. RESTORE commits one version whose tables equal the
//! target's.

use std::sync::Arc;
use std::time::Instant;

use datafusion::arrow::array::{ArrayRef, RecordBatch, StringArray, TimestampMillisecondArray, UInt64Array};
use datafusion::arrow::datatypes::{DataType, Field, Schema, TimeUnit};
use datafusion::common::DataFusionError;
use futures::{StreamExt, TryStreamExt};

use blobhouse_storage::{Transaction, VersionSummary};

use crate::engine::Engine;
use crate::env::Env;
use crate::provider::Scope;
use crate::result::{QueryResult, empty_result};
use crate::time_travel::AsOf;
use crate::transaction::stage;
use crate::{EngineError, TxnRule};

/// A history statement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum History {
    CreateSnapshot { name: String, at: Option<AsOf> },
    DropSnapshot { name: String, if_exists: bool },
    ShowSnapshots,
    /// Bytes by table, pinned by snapshot, and awaiting VACUUM.
    ShowStorage,
    ShowVersions { limit: usize },
    /// `tables`: `None` for the whole database.
    Restore { tables: Option<Vec<String>>, to: AsOf },
    Vacuum { retain: std::time::Duration, grace: std::time::Duration, dry_run: bool },
    /// `ALTER DATABASE SET iceberg = on|off|v2|v3`: whether commits write
    /// Iceberg metadata, in which format version; on also writes it for
    /// every table that lacks it, and answers each table with its
    /// metadata's path.
    SetIceberg { on: bool, format: Option<u32> },
}

impl History {
    /// Whether it answers rows (known once it ran: it only reads metadata).
    pub(crate) fn returns_rows(&self) -> bool {
        matches!(self, History::ShowSnapshots | History::ShowStorage | History::ShowVersions { .. } | History::Vacuum { dry_run: true, .. } | History::SetIceberg { .. })
    }
}

/// Runs a history statement in the statement's transaction.
pub(crate) async fn run(env: &Env<'_>, h: History) -> Result<QueryResult, EngineError> {
    let (scope, started, engine) = (&env.scope, env.started, env.engine);
    match h {
        History::CreateSnapshot { name, at } => {
            let version = match &at {
                Some(at) => Some(engine.past_version_number(scope, at).await?),
                // (On its own, it does not come here: see `dispatch`.)
                None => {
                    let read_only = scope.txn.lock().await.as_ref().is_none_or(Transaction::is_read_only);
                    if !read_only {
                        return Err(EngineError::transaction(TxnRule::InProgress, "CREATE SNAPSHOT inside a transaction that changed something would name a version without those changes; COMMIT first, or give AT(VERSION => n)"));
                    }
                    Some(scope.view.version)
                }
            };
            if version == Some(0) {
                return Err(EngineError::Unsupported("the database has no version yet to snapshot".into()));
            }
            stage(scope, |t| t.create_snapshot(&name, version)).await?;
            Ok(empty_result(started))
        }
        History::DropSnapshot { name, if_exists } => {
            stage(scope, |t| t.drop_snapshot(&name, if_exists)).await?;
            Ok(empty_result(started))
        }
        History::Restore { tables, to } => {
            let target = engine.past_version(scope, &to).await?;
            stage(scope, |t| t.restore(&target, tables.as_deref())).await?;
            Ok(empty_result(started))
        }
        History::Vacuum { retain, grace, dry_run } => {
            if env.in_transaction {
                return Err(EngineError::transaction(TxnRule::InProgress, "VACUUM cannot run inside a transaction block; COMMIT or ROLLBACK first"));
            }
            let report = blobhouse_storage::gc::vacuum(engine.database(), retain, grace, dry_run).await?;
            Ok(vacuum_result(&report, dry_run, started))
        }
        History::SetIceberg { on, format } => {
            if env.in_transaction {
                return Err(EngineError::transaction(TxnRule::InProgress, "ALTER DATABASE cannot run inside a transaction block; COMMIT or ROLLBACK first"));
            }
            let db = engine.database();
            if on && db.keyring().is_some() {
                return Err(EngineError::Unsupported(
                    "an encrypted database cannot be shared as Iceberg: other engines cannot read its objects; COPY its tables into a plaintext database to share them".into(),
                ));
            }
            db.commit(&[blobhouse_storage::Change::SetIceberg { on, format }]).await?;
            let rows = if on { blobhouse_storage::iceberg::publish_all(db, db.refresh().await?.as_ref()).await } else { Vec::new() };
            let schema = Arc::new(Schema::new(vec![
                Field::new("table", DataType::Utf8, false),
                Field::new("iceberg_metadata", DataType::Utf8, true),
                Field::new("note", DataType::Utf8, true),
            ]));
            let columns: Vec<ArrayRef> = vec![
                Arc::new(rows.iter().map(|r| Some(r.0.as_str())).collect::<StringArray>()),
                Arc::new(rows.iter().map(|r| r.1.as_ref().ok().map(String::as_str)).collect::<StringArray>()),
                Arc::new(rows.iter().map(|r| r.1.as_ref().err().map(String::as_str)).collect::<StringArray>()),
            ];
            let batch = RecordBatch::try_new(schema.clone(), columns).map_err(DataFusionError::from)?;
            Ok(QueryResult { batches: vec![batch], ..empty_result(started).with_schema(schema) })
        }
        History::ShowVersions { limit } => {
            let newest = scope.view.version.max(engine.database().current().version);
            let oldest = scope.view.gc.horizon.max(1);
            let wanted: Vec<u64> = (oldest..=newest).rev().take(limit).collect();
            let fetches: Vec<_> = wanted.iter().map(|v| engine.database().version_summary(*v)).collect();
            let summaries: Vec<VersionSummary> = futures::stream::iter(fetches).buffered(16).try_collect().await?;
            let schema = Arc::new(Schema::new(vec![
                Field::new("version", DataType::UInt64, false),
                Field::new("committed_at", DataType::Timestamp(TimeUnit::Millisecond, Some("UTC".into())), false),
                Field::new("operation", DataType::Utf8, false),
            ]));
            let columns: Vec<ArrayRef> = vec![
                Arc::new(summaries.iter().map(|s| s.version).collect::<UInt64Array>()),
                Arc::new(TimestampMillisecondArray::from(summaries.iter().map(|s| s.committed_at_ms as i64).collect::<Vec<_>>()).with_timezone("UTC")),
                Arc::new(summaries.iter().map(|s| Some(s.operation.as_str())).collect::<StringArray>()),
            ];
            let batch = RecordBatch::try_new(schema.clone(), columns).map_err(DataFusionError::from)?;
            Ok(QueryResult { batches: vec![batch], ..empty_result(started).with_schema(schema) })
        }
        History::ShowStorage => {
            // (kind, name, objects, bytes)
            let mut rows: Vec<(&str, String, u64, u64)> = Vec::new();
            for (name, t) in &scope.view.tables {
                rows.push(("table", name.clone(), t.objects, t.bytes));
            }
            for (name, s) in &scope.view.snapshots {
                let (objects, bytes) = pinned(engine, scope, s.version).await?;
                rows.push(("snapshot", name.clone(), objects, bytes));
            }
            let (objects, bytes, other) = blobhouse_storage::gc::awaiting(engine.database()).await?;
            rows.push(("awaiting vacuum", format!("data objects retired since version {}", scope.view.gc.horizon.max(1)), objects, bytes));
            rows.push(("awaiting vacuum", "manifests and deletion vectors".into(), other, 0));
            let schema = Arc::new(Schema::new(vec![
                Field::new("kind", DataType::Utf8, false),
                Field::new("name", DataType::Utf8, false),
                Field::new("objects", DataType::UInt64, false),
                Field::new("bytes", DataType::UInt64, false),
            ]));
            let columns: Vec<ArrayRef> = vec![
                Arc::new(rows.iter().map(|r| Some(r.0)).collect::<StringArray>()),
                Arc::new(rows.iter().map(|r| Some(r.1.as_str())).collect::<StringArray>()),
                Arc::new(rows.iter().map(|r| r.2).collect::<UInt64Array>()),
                Arc::new(rows.iter().map(|r| r.3).collect::<UInt64Array>()),
            ];
            let batch = RecordBatch::try_new(schema.clone(), columns).map_err(DataFusionError::from)?;
            Ok(QueryResult { batches: vec![batch], ..empty_result(started).with_schema(schema) })
        }
        History::ShowSnapshots => {
            let mut rows = Vec::new();
            for (name, s) in &scope.view.snapshots {
                let (_, pinned) = pinned(engine, scope, s.version).await?;
                rows.push((name.clone(), s.version, s.created_at_ms, pinned));
            }
            let schema = Arc::new(Schema::new(vec![
                Field::new("name", DataType::Utf8, false),
                Field::new("version", DataType::UInt64, false),
                Field::new("created_at", DataType::Timestamp(TimeUnit::Millisecond, Some("UTC".into())), false),
                Field::new("bytes_pinned", DataType::UInt64, false),
            ]));
            let columns: Vec<ArrayRef> = vec![
                Arc::new(rows.iter().map(|r| Some(r.0.as_str())).collect::<StringArray>()),
                Arc::new(rows.iter().map(|r| r.1).collect::<UInt64Array>()),
                Arc::new(TimestampMillisecondArray::from(rows.iter().map(|r| r.2 as i64).collect::<Vec<_>>()).with_timezone("UTC")),
                Arc::new(rows.iter().map(|r| r.3).collect::<UInt64Array>()),
            ];
            let batch = RecordBatch::try_new(schema.clone(), columns).map_err(DataFusionError::from)?;
            Ok(QueryResult { batches: vec![batch], ..empty_result(started).with_schema(schema) })
        }
    }
}

/// The data objects (count, bytes) version `v` references that the
/// current view does not: what a snapshot of `v` keeps from garbage
/// collection.
async fn pinned(engine: &Engine, scope: &Scope, v: u64) -> Result<(u64, u64), EngineError> {
    let then = engine.past_version(scope, &AsOf::Version(v)).await?;
    let mut live_now = std::collections::HashSet::new();
    for entry in scope.view.tables.values() {
        let data = engine.database().table_data(entry).await?;
        live_now.extend(data.objects.iter().map(|l| data.object(l).key));
    }
    let (mut objects, mut bytes) = (0, 0);
    for entry in then.tables.values() {
        let data = engine.database().table_data(entry).await?;
        for o in data.objects.iter().map(|l| data.object(l)).filter(|o| !live_now.contains(&o.key)) {
            objects += 1;
            bytes += o.size;
        }
    }
    Ok((objects, bytes))
}

/// COPY … TO: runs the query in the statement's scope (so it sees the
/// transaction's own changes, and never a deleted row) and writes one

/// VACUUM's answer: what it would delete and why (dry run), or what it did.
fn vacuum_result(r: &blobhouse_storage::gc::VacuumReport, dry_run: bool, started: Instant) -> QueryResult {
    let (schema, columns): (Schema, Vec<ArrayRef>) = if dry_run {
        (
            Schema::new(vec![Field::new("path", DataType::Utf8, false), Field::new("reason", DataType::Utf8, false)]),
            vec![
                Arc::new(r.deleted.iter().map(|(p, _)| Some(p.as_str())).collect::<StringArray>()),
                Arc::new(r.deleted.iter().map(|(_, why)| Some(why.as_str())).collect::<StringArray>()),
            ],
        )
    } else {
        let names = ["previous_horizon", "horizon", "versions_scanned", "candidates", "kept", "deferred", "deleted", "gets", "deletes"];
        let values = [r.previous_horizon, r.horizon, r.versions_scanned, r.candidates, r.kept, r.deferred, r.deleted.len() as u64, r.gets, r.deletes];
        (
            Schema::new(names.iter().map(|n| Field::new(*n, DataType::UInt64, false)).collect::<Vec<_>>()),
            values.iter().map(|v| Arc::new(UInt64Array::from(vec![*v])) as ArrayRef).collect(),
        )
    };
    let schema = Arc::new(schema);
    let batch = RecordBatch::try_new(schema.clone(), columns).expect("vacuum batch");
    QueryResult { batches: vec![batch], ..empty_result(started).with_schema(schema) }
}
