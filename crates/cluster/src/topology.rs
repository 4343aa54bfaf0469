//! The machine's NUMA nodes, CPUs and memory, read from sysfs.
//!
//! What a deployment needs to know: which CPUs and how much memory each
//! NUMA node has, which CPUs are threads of one physical core, and which of
//! them this process may use at all (a container's cpuset, `taskset`):
//! binding a worker outside the allowed set fails in the kernel, so the
//! topology is the machine's intersected with the allowed CPUs and memory
//! nodes of `/proc/self/status`.
//!
//! Why by hand: the maintained hwloc binding (`hwlocality`) is an alpha
//! that needs libhwloc ≥ 2.0.4 installed, the other crates are unmaintained
//! or pin threads only (../shared/research/scaleout.md §3), and the few
//! files read here are the kernel's stable ABI
//! (Documentation/ABI/stable/sysfs-devices-node, sysfs-devices-system-cpu).
//! The sysfs root is a parameter, so every layout is tested on any machine
//! from a tree the tests write.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Why the topology could not be read.
#[derive(Debug, thiserror::Error)]
pub enum TopologyError {
    #[error("reading {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("{path}: cannot parse {text:?} as {what}")]
    Parse { path: PathBuf, text: String, what: &'static str },
    #[error("no CPU is both online and allowed for this process (allowed: {allowed}); check the container's cpuset or taskset")]
    NoCpus { allowed: String },
}

/// One CPU (a hardware thread) this process may run on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CpuInfo {
    pub id: u32,
    /// The NUMA node it belongs to.
    pub node: u32,
    /// Its socket (`physical_package_id`).
    pub package: u32,
    /// Its physical core: the lowest CPU among its thread siblings, which
    /// names the core uniquely across packages (`core_id` repeats per package).
    pub core: u32,
}

/// A NUMA node as this process may use it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Node {
    pub id: u32,
    /// Its allowed CPUs, ascending (empty for a memory-only node).
    pub cpus: Vec<u32>,
    /// Its memory (`MemTotal`), in bytes; 0 for a CPU-only node.
    pub memory: u64,
    /// Whether this process may allocate on it (`Mems_allowed_list`).
    pub memory_allowed: bool,
    /// Distances to every node, by node id (10 is local), when the kernel
    /// gives them.
    pub distances: BTreeMap<u32, u32>,
}

/// The machine, limited to what this process may use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Topology {
    /// Every online node with allowed CPUs or allowed memory, by id.
    pub nodes: Vec<Node>,
    /// Every online, allowed CPU, ascending.
    pub cpus: Vec<CpuInfo>,
}

impl Topology {
    /// This machine's topology, for this process.
    pub fn detect() -> Result<Topology, TopologyError> {
        let status = read(Path::new("/proc/self/status"))?;
        Topology::read(Path::new("/sys/devices/system"), &status, Path::new("/proc/meminfo"))
    }

    /// The topology under `sysfs` (what `/sys/devices/system` holds), for a
    /// process whose `/proc/<pid>/status` is `status`. `meminfo` (a
    /// `/proc/meminfo`) gives the memory of a kernel without NUMA, which has
    /// no `node` directory: then the machine is one node, 0.
    pub fn read(sysfs: &Path, status: &str, meminfo: &Path) -> Result<Topology, TopologyError> {
        let status_path = PathBuf::from("/proc/self/status");
        let field = |name: &str| status.lines().find_map(|l| l.strip_prefix(name).map(|v| v.trim_start_matches(':').trim().to_string()));
        let allowed_cpus = match field("Cpus_allowed_list") {
            Some(text) => Some(parse_list(&text, &status_path)?),
            None => None,
        };
        let allowed_mems = match field("Mems_allowed_list") {
            Some(text) => Some(parse_list(&text, &status_path)?),
            None => None,
        };
        let cpu_dir = sysfs.join("cpu");
        let online = parse_list(&read(&cpu_dir.join("online"))?, &cpu_dir.join("online"))?;
        let usable: Vec<u32> = online.into_iter().filter(|c| allowed_cpus.as_ref().is_none_or(|a| a.contains(c))).collect();
        if usable.is_empty() {
            return Err(TopologyError::NoCpus { allowed: field("Cpus_allowed_list").unwrap_or_else(|| "all".into()) });
        }

        // Nodes: their CPUs, memory and distances; one node 0 without NUMA.
        let node_dir = sysfs.join("node");
        let mut nodes = Vec::new();
        match node_dir.join("online").exists() {
            true => {
                let ids = parse_list(&read(&node_dir.join("online"))?, &node_dir.join("online"))?;
                for id in ids {
                    let dir = node_dir.join(format!("node{id}"));
                    let cpus: Vec<u32> = parse_list(&read(&dir.join("cpulist"))?, &dir.join("cpulist"))?.into_iter().filter(|c| usable.contains(c)).collect();
                    let memory = node_memory(&dir.join("meminfo"))?;
                    let memory_allowed = memory > 0 && allowed_mems.as_ref().is_none_or(|m| m.contains(&id));
                    let distances = match read(&dir.join("distance")) {
                        Ok(text) => parse_distances(&text, &ids_of(&node_dir)?, &dir.join("distance"))?,
                        Err(_) => BTreeMap::new(),
                    };
                    if !cpus.is_empty() || memory_allowed {
                        nodes.push(Node { id, cpus, memory, memory_allowed, distances });
                    }
                }
            }
            false => {
                let memory = machine_memory(meminfo)?;
                nodes.push(Node { id: 0, cpus: usable.clone(), memory, memory_allowed: true, distances: BTreeMap::from([(0, 10)]) });
            }
        }

        let mut cpus = Vec::new();
        for &id in &usable {
            let node = nodes.iter().find(|n| n.cpus.contains(&id)).map_or(0, |n| n.id);
            let topo = cpu_dir.join(format!("cpu{id}/topology"));
            let package = match read(&topo.join("physical_package_id")) {
                Ok(text) => parse_number(&text, &topo.join("physical_package_id"))?,
                Err(_) => 0,
            };
            let core = match read(&topo.join("thread_siblings_list")) {
                Ok(text) => parse_list(&text, &topo.join("thread_siblings_list"))?.into_iter().min().unwrap_or(id),
                Err(_) => id,
            };
            cpus.push(CpuInfo { id, node, package, core });
        }
        Ok(Topology { nodes, cpus })
    }

