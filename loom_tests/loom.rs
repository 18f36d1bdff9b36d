//! Loom model checks of the real `get_or_build` and `BuildResult` (src/cache/build_result.rs), of the
//! per-thread front's eviction protocol (src/cache/front.rs), and of the disk cache's pass scheduling
//! (src/cache/pass_gate.rs) with its counting, compiled against loom's primitives through
//! src/cache/sync.rs.
//!
//! Run: `RUSTFLAGS="--cfg loom" cargo test --release --test loom`
//! (scripts/test.sh uses a separate target dir so the normal build stays warm.)
//!
//! Without `--cfg loom` this file compiles to nothing.
#![cfg(loom)]

use std::collections::HashMap;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;

use kpc::loom_internals::{
    BuildError, BuildMap, BuildResult, BuildState, Front, Mutex, PassGate, Served, get_or_build,
};
use loom::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use loom::thread;

type Entry = BuildResult<u64, BuildError>;

/// The acquire/get-cache pair of the models: one loom-modelled mutex around a map, the classic design,
/// so the model also checks the insert-or-acquire step under contention.
#[derive(Default)]
struct Maps {
    programs: Mutex<HashMap<u32, Arc<Entry>>>,
}

struct LockedMap<'a>(&'a Mutex<HashMap<u32, Arc<Entry>>>);

impl BuildMap<u32, u64, BuildError> for LockedMap<'_> {
    fn with_entry<R>(&self, key: &u32, f: impl FnOnce(&Entry) -> R) -> Option<R> {
        let g = self.0.lock();
        g.get(key).map(|e| f(e))
    }
    fn entry_or_insert(&self, key: &u32) -> Arc<Entry> {
        self.0
            .lock()
            .entry(*key)
            .or_insert_with(|| Arc::new(BuildResult::new()))
            .clone()
    }
    fn remove_entry(&self, key: &u32, entry: &Arc<Entry>) {
        let mut g = self.0.lock();
        if g.get(key).is_some_and(|e| Arc::ptr_eq(e, entry)) {
            g.remove(key);
        }
    }
}

fn request(
    maps: &Maps,
    builds: &AtomicUsize,
    outcome: impl Fn(usize) -> Result<u64, BuildError>,
) -> (Result<Arc<u64>, BuildError>, Served) {
    let r = get_or_build(
        || LockedMap(&maps.programs),
        |m| m,
        &7u32,
        || outcome(builds.fetch_add(1, Ordering::SeqCst)),
        |_| {},
        |_, _| {},
    );
    (r.result, r.served)
}

/// Runs `f` under loom: every interleaving of two threads, and of three with at most two
/// preemptions.
///
/// Two preemptions are enough for what the three-thread models check: each of their races needs at
/// most two forced switches (a waiter arriving while the builder is between `Initial -> InProgress`
/// and publishing, and a third caller arriving between the publish and the waiters' wake-up or the
/// reset of a failed entry); every other switch is a thread blocking, which loom explores at any
/// bound. Loom's own guidance puts most concurrency bugs within a bound of 2 or 3 (CHESS), and the
/// two-thread models, unbounded, still cover every ordering of each pair. Bound 3 took most of the
/// 397 s loom run on a 2-core machine (BENCHMARKS.md, "Fresh-machine build").
fn model(threads: usize, f: impl Fn() + Sync + Send + 'static) {
    let mut b = loom::model::Builder::new();
    if threads > 2 {
        b.preemption_bound = Some(2);
    }
    b.check(f);
}

