//! Workloads and their oracles: TPC-H generation and loading, the 22 queries,
//! and verification of answers against reference answers from outside the
//! project (DuckDB's results on the same generated data, exported by
//! `scripts/export-tpch-reference.py`).

pub mod answers;
pub mod tpch;
