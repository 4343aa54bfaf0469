//! blobhouse's SQL engine on DataFusion.
//!
//! - [`Engine`]: one open database with a DataFusion session; runs statements.
//! - [`provider`]: tables, the schema provider and the INSERT sink.
//! - [`scan`]: the footer-free, zone-map-pruned scan operator: plans every
//!   request of a scan up front.
//! - [`scheduler`]: the object scheduler, how many bytes a scan keeps in
//!   flight and on how many download threads.
//! - `pipeline`: the running scan — fetcher, arrival-order hand-off to the
//!   partitions, cancellation.
//! - [`source`]: where data ranges are read from — the download manager
//!   with presigned URLs, or object_store.
//! - [`chunks`]: fetched column chunks served to the Parquet decoder.
//! - [`copy`]: `COPY table FROM …`.
//! - [`selectivity`]: filter estimates for the optimizer's join choices.
//! - [`memory`]: the engine's one memory budget, and the process's resident
//!   set as the kernel reports it.
//! - [`types`]: column types as SQL names, for DESCRIBE and the shell.
//! - [`sqlstate`]: the PostgreSQL SQLSTATE of every engine error, which
//!   every endpoint reports.

pub mod bloom_join;
pub mod chunks;
pub mod copy;
pub mod hybrid;
mod dml;
mod history;
mod names;
mod optimize;
mod time_travel;
pub mod memory;
pub mod provider;
pub mod runtime_filter;
pub mod scan;
pub mod scheduler;
pub mod selectivity;
mod pipeline;
pub mod source;
mod session;
pub mod sqlstate;
pub mod tiers;
pub mod types;
mod zone_maps;

pub use chunks::RequestPolicy;
pub use source::DataSource;
pub use scan::{BlobScanExec, GET_PRICE_USD, ScanMetrics, collect_scan_metrics};
pub use scheduler::{Decision, SchedulerOptions};
pub use memory::MemoryBudget;
pub use tiers::{CacheOptions, CachedChunk, DECODED_MAX_RATIO, DecodedSize, Tiers, parse_cache_size};
pub use session::{Answer, CATALOG, Described, RowStream, Engine, EngineError, EngineOptions, MemoryUse, Notice, QueryResult, TxnRule, SpillOptions, is_engine_setting, scan_download_options, split_complete_statements, split_statements};
