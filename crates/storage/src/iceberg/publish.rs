//! Writing a table's Iceberg metadata for a database version: the
//! manifests of what the version added, the manifest list, the metadata
//! file (see the parent module for the layout and the rules).

use std::collections::HashMap;
use std::sync::Arc;

use serde_json::{Value as Json, json};
use twox_hash::XxHash3_64;

use super::avro::{self, Value};
use super::*;
use crate::database::Database;
use crate::error::{Result, StorageError};
use crate::format::{CatalogVersion, DataObject, TableEntry};
use crate::keys::object_name;

/// After version `next` was committed on `base`: writes the Iceberg
/// metadata of every table whose content changed (of every table, when
/// this commit turned Iceberg on). Failures are kept, not returned: the
/// commit stands either way.
pub(crate) async fn publish_commit(db: &Database, base: &CatalogVersion, next: &CatalogVersion) {
    if !db.iceberg_enabled(next) {
        return;
    }
    // Turned on, or another format version: every table's metadata anew.
    let all = !db.iceberg_enabled(base) || db.iceberg_format(base) != db.iceberg_format(next);
    let mut failure = None;
    for (name, entry) in &next.tables {
        let same = base.tables.get(name).is_some_and(|b| b.id == entry.id && b.table_version == entry.table_version);
        // A table Iceberg cannot describe (a column without an Iceberg
        // type) has no metadata by design, not by failure: SHOW TABLES and
        // ALTER DATABASE say why.
        if (same && !all) || schema::table_schema(&entry.schema, db.iceberg_format(next)).is_err() {
            continue;
        }
        if let Err(e) = publish_table(db, next, name, entry).await {
            failure = Some(e.to_string());
        }
    }
    *db.iceberg.last_error.lock().expect("iceberg error") = failure.map(|why| (next.version, why));
}

/// Writes the Iceberg metadata of every table of `version` that has none
/// for its current content (a database that had Iceberg off, or a crash
/// between a commit and its metadata). Returns each table with the path of
/// its metadata, or why it has none.
pub async fn publish_all(db: &Database, version: &CatalogVersion) -> Vec<(String, std::result::Result<String, String>)> {
    let mut out = Vec::new();
    for (name, entry) in &version.tables {
        let r = publish_table(db, version, name, entry).await.map(|s| db.object_uri(&s.path)).map_err(|e| e.to_string());
        out.push((name.clone(), r));
    }
    out
}

