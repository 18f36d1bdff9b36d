//! The one-thread `Context::kernel` memory hit in thread CPU time: the figure issue 26's backend seam
//! was checked with. Time the thread spends descheduled is not counted, so on a machine shared with
//! other work it varies far less than `hit_path`'s wall-clock columns (which it complements, not
//! replaces).
//!
//! Run: `cargo bench --bench hit_cpu [-- ROUNDS]` on the device `KPC_DEVICE` selects (lavapipe or PoCL
//! on a CPU-only machine). Prints the minimum and median over ROUNDS (default 15) rounds of 500,000
//! hits each. Without `--bench` (as `cargo test --all-targets` runs it) it makes one short round.

use std::hint::black_box;

use kpc::BackendKind;
use kpc::{Config, Context};

/// This thread's CPU time in nanoseconds.
fn cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; the clock id is a constant Linux defines.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0, "CLOCK_THREAD_CPUTIME_ID is not available");
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

fn main() {
    let bench = std::env::args().any(|a| a == "--bench");
    let rounds: usize = std::env::args()
        .skip(1)
        .find(|a| !a.starts_with('-'))
        .map_or(15, |a| {
            a.parse().unwrap_or_else(|_| {
                eprintln!("hit_cpu: {a:?} is not a round count (expected a number above 0)");
                std::process::exit(2)
            })
        })
        .max(1);
    let (rounds, hits) = if bench {
        (rounds, 500_000u64)
    } else {
        (1, 1_000)
    };
    let opened = Config::from_env()
        .map_err(|e| e.to_string())
        .and_then(|mut c| {
            c.persistent = false;
            Context::builder()
                .config(c.clone())
                .build()
                .map_err(|e| e.to_string())
        });
    let ctx = match opened {
        Ok(ctx) => ctx,
        Err(e) => {
            eprintln!("hit_cpu: no device, nothing measured: {e}");
            return;
        }
    };
    let image = match ctx.backend() {
        BackendKind::Vulkan => kpc::kernels::spirv_image("copy"),
        BackendKind::OpenCl => kpc::kernels::opencl_image("copy"),
    }
    .expect("the built-in copy kernel");
    ctx.kernel(&image, "copy").expect("the copy kernel builds");
    let mut ns: Vec<f64> = (0..rounds)
        .map(|_| {
            let t = cpu_ns();
            for _ in 0..hits {
                black_box(ctx.kernel(black_box(&image), "copy").expect("a memory hit"));
            }
            (cpu_ns() - t) as f64 / hits as f64
        })
        .collect();
    ns.sort_by(|a, b| a.total_cmp(b));
    println!(
        "Context::kernel memory hit on {}: min {:.1} median {:.1} ns/hit (thread CPU time, {rounds} \
         round(s) of {hits})",
        ctx.device().name,
        ns[0],
        ns[rounds / 2]
    );
}
