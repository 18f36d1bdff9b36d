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
        Phase::Floor | Phase::Record => Vec::new(),
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
