//! The variables of cluster storage (issue 44): how the remote's entries travel
//! (`KPC_CACHE_REMOTE_COMPRESS`), parsed strictly like every other, and their builder setters.

use super::{Config, ConfigBuilder, ConfigError, invalid, vars};

pub(super) const COMPRESS_ACCEPTED: &str = "a zstd level 1..=19, or 0 (also off/no/false) to publish entries uncompressed (readable by kpc before compression)";

/// Parses `KPC_CACHE_REMOTE_COMPRESS`: a zstd level, or off.
pub(super) fn parse_compress(v: &str) -> Result<u8, ConfigError> {
    let t = v.trim().to_ascii_lowercase();
    let level = match t.as_str() {
        "off" | "no" | "false" => 0,
        _ => t
            .parse::<u8>()
            .map_err(|_| invalid(vars::CACHE_REMOTE_COMPRESS, v, COMPRESS_ACCEPTED))?,
    };
    if level > 19 {
        return Err(invalid(vars::CACHE_REMOTE_COMPRESS, v, COMPRESS_ACCEPTED));
    }
    Ok(level)
}

/// Reads the cluster storage variables through `get` into `b`.
pub(super) fn from_lookup(
    mut b: ConfigBuilder,
    get: &dyn Fn(&'static str) -> Result<Option<String>, ConfigError>,
) -> Result<ConfigBuilder, ConfigError> {
    if let Some(v) = get(vars::CACHE_REMOTE_COMPRESS)? {
        b = b.remote_compress(parse_compress(&v)?);
    }
    Ok(b)
}

/// The cluster storage invariants [`ConfigBuilder::build`] checks.
pub(super) fn check(c: &Config) -> Result<(), ConfigError> {
    if c.remote_compress > 19 {
        return Err(invalid(
            vars::CACHE_REMOTE_COMPRESS,
            &c.remote_compress.to_string(),
            COMPRESS_ACCEPTED,
        ));
    }
    Ok(())
}

impl ConfigBuilder {
    /// Sets the zstd level of published remote entries (0 = uncompressed; see
    /// [`Config::remote_compress`]). [`ConfigBuilder::build`] rejects a level above 19.
    pub fn remote_compress(mut self, level: u8) -> Self {
        self.config.remote_compress = level;
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compression_levels_parse_strictly() {
        assert_eq!(parse_compress("3").unwrap(), 3);
        assert_eq!(parse_compress(" off ").unwrap(), 0);
        assert_eq!(parse_compress("0").unwrap(), 0);
        assert_eq!(parse_compress("19").unwrap(), 19);
        for bad in ["20", "-1", "zstd", "", "on"] {
            let e = parse_compress(bad).unwrap_err().to_string();
            assert!(e.contains("KPC_CACHE_REMOTE_COMPRESS"), "{e}");
            assert!(e.contains("zstd level"), "{e}");
        }
        let e = Config::builder().remote_compress(22).build().unwrap_err();
        assert!(e.to_string().contains("KPC_CACHE_REMOTE_COMPRESS"), "{e}");
    }
}
