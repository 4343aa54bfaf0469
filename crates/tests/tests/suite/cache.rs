//! The caching tiers (docs/cache.md): answers never change with a tier on
//! or off or with the policy, hits replace GETs, and the SSD tier's
//! entries outlive the engine that wrote them.

use std::sync::Arc;

use blobhouse_bench::tpch;
use blobhouse_cache::PolicyKind;
use blobhouse_engine::{CacheOptions, EngineOptions, Session};

use crate::common::*;
use crate::tpch::assert_22_answers;

async fn loaded(b: Backend, name: &str) -> TestDb {
    let db = TestDb::new(b, name);
    let loader = db.engine(EngineOptions { cache: CacheOptions::off(), ..EngineOptions::default() }).await;
    tpch::load(&loader, 0.01, Arc::new(|_, _, _| {})).await.expect("load TPC-H");
    db
}

fn with_cache(cache: CacheOptions) -> EngineOptions {
    EngineOptions { cache, ..EngineOptions::default() }
}

/// An SSD tier of 64 MiB in `dir` and no memory tier: every hit is an SSD hit.
fn ssd_only(dir: &std::path::Path) -> CacheOptions {
    CacheOptions { memory: Some(0), ssd_dir: Some(dir.to_path_buf()), ssd_capacity: 64 << 20, ..CacheOptions::default() }
}

/// Waits until the SSD tier's background writes are done (nothing is
/// written for a while).
async fn ssd_settled(e: &Session) {
    let ssd = e.engine().tiers().and_then(|t| t.ssd()).expect("an SSD tier");
    let mut last = u64::MAX;
    while ssd.stats().written != last {
        last = ssd.stats().written;
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}

/// The 22 answers, twice each, under every tier and policy — with tiers
/// small enough (256 KiB against ~2 MiB of data) that admission and
/// eviction churn — and the second round is served partly from the tiers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tpch_answers_are_exact_under_every_tier_and_policy() {
    let db = loaded(Backend::Local, "cache-answers").await;
    let ssd_dir = tempfile::tempdir().unwrap();
    let small = 256 << 10;
    let configs = [
        ("off", CacheOptions::off()),
        ("memory lru", CacheOptions { memory: Some(small), memory_policy: PolicyKind::Lru, ..CacheOptions::default() }),
        ("memory lfu", CacheOptions { memory: Some(small), memory_policy: PolicyKind::Lfu, ..CacheOptions::default() }),
        ("memory wlfu", CacheOptions { memory: Some(small), memory_policy: PolicyKind::WeightedLfu, ..CacheOptions::default() }),
        ("memory, all of it", CacheOptions { memory: Some(64 << 20), ..CacheOptions::default() }),
        ("ssd", CacheOptions { memory: Some(0), ssd_dir: Some(ssd_dir.path().join("a")), ssd_capacity: small, ..CacheOptions::default() }),
        ("both", CacheOptions { memory: Some(small), ssd_dir: Some(ssd_dir.path().join("b")), ssd_capacity: 64 << 20, ..CacheOptions::default() }),
    ];
    for (name, cache) in configs {
        let e = db.engine(with_cache(cache)).await;
        assert_22_answers(&e, &format!(" (cache {name}, first round)")).await;
        if e.engine().tiers().and_then(|t| t.ssd()).is_some() {
            ssd_settled(&e).await;
        }
        assert_22_answers(&e, &format!(" (cache {name}, second round)")).await;
        let tiers = e.engine().tiers();
        assert_eq!(tiers.is_none(), name == "off", "{name}");
        let memory_hits = tiers.and_then(|t| t.memory()).map_or(0, |m| m.stats().hits);
        let ssd_hits = tiers.and_then(|t| t.ssd()).map_or(0, |s| s.stats().hits);
        if name != "off" {
            assert!(memory_hits + ssd_hits > 0, "cache {name}: no hits in two rounds");
        }
        if let Some(m) = tiers.and_then(|t| t.memory()) {
            assert!(m.stats().used <= m.stats().capacity, "{name}: {:?}", m.stats());
        }
    }
}

