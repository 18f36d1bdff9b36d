//! The per-thread front of a cache's kernel map: what makes a hit write no cache line another thread
//! reads or writes.
//!
//! A hit on the shared map writes shared lines three times: the shard lock's reader count, the `Arc`
//! reference count of the handle it returns, and (before they were striped) the hit counter. With 16
//! threads asking for the same kernel, every one of those writes moves a cache line between cores.
//! The front keeps, per thread, the kernels that thread has found, each behind a handle of its own
//! ([`Local`]), so a repeated hit locks a mutex only this thread uses, clones a reference count only
//! this thread's handles share, and counts the hit on its own line.
//!
//! The front lives inside its cache (one [`Front`] per cache), not in a `thread_local!`: dropping the
//! cache drops every handle the front holds, and an eviction can reach every thread's entries. Each
//! thread owns one stripe, chosen by `thread_index`; threads beyond the stripe count share stripes,
//! which costs speed, never correctness (every stripe is a mutex).
//!
//! Eviction: the evictor removes entries from the shared map first, then [`Front::purge`]s every
//! stripe. A thread fills its stripe from the shared map while holding that stripe's lock, so the fill
//! either happens before the purge of its stripe (and is purged) or after it (and no longer finds the
//! evicted entry). Once an eviction returns, no lookup returns what it evicted; the loom model
//! `loom_tests/loom.rs` checks this against the code below.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::ops::Deref;
use std::sync::Arc;

use super::sync::Mutex;

/// How many stripes a [`Front`] has: enough for one per thread on the machines kpc targets; more
/// threads share stripes.
pub(crate) const STRIPES: usize = 64;

/// A thread's own handle to a shared, cached object: cloning it touches only a count that this
/// thread's handles share, not the shared `Arc`'s. Dereferences to the object.
///
/// Aligned to 128 bytes so that its count, in the `Arc` allocation, shares a cache line with no other
/// thread's handle.
#[derive(Debug)]
#[repr(align(128))]
pub struct Local<T>(Arc<T>);

impl<T> Local<T> {
    /// A handle over `shared`.
    pub fn new(shared: Arc<T>) -> Self {
        Local(shared)
    }
    /// The shared `Arc` itself (cloning it writes the shared count).
    pub fn shared(&self) -> &Arc<T> {
        &self.0
    }
}

impl<T> Deref for Local<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

/// Hashes are computed by the caller (once per request) and stored as the table's key, so the table
/// only has to pass them through.
#[derive(Default)]
struct PassThrough(u64);

impl Hasher for PassThrough {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        // Only `write_u64` is used; fold anything else in so the hasher is still correct.
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = v;
    }
}

struct Table<Key, V> {
    /// By the caller's hash of the key; a second key with the same hash replaces the first.
    entries: HashMap<u64, (Key, V), BuildHasherDefault<PassThrough>>,
    hits: u64,
}

#[repr(align(128))]
struct Stripe<Key, V>(Mutex<Table<Key, V>>);

/// Per-thread stripes of entries found in a shared map. See the module documentation.
pub struct Front<Key, V> {
    stripes: Box<[Stripe<Key, V>]>,
}

impl<Key, V> Front<Key, V> {
    /// A front of `stripes` (at least one) empty stripes.
    pub fn new(stripes: usize) -> Self {
        Front {
            stripes: (0..stripes.max(1))
                .map(|_| {
                    Stripe(Mutex::new(Table {
                        entries: HashMap::default(),
                        hits: 0,
                    }))
                })
                .collect(),
        }
    }

    /// Looks `key` (hashed to `hash` by the caller) up in stripe `slot` (taken modulo the stripe
    /// count) and applies `with` to its value. On a miss, `fill` runs with the stripe locked; a value it
    /// returns is stored. `fill` must read the shared map, so that [`Front::purge`] can order itself
    /// against it; it must not block on a build. `None` when neither the stripe nor `fill` has a value.
    ///
    /// Hits served from the stripe are counted in [`Front::hits`]; a value `fill` provides is not.
    #[inline]
    pub fn get<Q, R>(
        &self,
        slot: usize,
        hash: u64,
        key: &Q,
        fill: impl FnOnce() -> Option<(Key, V)>,
        with: impl FnOnce(&mut V) -> R,
    ) -> Option<R>
    where
        Q: ?Sized,
        Key: std::borrow::Borrow<Q>,
        Q: PartialEq,
    {
        let mut t = self.stripes[slot % self.stripes.len()].0.lock();
        if let Some((k, v)) = t.entries.get_mut(&hash) {
            if (*k).borrow() == key {
                let r = with(v);
                t.hits += 1;
                return Some(r);
            }
        }
        let (k, mut v) = fill()?;
        let r = with(&mut v);
        t.entries.insert(hash, (k, v));
        Some(r)
    }

