//! Statements run on a cluster: a coordinator engine and 1–3 workers, each
//! an engine of its own on the same database (its own download manager,
//! caches and memory budget), serving over loopback TCP in this process.
//! Plans and rows cross real gRPC connections, so every plan is encoded
//! and decoded as it would be between machines.

use std::collections::HashSet;
use std::sync::Arc;

use blobhouse_bench::tpch;
use blobhouse_cluster::{Cluster, ClusterToken, WorkerServer};
use blobhouse_engine::scan::ScanTally;
use blobhouse_engine::{EngineOptions, Session};

use crate::common::*;
use crate::tpch::assert_22_answers;

fn token() -> ClusterToken {
    ClusterToken::new("suite-cluster-token").expect("a token")
}

/// Workers serving in this process, with what each one's scans read.
struct Workers {
    servers: Vec<WorkerServer>,
    tallies: Vec<Arc<ScanTally>>,
    _engines: Vec<Session>,
}

impl Workers {
    async fn start(db: &TestDb, n: usize) -> Workers {
        let mut w = Workers { servers: Vec::new(), tallies: Vec::new(), _engines: Vec::new() };
        for _ in 0..n {
            let engine = db.engine(EngineOptions::default()).await;
            let tally = Arc::new(ScanTally::default());
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind a loopback port");
            w.servers.push(WorkerServer::start(engine.engine(), listener, token(), None, Some(tally.clone())).expect("serve"));
            w.tallies.push(tally);
            w._engines.push(engine);
        }
        w
    }

    fn urls(&self) -> Vec<String> {
        self.servers.iter().map(|s| s.url().to_string()).collect()
    }

    /// A coordinator on `db` that runs its statements on these workers.
    async fn coordinator(&self, db: &TestDb) -> Session {
        let e = db.engine(EngineOptions::default()).await;
        Cluster::new(&self.urls(), token(), None).expect("a valid cluster").install(e.engine());
        e
    }

    /// Every (object, row group) the workers' scans were given.
    fn row_groups(&self) -> Vec<(String, usize)> {
        self.tallies.iter().flat_map(|t| t.row_groups()).collect()
    }

    fn clear(&self) {
        self.tallies.iter().for_each(|t| t.clear());
    }
}

/// Lineitem of SF 0.01 in row groups of 1 000 rows (61 of them).
async fn small_row_groups(db: &TestDb) {
    let mut o = EngineOptions::default();
    o.write.max_row_group_rows = Some(1000);
    let loader = db.engine(o).await;
    tpch::load(&loader, 0.01, Arc::new(|_, _, _| {})).await.expect("load TPC-H");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tpch_answers_on_one_two_and_three_workers_are_exact() {
    let db = TestDb::new(Backend::Local, "cluster-tpch");
    small_row_groups(&db).await;
    for n in [1, 2, 3] {
        let workers = Workers::start(&db, n).await;
        let c = workers.coordinator(&db).await;
        assert_22_answers(&c, &format!(" on {n} workers")).await;
        // One worker included: its stage boundary is placed for it
        // (`blobhouse_cluster::whole`), or the coordinator would run it all.
        assert!(!workers.row_groups().is_empty(), "{n} workers read nothing: the queries did not run on them");
    }
}

/// Every row group is read once, by one worker, and the workers together
/// read what one engine alone reads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_row_group_is_read_by_exactly_one_worker() {
    let db = TestDb::new(Backend::Local, "cluster-once");
    small_row_groups(&db).await;
    let single = db.engine(EngineOptions::default()).await;
    let sql = "SELECT count(*), sum(l_quantity), sum(l_extendedprice) FROM lineitem";
    let alone = run(&single, sql).await;
    assert!(alone.scan.row_groups_read >= 50, "{:?}", alone.scan);
    let workers = Workers::start(&db, 3).await;
    let c = workers.coordinator(&db).await;
    let plan = text(&run(&c, &format!("EXPLAIN {sql}")).await);
    assert!(plan.contains("distributed_plan") && plan.contains("Stage") && plan.contains("BlobScanExec"), "{plan}");
    workers.clear();
    let together = run(&c, sql).await;
    assert_eq!(text(&together), text(&alone));
    let given = workers.row_groups();
    let distinct: HashSet<&(String, usize)> = given.iter().collect();
    assert_eq!(distinct.len(), given.len(), "a row group was given to two tasks");
    assert_eq!(given.len() as u64, alone.scan.row_groups_read, "row groups given, against one engine's");
    let read: u64 = workers.tallies.iter().map(|t| t.read().row_groups_read).sum();
    assert_eq!(read, alone.scan.row_groups_read, "row groups read, against one engine's");
    let rows: u64 = workers.tallies.iter().map(|t| t.rows()).sum();
    assert_eq!(rows.to_string(), scalar(&run(&single, "SELECT count(*) FROM lineitem").await));
    let busy = workers.tallies.iter().filter(|t| !t.row_groups().is_empty()).count();
    assert_eq!(busy, 3, "every worker is home to some of 61 row groups");

    // What the workers' scans read reaches the coordinator with their
    // streams: its counters are theirs, per worker and summed.
    assert_eq!(together.scan.row_groups_read, alone.scan.row_groups_read, "{:?}", together.scan);
    assert_eq!(together.scan.get_requests, workers.tallies.iter().map(|t| t.read().get_requests).sum::<u64>());
    assert_eq!(together.processes.len(), 3, "{:?}", together.processes);
    for ((who, m), (url, tally)) in together.processes.iter().zip(workers.urls().iter().zip(&workers.tallies)) {
        assert!(who.contains(url.trim_end_matches('/')), "{who} is not {url}");
        assert_eq!(m.row_groups_read, tally.read().row_groups_read, "{who}");
    }
    let analyzed = text(&run(&c, &format!("EXPLAIN ANALYZE {sql}")).await);
    assert!(analyzed.contains("Scans per process") && analyzed.matches("row groups, ").count() >= 3, "{analyzed}");
}

