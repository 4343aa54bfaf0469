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

/// The tasks of each stage when one worker is up. datafusion-distributed
/// runs a stage of one task in the process that consumes it, so with one
/// task per worker a lone worker would get nothing and the coordinator
/// would run the whole statement; with two, every stage goes to it.
pub const ONE_WORKER_TASKS: usize = 2;

/// The tasks a stage may have on `workers` workers up.
pub fn task_slots(workers: usize) -> usize {
    match workers {
        1 => ONE_WORKER_TASKS,
        n => n,
    }
}

/// Tasks for a scan of `row_groups` row groups on `workers` workers.
pub fn desired_tasks(row_groups: usize, workers: usize) -> usize {
    row_groups.min(task_slots(workers)).max(1)
}

/// The task of each row group (object name, row group), for `tasks` tasks
/// over `workers`: a task routed to its home. Task `t` runs on worker
/// `t % workers` ([`TaskPlacement::route`]); with fewer tasks than workers,
/// homes fold onto the tasks, and with more (one worker, two tasks) a
/// home's row groups alternate between that worker's tasks.
pub fn share_of(row_groups: &[(&str, usize)], workers: &[WorkerKey], tasks: usize) -> Vec<usize> {
    assert!(tasks >= 1, "a stage runs at least one task");
    let w = workers.len().max(1);
    let per_worker = tasks.div_ceil(w);
    row_groups
        .iter()
        .enumerate()
        .map(|(i, (object, rg))| {
            let h = home(row_group_key(object, *rg), workers).unwrap_or(0);
            match tasks > w {
                true => Some(h + w * (i % per_worker)).filter(|t| *t < tasks).unwrap_or(h),
                false => h % tasks,
            }
        })
        .collect()
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

    /// Task `i` of a stage that reads our scan goes to worker `i` (modulo
    /// the workers up).
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
        // One worker: two tasks, both on it (a one-task stage would stay in the coordinator).
        assert_eq!(desired_tasks(50, 1), 2);
        assert_eq!(desired_tasks(1, 1), 1);
    }

    #[test]
    fn one_worker_splits_its_row_groups_between_its_two_tasks() {
        let names: Vec<String> = (0..10).map(|i| format!("data/t/{i:016x}.parquet")).collect();
        let rgs: Vec<(&str, usize)> = names.iter().flat_map(|n| (0..3).map(move |rg| (n.as_str(), rg))).collect();
        let shares = share_of(&rgs, &workers(1), 2);
        let first = shares.iter().filter(|s| **s == 0).count();
        assert_eq!((first, shares.len() - first), (15, 15), "{shares:?}");
    }
}
