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
//! Distributed execution itself runs on `datafusion-distributed` (the
//! issue's design note); the worker command and the supervisor that
//! starts workers with these plans come next.

pub mod affinity;
pub mod bind;
pub mod deploy;
pub mod topology;

pub use bind::{BindError, MemBind, bind, check};
pub use deploy::{DeployError, Placement, Workers, plan};
pub use topology::{CpuInfo, Node, Topology, TopologyError};
