//! The in-memory cache's hit path: ns per hit at 1, 2, 4, ... threads (up to the available cores),
//! for kpc's sharded, lock-free-hit design and, in the same run, the classic design: one global
//! `Mutex<HashMap>` (what the SYCL runtime's acquire-lock amounts to on a hit).
//!
//! Run: `cargo bench --bench hit_path`. Criterion reports each variant; a summary table with both
//! designs' ns per hit and their ratio is printed at the end.

#[path = "../tests/common/fake_backend.rs"]
#[allow(dead_code)]
mod fake_backend;

use std::collections::HashMap;
use std::hint::black_box;
use std::sync::{Arc, Barrier, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, criterion_group};
use fake_backend::{FakeBackend, image};
use kpc::Config;
use kpc::backend::DeviceImage;
use kpc::cache::{
    BuildError, BuildOptions, CacheCost, Digest, KernelKey, KernelProgramCache, MemCacheSettings,
    ProgramKey, SpecConstants, SpecValue,
};
use kpc::runtime::ProgramManager;

struct Prog;
impl CacheCost for Prog {
    fn cache_bytes(&self) -> u64 {
        1
    }
}

/// Keys shaped like real ones: a spec constant, build options, an entry name.
fn key(i: u32) -> KernelKey {
    KernelKey::new(
        ProgramKey {
            image: Digest::of(&i.to_le_bytes()),
            spec: SpecConstants::new().with(0, SpecValue::U32(64)),
            device: Digest::of(b"device"),
            options: BuildOptions::new("-O"),
        },
        "attention_decode",
    )
}

const KEYS: u32 = 16;

trait HitPath: Sync + Send {
    fn hit(&self, i: u32);
}

struct Kpc {
    cache: KernelProgramCache<Prog, u64, BuildError>,
    keys: Vec<KernelKey>,
}

impl Kpc {
    fn new() -> Self {
        let cache = KernelProgramCache::new(MemCacheSettings::default());
        let keys: Vec<_> = (0..KEYS).map(key).collect();
        for (i, k) in keys.iter().enumerate() {
            cache.get_or_build_kernel(k, || Ok(i as u64)).unwrap();
        }
        Kpc { cache, keys }
    }
}

impl HitPath for Kpc {
    #[inline]
    fn hit(&self, i: u32) {
        let k = &self.keys[(i % KEYS) as usize];
        black_box(
            self.cache
                .get_or_build_kernel(k, || unreachable!("warm"))
                .unwrap(),
        );
    }
}

/// The classic design: one process-wide mutex around a map.
struct MutexMap {
    map: Mutex<HashMap<KernelKey, Arc<u64>>>,
    keys: Vec<KernelKey>,
}

impl MutexMap {
    fn new() -> Self {
        let keys: Vec<_> = (0..KEYS).map(key).collect();
        let map = keys
            .iter()
            .enumerate()
            .map(|(i, k)| (k.clone(), Arc::new(i as u64)))
            .collect();
        MutexMap {
            map: Mutex::new(map),
            keys,
        }
    }
}

impl HitPath for MutexMap {
    #[inline]
    fn hit(&self, i: u32) {
        let k = &self.keys[(i % KEYS) as usize];
        black_box(self.map.lock().unwrap().get(k).cloned().unwrap());
    }
}

/// Control: each thread looks up its own private map (same keys, same hasher as the mutex baseline), so
/// nothing is shared. Its scaling is the machine's own ceiling (SMT siblings, memory bandwidth), against
/// which the shared designs' per-thread cost should be read.
struct PrivateMaps {
    keys: Vec<KernelKey>,
}

impl HitPath for PrivateMaps {
    #[inline]
    fn hit(&self, i: u32) {
        thread_local! {
            static MAP: std::cell::RefCell<HashMap<KernelKey, Arc<u64>>> = Default::default();
        }
        let k = &self.keys[(i % KEYS) as usize];
        MAP.with(|m| {
            let mut m = m.borrow_mut();
            if m.is_empty() {
                for (j, k) in self.keys.iter().enumerate() {
                    m.insert(k.clone(), Arc::new(j as u64));
                }
            }
            black_box(m.get(k).cloned().unwrap());
        });
    }
}

/// The whole runtime call an application makes: key construction from (image, entry, spec, options)
/// plus the kernel-map hit.
struct Runtime {
    pm: ProgramManager<FakeBackend>,
    image: DeviceImage,
    spec: SpecConstants,
    options: BuildOptions,
}