/// With the whole data set in memory, a repeated query issues no GET, and
/// the shell's figures say where the bytes came from.
async fn a_repeated_query_is_served_from_memory(b: Backend) {
    let db = loaded(b, "cache-repeat").await;
    let e = db.engine(with_cache(CacheOptions { memory: Some(64 << 20), ..CacheOptions::default() })).await;
    let sql = "SELECT l_returnflag, sum(l_extendedprice) FROM lineitem GROUP BY l_returnflag ORDER BY 1";
    let cold = run(&e, sql).await;
    let warm = run(&e, sql).await;
    assert_eq!(lines(&cold), lines(&warm));
    assert!(cold.scan.get_requests > 0 && cold.scan.memory_hits == 0, "{:?}", cold.scan);
    assert_eq!(warm.scan.get_requests, 0, "{:?}", warm.scan);
    assert!(warm.scan.memory_hits > 0 && warm.scan.cache_misses == 0, "{:?}", warm.scan);
    assert_eq!(warm.scan.gets_avoided, cold.scan.get_requests, "every request of the cold run was avoided");
    assert_eq!(warm.scan.memory_bytes, cold.scan.bytes_fetched);
}

/// An engine started after another ended on the same cache directory finds
/// its entries: its first query is served from SSD.
async fn a_later_engine_reads_the_ssd_entries_of_an_earlier_one(b: Backend) {
    let db = loaded(b, "cache-restart").await;
    let dir = tempfile::tempdir().unwrap();
    let cache = ssd_only(dir.path());
    let sql = "SELECT count(*), sum(o_totalprice) FROM orders";
    let first = db.engine(with_cache(cache.clone())).await;
    let answer = lines(&run(&first, sql).await);
    ssd_settled(&first).await;
    let stats = first.engine().tiers().unwrap().ssd().unwrap().stats();
    assert!(stats.written > 0, "{stats:?} {:?}", first.engine().tiers().unwrap().take_warnings());
    drop(first);
    let second = db.engine(with_cache(cache)).await;
    assert!(second.engine().tiers().unwrap().ssd().unwrap().stats().recovered > 0);
    let r = run(&second, sql).await;
    assert_eq!(lines(&r), answer);
    assert!(r.scan.ssd_hits > 0 && r.scan.get_requests == 0, "{:?}", r.scan);
}

/// SSD entries damaged between two engines (a flipped byte, a cut file)
/// are detected, deleted and read from the store: the answer is the same,
/// and one warning says so.
async fn damaged_ssd_entries_are_refetched_never_served(b: Backend) {
    let db = loaded(b, "cache-damage").await;
    let dir = tempfile::tempdir().unwrap();
    let cache = ssd_only(dir.path());
    let sql = "SELECT l_linestatus, count(*), sum(l_quantity) FROM lineitem GROUP BY 1 ORDER BY 1";
    let first = db.engine(with_cache(cache.clone())).await;
    let answer = lines(&run(&first, sql).await);
    ssd_settled(&first).await;
    drop(first);
    let mut damaged = 0;
    for entry in walk(dir.path()) {
        if entry.extension().is_some_and(|x| x == "seg") {
            let mut bytes = std::fs::read(&entry).unwrap();
            match damaged % 2 {
                0 => *bytes.last_mut().unwrap() ^= 0x5a,
                _ => bytes.truncate(bytes.len() - 3),
            }
            std::fs::write(&entry, bytes).unwrap();
            damaged += 1;
        }
    }
    assert!(damaged >= 2, "{damaged} entries");
    let second = db.engine(with_cache(cache)).await;
    let r = run(&second, sql).await;
    assert_eq!(lines(&r), answer);
    assert_eq!(r.scan.ssd_hits, 0, "{:?}", r.scan);
    let tiers = second.engine().tiers().unwrap();
    let stats = tiers.ssd().unwrap().stats();
    assert!(stats.corrupt > 0, "{stats:?}");
    let warnings = tiers.take_warnings();
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(warnings[0].contains("damaged"), "{warnings:?}");
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() { out.extend(walk(&p)) } else { out.push(p) }
    }
    out
}

