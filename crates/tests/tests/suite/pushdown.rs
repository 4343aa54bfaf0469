//! Hybrid pushdown (docs/pushdown.md): answers are the same whether row
//! groups are read from the caches, pushed to a storage node or fetched;
//! a node that is busy or killed mid-query only costs time; a node serves
//! only callers with its token and only well-formed, separable fragments
//! over its own database's data objects.

use std::sync::Arc;
use std::time::Duration;

use blobhouse_bench::tpch;
use blobhouse_engine::hybrid::{PushdownMode, PushdownOptions};
use blobhouse_engine::{CacheOptions, EngineOptions};
use blobhouse_pushdown::{NodeClient, NodeOptions, ObjectSlice, ObjectSliceExec, PushdownError, StorageNode};

use crate::common::*;
use crate::on_both_backends;
use crate::tpch::assert_22_answers;

pub(crate) const TOKEN: &str = "pushdown-test-token";

/// TPC-H SF 0.01 written in small row groups (many units per scan, so that
/// every scan splits several ways).
async fn loaded(b: Backend, name: &str) -> TestDb {
    let db = TestDb::new(b, name);
    let loader = db.engine(EngineOptions { cache: CacheOptions::off(), ..small_chunks(64 << 10) }).await;
    tpch::load(&loader, 0.01, Arc::new(|_, _, _| {})).await.expect("load TPC-H");
    db
}

/// A node in this process over the test database (through its audited store).
pub(crate) async fn node(db: &TestDb, opts: NodeOptions) -> (StorageNode, String, tokio::task::JoinHandle<Result<(), String>>) {
    let node = StorageNode::new(db.location.clone(), opts).unwrap();
    let (addr, handle) = node.clone().spawn("127.0.0.1:0".parse().unwrap()).await.unwrap();
    (node, format!("http://{addr}"), handle)
}

pub(crate) fn pushing(endpoint: &str, mode: PushdownMode, cache: CacheOptions) -> EngineOptions {
    let mut p = PushdownOptions::new(endpoint, TOKEN);
    p.mode = mode;
    EngineOptions { cache, pushdown: Some(p), ..EngineOptions::default() }
}

/// The 22 answers in pull-up, caching-only, pushdown-only and hybrid modes
/// (on and auto), and the node did the pushed work.
async fn tpch_answers_are_exact_in_every_mode(b: Backend) {
    let db = loaded(b, "pushdown-answers").await;
    let (node, endpoint, _h) = node(&db, NodeOptions::new(TOKEN)).await;
    let small = CacheOptions { memory: Some(512 << 10), ..CacheOptions::default() };
    let configs = [
        ("pull-up", EngineOptions { cache: CacheOptions::off(), ..EngineOptions::default() }),
        ("caching-only", EngineOptions { cache: small.clone(), ..EngineOptions::default() }),
        ("pushdown-only", pushing(&endpoint, PushdownMode::On, CacheOptions::off())),
        ("hybrid", pushing(&endpoint, PushdownMode::On, small.clone())),
        ("hybrid auto", pushing(&endpoint, PushdownMode::Auto, small.clone())),
        ("hybrid wlfu", pushing(&endpoint, PushdownMode::Auto, CacheOptions { memory_policy: blobhouse_cache::PolicyKind::WeightedLfu, ..small.clone() })),
    ];
    for (name, options) in configs {
        let before = node.stats().tasks_done;
        let pushes = options.pushdown.is_some();
        let e = db.engine(options).await;
        assert_22_answers(&e, &format!(" ({name}, first round)")).await;
        assert_22_answers(&e, &format!(" ({name}, second round)")).await;
        let tasks = node.stats().tasks_done - before;
        if pushes {
            assert!(tasks > 0, "{name}: nothing was pushed");
        } else {
            assert_eq!(tasks, 0, "{name} pushed work");
        }
        let warnings = e.engine().pushdown().map(|p| p.take_warnings()).unwrap_or_default();
        assert!(warnings.is_empty(), "{name}: node failures were survived: {warnings:?}");
    }
    let stats = node.stats();
    assert_eq!(stats.tasks_failed, 0, "{stats:?}");
    assert!(stats.bytes_read > 0 && stats.rows_decoded > stats.rows_sent, "pushed filters and aggregates reduce rows: {stats:?}");
}

