//! Workloads, their oracles and reports: TPC-H generation and loading, the 22
//! queries, verification of answers against reference answers from outside
//! the project (DuckDB's results on the same generated data, exported by
//! `scripts/export-tpch-reference.py`), the testbed's calibration benchmark,
//! and PNG plots.

pub mod answers;
pub mod calibrate;
pub mod plot;
pub mod tpch;