/// SHOW CACHE lists the tiers; SET changes the memory tier's size and
/// policy for the running engine, RESET goes back to the configuration,
/// and bad values or an engine without caches get clear errors.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn set_and_show_cache() {
    let db = loaded(Backend::Local, "cache-settings").await;
    let dir = tempfile::tempdir().unwrap();
    let e = db.engine(with_cache(CacheOptions { memory: Some(32 << 20), ssd_dir: Some(dir.path().to_path_buf()), ..CacheOptions::default() })).await;
    let sql = "SELECT sum(l_quantity) FROM lineitem";
    run(&e, sql).await;
    run(&e, sql).await;
    let rows = lines(&run(&e, "SHOW CACHE").await);
    assert_eq!(rows.len(), 2, "{rows:?}");
    let memory: Vec<&str> = rows[0].split('|').collect();
    assert_eq!((memory[0], memory[1], memory[4]), ("memory", "lfu", "33554432"), "{rows:?}");
    assert!(memory[2].parse::<u64>().unwrap() > 0 && memory[5].parse::<u64>().unwrap() > 0, "segments and hits: {rows:?}");
    assert!(rows[1].starts_with("ssd|lru|"), "{rows:?}");

    run(&e, "SET cache_policy = 'lru'").await;
    run(&e, "SET cache_memory = '0'").await;
    let rows = lines(&run(&e, "SHOW CACHE").await);
    assert!(rows[0].starts_with("memory|lru|0|0|0|"), "{rows:?}");
    let r = run(&e, sql).await;
    assert_eq!(r.scan.memory_hits, 0, "an empty memory tier serves nothing: {:?}", r.scan);
    run(&e, "RESET cache_memory").await;
    run(&e, "RESET cache_policy").await;
    assert!(lines(&run(&e, "SHOW CACHE").await)[0].starts_with("memory|lfu|"));
    let err = fail(&e, "SET cache_policy = 'belady'").await;
    assert!(err.contains("lru") && err.contains("lfu"), "{err}");
    let err = fail(&e, "SET cache_memory = 'lots'").await;
    assert!(err.contains("cache_memory"), "{err}");

    let off = db.engine(with_cache(CacheOptions::off())).await;
    assert!(lines(&run(&off, "SHOW CACHE").await).is_empty());
    let err = fail(&off, "SET cache_memory = '1G'").await;
    assert!(err.contains("no caching tiers"), "{err}");
}

/// Routing by measured speed: with the SSD made slower than the store (a
/// read delay of 30 ms against MinIO on loopback), reads of what the SSD
/// holds go to the store, but for the probes that keep the estimate fresh;
/// with a fast SSD, they stay on the SSD.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slower_ssd_is_routed_around() {
    let db = loaded(Backend::Minio, "cache-routing").await;
    let sql = "SELECT l_returnflag, count(*), sum(l_quantity), sum(l_extendedprice), avg(l_discount) FROM lineitem GROUP BY 1 ORDER BY 1";
    let mut figures = Vec::new();
    for delay_ms in [30u64, 0] {
        let dir = tempfile::tempdir().unwrap();
        let cache = CacheOptions {
            memory: Some(0),
            ssd_dir: Some(dir.path().to_path_buf()),
            ssd_read_delay: std::time::Duration::from_millis(delay_ms),
            ..CacheOptions::default()
        };
        let e = db.engine(with_cache(cache)).await;
        let answer = lines(&run(&e, sql).await);
        ssd_settled(&e).await;
        let (mut ssd_hits, mut routed) = (0, 0);
        for _ in 0..8 {
            let r = run(&e, sql).await;
            assert_eq!(lines(&r), answer);
            ssd_hits += r.scan.ssd_hits;
            routed += r.scan.routed_to_store;
        }
        figures.push((delay_ms, ssd_hits, routed, e.engine().tiers().unwrap().router()));
    }
    eprintln!("routing (delay ms, SSD hits, routed to the store, router): {figures:?}");
    let (slow, fast) = (&figures[0], &figures[1]);
    assert!(slow.2 > slow.1, "a slow SSD: most reads routed to the store: {figures:?}");
    assert!(slow.1 > 0, "a slow SSD still gets probes: {figures:?}");
    assert!(fast.1 > fast.2, "a fast SSD serves most reads: {figures:?}");
}

