//! The synchronization primitives `get_or_build` and `BuildResult` use, behind one small shim.
//!
//! Normal builds get `parking_lot` and `std` atomics; `--cfg loom` builds get loom's modelled
//! primitives, so the loom tests check the very code the runtime runs rather than a copy of it.
//! The shim's API is the intersection both can offer: `wait` takes the guard by value.

#[cfg(not(loom))]
mod imp {
    pub use std::sync::atomic::{AtomicU8, AtomicU32, Ordering};

    /// A mutex (parking_lot outside loom).
    #[derive(Debug, Default)]
    pub struct Mutex<T>(parking_lot::Mutex<T>);
    /// The guard of [`Mutex`].
    pub type MutexGuard<'a, T> = parking_lot::MutexGuard<'a, T>;

    impl<T> Mutex<T> {
        /// A mutex holding `v`.
        pub fn new(v: T) -> Self {
            Mutex(parking_lot::Mutex::new(v))
        }
        /// Locks, blocking until the lock is free.
        pub fn lock(&self) -> MutexGuard<'_, T> {
            self.0.lock()
        }
    }

    /// A condition variable paired with [`Mutex`].
    #[derive(Debug, Default)]
    pub(crate) struct Condvar(parking_lot::Condvar);

    impl Condvar {
        /// A condvar with no waiters.
        pub fn new() -> Self {
            Condvar(parking_lot::Condvar::new())
        }
        /// Releases the guard's lock, sleeps until notified, and locks again.
        pub fn wait<'a, T>(&self, mut g: MutexGuard<'a, T>) -> MutexGuard<'a, T> {
            self.0.wait(&mut g);
            g
        }
        /// Wakes every waiter.
        pub(crate) fn notify_all(&self) {
            self.0.notify_all();
        }
    }

    /// A value written at most once and then read without locks.
    #[derive(Debug)]
    pub(crate) struct OnceValue<T>(std::sync::OnceLock<T>);

    impl<T> OnceValue<T> {
        /// An empty slot.
        pub fn new() -> Self {
            OnceValue(std::sync::OnceLock::new())
        }
        /// Stores `v` unless a value is already there (then `v` is dropped).
        pub fn set(&self, v: T) {
            let _ = self.0.set(v);
        }
        /// Applies `f` to the value, if set. Lock-free: an acquire load inside `OnceLock::get`.
        #[inline]
        pub fn with<R>(&self, f: impl FnOnce(&T) -> R) -> Option<R> {
            self.0.get().map(f)
        }
    }
}

#[cfg(loom)]
mod imp {
    pub use loom::sync::atomic::{AtomicU8, AtomicU32, Ordering};

    /// A mutex (loom's, under the model checker).
    #[derive(Debug, Default)]
    pub struct Mutex<T>(loom::sync::Mutex<T>);
    /// The guard of [`Mutex`].
    pub type MutexGuard<'a, T> = loom::sync::MutexGuard<'a, T>;

    impl<T> Mutex<T> {
        /// A mutex holding `v`.
        pub fn new(v: T) -> Self {
            Mutex(loom::sync::Mutex::new(v))
        }
        /// Locks, blocking until the lock is free.
        pub fn lock(&self) -> MutexGuard<'_, T> {
            self.0.lock().unwrap_or_else(|p| p.into_inner())
        }
    }

    /// A condition variable paired with [`Mutex`].
    #[derive(Debug, Default)]
    pub(crate) struct Condvar(loom::sync::Condvar);

    impl Condvar {
        /// A condvar with no waiters.
        pub fn new() -> Self {
            Condvar(loom::sync::Condvar::new())
        }
        /// Releases the guard's lock, sleeps until notified, and locks again.
        pub fn wait<'a, T>(&self, g: MutexGuard<'a, T>) -> MutexGuard<'a, T> {
            self.0.wait(g).unwrap_or_else(|p| p.into_inner())
        }
        /// Wakes every waiter.
        pub(crate) fn notify_all(&self) {
            self.0.notify_all();
        }
    }

    /// A value written at most once; under loom, a modelled mutex stands in for `OnceLock`.
    #[derive(Debug)]
    pub(crate) struct OnceValue<T>(loom::sync::Mutex<Option<T>>);

    impl<T> OnceValue<T> {
        /// An empty slot.
        pub fn new() -> Self {
            OnceValue(loom::sync::Mutex::new(None))
        }
        /// Stores `v` unless a value is already there.
        pub fn set(&self, v: T) {
            let mut g = self.0.lock().unwrap_or_else(|p| p.into_inner());
            if g.is_none() {
                *g = Some(v);
            }
        }
        /// Applies `f` to the value, if set.
        pub fn with<R>(&self, f: impl FnOnce(&T) -> R) -> Option<R> {
            self.0
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .as_ref()
                .map(f)
        }
    }
}

pub use imp::*;

impl<T> Default for OnceValue<T> {
    fn default() -> Self {
        OnceValue::new()
    }
}
