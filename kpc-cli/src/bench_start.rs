//! `kpc bench-start`: one phase of the start-up measurement of issue 18, in this process. The script
//! `benches/hot_path_gpu.sh` runs each phase in many fresh processes and takes medians.
//!
//! Phases (`--phase`):
//! - `record`: acquires the attention workload's kernels (what `kpc attention` acquires: the layer's
//!   kernels and the copy kernel) with warm start on under `--app`, which writes the manifest the
//!   other phases read. Run it once, with the disk cache at KPC_CACHE_DIR, before the warm phases.
//! - `floor`: only opens the device (the process floor).
//! - `serial`: opens the device, then acquires the recorded kernels one after the other on this
//!   thread (`Context::kernel`, today's way).
//! - `prefetch`: opens the device, then acquires them with `Context::prefetch`.
//! - `warm`: opens the device with warm start on (`--app`), waits for the background load, then asks
//!   for every kernel and checks each came from memory.
//! - `cold-parallel`: every shipped kernel of the backend at once with `Context::prefetch` (point
//!   KPC_CACHE_DIR at an empty directory and turn driver caches off).
//! - `cold-single`: one shipped kernel (`--kernel`), alone.
//! - `first-step`: the time to the first correct decode step (issue 45): opens the device, makes the
//!   attention layer (`--heads`, `--kv-heads`, `--head-dim`, f16 K/V; with `--lazy`,
//!   `AttentionOptions::lazy`), runs a causal prefill of `--prompt` positions and one decode step,
//!   reads the step's output and checks it against the float64 reference (outside the clock). Point
//!   KPC_CACHE_DIR at an empty directory and turn driver caches off for a cold start.
//!
//! Each prints one `bench-start:` line: `total_ms` from the start of this subcommand (configuration
//! read, device opened, kernels in memory) and `kernels_ms` from the device being open.

use std::process::ExitCode;
use std::time::Instant;

use clap::{Args as ClapArgs, ValueEnum};
use kpc::DeviceImage;
use kpc::DeviceInfo;
use kpc::admin::runtime::{WarmStart, manifest};
use kpc::select_device;
use kpc::{BackendKind, DeviceSelector};
use kpc::{Config, Context, Error};
use kpc::{KernelRequest, Source};
use kpc_attention::{Attention, AttentionOptions, AttentionShape, KvDtype};

