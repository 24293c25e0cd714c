//! Policies: the YAML model, bundles (directories and ConfigMaps), loading
//! and validation with `file:line:col` errors, and the immutable
//! [`PolicySet`] that is swapped in whole.

pub mod bundle;
pub mod claim;
pub mod compile;
pub mod limits;
pub mod model;
pub mod set;

pub use bundle::{Bundle, Origin};
pub use compile::{
    Body, CompiledPolicy, CompiledStep, LoadError, Loaded, ScheduleSource, load_bundle,
};
pub use limits::{RateLimit, Verb};
pub use model::Mode;
pub use set::PolicySet;

use crate::script::ScriptEngine;

/// Load bundles into a set; errors from every bundle are returned together.
pub fn load(engine: &ScriptEngine, bundles: &[Bundle]) -> (PolicySet, Vec<LoadError>) {
    PolicySet::build(
        bundles
            .iter()
            .map(|b| load_bundle(engine, b, None))
            .collect(),
    )
}
