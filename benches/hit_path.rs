//! The in-memory cache's hit path: ns per hit per thread at 1, 2, 4, ... N threads, for kpc's kernel
//! cache, the whole `Context::kernel` call, and in the same run the classic design (one global
//! `Mutex<HashMap>`, what the SYCL runtime's acquire-lock amounts to on a hit) and a control (a private
//! map per thread: nothing shared, so its curve is the machine's own).
//!
//! Run: `cargo bench --bench hit_path`. Criterion reports each variant; then a table prints every
//! design's ns per hit per thread and, per design, its cost at N threads over its cost at one. A
//! criterion filter that matches nothing (`cargo bench --bench hit_path -- table`) prints the table
//! alone. `KPC_BENCH_THREADS` sets N (default: the available parallelism) or, as a comma-separated
//! list, the exact thread counts (ENVIRONMENT.md).
//!
//! The goal (issue 18): per-thread cost at 16 threads at most 1.5x the one-thread cost, for the kernel
//! cache and the `Context::kernel` call alike.

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
use kpc::BackendKind;
use kpc::DeviceImage;
use kpc::admin::cache::{
    BuildError, CacheCost, KernelKey, KernelProgramCache, MemCacheSettings, ProgramKey,
};
use kpc::admin::runtime::ProgramManager;
use kpc::{BuildOptions, Digest, SpecConstants, SpecValue};
use kpc::{Config, Context};

struct Prog;
impl CacheCost for Prog {
    fn cache_bytes(&self) -> u64 {
        1
    }
}

