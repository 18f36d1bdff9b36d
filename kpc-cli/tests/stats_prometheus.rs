//! `kpc cache stats --format prometheus`: the text exposition of a real cache directory's entries,
//! limit and quarantine, and of a remote that is up (fs://) or down (a dead redis port).

// The support code all of the workspace's integration tests share.
use crate::common;

use std::time::Duration;

use common::disk::{TempDir, cache, entry_bytes, key, payload};
use common::redis::dead_url;

fn stats(dir: &TempDir, remote: Option<&str>) -> String {
    let mut c = common::cli::kpc_command();
    c.args(["cache", "stats", "--format", "prometheus"])
        .env("KPC_CACHE_DIR", dir.path())
        .env("KPC_CACHE_MAX_SIZE", "64M")
        .env("KPC_CACHE_REMOTE_TIMEOUT", "500ms")
        .env_remove("KPC_CACHE_REMOTE");
    if let Some(r) = remote {
        c.env("KPC_CACHE_REMOTE", r);
    }
    let out = c.output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    text
}

/// The sum of every sample of `name` (with any labels).
fn sum(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (series, v) = l.rsplit_once(' ')?;
            let n = series.split('{').next()?;
            (n == name).then(|| v.parse::<f64>().ok())?
        })
        .sum()
}

#[test]
fn cache_stats_prints_the_prometheus_text_exposition() {
    let d = TempDir::new("stats-prom");
    let c = cache(d.path());
    for i in 0..5 {
        c.put(
            &key(i),
            &payload(i, 2000 + i as usize),
            Duration::from_millis(3),
        );
    }
    drop(c);
    let text = stats(&d, None);
    assert!(text.contains("# TYPE kpc_disk_entries gauge"), "{text}");
    assert_eq!(sum(&text, "kpc_disk_entries"), 5.0, "{text}");
    assert_eq!(
        sum(&text, "kpc_disk_bytes"),
        entry_bytes(d.path()) as f64,
        "{text}"
    );
    assert_eq!(sum(&text, "kpc_disk_limit_bytes"), (64u64 << 20) as f64);
    assert_eq!(sum(&text, "kpc_disk_quarantine_files"), 0.0);
    assert!(
        !text.contains("kpc_remote_up"),
        "no remote, no remote series: {text}"
    );

    let remote = TempDir::new("stats-prom-remote");
    let text = stats(&d, Some(&format!("fs://{}", remote.path().display())));
    assert_eq!(sum(&text, "kpc_remote_up"), 1.0, "{text}");
    assert_eq!(sum(&text, "kpc_remote_entries"), 0.0, "{text}");
    let text = stats(&d, Some(&dead_url()));
    assert_eq!(sum(&text, "kpc_remote_up"), 0.0, "{text}");
    assert!(text.contains("kpc_remote_up 0"), "{text}");
}
