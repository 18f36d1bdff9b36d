//! `kpc attention`: a prompt's causal prefill and N decode steps with a KV cache, on the selected
//! device. Prints where each kernel came from (built, memory, disk) and how long it took to acquire,
//! prefill time and TFLOP/s, decode µs per step and GB/s next to the device's copy bandwidth measured
//! in the same run, and with `--check` the error against the float64 reference.

use std::io::Write;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Args as ClapArgs;
use kpc::attention::reference::{attention, relative_error};
use kpc::attention::{Attention, AttentionOptions, AttentionShape, KvCache, KvDtype};
use kpc::cache::{BuildOptions, SpecConstants};
use kpc::config::{BackendKind, DeviceSelector};
use kpc::runtime::device::select_device;
use kpc::{Config, Context, Error, PushConstants};

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum BackendArg {
    Vulkan,
    Opencl,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum KvArg {
    F16,
    F32,
}

#[derive(ClapArgs, Debug)]
pub struct Args {
    /// Backend; without it (and without --device) KPC_DEVICE decides.
    #[arg(long, value_enum)]
    backend: Option<BackendArg>,
    /// Device: an index on the backend, or a KPC_DEVICE selector such as `vulkan:gpu`.
    #[arg(long)]
    device: Option<String>,
    /// Sequences (B).
    #[arg(long, default_value_t = 1)]
    batch: usize,
    /// Query heads (Hq).
    #[arg(long, default_value_t = 8)]
    heads: usize,
    /// Key/value heads (Hkv); defaults to --heads.
    #[arg(long)]
    kv_heads: Option<usize>,
    /// Head dimension (D).
    #[arg(long, default_value_t = 64)]
    head_dim: usize,
    /// Prompt length prefilled.
    #[arg(long, default_value_t = 128)]
    prompt: usize,
    /// Decode steps after the prompt.
    #[arg(long, default_value_t = 32)]
    steps: usize,
    /// K/V storage type.
    #[arg(long, value_enum, default_value = "f16")]
    kv: KvArg,
    /// Compare every output with the float64 reference (fails above 1e-5 for f32, 2e-3 for f16).
    #[arg(long)]
    check: bool,
}

fn selector(args: &Args, config: &Config) -> kpc::Result<DeviceSelector> {
    let backend = args.backend.map(|b| match b {
        BackendArg::Vulkan => "vulkan",
        BackendArg::Opencl => "opencl",
    });
    let text = match (backend, args.device.as_deref()) {
        (_, Some(d)) if d.contains(':') => d.to_string(),
        (Some(b), Some(d)) => format!("{b}:{d}"),
        (None, Some(d)) => format!("any:{d}"),
        (Some(b), None) => format!("{b}:0"),
        (None, None) => return Ok(config.device),
    };
    Ok(DeviceSelector::parse(&text)?)
}

/// Uniform numbers in [-1, 1) from a xorshift generator seeded by the clock: fresh inputs each run.
struct Rng(u64);

impl Rng {
    fn new() -> Rng {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64);
        Rng(t | 1)
    }
    fn vec(&mut self, n: usize) -> Vec<f32> {
        (0..n)
            .map(|_| {
                self.0 ^= self.0 << 13;
                self.0 ^= self.0 >> 7;
                self.0 ^= self.0 << 17;
                ((self.0 >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
            })
            .collect()
    }
}

/// `[h][len][d]` → the first `n` positions of each head.
fn prefix(x: &[f32], heads: usize, len: usize, d: usize, n: usize) -> Vec<f32> {
    (0..heads)
        .flat_map(|h| x[h * len * d..][..n * d].iter().copied())
        .collect()
}

/// `[h][len][d]` → position `pos` of each head, `[h][d]`.
fn position(x: &[f32], heads: usize, len: usize, d: usize, pos: usize) -> Vec<f32> {
    (0..heads)
        .flat_map(|h| x[(h * len + pos) * d..][..d].iter().copied())
        .collect()
}

/// The device's copy bandwidth in bytes per second (read + write), from the copy kernel.
fn copy_bandwidth(ctx: &Context) -> kpc::Result<(f64, kpc::Kernel)> {
    let image = match ctx.backend() {
        BackendKind::Vulkan => kpc::kernels::spirv_image("copy")?,
        BackendKind::OpenCl => kpc::kernels::opencl_image("copy")?,
    };
    let k = ctx.kernel(
        &image,
        "copy",
        &SpecConstants::new(),
        &BuildOptions::default(),
    )?;
    let n = 1usize << 20; // 16 MiB of uvec4
    let src = ctx.buffer::<u32>(4 * n)?;
    let dst = ctx.buffer::<u32>(4 * n)?;
    let mut groups = k.groups_for([n as u64, 1, 1])?;
    groups[0] = groups[0].min(ctx.device().limits.max_workgroup_count[0]);
    let push = PushConstants::new().u32(n as u32);
    let mut best = Duration::MAX;
    for _ in 0..5 {
        let t = Instant::now();
        let ev = ctx
            .queue()
            .launch(&k, groups, &[&src, &dst], push.as_bytes())?;
        ev.wait()?;
        let took = ev.device_time()?.unwrap_or_else(|| t.elapsed());
        best = best.min(took);
    }
    Ok((2.0 * (16 * n) as f64 / best.as_secs_f64(), k))
}

pub fn run(config: &Config, args: &Args) -> kpc::Result<ExitCode> {
    let shape = AttentionShape {
        batch: args.batch,
        q_heads: args.heads,
        kv_heads: args.kv_heads.unwrap_or(args.heads),
        head_dim: args.head_dim,
    };
    shape.validate()?;
    if args.prompt == 0 {
        return Err(Error::InvalidArgument("--prompt must be at least 1".into()));
    }
    let dtype = match args.kv {
        KvArg::F16 => KvDtype::F16,
        KvArg::F32 => KvDtype::F32,
    };
    let device = select_device(&selector(args, config)?)?;
    let ctx = Context::with_device(&device, config)?;
    let total = args.prompt + args.steps;
    let d = shape.head_dim;
    println!(
        "kpc attention: B={} Hq={} Hkv={} D={} prompt={} steps={} kv={:?}",
        shape.batch, shape.q_heads, shape.kv_heads, d, args.prompt, args.steps, dtype
    );
    println!(
        "device: {}:{} {} [{}], driver {}",
        device.backend, device.index, device.name, device.device_type, device.driver
    );

    let options = AttentionOptions::for_device(&device);
    let attn = Attention::new(&ctx, &shape, dtype, total, options)?;
    let (copy_bw, copy_kernel) = copy_bandwidth(&ctx)?;
    println!("kernels:");
    for k in attn.kernels().into_iter().chain([&copy_kernel]) {
        println!(
            "  {:<14} {:<6} {:>10.3} ms",
            k.name(),
            k.source().to_string(),
            k.acquire_time().as_secs_f64() * 1e3
        );
    }

    let rows_q = shape.batch * shape.q_heads;
    let rows_kv = shape.batch * shape.kv_heads;
    let mut rng = Rng::new();
    let q = rng.vec(rows_q * total * d);
    let k = rng.vec(rows_kv * total * d);
    let v = rng.vec(rows_kv * total * d);
    let mut got = vec![f32::NAN; q.len()];
    let mut cache = KvCache::new(&ctx, &shape, total, dtype)?;

    // Prefill.
    let qb = ctx.buffer_from(&prefix(&q, rows_q, total, d, args.prompt))?;
    let out = ctx.buffer_from(&vec![f32::NAN; rows_q * args.prompt * d])?;
    let t = Instant::now();
    let ev = attn.prefill(
        &mut cache,
        &qb,
        &prefix(&k, rows_kv, total, d, args.prompt),
        &prefix(&v, rows_kv, total, d, args.prompt),
        args.prompt,
        &out,
    )?;
    ev.wait()?;
    let prefill_time = ev.device_time()?.unwrap_or_else(|| t.elapsed());
    let o = out.read()?;
    for h in 0..rows_q {
        got[h * total * d..][..args.prompt * d]
            .copy_from_slice(&o[h * args.prompt * d..][..args.prompt * d]);
    }
    // Causal: about half of the L x L scores, two matmuls of 2 * D flops each.
    let flops = 2.0 * rows_q as f64 * (args.prompt as f64).powi(2) * d as f64;
    println!(
        "prefill: {:.3} ms, {:.4} TFLOP/s (causal, 2*B*H*L^2*D flops)",
        prefill_time.as_secs_f64() * 1e3,
        flops / prefill_time.as_secs_f64() / 1e12
    );

    // Decode: whole steps (append + split + reduce), wall time.
    let qb = ctx.buffer::<f32>(shape.q_elems())?;
    let out = ctx.buffer::<f32>(shape.q_elems())?;
    let mut step_time = Duration::ZERO;
    let mut bytes = 0f64;
    for (i, t_pos) in (args.prompt..total).enumerate() {
        qb.write(&position(&q, rows_q, total, d, t_pos))?;
        out.write(&vec![f32::NAN; shape.q_elems()])?;
        let (kn, vn) = (
            position(&k, rows_kv, total, d, t_pos),
            position(&v, rows_kv, total, d, t_pos),
        );
        let t = Instant::now();
        attn.decode_step(&mut cache, &qb, &kn, &vn, &out)?.wait()?;
        step_time += t.elapsed();
        bytes += 2.0 * (rows_kv * (t_pos + 1) * d * dtype.bytes()) as f64;
        let o = out.read()?;
        for h in 0..rows_q {
            got[(h * total + t_pos) * d..][..d].copy_from_slice(&o[h * d..][..d]);
        }
        if args.steps >= 100 && (i + 1) % (args.steps / 10) == 0 {
            eprint!("\rdecode {}/{}", i + 1, args.steps);
            let _ = std::io::stderr().flush();
        }
    }
    if args.steps >= 100 {
        eprintln!();
    }
    if args.steps > 0 {
        let secs = step_time.as_secs_f64();
        let bw = bytes / secs;
        println!(
            "decode:  {:.1} us/step (wall, append included), {:.2} GB/s of K/V read",
            secs / args.steps as f64 * 1e6,
            bw / 1e9
        );
        println!(
            "copy:    {:.2} GB/s (copy kernel, same run); decode/copy = {:.1}%",
            copy_bw / 1e9,
            100.0 * bw / copy_bw
        );
    }

    if args.check {
        let want = attention(&shape, &q, &k, &v, total, total, true)?;
        let err = relative_error(&got, &want);
        let tolerance = match dtype {
            KvDtype::F32 => 1e-5,
            KvDtype::F16 => 2e-3,
        };
        let ok = err <= tolerance;
        println!(
            "check:   |out - ref| / |ref| = {err:.3e} (tolerance {tolerance:e}): {}",
            if ok { "ok" } else { "FAILED" }
        );
        if !ok {
            return Ok(ExitCode::FAILURE);
        }
    }
    Ok(ExitCode::SUCCESS)
}
