//! blobhouse's integration suite. Each storage and SQL test runs twice: on a
//! local directory store and on a real MinIO (started by the harness). Every
//! test's store is wrapped in an `AuditStore`, so any attempt to overwrite an
//! existing object fails the test.

mod common;

mod bad_input;
mod cluster;
mod corruption;
mod cache;
mod concurrency;
mod dml;
mod encryption;
mod files;
mod flight;
mod format;
mod history;
mod iceberg;
mod integrity;
mod join_estimates;
mod lifecycle;
mod memory;
mod morsels;
mod plan_shape;
mod pushdown;
mod runtime_filters;
mod scan;
mod server;
mod server_clients;
mod server_fuzz;
mod settings;
mod sql;
mod ssb;
mod time_travel;
mod tpch;
mod transactions;
