//! The validation layer for instances a test creates itself (an embedder's, in the interop tests),
//! on the same request as kpc's own (`KPC_VULKAN_VALIDATION`): kpc validates only the instances it
//! creates, so an embedder that wants its device checked, kpc's calls on it included, enables the
//! layer itself. As with kpc's `abort`, an error is printed and aborts the test process.
use std::ffi::{CStr, c_char, c_void};
use std::io::Write;

use ash::vk;

const LAYER: &CStr = c"VK_LAYER_KHRONOS_validation";

/// Whether the run asks for validation.
pub fn requested() -> bool {
    std::env::var("KPC_VULKAN_VALIDATION")
        .is_ok_and(|v| !matches!(v.trim(), "" | "0" | "false" | "no" | "off"))
}

/// The layers and instance extensions to enable: the layer and VK_EXT_debug_utils when the run
/// asks for validation, nothing otherwise.
pub fn instance_layers_and_extensions() -> (Vec<*const c_char>, Vec<*const c_char>) {
    if requested() {
        (
            vec![LAYER.as_ptr()],
            vec![vk::EXT_DEBUG_UTILS_NAME.as_ptr()],
        )
    } else {
        (Vec::new(), Vec::new())
    }
}

/// A messenger on a test's own instance; destroy it (`destroy`) before the instance.
pub struct Messenger(Option<(ash::ext::debug_utils::Instance, vk::DebugUtilsMessengerEXT)>);

impl Messenger {
    /// Destroys the messenger. Call it right before vkDestroyInstance.
    pub fn destroy(&mut self) {
        if let Some((utils, m)) = self.0.take() {
            // SAFETY: the messenger was created on this still-live instance and is destroyed once.
            unsafe { utils.destroy_debug_utils_messenger(m, None) };
        }
    }
}

/// After creating `instance` with [`instance_layers_and_extensions`]: a messenger that aborts at the
/// first validation error (none when validation is not requested).
pub fn install_messenger(entry: &ash::Entry, instance: &ash::Instance) -> Messenger {
    if !requested() {
        return Messenger(None);
    }
    let info = vk::DebugUtilsMessengerCreateInfoEXT::default()
        .message_severity(vk::DebugUtilsMessageSeverityFlagsEXT::ERROR)
        .message_type(
            vk::DebugUtilsMessageTypeFlagsEXT::GENERAL
                | vk::DebugUtilsMessageTypeFlagsEXT::VALIDATION,
        )
        .pfn_user_callback(Some(on_error));
    let utils = ash::ext::debug_utils::Instance::new(entry, instance);
    // SAFETY: the instance is alive and was created with VK_EXT_debug_utils (requested() is true).
    let m = unsafe { utils.create_debug_utils_messenger(&info, None) }
        .expect("vkCreateDebugUtilsMessengerEXT");
    Messenger(Some((utils, m)))
}

unsafe extern "system" fn on_error(
    _severity: vk::DebugUtilsMessageSeverityFlagsEXT,
    _types: vk::DebugUtilsMessageTypeFlagsEXT,
    data: *const vk::DebugUtilsMessengerCallbackDataEXT<'_>,
    _user: *mut c_void,
) -> vk::Bool32 {
    // SAFETY: the layer passes valid callback data whose message lives for the call.
    let message = unsafe { data.as_ref() }
        .filter(|d| !d.p_message.is_null())
        .map(|d| {
            unsafe { CStr::from_ptr(d.p_message) }
                .to_string_lossy()
                .into_owned()
        })
        .unwrap_or_default();
    let _ = std::io::stderr().write_all(
        format!("test embedder: Vulkan validation error (aborting): {message}\n").as_bytes(),
    );
    std::process::abort();
}
