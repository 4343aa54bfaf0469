//! Hybrid scans (FlexPushdownDB §4): per row group, read from the caching
//! tiers, push the separable operators above the scan to a storage node,
//! or fetch the data and run them here — and merge the two into one stream.
//!
//! Planning: [`HybridRule`], a physical optimizer rule, finds the separable
//! operators directly above a [`BlobScanExec`](crate::scan::BlobScanExec)
//! — filters, projections and a
//! partial (first-phase) aggregation, FlexPushdownDB §4.1 — and puts a
//! [`HybridExec`] on top of them. Only chains that reduce the data (a filter
//! or an aggregation) are worth shipping: a bare projection is already free
//! in Parquet, and decoded rows are larger than the compressed chunks.
//!
//! Execution: when the first partition starts, [`HybridExec`] tells the
//! caching tiers of the scan's access (one access, Algorithm 1, with each
//! segment weighted by the pushdown work a hit saves — what Weighted-LFU
//! values), then splits the row groups:
//! - every chunk cached or admitted → read here (the scan below reads it);
//! - otherwise pushed or fetched, by [`PushdownMode`]: `on` pushes all of
//!   them (FlexPushdownDB's heuristic), `auto` sends each to the path that
//!   would finish it first ([`push_next`]), by the fetch rate and the push
//!   rate of this chain's shape measured on earlier scans ([`CostModel`]).
//!
//! Pushed row groups travel in tasks of up to `row_groups_per_task` row
//! groups of one object; each task's output arrives whole or not at all, so
//! a node that is busy, dies or fails mid-query costs only time: its row
//! groups are then read here by a scan restricted to them. Partial
//! aggregates from either side go to the same final aggregation, which is
//! what makes the merge exact.
//!
//! A hybrid scan on the probe side of a hash join carries [`Probe`]s (put
//! there by `crate::bloom_join`): its pushed tasks start when the join first
//! asks for rows — after the build side is complete — and add a Bloom
//! filter of the build side's keys to the fragment, so the node sends back
//! only rows that may join (FlexPushdownDB §4.2).

mod cost;
mod exec;
mod node;
mod rule;

use std::fmt;

pub use cost::{CostModel, push_next};
pub(crate) use exec::Probe;
pub use exec::{HybridExec, collect_pushdown};
pub use node::{Pushdown, PushdownTotals};
pub use rule::HybridRule;

/// When scans push work to the storage node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PushdownMode {
    /// Never: fetch what the caches do not hold.
    Off,
    /// Always, for what the caches do not hold (FlexPushdownDB's heuristic).
    On,
    /// Divide the uncached row groups between pushing and fetching by the
    /// rates measured on earlier scans.
    #[default]
    Auto,
}

impl PushdownMode {
    /// Parses `off`, `on` or `auto` (any case).
    pub fn parse(text: &str) -> Option<PushdownMode> {
        [PushdownMode::Off, PushdownMode::On, PushdownMode::Auto].into_iter().find(|m| m.name().eq_ignore_ascii_case(text.trim()))
    }

    /// Its name, as `parse` takes it.
    pub fn name(self) -> &'static str {
        match self {
            PushdownMode::Off => "off",
            PushdownMode::On => "on",
            PushdownMode::Auto => "auto",
        }
    }
}

/// The storage node an engine pushes to.
#[derive(Clone)]
pub struct PushdownOptions {
    /// `http://host:port` of a `blobhouse storage-node` serving the same database.
    pub endpoint: String,
    /// The node's bearer token.
    pub token: String,
    pub mode: PushdownMode,
    /// Row groups of one object per task: fewer tasks, against finer
    /// fallback and balance.
    pub row_groups_per_task: usize,
    /// Tasks one scan keeps at the node at once.
    pub tasks_in_flight: usize,
    /// The CA (PEM) that signed an `https://` node's certificate.
    pub ca: Option<Vec<u8>>,
}

/// Never shows the token (engine options are printed in messages and logs).
impl fmt::Debug for PushdownOptions {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.debug_struct("PushdownOptions")
            .field("endpoint", &self.endpoint)
            .field("token", &"<redacted>")
            .field("mode", &self.mode)
            .field("row_groups_per_task", &self.row_groups_per_task)
            .field("tasks_in_flight", &self.tasks_in_flight)
            .finish()
    }
}

impl PushdownOptions {
    /// Defaults for the node at `endpoint`.
    pub fn new(endpoint: impl Into<String>, token: impl Into<String>) -> Self {
        PushdownOptions { endpoint: endpoint.into(), token: token.into(), mode: PushdownMode::Auto, row_groups_per_task: 4, tasks_in_flight: 8, ca: None }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_never_show_the_token() {
        let o = PushdownOptions::new("http://node:50061", "s3cr3t-token");
        assert!(!format!("{o:?}").contains("s3cr3t"), "{o:?}");
    }

    #[test]
    fn modes_by_name() {
        assert_eq!(PushdownMode::parse(" AUTO "), Some(PushdownMode::Auto));
        assert_eq!(PushdownMode::parse("off"), Some(PushdownMode::Off));
        assert_eq!(PushdownMode::parse("sometimes"), None);
    }
}