/// Write-through: what a load writes is on the SSD tier when it commits,
/// so the first query after it reads the data from local disk, not the
/// store; EXPLAIN ANALYZE and the shell's summary say what that saved.
async fn a_load_leaves_its_data_on_the_ssd(b: Backend) {
    let db = TestDb::new(b, "cache-write-through");
    let dir = tempfile::tempdir().unwrap();
    let e = db.engine(with_cache(ssd_only(dir.path()))).await;
    run(&e, "CREATE TABLE t (k BIGINT, v VARCHAR)").await;
    run(&e, "INSERT INTO t SELECT v, 'row ' || CAST(v AS VARCHAR) FROM generate_series(1, 50000) AS s(v)").await;
    ssd_settled(&e).await;
    let ssd = e.engine().tiers().unwrap().ssd().unwrap().stats();
    assert!(ssd.written >= 2, "both columns written through: {ssd:?}");
    let r = run(&e, "SELECT count(*), sum(k), max(v) FROM t").await;
    assert_eq!(lines(&r), vec!["50000|1250025000|row 9999"]);
    assert!(r.scan.ssd_hits >= 2 && r.scan.cache_misses == 0 && r.scan.get_requests == 0, "{:?}", r.scan);

    let explain = lines(&run(&e, "EXPLAIN ANALYZE SELECT sum(k) FROM t").await);
    let cache = explain.iter().find(|l| l.starts_with("Cache|")).unwrap_or_else(|| panic!("no Cache row: {explain:?}"));
    assert!(cache.contains("100% of 1 chunks from cache") && cache.contains("1 GET avoided = $0.000000 saved"), "{cache}");
    let summary = r.scan.cache_summary().unwrap();
    assert!(summary.starts_with("100% of 2 chunks from cache (0 memory, 0.00 MiB; 2 SSD,") && summary.contains(" avoided = $"), "{summary}");
    // Cache off: nothing to say.
    let off = db.engine(with_cache(CacheOptions::off())).await;
    let r = run(&off, "SELECT sum(k) FROM t").await;
    assert_eq!(r.scan.cache_summary(), None);
    assert!(!lines(&run(&off, "EXPLAIN ANALYZE SELECT sum(k) FROM t").await).iter().any(|l| l.starts_with("Cache|")));
}

/// What a cache worker process is told: a database, a cache directory, and
/// statements to run in order, forever when `forever` is set.
#[derive(serde::Serialize, serde::Deserialize)]
struct CacheTask {
    url: String,
    store: blobhouse_storage::StoreOptions,
    cache_dir: std::path::PathBuf,
    statements: Vec<String>,
    forever: bool,
}

const CACHE_WORKER_ENV: &str = "BLOBHOUSE_CACHE_WORKER";

