//! blobhouse's scale-out (issue 44): one query on many worker processes.
//!
//! This crate holds what the cluster needs that no engine gives it. So far:
//! - [`topology`]: the machine as the kernel describes it in sysfs — NUMA
//!   nodes, their CPUs and memory, physical cores — limited to the CPUs and
//!   memory nodes this process may use (a container's cpuset).
//! - [`deploy`]: where each worker goes for a deployment mode (one worker
//!   per machine, per NUMA node, per physical core, or N): its CPUs, the
//!   memory nodes to bind it to, and its memory budget.
//!
//! - [`affinity`]: each row group's home worker (rendezvous hashing).
//! - [`bind`]: a worker process bound to its CPUs and memory nodes.
//!
//! Distributed execution runs on `datafusion-distributed` (stages, tasks,
//! Arrow Flight between processes); what blobhouse adds to it:
//! - [`coordinator`]: [`Cluster`], installed on an engine, makes its
//!   statements plan and run on the workers.
//! - [`tasks`]: how our scan becomes a stage's tasks — disjoint shares of
//!   row groups, each on the worker that is its home.
//! - [`worker`]: a worker serving tasks through its own engine.
//! - [`channels`]: the connections to workers, reused across statements,
//!   with bounded connects and keepalives.
//! - [`token`]: the cluster's bearer token, checked by every worker.
//! - [`supervisor`]: worker processes started on this machine, one per
//!   placement, bound to their CPUs and memory nodes.
//! - [`liveness`]: which workers are up; a failed statement's dead
//!   workers are left out for a while.
//! - [`report`]: what each worker's scans read, from the metrics that
//!   come back with its tasks.
//!
//! Layering: this crate calls the engine (`blobhouse-engine`); the engine
//! knows it only as a `StatementExtension`.

pub mod affinity;
pub mod bind;
pub mod channels;
pub mod coordinator;
pub mod deploy;
pub mod liveness;
pub mod report;
pub mod supervisor;
pub mod tasks;
pub mod token;
pub mod topology;
pub mod worker;

pub use coordinator::{Cluster, ClusterError};
pub use supervisor::{LocalSpec, LocalWorkers, SuperviseError};
pub use token::{ClusterToken, TokenError};
pub use worker::{WorkerError, WorkerServer, WorkerTls};

pub use bind::{BindError, MemBind, bind, check};
pub use deploy::{DeployError, Placement, Workers, plan};
pub use topology::{CpuInfo, Node, Topology, TopologyError};
