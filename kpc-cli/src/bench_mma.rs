//! `kpc bench-mma`: the device's matrix ceiling, and the projection GEMMs measured against it in the
//! same process.
//!
//! Sections (`--sections`, default all):
//! - `peak`: the cooperative-matrix multiply-add rate with operands in registers (`bench_mma`, mode
//!   0: KHR 16x16x16 fp16 products into fp32 and fp16 accumulators, several fragment counts per
//!   subgroup; `bench_mma_cm2`: VK_NV_cooperative_matrix2 workgroup-scope matrices, where the
//!   device has them), and fed from shared memory as a GEMM's inner loop reads it (`bench_mma`,
//!   mode 1);
//! - `copy`: device-to-device copy bandwidth (the `copy` kernel, 16 bytes per invocation and
//!   element; bytes read plus bytes written);
//! - `gemm`: `mha_gemm_wide` for each tile, activation type and accumulator asked for, and the
//!   previous kernel (`mha_gemm_coop`), at each `--shapes` M x N x K. Each figure is a batch of
//!   `--runs` launches timed on the device over `--runs` (median of three, after 100 ms of the same
//!   launches); TFLOP/s is 2 M N K over it and
//!   `of_peak` the fraction of the register-fed peak with the same accumulator. Every case is also
//!   checked against a float64 reference on sampled rows (`err`, relative 2-norm; the inputs are
//!   fp16 values, so f32 and fp16 activations see the same numbers), and at the `--check-shapes`
//!   (edge tiles, K not a multiple of the step) every element of the output, poisoned first, is.
//!
//! Inputs are not rotated between launches: a projection's weights (32 MiB at N = K = 4096) stay in
//! the H100's 50 MiB L2 either way, and the GEMMs are bound by arithmetic.

use std::process::ExitCode;
use std::time::Duration;

use clap::Args as ClapArgs;
use kpc::select_device;
use kpc::{BackendKind, DeviceSelector};
use kpc::{BufferArg, LaunchDesc};
use kpc::{Config, Context, Error, Event, Kernel, PushConstants};
use kpc::{SpecConstants, SpecValue};
use kpc_attention::mha::gemm::GemmAccumulator;

mod gemm;

#[derive(ClapArgs, Debug)]
pub struct Args {
    /// Device selector (a KPC_DEVICE value, e.g. `vulkan:gpu`); default: KPC_DEVICE, else `vulkan:0`.
    #[arg(long)]
    device: Option<String>,
    /// Sections to run: peak, copy, gemm (comma separated).
    #[arg(long, default_value = "peak,copy,gemm", value_delimiter = ',')]
    sections: Vec<String>,
    /// Loop iterations of the peak kernels per launch.
    #[arg(long, default_value_t = 1024)]
    iters: u32,
    /// Workgroups of the peak kernels per launch.
    #[arg(long, default_value_t = 2048)]
    groups: u32,
    /// Launches per figure (one batch; the median is reported).
    #[arg(long, default_value_t = 10)]
    runs: usize,
    /// GEMM shapes MxNxK (comma separated).
    #[arg(
        long,
        default_value = "2048x4096x4096,8192x4096x4096,2048x1024x4096,8192x1024x4096,2048x12288x4096,8192x12288x4096",
        value_delimiter = ','
    )]
    shapes: Vec<String>,
    /// Shapes checked element by element (not timed): edge tiles, K not a multiple of the step.
    #[arg(long, default_value = "333x264x200,130x520x72", value_delimiter = ',')]
    check_shapes: Vec<String>,
    /// GEMM cases, comma separated: `coop` (mha_gemm_coop, f32 A), or TILE:A:ACC with TILE as
    /// `BMxBNxBK/SGMxSGN[s1|s2][a1|a2]`, A `a16` or `a32`, ACC `acc32` or `acc16`. Default: every
    /// sweep tile with fp16 A and fp32 sums, a few with f32 A, and a few with fp16 sums (256 x 256
    /// among them).
    #[arg(long, value_delimiter = ',')]
    gemm: Vec<String>,
}

