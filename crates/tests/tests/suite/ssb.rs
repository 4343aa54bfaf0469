//! The Star Schema Benchmark (crates/bench/src/ssb.rs): the tables derived
//! from TPC-H give DuckDB's answers to the 13 queries, and the answers stay
//! the same whether lineorder's row groups are read from the caches, pushed
//! to a storage node or fetched.

use blobhouse_bench::answers::{Verdict, compare, parse_answer, result_rows};
use blobhouse_bench::ssb;
use blobhouse_engine::hybrid::PushdownMode;
use blobhouse_engine::{CacheOptions, EngineOptions, Session};
use blobhouse_pushdown::NodeOptions;

use crate::common::*;
use crate::on_both_backends;
use crate::pushdown::{TOKEN, node, pushing};

/// Scale factor of the tests: big enough that every query has rows
/// (Q3.4's two cities in one month), small enough to derive in seconds.
const SF: f64 = 0.05;

/// SSB at [`SF`], lineorder in small row groups so that scans split.
async fn loaded(b: Backend, name: &str) -> TestDb {
    let db = TestDb::new(b, name);
    let loader = db.engine(EngineOptions { cache: CacheOptions::off(), ..small_chunks(64 << 10) }).await;
    ssb::load(&loader, SF, ssb::quiet()).await.expect("derive SSB");
    db
}

/// Q3.4 at SF 0.05 has no rows (two cities on each side in one month:
/// about 5 × SF rows); this query checks its month predicate on more rows.
const Q34_WIDE: &str = "SELECT c_city, d_yearmonth, count(*) AS n, sum(lo_revenue) AS revenue \
    FROM customer, lineorder, dwdate WHERE lo_custkey = c_custkey AND lo_orderdate = d_datekey \
    AND (c_city = 'UNITED KI1' OR c_city = 'UNITED KI5') AND d_yearmonth = 'Dec1997' GROUP BY 1, 2 ORDER BY 1";

/// The 13 queries and [`Q34_WIDE`].
fn queries() -> Vec<(&'static str, &'static str)> {
    ssb::QUERIES.iter().map(|q| (*q, ssb::query(q).unwrap())).chain([("3.4-wide", Q34_WIDE)]).collect()
}

async fn answers(e: &Session) -> Vec<Vec<Vec<String>>> {
    let mut all = Vec::new();
    for (q, sql) in queries() {
        let r = e.execute(sql).await.unwrap_or_else(|err| panic!("SSB Q{q}: {err}"));
        all.push(result_rows(&r.batches));
    }
    all
}

/// DuckDB, reading the derived tables' data objects with its own Parquet
/// reader, gives the same 13 answers; and every answer but Q3.4's has rows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ssb_answers_agree_with_duckdb() {
    let db = loaded(Backend::Local, "ssb-duckdb").await;
    let e = db.engine(EngineOptions::default()).await;
    let tables: Vec<String> = lines(&run(&e, "SELECT table_name FROM information_schema.tables WHERE table_schema = 'public' ORDER BY 1").await);
    assert_eq!(tables.join(","), "customer,dwdate,lineorder,part,supplier", "SSB's five tables and no TPC-H leftovers");
    // The derivation's shape: SSB's 7 years of days, 25 categories, 1,000
    // brands, 250 cities, every line item with its part-supplier.
    let shape = "SELECT (SELECT count(*) FROM dwdate) AS days, (SELECT count(DISTINCT p_category) FROM part) AS categories, \
        (SELECT count(DISTINCT p_brand1) FROM part) AS brands, (SELECT count(DISTINCT c_city) FROM customer) AS cities, \
        (SELECT count(*) FROM lineorder WHERE lo_supplycost IS NULL OR lo_revenue > lo_extendedprice) AS bad";
    assert_eq!(lines(&run(&e, shape).await), vec!["2557|25|1000|250|0"]);
    let ours = answers(&e).await;
    let dir = tempfile::tempdir().unwrap();
    let files: Vec<_> = queries()
        .into_iter()
        .map(|(q, sql)| {
            let f = dir.path().join(format!("q{q}.sql"));
            std::fs::write(&f, sql).unwrap();
            f
        })
        .collect();
    let mut args = vec![db.url.as_ref()];
    args.extend(files.iter().map(|f| f.as_os_str()));
    let theirs = duckdb_oracle(&args);
    assert_eq!(theirs.len(), 14);
    for (((q, _), ours), theirs) in queries().iter().zip(&ours).zip(theirs) {
        let expected = parse_answer(theirs.split_once('\n').map_or("", |(_, b)| b));
        assert!(!expected.is_empty() || *q == "3.4", "SSB Q{q} has no rows at SF {SF}: the check would prove little");
        assert_eq!(compare(&expected, ours), Verdict::Verified, "SSB Q{q}\nDuckDB: {expected:?}\nblobhouse: {ours:?}");
    }
}

