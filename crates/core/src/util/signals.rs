//! How the process answers signals.

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
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}
