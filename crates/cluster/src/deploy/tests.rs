use std::path::Path;

use super::*;
use crate::topology::fake::{Machine, status};

fn topology(m: &Machine, cpus: &str, mems: &str) -> Topology {
    let dir = tempfile::tempdir().unwrap();
    Topology::read(&m.write(dir.path()), &status(cpus, mems), Path::new("/nonexistent")).unwrap()
}

fn lines(placements: &[Placement]) -> Vec<String> {
    placements.iter().map(ToString::to_string).collect()
}

#[test]
fn modes_parse_and_bad_ones_say_what_is_expected() {
    assert_eq!("machine".parse::<Workers>().unwrap(), Workers::Machine);
    assert_eq!(" NUMA ".parse::<Workers>().unwrap(), Workers::Numa);
    assert_eq!("core".parse::<Workers>().unwrap(), Workers::Core);
    assert_eq!("4".parse::<Workers>().unwrap(), Workers::Count(4));
    let e = "sockets".parse::<Workers>().unwrap_err().to_string();
    assert!(e.contains("machine, numa, core or a number"), "{e}");
}

#[test]
fn two_sockets_of_sixteen_cores_with_hyper_threads() {
    let t = topology(&Machine::sockets(2, 16, 2, 64 << 20), "0-63", "0-1");
    assert_eq!(lines(&plan(&t, Workers::Machine).unwrap()), vec!["cpus 0-63 memory 131072 MiB (first touch on 0-1)"]);
    assert_eq!(lines(&plan(&t, Workers::Numa).unwrap()), vec!["cpus 0-15,32-47 membind 0 memory 65536 MiB", "cpus 16-31,48-63 membind 1 memory 65536 MiB"]);
    let cores = plan(&t, Workers::Core).unwrap();
    assert_eq!(cores.len(), 32, "one worker per physical core, not per thread");
    assert_eq!(cores[0].to_string(), "cpus 0,32 membind 0 memory 4096 MiB");
    assert_eq!(cores[31].to_string(), "cpus 31,63 membind 1 memory 4096 MiB");
    assert_eq!(
        lines(&plan(&t, Workers::Count(4)).unwrap()),
        vec!["cpus 0-7,32-39 membind 0 memory 32768 MiB", "cpus 8-15,40-47 membind 0 memory 32768 MiB", "cpus 16-23,48-55 membind 1 memory 32768 MiB", "cpus 24-31,56-63 membind 1 memory 32768 MiB"]
    );
    // Three workers over 32 cores: the middle one spans both sockets.
    let three = plan(&t, Workers::Count(3)).unwrap();
    assert_eq!(three.iter().map(|p| p.cpus.len()).collect::<Vec<_>>(), vec![22, 22, 20]);
    assert_eq!(three[1].memory_nodes, vec![0, 1]);
    // More workers than cores: threads.
    let many = plan(&t, Workers::Count(64)).unwrap();
    assert!(many.iter().all(|p| p.cpus.len() == 1));
    assert_eq!(plan(&t, Workers::Count(65)), Err(DeployError::TooMany { asked: 65, cpus: 64 }));
    assert_eq!(plan(&t, Workers::Count(0)), Err(DeployError::NoWorkers));
}

#[test]
fn every_cpu_is_in_exactly_one_worker_and_memory_is_not_over_given() {
    let t = topology(&Machine::sockets(2, 16, 2, 64 << 20), "0-63", "0-1");
    for workers in [Workers::Machine, Workers::Numa, Workers::Core, Workers::Count(1), Workers::Count(3), Workers::Count(5), Workers::Count(40)] {
        let p = plan(&t, workers).unwrap();
        let mut cpus: Vec<u32> = p.iter().flat_map(|w| w.cpus.clone()).collect();
        cpus.sort_unstable();
        assert_eq!(cpus, (0..64).collect::<Vec<_>>(), "{workers:?}");
        let memory: u64 = p.iter().map(|w| w.memory).sum();
        assert!(memory <= 128 << 30 && memory > 127 << 30, "{workers:?}: {memory}");
    }
}

#[test]
fn four_nodes_on_one_socket() {
    // AMD's NPS4: one package, four nodes of eight cores, 12 between nodes.
    let mut m = Machine::sockets(1, 32, 1, 0);
    m.nodes = (0..4).map(|n| (n, (n * 8..n * 8 + 8).collect(), 32 << 20)).collect();
    m.distances = Some((0..4).map(|a| (0..4).map(|b| if a == b { 10 } else { 12 }).collect()).collect());
    let t = topology(&m, "0-31", "0-3");
    assert_eq!(lines(&plan(&t, Workers::Numa).unwrap()), vec!["cpus 0-7 membind 0 memory 32768 MiB", "cpus 8-15 membind 1 memory 32768 MiB", "cpus 16-23 membind 2 memory 32768 MiB", "cpus 24-31 membind 3 memory 32768 MiB"]);
}

#[test]
fn memory_only_and_cpu_only_nodes() {
    // Nodes 0 and 1 with CPUs; node 1 has no memory; node 2 memory only (CXL).
    let mut m = Machine::sockets(2, 4, 1, 32 << 20);
    m.nodes[1].2 = 0;
    m.nodes.push((2, vec![], 128 << 20));
    m.distances = Some(vec![vec![10, 21, 14], vec![21, 10, 17], vec![14, 17, 10]]);
    let t = topology(&m, "0-7", "0-2");
    assert_eq!(lines(&plan(&t, Workers::Numa).unwrap()), vec!["cpus 0-3 membind 0 memory 32768 MiB", "cpus 4-7 membind 2 memory 131072 MiB"], "node 1 takes its nearest memory, node 2's");
    assert_eq!(lines(&plan(&t, Workers::Machine).unwrap()), vec!["cpus 0-7 memory 163840 MiB (first touch on 0,2)"]);
    // No memory the process may use near node 1 but its own, which it has not.
    let t = topology(&m, "4-7", "1");
    assert_eq!(plan(&t, Workers::Numa), Err(DeployError::NoMemory { node: 1 }));
}

#[test]
fn a_container_gets_workers_on_its_cpus_only() {
    let t = topology(&Machine::sockets(2, 16, 2, 64 << 20), "4-7,36-39", "0");
    assert_eq!(lines(&plan(&t, Workers::Numa).unwrap()), vec!["cpus 4-7,36-39 membind 0 memory 65536 MiB"]);
    assert_eq!(lines(&plan(&t, Workers::Core).unwrap())[0], "cpus 4,36 membind 0 memory 16384 MiB");
    assert_eq!(plan(&t, Workers::Core).unwrap().len(), 4);
}
