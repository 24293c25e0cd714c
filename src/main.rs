//! The `runbook` command: a thin shell over the library.
#![forbid(unsafe_code)]

// mimalloc: the runtime allocates many short-lived JSON trees, and the
// system allocator spent a third of the operator benchmark's time there.
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    runbook::cli::main()
}
