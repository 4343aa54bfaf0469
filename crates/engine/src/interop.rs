//! What other engines see of the database: each table's Iceberg metadata
//! (`blobhouse_storage::iceberg`), which SHOW TABLES shows beside its
//! name so that DuckDB, Spark or pyiceberg can be pointed at it, and the
//! warning a client gets when a commit's metadata could not be written.

use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, RecordBatch, StringArray};
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::common::DataFusionError;

use crate::EngineError;
use crate::env::Env;
use crate::result::{Notice, QueryResult};

/// The warning for a commit (version `version`) whose Iceberg metadata
/// could not be written: the commit stands, other engines still see the
/// tables' previous versions.
pub(crate) fn iceberg_notice(db: &blobhouse_storage::Database, version: u64) -> Option<Notice> {
    let why = db.iceberg_failure(version)?;
    Some(Notice {
        severity: "WARNING",
        sqlstate: "01000",
        message: format!(
            "committed as version {version}, but its Iceberg metadata was not written ({why}): other engines still see the previous version; ALTER DATABASE SET iceberg = on writes it"
        ),
    })
}

/// SHOW TABLES' rows (`name`) with `iceberg_metadata`: the full URI of the
/// table's newest Iceberg metadata file, or NULL when it has none (Iceberg
/// off, a table registered from this process, a column type Iceberg
/// lacks, or metadata not written yet).
pub(crate) async fn show_tables(env: &Env<'_>, mut result: QueryResult) -> Result<QueryResult, EngineError> {
    let db = env.engine.database();
    let view = &env.scope.view;
    let schema = Arc::new(Schema::new(vec![Field::new("name", DataType::Utf8, false), Field::new("iceberg_metadata", DataType::Utf8, true)]));
    let mut batches = Vec::with_capacity(result.batches.len());
    for batch in &result.batches {
        let names = batch.column(0).as_any().downcast_ref::<StringArray>().ok_or_else(|| DataFusionError::Internal("SHOW TABLES: names are not strings".into()))?;
        let mut paths = Vec::with_capacity(names.len());
        for i in 0..names.len() {
            let name = names.value(i);
            let path = match view.tables.contains_key(name) {
                true => match blobhouse_storage::iceberg::current(db, view, name).await {
                    Ok(state) => state.map(|s| db.object_uri(&s.path)),
                    Err(_) => None,
                },
                false => None,
            };
            paths.push(path);
        }
        let columns: Vec<ArrayRef> = vec![Arc::new(names.clone()), Arc::new(StringArray::from(paths))];
        batches.push(RecordBatch::try_new(schema.clone(), columns).map_err(DataFusionError::from)?);
    }
    result.batches = batches;
    result.schema = schema;
    Ok(result)
}