impl Runtime {
    fn new() -> Self {
        let config = Config::builder().persistent(false).build().unwrap();
        let pm = ProgramManager::new(Arc::new(FakeBackend::new()), &config);
        let r = Runtime {
            pm,
            image: image("bench", &["attention_decode"]),
            spec: SpecConstants::new().with(0, SpecValue::U32(64)),
            options: BuildOptions::new("-O"),
        };
        r.pm.kernel(&r.image, "attention_decode", &r.spec, &r.options)
            .unwrap();
        r
    }
}

impl HitPath for Runtime {
    #[inline]
    fn hit(&self, _i: u32) {
        black_box(
            self.pm
                .kernel(&self.image, "attention_decode", &self.spec, &self.options)
                .unwrap(),
        );
    }
}

/// Runs `iters` hits on each of `threads` threads started together; returns the wall time, which is
/// the time per hit per thread times `iters` when the threads run in parallel.
fn run(target: &Arc<dyn HitPath>, threads: usize, iters: u64) -> Duration {
    let barrier = Arc::new(Barrier::new(threads + 1));
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let (target, barrier) = (target.clone(), barrier.clone());
            thread::spawn(move || {
                barrier.wait();
                let start = Instant::now();
                for i in 0..iters {
                    target.hit(i as u32 ^ (t as u32 * 7));
                }
                start.elapsed()
            })
        })
        .collect();
    barrier.wait();
    handles
        .into_iter()
        .map(|h| h.join().unwrap())
        .max()
        .unwrap()
}

fn thread_counts() -> Vec<usize> {
    let cores = thread::available_parallelism().map_or(1, |n| n.get());
    let mut v = vec![1];
    while *v.last().unwrap() * 2 <= cores {
        v.push(v.last().unwrap() * 2);
    }
    if *v.last().unwrap() != cores {
        v.push(cores);
    }
    v
}

fn designs() -> Vec<(&'static str, Arc<dyn HitPath>)> {
    vec![
        ("kpc_kernel_cache", Arc::new(Kpc::new()) as Arc<dyn HitPath>),
        ("global_mutex_hashmap", Arc::new(MutexMap::new())),
        ("kpc_runtime_call", Arc::new(Runtime::new())),
        (
            "thread_private_hashmap",
            Arc::new(PrivateMaps {
                keys: (0..KEYS).map(key).collect(),
            }),
        ),
    ]
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("hit_path");
    for (name, target) in designs() {
        for t in thread_counts() {
            g.bench_with_input(BenchmarkId::new(name, format!("{t}t")), &t, |b, &t| {
                b.iter_custom(|iters| run(&target, t, iters))
            });
        }
    }
    g.finish();
}

/// The side-by-side table: median of 7 runs of 2M hits per thread, for both designs at each thread count.
fn summary() {
    const ITERS: u64 = 2_000_000;
    let ns = |target: &Arc<dyn HitPath>, t| {
        run(target, t, ITERS / 10); // warm-up
        let mut v: Vec<f64> = (0..7)
            .map(|_| run(target, t, ITERS).as_nanos() as f64 / ITERS as f64)
            .collect();
        v.sort_by(|a, b| a.partial_cmp(b).unwrap());
        v[3]
    };
    let d = designs();
    println!(
        "\nhit path, ns per hit per thread (median of 7 x {ITERS} hits per thread, {KEYS} keys):"
    );
    println!(
        "{:>7} | {:>16} | {:>20} | {:>12} | {:>16} | {:>22}",
        "threads",
        "kpc kernel cache",
        "global Mutex<HashMap>",
        "mutex / kpc",
        "kpc runtime call",
        "control: private maps"
    );
    for t in thread_counts() {
        let (k, m, r, c) = (
            ns(&d[0].1, t),
            ns(&d[1].1, t),
            ns(&d[2].1, t),
            ns(&d[3].1, t),
        );
        println!(
            "{t:>7} | {k:>16.1} | {m:>20.1} | {:>11.2}x | {r:>16.1} | {c:>22.1}",
            m / k
        );
    }
}

criterion_group!(benches, bench);

fn main() {
    benches();
    // `cargo test --all-targets` runs this binary without `--bench` to smoke-test it; the long
    // side-by-side table is only for real benchmark runs.
    if std::env::args().any(|a| a == "--bench") {
        summary();
    }
    criterion::Criterion::default()
        .configure_from_args()
        .final_summary();
}
