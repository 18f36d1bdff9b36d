//! One runner at a time for a repeatable background job (the disk cache's eviction pass), and no
//! request lost while it runs.
//!
//! A request that finds the job running does not start a second runner: it marks the job "run again".
//! The runner clears that mark before each run and stops only if nothing marked it since (one
//! compare-and-swap from "running" to "idle"), so a request that came while it ran (after the run had
//! read the state it acts on) gets a run that starts after it: by this runner, or by the requester
//! itself when the runner had already stopped. The disk cache's size limit depends on that: the last
//! put over the limit always has a pass that sees it. The whole state is one atomic byte, so every
//! request and every stop are ordered by that byte's own modification order, whatever the memory
//! orderings.
//!
//! Compiled against loom's atomics under `--cfg loom` (`src/cache/sync.rs`), where
//! `loom_tests/loom.rs` checks exactly this property.

use super::sync::{AtomicU8, Ordering};

const IDLE: u8 = 0;
const RUNNING: u8 = 1;
const AGAIN: u8 = 2;

/// The state of one repeatable job: idle, running, or running and asked to run again.
#[derive(Debug)]
pub struct PassGate {
    state: AtomicU8,
}

impl Default for PassGate {
    fn default() -> Self {
        PassGate::new()
    }
}

impl PassGate {
    /// No runner, nothing asked for.
    pub fn new() -> Self {
        PassGate {
            state: AtomicU8::new(IDLE),
        }
    }

    /// Asks for a run. `true`: the caller became the runner and must call [`PassGate::begin`], run, and
    /// call [`PassGate::finish`] until it returns `false`. `false`: a runner is active and will run
    /// again after this request.
    pub fn request(&self) -> bool {
        let mut cur = self.state.load(Ordering::Acquire);
        loop {
            let next = if cur == IDLE { RUNNING } else { AGAIN };
            if cur == AGAIN {
                return false;
            }
            match self
                .state
                .compare_exchange(cur, next, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return cur == IDLE,
                Err(now) => cur = now,
            }
        }
    }

    /// The runner is about to read the state a run acts on: requests up to here are served by it.
    pub fn begin(&self) {
        // A swap, not a store: reading the mark a request left synchronizes with that request, so the
        // run sees what the requester did before asking.
        self.state.swap(RUNNING, Ordering::AcqRel);
    }

    /// The runner finished a run. `true`: a request came during it and the caller is still the runner
    /// (run again); `false`: the caller is no longer the runner.
    pub fn finish(&self) -> bool {
        self.state
            .compare_exchange(RUNNING, IDLE, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
    }

    /// Whether a runner is active now (a snapshot).
    #[cfg(loom)]
    pub fn running(&self) -> bool {
        self.state.load(Ordering::Acquire) != IDLE
    }
}
