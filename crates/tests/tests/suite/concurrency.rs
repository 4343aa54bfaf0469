//! Concurrent writers: every row present exactly once.

use blobhouse_engine::{EngineOptions, Session};

use crate::common::*;
use crate::on_both_backends;

on_both_backends!(concurrent_inserts_keep_every_row_exactly_once);

async fn insert_many(e: &Session, writer: u32, n: u32) {
    for i in 0..n {
        run(e, &format!("INSERT INTO c VALUES ({writer}, {i}), ({writer}, {})", i + 1000)).await;
    }
}

async fn concurrent_inserts_keep_every_row_exactly_once(b: Backend) {
    let db = TestDb::new(b, "concurrent");
    // Two handles: separate key leases, caches and catalog views, as two processes.
    let e1 = db.engine(EngineOptions::default()).await;
    let e2 = db.engine(EngineOptions::default()).await;
    run(&e1, "CREATE TABLE c (writer INT NOT NULL, seq INT NOT NULL)").await;
    let before = e1.engine().database().refresh().await.unwrap().version;
    const N: u32 = 12;
    tokio::join!(insert_many(&e1, 1, N), insert_many(&e2, 2, N));
    let total = run(&e1, "SELECT count(*) FROM c").await;
    let distinct = run(&e2, "SELECT count(*) FROM (SELECT DISTINCT writer, seq FROM c)").await;
    assert_eq!(scalar(&total), (4 * N).to_string());
    assert_eq!(scalar(&distinct), (4 * N).to_string());
    for w in [1, 2] {
        let r = run(&e1, &format!("SELECT count(*) FROM c WHERE writer = {w} AND (seq < {N} OR seq BETWEEN 1000 AND {})", 1000 + N - 1)).await;
        assert_eq!(scalar(&r), (2 * N).to_string(), "writer {w}");
    }
    // Each INSERT committed exactly one database version.
    let after = e2.engine().database().refresh().await.unwrap().version;
    assert_eq!(after - before, 2 * N as u64);
}