/// What the coordinator plans from — deleted rows, a past version, an open
/// transaction's own uncommitted rows — is what the workers read: the same
/// answers as one engine alone, and DML whose WHERE reads through the
/// workers changes the same rows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn versions_deletes_and_open_transactions_read_the_same_on_workers() {
    let db = TestDb::new(Backend::Local, "cluster-versions");
    small_row_groups(&db).await;
    let workers = Workers::start(&db, 3).await;
    let c = workers.coordinator(&db).await;
    let single = db.engine(EngineOptions::default()).await;
    let q = "SELECT count(*), sum(l_quantity), min(l_orderkey), max(l_orderkey), count(DISTINCT l_suppkey) FROM lineitem";
    let version = |r: &blobhouse_engine::QueryResult| lines(r)[0].split('|').next().expect("a version").to_string();
    let v1 = version(&run(&single, "SHOW VERSIONS 1").await);

    // DML on the cluster, WHERE with a subquery.
    run(&c, "DELETE FROM lineitem WHERE l_orderkey IN (SELECT o_orderkey FROM orders WHERE o_totalprice > 250000)").await;
    run(&c, "UPDATE lineitem SET l_quantity = l_quantity + 1 WHERE l_linenumber = 1 AND l_partkey IN (SELECT p_partkey FROM part WHERE p_size < 10)").await;
    workers.clear();
    let now = run(&c, q).await;
    assert!(workers.tallies.iter().filter(|t| !t.row_groups().is_empty()).count() > 1, "the query did not run on the workers");
    assert_eq!(text(&now), text(&run(&single, q).await), "after DELETE and UPDATE");
    let at = format!("SELECT count(*), sum(l_quantity) FROM lineitem AT(VERSION => {v1})");
    assert_eq!(text(&run(&c, &at).await), text(&run(&single, &at).await), "at version {v1}");
    assert_ne!(text(&run(&c, &at).await), text(&run(&c, "SELECT count(*), sum(l_quantity) FROM lineitem").await), "the DML changed nothing");

    // An open transaction reads its own uncommitted rows through the workers.
    let insert = "INSERT INTO lineitem SELECT * FROM lineitem WHERE l_orderkey < 200";
    for e in [&c, &single] {
        run(e, "BEGIN").await;
        run(e, insert).await;
    }
    let inside = run(&c, q).await;
    assert_ne!(text(&inside), text(&now), "the transaction's rows were not read");
    assert_eq!(text(&inside), text(&run(&single, q).await), "inside BEGIN after an INSERT");
    for e in [&c, &single] {
        run(e, "ROLLBACK").await;
    }
    assert_eq!(text(&run(&c, q).await), text(&now), "after ROLLBACK");
}

