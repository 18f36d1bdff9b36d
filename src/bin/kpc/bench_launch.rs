//! `kpc bench-launch`: how fast one cached OpenCL kernel launches from many threads under each
//! kernel-sharing strategy (pool of kernel objects, clCloneKernel per launch, one locked kernel).
//!
//! Every thread has its own buffers and launches the same cached saxpy kernel. Two modes:
//! - `enqueue`: launches back to back, one wait at the end: the host cost of getting a kernel
//!   object, clSetKernelArg and clEnqueueNDRangeKernel, which is where the strategies differ;
//! - `wait`: each launch waited for before the next, as a caller that needs each result does.

use std::process::ExitCode;
use std::sync::Barrier;
use std::time::{Duration, Instant};

use clap::Args as ClapArgs;
use kpc::backend::opencl::{KernelSharing, OpenClBackend, OpenClOptions};
use kpc::cache::{BuildOptions, SpecConstants};
use kpc::config::BackendKind;
use kpc::runtime::device::select_device;
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
    let k = ctx.kernel(
        &image,
        "saxpy",
        &SpecConstants::new(),
        &BuildOptions::default(),
    )?;
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
    let barrier = Barrier::new(threads + 1);
    let elapsed = std::thread::scope(|s| -> kpc::Result<Duration> {
        let handles: Vec<_> = bufs
            .iter()
            .map(|b| {
                let (q, k, barrier, push) = (q.clone(), &k, &barrier, &push);
                s.spawn(move || -> kpc::Result<()> {
                    barrier.wait();
                    let mut last = None;
                    for _ in 0..launches {
                        let ev = q.launch(k, groups, &[&b.x, &b.y, &b.out], push.as_bytes())?;
                        if wait_each {
                            ev.wait()?;
                        } else {
                            last = Some(ev);
                        }
                    }
                    if let Some(ev) = last {
                        ev.wait()?;
                    }
                    Ok(())
                })
            })
            .collect();
        barrier.wait();
        let start = Instant::now();
        for h in handles {
            h.join()
                .map_err(|_| Error::Panicked("a bench-launch thread panicked".into()))??;
        }
        ctx.finish()?;
        Ok(start.elapsed())
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
    println!(
        "kpc bench-launch: one cached OpenCL kernel (saxpy, n = {}) launched from many threads",
        args.n
    );
    println!(
        "device:  {}:{} {} [{}]",
        device.backend, device.index, device.name, device.device_type
    );
    println!("driver:  {} (API {})", device.driver, device.api_version);
    println!(
        "{} launches per thread; microseconds per launch (wall time / all launches)",
        args.launches
    );
    println!();
    print!("{:<16}", "strategy");
    for t in &args.threads {
        print!(
            " {:>14} {:>14}",
            format!("enqueue {t}T"),
            format!("wait {t}T")
        );
    }
    println!();
    for (label, sharing) in [
        ("pool", KernelSharing::Pool),
        ("clone-per-launch", KernelSharing::ClonePerLaunch),
        ("lock", KernelSharing::Lock),
    ] {
        let backend = OpenClBackend::open_with(
            device.index,
            config,
            &OpenClOptions {
                kernel_sharing: sharing,
            },
        )?;
        let ctx = Context::from_backend(backend, config);
        print!("{label:<16}");
        for &t in &args.threads {
            for wait_each in [false, true] {
                let d = measure(
                    &ctx,
                    t.max(1),
                    args.launches.max(1),
                    args.n.max(1),
                    wait_each,
                )?;
                let per = d.as_secs_f64() * 1e6 / (t.max(1) * args.launches.max(1)) as f64;
                print!(" {per:>14.1}");
            }
        }
        println!();
    }
    println!();
    println!(
        "rerun: KPC_DEVICE={} kpc bench-launch --threads {} --launches {} --n {}",
        config.device,
        args.threads
            .iter()
            .map(|t| t.to_string())
            .collect::<Vec<_>>()
            .join(","),
        args.launches,
        args.n
    );
    Ok(ExitCode::SUCCESS)
}