    /// The node of id `id`.
    pub fn node(&self, id: u32) -> Option<&Node> {
        self.nodes.iter().find(|n| n.id == id)
    }

    /// Nodes with allowed CPUs.
    pub fn cpu_nodes(&self) -> impl Iterator<Item = &Node> {
        self.nodes.iter().filter(|n| !n.cpus.is_empty())
    }

    /// The allowed memory node nearest to `node` (itself when it has
    /// allowed memory; else the smallest distance, then the lowest id).
    pub fn nearest_memory(&self, node: u32) -> Option<u32> {
        let from = self.node(node)?;
        self.nodes
            .iter()
            .filter(|n| n.memory_allowed)
            .min_by_key(|n| (if n.id == node { 0 } else { from.distances.get(&n.id).copied().unwrap_or(u32::MAX) }, n.id))
            .map(|n| n.id)
    }
}

fn read(path: &Path) -> Result<String, TopologyError> {
    std::fs::read_to_string(path).map_err(|source| TopologyError::Read { path: path.to_path_buf(), source })
}

fn ids_of(node_dir: &Path) -> Result<Vec<u32>, TopologyError> {
    let path = node_dir.join("possible");
    match read(&path) {
        Ok(text) => parse_list(&text, &path),
        Err(_) => parse_list(&read(&node_dir.join("online"))?, &node_dir.join("online")),
    }
}

fn parse_number(text: &str, path: &Path) -> Result<u32, TopologyError> {
    text.trim().parse().map_err(|_| TopologyError::Parse { path: path.to_path_buf(), text: text.trim().to_string(), what: "a number" })
}

/// A kernel CPU or node list: `0-3,8,10-11`; empty for none.
pub fn parse_list(text: &str, path: &Path) -> Result<Vec<u32>, TopologyError> {
    let bad = || TopologyError::Parse { path: path.to_path_buf(), text: text.trim().to_string(), what: "a list like 0-3,8" };
    let mut out = Vec::new();
    for part in text.trim().split(',').map(str::trim).filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (u32, u32) = (a.trim().parse().map_err(|_| bad())?, b.trim().parse().map_err(|_| bad())?);
                if a > b || b - a > 1 << 16 {
                    return Err(bad());
                }
                out.extend(a..=b);
            }
            None => out.push(part.parse().map_err(|_| bad())?),
        }
    }
    out.sort_unstable();
    out.dedup();
    Ok(out)
}

/// A list as the kernel writes it (`0-3,8`).
pub fn format_list(ids: &[u32]) -> String {
    let mut sorted = ids.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    let mut parts = Vec::new();
    let mut i = 0;
    while i < sorted.len() {
        let start = sorted[i];
        while i + 1 < sorted.len() && sorted[i + 1] == sorted[i] + 1 {
            i += 1;
        }
        parts.push(if sorted[i] == start { start.to_string() } else { format!("{start}-{}", sorted[i]) });
        i += 1;
    }
    parts.join(",")
}

/// `Node N MemTotal: K kB` of a node's meminfo, in bytes; 0 without one.
fn node_memory(path: &Path) -> Result<u64, TopologyError> {
    let Ok(text) = std::fs::read_to_string(path) else { return Ok(0) };
    kib_field(&text, "MemTotal:", path).map(|k| k.unwrap_or(0))
}

fn machine_memory(path: &Path) -> Result<u64, TopologyError> {
    let text = read(path)?;
    kib_field(&text, "MemTotal:", path)?.ok_or_else(|| TopologyError::Parse { path: path.to_path_buf(), text: String::new(), what: "a MemTotal line" })
}

fn kib_field(text: &str, name: &str, path: &Path) -> Result<Option<u64>, TopologyError> {
    let Some(line) = text.lines().find(|l| l.contains(name)) else { return Ok(None) };
    let bad = || TopologyError::Parse { path: path.to_path_buf(), text: line.to_string(), what: "MemTotal: <n> kB" };
    let value = line.split(name).nth(1).ok_or_else(bad)?.split_whitespace().next().ok_or_else(bad)?;
    value.parse::<u64>().map(|k| Some(k * 1024)).map_err(|_| bad())
}

/// A node's `distance` file: one distance per possible node, in order.
fn parse_distances(text: &str, ids: &[u32], path: &Path) -> Result<BTreeMap<u32, u32>, TopologyError> {
    let values: Vec<u32> = text.split_whitespace().map(|v| parse_number(v, path)).collect::<Result<_, _>>()?;
    if values.len() != ids.len() {
        return Err(TopologyError::Parse { path: path.to_path_buf(), text: text.trim().to_string(), what: "one distance per node" });
    }
    Ok(ids.iter().copied().zip(values).collect())
}

#[cfg(test)]
pub(crate) mod fake;
#[cfg(test)]
mod tests;
