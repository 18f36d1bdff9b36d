//! Runtime configuration: every `KPC_*` environment variable, parsed strictly.
//!
//! kpc is configured the way the SYCL runtime is, through environment variables, but an embedding
//! runtime can build a [`Config`] in code ([`Config::builder`]) and never touch the process
//! environment. Parsing is strict on purpose: a malformed value is a [`ConfigError`] naming the
//! variable, the value and what is accepted, because a cache setting silently ignored is a cache that
//! silently does something else.

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

pub mod vars;

mod device;
mod error;
pub use device::{BackendKind, DeviceClass, DeviceSelector};
pub use error::ConfigError;
pub(crate) use error::invalid;

/// The `KPC_CACHE_TRACE` bitmask: which cache layers emit `tracing` events.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TraceFlags(u8);

impl TraceFlags {
    /// Disk cache events (bit 1).
    pub const DISK: TraceFlags = TraceFlags(1);
    /// In-memory cache events: inserts, hits, evictions (bit 2).
    pub const MEMORY: TraceFlags = TraceFlags(2);
    /// Build events (bit 4).
    pub const BUILDS: TraceFlags = TraceFlags(4);
    /// Every layer.
    pub const ALL: TraceFlags = TraceFlags(7);

    /// Builds the mask from its bits; bits above 7 are rejected.
    pub fn from_bits(bits: u8) -> Result<Self, ConfigError> {
        if bits > 7 {
            return Err(invalid(
                vars::CACHE_TRACE,
                &bits.to_string(),
                TRACE_ACCEPTED,
            ));
        }
        Ok(TraceFlags(bits))
    }
    /// The raw bitmask.
    pub fn bits(self) -> u8 {
        self.0
    }
    /// Whether every bit of `other` is set.
    pub fn contains(self, other: TraceFlags) -> bool {
        self.0 & other.0 == other.0 && other.0 != 0
    }
}

/// Where the disk cache root came from, so `kpc` can tell the user why it is where it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CacheDirSource {
    /// `KPC_CACHE_DIR` (or the builder).
    Explicit,
    /// `$XDG_CACHE_HOME/kpc`.
    XdgCacheHome,
    /// `$HOME/.cache/kpc`.
    Home,
    /// Nothing resolvable: the disk cache is off.
    Unresolved,
}

