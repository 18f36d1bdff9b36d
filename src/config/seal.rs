//! `KPC_CACHE_SEAL`: what a context does with a build once it is sealed (after its warm-up).

use std::fmt;

use super::{ConfigError, invalid, vars};

/// What `KPC_CACHE_SEAL` (and [`super::ConfigBuilder::seal`]) accept.
pub const SEAL_ACCEPTED: &str = "off (also 0, false, no or empty: never sealed), warn (a build after sealing is logged with its miss explanation) error (a build after sealing is refused with Error::Sealed) or generic (a request that names a generic fallback is served the fallback instead of building its specialized kernel; any other build is logged as under warn)";

/// What a sealed context does when an acquisition would build: nothing (`Off`), build and report
/// it (`Warn`), or refuse with [`crate::Error::Sealed`] without building (`Error`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum SealMode {
    /// Not sealed: builds happen as needed, silently (the default).
    #[default]
    Off,
    /// Builds, and logs one warning line per build with the kernel, why no store served it and the
    /// build time.
    Warn,
    /// Does not build: the acquisition fails with [`crate::Error::Sealed`].
    Error,
    /// A request with a generic fallback ([`crate::KernelRequest::or_generic`]) whose specialized
    /// kernel no layer holds is served the fallback, and the specialized kernel is not built; a
    /// build that has no fallback to serve instead (the fallback itself, a plain request) is built
    /// and logged as under [`SealMode::Warn`].
    Generic,
}

impl SealMode {
    /// The name `KPC_CACHE_SEAL` uses for it.
    pub fn name(self) -> &'static str {
        match self {
            SealMode::Off => "off",
            SealMode::Warn => "warn",
            SealMode::Error => "error",
            SealMode::Generic => "generic",
        }
    }
}

impl fmt::Display for SealMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What `KPC_CACHE_BUILD_BUDGET` accepts.
pub const BUILD_BUDGET_ACCEPTED: &str = "a whole number of builds (0 or more) that a context may run after its warm-up before it is sealed, or empty for no budget";

/// Parses a `KPC_CACHE_BUILD_BUDGET` value: `None` for empty (no budget).
pub(crate) fn parse_build_budget(v: &str) -> Result<Option<u64>, ConfigError> {
    let t = v.trim();
    if t.is_empty() {
        return Ok(None);
    }
    t.parse::<u64>()
        .map(Some)
        .map_err(|_| invalid(vars::CACHE_BUILD_BUDGET, v, BUILD_BUDGET_ACCEPTED))
}

/// Parses a `KPC_CACHE_SEAL` value (case-insensitive, surrounding blanks ignored).
pub(crate) fn parse_seal(v: &str) -> Result<SealMode, ConfigError> {
    match v.trim().to_ascii_lowercase().as_str() {
        "" | "off" | "0" | "false" | "no" => Ok(SealMode::Off),
        "warn" => Ok(SealMode::Warn),
        "error" => Ok(SealMode::Error),
        "generic" => Ok(SealMode::Generic),
        _ => Err(invalid(vars::CACHE_SEAL, v, SEAL_ACCEPTED)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn build_budget_values_and_errors() {
        assert_eq!(parse_build_budget("").unwrap(), None);
        assert_eq!(parse_build_budget(" 0 ").unwrap(), Some(0));
        assert_eq!(parse_build_budget("12").unwrap(), Some(12));
        for bad in ["-1", "1.5", "ten", "3 builds"] {
            let msg = parse_build_budget(bad).unwrap_err().to_string();
            assert!(
                msg.contains("KPC_CACHE_BUILD_BUDGET")
                    && msg.contains(bad)
                    && msg.contains("whole number"),
                "{msg}"
            );
        }
    }

    #[test]
    fn values_and_errors() {
        for (v, want) in [
            ("", SealMode::Off),
            ("off", SealMode::Off),
            ("0", SealMode::Off),
            (" Warn ", SealMode::Warn),
            ("ERROR", SealMode::Error),
            ("generic", SealMode::Generic),
        ] {
            assert_eq!(parse_seal(v).unwrap(), want, "{v:?}");
        }
        for bad in ["1", "on", "strict", "warn,error"] {
            let e = parse_seal(bad).unwrap_err();
            assert_eq!(
                e,
                ConfigError::Invalid {
                    var: "KPC_CACHE_SEAL",
                    value: bad.into(),
                    accepted: SEAL_ACCEPTED
                }
            );
            let msg = e.to_string();
            assert!(
                msg.contains("KPC_CACHE_SEAL") && msg.contains(bad) && msg.contains("warn"),
                "{msg}"
            );
        }
    }
}
