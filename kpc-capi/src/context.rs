//! `kpc_context`: one device with its in-memory cache and (per configuration) the disk cache; made
//! from a device selector, and its statistics.

use std::ffi::c_char;

use super::config::resolved;
use super::registry::{self, Object};
use super::util::{check_out, copy_out, opt_str_arg, write_out, write_versioned};
use super::{Failure, guard, kpc_config, kpc_status};
use kpc::Context;
use kpc::{BackendKind, DeviceSelector, SealMode};

/// A context (opaque): one device, its in-memory kernel cache, and the disk cache its configuration
/// names. Thread-safe: any thread may use one context at once. Destroy with `kpc_context_destroy`.
pub struct kpc_context {
    _opaque: [u8; 0],
}

impl Object for Context {
    type Handle = kpc_context;
    const NAME: &'static str = "kpc_context";
}

/// Which API a context runs on.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum kpc_backend {
    /// Vulkan compute.
    KPC_BACKEND_VULKAN = 1,
    /// OpenCL.
    KPC_BACKEND_OPENCL = 2,
}

pub(crate) fn c_backend(b: BackendKind) -> kpc_backend {
    match b {
        BackendKind::Vulkan => kpc_backend::KPC_BACKEND_VULKAN,
        BackendKind::OpenCl => kpc_backend::KPC_BACKEND_OPENCL,
    }
}

/// Creates a context on the device `selector` names (`KPC_DEVICE` syntax: `auto`, `vulkan:0`,
/// `vulkan:gpu`, `opencl:1`, `any:cpu`, ...), or, when `selector` is NULL, the one `config`'s device
/// selector names. kpc creates and owns the device (for a device the caller owns, see the interop
/// constructors). `config` is copied; it may be destroyed afterwards.
///
/// Ownership: `*out` receives a new context; destroy it with `kpc_context_destroy`.
/// Errors: `KPC_STATUS_INVALID_ARGUMENT` (bad handle, NULL `out`, non-UTF-8 selector);
/// `KPC_STATUS_CONFIG` (malformed selector); `KPC_STATUS_NO_SUCH_DEVICE` (the message lists the
/// devices that exist); `KPC_STATUS_UNAVAILABLE` (no loader or driver for the backend named).
///
/// # Safety
/// `selector` is NULL or a NUL-terminated string; `out` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kpc_context_create(
    config: *const kpc_config,
    selector: *const c_char,
    out: *mut *mut kpc_context,
) -> kpc_status {
    guard("kpc_context_create", || {
        check_out(out, "out")?;
        let mut c = resolved(config)?;
        // SAFETY: forwarded to the caller.
        if let Some(s) = unsafe { opt_str_arg(selector, "selector")? } {
            c.device = DeviceSelector::parse(s)?;
        }
        let ctx = Context::builder().config(c.clone()).build()?;
        let h = registry::insert(ctx);
        // SAFETY: checked above; writable by the caller's promise.
        unsafe { write_out(out, h, "out") }
    })
}

/// Destroys a context. NULL is accepted and does nothing. Kernels and leases made from it stay
/// usable until they are destroyed themselves: they hold what they need of the device. A device the
/// caller owns (interop) must outlive every kpc object made on it.
///
/// Errors: `KPC_STATUS_INVALID_ARGUMENT` when `context` is not a live context; nothing is freed then.
///
/// # Safety
/// None beyond the handle's (which is checked).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kpc_context_destroy(context: *mut kpc_context) -> kpc_status {
    guard("kpc_context_destroy", || {
        registry::remove::<Context>(context, "context")
    })
}

/// Returns once kpc has no call in flight on the context's device and none pending of its own: the
/// warm start is stopped (what it loaded stays cached), background loads running now have finished,
/// and every submission made so far has finished executing. For a caller about to do something to
/// its device that kpc must not overlap. The context stays usable; a later call runs as usual.
/// Calls other threads make on the context meanwhile are theirs to finish.
///
/// Errors: `KPC_STATUS_INVALID_ARGUMENT` for a bad handle; `KPC_STATUS_BACKEND` when waiting for a
/// submission fails (a lost device).
///
/// # Safety
/// None beyond the handle's (which is checked).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kpc_context_quiesce(context: *const kpc_context) -> kpc_status {
    guard("kpc_context_quiesce", || {
        let ctx = registry::get::<Context>(context, "context")?;
        ctx.quiesce()?;
        Ok(())
    })
}

/// Writes the context's backend to `*out`.
///
/// Errors: `KPC_STATUS_INVALID_ARGUMENT` for a bad handle or a NULL `out`.
///
/// # Safety
/// `out` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kpc_context_backend(
    context: *const kpc_context,
    out: *mut kpc_backend,
) -> kpc_status {
    guard("kpc_context_backend", || {
        let ctx = registry::get::<Context>(context, "context")?;
        // SAFETY: forwarded to the caller.
        unsafe { write_out(out, c_backend(ctx.backend()), "out") }
    })
}

