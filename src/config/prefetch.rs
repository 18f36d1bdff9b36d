//! `KPC_CACHE_PREFETCH`: warm start from the last run, and the application name it remembers under.

use super::{ConfigError, invalid, vars};

/// What `KPC_CACHE_PREFETCH` (and [`super::ConfigBuilder::warm_start`]) accept.
pub const PREFETCH_ACCEPTED: &str = "0/false/no/off/empty (warm start off), 1/true/yes/on (on, named after the executable), or an application name of 1 to 64 letters, digits, '.', '_' or '-' not starting with '.' or '-' (on, under that name)";

/// Whether `name` is a usable application name: it becomes a file name under the cache root.
pub fn valid_app_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && !name.starts_with(['.', '-'])
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// The application name `1` stands for: the running executable's file stem, made a valid name
/// (other characters become `_`), or `default` when there is none.
pub(crate) fn default_app_name() -> String {
    let stem = std::env::current_exe()
        .ok()
        .and_then(|p| p.file_stem().map(|s| s.to_string_lossy().into_owned()))
        .unwrap_or_default();
    let mut name: String = stem
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '_'
            }
        })
        .collect();
    name = name.trim_start_matches(['.', '-']).to_string();
    name.truncate(64);
    if name.is_empty() {
        "default".into()
    } else {
        name
    }
}

/// Parses a `KPC_CACHE_PREFETCH` value: `None` = warm start off, `Some(app)` = on under `app`.
pub(crate) fn parse_prefetch(v: &str) -> Result<Option<String>, ConfigError> {
    let t = v.trim();
    match t.to_ascii_lowercase().as_str() {
        "" | "0" | "false" | "no" | "off" => Ok(None),
        "1" | "true" | "yes" | "on" => Ok(Some(default_app_name())),
        _ if valid_app_name(t) => Ok(Some(t.to_string())),
        _ => Err(invalid(vars::CACHE_PREFETCH, v, PREFETCH_ACCEPTED)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values() {
        assert_eq!(parse_prefetch("").unwrap(), None);
        assert_eq!(parse_prefetch("0").unwrap(), None);
        assert_eq!(parse_prefetch("Off").unwrap(), None);
        assert_eq!(
            parse_prefetch("llm-server").unwrap(),
            Some("llm-server".into())
        );
        assert_eq!(
            parse_prefetch(" app_1.v2 ").unwrap(),
            Some("app_1.v2".into())
        );
        let d = parse_prefetch("1").unwrap().unwrap();
        assert!(valid_app_name(&d), "{d}");
        for bad in [
            "../x",
            "a/b",
            ".hidden",
            "-x",
            "sp ace",
            &"x".repeat(65),
            "é",
        ] {
            let e = parse_prefetch(bad).unwrap_err();
            assert!(e.to_string().contains("KPC_CACHE_PREFETCH"), "{e}");
        }
    }
}
