//! The handle registry: C handles are tokens, never pointers kpc dereferences.
//!
//! A magic tag inside a heap object can only be checked by reading the memory the pointer names,
//! which is itself the crash (or undefined behaviour) when the pointer is garbage or freed. Looking the
//! token up in a map instead checks NULL, invented values, destroyed handles and handles of another
//! type without touching the caller's pointer at all. Each entry records its type's name, which is the
//! tag checked on every use, and holds an `Arc`, so a call in flight keeps its object alive even if
//! another thread destroys the handle meanwhile.

use std::any::Any;
use std::hash::{BuildHasher, RandomState};
use std::sync::Arc;
use std::sync::LazyLock;
use std::sync::atomic::{AtomicUsize, Ordering};

use dashmap::DashMap;

use super::Failure;

/// A Rust object behind a C handle type.
pub(crate) trait Object: Any + Send + Sync {
    /// The C handle type (`kpc_context`, ...): an opaque struct the header declares.
    type Handle;
    /// The handle type's name, for messages.
    const NAME: &'static str;
}

struct Entry {
    type_name: &'static str,
    object: Arc<dyn Any + Send + Sync>,
}

static LIVE: LazyLock<DashMap<usize, Entry>> = LazyLock::new(DashMap::new);

/// Token spacing: tokens look like aligned pointers, which is what C code and tools expect of them.
const STEP: usize = 16;

/// The first token: random per process (so a token from another run, or a small made-up integer,
/// does not name a live object), in the upper half of the address space and away from NULL.
static BASE: LazyLock<usize> = LazyLock::new(|| {
    let r = RandomState::new().hash_one(0x006b_7063_u64) as usize;
    (r | (1usize << (usize::BITS - 2))) & !(STEP - 1)
});

static NEXT: AtomicUsize = AtomicUsize::new(1);

/// Registers `object` and returns its new handle. Tokens are never reused within a process.
pub(crate) fn insert<T: Object>(object: T) -> *mut T::Handle {
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let token = BASE.wrapping_add(n.wrapping_mul(STEP));
    LIVE.insert(
        token,
        Entry {
            type_name: T::NAME,
            object: Arc::new(object),
        },
    );
    // A token, not an address: nothing ever reads through it (see the module doc).
    std::ptr::without_provenance_mut(token)
}

fn not_live<T: Object>(what: &str, token: usize) -> Failure {
    Failure::invalid(format!(
        "{what} ({token:#x}) is not a live {} (never created, already destroyed, or not a kpc handle)",
        T::NAME
    ))
}

/// The object behind `handle`, which the argument `what` passed.
///
/// Errors: NULL, or a token that is not a live object of type `T` (the message says which type it
/// is, if it is another kpc type).
pub(crate) fn get<T: Object>(handle: *const T::Handle, what: &str) -> Result<Arc<T>, Failure> {
    let token = handle.addr();
    if token == 0 {
        return Err(Failure::invalid(format!("{what} is NULL")));
    }
    let object = {
        let e = LIVE.get(&token).ok_or_else(|| not_live::<T>(what, token))?;
        if e.type_name != T::NAME {
            return Err(Failure::invalid(format!(
                "{what} is a {}, not a {}",
                e.type_name,
                T::NAME
            )));
        }
        e.object.clone()
    };
    // The name matched, so the type does: every `Object` has its own name.
    object
        .downcast::<T>()
        .map_err(|_| not_live::<T>(what, token))
}

/// Destroys the handle: NULL is accepted and does nothing. The object is dropped now, or when the
/// last call still using it returns.
///
/// Errors: a token that is not a live object of type `T`.
pub(crate) fn remove<T: Object>(handle: *mut T::Handle, what: &str) -> Result<(), Failure> {
    let token = handle.addr();
    if token == 0 {
        return Ok(());
    }
    match LIVE.remove_if(&token, |_, e| e.type_name == T::NAME) {
        Some(_) => Ok(()),
        None => match LIVE.get(&token) {
            Some(e) => Err(Failure::invalid(format!(
                "{what} is a {}, not a {}",
                e.type_name,
                T::NAME
            ))),
            None => Err(not_live::<T>(what, token)),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct A(u32);
    struct AHandle;
    impl Object for A {
        type Handle = AHandle;
        const NAME: &'static str = "test_a";
    }
    #[derive(Debug)]
    struct B;
    struct BHandle;
    impl Object for B {
        type Handle = BHandle;
        const NAME: &'static str = "test_b";
    }

    #[test]
    fn tokens_check_type_liveness_and_null() {
        let a = insert(A(7));
        let b = insert(B);
        assert_eq!(get::<A>(a, "a").unwrap().0, 7);
        let e = get::<A>(b.cast(), "ctx").unwrap_err();
        assert_eq!(e.message, "ctx is a test_b, not a test_a");
        assert!(
            get::<A>(std::ptr::null(), "x")
                .unwrap_err()
                .message
                .contains("NULL")
        );
        // An invented value, aligned or not, is refused without being read.
        for bogus in [1usize, 8, 0x1000, usize::MAX & !15] {
            let p: *const AHandle = std::ptr::without_provenance(bogus);
            assert!(get::<A>(p, "p").is_err());
        }
        // A destroy with the wrong type leaves the object alone.
        assert!(remove::<B>(a.cast(), "a").is_err());
        let held = get::<A>(a, "a").unwrap();
        remove::<A>(a, "a").unwrap();
        // Destroyed: refused, and destroying twice is an error, not a double free.
        assert!(get::<A>(a, "a").is_err());
        assert!(
            remove::<A>(a, "a")
                .unwrap_err()
                .message
                .contains("not a live test_a")
        );
        // A call in flight keeps its object.
        assert_eq!(held.0, 7);
        remove::<A>(std::ptr::null_mut(), "a").unwrap();
        remove::<B>(b, "b").unwrap();
    }

    #[test]
    fn tokens_are_unique_and_aligned() {
        let hs: Vec<_> = (0..100).map(|i| insert(A(i))).collect();
        let mut addrs: Vec<usize> = hs.iter().map(|h| h.addr()).collect();
        assert!(addrs.iter().all(|a| a % STEP == 0 && *a != 0));
        addrs.sort();
        addrs.dedup();
        assert_eq!(addrs.len(), 100);
        for h in hs {
            remove::<A>(h, "h").unwrap();
        }
    }
}
