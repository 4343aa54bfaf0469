//! Storage-side compute for blobhouse (FlexPushdownDB §4, on our own
//! service since S3 Select is closed).
//!
//! A storage node runs next to the store and evaluates the separable part
//! of a scan — projection, filter, partial aggregation — on slices of data
//! objects, so that only the (much smaller) results cross the network
//! between store and compute. The compute side decides per segment whether
//! to read from its caches, push down, or fetch (`blobhouse_engine`'s hybrid
//! scan); this crate is the protocol, the node and the client.
//!
//! - [`bloom`]: Bloom-filter probes for the probe side of hash joins.
//! - [`slice`]: the leaf of every pushed fragment (row groups of one object).
//! - [`codec`]: tickets, the fragment codec, and the allow-list a node
//!   checks before decoding anything.
//! - [`node`]: the Arrow Flight service with its token and CPU budget.
//! - [`client`]: the compute side's connection to a node.

pub mod bloom;
pub mod client;
pub mod codec;
pub mod error;
pub mod node;
pub mod slice;

pub use bloom::{BloomFilter, BloomProbeExpr, BloomSlot};
pub use client::{NodeClient, NodeReply};
pub use error::PushdownError;
pub use node::{NodeOptions, NodeStats, NodeTls, ReplyCompression, StorageNode};
pub use slice::{ObjectSlice, ObjectSliceExec, SliceChecks};
