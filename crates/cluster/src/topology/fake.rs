//! Sysfs trees of machines this one is not, written by the tests.

use std::path::{Path, PathBuf};

/// A machine to write as sysfs.
pub struct Machine {
    /// (node id, its CPUs, its memory in KiB).
    pub nodes: Vec<(u32, Vec<u32>, u64)>,
    /// (CPU, package, its thread siblings) for every CPU present.
    pub cpus: Vec<(u32, u32, Vec<u32>)>,
    /// The online CPUs (default: all present).
    pub online: Option<Vec<u32>>,
    /// `distance` rows, one per node in `nodes` order (default: 10 local, 20 remote).
    pub distances: Option<Vec<Vec<u32>>>,
}

impl Machine {
    /// `sockets` packages of `cores` cores with `threads` threads each, one
    /// node per package, `kib` of memory per node. CPUs are numbered as
    /// Linux does on x86: first every core's first thread, then the second.
    pub fn sockets(sockets: u32, cores: u32, threads: u32, kib: u64) -> Machine {
        let per_thread = sockets * cores;
        let cpu = |s: u32, c: u32, t: u32| t * per_thread + s * cores + c;
        let mut nodes = Vec::new();
        let mut cpus = Vec::new();
        for s in 0..sockets {
            let mut on_node = Vec::new();
            for c in 0..cores {
                let siblings: Vec<u32> = (0..threads).map(|t| cpu(s, c, t)).collect();
                for t in 0..threads {
                    cpus.push((cpu(s, c, t), s, siblings.clone()));
                    on_node.push(cpu(s, c, t));
                }
            }
            on_node.sort_unstable();
            nodes.push((s, on_node, kib));
        }
        cpus.sort_unstable();
        Machine { nodes, cpus, online: None, distances: None }
    }

    /// Writes the tree under `root` (as `/sys/devices/system`).
    pub fn write(&self, root: &Path) -> PathBuf {
        let list = |ids: &[u32]| crate::topology::format_list(ids);
        let put = |path: PathBuf, text: String| {
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text + "\n").unwrap();
        };
        let present: Vec<u32> = self.cpus.iter().map(|c| c.0).collect();
        put(root.join("cpu/online"), list(self.online.as_deref().unwrap_or(&present)));
        put(root.join("cpu/present"), list(&present));
        for (id, package, siblings) in &self.cpus {
            let t = root.join(format!("cpu/cpu{id}/topology"));
            put(t.join("physical_package_id"), package.to_string());
            put(t.join("thread_siblings_list"), list(siblings));
        }
        let ids: Vec<u32> = self.nodes.iter().map(|n| n.0).collect();
        put(root.join("node/online"), list(&ids));
        put(root.join("node/possible"), list(&ids));
        for (i, (id, cpus, kib)) in self.nodes.iter().enumerate() {
            let d = root.join(format!("node/node{id}"));
            put(d.join("cpulist"), list(cpus));
            put(d.join("meminfo"), format!("Node {id} MemTotal:       {kib} kB\nNode {id} MemFree:        {} kB", kib / 2));
            let row: Vec<String> = match &self.distances {
                Some(rows) => rows[i].iter().map(u32::to_string).collect(),
                None => ids.iter().map(|o| if o == id { "10".into() } else { "20".into() }).collect(),
            };
            put(d.join("distance"), row.join(" "));
        }
        root.to_path_buf()
    }
}

/// A `/proc/<pid>/status` with these allowed CPUs and memory nodes.
pub fn status(cpus: &str, mems: &str) -> String {
    format!("Name:\tblobhouse\nState:\tR (running)\nCpus_allowed:\tffff\nCpus_allowed_list:\t{cpus}\nMems_allowed:\t1\nMems_allowed_list:\t{mems}\nvoluntary_ctxt_switches:\t1\n")
}
