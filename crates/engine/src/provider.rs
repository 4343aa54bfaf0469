//! blobhouse tables as DataFusion sees them: a [`SchemaProvider`] over the
//! catalog's current version, a [`TableProvider`] per table version, and a
//! [`DataSink`] that turns INSERT into data objects plus one atomic commit.

use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::catalog::{SchemaProvider, Session};
use datafusion::common::{DataFusionError, Result, not_impl_err};
use datafusion::datasource::sink::{DataSink, DataSinkExec};
use datafusion::datasource::{TableProvider, TableType};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::logical_expr::dml::InsertOp;
use datafusion::logical_expr::{Expr, TableProviderFilterPushDown};
use datafusion::physical_plan::{DisplayAs, DisplayFormatType, ExecutionPlan};
use futures::StreamExt;

use blobhouse_storage::format::{Manifest, TableEntry};
use blobhouse_storage::{Change, Database, StorageError, TableWriter};

use crate::EngineOptions;
use crate::scan::{BlobScanExec, FooterCache, ScanRequest};
use crate::source::DataSource;

pub(crate) fn external(e: StorageError) -> DataFusionError {
    DataFusionError::External(Box::new(e))
}

/// The tables of a database, as of the catalog version the handle last saw.
/// The engine refreshes that version at the start of every statement.
#[derive(Debug)]
pub struct BlobSchemaProvider {
    db: Arc<Database>,
    options: Arc<EngineOptions>,
    footers: Arc<FooterCache>,
    source: DataSource,
}

impl BlobSchemaProvider {
    pub(crate) fn new(db: Arc<Database>, options: Arc<EngineOptions>, footers: Arc<FooterCache>, source: DataSource) -> Self {
        BlobSchemaProvider { db, options, footers, source }
    }
}

#[async_trait]
impl SchemaProvider for BlobSchemaProvider {
    fn table_names(&self) -> Vec<String> {
        self.db.current().tables.keys().cloned().collect()
    }

    async fn table(&self, name: &str) -> Result<Option<Arc<dyn TableProvider>>> {
        let version = self.db.current();
        let Some(entry) = version.tables.get(name) else { return Ok(None) };
        let manifest = self.db.manifest(entry).await.map_err(external)?;
        Ok(Some(Arc::new(BlobTable {
            db: self.db.clone(),
            name: name.to_string(),
            schema: Arc::new(entry.schema.clone()),
            entry: entry.clone(),
            manifest,
            options: self.options.clone(),
            footers: self.footers.clone(),
            source: self.source.clone(),
        })))
    }

    fn register_table(&self, name: String, _table: Arc<dyn TableProvider>) -> Result<Option<Arc<dyn TableProvider>>> {
        not_impl_err!("cannot register '{name}' as a blobhouse table: only CREATE TABLE [AS SELECT] creates tables (views and external tables are not supported yet)")
    }

    fn deregister_table(&self, name: &str) -> Result<Option<Arc<dyn TableProvider>>> {
        not_impl_err!("use DROP TABLE {name}")
    }

    fn table_exist(&self, name: &str) -> bool {
        self.db.current().tables.contains_key(name)
    }
}

/// One version of a blobhouse table.
#[derive(Debug)]
pub struct BlobTable {
    db: Arc<Database>,
    name: String,
    schema: SchemaRef,
    entry: TableEntry,
    manifest: Arc<Manifest>,
    options: Arc<EngineOptions>,
    footers: Arc<FooterCache>,
    source: DataSource,
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
            &self.footers,
            state,
            ScanRequest {
                table: &self.name,
                table_schema: self.schema.clone(),
                manifest: &self.manifest,
                projection,
                filters,
                limit,
                target_partitions: state.config().target_partitions(),
                batch_size: state.config().batch_size(),
                policy: &self.options.requests,
                scheduler: &self.options.scan,
                source: &self.source,
            },
        )?;
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
        let sink = BlobSink { db: self.db.clone(), table: self.name.clone(), table_id: self.entry.id, schema: self.schema.clone(), options: self.options.clone() };
        Ok(Arc::new(DataSinkExec::new(input, Arc::new(sink), None)))
    }
}

/// Writes INSERTed rows as new data objects and commits them in one version.
#[derive(Debug)]
pub struct BlobSink {
    db: Arc<Database>,
    table: String,
    table_id: u64,
    schema: SchemaRef,
    options: Arc<EngineOptions>,
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
        let rows = write_stream(&self.db, &self.schema, &self.options, data).await?;
        let (rows, objects) = rows;
        self.db
            .commit(Change::Append { name: self.table.clone(), table_id: self.table_id, objects })
            .await
            .map_err(external)?;
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