    /// Removes every entry whose key `evicted` selects, from every stripe. The caller has already
    /// removed them from the shared map, so no later fill brings them back.
    pub fn purge(&self, evicted: impl Fn(&Key) -> bool) {
        for s in self.stripes.iter() {
            let mut t = s.0.lock();
            if !t.entries.is_empty() {
                t.entries.retain(|_, (k, _)| !evicted(k));
            }
        }
    }

    /// Applies `f` to every entry of every stripe, one stripe locked at a time: how the owning cache
    /// folds what threads recorded privately (LRU uses) into shared state, off the hit path.
    pub fn for_each_mut(&self, mut f: impl FnMut(&mut V)) {
        for s in self.stripes.iter() {
            let mut t = s.0.lock();
            for (_, v) in t.entries.values_mut() {
                f(v);
            }
        }
    }

    /// Hits served from the stripes so far, summed over them.
    pub fn hits(&self) -> u64 {
        self.stripes.iter().map(|s| s.0.lock().hits).sum()
    }

    /// Entries held, summed over the stripes (the same kernel counts once per thread holding it).
    #[cfg(any(loom, test))]
    pub fn len(&self) -> usize {
        self.stripes.iter().map(|s| s.0.lock().entries.len()).sum()
    }

    /// Whether no stripe holds an entry.
    #[cfg(any(loom, test))]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// This thread's index: distinct among the threads alive at once, and reused after a thread exits, so
/// a pool of N threads occupies N stripes however many threads came and went before it.
#[inline]
pub(crate) fn thread_index() -> usize {
    thread_local! {
        static INDEX: ThreadIndex = ThreadIndex::acquire();
    }
    // While the thread's locals are being destroyed the index is gone; stripe 0 is as correct as any.
    INDEX.try_with(|i| i.0).unwrap_or(0)
}

struct ThreadIndex(usize);

static INDICES: parking_lot::Mutex<(usize, Vec<usize>)> = parking_lot::Mutex::new((0, Vec::new()));

impl ThreadIndex {
    fn acquire() -> ThreadIndex {
        let mut g = INDICES.lock();
        // The lowest free index, so a pool packs into the first stripes.
        if let Some((pos, _)) = g.1.iter().enumerate().min_by_key(|(_, i)| **i) {
            return ThreadIndex(g.1.swap_remove(pos));
        }
        g.0 += 1;
        ThreadIndex(g.0 - 1)
    }
}

impl Drop for ThreadIndex {
    fn drop(&mut self) {
        INDICES.lock().1.push(self.0);
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn live_threads_get_distinct_indices_and_exited_ones_are_reused() {
        let mine = thread_index();
        let (tx, rx) = std::sync::mpsc::channel();
        let barrier = Arc::new(std::sync::Barrier::new(4));
        let hs: Vec<_> = (0..4)
            .map(|_| {
                let (tx, b) = (tx.clone(), barrier.clone());
                std::thread::spawn(move || {
                    tx.send(thread_index()).unwrap();
                    // All four are alive at once when they report.
                    b.wait();
                })
            })
            .collect();
        for h in hs {
            h.join().unwrap();
        }
        let mut got: Vec<usize> = rx.try_iter().collect();
        got.push(mine);
        got.sort();
        got.dedup();
        assert_eq!(got.len(), 5, "five live threads, five indices: {got:?}");
        // The four exited; a new thread takes one of their indices rather than a fifth new one.
        let max = *got.iter().max().unwrap();
        let again = std::thread::spawn(thread_index).join().unwrap();
        assert!(again <= max, "index {again} reused from {got:?}");
    }

    #[test]
    fn fills_once_then_hits_and_purge_forgets() {
        let f: Front<String, u32> = Front::new(2);
        let mut fills = 0;
        for _ in 0..3 {
            let v = f.get(
                0,
                7,
                "a",
                || {
                    fills += 1;
                    Some(("a".to_string(), 5))
                },
                |v| *v,
            );
            assert_eq!(v, Some(5));
        }
        assert_eq!((fills, f.hits(), f.len()), (1, 2, 1));
        // Same hash, other key: a miss that replaces the entry.
        assert_eq!(f.get(0, 7, "b", || None, |v| *v), None);
        assert_eq!(f.get(0, 7, "b", || Some(("b".into(), 6)), |v| *v), Some(6));
        assert_eq!(f.get(0, 7, "a", || None, |v| *v), None);
        // Slots wrap modulo the stripe count.
        assert_eq!(f.get(2, 7, "b", || None, |v| *v), Some(6));
        f.purge(|k| k == "b");
        assert!(f.is_empty());
        assert_eq!(f.get(0, 7, "b", || None, |v| *v), None);
    }
}
