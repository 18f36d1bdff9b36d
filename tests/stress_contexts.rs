//! Contexts opened, used and dropped from many threads at once, on the real drivers (issue 21).
//!
//! Each of 16 threads repeatedly opens a context, builds and launches `saxpy`, checks the result
//! and drops the context. Mixed in:
//! - opens of a device that does not exist (a typed error, not a hang);
//! - contexts whose last handle is dropped on one thread while another thread of the same context
//!   still holds a kernel, a buffer and the queue, and launches with them afterwards.
//!
//! A hang fails the test with a message: a watchdog thread that sees no progress for
//! [`STALL_LIMIT`] prints what every worker was doing and exits the process with status 3 (a hung
//! thread cannot be cancelled, and a stalled CI job says nothing). Rounds per thread:
//! `KPC_TEST_STRESS_ROUNDS` (default 6; the GPU host ran 100).

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use common::drivers::{opencl_device, test_config, vulkan_device};
use kpc::BackendKind;
use kpc::DeviceInfo;
use kpc::{Buffer, Context, Error, PushConstants};

const THREADS: usize = 16;
/// No worker finishing a step for this long is a hang.
const STALL_LIMIT: Duration = Duration::from_secs(120);

fn rounds() -> usize {
    match std::env::var("KPC_TEST_STRESS_ROUNDS") {
        Ok(v) => v
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("KPC_TEST_STRESS_ROUNDS={v:?}: expected a whole number")),
        Err(_) => 6,
    }
}

/// What each worker is doing, for the watchdog's report.
const STEPS: &[&str] = &[
    "idle",
    "opening a context",
    "opening a missing device",
    "acquiring saxpy",
    "launching saxpy",
    "dropping the context",
    "handing the context to a second thread",
    "second thread launching after the owner dropped it",
    "done",
];

struct Progress {
    /// Per worker: (round << 8) | step index.
    state: Vec<AtomicU64>,
    /// Total steps taken by everyone: the watchdog's heartbeat.
    steps: AtomicU64,
}

impl Progress {
    fn set(&self, worker: usize, round: usize, step: &str) {
        let i = STEPS.iter().position(|s| *s == step).expect("known step") as u64;
        self.state[worker].store(((round as u64) << 8) | i, Ordering::Relaxed);
        self.steps.fetch_add(1, Ordering::Relaxed);
    }

