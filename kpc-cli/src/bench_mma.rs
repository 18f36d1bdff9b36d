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
use kpc::{Buffer, Config, Context, Error, Event, Kernel, PushConstants};
use kpc::{BufferArg, LaunchDesc};
use kpc::{SpecConstants, SpecValue};
use kpc_attention::mha::gemm::{
    GemmAccumulator, GemmShape, GemmTiles, KERNEL, SWEEP_TILES, WideGemm,
};

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

/// One GEMM to time.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Case {
    Coop,
    Wide {
        tiles: GemmTiles,
        a_f16: bool,
        acc: GemmAccumulator,
    },
}

impl Case {
    fn parse(text: &str) -> kpc::Result<Case> {
        if text == "coop" {
            return Ok(Case::Coop);
        }
        let bad = || {
            Error::InvalidArgument(format!(
                "GEMM case {text:?}: expected `coop` or TILE:a16|a32:acc32|acc16"
            ))
        };
        let mut parts = text.split(':');
        let tiles = GemmTiles::parse(parts.next().ok_or_else(bad)?)?;
        let a_f16 = match parts.next() {
            Some("a16") | None => true,
            Some("a32") => false,
            Some(_) => return Err(bad()),
        };
        let acc = match parts.next() {
            Some("acc32") | None => GemmAccumulator::F32,
            Some("acc16") => GemmAccumulator::F16,
            Some(_) => return Err(bad()),
        };
        if parts.next().is_some() {
            return Err(bad());
        }
        Ok(Case::Wide { tiles, a_f16, acc })
    }

    fn defaults() -> Vec<Case> {
        let mut v = vec![Case::Coop];
        let t = |s: &str| GemmTiles::parse(s).expect("a valid built-in tile");
        v.extend(SWEEP_TILES.iter().map(|&tiles| Case::Wide {
            tiles,
            a_f16: true,
            acc: GemmAccumulator::F32,
        }));
        for s in ["128x256x32/2x4", "128x256x32/2x4e", "128x128x64/2x4a2"] {
            v.push(Case::Wide {
                tiles: t(s),
                a_f16: false,
                acc: GemmAccumulator::F32,
            });
        }
        // fp16 sums leave registers for 128 x 64 of C per subgroup (256 x 256).
        for s in [
            "256x256x32/2x4",
            "256x256x32/2x4e",
            "128x256x32/2x4",
            "128x128x64/2x4a2",
        ] {
            v.push(Case::Wide {
                tiles: t(s),
                a_f16: true,
                acc: GemmAccumulator::F16,
            });
        }
        v
    }

    fn label(&self) -> String {
        match self {
            Case::Coop => "kernel=mha_gemm_coop tiles=128x128x32/2x4 a=f32 acc=f32".into(),
            Case::Wide { tiles, a_f16, acc } => format!(
                "kernel={KERNEL} tiles={tiles} a={} acc={}",
                if *a_f16 { "f16" } else { "f32" },
                acc_name(*acc)
            ),
        }
    }

    fn acc(&self) -> GemmAccumulator {
        match self {
            Case::Coop => GemmAccumulator::F32,
            Case::Wide { acc, .. } => *acc,
        }
    }
}

fn acc_name(acc: GemmAccumulator) -> &'static str {
    match acc {
        GemmAccumulator::F32 => "f32",
        GemmAccumulator::F16 => "f16",
    }
}

