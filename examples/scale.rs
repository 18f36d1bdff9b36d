//! How cost grows with the number of entries (issue 44, item 6): a disk cache filled with N entries
//! (each an image of its own), then
//! - the verified lookup of a present key (hit) and of an absent one (miss, explained), p50 / p99 over
//!   20 000 random keys, through the chain's view of the disk cache (`Store::get`);
//! - `kpc cache stats`, `kpc cache ls --json`, `kpc cache verify` and `kpc cache check DIR`, each one
//!   run of the real binary (`target/release/kpc`, or `KPC`);
//! - one eviction pass that removes a tenth of the bytes (the pass, then its deferred sweep);
//! - the same entries as a bundle read in place: its hit p50 / p99.
//!
//! And, for the remote sizes, N entries published to a real redis-server (tests/common) and one
//! collection pass (`gc_plan` + `gc_apply`, a quota that removes a tenth).
//!
//! Run: `cargo run --release --example scale -- [--disk 1000,10000,100000] [--remote 10000]
//! [--payload 4096]`. Everything lives under `std::env::temp_dir()` (set TMPDIR for another file
//! system) and is removed afterwards; fsync is off while filling (the figures are about lookups and
//! maintenance, not about publishing).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use kpc::Digest;
use kpc::RemoteUrl;
use kpc::admin::bundle;
use kpc::admin::bundle::BundleStore;
use kpc::admin::disk::{DiskCacheSettings, PersistentCache};
use kpc::admin::store::{EntryAuth, GcPolicy, ReadOnlyStore, RemoteStore};
use kpc::{Access, Store, StoreKey};

#[path = "../tests/common/mod.rs"]
mod common;

const DEVICE: &str =
    "backend=vulkan\nkpc_format=1\nvendorID=0x10de\ndeviceID=0x2335\ndeviceName=scale\n";

fn key(i: u64) -> StoreKey {
    StoreKey::new(
        DEVICE,
        Digest::of(DEVICE.as_bytes()),
        Digest::of(&i.to_le_bytes()),
        4096,
        &[0, 0, 0, 0, 2, 64, 0, 0, 0, 0, 0, 0, 0],
        "-O2",
    )
    .with_label(&format!("kernel{i}.spv"))
}

fn payload(i: u64, len: usize) -> Vec<u8> {
    let mut x = i.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|n| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            if n % 2 == 0 { x as u8 } else { (n % 61) as u8 }
        })
        .collect()
}

fn pct(v: &mut [Duration], p: f64) -> f64 {
    v.sort_unstable();
    v[((v.len() as f64 * p) as usize).min(v.len() - 1)].as_secs_f64() * 1e6
}

/// p50 / p99 (µs) of 20 000 lookups in `store` of keys `pick(round)`, each a hit or a miss as `hit`.
fn lookups(store: &dyn Store, pick: impl Fn(u64) -> u64, hit: bool) -> String {
    let mut t = Vec::with_capacity(20_000);
    for r in 0..20_000u64 {
        let k = key(pick(r));
        let s = Instant::now();
        let got = store.get(&k, Access::ReadWrite);
        t.push(s.elapsed());
        assert_eq!(got.is_some(), hit, "key {}", pick(r));
    }
    format!("{:.1} / {:.1}", pct(&mut t, 0.5), pct(&mut t, 0.99))
}

fn kpc_bin() -> PathBuf {
    std::env::var_os("KPC").map_or_else(
        || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/release/kpc"),
        PathBuf::from,
    )
}

/// Seconds one run of `kpc ARGS` took against the cache at `root`.
fn kpc(root: &Path, args: &[&str]) -> f64 {
    let s = Instant::now();
    let st = Command::new(kpc_bin())
        .env("KPC_CACHE_DIR", root)
        .env("KPC_CACHE_MAX_SIZE", "0")
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .expect("run kpc (build it first: cargo build --release -p kpc-cli)");
    let t = s.elapsed().as_secs_f64();
    assert!(st.code().is_some_and(|c| c <= 1), "kpc {args:?}: {st}");
    t
}

