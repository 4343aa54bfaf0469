//! The Star Schema Benchmark (O'Neil et al., 2009): its five tables, its 13
//! queries, and FlexPushdownDB's workloads over them — queries drawn from
//! templates with a Zipf-skewed date range, and the mixed-selectivity
//! workload that separates Weighted-LFU from LFU.
//!
//! **Data.** No SSB generator exists as a crate, and the reference `ssb-dbgen`
//! is a C program with its own random streams. SSB was defined as a
//! denormalisation of TPC-H, so the tables are derived in SQL, inside
//! blobhouse, from the TPC-H tables that `tpchgen` (byte for byte dbgen)
//! generates — the derivation published with SSB's definition and used by
//! most SSB-on-TPC-H setups:
//!
//! - `lineorder` = lineitem ⋈ orders ⋈ partsupp: one row per line item;
//!   dates as `yyyymmdd` integers, discount and tax in percent, `lo_revenue`
//!   = extended price × (1 − discount), `lo_supplycost` = the part-supplier's
//!   cost. Rows are written in `lo_orderdate` order (a fact table clustered
//!   on its date, as warehouses keep them), so a date range touches a
//!   contiguous run of row groups — which is what makes FlexPushdownDB's
//!   skew over dates a skew over segments.
//! - `customer`, `supplier`: nation and region names joined in; the city is
//!   the nation's first nine letters (blank padded) and a digit (key mod 10),
//!   as in SSB (`UNITED KI1`).
//! - `part`: `MFGR#m` from TPC-H's manufacturer, category `MFGR#mn` from
//!   TPC-H's brand (25 categories), brand `MFGR#mn` + 1..40 (1,000 brands),
//!   colour = the first word of the name.
//! - `dwdate` (SSB's `date`, renamed as in Redshift's SSB tutorial because
//!   `date` is a type name): one row per day from 1992-01-01 to 1998-12-31.
//!
//! The 13 query texts are SSB's (`ssb/queries/`), with `dwdate` for `date`.
//! Their answers are checked against DuckDB on the same data objects by the
//! test suite (`ssb_answers_agree_with_duckdb`).

use std::sync::Arc;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use blobhouse_engine::{EngineError, Session};

use crate::tpch;

/// SSB's tables, dimensions first.
pub const TABLES: [&str; 5] = ["dwdate", "customer", "supplier", "part", "lineorder"];

/// The 13 queries' names, in SSB's order.
pub const QUERIES: [&str; 13] = ["1.1", "1.2", "1.3", "2.1", "2.2", "2.3", "3.1", "3.2", "3.3", "3.4", "4.1", "4.2", "4.3"];

/// The text of SSB query `name` (`"1.1"` … `"4.3"`).
pub fn query(name: &str) -> Option<&'static str> {
    macro_rules! q {
        ($($n:literal),*) => { match name { $($n => Some(include_str!(concat!("../ssb/queries/q", $n, ".sql"))),)* _ => None } };
    }
    q!("1.1", "1.2", "1.3", "2.1", "2.2", "2.3", "3.1", "3.2", "3.3", "3.4", "4.1", "4.2", "4.3")
}

/// `yyyymmdd` of a DATE column, as SSB stores dates.
macro_rules! datekey {
    ($d:literal) => {
        concat!("CAST(date_part('year', ", $d, ") * 10000 + date_part('month', ", $d, ") * 100 + date_part('day', ", $d, ") AS INT)")
    };
}

/// Day numbers 0..9999 from a cross join of digits (no table function
/// needed: the build carries only the DataFusion features it uses).
const DAYS: &str = "SELECT a.x + 10 * b.x + 100 * c.x + 1000 * e.x AS n FROM \
    (VALUES (0), (1), (2), (3), (4), (5), (6), (7), (8), (9)) a(x), \
    (VALUES (0), (1), (2), (3), (4), (5), (6), (7), (8), (9)) b(x), \
    (VALUES (0), (1), (2), (3), (4), (5), (6), (7), (8), (9)) c(x), \
    (VALUES (0), (1), (2), (3), (4), (5), (6), (7), (8), (9)) e(x)";

