//! The circuit breaker in front of the remote: after a call times out or cannot connect, every remote
//! call (lookup, fleet lock, publish, removal) is skipped while the breaker is open, so a frozen or
//! dead remote costs a process one `KPC_CACHE_REMOTE_TIMEOUT`, not one per kernel.
//!
//! - **Closed**: calls go through.
//! - **Open**: a call that failed by timeout or connection opened it for a hold-off; calls are skipped
//!   until it passes. Each time it opens again without a success in between, the hold-off doubles:
//!   2 s, 4 s, 8 s, ... up to 60 s.
//! - **Half-open**: once the hold-off passed, exactly one call (the probe) goes through and the others
//!   are still skipped. A probe the remote answers (whatever the answer) closes the breaker and resets
//!   the hold-off; a probe that fails opens it again with the next hold-off.
//!
//! Only failures that mean "unreachable or not answering" trip it; a remote that answers with an error
//! (full, permission denied) is healthy as far as waiting on it goes.

use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// The first hold-off after the remote failed.
pub(crate) const FIRST_HOLD_OFF: Duration = Duration::from_secs(2);
/// The longest hold-off: a remote that comes back is used again within this.
pub(crate) const MAX_HOLD_OFF: Duration = Duration::from_secs(60);

/// What the breaker lets a call do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Admit {
    /// The breaker is closed: call.
    Call,
    /// The hold-off passed: call, as the one probe; report the outcome.
    Probe,
    /// Open (or another call is probing): do not call.
    Skip,
}

/// What the breaker did so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct BreakerStats {
    /// Times it opened (a failure while closed, or a failed probe).
    pub trips: u64,
    /// Calls not made because it was open.
    pub skipped: u64,
    /// Probes let through after a hold-off.
    pub probes: u64,
    /// Whether it is open (or half-open) now.
    pub open: bool,
    /// The hold-off it would use at the next trip.
    pub next_hold_off: Duration,
}

#[derive(Debug)]
struct State {
    open_until: Option<Instant>,
    probing: bool,
    next_hold_off: Duration,
    trips: u64,
    skipped: u64,
    probes: u64,
}

/// One remote's breaker, shared by every call to it.
#[derive(Debug)]
pub(crate) struct Breaker(Mutex<State>);

impl Default for Breaker {
    fn default() -> Self {
        Breaker(Mutex::new(State {
            open_until: None,
            probing: false,
            next_hold_off: FIRST_HOLD_OFF,
            trips: 0,
            skipped: 0,
            probes: 0,
        }))
    }
}

impl Breaker {
    /// Whether a call may go to the remote now.
    pub(crate) fn admit(&self) -> Admit {
        self.admit_at(Instant::now())
    }

    fn admit_at(&self, now: Instant) -> Admit {
        let mut s = self.0.lock();
        match s.open_until {
            None => Admit::Call,
            Some(until) if now < until || s.probing => {
                s.skipped += 1;
                Admit::Skip
            }
            Some(_) => {
                s.probing = true;
                s.probes += 1;
                Admit::Probe
            }
        }
    }

    /// Whether calls are being skipped (open or half-open): what a caller that would wait on the
    /// remote checks without becoming the probe (a publish, whose caller waits for it).
    pub(crate) fn is_open(&self) -> bool {
        self.0.lock().open_until.is_some()
    }

    /// Counts a call skipped by a check of [`Breaker::is_open`].
    pub(crate) fn count_skip(&self) {
        self.0.lock().skipped += 1;
    }

    /// The remote answered a call admitted as `a`.
    pub fn answered(&self, a: Admit) {
        if a == Admit::Probe {
            let mut s = self.0.lock();
            s.open_until = None;
            s.probing = false;
            s.next_hold_off = FIRST_HOLD_OFF;
        }
    }

    /// A call admitted as `a` timed out or could not connect.
    pub fn failed(&self, a: Admit) {
        self.failed_at(a, Instant::now());
    }

    fn failed_at(&self, a: Admit, now: Instant) {
        let mut s = self.0.lock();
        // A call that was let through while closed and fails after another one tripped the breaker
        // does not extend the hold-off.
        if a == Admit::Probe || s.open_until.is_none() {
            s.open_until = Some(now + s.next_hold_off);
            s.next_hold_off = (s.next_hold_off * 2).min(MAX_HOLD_OFF);
            s.trips += 1;
        }
        if a == Admit::Probe {
            s.probing = false;
        }
    }

    /// The counts so far.
    pub fn stats(&self) -> BreakerStats {
        let s = self.0.lock();
        BreakerStats {
            trips: s.trips,
            skipped: s.skipped,
            probes: s.probes,
            open: s.open_until.is_some(),
            next_hold_off: s.next_hold_off,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hold_off_grows_while_probes_fail_and_one_answered_probe_closes_it() {
        let b = Breaker::default();
        let t0 = Instant::now();
        assert_eq!(b.admit_at(t0), Admit::Call);
        b.failed_at(Admit::Call, t0);
        let mut at = t0;
        let mut seen = Vec::new();
        for _ in 0..7 {
            let hold = b.stats().next_hold_off;
            // Skipped throughout the hold-off ...
            assert_eq!(b.admit_at(at + Duration::from_millis(10)), Admit::Skip);
            let open_for = b.0.lock().open_until.unwrap() - at;
            seen.push(open_for.as_secs());
            at += open_for;
            // ... then one probe, and nobody else while it runs.
            assert_eq!(b.admit_at(at), Admit::Probe);
            assert_eq!(b.admit_at(at), Admit::Skip);
            b.failed_at(Admit::Probe, at);
            assert!(b.stats().next_hold_off >= hold);
        }
        assert_eq!(seen, [2, 4, 8, 16, 32, 60, 60]);
        let at = b.0.lock().open_until.unwrap();
        assert_eq!(b.admit_at(at), Admit::Probe);
        b.answered(Admit::Probe);
        let s = b.stats();
        assert!(!s.open);
        assert_eq!(s.next_hold_off, FIRST_HOLD_OFF);
        assert_eq!((s.trips, s.probes), (8, 8));
        assert_eq!(b.admit_at(at), Admit::Call);
    }

    #[test]
    fn a_late_failure_of_a_call_let_through_before_the_trip_does_not_extend_it() {
        let b = Breaker::default();
        let t0 = Instant::now();
        let (a, c) = (b.admit_at(t0), b.admit_at(t0));
        b.failed_at(a, t0);
        b.failed_at(c, t0 + Duration::from_secs(1));
        assert_eq!(b.stats().trips, 1);
        assert_eq!(b.0.lock().open_until, Some(t0 + FIRST_HOLD_OFF));
    }
}
