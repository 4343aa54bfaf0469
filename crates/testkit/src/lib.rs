//! Test harness shared by blobhouse's test suites.
//!
//! - [`minio`]: the project's testbed (MinIO, nginx, toxiproxy; installed by
//!   `scripts/install-test-deps.sh`) started once per test process on
//!   127.0.0.1 in a directory of its own, killed when the process exits.
//! - [`audit`]: an object-store wrapper that records every request and fails
//!   any write that would replace an existing object — the layout's central
//!   rule, enforced under the whole suite.

pub mod audit;
pub mod minio;

pub use audit::{AuditStore, Request};
pub use minio::MinioServer;
