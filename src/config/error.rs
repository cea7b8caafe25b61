//! `ConfigError`: one clear message naming the variable, the key, the value and what is allowed.
//!
//! The message is the whole user interface of a configuration mistake (the library prints it once
//! on stderr at the first interposed call), so every variant carries what the user wrote and the
//! allowed alternatives, never an index into a token list.

use super::options::PYTORCH_ONLY_KEYS;
use std::fmt;

/// A configuration variable (or the `--conf` flag) could not be understood.
#[derive(Clone, Debug, PartialEq)]
pub struct ConfigError {
    /// Where the bad text came from: a variable name such as `CACHEALLOC_CONF`, or `--conf`.
    pub variable: &'static str,
    /// What was wrong with it.
    pub problem: Problem,
}

/// What was wrong, with everything the message needs.
#[derive(Clone, Debug, PartialEq)]
pub enum Problem {
    /// A key that is not an option of this variable.
    UnknownKey {
        key: String,
        /// The keys this variable accepts (shown in the message).
        allowed: Vec<&'static str>,
        /// The closest allowed or ignored key, when one is close enough to be a likely typo.
        suggestion: Option<&'static str>,
    },
    /// One of our own keys in a PyTorch variable (PyTorch itself would reject it).
    CacheallocOnlyKey { key: String },
    /// The text does not follow `key:value(,key:value)*`.
    Syntax { message: String },
    /// A known key with a value outside what it allows; `why` says what is allowed.
    InvalidValue {
        key: String,
        value: String,
        why: String,
    },
    /// A whole-variable value (`CACHEALLOC_DISABLE`, `CACHEALLOC_LOG`) that is not allowed.
    InvalidVariable { value: String, why: String },
}

impl ConfigError {
    pub(crate) fn new(variable: &'static str, problem: Problem) -> Self {
        Self { variable, problem }
    }

    pub(crate) fn syntax(variable: &'static str, message: String) -> Self {
        Self::new(variable, Problem::Syntax { message })
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let var = self.variable;
        match &self.problem {
            Problem::UnknownKey {
                key,
                allowed,
                suggestion,
            } => {
                write!(f, "{var}: unknown key '{key}'")?;
                if let Some(s) = suggestion {
                    write!(f, "; did you mean '{s}'?")?;
                }
                write!(
                    f,
                    " (allowed keys: {}; PyTorch's own keys are accepted and ignored: {})",
                    allowed.join(", "),
                    PYTORCH_ONLY_KEYS.join(", ")
                )
            }
            Problem::CacheallocOnlyKey { key } => write!(
                f,
                "{var}: key '{key}' is a cachealloc option and is read only from CACHEALLOC_CONF \
                 (PyTorch rejects keys it does not know)"
            ),
            Problem::Syntax { message } => write!(f, "{var}: {message}"),
            Problem::InvalidValue { key, value, why } => write!(f, "{var}: {key}:{value}: {why}"),
            Problem::InvalidVariable { value, why } => write!(f, "{var}={value}: {why}"),
        }
    }
}

impl std::error::Error for ConfigError {}
