//! What a distributed statement's scans read, per process: the counters of
//! scans that ran on workers reach the coordinator only as the metrics
//! datafusion-distributed sends back with each task's stream, so they are
//! read from its metrics-rewritten plan rather than from our scan nodes.
//!
//! A scan stage's task `i` is routed to worker `i` (modulo the workers)
//! of those up when the statement was planned ([`crate::tasks::TaskPlacement::route`]); scans in
//! the stage the coordinator runs itself are labelled `coordinator`.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::metrics::MetricsSet;
use datafusion_distributed::{DISTRIBUTED_DATAFUSION_TASK_ID_LABEL, DistributedExec, DistributedMetricsFormat, rewrite_distributed_plan_with_metrics};
use url::Url;

use blobhouse_engine::RemoteRun;
use blobhouse_engine::scan::ScanMetrics;

/// How long the coordinator waits, after the last row, for the tasks'
/// metrics still on their way; past it the statement's counters are left
/// out rather than holding its answer back.
pub const METRICS_WAIT: Duration = Duration::from_secs(5);

/// Who scanned what in `plan`, an executed plan holding a
/// [`DistributedExec`] (`None` when it holds none: the plan ran here).
/// `workers` are the workers up when it was planned, in routing order.
pub async fn remote_run(plan: &Arc<dyn ExecutionPlan>, workers: &[Url]) -> Option<RemoteRun> {
    let distributed = find_distributed(plan)?;
    let rewritten = tokio::time::timeout(METRICS_WAIT, rewrite_distributed_plan_with_metrics(distributed, DistributedMetricsFormat::PerTask)).await.ok()?.ok()?;
    let mut per: BTreeMap<Who, MetricsSet> = BTreeMap::new();
    collect(&rewritten, false, workers.len().max(1), &mut per);
    let mut run = RemoteRun::default();
    for (who, metrics) in per {
        let m = ScanMetrics::from_metrics(&metrics);
        run.scan += m;
        if who == Who::Coordinator && m.row_groups_read == 0 {
            // Timers of the scan nodes here that only stood for the workers' tasks.
            continue;
        }
        let label = match who {
            Who::Coordinator => "coordinator".to_string(),
            Who::Worker(i) => match workers.get(i) {
                Some(url) => format!("worker {} ({})", i + 1, url.as_str().trim_end_matches('/')),
                None => format!("worker {}", i + 1),
            },
        };
        run.processes.push((label, m));
    }
    Some(run)
}

/// Where a scan ran: in the coordinator's own stage, or on the `i`-th
/// worker up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Who {
    Coordinator,
    Worker(usize),
}

/// The first [`DistributedExec`] in `plan` (the root, or below the node
/// EXPLAIN ANALYZE puts on top).
fn find_distributed(plan: &Arc<dyn ExecutionPlan>) -> Option<Arc<dyn ExecutionPlan>> {
    if plan.downcast_ref::<DistributedExec>().is_some() {
        return Some(plan.clone());
    }
    plan.children().into_iter().find_map(find_distributed)
}

/// The nodes that hold a scan's metrics: our scan where it ran in this
/// process, the leaf standing for its per-task shares where they ran on
/// workers.
const SCAN_NODES: [&str; 2] = ["BlobScanExec", "DistributedLeafExec"];

/// Gathers the metrics of every scan below `plan` by who ran it. The
/// rewritten plan wraps each node in a metrics holder that keeps its name;
/// `remote` turns true below the first network boundary.
fn collect(plan: &Arc<dyn ExecutionPlan>, remote: bool, workers: usize, per: &mut BTreeMap<Who, MetricsSet>) {
    if SCAN_NODES.contains(&plan.name()) {
        for metric in plan.metrics().unwrap_or_default().iter() {
            let task = metric.labels().iter().find(|l| l.name() == DISTRIBUTED_DATAFUSION_TASK_ID_LABEL).and_then(|l| l.value().parse::<u64>().ok());
            let who = match (remote, task) {
                (true, Some(i)) => Who::Worker(i as usize % workers),
                _ => Who::Coordinator,
            };
            per.entry(who).or_default().push(metric.clone());
        }
    }
    let below = remote || plan.name().starts_with("Network");
    for child in plan.children() {
        collect(child, below, workers, per);
    }
}