/// The resolved configuration of one kpc runtime. Each field documents its variable and default
/// (ENVIRONMENT.md lists them all).
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Config {
    /// Use the on-disk cache (`KPC_CACHE_PERSISTENT`, default on).
    pub persistent: bool,
    /// Disk cache root (`KPC_CACHE_DIR`); `None` when nothing could be resolved (disk cache off).
    pub cache_dir: Option<PathBuf>,
    /// Where `cache_dir` came from.
    pub cache_dir_source: CacheDirSource,
    /// Read-only cache roots searched, in order, after the local cache (`KPC_CACHE_READONLY_DIRS`,
    /// default none): never written, locked or evicted. Each must be absolute.
    pub readonly_dirs: Vec<PathBuf>,
    /// Disk limit in bytes (`KPC_CACHE_MAX_SIZE`, default 1 GiB); 0 = unlimited.
    pub max_size: u64,
    /// Disk limit in entries, two files each (`KPC_CACHE_MAX_ENTRIES`, default 0 = unlimited): what
    /// inode quotas count.
    pub max_entries: u64,
    /// Free space (and inodes) a disk cache put must leave on the file system, or it is skipped with
    /// one warning (`KPC_CACHE_MIN_FREE`, default 1%).
    pub min_free: MinFree,
    /// Where the disk cache keeps its lock files instead of the cache tree (`KPC_CACHE_LOCK_DIR`,
    /// default none): node-local storage when the cache is on a network file system.
    pub lock_dir: Option<PathBuf>,
    /// Device images smaller than this are not persisted (`KPC_CACHE_MIN_DEVICE_IMAGE_SIZE`, default 0).
    pub min_device_image_size: u64,
    /// Device images larger than this are not persisted (`KPC_CACHE_MAX_DEVICE_IMAGE_SIZE`, default 1 GiB).
    pub max_device_image_size: u64,
    /// Use the in-memory cache (`KPC_CACHE_IN_MEM`, default on).
    pub in_mem: bool,
    /// Bytes of programs ([`crate::cache::CacheCost`]) kept in memory before LRU eviction; 0 = never evict
    /// (`KPC_IN_MEM_CACHE_EVICTION_THRESHOLD`).
    pub in_mem_eviction_threshold: u64,
    /// How long a process waits for another one building the same key (`KPC_CACHE_LOCK_TIMEOUT`, 30 s).
    pub lock_timeout: Duration,
    /// Which layers trace (`KPC_CACHE_TRACE`, default none).
    pub trace: TraceFlags,
    /// Cache debug mode (`KPC_CACHE_DEBUG`, default off): lookups run and are counted as usual, but
    /// every program is built fresh, its binary compared with the cached one, and nothing is written
    /// to any store.
    pub cache_debug: bool,
    /// Device selector (`KPC_DEVICE`, default auto).
    pub device: DeviceSelector,
    /// Warm start (`KPC_CACHE_PREFETCH`, default off): the application name under which a context
    /// remembers the kernels it acquires and, at creation, reloads those of the last run in the
    /// background. `None` = off.
    pub warm_start: Option<String>,
    /// The remote store (`KPC_CACHE_REMOTE`, default none), looked up after every local layer.
    pub remote: Option<RemoteUrl>,
    /// Bound on each remote call, and on how long publishing a build may hold it back
    /// (`KPC_CACHE_REMOTE_TIMEOUT`, default 2 s).
    pub remote_timeout: Duration,
    /// The fleet's MAC key (`KPC_CACHE_REMOTE_KEY`, default none: entries unauthenticated).
    pub remote_key: Option<MacKey>,
    /// zstd level of the entries this process publishes to the remote (`KPC_CACHE_REMOTE_COMPRESS`,
    /// default 3); 0 publishes them uncompressed. Readers take both whatever this is.
    pub remote_compress: u8,
    /// Remote entries built before this time (seconds since the Unix epoch; the provenance's build
    /// time, covered by the signature when signed) are refused (`KPC_CACHE_REMOTE_NOT_BEFORE`,
    /// default none).
    pub remote_not_before: Option<u64>,
    /// This process's signing key (`KPC_CACHE_SIGNING_KEY`, default none): what it publishes to the
    /// remote or exports to a bundle is signed with it.
    pub signing_key: Option<SigningKey>,
    /// Keys whose signatures this process accepts on shared entries (`KPC_CACHE_TRUSTED_KEYS`,
    /// default none: signatures are not required). With any, an unsigned entry or one signed by
    /// another key is refused.
    pub trusted_keys: Vec<PublicKey>,
    /// This machine's name in the provenance of what it publishes or exports (`KPC_HOST_ID`;
    /// `None`: the host name, see [`Config::host_id`]).
    pub host_id: Option<String>,
    /// Sealed mode (`KPC_CACHE_SEAL`, default off): what a context does with a build once sealed.
    pub seal: SealMode,
    /// Builds a context may run after its warm-up before it is sealed (`KPC_CACHE_BUILD_BUDGET`,
    /// default `None`: sealed, if at all, as soon as the warm-up ends). With a budget, the seal
    /// ([`Config::seal`], `warn` where that is off) comes into force at the first build past it: a
    /// serving process that keeps meeting new kernels stops compiling after the first few.
    pub build_budget: Option<u64>,
    /// Receives the warnings of the caches and stores of contexts made with this configuration
    /// (an unusable cache directory, a failing remote, corrupt entries: once per cause); `None`
    /// (default): the process-wide callback ([`crate::set_warning_callback`]), else stderr. See
    /// [`crate::Warning`].
    pub on_warning: Option<crate::WarningCallback>,
    /// Print warnings that no callback and no `tracing` subscriber receives on stderr, one line per
    /// cause (`KPC_LOG_STDERR`, default on).
    pub log_stderr: bool,
}

/// 1 GiB, the default disk limit and largest persisted image.
pub(crate) const GIB: u64 = 1 << 30;

