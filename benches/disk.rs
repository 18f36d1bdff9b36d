//! Disk cache latencies on real files: a hit (lookup + read + verify) for 16 KB and 1 MB binaries, a
//! put (durable, and without fsync), and one eviction pass over 10,000 entries.
//!
//! Run: `cargo bench --bench disk`. The cache lives under `std::env::temp_dir()` (set TMPDIR to bench
//! another file system).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use criterion::{
    BenchmarkId, Criterion, SamplingMode, Throughput, criterion_group, criterion_main,
};
use kpc::Digest;
use kpc::admin::disk::{DiskCacheSettings, PersistentCache};
use kpc::{PutOutcome, StoreKey};

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

struct Dir(PathBuf);

impl Dir {
    fn new(tag: &str) -> Dir {
        let p = std::env::temp_dir().join(format!("kpc-bench-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        Dir(p)
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn settings(root: &Path, sync: bool) -> DiskCacheSettings {
    DiskCacheSettings::new(root)
        .max_size(0)
        .sync(sync)
        .background_eviction(false)
}

fn hits(c: &mut Criterion) {
    let mut g = c.benchmark_group("disk_hit");
    for (name, len) in [("16KB", 16 << 10), ("1MB", 1 << 20)] {
        let dir = Dir::new("hit");
        let cache = PersistentCache::new(settings(&dir.0, true));
        let k = key(1);
        let data = payload(len);
        assert_eq!(
            cache.put(&k, &data, Duration::from_millis(30)),
            PutOutcome::Published(0)
        );
        assert!(cache.get(&k).is_some());
        g.throughput(Throughput::Bytes(len as u64));
        g.bench_function(BenchmarkId::from_parameter(name), |b| {
            b.iter(|| {
                let h = cache.get(&k).expect("hit");
                assert_eq!(h.bytes().len(), len);
                h
            })
        });
        // Every lookup was a hit, verified; none fell back to a miss.
        let s = cache.stats();
        assert_eq!((s.misses, s.corruptions), (0, 0));
    }
    g.finish();
}

fn puts(c: &mut Criterion) {
    let mut g = c.benchmark_group("disk_put_16KB");
    // A durable put costs several fsyncs (milliseconds on a VM disk): ten samples keep the run short.
    g.sample_size(10);
    for (name, sync) in [("fsync", true), ("no_fsync", false)] {
        let dir = Dir::new("put");
        let cache = PersistentCache::new(settings(&dir.0, sync));
        let data = payload(16 << 10);
        let mut i = 0u64;
        g.bench_function(BenchmarkId::from_parameter(name), |b| {
            b.iter(|| {
                i += 1;
                assert!(matches!(
                    cache.put(&key(i), &data, Duration::ZERO),
                    PutOutcome::Published(_)
                ));
            })
        });
    }
    g.finish();
}

/// Fills a fresh cache with `n` entries of 4 KB (one leaf each, as distinct images give), unsynced:
/// setup only, never timed.
fn populate(root: &Path, n: u64) -> PersistentCache {
    let fill = PersistentCache::new(settings(root, false));
    let data = payload(4096);
    for i in 0..n {
        assert!(matches!(
            fill.put(&key(i), &data, Duration::ZERO),
            PutOutcome::Published(_)
        ));
    }
    fill
}

/// 10,000 entries in a real benchmark run; a few hundred when `cargo test --all-targets` merely
/// smoke-tests this binary (no `--bench`), where populating 10k entries on a slow disk takes minutes.
fn evict_entries() -> u64 {
    if std::env::args().any(|a| a == "--bench") {
        10_000
    } else {
        300
    }
}

fn eviction(c: &mut Criterion) {
    let n = evict_entries();
    let mut g = c.benchmark_group("disk_evict_10k");
    g.sample_size(10)
        .sampling_mode(SamplingMode::Flat)
        .warm_up_time(Duration::from_millis(1))
        .measurement_time(Duration::from_secs(2));
    // Every entry goes (prune to 0): 10,000 removals plus their directories.
    g.bench_function("remove_all", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let dir = Dir::new("evict");
                let cache = populate(&dir.0, n);
                let start = Instant::now();
                let r = cache.evict(Some(0), None).unwrap();
                total += start.elapsed();
                assert_eq!(r.removed, n);
            }
            total
        })
    });
    // What a put over the limit triggers: walk 10,000 entries, evict the oldest quarter.
    g.bench_function("to_watermark", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let dir = Dir::new("evict");
                let cache = populate(&dir.0, n);
                let size = cache.tracked_size().unwrap();
                let start = Instant::now();
                let r = cache.evict(Some(size * 3 / 4), None).unwrap();
                total += start.elapsed();
                assert!(
                    r.removed >= n * 24 / 100 && r.removed <= n * 26 / 100,
                    "{r:?}"
                );
            }
            total
        })
    });
    g.finish();
}

criterion_group!(benches, hits, puts, eviction);
criterion_main!(benches);