/// The statements that derive SSB from the TPC-H tables of the same
/// database, in order. The three dimensions whose names TPC-H also uses are
/// built under a `ssb_` name, the TPC-H table is dropped, then copied to its
/// SSB name; the TPC-H tables SSB does not keep are dropped at the end.
pub fn derivation() -> Vec<String> {
    let city = |key: &str| format!("rpad(substr(n_name, 1, 9), 9, ' ') || CAST({key} % 10 AS VARCHAR)");
    let mut s = vec![
        format!(
            "CREATE TABLE dwdate AS SELECT \
               {} AS d_datekey, \
               to_char(d, '%B %-d, %Y') AS d_date, \
               to_char(d, '%A') AS d_dayofweek, \
               to_char(d, '%B') AS d_month, \
               CAST(date_part('year', d) AS INT) AS d_year, \
               CAST(date_part('year', d) * 100 + date_part('month', d) AS INT) AS d_yearmonthnum, \
               to_char(d, '%b%Y') AS d_yearmonth, \
               CAST(date_part('dow', d) AS INT) + 1 AS d_daynuminweek, \
               CAST(date_part('day', d) AS INT) AS d_daynuminmonth, \
               CAST(date_part('doy', d) AS INT) AS d_daynuminyear, \
               CAST(date_part('month', d) AS INT) AS d_monthnuminyear, \
               CAST((date_part('doy', d) - 1) / 7 + 1 AS INT) AS d_weeknuminyear, \
               CASE WHEN date_part('month', d) IN (12, 1) THEN 'Christmas' \
                    WHEN date_part('month', d) IN (2, 3, 4) THEN 'Spring' \
                    WHEN date_part('month', d) IN (5, 6, 7) THEN 'Summer' \
                    WHEN date_part('month', d) IN (8, 9, 10) THEN 'Fall' ELSE 'Winter' END AS d_sellingseason, \
               date_part('dow', d) = 6 AS d_lastdayinweekfl, \
               date_part('month', d + INTERVAL '1 day') <> date_part('month', d) AS d_lastdayinmonthfl, \
               (date_part('month', d) = 12 AND date_part('day', d) = 25) OR (date_part('month', d) = 1 AND date_part('day', d) = 1) AS d_holidayfl, \
               date_part('dow', d) BETWEEN 1 AND 5 AS d_weekdayfl \
             FROM (SELECT CAST(CAST(CAST(DATE '1992-01-01' AS INT) + n AS INT) AS DATE) AS d FROM ({DAYS})) \
             WHERE d < DATE '1999-01-01' ORDER BY d_datekey",
            datekey!("d"),
        ),
        format!(
            "CREATE TABLE ssb_customer AS SELECT c_custkey, c_name, c_address, {} AS c_city, n_name AS c_nation, \
               r_name AS c_region, c_phone, c_mktsegment \
             FROM customer JOIN nation ON c_nationkey = n_nationkey JOIN region ON n_regionkey = r_regionkey ORDER BY c_custkey",
            city("c_custkey")
        ),
        format!(
            "CREATE TABLE ssb_supplier AS SELECT s_suppkey, s_name, s_address, {} AS s_city, n_name AS s_nation, \
               r_name AS s_region, s_phone \
             FROM supplier JOIN nation ON s_nationkey = n_nationkey JOIN region ON n_regionkey = r_regionkey ORDER BY s_suppkey",
            city("s_suppkey")
        ),
        // 'Manufacturer#m' and 'Brand#mn': the digits sit at fixed positions.
        "CREATE TABLE ssb_part AS SELECT p_partkey, p_name, 'MFGR#' || substr(p_mfgr, 14, 1) AS p_mfgr, \
           'MFGR#' || substr(p_brand, 7, 2) AS p_category, \
           'MFGR#' || substr(p_brand, 7, 2) || CAST(1 + p_partkey % 40 AS VARCHAR) AS p_brand1, \
           split_part(p_name, ' ', 1) AS p_color, p_type, p_size, p_container \
         FROM part ORDER BY p_partkey"
            .to_string(),
        format!(
            "CREATE TABLE lineorder AS SELECT l_orderkey AS lo_orderkey, CAST(l_linenumber AS INT) AS lo_linenumber, \
               o_custkey AS lo_custkey, l_partkey AS lo_partkey, l_suppkey AS lo_suppkey, {} AS lo_orderdate, \
               o_orderpriority AS lo_orderpriority, CAST(o_shippriority AS INT) AS lo_shippriority, \
               CAST(l_quantity AS INT) AS lo_quantity, l_extendedprice AS lo_extendedprice, o_totalprice AS lo_ordtotalprice, \
               CAST(l_discount * 100 AS INT) AS lo_discount, \
               CAST(l_extendedprice * (1 - l_discount) AS DECIMAL(15, 2)) AS lo_revenue, \
               ps_supplycost AS lo_supplycost, CAST(l_tax * 100 AS INT) AS lo_tax, {} AS lo_commitdate, l_shipmode AS lo_shipmode \
             FROM lineitem JOIN orders ON l_orderkey = o_orderkey \
               JOIN partsupp ON l_partkey = ps_partkey AND l_suppkey = ps_suppkey \
             ORDER BY lo_orderdate, lo_orderkey, lo_linenumber",
            datekey!("o_orderdate"),
            datekey!("l_commitdate")
        ),
    ];
    for t in ["customer", "supplier", "part"] {
        s.push(format!("DROP TABLE {t}"));
        s.push(format!("CREATE TABLE {t} AS SELECT * FROM ssb_{t} ORDER BY 1"));
        s.push(format!("DROP TABLE ssb_{t}"));
    }
    for t in ["lineitem", "orders", "partsupp", "nation", "region"] {
        s.push(format!("DROP TABLE {t}"));
    }
    s
}