/// A process of its own with an SSD tier on the task's directory (the
/// harness's worker: run by the tests below, not on its own). Prints each
/// statement's answer and scan figures on one line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a worker process of the tests below"]
async fn cache_worker() {
    let task: CacheTask = serde_json::from_str(&std::env::var(CACHE_WORKER_ENV).expect("run by a test")).unwrap();
    let cache = ssd_only(&task.cache_dir);
    let e = Session::open(&task.url, &task.store, with_cache(cache)).await.unwrap();
    loop {
        for s in &task.statements {
            let r = run(&e, s).await;
            let warnings = e.engine().tiers().map(|t| t.take_warnings()).unwrap_or_default();
            println!("CACHE-WORKER {}", serde_json::json!({"answer": lines(&r), "ssd_hits": r.scan.ssd_hits, "gets": r.scan.get_requests, "warnings": warnings}));
        }
        if !task.forever {
            break;
        }
    }
    ssd_settled(&e).await;
    println!("CACHE-WORKER done");
}

fn cache_worker_command(db: &TestDb, dir: &std::path::Path, statements: &[&str], forever: bool) -> tokio::process::Command {
    let task = CacheTask { url: db.url.clone(), store: db.store_options.clone(), cache_dir: dir.to_path_buf(), statements: statements.iter().map(|s| s.to_string()).collect(), forever };
    let mut c = tokio::process::Command::from(worker_command("cache::cache_worker"));
    c.env(CACHE_WORKER_ENV, serde_json::to_string(&task).unwrap()).kill_on_drop(true);
    c
}

fn worker_lines(out: &std::process::Output) -> Vec<serde_json::Value> {
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("CACHE-WORKER done"), "the worker failed: {stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    // (libtest prints the test's name on the line its first output starts.)
    stdout.lines().filter_map(|l| l.find("CACHE-WORKER {").map(|i| &l[i + "CACHE-WORKER ".len()..])).map(|l| serde_json::from_str(l).unwrap()).collect()
}

/// Restart: a second process on the same cache directory finds what the
/// first one left and serves its first query from the SSD, without a GET.
async fn a_second_process_reads_what_the_first_left_on_the_ssd(b: Backend) {
    let db = loaded(b, "cache-processes").await;
    let dir = tempfile::tempdir().unwrap();
    let sql = ["SELECT l_returnflag, count(*), sum(l_extendedprice) FROM lineitem GROUP BY 1 ORDER BY 1"];
    let first = worker_lines(&cache_worker_command(&db, dir.path(), &sql, false).output().await.unwrap());
    assert_eq!(first[0]["ssd_hits"], 0, "{first:?}");
    let second = worker_lines(&cache_worker_command(&db, dir.path(), &sql, false).output().await.unwrap());
    assert_eq!(second[0]["answer"], first[0]["answer"]);
    assert!(second[0]["ssd_hits"].as_u64().unwrap() > 0 && second[0]["gets"] == 0, "second process: {second:?}");
}

/// Processes killed (SIGKILL) while they fill the SSD tier leave nothing
/// that is served wrong: after each kill the next process recovers the
/// directory, and at the end all 22 answers are exact from what is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_processes_leave_no_entry_served_wrong() {
    let db = loaded(Backend::Local, "cache-kill").await;
    let dir = tempfile::tempdir().unwrap();
    let queries: Vec<String> = (1..=22).map(|q| tpch::query(q).to_string()).collect();
    let statements: Vec<&str> = queries.iter().map(String::as_str).collect();
    let mut killed_with_output = 0;
    for delay_ms in [150u64, 400, 700, 1100, 1600] {
        let mut child = cache_worker_command(&db, dir.path(), &statements, true).stdout(std::process::Stdio::piped()).spawn().unwrap();
        tokio::time::sleep(std::time::Duration::from_millis(delay_ms)).await;
        child.start_kill().unwrap(); // SIGKILL
        let out = child.wait_with_output().await.unwrap();
        assert!(!out.status.success(), "killed");
        killed_with_output += usize::from(String::from_utf8_lossy(&out.stdout).contains("CACHE-WORKER {"));
    }
    let e = db.engine(with_cache(ssd_only(dir.path()))).await;
    let ssd = e.engine().tiers().unwrap().ssd().unwrap();
    let recovered = ssd.stats().recovered;
    assert_22_answers(&e, " (after killed cache processes)").await;
    let stats = ssd.stats();
    assert_eq!(stats.corrupt, 0, "a kill never leaves a damaged entry under its name: {stats:?}");
    assert!(recovered > 0 && stats.hits > 0, "what the killed processes wrote is used: recovered {recovered}, {stats:?}");
    let leftovers: Vec<_> = walk(dir.path()).into_iter().filter(|p| p.file_name().unwrap().to_string_lossy().starts_with("tmp-") && p.starts_with(ssd.slot())).collect();
    assert!(leftovers.is_empty(), "recovery removes half-written files: {leftovers:?}");
    eprintln!("killed 5 cache processes ({killed_with_output} had answered a query); recovered {recovered} entries; {stats:?}");
}