fn parse_shape(text: &str) -> kpc::Result<(usize, usize, usize)> {
    let v: Vec<usize> = text
        .split('x')
        .map(|n| n.parse::<usize>())
        .collect::<Result<_, _>>()
        .map_err(|_| Error::InvalidArgument(format!("shape {text:?}: expected MxNxK")))?;
    match v.as_slice() {
        &[m, n, k] if m > 0 && n > 0 && k > 0 => Ok((m, n, k)),
        _ => Err(Error::InvalidArgument(format!(
            "shape {text:?}: expected MxNxK, each at least 1"
        ))),
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

/// One shape's inputs on the host and the device.
struct Inputs {
    m: usize,
    n: usize,
    k: usize,
    /// A as fp16 bits ([m][k]).
    a: Vec<u16>,
    a16: Buffer<u16>,
    a32: Buffer<f32>,
    /// W as fp16 bits ([n][k]).
    w: Vec<u16>,
    wd: Buffer<u32>,
    bias: Vec<f32>,
    biasd: Buffer<f32>,
    c: Buffer<f32>,
}

impl Inputs {
    fn new(ctx: &Context, m: usize, n: usize, k: usize, seed: u64) -> kpc::Result<Inputs> {
        let mut rng = Rng(seed | 1);
        let a: Vec<u16> = (0..m * k).map(|_| f16_bits(rng.unit())).collect();
        // Weights at a layer's scale (1 / sqrt(K)), so that outputs are O(1).
        let s = 1.0 / (k as f32).sqrt();
        let w: Vec<u16> = (0..n * k).map(|_| f16_bits(rng.unit() * s)).collect();
        let bias: Vec<f32> = (0..n).map(|_| rng.unit() * 0.1).collect();
        let a32: Vec<f32> = a.iter().map(|&b| f16_value(b)).collect();
        let pairs: Vec<u32> = w
            .chunks(2)
            .map(|c| c[0] as u32 | (c.get(1).copied().unwrap_or(0) as u32) << 16)
            .collect();
        Ok(Inputs {
            m,
            n,
            k,
            a16: ctx.buffer_from(&a)?,
            a32: ctx.buffer_from(&a32)?,
            a,
            wd: ctx.buffer_from(&pairs)?,
            w,
            biasd: ctx.buffer_from(&bias)?,
            bias,
            c: ctx.buffer::<f32>(m * n)?,
        })
    }

    /// Row `r` of A W^T + bias in float64.
    fn reference_row(&self, r: usize) -> Vec<f64> {
        let a: Vec<f64> = self.a[r * self.k..(r + 1) * self.k]
            .iter()
            .map(|&b| f16_value(b) as f64)
            .collect();
        (0..self.n)
            .map(|j| {
                let w = &self.w[j * self.k..(j + 1) * self.k];
                let dot: f64 = a.iter().zip(w).map(|(x, &y)| x * f16_value(y) as f64).sum();
                dot + self.bias[j] as f64
            })
            .collect()
    }

    fn shape(&self) -> GemmShape {
        GemmShape::plain(self.m, self.n, self.k)
    }
}

/// A built case, ready to launch.
enum Built {
    Coop(Kernel),
    Wide(WideGemm),
}

impl Built {
    fn new(ctx: &Context, case: &Case) -> kpc::Result<Built> {
        Ok(match case {
            Case::Coop => Built::Coop(kernel(ctx, "mha_gemm_coop", &SpecConstants::new())?),
            Case::Wide { tiles, a_f16, acc } => {
                Built::Wide(WideGemm::new(ctx, *tiles, *a_f16, *acc)?)
            }
        })
    }

    fn kernel(&self) -> &Kernel {
        match self {
            Built::Coop(k) => k,
            Built::Wide(g) => g.kernel(),
        }
    }

    fn label(&self, case: &Case) -> String {
        match (self, case) {
            (Built::Wide(g), Case::Wide { .. }) => Case::Wide {
                tiles: g.tiles(),
                a_f16: g.a_f16(),
                acc: g.accumulator(),
            }
            .label(),
            _ => case.label(),
        }
    }

    fn submit(&self, ctx: &Context, x: &Inputs, n: usize) -> kpc::Result<Event> {
        let s = x.shape();
        match self {
            Built::Coop(k) => {
                let push = s.push_constants();
                let bufs: [&dyn BufferArg; 6] = [&x.a32, &x.wd, &x.biasd, &x.c, &x.c, &x.c];
                let groups = [x.n.div_ceil(128) as u32, x.m.div_ceil(128) as u32, 1];
                launch_n(ctx, k, groups, &bufs, &push, n)
            }
            Built::Wide(g) => {
                let a: &dyn BufferArg = if g.a_f16() { &x.a16 } else { &x.a32 };
                g.launch(ctx, a, &x.wd, &x.biasd, [&x.c; 3], &s, n)
            }
        }
    }
}

/// Relative 2-norm error of the sampled rows (and whether every element of them is finite).
fn sampled_error(x: &Inputs, rows: &[usize], refs: &[Vec<f64>]) -> kpc::Result<(f64, bool)> {
    let (mut num, mut den, mut finite) = (0.0f64, 0.0f64, true);
    let mut got = vec![0f32; x.n];
    for (&r, want) in rows.iter().zip(refs) {
        x.c.read_at(r * x.n, &mut got)?;
        for (&g, &w) in got.iter().zip(want) {
            finite &= g.is_finite();
            num += (g as f64 - w) * (g as f64 - w);
            den += w * w;
        }
    }
    Ok(((num / den.max(1e-300)).sqrt(), finite))
}

/// The tolerance a case is held to: fp32 sums of exact fp16 products, or fp16 sums.
fn tolerance(acc: GemmAccumulator) -> f64 {
    match acc {
        GemmAccumulator::F32 => 1e-4,
        GemmAccumulator::F16 => 3e-2,
    }
}

fn gemm(ctx: &Context, args: &Args, peaks: &Peaks) -> kpc::Result<bool> {
    let cases = if args.gemm.is_empty() {
        Case::defaults()
    } else {
        args.gemm
            .iter()
            .map(|c| Case::parse(c))
            .collect::<kpc::Result<Vec<_>>>()?
    };
    let mut all_ok = true;
    let mut built = Vec::new();
    for case in &cases {
        match Built::new(ctx, case) {
            Ok(b) => {
                outln!(
                    "bench: kind=gemm-kernel {}{}",
                    b.label(case),
                    registers(b.kernel())
                );
                built.push((*case, b));
            }
            Err(e) => outln!("bench: kind=gemm-kernel {} refused: {e}", case.label()),
        }
    }
    // Every element, poisoned first, at the edge shapes.
    for text in &args.check_shapes {
        let (m, n, k) = parse_shape(text)?;
        let x = Inputs::new(ctx, m, n, k, (m * 31 + n * 7 + k) as u64)?;
        let refs: Vec<Vec<f64>> = (0..m).map(|r| x.reference_row(r)).collect();
        for (case, b) in &built {
            x.c.write(&vec![f32::NAN; m * n])?;
            b.submit(ctx, &x, 1)?.wait()?;
            let rows: Vec<usize> = (0..m).collect();
            let (err, finite) = sampled_error(&x, &rows, &refs)?;
            let ok = finite && err <= tolerance(case.acc());
            all_ok &= ok;
            outln!(
                "check: m={m} n={n} k={k} {} err={err:.2e} {}",
                b.label(case),
                if ok { "ok" } else { "FAIL" }
            );
        }
    }
    for text in &args.shapes {
        let (m, n, k) = parse_shape(text)?;
        let x = Inputs::new(ctx, m, n, k, (m * 31 + n * 7 + k) as u64)?;
        let rows = [0, 1, m / 3, m / 2, (2 * m) / 3, m - 2, m - 1]
            .into_iter()
            .filter(|&r| r < m)
            .collect::<Vec<_>>();
        let refs: Vec<Vec<f64>> = rows.iter().map(|&r| x.reference_row(r)).collect();
        let flops = x.shape().flops();
        let poison = vec![f32::NAN; m * n];
        for (i, (case, b)) in built.iter().enumerate() {
            x.c.write(&poison)?;
            // The shape's inputs and references were made on the host meanwhile: warm longer.
            let warm = Duration::from_millis(if i == 0 { 500 } else { 100 });
            let t = time_after(warm, args.runs, &|r| b.submit(ctx, &x, r))?;
            let (err, finite) = sampled_error(&x, &rows, &refs)?;
            let ok = finite && err <= tolerance(case.acc());
            all_ok &= ok;
            let tflops = flops / t.as_secs_f64() / 1e12;
            let peak = match case.acc() {
                GemmAccumulator::F32 => peaks.f32,
                GemmAccumulator::F16 => peaks.f16,
            };
            let of_peak = if peak > 0.0 {
                format!(" of_peak={:.3}", tflops / peak)
            } else {
                String::new()
            };
            outln!(
                "bench: kind=gemm m={m} n={n} k={k} {} us={:.1} tflops={tflops:.1}{of_peak} err={err:.2e} {}",
                b.label(case),
                t.as_secs_f64() * 1e6,
                if ok { "ok" } else { "FAIL" }
            );
        }
    }
    Ok(all_ok)
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
        ok = gemm(&ctx, args, &peaks)?;
    }
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