#[derive(ClapArgs, Debug)]
pub struct Args {
    /// What this process measures.
    #[arg(long, value_enum)]
    phase: Phase,
    /// Device: a KPC_DEVICE selector such as `vulkan:gpu` (default: KPC_DEVICE).
    #[arg(long)]
    device: Option<String>,
    /// Warm-start application name the record and warm phases use.
    #[arg(long, default_value = "kpc-bench-start")]
    app: String,
    /// The shipped kernel the cold-single phase builds.
    #[arg(long)]
    kernel: Option<String>,
    /// Attention shape of the record phase: query heads, KV heads, head dimension.
    #[arg(long, default_value_t = 32)]
    heads: usize,
    #[arg(long, default_value_t = 32)]
    kv_heads: usize,
    #[arg(long, default_value_t = 128)]
    head_dim: usize,
    /// first-step: the prompt's positions before the decode step.
    #[arg(long, default_value_t = 64)]
    prompt: usize,
    /// first-step: request every specialized kernel with the generic one as its fallback
    /// (AttentionOptions::lazy).
    #[arg(long)]
    lazy: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Phase {
    Record,
    Floor,
    Serial,
    Prefetch,
    Warm,
    ColdParallel,
    ColdSingle,
    FirstStep,
}

fn ms(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}

/// The manifest `record` wrote for this device: an application knows its kernels without reading
/// anything, so the phases read it outside the clock.
fn recorded(config: &Config, device: &DeviceInfo, app: &str) -> kpc::Result<Vec<KernelRequest>> {
    let root = config.disk_cache_root().ok_or_else(|| {
        Error::InvalidArgument("bench-start needs the disk cache (KPC_CACHE_DIR)".into())
    })?;
    let path = bench_copy(root, device, app);
    let bytes = std::fs::read(&path).map_err(|e| {
        Error::Io(format!(
            "{}: {e} (run `kpc bench-start --phase record` first)",
            path.display()
        ))
    })?;
    manifest::decode(&bytes).map_err(|c| Error::Io(format!("{}: {}", path.display(), c.0)))
}

fn shipped(device: &DeviceInfo, only: Option<&str>) -> kpc::Result<Vec<KernelRequest>> {
    let images: Vec<DeviceImage> = match device.backend {
        BackendKind::Vulkan => crate::shipped::spirv()
            .filter(|k| k.matrices_fit(&device.limits))
            .filter(|k| only.is_none_or(|o| o == k.name))
            .map(|k| crate::shipped::spirv_image(k.name))
            .collect::<kpc::Result<_>>()?,
        BackendKind::OpenCl => crate::shipped::opencl()
            .filter(|k| only.is_none_or(|o| o == k.name))
            .map(|k| crate::shipped::opencl_image(k.name))
            .collect::<kpc::Result<_>>()?,
    };
    if images.is_empty() {
        return Err(Error::InvalidArgument(format!(
            "no shipped kernel {:?} runs on this device",
            only.unwrap_or("")
        )));
    }
    Ok(images
        .iter()
        .map(|i| KernelRequest::new(i, i.name()))
        .collect())
}

/// Where `record` leaves a copy of the warm-start manifest for the later phases, keyed by the
/// discovered device: the manifest itself is keyed by the opened device's fingerprint, which on a
/// device persisting pipeline binaries holds the driver's global key, known only once it is open,
/// and opening it before the clock would hand the measured context a ready device.
fn bench_copy(root: &std::path::Path, device: &DeviceInfo, app: &str) -> std::path::PathBuf {
    root.join(format!(
        "bench-start-{}-{app}.manifest",
        device.fingerprint.digest.short_hex(16)
    ))
}

/// The attention workload's kernels (what `kpc attention` acquires), with warm start recording them.
fn record(ctx: &Context, args: &Args, config: &Config, device: &DeviceInfo) -> kpc::Result<usize> {
    let shape = AttentionShape {
        batch: 1,
        q_heads: args.heads,
        kv_heads: args.kv_heads,
        head_dim: args.head_dim,
    };
    let options = AttentionOptions::for_device(ctx.device());
    let attn = Attention::new(ctx, &shape, KvDtype::F16, 1024, options)?;
    let mut names: Vec<String> = attn
        .kernels()
        .iter()
        .map(|k| k.name().to_string())
        .collect();
    let copy = match ctx.backend() {
        BackendKind::Vulkan => crate::shipped::spirv_image("copy")?,
        BackendKind::OpenCl => crate::shipped::opencl_image("copy")?,
    };
    ctx.kernel(&copy, "copy")?;
    names.push("copy".into());
    drop(attn);
    let listed = ctx.save_warm_start()?;
    if let Some(root) = config.disk_cache_root() {
        let ws = WarmStart::new(root, &ctx.device().fingerprint.digest, &args.app);
        let copy = bench_copy(root, device, &args.app);
        std::fs::copy(ws.manifest_path(), &copy)
            .map_err(|e| Error::Io(format!("{}: {e}", copy.display())))?;
    }
    outln!(
        "recorded: {} (the manifest lists {})",
        names.join(" "),
        listed.map_or("no new kernel".into(), |n| format!("{n} kernels"))
    );
    Ok(names.len())
}

pub fn run(config: &Config, args: &Args) -> kpc::Result<ExitCode> {
    let start = Instant::now();
    let mut config = config.clone();
    if let Some(d) = &args.device {
        config.device = DeviceSelector::parse(d)?;
    }
    if !kpc::admin::config::valid_app_name(&args.app) {
        return Err(Error::InvalidArgument(format!(
            "--app {:?}: expected {}",
            args.app,
            kpc::admin::config::PREFETCH_ACCEPTED
        )));
    }
    let warm = matches!(args.phase, Phase::Record | Phase::Warm);
    config.warm_start = warm.then(|| args.app.clone());
    let device = select_device(&config.device)?;
    // Set-up outside the clock: the request lists (an application has its images at hand).
    let setup = Instant::now();
    let reqs = match args.phase {
        Phase::Serial | Phase::Prefetch | Phase::Warm => recorded(&config, &device, &args.app)?,
        Phase::ColdParallel => shipped(&device, None)?,
        Phase::ColdSingle => {
            let k = args.kernel.as_deref().ok_or_else(|| {
                Error::InvalidArgument("--phase cold-single needs --kernel NAME".into())
            })?;
            shipped(&device, Some(k))?
        }
        Phase::Floor | Phase::Record | Phase::FirstStep => Vec::new(),
    };
    let setup_ms = ms(setup);
    let ctx = Context::builder()
        .device(&device)
        .config(config.clone())
        .build()?;
    let open_ms = ms(start) - setup_ms;
    let label = format!(
        "phase={} backend={} device={:?}",
        format!("{:?}", args.phase).to_lowercase(),
        ctx.backend(),
        ctx.device().name
    );
    let t = Instant::now();
    let mut each = Vec::new();
    match args.phase {
        Phase::FirstStep => return first_step(&ctx, args, &label, start, open_ms),
        Phase::Floor => {}
        Phase::Record => {
            record(&ctx, args, &config, &device)?;
        }
        Phase::Serial => {
            for r in &reqs {
                each.push(ctx.kernel_with(r)?);
            }
        }
        Phase::Prefetch | Phase::ColdParallel | Phase::ColdSingle => {
            for k in ctx.prefetch(reqs.clone()).wait() {
                each.push(k?);
            }
        }
        Phase::Warm => {
            let report = ctx.wait_warm_start();
            for r in &reqs {
                each.push(ctx.kernel_with(r)?);
            }
            if let Some(rep) = report {
                eprintln!(
                    "warm start: manifest {:?}, listed {}, loaded {}, not stored {}, failed {}, \
                     {:.2} ms from context creation to the last kernel in memory",
                    rep.state,
                    rep.listed,
                    rep.loaded,
                    rep.not_stored,
                    rep.failed,
                    rep.elapsed.as_secs_f64() * 1e3
                );
            }
        }
    }
    let kernels_ms = ms(t);
    let from_memory = each.iter().filter(|k| k.source() == Source::Memory).count();
    let detail: Vec<String> = each
        .iter()
        .map(|k| {
            format!(
                "{}:{}:{:.1}",
                k.name(),
                k.source(),
                k.acquire_time().as_secs_f64() * 1e3
            )
        })
        .collect();
    outln!(
        "bench-start: {label} kernels={} from_memory={from_memory} open_ms={open_ms:.2} kernels_ms={kernels_ms:.2} total_ms={:.2} each={}",
        each.len(),
        open_ms + kernels_ms,
        detail.join(",")
    );
    Ok(ExitCode::SUCCESS)
}

/// The `first-step` phase (see the module documentation): prints one `bench-start:` line with
/// `first_step_ms` from the start of this subcommand, and whether the step ran on the generic
/// kernel.
fn first_step(
    ctx: &Context,
    args: &Args,
    label: &str,
    start: Instant,
    open_ms: f64,
) -> kpc::Result<ExitCode> {
    use kpc_attention::KvCache;
    use kpc_attention::reference::{attention, relative_error};
    let shape = AttentionShape {
        batch: 1,
        q_heads: args.heads,
        kv_heads: args.kv_heads,
        head_dim: args.head_dim,
    };
    let prompt = args.prompt.max(1);
    let total = prompt + 1;
    let (rows_q, rows_kv, d) = (shape.q_heads, shape.kv_heads, shape.head_dim);
    // Inputs made before the clock's part that matters (they are the application's own data), in
    // the values an f16 cache stores, so that the check compares like with like.
    let mut rng = crate::attention_measure::Rng::new();
    let q = rng.vec(rows_q * total * d);
    let k = kpc_attention::round_to_f16(&rng.vec(rows_kv * total * d));
    let v = kpc_attention::round_to_f16(&rng.vec(rows_kv * total * d));
    let options = AttentionOptions {
        lazy: args.lazy,
        ..AttentionOptions::for_device(ctx.device())
    };
    let t = Instant::now();
    let attn = Attention::new(ctx, &shape, KvDtype::F16, total, options)?;
    let layer_ms = ms(t);
    let mut cache = KvCache::new(ctx, &shape, total, KvDtype::F16)?;
    let cut = |x: &[f32], heads: usize, from: usize, n: usize| -> Vec<f32> {
        (0..heads)
            .flat_map(|h| x[(h * total + from) * d..][..n * d].iter().copied())
            .collect()
    };
    let qb = ctx.buffer_from(&cut(&q, rows_q, 0, prompt))?;
    let out = ctx.buffer::<f32>(rows_q * prompt * d)?;
    attn.prefill(
        &mut cache,
        &qb,
        &cut(&k, rows_kv, 0, prompt),
        &cut(&v, rows_kv, 0, prompt),
        prompt,
        &out,
    )?
    .wait()?;
    let prefill_ms = ms(t) - layer_ms;
    let before = attn.lazy_report().map_or(0, |r| r.generic_calls);
    let qs = ctx.buffer_from(&cut(&q, rows_q, prompt, 1))?;
    let os = ctx.buffer_from(&vec![f32::NAN; shape.q_elems()])?;
    attn.decode_step(
        &mut cache,
        &qs,
        &cut(&k, rows_kv, prompt, 1),
        &cut(&v, rows_kv, prompt, 1),
        &os,
    )?
    .wait()?;
    let got = os.read()?;
    let first_ms = ms(start);
    let step_ms = ms(t);
    let want = attention(&shape, &cut(&q, rows_q, prompt, 1), &k, &v, 1, total, true)?;
    let err = relative_error(&got, &want);
    // Which kernel answered the step itself (the prefill may have run on the other).
    let generic = attn.lazy_report().is_some_and(|r| r.generic_calls > before);
    let prefill_generic = before > 0;
    let lazy = ctx.stats().lazy;
    outln!(
        "bench-start: {label} lazy={} step_generic={generic} prefill_generic={prefill_generic} \
         error={err:.2e} open_ms={open_ms:.2} layer_ms={layer_ms:.2} prefill_ms={prefill_ms:.2} \
         layer_to_step_ms={step_ms:.2} first_step_ms={first_ms:.2} served_generic={} pending={}",
        args.lazy,
        lazy.served_generic,
        lazy.pending
    );
    if err > 2e-3 {
        return Err(Error::InvalidArgument(format!(
            "the first decode step is wrong: relative error {err:e} against the reference"
        )));
    }
    Ok(ExitCode::SUCCESS)
}