/// EXPLAIN shows the split and the rates behind it; EXPLAIN ANALYZE the
/// row groups each path took.
async fn explain_shows_the_split(b: Backend) {
    let db = loaded(b, "pushdown-explain").await;
    let (_node, endpoint, _h) = node(&db, NodeOptions::new(TOKEN)).await;
    let e = db.engine(pushing(&endpoint, PushdownMode::On, CacheOptions::off())).await;
    let sql = "SELECT l_returnflag, sum(l_quantity) FROM lineitem WHERE l_shipdate < DATE '1995-01-01' GROUP BY 1";
    let plan = text(&run(&e, &format!("EXPLAIN {sql}")).await);
    assert!(plan.contains("HybridExec: node=http://127.0.0.1") && plan.contains("mode=on") && plan.contains("push="), "{plan}");
    let analyzed = text(&run(&e, &format!("EXPLAIN ANALYZE {sql}")).await);
    assert!(analyzed.contains("row_groups_pushed="), "{analyzed}");
    // Each statement's result says what it pushed (the shell prints it).
    let pushed = run(&e, sql).await.pushdown;
    assert!(pushed.row_groups_pushed > 0 && pushed.bytes_pushed > 0 && pushed.bytes_received > 0, "{pushed:?}");
    run(&e, "SET pushdown = 'off'").await;
    assert_eq!(run(&e, sql).await.pushdown, Default::default());
    let plan = text(&run(&e, &format!("EXPLAIN {sql}")).await);
    assert!(!plan.contains("HybridExec"), "{plan}");
    assert!(fail(&e, "SET pushdown = 'sometimes'").await.contains("use 'off', 'on' or 'auto'"));
}

/// Joins send a Bloom filter of their build side's keys with the pushed
/// scans of their probe side: the node returns fewer bytes, and answers of
/// inner, semi, anti and outer joins stay those of a plain engine.
async fn bloom_probes_cut_what_the_node_sends(b: Backend) {
    let db = loaded(b, "pushdown-bloom").await;
    let (node, endpoint, _h) = node(&db, NodeOptions::new(TOKEN)).await;
    let plain = db.engine(EngineOptions { cache: CacheOptions::off(), ..EngineOptions::default() }).await;
    let selective = "SELECT count(*), sum(l_extendedprice) FROM lineitem JOIN part ON l_partkey = p_partkey \
                     WHERE p_brand = 'Brand#23' AND l_shipdate < DATE '1998-01-01'";
    let queries = [
        selective,
        "SELECT count(*) FROM orders WHERE o_orderdate < DATE '1996-01-01' AND o_custkey IN (SELECT c_custkey FROM customer WHERE c_mktsegment = 'BUILDING')",
        "SELECT count(*) FROM orders WHERE o_orderdate < DATE '1996-01-01' AND NOT EXISTS (SELECT 1 FROM customer WHERE c_custkey = o_custkey AND c_mktsegment = 'BUILDING')",
        "SELECT count(*), count(l_orderkey) FROM part LEFT JOIN lineitem ON l_partkey = p_partkey AND l_quantity < 5 WHERE p_size = 7",
        "SELECT c_mktsegment, count(*) FROM customer JOIN orders ON o_custkey = c_custkey JOIN nation ON c_nationkey = n_nationkey \
         WHERE n_name = 'FRANCE' AND o_totalprice > 1000 GROUP BY 1 ORDER BY 1",
    ];
    let mut received = Vec::new();
    for bloom in ["on", "off"] {
        let e = db.engine(pushing(&endpoint, PushdownMode::On, CacheOptions::off())).await;
        run(&e, &format!("SET pushdown_bloom = {bloom}")).await;
        for q in queries {
            assert_eq!(lines(&run(&e, q).await), lines(&run(&plain, q).await), "bloom {bloom}: {q}");
        }
        let before = e.engine().pushdown().unwrap().totals().bytes_received;
        run(&e, selective).await;
        received.push(e.engine().pushdown().unwrap().totals().bytes_received - before);
        let analyzed = text(&run(&e, &format!("EXPLAIN ANALYZE {selective}")).await);
        let used = analyzed.contains("bloom_filters=1");
        assert_eq!(used, bloom == "on", "bloom {bloom}: {analyzed}");
        assert!(e.engine().pushdown().unwrap().take_warnings().is_empty());
    }
    // Brand#23 is one part in 25: the filter drops most of lineitem's rows.
    assert!(received[0] * 3 < received[1], "bytes received with and without Bloom probes: {received:?}");
    assert_eq!(node.stats().tasks_failed, 0);
}

