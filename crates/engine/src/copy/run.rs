//! Running COPY: reading a file or URL into new data objects of a table
//! (one commit, or none), and writing a query's rows to one file.

use std::sync::Arc;

use datafusion::arrow::array::{Array, UInt64Array};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::common::{Column, DataFusionError};
use datafusion::logical_expr::{Expr, cast};
use datafusion::physical_plan::SendableRecordBatchStream;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::prelude::{SessionConfig, SessionContext};
use datafusion::sql::parser::Statement as DFStatement;
use datafusion::sql::sqlparser::ast;

use blobhouse_storage::StorageError;

use super::{CopyFormat, CopyFrom, CopyQuery, CopyTo};
use crate::env::Env;
use crate::files::{FileScan, Format};
use crate::error::describe_df;
use crate::provider::write_stream;
use crate::transaction::joined;
use crate::EngineError;

/// COPY … TO: runs the query in the statement's scope (so it sees the
/// transaction's own changes, and never a deleted row) and writes one
/// Parquet or CSV file with DataFusion's writers, to a local path or any
/// store URL `--db` accepts. Returns the rows written.
pub(crate) async fn copy_to(env: &Env<'_>, copy: &CopyTo) -> Result<u64, EngineError> {
    let fail = |message: String| EngineError::CopyTo { target: copy.target.clone(), message };
    crate::files::FileAccess::of(env.ctx.state().config()).check(&copy.target)?;
    let db_url = env.engine.database().location().url.trim_end_matches('/');
    let db_url = db_url.strip_prefix("file://").unwrap_or(db_url).to_string();
    let target = copy.target.strip_prefix("file://").unwrap_or(&copy.target);
    if target == db_url || target.starts_with(&format!("{db_url}/")) {
        return Err(fail("the file would be inside the database, whose objects blobhouse never overwrites; export elsewhere".into()));
    }
    // The statement's stores ([`crate::files::FileStores`]) open the
    // target's bucket with the engine's store options.
    let ctx = &env.ctx;
    let df = match &copy.query {
        CopyQuery::Table(name) => ctx.table(name.to_string()).await?,
        CopyQuery::Query(q) => {
            let plan = ctx.state().statement_to_plan(DFStatement::Statement(Box::new(ast::Statement::Query(q.clone())))).await?;
            ctx.execute_logical_plan(plan).await?
        }
    };
    let options = datafusion::dataframe::DataFrameWriteOptions::new().with_single_file_output(true);
    let written = match copy.format {
        CopyFormat::Parquet => df.write_parquet(&copy.target, options, None).await,
        CopyFormat::Csv => {
            let csv = datafusion::common::config::CsvOptions { has_header: Some(copy.header), delimiter: copy.delimiter, ..Default::default() };
            df.write_csv(&copy.target, options, Some(csv)).await
        }
        CopyFormat::Text => return Err(fail("FORMAT text is read only; export with FORMAT csv or parquet".into())),
    }
    .map_err(|e| fail(describe_df(&e)))?;
    let rows = written.first().and_then(|b| b.column(0).as_any().downcast_ref::<UInt64Array>()).map_or(0, |c| c.value(0));
    Ok(rows)
}

/// OPTIMIZE: rewrites the table's small and much-deleted objects

pub(crate) async fn copy_from(env: &Env<'_>, copy: &CopyFrom) -> Result<u64, EngineError> {
    let scope = &env.scope;
    let entry = scope.view.tables.get(&copy.table).cloned().ok_or_else(|| StorageError::TableNotFound(copy.table.clone()))?;
    let fail = |message: String| EngineError::Copy { table: copy.table.clone(), source_url: copy.source.clone(), message };
    let schema = Arc::new(entry.schema.clone());
    crate::files::FileAccess::of(env.ctx.state().config()).check(&copy.source)?;
    if copy.format == CopyFormat::Text {
        let stream = text_stream(copy, &schema).map_err(fail)?;
        return append_stream(env, copy, entry.id, &schema, stream).await;
    }
    // One partition, no splitting of files: errors keep whole-file line numbers.
    let mut config = SessionConfig::new().with_target_partitions(1).with_repartition_file_scans(false);
    config.options_mut().execution.listing_table_ignore_subdirectory = false;
    // The source — a file, a directory or a glob — is read through the
    // engine's stores of files in place (download manager, tiers).
    let mut runtime = datafusion::execution::runtime_env::RuntimeEnvBuilder::new();
    runtime.cache_manager.list_files_cache_limit = 0;
    let runtime = runtime.with_object_store_registry(Arc::new(crate::files::store::StatementFiles::new(env.engine.file_stores().clone(), Default::default()))).build_arc()?;
    let reader = SessionContext::new_with_config_rt(config, runtime);
    // CSV's columns are matched by position, Parquet's by name.
    let csv = copy.format == CopyFormat::Csv;
    let table = if csv {
        // Read strings as Utf8 (the CSV reader's native type), cast below.
        let read_schema = Schema::new(
            schema
                .fields()
                .iter()
                .map(|f| match f.data_type() {
                    DataType::Utf8View | DataType::LargeUtf8 => Field::new(f.name(), DataType::Utf8, f.is_nullable()),
                    _ => f.as_ref().clone(),
                })
                .collect::<Vec<_>>(),
        );
        let scan = FileScan { locations: vec![copy.source.clone()], format: Format::Csv { header: copy.header, delimiter: copy.delimiter }, hive: Some(false), union_by_name: false };
        crate::files::listing_table_as(&reader.state(), &scan, Some(Arc::new(read_schema))).await
    } else {
        let scan = FileScan { locations: vec![copy.source.clone()], format: Format::Parquet, hive: Some(false), union_by_name: false };
        crate::files::listing_table(&reader.state(), &scan).await
    }
    .map_err(|e| fail(e.to_string()))?;
    let df = reader.read_table(table).map_err(|e| fail(describe_df(&e)))?;
    let source_fields: Vec<String> = df.schema().fields().iter().map(|f| f.name().clone()).collect();
    let mut exprs = Vec::with_capacity(schema.fields().len());
    for (i, f) in schema.fields().iter().enumerate() {
        let source_name = if csv { source_fields.get(i).cloned() } else { source_fields.iter().find(|n| n.as_str() == f.name()).cloned() }
            .ok_or_else(|| fail(format!("the source has no column '{}'", f.name())))?;
        exprs.push(cast(Expr::Column(Column::new_unqualified(source_name)), f.data_type().clone()).alias(f.name()));
    }
    let df = df.select(exprs).map_err(|e| fail(describe_df(&e)))?;
    let stream = df.execute_stream().await.map_err(|e| fail(describe_df(&e)))?;
    append_stream(env, copy, entry.id, &schema, stream).await
}

