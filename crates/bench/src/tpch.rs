//! TPC-H: generate the eight tables with `tpchgen` (identical to dbgen),
//! load them into a database, and run the 22 queries.

use std::sync::Arc;
use std::time::{Duration, Instant};

use datafusion::arrow::array::{RecordBatch, RecordBatchReader};
use datafusion::arrow::error::ArrowError;
use datafusion::arrow::datatypes::SchemaRef;
use tokio::sync::mpsc;

use blobhouse_engine::{EngineError, QueryResult, Session};
use blobhouse_storage::{StorageError, TableWriter, Transaction};
use tpchgen::generators::*;
use tpchgen_arrow::*;

use crate::answers::{self, Verdict};

/// The tables, smallest first.
pub const TABLES: [&str; 8] = ["region", "nation", "supplier", "customer", "part", "partsupp", "orders", "lineitem"];

/// The text of query `n` (1–22), with the official validation parameters.
pub fn query(n: usize) -> &'static str {
    macro_rules! q {
        ($($n:literal => $f:literal),*) => { match n { $($n => include_str!(concat!("../tpch/queries/", $f)),)* _ => panic!("TPC-H has queries 1 to 22, not {n}") } };
    }
    q!(1 => "q01.sql", 2 => "q02.sql", 3 => "q03.sql", 4 => "q04.sql", 5 => "q05.sql", 6 => "q06.sql", 7 => "q07.sql",
       8 => "q08.sql", 9 => "q09.sql", 10 => "q10.sql", 11 => "q11.sql", 12 => "q12.sql", 13 => "q13.sql", 14 => "q14.sql",
       15 => "q15.sql", 16 => "q16.sql", 17 => "q17.sql", 18 => "q18.sql", 19 => "q19.sql", 20 => "q20.sql", 21 => "q21.sql",
       22 => "q22.sql")
}

/// Rows a table will have at `sf` (lineitem: the expected value, ±0.1%).
pub fn estimated_rows(table: &str, sf: f64) -> u64 {
    match table {
        "region" => 5,
        "nation" => 25,
        "supplier" => SupplierGenerator::calculate_row_count(sf, 1, 1) as u64,
        "customer" => CustomerGenerator::calculate_row_count(sf, 1, 1) as u64,
        "part" => PartGenerator::calculate_row_count(sf, 1, 1) as u64,
        "partsupp" => PartSuppGenerator::calculate_row_count(sf, 1, 1) as u64,
        "orders" => OrderGenerator::calculate_row_count(sf, 1, 1) as u64,
        "lineitem" => OrderGenerator::calculate_row_count(sf, 1, 1) as u64 * 4,
        _ => 0,
    }
}

fn schema_of(table: &str) -> SchemaRef {
    match table {
        "region" => RegionArrow::new(RegionGenerator::new(1.0, 1, 1)).schema().clone(),
        "nation" => NationArrow::new(NationGenerator::new(1.0, 1, 1)).schema().clone(),
        "supplier" => SupplierArrow::new(SupplierGenerator::new(1.0, 1, 1)).schema().clone(),
        "customer" => CustomerArrow::new(CustomerGenerator::new(1.0, 1, 1)).schema().clone(),
        "part" => PartArrow::new(PartGenerator::new(1.0, 1, 1)).schema().clone(),
        "partsupp" => PartSuppArrow::new(PartSuppGenerator::new(1.0, 1, 1)).schema().clone(),
        "orders" => OrderArrow::new(OrderGenerator::new(1.0, 1, 1)).schema().clone(),
        "lineitem" => LineItemArrow::new(LineItemGenerator::new(1.0, 1, 1)).schema().clone(),
        other => panic!("not a TPC-H table: {other}"),
    }
}

fn generate(table: &str, sf: f64) -> Box<dyn Iterator<Item = Result<RecordBatch, ArrowError>> + Send> {
    const BATCH: usize = 8192;
    match table {
        "region" => Box::new(RegionArrow::new(RegionGenerator::new(sf, 1, 1)).with_batch_size(BATCH)),
        "nation" => Box::new(NationArrow::new(NationGenerator::new(sf, 1, 1)).with_batch_size(BATCH)),
        "supplier" => Box::new(SupplierArrow::new(SupplierGenerator::new(sf, 1, 1)).with_batch_size(BATCH)),
        "customer" => Box::new(CustomerArrow::new(CustomerGenerator::new(sf, 1, 1)).with_batch_size(BATCH)),
        "part" => Box::new(PartArrow::new(PartGenerator::new(sf, 1, 1)).with_batch_size(BATCH)),
        "partsupp" => Box::new(PartSuppArrow::new(PartSuppGenerator::new(sf, 1, 1)).with_batch_size(BATCH)),
        "orders" => Box::new(OrderArrow::new(OrderGenerator::new(sf, 1, 1)).with_batch_size(BATCH)),
        "lineitem" => Box::new(LineItemArrow::new(LineItemGenerator::new(sf, 1, 1)).with_batch_size(BATCH)),
        other => panic!("not a TPC-H table: {other}"),
    }
}

