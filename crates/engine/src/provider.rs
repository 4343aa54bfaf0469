//! blobhouse tables as DataFusion sees them: a [`SchemaProvider`] over the
//! catalog's current version, a [`TableProvider`] per table version, and a
//! [`DataSink`] that turns INSERT into data objects plus one atomic commit.

use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::catalog::{SchemaProvider, Session};
use datafusion::common::{DataFusionError, Result, not_impl_err};
use datafusion::datasource::sink::{DataSink, DataSinkExec};
use datafusion::datasource::{TableProvider, TableType};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::logical_expr::dml::InsertOp;
use datafusion::logical_expr::{Expr, TableProviderFilterPushDown};
use datafusion::physical_plan::{DisplayAs, DisplayFormatType, ExecutionPlan};
use futures::StreamExt;

use blobhouse_storage::format::{CatalogVersion, TableEntry};
use blobhouse_storage::{Database, StorageError, TableData, TableWriter, Transaction};

use crate::EngineOptions;
use crate::scan::{BlobScanExec, MetadataCache, ScanRequest};
use crate::source::DataSource;

pub(crate) fn external(e: StorageError) -> DataFusionError {
    DataFusionError::External(Box::new(e))
}

/// Name of the hidden column of row ids that DELETE and UPDATE select
/// through (see [`crate::dml`]): `ordinal of the data object << 32 | row
/// position in it`. Only tables resolved in [`DML_SCHEMA`] have it.
pub const ROW_ID_COLUMN: &str = "__blobhouse_row_id";

/// The schema through which DELETE and UPDATE read their table with
/// [`ROW_ID_COLUMN`]. It lists no tables (SHOW TABLES does not show it).
pub const DML_SCHEMA: &str = "blobhouse_dml";

/// What one statement reads and writes through: the database version it
/// sees (a transaction's snapshot with its own changes) and the
/// transaction that its writes join.
#[derive(Debug, Clone)]
pub(crate) struct Scope {
    /// What the statement reads: a committed version, with its
    /// transaction's own changes on top.
    pub view: Arc<CatalogVersion>,
    /// The committed version `view` builds on (the transaction's start):
    /// what time travel to that version reads.
    pub snapshot: Arc<CatalogVersion>,
    pub txn: Arc<tokio::sync::Mutex<Option<Transaction>>>,
    /// The past versions the statement reads tables at ([`crate::time_travel`]).
    pub past: Vec<crate::time_travel::AsOf>,
    /// The files the statement reads in place (`read_parquet(…)`), one
    /// table each in its `blobhouse_files` schema ([`crate::files`]).
    pub files: Vec<crate::files::FileScan>,
}

/// The tables of a database as one statement sees them: with a [`Scope`],
/// its version and its transaction; without (the session's own context,
/// used by tests and tools), the newest version the handle has seen, each
/// INSERT committing on its own.
#[derive(Debug)]
pub struct BlobSchemaProvider {
    db: Arc<Database>,
    options: Arc<EngineOptions>,
    metadata: Arc<MetadataCache>,
    source: DataSource,
    scope: Option<Scope>,
    row_ids: bool,
    /// A past version, read only (time travel).
    past: Option<Arc<CatalogVersion>>,
}

impl BlobSchemaProvider {
    pub(crate) fn new(db: Arc<Database>, options: Arc<EngineOptions>, metadata: Arc<MetadataCache>, source: DataSource) -> Self {
        BlobSchemaProvider { db, options, metadata, source, scope: None, row_ids: false, past: None }
    }

    /// The same tables, seen through `scope`; with the row-id column when
    /// `row_ids` is set.
    pub(crate) fn scoped(&self, scope: Scope, row_ids: bool) -> Self {
        BlobSchemaProvider {
            db: self.db.clone(),
            options: self.options.clone(),
            metadata: self.metadata.clone(),
            source: self.source.clone(),
            scope: Some(scope),
            row_ids,
            past: None,
        }
    }

    /// The tables of past version `version`, read only.
    pub(crate) fn at(&self, version: Arc<CatalogVersion>) -> Self {
        BlobSchemaProvider {
            db: self.db.clone(),
            options: self.options.clone(),
            metadata: self.metadata.clone(),
            source: self.source.clone(),
            scope: None,
            row_ids: false,
            past: Some(version),
        }
    }