/// A pushed row group carries the compute side's page-index selection: the
/// node fetches and decodes only those pages (with the dictionary pages),
/// and drops deleted rows at their right positions inside them.
async fn the_node_decodes_only_the_selected_pages(b: Backend) {
    let db = TestDb::new(b, "pushdown-pages");
    let plain = db.engine(EngineOptions { cache: CacheOptions::off(), ..EngineOptions::default() }).await;
    tpch::load_tables(&plain, 0.01, &["lineitem"], Arc::new(|_, _, _| {})).await.expect("load lineitem");
    run(&plain, "DELETE FROM lineitem WHERE l_orderkey BETWEEN 45000 AND 45100").await;
    let rows: u64 = scalar(&run(&plain, "SELECT count(*) FROM lineitem").await).parse().unwrap();
    let (node, endpoint, _h) = node(&db, NodeOptions::new(TOKEN)).await;
    let e = db.engine(pushing(&endpoint, PushdownMode::On, CacheOptions::off())).await;
    let current = plain.engine().database().current();
    let manifest = plain.engine().database().manifest(&current.tables["lineitem"]).await.unwrap();
    // The chunks of the columns the query reads: l_orderkey, l_quantity, l_returnflag.
    let chunks: u64 = manifest.objects.iter().flat_map(|o| &o.row_groups).map(|rg| [0, 4, 8].iter().map(|&c| rg.columns[c].length).sum::<u64>()).sum();
    for range in ["l_orderkey < 5000", "l_orderkey BETWEEN 44000 AND 46000", "l_orderkey > 40000"] {
        let sql = format!("SELECT l_returnflag, count(*), sum(l_quantity) FROM lineitem WHERE {range} GROUP BY 1 ORDER BY 1");
        let before = node.stats();
        let pushed = run(&e, &sql).await;
        let (decoded, read) = (node.stats().rows_decoded - before.rows_decoded, node.stats().bytes_read - before.bytes_read);
        assert!(pushed.pushdown.row_groups_pushed > 0, "{range}: nothing pushed");
        assert_eq!(lines(&pushed), lines(&run(&plain, &sql).await), "{range}");
        assert!(decoded < rows, "{range}: the node decoded {decoded} of {rows} rows");
        eprintln!("{range}: the node read {read} of the columns' {chunks} bytes, decoded {decoded} of {rows} rows");
        // What it reads follows the share of rows selected; the dictionary
        // pages come on top (reading whole chunks would make this 1.0).
        let (read_share, row_share) = (read as f64 / chunks as f64, decoded as f64 / rows as f64);
        assert!(read_share < row_share + 0.1, "{range}: the node read {read} of the columns' {chunks} bytes for {decoded} of {rows} rows");
    }
    assert!(e.engine().pushdown().unwrap().take_warnings().is_empty());
    assert_eq!(node.stats().tasks_failed, 0);
}

on_both_backends!(
    tpch_answers_are_exact_in_every_mode,
    explain_shows_the_split,
    bloom_probes_cut_what_the_node_sends,
    the_node_decodes_only_the_selected_pages
);

