//! `kpc bench-build` on an OpenCL device: per shipped kernel, a cold build and a binary load, each
//! in a fresh process, with the costs a driver moves around between build, binary query and first
//! launch broken out.
//!
//! Three child processes per kernel (this binary re-invoked with a hidden `--phase`):
//! - `cold`: clBuildProgram from source, then the CL_PROGRAM_BINARIES query, then the first launch;
//! - `cold-launch`: clBuildProgram, the first launch, then the query (what a build costs when the
//!   binary is made off the critical path, and what the query costs after a launch);
//! - `load`: the container from `cold` through program_from_binary, then the first launch.
//!
//! Driver caches that would hide cold builds are turned off for the children unless the caller set
//! them: POCL_KERNEL_CACHE=0 with a fresh POCL_CACHE_DIR per process (PoCL), CUDA_CACHE_DISABLE=1
//! (NVIDIA). A launch is one workgroup with zeroed scalars and 64 KiB zeroed buffers: enough for
//! the driver to finish compiling (PoCL's work-group function, NVIDIA's PTX JIT), no real work.

use std::path::Path;
use std::process::{Command, ExitCode};
use std::sync::Arc;
use std::time::Instant;

use kpc::DeviceInfo;
use kpc::admin::backend::{Backend, ComputeBackend, KernelObject, Launch};
use kpc::admin::opencl::OpenClBackend;
use kpc::{BuildOptions, SpecConstants};
use kpc::{Config, Error};

/// Driver variables that change what is measured, shown in the header.
const DRIVER_VARS: &[&str] = &[
    "POCL_KERNEL_CACHE",
    "POCL_CACHE_DIR",
    "POCL_WORK_GROUP_SPECIALIZATION",
    "CUDA_CACHE_DISABLE",
];

fn ms(d: std::time::Duration) -> String {
    format!("{:.2}", d.as_secs_f64() * 1e3)
}

fn io(path: &Path) -> impl Fn(std::io::Error) -> Error + '_ {
    move |e| Error::Io(format!("{}: {e}", path.display()))
}