/// Workers over TLS: a coordinator that trusts their CA gets the answers;
/// one without the CA is told to give it; a worker whose key does not
/// match its certificate does not start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_over_tls_serve_coordinators_that_trust_their_ca() {
    let db = TestDb::new(Backend::Local, "cluster-tls");
    small_row_groups(&db).await;
    let certs = tempfile::tempdir().unwrap();
    blobhouse_testbed::make_certificates(certs.path()).expect("openssl makes the test certificates");
    let read = |f: &str| std::fs::read(certs.path().join(f)).unwrap();
    let tls = blobhouse_cluster::WorkerTls { cert: read("cert.pem"), key: read("key.pem"), ca: Some(read("ca.pem")) };
    let mut servers = Vec::new();
    let mut engines = Vec::new();
    for _ in 0..2 {
        let engine = db.engine(EngineOptions::default()).await;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        servers.push(WorkerServer::start(engine.engine(), listener, token(), Some(&tls), None).expect("serve over TLS"));
        engines.push(engine);
    }
    let urls: Vec<String> = servers.iter().map(|s| s.url().to_string()).collect();
    assert!(urls.iter().all(|u| u.starts_with("https://")), "{urls:?}");
    let q = "SELECT l_returnflag, count(*), sum(l_quantity) FROM lineitem GROUP BY l_returnflag ORDER BY l_returnflag";
    let single = db.engine(EngineOptions::default()).await;
    let c = db.engine(EngineOptions::default()).await;
    Cluster::new(&urls, token(), Some(&read("ca.pem"))).unwrap().install(c.engine());
    assert_eq!(text(&run(&c, q).await), text(&run(&single, q).await));
    let untrusting = db.engine(EngineOptions::default()).await;
    Cluster::new(&urls, token(), None).unwrap().install(untrusting.engine());
    let err = fail(&untrusting, q).await;
    assert!(err.contains("--worker-ca"), "{err}");

    let engine = db.engine(EngineOptions::default()).await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let mismatched = blobhouse_cluster::WorkerTls { key: read("ca.key"), ..tls.clone() };
    let refused = WorkerServer::start(engine.engine(), listener, token(), Some(&mismatched), None);
    assert!(matches!(refused, Err(blobhouse_cluster::WorkerError::Tls(_))), "{refused:?}");
}

/// Cache affinity: a repeated query sends each row group to the worker
/// that read it last time, so the second run reads its data from the
/// workers' memory tiers and hardly from the store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeated_query_reads_from_the_workers_tiers() {
    let db = TestDb::new(Backend::Local, "cluster-affinity");
    small_row_groups(&db).await;
    for q in [1, 6] {
        // Fresh workers for each query: Q6's columns are among Q1's.
        let workers = Workers::start(&db, 3).await;
        let c = workers.coordinator(&db).await;
        repeat_on(&workers, &c, q).await;
    }
}

async fn repeat_on(workers: &Workers, c: &Session, q: usize) {
    let read = || {
        let mut sum = blobhouse_engine::scan::TallyRead::default();
        for t in &workers.tallies {
            let r = t.read();
            sum.get_requests += r.get_requests;
            sum.bytes_fetched += r.bytes_fetched;
            sum.tier_bytes += r.tier_bytes;
            sum.row_groups_read += r.row_groups_read;
        }
        sum
    };
    let sql = tpch::query(q);
    workers.clear();
    let first = run(c, sql).await;
    let cold = read();
    workers.clear();
    let second = run(c, sql).await;
    let warm = read();
    assert_eq!(text(&first), text(&second), "Q{q}");
    assert!(cold.get_requests > 0 && cold.bytes_fetched > 0, "Q{q} cold: {cold:?}");
    // The coordinator's counters are the workers' (they come back with the streams).
    assert_eq!((first.scan.get_requests, second.scan.get_requests), (cold.get_requests, warm.get_requests), "Q{q}");
    assert_eq!(warm.row_groups_read, cold.row_groups_read, "Q{q}");
    let from_tiers = warm.tier_bytes as f64 / (warm.tier_bytes + warm.bytes_fetched).max(1) as f64;
    assert!(from_tiers >= 0.95, "Q{q}: {:.1} % of the second run's bytes came from the tiers: {warm:?}", from_tiers * 100.0);
    assert!(warm.get_requests * 20 <= cold.get_requests, "Q{q}: {} GETs against {} the first time", warm.get_requests, cold.get_requests);
}