/// A node with one task slot and no queue refuses most of a scan's tasks;
/// the engine reads those row groups itself and the answers stay exact.
/// One row group per task, so that a scan of several row groups sends
/// several tasks at once (with the default four per task, whether two tasks
/// ever overlapped depended on timing, and one run in the suite saw none).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_node_refuses_and_the_engine_fetches_instead() {
    let db = loaded(Backend::Local, "pushdown-busy").await;
    let (node, endpoint, _h) = node(&db, NodeOptions { max_tasks: 1, max_queued: 0, ..NodeOptions::new(TOKEN) }).await;
    let mut options = pushing(&endpoint, PushdownMode::On, CacheOptions::off());
    options.pushdown.as_mut().expect("pushing configures a node").row_groups_per_task = 1;
    let e = db.engine(options).await;
    assert_22_answers(&e, " (busy node)").await;
    let stats = node.stats();
    assert!(stats.tasks_refused > 0 && stats.tasks_done > 0, "{stats:?}");
    let warnings = e.engine().pushdown().unwrap().take_warnings();
    assert!(warnings.iter().any(|w| w.contains("refused") && w.contains("fetch the data instead")), "{warnings:?}");
}

/// A node that is not there: every query fetches, with a warning.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_node_costs_only_time() {
    let db = loaded(Backend::Local, "pushdown-absent").await;
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let e = db.engine(pushing(&format!("http://127.0.0.1:{port}"), PushdownMode::On, CacheOptions::off())).await;
    assert_22_answers(&e, " (no node)").await;
    let warnings = e.engine().pushdown().unwrap().take_warnings();
    assert!(warnings.iter().any(|w| w.contains("unavailable")), "{warnings:?}");
}

const NODE_WORKER_ENV: &str = "BLOBHOUSE_TEST_NODE";

/// A storage node in a process of its own (the harness's worker: run by the
/// test below). Prints its address, then serves until killed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a worker process of the tests below"]
async fn node_worker() {
    let task: (String, blobhouse_storage::StoreOptions) = serde_json::from_str(&std::env::var(NODE_WORKER_ENV).expect("run by a test")).unwrap();
    let location = blobhouse_storage::open_location(&task.0, &task.1).unwrap();
    let node = StorageNode::new(location, NodeOptions::new(TOKEN)).unwrap();
    let (addr, handle) = node.spawn("127.0.0.1:0".parse().unwrap()).await.unwrap();
    println!("NODE-WORKER http://{addr}");
    handle.await.unwrap().unwrap();
}

/// A node process killed with SIGKILL while queries push to it: each
/// query in flight finishes with the right answer from fetched data.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_killed_mid_query_leaves_the_answers_exact() {
    use tokio::io::AsyncBufReadExt;
    let db = loaded(Backend::Local, "pushdown-kill").await;
    let mut child = tokio::process::Command::from(worker_command("pushdown::node_worker"))
        .env(NODE_WORKER_ENV, serde_json::to_string(&(db.url.clone(), db.store_options.clone())).unwrap())
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut out = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let endpoint = loop {
        let line = out.next_line().await.unwrap().expect("the node worker printed its address");
        if let Some(i) = line.find("NODE-WORKER ") {
            break line[i + "NODE-WORKER ".len()..].trim().to_string();
        }
    };
    let e = Arc::new(db.engine(pushing(&endpoint, PushdownMode::On, CacheOptions::off())).await);
    // Queries run while the node is killed at some point among them.
    let runner = {
        let e = e.clone();
        tokio::spawn(async move {
            for round in 0..3 {
                assert_22_answers(&e, &format!(" (node killed, round {round})")).await;
            }
        })
    };
    tokio::time::sleep(Duration::from_millis(700)).await;
    child.start_kill().unwrap(); // SIGKILL
    child.wait().await.unwrap();
    runner.await.unwrap();
    let warnings = e.engine().pushdown().unwrap().take_warnings();
    assert!(!warnings.is_empty(), "the node was killed before any query pushed to it");
}

