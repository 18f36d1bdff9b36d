//! A logical device with one compute queue, as an embedder in the interop tests opens it.

use ash::vk;

/// Creates a device on `pd` with queue 0 of its first compute-capable family and nothing optional
/// enabled but `robustBufferAccess` where the device has it (as an engine that launches through kpc
/// would; [`robust`] says whether it did). Returns the device, the family and the queue.
pub fn open_compute_device(
    instance: &ash::Instance,
    pd: vk::PhysicalDevice,
) -> (ash::Device, u32, vk::Queue) {
    // SAFETY: `pd` belongs to the instance.
    let families = unsafe { instance.get_physical_device_queue_family_properties(pd) };
    let family = families
        .iter()
        .position(|f| f.queue_flags.contains(vk::QueueFlags::COMPUTE))
        .expect("a compute queue family") as u32;
    let priorities = [1.0f32];
    let queues = [vk::DeviceQueueCreateInfo::default()
        .queue_family_index(family)
        .queue_priorities(&priorities)];
    let features = vk::PhysicalDeviceFeatures::default().robust_buffer_access(robust(instance, pd));
    // SAFETY: the create info lives across the call; the one feature enabled is supported.
    let device = unsafe {
        instance.create_device(
            pd,
            &vk::DeviceCreateInfo::default()
                .queue_create_infos(&queues)
                .enabled_features(&features),
            None,
        )
    }
    .expect("vkCreateDevice");
    // SAFETY: queue 0 of `family` was requested.
    let queue = unsafe { device.get_device_queue(family, 0) };
    (device, family, queue)
}

/// Whether `pd` supports `robustBufferAccess` (then [`open_compute_device`] enables it).
pub fn robust(instance: &ash::Instance, pd: vk::PhysicalDevice) -> bool {
    // SAFETY: `pd` belongs to the instance.
    unsafe { instance.get_physical_device_features(pd) }.robust_buffer_access == vk::TRUE
}
