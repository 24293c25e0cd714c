//! Script errors that name the file, line and column.

use std::fmt;

use rhai::{EvalAltResult, ParseError, Position};

use super::stop::{Limit, OVER_MEMORY, Stopped};
use crate::util::yaml::Pos;

/// What went wrong in a script.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ScriptErrorKind {
    /// The script does not parse.
    Syntax,
    /// The script raised an error or called something that failed.
    Runtime,
    /// The wall-clock budget ran out.
    Timeout,
    /// An operation, depth or size limit was hit.
    Limit,
    /// The script returned something that is not a list of actions.
    BadResult,
}

impl ScriptErrorKind {
    /// Short label for metrics and conditions.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Syntax => "syntax",
            Self::Runtime => "runtime",
            Self::Timeout => "timeout",
            Self::Limit => "limit",
            Self::BadResult => "bad_result",
        }
    }
}

/// A script error with its place.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScriptError {
    pub file: String,
    pub pos: Option<Pos>,
    pub kind: ScriptErrorKind,
    pub message: String,
}

impl fmt::Display for ScriptError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.pos {
            Some(p) => write!(f, "{}:{}:{}: {}", self.file, p.line, p.col, self.message),
            None => write!(f, "{}: {}", self.file, self.message),
        }
    }
}

impl std::error::Error for ScriptError {}

/// Convert a Rhai position, shifted by where the script starts in its file.
pub fn pos_of(p: Position, origin: Pos) -> Option<Pos> {
    let line = p.line()? as u32;
    let col = p.position().unwrap_or(1) as u32;
    if line == 1 {
        Some(Pos {
            line: origin.line,
            col: origin.col + col - 1,
        })
    } else {
        Some(Pos {
            line: origin.line + line - 1,
            col,
        })
    }
}

/// The position a script starts at when it is a file of its own.
pub const FILE_START: Pos = Pos { line: 1, col: 1 };

impl ScriptError {
    pub fn from_parse(file: &str, err: &ParseError, origin: Pos) -> Self {
        Self {
            file: file.to_string(),
            pos: pos_of(err.position(), origin),
            kind: ScriptErrorKind::Syntax,
            message: strip_position(&err.err_type().to_string()),
        }
    }

    /// Describe a runtime error by its innermost cause, where the fault is.
    pub fn from_eval(file: &str, err: &EvalAltResult, origin: Pos, budget_ms: u128) -> Self {
        let mut err = err;
        let mut context = Vec::new();
        while let EvalAltResult::ErrorInFunctionCall(name, _, inner, _) = err {
            context.push(name.clone());
            err = inner;
        }
        let stopped = match err {
            EvalAltResult::ErrorRuntime(value, _) => value.clone().try_cast::<Stopped>(),
            EvalAltResult::ErrorTerminated(token, _)
                if token.clone().into_string().ok().as_deref() == Some(OVER_MEMORY) =>
            {
                Some(Stopped {
                    limit: Limit::Memory,
                    took: None,
                })
            }
            EvalAltResult::ErrorTerminated(_, _) => Some(Stopped {
                limit: Limit::Time,
                took: None,
            }),
            EvalAltResult::ErrorTooManyOperations(_) => Some(Stopped {
                limit: Limit::Operations,
                took: None,
            }),
            EvalAltResult::ErrorStackOverflow(_) => Some(Stopped {
                limit: Limit::Depth,
                took: None,
            }),
            _ => None,
        };
        let (kind, message) = match (stopped, err) {
            (Some(Stopped { limit: Limit::Memory, .. }), _) => (
                ScriptErrorKind::Limit,
                "stopped: its values together took more than the memory cap of a call (32 MB by default)".to_string(),
            ),
            (Some(Stopped { limit: Limit::Time, took }), _) => (
                ScriptErrorKind::Timeout,
                match took.filter(|t| t.as_millis() * 4 >= budget_ms) {
                    Some(t) => format!(
                        "stopped: ran past its wall-clock budget of {budget_ms}ms; this call took {}ms",
                        t.as_millis()
                    ),
                    None => format!("stopped: ran past its wall-clock budget of {budget_ms}ms"),
                },
            ),
            (Some(Stopped { limit: Limit::Operations, .. }), _) => (
                ScriptErrorKind::Limit,
                "stopped: ran past the operation limit".to_string(),
            ),
            (Some(Stopped { limit: Limit::Depth, .. }), _) => (
                ScriptErrorKind::Limit,
                "stopped: calls nested deeper than the limit (runaway recursion?)".to_string(),
            ),
            (None, err) => Self::described(err),
        };
        let message = if context.is_empty() {
            message
        } else {
            format!("in {}: {message}", chain(&context))
        };
        Self {
            file: file.to_string(),
            pos: pos_of(err.position(), origin),
            kind,
            message,
        }
    }

    /// Any other runtime error, by its kind and message.
    fn described(err: &EvalAltResult) -> (ScriptErrorKind, String) {
        match err {
            EvalAltResult::ErrorDataTooLarge(what, _) => (
                ScriptErrorKind::Limit,
                format!("stopped: {} is larger than the limit", what.to_lowercase()),
            ),
            EvalAltResult::ErrorTooManyVariables(_) => (
                ScriptErrorKind::Limit,
                "stopped: too many variables".to_string(),
            ),
            // A message raised by Runbook's own functions reads as it is.
            EvalAltResult::ErrorRuntime(value, _) if value.is_string() => {
                (ScriptErrorKind::Runtime, strip_position(&value.to_string()))
            }
            other => (ScriptErrorKind::Runtime, strip_position(&other.to_string())),
        }
    }

    pub fn bad_result(file: &str, pos: Option<Pos>, message: impl Into<String>) -> Self {
        Self {
            file: file.to_string(),
            pos,
            kind: ScriptErrorKind::BadResult,
            message: message.into(),
        }
    }
}

/// The functions an error came through, outermost first; a function calling
/// itself is named once with the depth.
fn chain(names: &[String]) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut i = 0;
    while i < names.len() {
        let run = names[i..].iter().take_while(|n| **n == names[i]).count();
        parts.push(match run {
            1 => names[i].clone(),
            n => format!("{} ({n} calls deep)", names[i]),
        });
        i += run;
    }
    parts.join(" > ")
}

/// Rhai appends " (line L, position C)" to messages; the position is ours to print.
fn strip_position(message: &str) -> String {
    match message.rfind(" (line ") {
        Some(i) if message.ends_with(')') => message[..i].to_string(),
        _ => message.to_string(),
    }
}
