pub mod access;
pub mod cache;
pub mod health;
pub mod leader;
pub mod runtime;
pub mod view;
pub use runtime::{Context, Operator, OperatorConfig, StartError};
pub mod reload;
pub mod sources;
