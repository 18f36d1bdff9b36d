//! What `kpc attention` prints: a short human summary first (device, what ran, each kernel and the
//! cache layer that served it, whether the check passed), then the detailed benchmark lines that
//! scripts parse (`bench: ...`), in the order they were measured.

use std::fmt::Write as _;

/// Appends one formatted line to a [`Report`]'s details.
macro_rules! say {
    ($report:expr, $($fmt:tt)*) => {
        $report.lines.push(format!($($fmt)*))
    };
}
pub(crate) use say;

/// One run's results, printed once the run is over so the summary can come first.
#[derive(Default)]
pub(crate) struct Report {
    /// What ran, in words (shape, dtype).
    pub what: String,
    /// The device, in words.
    pub device: String,
    /// Each kernel: name, the layer that served it (built, memory, disk, ...), milliseconds to acquire.
    pub kernels: Vec<(String, String, f64)>,
    /// Median prefill time, ms.
    pub prefill_ms: Option<f64>,
    /// Median decode wall time per step, µs.
    pub decode_us: Option<f64>,
    /// The reference check: worst relative error, tolerance.
    pub check: Option<(f64, f64)>,
    /// The detailed lines, as measured.
    pub lines: Vec<String>,
}

impl Report {
    /// The summary, then the details. `completed` is false when the run stopped on an error (printed
    /// by the caller): then only what was measured so far is shown.
    pub fn print(&self, completed: bool) {
        let mut s = String::new();
        let verdict = match (self.check, completed) {
            (_, false) => "stopped on an error (below)".to_string(),
            (Some((worst, tol)), true) if worst <= tol => format!(
                "check ok: matches the float64 reference (relative error {worst:.1e}, tolerance {tol:.0e})"
            ),
            (Some((worst, tol)), true) => format!(
                "check FAILED: relative error {worst:.1e} against the float64 reference exceeds {tol:.0e}"
            ),
            (None, true) => "ran (no reference check; pass --check)".to_string(),
        };
        let _ = writeln!(s, "kpc attention: {verdict}");
        let _ = writeln!(s, "  ran:     {}", self.what);
        let _ = writeln!(s, "  on:      {}", self.device);
        for (name, source, ms) in &self.kernels {
            let _ = writeln!(s, "  kernel:  {name:<20} {source:<9} in {ms:.1} ms");
        }
        let mut times = Vec::new();
        if let Some(ms) = self.prefill_ms {
            times.push(format!("prefill {ms:.3} ms"));
        }
        if let Some(us) = self.decode_us {
            times.push(format!("decode {us:.1} us/step"));
        }
        if !times.is_empty() {
            let _ = writeln!(
                s,
                "  time:    {} (every kernel ran once untimed first, so a driver's compile at its \
                 first dispatch is not in these figures)",
                times.join(", ")
            );
        }
        let _ = writeln!(s, "details:");
        out!("{s}");
        for l in &self.lines {
            outln!("{l}");
        }
    }
}

/// With `KPC_CACHE_SEAL` set: waits for the context's warm start, so that the seal is in force
/// before the first acquisition (a kernel the manifest lacks is then reported or refused here too),
/// and says so in one line.
/// The device line every attention run prints first: selector, name, type and driver.
pub(crate) fn device_line(d: &kpc::DeviceInfo) -> String {
    format!(
        "device: {}:{} {} [{}], driver {}",
        d.backend, d.index, d.name, d.device_type, d.driver
    )
}

pub(crate) fn seal_before_first_acquisition(ctx: &kpc::Context) {
    let mode = ctx.config().seal;
    if mode == kpc::SealMode::Off {
        return;
    }
    match ctx.wait_warm_start() {
        Some(r) => outln!(
            "sealed ({mode}) after warm start: {} of {} remembered kernels loaded in {:.1} ms",
            r.loaded,
            r.listed,
            r.elapsed.as_secs_f64() * 1e3
        ),
        None => outln!("sealed ({mode}) from the start (no warm start: KPC_CACHE_PREFETCH is off)"),
    }
}

/// What the generic fallbacks did in this run (`--lazy`), when any was served.
pub(crate) fn lazy_summary(ctx: &kpc::Context) {
    let l = ctx.stats().lazy;
    if l.served_generic + l.swapped_in + l.background_builds + l.background_failures > 0 {
        outln!(
            "generic fallbacks: served {} times ({} under the generic seal), {} specialized \
             kernels swapped in, {} background builds ({:.1} ms), {} failed, {} pending",
            l.served_generic,
            l.sealed_generic,
            l.swapped_in,
            l.background_builds,
            l.background_build_time.as_secs_f64() * 1e3,
            l.background_failures,
            l.pending
        );
    }
}

/// What sealing did in this run, when the context was sealed at any point.
pub(crate) fn seal_summary(ctx: &kpc::Context) {
    let s = ctx.stats().seal;
    if s.mode != kpc::SealMode::Off || s.builds + s.refused > 0 {
        outln!(
            "sealed ({}): {} builds after sealing, {} refused",
            s.mode,
            s.builds,
            s.refused
        );
    }
}