/// A ticket to read row group 0 of `object` (no columns: a row count).
fn ticket_for(object: &str) -> Vec<u8> {
    let schema = Arc::new(datafusion::arrow::datatypes::Schema::empty());
    let leaf = ObjectSliceExec::new(ObjectSlice { object: object.to_string(), row_groups: vec![0], columns: vec![], deleted: None, selections: Vec::new(), checks: None }, schema);
    blobhouse_pushdown::codec::encode_task(Arc::new(leaf)).unwrap()
}

/// The name of one data object of the database.
async fn a_data_object(db: &TestDb) -> String {
    use futures::TryStreamExt;
    use object_store::ObjectStore;
    let prefix = db.location.child("objects");
    let listed: Vec<object_store::ObjectMeta> = db.location.store.list(Some(&prefix)).try_collect().await.unwrap();
    let meta = listed.iter().find(|m| m.location.as_ref().ends_with(".parquet")).expect("a data object");
    meta.location.as_ref().strip_prefix(db.location.prefix.as_ref()).unwrap().trim_start_matches('/').to_string()
}

/// A raw Flight call: the rows returned, or the status code.
async fn call(endpoint: &str, token: Option<&str>, ticket: Vec<u8>) -> Result<usize, tonic::Code> {
    use futures::TryStreamExt;
    let channel = tonic::transport::Channel::from_shared(endpoint.to_string()).unwrap().connect().await.map_err(|_| tonic::Code::Unavailable)?;
    let mut client = arrow_flight::FlightClient::new(channel);
    if let Some(t) = token {
        client.add_header("authorization", &format!("Bearer {t}")).unwrap();
    }
    let code = |e: arrow_flight::error::FlightError| match e {
        arrow_flight::error::FlightError::Tonic(s) => s.code(),
        _ => tonic::Code::Internal,
    };
    let stream = client.do_get(arrow_flight::Ticket { ticket: ticket.into() }).await.map_err(code)?;
    let batches: Vec<datafusion::arrow::record_batch::RecordBatch> = stream.try_collect().await.map_err(code)?;
    Ok(batches.iter().map(|b| b.num_rows()).sum())
}

/// Strangers, names outside the data objects, and 600 malformed tickets
/// (random bytes, truncations, bit flips of a valid one): each gets a clear
/// refusal, and the node keeps serving the well-behaved caller throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_node_rejects_strangers_and_malformed_requests() {
    let db = loaded(Backend::Local, "pushdown-fuzz").await;
    let (node, endpoint, _h) = node(&db, NodeOptions::new(TOKEN)).await;
    let object = a_data_object(&db).await;
    let good = ticket_for(&object);
    let rows = call(&endpoint, Some(TOKEN), good.clone()).await.expect("a valid request");
    assert!(rows > 0);
    assert_eq!(call(&endpoint, Some("wrong-token"), good.clone()).await, Err(tonic::Code::Unauthenticated));
    assert_eq!(call(&endpoint, None, good.clone()).await, Err(tonic::Code::Unauthenticated));
    // Only the database's data objects are ever read.
    for name in ["../outside.parquet".to_string(), format!("objects/../{object}"), "catalog/00000000000000000001.json".into(), format!("/{object}"), "/etc/passwd".into()] {
        assert_eq!(call(&endpoint, Some(TOKEN), ticket_for(&name)).await, Err(tonic::Code::InvalidArgument), "{name}");
    }
    // The client sees the same as a PushdownError that says what failed.
    let client = NodeClient::new(&endpoint, "wrong-token").unwrap();
    match client.stats().await {
        Err(e @ PushdownError::Rejected { .. }) => assert!(e.to_string().contains("bearer token"), "{e}"),
        other => panic!("{other:?}"),
    }

    let mut seed = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let mut outcomes = std::collections::BTreeMap::<String, usize>::new();
    for case in 0..600 {
        let ticket: Vec<u8> = match case % 3 {
            0 => (0..next() % 256).map(|_| next() as u8).collect(),
            1 => good[..(next() as usize % good.len())].to_vec(),
            _ => {
                let mut t = good.clone();
                for _ in 0..1 + next() % 4 {
                    let i = next() as usize % t.len();
                    t[i] ^= 1 << (next() % 8);
                }
                t
            }
        };
        let outcome = call(&endpoint, Some(TOKEN), ticket).await;
        assert_ne!(outcome, Err(tonic::Code::Unavailable), "case {case}: the node went away");
        *outcomes.entry(format!("{outcome:?}")).or_default() += 1;
        if case % 50 == 0 {
            assert_eq!(call(&endpoint, Some(TOKEN), good.clone()).await, Ok(rows), "case {case}: the node stopped serving");
        }
    }
    eprintln!("600 malformed tickets: {outcomes:?}");
    assert!(outcomes.get("Err(InvalidArgument)").copied().unwrap_or(0) >= 300, "{outcomes:?}");
    let stats = node.stats();
    assert!(stats.requests_rejected >= 300, "{stats:?}");
    assert_eq!(call(&endpoint, Some(TOKEN), good).await, Ok(rows));
}