pub fn run(
    config: &Config,
    device: &DeviceInfo,
    kernel: Option<&str>,
    options: &str,
) -> kpc::Result<ExitCode> {
    let names: Vec<&str> = match kernel {
        Some(k) => vec![k],
        None => crate::shipped::opencl().map(|k| k.name).collect(),
    };
    outln!("kpc bench-build: OpenCL cold build vs binary load, each in a new process");
    outln!(
        "device:  {}:{} {} [{}]",
        device.backend,
        device.index,
        device.name,
        device.device_type
    );
    outln!("driver:  {} (API {})", device.driver, device.api_version);
    let user_set = |v: &str| std::env::var_os(v).is_some();
    let mut caches = Vec::new();
    if user_set("POCL_KERNEL_CACHE") || user_set("POCL_CACHE_DIR") {
        caches.push("PoCL cache as set by the caller".to_string());
    } else {
        caches.push("POCL_KERNEL_CACHE=0 + fresh POCL_CACHE_DIR per process".to_string());
    }
    if !user_set("CUDA_CACHE_DISABLE") {
        caches.push("CUDA_CACHE_DISABLE=1".to_string());
    }
    outln!(
        "driver caches (set for the children): {}",
        caches.join(", ")
    );
    let set: Vec<String> = DRIVER_VARS
        .iter()
        .filter_map(|v| std::env::var(v).ok().map(|x| format!("{v}={x}")))
        .collect();
    outln!(
        "caller's driver variables: {}",
        if set.is_empty() {
            "none".to_string()
        } else {
            set.join(" ")
        }
    );
    outln!("options: {options:?}");
    outln!();
    outln!(
        "{:<8} {:>9} {:>9} {:>10} {:>9} {:>10} {:>9} {:>9} {:>10} {:>9} {:>10}",
        "kernel",
        "build ms",
        "query ms",
        "launch1 ms",
        "| launch1",
        "query ms",
        "binary B",
        "load ms",
        "launch1 ms",
        "build/load",
        "first/first"
    );
    let exe = std::env::current_exe().map_err(|e| Error::Io(format!("current_exe: {e}")))?;
    let dir = std::env::temp_dir().join(format!("kpc-bench-build-cl-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(io(&dir))?;
    let mut failed = false;
    let mut fresh = 0;
    for name in names {
        let blob = dir.join(format!("{name}.bin"));
        let mut child = |phase: &str| -> Result<Vec<(String, String)>, String> {
            let mut c = Command::new(&exe);
            kpc::admin::backend::with_original_loader_environment(&mut c)
                .args([
                    "bench-build",
                    "--kernel",
                    name,
                    "--phase",
                    phase,
                    "--options",
                ])
                .arg(options)
                .arg("--blob")
                .arg(&blob)
                .env("KPC_DEVICE", format!("opencl:{}", device.index));
            if !user_set("POCL_KERNEL_CACHE") && !user_set("POCL_CACHE_DIR") {
                fresh += 1;
                let pocl = dir.join(format!("pocl-{fresh}"));
                c.env("POCL_KERNEL_CACHE", "0").env("POCL_CACHE_DIR", pocl);
            }
            if !user_set("CUDA_CACHE_DISABLE") {
                c.env("CUDA_CACHE_DISABLE", "1");
            }
            let out = c.output().map_err(|e| e.to_string())?;
            let text = String::from_utf8_lossy(&out.stdout);
            let line = text
                .lines()
                .find_map(|l| l.strip_prefix("KPCBENCH "))
                .ok_or_else(|| {
                    format!(
                        "{phase}: {}{}",
                        String::from_utf8_lossy(&out.stderr).trim(),
                        text.trim()
                    )
                })?;
            Ok(line
                .split_whitespace()
                .filter_map(|kv| {
                    kv.split_once('=')
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                })
                .collect())
        };
        let rows = child("cold").and_then(|c| {
            let cl = child("cold-launch")?;
            let l = child("load")?;
            Ok((c, cl, l))
        });
        let get = |r: &Vec<(String, String)>, k: &str| {
            r.iter()
                .find(|(kk, _)| kk == k)
                .map_or("-".to_string(), |(_, v)| v.clone())
        };
        let num = |r: &Vec<(String, String)>, k: &str| get(r, k).parse::<f64>().ok();
        match rows {
            Ok((c, cl, l)) => {
                let ratio = match (num(&c, "build_ms"), num(&l, "load_ms")) {
                    (Some(a), Some(b)) if b > 0.0 => format!("{:.0}x", a / b),
                    _ => "-".into(),
                };
                // Time to a first result: build + query + launch vs load + launch.
                let first = match (
                    num(&c, "build_ms"),
                    num(&c, "query_ms"),
                    num(&c, "launch_ms"),
                    num(&l, "load_ms"),
                    num(&l, "launch_ms"),
                ) {
                    (Some(b), Some(q), Some(la), Some(lo), Some(ll)) if lo + ll > 0.0 => {
                        format!("{:.0}x", (b + q + la) / (lo + ll))
                    }
                    _ => "-".into(),
                };
                outln!(
                    "{:<8} {:>9} {:>9} {:>10} {:>9} {:>10} {:>9} {:>9} {:>10} {:>9} {:>10}",
                    name,
                    get(&c, "build_ms"),
                    get(&c, "query_ms"),
                    get(&c, "launch_ms"),
                    get(&cl, "launch_ms"),
                    get(&cl, "query_ms"),
                    get(&c, "binary_bytes"),
                    get(&l, "load_ms"),
                    get(&l, "launch_ms"),
                    ratio,
                    first
                );
            }
            Err(e) => {
                failed = true;
                outln!("{name:<8} failed: {e}");
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    outln!();
    outln!(
        "build    = clBuildProgram from source + reflection (clGetKernelArgInfo), fresh process;"
    );
    outln!(
        "query    = the first CL_PROGRAM_BINARIES query right after it (kpc container included);"
    );
    outln!(
        "launch1  = first launch (1 workgroup) after the query; '| launch1' and the next 'query'"
    );
    outln!("           = first launch, then the query, in another fresh process (launch first);");
    outln!("load     = program_from_binary (container checks + clCreateProgramWithBinary +");
    outln!("           clBuildProgram), then its first launch, in a third fresh process;");
    outln!("first/first = (build + query + launch1) / (load + launch1): time to a first result.");
    outln!(
        "rerun: KPC_DEVICE={} kpc bench-build{}",
        config.device,
        if options.is_empty() {
            String::new()
        } else {
            format!(" --options={options:?}")
        }
    );
    Ok(if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

/// One workgroup of `kernel` with zeroed scalars and zeroed 64 KiB buffers; waits for it.
fn launch_once(b: &OpenClBackend, k: &kpc::admin::opencl::OpenClKernel) -> kpc::Result<()> {
    let info = k.info();
    let buffers = info
        .buffers
        .iter()
        .map(|_| {
            let buf = b.create_buffer(64 << 10)?;
            b.write_buffer(&buf, 0, &vec![0u8; 64 << 10])?;
            Ok(Arc::new(buf))
        })
        .collect::<kpc::Result<Vec<_>>>()?;
    let push = vec![0u8; info.push_constant_bytes as usize];
    let ev = b.submit(&[Launch {
        kernel: k,
        groups: [1, 1, 1],
        buffers,
        push_constants: &push,
    }])?;
    b.wait(&ev)
}

/// `phase` is `cold`, `cold-launch` or `load`.
pub fn phase(
    config: &Config,
    device: &DeviceInfo,
    name: &str,
    options: &str,
    phase: &str,
    blob: &Path,
) -> kpc::Result<ExitCode> {
    let t = Instant::now();
    let backend = OpenClBackend::open(device.index, config)?;
    let init = t.elapsed();
    let image = crate::shipped::opencl_image(name)?;
    let spec = SpecConstants::new();
    let options = BuildOptions::new(options);
    match phase {
        "cold" | "cold-launch" => {
            let t = Instant::now();
            let program = Arc::new(backend.build_program(&image, &spec, &options)?);
            let build = t.elapsed();
            let query_and_launch = |query_first: bool| -> kpc::Result<_> {
                let mut bytes = Vec::new();
                let mut query = Default::default();
                let mut launch = Default::default();
                for step in if query_first {
                    [true, false]
                } else {
                    [false, true]
                } {
                    let t = Instant::now();
                    if step {
                        bytes = backend.program_binary(&program)?.unwrap_or_default();
                        query = t.elapsed();
                    } else {
                        for entry in program.kernel_names() {
                            let k = backend.create_kernel(&program, entry)?;
                            launch_once(&backend, &k)?;
                        }
                        launch = t.elapsed();
                    }
                }
                Ok((bytes, query, launch))
            };
            let (bytes, query, launch) = query_and_launch(phase == "cold")?;
            if phase == "cold" {
                std::fs::write(blob, &bytes).map_err(io(blob))?;
            }
            outln!(
                "KPCBENCH init_ms={} build_ms={} query_ms={} launch_ms={} binary_bytes={}",
                ms(init),
                ms(build),
                ms(query),
                ms(launch),
                bytes.len()
            );
        }
        "load" => {
            let bytes = std::fs::read(blob).map_err(io(blob))?;
            let t = Instant::now();
            let program = Arc::new(backend.program_from_binary(&image, &spec, &options, &bytes)?);
            let load = t.elapsed();
            let t = Instant::now();
            for entry in program.kernel_names() {
                let k = backend.create_kernel(&program, entry)?;
                launch_once(&backend, &k)?;
            }
            let launch = t.elapsed();
            outln!(
                "KPCBENCH init_ms={} load_ms={} launch_ms={}",
                ms(init),
                ms(load),
                ms(launch)
            );
        }
        other => {
            return Err(Error::InvalidArgument(format!(
                "unknown bench-build phase {other:?}"
            )));
        }
    }
    Ok(ExitCode::SUCCESS)
}