/// Writes the metadata of table `name` (`entry`) as snapshot
/// `version.version`, unless its newest metadata already shows this
/// content.
async fn publish_table(db: &Database, version: &CatalogVersion, name: &str, entry: &TableEntry) -> Result<Arc<TableState>> {
    let fail = |reason: String| StorageError::Iceberg { table: name.to_string(), reason };
    let format = db.iceberg_format(version);
    let table_schema = schema::table_schema(&entry.schema, format).map_err(&fail)?;
    let v = version.version;
    // The previous metadata, if it is of this format version (after a
    // change of format, the table's metadata starts anew).
    let prev = previous(db, entry.id, v + 1).await.filter(|p| p.metadata["format-version"].as_u64() == Some(u64::from(format)));
    if let Some(p) = &prev
        && (p.table_version == entry.table_version || p.version == v)
    {
        return Ok(p.clone());
    }
    let (entry_text, list_text) = schema::manifest_schemas(format);
    let v3 = format >= 3;
    // Format 3's row lineage: each new data manifest's rows get the next ids.
    let mut next_row_id: i64 = prev.as_ref().and_then(|p| p.metadata["next-row-id"].as_i64()).unwrap_or(0);
    let first_row_id = next_row_id;
    let carried: HashMap<&str, &ListEntry> = prev.iter().flat_map(|p| p.list.iter().map(|e| (e.path.as_str(), e))).collect();
    let header = |content: &str| {
        vec![
            ("schema", table_schema.to_string()),
            ("schema-id", "0".to_string()),
            ("partition-spec", "[]".to_string()),
            ("partition-spec-id", "0".to_string()),
            ("format-version", format.to_string()),
            ("content", content.to_string()),
        ]
    };
    let entry_schema = avro::parse_schema(entry_text).map_err(|e| fail(e.to_string()))?;
    let data = db.table_data(entry).await?;
    let seq = v as i64;
    let mut list = Vec::new();
    let (mut added_files, mut added_deletes) = (0, 0);

    // Data: one manifest per blobhouse manifest file with live objects.
    let mut live: HashMap<u64, Vec<&DataObject>> = HashMap::new();
    for l in &data.objects {
        live.entry(l.manifest).or_default().push(data.object(l));
    }
    for m in &entry.manifests {
        let Some(objects) = live.get(&m.key) else { continue };
        let ext = if v3 { "m3.avro" } else { "m.avro" };
        let rel = if objects.len() as u64 == m.objects {
            mirror(m.key, ext)
        } else {
            let keys: Vec<u8> = objects.iter().flat_map(|o| o.key.to_le_bytes()).collect();
            let name = object_name(m.key, ext);
            format!("{DIR}/{}-r{:016x}.{ext}", name.trim_end_matches(&format!(".{ext}")), XxHash3_64::oneshot(&keys))
        };
        let uri = db.object_uri(&rel);
        if let Some(e) = carried.get(uri.as_str()) {
            list.push((*e).clone());
            continue;
        }
        let records: Vec<Value> = objects.iter().map(|o| data_file_entry(format, DataFile::Data, &db.object_uri(&o.path), o.rows as i64, o.size as i64)).collect();
        let bytes = avro::write_file(entry_text, &entry_schema, &header("data"), &records, sync_marker(&rel)).map_err(|e| fail(e.to_string()))?;
        let length = put_derived(db, &rel, bytes).await?;
        added_files += objects.len();
        let rows: i64 = objects.iter().map(|o| o.rows as i64).sum();
        let first_row_id = v3.then_some(next_row_id);
        if v3 {
            next_row_id += rows;
        }
        list.push(ListEntry { path: uri, length, content: 0, sequence: seq, added_snapshot: seq, files: objects.len() as i32, rows, first_row_id });
    }

    // Deletes, per deletion vector: a position delete file (format 2) or
    // a Puffin deletion vector (format 3), and a manifest listing it.
    for l in &data.objects {
        let (Some(d), Some(deleted)) = (l.vector, &l.deleted) else { continue };
        let rel = mirror(d.key, if v3 { "dv.avro" } else { "d.avro" });
        let uri = db.object_uri(&rel);
        if let Some(e) = carried.get(uri.as_str()) {
            list.push((*e).clone());
            continue;
        }
        let target = db.object_uri(&data.object(l).path);
        let record = if v3 {
            let file = puffin::deletion_vector_file(&target, deleted);
            let file_rel = mirror(d.key, "puffin");
            let size = put_derived(db, &file_rel, file.bytes).await?;
            let blob = DataFile::DeletionVector { referenced: &target, offset: file.offset as i64, length: file.length as i64 };
            data_file_entry(format, blob, &db.object_uri(&file_rel), deleted.len() as i64, size)
        } else {
            let file = deletes::position_delete_file(&target, deleted).map_err(|e| fail(format!("position delete file: {e}")))?;
            let file_rel = mirror(d.key, "pos.parquet");
            let size = put_derived(db, &file_rel, file).await?;
            data_file_entry(format, DataFile::PositionDeletes { referenced: &target }, &db.object_uri(&file_rel), deleted.len() as i64, size)
        };
        let bytes = avro::write_file(entry_text, &entry_schema, &header("deletes"), &[record], sync_marker(&rel)).map_err(|e| fail(e.to_string()))?;
        let length = put_derived(db, &rel, bytes).await?;
        added_deletes += 1;
        list.push(ListEntry { path: uri, length, content: 1, sequence: seq, added_snapshot: seq, files: 1, rows: deleted.len() as i64, first_row_id: None });
    }

    // The manifest list.
    let parent = prev.as_ref().map(|p| p.version);
    let list_rel = list_path(entry.id, v);
    let list_schema = avro::parse_schema(list_text).map_err(|e| fail(e.to_string()))?;
    let mut list_header = vec![
        ("snapshot-id", v.to_string()),
        ("parent-snapshot-id", parent.map_or("null".to_string(), |p| p.to_string())),
        ("sequence-number", v.to_string()),
        ("format-version", format.to_string()),
    ];
    if v3 {
        list_header.push(("first-row-id", first_row_id.to_string()));
    }
    let records: Vec<Value> = list.iter().map(|e| e.to_avro(format)).collect();
    let bytes = avro::write_file(list_text, &list_schema, &list_header, &records, sync_marker(&list_rel)).map_err(|e| fail(e.to_string()))?;
    put_derived(db, &list_rel, bytes).await?;

    // The table metadata.
    let operation = match (added_files > 0, added_deletes > 0) {
        (true, false) => "append",
        (false, true) => "delete",
        _ => "overwrite",
    };
    let live_rows: i64 = data.rows() as i64;
    let snapshot = json!({
        "snapshot-id": v,
        "sequence-number": v,
        "timestamp-ms": version.committed_at_ms,
        "manifest-list": db.object_uri(&list_rel),
        "summary": {
            "operation": operation,
            "added-data-files": added_files.to_string(),
            "added-position-delete-files": added_deletes.to_string(),
            "total-records": (live_rows + data.objects.iter().map(|l| l.vector.map_or(0, |d| d.rows as i64)).sum::<i64>()).to_string(),
            "total-data-files": data.objects.len().to_string(),
            "total-position-deletes": data.objects.iter().map(|l| l.vector.map_or(0, |d| d.rows)).sum::<u64>().to_string(),
            "blobhouse-version": v.to_string(),
            "blobhouse-live-rows": live_rows.to_string(),
        },
        "schema-id": 0,
    });
    let mut snapshot = snapshot;
    if let Some(p) = parent {
        snapshot["parent-snapshot-id"] = json!(p);
    }
    if v3 {
        snapshot["first-row-id"] = json!(first_row_id);
        snapshot["added-rows"] = json!(next_row_id - first_row_id);
    }
    let mut snapshots: Vec<Json> = prev.as_ref().and_then(|p| p.metadata["snapshots"].as_array().cloned()).unwrap_or_default();
    snapshots.push(snapshot);
    let ids: Vec<u64> = snapshots.iter().filter_map(|s| s["snapshot-id"].as_u64()).collect();
    let pins: Vec<u64> = version.snapshots.values().map(|s| s.version).chain([version.gc.horizon]).collect();
    let keep = kept(&ids, version.gc.horizon, &pins, MAX_SNAPSHOTS);
    snapshots.retain(|s| s["snapshot-id"].as_u64().is_some_and(|id| keep.contains(&id)));
    let log: Vec<Json> = snapshots.iter().map(|s| json!({"snapshot-id": s["snapshot-id"], "timestamp-ms": s["timestamp-ms"]})).collect();
    let mut metadata = json!({
        "format-version": format,
        "table-uuid": table_uuid(db, entry.id),
        "location": db.object_uri(&table_dir(entry.id)),
        "last-sequence-number": v,
        "last-updated-ms": version.committed_at_ms,
        "last-column-id": entry.schema.fields().len(),
        "current-schema-id": 0,
        "schemas": [table_schema],
        "default-spec-id": 0,
        "partition-specs": [{"spec-id": 0, "fields": []}],
        "last-partition-id": 999,
        "default-sort-order-id": 0,
        "sort-orders": [{"order-id": 0, "fields": []}],
        "properties": {
            "schema.name-mapping.default": schema::name_mapping(&entry.schema),
            "blobhouse.table": name,
            "blobhouse.table-id": entry.id.to_string(),
            "blobhouse.table-version": entry.table_version.to_string(),
        },
        "current-snapshot-id": v,
        "refs": {"main": {"snapshot-id": v, "type": "branch"}},
        "snapshots": snapshots,
        "snapshot-log": log,
        "metadata-log": [],
    });
    if v3 {
        metadata["next-row-id"] = json!(next_row_id);
    }
    crate::failpoint::hit("iceberg.before_metadata")?;
    let path = metadata_path(entry.id, v);
    let body = serde_json::to_vec(&metadata).expect("JSON values serialise");
    put_derived(db, &path, body).await?;
    let state = Arc::new(TableState { version: v, table_version: entry.table_version, path, metadata, list });
    let mut tables = db.iceberg.tables.lock().expect("iceberg tables");
    if tables.get(&entry.id).is_none_or(|s| s.version < v) {
        tables.insert(entry.id, state.clone());
    }
    Ok(state)
}

