//! The testbed's named profiles: how the proxies shape every connection.
//!
//! Numbers follow the AnyBlob paper's S3 measurements (§2, Figures 2–4 and
//! 10): ~30 ms to the first byte, 25–95 MiB/s per request (median 55–60),
//! a few per cent of requests slow by seconds or lost without notice. The
//! `s3-scaled` profile keeps that shape but cuts the per-connection bandwidth
//! so that this machine's aggregate throughput is reached only with hundreds
//! of requests in flight — the ratio a 100 Gbit/s instance has against S3
//! (~200–250 requests). See docs/testbed.md.

use serde_json::json;

use crate::error::{Result, TestbedError};
use crate::toxiproxy::Toxic;

/// Base (first-byte) latency added to every response, ms.
pub const S3_LATENCY_MS: u64 = 30;
/// Jitter of the base latency, ms.
pub const S3_JITTER_MS: u64 = 5;
/// Per-connection bandwidth of `s3`, toxiproxy KB/s.
pub const S3_BANDWIDTH_KBPS: u64 = 61_440;
/// Per-connection bandwidth of `s3-scaled`, toxiproxy KB/s.
pub const S3_SCALED_BANDWIDTH_KBPS: u64 = 2_560;
/// Share of connections that stall for seconds.
pub const STALL_SHARE: f32 = 0.02;
/// Share of connections whose responses never arrive (lost requests).
pub const LOST_SHARE: f32 = 0.01;
/// Share of connections reset by the server.
pub const RESET_SHARE: f32 = 0.005;
/// Share of connections cut after [`TRUNCATE_AFTER_BYTES`] (truncated bodies).
pub const TRUNCATE_SHARE: f32 = 0.005;
/// Bytes after which a truncating connection is closed.
pub const TRUNCATE_AFTER_BYTES: u64 = 4 << 20;
/// Share of connections whose requests are cut after
/// [`TRUNCATE_UPLOAD_AFTER_BYTES`] sent (truncated PUT bodies, mostly).
pub const TRUNCATE_UPLOAD_SHARE: f32 = 0.005;
/// Bytes a client may send on such a connection before it is closed.
pub const TRUNCATE_UPLOAD_AFTER_BYTES: u64 = 16 << 10;
/// Share of S3 requests answered 503 SlowDown (nginx, before MinIO).
pub const SLOWDOWN_SHARE: f32 = 0.005;
/// nginx's request rate limit in the `throttled` profile (requests/s), and
/// the burst it tolerates before answering 503.
pub const THROTTLE_RATE: u32 = 200;
pub const THROTTLE_BURST: u32 = 50;

/// A named testbed configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Profile {
    /// No shaping: clients reach the servers directly.
    Lan,
    /// S3 as measured in the paper.
    S3,
    /// S3's shape with per-connection bandwidth scaled down (≥128 requests needed).
    S3Scaled,
    /// A share of requests answered with HTTP 503 (nginx `limit_req`).
    Throttled,
    /// MinIO (and a benchmark's storage node) behind a link of limited
    /// aggregate bandwidth in a network namespace: FlexPushdownDB's regime,
    /// where the network, not the compute, is the bottleneck ([`crate::Link`]).
    Bottleneck,
}

impl Profile {
    /// All profiles.
    pub const ALL: [Profile; 5] = [Profile::Lan, Profile::S3, Profile::S3Scaled, Profile::Throttled, Profile::Bottleneck];

    /// Parses a profile name.
    pub fn parse(name: &str) -> Result<Profile> {
        Profile::ALL.into_iter().find(|p| p.name() == name).ok_or_else(|| TestbedError::UnknownProfile(name.into()))
    }

    /// The profile's name.
    pub fn name(self) -> &'static str {
        match self {
            Profile::Lan => "lan",
            Profile::S3 => "s3",
            Profile::S3Scaled => "s3-scaled",
            Profile::Throttled => "throttled",
            Profile::Bottleneck => "bottleneck",
        }
    }

    /// One line on what the profile does.
    pub fn description(self) -> String {
        match self {
            Profile::Lan => "no shaping; clients talk to MinIO and nginx directly".into(),
            Profile::S3 => format!(
                "{S3_LATENCY_MS}±{S3_JITTER_MS} ms first byte, {} KB/s per connection; {:.1}% of connections stall 2-4 s, {:.1}% lose their responses, {:.1}% are reset, {:.1}% cut after {} MiB received, {:.1}% cut after {} KiB sent (truncated uploads); {:.1}% of S3 requests answered 503 SlowDown",
                S3_BANDWIDTH_KBPS,
                STALL_SHARE * 100.0,
                LOST_SHARE * 100.0,
                RESET_SHARE * 100.0,
                TRUNCATE_SHARE * 100.0,
                TRUNCATE_AFTER_BYTES >> 20,
                TRUNCATE_UPLOAD_SHARE * 100.0,
                TRUNCATE_UPLOAD_AFTER_BYTES >> 10,
                SLOWDOWN_SHARE * 100.0
            ),
            Profile::S3Scaled => format!("as s3 (without the 503 answers), but {S3_SCALED_BANDWIDTH_KBPS} KB/s per connection: the machine's aggregate needs hundreds of requests in flight"),
            Profile::Throttled => format!("nginx answers requests beyond {THROTTLE_RATE}/s (burst {THROTTLE_BURST}) with HTTP 503; MinIO unshaped"),
            Profile::Bottleneck => format!(
                "MinIO in a network namespace behind a veth link shaped to {} Mbit/s each way (tc tbf; BLOBHOUSE_BOTTLENECK_MBIT); storage nodes run next to it with a CPU share",
                crate::link::Link::configured_mbit().unwrap_or(crate::link::DEFAULT_LINK_MBIT)
            ),
        }
    }

    /// Whether clients bypass the proxies.
    pub fn direct(self) -> bool {
        matches!(self, Profile::Lan | Profile::Bottleneck)
    }

    /// Whether S3 requests pass nginx's random 503 SlowDown answers.
    pub fn slows_down(self) -> bool {
        self == Profile::S3
    }

    /// Whether the HTTP endpoint is the rate-limited nginx server.
    pub fn throttled(self) -> bool {
        self == Profile::Throttled
    }

    /// The toxics applied to every proxy.
    pub fn toxics(self) -> Vec<Toxic> {
        let bandwidth = match self {
            Profile::S3 => S3_BANDWIDTH_KBPS,
            Profile::S3Scaled => S3_SCALED_BANDWIDTH_KBPS,
            Profile::Lan | Profile::Throttled | Profile::Bottleneck => return Vec::new(),
        };
        vec![
            Toxic::new("first-byte", "latency", 1.0, json!({"latency": S3_LATENCY_MS, "jitter": S3_JITTER_MS})),
            Toxic::new("bandwidth", "bandwidth", 1.0, json!({"rate": bandwidth})),
            Toxic::new("stall", "latency", STALL_SHARE, json!({"latency": 3000, "jitter": 1000})),
            Toxic::new("lost", "timeout", LOST_SHARE, json!({"timeout": 0})),
            Toxic::new("reset", "reset_peer", RESET_SHARE, json!({"timeout": 0})),
            Toxic::new("truncate", "limit_data", TRUNCATE_SHARE, json!({"bytes": TRUNCATE_AFTER_BYTES})),
            Toxic::upstream("truncate-upload", "limit_data", TRUNCATE_UPLOAD_SHARE, json!({"bytes": TRUNCATE_UPLOAD_AFTER_BYTES})),
        ]
    }
}