/// The 13 answers in pull-up, caching-only, pushdown-only and hybrid
/// modes are the pull-up answers, and the node did pushed work.
async fn ssb_answers_are_exact_in_every_mode(b: Backend) {
    let db = loaded(b, "ssb-modes").await;
    let (node, endpoint, _h) = node(&db, NodeOptions::new(TOKEN)).await;
    let expected = answers(&db.engine(EngineOptions { cache: CacheOptions::off(), ..EngineOptions::default() }).await).await;
    let small = CacheOptions { memory: Some(1 << 20), ..CacheOptions::default() };
    let wlfu = CacheOptions { memory_policy: blobhouse_cache::PolicyKind::WeightedLfu, ..small.clone() };
    let configs = [
        ("caching-only", EngineOptions { cache: small.clone(), ..EngineOptions::default() }),
        ("pushdown-only", pushing(&endpoint, PushdownMode::On, CacheOptions::off())),
        ("hybrid", pushing(&endpoint, PushdownMode::On, small.clone())),
        ("hybrid auto wlfu", pushing(&endpoint, PushdownMode::Auto, wlfu)),
    ];
    for (name, options) in configs {
        let before = node.stats().tasks_done;
        let pushes = options.pushdown.is_some();
        let e = db.engine(options).await;
        for round in 0..2 {
            let got = answers(&e).await;
            for (((q, _), want), got) in queries().iter().zip(&expected).zip(&got) {
                assert_eq!(compare(want, got), Verdict::Verified, "SSB Q{q} ({name}, round {round})");
            }
        }
        let tasks = node.stats().tasks_done - before;
        assert_eq!(tasks > 0, pushes, "{name}: {tasks} tasks pushed");
        let warnings = e.engine().pushdown().map(|p| p.take_warnings()).unwrap_or_default();
        assert!(warnings.is_empty(), "{name}: {warnings:?}");
    }
    // Generated queries of both workloads run and agree with pull-up too.
    let pull_up = db.engine(EngineOptions { cache: CacheOptions::off(), ..EngineOptions::default() }).await;
    let hybrid = db.engine(pushing(&endpoint, PushdownMode::Auto, CacheOptions { memory: Some(1 << 20), ..CacheOptions::default() })).await;
    let mut generated = ssb::generate(ssb::Workload::Skewed, 1.0, 11, 8);
    generated.extend(ssb::generate(ssb::Workload::MixedSelectivity, 0.3, 12, 6));
    for sql in &generated {
        let want = result_rows(&pull_up.execute(sql).await.unwrap().batches);
        let got = result_rows(&hybrid.execute(sql).await.unwrap().batches);
        assert_eq!(compare(&want, &got), Verdict::Verified, "{sql}");
    }
}

on_both_backends!(ssb_answers_are_exact_in_every_mode);

