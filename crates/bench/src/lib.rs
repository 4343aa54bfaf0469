//! Workloads, their oracles and reports: TPC-H generation and loading, the 22
//! queries, verification of answers against reference answers from outside
//! the project (DuckDB's results on the same generated data, exported by
//! `scripts/export-tpch-reference.py`), the testbed's calibration benchmark,
//! the I/O benchmark (download manager vs object_store), the caching
//! tiers' benchmark, the TPC-H
//! benchmark (memory vs remote-only, and peer engines), its thread sweep
//! (`scaling`), the bank workload
//! (transactions under concurrency), and PNG plots.

pub mod answers;
pub mod bank;
pub mod cache_bench;
pub mod calibrate;
pub mod cluster_bench;
pub mod crash;
pub mod dml_bench;
pub mod encryption_bench;
pub mod hybrid_bench;
pub mod io_bench;
pub mod serve_bench;
pub mod ssb;
pub mod plot;
pub mod scaling;
pub mod tpch;
pub mod tpch_bench;
pub mod vacuum_bench;
