//! One runner at a time for a repeatable background job (the disk cache's eviction pass), and no
//! request lost while it runs.
//!
//! A request that finds the job running does not start a second runner: it leaves a flag. The runner
//! clears the flag before each run and looks at it again after it has marked itself stopped, so a
//! request that came while it ran (after the run had read the state it acts on) gets a run that starts
//! after it: by this runner, or by the requester itself when the runner had already stopped. The disk
//! cache's size limit depends on that: the last put over the limit always has a pass that sees it.
//!
//! Compiled against loom's atomics under `--cfg loom` (`src/cache/sync.rs`), where
//! `loom_tests/loom.rs` checks exactly this property.

use super::sync::{AtomicBool, Ordering};

/// The state of one repeatable job: whether a runner is active, and whether a run was asked for.
#[derive(Debug, Default)]
pub struct PassGate {
    running: AtomicBool,
    again: AtomicBool,
}

impl PassGate {
    /// No runner, nothing asked for.
    pub fn new() -> Self {
        PassGate::default()
    }

    /// Asks for a run. `true`: the caller became the runner and must call [`PassGate::begin`], run, and
    /// call [`PassGate::finish`] until it returns `false`. `false`: a runner is active and will run
    /// again after this request.
    pub fn request(&self) -> bool {
        // The flag goes first: a runner that stops after our swap saw `running` set reads it afterwards.
        self.again.store(true, Ordering::SeqCst);
        !self.running.swap(true, Ordering::SeqCst)
    }

    /// The runner is about to read the state a run acts on: requests up to here are served by it.
    pub fn begin(&self) {
        self.again.store(false, Ordering::SeqCst);
    }

    /// The runner finished a run. `true`: a request came during it and the caller is still the runner
    /// (run again); `false`: the caller is no longer the runner.
    pub fn finish(&self) -> bool {
        self.running.store(false, Ordering::SeqCst);
        self.again.load(Ordering::SeqCst) && !self.running.swap(true, Ordering::SeqCst)
    }

    /// Whether a runner is active now (a snapshot).
    pub fn running(&self) -> bool {
        self.running.load(Ordering::SeqCst)
    }
}
