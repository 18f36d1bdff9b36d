//! `kpc bench-build`: for each shipped kernel, a cold build in a new process and a load of its
//! persisted binary in another new process, side by side.
//!
//! Each measurement runs in a child process of its own (this binary, re-invoked with a hidden
//! `--phase`), so neither benefits from the other's driver state; the only thing that crosses is the
//! binary, through a temporary file, as it would through the disk cache. Driver-level shader caches
//! are the caller's to turn off (the header says which variables are set).

use std::path::PathBuf;
use std::process::{Command, ExitCode};
use std::time::Instant;

use clap::{Args as ClapArgs, ValueEnum};
use kpc::BackendKind;
use kpc::DeviceImage;
use kpc::admin::backend::Backend;
use kpc::admin::vulkan::VulkanBackend;
use kpc::select_device;
use kpc::{BuildOptions, SpecConstants};
use kpc::{Config, Error};

#[derive(ClapArgs, Debug)]
pub struct Args {
    /// Only this shipped kernel (default: every one).
    #[arg(long)]
    kernel: Option<String>,
    /// Build options, e.g. "-O" (runs the spirv-tools optimizer).
    #[arg(long, default_value = "", allow_hyphen_values = true)]
    options: String,
    /// Internal: run one measurement phase in this process.
    #[arg(long, value_enum, hide = true)]
    phase: Option<Phase>,
    /// Internal: where the cold phase writes the binary and the load phase reads it.
    #[arg(long, hide = true)]
    blob: Option<PathBuf>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Phase {
    Cold,
    Load,
    /// OpenCL only: build, launch, then query the binary (see bench_build_cl.rs).
    ColdLaunch,
    /// Vulkan: one `Context::kernel` through every cache layer, with the disk cache at KPC_CACHE_DIR.
    Context,
}

const DRIVER_CACHE_VARS: &[&str] = &[
    "__GL_SHADER_DISK_CACHE",
    "MESA_SHADER_CACHE_DISABLE",
    "MESA_SHADER_CACHE_DIR",
    "RADV_DEBUG",
];

pub fn run(config: &Config, args: &Args) -> kpc::Result<ExitCode> {
    if let Some(phase) = args.phase {
        return phase_main(config, args, phase);
    }
    let device = select_device(&config.device)?;
    if device.backend == BackendKind::OpenCl {
        return crate::bench_build_cl::run(config, &device, args.kernel.as_deref(), &args.options);
    }
    let names: Vec<&str> = match &args.kernel {
        Some(k) => vec![k.as_str()],
        None => crate::shipped::spirv().map(|k| k.name).collect(),
    };
    outln!("kpc bench-build: cold build vs load of the persisted binary, each in a new process");
    outln!(
        "device:  {}:{} {} [{}]",
        device.backend,
        device.index,
        device.name,
        device.device_type
    );
    outln!("driver:  {} (API {})", device.driver, device.api_version);
    let set: Vec<String> = DRIVER_CACHE_VARS
        .iter()
        .filter_map(|v| std::env::var(v).ok().map(|x| format!("{v}={x}")))
        .collect();
    outln!(
        "driver shader caches: {}",
        if set.is_empty() {
            "no cache variable set (a warm driver cache may hide cold builds)".to_string()
        } else {
            set.join(" ")
        }
    );
    outln!("options: {:?}", args.options);
    outln!();
    outln!(
        "{:<10} {:>7} {:>11} {:>9} {:>8} {:>10} {:>8} {:>9} {:>10} {:>9} | {:>12} {:>12} {:>10} {:>9}",
        "kernel",
        "entries",
        "validate ms",
        "build ms",
        "blob B",
        "reflect ms",
        "load ms",
        "load2 ms",
        "driver hit",
        "cold/hit",
        "ctx built ms",
        "ctx disk ms",
        "driver hit",
        "built/disk"
    );
    let exe = std::env::current_exe().map_err(|e| Error::Io(format!("current_exe: {e}")))?;
    let dir = std::env::temp_dir().join(format!("kpc-bench-build-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| Error::Io(format!("{}: {e}", dir.display())))?;
    let mut failed = false;
    for name in names {
        let unfit =
            crate::shipped::spirv().any(|k| k.name == name && !k.matrices_fit(&device.limits));
        if unfit {
            outln!(
                "{name:<10} skipped: it multiplies cooperative matrices, which this device does not \
                 offer as it needs (VK_KHR_cooperative_matrix, 16x16 f16 into f32; for workgroup \
                 scope, VK_NV_cooperative_matrix2)"
            );
            continue;
        }
        let blob = dir.join(format!("{name}.bin"));
        let cache_dir = dir.join(format!("{name}-cache"));
        let child = |phase: &str| {
            let mut c = Command::new(&exe);
            kpc::admin::backend::with_original_loader_environment(&mut c)
                .env("KPC_CACHE_DIR", &cache_dir)
                .env("KPC_CACHE_PERSISTENT", "1")
                .args([
                    "bench-build",
                    "--kernel",
                    name,
                    "--phase",
                    phase,
                    "--options",
                ])
                .arg(&args.options)
                .arg("--blob")
                .arg(&blob)
                .output()
        };
        let parse =
            |out: std::io::Result<std::process::Output>| -> Result<Vec<(String, String)>, String> {
                let out = out.map_err(|e| e.to_string())?;
                let text = String::from_utf8_lossy(&out.stdout);
                let line = text
                    .lines()
                    .find_map(|l| l.strip_prefix("KPCBENCH "))
                    .ok_or_else(|| String::from_utf8_lossy(&out.stderr).trim().to_string())?;
                Ok(line
                    .split_whitespace()
                    .filter_map(|kv| {
                        kv.split_once('=')
                            .map(|(k, v)| (k.to_string(), v.to_string()))
                    })
                    .collect())
            };
        let row = parse(child("cold")).and_then(|c| parse(child("load")).map(|l| (c, l)));
        // End to end through the runtime: the first new process finds an empty disk cache and builds, the
        // second finds what the first persisted.
        let ctx_built = parse(child("context"));
        let ctx_disk = parse(child("context"));
        let get = |r: &Vec<(String, String)>, k: &str| {
            r.iter()
                .find(|(kk, _)| kk == k)
                .map_or("-".to_string(), |(_, v)| v.clone())
        };
        match row {
            Ok((c, l)) => {
                let num = |r: &Vec<(String, String)>, k: &str| get(r, k).parse::<f64>().ok();
                let cold = num(&c, "validate_ms")
                    .zip(num(&c, "cold_ms"))
                    .map(|(a, b)| a + b);
                let hit = num(&l, "reflect_ms")
                    .zip(num(&l, "load_ms"))
                    .map(|(a, b)| a + b);
                let ratio = match (cold, hit) {
                    (Some(a), Some(b)) if b > 0.0 => format!("{:.1}x", a / b),
                    _ => "-".into(),
                };
                let cell = |r: &Result<Vec<(String, String)>, String>, want: &str| match r {
                    Ok(v) if get(v, "source") == want => get(v, "ms"),
                    Ok(v) => format!("{}?", get(v, "source")),
                    Err(_) => "failed".into(),
                };
                let (cb, cd) = (cell(&ctx_built, "built"), cell(&ctx_disk, "disk"));
                let ctx_ratio = match (cb.parse::<f64>(), cd.parse::<f64>()) {
                    (Ok(a), Ok(b)) if b > 0.0 => format!("{:.1}x", a / b),
                    _ => "-".into(),
                };
                let ctx_hit = ctx_disk.as_ref().map_or("-".into(), |v| get(v, "hit"));
                outln!(
                    "{:<10} {:>7} {:>11} {:>9} {:>8} {:>10} {:>8} {:>9} {:>10} {:>9} | {:>12} {:>12} {:>10} {:>9}",
                    name,
                    get(&c, "entries"),
                    get(&c, "validate_ms"),
                    get(&c, "cold_ms"),
                    get(&c, "blob_bytes"),
                    get(&l, "reflect_ms"),
                    get(&l, "load_ms"),
                    get(&l, "load2_ms"),
                    get(&l, "hit"),
                    ratio,
                    cb,
                    cd,
                    ctx_hit,
                    ctx_ratio
                );
            }
            Err(e) => {
                failed = true;
                outln!("{name:<10} failed: {e}");
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    outln!();
    outln!("validate = spirv-tools validation + reflection of the image (a cold build needs it);");
    outln!(
        "build = build_program: vkCreateComputePipelines for every entry point, empty pipeline cache;"
    );
    outln!("reflect = reflection only (a load trusts the image its binary was built from);");
    outln!(
        "load = program_from_binary: header check, vkCreatePipelineCache, vkCreateComputePipelines;"
    );
    outln!(
        "load2 = the same load again in the same process (after the driver's per-process set-up);"
    );
    outln!(
        "driver hit = VK_EXT_pipeline_creation_feedback APPLICATION_PIPELINE_CACHE_HIT on load;"
    );
    outln!(
        "cold/hit = (validate + build) / (reflect + load). Device open and file I/O are excluded."
    );
    outln!(
        "ctx built / ctx disk = Context::kernel in a new process with an empty disk cache, then in another"
    );
    outln!(
        "new process with the cache the first one filled: keys, disk lookup (read + checksum) or build +"
    );
    outln!("put, pipeline creation. Device open is excluded.");
    if device.device_type == kpc::DeviceType::Cpu {
        outln!(
            "note: lavapipe compiles at first dispatch, not in vkCreateComputePipelines, and its"
        );
        outln!("pipeline cache is a stub: neither column includes that compile here.");
    }
    outln!(
        "rerun: KPC_DEVICE={} kpc bench-build{}",
        config.device,
        if args.options.is_empty() {
            String::new()
        } else {
            format!(" --options={:?}", args.options)
        }
    );
    Ok(if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

fn ms(d: std::time::Duration) -> String {
    format!("{:.3}", d.as_secs_f64() * 1e3)
}

fn phase_main(config: &Config, args: &Args, phase: Phase) -> kpc::Result<ExitCode> {
    let name = args
        .kernel
        .as_deref()
        .ok_or_else(|| Error::InvalidArgument("--phase needs --kernel".into()))?;
    let blob = args
        .blob
        .as_ref()
        .ok_or_else(|| Error::InvalidArgument("--phase needs --blob".into()))?;
    let device = select_device(&config.device).inspect_err(|_| {
        // A child that cannot find the device its parent measured on: show what it inherited that
        // decides which drivers load, since the parent's drivers may have changed its environment.
        let vars: Vec<String> = std::env::vars()
            .filter(|(k, _)| {
                [
                    "OCL", "OPENCL", "POCL", "CUDA", "LD_", "VK_", "__GL", "NVIDIA",
                ]
                .iter()
                .any(|p| k.starts_with(p))
            })
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        eprintln!("child environment: {}", vars.join(" "));
    })?;
    if device.backend == BackendKind::OpenCl {
        let phase = match phase {
            Phase::Cold => "cold",
            Phase::ColdLaunch => "cold-launch",
            Phase::Load => "load",
            Phase::Context => {
                return Err(Error::InvalidArgument(
                    "--phase context is for Vulkan devices".into(),
                ));
            }
        };
        return crate::bench_build_cl::phase(config, &device, name, &args.options, phase, blob);
    }
    if phase == Phase::ColdLaunch {
        return Err(Error::InvalidArgument(
            "--phase cold-launch is for OpenCL devices".into(),
        ));
    }
    if device.backend != BackendKind::Vulkan {
        return Err(Error::InvalidArgument(format!(
            "bench-build measures Vulkan kernels; KPC_DEVICE selected {}:{}",
            device.backend, device.index
        )));
    }
    if phase == Phase::Context {
        return context_phase(config, &device, name, &args.options);
    }
    let backend = VulkanBackend::open(device.index, config)?;
    let k = crate::shipped::spirv_kernel(name)?;
    let image = DeviceImage::new(k.name, kpc::ImageFormat::SpirV, k.spirv);
    // The cold path validates and reflects; the load path only reflects (see program_from_binary).
    let t = Instant::now();
    let module = match phase {
        Phase::Cold | Phase::ColdLaunch | Phase::Context => image.spirv_module()?,
        Phase::Load => image.spirv_reflection()?,
    };
    let prepare = t.elapsed();
    let spec = SpecConstants::new();
    let options = BuildOptions::new(&args.options);
    let io = |e: std::io::Error| Error::Io(format!("{}: {e}", blob.display()));
    match phase {
        Phase::Cold | Phase::ColdLaunch | Phase::Context => {
            let t = Instant::now();
            let program = backend.build_program(&image, &spec, &options)?;
            let cold = t.elapsed();
            let bytes = backend.program_binary(&program)?.unwrap_or_default();
            std::fs::write(blob, &bytes).map_err(io)?;
            outln!(
                "KPCBENCH entries={} validate_ms={} cold_ms={} blob_bytes={}",
                module.entry_points.len(),
                ms(prepare),
                ms(cold),
                bytes.len()
            );
        }
        Phase::Load => {
            let bytes = std::fs::read(blob).map_err(io)?;
            let t = Instant::now();
            let program = backend.program_from_binary(&image, &spec, &options, &bytes)?;
            let load = t.elapsed();
            // The same load again in this process: what remains once the driver's one-time,
            // per-process initialization (paid by whichever pipeline comes first) is out of the way.
            let t = Instant::now();
            drop(backend.program_from_binary(&image, &spec, &options, &bytes)?);
            let load2 = t.elapsed();
            let hits: Vec<String> = program
                .kernels()
                .map(|k| match k.driver_cache_hit {
                    Some(true) => "yes".to_string(),
                    Some(false) => "no".to_string(),
                    None => "unknown".to_string(),
                })
                .collect();
            outln!(
                "KPCBENCH reflect_ms={} load_ms={} load2_ms={} hit={}",
                ms(prepare),
                ms(load),
                ms(load2),
                hits.join(",")
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// One `Context::kernel` in this (new) process, timed as a user sees it.
fn context_phase(
    config: &Config,
    device: &kpc::DeviceInfo,
    name: &str,
    options: &str,
) -> kpc::Result<ExitCode> {
    let k = crate::shipped::spirv_kernel(name)?;
    let ctx = kpc::Context::builder()
        .device(device)
        .config(config.clone())
        .build()?;
    let image = DeviceImage::new(k.name, kpc::ImageFormat::SpirV, k.spirv);
    let t = Instant::now();
    let kernel = ctx.kernel_with(
        &kpc::KernelRequest::new(&image, k.name).options(BuildOptions::new(options)),
    )?;
    let took = t.elapsed();
    let hit = match kernel.driver_cache_hit() {
        Some(true) => "yes",
        Some(false) => "no",
        None => "unknown",
    };
    outln!(
        "KPCBENCH source={} ms={} hit={hit}",
        kernel.source(),
        ms(took)
    );
    Ok(ExitCode::SUCCESS)
}
