//! The caching tiers (docs/cache.md): answers never change with a tier on
//! or off or with the policy, hits replace GETs, and the SSD tier's
//! entries outlive the engine that wrote them.

use std::sync::Arc;

use blobhouse_bench::tpch;
use blobhouse_cache::PolicyKind;
use blobhouse_engine::{CacheOptions, Engine, EngineOptions};

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

/// Waits until the SSD tier's background writes are done (nothing is
/// written for a while).
async fn ssd_settled(e: &Engine) {
    let ssd = e.tiers().and_then(|t| t.ssd()).expect("an SSD tier");
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
        ("memory, all of it", CacheOptions { memory: Some(64 << 20), ..CacheOptions::default() }),
        ("ssd", CacheOptions { memory: Some(0), ssd_dir: Some(ssd_dir.path().join("a")), ssd_capacity: small, ..CacheOptions::default() }),
        ("both", CacheOptions { memory: Some(small), ssd_dir: Some(ssd_dir.path().join("b")), ssd_capacity: 64 << 20, ..CacheOptions::default() }),
    ];
    for (name, cache) in configs {
        let e = db.engine(with_cache(cache)).await;
        assert_22_answers(&e, &format!(" (cache {name}, first round)")).await;
        if e.tiers().and_then(|t| t.ssd()).is_some() {
            ssd_settled(&e).await;
        }
        assert_22_answers(&e, &format!(" (cache {name}, second round)")).await;
        let tiers = e.tiers();
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
    let cache = CacheOptions { memory: Some(0), ssd_dir: Some(dir.path().to_path_buf()), ssd_capacity: 64 << 20, ..CacheOptions::default() };
    let sql = "SELECT count(*), sum(o_totalprice) FROM orders";
    let first = db.engine(with_cache(cache.clone())).await;
    let answer = lines(&run(&first, sql).await);
    ssd_settled(&first).await;
    let stats = first.tiers().unwrap().ssd().unwrap().stats();
    assert!(stats.written > 0, "{stats:?} {:?}", first.tiers().unwrap().take_warnings());
    drop(first);
    let second = db.engine(with_cache(cache)).await;
    assert!(second.tiers().unwrap().ssd().unwrap().stats().recovered > 0);
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
    let cache = CacheOptions { memory: Some(0), ssd_dir: Some(dir.path().to_path_buf()), ssd_capacity: 64 << 20, ..CacheOptions::default() };
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
    let tiers = second.tiers().unwrap();
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
        figures.push((delay_ms, ssd_hits, routed, e.tiers().unwrap().router()));
    }
    eprintln!("routing (delay ms, SSD hits, routed to the store, router): {figures:?}");
    let (slow, fast) = (&figures[0], &figures[1]);
    assert!(slow.2 > slow.1, "a slow SSD: most reads routed to the store: {figures:?}");
    assert!(slow.1 > 0, "a slow SSD still gets probes: {figures:?}");
    assert!(fast.1 > fast.2, "a fast SSD serves most reads: {figures:?}");
}

crate::on_both_backends!(a_repeated_query_is_served_from_memory, a_later_engine_reads_the_ssd_entries_of_an_earlier_one, damaged_ssd_entries_are_refetched_never_served);
