//! What scans report: [`ScanMetrics`], one scan's counters as plain
//! numbers, and the `collect_*` functions that gather them (and the
//! scheduler's decisions) from an executed plan.

use std::sync::Arc;

use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::metrics::MetricsSet;

use crate::scheduler::Decision;

use super::BlobScanExec;

impl BlobScanExec {
    /// Scan counters as plain numbers, for benchmarks and tests.
    pub fn scan_metrics(&self) -> ScanMetrics {
        ScanMetrics {
            query_wait: self.counters.query_wait_time.value() as u64,
            data_wait: self.counters.data_wait_time.value() as u64,
            partitions: self.partitions as u64,
            row_groups_pruned: self.summary.row_groups_pruned as u64,
            row_groups_total: self.summary.row_groups_total as u64,
            bytes_skipped: self.summary.bytes_skipped,
            rows_skipped_by_page_index: self.summary.rows_skipped_by_pages,
            page_index_reads: self.summary.page_index_reads,
            ..ScanMetrics::from_metrics(&self.metrics.clone_inner())
        }
    }

    /// The scheduler's decisions in the latest execution (empty when it
    /// does not adapt).
    pub fn scheduler_timeline(&self) -> Vec<Decision> {
        self.counters.timeline.lock().expect("not poisoned").clone()
    }
}

/// Counters of one or more scans, summed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ScanMetrics {
    /// Nanoseconds partitions waited for data, and data for partitions.
    pub query_wait: u64,
    pub data_wait: u64,
    pub get_requests: u64,
    pub bytes_fetched: u64,
    pub row_groups_read: u64,
    /// Pieces of row groups decoded ([`super::pipeline`]'s morsels).
    pub morsels_read: u64,
    /// The scans' partitions, and those that decoded at least one morsel:
    /// whether a scan's work reached every partition it planned.
    pub partitions: u64,
    pub partitions_busy: u64,
    pub row_groups_pruned: u64,
    pub row_groups_total: u64,
    pub bytes_skipped: u64,
    /// Row groups not downloaded because a runtime filter excluded them.
    pub runtime_skipped_row_groups: u64,
    /// Decoded rows the runtime filters dropped.
    pub runtime_dropped_rows: u64,
    /// Decoded rows dropped because they are deleted.
    pub rows_deleted: u64,
    /// Rows of row groups kept by the zone maps that the page index left
    /// undecoded.
    pub rows_skipped_by_page_index: u64,
    /// Page indexes the planner read from their objects (the first
    /// filtered scan of each object; later ones find them cached).
    pub page_index_reads: u64,
    /// Column chunks served by the memory and SSD tiers, and their bytes.
    pub memory_hits: u64,
    pub memory_bytes: u64,
    pub ssd_hits: u64,
    pub ssd_bytes: u64,
    /// Chunks no tier had (fetched from the store).
    pub cache_misses: u64,
    /// Requests to the store the tiers made unnecessary.
    pub gets_avoided: u64,
    /// Chunks the SSD held that were read from the store, being faster.
    pub routed_to_store: u64,
}

impl ScanMetrics {
    /// The counters a scan node's metrics carry: all but what its planning
    /// decided (row groups pruned and total, bytes skipped, page indexes)
    /// and its partition count. Metrics are what survives a scan that ran
    /// in another process (a cluster worker's), so this is how a
    /// coordinator learns what its workers' scans read.
    pub fn from_metrics(m: &MetricsSet) -> ScanMetrics {
        let get = |name: &str| m.sum_by_name(name).map(|v| v.as_usize() as u64).unwrap_or(0);
        ScanMetrics {
            query_wait: get("query_wait_time"),
            data_wait: get("data_wait_time"),
            get_requests: get("get_requests"),
            bytes_fetched: get("bytes_fetched"),
            row_groups_read: get("row_groups_read"),
            morsels_read: get("morsels_decoded"),
            partitions_busy: m.iter().filter(|metric| metric.value().name() == "morsels_decoded" && metric.value().as_usize() > 0).count() as u64,
            runtime_skipped_row_groups: get("runtime_filter_row_groups_skipped"),
            runtime_dropped_rows: get("runtime_filter_rows_dropped"),
            rows_deleted: get("rows_deleted"),
            memory_hits: get("cache_memory_hits"),
            memory_bytes: get("cache_memory_bytes"),
            ssd_hits: get("cache_ssd_hits"),
            ssd_bytes: get("cache_ssd_bytes"),
            cache_misses: get("cache_misses"),
            gets_avoided: get("cache_gets_avoided"),
            routed_to_store: get("cache_routed_to_store"),
            ..ScanMetrics::default()
        }
    }
}

