//! A global allocator wrapper that can count live heap bytes and their
//! peak, so `runbook bench` can report heap as well as RSS. Counting is off
//! unless `enable` is called (the memory benchmark's operator process
//! does, first thing): shared counters on every allocation cost a multi-
//! threaded process a good part of its time.

use std::alloc::{GlobalAlloc, Layout};
use std::sync::atomic::{AtomicBool, AtomicIsize, Ordering};

use runbook_operator::util::memory::thread_allocated;

static ENABLED: AtomicBool = AtomicBool::new(false);
static LIVE: AtomicIsize = AtomicIsize::new(0);
static PEAK: AtomicIsize = AtomicIsize::new(0);

/// Wraps an allocator; while counting is enabled every allocation and free
/// adjusts the counters.
pub struct Counting<A>(pub A);

/// Start counting (what was allocated before is not counted).
pub fn enable() {
    ENABLED.store(true, Ordering::Relaxed);
}

fn grew(by: usize) {
    // Every thread's own count is always kept (a script's memory cap).
    thread_allocated(by as isize);
    if !ENABLED.load(Ordering::Relaxed) {
        return;
    }
    let by = by as isize;
    let now = LIVE.fetch_add(by, Ordering::Relaxed) + by;
    if now > PEAK.load(Ordering::Relaxed) {
        PEAK.fetch_max(now, Ordering::Relaxed);
    }
}

fn shrank(by: usize) {
    thread_allocated(-(by as isize));
    if ENABLED.load(Ordering::Relaxed) {
        LIVE.fetch_sub(by as isize, Ordering::Relaxed);
    }
}

// SAFETY: every call is forwarded to the wrapped allocator unchanged; the
// counters are only bookkeeping.
unsafe impl<A: GlobalAlloc> GlobalAlloc for Counting<A> {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller upholds `alloc`'s contract.
        let p = unsafe { self.0.alloc(layout) };
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as for `alloc`.
        let p = unsafe { self.0.alloc_zeroed(layout) };
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller upholds `dealloc`'s contract.
        unsafe { self.0.dealloc(ptr, layout) };
        shrank(layout.size());
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller upholds `realloc`'s contract.
        let p = unsafe { self.0.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            if new_size >= layout.size() {
                grew(new_size - layout.size());
            } else {
                shrank(layout.size() - new_size);
            }
        }
        p
    }
}

/// Heap bytes allocated and not yet freed since `enable` (0 unless the
/// process's global allocator is a `Counting`).
pub fn live() -> usize {
    LIVE.load(Ordering::Relaxed).max(0) as usize
}

/// The most `live` has been since the start or the last `reset_peak`.
pub fn peak() -> usize {
    PEAK.load(Ordering::Relaxed).max(0) as usize
}

pub fn reset_peak() {
    PEAK.store(live() as isize, Ordering::Relaxed);
}
