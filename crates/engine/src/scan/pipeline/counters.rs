//! What a running scan measures: [`ScanCounters`], the metrics of the scan
//! node that its runs share, and [`CpuSpan`], the download manager's CPU
//! while it downloaded.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use datafusion::physical_plan::metrics::{Count, ExecutionPlanMetricsSet, Gauge, MetricBuilder, MetricValue, Time};

use crate::scheduler::Decision;
use crate::source::DataSource;

/// Counters of a scan, shared by its runs (global metrics of the plan node).
#[derive(Debug, Clone)]
pub(crate) struct ScanCounters {
    pub get_requests: Count,
    pub bytes_fetched: Count,
    pub row_groups_read: Count,
    pub retries: Count,
    pub hedged: Count,
    /// Sum of the requests' times to first byte.
    pub first_byte_time: Time,
    /// Sum of the row groups' download times (submit to last byte).
    pub fetch_time: Time,
    pub decode_time: Time,
    /// Rows the runtime filters dropped ([`crate::runtime_filter`]).
    pub rows_filtered: Count,
    /// Decoded rows dropped because a deletion vector deletes them.
    pub rows_deleted: Count,
    /// Row groups not downloaded because a runtime filter excludes them.
    pub row_groups_skipped: Count,
    /// Partitions waiting for a row group to arrive (the query waited on data).
    pub query_wait_time: Time,
    /// Row groups waiting for a partition to take them (data waited on the query).
    pub data_wait_time: Time,
    /// The download manager's CPU while the scan downloaded.
    pub download_cpu: Option<Time>,
    /// Bytes fetched per second of the scan's download phase (MiB/s).
    pub retrieval_mib_s: Gauge,
    pub in_flight_peak_mib: Gauge,
    /// Most bytes held ahead of the partitions: in flight plus arrived and
    /// not yet taken.
    pub ahead_peak_mib: Gauge,
    pub in_flight_target_mib: Gauge,
    pub loop_threads: Gauge,
    pub scheduler_epochs: Count,
    /// Column chunks (and bytes) the memory and SSD tiers served, chunks
    /// they did not have, and store requests they saved.
    pub memory_hits: Count,
    pub memory_bytes: Count,
    pub ssd_hits: Count,
    pub ssd_bytes: Count,
    pub cache_misses: Count,
    pub gets_avoided: Count,
    /// Chunks the SSD held that the router read from the store instead.
    pub routed_to_store: Count,
    /// Decisions of the latest run, for plots.
    pub timeline: Arc<Mutex<Vec<Decision>>>,
}

impl ScanCounters {
    pub fn new(set: &ExecutionPlanMetricsSet, managed: bool) -> Self {
        let time = |name: &'static str| {
            let t = Time::new();
            MetricBuilder::new(set).build(MetricValue::Time { name: name.into(), time: t.clone() });
            t
        };
        let count = |name: &'static str| MetricBuilder::new(set).global_counter(name);
        let gauge = |name: &'static str| MetricBuilder::new(set).global_gauge(name);
        ScanCounters {
            get_requests: count("get_requests"),
            bytes_fetched: count("bytes_fetched"),
            row_groups_read: count("row_groups_read"),
            retries: count("retries"),
            hedged: count("hedged"),
            first_byte_time: time("first_byte_time"),
            fetch_time: time("fetch_time"),
            decode_time: time("decode_time"),
            rows_filtered: count("runtime_filter_rows_dropped"),
            rows_deleted: count("rows_deleted"),
            row_groups_skipped: count("runtime_filter_row_groups_skipped"),
            query_wait_time: time("query_wait_time"),
            data_wait_time: time("data_wait_time"),
            download_cpu: managed.then(|| time("download_cpu")),
            retrieval_mib_s: gauge("retrieval_mib_s"),
            in_flight_peak_mib: gauge("in_flight_peak_mib"),
            ahead_peak_mib: gauge("ahead_peak_mib"),
            in_flight_target_mib: gauge("in_flight_target_mib"),
            loop_threads: gauge("loop_threads"),
            scheduler_epochs: count("scheduler_epochs"),
            memory_hits: count("cache_memory_hits"),
            memory_bytes: count("cache_memory_bytes"),
            ssd_hits: count("cache_ssd_hits"),
            ssd_bytes: count("cache_ssd_bytes"),
            cache_misses: count("cache_misses"),
            gets_avoided: count("cache_gets_avoided"),
            routed_to_store: count("cache_routed_to_store"),
            timeline: Arc::default(),
        }
    }
}

/// The CPU time the download manager's loop threads spent while a scan
/// downloaded. The loops serve every query of the engine, so concurrent
/// scans share it.
#[derive(Debug, Default)]
pub(crate) struct CpuSpan {
    start: std::sync::OnceLock<Duration>,
    reported: Mutex<Duration>,
}

impl CpuSpan {
    pub(super) fn begin(&self, source: &DataSource) {
        if let Some(dm) = source.download_manager() {
            self.start.get_or_init(|| dm.stats().cpu);
        }
    }

    /// Adds to `metric` the CPU spent since the start and not yet reported.
    pub(super) fn end(&self, source: &DataSource, metric: Option<&Time>) {
        let (Some(dm), Some(start), Some(metric)) = (source.download_manager(), self.start.get(), metric) else { return };
        let total = dm.stats().cpu.saturating_sub(*start);
        let mut reported = self.reported.lock().expect("not poisoned");
        if total > *reported {
            metric.add_duration(total - *reported);
            *reported = total;
        }
    }
}
