//! A workaround for a PoCL bug that aborts the process when two command queues run the same
//! kernel at once with different grid sizes.
//!
//! PoCL's CPU drivers keep one process-wide cache of loaded work-group functions ("dlhandles"),
//! reference-counted per running command. Taking an entry matches the kernel's hash, local size,
//! global offset and grid width (an entry made for a wider grid serves narrower ones); giving it
//! back matches the hash and local size only, and takes the first such entry in the list, where a
//! newer, wider one sits in front. So when queue A runs a kernel with a narrow grid while queue B
//! starts the same kernel with a wider one (which makes a second entry), A's completion decrements
//! B's entry and B's completion then fails `assert(found->ref_count > 0)` in
//! `pocl_release_dlhandle_cache`, aborting the process. Contexts over one PoCL device share the
//! cache (the hash depends on the program, not the context). Seen with `tests/stress_contexts.rs`
//! on PoCL 5.0 (16 cores, and pinned to 2) in 2 of 24 runs, none of 24 with this workaround; a CI
//! run on PoCL 3.1 lost that test binary to a crash whose log was cut, most likely this one.
//!
//! Within one in-order queue PoCL starts a command only after the previous one has completed, so
//! the bug needs two queues. kpc therefore runs PoCL launches one batch at a time across the
//! process: a submission holds [`LAUNCHES`] from its first enqueue until its last launch has
//! completed. Launches on PoCL become synchronous: a CPU device runs one kernel on every core
//! anyway, so two contexts' kernels gain little from overlapping. Other drivers are unaffected.

use parking_lot::{Mutex, MutexGuard};

/// Held by a PoCL submission from its first enqueue until its last launch has completed.
static LAUNCHES: Mutex<()> = Mutex::new(());

/// Whether `driver` (the device's `DeviceInfo::driver`: platform name and driver version) is
/// PoCL, whose launches are serialized.
pub(crate) fn is_pocl(driver: &str) -> bool {
    driver.starts_with("Portable Computing Language")
}

/// The process-wide PoCL launch lock, for the duration of one submission.
pub(crate) fn serialize_launches() -> MutexGuard<'static, ()> {
    LAUNCHES.lock()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pocl_is_told_by_its_platform_name() {
        assert!(is_pocl("Portable Computing Language 3.1+debian"));
        assert!(!is_pocl("NVIDIA CUDA 580.159.04"));
        assert!(!is_pocl(""));
    }
}
