//! A global allocator wrapper that can count live heap bytes and their
//! peak, so `runbook bench` can report heap as well as RSS, and each
//! thread's own net allocation, so a script's memory cap can hold. Counting is off
//! unless `enable` is called (the memory benchmark's operator process
//! does, first thing): shared counters on every allocation cost a multi-
//! threaded process a good part of its time.

use std::alloc::{GlobalAlloc, Layout};
use std::sync::atomic::{AtomicBool, AtomicIsize, Ordering};

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
#[allow(unsafe_code)]
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

thread_local! {
    /// Bytes this thread allocated less those it freed, counted by the
    /// binary's allocator ([`Counting`]): what a script holds
    /// is what its thread allocated since its call began.
    static THREAD_NET: std::cell::Cell<isize> = const { std::cell::Cell::new(0) };
}

/// Whether the process allocates through a counting allocator at all.
static COUNTED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// An allocation (`by` > 0) or free on this thread, told by the allocator.
fn thread_allocated(by: isize) {
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
