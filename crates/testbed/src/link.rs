//! The `bottleneck` profile's network: a link of limited bandwidth between
//! the compute side (this namespace) and the store side (a network
//! namespace of the testbed's own holding MinIO and, when a benchmark starts
//! one, the storage node), plus a CPU share for store-side processes.
//!
//! FlexPushdownDB's regime is a network slower than the compute behind it,
//! with the storage-side service next to the store. On one machine that is
//! a veth pair into a namespace, shaped in both directions by the kernel's
//! token bucket (`tc … tbf`; this kernel has no `netem`). Traffic between
//! the node and MinIO stays inside the namespace, on its loopback, as it
//! would stay inside a zone. The node's CPU is capped with the cgroup `cpu`
//! controller (v1 `cpu.cfs_quota_us`, or v2 `cpu.max`) so that pushing work
//! down is not free either.
//!
//! Why by hand: `ip` and `tc` are the interface to the kernel; no crate
//! wraps namespaces, veth, tbf and cgroups together.

use std::path::PathBuf;
use std::process::Command;

use crate::error::{Result, TestbedError};

/// Bandwidth of the link in each direction, Mbit/s, unless
/// `BLOBHOUSE_BOTTLENECK_MBIT` says otherwise. Calibrated in
/// docs/pushdown.md: about a quarter of what two cores decode, so that
/// fetching is clearly the slow path, as in the paper's 10 Gbit/s against
/// a 32-core instance.
pub const DEFAULT_LINK_MBIT: u32 = 240;

/// The link of a testbed: names and addresses derived from one number (the
/// MinIO port), so that testbeds in different directories never collide.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Link {
    /// The network namespace of the store side.
    pub namespace: String,
    /// The veth end in this (the compute side's) namespace.
    pub host_if: String,
    /// The veth end inside the namespace.
    pub store_if: String,
    /// The compute side's address on the link.
    pub host_ip: String,
    /// The store side's address: MinIO and the storage node listen here.
    pub store_ip: String,
}

impl Link {
    /// The link of the testbed whose MinIO listens on `port`.
    pub fn for_port(port: u16) -> Link {
        // A /30 inside 10.201.0.0/16 per port (16,384 of them).
        let index = u32::from(port) % 16_384;
        let base = (index * 4) as u16;
        let (c, d) = (base >> 8, base & 0xff);
        Link {
            namespace: format!("blobhouse-store-{port}"),
            host_if: format!("bhc{port}"),
            store_if: format!("bhs{port}"),
            host_ip: format!("10.201.{c}.{}", d + 1),
            store_ip: format!("10.201.{c}.{}", d + 2),
        }
    }

    /// The link's bandwidth in Mbit/s ([`DEFAULT_LINK_MBIT`] or
    /// `BLOBHOUSE_BOTTLENECK_MBIT`).
    pub fn configured_mbit() -> Result<u32> {
        match std::env::var("BLOBHOUSE_BOTTLENECK_MBIT") {
            Err(_) => Ok(DEFAULT_LINK_MBIT),
            Ok(v) => v.parse().ok().filter(|&m: &u32| (1..=100_000).contains(&m)).ok_or_else(|| TestbedError::Tool {
                tool: "BLOBHOUSE_BOTTLENECK_MBIT".into(),
                message: format!("'{v}' is not a bandwidth in Mbit/s between 1 and 100000"),
            }),
        }
    }

    /// Creates the namespace, the veth pair and the shaping (`mbit` each
    /// way). Anything left from an earlier run of the same name goes first.
    pub fn create(&self, mbit: u32) -> Result<()> {
        self.delete();
        let rate = format!("{mbit}mbit");
        // A burst of 1 ms at the rate (at least 64 KiB) keeps the rate
        // smooth at the scale of a request; 50 ms of queue.
        let burst = format!("{}", (mbit as u64 * 1000 / 8).max(64 << 10));
        let ns = self.namespace.as_str();
        let (host_net, store_net) = (format!("{}/30", self.host_ip), format!("{}/30", self.store_ip));
        let steps: Vec<Vec<&str>> = vec![
            vec!["ip", "netns", "add", ns],
            vec!["ip", "link", "add", &self.host_if, "type", "veth", "peer", "name", &self.store_if],
            vec!["ip", "link", "set", &self.store_if, "netns", ns],
            vec!["ip", "addr", "add", &host_net, "dev", &self.host_if],
            vec!["ip", "link", "set", &self.host_if, "up"],
            vec!["ip", "-n", ns, "addr", "add", &store_net, "dev", &self.store_if],
            vec!["ip", "-n", ns, "link", "set", &self.store_if, "up"],
            vec!["ip", "-n", ns, "link", "set", "lo", "up"],
            vec!["tc", "qdisc", "add", "dev", &self.host_if, "root", "tbf", "rate", &rate, "burst", &burst, "latency", "50ms"],
            vec!["ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", &self.store_if, "root", "tbf", "rate", &rate, "burst", &burst, "latency", "50ms"],
        ];
        for step in steps {
            if let Err(e) = run(&step) {
                self.delete();
                return Err(e);
            }
        }
        Ok(())
    }

    /// Removes the namespace (which removes the veth pair) and the CPU
    /// cgroup. Idempotent.
    pub fn delete(&self) {
        let _ = Command::new("ip").args(["netns", "del", &self.namespace]).output();
        let _ = Command::new("ip").args(["link", "del", &self.host_if]).output();
        if let Some(dir) = cgroup_dir(&self.namespace) {
            let _ = std::fs::remove_dir(dir);
        }
    }

