//! `blobhouse bench dml`: deletion vectors against copy-on-write, measured
//! on TPC-H `lineitem` in a local database.
//!
//! For DELETEs of growing size, the same run measures (1) blobhouse's
//! DELETE, which writes a deletion vector per touched data object and a
//! version, and (2) copy-on-write, which rewrites every row group holding a
//! deleted row without those rows — run here as `CREATE TABLE … AS SELECT *
//! FROM lineitem WHERE NOT (predicate)` when the deleted rows touch every
//! row group (the report says how many do; on SF 1 the writer's 12 MiB
//! chunk target makes lineitem one object of one row group, so any delete
//! touches all of it). Reported: bytes written (new files in the database
//! folder), time, and a full scan of the table afterwards (the price of
//! applying deletion vectors while reading).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use blobhouse_engine::{EngineError, EngineOptions, Session};
use blobhouse_storage::StoreOptions;

use crate::answers::result_rows;
use crate::tpch;

/// One DELETE, both ways.
#[derive(Debug, Clone)]
pub struct DmlFigures {
    pub label: String,
    pub rows: u64,
    /// Row groups holding at least one deleted row, of all.
    pub row_groups_touched: u64,
    pub row_groups: u64,
    pub dv_bytes: u64,
    pub dv_time: Duration,
    pub dv_scan: Duration,
    pub cow_bytes: u64,
    pub cow_time: Duration,
    pub cow_scan: Duration,
}

/// The DELETEs measured: a single row, then about 0.1 % and 1 % of the table.
const DELETES: [(&str, &str); 3] = [
    ("1 row", "l_orderkey = 1 AND l_linenumber = 1"),
    ("~0.1 %", "l_orderkey % 1000 = 7"),
    ("~1 %", "l_orderkey % 100 = 3"),
];

/// Runs the benchmark in a fresh database under `dir` (removed after).
pub async fn run(dir: &Path, sf: f64, progress: &dyn Fn(&str)) -> Result<Vec<DmlFigures>, EngineError> {
    let db_dir = dir.join(format!("dml-sf{sf}-{}", std::process::id()));
    let url = db_dir.to_string_lossy().to_string();
    // Scans read the objects each time (the cache would hide what a delete costs them).
    let e = Session::open(&url, &StoreOptions::default(), EngineOptions { cache: blobhouse_engine::CacheOptions::off(), ..EngineOptions::default() }).await?;
    progress(&format!("loading lineitem at SF {sf} into {url}"));
    tpch::load_tables(&e, sf, &["lineitem"], Arc::new(|_, _, _| {})).await?;
    let mut out = Vec::new();
    for (label, predicate) in DELETES {
        progress(&format!("DELETE {label}"));
        let (touched, total) = row_groups_touched(&e, predicate).await?;
        let before = files(&db_dir);
        let started = Instant::now();
        let rows = count(&e.execute(&format!("DELETE FROM lineitem WHERE {predicate}")).await?);
        let dv_time = started.elapsed();
        let dv_bytes = new_bytes(&db_dir, &before);
        let dv_scan = timed(&e, "SELECT sum(l_quantity), count(*) FROM lineitem").await?;

        let before = files(&db_dir);
        let started = Instant::now();
        e.execute(&format!("CREATE TABLE lineitem_cow AS SELECT * FROM lineitem WHERE NOT ({predicate})")).await?;
        let cow_time = started.elapsed();
        let cow_bytes = new_bytes(&db_dir, &before);
        let cow_scan = timed(&e, "SELECT sum(l_quantity), count(*) FROM lineitem_cow").await?;
        e.execute("DROP TABLE lineitem_cow").await?;
        out.push(DmlFigures { label: label.to_string(), rows, row_groups_touched: touched, row_groups: total, dv_bytes, dv_time, dv_scan, cow_bytes, cow_time, cow_scan });
    }
    drop(e);
    let _ = std::fs::remove_dir_all(&db_dir);
    Ok(out)
}

/// Row groups of lineitem holding rows that match `predicate`, and all
/// row groups (from the row ids and the manifest).
async fn row_groups_touched(e: &Session, predicate: &str) -> Result<(u64, u64), EngineError> {
    let version = e.engine().database().refresh().await?;
    let entry = version.tables.get("lineitem").cloned().ok_or_else(|| EngineError::Unsupported("lineitem is missing".into()))?;
    let data = e.engine().database().table_data(&entry).await?;
    let ids = e.execute(&format!("SELECT __blobhouse_row_id FROM blobhouse_dml.lineitem WHERE {predicate}")).await?;
    let mut touched = BTreeSet::new();
    for row in result_rows(&ids.batches) {
        let id: u64 = row[0].parse().unwrap_or(0);
        let (ordinal, position) = ((id >> 32) as usize, id & 0xffff_ffff);
        let object = &data.manifest.objects[ordinal];
        let mut first = 0;
        for (i, rg) in object.row_groups.iter().enumerate() {
            if position < first + rg.rows {
                touched.insert((ordinal, i));
                break;
            }
            first += rg.rows;
        }
    }
    let total = data.objects.iter().map(|l| data.object(l).row_groups.len() as u64).sum();
    Ok((touched.len() as u64, total))
}

async fn timed(e: &Session, sql: &str) -> Result<Duration, EngineError> {
    let started = Instant::now();
    e.execute(sql).await?;
    Ok(started.elapsed())
}

fn count(r: &blobhouse_engine::QueryResult) -> u64 {
    result_rows(&r.batches).first().and_then(|row| row[0].parse().ok()).unwrap_or(0)
}

/// Every file under `dir`.
fn files(dir: &Path) -> BTreeSet<PathBuf> {
    let mut out = BTreeSet::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = entry.path();
            if p.is_dir() {
                stack.push(p);
            } else {
                out.insert(p);
            }
        }
    }
    out
}

/// Bytes of the files under `dir` that are not in `before`.
fn new_bytes(dir: &Path, before: &BTreeSet<PathBuf>) -> u64 {
    files(dir).difference(before).filter_map(|p| std::fs::metadata(p).ok()).map(|m| m.len()).sum()
}

/// The report's table.
pub fn describe(sf: f64, figures: &[DmlFigures]) -> String {
    let mut s = format!(
        "DELETE on TPC-H lineitem SF {sf}: deletion vectors (blobhouse) against copy-on-write of the row groups touched\n\
         {:<8} {:>9} {:>12} {:>14} {:>9} {:>14} {:>9} {:>10} {:>10}\n",
        "delete", "rows", "row groups", "DV bytes", "DV s", "CoW bytes", "CoW s", "scan DV s", "scan CoW s"
    );
    for f in figures {
        s += &format!(
            "{:<8} {:>9} {:>12} {:>14} {:>9.3} {:>14} {:>9.3} {:>10.3} {:>10.3}\n",
            f.label,
            f.rows,
            format!("{}/{}", f.row_groups_touched, f.row_groups),
            f.dv_bytes,
            f.dv_time.as_secs_f64(),
            f.cow_bytes,
            f.cow_time.as_secs_f64(),
            f.dv_scan.as_secs_f64(),
            f.cow_scan.as_secs_f64(),
        );
    }
    s += "DV bytes: the deletion vectors and the version written by the DELETE (the vectors are cumulative, so later rows include earlier deletes).\n\
          CoW: CREATE TABLE … AS SELECT * WHERE NOT (predicate), valid as copy-on-write when the touched row groups are all of them.\n";
    s
}