impl Default for Config {
    /// The defaults of every `KPC_*` variable, the cache directory included: `$XDG_CACHE_HOME/kpc`,
    /// else `$HOME/.cache/kpc` (the platform's variables, not kpc's), as [`Config::from_env`] gives
    /// with no `KPC_*` variable set. The disk cache is off only where neither resolves.
    fn default() -> Self {
        let (cache_dir, cache_dir_source) = default_cache_dir(|name| std::env::var_os(name));
        Config {
            persistent: true,
            cache_dir,
            cache_dir_source,
            readonly_dirs: Vec::new(),
            max_size: GIB,
            max_entries: 0,
            min_free: MinFree::default(),
            lock_dir: None,
            min_device_image_size: 0,
            max_device_image_size: GIB,
            in_mem: true,
            in_mem_eviction_threshold: 0,
            lock_timeout: Duration::from_secs(30),
            trace: TraceFlags::default(),
            cache_debug: false,
            device: DeviceSelector::Auto,
            warm_start: None,
            remote: None,
            remote_timeout: Duration::from_secs(2),
            remote_key: None,
            remote_compress: 3,
            remote_not_before: None,
            signing_key: None,
            trusted_keys: Vec::new(),
            host_id: None,
            seal: SealMode::Off,
            build_budget: None,
            on_warning: None,
            log_stderr: true,
        }
    }
}

/// The default cache directory from `lookup`'s `XDG_CACHE_HOME` and `HOME`, and where it came from.
/// XDG says a relative XDG_CACHE_HOME is invalid and must be ignored; HOME must be absolute too, or
/// the cache would move with the working directory.
fn default_cache_dir(
    lookup: impl Fn(&str) -> Option<OsString>,
) -> (Option<PathBuf>, CacheDirSource) {
    let abs = |v: Option<OsString>| {
        v.map(PathBuf::from)
            .filter(|p| p.is_absolute() && !p.as_os_str().is_empty())
    };
    if let Some(x) = abs(lookup(vars::XDG_CACHE_HOME)) {
        (Some(x.join("kpc")), CacheDirSource::XdgCacheHome)
    } else if let Some(h) = abs(lookup(vars::HOME)) {
        (Some(h.join(".cache").join("kpc")), CacheDirSource::Home)
    } else {
        (None, CacheDirSource::Unresolved)
    }
}

impl Config {
    /// Reads every `KPC_*` variable from the process environment.
    ///
    /// Unset variables take their defaults. A malformed one is an error; nothing is silently ignored.
    pub fn from_env() -> Result<Config, ConfigError> {
        Config::from_lookup(|name| std::env::var_os(name))
    }

