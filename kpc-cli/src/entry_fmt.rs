//! Formatting shared by the `kpc cache` commands: dates without a date crate, an entry's device.

use kpc::admin::disk::EntryInfo;

/// "2025-11-21 09:37:05 UTC" without a date crate (days-to-civil, H. Hinnant's algorithm).
pub fn utc(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02} UTC",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

/// An entry's backend and device name, as its key record gives them.
pub fn device_of(e: &EntryInfo) -> (String, String) {
    match &e.record {
        Some(r) => (
            r.backend().to_string(),
            r.device_name().unwrap_or("-").to_string(),
        ),
        None => ("?".into(), "(unreadable .src)".into()),
    }
}

/// Bytes for people: 1536 -> "1.5 KiB".
pub fn human(b: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{b} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}