    fn report(&self) -> String {
        self.state
            .iter()
            .enumerate()
            .map(|(w, s)| {
                let s = s.load(Ordering::Relaxed);
                format!(
                    "  worker {w:2}: round {}, {}",
                    s >> 8,
                    STEPS[(s & 0xff) as usize]
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// Runs `body(worker)` on [`THREADS`] threads under a watchdog.
fn stress(name: &str, body: impl Fn(usize, &Progress) + Sync) {
    let progress = Arc::new(Progress {
        state: (0..THREADS).map(|_| AtomicU64::new(0)).collect(),
        steps: AtomicU64::new(0),
    });
    let finished = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let watchdog = {
        let (progress, finished, name) = (progress.clone(), finished.clone(), name.to_string());
        thread::spawn(move || {
            let mut last = (progress.steps.load(Ordering::Relaxed), Instant::now());
            while !finished.load(Ordering::Relaxed) {
                thread::sleep(Duration::from_millis(200));
                let now = progress.steps.load(Ordering::Relaxed);
                if now != last.0 {
                    last = (now, Instant::now());
                } else if last.1.elapsed() > STALL_LIMIT {
                    eprintln!(
                        "{name}: HANG: no worker made progress for {STALL_LIMIT:?}; workers:\n{}",
                        progress.report()
                    );
                    std::process::exit(3);
                }
            }
        })
    };
    let start = Instant::now();
    thread::scope(|s| {
        for w in 0..THREADS {
            let (body, progress) = (&body, &*progress);
            s.spawn(move || {
                body(w, progress);
                progress.set(w, 0, "done");
            });
        }
    });
    finished.store(true, Ordering::Relaxed);
    watchdog.join().unwrap();
    eprintln!(
        "{name}: {THREADS} threads x {} rounds in {:.1} s",
        rounds(),
        start.elapsed().as_secs_f64()
    );
}

/// Launches saxpy with a = `a` over a few hundred elements on `ctx` and checks the output.
fn launch_and_check(ctx_queue: &kpc::Queue, k: &kpc::Kernel, bufs: &[Buffer<f32>; 3], a: f32) {
    let n = bufs[0].len();
    let push = PushConstants::new().u32(n as u32).f32(a);
    let groups = k.groups_for([n as u64, 1, 1]).unwrap();
    ctx_queue
        .launch(k, groups, &[&bufs[0], &bufs[1], &bufs[2]], push.as_bytes())
        .expect("launch")
        .wait()
        .expect("wait");
    let (x, y, out) = (
        bufs[0].read().unwrap(),
        bufs[1].read().unwrap(),
        bufs[2].read().unwrap(),
    );
    for i in 0..n {
        let want = a * x[i] + y[i];
        assert!(
            (out[i] - want).abs() <= 1e-5 * (1.0 + want.abs()),
            "out[{i}] = {}, expected {want}",
            out[i]
        );
    }
}

fn saxpy_setup(ctx: &Context, seed: usize) -> (kpc::Kernel, [Buffer<f32>; 3]) {
    let image = match ctx.backend() {
        BackendKind::Vulkan => kpc::kernels::spirv_image("saxpy"),
        BackendKind::OpenCl => kpc::kernels::opencl_image("saxpy"),
    }
    .unwrap();
    let k = ctx.kernel(&image, "saxpy").expect("saxpy builds");
    let n = 200 + seed % 64;
    let x: Vec<f32> = (0..n).map(|i| (i + seed) as f32 * 0.25).collect();
    let y: Vec<f32> = (0..n).map(|i| 1.0 - i as f32).collect();
    let bufs = [
        ctx.buffer_from(&x).unwrap(),
        ctx.buffer_from(&y).unwrap(),
        ctx.buffer_from(&vec![f32::NAN; n]).unwrap(),
    ];
    (k, bufs)
}

fn missing_device(d: &DeviceInfo) -> DeviceInfo {
    let mut missing = d.clone();
    missing.index = 10_000;
    missing
}

/// One worker's rounds on `device`: plain rounds, failing opens and cross-thread drops in turn.
fn worker(device: &DeviceInfo, w: usize, p: &Progress) {
    let config = test_config();
    for round in 0..rounds() {
        match (w + round) % 4 {
            // A device that does not exist: a typed error, whatever the other threads do.
            0 => {
                p.set(w, round, "opening a missing device");
                let e = Context::builder()
                    .device(&missing_device(device))
                    .config(config.clone())
                    .build()
                    .unwrap_err();
                assert!(matches!(e, Error::NoSuchDevice { .. }), "{e}");
            }
            // The owner drops its context while a second thread still holds a kernel, buffers and
            // the queue, and launches with them afterwards: the second thread's drop is the last.
            1 => {
                p.set(w, round, "opening a context");
                let ctx = Context::builder()
                    .device(device)
                    .config(config.clone())
                    .build()
                    .expect("open");
                p.set(w, round, "acquiring saxpy");
                let (k, bufs) = saxpy_setup(&ctx, w * 1000 + round);
                let queue = ctx.queue();
                let (tx, rx) = std::sync::mpsc::channel::<()>();
                p.set(w, round, "handing the context to a second thread");
                let second = thread::spawn(move || {
                    rx.recv().unwrap();
                    launch_and_check(&queue, &k, &bufs, 2.5);
                    drop((k, bufs, queue));
                });
                p.set(w, round, "dropping the context");
                drop(ctx);
                tx.send(()).unwrap();
                p.set(
                    w,
                    round,
                    "second thread launching after the owner dropped it",
                );
                second.join().expect("the second thread's launch");
            }
            // Open, build, launch, drop.
            _ => {
                p.set(w, round, "opening a context");
                let ctx = Context::builder()
                    .device(device)
                    .config(config.clone())
                    .build()
                    .expect("open");
                p.set(w, round, "acquiring saxpy");
                let (k, bufs) = saxpy_setup(&ctx, w * 1000 + round);
                p.set(w, round, "launching saxpy");
                launch_and_check(&ctx.queue(), &k, &bufs, 1.5);
                p.set(w, round, "dropping the context");
                drop((k, bufs, ctx));
            }
        }
    }
}

#[test]
fn vulkan_contexts_from_many_threads() {
    let Some(d) = vulkan_device("vulkan_contexts_from_many_threads") else {
        return;
    };
    stress("vulkan", |w, p| worker(&d, w, p));
}

#[test]
fn opencl_contexts_from_many_threads() {
    let Some(d) = opencl_device("opencl_contexts_from_many_threads") else {
        return;
    };
    stress("opencl", |w, p| worker(&d, w, p));
}

/// Both backends at once in one process, as an embedder with both would.
#[test]
fn both_backends_at_once() {
    let (Some(v), Some(c)) = (
        vulkan_device("both_backends_at_once"),
        opencl_device("both_backends_at_once"),
    ) else {
        return;
    };
    stress("both", |w, p| {
        worker(if w % 2 == 0 { &v } else { &c }, w, p);
    });
}
