//! How the process takes memory from the kernel.

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
    unsafe {
        libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0);
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

thread_local! {
    /// Bytes this thread allocated less those it freed, counted by the
    /// binary's allocator (`bench::alloc::Counting`): what a script holds
    /// is what its thread allocated since its call began.
    static THREAD_NET: std::cell::Cell<isize> = const { std::cell::Cell::new(0) };
}

/// Whether the process allocates through a counting allocator at all.
static COUNTED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// An allocation (`by` > 0) or free on this thread, told by the allocator.
pub fn thread_allocated(by: isize) {
    if !COUNTED.load(std::sync::atomic::Ordering::Relaxed) {
        COUNTED.store(true, std::sync::atomic::Ordering::Relaxed);
    }
    let _ = THREAD_NET.try_with(|n| n.set(n.get().wrapping_add(by)));
}

/// Bytes this thread holds, net, since it began; `None` where no counting
/// allocator tells (test binaries), which cannot know.
pub fn thread_held() -> Option<isize> {
    COUNTED
        .load(std::sync::atomic::Ordering::Relaxed)
        .then(|| THREAD_NET.try_with(std::cell::Cell::get).unwrap_or(0))
}
