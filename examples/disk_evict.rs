//! Times one disk-cache eviction pass over N entries, once, on the file system of `std::env::temp_dir()`
//! (set TMPDIR to choose). For file systems where the criterion bench (`cargo bench --bench disk`), which
//! repeats the pass at least ten times, would take too long.
//!
//! The pass is `PersistentCache::evict_deferred`: it returns once every entry is gone from the tree and
//! leaves removing the emptied directories and deleting the removed files to a background sweep, timed
//! separately. With SETTLE_SECS > 0 the example runs `sync` and waits that long before evicting, so the
//! files' blocks are allocated and committed, as an old entry's are (freeing blocks is what costs on
//! ext4 with `discard`).
//!
//! Run: `cargo run --release --example disk_evict -- [ENTRIES] [PAYLOAD_BYTES] [SETTLE_SECS]`
//! (defaults 10000, 4096 and 0).

use std::time::{Duration, Instant};

use kpc::Digest;
use kpc::admin::disk::{DiskCacheSettings, PersistentCache};
use kpc::{PutOutcome, StoreKey};

fn main() {
    let mut args = std::env::args().skip(1);
    let n: u64 = args
        .next()
        .map_or(10_000, |a| a.parse().expect("ENTRIES: a number"));
    let len: usize = args
        .next()
        .map_or(4096, |a| a.parse().expect("PAYLOAD_BYTES: a number"));
    let settle: u64 = args
        .next()
        .map_or(0, |a| a.parse().expect("SETTLE_SECS: a number"));
    let root = std::env::temp_dir().join(format!("kpc-evict-example-{}", std::process::id()));
    let settings = DiskCacheSettings::new(&root)
        .max_size(0)
        .sync(false)
        .background_eviction(false);
    let cache = PersistentCache::new(settings);
    let device = "backend=vulkan\nkpc_format=1\ndeviceName=example\n";
    let data: Vec<u8> = (0..len).map(|i| i as u8).collect();
    let start = Instant::now();
    for i in 0..n {
        let key = StoreKey::new(
            device,
            Digest::of(device.as_bytes()),
            Digest::of(&i.to_le_bytes()),
            len as u64,
            b"",
            "-O2",
        );
        let out = cache.put(&key, &data, Duration::ZERO);
        assert!(matches!(out, PutOutcome::Published(_)), "{out:?}");
    }
    let fill = start.elapsed();
    if settle > 0 {
        let _ = std::process::Command::new("sync").status();
        std::thread::sleep(Duration::from_secs(settle));
    }
    let sched0 = cpu_ticks();
    let start = Instant::now();
    let r = cache.evict_deferred(Some(0), None).expect("eviction pass");
    let pass = start.elapsed();
    let sched1 = cpu_ticks();
    cache.wait_for_eviction();
    let sweep = start.elapsed() - pass;
    let trash_left = std::fs::read_dir(root.join("trash")).map_or(0, |d| d.count());
    let _ = std::fs::remove_dir_all(&root);
    println!("settle      {settle} s after sync");
    println!("root        {}", root.display());
    println!("populate    {n} entries of {len} B in {fill:.2?} (unsynced)");
    println!(
        "evict pass  {pass:.3?} ({:.1} us per entry): removed {} entries, sweep deferred: {}",
        pass.as_secs_f64() * 1e6 / n.max(1) as f64,
        r.removed,
        r.sweep_deferred
    );
    if let (Some(c0), Some(c1)) = (sched0, sched1) {
        println!(
            "            of which the process was on a CPU {:.3?} (user + system, /proc/self/stat, 10 ms ticks)",
            Duration::from_millis((c1 - c0) * 10)
        );
    }
    println!(
        "sweep       {sweep:.3?} more in the background ({trash_left} trash directories left)"
    );
}

/// The process's user + system time in clock ticks (100 per second on Linux), threads that exited
/// included: on a shared machine, the gap to the wall time is what other people's work cost.
fn cpu_ticks() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the command name (which is in parentheses and may hold spaces); utime and stime are
    // the 14th and 15th fields overall.
    let rest = &s[s.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    Some(f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?)
}