/// Keys shaped like real ones: a spec constant, build options, an entry name.
fn key(i: u32) -> KernelKey {
    KernelKey::new(
        ProgramKey::new(
            Digest::of(&i.to_le_bytes()),
            SpecConstants::new().with(0, SpecValue::U32(64)),
            Digest::of(b"device"),
            BuildOptions::new("-O"),
        ),
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
    /// The cache's hit path as the runtime takes it: the thread's front, then (first hit of a thread
    /// only) the shared map.
    #[inline]
    fn hit(&self, i: u32) {
        let k = &self.keys[(i % KEYS) as usize];
        black_box(self.cache.kernel_local(k).unwrap());
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

/// The whole runtime call an application makes, as `Context::kernel` makes it on its backend: key
/// construction from (image, entry, spec, options) plus the hit, on the counting fake backend (what the
/// numbers of issue 18 measured), through the same `ProgramManager::kernel_local` that the context's
/// backend-erased `kernel` calls.
struct Runtime {
    pm: ProgramManager,
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
                .kernel_local(&self.image, "attention_decode", &self.spec, &self.options)
                .unwrap(),
        );
    }
}

/// `Context::kernel` itself on the real device `KPC_DEVICE` selects (lavapipe or PoCL on a CPU-only
/// machine, the GPU on a GPU host): the same call plus the context's entry-point check, its
/// backend-erased dispatch and the `Kernel` handle it returns.
struct DeviceCall {
    ctx: Context,
    image: DeviceImage,
    entry: &'static str,
}

impl DeviceCall {
    /// `None` (with the reason printed) where no device opens.
    fn open() -> Option<Self> {
        let config = Config::from_env()
            .map(|mut c| {
                c.persistent = false;
                c
            })
            .map_err(|e| eprintln!("hit_path: no device column: {e}"))
            .ok()?;
        let ctx = Context::builder()
            .config(config.clone())
            .build()
            .map_err(|e| eprintln!("hit_path: no device column: {e}"))
            .ok()?;
        let image = match ctx.backend() {
            BackendKind::Vulkan => kpc::kernels::spirv_image("copy"),
            BackendKind::OpenCl => kpc::kernels::opencl_image("copy"),
        }
        .unwrap();
        let d = DeviceCall {
            ctx,
            image,
            entry: "copy",
        };
        d.ctx
            .kernel(&d.image, d.entry)
            .map_err(|e| eprintln!("hit_path: no device column: {e}"))
            .ok()?;
        Some(d)
    }
}

impl HitPath for DeviceCall {
    #[inline]
    fn hit(&self, _i: u32) {
        black_box(self.ctx.kernel(&self.image, self.entry).unwrap());
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

/// 1, 2, 4, ... up to N, and N itself; N from `KPC_BENCH_THREADS`, else the available parallelism.
/// A comma-separated `KPC_BENCH_THREADS` gives the counts exactly.
fn thread_counts() -> Vec<usize> {
    let var = std::env::var("KPC_BENCH_THREADS").unwrap_or_default();
    let parse = |t: &str| match t.trim().parse::<usize>() {
        Ok(n) if n > 0 => n,
        _ => {
            eprintln!(
                "KPC_BENCH_THREADS={var:?} is not valid: expected a thread count above 0, or a \
                 comma-separated list of them (e.g. 16 or 1,2,4,8,16)"
            );
            std::process::exit(2);
        }
    };
    if var.contains(',') {
        return var.split(',').map(parse).collect();
    }
    let max = if var.trim().is_empty() {
        thread::available_parallelism().map_or(1, |n| n.get())
    } else {
        parse(&var)
    };
    let mut v = vec![1];
    while *v.last().unwrap() * 2 <= max {
        v.push(v.last().unwrap() * 2);
    }
    if *v.last().unwrap() != max {
        v.push(max);
    }
    v
}

/// The table's columns, in order: (header, criterion id, design); the device column only where a
/// device opens.
fn designs() -> Vec<(&'static str, &'static str, Arc<dyn HitPath>)> {
    let mut d: Vec<(&'static str, &'static str, Arc<dyn HitPath>)> = vec![
        ("kpc kernel cache", "kpc_kernel_cache", Arc::new(Kpc::new())),
        (
            "Context::kernel call",
            "kpc_runtime_call",
            Arc::new(Runtime::new()),
        ),
        (
            "global mutex",
            "global_mutex_hashmap",
            Arc::new(MutexMap::new()),
        ),
        (
            "private maps (control)",
            "thread_private_hashmap",
            Arc::new(PrivateMaps {
                keys: (0..KEYS).map(key).collect(),
            }),
        ),
    ];
    if let Some(dev) = DeviceCall::open() {
        let name = dev.ctx.device().name.clone();
        println!("device column: Context::kernel on {name}");
        d.push((
            "Context::kernel (device)",
            "context_kernel_device",
            Arc::new(dev),
        ));
    }
    d
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("hit_path");
    for (_, id, target) in designs() {
        for t in thread_counts() {
            g.bench_with_input(BenchmarkId::new(id, format!("{t}t")), &t, |b, &t| {
                b.iter_custom(|iters| run(&target, t, iters))
            });
        }
    }
    g.finish();
}

/// The side-by-side table: per design and thread count, the median of 7 runs of about 0.2 s each (at
/// most 2M hits per thread), then each design's cost at its most threads over its cost at one.
fn summary() {
    const MAX_ITERS: u64 = 2_000_000;
    let ns = |target: &Arc<dyn HitPath>, t| {
        // Calibrate (and warm up): a slow design at many threads gets fewer hits, not minutes.
        let probe = run(target, t, 20_000).as_nanos() as f64 / 20_000.0;
        let iters = ((2e8 / probe.max(1.0)) as u64).clamp(20_000, MAX_ITERS);
        let mut v: Vec<f64> = (0..7)
            .map(|_| run(target, t, iters).as_nanos() as f64 / iters as f64)
            .collect();
        v.sort_by(|a, b| a.partial_cmp(b).unwrap());
        v[3]
    };
    let d = designs();
    println!(
        "\nhit path, ns per hit per thread (median of 7 runs of ~0.2 s, at most {MAX_ITERS} hits per \
         thread; {KEYS} keys for the cache and the maps, one kernel for the calls):"
    );
    let header: Vec<String> = d.iter().map(|(h, _, _)| format!("{h:>24}")).collect();
    println!("{:>7} | {}", "threads", header.join(" | "));
    let counts = thread_counts();
    let mut first = vec![0.0; d.len()];
    let mut last = vec![0.0; d.len()];
    for &t in &counts {
        let row: Vec<f64> = d.iter().map(|(_, _, target)| ns(target, t)).collect();
        if t == counts[0] {
            first.clone_from(&row);
        }
        last.clone_from(&row);
        let cells: Vec<String> = row.iter().map(|v| format!("{v:>24.1}")).collect();
        println!("{t:>7} | {}", cells.join(" | "));
    }
    let ratios: Vec<String> = first
        .iter()
        .zip(&last)
        .map(|(a, b)| format!("{:>23.2}x", b / a))
        .collect();
    let label = format!("{}t/{}t", counts.last().unwrap(), counts[0]);
    println!("{label:>7} | {}", ratios.join(" | "));
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
