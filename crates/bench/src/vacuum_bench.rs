//! `blobhouse bench vacuum`: what one VACUUM costs on a database of many
//! objects with a little garbage.
//!
//! Builds a local database of `tables` tables holding `objects` one-row data
//! objects in all, drops one table (its objects are the garbage), and runs
//! `VACUUM RETAIN '0 seconds' GRACE '0 seconds'`. Reports VACUUM's own request counts (GETs,
//! LISTs, paths deleted, and the requests the deletes take on S3, which
//! deletes 1,000 keys per request) beside what listing `objects/` alone
//! would take — the first step of a mark-and-sweep collector.

use std::sync::Arc;
use std::time::Instant;

use datafusion::arrow::array::Int64Array;
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::arrow::record_batch::RecordBatch;

use blobhouse_engine::{EngineError, EngineOptions, Session};
use blobhouse_storage::{StoreOptions, TableWriter, Transaction, WriteOptions};

use crate::answers::result_rows;

/// The figures of one run.
#[derive(Debug, Clone)]
pub struct VacuumFigures {
    pub objects: u64,
    pub garbage: u64,
    pub build_secs: f64,
    pub vacuum_secs: f64,
    pub gets: u64,
    pub deleted_paths: u64,
    pub s3_requests: u64,
    pub list_pages_for_full_listing: u64,
    pub full_listing_secs: f64,
}

/// Runs the benchmark in a fresh database under `dir` (removed after).
pub async fn run(dir: &std::path::Path, objects: u64, tables: u64, progress: &dyn Fn(&str)) -> Result<VacuumFigures, EngineError> {
    let db_dir = dir.join(format!("vacuum-{}", std::process::id()));
    let url = db_dir.to_string_lossy().to_string();
    let e = Session::open(&url, &StoreOptions::default(), EngineOptions::default()).await?;
    let schema = Arc::new(Schema::new(vec![Field::new("id", DataType::Int64, false)]));
    let per_table = objects / tables;
    // One row group and one object per row.
    let options = WriteOptions { max_row_group_rows: Some(1), max_object_bytes: 1, ..WriteOptions::default() };
    let started = Instant::now();
    for t in 0..tables {
        let mut writer = TableWriter::new(e.engine().database().clone(), schema.clone(), options.clone());
        for i in 0..per_table {
            let batch = RecordBatch::try_new(schema.clone(), vec![Arc::new(Int64Array::from(vec![(t * per_table + i) as i64]))]).map_err(datafusion::error::DataFusionError::from)?;
            writer.write(&batch).await?;
        }
        let written = writer.finish().await?;
        let mut txn = Transaction::begin(e.engine().database(), e.engine().database().refresh().await?);
        txn.create_table(&format!("t{t}"), schema.as_ref().clone(), false, written).await?;
        txn.commit().await?;
        if t % 10 == 9 {
            progress(&format!("{} of {objects} objects written", (t + 1) * per_table));
        }
    }
    let build_secs = started.elapsed().as_secs_f64();
    // The garbage: one table's objects.
    e.execute("DROP TABLE t0").await?;
    let started = Instant::now();
    // GRACE 0 as well: nothing else writes, so the expired versions go too.
    let r = e.execute("VACUUM RETAIN '0 seconds' GRACE '0 seconds'").await?;
    let vacuum_secs = started.elapsed().as_secs_f64();
    let row = &result_rows(&r.batches)[0];
    let field = |i: usize| row[i].parse::<u64>().unwrap_or(0);
    let (gets, deleted_paths) = (field(7), field(6));
    // The comparison: listing every object once.
    let started = Instant::now();
    let listed: Vec<object_store::ObjectMeta> =
        futures::TryStreamExt::try_collect(e.engine().database().store().list(Some(&e.engine().database().location().child("objects")))).await.map_err(|err| EngineError::Unsupported(err.to_string()))?;
    let full_listing_secs = started.elapsed().as_secs_f64();
    let figures = VacuumFigures {
        objects: per_table * tables,
        garbage: per_table,
        build_secs,
        vacuum_secs,
        gets,
        deleted_paths,
        // GETs, one LIST of keys/ per 1,000 key blocks (the sweep), and the
        // deletes in requests of 1,000 keys.
        s3_requests: gets + deleted_paths.div_ceil(1000) + 1,
        list_pages_for_full_listing: (listed.len() as u64).div_ceil(1000),
        full_listing_secs,
    };
    drop(e);
    let _ = std::fs::remove_dir_all(&db_dir);
    Ok(figures)
}

/// The report's table.
pub fn describe(f: &VacuumFigures) -> String {
    format!(
        "VACUUM on {} one-row data objects in {} tables, {} of them garbage (one dropped table); built in {:.1} s\n\
         VACUUM: {:.2} s, {} GETs, {} paths deleted, {} requests on S3 (GETs + 1 LIST of keys/ + deletes by 1,000)\n\
         Listing objects/ alone (a mark-and-sweep collector's first step): {} LIST pages, {:.2} s here\n",
        f.objects,
        f.objects / f.garbage.max(1),
        f.garbage,
        f.build_secs,
        f.vacuum_secs,
        f.gets,
        f.deleted_paths,
        f.s3_requests,
        f.list_pages_for_full_listing,
        f.full_listing_secs
    )
}