/// Writes the rows of `stream` as new objects of the COPY's table and
/// adds them to the statement's transaction.
async fn append_stream(env: &Env<'_>, copy: &CopyFrom, table_id: u64, schema: &SchemaRef, stream: SendableRecordBatchStream) -> Result<u64, EngineError> {
    let (rows, objects) = write_stream(env.engine.database(), schema, env.engine.options(), stream).await.map_err(|e| EngineError::Copy {
        table: copy.table.clone(),
        source_url: copy.source.clone(),
        message: match copy.format {
            CopyFormat::Text => describe_df(&e),
            _ => file_line_numbers(&describe_df(&e)),
        },
    })?;
    let mut slot = env.scope.txn.lock().await;
    joined(env.engine.database(), &mut slot, &objects).await?.append(&copy.table, table_id, objects).await?;
    Ok(rows)
}

/// The rows of a local file in PostgreSQL's text format, as `schema`.
fn text_stream(copy: &CopyFrom, schema: &SchemaRef) -> Result<SendableRecordBatchStream, String> {
    if split_url(&copy.source).is_some() {
        return Err("FORMAT text reads local files (and COPY … FROM STDIN through the server); for a URL use FORMAT csv or parquet".into());
    }
    let path = copy.source.strip_prefix("file://").unwrap_or(&copy.source);
    let file = std::fs::File::open(path).map_err(|e| format!("cannot open {path}: {e}"))?;
    let mut reader = super::TextReader::new(std::io::BufReader::new(file), schema.clone(), copy.delimiter, copy.header);
    let batches = std::iter::from_fn(move || match reader.next_batch() {
        Ok(Some(batch)) => Some(Ok(batch)),
        Ok(None) => None,
        Err(message) => Some(Err(DataFusionError::Execution(message))),
    })
    .fuse();
    Ok(Box::pin(RecordBatchStreamAdapter::new(schema.clone(), futures::stream::iter(batches))))
}

/// The statement's transaction. It has ended only if the session was torn
/// down under the statement; then the objects the statement `uploaded`

/// The CSV reader numbers the file's records from 0, the header included
/// when there is one (so the first record of a file without a header is
/// "line 0"); a user looks for the line in the file, counted from 1.
pub(crate) fn file_line_numbers(message: &str) -> String {
    const MARK: &str = "at line ";
    let Some(pos) = message.find(MARK) else { return message.to_string() };
    let start = pos + MARK.len();
    let digits: String = message[start..].chars().take_while(char::is_ascii_digit).collect();
    match digits.parse::<u64>() {
        Ok(n) => format!("{}{MARK}{}{}", &message[..pos], n + 1, &message[start + digits.len()..]),
        Err(_) => message.to_string(),
    }
}

/// `scheme://host` and the rest, for URLs other than file://.
pub(crate) fn split_url(source: &str) -> Option<(String, String)> {
    let (scheme, rest) = source.split_once("://")?;
    if scheme == "file" {
        return None;
    }
    let (host, path) = rest.split_once('/').unwrap_or((rest, ""));
    Some((format!("{scheme}://{host}"), path.to_string()))
}

#[cfg(test)]
mod tests {
    #[test]
    fn csv_errors_name_the_file_line() {
        let m = "Parser error: Error while parsing value 'x' as type 'Int32' for column 0 at line 7. Row data: '[x]'";
        assert!(super::file_line_numbers(m).contains("at line 8. Row data"));
        // The first record is the reader's line 0: the file's line 1.
        assert!(super::file_line_numbers(&m.replace("line 7", "line 0")).contains("at line 1. Row data"));
        assert_eq!(super::file_line_numbers("no line here"), "no line here");
    }
}
