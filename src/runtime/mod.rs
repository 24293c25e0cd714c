//! The runtime: a controller per target kind, the reconcile that runs each
//! policy's decision through `act`, the queue and backoff, leader election
//! and the permission check. It owns no logic of its own about what to do:
//! that is `decide`'s, and every write is `act`'s.

pub mod access;
pub mod leader;
pub mod operator;
pub use operator::{Context, Operator, OperatorConfig, StartError};
