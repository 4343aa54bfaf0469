//! CREATE TABLE [AS SELECT] and DROP TABLE: changes to the catalog that
//! become part of the statement's transaction (one atomic commit with
//! the table's first data objects), not of an in-memory catalog.

use std::collections::HashSet;
use std::sync::Arc;

use datafusion::arrow::datatypes::{DataType, Schema};
use datafusion::logical_expr::{CreateMemoryTable, DropTable};
use datafusion::physical_plan::execute_stream;

use blobhouse_storage::StorageError;

use crate::env::Env;
use crate::provider::write_stream;
use crate::transaction::{joined, stage};
use crate::EngineError;

pub(crate) async fn create_table(env: &Env<'_>, create: CreateMemoryTable) -> Result<u64, EngineError> {
    let (ctx, scope, db) = (&env.ctx, &env.scope, env.engine.database());
    let name = table_name(&create.name)?;
    if !create.column_defaults.is_empty() {
        return Err(EngineError::Unsupported(format!("column DEFAULT values are not supported yet (table '{name}')")));
    }
    let exists = scope.view.tables.contains_key(&name);
    if exists && create.if_not_exists {
        return Ok(0);
    }
    if exists && !create.or_replace {
        return Err(StorageError::TableExists(name).into());
    }
    let schema: Schema = create.input.schema().as_arrow().clone();
    let mut seen = HashSet::new();
    for f in schema.fields() {
        if !seen.insert(f.name()) {
            return Err(EngineError::Unsupported(format!("column '{}' appears twice in table '{name}'; give the columns distinct names (AS alias)", f.name())));
        }
        // Refused here, not at the first INSERT: the Parquet writer has no
        // interval type, so such a table could never hold a row.
        if matches!(f.data_type(), DataType::Interval(_)) {
            return Err(EngineError::Unsupported(format!(
                "column '{}' of table '{name}': INTERVAL columns cannot be stored yet (Parquet has no interval type blobhouse can write); store the duration as BIGINT microseconds, or compute intervals in queries",
                f.name()
            )));
        }
    }
    let schema = Arc::new(schema);
    let physical = ctx.state().create_physical_plan(&create.input).await?;
    let stream = execute_stream(physical, ctx.task_ctx())?;
    let (rows, objects) = write_stream(db, &schema, env.engine.options(), stream).await?;
    let mut slot = scope.txn.lock().await;
    let txn = joined(db, &mut slot, &objects).await?;
    if create.or_replace && exists {
        txn.drop_table(&name, true)?;
    }
    txn.create_table(&name, schema.as_ref().clone(), create.if_not_exists, objects).await?;
    Ok(rows)
}

/// DROP TABLE [IF EXISTS].
pub(crate) async fn drop_table(env: &Env<'_>, drop: &DropTable) -> Result<(), EngineError> {
    let name = table_name(&drop.name)?;
    stage(&env.scope, |t| t.drop_table(&name, drop.if_exists)).await?;
    Ok(())
}

fn table_name(r: &datafusion::common::TableReference) -> Result<String, EngineError> {
    match r.schema() {
        None | Some("public") => Ok(r.table().to_string()),
        Some(s) => Err(EngineError::Unsupported(format!("schema '{s}' does not exist; blobhouse tables live in the default schema"))),
    }
}