/// Copies the device's name as the driver reports it (UTF-8, NUL-terminated) into `buffer`.
/// `*size` receives the bytes needed, NUL included. Call with `buffer` NULL and `capacity` 0 to ask
/// the size.
///
/// Errors: `KPC_STATUS_INVALID_ARGUMENT` for a bad handle, a NULL `size`, or a NULL `buffer` with a
/// non-zero capacity; `KPC_STATUS_BUFFER_TOO_SMALL` when `capacity` is less than `*size` (nothing is
/// copied).
///
/// # Safety
/// `buffer` is NULL or has `capacity` writable bytes; `size` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kpc_context_device_name(
    context: *const kpc_context,
    buffer: *mut c_char,
    capacity: usize,
    size: *mut usize,
) -> kpc_status {
    guard("kpc_context_device_name", || {
        let ctx = registry::get::<Context>(context, "context")?;
        let mut name = ctx.device().name.clone().into_bytes();
        name.retain(|b| *b != 0);
        name.push(0);
        // SAFETY: forwarded to the caller.
        unsafe { copy_out(&name, buffer.cast(), capacity, size, "the device name") }
    })
}

/// Counters of a context's in-memory cache (all its programs and kernels together).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct kpc_memory_stats {
    /// Requests answered from a finished entry.
    pub hits: u64,
    /// Requests that found no finished entry (they built or waited).
    pub misses: u64,
    /// Builds run (successful or not).
    pub builds: u64,
    /// Builds that failed.
    pub failed_builds: u64,
    /// Programs evicted by the LRU.
    pub evictions: u64,
    /// Requests that waited for another thread's build.
    pub waits: u64,
    /// Nanoseconds spent building.
    pub build_time_ns: u64,
    /// Programs cached now.
    pub programs: u64,
    /// Kernels cached now.
    pub kernels: u64,
    /// Bytes of program binaries cached now.
    pub program_bytes: u64,
}

/// Counters of the disk cache a context uses (all zero, `enabled` 0, when it has none).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct kpc_disk_stats {
    /// 1 when the context has a disk cache, else 0.
    pub enabled: u64,
    /// Lookups that returned a verified binary.
    pub hits: u64,
    /// Lookups that found nothing usable.
    pub misses: u64,
    /// Entries published.
    pub puts: u64,
    /// Bytes written into published entries.
    pub bytes_written: u64,
    /// Payload bytes returned by hits.
    pub bytes_read: u64,
    /// Entries evicted.
    pub evictions: u64,
    /// Bytes evictions freed.
    pub evicted_bytes: u64,
    /// Corrupt or incomplete entries found (and removed).
    pub corruptions: u64,
    /// Verified binaries the backend refused (removed and rebuilt).
    pub rejected: u64,
    /// Waits for another process building the same key.
    pub lock_waits: u64,
    /// Nanoseconds spent in those waits.
    pub lock_wait_time_ns: u64,
    /// Waits that timed out (the caller built the key itself).
    pub lock_timeouts: u64,
    /// Nanoseconds of build time the hits saved.
    pub build_time_saved_ns: u64,
    /// Lookups and puts skipped by the image-size limits.
    pub skipped: u64,
    /// Puts that failed (the build itself succeeded).
    pub failed_puts: u64,
    /// Read errors treated as misses.
    pub read_errors: u64,
}

/// Counters a context's backend keeps.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct kpc_backend_stats {
    /// Programs compiled from a device image.
    pub programs_built: u64,
    /// Programs recreated from a persisted binary (disk cache or blob) without compiling.
    pub programs_loaded: u64,
    /// Persisted binaries refused before reaching the driver, or by it.
    pub binaries_rejected: u64,
    /// Pipelines the driver reported as served from the pipeline-cache data kpc gave it.
    pub driver_cache_hits: u64,
    /// Pipelines the driver reported as compiled anyway.
    pub driver_cache_misses: u64,
    /// Pipelines the driver gave no feedback about.
    pub driver_cache_unknown: u64,
    /// Launches kpc submitted (not counting the caller's own command buffers).
    pub launches: u64,
    /// Of `programs_loaded`, programs the driver compiled anyway (its creation feedback reported no
    /// pipeline-cache hit): loaded, but no compile saved. Last, so older callers' structs still fit.
    pub programs_loaded_recompiled: u64,
}

