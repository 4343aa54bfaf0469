//! Where each worker of a local cluster runs: its CPUs, the memory nodes it
//! is bound to, and its memory budget — for the deployment modes of the
//! NUMA paper (../shared/papers/numa-aware-distributed-query-engines.txt,
//! §III): one worker in the machine (WIM), one per NUMA node with its
//! memory bound there (WIN+MEM), one per physical core (WIC), or N.
//!
//! A plan is data: the launcher applies it to a worker process before the
//! worker starts its threads (affinity and memory policy are inherited),
//! and tests check plans for machines this one is not.

use crate::topology::{Topology, format_list};

/// How many workers, and along which lines of the machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Workers {
    /// One worker on every allowed CPU; memory by first touch (WIM).
    Machine,
    /// One worker per NUMA node with CPUs, bound to that node's memory, or
    /// the nearest node's when it has none (WIN+MEM).
    Numa,
    /// One worker per physical core, with that core's threads (WIC).
    Core,
    /// `n` workers over consecutive cores (threads, when there are more
    /// workers than cores), nodes kept together where the split allows.
    Count(usize),
}

impl std::str::FromStr for Workers {
    type Err = DeployError;

    fn from_str(text: &str) -> Result<Workers, DeployError> {
        match text.trim().to_ascii_lowercase().as_str() {
            "machine" => Ok(Workers::Machine),
            "numa" => Ok(Workers::Numa),
            "core" => Ok(Workers::Core),
            n => n.parse().map(Workers::Count).map_err(|_| DeployError::Mode(text.to_string())),
        }
    }
}

/// Why a deployment cannot be planned.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DeployError {
    #[error("--workers {0:?}: expected machine, numa, core or a number of workers")]
    Mode(String),
    #[error("--workers 0: a cluster needs at least one worker")]
    NoWorkers,
    #[error("--workers {asked}: this process may use only {cpus} CPUs, one worker needs at least one")]
    TooMany { asked: usize, cpus: usize },
    #[error("NUMA node {node} has CPUs but no memory this process may use, nor does any other node")]
    NoMemory { node: u32 },
}

/// Where one worker runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    /// The CPUs it may run on, ascending.
    pub cpus: Vec<u32>,
    /// The memory nodes it allocates on, ascending.
    pub memory_nodes: Vec<u32>,
    /// Whether its memory is bound to `memory_nodes` (else first touch).
    pub bind_memory: bool,
    /// Its memory budget, bytes: its share of its nodes' memory.
    pub memory: u64,
}

impl std::fmt::Display for Placement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mib = self.memory >> 20;
        match self.bind_memory {
            true => write!(f, "cpus {} membind {} memory {mib} MiB", format_list(&self.cpus), format_list(&self.memory_nodes)),
            false => write!(f, "cpus {} memory {mib} MiB (first touch on {})", format_list(&self.cpus), format_list(&self.memory_nodes)),
        }
    }
}

/// The workers of deployment `workers` on `topology`, in CPU order.
pub fn plan(topology: &Topology, workers: Workers) -> Result<Vec<Placement>, DeployError> {
    let memory_of = |node: u32| -> Result<u32, DeployError> { topology.nearest_memory(node).ok_or(DeployError::NoMemory { node }) };
    // Groups of CPUs, each becoming one worker's, before memory is shared out.
    let groups: Vec<Vec<u32>> = match workers {
        Workers::Machine => {
            let memory_nodes: Vec<u32> = topology.nodes.iter().filter(|n| n.memory_allowed).map(|n| n.id).collect();
            let memory = topology.nodes.iter().filter(|n| n.memory_allowed).map(|n| n.memory).sum();
            return Ok(vec![Placement { cpus: topology.cpus.iter().map(|c| c.id).collect(), memory_nodes, bind_memory: false, memory }]);
        }
        Workers::Numa => topology.cpu_nodes().map(|n| n.cpus.clone()).collect(),
        Workers::Core => cores(topology),
        Workers::Count(0) => return Err(DeployError::NoWorkers),
        Workers::Count(n) if n > topology.cpus.len() => return Err(DeployError::TooMany { asked: n, cpus: topology.cpus.len() }),
        Workers::Count(n) => {
            let cores = cores(topology);
            match n <= cores.len() {
                true => split(&cores, n).into_iter().map(|g| g.concat()).collect(),
                false => split(&topology.cpus.iter().map(|c| vec![c.id]).collect::<Vec<_>>(), n).into_iter().map(|g| g.concat()).collect(),
            }
        }
    };
    // Each group's memory nodes: the nearest with memory of its CPUs' nodes.
    let mut placements = Vec::with_capacity(groups.len());
    for mut cpus in groups {
        cpus.sort_unstable();
        let mut memory_nodes = Vec::new();
        for &cpu in &cpus {
            let node = topology.cpus.iter().find(|c| c.id == cpu).map_or(0, |c| c.node);
            memory_nodes.push(memory_of(node)?);
        }
        memory_nodes.sort_unstable();
        memory_nodes.dedup();
        placements.push(Placement { cpus, memory_nodes, bind_memory: true, memory: 0 });
    }
    // A node's memory is shared by the workers bound to it, by their CPUs.
    for node in &topology.nodes {
        let cpus_on = |p: &Placement| if p.memory_nodes.contains(&node.id) { p.cpus.len() as u64 / p.memory_nodes.len() as u64 } else { 0 };
        let total: u64 = placements.iter().map(cpus_on).sum();
        if total == 0 {
            continue;
        }
        let shares: Vec<u64> = placements.iter().map(|p| node.memory / total * cpus_on(p)).collect();
        for (p, share) in placements.iter_mut().zip(shares) {
            p.memory += share;
        }
    }
    Ok(placements)
}

/// The allowed CPUs grouped by physical core, cores in (node, CPU) order.
fn cores(topology: &Topology) -> Vec<Vec<u32>> {
    let mut cpus = topology.cpus.clone();
    cpus.sort_by_key(|c| (c.node, c.package, c.core, c.id));
    let mut out: Vec<Vec<u32>> = Vec::new();
    let mut last = None;
    for c in cpus {
        match out.last_mut() {
            Some(group) if last == Some((c.node, c.package, c.core)) => group.push(c.id),
            _ => out.push(vec![c.id]),
        }
        last = Some((c.node, c.package, c.core));
    }
    out
}

/// `items` in `n` consecutive runs whose lengths differ by at most one.
fn split<T: Clone>(items: &[T], n: usize) -> Vec<Vec<T>> {
    let (base, extra) = (items.len() / n, items.len() % n);
    let mut out = Vec::with_capacity(n);
    let mut at = 0;
    for i in 0..n {
        let len = base + usize::from(i < extra);
        out.push(items[at..at + len].to_vec());
        at += len;
    }
    out
}

#[cfg(test)]
mod tests;
