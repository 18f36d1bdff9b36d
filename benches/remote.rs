//! The remote tier against the local disk: a verified hit (lookup, read, verify; for the remote also
//! the envelope and a keyed MAC) for 16 KB and 1 MB binaries, from a disk cache on real files and from
//! a redis-server on loopback that this bench starts itself (`/usr/bin/redis-server`, no persistence).
//!
//! Run: `cargo bench --bench remote`.

use std::time::Duration;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use kpc::Digest;
use kpc::MacKey;
use kpc::RemoteUrl;
use kpc::StoreKey;
use kpc::admin::disk::{DiskCacheSettings, PersistentCache};
use kpc::admin::store::RemoteStore;
use kpc::{Access, Store};

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
    .with_label("attention.spv")
}

fn payload(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 31 % 251) as u8).collect()
}

// The integration tests' redis-server harness (own loopback port and directory, killed on drop).
#[path = "../tests/common/mod.rs"]
mod common;

fn hits(c: &mut Criterion) {
    let redis = common::redis::RedisServer::spawn(&[]);
    let url = RemoteUrl::parse(&redis.url()).unwrap();
    let mac = MacKey::from_secret("KPC_CACHE_REMOTE_KEY", "bench-secret-0123456789").unwrap();
    let remote = RemoteStore::open(
        &url,
        Duration::from_secs(5),
        Some(mac),
        Duration::from_secs(5),
    )
    .unwrap();
    let dir = std::env::temp_dir().join(format!("kpc-bench-remote-disk-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let disk = PersistentCache::new(DiskCacheSettings::new(&dir).max_size(0));
    let mut g = c.benchmark_group("store_hit");
    for (i, len) in [(1u64, 16usize << 10), (2, 1 << 20)] {
        let (k, bin) = (key(i), payload(len));
        disk.put(&k, &bin, Duration::from_millis(30));
        remote.put(&k, &bin, Duration::from_millis(30));
        assert_eq!(disk.get(&k).unwrap().bytes(), &bin[..]);
        assert_eq!(remote.get(&k, Access::ReadOnly).unwrap().bytes(), &bin[..]);
        g.throughput(Throughput::Bytes(len as u64));
        g.bench_with_input(BenchmarkId::new("disk", len), &k, |b, k| {
            b.iter(|| disk.get(k).unwrap())
        });
        g.bench_with_input(
            BenchmarkId::new("remote_redis_loopback", len),
            &k,
            |b, k| b.iter(|| remote.get(k, Access::ReadOnly).unwrap()),
        );
    }
    g.finish();
    let _ = std::fs::remove_dir_all(&dir);
}

criterion_group!(benches, hits);
criterion_main!(benches);
