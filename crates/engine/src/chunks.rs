//! Column-chunk bytes fetched by range requests.
//!
//! A scan asks for the byte ranges of the column chunks it needs; the
//! download manager's planner ([`blobhouse_io::plan::RequestPolicy`]) cuts
//! them into requests. [`FetchedChunks`] then serves the Parquet decoder from those bytes, so the
//! decoder never touches the object store and never needs the file's footer.

pub use blobhouse_io::plan::{RequestPolicy, Span};
pub use blobhouse_storage::chunks::FetchedChunks;
