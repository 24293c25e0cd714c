//! The process's edges that need unsafe code, kept in one crate so that
//! every other crate of the workspace forbids it: the global allocator
//! that counts live heap bytes and each thread's allocations, SIGPIPE's
//! default for commands that print, and transparent huge pages off. Each
//! unsafe item is allowed where it stands, with its SAFETY comment.

pub mod alloc;
pub mod process;
