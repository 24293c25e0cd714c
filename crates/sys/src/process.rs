//! How the process takes memory from the kernel and answers signals.

/// The environment variable that keeps transparent huge pages on (any
/// value; it is also the allocator's own switch for them).
pub const KEEP_HUGE_PAGES: &str = "MIMALLOC_ALLOW_THP";

/// Back the heap with ordinary 4 KiB pages, not transparent huge pages,
/// unless `MIMALLOC_ALLOW_THP` is set.
///
/// The operator's heap is many small JSON trees made and dropped on every
/// watch event and write. Where the kernel backs it with huge pages, the
/// resident set counts each 2 MiB page the heap touches at all, and memory
/// the allocator hands back and takes again is faulted in and zeroed 2 MiB
/// at a time. Measured with `runbook bench --only memory`: an operator
/// caching 10,000 targets and their children 75-77 MB resident against
/// 90-97 MB with huge pages, its relist peak 115-117 MB against 143-152
/// (the live heap 48 MB either way). Called first thing, before the heap
/// grows; the setting is per process and passes to processes started from
/// it (hooks the benchmarks run).
pub fn prefer_small_pages() {
    if std::env::var_os(KEEP_HUGE_PAGES).is_some() {
        return;
    }
    #[cfg(target_os = "linux")]
    // SAFETY: PR_SET_THP_DISABLE takes plain integers and touches no
    // memory of this process; its result is only informative (a kernel
    // without it leaves the process as it was).
    #[allow(unsafe_code)]
    unsafe {
        libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0);
    }
}

/// Let a closed pipe on stdout end the process quietly, as it ends `cat`
/// or `grep`: `runbook simulate ... | head -1` stops when `head` has read
/// its line, instead of failing its next write (Rust ignores SIGPIPE, so
/// printing panics with "Broken pipe"). Only for commands that print and
/// exit: a server keeps ignoring it, so a client that hangs up costs it
/// an error on that connection, not its life.
pub fn end_quietly_on_closed_pipe() {
    #[cfg(unix)]
    // SAFETY: restoring SIGPIPE's default disposition takes plain integers
    // and installs no handler of this process.
    #[allow(unsafe_code)]
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    /// What the kernel says of this process: `THP_enabled` is 0 once
    /// huge pages are turned off for it.
    fn huge_pages_allowed() -> Option<bool> {
        let status = std::fs::read_to_string("/proc/self/status").ok()?;
        let line = status
            .lines()
            .find_map(|l| l.strip_prefix("THP_enabled:"))?;
        Some(line.trim() != "0")
    }

    #[test]
    fn the_heap_is_kept_off_huge_pages_unless_the_allocator_switch_is_set() {
        prefer_small_pages();
        let asked = std::env::var_os(KEEP_HUGE_PAGES).is_some();
        // Kernels before 5.0 do not say; there is nothing to check there.
        if let Some(allowed) = huge_pages_allowed() {
            assert_eq!(allowed, asked, "huge pages allowed: {allowed}");
        }
    }
}
