//! [`StatementExtension`]: how a layer above the engine changes the
//! DataFusion state every statement plans and runs with, without the engine
//! knowing that layer. The cluster (`blobhouse-cluster`) installs one that
//! plans statements to run on workers; the engine stays the coordinator
//! (parsing, transactions, commits, the catalog) and never imports it.
//!
//! An extension is consulted for each statement, after the statement's
//! catalog and memory pool are set: it may add a query planner, session
//! config extensions, or change options. While one is installed the engine
//! plans with [`portable_rules`]: plans it builds are cut into stages and
//! sent to other processes, so operators that share state through memory
//! (a hybrid scan's split, a key transfer between a join and a distant
//! scan, a subplan computed once for two consumers) or physical
//! expressions of our own inside DataFusion's nodes (which DataFusion 55's
//! plan codec cannot carry, apache/datafusion#24829) are left out.

use std::sync::Arc;

use datafusion::common::DataFusionError;
use datafusion::execution::session_state::SessionStateBuilder;
use futures::future::BoxFuture;
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::ExecutionPlan;

use crate::scan::ScanMetrics;

/// A change to every statement's DataFusion state (see the module docs).
pub trait StatementExtension: Send + Sync + std::fmt::Debug {
    /// Extends `builder`, the state one statement is about to plan with.
    fn extend(&self, builder: SessionStateBuilder) -> SessionStateBuilder;

    /// How EXPLAIN shows `plan`, a physical plan planned with this
    /// extension, beyond DataFusion's own rows (the cluster's stages and
    /// tasks): `None` adds nothing.
    fn explain(&self, _plan: &Arc<dyn ExecutionPlan>) -> Option<String> {
        None
    }

    /// After `error` failed a statement: the processes this extension
    /// found down (the cluster's dead workers, by address), each left out
    /// of the plans that follow. A statement that only reads, outside
    /// BEGIN … COMMIT, then runs once more; any other fails naming them.
    /// Default: none.
    fn failed_by<'a>(&'a self, _error: &'a DataFusionError) -> BoxFuture<'a, Vec<String>> {
        Box::pin(async { Vec::new() })
    }

    /// After `plan` (planned with this extension) ran to the end: what its
    /// scans read, including the parts that ran in other processes, whose
    /// counters the plan in this process never sees. `None`: the plan ran
    /// here, and its own nodes say it.
    fn executed<'a>(&'a self, _plan: &'a Arc<dyn ExecutionPlan>) -> BoxFuture<'a, Option<RemoteRun>> {
        Box::pin(async { None })
    }

    /// The processes statements run on (a cluster's workers) and whether
    /// each is taken to be up: what a server's `/metrics` reports.
    fn workers(&self) -> Vec<(String, bool)> {
        Vec::new()
    }
}

/// What a statement that ran partly in other processes read
/// ([`StatementExtension::executed`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RemoteRun {
    /// Every scan's counters, summed over the processes that ran them.
    /// What the coordinator decided while planning (row groups pruned,
    /// bytes skipped) is not among them.
    pub scan: ScanMetrics,
    /// The same per process that scanned (a label such as `worker 2
    /// (http://10.0.0.7:50071)`, or `coordinator`), in task order.
    pub processes: Vec<(String, ScanMetrics)>,
}

/// The physical optimizer rules of ours whose plans cannot leave the
/// process (see the module docs), by [`PhysicalOptimizerRule::name`].
pub const PROCESS_LOCAL_RULES: [&str; 6] = [
    "blobhouse_hybrid_pushdown",
    "blobhouse_bloom_join",
    "blobhouse_key_transfer",
    "decimal64",
    "blobhouse_shared_subplan",
    "blobhouse_adaptive_filter",
];

/// `rules` without [`PROCESS_LOCAL_RULES`].
pub fn portable_rules(rules: &[Arc<dyn PhysicalOptimizerRule + Send + Sync>]) -> Vec<Arc<dyn PhysicalOptimizerRule + Send + Sync>> {
    rules.iter().filter(|r| !PROCESS_LOCAL_RULES.contains(&r.name())).cloned().collect()
}