    /// Table `name` (version `entry`) reading only the data in `data` (OPTIMIZE reads the objects it rewrites so).
    pub(crate) fn table_over(&self, name: &str, entry: &TableEntry, data: TableData) -> BlobTable {
        BlobTable {
            db: self.db.clone(),
            name: name.to_string(),
            schema: Arc::new(entry.schema.clone()),
            row_ids: false,
            entry: entry.clone(),
            data: Arc::new(data),
            options: self.options.clone(),
            metadata: self.metadata.clone(),
            source: self.source.clone(),
            txn: None,
            past: None,
        }
    }

    fn version(&self) -> Arc<CatalogVersion> {
        match (&self.past, &self.scope) {
            (Some(past), _) => past.clone(),
            (None, Some(s)) => s.view.clone(),
            (None, None) => self.db.current(),
        }
    }
}

#[async_trait]
impl SchemaProvider for BlobSchemaProvider {
    fn table_names(&self) -> Vec<String> {
        if self.row_ids {
            return Vec::new();
        }
        let version = self.version();
        version.tables.keys().chain(version.external.keys()).cloned().collect()
    }

    async fn table(&self, name: &str) -> Result<Option<Arc<dyn TableProvider>>> {
        let version = self.version();
        if let Some(external) = version.external.get(name).filter(|_| !version.tables.contains_key(name)) {
            if self.row_ids {
                return Ok(None);
            }
            let table = crate::files::external_table(name, external).map_err(|e| DataFusionError::External(Box::new(e)))?;
            return Ok(Some(Arc::new(crate::files::ReadOnly::new(name, &external.location, table))));
        }
        let Some(entry) = version.tables.get(name) else { return Ok(None) };
        let data = self.db.table_data(entry).await.map_err(external)?;
        let mut schema = entry.schema.clone();
        if self.row_ids {
            let mut fields: Vec<Field> = schema.fields().iter().map(|f| f.as_ref().clone()).collect();
            fields.push(Field::new(ROW_ID_COLUMN, DataType::UInt64, false));
            schema = Schema::new(fields);
        }
        Ok(Some(Arc::new(BlobTable {
            db: self.db.clone(),
            name: name.to_string(),
            schema: Arc::new(schema),
            row_ids: self.row_ids,
            entry: entry.clone(),
            data: Arc::new(data),
            options: self.options.clone(),
            metadata: self.metadata.clone(),
            source: self.source.clone(),
            txn: self.scope.as_ref().map(|s| s.txn.clone()),
            past: self.past.as_ref().map(|p| p.version),
        })))
    }

    fn register_table(&self, name: String, _table: Arc<dyn TableProvider>) -> Result<Option<Arc<dyn TableProvider>>> {
        not_impl_err!("cannot register '{name}' as a blobhouse table: only CREATE TABLE [AS SELECT] creates tables (views and external tables are not supported yet)")
    }

    fn deregister_table(&self, name: &str) -> Result<Option<Arc<dyn TableProvider>>> {
        not_impl_err!("use DROP TABLE {name}")
    }

    fn table_exist(&self, name: &str) -> bool {
        let version = self.version();
        version.tables.contains_key(name) || (!self.row_ids && version.external.contains_key(name))
    }
}

/// One version of a blobhouse table.
#[derive(Debug)]
pub struct BlobTable {
    db: Arc<Database>,
    name: String,
    /// The table's columns, and [`ROW_ID_COLUMN`] last when `row_ids`.
    schema: SchemaRef,
    row_ids: bool,
    entry: TableEntry,
    data: Arc<TableData>,
    options: Arc<EngineOptions>,
    metadata: Arc<MetadataCache>,
    source: DataSource,
    /// The statement's transaction, which INSERT joins; `None`: INSERT
    /// commits on its own.
    txn: Option<Arc<tokio::sync::Mutex<Option<Transaction>>>>,
    /// The past version this table is read at (then it is read only).
    past: Option<u64>,
}

impl BlobTable {
    /// The table version's live data objects.
    pub fn data(&self) -> &Arc<TableData> {
        &self.data
    }
}

#[async_trait]
impl TableProvider for BlobTable {
    fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    fn table_type(&self) -> TableType {
        TableType::Base
    }

