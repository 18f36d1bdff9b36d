//! The variables of cluster storage (issue 44): how the remote's entries travel
//! (`KPC_CACHE_REMOTE_COMPRESS`) and the limits shared file systems need (`KPC_CACHE_MAX_ENTRIES`,
//! `KPC_CACHE_MIN_FREE`, `KPC_CACHE_LOCK_DIR`), parsed strictly like every other, and their builder
//! setters.

use std::fmt;
use std::path::PathBuf;

use super::parse::parse_size;
use super::{Config, ConfigBuilder, ConfigError, invalid, vars};

const ENTRIES_ACCEPTED: &str =
    "a whole number of entries (each is two files), 0 for no limit, e.g. 50000";
const MIN_FREE_ACCEPTED: &str = "a size (e.g. 2G, 512M; 0 for no floor) or a percentage of the file system from 0% to 50% with at most two decimals (e.g. 1%, 0.5%)";
const NOT_BEFORE_ACCEPTED: &str = "a UTC time: YYYY-MM-DD, YYYY-MM-DDTHH:MM:SSZ, or @SECONDS since the Unix epoch (e.g. 2026-11-01, 2026-11-01T12:00:00Z, @1793491200)";
const LOCK_DIR_ACCEPTED: &str =
    "an absolute directory path on node-local storage (e.g. /run/kpc-locks, /tmp/kpc-locks)";

/// The free-space floor a disk cache put must leave (`KPC_CACHE_MIN_FREE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MinFree {
    /// At least this many bytes free (0: no floor).
    Bytes(u64),
    /// At least this share of the file system free, in hundredths of a percent (100 = 1%); the same
    /// share of its inodes, where it reports them.
    Fraction(u32),
}

impl Default for MinFree {
    /// 1% of the file system.
    fn default() -> Self {
        MinFree::Fraction(100)
    }
}

impl fmt::Display for MinFree {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            MinFree::Bytes(b) => write!(f, "{b} bytes"),
            MinFree::Fraction(bp) if bp % 100 == 0 => write!(f, "{}%", bp / 100),
            MinFree::Fraction(bp) => write!(f, "{}.{:02}%", bp / 100, bp % 100),
        }
    }
}

impl MinFree {
    /// The floor, in bytes and in inodes, for a file system of `blocks_bytes` bytes and `inodes`
    /// inodes (0 where it reports none).
    pub fn floor(self, fs_bytes: u64, inodes: u64) -> (u64, u64) {
        match self {
            MinFree::Bytes(b) => (b, 0),
            MinFree::Fraction(bp) => {
                let share = |n: u64| (n as u128 * bp as u128 / 10_000) as u64;
                (share(fs_bytes), share(inodes))
            }
        }
    }
}

/// Parses `KPC_CACHE_MIN_FREE`: a size, or a percentage.
pub(super) fn parse_min_free(v: &str) -> Result<MinFree, ConfigError> {
    let err = || invalid(vars::CACHE_MIN_FREE, v, MIN_FREE_ACCEPTED);
    let t = v.trim();
    let Some(pct) = t.strip_suffix('%') else {
        return parse_size(vars::CACHE_MIN_FREE, t)
            .map(MinFree::Bytes)
            .map_err(|_| err());
    };
    let (whole, frac) = pct.trim().split_once('.').unwrap_or((pct.trim(), ""));
    if whole.is_empty()
        || frac.len() > 2
        || !whole.bytes().all(|b| b.is_ascii_digit())
        || !frac.bytes().all(|b| b.is_ascii_digit())
    {
        return Err(err());
    }
    let whole: u32 = whole.parse().map_err(|_| err())?;
    let frac: u32 = format!("{frac:0<2}").parse().map_err(|_| err())?;
    let bp = whole.checked_mul(100).and_then(|w| w.checked_add(frac));
    match bp {
        Some(bp) if bp <= 5_000 => Ok(MinFree::Fraction(bp)),
        _ => Err(err()),
    }
}

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

