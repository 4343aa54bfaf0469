//! Binding a worker process to its [`Placement`]: its CPUs with
//! `sched_setaffinity`, its memory with `set_mempolicy`, both applied in
//! the child between fork and exec, so every thread the worker starts
//! inherits them and none of its memory is allocated before.
//!
//! Why by hand: `set_mempolicy` has no glibc wrapper (it lives in libnuma,
//! which is not installed everywhere), `libc` has the raw syscall; crates
//! that pin threads (`core_affinity`, `nix`) do not set memory policy
//! (../shared/research/scaleout.md §3).

use std::os::unix::process::CommandExt;
use std::process::Command;

use crate::deploy::Placement;
use crate::topology::{Topology, format_list};

/// How strictly a worker's memory stays on its nodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MemBind {
    /// Only its nodes (`MPOL_BIND`): the kernel never falls back, so a
    /// worker that outgrows its nodes is killed — its budget comes from
    /// its nodes' memory for that reason.
    #[default]
    Strict,
    /// Its first node first, others when that is full (`MPOL_PREFERRED`).
    Preferred,
}

/// Why a worker cannot be bound.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum BindError {
    #[error("CPU {cpu} is not one this process may use (allowed: {allowed}); check --workers and the container's cpuset")]
    Cpu { cpu: u32, allowed: String },
    #[error("NUMA node {node} has no memory this process may use (nodes with memory: {allowed})")]
    Node { node: u32, allowed: String },
    #[error("CPU {cpu} or NUMA node {node} is beyond what the binding supports ({limit})")]
    TooLarge { cpu: u32, node: u32, limit: u32 },
}

/// Node masks cover this many nodes (the kernel's usual `MAX_NUMNODES`
/// is 1024 at most).
const MAX_NODES: u32 = 1024;
const WORDS: usize = MAX_NODES as usize / 64;

/// Checks `placement` against `topology`: every CPU and memory node must be
/// one this process may use, or binding would fail in the child, where the
/// error can say less.
pub fn check(topology: &Topology, placement: &Placement) -> Result<(), BindError> {
    let cpus: Vec<u32> = topology.cpus.iter().map(|c| c.id).collect();
    if let Some(&cpu) = placement.cpus.iter().find(|c| !cpus.contains(c)) {
        return Err(BindError::Cpu { cpu, allowed: format_list(&cpus) });
    }
    let nodes: Vec<u32> = topology.nodes.iter().filter(|n| n.memory_allowed).map(|n| n.id).collect();
    if let Some(&node) = placement.memory_nodes.iter().find(|n| !nodes.contains(n)) {
        return Err(BindError::Node { node, allowed: format_list(&nodes) });
    }
    Ok(())
}

/// Makes `command` start bound to `placement` (its CPUs always; its memory
/// nodes when the placement binds memory, as `mode` says). Spawning fails
/// with the kernel's error when the binding is refused.
pub fn bind(command: &mut Command, placement: &Placement, mode: MemBind) -> Result<(), BindError> {
    let max_cpu = placement.cpus.iter().copied().max().unwrap_or(0);
    let max_node = placement.memory_nodes.iter().copied().max().unwrap_or(0);
    if max_cpu as usize >= libc::CPU_SETSIZE as usize || max_node >= MAX_NODES {
        return Err(BindError::TooLarge { cpu: max_cpu, node: max_node, limit: libc::CPU_SETSIZE as u32 });
    }
    // Built before the fork: between fork and exec only system calls run.
    // SAFETY: a zeroed cpu_set_t is the empty set; CPU_SET writes within it
    // (checked against CPU_SETSIZE above).
    let mut cpus: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for &cpu in &placement.cpus {
        unsafe { libc::CPU_SET(cpu as usize, &mut cpus) };
    }
    let mut nodes = [0 as libc::c_ulong; WORDS];
    let chosen: Vec<u32> = match mode {
        MemBind::Strict => placement.memory_nodes.clone(),
        MemBind::Preferred => placement.memory_nodes.iter().take(1).copied().collect(),
    };
    for &node in &chosen {
        nodes[node as usize / 64] |= 1 << (node % 64);
    }
    let policy = match mode {
        MemBind::Strict => libc::MPOL_BIND,
        MemBind::Preferred => libc::MPOL_PREFERRED,
    };
    let bind_memory = placement.bind_memory && !chosen.is_empty();
    let bind_cpus = !placement.cpus.is_empty();
    // SAFETY: the closure only makes two system calls on memory it owns.
    unsafe {
        command.pre_exec(move || {
            if bind_cpus && libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &cpus) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // The kernel reads maxnode - 1 bits, as libnuma passes them.
            if bind_memory && libc::syscall(libc::SYS_set_mempolicy, policy, nodes.as_ptr(), MAX_NODES as libc::c_ulong + 1) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests;
