//! Strict parsers for the value forms environment variables take: switches, sizes, durations, lists
//! of directories, the trace mask. Each error names the variable and what it accepts.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::{ConfigError, TraceFlags, invalid, vars};

const BOOL_ACCEPTED: &str = "0 or 1 (also true/false, yes/no, on/off)";
const SIZE_ACCEPTED: &str = "a byte count with an optional suffix K, M, G, T (powers of 1024; KiB/MiB/GiB/TiB and KB/MB/GB/TB mean the same), e.g. 4096, 512K, 1G";
const DURATION_ACCEPTED: &str = "a duration: a number with unit ms, s, m or h (e.g. 500ms, 30s, 2m); a bare number means seconds";
pub(super) const TRACE_ACCEPTED: &str =
    "a bitmask 0..=7 (1 = disk cache, 2 = memory cache, 4 = builds), decimal or 0x-hex";
pub(super) const DIRS_ACCEPTED: &str = "a colon-separated list of absolute paths of cache directories or bundle files (.kpcb), like PATH, with no empty element (unset it for none), e.g. /opt/kpc-cache:/opt/kernels.kpcb";

/// Parses a 0/1 switch (true/false, yes/no, on/off also accepted, any case).
pub(crate) fn parse_bool(var: &'static str, v: &str) -> Result<bool, ConfigError> {
    match v.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Ok(true),
        "0" | "false" | "no" | "off" => Ok(false),
        _ => Err(invalid(var, v, BOOL_ACCEPTED)),
    }
}

/// Parses a byte size: plain bytes or a K/M/G/T suffix (binary multiples, optional `iB`/`B`).
pub fn parse_size(var: &'static str, v: &str) -> Result<u64, ConfigError> {
    let err = || invalid(var, v, SIZE_ACCEPTED);
    let t = v.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, suffix) = t.split_at(split);
    if num.is_empty() {
        return Err(err());
    }
    let n: u64 = num.parse().map_err(|_| err())?;
    let shift = match suffix.trim().to_ascii_uppercase().as_str() {
        "" | "B" => 0,
        "K" | "KB" | "KIB" => 10,
        "M" | "MB" | "MIB" => 20,
        "G" | "GB" | "GIB" => 30,
        "T" | "TB" | "TIB" => 40,
        _ => return Err(err()),
    };
    n.checked_mul(1u64 << shift).ok_or_else(err)
}

/// Parses a duration: `500ms`, `30s`, `2m`, `1h`, or a bare number of seconds.
pub fn parse_duration(var: &'static str, v: &str) -> Result<Duration, ConfigError> {
    let err = || invalid(var, v, DURATION_ACCEPTED);
    let t = v.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: f64 = num.parse().map_err(|_| err())?;
    if !n.is_finite() || n < 0.0 {
        return Err(err());
    }
    let secs = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "s" | "sec" | "secs" => n,
        "ms" => n / 1000.0,
        "m" | "min" => n * 60.0,
        "h" => n * 3600.0,
        _ => return Err(err()),
    };
    Duration::try_from_secs_f64(secs).map_err(|_| err())
}

/// What is wrong with `d` as a cache root in a list, if anything.
pub(super) fn dir_problem(d: &OsStr) -> Option<&'static str> {
    if d.is_empty() {
        Some("is empty")
    } else if !Path::new(d).is_absolute() {
        Some("is a relative path")
    } else {
        None
    }
}

/// Parses a colon-separated list of absolute directory paths (any bytes but `:`; no empty element,
/// which PATH would read as the working directory).
pub fn parse_dir_list(var: &'static str, v: &OsStr) -> Result<Vec<PathBuf>, ConfigError> {
    let dirs: Vec<PathBuf> = std::env::split_paths(v).collect();
    for (i, d) in dirs.iter().enumerate() {
        if let Some(problem) = dir_problem(d.as_os_str()) {
            return Err(ConfigError::InvalidListElement {
                var,
                value: v.to_string_lossy().into_owned(),
                index: i + 1,
                element: d.to_string_lossy().into_owned(),
                problem,
                accepted: DIRS_ACCEPTED,
            });
        }
    }
    Ok(dirs)
}

pub(super) fn parse_trace(v: &str) -> Result<TraceFlags, ConfigError> {
    let t = v.trim();
    let bits = match t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
        Some(hex) => u8::from_str_radix(hex, 16),
        None => t.parse::<u8>(),
    }
    .map_err(|_| invalid(vars::CACHE_TRACE, v, TRACE_ACCEPTED))?;
    if bits > 7 {
        return Err(invalid(vars::CACHE_TRACE, v, TRACE_ACCEPTED));
    }
    Ok(TraceFlags(bits))
}
