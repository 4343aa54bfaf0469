//! blobhouse's download manager (AnyBlob, VLDB 2023, §3).
//!
//! Object stores give each request tens of MiB/s after tens of milliseconds,
//! so bandwidth comes from hundreds of requests in flight; the CPU spent on
//! them is CPU the query cannot use. General-purpose HTTP stacks (hyper via
//! reqwest, what object_store uses) spend it on per-request futures, header
//! maps and copies. This crate keeps its own small HTTP/1.1 codec so that the
//! event loop can receive bodies straight into the caller's buffers and parse
//! with no allocation per chunk — which is why it is written here and not
//! taken from a crate.
//!
//! - [`http`]: the wire format — request writing, a strict response parser,
//!   an in-place body decoder that detects truncated bodies.
//! - [`uring`]: the event loop — many requests in flight on one thread
//!   through io_uring (or epoll where io_uring is unavailable), keep-alive
//!   pools, deadlines, retries, hedging.
//! - [`model`]: latencies learned from completed requests; they set the
//!   requests in flight and the hedging deadlines.
//! - [`manager`]: loop threads behind an async `get`/`put` with a memory
//!   budget as back-pressure — what the engine calls.
//! - [`plan`]: which range requests to send for the byte ranges a reader wants.
//! - [`stats`]: latency histograms.
//! - [`buffers`]: receive buffers reused across requests.
//!
//! - [`tls`]: HTTPS through rustls on the same loop.
//! - [`resolver`]: endpoint addresses, spread and replaced by throughput.

pub mod buffers;
mod epoll;
pub mod http;
pub mod manager;
pub mod model;
pub mod plan;
pub mod resolver;
pub mod stats;
pub mod tls;
pub mod uring;

pub use manager::{Download, DownloadError, DownloadManager, LoggedRequest, ManagerOptions, ManagerStats};
