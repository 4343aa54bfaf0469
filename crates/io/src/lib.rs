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
//!   through io_uring, keep-alive pools, deadlines, retries.
//!
//! Still to come: the async front-end and loop threads, request planning,
//! the concurrency model, hedging, the epoll fallback, HTTPS and statistics
//! for EXPLAIN (see docs/notes/2026-11-22-download-manager.md).

mod epoll;
pub mod http;
pub mod uring;
