//! How a blobhouse scan becomes a stage's tasks: how many, which row groups
//! each reads, and which worker runs each.
//!
//! datafusion-distributed asks three questions of every leaf of a stage,
//! answered here for [`BlobScanExec`] and left to its defaults for the rest:
//! - *How many tasks?* As many as workers, but no more than the scan has
//!   row groups ([`desired_tasks`]).
//! - *What does task `i` read?* The row groups whose home is worker `i`
//!   ([`crate::affinity`]; with fewer tasks than workers, homes fold onto
//!   tasks). Each task gets its own share ([`BlobScanExec::split`]), so
//!   every row group is read by exactly one task: the shares are disjoint
//!   and cover the scan, which `split` checks.
//! - *Where does task `i` run?* On worker `i`, whose caching tiers hold
//!   those row groups from the last time ([`route`]).
//!
//! Routing only decides where data is cached; which rows a task reads is
//! fixed by its share, so a route that differs (a worker replaced) changes
//! speed, never the answer.

use std::sync::Arc;

use datafusion::common::Result;
use datafusion::common::tree_node::TreeNode;
use datafusion::physical_plan::ExecutionPlan;
use datafusion_distributed::{
    DesiredTaskCountEvent, DesiredTaskCountEventResponse, DistributedLeafExec, RouteTasksEvent, RouteTasksEventResponse, ScaleUpLeafNodeEvent,
    ScaleUpLeafNodeEventResponse,
};

use blobhouse_engine::BlobScanExec;

use crate::affinity::{WorkerKey, home, row_group_key};
use crate::liveness::Liveness;

/// Tasks for a scan of `row_groups` row groups on `workers` workers.
pub fn desired_tasks(row_groups: usize, workers: usize) -> usize {
    row_groups.min(workers).max(1)
}

/// The task of each row group (object name, row group), for `tasks` tasks
/// over `workers`: its home's index, folded onto the tasks.
pub fn share_of(row_groups: &[(&str, usize)], workers: &[WorkerKey], tasks: usize) -> Vec<usize> {
    assert!(tasks >= 1, "a stage runs at least one task");
    row_groups.iter().map(|(object, rg)| home(row_group_key(object, *rg), workers).unwrap_or(0) % tasks).collect()
}

/// The workers of a cluster that are up, in the order tasks are routed to
/// them: read at each question, so a worker found down leaves the next
/// plan.
#[derive(Debug, Clone)]
pub struct TaskPlacement {
    live: Liveness,
}

impl TaskPlacement {
    /// Placement over the up workers of `live`; a worker's identity is its URL.
    pub fn new(live: Liveness) -> Self {
        TaskPlacement { live }
    }

    fn keys(&self) -> Vec<WorkerKey> {
        self.live.up().iter().map(|u| WorkerKey::new(u.as_str())).collect()
    }

    /// The answer to "how many tasks" for `plan`, when it is our scan.
    pub fn desired(&self, ev: DesiredTaskCountEvent) -> Option<Result<DesiredTaskCountEventResponse>> {
        let scan = ev.plan.downcast_ref::<BlobScanExec>()?;
        Some(Ok(DesiredTaskCountEventResponse::desired(desired_tasks(scan.unit_count(), self.keys().len()))))
    }

    /// `plan` (our scan) cut into one share per task.
    pub fn scale_up(&self, ev: ScaleUpLeafNodeEvent) -> Option<Result<ScaleUpLeafNodeEventResponse>> {
        let scan = ev.plan.downcast_ref::<BlobScanExec>()?;
        if ev.task_count <= 1 {
            return None;
        }
        let shares = share_of(&scan.unit_identities(), &self.keys(), ev.task_count);
        Some(scan.split(&shares, ev.task_count).and_then(|variants| {
            let variants = variants.into_iter().map(|v| Arc::new(v) as Arc<dyn ExecutionPlan>);
            Ok(ScaleUpLeafNodeEventResponse::new(Arc::new(DistributedLeafExec::try_new(ev.plan.clone(), variants)?)))
        }))
    }

    /// Task `i` of a stage that reads our scan goes to worker `i`.
    pub fn route(&self, ev: RouteTasksEvent) -> Option<Result<RouteTasksEventResponse>> {
        let reads_ours = ev
            .plan
            .exists(|p| Ok(p.downcast_ref::<DistributedLeafExec>().is_some_and(|l| l.original().downcast_ref::<BlobScanExec>().is_some())))
            .unwrap_or(false);
        let urls = self.live.up();
        if !reads_ours || urls.is_empty() {
            return None;
        }
        Some(Ok(RouteTasksEventResponse::new(urls.iter().cycle().take(ev.task_count).cloned().collect())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn workers(n: usize) -> Vec<WorkerKey> {
        (0..n).map(|i| WorkerKey::new(format!("http://127.0.0.1:{}", 7000 + i))).collect()
    }

    #[test]
    fn every_row_group_gets_exactly_one_task_below_the_task_count() {
        let names: Vec<String> = (0..40).map(|i| format!("data/t/{i:016x}.parquet")).collect();
        let rgs: Vec<(&str, usize)> = names.iter().flat_map(|n| (0..5).map(move |rg| (n.as_str(), rg))).collect();
        for w in [1, 2, 3, 7] {
            for t in 1..=w {
                let shares = share_of(&rgs, &workers(w), t);
                assert_eq!(shares.len(), rgs.len());
                assert!(shares.iter().all(|s| *s < t), "{w} workers, {t} tasks");
                if t == w && w > 1 {
                    // 200 row groups over w homes: every task gets some.
                    assert!((0..t).all(|i| shares.contains(&i)), "{w} workers: a worker got nothing");
                }
            }
        }
    }

    #[test]
    fn tasks_are_capped_by_row_groups_and_workers() {
        assert_eq!(desired_tasks(0, 3), 1);
        assert_eq!(desired_tasks(1, 3), 1);
        assert_eq!(desired_tasks(2, 3), 2);
        assert_eq!(desired_tasks(50, 3), 3);
        assert_eq!(desired_tasks(50, 0), 1);
    }
}
