//! The `runbook` command: a thin shell over the library.
#![forbid(unsafe_code)]

fn main() -> std::process::ExitCode {
    runbook::cli::main()
}