/// `blobhouse bench hybrid`'s short mode: every experiment runs on a local
/// store with a node in this process, every answer agrees across the
/// configurations, the node does the pushdown-only work and the report
/// carries the ratios the targets are about.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hybrid_benchmark_short_mode() {
    use blobhouse_bench::hybrid_bench::{self, HybridBenchOptions, Mode, NodeSetup};
    use blobhouse_bench::tpch_bench::{BenchStore, Dataset, prepare_dataset};
    let dir = tempfile::tempdir().unwrap();
    let store = BenchStore::Local(dir.path().join("data"));
    let chunk_bytes = 64 << 10;
    let (url, store_options, _loader) = prepare_dataset(&store, Dataset::Ssb, 0.02, chunk_bytes, &|_| {}).await.unwrap();
    let location = blobhouse_storage::open_location(&url, &store_options).unwrap();
    let node = blobhouse_pushdown::StorageNode::new(location, NodeOptions::new(TOKEN)).unwrap();
    let (addr, _h) = node.clone().spawn("127.0.0.1:0".parse().unwrap()).await.unwrap();
    let opts = HybridBenchOptions {
        experiments: blobhouse_bench::hybrid_bench::Experiments::ALL,
        sf: 0.02,
        chunk_bytes,
        queries: 8,
        seed: 3,
        sizes: vec![20.0, 80.0],
        theta: 2.0,
        thetas: vec![0.0, 2.0],
        fixed_size: 20.0,
        policy_sizes: vec![10.0, 20.0],
        policy_theta: 0.3,
        decoded_max_ratio: blobhouse_engine::DECODED_MAX_RATIO,
        node: NodeSetup::Running { endpoint: format!("http://{addr}"), token: TOKEN.into(), pid: None },
        request_bytes: 16 << 20,
        memory_limit: None,
        out: dir.path().join("out"),
    };
    let result = hybrid_bench::run(&store, &opts, &|_| {}).await.unwrap();
    assert_eq!(result.wrong(), 0);
    // 2 flat + 3 per size (and 3 at the crossover when it lies between the
    // sizes); 3 per skew; 4 policies per size.
    let sizes = result.sizes();
    assert!(sizes.len() == 2 || (sizes.len() == 3 && sizes[1] > 20.0 && sizes[1] < 80.0), "{sizes:?}");
    assert_eq!(result.runs.len(), 2 + 3 * sizes.len() + 3 * 2 + 4 * 2);
    let pushdown = result.runs.iter().find(|r| r.mode == Mode::Pushdown).unwrap();
    assert!(pushdown.row_groups_pushed > 0 && pushdown.row_groups_cached == 0, "{pushdown:?}");
    let pull_up = result.runs.iter().find(|r| r.mode == Mode::PullUp).unwrap();
    let big_cache = result.runs.iter().find(|r| r.mode == Mode::Caching && r.percent == 80.0).unwrap();
    assert!(big_cache.cache_byte_hit > 0.0 && big_cache.traffic < pull_up.traffic, "a cache saves traffic: {big_cache:?} against {pull_up:?}");
    assert!(node.stats().tasks_done > 0);
    let report = hybrid_bench::report("local", &opts, &result);
    for needle in ["against cache size", "against skew", "Figure 11", "the better of caching-only", "Weighted-LFU", "belady"] {
        assert!(report.contains(needle), "{needle}: {report}");
    }
    // Two skews and two policy sizes: every plot is drawn, and the files
    // the run says it wrote are there.
    let files = hybrid_bench::output_files(&opts);
    for png in ["time-vs-cache.png", "traffic-vs-cache.png", "time-vs-skew.png", "policies-vs-cache.png"] {
        assert!(files.contains(&png), "{files:?}");
    }
    for file in files {
        assert!(std::fs::metadata(opts.out.join(file)).unwrap().len() > 1000, "{file}");
    }
    // One line per measured query of every run, adding up to the run's figures.
    let per_query = std::fs::read_to_string(opts.out.join("queries.csv")).unwrap();
    assert_eq!(per_query.lines().count(), 1 + result.runs.iter().map(|r| r.queries).sum::<usize>());
    assert!(per_query.lines().skip(1).all(|l| l.ends_with("\"") && l.contains(",\"SELECT ")), "each line ends with its query's text: {per_query}");
    for run in &result.runs {
        assert_eq!(run.per_query.len(), run.queries);
        assert!(run.per_query.iter().all(|q| q.planning_seconds > 0.0 && q.planning_seconds < q.seconds), "planning is a part of each query's time: {run:?}");
        assert_eq!(run.per_query.iter().map(|q| q.pushdown.row_groups_pushed).sum::<u64>(), run.row_groups_pushed, "{run:?}");
        assert!((run.per_query.iter().map(|q| q.seconds).sum::<f64>() - run.seconds).abs() < 1e-6, "{run:?}");
    }
}

/// Histograms put the fact table on the probe side of a star join. SSB's
/// date key is a `yyyymmdd` integer: spread evenly between its bounds, a
/// quarter looked like 0.5 % of the days where it is 3.6 %, so lineorder's
/// joined rows looked fewer than one region's customers and the hash
/// tables were built on lineorder — and a pushed scan of lineorder got no
/// Bloom filters from the dimensions. From the row groups' histograms the
/// filtered dimensions are the smaller sides, as they are. (Loaded in the
/// writer's default row groups — one per table here — where zone maps
/// alone cannot tell a quarter from the rest.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn star_joins_build_their_hash_tables_on_the_dimensions() {
    let db = TestDb::new(Backend::Local, "ssb-star");
    let e = db.engine(EngineOptions::default()).await;
    ssb::load(&e, SF, ssb::quiet()).await.expect("derive SSB");
    // SSB Q4.2's shape: the part join keeps lineorder's side as its build
    // side, rightly (fewer rows than 40 % of the parts).
    let sql = "EXPLAIN SELECT d_year, c_nation, sum(lo_revenue - lo_supplycost) AS profit FROM dwdate, customer, supplier, part, lineorder \
        WHERE lo_custkey = c_custkey AND lo_suppkey = s_suppkey AND lo_partkey = p_partkey AND lo_orderdate = d_datekey \
        AND lo_orderdate >= 19980601 AND lo_orderdate < 19980901 AND c_region = 'AFRICA' AND s_region = 'AFRICA' \
        AND (p_mfgr = 'MFGR#3' OR p_mfgr = 'MFGR#4') GROUP BY d_year, c_nation ORDER BY d_year, c_nation";
    let plan = lines(&run(&e, sql).await).join("\n");
    // A hash join lists its build side's key first.
    for build in ["(d_datekey@", "(c_custkey@", "(s_suppkey@"] {
        assert!(plan.contains(&format!("on=[{build}")), "{build} should be a build side:\n{plan}");
    }
    for probe in ["(lo_orderdate@", "(lo_custkey@", "(lo_suppkey@"] {
        assert!(!plan.contains(&format!("on=[{probe}")), "{probe} should be a probe side:\n{plan}");
    }
}
