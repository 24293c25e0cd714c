//! The `runbook` command: a thin shell over the library.

// mimalloc: the runtime allocates many short-lived JSON trees, and the
// system allocator spent a third of the operator benchmark's time there.
/// mimalloc, counted so that `runbook bench` can report the live heap.
#[global_allocator]
static ALLOC: runbook_sys::alloc::Counting<mimalloc::MiMalloc> =
    runbook_sys::alloc::Counting(mimalloc::MiMalloc);

fn main() -> std::process::ExitCode {
    runbook::cli::main()
}
