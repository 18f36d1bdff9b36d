//! The Khronos validation layer on kpc's own Vulkan instance, on request (`KPC_VULKAN_VALIDATION`).
//!
//! With it, the instance enables `VK_LAYER_KHRONOS_validation` and a VK_EXT_debug_utils messenger
//! that counts every validation error ([`validation_errors`]) and prints it on stderr (and through
//! `tracing`, target `kpc::vulkan::validation`). With `abort`, the first error also ends the process
//! (after printing it), so that a test run fails on any error wherever it happens: scripts/test.sh
//! runs the tests that way. An embedder's instance (interop) is the embedder's to validate.

use std::ffi::{CStr, c_void};
use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};

use ash::vk;

use crate::config::ConfigError;
use crate::error::{Error, Result};

/// The variable that asks for validation.
pub(crate) const VAR: &str = "KPC_VULKAN_VALIDATION";

/// The layer kpc enables.
pub(crate) const LAYER: &CStr = c"VK_LAYER_KHRONOS_validation";

/// What `KPC_VULKAN_VALIDATION` asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// No layer (the default).
    Off,
    /// The layer, with errors counted and printed.
    Report,
    /// As `Report`, and the first error aborts the process.
    Abort,
}

/// Parses the variable's value (`None`: unset).
///
/// Errors: [`Error::Config`] for a value that is neither a switch nor `abort`.
pub(crate) fn parse(value: Option<&str>) -> Result<Mode> {
    let Some(v) = value else {
        return Ok(Mode::Off);
    };
    match v.trim().to_ascii_lowercase().as_str() {
        "" | "0" | "false" | "no" | "off" => Ok(Mode::Off),
        "1" | "true" | "yes" | "on" => Ok(Mode::Report),
        "abort" => Ok(Mode::Abort),
        _ => Err(Error::Config(ConfigError::Invalid {
            var: VAR,
            value: v.to_string(),
            accepted: "0 or 1 (also true/false, yes/no, on/off), or abort",
        })),
    }
}

/// The mode the process's environment asks for.
pub(crate) fn from_env() -> Result<Mode> {
    let v = std::env::var_os(VAR);
    let s = v.as_ref().map(|v| v.to_string_lossy());
    parse(s.as_deref())
}

static ERRORS: AtomicU64 = AtomicU64::new(0);
static ENABLED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
static ABORT: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Validation errors the layer reported on kpc's own instance in this process (0 when validation
/// is off, see [`validation_enabled`]).
pub fn validation_errors() -> u64 {
    ERRORS.load(Ordering::Relaxed)
}

/// Whether kpc's own Vulkan instance runs under the validation layer (`KPC_VULKAN_VALIDATION`).
/// Known only once the instance exists (after the first Vulkan call of the process).
pub fn validation_enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

pub(crate) fn mark_enabled(mode: Mode) {
    ENABLED.store(mode != Mode::Off, Ordering::Relaxed);
    ABORT.store(mode == Mode::Abort, Ordering::Relaxed);
}

/// Whether the loader offers the layer.
pub(crate) fn layer_present(entry: &ash::Entry) -> bool {
    // SAFETY: `entry` is a loaded loader; the call has no preconditions.
    unsafe { entry.enumerate_instance_layer_properties() }
        .unwrap_or_default()
        .iter()
        .any(|l| l.layer_name_as_c_str().is_ok_and(|n| n == LAYER))
}

/// What the messenger listens to: errors and warnings of validation and general messages.
pub(crate) fn messenger_info() -> vk::DebugUtilsMessengerCreateInfoEXT<'static> {
    vk::DebugUtilsMessengerCreateInfoEXT::default()
        .message_severity(
            vk::DebugUtilsMessageSeverityFlagsEXT::ERROR
                | vk::DebugUtilsMessageSeverityFlagsEXT::WARNING,
        )
        .message_type(
            vk::DebugUtilsMessageTypeFlagsEXT::GENERAL
                | vk::DebugUtilsMessageTypeFlagsEXT::VALIDATION,
        )
        .pfn_user_callback(Some(on_message))
}

/// The messenger's callback. It runs on whichever thread made the Vulkan call, inside the driver's
/// call stack: it must not unwind, so everything that could panic runs under `catch_unwind`.
unsafe extern "system" fn on_message(
    severity: vk::DebugUtilsMessageSeverityFlagsEXT,
    _types: vk::DebugUtilsMessageTypeFlagsEXT,
    data: *const vk::DebugUtilsMessengerCallbackDataEXT<'_>,
    _user: *mut c_void,
) -> vk::Bool32 {
    let error = severity.contains(vk::DebugUtilsMessageSeverityFlagsEXT::ERROR);
    let _ = std::panic::catch_unwind(|| {
        // SAFETY: the layer passes a valid callback data struct whose strings live for the call.
        let message = unsafe { data.as_ref() }
            .and_then(|d| (!d.p_message.is_null()).then(|| unsafe { CStr::from_ptr(d.p_message) }))
            .map(|m| m.to_string_lossy().into_owned())
            .unwrap_or_default();
        if error {
            ERRORS.fetch_add(1, Ordering::Relaxed);
            // Straight to the stderr file, not through the test harness's captured print!: the
            // process may abort right after.
            let _ = std::io::stderr()
                .write_all(format!("kpc: Vulkan validation error: {message}\n").as_bytes());
            tracing::error!(target: "kpc::vulkan::validation", "{message}");
        } else {
            tracing::warn!(target: "kpc::vulkan::validation", "{message}");
        }
    });
    if error && ABORT.load(Ordering::Relaxed) {
        let _ = std::io::stderr().write_all(
            format!("kpc: {VAR}=abort: aborting at the first validation error\n").as_bytes(),
        );
        std::process::abort();
    }
    vk::FALSE
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_switches_and_abort() {
        assert_eq!(parse(None).unwrap(), Mode::Off);
        assert_eq!(parse(Some("0")).unwrap(), Mode::Off);
        assert_eq!(parse(Some("on")).unwrap(), Mode::Report);
        assert_eq!(parse(Some("ABORT")).unwrap(), Mode::Abort);
        let e = parse(Some("loud")).unwrap_err();
        assert!(e.to_string().contains(VAR), "{e}");
    }
}
