//! The `kpc` command: runs the attention workload and inspects the caches.

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use kpc::Config;

// First: its `outln!` and `out!` are used by every module below.
#[macro_use]
mod out;

mod attention;
mod attention_args;
mod attention_check;
mod attention_measure;
mod attention_mha;
mod attention_report;
mod attention_stack;
mod bench_build;
mod bench_build_cl;
mod bench_glsl;
mod bench_launch;
mod bench_mma;
mod bench_start;
mod cache;
mod cache_bundle;
mod cache_check;
mod cache_explain;
mod cache_gc;
mod cache_keys;
mod cache_metrics;
mod cache_prebuild;
mod mha_random;
// `kpc cache ls --remote` and the remote in `kpc cache stats`.
mod cache_remote;
mod cache_report;
mod devices;
mod entry_fmt;
mod output;
mod shipped;
mod status;

/// kpc: GPU kernels built once, reused from memory and disk.
#[derive(Parser, Debug)]
#[command(name = "kpc", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run a causal prefill and decode steps with a KV cache, report kernel sources, timings and
    /// bandwidth, and with --check compare against the float64 reference.
    Attention(attention::Args),
    /// Print the resolved configuration and the disk cache's status (the default).
    Status,
    /// Inspect and maintain the on-disk cache.
    Cache {
        #[command(subcommand)]
        command: cache::CacheCommand,
    },
    /// List backends, devices, their types, driver versions and fingerprints.
    Devices,
    /// Time each shipped kernel's cold build and its load from the persisted binary (Vulkan: pipeline-cache
    /// blob; OpenCL: CL_PROGRAM_BINARIES), each in a fresh process.
    BenchBuild(bench_build::Args),
    /// Time launches of one cached OpenCL kernel from many threads under each kernel-sharing strategy.
    BenchLaunch(bench_launch::Args),
    /// One phase of the start-up measurement (floor, serial, prefetch, warm start, cold builds in
    /// parallel or alone); benches/hot_path_gpu.sh runs them in fresh processes.
    BenchStart(bench_start::Args),
    /// GLSL images: compile time per shipped kernel against SPIR-V cache hits, and the whole cold
    /// path (GLSL -> SPIR-V -> pipeline) against the warm one.
    BenchGlsl(bench_glsl::Args),
    /// The device's matrix ceiling (cooperative-matrix products with operands in registers and fed
    /// from shared memory, copy bandwidth) and the projection GEMMs swept against it.
    BenchMma(bench_mma::Args),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let config = match Config::from_env() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("kpc: {e}");
            return ExitCode::from(2);
        }
    };
    init_tracing(&config);
    let r = match cli.command.unwrap_or(Command::Status) {
        Command::Attention(args) => attention::run(&config, &args),
        Command::Status => status::run(&config),
        Command::Cache { command } => cache::run(&config, command),
        Command::Devices => devices::run(&config),
        Command::BenchBuild(args) => bench_build::run(&config, &args),
        Command::BenchLaunch(args) => bench_launch::run(&config, &args),
        Command::BenchStart(args) => bench_start::run(&config, &args),
        Command::BenchGlsl(args) => bench_glsl::run(&config, &args),
        Command::BenchMma(args) => bench_mma::run(&config, &args),
    };
    // What an unterminated line left in the buffer; a reader gone by now still ends quietly.
    out::flush();
    match r {
        Ok(code) => code,
        Err(e) => {
            eprintln!("kpc: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Routes kpc's events to stderr: always its warnings (a cache layer that degraded to "build it" says
/// so once per cause), and with KPC_CACHE_TRACE the selected layers' trace events too.
fn init_tracing(config: &Config) {
    let level = if config.trace.bits() != 0 {
        tracing::Level::DEBUG
    } else {
        tracing::Level::WARN
    };
    let _ = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_max_level(level)
        .with_target(true)
        .try_init();
}