    /// Like [`Config::from_env`], but reads variables through `lookup`, so tests and embedders can supply
    /// their own environment.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<OsString>) -> Result<Config, ConfigError> {
        let get = |name: &'static str| -> Result<Option<String>, ConfigError> {
            match lookup(name) {
                None => Ok(None),
                Some(v) => v
                    .into_string()
                    .map(Some)
                    .map_err(|raw| invalid(name, &raw.to_string_lossy(), "a value in valid UTF-8")),
            }
        };
        let mut b = Config::builder();
        if let Some(v) = get(vars::CACHE_PERSISTENT)? {
            b = b.persistent(parse_bool(vars::CACHE_PERSISTENT, &v)?);
        }
        if let Some(v) = get(vars::CACHE_IN_MEM)? {
            b = b.in_mem(parse_bool(vars::CACHE_IN_MEM, &v)?);
        }
        if let Some(v) = get(vars::CACHE_MAX_SIZE)? {
            b = b.max_size(parse_size(vars::CACHE_MAX_SIZE, &v)?);
        }
        if let Some(v) = get(vars::CACHE_MIN_DEVICE_IMAGE_SIZE)? {
            b = b.min_device_image_size(parse_size(vars::CACHE_MIN_DEVICE_IMAGE_SIZE, &v)?);
        }
        if let Some(v) = get(vars::CACHE_MAX_DEVICE_IMAGE_SIZE)? {
            b = b.max_device_image_size(parse_size(vars::CACHE_MAX_DEVICE_IMAGE_SIZE, &v)?);
        }
        if let Some(v) = get(vars::IN_MEM_CACHE_EVICTION_THRESHOLD)? {
            b = b.in_mem_eviction_threshold(parse_size(vars::IN_MEM_CACHE_EVICTION_THRESHOLD, &v)?);
        }
        if let Some(v) = get(vars::CACHE_LOCK_TIMEOUT)? {
            b = b.lock_timeout(parse_duration(vars::CACHE_LOCK_TIMEOUT, &v)?);
        }
        if let Some(v) = get(vars::CACHE_TRACE)? {
            b = b.trace(parse_trace(&v)?);
        }
        if let Some(v) = get(vars::CACHE_DEBUG)? {
            b = b.cache_debug(parse_bool(vars::CACHE_DEBUG, &v)?);
        }
        if let Some(v) = get(vars::DEVICE)? {
            b = b.device(DeviceSelector::parse_var(vars::DEVICE, &v)?);
        }
        if let Some(v) = get(vars::CACHE_PREFETCH)? {
            b.config.warm_start = prefetch::parse_prefetch(&v)?;
        }
        if let Some(v) = get(vars::CACHE_REMOTE)?.filter(|v| !v.trim().is_empty()) {
            b = b.remote(RemoteUrl::parse(&v)?);
        }
        if let Some(v) = get(vars::CACHE_REMOTE_TIMEOUT)? {
            b = b.remote_timeout(parse_duration(vars::CACHE_REMOTE_TIMEOUT, &v)?);
        }
        if let Some(v) = get(vars::CACHE_REMOTE_KEY)? {
            b = b.remote_key(MacKey::from_secret(vars::CACHE_REMOTE_KEY, &v)?);
        }
        if let Some(v) = get(vars::CACHE_SIGNING_KEY)?.filter(|v| !v.trim().is_empty()) {
            let path = std::path::Path::new(v.trim());
            b = b.signing_key(SigningKey::from_file(vars::CACHE_SIGNING_KEY, path)?);
        }
        if let Some(v) = get(vars::CACHE_TRUSTED_KEYS)?.filter(|v| !v.trim().is_empty()) {
            b = b.trusted_keys(signing::parse_trusted_keys(vars::CACHE_TRUSTED_KEYS, &v)?);
        }
        if let Some(v) = get(vars::HOST_ID)? {
            b.config.host_id = Some(v);
        }
        if let Some(v) = get(vars::CACHE_SEAL)? {
            b = b.seal(seal::parse_seal(&v)?);
        }
        if let Some(v) = get(vars::CACHE_BUILD_BUDGET)? {
            b.config.build_budget = seal::parse_build_budget(&v)?;
        }
        if let Some(v) = get(vars::LOG_STDERR)? {
            b = b.log_stderr(parse_bool(vars::LOG_STDERR, &v)?);
        }
        b = cluster::from_lookup(b, &get)?;
        // Paths are bytes on Unix, so the cache roots are the variables not required to be UTF-8.
        if let Some(v) = lookup(vars::CACHE_READONLY_DIRS) {
            b = b.readonly_dirs(parse_dir_list(vars::CACHE_READONLY_DIRS, &v)?);
        }
        match lookup(vars::CACHE_DIR) {
            Some(dir) if dir.to_string_lossy().trim().is_empty() => {
                return Err(invalid(
                    vars::CACHE_DIR,
                    &dir.to_string_lossy(),
                    "a non-empty directory path (unset it to use $XDG_CACHE_HOME/kpc or $HOME/.cache/kpc)",
                ));
            }
            Some(dir) => b = b.cache_dir(dir),
            None => {
                (b.config.cache_dir, b.config.cache_dir_source) = default_cache_dir(&lookup);
            }
        }
        b.build()
    }

    /// A builder starting from the defaults, for embedders that configure kpc in code: what
    /// [`Config::from_env`] gives with no `KPC_*` variable set, so the disk cache is on, at
    /// `$XDG_CACHE_HOME/kpc` or `$HOME/.cache/kpc` ([`Config::default`]). Use
    /// [`ConfigBuilder::cache_dir`] for another directory, [`ConfigBuilder::persistent`]`(false)`
    /// for none.
    pub fn builder() -> ConfigBuilder {
        ConfigBuilder {
            config: Config::default(),
        }
    }

    /// The host id provenance records: `KPC_HOST_ID`, else this machine's host name.
    pub fn host_id(&self) -> String {
        self.host_id.clone().unwrap_or_else(signing::hostname)
    }

    /// Where the warnings of this configuration's contexts go.
    pub(crate) fn warning_sink(&self) -> crate::warnings::Sink {
        crate::warnings::Sink {
            callback: self.on_warning.clone(),
            stderr: self.log_stderr,
        }
    }

    /// The directory the disk cache uses, or `None` when it is off (disabled or unresolvable).
    pub fn disk_cache_root(&self) -> Option<&std::path::Path> {
        if self.persistent {
            self.cache_dir.as_deref()
        } else {
            None
        }
    }
}