    async fn scan(&self, state: &dyn Session, projection: Option<&Vec<usize>>, filters: &[Expr], limit: Option<usize>) -> Result<Arc<dyn ExecutionPlan>> {
        let exec = BlobScanExec::try_new(
            &self.db,
            &self.metadata,
            state,
            ScanRequest {
                table: &self.name,
                table_schema: self.schema.clone(),
                row_ids: self.row_ids,
                data: &self.data,
                projection,
                filters,
                limit,
                target_partitions: state.config().target_partitions(),
                batch_size: state.config().batch_size(),
                policy: &self.options.requests,
                scheduler: &self.options.scan,
                source: &self.source,
            },
        )
        .await?;
        Ok(Arc::new(exec))
    }

    /// Filters are used to prune row groups; rows are still filtered above
    /// the scan, hence `Inexact`.
    fn supports_filters_pushdown(&self, filters: &[&Expr]) -> Result<Vec<TableProviderFilterPushDown>> {
        Ok(vec![TableProviderFilterPushDown::Inexact; filters.len()])
    }

    async fn insert_into(&self, _state: &dyn Session, input: Arc<dyn ExecutionPlan>, op: InsertOp) -> Result<Arc<dyn ExecutionPlan>> {
        if op != InsertOp::Append {
            return not_impl_err!("{op} is not supported on blobhouse tables yet; use INSERT INTO");
        }
        if self.row_ids {
            return not_impl_err!("cannot INSERT through {DML_SCHEMA}; insert into {}", self.name);
        }
        if let Some(v) = self.past {
            return not_impl_err!("cannot write to {} as of version {v}: past versions are read only (RESTORE TABLE {} TO VERSION {v} makes it current again)", self.name, self.name);
        }
        let sink = BlobSink {
            db: self.db.clone(),
            table: self.name.clone(),
            table_id: self.entry.id,
            schema: self.schema.clone(),
            options: self.options.clone(),
            txn: self.txn.clone(),
        };
        Ok(Arc::new(DataSinkExec::new(input, Arc::new(sink), None)))
    }
}

/// Writes INSERTed rows as new data objects and adds them to the
/// statement's transaction (or commits them in one version of their own).
#[derive(Debug)]
pub struct BlobSink {
    db: Arc<Database>,
    table: String,
    table_id: u64,
    schema: SchemaRef,
    options: Arc<EngineOptions>,
    txn: Option<Arc<tokio::sync::Mutex<Option<Transaction>>>>,
}

impl DisplayAs for BlobSink {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "BlobSink: table={}", self.table)
    }
}

#[async_trait]
impl DataSink for BlobSink {
    fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    async fn write_all(&self, data: SendableRecordBatchStream, _context: &Arc<TaskContext>) -> Result<u64> {
        let (rows, objects) = write_stream(&self.db, &self.schema, &self.options, data).await?;
        match &self.txn {
            Some(txn) => {
                let mut slot = txn.lock().await;
                let Some(txn) = slot.as_mut() else {
                    self.db.delete_unreferenced(objects.into_iter().map(|o| o.path).collect()).await;
                    return Err(DataFusionError::Execution(format!("INSERT INTO {}: the transaction has ended", self.table)));
                };
                txn.append(&self.table, self.table_id, objects).await.map_err(external)?;
            }
            None => {
                let mut txn = Transaction::begin(&self.db, self.db.refresh().await.map_err(external)?);
                txn.append(&self.table, self.table_id, objects).await.map_err(external)?;
                txn.commit().await.map_err(external)?;
            }
        }
        Ok(rows)
    }
}

/// Drains `data` into new data objects. Deletes them again on failure.
pub(crate) async fn write_stream(
    db: &Arc<Database>,
    schema: &SchemaRef,
    options: &EngineOptions,
    mut data: SendableRecordBatchStream,
) -> Result<(u64, Vec<blobhouse_storage::format::DataObject>)> {
    let mut writer = TableWriter::new(db.clone(), schema.clone(), options.write.clone());
    while let Some(batch) = data.next().await {
        let step = match batch {
            Ok(b) => writer.write(&b).await.map_err(external),
            Err(e) => Err(e),
        };
        if let Err(e) = step {
            writer.abort().await;
            return Err(e);
        }
    }
    let rows = writer.rows();
    let objects = writer.finish().await.map_err(external)?;
    Ok((rows, objects))
}
