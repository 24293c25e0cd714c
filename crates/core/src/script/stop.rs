//! Stopping a call at the expression that crossed a limit.
//!
//! Rhai's own limit errors (operations, call depth, the `on_progress`
//! stop) are "system exceptions": as one leaves each script function Rhai
//! moves its position to the call site, so an error deep in a helper
//! function came out naming the entry function's first line. Runbook
//! raises its limits itself instead: crossing one arms a stop, and the next
//! variable the script reads fails with an ordinary error that keeps its
//! position and the chain of functions it is in. Rhai's limits stay in
//! place a little further out, as a backstop for a script that reads no
//! variable (or catches the error and carries on).

use std::cell::Cell;
use std::time::{Duration, Instant};

use rhai::{Dynamic, EvalAltResult, EvalContext, NativeCallContext};

/// Which limit stopped a call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Limit {
    /// Its values together held more than the memory cap.
    Memory,
    /// Its wall-clock budget ran out.
    Time,
    /// It ran more operations than allowed.
    Operations,
    /// Its calls nested deeper than allowed.
    Depth,
}

/// The value of the error a stopped call fails with.
#[derive(Clone, Debug)]
pub struct Stopped {
    pub limit: Limit,
    /// The one call that took this long when time ran out in it.
    pub took: Option<Duration>,
}

/// Operations a call may run past an armed stop before Rhai's backstop
/// ends it where it is.
pub(super) const GRACE: u64 = 10_000;

/// The same past the memory cap: each operation may allocate (up to the
/// size limits), so the backstop comes much sooner.
const MEMORY_GRACE: u64 = 16;

/// Call levels past Runbook's own limit where Rhai's backstop sits.
pub(super) const DEPTH_GRACE: usize = 4;

/// How often (in operations) the deadline is checked: often enough to stop
/// within tens of microseconds, rarely enough to cost nothing measurable.
const DEADLINE_CHECK_EVERY: u64 = 512;

/// The token of the memory backstop (Rhai's `on_progress` stop).
pub(crate) const OVER_MEMORY: &str = "memory";

thread_local! {
    /// When the call running on this thread must stop.
    static DEADLINE: Cell<Option<Instant>> = const { Cell::new(None) };
    /// The thread's net allocation past which the running call must stop.
    static MEMORY_CAP: Cell<Option<isize>> = const { Cell::new(None) };
    /// A limit crossed, and the operation count when it was.
    static ARMED: Cell<Option<(Limit, u64)>> = const { Cell::new(None) };
}

/// The limits of the call running on this thread, put back as they were
/// when it ends (calls nest: a nested one keeps the outer deadline and cap).
pub(super) struct Budget {
    deadline: Option<Instant>,
    cap: Option<isize>,
    armed: Option<(Limit, u64)>,
}

impl Budget {
    pub(super) fn enter(wall_time: Duration, max_memory: usize) -> Self {
        let saved = Self {
            deadline: DEADLINE.get(),
            cap: MEMORY_CAP.get(),
            armed: ARMED.take(),
        };
        let deadline = Instant::now() + wall_time;
        DEADLINE.set(Some(saved.deadline.map_or(deadline, |p| p.min(deadline))));
        if let Some(now) = runbook_sys::alloc::thread_held() {
            let cap = now.saturating_add(max_memory as isize);
            MEMORY_CAP.set(Some(saved.cap.map_or(cap, |p| p.min(cap))));
        }
        saved
    }
}

impl Drop for Budget {
    fn drop(&mut self) {
        DEADLINE.set(self.deadline);
        MEMORY_CAP.set(self.cap);
        ARMED.set(self.armed);
    }
}

fn over_memory() -> bool {
    MEMORY_CAP
        .get()
        .is_some_and(|cap| runbook_sys::alloc::thread_held().is_some_and(|n| n > cap))
}

fn past_deadline(now: Instant) -> bool {
    DEADLINE.get().is_some_and(|deadline| now >= deadline)
}

/// The engine's `on_progress`: arm a stop when a limit is crossed; end the
/// call where it is once it has run `GRACE` operations past it.
pub(super) fn progress(ops: u64, max_operations: u64) -> Option<Dynamic> {
    if let Some((limit, at)) = ARMED.get() {
        let grace = match limit {
            Limit::Memory => MEMORY_GRACE,
            _ => GRACE,
        };
        return (ops.saturating_sub(at) > grace).then(|| {
            Dynamic::from(match limit {
                Limit::Memory => OVER_MEMORY,
                _ => "deadline",
            })
        });
    }
    let crossed = if over_memory() {
        Some(Limit::Memory)
    } else if ops >= max_operations {
        Some(Limit::Operations)
    } else if ops.is_multiple_of(DEADLINE_CHECK_EVERY) && past_deadline(Instant::now()) {
        Some(Limit::Time)
    } else {
        None
    };
    if let Some(limit) = crossed {
        ARMED.set(Some((limit, ops)));
    }
    None
}

/// The engine's `on_var`: a variable read after a stop was armed, or at a
/// call depth past the limit, fails there.
pub(super) fn on_var(
    context: &EvalContext,
    max_call_levels: usize,
) -> Result<Option<Dynamic>, Box<EvalAltResult>> {
    let limit = match ARMED.get() {
        Some((limit, _)) => limit,
        None if context.call_level() > max_call_levels => Limit::Depth,
        None => return Ok(None),
    };
    Err(stopped(limit, None, rhai::Position::NONE))
}

/// Run one of Runbook's own functions that may take long (the cache
/// lookups): a call whose time runs out in it fails at it, saying how long
/// it took.
pub(crate) fn timed<T>(
    call: &NativeCallContext,
    f: impl FnOnce() -> Result<T, Box<EvalAltResult>>,
) -> Result<T, Box<EvalAltResult>> {
    let started = Instant::now();
    let out = f()?;
    let now = Instant::now();
    if past_deadline(now) {
        return Err(stopped(
            Limit::Time,
            Some(now - started),
            call.call_position(),
        ));
    }
    Ok(out)
}

fn stopped(limit: Limit, took: Option<Duration>, pos: rhai::Position) -> Box<EvalAltResult> {
    Box::new(EvalAltResult::ErrorRuntime(
        Dynamic::from(Stopped { limit, took }),
        pos,
    ))
}