/// What a `data_file` of a manifest entry is.
#[derive(Clone, Copy)]
enum DataFile<'a> {
    Data,
    /// A position delete file (format 2) of the data file `referenced`.
    PositionDeletes { referenced: &'a str },
    /// A Puffin deletion vector (format 3) of `referenced`: its blob's place.
    DeletionVector { referenced: &'a str, offset: i64, length: i64 },
}

/// A `manifest_entry` record of format version `format`: an added file
/// whose sequence numbers and snapshot come from its manifest's entry in
/// the manifest list (and, in format 3, whose row ids from its manifest's
/// first row id).
fn data_file_entry(format: u32, kind: DataFile<'_>, path: &str, rows: i64, size: i64) -> Value {
    let (content, file_format, referenced) = match kind {
        DataFile::Data => (0, "PARQUET", None),
        DataFile::PositionDeletes { referenced } => (1, "PARQUET", Some(referenced)),
        DataFile::DeletionVector { referenced, .. } => (1, "PUFFIN", Some(referenced)),
    };
    let text = |s: &str| Value::some(Value::String(s.to_string()));
    let mut file = vec![
        Value::Int(content),
        Value::String(path.to_string()),
        Value::String(file_format.into()),
        Value::Record(Vec::new()),
        Value::Long(rows),
        Value::Long(size),
        Value::none(),
        Value::none(),
        Value::none(),
        Value::none(),
        referenced.map_or_else(Value::none, text),
    ];
    if format >= 3 {
        let (offset, length) = match kind {
            DataFile::DeletionVector { offset, length, .. } => (Value::some(Value::Long(offset)), Value::some(Value::Long(length))),
            _ => (Value::none(), Value::none()),
        };
        file.extend([Value::none(), offset, length]);
    }
    Value::Record(vec![Value::Int(1), Value::none(), Value::none(), Value::none(), Value::Record(file)])
}