/// Builds a [`Config`] in code. [`ConfigBuilder::build`] checks the same invariants as `from_env`.
#[derive(Debug, Clone)]
pub struct ConfigBuilder {
    config: Config,
}

impl ConfigBuilder {
    /// Turns the on-disk cache on or off.
    pub fn persistent(mut self, on: bool) -> Self {
        self.config.persistent = on;
        self
    }
    /// Sends the warnings of this configuration's contexts to `f` instead of the process-wide
    /// callback or stderr (see [`crate::Warning`]).
    pub fn on_warning(mut self, f: impl Fn(&crate::Warning) + Send + Sync + 'static) -> Self {
        self.config.on_warning = Some(crate::WarningCallback::new(f));
        self
    }
    /// Whether warnings nobody else receives go to stderr (`KPC_LOG_STDERR`; default on).
    pub fn log_stderr(mut self, on: bool) -> Self {
        self.config.log_stderr = on;
        self
    }
    /// Sets the disk cache root.
    pub fn cache_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.config.cache_dir = Some(dir.into());
        self.config.cache_dir_source = CacheDirSource::Explicit;
        self
    }
    /// Sets the disk limit in bytes (0 = unlimited).
    pub fn max_size(mut self, bytes: u64) -> Self {
        self.config.max_size = bytes;
        self
    }
    /// Sets the smallest persisted image.
    pub fn min_device_image_size(mut self, bytes: u64) -> Self {
        self.config.min_device_image_size = bytes;
        self
    }
    /// Sets the read-only cache roots, searched in order after the local cache. [`ConfigBuilder::build`]
    /// rejects an empty or relative path.
    pub fn readonly_dirs(mut self, dirs: impl IntoIterator<Item = impl Into<PathBuf>>) -> Self {
        self.config.readonly_dirs = dirs.into_iter().map(Into::into).collect();
        self
    }
    /// Sets the largest persisted image.
    pub fn max_device_image_size(mut self, bytes: u64) -> Self {
        self.config.max_device_image_size = bytes;
        self
    }
    /// Turns the in-memory cache on or off.
    pub fn in_mem(mut self, on: bool) -> Self {
        self.config.in_mem = on;
        self
    }
    /// Sets the in-memory LRU threshold in bytes of programs ([`crate::cache::CacheCost`]) (0 = off).
    pub fn in_mem_eviction_threshold(mut self, bytes: u64) -> Self {
        self.config.in_mem_eviction_threshold = bytes;
        self
    }
    /// Sets the cross-process build wait.
    pub fn lock_timeout(mut self, t: Duration) -> Self {
        self.config.lock_timeout = t;
        self
    }
    /// Sets the trace mask.
    pub fn trace(mut self, t: TraceFlags) -> Self {
        self.config.trace = t;
        self
    }
    /// Sets cache debug mode (see [`Config::cache_debug`]).
    pub fn cache_debug(mut self, on: bool) -> Self {
        self.config.cache_debug = on;
        self
    }
    /// Sets the device selector.
    pub fn device(mut self, d: DeviceSelector) -> Self {
        self.config.device = d;
        self
    }
    /// Turns warm start on under application `app` (`Some`), or off (`None`); see
    /// [`Config::warm_start`]. [`ConfigBuilder::build`] rejects a name `KPC_CACHE_PREFETCH` would.
    pub fn warm_start(mut self, app: Option<&str>) -> Self {
        self.config.warm_start = app.map(str::to_string);
        self
    }
    /// Sets the remote store (`None` for none).
    pub fn remote(mut self, url: impl Into<Option<RemoteUrl>>) -> Self {
        self.config.remote = url.into();
        self
    }
    /// Sets the bound on each remote call and on a publish. [`ConfigBuilder::build`] rejects zero.
    pub fn remote_timeout(mut self, t: Duration) -> Self {
        self.config.remote_timeout = t;
        self
    }
    /// Sets the fleet's MAC key (see [`MacKey::from_secret`]).
    pub fn remote_key(mut self, key: impl Into<Option<MacKey>>) -> Self {
        self.config.remote_key = key.into();
        self
    }
    /// Sets this process's signing key (see [`Config::signing_key`]).
    pub fn signing_key(mut self, key: impl Into<Option<SigningKey>>) -> Self {
        self.config.signing_key = key.into();
        self
    }
    /// Sets the trusted public keys (see [`Config::trusted_keys`]).
    pub fn trusted_keys(mut self, keys: impl IntoIterator<Item = PublicKey>) -> Self {
        self.config.trusted_keys = keys.into_iter().collect();
        self
    }
    /// Sets the host id provenance records. [`ConfigBuilder::build`] rejects an empty one, one longer
    /// than 255 bytes or one with control characters.
    pub fn host_id(mut self, id: impl Into<Option<String>>) -> Self {
        self.config.host_id = id.into();
        self
    }
    /// Sets sealed mode ([`Config::seal`]).
    pub fn seal(mut self, mode: SealMode) -> Self {
        self.config.seal = mode;
        self
    }
    /// Sets the build budget ([`Config::build_budget`]): `builds` after the warm-up, then sealed.
    pub fn build_budget(mut self, builds: u64) -> Self {
        self.config.build_budget = Some(builds);
        self
    }
    /// Checks cross-field invariants and returns the configuration.
    pub fn build(self) -> Result<Config, ConfigError> {
        let c = self.config;
        if let Some(app) = &c.warm_start
            && !prefetch::valid_app_name(app)
        {
            return Err(invalid(
                vars::CACHE_PREFETCH,
                app,
                prefetch::PREFETCH_ACCEPTED,
            ));
        }
        let joined = || {
            let v: Vec<_> = c
                .readonly_dirs
                .iter()
                .map(|p| p.to_string_lossy())
                .collect();
            v.join(":")
        };
        for (i, d) in c.readonly_dirs.iter().enumerate() {
            if let Some(problem) = dir_problem(d.as_os_str()) {
                return Err(ConfigError::InvalidListElement {
                    var: vars::CACHE_READONLY_DIRS,
                    value: joined(),
                    index: i + 1,
                    element: d.to_string_lossy().into_owned(),
                    problem,
                    accepted: DIRS_ACCEPTED,
                });
            }
        }
        if let Some(id) = &c.host_id
            && !signing::valid_host_id(id)
        {
            return Err(invalid(
                vars::HOST_ID,
                id,
                "a name for this machine of 1 to 255 bytes without control characters (unset it to use the host name)",
            ));
        }
        cluster::check(&c)?;
        if c.remote_timeout.is_zero() {
            return Err(invalid(
                vars::CACHE_REMOTE_TIMEOUT,
                "0",
                "a positive duration (e.g. 500ms, 2s): every remote call needs a bound",
            ));
        }
        if c.min_device_image_size > c.max_device_image_size {
            return Err(ConfigError::Inconsistent(format!(
                "{}={} is larger than {}={}: no device image could ever be persisted; \
                 the minimum must not exceed the maximum",
                vars::CACHE_MIN_DEVICE_IMAGE_SIZE,
                c.min_device_image_size,
                vars::CACHE_MAX_DEVICE_IMAGE_SIZE,
                c.max_device_image_size
            )));
        }
        Ok(c)
    }
}

mod cluster;
pub use cluster::MinFree;
mod mac_key;
mod remote_url;
pub mod signing;
pub use mac_key::MacKey;
pub use remote_url::RemoteUrl;
pub use signing::{PublicKey, SigningKey};

mod parse;
pub mod prefetch;
pub mod seal;
pub(crate) use parse::parse_bool;
use parse::{DIRS_ACCEPTED, TRACE_ACCEPTED, dir_problem, parse_trace};
pub use parse::{parse_dir_list, parse_duration, parse_size};
pub use seal::SealMode;

#[cfg(test)]
mod tests;