/// Reports load progress: (table, rows written, rows expected).
pub type Progress = Arc<dyn Fn(&str, u64, u64) + Send + Sync>;

/// What a load did, per table.
#[derive(Debug, Clone)]
pub struct TableLoad {
    pub table: String,
    pub rows: u64,
    pub bytes: u64,
    pub objects: usize,
    pub elapsed: Duration,
}

/// Generates TPC-H at scale factor `sf` and loads each table in one commit.
/// Fails (with nothing committed for that table) if a table already exists.
pub async fn load(engine: &Session, sf: f64, progress: Progress) -> Result<Vec<TableLoad>, EngineError> {
    load_tables(engine, sf, &TABLES, progress).await
}

/// Like [`load`], for a subset of the tables.
pub async fn load_tables(engine: &Session, sf: f64, tables: &[&str], progress: Progress) -> Result<Vec<TableLoad>, EngineError> {
    if let Some(t) = tables.iter().find(|t| !TABLES.contains(t)) {
        return Err(EngineError::Unsupported(format!("'{t}' is not a TPC-H table")));
    }
    if !(sf > 0.0 && sf.is_finite()) {
        return Err(EngineError::Unsupported(format!("scale factor must be positive, not {sf}")));
    }
    let current = engine.engine().database().refresh().await?;
    if let Some(t) = tables.iter().find(|t| current.tables.contains_key(**t)) {
        return Err(StorageError::TableExists(t.to_string()).into());
    }
    // Tables load concurrently: generation and encoding of different tables
    // keep all cores busy while uploads are in flight.
    let loads = tables.iter().map(|t| load_table(engine, t, sf, progress.clone()));
    futures::future::try_join_all(loads).await
}

async fn load_table(engine: &Session, table: &str, sf: f64, progress: Progress) -> Result<TableLoad, EngineError> {
    let started = Instant::now();
    let schema = schema_of(table);
    let expected = estimated_rows(table, sf);
    let (tx, mut rx) = mpsc::channel::<Result<RecordBatch, ArrowError>>(4);
    let name = table.to_string();
    let generator = std::thread::spawn(move || {
        for batch in generate(&name, sf) {
            if tx.blocking_send(batch).is_err() {
                break;
            }
        }
    });
    let mut writer = TableWriter::new(engine.engine().database().clone(), schema.clone(), engine_write_options(engine));
    while let Some(batch) = rx.recv().await {
        let written = match batch {
            Ok(batch) => writer.write(&batch).await.map_err(EngineError::from),
            Err(e) => Err(EngineError::Unsupported(format!("TPC-H generator failed for {table}: {e}"))),
        };
        if let Err(e) = written {
            writer.abort().await;
            return Err(e);
        }
        progress(table, writer.rows(), expected.max(writer.rows()));
    }
    let _ = generator.join();
    let rows = writer.rows();
    let objects = writer.finish().await?;
    let bytes = objects.iter().map(|o| o.size).sum();
    let count = objects.len();
    let mut txn = Transaction::begin(engine.engine().database(), engine.engine().database().refresh().await?);
    txn.create_table(table, schema.as_ref().clone(), false, objects).await?;
    txn.commit().await?;
    progress(table, rows, rows);
    Ok(TableLoad { table: table.to_string(), rows, bytes, objects: count, elapsed: started.elapsed() })
}

fn engine_write_options(engine: &Session) -> blobhouse_storage::WriteOptions {
    engine.engine().options().write.clone()
}

/// One query's run.
#[derive(Debug, Clone)]
pub struct QueryRun {
    pub query: usize,
    pub result: QueryResult,
    pub verdict: Verdict,
}

/// Runs query `n` and checks its answer against the reference for `sf`.
pub async fn run_query(engine: &Session, n: usize, sf: f64) -> Result<QueryRun, EngineError> {
    let result = engine.execute(query(n)).await?;
    let verdict = answers::verify(n, sf, &result);
    Ok(QueryRun { query: n, result, verdict })
}
