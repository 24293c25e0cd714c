//! The runtime: a controller per target kind, the reconcile that runs each
//! policy's decision through `act`, the queue and backoff, leader election
//! and the permission check. It owns no logic of its own about what to do:
//! that is `decide`'s, and every write is `act`'s.

pub mod access;
mod context;
mod controllers;
mod deleted;
pub mod fair;
pub mod forbidden;
mod gauges;
pub mod leader;
pub mod operator;
pub mod queries;
mod reach;
mod reconcile;
mod records;
pub mod rediscover;
pub mod shard;
mod sweeps;
pub mod tenants;
mod unchanged;
pub mod webhook;
pub use context::{Context, Health, OperatorConfig, SetAside, ShadowRecord};
pub use operator::{Operator, StartError};
pub use reconcile::{ReconcileError, backoff};
pub use tenants::{TenancyConfig, Tenants};
pub use webhook::{Webhook, WebhookConfig};
