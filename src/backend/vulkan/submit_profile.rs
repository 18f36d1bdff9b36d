//! `KPC_VULKAN_SUBMIT_PROFILE`: where the host time of a submission goes, phase by phase, summed
//! over the process and printed on stderr when a submitter is dropped. A debug switch for the
//! decode host cost (issue 28): NVIDIA's vkQueueSubmit and fence costs show only on its hardware,
//! so the breakdown has to come from the binary that runs there. Off, each phase costs one relaxed
//! load of a flag.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// The environment variable.
const VAR: &str = "KPC_VULKAN_SUBMIT_PROFILE";

/// The phases of `VulkanBackend::dispatch` and `Submitter::submit`, in the order they run.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Phase {
    /// `Record::new`: a fence and a timestamp pool, spare or created.
    Record,
    /// The descriptor pool, its sets allocated and written, keep-alives.
    Descriptors,
    /// Polling fences of earlier submissions and handing their pools back.
    Reclaim,
    /// Beginning, recording and ending the command buffer.
    Commands,
    /// The queue lock and vkQueueSubmit.
    QueueSubmit,
    /// A whole `dispatch`, every phase above included.
    Dispatch,
}

const NAMES: [&str; 6] = [
    "record",
    "descriptors",
    "reclaim",
    "commands",
    "queue_submit",
    "dispatch",
];

static NANOS: [AtomicU64; 6] = [const { AtomicU64::new(0) }; 6];
static COUNT: [AtomicU64; 6] = [const { AtomicU64::new(0) }; 6];
static MAX: [AtomicU64; 6] = [const { AtomicU64::new(0) }; 6];

fn enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| {
        std::env::var(VAR).is_ok_and(|v| matches!(v.trim(), "1" | "true" | "yes" | "on"))
    })
}

/// A started phase: `None` when profiling is off.
pub(crate) fn start() -> Option<Instant> {
    enabled().then(Instant::now)
}

/// Adds the time since `started` to `phase`.
pub(crate) fn end(phase: Phase, started: Option<Instant>) {
    if let Some(t) = started {
        let i = phase as usize;
        let ns = t.elapsed().as_nanos() as u64;
        NANOS[i].fetch_add(ns, Ordering::Relaxed);
        MAX[i].fetch_max(ns, Ordering::Relaxed);
        COUNT[i].fetch_add(1, Ordering::Relaxed);
    }
}

/// Prints the mean of each phase so far, when profiling is on.
pub(crate) fn report() {
    if !enabled() {
        return;
    }
    let mut line = String::from("kpc: Vulkan submit profile, mean µs (max µs, count):");
    for (i, name) in NAMES.iter().enumerate() {
        let n = COUNT[i].load(Ordering::Relaxed);
        if n > 0 {
            let us = NANOS[i].load(Ordering::Relaxed) as f64 / n as f64 / 1e3;
            let max = MAX[i].load(Ordering::Relaxed) as f64 / 1e3;
            line.push_str(&format!(" {name}={us:.2} ({max:.0}, {n})"));
        }
    }
    eprintln!("{line}");
}