/// A full disk: the cache directory is a 128 KiB tmpfs (mounted in a user
/// and mount namespace of the worker's own, `unshare -Urm`, no privileges
/// needed), far smaller than the tier's configured 64 MiB. Writes fail with
/// ENOSPC; every answer stays right, the worker says so once, and reads go
/// to the store.
async fn a_full_cache_disk_degrades_to_the_store(b: Backend) {
    let db = loaded(b, "cache-full").await;
    let reference = db.engine(with_cache(CacheOptions::off())).await;
    let statements = [tpch::query(1), tpch::query(3), tpch::query(1), tpch::query(3)];
    let expected: Vec<Vec<String>> = futures::future::join_all(statements.iter().map(|s| async { lines(&run(&reference, s).await) })).await;
    let dir = tempfile::tempdir().unwrap();
    let mount = dir.path().join("tiny");
    std::fs::create_dir(&mount).unwrap();
    let worker = cache_worker_command(&db, &mount, &statements, false);
    let std = worker.as_std();
    let script = format!("mount -t tmpfs -o size=128k tmpfs '{}' && exec \"$0\" \"$@\"", mount.display());
    let mut c = tokio::process::Command::new("unshare");
    c.args(["-Urm", "sh", "-c", &script]).arg(std.get_program()).args(std.get_args()).kill_on_drop(true);
    for (k, v) in std.get_envs() {
        if let Some(v) = v {
            c.env(k, v);
        }
    }
    let out = c.output().await.expect("unshare (util-linux) runs");
    let runs = worker_lines(&out);
    assert_eq!(runs.len(), statements.len());
    let mut warnings = Vec::new();
    for (i, run) in runs.iter().enumerate() {
        let answer: Vec<String> = serde_json::from_value(run["answer"].clone()).unwrap();
        assert_eq!(answer, expected[i], "statement {i} on a full cache disk");
        warnings.extend(run["warnings"].as_array().unwrap().iter().map(|w| w.as_str().unwrap().to_string()));
    }
    assert_eq!(warnings.len(), 1, "one warning, not one per entry: {warnings:?}");
    assert!(warnings[0].contains("No space left on device") && warnings[0].contains("reading from the store instead"), "{warnings:?}");
    assert!(runs[2]["gets"].as_u64().unwrap() > 0, "what could not be cached is read from the store: {runs:?}");
}