/// Days from 1970-01-01 to the civil date `y-m-d` (proleptic Gregorian).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// Parses `KPC_CACHE_REMOTE_NOT_BEFORE`: seconds since the Unix epoch.
pub(super) fn parse_not_before(v: &str) -> Result<u64, ConfigError> {
    let err = || invalid(vars::CACHE_REMOTE_NOT_BEFORE, v, NOT_BEFORE_ACCEPTED);
    let t = v.trim();
    if let Some(secs) = t.strip_prefix('@') {
        return secs.parse::<u64>().map_err(|_| err());
    }
    let (date, time) = match t.split_once(['T', ' ']) {
        Some((d, tm)) => (d, Some(tm.strip_suffix('Z').ok_or_else(err)?)),
        None => (t, None),
    };
    let num = |s: &str, len: usize| -> Result<i64, ConfigError> {
        if s.len() != len || !s.bytes().all(|b| b.is_ascii_digit()) {
            return Err(err());
        }
        s.parse().map_err(|_| err())
    };
    let d: Vec<&str> = date.split('-').collect();
    let [y, m, day] = d[..] else {
        return Err(err());
    };
    let (y, m, day) = (num(y, 4)?, num(m, 2)?, num(day, 2)?);
    let leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    let days_in = [
        31,
        if leap { 29 } else { 28 },
        31,
        30,
        31,
        30,
        31,
        31,
        30,
        31,
        30,
        31,
    ];
    if !(1..=12).contains(&m) || day < 1 || day > days_in[(m - 1) as usize] {
        return Err(err());
    }
    let secs = match time {
        None => 0,
        Some(tm) => {
            let p: Vec<&str> = tm.split(':').collect();
            let [h, mi, s] = p[..] else { return Err(err()) };
            let (h, mi, s) = (num(h, 2)?, num(mi, 2)?, num(s, 2)?);
            if h > 23 || mi > 59 || s > 59 {
                return Err(err());
            }
            h * 3600 + mi * 60 + s
        }
    };
    let t = days_from_civil(y, m, day) * 86_400 + secs;
    u64::try_from(t).map_err(|_| err())
}