fn acc_name(acc: GemmAccumulator) -> &'static str {
    match acc {
        GemmAccumulator::F32 => "f32",
        GemmAccumulator::F16 => "f16",
    }
}

/// A small deterministic generator (xorshift64*), so that every run sees the same data.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in [-1, 1).
    fn unit(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
}

fn f16_bits(x: f32) -> u16 {
    half::f16::from_f32(x).to_bits()
}

fn f16_value(bits: u16) -> f32 {
    half::f16::from_bits(bits).to_f32()
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

/// Device time per launch: the case itself runs for 100 ms first (the GPU leaves its idle clocks
/// only under load, and host work between cases lets them drop), then three batches of `runs`
/// launches, each timed from its first launch's start to its last one's end (per-launch intervals
/// would count a launch's wait behind the previous one); the median batch over `runs`.
fn time_batch(runs: usize, submit: &dyn Fn(usize) -> kpc::Result<Event>) -> kpc::Result<Duration> {
    time_after(Duration::from_millis(100), runs, submit)
}

/// [`time_batch`] with `warm_for` of warm-up (longer after host work that idled the GPU).
fn time_after(
    warm_for: Duration,
    runs: usize,
    submit: &dyn Fn(usize) -> kpc::Result<Event>,
) -> kpc::Result<Duration> {
    let warm = std::time::Instant::now();
    while warm.elapsed() < warm_for {
        submit(runs)?.wait()?;
    }
    let mut per = Vec::new();
    for _ in 0..3 {
        let span = submit(runs)?.device_time()?.ok_or_else(|| {
            Error::InvalidArgument("the device cannot time launches (no timestamps)".into())
        })?;
        per.push(span / runs as u32);
    }
    Ok(median(per))
}

/// The driver's register count and spilled bytes (NVIDIA: `Register Count`, and `Local Memory
/// Size` above its 2^36 base), where it reports them.
fn registers(k: &Kernel) -> String {
    let stat = |name: &str| {
        k.driver_stats()
            .iter()
            .find(|(n, _)| n == name)
            .and_then(|(_, v)| v.parse::<u64>().ok())
    };
    let mut s = String::new();
    if let Some(r) = stat("Register Count") {
        s += &format!(" regs={r}");
    }
    if let Some(l) = stat("Local Memory Size") {
        s += &format!(" local_bytes={}", l.saturating_sub(1 << 36));
    }
    if let Some(l) = stat("Shared Memory Size") {
        s += &format!(" shared_bytes={l}");
    }
    s
}

fn kernel(ctx: &Context, name: &str, spec: &SpecConstants) -> kpc::Result<Kernel> {
    let image = kpc::kernels::spirv_image(name)?;
    ctx.kernel_with(&kpc::KernelRequest::new(&image, name).spec(spec.clone()))
}

fn launch_n<'a>(
    ctx: &Context,
    k: &'a Kernel,
    groups: [u32; 3],
    bufs: &'a [&'a dyn BufferArg],
    push: &'a PushConstants,
    n: usize,
) -> kpc::Result<Event> {
    let launches: Vec<LaunchDesc<'_>> = (0..n)
        .map(|_| LaunchDesc {
            kernel: k,
            groups,
            buffers: bufs,
            push_constants: push.as_bytes(),
        })
        .collect();
    ctx.queue().submit(&launches)
}

/// The register-fed peaks by accumulator (the largest of the variants), for `of_peak`.
#[derive(Default)]
struct Peaks {
    f32: f64,
    f16: f64,
}

