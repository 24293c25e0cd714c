pub mod cache;
pub mod leader;
pub mod metrics;
pub mod object;
pub mod runtime;
pub mod view;
pub use runtime::{Context, Operator, OperatorConfig, StartError};
pub mod reload;
pub mod sources;
