//! VK_NV_cooperative_matrix2, which ash 0.38 does not know: its feature and property structs as the
//! Vulkan registry defines them (vk.xml, extension 594), chained by raw `p_next`.

use std::ffi::{CStr, c_void};

use ash::vk;

/// The extension's name.
pub(crate) const NAME: &CStr = c"VK_NV_cooperative_matrix2";

/// `VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_2_FEATURES_NV` (vk.xml).
const FEATURES_STYPE: vk::StructureType = vk::StructureType::from_raw(1_000_593_000);
/// `VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_2_PROPERTIES_NV` (vk.xml).
const PROPERTIES_STYPE: vk::StructureType = vk::StructureType::from_raw(1_000_593_002);

/// `VkPhysicalDeviceCooperativeMatrix2FeaturesNV`, field for field.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub(crate) struct Features {
    s_type: vk::StructureType,
    p_next: *mut c_void,
    pub(crate) workgroup_scope: vk::Bool32,
    pub(crate) flexible_dimensions: vk::Bool32,
    pub(crate) reductions: vk::Bool32,
    pub(crate) conversions: vk::Bool32,
    pub(crate) per_element_operations: vk::Bool32,
    pub(crate) tensor_addressing: vk::Bool32,
    pub(crate) block_loads: vk::Bool32,
}

impl Default for Features {
    fn default() -> Self {
        Features {
            s_type: FEATURES_STYPE,
            p_next: std::ptr::null_mut(),
            workgroup_scope: vk::FALSE,
            flexible_dimensions: vk::FALSE,
            reductions: vk::FALSE,
            conversions: vk::FALSE,
            per_element_operations: vk::FALSE,
            tensor_addressing: vk::FALSE,
            block_loads: vk::FALSE,
        }
    }
}

/// `VkPhysicalDeviceCooperativeMatrix2PropertiesNV`, field for field.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub(crate) struct Properties {
    s_type: vk::StructureType,
    p_next: *mut c_void,
    pub(crate) workgroup_scope_max_workgroup_size: u32,
    pub(crate) flexible_dimensions_max_dimension: u32,
    pub(crate) workgroup_scope_reserved_shared_memory: u32,
}

impl Default for Properties {
    fn default() -> Self {
        Properties {
            s_type: PROPERTIES_STYPE,
            p_next: std::ptr::null_mut(),
            workgroup_scope_max_workgroup_size: 0,
            flexible_dimensions_max_dimension: 0,
            workgroup_scope_reserved_shared_memory: 0,
        }
    }
}

/// Puts `s` at the head of the chain that `head` (a `p_next` field) starts. The caller keeps `s`
/// alive, and unmoved, while the chain is used.
fn link(head: &mut *mut c_void, s: *mut c_void, s_next: &mut *mut c_void) {
    *s_next = *head;
    *head = s;
}

impl Features {
    /// The struct that enables, in the struct's order, workgroup scope, flexible dimensions,
    /// reductions, conversions, per-element operations and tensor addressing where `on` says so
    /// (block loads: never).
    pub(crate) fn enabling(on: [bool; 6]) -> Features {
        let b = |i: usize| if on[i] { vk::TRUE } else { vk::FALSE };
        Features {
            workgroup_scope: b(0),
            flexible_dimensions: b(1),
            reductions: b(2),
            conversions: b(3),
            per_element_operations: b(4),
            tensor_addressing: b(5),
            ..Features::default()
        }
    }

    /// Chains `self` into `f2` (whose other structs stay chained after it).
    pub(crate) fn chain_into(&mut self, f2: &mut vk::PhysicalDeviceFeatures2<'_>) {
        let me = (self as *mut Features).cast::<c_void>();
        link(&mut f2.p_next, me, &mut self.p_next);
    }

    /// Chains `self` into a device's creation info.
    pub(crate) fn chain_into_create(&mut self, info: &mut vk::DeviceCreateInfo<'_>) {
        let me = (self as *mut Features).cast::<c_void>();
        // DeviceCreateInfo's p_next is *const; the driver only reads the chain.
        let mut head = info.p_next.cast_mut();
        link(&mut head, me, &mut self.p_next);
        info.p_next = head.cast_const();
    }
}

impl Properties {
    /// Chains `self` into `p2`.
    pub(crate) fn chain_into(&mut self, p2: &mut vk::PhysicalDeviceProperties2<'_>) {
        let me = (self as *mut Properties).cast::<c_void>();
        link(&mut p2.p_next, me, &mut self.p_next);
    }
}

/// The largest workgroup that may use workgroup-scope matrices on `raw`, which must list the
/// extension.
pub(crate) fn max_workgroup(instance: &ash::Instance, raw: vk::PhysicalDevice) -> u32 {
    let mut props = Properties::default();
    let mut p2 = vk::PhysicalDeviceProperties2::default();
    props.chain_into(&mut p2);
    // SAFETY: `props` outlives the call and is the only struct chained; the device lists the
    // extension that defines it, and the callers query only 1.1+ devices (vkGetPhysicalDevice-
    // Properties2 exists).
    unsafe { instance.get_physical_device_properties2(raw, &mut p2) };
    props.workgroup_scope_max_workgroup_size
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn structs_have_the_registry_layout() {
        // sType + pNext, then seven and three 32-bit members (C layout on 64-bit targets).
        assert_eq!(std::mem::size_of::<Features>(), 16 + 7 * 4 + 4);
        assert_eq!(std::mem::size_of::<Properties>(), 16 + 3 * 4 + 4);
        assert_eq!(std::mem::offset_of!(Features, workgroup_scope), 16);
        assert_eq!(std::mem::offset_of!(Features, block_loads), 16 + 6 * 4);
        assert_eq!(Features::default().s_type.as_raw(), 1_000_593_000);
        assert_eq!(Properties::default().s_type.as_raw(), 1_000_593_002);
    }

    #[test]
    fn chaining_keeps_the_rest_of_the_chain() {
        let mut other = vk::PhysicalDevice16BitStorageFeatures::default();
        let mut f2 = vk::PhysicalDeviceFeatures2::default().push_next(&mut other);
        let before = f2.p_next;
        let mut cm2 = Features::default();
        cm2.chain_into(&mut f2);
        assert_eq!(f2.p_next, (&mut cm2 as *mut Features).cast::<c_void>());
        assert_eq!(cm2.p_next, before);
    }
}
