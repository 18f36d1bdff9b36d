//! `kpc_config`: the configuration a context is created with, from the environment or set field by
//! field. Each setter checks its value, so a configuration is always valid.

use std::ffi::c_char;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::time::Duration;

use parking_lot::Mutex;

use super::registry::{self, Object};
use super::util::{cstr_bytes, str_arg, switch_arg, write_out};
use super::{Failure, guard, kpc_status};
use kpc::{CacheDirSource, Config, DeviceSelector, TraceFlags};

/// A configuration (opaque). Create with `kpc_config_create` or `kpc_config_from_env`, destroy with
/// `kpc_config_destroy`. Contexts copy it when created, so it may be changed or destroyed afterwards.
pub struct kpc_config {
    _opaque: [u8; 0],
}

pub(crate) struct ConfigObject(pub(crate) Mutex<Config>);

impl Object for ConfigObject {
    type Handle = kpc_config;
    const NAME: &'static str = "kpc_config";
}

/// A copy of the configuration in `config`. Every setter keeps it valid (the one cross-field rule,
/// min <= max image size, is set by one call), so it needs no second check here.
pub(crate) fn resolved(config: *const kpc_config) -> Result<Config, Failure> {
    Ok(registry::get::<ConfigObject>(config, "config")?
        .0
        .lock()
        .clone())
}

/// Applies `f` to a copy of the configuration and keeps the copy only if `f` accepted the value.
pub(crate) fn with_config(
    config: *mut kpc_config,
    f: impl FnOnce(&mut Config) -> Result<(), Failure>,
) -> Result<(), Failure> {
    let c = registry::get::<ConfigObject>(config, "config")?;
    let mut c = c.0.lock();
    // Apply to a copy, so a refused value leaves the configuration as it was.
    let mut next = c.clone();
    f(&mut next)?;
    *c = next;
    Ok(())
}

/// Creates a configuration with kpc's defaults: what `kpc_config_from_env` gives with no `KPC_*`
/// variable set. The disk cache is on, at `$XDG_CACHE_HOME/kpc`, else `$HOME/.cache/kpc` (the
/// platform's variables; no `KPC_*` variable is read); `kpc_config_set_cache_dir` sets another
/// directory, `kpc_config_set_persistent(config, 0)` turns it off.
///
/// Ownership: `*out` receives a new configuration; destroy it with `kpc_config_destroy`.
/// Errors: `KPC_STATUS_INVALID_ARGUMENT` when `out` is NULL.
///
/// # Safety
/// `out` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kpc_config_create(out: *mut *mut kpc_config) -> kpc_status {
    guard("kpc_config_create", || {
        super::util::check_out(out, "out")?;
        let h = registry::insert(ConfigObject(Mutex::new(Config::default())));
        // SAFETY: checked above; writable by the caller's promise.
        unsafe { write_out(out, h, "out") }
    })
}

/// Creates a configuration from the `KPC_*` environment variables, as the `kpc` command reads them
/// (ENVIRONMENT.md). Unset variables take their defaults; the cache directory defaults to
/// `$XDG_CACHE_HOME/kpc` or `$HOME/.cache/kpc`.
///
/// Ownership: `*out` receives a new configuration; destroy it with `kpc_config_destroy`.
/// Errors: `KPC_STATUS_CONFIG` naming the variable, its value and what is accepted when one is
/// malformed; `KPC_STATUS_INVALID_ARGUMENT` when `out` is NULL.
///
/// # Safety
/// `out` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kpc_config_from_env(out: *mut *mut kpc_config) -> kpc_status {
    guard("kpc_config_from_env", || {
        super::util::check_out(out, "out")?;
        let c = Config::from_env()?;
        let h = registry::insert(ConfigObject(Mutex::new(c)));
        // SAFETY: checked above; writable by the caller's promise.
        unsafe { write_out(out, h, "out") }
    })
}

/// Destroys a configuration. NULL is accepted and does nothing. Contexts created from it are not
/// affected.
///
/// Errors: `KPC_STATUS_INVALID_ARGUMENT` when `config` is not a live `kpc_config` (for example one
/// already destroyed); nothing is freed then.
///
/// # Safety
/// None beyond the handle's (which is checked).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kpc_config_destroy(config: *mut kpc_config) -> kpc_status {
    guard("kpc_config_destroy", || {
        registry::remove::<ConfigObject>(config, "config")
    })
}

/// Sets the disk cache's root directory (`KPC_CACHE_DIR`): a path in the platform's encoding (any
/// bytes but NUL). NULL unsets it, which turns the disk cache off.
///
/// Errors: `KPC_STATUS_INVALID_ARGUMENT` for a bad handle or an empty or all-blank path.
///
/// # Safety
/// `path` is NULL or a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kpc_config_set_cache_dir(
    config: *mut kpc_config,
    path: *const c_char,
) -> kpc_status {
    guard("kpc_config_set_cache_dir", || {
        let dir = if path.is_null() {
            None
        } else {
            // SAFETY: non-NULL, and the caller promises a NUL-terminated string.
            let bytes = unsafe { cstr_bytes(path, "path")? };
            if bytes.iter().all(u8::is_ascii_whitespace) {
                return Err(Failure::invalid(
                    "path is empty or blank: expected a directory path, or NULL for no disk cache",
                ));
            }
            Some(PathBuf::from(std::ffi::OsStr::from_bytes(bytes)))
        };
        with_config(config, |c| {
            c.cache_dir_source = if dir.is_some() {
                CacheDirSource::Explicit
            } else {
                CacheDirSource::Unresolved
            };
            c.cache_dir = dir;
            Ok(())
        })
    })
}