/// A node given a certificate serves TLS only: a caller trusting its CA is
/// served the same answers, a plaintext caller is refused (the scan then
/// fetches and says so), an https:// node without a CA to check it is a
/// configuration error, and a certificate that does not parse stops the
/// node before it serves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_with_a_certificate_serves_tls_only() {
    let certs = tempfile::tempdir().unwrap();
    blobhouse_testbed::make_certificates(certs.path()).expect("openssl makes the test certificates");
    let read = |f: &str| std::fs::read(certs.path().join(f)).unwrap();
    let db = TestDb::new(Backend::Local, "pushdown-tls");
    let plain = db.engine(EngineOptions { cache: CacheOptions::off(), ..EngineOptions::default() }).await;
    run(&plain, "CREATE TABLE t AS SELECT value AS k, value % 10 AS g FROM generate_series(1, 50000)").await;
    let sql = "SELECT g, count(*), sum(k) FROM t WHERE k > 100 GROUP BY g ORDER BY g";
    let expected = lines(&run(&plain, sql).await);

    let tls = blobhouse_pushdown::NodeTls { cert: read("cert.pem"), key: read("key.pem") };
    let (node, endpoint, _h) = node(&db, NodeOptions { tls: Some(tls.clone()), ..NodeOptions::new(TOKEN) }).await;
    let https = endpoint.replace("http://", "https://");
    let mut trusted = pushing(&https, PushdownMode::On, CacheOptions::off());
    trusted.pushdown.as_mut().unwrap().ca = Some(read("ca.pem"));
    let e = db.engine(trusted).await;
    let r = run(&e, sql).await;
    assert_eq!(lines(&r), expected);
    assert!(r.pushdown.row_groups_pushed > 0 && node.stats().tasks_done > 0, "nothing pushed over TLS: {:?}", e.engine().pushdown().unwrap().take_warnings());

    // Plaintext to a TLS node: refused; the scan fetches instead and warns.
    let done = node.stats().tasks_done;
    let e = db.engine(pushing(&endpoint, PushdownMode::On, CacheOptions::off())).await;
    assert_eq!(lines(&run(&e, sql).await), expected);
    assert_eq!(node.stats().tasks_done, done, "a plaintext caller got work done");
    assert!(!e.engine().pushdown().unwrap().take_warnings().is_empty(), "the fallback is said");

    let no_ca = NodeClient::with_ca(&https, TOKEN, None).unwrap_err().to_string();
    assert!(no_ca.contains("--storage-node-ca"), "{no_ca}");
    let broken = blobhouse_pushdown::NodeTls { cert: b"-----BEGIN CERTIFICATE-----\nnot base64\n-----END CERTIFICATE-----\n".to_vec(), key: tls.key };
    let refused = StorageNode::new(db.location.clone(), NodeOptions { tls: Some(broken), ..NodeOptions::new(TOKEN) }).err().expect("a broken certificate must stop the node");
    assert!(refused.contains("certificate does not parse") && refused.contains("does not start"), "{refused}");
}