    /// Whether the namespace exists.
    pub fn exists(&self) -> bool {
        std::path::Path::new("/run/netns").join(&self.namespace).exists()
    }

    /// A command that runs `program` on the store side of the link.
    pub fn store_side(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.namespace]).arg(program);
        c
    }

    /// Bytes the link has carried since it was created, from the kernel's
    /// qdisc counters: (towards the compute side, towards the store side).
    pub fn bytes_carried(&self) -> Result<(u64, u64)> {
        let sent = |args: &[&str]| -> Result<u64> {
            let out = Command::new(args[0]).args(&args[1..]).output().map_err(|e| TestbedError::Tool { tool: "tc".into(), message: e.to_string() })?;
            let text = String::from_utf8_lossy(&out.stdout);
            parse_sent(&text).ok_or_else(|| TestbedError::Tool { tool: "tc".into(), message: format!("no byte counter in `{}`: {text}", args.join(" ")) })
        };
        let to_compute = sent(&["ip", "netns", "exec", &self.namespace, "tc", "-s", "qdisc", "show", "dev", &self.store_if])?;
        let to_store = sent(&["tc", "-s", "qdisc", "show", "dev", &self.host_if])?;
        Ok((to_compute, to_store))
    }

    /// Caps process `pid` (and its future threads) at `cores` CPUs.
    pub fn limit_cpu(&self, pid: u32, cores: f64) -> Result<()> {
        assert!(cores > 0.0, "a CPU share must be positive");
        let dir = cgroup_dir(&self.namespace).ok_or_else(|| TestbedError::Tool {
            tool: "cgroup".into(),
            message: "no cgroup cpu controller at /sys/fs/cgroup (v1 cpu/ or v2 cgroup.controllers with cpu)".into(),
        })?;
        let io = |e: std::io::Error, what: &str| TestbedError::Tool { tool: "cgroup".into(), message: format!("{what} in {}: {e}", dir.display()) };
        std::fs::create_dir_all(&dir).map_err(|e| io(e, "mkdir"))?;
        let period = 100_000u64;
        let quota = (cores * period as f64).round() as u64;
        if dir.join("cpu.max").exists() {
            std::fs::write(dir.join("cpu.max"), format!("{quota} {period}")).map_err(|e| io(e, "cpu.max"))?;
        } else {
            std::fs::write(dir.join("cpu.cfs_period_us"), period.to_string()).map_err(|e| io(e, "cpu.cfs_period_us"))?;
            std::fs::write(dir.join("cpu.cfs_quota_us"), quota.to_string()).map_err(|e| io(e, "cpu.cfs_quota_us"))?;
        }
        std::fs::write(dir.join("cgroup.procs"), pid.to_string()).map_err(|e| io(e, "cgroup.procs"))?;
        Ok(())
    }
}

/// The cgroup directory for the store side's processes.
fn cgroup_dir(name: &str) -> Option<PathBuf> {
    let v1 = PathBuf::from("/sys/fs/cgroup/cpu");
    if v1.join("cpu.cfs_quota_us").exists() {
        return Some(v1.join(name));
    }
    let v2 = PathBuf::from("/sys/fs/cgroup");
    let controllers = std::fs::read_to_string(v2.join("cgroup.controllers")).ok()?;
    controllers.split_whitespace().any(|c| c == "cpu").then(|| v2.join(name))
}

/// The first "Sent N bytes" of `tc -s qdisc show` output.
fn parse_sent(text: &str) -> Option<u64> {
    text.split("Sent ").nth(1)?.split_whitespace().next()?.parse().ok()
}

fn run(args: &[&str]) -> Result<()> {
    let out = Command::new(args[0]).args(&args[1..]).output().map_err(|e| TestbedError::Tool {
        tool: args[0].into(),
        message: format!("cannot run `{}`: {e} (the bottleneck profile needs iproute2 and root)", args.join(" ")),
    })?;
    if out.status.success() {
        return Ok(());
    }
    Err(TestbedError::Tool {
        tool: args[0].into(),
        message: format!("`{}` failed: {} (the bottleneck profile needs root, network namespaces and tc's tbf)", args.join(" "), String::from_utf8_lossy(&out.stderr).trim()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_addresses_fit_the_kernel_limits_and_do_not_collide() {
        let a = Link::for_port(65_535);
        assert!(a.host_if.len() <= 15 && a.store_if.len() <= 15, "{a:?}");
        let b = Link::for_port(9000);
        assert_ne!(a.store_ip, b.store_ip);
        assert_eq!(Link::for_port(0).host_ip, "10.201.0.1");
        assert_eq!(Link::for_port(0).store_ip, "10.201.0.2");
        assert_eq!(Link::for_port(64).store_ip, "10.201.1.2");
    }

    #[test]
    fn reads_the_byte_counter_of_tc() {
        let out = "qdisc tbf 8001: root refcnt 3 rate 240Mbit burst 30000b lat 50ms \n Sent 1234567 bytes 890 pkt (dropped 0, overlimits 3 requeues 0) \n backlog 0b 0p requeues 0\n";
        assert_eq!(parse_sent(out), Some(1_234_567));
        assert_eq!(parse_sent("qdisc noqueue 0: root"), None);
    }
}