/// Reads the cluster storage variables through `get` into `b`.
pub(super) fn from_lookup(
    mut b: ConfigBuilder,
    get: &dyn Fn(&'static str) -> Result<Option<String>, ConfigError>,
) -> Result<ConfigBuilder, ConfigError> {
    if let Some(v) = get(vars::CACHE_REMOTE_COMPRESS)? {
        b = b.remote_compress(parse_compress(&v)?);
    }
    if let Some(v) = get(vars::CACHE_MAX_ENTRIES)? {
        let n = v
            .trim()
            .parse::<u64>()
            .map_err(|_| invalid(vars::CACHE_MAX_ENTRIES, &v, ENTRIES_ACCEPTED))?;
        b = b.max_entries(n);
    }
    if let Some(v) = get(vars::CACHE_MIN_FREE)? {
        b = b.min_free(parse_min_free(&v)?);
    }
    if let Some(v) = get(vars::CACHE_REMOTE_NOT_BEFORE)?.filter(|v| !v.trim().is_empty()) {
        b = b.remote_not_before(Some(parse_not_before(&v)?));
    }
    if let Some(v) = get(vars::CACHE_LOCK_DIR)?.filter(|v| !v.trim().is_empty()) {
        b = b.lock_dir(Some(PathBuf::from(v)));
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
    if let MinFree::Fraction(bp) = c.min_free
        && bp > 5_000
    {
        return Err(invalid(
            vars::CACHE_MIN_FREE,
            &c.min_free.to_string(),
            MIN_FREE_ACCEPTED,
        ));
    }
    if let Some(d) = &c.lock_dir
        && !d.is_absolute()
    {
        return Err(invalid(
            vars::CACHE_LOCK_DIR,
            &d.to_string_lossy(),
            LOCK_DIR_ACCEPTED,
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
    /// Sets the remote's cut-off: entries built before this time (seconds since the Unix epoch) are
    /// refused (see [`Config::remote_not_before`]).
    pub fn remote_not_before(mut self, unix_secs: Option<u64>) -> Self {
        self.config.remote_not_before = unix_secs;
        self
    }
    /// Sets the disk cache's entry limit (0 = none; see [`Config::max_entries`]).
    pub fn max_entries(mut self, n: u64) -> Self {
        self.config.max_entries = n;
        self
    }
    /// Sets the free-space floor of disk cache puts (see [`Config::min_free`]).
    /// [`ConfigBuilder::build`] rejects a share above 50%.
    pub fn min_free(mut self, floor: MinFree) -> Self {
        self.config.min_free = floor;
        self
    }
    /// Sets where the disk cache's lock files go (`None`: in the cache tree; see
    /// [`Config::lock_dir`]). [`ConfigBuilder::build`] rejects a relative path.
    pub fn lock_dir(mut self, dir: Option<PathBuf>) -> Self {
        self.config.lock_dir = dir;
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

    #[test]
    fn cut_off_times_parse_strictly() {
        assert_eq!(parse_not_before("1970-01-01").unwrap(), 0);
        assert_eq!(parse_not_before("2000-02-29").unwrap(), 951_782_400);
        assert_eq!(
            parse_not_before("2023-11-14T22:13:20Z").unwrap(),
            1_700_000_000
        );
        assert_eq!(parse_not_before("@1700000000").unwrap(), 1_700_000_000);
        for bad in [
            "2023-02-29",
            "2023-13-01",
            "2023-11-14T22:13:20",
            "2023-11-14T24:00:00Z",
            "yesterday",
            "@-5",
            "1969-12-31",
            "23-11-14",
        ] {
            let e = parse_not_before(bad).unwrap_err().to_string();
            assert!(e.contains("KPC_CACHE_REMOTE_NOT_BEFORE"), "{bad}: {e}");
            assert!(e.contains("YYYY-MM-DD"), "{bad}: {e}");
        }
    }

    #[test]
    fn free_space_floors_parse_strictly() {
        assert_eq!(parse_min_free("1%").unwrap(), MinFree::Fraction(100));
        assert_eq!(parse_min_free("0.5%").unwrap(), MinFree::Fraction(50));
        assert_eq!(parse_min_free(" 12.25 %").unwrap(), MinFree::Fraction(1225));
        assert_eq!(parse_min_free("2G").unwrap(), MinFree::Bytes(2 << 30));
        assert_eq!(parse_min_free("0").unwrap(), MinFree::Bytes(0));
        for bad in ["51%", "1.234%", "%", "-1%", "lots", "1.5G", ".5%"] {
            let e = parse_min_free(bad).unwrap_err().to_string();
            assert!(e.contains("KPC_CACHE_MIN_FREE"), "{bad}: {e}");
            assert!(e.contains("percentage"), "{bad}: {e}");
        }
        assert_eq!(MinFree::Fraction(50).to_string(), "0.50%");
        assert_eq!(
            MinFree::Fraction(100).floor(1 << 30, 1000),
            (10_737_418, 10)
        );
        assert_eq!(MinFree::Bytes(5).floor(1 << 30, 1000), (5, 0));
    }

    #[test]
    fn entry_limits_and_lock_dirs_are_checked_naming_the_variable() {
        let get = |name: &'static str, val: &'static str| {
            Config::from_lookup(move |k| (k == name).then(|| val.into()))
        };
        assert_eq!(
            get("KPC_CACHE_MAX_ENTRIES", "50000").unwrap().max_entries,
            50_000
        );
        for bad in ["-3", "1e5", "many", "5K"] {
            let e = get("KPC_CACHE_MAX_ENTRIES", bad).unwrap_err().to_string();
            assert!(
                e.contains("KPC_CACHE_MAX_ENTRIES") && e.contains("whole number"),
                "{e}"
            );
        }
        let c = get("KPC_CACHE_LOCK_DIR", "/run/kpc-locks").unwrap();
        assert_eq!(c.lock_dir, Some(PathBuf::from("/run/kpc-locks")));
        let e = get("KPC_CACHE_LOCK_DIR", "locks").unwrap_err().to_string();
        assert!(
            e.contains("KPC_CACHE_LOCK_DIR") && e.contains("absolute"),
            "{e}"
        );
        assert_eq!(get("KPC_CACHE_LOCK_DIR", " ").unwrap().lock_dir, None);
        assert_eq!(Config::default().min_free, MinFree::Fraction(100));
    }
}
