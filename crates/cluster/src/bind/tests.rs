use std::process::{Child, Command, Stdio};

use super::*;
use crate::deploy::{Workers, plan};

fn sleeper(placement: &Placement, mode: MemBind) -> std::io::Result<Child> {
    let mut c = Command::new("sleep");
    c.arg("5").stdout(Stdio::null());
    bind(&mut c, placement, mode).unwrap();
    c.spawn()
}

fn status_field(pid: u32, name: &str) -> String {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status.lines().find_map(|l| l.strip_prefix(name)).unwrap().trim_start_matches(':').trim().to_string()
}

/// The memory policy the kernel reports for the child's stack.
fn stack_policy(pid: u32) -> String {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/numa_maps")).unwrap();
    let line = maps.lines().find(|l| l.contains("stack")).unwrap_or_else(|| panic!("{maps}"));
    line.split_whitespace().nth(1).unwrap().to_string()
}

#[test]
fn a_worker_starts_on_its_cpus_with_its_memory_policy() {
    let t = Topology::detect().unwrap();
    let core = plan(&t, Workers::Core).unwrap();
    for (i, p) in core.iter().enumerate().take(2) {
        check(&t, p).unwrap();
        let mut child = sleeper(p, MemBind::Strict).unwrap();
        let allowed = status_field(child.id(), "Cpus_allowed_list");
        let mems = status_field(child.id(), "Mems_allowed_list");
        let policy = stack_policy(child.id());
        child.kill().unwrap();
        child.wait().unwrap();
        assert_eq!(allowed, format_list(&p.cpus), "worker {i}");
        let mems = crate::topology::parse_list(&mems, std::path::Path::new("status")).unwrap();
        assert!(p.memory_nodes.iter().all(|n| mems.contains(n)), "worker {i}: its nodes {:?} within Mems_allowed_list {mems:?}", p.memory_nodes);
        assert_eq!(policy, format!("bind:{}", format_list(&p.memory_nodes)), "worker {i}");
    }
    // Preferred: the first node, softly.
    let mut child = sleeper(&core[0], MemBind::Preferred).unwrap();
    let policy = stack_policy(child.id());
    child.kill().unwrap();
    child.wait().unwrap();
    assert_eq!(policy, format!("prefer:{}", core[0].memory_nodes[0]));
    // A placement that does not bind memory leaves the default policy.
    let machine = &plan(&t, Workers::Machine).unwrap()[0];
    let mut child = sleeper(machine, MemBind::Strict).unwrap();
    let policy = stack_policy(child.id());
    child.kill().unwrap();
    child.wait().unwrap();
    assert_eq!(policy, "default");
}

#[test]
fn a_node_or_cpu_that_is_not_there_is_refused_before_and_at_spawn() {
    let t = Topology::detect().unwrap();
    let missing_node = t.nodes.iter().map(|n| n.id).max().unwrap() + 1;
    let p = Placement { cpus: vec![t.cpus[0].id], memory_nodes: vec![missing_node], bind_memory: true, memory: 1 << 30 };
    let e = check(&t, &p).unwrap_err();
    assert!(e.to_string().contains(&format!("NUMA node {missing_node} has no memory")), "{e}");
    // Past the check, the kernel refuses it and the spawn fails.
    let e = sleeper(&p, MemBind::Strict).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EINVAL), "{e}");

    let missing_cpu = t.cpus.iter().map(|c| c.id).max().unwrap() + 1;
    let p = Placement { cpus: vec![missing_cpu], memory_nodes: vec![], bind_memory: false, memory: 1 << 30 };
    assert!(check(&t, &p).unwrap_err().to_string().contains(&format!("CPU {missing_cpu} is not one")));
    assert!(sleeper(&p, MemBind::Strict).is_err(), "the kernel refuses a CPU set with no allowed CPU");

    let p = Placement { cpus: vec![1 << 20], memory_nodes: vec![], bind_memory: false, memory: 0 };
    let mut c = Command::new("true");
    assert!(matches!(bind(&mut c, &p, MemBind::Strict), Err(BindError::TooLarge { .. })));
}
