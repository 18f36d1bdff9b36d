//! The engine of the interop contract tests: its own instance under the Khronos validation layer,
//! with a debug-utils messenger that counts errors, its device and one compute queue; kpc gets the
//! counting `vkGetInstanceProcAddr` of `vk_counting.rs` in front of the loader's.

use std::ffi::c_void;
use std::sync::atomic::{AtomicU64, Ordering};

use ash::vk;
use kpc::interop::{VulkanFeatures, VulkanHandles};
use kpc::{Config, Context};

use crate::common::drivers::{ran, skip};
use crate::common::vk_counting;

/// Validation messages of error severity since the last scenario began.
pub static VALIDATION_ERRORS: AtomicU64 = AtomicU64::new(0);

unsafe extern "system" fn on_message(
    severity: vk::DebugUtilsMessageSeverityFlagsEXT,
    _types: vk::DebugUtilsMessageTypeFlagsEXT,
    data: *const vk::DebugUtilsMessengerCallbackDataEXT<'_>,
    _user: *mut c_void,
) -> vk::Bool32 {
    if severity.contains(vk::DebugUtilsMessageSeverityFlagsEXT::ERROR) {
        let n = VALIDATION_ERRORS.fetch_add(1, Ordering::SeqCst);
        // SAFETY: the layer passes valid callback data with a NUL-terminated message.
        let text = unsafe { (*data).message_as_c_str() }.map_or_else(
            || "<no message>".into(),
            |m| m.to_string_lossy().into_owned(),
        );
        if n < 5 {
            eprintln!("VALIDATION ERROR: {text}");
        }
    }
    vk::FALSE
}

const LAYER: &std::ffi::CStr = c"VK_LAYER_KHRONOS_validation";

/// The engine: its own instance under the validation layer, its device and one compute queue.
pub struct Engine {
    entry: ash::Entry,
    pub instance: ash::Instance,
    utils: ash::ext::debug_utils::Instance,
    messenger: vk::DebugUtilsMessengerEXT,
    pub api_version: u32,
    pub pd: vk::PhysicalDevice,
    pub device: ash::Device,
    pub family: u32,
    pub queue: vk::Queue,
}

impl Engine {
    /// The engine on the first Vulkan device, or a reported skip where there is no driver.
    pub fn new(test: &str) -> Option<Engine> {
        // SAFETY: loading the system's Vulkan loader, as any Vulkan application does.
        let entry = match unsafe { ash::Entry::load() } {
            Ok(e) => e,
            Err(e) => return skip("vulkan", test, &format!("no Vulkan loader: {e}")),
        };
        // SAFETY: no preconditions.
        let layers = unsafe { entry.enumerate_instance_layer_properties() }.unwrap_or_default();
        if !layers
            .iter()
            .any(|l| l.layer_name_as_c_str().is_ok_and(|n| n == LAYER))
        {
            return skip(
                "vulkan",
                test,
                "the Khronos validation layer is not installed (vulkan-validationlayers)",
            );
        }
        // SAFETY: no preconditions.
        let loader = unsafe { entry.try_enumerate_instance_version() }
            .unwrap()
            .unwrap_or(vk::API_VERSION_1_0);
        let api_version = loader.min(vk::API_VERSION_1_3);
        let app = vk::ApplicationInfo::default()
            .application_name(c"kpc contract test")
            .api_version(api_version);
        let layer_names = [LAYER.as_ptr()];
        let exts = [ash::ext::debug_utils::NAME.as_ptr()];
        let mut messenger_info = vk::DebugUtilsMessengerCreateInfoEXT::default()
            .message_severity(
                vk::DebugUtilsMessageSeverityFlagsEXT::ERROR
                    | vk::DebugUtilsMessageSeverityFlagsEXT::WARNING,
            )
            .message_type(
                vk::DebugUtilsMessageTypeFlagsEXT::GENERAL
                    | vk::DebugUtilsMessageTypeFlagsEXT::VALIDATION
                    | vk::DebugUtilsMessageTypeFlagsEXT::PERFORMANCE,
            )
            .pfn_user_callback(Some(on_message));
        // SAFETY: the create infos live across the call; the messenger chained here also reports
        // on vkCreateInstance itself.
        let instance = unsafe {
            entry.create_instance(
                &vk::InstanceCreateInfo::default()
                    .application_info(&app)
                    .enabled_layer_names(&layer_names)
                    .enabled_extension_names(&exts)
                    .push_next(&mut messenger_info),
                None,
            )
        }
        .expect("vkCreateInstance with the validation layer");
        let utils = ash::ext::debug_utils::Instance::new(&entry, &instance);
        // SAFETY: the instance enables VK_EXT_debug_utils; destroyed in Drop.
        let messenger = unsafe { utils.create_debug_utils_messenger(&messenger_info, None) }
            .expect("a debug messenger");
        // SAFETY: the instance is alive.
        let pds = unsafe { instance.enumerate_physical_devices() }.unwrap();
        let Some(&pd) = pds.first() else {
            return skip("vulkan", test, "no Vulkan device");
        };
        let (device, family, queue) = crate::common::vk_device::open_compute_device(&instance, pd);
        vk_counting::install(entry.static_fn().get_instance_proc_addr);
        ran("vulkan", test);
        Some(Engine {
            entry,
            instance,
            utils,
            messenger,
            api_version,
            pd,
            device,
            family,
            queue,
        })
    }

    /// The handles kpc gets: the counting `vkGetInstanceProcAddr` in front of the loader's.
    pub fn handles(&self) -> VulkanHandles {
        VulkanHandles {
            get_instance_proc_addr: vk_counting::counting_gipa,
            instance: self.instance.handle(),
            instance_api_version: self.api_version,
            physical_device: self.pd,
            device: self.device.handle(),
            queue_family_index: self.family,
            queue: self.queue,
            // What the engine enabled: robustBufferAccess where the device has it.
            enabled: if crate::common::vk_device::robust(&self.instance, self.pd) {
                VulkanFeatures::ROBUST_BUFFER_ACCESS
            } else {
                VulkanFeatures::empty()
            },
            queue_lock: None,
        }
    }

    /// A kpc context over the engine's device and queue.
    pub fn context(&self, config: &Config) -> Context {
        // SAFETY: the handles are this engine's live objects, destroyed in Drop after every kpc
        // object of the scenario was dropped; the counting entry point forwards to the loader's,
        // which created the instance; nothing optional is declared or enabled.
        unsafe {
            Context::builder()
                .vulkan_handles(&self.handles())
                .config(config.clone())
                .build()
        }
        .expect("an interop context")
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        // SAFETY: every kpc object over these handles was dropped before (each scenario drops
        // them first); the engine destroys what it created, last.
        unsafe {
            self.device.device_wait_idle().unwrap();
            self.device.destroy_device(None);
            self.utils
                .destroy_debug_utils_messenger(self.messenger, None);
            self.instance.destroy_instance(None);
        }
        let _ = &self.entry;
    }
}
