//! blobhouse's SQL engine on DataFusion.
//!
//! A statement flows one way (docs/architecture.md):
//! text → [`parser`] → `dispatch` → a family module → DataFusion's plan →
//! [`scan`] → [`scheduler`] → `scan::pipeline` → [`source`] → the download manager.
//!
//! The process and the connection:
//! - [`Engine`] (`engine`): one open database and what the process holds
//!   for it — store, download manager, memory budget, caches, pushdown
//!   client — shared by every session.
//! - [`Session`] (`session`): one connection's settings, transaction and
//!   statements.
//! - `env`: what one statement of a family runs with (engine, statement
//!   context, scope).
//!
//! Statements:
//! - [`parser`]: every statement parsed once into one enum; time travel is
//!   a table reference's version clause ([`time_travel`]).
//! - `dispatch`: the one match over statement kinds, and which transaction
//!   each runs in.
//! - `query`: queries, EXPLAIN, and what DataFusion plans (DESCRIBE,
//!   `SET datafusion.…`).
//! - `ddl`: CREATE TABLE [AS SELECT], DROP TABLE.
//! - `dml`: DELETE and UPDATE as queries of row ids.
//! - [`copy`]: `COPY … FROM` and `COPY … TO`.
//! - [`files`]: Parquet and CSV files queried in place — `read_parquet`,
//!   `read_csv`, external tables — through the download manager and tiers.
//! - `transaction`: BEGIN, COMMIT, ROLLBACK, SAVEPOINT; a session's
//!   transaction state.
//! - `history`: snapshots, versions, RESTORE, VACUUM, SHOW STORAGE.
//! - `optimize`: OPTIMIZE (compaction).
//! - [`settings`]: the registry of settings, SET / SHOW / RESET.
//! - [`registered`]: tables a session registers from its embedder's
//!   memory (a Python DataFrame), seen beside the stored ones.
//! - `names`: repeated output column names, as PostgreSQL allows them.
//! - [`placeholders`]: parameters (`$n`, `?`) bound as typed SQL literals.
//! - `script`: scripts cut into statements ([`split_statements`]).
//! - [`result`]: what a statement answers.
//! - [`error`] and [`sqlstate`]: the engine's errors and their SQLSTATEs.
//! - [`options`]: how an engine is opened.
//! - [`extension`]: what a layer above (the cluster) changes in every
//!   statement's DataFusion state.
//!
//! Reading data:
//! - [`provider`]: tables, the schema provider and the INSERT sink.
//! - [`scan`]: the footer-free, zone-map-pruned scan operator: plans every
//!   request of a scan up front.
//! - `zone_maps`: the row-group statistics scans prune with.
//! - [`scheduler`]: the object scheduler, how many bytes a scan keeps in
//!   flight and on how many download threads.
//! - `scan::pipeline`: the running scan — fetcher, arrival-order hand-off to the
//!   partitions, cancellation.
//! - [`source`]: where data ranges are read from — the download manager
//!   with presigned URLs, or object_store.
//! - [`chunks`]: fetched column chunks served to the Parquet decoder.
//! - [`tiers`]: the memory and SSD caching tiers.
//! - [`hybrid`]: scans that push work to the storage node (FlexPushdownDB).
//! - `interop`: what other engines see — each table's Iceberg metadata in
//!   SHOW TABLES.
//! - [`bloom_join`]: Bloom filters of join keys sent to the storage node.
//! - [`runtime_filter`]: join filters applied inside scans.
//! - `column_trace`: where a column's values come from below a plan node
//!   (what the two rules above and below follow).
//! - [`key_transfer`]: a join's build-side keys sent to scans that
//!   DataFusion's join filter does not reach (across other joins), and as
//!   a [`key_bloom`] Bloom filter in front of the hash lookup where it does.
//! - [`key_bloom`]: a blocked Bloom filter of a join's key values.
//! - [`build_side`]: partitioned hash joins built on the side with fewer
//!   estimated rows.
//! - [`conjunction`]: a filter's conjuncts evaluated one after another on
//!   the rows still selected, ordered by measured cost and selectivity
//!   (in filters and in the scans' runtime filters).
//! - [`adaptive_filter`]: the rule that puts every filter of two or more
//!   conjuncts into a [`conjunction::ConjunctionExpr`].
//! - [`selectivity`]: filter estimates for the optimizer's join choices.
//! - [`shared_subplan`]: a final aggregation a plan computes twice (a CTE
//!   referenced twice) computed once.
//! - [`subquery`]: logical rules that read a subquery's value from rows the
//!   outer query computes anyway (Q17's and Q2's per-part aggregates as
//!   windows, Q11's total from its own groups); the rules above are physical.
//! - [`decimal64`]: decimal `+`, `-`, `*` computed in 64 bits when the
//!   values fit, with the same answer.
//! - [`memory`]: the engine's one memory budget, and the process's resident
//!   set as the kernel reports it.
//! - [`types`]: column types as SQL names, for DESCRIBE and the shell.

pub mod adaptive_filter;
pub mod bloom_join;
pub mod build_side;
pub mod chunks;
mod column_trace;
pub mod conjunction;
pub mod copy;
pub mod decimal64;
mod ddl;
mod dispatch;
mod dml;
mod engine;
mod env;
pub mod error;
pub mod extension;
pub mod files;
mod history;
pub mod hybrid;
mod interop;
pub mod key_bloom;
pub mod key_transfer;
pub mod memory;
mod names;
mod optimize;
pub mod options;
pub mod parser;
pub mod placeholders;
pub mod provider;
mod query;
pub mod registered;
pub mod result;
pub mod runtime_filter;
pub mod scan;
pub mod scheduler;
mod script;
pub mod selectivity;
mod session;
pub mod settings;
pub mod shared_subplan;
pub mod subquery;
pub mod source;
pub mod sqlstate;
pub mod tiers;
pub mod time_travel;
mod transaction;
pub mod types;
mod zone_maps;

pub use chunks::RequestPolicy;
pub use engine::Engine;
pub use error::{EngineError, TxnRule};
pub use extension::{RemoteRun, StatementExtension};
pub use files::{FileAccess, FileRequest};
pub use memory::MemoryBudget;
pub use options::{CATALOG, EngineOptions, SpillOptions, scan_download_options};
pub use result::{Answer, Described, MemoryUse, Notice, QueryResult, RowStream};
pub use scan::{BlobScanExec, GET_PRICE_USD, ScanMetrics, collect_scan_metrics};
pub use scheduler::{Decision, SchedulerOptions};
pub use script::{split_complete_statements, split_statements};
pub use session::Session;
pub use source::DataSource;
pub use tiers::{CacheOptions, CachedChunk, DECODED_MAX_RATIO, DecodedSize, Tiers, parse_cache_size};
