//! The chain's one verb for a miss: [`StoreChain::acquire`] looks the key up level by level, hands
//! each verified hit to the caller's load under the crash guard, and on a refusal removes or skips
//! the level and looks again; when nothing usable is left it takes the build locks and returns a
//! [`Ticket`], which [`Ticket::publish`] turns into a stored entry.
//!
//! What a miss needs beyond storage lives here, in one place: the skip list of levels whose binary
//! was refused in this request, the crash guard around each load, rejection, the backfill of an
//! accepted hit, and the crashed-bytes check on publish. What is done about each step (counting,
//! the journal, the idle watch, metrics) is not: the chain tells its subscribers
//! (`crate::cache::events`).

use std::fmt;
use std::time::{Duration, Instant};

use super::chain::{ChainHit, ChainLock, Turn};
use super::{StoreChain, StoreKey, StoreKind};
use crate::cache::events::BuildCause;
use crate::error::Error;

/// How many persisted binaries in a row the backend may refuse for one request before it is built
/// without consulting the stores again (each refusal removes the entry from a writable store and takes
/// a read-only one out of the request, so this only bounds a storm).
const MAX_REJECTED_BINARIES: usize = 3;

/// A program the backend loaded from a level of the chain.
#[derive(Debug)]
pub(crate) struct Loaded<P> {
    /// The program.
    pub program: P,
    /// The kind of the level that served it.
    pub kind: StoreKind,
    /// Lookup time, up to the hit that loaded.
    pub lookup: Duration,
    /// Time spent on the crash guard's load record.
    pub guard: Duration,
    /// Time from the crash guard to the loaded program.
    pub load: Duration,
}

/// What [`StoreChain::acquire`] came to.
#[derive(Debug)]
pub(crate) enum Acquire<'a, P> {
    /// A stored binary, loaded.
    Loaded(Loaded<P>),
    /// Nothing usable is stored: build, then [`Ticket::publish`] (dropping the ticket releases the
    /// build locks, for a failed build).
    Build(Ticket<'a>),
}

/// The right to build one key: the build locks the chain could take, released as each level that
/// gave one holds the entry, or when the ticket drops.
#[derive(Debug)]
pub(crate) struct Ticket<'a> {
    chain: &'a StoreChain,
    key: &'a StoreKey,
    lock: Option<ChainLock>,
}

impl Ticket<'_> {
    /// The fresh build took `took` and serialized to `binary` (`Ok(None)`: the backend keeps no
    /// binary; `Err`: it could not serialize): told as [`CacheEvent::Built`](crate::cache::events::CacheEvent::Built) and stored in every
    /// writable level, unless the same bytes crashed a process loading them before.
    pub(crate) fn publish<E: fmt::Display>(
        self,
        took: Duration,
        binary: Result<Option<Vec<u8>>, E>,
    ) {
        let Ticket { chain, key, lock } = self;
        let bytes = binary.as_ref().ok().and_then(Option::as_deref);
        chain.built(key, took, bytes, BuildCause::Missed);
        match binary {
            Ok(Some(bytes)) if chain.crashed_before(key, &bytes) => {}
            Ok(Some(bytes)) => chain.put(key, &bytes, took, lock),
            Ok(None) => {}
            Err(e) => chain.note_serialize_failure(&e),
        }
    }
}

impl StoreChain {
    /// `key` from the chain: each verified hit goes to `load` (the backend's load; `Ok` with the
    /// program and whether the driver compiled anyway) under the crash guard. A refused binary (any
    /// error but [`Error::OutOfResources`] and [`Error::Unsupported`], which are returned, or one that
    /// crashed a load before) is removed from a writable level, or its read-only level skipped, and
    /// the chain looked up again. An accepted hit is copied up ([`StoreChain::backfill`]).
    ///
    /// Errors: what `load` returned that is not a refusal of the binary.
    pub(crate) fn acquire<'a, P>(
        &'a self,
        key: &'a StoreKey,
        mut load: impl FnMut(&[u8]) -> Result<(P, bool), Error>,
    ) -> Result<Acquire<'a, P>, Error> {
        // Levels whose binary the backend refused and which would serve it again (read-only ones).
        let mut skip = Vec::new();
        let mut lock = None;
        for _ in 0..MAX_REJECTED_BINARIES {
            let lookup_start = Instant::now();
            let hit = match self.get(key, &skip) {
                Some(hit) => hit,
                None => match self.lock_for_build(key, &skip) {
                    Turn::Published(hit) => hit,
                    Turn::Build(l) => {
                        lock = l;
                        break;
                    }
                },
            };
            // A binary that crashed a process loading it is refused like one the driver refused.
            let guard_start = Instant::now();
            let record = match self.begin_load(key, &hit) {
                Ok(r) => r,
                Err(crashed) => {
                    self.refused(key, &hit, &crashed, &mut skip);
                    continue;
                }
            };
            let guard = guard_start.elapsed();
            let loaded = load(hit.bytes());
            drop(record);
            match loaded {
                Ok((program, recompiled)) => {
                    // Copied up only now that the backend took it: refused bytes never spread.
                    self.backfill(key, &hit, recompiled);
                    let load = guard_start.elapsed();
                    return Ok(Acquire::Loaded(Loaded {
                        program,
                        kind: hit.kind(),
                        lookup: guard_start - lookup_start,
                        guard,
                        load,
                    }));
                }
                // Out of resources is not a refusal of the binary: retried by the caller, then
                // returned, never rejected. The kernel needs what this device did not enable (an
                // embedder's device that shares the fingerprint of one with more features): not
                // the entry's fault, so it stays for the contexts that can use it.
                Err(e @ (Error::OutOfResources { .. } | Error::Unsupported { .. })) => {
                    return Err(e);
                }
                // Verified bytes the driver will not take (a driver change the fingerprint missed):
                // the store removes them and we look again, which now misses and takes the lock.
                Err(e) => self.refused(key, &hit, &e, &mut skip),
            }
        }
        Ok(Acquire::Build(Ticket {
            chain: self,
            key,
            lock,
        }))
    }

    /// `hit` was refused for `reason`: rejected by its level, which is skipped for the rest of the
    /// request when it would serve the same bytes again.
    fn refused(
        &self,
        key: &StoreKey,
        hit: &ChainHit,
        reason: &dyn fmt::Display,
        skip: &mut Vec<usize>,
    ) {
        if !self.reject(key, hit, reason) {
            skip.push(hit.level());
        }
    }
}