/// Generates TPC-H at `sf` into the (empty) database, derives SSB from it
/// and drops the TPC-H tables. `progress` reports the TPC-H load, then
/// `("ssb", step, steps)` per derivation statement.
pub async fn load(engine: &Session, sf: f64, progress: tpch::Progress) -> Result<(), EngineError> {
    tpch::load(engine, sf, progress.clone()).await?;
    let steps = derivation();
    for (i, statement) in steps.iter().enumerate() {
        engine.execute(statement).await.map_err(|e| match e {
            EngineError::Query(d) => EngineError::Unsupported(format!("deriving SSB, step {} of {}: {}", i + 1, steps.len(), EngineError::Query(d))),
            other => other,
        })?;
        progress("ssb", i as u64 + 1, steps.len() as u64);
    }
    Ok(())
}

/// First and last month of lineorder's order dates (TPC-H's orders span
/// 1992-01-01 to 1998-08-02).
const FIRST_MONTH: (i32, i32) = (1992, 1);
/// Months from January 1992 to August 1998.
pub const MONTHS: usize = 80;

/// Draws ranks 1..=n with P(k) ∝ 1/k^θ (θ = 0: uniform).
#[derive(Debug, Clone)]
pub struct Zipf {
    cdf: Vec<f64>,
}

impl Zipf {
    /// A sampler over `n` ranks with skew `theta` (≥ 0).
    pub fn new(n: usize, theta: f64) -> Self {
        assert!(n > 0 && theta >= 0.0 && theta.is_finite(), "Zipf needs n > 0 and a finite θ ≥ 0");
        let weights: Vec<f64> = (1..=n).map(|k| 1.0 / (k as f64).powf(theta)).collect();
        let total: f64 = weights.iter().sum();
        let mut acc = 0.0;
        let cdf = weights
            .iter()
            .map(|w| {
                acc += w / total;
                acc
            })
            .collect();
        Zipf { cdf }
    }

    /// A rank in 1..=n.
    pub fn sample(&self, rng: &mut impl Rng) -> usize {
        let u: f64 = rng.random();
        self.cdf.partition_point(|&c| c < u).min(self.cdf.len() - 1) + 1
    }
}

/// `yyyymmdd` of the first day of the month `months` after January 1992.
fn month_start(months: usize) -> i32 {
    let m = FIRST_MONTH.1 - 1 + months as i32;
    (FIRST_MONTH.0 + m / 12) * 10000 + (m % 12 + 1) * 100 + 1
}

