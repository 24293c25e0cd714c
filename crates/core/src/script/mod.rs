//! Rhai: one hardened engine, compiled scripts and expressions, the `ctx`
//! object, helpers, action builders and templates.
//!
//! Nothing here touches the network or the clock: a script sees only what
//! `ctx` gives it.

pub mod action;
pub mod convert;
pub mod ctx;
pub mod engine;
pub mod error;
pub mod helpers;
pub mod obj;
pub mod reference;
pub mod stop;
pub mod strict;
pub mod template;

pub use action::{Action, ActionValue};
pub use ctx::{Ctx, CtxData};
pub use engine::{Expr, Script, ScriptEngine, ScriptLimits};
pub use error::{ScriptError, ScriptErrorKind};
pub use obj::Obj;
pub use template::Template;
