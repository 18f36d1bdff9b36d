//! A bundle read in place as a read-only layer against the same entries imported into a directory
//! layer: the time of a verified hit and of a miss (p50 / p99 over lookups of random keys), the time
//! to open the bundle (its first lookup reads the index), export and import times, and the sizes.
//!
//! Each entry has an image of its own and a binary of `PAYLOAD_BYTES` (default 17 700: the H200's
//! VkPipelineCache blob of a 125-line shader) that compresses like driver output does
//! (half of it repeats). Everything lives under `std::env::temp_dir()` and is removed afterwards.
//!
//! Run: `cargo run --release --example bundle_layer -- [ENTRIES...] [--payload BYTES]`
//! (default entries: 1000 10000).

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kpc::Digest;
use kpc::admin::bundle;
use kpc::admin::bundle::BundleStore;
use kpc::admin::disk::{DiskCacheSettings, PersistentCache};
use kpc::admin::store::{EntryAuth, ReadOnlyStore};
use kpc::{Access, Store, StoreKey};

const DEVICE: &str =
    "backend=vulkan\nkpc_format=1\nvendorID=0x10de\ndeviceID=0x2335\ndeviceName=bench\n";

fn key(i: u64) -> StoreKey {
    StoreKey::new(
        DEVICE,
        Digest::of(DEVICE.as_bytes()),
        Digest::of(&i.to_le_bytes()),
        17_700,
        &[0, 0, 0, 0, 2, 64, 0, 0, 0, 0, 0, 0, 0],
        "-O2",
    )
    .with_label(&format!("kernel{i}.spv"))
}

/// Half random, half a repeating pattern: zstd makes about half of it.
fn payload(i: u64, len: usize) -> Vec<u8> {
    let mut x = i.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|n| {
            if n % 2 == 0 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            } else {
                (n % 61) as u8
            }
        })
        .collect()
}

fn pct(v: &mut [Duration], p: f64) -> f64 {
    v.sort_unstable();
    let i = ((v.len() as f64 * p) as usize).min(v.len() - 1);
    v[i].as_secs_f64() * 1e6
}

/// p50 and p99 in µs of `rounds` lookups of keys `pick(round)` in `store`, asserting hit or miss.
fn time(store: &dyn Store, rounds: u64, pick: impl Fn(u64) -> u64, hit: bool) -> (f64, f64) {
    let mut t = Vec::with_capacity(rounds as usize);
    for r in 0..rounds {
        let k = key(pick(r));
        let s = Instant::now();
        let got = store.get(&k, Access::ReadOnly);
        t.push(s.elapsed());
        assert_eq!(got.is_some(), hit);
    }
    (pct(&mut t, 0.5), pct(&mut t, 0.99))
}

fn du(dir: &Path) -> u64 {
    walkdir::WalkDir::new(dir)
        .into_iter()
        .filter_map(Result::ok)
        .filter_map(|e| e.metadata().ok())
        .filter(|m| m.is_file())
        .map(|m| m.len())
        .sum()
}

fn run(n: u64, len: usize) {
    let base = std::env::temp_dir().join(format!("kpc-bundle-bench-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&base);
    let settings = |d: &Path| DiskCacheSettings::new(d).max_size(0).sync(false);
    let src = PersistentCache::new(settings(&base.join("built")));
    for i in 0..n {
        src.put(&key(i), &payload(i, len), Duration::from_millis(30));
    }
    let file = base.join("kernels.kpcb");
    let s = Instant::now();
    let e = bundle::export(&src, None, &EntryAuth::default(), &file).unwrap();
    let export = s.elapsed();
    let imported = PersistentCache::new(settings(&base.join("imported")));
    let s = Instant::now();
    let r = bundle::import(&imported, &EntryAuth::default(), &file).unwrap();
    let import = s.elapsed();
    assert_eq!(r.taken, n);

    let s = Instant::now();
    let layer = ReadOnlyStore::new(Arc::new(BundleStore::open(&file, EntryAuth::default())));
    assert!(layer.get(&key(0), Access::ReadOnly).is_some());
    let open = s.elapsed();
    let dir = ReadOnlyStore::new(Arc::new(imported));
    let rounds = 20_000;
    let spread = |r: u64| (r.wrapping_mul(2_654_435_761)) % n;
    let (bh50, bh99) = time(&layer, rounds, spread, true);
    let (dh50, dh99) = time(&dir, rounds, spread, true);
    let absent = |r: u64| n + 1 + r;
    let (bm50, bm99) = time(&layer, rounds, absent, false);
    let (dm50, dm99) = time(&dir, rounds, absent, false);
    println!(
        "| {n} | {len} | {:.1} | {:.1} | {} | {} | {:.1} | {bh50:.1} / {bh99:.1} | {dh50:.1} / {dh99:.1} | {bm50:.1} / {bm99:.1} | {dm50:.1} / {dm99:.1} |",
        export.as_secs_f64(),
        import.as_secs_f64(),
        e.file_bytes,
        du(&base.join("imported")),
        open.as_secs_f64() * 1e3,
    );
    let _ = std::fs::remove_dir_all(&base);
}

fn main() {
    let mut sizes = Vec::new();
    let mut len = 17_700;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        if a == "--payload" {
            len = args
                .next()
                .expect("--payload BYTES")
                .parse()
                .expect("bytes");
        } else {
            sizes.push(a.parse().expect("an entry count"));
        }
    }
    if sizes.is_empty() {
        sizes = vec![1000, 10_000];
    }
    println!(
        "| entries | binary bytes | export s | import s | bundle bytes | imported dir bytes | open + first hit ms | bundle hit µs p50 / p99 | dir hit µs p50 / p99 | bundle miss µs p50 / p99 | dir miss µs p50 / p99 |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    for n in sizes {
        run(n, len);
    }
}
