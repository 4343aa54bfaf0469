//! CREATE TABLE [AS SELECT], CREATE EXTERNAL TABLE and DROP TABLE:
//! changes to the catalog that become part of the statement's transaction
//! (one atomic commit with the table's first data objects), not of an
//! in-memory catalog.

use std::collections::HashSet;
use std::sync::Arc;

use datafusion::arrow::datatypes::{DataType, Schema};
use datafusion::arrow::datatypes::Field;
use datafusion::logical_expr::{CreateExternalTable, CreateMemoryTable, DropTable};
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

/// `CREATE [OR REPLACE] EXTERNAL TABLE [IF NOT EXISTS] t [(columns)]
/// STORED AS PARQUET|CSV [PARTITIONED BY (keys)] LOCATION '…' [OPTIONS
/// (…)]`: the files are listed once now, to find their columns (or check
/// the ones given) and their partition directories; the definition is
/// committed, the files are read by each statement that names the table.
pub(crate) async fn create_external_table(env: &Env<'_>, create: CreateExternalTable) -> Result<(), EngineError> {
    let name = table_name(&create.name)?;
    let refuse = |what: &str| Err(EngineError::Unsupported(format!("CREATE EXTERNAL TABLE {name}: {what} is not supported")));
    if create.temporary {
        return refuse("TEMPORARY");
    }
    if create.unbounded {
        return refuse("UNBOUNDED");
    }
    if !create.order_exprs.is_empty() {
        return refuse("WITH ORDER");
    }
    if !create.column_defaults.is_empty() {
        return refuse("a column DEFAULT");
    }
    let [location] = create.locations.as_slice() else {
        return refuse("more than one LOCATION");
    };
    crate::files::FileAccess::of(env.ctx.state().config()).check(location)?;
    let option = |keys: &[&str]| keys.iter().find_map(|k| create.options.get(*k).cloned());
    let format = match create.file_type.to_ascii_lowercase().as_str() {
        "parquet" => crate::files::Format::Parquet,
        "csv" => crate::files::Format::Csv {
            header: option(&["format.has_header", "has_header", "header"]).is_none_or(|h| h.eq_ignore_ascii_case("true")),
            delimiter: match option(&["format.delimiter", "delimiter"]) {
                None => b',',
                Some(d) if d.len() == 1 && d.is_ascii() => d.as_bytes()[0],
                Some(d) => return Err(EngineError::Unsupported(format!("CREATE EXTERNAL TABLE {name}: the delimiter must be one ASCII character, not '{d}'"))),
            },
        },
        other => return refuse(&format!("STORED AS {other} (external tables read PARQUET or CSV files)")),
    };
    let view = &env.scope.view;
    let exists = view.tables.contains_key(&name) || view.external.contains_key(&name);
    if exists && create.if_not_exists {
        return Ok(());
    }
    if exists && !create.or_replace {
        return Err(StorageError::TableExists(name).into());
    }
    let given_keys = &create.table_partition_cols;
    let hive = if given_keys.is_empty() { None } else { Some(true) };
    let mut table = crate::files::define(&env.ctx.state(), location, &format, hive).await?;
    let fields = table.schema.fields().clone();
    let split = fields.len() - table.partition_columns;
    let found_keys: Vec<String> = fields[split..].iter().map(|f| f.name().clone()).collect();
    if !given_keys.is_empty() && *given_keys != found_keys {
        return Err(EngineError::Files {
            location: location.clone(),
            message: format!("PARTITIONED BY ({}), but the files' directories are partitioned by ({})", given_keys.join(", "), found_keys.join(", ")),
        });
    }
    let given = create.schema.as_arrow();
    if !given.fields().is_empty() {
        // The columns given: those of the files (checked against what the
        // files hold), the partition keys with the type given or found.
        let file_fields: Vec<Field> = given.fields().iter().filter(|f| !found_keys.contains(f.name())).map(|f| f.as_ref().clone()).collect();
        crate::files::check_columns(location, &Schema::new(file_fields.clone()), &Schema::new(fields[..split].to_vec()))?;
        let keys: Vec<Field> = fields[split..].iter().map(|f| given.field_with_name(f.name()).map(|g| g.as_ref().clone()).unwrap_or_else(|_| f.as_ref().clone())).collect();
        table.schema = Schema::new(file_fields.into_iter().chain(keys).collect::<Vec<_>>());
    }
    stage(&env.scope, |t| {
        if exists {
            t.drop_table(&name, false)?;
        }
        t.create_external_table(&name, table, create.if_not_exists)
    })
    .await?;
    Ok(())
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