/// The memory tier's two forms of a chunk give the same answers: every
/// chunk compressed, every chunk decoded, and the default (numbers decoded,
/// strings compressed) — on a query whose page-index selection starts in
/// the middle of a row group, on full scans, with row ids, and around a
/// DELETE and an UPDATE whose rows the decoded chunks still hold. The
/// second round of each query is served from the tier, in its form; a
/// chunk is held decoded from its second read on.
async fn decoded_and_compressed_chunks_give_the_same_answers(b: Backend) {
    let queries = [
        "SELECT count(*), sum(l_quantity), sum(l_extendedprice), min(l_shipdate), max(l_comment) FROM lineitem WHERE l_orderkey BETWEEN 20000 AND 20500",
        "SELECT l_returnflag, l_linestatus, count(*), sum(l_discount), avg(l_tax) FROM lineitem GROUP BY 1, 2 ORDER BY 1, 2",
        "SELECT l_orderkey, l_linenumber, l_shipmode FROM lineitem WHERE l_orderkey > 59000 ORDER BY 1, 2",
        "SELECT count(*), sum(o_totalprice), max(o_orderdate) FROM orders WHERE o_orderkey < 3000 OR o_orderkey > 50000",
    ];
    let configs = [("compressed", 0.0), ("decoded", 1e9), ("default", blobhouse_engine::DECODED_MAX_RATIO)];
    let mut answers: Vec<(&str, Vec<Vec<String>>)> = Vec::new();
    for (name, ratio) in configs {
        let db = loaded(b, &format!("cache-decoded-{name}")).await;
        let e = db.engine(with_cache(CacheOptions { memory: Some(64 << 20), decoded_max_ratio: ratio, ..CacheOptions::default() })).await;
        let mut got = Vec::new();
        let round = async |e: &Session, got: &mut Vec<Vec<String>>| {
            for q in queries {
                let cold = lines(&run(e, q).await);
                let warm = run(e, q).await;
                assert!(warm.scan.memory_hits > 0 && warm.scan.get_requests == 0, "{name}: {q} was not served from memory: {:?}", warm.scan);
                assert_eq!(lines(&warm), cold, "{name}: {q}");
                got.push(cold);
            }
        };
        if ratio > 0.0 {
            // A chunk enters the tier as fetched and is decoded on its second
            // read, by the scan that decodes it anyway.
            let tiers = e.engine().tiers().unwrap();
            run(&e, queries[1]).await;
            assert_eq!(tiers.decoded_segments().0, 0, "{name}: read once, held compressed");
            run(&e, queries[1]).await;
            assert!(tiers.decoded_segments().0 > 0, "{name}: read twice, held decoded");
        }
        round(&e, &mut got).await;
        run(&e, "DELETE FROM lineitem WHERE l_orderkey BETWEEN 20100 AND 20200 OR l_orderkey > 59500").await;
        run(&e, "UPDATE orders SET o_totalprice = o_totalprice + 1 WHERE o_orderkey < 1000").await;
        round(&e, &mut got).await;
        // The columns of orders that only the UPDATE read, read twice more.
        run(&e, "SELECT * FROM orders").await;
        run(&e, "SELECT * FROM orders").await;
        let tiers = e.engine().tiers().unwrap();
        let (decoded, decoded_bytes) = tiers.decoded_segments();
        let stats = tiers.memory().unwrap().stats();
        let segments = tiers.memory().unwrap().held().len();
        assert!(stats.used <= stats.capacity && stats.evicted == 0, "{name}: {stats:?}");
        match name {
            "compressed" => assert_eq!(decoded, 0, "{name}"),
            "decoded" => assert_eq!(decoded, segments, "{name}: every chunk is held decoded"),
            _ => assert!(decoded > 0 && decoded < segments, "{name}: {decoded} of {segments} chunks decoded"),
        }
        assert!(decoded_bytes <= stats.used, "{name}: decoded chunks are charged what they take");
        let note = text(&run(&e, "SHOW CACHE").await);
        assert!(note.contains(&format!("{decoded} held decoded")), "{note}");
        answers.push((name, got));
    }
    for (name, got) in &answers[1..] {
        assert_eq!(got, &answers[0].1, "{name} against compressed");
    }
}

crate::on_both_backends!(
    decoded_and_compressed_chunks_give_the_same_answers,
    a_full_cache_disk_degrades_to_the_store,
    a_repeated_query_is_served_from_memory,
    a_later_engine_reads_the_ssd_entries_of_an_earlier_one,
    damaged_ssd_entries_are_refetched_never_served,
    a_load_leaves_its_data_on_the_ssd,
    a_second_process_reads_what_the_first_left_on_the_ssd
);
