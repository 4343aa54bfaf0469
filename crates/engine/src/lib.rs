//! blobhouse's SQL engine on DataFusion.
//!
//! - [`Engine`]: one open database with a DataFusion session; runs statements.
//! - [`provider`]: tables, the schema provider and the INSERT sink.
//! - [`scan`]: the footer-free, zone-map-pruned scan operator and its metrics.
//! - [`chunks`]: request planning (split/coalesce) and fetched-chunk decoding.
//! - [`copy`]: `COPY table FROM …`.

pub mod chunks;
pub mod copy;
pub mod provider;
pub mod scan;
mod session;

pub use chunks::RequestPolicy;
pub use scan::{BlobScanExec, ScanMetrics, collect_scan_metrics};
pub use session::{Engine, EngineError, EngineOptions, QueryResult, split_statements};
