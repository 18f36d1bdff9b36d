//! The `kpc_config` setters for the stores below the local disk and the run-time modes: read-only
//! layers, the remote tier, its key and writer signatures, warm start, cache debug and sealed mode.
//! With `kpc.h`'s other setters, C reaches every setting the environment does (ENVIRONMENT.md).

use std::ffi::{OsStr, c_char};
use std::os::unix::ffi::OsStrExt;
use std::time::Duration;

use super::config::{kpc_config, with_config};
use super::util::{cstr_bytes, str_arg, switch_arg};
use super::{Failure, guard, kpc_status};
use kpc::admin::config::parse_trusted_keys;
use kpc::admin::config::valid_app_name;
use kpc::admin::config::{parse_dir_list, vars};
use kpc::{MacKey, RemoteUrl, SigningKey};

/// Sets the read-only cache layers searched after the local disk (`KPC_CACHE_READONLY_DIRS`
/// syntax: absolute paths separated by `:`, each a cache directory or a bundle file from
/// `kpc cache export`, which is read in place and verified entry by entry). NULL or an empty string
/// clears them.
///
/// Errors: `KPC_STATUS_INVALID_ARGUMENT` for a bad handle; `KPC_STATUS_CONFIG` for a malformed list
/// (a relative path, say), naming what is accepted.
///
/// # Safety
/// `dirs` is NULL or a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kpc_config_set_readonly_dirs(
    config: *mut kpc_config,
    dirs: *const c_char,
) -> kpc_status {
    guard("kpc_config_set_readonly_dirs", || {
        let list = if dirs.is_null() {
            Vec::new()
        } else {
            // SAFETY: non-NULL, and the caller promises a NUL-terminated string.
            let bytes = unsafe { cstr_bytes(dirs, "dirs")? };
            parse_dir_list(vars::CACHE_READONLY_DIRS, OsStr::from_bytes(bytes))?
        };
        with_config(config, |c| {
            c.readonly_dirs = list;
            Ok(())
        })
    })
}

/// Sets the remote store (`KPC_CACHE_REMOTE` syntax: `redis://host:port/db`, `fs:///path`,
/// `s3://bucket/prefix?region=..&endpoint=..`). NULL unsets it.
///
/// Errors: `KPC_STATUS_INVALID_ARGUMENT` for a bad handle or non-UTF-8; `KPC_STATUS_CONFIG` for a
/// malformed URL (the message says what is wrong; a password in it is redacted).
///
/// # Safety
/// `url` is NULL or a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kpc_config_set_remote(
    config: *mut kpc_config,
    url: *const c_char,
) -> kpc_status {
    guard("kpc_config_set_remote", || {
        let remote = if url.is_null() {
            None
        } else {
            // SAFETY: forwarded to the caller.
            Some(RemoteUrl::parse(unsafe { str_arg(url, "url")? })?)
        };
        with_config(config, |c| {
            c.remote = remote;
            Ok(())
        })
    })
}

/// Sets the bound on every remote call, in milliseconds (`KPC_CACHE_REMOTE_TIMEOUT`).
///
/// Errors: `KPC_STATUS_INVALID_ARGUMENT` for a bad handle or 0 (a remote call needs some time).
///
/// # Safety
/// None beyond the handle's (which is checked).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kpc_config_set_remote_timeout_ms(
    config: *mut kpc_config,
    milliseconds: u64,
) -> kpc_status {
    guard("kpc_config_set_remote_timeout_ms", || {
        if milliseconds == 0 {
            return Err(Failure::invalid(
                "milliseconds is 0: expected a positive bound on each remote call",
            ));
        }
        with_config(config, |c| {
            c.remote_timeout = Duration::from_millis(milliseconds);
            Ok(())
        })
    })
}

/// Sets the fleet's shared secret (`KPC_CACHE_REMOTE_KEY`): shared entries are MAC'd with a key
/// derived from it, and entries without a valid MAC are refused. NULL unsets it.
///
/// Errors: `KPC_STATUS_INVALID_ARGUMENT` for a bad handle or non-UTF-8; `KPC_STATUS_CONFIG` for a
/// secret under 16 bytes (the message never contains the secret).
///
/// # Safety
/// `secret` is NULL or a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kpc_config_set_remote_key(
    config: *mut kpc_config,
    secret: *const c_char,
) -> kpc_status {
    guard("kpc_config_set_remote_key", || {
        let key = if secret.is_null() {
            None
        } else {
            // SAFETY: forwarded to the caller.
            let s = unsafe { str_arg(secret, "secret")? };
            Some(MacKey::from_secret(vars::CACHE_REMOTE_KEY, s)?)
        };
        with_config(config, |c| {
            c.remote_key = key;
            Ok(())
        })
    })
}

/// Sets this process's signing key from a private key file written by `kpc cache keygen`
/// (`KPC_CACHE_SIGNING_KEY`): what it publishes to the remote or exports is signed. NULL unsets it.
///
/// Errors: `KPC_STATUS_INVALID_ARGUMENT` for a bad handle; `KPC_STATUS_CONFIG` for a file that cannot
/// be read, that group or others may read, or that holds no private key (the message names the
/// path, never the key).
///
/// # Safety
/// `path` is NULL or a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kpc_config_set_signing_key(
    config: *mut kpc_config,
    path: *const c_char,
) -> kpc_status {
    guard("kpc_config_set_signing_key", || {
        // The handle is checked first; the file is read only for a live configuration.
        with_config(config, |c| {
            c.signing_key = if path.is_null() {
                None
            } else {
                // SAFETY: forwarded to the caller.
                let raw = unsafe { cstr_bytes(path, "path")? };
                let p = std::path::Path::new(OsStr::from_bytes(raw));
                Some(SigningKey::from_file(vars::CACHE_SIGNING_KEY, p)?)
            };
            Ok(())
        })
    })
}