/// A context's statistics. Versioned: set `struct_size = sizeof(kpc_stats)` before the call; kpc
/// fills as much as fits (a caller built against an older, smaller struct gets its fields) and sets
/// `struct_size` to the bytes it wrote.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct kpc_stats {
    /// In: the caller's `sizeof(kpc_stats)`. Out: the bytes kpc wrote.
    pub struct_size: u32,
    /// The context's backend (a `kpc_backend` value).
    pub backend: u32,
    /// The in-memory cache.
    pub memory: kpc_memory_stats,
    /// The disk cache.
    pub disk: kpc_disk_stats,
    /// The backend.
    pub backend_counters: kpc_backend_stats,
    /// Sealed mode.
    pub seal: kpc_seal_stats,
    /// Generic fallbacks (`kpc_kernel_get_or_generic`). Last, so older callers' structs still fit.
    pub lazy: kpc_lazy_stats,
}

/// What serving generic fallbacks did for a context (`kpc_kernel_get_or_generic`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct kpc_lazy_stats {
    /// Requests served the fallback.
    pub served_generic: u64,
    /// Of those, the ones served it because `KPC_SEAL_GENERIC` was in force.
    pub sealed_generic: u64,
    /// Specialized kernels returned for the first time after their background build.
    pub swapped_in: u64,
    /// Background builds that compiled, and their summed compile time.
    pub background_builds: u64,
    /// Nanoseconds of those builds.
    pub background_build_time_ns: u64,
    /// Background builds that failed (each warned about once; the fallback goes on serving).
    pub background_failures: u64,
    /// Background builds queued or running now.
    pub pending: u64,
}

/// What sealing did for a context (`kpc_context_seal`, `KPC_CACHE_SEAL`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct kpc_seal_stats {
    /// The seal in force: a `kpc_seal_mode` value, `KPC_SEAL_OFF` while not sealed.
    pub mode: u64,
    /// Builds that ran after sealing (`KPC_SEAL_WARN`), each logged with why no layer served it.
    pub builds: u64,
    /// Kernel requests refused after sealing (`KPC_SEAL_ERROR`) because they would have built.
    pub refused: u64,
    /// Builds left of the build budget (`KPC_CACHE_BUILD_BUDGET`) before the seal comes into
    /// force; `UINT64_MAX` where no budget is counting (none configured, the warm-up still
    /// running, or spent).
    pub budget_left: u64,
}

/// What a sealed context does with a kernel request no cache layer can serve.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum kpc_seal_mode {
    /// `kpc_context_seal`: the mode the context's configuration names (`KPC_CACHE_SEAL`,
    /// `kpc_config_set_seal`), or `KPC_SEAL_ERROR` when that is off.
    KPC_SEAL_CONFIGURED = 0,
    /// Not sealed: builds happen as needed (`kpc_context_seal` with it unseals).
    KPC_SEAL_OFF = 1,
    /// Build, and log one warning line with the kernel, why no layer served it and the build time.
    KPC_SEAL_WARN = 2,
    /// Do not build: the request fails with `KPC_STATUS_SEALED`.
    KPC_SEAL_ERROR = 3,
    /// A request with a generic fallback (`kpc_kernel_get_or_generic`) is served the fallback and
    /// its specialized kernel is not built; any other build is built and logged as under
    /// `KPC_SEAL_WARN`.
    KPC_SEAL_GENERIC = 4,
}

pub(crate) fn c_seal(m: SealMode) -> kpc_seal_mode {
    match m {
        SealMode::Off => kpc_seal_mode::KPC_SEAL_OFF,
        SealMode::Warn => kpc_seal_mode::KPC_SEAL_WARN,
        SealMode::Error => kpc_seal_mode::KPC_SEAL_ERROR,
        SealMode::Generic => kpc_seal_mode::KPC_SEAL_GENERIC,
    }
}

/// A `kpc_seal_mode` value from C (any integer): `None` for `KPC_SEAL_CONFIGURED`.
pub(crate) fn seal_arg(mode: u32, configured_ok: bool) -> Result<Option<SealMode>, Failure> {
    match mode {
        0 if configured_ok => Ok(None),
        1 => Ok(Some(SealMode::Off)),
        2 => Ok(Some(SealMode::Warn)),
        3 => Ok(Some(SealMode::Error)),
        4 => Ok(Some(SealMode::Generic)),
        _ => Err(Failure::invalid(format!(
            "mode is {mode}: expected {}KPC_SEAL_OFF (1), KPC_SEAL_WARN (2), KPC_SEAL_ERROR (3) or \
             KPC_SEAL_GENERIC (4)",
            if configured_ok {
                "KPC_SEAL_CONFIGURED (0), "
            } else {
                ""
            }
        ))),
    }
}