fn peak(ctx: &Context, args: &Args, peaks: &mut Peaks) -> kpc::Result<()> {
    let l = &ctx.device().limits;
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    // Small values: fp16 sums of many products stay finite.
    let src: Vec<u16> = (0..128 * 256)
        .map(|_| f16_bits(rng.unit() * 1e-2))
        .collect();
    let src = ctx.buffer_from(&src)?;
    let push = PushConstants::new().u32(args.iters);
    if l.cooperative_matrix_f16 && l.subgroup_size == Some(32) {
        let out = ctx.buffer::<f32>(args.groups as usize * 8 * 256)?;
        for (mode, what) in [(0u32, "registers"), (1, "shared")] {
            for acc in [GemmAccumulator::F32, GemmAccumulator::F16] {
                if acc == GemmAccumulator::F16 && !l.cooperative_matrix_f16_acc {
                    continue;
                }
                for (am, bn) in [(4u32, 4u32), (4, 2), (2, 2)] {
                    let spec = SpecConstants::new()
                        .with(0, SpecValue::U32(256))
                        .with(1, SpecValue::U32(mode))
                        .with(2, SpecValue::Bool(acc == GemmAccumulator::F16))
                        .with(3, SpecValue::U32(am))
                        .with(4, SpecValue::U32(bn));
                    let k = kernel(ctx, "bench_mma", &spec)?;
                    let bufs: [&dyn BufferArg; 2] = [&src, &out];
                    let t = time_batch(args.runs, &|n| {
                        launch_n(ctx, &k, [args.groups, 1, 1], &bufs, &push, n)
                    })?;
                    let flops =
                        args.groups as f64 * 8.0 * args.iters as f64 * (am * bn) as f64 * 8192.0;
                    let tflops = flops / t.as_secs_f64() / 1e12;
                    if mode == 0 {
                        let p = match acc {
                            GemmAccumulator::F32 => &mut peaks.f32,
                            GemmAccumulator::F16 => &mut peaks.f16,
                        };
                        *p = p.max(tflops);
                    }
                    outln!(
                        "bench: kind=mma api=khr operands={what} acc={} frags={am}x{bn} groups={} iters={} us={:.1} tflops={tflops:.1}{}",
                        acc_name(acc),
                        args.groups,
                        args.iters,
                        t.as_secs_f64() * 1e6,
                        registers(&k)
                    );
                }
            }
        }
    } else {
        outln!(
            "bench: kind=mma api=khr skipped: the device has no 16x16x16 fp16 cooperative matrices"
        );
    }
    if l.cooperative_matrix2_workgroup >= 256 {
        let out = ctx.buffer::<f32>(256 * 256)?;
        for acc in [GemmAccumulator::F32, GemmAccumulator::F16] {
            for (wm, wn, wk) in [(128u32, 128u32, 32u32), (128, 256, 32), (256, 128, 16)] {
                let spec = SpecConstants::new()
                    .with(0, SpecValue::U32(256))
                    .with(1, SpecValue::Bool(acc == GemmAccumulator::F16))
                    .with(2, SpecValue::U32(wm))
                    .with(3, SpecValue::U32(wn))
                    .with(4, SpecValue::U32(wk));
                let k = match kernel(ctx, "bench_mma_cm2", &spec) {
                    Ok(k) => k,
                    Err(e) => {
                        outln!(
                            "bench: kind=mma api=nv_cm2 acc={} tile={wm}x{wn}x{wk} error: {e}",
                            acc_name(acc)
                        );
                        continue;
                    }
                };
                let bufs: [&dyn BufferArg; 2] = [&src, &out];
                let groups = args.groups / 4;
                let t = time_batch(args.runs, &|n| {
                    launch_n(ctx, &k, [groups, 1, 1], &bufs, &push, n)
                })?;
                let flops = groups as f64 * args.iters as f64 * 2.0 * (wm * wn * wk) as f64;
                outln!(
                    "bench: kind=mma api=nv_cm2 operands=registers acc={} tile={wm}x{wn}x{wk} groups={groups} iters={} us={:.1} tflops={:.1}{}",
                    acc_name(acc),
                    args.iters,
                    t.as_secs_f64() * 1e6,
                    flops / t.as_secs_f64() / 1e12,
                    registers(&k)
                );
            }
        }
    } else {
        outln!(
            "bench: kind=mma api=nv_cm2 skipped: no workgroup-scope matrices of 256 invocations"
        );
    }
    Ok(())
}

