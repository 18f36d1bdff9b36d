//! `kpc status`: the resolved configuration, where it came from, and whether the disk cache and the
//! read-only layers are usable.

use std::process::ExitCode;

use kpc::{CacheDirSource, Config};

fn size(b: u64) -> String {
    match b {
        0 => "0".into(),
        b if b % (1 << 30) == 0 => format!("{}G", b >> 30),
        b if b % (1 << 20) == 0 => format!("{}M", b >> 20),
        b if b % (1 << 10) == 0 => format!("{}K", b >> 10),
        b => format!("{b}"),
    }
}

pub fn run(c: &Config) -> kpc::Result<ExitCode> {
    let onoff = |b: bool| if b { "on" } else { "off" };
    outln!("kpc {}", env!("CARGO_PKG_VERSION"));
    outln!("configuration (from the environment; see ENVIRONMENT.md):");
    outln!(
        "  KPC_CACHE_PERSISTENT                = {}",
        onoff(c.persistent)
    );
    let src = match c.cache_dir_source {
        CacheDirSource::Explicit => "KPC_CACHE_DIR",
        CacheDirSource::XdgCacheHome => "$XDG_CACHE_HOME/kpc",
        CacheDirSource::Home => "$HOME/.cache/kpc",
        CacheDirSource::Unresolved => "unresolved: no KPC_CACHE_DIR, XDG_CACHE_HOME or HOME",
    };
    match &c.cache_dir {
        Some(d) => outln!(
            "  KPC_CACHE_DIR                       = {} ({src})",
            d.display()
        ),
        None => outln!("  KPC_CACHE_DIR                       = - ({src})"),
    }
    let ro: Vec<String> = c
        .readonly_dirs
        .iter()
        .map(|d| d.display().to_string())
        .collect();
    outln!(
        "  KPC_CACHE_READONLY_DIRS             = {}",
        if ro.is_empty() {
            "- (none)".to_string()
        } else {
            ro.join(":")
        }
    );
    // The remote tier; its URL as displayed never shows a password, nor is the key shown.
    match &c.remote {
        Some(r) => outln!("  KPC_CACHE_REMOTE                    = {r}"),
        None => outln!("  KPC_CACHE_REMOTE                    = - (none)"),
    }
    outln!(
        "  KPC_CACHE_REMOTE_TIMEOUT            = {:?}",
        c.remote_timeout
    );
    outln!(
        "  KPC_CACHE_REMOTE_KEY                = {}",
        if c.remote_key.is_some() {
            "set (entries authenticated)"
        } else {
            "- (unset: entries unauthenticated)"
        }
    );
    outln!(
        "  KPC_CACHE_REMOTE_COMPRESS           = {}",
        match c.remote_compress {
            0 => "0 (entries published uncompressed)".to_string(),
            l => format!("{l} (zstd level of published entries)"),
        }
    );
    match c.remote_not_before {
        Some(t) => outln!(
            "  KPC_CACHE_REMOTE_NOT_BEFORE         = {} (entries built before are refused)",
            crate::entry_fmt::utc(t)
        ),
        None => outln!("  KPC_CACHE_REMOTE_NOT_BEFORE         = - (no cut-off)"),
    }
    match &c.signing_key {
        Some(k) => outln!(
            "  KPC_CACHE_SIGNING_KEY               = set (signs as {})",
            k.public_key().fingerprint()
        ),
        None => outln!("  KPC_CACHE_SIGNING_KEY               = - (unset: publishes unsigned)"),
    }
    if c.trusted_keys.is_empty() {
        outln!("  KPC_CACHE_TRUSTED_KEYS              = - (unset: signatures not required)");
    } else {
        let fps: Vec<String> = c.trusted_keys.iter().map(|k| k.fingerprint()).collect();
        outln!("  KPC_CACHE_TRUSTED_KEYS              = {}", fps.join(", "));
    }
    outln!("  KPC_HOST_ID                         = {}", c.host_id());
    let max = if c.max_size == 0 {
        "unlimited".to_string()
    } else {
        size(c.max_size)
    };
    outln!("  KPC_CACHE_MAX_SIZE                  = {max}");
    outln!(
        "  KPC_CACHE_MAX_ENTRIES               = {}",
        match c.max_entries {
            0 => "0 (unlimited)".to_string(),
            n => format!("{n} entries"),
        }
    );
    outln!(
        "  KPC_CACHE_MIN_FREE                  = {}",
        match c.min_free {
            kpc::MinFree::Bytes(0) => "0 (no free-space floor)".to_string(),
            kpc::MinFree::Bytes(b) => size(b),
            f => format!("{f} of the file system (and of its inodes)"),
        }
    );
    match &c.lock_dir {
        Some(d) => outln!("  KPC_CACHE_LOCK_DIR                  = {}", d.display()),
        None => outln!("  KPC_CACHE_LOCK_DIR                  = - (locks in the cache tree)"),
    }
    outln!(
        "  KPC_CACHE_MIN_DEVICE_IMAGE_SIZE     = {}",
        size(c.min_device_image_size)
    );
    outln!(
        "  KPC_CACHE_MAX_DEVICE_IMAGE_SIZE     = {}",
        size(c.max_device_image_size)
    );
    outln!(
        "  KPC_CACHE_IN_MEM                    = {}",
        onoff(c.in_mem)
    );
    let thr = if c.in_mem_eviction_threshold == 0 {
        "0 (no eviction)".to_string()
    } else {
        size(c.in_mem_eviction_threshold)
    };
    outln!("  KPC_IN_MEM_CACHE_EVICTION_THRESHOLD = {thr}");
    outln!(
        "  KPC_CACHE_LOCK_TIMEOUT              = {:?}",
        c.lock_timeout
    );
    outln!("  KPC_CACHE_TRACE                     = {}", c.trace.bits());
    outln!(
        "  KPC_CACHE_DEBUG                     = {}",
        u8::from(c.cache_debug)
    );
    outln!("  KPC_DEVICE                          = {}", c.device);
    outln!(
        "  KPC_CACHE_PREFETCH                  = {}",
        c.warm_start
            .as_deref()
            .map_or("0 (warm start off)".to_string(), |a| format!(
                "on, application {a:?}"
            ))
    );
    outln!("  KPC_CACHE_SEAL                      = {}", c.seal);
    outln!();
    match c.disk_cache_root() {
        None if !c.persistent => outln!("disk cache: off (KPC_CACHE_PERSISTENT=0)"),
        None => outln!("disk cache: off (no cache directory could be resolved)"),
        Some(root) => {
            let state = if root.is_dir() {
                match std::fs::metadata(root) {
                    Ok(m) if m.permissions().readonly() => "exists, read-only",
                    Ok(_) => "exists",
                    Err(_) => "unreadable",
                }
            } else {
                "not created yet (created on the first put)"
            };
            outln!("disk cache: on at {} ({state})", root.display());
        }
    }
    for (i, d) in c.readonly_dirs.iter().enumerate() {
        // Searched after the local cache, in this order; never written, so no state but presence.
        let bundle = kpc::admin::bundle::is_bundle_path(d);
        let state = match (c.persistent, d.join(kpc::admin::disk::VERSION_DIR).is_dir()) {
            (false, _) => "off (KPC_CACHE_PERSISTENT=0)",
            (true, _) if bundle && d.is_file() => "bundle, searched in place",
            (true, _) if bundle => "bundle, missing: every lookup misses",
            (true, true) => "searched",
            (true, false) if d.is_dir() => "searched, holds no cache yet",
            (true, false) => "searched, missing: every lookup misses",
        };
        outln!("read-only layer {}: {} ({state})", i + 1, d.display());
    }
    Ok(ExitCode::SUCCESS)
}
