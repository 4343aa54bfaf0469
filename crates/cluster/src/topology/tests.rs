use std::path::Path;

use super::fake::{Machine, status};
use super::*;

fn read_machine(m: &Machine, status_text: &str) -> Result<Topology, TopologyError> {
    let dir = tempfile::tempdir().unwrap();
    let root = m.write(dir.path());
    Topology::read(&root, status_text, Path::new("/nonexistent/meminfo"))
}

#[test]
fn lists_parse_and_print_as_the_kernel_writes_them() {
    let p = Path::new("cpulist");
    assert_eq!(parse_list("0-3,8,10-11\n", p).unwrap(), vec![0, 1, 2, 3, 8, 10, 11]);
    assert_eq!(parse_list("\n", p).unwrap(), Vec::<u32>::new());
    assert_eq!(parse_list("5", p).unwrap(), vec![5]);
    assert_eq!(format_list(&[0, 1, 2, 3, 8, 10, 11]), "0-3,8,10-11");
    assert_eq!(format_list(&[]), "");
    for bad in ["0-", "a", "3-1", "1,,x", "0-99999999"] {
        let e = parse_list(bad, p).unwrap_err().to_string();
        assert!(e.starts_with("cpulist: cannot parse"), "{bad}: {e}");
    }
}

#[test]
fn two_sockets_with_hyper_threads() {
    let t = read_machine(&Machine::sockets(2, 16, 2, 64 << 20), &status("0-63", "0-1")).unwrap();
    assert_eq!(t.nodes.len(), 2);
    assert_eq!(format_list(&t.nodes[0].cpus), "0-15,32-47");
    assert_eq!(format_list(&t.nodes[1].cpus), "16-31,48-63");
    assert_eq!(t.nodes[1].memory, 64 << 30);
    assert_eq!(t.nodes[0].distances, BTreeMap::from([(0, 10), (1, 20)]));
    let cpu = |id: u32| t.cpus.iter().find(|c| c.id == id).unwrap().clone();
    assert_eq!(cpu(32), CpuInfo { id: 32, node: 0, package: 0, core: 0 }, "CPU 32 is core 0's second thread");
    assert_eq!(cpu(63), CpuInfo { id: 63, node: 1, package: 1, core: 31 });
}

#[test]
fn a_cpuset_and_offline_cpus_limit_what_is_used() {
    // A container on four cores of socket 0 (both threads), memory of node 0 only.
    let t = read_machine(&Machine::sockets(2, 16, 2, 64 << 20), &status("4-7,36-39", "0")).unwrap();
    assert_eq!(t.nodes.len(), 1, "node 1: no allowed CPU, memory not allowed");
    assert_eq!(format_list(&t.nodes[0].cpus), "4-7,36-39");
    assert_eq!(t.cpus.len(), 8);

    let mut m = Machine::sockets(1, 8, 1, 16 << 20);
    m.online = Some(vec![0, 1, 2, 3, 4, 5, 7]);
    let t = read_machine(&m, &status("0-7", "0")).unwrap();
    assert_eq!(t.cpus.iter().map(|c| c.id).collect::<Vec<_>>(), vec![0, 1, 2, 3, 4, 5, 7], "CPU 6 is offline");

    let e = read_machine(&Machine::sockets(1, 2, 1, 1 << 20), &status("8-9", "0")).unwrap_err();
    assert!(e.to_string().contains("no CPU is both online and allowed") && e.to_string().contains("8-9"), "{e}");
}

#[test]
fn a_memory_only_node_has_memory_and_no_cpus() {
    let mut m = Machine::sockets(2, 4, 1, 32 << 20);
    m.nodes.push((2, vec![], 128 << 20));
    m.distances = Some(vec![vec![10, 21, 14], vec![21, 10, 24], vec![14, 24, 10]]);
    let t = read_machine(&m, &status("0-7", "0-2")).unwrap();
    let far = t.node(2).unwrap();
    assert!(far.cpus.is_empty() && far.memory_allowed && far.memory == 128 << 30);
    assert_eq!(t.cpu_nodes().count(), 2);
    assert_eq!(t.nearest_memory(1), Some(1));
}

#[test]
fn a_kernel_without_numa_is_one_node_with_the_machines_memory() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    std::fs::create_dir_all(root.join("cpu")).unwrap();
    std::fs::write(root.join("cpu/online"), "0-3\n").unwrap();
    let meminfo = root.join("meminfo");
    std::fs::write(&meminfo, "MemTotal:       8000000 kB\nMemFree:        1 kB\n").unwrap();
    let t = Topology::read(root, &status("0-3", "0"), &meminfo).unwrap();
    assert_eq!(t.nodes, vec![Node { id: 0, cpus: vec![0, 1, 2, 3], memory: 8_000_000 * 1024, memory_allowed: true, distances: BTreeMap::from([(0, 10)]) }]);
    assert!(t.cpus.iter().all(|c| c.core == c.id && c.package == 0), "no topology files: each CPU its own core");
}

#[test]
fn an_unreadable_file_is_named_in_the_error() {
    let dir = tempfile::tempdir().unwrap();
    let m = Machine::sockets(1, 2, 1, 1 << 20);
    let root = m.write(dir.path());
    std::fs::write(root.join("node/node0/cpulist"), "zero\n").unwrap();
    let e = Topology::read(&root, &status("0-1", "0"), Path::new("/nonexistent")).unwrap_err().to_string();
    assert!(e.contains("node/node0/cpulist") && e.contains("\"zero\""), "{e}");
}

#[test]
fn this_machine_reads_within_what_this_process_may_use() {
    let t = Topology::detect().unwrap();
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let allowed = status.lines().find_map(|l| l.strip_prefix("Cpus_allowed_list:")).unwrap();
    let allowed = parse_list(allowed, Path::new("status")).unwrap();
    assert!(!t.cpus.is_empty());
    assert!(t.cpus.iter().all(|c| allowed.contains(&c.id)), "{t:?} against {allowed:?}");
    assert!(t.nodes.iter().any(|n| n.memory > 0 && n.memory_allowed), "{t:?}");
}
