//! Where kpc's warnings go when nobody installed a `tracing` subscriber.
//!
//! kpc degrades instead of failing: an unusable cache directory, a remote that does not answer, a
//! corrupt entry are warnings, once per cause, and the work is built instead. Those warnings are
//! `tracing` events, but an embedder without a subscriber (and every C program) would never see
//! them. So each warning is also delivered, in this order of preference:
//! 1. to the callback of the context's [`crate::Config`] ([`crate::config::ConfigBuilder::on_warning`]),
//!    for warnings about that context's caches and stores;
//! 2. else to the process-wide callback ([`set_warning_callback`]; C: `kpc_set_log_callback`);
//! 3. else, when no `tracing` subscriber is installed, as one line on stderr (`kpc: warning: ...`),
//!    unless `KPC_LOG_STDERR=0` (read at each warning, so it applies to configurations made in code
//!    too) or the configuration says not to ([`crate::config::ConfigBuilder::log_stderr`]).
//!
//! A subscriber still receives every warning as a `tracing` event whatever happens here.

use std::fmt;
use std::sync::Arc;

use parking_lot::RwLock;

/// One warning: what kpc could not do and what it does instead.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Warning {
    /// The part of kpc that warns, as its `tracing` target (`kpc::cache::disk`, `kpc::cache::store`, ...).
    pub target: &'static str,
    /// The cause, a short stable name (`unusable-root`, `io`, `timeout`, ...): each is warned about
    /// once per cache or store.
    pub cause: &'static str,
    /// The message, in words.
    pub message: String,
}

impl fmt::Display for Warning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} [{}]", self.message, self.cause)
    }
}

/// A function that receives kpc's warnings. It runs on whichever thread warns, possibly inside a
/// cache operation, so it should return quickly and must not call back into the same context.
#[derive(Clone)]
pub struct WarningCallback(Arc<dyn Fn(&Warning) + Send + Sync>);

impl WarningCallback {
    /// Wraps `f`.
    pub fn new(f: impl Fn(&Warning) + Send + Sync + 'static) -> WarningCallback {
        WarningCallback(Arc::new(f))
    }

    fn call(&self, w: &Warning) {
        // A panicking callback must not take the cache operation that warned down with it.
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| (self.0)(w)));
    }
}

impl fmt::Debug for WarningCallback {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("WarningCallback")
    }
}

impl PartialEq for WarningCallback {
    /// Two callbacks are equal when they are the same function object.
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

/// Where the warnings of one context's caches and stores go: its [`crate::Config`]'s callback and
/// stderr switch (`KPC_LOG_STDERR`).
#[derive(Debug, Clone, PartialEq)]
pub struct Sink {
    /// The context's own callback; `None`: the process-wide one, else stderr.
    pub callback: Option<WarningCallback>,
    /// Whether a warning nobody else receives is printed on stderr.
    pub stderr: bool,
}

impl Default for Sink {
    fn default() -> Sink {
        Sink {
            callback: None,
            stderr: stderr_from_env(),
        }
    }
}

static GLOBAL: RwLock<Option<WarningCallback>> = RwLock::new(None);

/// Installs `callback` as the process-wide receiver of kpc's warnings (those of contexts without
/// their own callback, and those about devices); `None` removes it. Returns the one it replaces.
pub fn set_warning_callback(callback: Option<WarningCallback>) -> Option<WarningCallback> {
    std::mem::replace(&mut *GLOBAL.write(), callback)
}

/// The variable that silences the stderr fallback.
pub(crate) const STDERR_VAR: &str = "KPC_LOG_STDERR";

/// Delivers `w` (already emitted as a `tracing` event by the caller) to the sink's callback, else
/// the process-wide callback, else stderr when no subscriber is installed. `None`: a warning that
/// belongs to no context (a device's), with the environment's stderr switch.
pub(crate) fn deliver(sink: Option<&Sink>, w: &Warning) {
    if let Some(cb) = sink.and_then(|s| s.callback.as_ref()) {
        cb.call(w);
        return;
    }
    let global = GLOBAL.read().clone();
    if let Some(cb) = global {
        cb.call(w);
        return;
    }
    let subscriber =
        tracing::dispatcher::get_default(|d| !d.is::<tracing::subscriber::NoSubscriber>());
    // The operator's switch silences stderr for every context, whatever a configuration made in
    // code says; a configuration can silence its own contexts too.
    let stderr = sink.is_none_or(|s| s.stderr) && stderr_from_env();
    if !subscriber && stderr {
        eprintln!("kpc: warning: {w}");
    }
}

/// `KPC_LOG_STDERR`: 1 (default) or 0. [`crate::Config::from_env`] refuses a malformed value; here,
/// where a warning cannot fail, it keeps the default.
pub(crate) fn stderr_from_env() -> bool {
    // The switch syntax of every kpc variable; only an explicit "off" turns it off.
    let off = |v: String| {
        matches!(
            v.trim().to_ascii_lowercase().as_str(),
            "0" | "false" | "no" | "off"
        )
    };
    !std::env::var(STDERR_VAR).is_ok_and(off)
}

/// Emits a `tracing` warning on `target` and delivers it (see the module documentation).
macro_rules! emit {
    ($sink:expr, target: $target:literal, cause: $cause:expr, $($arg:tt)+) => {{
        let message = format!($($arg)+);
        let cause: &'static str = $cause;
        tracing::warn!(target: $target, cause, "{message}");
        $crate::warnings::deliver(
            $sink,
            &$crate::warnings::Warning { target: $target, cause, message },
        );
    }};
}
pub(crate) use emit;
