//! [`Cluster`]: what turns an [`Engine`] into a coordinator. Installed on
//! the engine, it makes every statement plan with datafusion-distributed:
//! DataFusion's physical plan is cut into stages at its repartitions and
//! merges, stages run as tasks on the workers, and our scans are split so
//! each worker reads the row groups it is home to ([`crate::tasks`]).
//!
//! Everything else stays on the coordinator: parsing, transactions, time
//! travel, commits and the catalog. A statement's scans are planned there
//! from the version it reads — past versions, deleted rows and an open
//! transaction's own uncommitted objects included — and the shares carry
//! exactly those row groups, so a worker cannot see a different version.

use std::sync::Arc;

use datafusion::common::DataFusionError;
use datafusion::execution::session_state::SessionStateBuilder;
use datafusion::physical_plan::ExecutionPlan;
use datafusion_distributed::{DesiredTaskCountEvent, DistributedExec, display_plan_ascii, DistributedExt, RouteTasksEvent, ScaleUpLeafNodeEvent, SessionStateBuilderExt, WorkerResolver};
use futures::future::BoxFuture;
use url::Url;

use blobhouse_engine::scan::ScanCodec;
use blobhouse_engine::{Engine, RemoteRun, StatementExtension};

use crate::channels::Channels;
use crate::liveness::Liveness;
use crate::token::ClusterToken;
use crate::tasks::TaskPlacement;

/// A bad cluster configuration.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    #[error("a cluster needs at least one worker (--worker URL)")]
    NoWorkers,
    #[error("worker URL {url:?} is not valid: {reason}; give it as http://HOST:PORT")]
    BadUrl { url: String, reason: String },
    #[error("worker {0} is listed twice")]
    Duplicate(Url),
}

/// The workers a coordinator runs its statements on (cheap to clone).
#[derive(Debug, Clone)]
pub struct Cluster {
    urls: Arc<[Url]>,
    live: Liveness,
    channels: Channels,
    placement: TaskPlacement,
}

/// The workers that are up, as datafusion-distributed asks for them.
#[derive(Debug)]
struct UpWorkers(Liveness);

impl WorkerResolver for UpWorkers {
    fn get_urls(&self) -> Result<Vec<Url>, DataFusionError> {
        let up = self.0.up();
        if up.is_empty() {
            return Err(DataFusionError::Execution(format!(
                "every worker of the cluster is down (tried again {} s after each failed): start them, or run without --worker",
                crate::liveness::DOWN_FOR.as_secs()
            )));
        }
        Ok(up)
    }
}

impl Cluster {
    /// A cluster of the workers at `urls` (`http://HOST:PORT`), in the order
    /// given: a worker's place in it decides nothing but its tasks' order;
    /// row groups find their home by the worker's URL.
    /// Every call carries `token`, which the workers check; `https://`
    /// workers are trusted when `ca` (PEM) signed their certificates.
    pub fn new(urls: &[impl AsRef<str>], token: ClusterToken, ca: Option<&[u8]>) -> Result<Cluster, ClusterError> {
        if urls.is_empty() {
            return Err(ClusterError::NoWorkers);
        }
        let mut parsed: Vec<Url> = Vec::with_capacity(urls.len());
        for u in urls {
            let text = u.as_ref();
            let url = Url::parse(text).map_err(|e| ClusterError::BadUrl { url: text.into(), reason: e.to_string() })?;
            if !matches!(url.scheme(), "http" | "https") || url.host().is_none() || url.port_or_known_default().is_none() {
                return Err(ClusterError::BadUrl { url: text.into(), reason: "it needs http:// or https://, a host and a port".into() });
            }
            if parsed.contains(&url) {
                return Err(ClusterError::Duplicate(url));
            }
            parsed.push(url);
        }
        let urls: Arc<[Url]> = parsed.into();
        let live = Liveness::new(urls.clone());
        Ok(Cluster { placement: TaskPlacement::new(live.clone()), live, urls, channels: Channels::new(token, ca) })
    }

    /// The workers.
    pub fn workers(&self) -> &[Url] {
        &self.urls
    }

    /// The workers that do not accept a connection now (each left out of
    /// statements for a while): what a command reports at start.
    pub async fn probe(&self) -> Vec<Url> {
        self.live.probe().await
    }

    /// Makes `engine` run its statements on this cluster from the next one on.
    pub fn install(&self, engine: &Engine) {
        engine.set_statement_extension(Some(Arc::new(self.clone())));
    }
}

impl StatementExtension for Cluster {
    fn extend(&self, builder: SessionStateBuilder) -> SessionStateBuilder {
        let (desired, scale_up, route) = (self.placement.clone(), self.placement.clone(), self.placement.clone());
        let mut builder = builder
            .with_distributed_worker_resolver(UpWorkers(self.live.clone()))
            .with_distributed_channel_resolver(self.channels.clone())
            .with_distributed_user_codec(ScanCodec::default())
            .with_distributed_desired_task_count_handler(move |ev: DesiredTaskCountEvent<'_>| desired.desired(ev))
            .with_distributed_scale_up_leaf_node_handler(move |ev: ScaleUpLeafNodeEvent<'_>| scale_up.scale_up(ev))
            .with_distributed_route_tasks_handler(move |ev: RouteTasksEvent<'_>| route.route(ev))
            .with_distributed_planner();
        // One worker: stages of one task would all stay in this process
        // (datafusion-distributed runs a stage of one task where its
        // consumer is); two tasks each send them to the worker, where the
        // CPUs and the cache are ([`crate::tasks`]). Should the setting not
        // take, statements run here, with the same answers.
        if self.live.up().len() == 1 {
            let _ = builder.set_distributed_max_tasks_per_stage(crate::tasks::ONE_WORKER_TASKS);
        }
        builder
    }

    /// Marks down the workers that no longer answer after a failed
    /// statement ([`Liveness::probe`]) and names them.
    fn failed_by<'a>(&'a self, _error: &'a DataFusionError) -> BoxFuture<'a, Vec<String>> {
        Box::pin(async move { self.live.probe().await.iter().map(|u| u.as_str().trim_end_matches('/').to_string()).collect() })
    }

    /// What each worker's scans read, from the metrics that came back
    /// with their tasks' streams ([`crate::report`]).
    fn executed<'a>(&'a self, plan: &'a Arc<dyn ExecutionPlan>) -> BoxFuture<'a, Option<RemoteRun>> {
        Box::pin(async move { crate::report::remote_run(plan, &self.live.up()).await })
    }

    /// Every worker, and whether it is up (not left out after a failure).
    fn workers(&self) -> Vec<(String, bool)> {
        let up = self.live.up();
        self.urls.iter().map(|u| (u.as_str().trim_end_matches('/').to_string(), up.contains(u))).collect()
    }

    /// The stages, their tasks, and what each task's scan share reads.
    fn explain(&self, plan: &Arc<dyn ExecutionPlan>) -> Option<String> {
        plan.downcast_ref::<DistributedExec>()?;
        Some(display_plan_ascii(plan.as_ref(), false))
    }
}