/// Seals the context (or, with `KPC_SEAL_OFF`, unseals it): from now on a kernel request that no
/// cache layer (memory, disk, read-only layer, remote, a cache blob) can serve is built and logged
/// (`KPC_SEAL_WARN`) or refused with `KPC_STATUS_SEALED` (`KPC_SEAL_ERROR`); hits are unaffected.
/// `KPC_SEAL_CONFIGURED` takes the configuration's mode (`KPC_CACHE_SEAL`), or `KPC_SEAL_ERROR` when
/// that is off. With `KPC_CACHE_SEAL` set, a context seals itself when its warm start has finished
/// (at creation without warm start); this seals it now. `*mode_out` (may be NULL) receives the
/// mode put in force.
///
/// Errors: `KPC_STATUS_INVALID_ARGUMENT` for a bad handle or a `mode` that is not a
/// `kpc_seal_mode` value; nothing changes then.
///
/// # Safety
/// `mode_out` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kpc_context_seal(
    context: *const kpc_context,
    mode: u32,
    mode_out: *mut u32,
) -> kpc_status {
    guard("kpc_context_seal", || {
        let ctx = registry::get::<Context>(context, "context")?;
        let put = match seal_arg(mode, true)? {
            None => ctx.seal(),
            Some(m) => {
                ctx.seal_with(m);
                m
            }
        };
        if !mode_out.is_null() {
            // SAFETY: non-NULL, and writable by the caller's promise.
            unsafe { write_out(mode_out, c_seal(put) as u32, "mode_out")? };
        }
        Ok(())
    })
}

/// The C shape of [`Context::stats`]: its first four parts, field for field.
fn stats_of(ctx: &Context) -> kpc_stats {
    let s = ctx.stats();
    let (m, b) = (s.memory, s.backend_counters);
    let ns = |d: std::time::Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
    kpc_stats {
        struct_size: 0,
        backend: c_backend(s.backend) as u32,
        memory: kpc_memory_stats {
            hits: m.hits,
            misses: m.misses,
            builds: m.builds,
            failed_builds: m.failed_builds,
            evictions: m.evictions,
            waits: m.waits,
            build_time_ns: ns(m.build_time),
            programs: m.programs,
            kernels: m.kernels,
            program_bytes: m.program_bytes,
        },
        disk: s
            .disk
            .map_or_else(kpc_disk_stats::default, |d| kpc_disk_stats {
                enabled: 1,
                hits: d.hits,
                misses: d.misses,
                puts: d.puts,
                bytes_written: d.bytes_written,
                bytes_read: d.bytes_read,
                evictions: d.evictions,
                evicted_bytes: d.evicted_bytes,
                corruptions: d.corruptions,
                rejected: d.rejected,
                lock_waits: d.lock_waits,
                lock_wait_time_ns: ns(d.lock_wait_time),
                lock_timeouts: d.lock_timeouts,
                build_time_saved_ns: ns(d.build_time_saved),
                skipped: d.skipped,
                failed_puts: d.failed_puts,
                read_errors: d.read_errors,
            }),
        backend_counters: kpc_backend_stats {
            programs_built: b.programs_built,
            programs_loaded: b.programs_loaded,
            binaries_rejected: b.binaries_rejected,
            driver_cache_hits: b.driver_cache_hits,
            driver_cache_misses: b.driver_cache_misses,
            driver_cache_unknown: b.driver_cache_unknown,
            launches: b.launches,
            programs_loaded_recompiled: b.programs_loaded_recompiled,
        },
        seal: kpc_seal_stats {
            mode: c_seal(s.seal.mode) as u64,
            builds: s.seal.builds,
            refused: s.seal.refused,
            budget_left: s.seal.budget_left.unwrap_or(u64::MAX),
        },
        lazy: kpc_lazy_stats {
            served_generic: s.lazy.served_generic,
            sealed_generic: s.lazy.sealed_generic,
            swapped_in: s.lazy.swapped_in,
            background_builds: s.lazy.background_builds,
            background_build_time_ns: ns(s.lazy.background_build_time),
            background_failures: s.lazy.background_failures,
            pending: s.lazy.pending,
        },
    }
}

/// Writes a snapshot of the context's counters (memory cache, disk cache, backend) to `*out`. Set
/// `out->struct_size = sizeof(kpc_stats)` first.
///
/// Errors: `KPC_STATUS_INVALID_ARGUMENT` for a bad handle, a NULL `out`, or a `struct_size` below 8
/// (not set).
///
/// # Safety
/// `out` is NULL or points to a writable `kpc_stats` (or as many bytes as its `struct_size` says)
/// whose `struct_size` the caller set.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kpc_context_stats(
    context: *const kpc_context,
    out: *mut kpc_stats,
) -> kpc_status {
    guard("kpc_context_stats", || {
        let ctx = registry::get::<Context>(context, "context")?;
        // SAFETY: forwarded to the caller.
        unsafe { write_versioned(out, stats_of(&ctx), |s| &mut s.struct_size, "kpc_stats") }
    })
}