/// Turns the on-disk cache on (1) or off (0) (`KPC_CACHE_PERSISTENT`). It also needs a cache
/// directory.
///
/// Errors: `KPC_STATUS_INVALID_ARGUMENT` for a bad handle or a value other than 0 or 1.
///
/// # Safety
/// None beyond the handle's (which is checked).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kpc_config_set_persistent(config: *mut kpc_config, on: i32) -> kpc_status {
    guard("kpc_config_set_persistent", || {
        let on = switch_arg(on, "on")?;
        with_config(config, |c| {
            c.persistent = on;
            Ok(())
        })
    })
}

/// Turns the in-memory cache on (1) or off (0) (`KPC_CACHE_IN_MEM`).
///
/// Errors: `KPC_STATUS_INVALID_ARGUMENT` for a bad handle or a value other than 0 or 1.
///
/// # Safety
/// None beyond the handle's (which is checked).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kpc_config_set_in_mem(config: *mut kpc_config, on: i32) -> kpc_status {
    guard("kpc_config_set_in_mem", || {
        let on = switch_arg(on, "on")?;
        with_config(config, |c| {
            c.in_mem = on;
            Ok(())
        })
    })
}

/// Sets the disk cache's size limit in bytes, 0 for unlimited (`KPC_CACHE_MAX_SIZE`).
///
/// Errors: `KPC_STATUS_INVALID_ARGUMENT` for a bad handle.
///
/// # Safety
/// None beyond the handle's (which is checked).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kpc_config_set_max_size(
    config: *mut kpc_config,
    bytes: u64,
) -> kpc_status {
    guard("kpc_config_set_max_size", || {
        with_config(config, |c| {
            c.max_size = bytes;
            Ok(())
        })
    })
}

/// Sets the range of device-image sizes (in bytes) that are persisted
/// (`KPC_CACHE_MIN_DEVICE_IMAGE_SIZE`, `KPC_CACHE_MAX_DEVICE_IMAGE_SIZE`).
///
/// Errors: `KPC_STATUS_INVALID_ARGUMENT` for a bad handle; `KPC_STATUS_CONFIG` when `min > max`.
///
/// # Safety
/// None beyond the handle's (which is checked).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kpc_config_set_device_image_sizes(
    config: *mut kpc_config,
    min: u64,
    max: u64,
) -> kpc_status {
    guard("kpc_config_set_device_image_sizes", || {
        Config::builder()
            .min_device_image_size(min)
            .max_device_image_size(max)
            .build()?;
        with_config(config, |c| {
            c.min_device_image_size = min;
            c.max_device_image_size = max;
            Ok(())
        })
    })
}

/// Sets how many bytes of program binaries each context keeps in memory before evicting the least
/// recently used; 0 never evicts (`KPC_IN_MEM_CACHE_EVICTION_THRESHOLD`).
///
/// Errors: `KPC_STATUS_INVALID_ARGUMENT` for a bad handle.
///
/// # Safety
/// None beyond the handle's (which is checked).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kpc_config_set_in_mem_eviction_threshold(
    config: *mut kpc_config,
    bytes: u64,
) -> kpc_status {
    guard("kpc_config_set_in_mem_eviction_threshold", || {
        with_config(config, |c| {
            c.in_mem_eviction_threshold = bytes;
            Ok(())
        })
    })
}

/// Sets how long (milliseconds) a process waits for another one building the same program before it
/// builds it itself (`KPC_CACHE_LOCK_TIMEOUT`).
///
/// Errors: `KPC_STATUS_INVALID_ARGUMENT` for a bad handle.
///
/// # Safety
/// None beyond the handle's (which is checked).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kpc_config_set_lock_timeout_ms(
    config: *mut kpc_config,
    milliseconds: u64,
) -> kpc_status {
    guard("kpc_config_set_lock_timeout_ms", || {
        with_config(config, |c| {
            c.lock_timeout = Duration::from_millis(milliseconds);
            Ok(())
        })
    })
}

/// Sets the trace bitmask (`KPC_CACHE_TRACE`): 1 disk cache, 2 memory cache, 4 builds. Events go to
/// the process's `tracing` subscriber, if the embedding program installed one.
///
/// Errors: `KPC_STATUS_INVALID_ARGUMENT` for a bad handle; `KPC_STATUS_CONFIG` for bits above 7.
///
/// # Safety
/// None beyond the handle's (which is checked).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kpc_config_set_trace(config: *mut kpc_config, bits: u32) -> kpc_status {
    guard("kpc_config_set_trace", || {
        let flags = u8::try_from(bits)
            .map_err(|_| Failure::invalid(format!("bits is {bits}: expected 0..=7")))
            .and_then(|b| TraceFlags::from_bits(b).map_err(Failure::from))?;
        with_config(config, |c| {
            c.trace = flags;
            Ok(())
        })
    })
}

/// Sets the device selector (`KPC_DEVICE` syntax: `auto`, `vulkan:0`, `opencl:cpu`, `any:gpu`, ...)
/// that `kpc_context_create` uses when it is given no selector of its own.
///
/// Errors: `KPC_STATUS_INVALID_ARGUMENT` for a bad handle, NULL or non-UTF-8; `KPC_STATUS_CONFIG`
/// for a malformed selector (the message lists the accepted forms).
///
/// # Safety
/// `selector` is NULL or a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kpc_config_set_device(
    config: *mut kpc_config,
    selector: *const c_char,
) -> kpc_status {
    guard("kpc_config_set_device", || {
        // SAFETY: forwarded to the caller.
        let s = unsafe { str_arg(selector, "selector")? };
        let d = DeviceSelector::parse(s)?;
        with_config(config, |c| {
            c.device = d;
            Ok(())
        })
    })
}
