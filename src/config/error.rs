//! [`ConfigError`]: what a rejected configuration value says (the variable, the value, what is
//! accepted).

/// A configuration value that could not be accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// A variable (or builder field) held a value that does not parse.
    #[error("{var}={value:?} is not valid: expected {accepted}")]
    Invalid {
        /// The variable (or builder field) name.
        var: &'static str,
        /// The value as given.
        value: String,
        /// What would have been accepted.
        accepted: &'static str,
    },
    /// A value given in code (not through a variable) that does not parse: a device selector
    /// passed to the builder, the C API or a command-line option.
    #[error("{what} {value:?} is not valid: expected {accepted}")]
    InvalidValue {
        /// What the value is (`device selector`).
        what: &'static str,
        /// The value as given.
        value: String,
        /// What would have been accepted.
        accepted: &'static str,
    },
    /// One element of a list variable is not valid.
    #[error(
        "{var}={value:?} is not valid: element {index} ({element:?}) {problem}; expected {accepted}"
    )]
    InvalidListElement {
        /// The variable (or builder field) name.
        var: &'static str,
        /// The whole value as given.
        value: String,
        /// The element at fault, 1-based.
        index: usize,
        /// The element as given.
        element: String,
        /// What is wrong with it.
        problem: &'static str,
        /// What would have been accepted.
        accepted: &'static str,
    },
    /// Two values are each valid but contradict each other.
    #[error("{0}")]
    Inconsistent(String),
    /// A key variable (`KPC_CACHE_SIGNING_KEY`, `KPC_CACHE_TRUSTED_KEYS`) whose value, or the file it
    /// names, does not hold an acceptable key.
    #[error("{var}={value:?} is not valid: {problem}; expected {accepted}")]
    InvalidKey {
        /// The variable name.
        var: &'static str,
        /// The value as given (a path or a list; never a private key itself).
        value: String,
        /// What is wrong with it.
        problem: String,
        /// What would have been accepted.
        accepted: &'static str,
    },
    /// A URL variable (`KPC_CACHE_REMOTE`) that does not parse; the value shown has any password
    /// redacted.
    #[error("{var}={value:?} is not valid: the URL {problem}; expected {accepted}")]
    InvalidUrl {
        /// The variable name.
        var: &'static str,
        /// The value as given, password redacted.
        value: String,
        /// What is wrong with it.
        problem: &'static str,
        /// What would have been accepted.
        accepted: &'static str,
    },
}

pub(crate) fn invalid(var: &'static str, value: &str, accepted: &'static str) -> ConfigError {
    ConfigError::Invalid {
        var,
        value: value.to_owned(),
        accepted,
    }
}