fn disk(n: u64, len: usize) {
    let base = std::env::temp_dir().join(format!("kpc-scale-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&base);
    let root = base.join("cache");
    let settings = DiskCacheSettings::new(&root)
        .max_size(0)
        .sync(false)
        .background_eviction(false);
    let cache = PersistentCache::new(settings.clone());
    let s = Instant::now();
    for i in 0..n {
        cache.put(&key(i), &payload(i, len), Duration::from_millis(20));
    }
    let fill = s.elapsed().as_secs_f64();
    let store: &dyn Store = &cache;
    let spread = |r: u64| r.wrapping_mul(2_654_435_761) % n;
    let hit = lookups(store, spread, true);
    let miss = lookups(store, |r| n + 1 + r, false);
    let stats = kpc(&root, &["cache", "stats"]);
    let ls = kpc(&root, &["cache", "ls", "--json"]);
    let verify = kpc(&root, &["cache", "verify"]);
    let check = kpc(&root, &["cache", "check", "--json", root.to_str().unwrap()]);
    let file = base.join("all.kpcb");
    let s = Instant::now();
    bundle::export(&cache, None, &EntryAuth::default(), &file).unwrap();
    let export = s.elapsed().as_secs_f64();
    let layer = ReadOnlyStore::new(Arc::new(BundleStore::open(&file, EntryAuth::default())));
    let bundle_hit = lookups(&layer, spread, true);
    let total = cache.tracked_size().unwrap();
    let s = Instant::now();
    let r = cache
        .evict_deferred(Some(total - total / 10), None)
        .unwrap();
    let evict = s.elapsed().as_secs_f64();
    cache.wait_for_eviction();
    let sweep = s.elapsed().as_secs_f64() - evict;
    println!(
        "| disk | {n} | {fill:.1} | {hit} | {miss} | {stats:.2} | {ls:.2} | {verify:.2} | {check:.2} | {evict:.2} + sweep {sweep:.2} ({} removed) | {export:.1} | {bundle_hit} |",
        r.removed
    );
    let _ = std::fs::remove_dir_all(&base);
}

fn remote(n: u64, len: usize) {
    let redis = common::redis::RedisServer::spawn(&[]);
    let url = RemoteUrl::parse(&redis.url()).unwrap();
    let t = Duration::from_secs(30);
    let store = RemoteStore::open(&url, t, None, t).unwrap();
    let s = Instant::now();
    for i in 0..n {
        store.put(&key(i), &payload(i, len), Duration::from_millis(20));
    }
    drop(store);
    let fill = s.elapsed().as_secs_f64();
    let store = RemoteStore::open(&url, t, None, t).unwrap();
    let spread = |r: u64| r.wrapping_mul(2_654_435_761) % n;
    let hit = lookups(&store, spread, true);
    let census = store
        .gc_plan(GcPolicy::default(), SystemTime::now())
        .unwrap();
    let total: u64 = census.entries.iter().map(|e| e.bytes).sum();
    let s = Instant::now();
    let policy = GcPolicy::default()
        .older_than(Some(Duration::from_secs(86_400)))
        .max_size(Some(total - total / 10));
    let plan = store.gc_plan(policy, SystemTime::now()).unwrap();
    let planned = s.elapsed().as_secs_f64();
    let report = store.gc_apply(&plan).unwrap();
    let gc = s.elapsed().as_secs_f64();
    println!(
        "| remote (redis) | {n} | {fill:.1} | {hit} | - | - | - | - | - | gc {gc:.2} (plan {planned:.2}; {} removed) | - | - |",
        report.removed_by_quota
    );
}

fn list(s: &str) -> Vec<u64> {
    s.split(',').map(|x| x.parse().expect("a count")).collect()
}

fn main() {
    let (mut disks, mut remotes, mut len) = (vec![1000, 10_000, 100_000], vec![10_000], 4096);
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let v = args.next().expect("a value");
        match a.as_str() {
            "--disk" => disks = list(&v),
            "--remote" => remotes = list(&v),
            "--payload" => len = v.parse().expect("bytes"),
            _ => panic!("usage: scale [--disk N,..] [--remote N,..] [--payload BYTES]"),
        }
    }
    println!(
        "| store | entries | fill s | hit µs p50 / p99 | miss µs p50 / p99 | stats s | ls s | verify s | check s | eviction pass s | export s | bundle hit µs p50 / p99 |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|");
    for n in disks {
        disk(n, len);
    }
    for n in remotes {
        remote(n, len);
    }
}
