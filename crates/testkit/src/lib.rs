//! Test harness shared by blobhouse's test suites.
//!
//! - [`minio`]: the project's testbed (MinIO, nginx, toxiproxy; installed by
//!   `scripts/install-test-deps.sh`) started once per test process on
//!   127.0.0.1 in a directory of its own, killed when the process exits.
//! - [`azurite`]: Azure Blob Storage's emulator (installed by the same
//!   script), started once per test process on 127.0.0.1 with a container.
//! - [`gcs`]: fake-gcs-server behind a loopback proxy that completes its
//!   uploads and create-if-absent, started once per test process.
//! - [`audit`]: an object-store wrapper that records every request and fails
//!   any write that would replace an existing object — the layout's central
//!   rule, enforced under the whole suite.

pub mod audit;
pub mod azurite;
pub mod gcs;
pub mod minio;

pub use audit::{AuditStore, Request};
pub use azurite::AzuriteServer;
pub use gcs::GcsServer;
pub use minio::MinioServer;

/// `name` made unique in this test run: the process id and a counter, so
/// that every test database of every test process gets its own prefix.
pub fn unique(name: &str) -> String {
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("{name}-{}-{n}", std::process::id())
}

/// The process-wide server in `cell`, started by `start` on first call.
/// Panics with `start`'s error (instructions to install what is missing):
/// tests of a store must fail, not be skipped, when it cannot run.
pub(crate) fn shared<T>(cell: &'static std::sync::OnceLock<Result<T, String>>, start: fn() -> Result<T, String>) -> &'static T {
    match cell.get_or_init(start) {
        Ok(s) => s,
        Err(e) => panic!("{e}"),
    }
}
