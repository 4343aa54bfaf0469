//! The process as the kernel sees it: its resident set and peak, and the
//! allocator's thresholds that decide what of the freed memory stays
//! resident. Apart from the engine's budget (the parent module), which
//! counts what operators reserve, not what the process holds.

/// The process's memory as the kernel sees it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProcessMemory {
    /// Resident set size now (VmRSS).
    pub rss: u64,
    /// Peak resident set size since the process started or the last
    /// [`reset_peak_rss`] (VmHWM).
    pub peak_rss: u64,
}

/// Reads the resident set and its peak from /proc/self/status; `None` where
/// there is no such file (not Linux).
pub fn process_memory() -> Option<ProcessMemory> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let field = |name: &str| -> Option<u64> {
        let line = status.lines().find(|l| l.starts_with(name))?;
        let kib: u64 = line[name.len()..].trim().trim_end_matches("kB").trim().parse().ok()?;
        Some(kib * 1024)
    };
    Some(ProcessMemory { rss: field("VmRSS:")?, peak_rss: field("VmHWM:")? })
}

/// Resets the kernel's peak resident set (VmHWM) to the current one, so the
/// next [`process_memory`] reports the peak of what ran since. Returns
/// false where the kernel does not support it. The peak is per process:
/// statements running at the same time share it.
pub fn reset_peak_rss() -> bool {
    // "5" resets the peak RSS (Documentation/filesystems/proc.rst, clear_refs).
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

/// Makes the allocator give freed memory back to the kernel at once, for a
/// process that should hold as little as possible between queries (one
/// beside other memory-hungry processes); the CLI calls it when
/// `BLOBHOUSE_RETURN_FREED_MEMORY=1`. Returns whether it changed anything.
///
/// Why it is not the default: glibc adapts its thresholds as a program
/// runs. Once a query has freed a large buffer, allocations up to 32 MiB
/// come from the per-thread arenas and each arena keeps up to twice that
/// free at its top — which `malloc_trim` never releases. At TPC-H SF 10 on
/// two cores that left 250–450 MiB resident between queries, counted in
/// every later query's peak (Q22 peaked at 465 MiB after Q21, 185 MiB in a
/// fresh process). Fixing the mmap threshold at the adaptive maximum and
/// the trim threshold at 8 MiB halves the peaks of queries in a warm
/// process, but each query then faults its buffers in afresh: 7 % slower
/// at SF 10 and 13 % at SF 1 in one process (one-shot processes: no
/// difference). Measured in `docs/notes/2026-11-27-issue43-scaling.md`
/// ("Fourth session").
///
/// Leaves the allocator alone where the user tuned it (`GLIBC_TUNABLES`
/// names a malloc setting) and where the allocator is not glibc's.
pub fn configure_allocator() -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        if std::env::var("GLIBC_TUNABLES").is_ok_and(|t| t.contains("glibc.malloc.")) {
            return false;
        }
        // SAFETY: mallopt only sets the allocator's parameters; called
        // before the runtime's threads exist.
        unsafe { libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1 && libc::mallopt(libc::M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1 }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    false
}

/// glibc's adaptive maximum for 64-bit (`DEFAULT_MMAP_THRESHOLD_MAX`).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const MMAP_THRESHOLD: libc::c_int = 32 << 20;
/// Free memory an arena may keep at its top.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const TRIM_THRESHOLD: libc::c_int = 8 << 20;
