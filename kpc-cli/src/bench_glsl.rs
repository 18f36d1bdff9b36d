//! `kpc bench-glsl`: what GLSL images cost, per shipped kernel (the ones `kpc attention
//! --from-source` compiles), on the selected Vulkan device:
//! - `compile`: resolving includes and compiling the GLSL to SPIR-V (shaderc), nothing cached;
//! - `spirv disk hit`: the SPIR-V step of a new context whose disk cache has the entry (includes,
//!   key, lookup, checksum verification, parse; no glslang, no spirv-tools);
//! - `spirv memory hit`: the same context asked again with a new image of the same source;
//! - `cold`: a new context and an empty cache directory: GLSL -> SPIR-V -> pipeline (`Context::kernel`);
//! - `warm`: a new context on that directory: SPIR-V and program both from disk.
//!
//! Each figure is the median of `--repeat` runs, in milliseconds, each in a fresh cache directory
//! under `$TMPDIR`. Driver shader caches (Mesa's, NVIDIA's) should be off for cold figures to mean
//! cold: MESA_SHADER_CACHE_DISABLE=true, __GL_SHADER_DISK_CACHE=0.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Args as ClapArgs;
use kpc::admin::glsl::compile;
use kpc::select_device;
use kpc::{BackendKind, DeviceSelector};
use kpc::{BuildOptions, SpecConstants};
use kpc::{Config, Context, Error};

#[derive(ClapArgs, Debug)]
pub struct Args {
    /// Device selector (a KPC_DEVICE value, e.g. `vulkan:gpu`); default: KPC_DEVICE, else `vulkan:0`.
    #[arg(long)]
    device: Option<String>,
    /// Runs per figure; the median is printed.
    #[arg(long, default_value_t = 5)]
    repeat: usize,
    /// Only these kernels (comma separated); default: every shipped one that compiles from GLSL.
    #[arg(long, value_delimiter = ',')]
    kernels: Vec<String>,
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

struct Row {
    compile: Duration,
    disk_hit: Duration,
    mem_hit: Duration,
    cold: Duration,
    warm: Duration,
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
            "bench-glsl needs a Vulkan device; {selector:?} is {}",
            device.backend
        )));
    }
    let names: Vec<&str> = crate::shipped::spirv()
        .filter(|k| !k.cooperative_matrix)
        .map(|k| k.name)
        .filter(|n| args.kernels.is_empty() || args.kernels.iter().any(|k| k == n))
        .collect();
    let repeat = args.repeat.max(1);
    outln!(
        "kpc bench-glsl: {} [{}], driver {}; {}; median of {repeat}",
        device.name,
        device.device_type,
        device.driver,
        compile::compiler_identity()
    );
    outln!(
        "| kernel | GLSL bytes | compile ms | SPIR-V disk hit ms | SPIR-V memory hit ms | cold: GLSL -> pipeline ms | warm: both from disk ms |"
    );
    outln!("|---|---|---|---|---|---|---|");
    let base = std::env::temp_dir().join(format!("kpc-bench-glsl-{}", std::process::id()));
    let mut totals = [Duration::ZERO; 5];
    for name in &names {
        let mut rows = Vec::new();
        for rep in 0..repeat {
            let dir = base.join(format!("{name}-{rep}"));
            let _ = std::fs::remove_dir_all(&dir);
            rows.push(one(&device, config, name, dir.clone())?);
            let _ = std::fs::remove_dir_all(&dir);
        }
        let pick = |f: fn(&Row) -> Duration| median(rows.iter().map(f).collect());
        let r = [
            pick(|r| r.compile),
            pick(|r| r.disk_hit),
            pick(|r| r.mem_hit),
            pick(|r| r.cold),
            pick(|r| r.warm),
        ];
        for (t, x) in totals.iter_mut().zip(r) {
            *t += x;
        }
        let glsl = crate::shipped::glsl_image(name)?;
        outln!(
            "| {name} | {} | {:.2} | {:.3} | {:.4} | {:.1} | {:.1} |",
            glsl.bytes().len(),
            ms(r[0]),
            ms(r[1]),
            ms(r[2]),
            ms(r[3]),
            ms(r[4])
        );
    }
    outln!(
        "| all {} | | {:.2} | {:.3} | {:.4} | {:.1} | {:.1} |",
        names.len(),
        ms(totals[0]),
        ms(totals[1]),
        ms(totals[2]),
        ms(totals[3]),
        ms(totals[4])
    );
    let _ = std::fs::remove_dir_all(&base);
    Ok(ExitCode::SUCCESS)
}

fn one(device: &kpc::DeviceInfo, config: &Config, name: &str, dir: PathBuf) -> kpc::Result<Row> {
    let cfg = Config::builder()
        .persistent(true)
        .cache_dir(&dir)
        .trace(config.trace)
        .build()?;
    let spec = SpecConstants::new();
    let opts = BuildOptions::default();

    let image = crate::shipped::glsl_image(name)?;
    let src = image.glsl_source().expect("a GLSL image");
    let t = Instant::now();
    let pre = compile::preprocess(src)?;
    compile::compile(src, &pre)?;
    let compile_time = t.elapsed();

    // Cold: empty directory, new context.
    let ctx = Context::builder()
        .device(device)
        .config(cfg.clone())
        .build()?;
    let k = ctx.kernel_with(
        &kpc::KernelRequest::new(&crate::shipped::glsl_image(name)?, name)
            .spec(spec.clone())
            .options(opts.clone()),
    )?;
    let cold = k.acquire_time();
    drop((k, ctx));

    // Warm: a new context on the same directory; then a memory hit of the SPIR-V step.
    let ctx = Context::builder()
        .device(device)
        .config(cfg.clone())
        .build()?;
    let k = ctx.kernel_with(
        &kpc::KernelRequest::new(&crate::shipped::glsl_image(name)?, name)
            .spec(spec.clone())
            .options(opts.clone()),
    )?;
    let warm = k.acquire_time();
    let step = k.spirv_step().expect("a GLSL kernel");
    if step.source == kpc::Source::Built || k.source() == kpc::Source::Built {
        eprintln!(
            "bench-glsl: {name}: the warm run was not served from disk ({step}, program {})",
            k.source()
        );
    }
    let disk_hit = step.elapsed;
    let k = ctx.kernel_with(
        &kpc::KernelRequest::new(&crate::shipped::glsl_image(name)?, name)
            .spec(spec.clone())
            .options(opts.clone()),
    )?;
    let mem_hit = k.spirv_step().expect("a GLSL kernel").elapsed;
    Ok(Row {
        compile: compile_time,
        disk_hit,
        mem_hit,
        cold,
        warm,
    })
}