/// Sets the public keys whose signatures this process accepts on shared entries
/// (`KPC_CACHE_TRUSTED_KEYS` syntax: `ed25519:<hex>` keys or files of them, separated by `,`). With
/// any, unsigned entries and entries signed by other keys are refused. NULL or an empty string
/// clears them.
///
/// Errors: `KPC_STATUS_INVALID_ARGUMENT` for a bad handle or non-UTF-8; `KPC_STATUS_CONFIG` for a
/// malformed key or an unreadable file, naming the element.
///
/// # Safety
/// `keys` is NULL or a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kpc_config_set_trusted_keys(
    config: *mut kpc_config,
    keys: *const c_char,
) -> kpc_status {
    guard("kpc_config_set_trusted_keys", || {
        with_config(config, |c| {
            c.trusted_keys = if keys.is_null() {
                Vec::new()
            } else {
                // SAFETY: forwarded to the caller.
                let s = unsafe { str_arg(keys, "keys")? };
                if s.trim().is_empty() {
                    Vec::new()
                } else {
                    parse_trusted_keys(vars::CACHE_TRUSTED_KEYS, s)?
                }
            };
            Ok(())
        })
    })
}

/// Sets the host id recorded in the provenance of what this process publishes or exports
/// (`KPC_HOST_ID`). NULL: the host name.
///
/// Errors: `KPC_STATUS_INVALID_ARGUMENT` for a bad handle or non-UTF-8; `KPC_STATUS_CONFIG` for an
/// empty id, one over 255 bytes or one with control characters.
///
/// # Safety
/// `id` is NULL or a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kpc_config_set_host_id(
    config: *mut kpc_config,
    id: *const c_char,
) -> kpc_status {
    guard("kpc_config_set_host_id", || {
        with_config(config, |c| {
            c.host_id = if id.is_null() {
                None
            } else {
                // SAFETY: forwarded to the caller.
                let s = unsafe { str_arg(id, "id")? }.to_string();
                // The builder checks it as KPC_HOST_ID is checked.
                kpc::Config::builder().host_id(Some(s.clone())).build()?;
                Some(s)
            };
            Ok(())
        })
    })
}

/// Turns warm start on under an application name (`KPC_CACHE_PREFETCH=NAME`): a context remembers
/// the kernels it acquires and reloads those of the last run in the background. NULL turns it off.
///
/// Errors: `KPC_STATUS_INVALID_ARGUMENT` for a bad handle, non-UTF-8, or a name that is not 1 to 64
/// letters, digits, '.', '_' or '-' (not starting with '.' or '-').
///
/// # Safety
/// `app` is NULL or a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kpc_config_set_warm_start(
    config: *mut kpc_config,
    app: *const c_char,
) -> kpc_status {
    guard("kpc_config_set_warm_start", || {
        let app = if app.is_null() {
            None
        } else {
            // SAFETY: forwarded to the caller.
            let name = unsafe { str_arg(app, "app")? };
            if !valid_app_name(name) {
                return Err(Failure::invalid(format!(
                    "app is {name:?}: expected 1 to 64 letters, digits, '.', '_' or '-', not \
                     starting with '.' or '-'"
                )));
            }
            Some(name.to_owned())
        };
        with_config(config, |c| {
            c.warm_start = app;
            Ok(())
        })
    })
}

/// Turns cache debug mode on (1) or off (0) (`KPC_CACHE_DEBUG`): lookups run and are counted, but
/// every program is built fresh, compared with the cached binary, and nothing is written.
///
/// Errors: `KPC_STATUS_INVALID_ARGUMENT` for a bad handle or a value other than 0 or 1.
///
/// # Safety
/// None beyond the handle's (which is checked).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kpc_config_set_cache_debug(
    config: *mut kpc_config,
    on: i32,
) -> kpc_status {
    guard("kpc_config_set_cache_debug", || {
        let on = switch_arg(on, "on")?;
        with_config(config, |c| {
            c.cache_debug = on;
            Ok(())
        })
    })
}

/// Sets sealed mode (`KPC_CACHE_SEAL`): `KPC_SEAL_OFF` (the default), `KPC_SEAL_WARN` or
/// `KPC_SEAL_ERROR`. A context made with warn or error seals itself when its warm start has finished
/// (at creation without warm start); see `kpc_context_seal`.
///
/// Errors: `KPC_STATUS_INVALID_ARGUMENT` for a bad handle or a `mode` that is not one of those three.
///
/// # Safety
/// None beyond the handle's (which is checked).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kpc_config_set_seal(config: *mut kpc_config, mode: u32) -> kpc_status {
    guard("kpc_config_set_seal", || {
        let mode = super::context::seal_arg(mode, false)?.unwrap_or_default();
        with_config(config, |c| {
            c.seal = mode;
            Ok(())
        })
    })
}
