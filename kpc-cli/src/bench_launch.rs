//! `kpc bench-launch`: how fast one cached OpenCL kernel launches from many threads under each
//! kernel-sharing strategy (pool of kernel objects, clCloneKernel per launch, one locked kernel).
//!
//! Every thread has its own buffers and launches the same cached saxpy kernel. Two modes:
//! - `enqueue`: launches back to back, timed until every thread has enqueued its last one (the
//!   waits come after the clock stops): the host cost of getting a kernel object, clSetKernelArg
//!   and clEnqueueNDRangeKernel, which is where the strategies differ;
//! - `wait`: each launch waited for before the next, as a caller that needs each result does;
//!   timed to the last result.
//!
//! Each cell is the median of `--repeat` runs.

use std::process::ExitCode;
use std::sync::Barrier;
use std::time::{Duration, Instant};

use clap::Args as ClapArgs;
use kpc::BackendKind;
use kpc::admin::opencl::{KernelSharing, OpenClBackend, OpenClOptions};
use kpc::select_device;
use kpc::{Buffer, Config, Context, Error, PushConstants};

#[derive(ClapArgs, Debug)]
pub struct Args {
    /// Thread counts to measure, comma separated.
    #[arg(long, default_value = "1,32", value_delimiter = ',')]
    threads: Vec<usize>,
    /// Launches per thread.
    #[arg(long, default_value_t = 200)]
    launches: usize,
    /// Elements per launch.
    #[arg(long, default_value_t = 1024)]
    n: usize,
    /// Runs per cell; the median is printed.
    #[arg(long, default_value_t = 5)]
    repeat: usize,
}

struct PerThread {
    x: Buffer<f32>,
    y: Buffer<f32>,
    out: Buffer<f32>,
}

fn measure(
    ctx: &Context,
    threads: usize,
    launches: usize,
    n: usize,
    wait_each: bool,
) -> kpc::Result<Duration> {
    let image = kpc::kernels::opencl_image("saxpy")?;
    let k = ctx.kernel(&image, "saxpy")?;
    let groups = k.groups_for([n as u64, 1, 1])?;
    let push = PushConstants::new().u32(n as u32).f32(2.0);
    let bufs = (0..threads)
        .map(|_| {
            Ok(PerThread {
                x: ctx.buffer_from(&vec![1.0f32; n])?,
                y: ctx.buffer_from(&vec![2.0f32; n])?,
                out: ctx.buffer::<f32>(n)?,
            })
        })
        .collect::<kpc::Result<Vec<_>>>()?;
    let q = ctx.queue();
    // Warm up: one launch per thread (grows a pool to its working size, JITs the kernel).
    for b in &bufs {
        q.launch(&k, groups, &[&b.x, &b.y, &b.out], push.as_bytes())?
            .wait()?;
    }
    let start_line = Barrier::new(threads + 1);
    let enqueued = Barrier::new(threads + 1);
    let elapsed = std::thread::scope(|s| -> kpc::Result<Duration> {
        let handles: Vec<_> = bufs
            .iter()
            .map(|b| {
                let (q, k, push) = (q.clone(), &k, &push);
                let (start_line, enqueued) = (&start_line, &enqueued);
                s.spawn(move || -> kpc::Result<()> {
                    start_line.wait();
                    let mut pending = Vec::new();
                    let mut r = Ok(());
                    for _ in 0..launches {
                        match q.launch(k, groups, &[&b.x, &b.y, &b.out], push.as_bytes()) {
                            Ok(ev) if wait_each => {
                                if let Err(e) = ev.wait() {
                                    r = Err(e);
                                    break;
                                }
                            }
                            Ok(ev) => pending.push(ev),
                            Err(e) => {
                                r = Err(e);
                                break;
                            }
                        }
                    }
                    // Always reach the barrier, even after an error, so the others are not stranded.
                    enqueued.wait();
                    for ev in pending {
                        ev.wait()?;
                    }
                    r
                })
            })
            .collect();
        start_line.wait();
        let start = Instant::now();
        enqueued.wait();
        let enqueue_time = start.elapsed();
        for h in handles {
            h.join()
                .map_err(|_| Error::Panicked("a bench-launch thread panicked".into()))??;
        }
        ctx.finish()?;
        Ok(if wait_each {
            start.elapsed()
        } else {
            enqueue_time
        })
    })?;
    // Every result is 2 * 1 + 2 = 4: the launches computed, not just ran.
    for b in &bufs {
        if b.out.read()?.iter().any(|&v| v != 4.0) {
            return Err(Error::InvalidArgument(
                "bench-launch computed a wrong result".into(),
            ));
        }
    }
    Ok(elapsed)
}

pub fn run(config: &Config, args: &Args) -> kpc::Result<ExitCode> {
    let device = select_device(&config.device)?;
    if device.backend != BackendKind::OpenCl {
        return Err(Error::InvalidArgument(format!(
            "bench-launch measures OpenCL kernel sharing; KPC_DEVICE selected {}:{} (try KPC_DEVICE=opencl:0)",
            device.backend, device.index
        )));
    }
    outln!(
        "kpc bench-launch: one cached OpenCL kernel (saxpy, n = {}) launched from many threads",
        args.n
    );
    outln!(
        "device:  {}:{} {} [{}]",
        device.backend,
        device.index,
        device.name,
        device.device_type
    );
    outln!("driver:  {} (API {})", device.driver, device.api_version);
    outln!(
        "{} launches per thread; microseconds per launch (wall time / all launches), median of {}",
        args.launches,
        args.repeat
    );
    outln!();
    out!("{:<16}", "strategy");
    for t in &args.threads {
        out!(
            " {:>14} {:>14}",
            format!("enqueue {t}T"),
            format!("wait {t}T")
        );
    }
    outln!();
    for (label, sharing) in [
        ("pool", KernelSharing::Pool),
        ("clone-per-launch", KernelSharing::ClonePerLaunch),
        ("lock", KernelSharing::Lock),
    ] {
        let backend = OpenClBackend::open_with(
            device.index,
            config,
            &OpenClOptions::default().kernel_sharing(sharing),
        )?;
        let ctx = Context::builder()
            .backend(backend)
            .config(config.clone())
            .build()?;
        out!("{label:<16}");
        for &t in &args.threads {
            for wait_each in [false, true] {
                let mut runs = (0..args.repeat.max(1))
                    .map(|_| {
                        measure(
                            &ctx,
                            t.max(1),
                            args.launches.max(1),
                            args.n.max(1),
                            wait_each,
                        )
                    })
                    .collect::<kpc::Result<Vec<Duration>>>()?;
                runs.sort();
                let d = runs[runs.len() / 2];
                let per = d.as_secs_f64() * 1e6 / (t.max(1) * args.launches.max(1)) as f64;
                out!(" {per:>14.1}");
            }
        }
        outln!();
    }
    outln!();
    outln!(
        "rerun: KPC_DEVICE={} kpc bench-launch --threads {} --launches {} --n {} --repeat {}",
        config.device,
        args.threads
            .iter()
            .map(|t| t.to_string())
            .collect::<Vec<_>>()
            .join(","),
        args.launches,
        args.n,
        args.repeat
    );
    Ok(ExitCode::SUCCESS)
}