fn run_threads<R: Send + 'static>(n: usize, f: impl Fn() -> R + Send + Sync + 'static) -> Vec<R> {
    let f = Arc::new(f);
    let handles: Vec<_> = (0..n)
        .map(|_| {
            let f = f.clone();
            thread::spawn(move || f())
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}

#[test]
fn exactly_one_build_and_every_waiter_sees_the_value() {
    for threads in [2, 3] {
        model(threads, move || {
            let maps = Arc::new(Maps::default());
            let builds = Arc::new(AtomicUsize::new(0));
            let (m, b) = (maps.clone(), builds.clone());
            let results = run_threads(threads, move || request(&m, &b, |_| Ok(42)));
            assert_eq!(builds.load(Ordering::SeqCst), 1, "one build per key");
            let first = results[0].0.as_ref().unwrap().clone();
            for (r, _) in &results {
                let v = r.as_ref().expect("every caller gets the value");
                assert_eq!(**v, 42);
                assert!(Arc::ptr_eq(v, &first), "every caller gets the same Arc");
            }
            assert_eq!(
                results.iter().filter(|(_, s)| *s == Served::Built).count(),
                1
            );
        });
    }
}

#[test]
fn a_deterministic_failure_reaches_every_waiter() {
    for threads in [2, 3] {
        model(threads, move || {
            let maps = Arc::new(Maps::default());
            let builds = Arc::new(AtomicUsize::new(0));
            let (m, b) = (maps.clone(), builds.clone());
            let results = run_threads(threads, move || {
                request(&m, &b, |_| {
                    Err(BuildError::deterministic(-11, "syntax error"))
                })
            });
            assert_eq!(builds.load(Ordering::SeqCst), 1, "a failure is built once");
            for (r, _) in &results {
                let e = r.as_ref().expect_err("every caller sees the failure");
                assert_eq!((e.code, e.message.as_str()), (-11, "syntax error"));
            }
            let entry = maps.programs.lock().get(&7).unwrap().clone();
            assert_eq!(entry.state(), BuildState::Failed);
        });
    }
}

#[test]
fn a_transient_failure_produces_exactly_one_retrying_builder() {
    for threads in [2, 3] {
        model(threads, move || {
            let maps = Arc::new(Maps::default());
            let builds = Arc::new(AtomicUsize::new(0));
            let (m, b) = (maps.clone(), builds.clone());
            let results = run_threads(threads, move || {
                request(&m, &b, |n| {
                    if n == 0 {
                        Err(BuildError::transient(-2, "out of memory"))
                    } else {
                        Ok(5)
                    }
                })
            });
            // The failed builder returns its own error; exactly one other caller rebuilds; everyone else
            // gets that caller's value.
            assert_eq!(builds.load(Ordering::SeqCst), 2);
            assert_eq!(results.iter().filter(|(r, _)| r.is_err()).count(), 1);
            assert_eq!(
                results.iter().filter(|(_, s)| *s == Served::Built).count(),
                2
            );
            for (r, _) in results.iter().filter(|(r, _)| r.is_ok()) {
                assert_eq!(**r.as_ref().unwrap(), 5);
            }
            let entry = maps.programs.lock().get(&7).unwrap().clone();
            assert_eq!(entry.state(), BuildState::Done);
            assert_eq!(entry.transient_failures(), 1);
        });
    }
}

#[test]
fn a_panic_in_build_leaves_no_waiter_hanging() {
    std::panic::set_hook(Box::new(|_| {}));
    for threads in [2, 3] {
        model(threads, move || {
            let maps = Arc::new(Maps::default());
            let builds = Arc::new(AtomicUsize::new(0));
            let (m, b) = (maps.clone(), builds.clone());
            let results = run_threads(threads, move || {
                catch_unwind(AssertUnwindSafe(|| {
                    request(&m, &b, |n| {
                        if n == 0 {
                            panic!("driver crashed");
                        }
                        Ok(9)
                    })
                }))
            });
            // The model finishing at all proves no thread hung; the panic reached exactly its own caller,
            // and one waiter (or a later caller) rebuilt.
            assert_eq!(results.iter().filter(|r| r.is_err()).count(), 1);
            assert_eq!(builds.load(Ordering::SeqCst), 2);
            for r in results.iter().filter_map(|r| r.as_ref().ok()) {
                assert_eq!(**r.0.as_ref().unwrap(), 9);
            }
            let entry = maps.programs.lock().get(&7).unwrap().clone();
            assert_eq!(entry.state(), BuildState::Done);
        });
    }
}

#[test]
fn hits_after_done_take_the_lock_free_path() {
    model(2, || {
        let maps = Arc::new(Maps::default());
        let builds = Arc::new(AtomicUsize::new(0));
        let first = request(&maps, &builds, |_| Ok(1));
        assert_eq!(first.1, Served::Built);
        let (m, b) = (maps.clone(), builds.clone());
        let results = run_threads(2, move || request(&m, &b, |_| Ok(2)));
        for (r, s) in results {
            assert_eq!(s, Served::Hit);
            assert_eq!(*r.unwrap(), 1);
        }
        assert_eq!(builds.load(Ordering::SeqCst), 1);
    });
}

/// The front's eviction protocol, as `KernelProgramCache` runs it: readers look a key up in their
/// stripe and fill it from the shared map (locked) on a miss; the evictor removes the key from the map,
/// then purges every stripe. Once the eviction has returned (`evicted` is set after the purge), no
/// lookup may return the evicted value, and no stripe may keep it. Hits served from the stripes plus
/// fills account for every value returned.
fn front_vs_eviction(slots: &'static [usize]) {
    model(slots.len() + 1, move || {
        let map = Arc::new(Mutex::new(HashMap::from([(7u32, Arc::new(70u64))])));
        let front = Arc::new(Front::<u32, Arc<u64>>::new(2));
        let evicted = Arc::new(AtomicBool::new(false));
        let fills = Arc::new(AtomicUsize::new(0));
        let readers: Vec<_> = slots
            .iter()
            .map(|&slot| {
                let (map, front, evicted, fills) =
                    (map.clone(), front.clone(), evicted.clone(), fills.clone());
                thread::spawn(move || {
                    let mut served = 0;
                    for _ in 0..2 {
                        let after_eviction = evicted.load(Ordering::Acquire);
                        let fill = || {
                            let v = map.lock().get(&7).cloned()?;
                            fills.fetch_add(1, Ordering::SeqCst);
                            Some((7, v))
                        };
                        let got = front.get(slot, 7, &7u32, fill, |v| **v);
                        if after_eviction {
                            assert_eq!(got, None, "served after its eviction returned");
                        }
                        served += usize::from(got.is_some());
                    }
                    served
                })
            })
            .collect();
        map.lock().remove(&7);
        front.purge(|k| *k == 7);
        evicted.store(true, Ordering::Release);
        let served: usize = readers.into_iter().map(|h| h.join().unwrap()).sum();
        assert!(front.is_empty(), "a stripe kept an evicted entry");
        assert_eq!(
            served as u64,
            front.hits() + fills.load(Ordering::SeqCst) as u64,
            "every value served is a stripe hit or a fill"
        );
    });
}

#[test]
fn front_one_reader_never_serves_an_evicted_kernel() {
    front_vs_eviction(&[0]);
}

#[test]
fn front_two_readers_on_their_own_stripes_never_serve_an_evicted_kernel() {
    front_vs_eviction(&[0, 1]);
}

#[test]
fn front_two_readers_sharing_a_stripe_never_serve_an_evicted_kernel() {
    front_vs_eviction(&[0, 2]);
}

/// The LRU fold (`KernelProgramCache::fold_front_uses`): a hit marks its stripe entry used, a folder
/// concurrently takes the marks. A use is never lost: it is either taken by the fold or still marked
/// afterwards, and the fold never sees an entry half-inserted.
#[test]
fn front_uses_are_never_lost_by_a_concurrent_fold() {
    model(2, || {
        let front = Arc::new(Front::<u32, (u64, bool)>::new(1));
        let f = front.clone();
        let reader = thread::spawn(move || {
            f.get(0, 7, &7u32, || Some((7, (70, false))), |v| v.1 = true)
                .expect("filled");
        });
        let mut taken = 0;
        front.for_each_mut(|v| {
            assert_eq!(v.0, 70, "a whole entry");
            taken += usize::from(std::mem::take(&mut v.1));
        });
        reader.join().unwrap();
        let mut left = 0;
        front.for_each_mut(|v| left += usize::from(v.1));
        assert_eq!(taken + left, 1, "the one use is folded or still marked");
    });
}

/// The disk cache's counting and pass scheduling (src/cache/disk/count.rs, schedule.rs), with the
/// real `PassGate`: a put publishes and counts in one step under the size lock (a modelled mutex
/// standing for the size file's flock), then asks for a pass when the total is over the limit (here
/// 0: every put is). The one runner removes what its look at the total found, as a pass removes only
/// what its walk saw. Whatever the interleaving, once both puts and every pass they caused are done
/// the total is back under the limit and equals what is "on disk".
#[test]
fn every_put_over_the_limit_is_followed_by_a_pass_that_sees_it() {
    model(2, || {
        struct Cache {
            /// (tracked total, bytes "on disk"), both under the size lock.
            size: Mutex<(u64, u64)>,
            passes: PassGate,
            active: AtomicUsize,
        }
        let c = Arc::new(Cache {
            size: Mutex::new((0, 0)),
            passes: PassGate::new(),
            active: AtomicUsize::new(0),
        });
        let put = |c: &Cache| {
            let total = {
                let mut g = c.size.lock();
                g.1 += 1;
                g.0 += 1;
                g.0
            };
            if total > 0 && c.passes.request() {
                loop {
                    assert_eq!(c.active.fetch_add(1, Ordering::SeqCst), 0, "one runner");
                    c.passes.begin();
                    let seen = c.size.lock().0;
                    if seen > 0 {
                        let mut g = c.size.lock();
                        g.1 -= seen;
                        g.0 -= seen;
                    }
                    c.active.fetch_sub(1, Ordering::SeqCst);
                    if !c.passes.finish() {
                        break;
                    }
                }
            }
        };
        let c2 = c.clone();
        let other = thread::spawn(move || put(&c2));
        put(&c);
        other.join().unwrap();
        let g = c.size.lock();
        assert_eq!(
            *g,
            (0, 0),
            "over the limit after the last put, or miscounted"
        );
        assert!(!c.passes.running(), "a runner left behind");
    });
}