/// The workloads of FlexPushdownDB's evaluation (§7.1, §7.2.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Workload {
    /// Queries from SSB's four flights; the date range of lineorder is a
    /// quarter whose last month is drawn by Zipf over the months, the most
    /// recent month most often; the other parameters uniformly.
    Skewed,
    /// SSB flight 1 queries (lineorder ⋈ dwdate, summed by year) whose
    /// lineorder filter differs in selectivity, as in FlexPushdownDB
    /// §7.2.3: equality on one column (`lo_quantity = 10`, ~2 % of rows)
    /// or a wide range on another (`lo_discount < 3 OR lo_discount > 6`,
    /// ~64 %). The aggregation sits above the join, so the storage node
    /// returns the filtered rows' columns: pushing a segment down costs
    /// little for the first kind and nearly a fetch for the second — the
    /// difference Weighted-LFU exploits.
    MixedSelectivity,
}

/// A seeded stream of generated queries.
#[derive(Debug)]
pub struct QueryGenerator {
    workload: Workload,
    zipf: Zipf,
    rng: StdRng,
}

/// Months a generated date range covers.
const RANGE_MONTHS: usize = 3;
const REGIONS: [&str; 5] = ["AFRICA", "AMERICA", "ASIA", "EUROPE", "MIDDLE EAST"];

impl QueryGenerator {
    /// Queries of `workload` with date skew `theta`, reproducible from `seed`.
    pub fn new(workload: Workload, theta: f64, seed: u64) -> Self {
        QueryGenerator { workload, zipf: Zipf::new(MONTHS - RANGE_MONTHS + 1, theta), rng: StdRng::seed_from_u64(seed) }
    }

    /// `lo_orderdate BETWEEN a AND b`, a quarter chosen by the skew.
    fn date_range(&mut self) -> String {
        // Rank 1 is the most recent quarter.
        let rank = self.zipf.sample(&mut self.rng);
        let first = MONTHS - RANGE_MONTHS + 1 - rank;
        format!("lo_orderdate >= {} AND lo_orderdate < {}", month_start(first), month_start(first + RANGE_MONTHS))
    }

    /// The next query's text.
    pub fn next_query(&mut self) -> String {
        let dates = self.date_range();
        let r = &mut self.rng;
        match self.workload {
            Workload::Skewed => match r.random_range(0..4) {
                0 => {
                    let d = r.random_range(1..=8);
                    let q = r.random_range(20..=35);
                    format!(
                        "SELECT sum(lo_extendedprice * lo_discount) AS revenue FROM lineorder \
                         WHERE {dates} AND lo_discount BETWEEN {d} AND {} AND lo_quantity < {q}",
                        d + 2
                    )
                }
                1 => format!(
                    "SELECT sum(lo_revenue) AS revenue, d_year, p_brand1 FROM lineorder, dwdate, part, supplier \
                     WHERE lo_orderdate = d_datekey AND lo_partkey = p_partkey AND lo_suppkey = s_suppkey AND {dates} \
                     AND p_category = 'MFGR#{}{}' AND s_region = '{}' GROUP BY d_year, p_brand1 ORDER BY d_year, p_brand1",
                    r.random_range(1..=5),
                    r.random_range(1..=5),
                    REGIONS[r.random_range(0..5)]
                ),
                2 => {
                    let region = REGIONS[r.random_range(0..5)];
                    format!(
                        "SELECT c_nation, s_nation, d_year, sum(lo_revenue) AS revenue FROM customer, lineorder, supplier, dwdate \
                         WHERE lo_custkey = c_custkey AND lo_suppkey = s_suppkey AND lo_orderdate = d_datekey AND {dates} \
                         AND c_region = '{region}' AND s_region = '{region}' \
                         GROUP BY c_nation, s_nation, d_year ORDER BY d_year, revenue DESC"
                    )
                }
                _ => {
                    let region = REGIONS[r.random_range(0..5)];
                    let m = r.random_range(1..=4);
                    format!(
                        "SELECT d_year, c_nation, sum(lo_revenue - lo_supplycost) AS profit \
                         FROM dwdate, customer, supplier, part, lineorder \
                         WHERE lo_custkey = c_custkey AND lo_suppkey = s_suppkey AND lo_partkey = p_partkey AND lo_orderdate = d_datekey \
                         AND {dates} AND c_region = '{region}' AND s_region = '{region}' AND (p_mfgr = 'MFGR#{m}' OR p_mfgr = 'MFGR#{}') \
                         GROUP BY d_year, c_nation ORDER BY d_year, c_nation",
                        m + 1
                    )
                }
            },
            Workload::MixedSelectivity => {
                // SSB's flight 1 (lineorder ⋈ dwdate) with one predicate
                // changed, as the paper did; the aggregation stays above the
                // join, so the node's reply is the filtered columns.
                let (predicate, measure) = if r.random_bool(0.5) {
                    (format!("lo_quantity = {}", r.random_range(1..=50)), "lo_revenue")
                } else {
                    ("(lo_discount < 3 OR lo_discount > 6)".to_string(), "lo_extendedprice * lo_discount")
                };
                format!(
                    "SELECT d_year, sum({measure}) AS revenue FROM lineorder, dwdate \
                     WHERE lo_orderdate = d_datekey AND {dates} AND {predicate} GROUP BY d_year ORDER BY d_year"
                )
            }
        }
    }
}