impl std::ops::AddAssign for ScanMetrics {
    fn add_assign(&mut self, o: Self) {
        self.get_requests += o.get_requests;
        self.bytes_fetched += o.bytes_fetched;
        self.row_groups_read += o.row_groups_read;
        self.morsels_read += o.morsels_read;
        self.partitions += o.partitions;
        self.partitions_busy += o.partitions_busy;
        self.row_groups_pruned += o.row_groups_pruned;
        self.row_groups_total += o.row_groups_total;
        self.bytes_skipped += o.bytes_skipped;
        self.query_wait += o.query_wait;
        self.data_wait += o.data_wait;
        self.runtime_skipped_row_groups += o.runtime_skipped_row_groups;
        self.runtime_dropped_rows += o.runtime_dropped_rows;
        self.rows_deleted += o.rows_deleted;
        self.rows_skipped_by_page_index += o.rows_skipped_by_page_index;
        self.page_index_reads += o.page_index_reads;
        self.memory_hits += o.memory_hits;
        self.memory_bytes += o.memory_bytes;
        self.ssd_hits += o.ssd_hits;
        self.ssd_bytes += o.ssd_bytes;
        self.cache_misses += o.cache_misses;
        self.gets_avoided += o.gets_avoided;
        self.routed_to_store += o.routed_to_store;
    }
}

/// Public S3 price of a GET: $0.0004 per 1,000 requests. What the caches
/// save is counted at this price (the store's own price may differ; S3's is
/// the reference every peer quotes).
pub const GET_PRICE_USD: f64 = 0.0004 / 1000.0;

impl ScanMetrics {
    /// What these scans read, in one line: row groups, requests and bytes
    /// from the store, and chunks from the caching tiers.
    pub fn describe_reads(&self) -> String {
        let mib = |b: u64| b as f64 / 1048576.0;
        let plural = |n: u64| if n == 1 { "" } else { "s" };
        format!(
            "{} row group{}, {} GET{} ({:.2} MiB) from the store, {} chunk{} from memory ({:.2} MiB), {} from SSD ({:.2} MiB)",
            self.row_groups_read,
            plural(self.row_groups_read),
            self.get_requests,
            plural(self.get_requests),
            mib(self.bytes_fetched),
            self.memory_hits,
            plural(self.memory_hits),
            mib(self.memory_bytes),
            self.ssd_hits,
            mib(self.ssd_bytes),
        )
    }

    /// What the caches did for these scans, in one line for the shell and
    /// EXPLAIN ANALYZE: hit rate, bytes by tier, GETs avoided and what they
    /// would have cost. `None` when no cache was asked (no tier, or a scan
    /// that read nothing).
    pub fn cache_summary(&self) -> Option<String> {
        let hits = self.memory_hits + self.ssd_hits;
        let asked = hits + self.cache_misses + self.routed_to_store;
        if asked == 0 {
            return None;
        }
        let mib = |b: u64| b as f64 / 1048576.0;
        let routed = match self.routed_to_store {
            0 => String::new(),
            n => format!(", {n} read{} routed to the store", if n == 1 { "" } else { "s" }),
        };
        Some(format!(
            "{:.0}% of {asked} chunks from cache ({} memory, {:.2} MiB; {} SSD, {:.2} MiB{routed}), {} GET{} avoided = ${:.6} saved",
            100.0 * hits as f64 / asked as f64,
            self.memory_hits,
            mib(self.memory_bytes),
            self.ssd_hits,
            mib(self.ssd_bytes),
            self.gets_avoided,
            if self.gets_avoided == 1 { "" } else { "s" },
            self.gets_avoided as f64 * GET_PRICE_USD,
        ))
    }
}

/// Sums the scan metrics of every [`BlobScanExec`] in an executed plan.
pub fn collect_scan_metrics(plan: &Arc<dyn ExecutionPlan>) -> ScanMetrics {
    let mut total = ScanMetrics::default();
    if let Some(scan) = plan.downcast_ref::<BlobScanExec>() {
        total += scan.scan_metrics();
    }
    for child in plan.children() {
        total += collect_scan_metrics(child);
    }
    total
}

/// Each [`BlobScanExec`]'s table and scheduler decisions in an executed plan.
pub fn collect_scheduler_timelines(plan: &Arc<dyn ExecutionPlan>) -> Vec<(String, Vec<Decision>)> {
    let mut out = Vec::new();
    if let Some(scan) = plan.downcast_ref::<BlobScanExec>() {
        out.push((scan.table.clone(), scan.scheduler_timeline()));
    }
    for child in plan.children() {
        out.extend(collect_scheduler_timelines(child));
    }
    out
}