fn copy(ctx: &Context, args: &Args) -> kpc::Result<()> {
    let bytes = 256usize << 20;
    let n = bytes / 16;
    let mut rng = Rng(7);
    let data: Vec<u32> = (0..bytes / 4).map(|_| rng.next() as u32).collect();
    let src = ctx.buffer_from(&data)?;
    let dst = ctx.buffer::<u32>(bytes / 4)?;
    let k = kernel(
        ctx,
        "copy",
        &SpecConstants::new().with(0, SpecValue::U32(256)),
    )?;
    let push = PushConstants::new().u32(n as u32);
    let groups = (n / 256).min(ctx.device().limits.max_workgroup_count[0] as usize) as u32;
    let bufs: [&dyn BufferArg; 2] = [&src, &dst];
    let t = time_batch(args.runs, &|r| {
        launch_n(ctx, &k, [groups, 1, 1], &bufs, &push, r)
    })?;
    let mut back = vec![0u32; 1024];
    dst.read_at(n * 4 - 1024, &mut back)?;
    let ok = back == data[n * 4 - 1024..];
    outln!(
        "bench: kind=copy bytes={bytes} us={:.1} gbs={:.1} (read + write){}",
        t.as_secs_f64() * 1e6,
        2.0 * bytes as f64 / t.as_secs_f64() / 1e9,
        if ok { "" } else { " WRONG-COPY" }
    );
    Ok(())
}

/// Copies 64 MiB back and forth until `time` has passed.
fn spin(ctx: &Context, time: Duration) -> kpc::Result<()> {
    let n = (64usize << 20) / 16;
    let a = ctx.buffer::<u32>(n * 4)?;
    let b = ctx.buffer::<u32>(n * 4)?;
    let k = kernel(
        ctx,
        "copy",
        &SpecConstants::new().with(0, SpecValue::U32(256)),
    )?;
    let push = PushConstants::new().u32(n as u32);
    let groups = (n / 256).min(ctx.device().limits.max_workgroup_count[0] as usize) as u32;
    let bufs: [&dyn BufferArg; 2] = [&a, &b];
    let start = std::time::Instant::now();
    while start.elapsed() < time {
        launch_n(ctx, &k, [groups, 1, 1], &bufs, &push, 20)?.wait()?;
    }
    Ok(())
}

pub fn run(config: &Config, args: &Args) -> kpc::Result<ExitCode> {
    let selector = match &args.device {
        Some(s) => DeviceSelector::parse(s)?,
        None if config.device != DeviceSelector::Auto => config.device,
        None => DeviceSelector::parse("vulkan:0")?,
    };
    let device = select_device(&selector)?;
    if device.backend != BackendKind::Vulkan {
        return Err(Error::InvalidArgument(format!(
            "bench-mma measures Vulkan devices; {} is {}",
            device.name, device.backend
        )));
    }
    if args.runs == 0 {
        return Err(Error::InvalidArgument("--runs must be at least 1".into()));
    }
    let ctx = Context::builder()
        .device(&device)
        .config(config.clone())
        .build()?;
    let l = &device.limits;
    outln!(
        "device: {} (driver {}, Vulkan {}), shared {} KiB per workgroup, subgroup {:?}, f16 matrices {} (fp16 sums {}), workgroup-scope matrices {}",
        device.name,
        device.driver,
        device.api_version,
        l.max_shared_memory_bytes / 1024,
        l.subgroup_size,
        l.cooperative_matrix_f16,
        l.cooperative_matrix_f16_acc,
        l.cooperative_matrix2_workgroup
    );
    // The GPU leaves its idle clocks only under sustained load: copies for 300 ms first.
    spin(&ctx, Duration::from_millis(300))?;
    let on = |s: &str| args.sections.iter().any(|x| x == s);
    let mut peaks = Peaks::default();
    if on("peak") {
        peak(&ctx, args, &mut peaks)?;
    }
    if on("copy") {
        copy(&ctx, args)?;
    }
    let mut ok = true;
    if on("gemm") {
        ok = gemm::gemm(&ctx, args, &peaks)?;
    }
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