/// Generated queries, `n` of them.
pub fn generate(workload: Workload, theta: f64, seed: u64, n: usize) -> Vec<String> {
    let mut g = QueryGenerator::new(workload, theta, seed);
    (0..n).map(|_| g.next_query()).collect()
}

/// A progress callback that prints nothing.
pub fn quiet() -> tpch::Progress {
    Arc::new(|_, _, _| {})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_query_has_a_text() {
        for q in QUERIES {
            let text = query(q).unwrap();
            assert!(text.contains("lineorder"), "{q}");
        }
        assert!(query("5.1").is_none());
    }

    #[test]
    fn months_map_to_datekeys() {
        assert_eq!(month_start(0), 19920101);
        assert_eq!(month_start(11), 19921201);
        assert_eq!(month_start(12), 19930101);
        assert_eq!(month_start(MONTHS), 19980901);
    }

    #[test]
    fn zipf_skews_towards_rank_one_and_theta_zero_is_uniform() {
        let mut rng = StdRng::seed_from_u64(7);
        let n = 20_000;
        let count = |z: &Zipf, rng: &mut StdRng| {
            let mut c = vec![0usize; 79];
            for _ in 0..n {
                c[z.sample(rng) - 1] += 1;
            }
            c
        };
        let skewed = count(&Zipf::new(78, 2.0), &mut rng);
        // 1/ζ(2) ≈ 0.61 of draws are rank 1; ranks beyond 78 never appear.
        assert!((skewed[0] as f64 / n as f64 - 0.61).abs() < 0.03, "{}", skewed[0]);
        assert_eq!(skewed[78], 0);
        let flat = count(&Zipf::new(78, 0.0), &mut rng);
        let expected = n as f64 / 78.0;
        assert!(flat[..78].iter().all(|&c| (c as f64 - expected).abs() < expected * 0.35), "{flat:?}");
    }

    #[test]
    fn generated_date_ranges_stay_inside_the_data_and_favour_recent_months() {
        let queries = generate(Workload::Skewed, 2.0, 1, 400);
        let recent = queries.iter().filter(|q| q.contains("lo_orderdate >= 19980601")).count();
        assert!(recent > 200, "{recent} of 400 queries read the newest quarter");
        for q in &queries {
            let from: i32 = q.split("lo_orderdate >= ").nth(1).unwrap()[..8].parse().unwrap();
            assert!((19920101..=19980601).contains(&from), "{q}");
        }
        // Reproducible from the seed; both kinds of the mixed workload occur.
        assert_eq!(generate(Workload::Skewed, 2.0, 1, 5), generate(Workload::Skewed, 2.0, 1, 5));
        let mixed = generate(Workload::MixedSelectivity, 0.3, 2, 50);
        assert!(mixed.iter().any(|q| q.contains("lo_quantity =")) && mixed.iter().any(|q| q.contains("lo_discount < 3")));
    }
}
