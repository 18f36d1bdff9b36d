//! The process-wide Vulkan instance and physical-device discovery.
//!
//! The loader is opened at run time (`ash::Entry::load`), so kpc builds and starts on machines with no
//! Vulkan at all; there every Vulkan call answers `Error::Unavailable`.

use std::ffi::CStr;
use std::sync::{Arc, OnceLock};

use ash::vk;

use crate::backend::{DeviceFingerprint, DeviceInfo, DeviceLimits, DeviceType};
use crate::config::BackendKind;
use crate::error::{Error, Result};

use super::features::VulkanFeatures;
use super::pipeline_cache::BLOB_FORMAT_VERSION;
use super::validation;

/// The newest Vulkan API version kpc asks for; it uses nothing beyond 1.3.
pub(crate) const MAX_API: u32 = vk::API_VERSION_1_3;

/// The loader and one instance, shared by every device of the process. Never destroyed: devices
/// created from it may live until exit, and a process has no use for a second one. Interop also
/// wraps an embedder's instance in one (`interop.rs`), which is one more reason this type must
/// never destroy its instance.
pub(crate) struct VkInstance {
    /// The loader; also keeps its library mapped for as long as the instance is used.
    pub(crate) entry: ash::Entry,
    pub(crate) raw: ash::Instance,
    /// The instance's API version (what the loader supports, capped at 1.3).
    pub(crate) api_version: u32,
}

pub(crate) fn unavailable(reason: impl Into<String>) -> Error {
    Error::Unavailable {
        backend: BackendKind::Vulkan,
        reason: reason.into(),
    }
}

static INSTANCE: OnceLock<Result<Arc<VkInstance>>> = OnceLock::new();

/// The process's Vulkan instance, created on first use. A missing loader or driver is remembered:
/// installing one needs a restart anyway.
pub(crate) fn instance() -> Result<Arc<VkInstance>> {
    INSTANCE.get_or_init(create_instance).clone()
}

fn create_instance() -> Result<Arc<VkInstance>> {
    // SAFETY: loading the Vulkan loader runs its initialization code; we trust the system's
    // libvulkan as every Vulkan application must.
    let entry = unsafe { ash::Entry::load() }
        .map_err(|e| unavailable(format!("no Vulkan loader (libvulkan.so.1): {e}")))?;
    // SAFETY: `entry` is a loaded loader; the call has no preconditions.
    let loader_version = match unsafe { entry.try_enumerate_instance_version() } {
        Ok(Some(v)) => v,
        Ok(None) => vk::API_VERSION_1_0,
        Err(e) => {
            return Err(unavailable(format!(
                "vkEnumerateInstanceVersion failed: {e}"
            )));
        }
    };
    if loader_version < vk::API_VERSION_1_1 {
        return Err(unavailable(format!(
            "the Vulkan loader supports only API {}; kpc needs 1.1",
            version_string(loader_version)
        )));
    }
    let api_version = loader_version.min(MAX_API);
    let app = vk::ApplicationInfo::default()
        .application_name(c"kpc")
        .engine_name(c"kpc")
        .engine_version(1)
        .api_version(api_version);
    let validate = validation::from_env()?;
    let mut layers = Vec::new();
    let mut extensions = Vec::new();
    if validate != validation::Mode::Off {
        if !validation::layer_present(&entry) {
            return Err(unavailable(format!(
                "{}={:?} asks for the validation layer {:?}, which the Vulkan loader does not \
                 find (Debian: apt-get install vulkan-validationlayers)",
                validation::VAR,
                std::env::var(validation::VAR).unwrap_or_default(),
                validation::LAYER
            )));
        }
        layers.push(validation::LAYER.as_ptr());
        extensions.push(vk::EXT_DEBUG_UTILS_NAME.as_ptr());
    }
    // Chained into the create info too, so that vkCreateInstance itself is validated.
    let mut messenger = validation::messenger_info();
    let mut info = vk::InstanceCreateInfo::default()
        .application_info(&app)
        .enabled_layer_names(&layers)
        .enabled_extension_names(&extensions);
    if validate != validation::Mode::Off {
        info = info.push_next(&mut messenger);
    }
    // SAFETY: `info` and what it points to live across the call; the layer and its debug-utils
    // extension are enabled only where the loader lists the layer.
    let raw = unsafe { entry.create_instance(&info, None) }.map_err(|e| {
        if e == vk::Result::ERROR_INCOMPATIBLE_DRIVER {
            unavailable("no Vulkan driver (ICD) is installed (VK_ERROR_INCOMPATIBLE_DRIVER)")
        } else {
            unavailable(format!("vkCreateInstance failed: {e}"))
        }
    })?;
    if validate != validation::Mode::Off {
        let utils = ash::ext::debug_utils::Instance::new(&entry, &raw);
        // SAFETY: the instance is alive and has VK_EXT_debug_utils enabled. The messenger lives as
        // long as the instance, which is never destroyed.
        unsafe { utils.create_debug_utils_messenger(&validation::messenger_info(), None) }
            .map_err(|e| unavailable(format!("vkCreateDebugUtilsMessengerEXT failed: {e}")))?;
        validation::mark_enabled(validate);
    }
    Ok(Arc::new(VkInstance {
        entry,
        raw,
        api_version,
    }))
}

/// `major.minor.patch` of a Vulkan version number.
pub(crate) fn version_string(v: u32) -> String {
    format!(
        "{}.{}.{}",
        vk::api_version_major(v),
        vk::api_version_minor(v),
        vk::api_version_patch(v)
    )
}

/// A driver version in the vendor's own encoding (NVIDIA packs 10.8.8.6 bits; most others use
/// Vulkan's version packing).
fn driver_version_string(vendor_id: u32, v: u32) -> String {
    if vendor_id == 0x10de {
        format!(
            "{}.{}.{}.{}",
            v >> 22,
            (v >> 14) & 0xff,
            (v >> 6) & 0xff,
            v & 0x3f
        )
    } else {
        version_string(v)
    }
}

pub(crate) fn c_chars(s: &[std::ffi::c_char]) -> String {
    let bytes: Vec<u8> = s
        .iter()
        .take_while(|c| **c != 0)
        .map(|c| *c as u8)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// What the backend needs to know about one physical device beyond its [`DeviceInfo`].
#[derive(Clone)]
pub(crate) struct PhysicalDevice {
    pub(crate) raw: vk::PhysicalDevice,
    pub(crate) info: DeviceInfo,
    pub(crate) api_version: u32,
    pub(crate) vendor_id: u32,
    pub(crate) device_id: u32,
    pub(crate) pipeline_cache_uuid: [u8; vk::UUID_SIZE],
    pub(crate) limits: vk::PhysicalDeviceLimits,
    /// The queue family kpc submits to: the first with compute, preferring one that can time.
    pub(crate) queue_family: Option<u32>,
    pub(crate) timestamp_valid_bits: u32,
    /// Whether VK_EXT_pipeline_creation_feedback is available (core from 1.3).
    pub(crate) feedback: bool,
    /// Whether VK_KHR_spirv_1_4 is available (SPIR-V 1.4 on a 1.1 device).
    pub(crate) spirv_1_4_ext: bool,
    /// Whether VK_KHR_pipeline_executable_properties is to be enabled: the driver's statistics
    /// about each compiled kernel (registers, shared memory, ...), reported in `KernelInfo`.
    pub(crate) executable_stats: bool,
    /// Subgroup operations supported in compute shaders (empty where compute is not among the
    /// device's subgroup stages): what SPIR-V subgroup capabilities are checked against.
    pub(crate) subgroup_ops: vk::SubgroupFeatureFlags,
    /// The optional features and extensions it supports: what kpc enables on it.
    pub(crate) supported: VulkanFeatures,
    /// Whether a device kpc opens on it persists pipeline binaries (`VulkanFeatures::PIPELINE_BINARY`
    /// and `KPC_VULKAN_PIPELINE_BINARY` not `off`); its fingerprint says so (`kpc_vulkan_binary`).
    pub(crate) pipeline_binaries: bool,
}

fn has_extension(exts: &[vk::ExtensionProperties], name: &CStr) -> bool {
    exts.iter()
        .any(|e| e.extension_name_as_c_str().is_ok_and(|n| n == name))
}

static PHYSICAL_DEVICES: OnceLock<Result<Arc<[PhysicalDevice]>>> = OnceLock::new();

/// Every physical device, in the driver's enumeration order (what `vulkan:N` indexes), enumerated
/// and described once per process.
///
/// Once, because the physical devices of an instance do not change while it lives, and because
/// enumerating them while other threads create and destroy devices is one of the interleavings under
/// which NVIDIA's driver hung (issue 21): an open no longer calls into the driver before
/// vkCreateDevice, and discovery costs one enumeration per process instead of one per open.
///
/// Errors: [`Error::Unavailable`] when there is no loader, no driver, or no device at all.
pub(crate) fn physical_devices(instance: &VkInstance) -> Result<Arc<[PhysicalDevice]>> {
    PHYSICAL_DEVICES
        .get_or_init(|| enumerate_physical_devices(instance).map(Arc::from))
        .clone()
}

fn enumerate_physical_devices(instance: &VkInstance) -> Result<Vec<PhysicalDevice>> {
    // SAFETY: the instance is alive (never destroyed).
    let raws = unsafe { instance.raw.enumerate_physical_devices() }
        .map_err(|e| unavailable(format!("vkEnumeratePhysicalDevices failed: {e}")))?;
    if raws.is_empty() {
        return Err(unavailable("the Vulkan loader found no devices"));
    }
    raws.into_iter()
        .enumerate()
        .map(|(i, raw)| describe(instance, i, raw))
        .collect()
}

/// Held around every vkCreateDevice of the process.
///
/// The Vulkan spec asks for no such lock, but creating devices is rare (kept devices are reused, see
/// `device::IDLE_DEVICES`) and slow (milliseconds), and NVIDIA's driver has shown it does not take
/// concurrent device lifetimes well (issue 21), so kpc does not ask it to. Nothing on a kernel lookup
/// or a launch takes this lock.
pub(crate) static DEVICE_LIFECYCLE: parking_lot::Mutex<()> = parking_lot::Mutex::new(());

/// Describes `raw`, device `index` of `instance`'s enumeration: what discovery reports, and what
/// interop reuses so that an embedder's device gets the same fingerprint as an owned one.
pub(crate) fn describe(
    instance: &VkInstance,
    index: usize,
    raw: vk::PhysicalDevice,
) -> Result<PhysicalDevice> {
    let inst = &instance.raw;
    // SAFETY: `raw` was enumerated from this live instance.
    let props = unsafe { inst.get_physical_device_properties(raw) };
    // SAFETY: as above.
    let exts = unsafe { inst.enumerate_device_extension_properties(raw) }.unwrap_or_default();
    let api_version = props.api_version;
    let at_least = |v: u32| api_version >= v && instance.api_version >= v;

    let mut driver_props = vk::PhysicalDeviceDriverProperties::default();
    let mut subgroup = vk::PhysicalDeviceSubgroupProperties::default();
    let driver_known =
        at_least(vk::API_VERSION_1_2) || has_extension(&exts, vk::KHR_DRIVER_PROPERTIES_NAME);
    let mut storage16 = vk::PhysicalDevice16BitStorageFeatures::default();
    let mut f16 = vk::PhysicalDeviceShaderFloat16Int8Features::default();
    let coop_ext = has_extension(&exts, vk::KHR_COOPERATIVE_MATRIX_NAME);
    let mut coop = vk::PhysicalDeviceCooperativeMatrixFeaturesKHR::default();
    let mut memory_model = vk::PhysicalDeviceVulkanMemoryModelFeatures::default();
    let stats_ext = has_extension(&exts, vk::KHR_PIPELINE_EXECUTABLE_PROPERTIES_NAME);
    let mut stats = vk::PhysicalDevicePipelineExecutablePropertiesFeaturesKHR::default();
    if at_least(vk::API_VERSION_1_1) {
        let mut p2 = vk::PhysicalDeviceProperties2::default().push_next(&mut subgroup);
        if driver_known {
            p2 = p2.push_next(&mut driver_props);
        }
        // SAFETY: the chain holds structs that live across the call; the instance and device are
        // 1.1 or later, so vkGetPhysicalDeviceProperties2 exists.
        unsafe { inst.get_physical_device_properties2(raw, &mut p2) };
        let mut f2 = vk::PhysicalDeviceFeatures2::default().push_next(&mut storage16);
        if at_least(vk::API_VERSION_1_2) {
            f2 = f2.push_next(&mut f16).push_next(&mut memory_model);
        }
        if coop_ext {
            f2 = f2.push_next(&mut coop);
        }
        if stats_ext {
            f2 = f2.push_next(&mut stats);
        }
        // SAFETY: as above, for vkGetPhysicalDeviceFeatures2; the extension structs are chained
        // only where the device lists their extensions.
        unsafe { inst.get_physical_device_features2(raw, &mut f2) };
    }
    let cooperative_matrix_f16 = coop_ext
        && coop.cooperative_matrix == vk::TRUE
        && memory_model.vulkan_memory_model == vk::TRUE
        && f16.shader_float16 == vk::TRUE
        && storage16.storage_buffer16_bit_access == vk::TRUE
        && lists_f16_16x16x16(instance, raw, vk::ComponentTypeKHR::FLOAT32);
    let cooperative_matrix_f16_acc =
        cooperative_matrix_f16 && lists_f16_16x16x16(instance, raw, vk::ComponentTypeKHR::FLOAT16);
    // SAFETY: `raw` belongs to this live instance.
    let families = unsafe { inst.get_physical_device_queue_family_properties(raw) };
    let compute = |f: &vk::QueueFamilyProperties| f.queue_flags.contains(vk::QueueFlags::COMPUTE);
    let queue_family = families
        .iter()
        .position(|f| compute(f) && f.timestamp_valid_bits > 0)
        .or_else(|| families.iter().position(compute))
        .map(|i| i as u32);
    let timestamp_valid_bits =
        queue_family.map_or(0, |q| families[q as usize].timestamp_valid_bits);

    let vendor_id = props.vendor_id;
    let device_id = props.device_id;
    let name = props
        .device_name_as_c_str()
        .map(|c| c.to_string_lossy().into_owned())
        .unwrap_or_default();
    let (driver_id, driver_name, driver_info) = if driver_known {
        (
            format!("{:?}", driver_props.driver_id),
            c_chars(&driver_props.driver_name),
            c_chars(&driver_props.driver_info),
        )
    } else {
        ("unknown".into(), "unknown".into(), "unknown".into())
    };
    let driver_version = driver_version_string(vendor_id, props.driver_version);
    let device_type = match props.device_type {
        vk::PhysicalDeviceType::DISCRETE_GPU => DeviceType::DiscreteGpu,
        vk::PhysicalDeviceType::INTEGRATED_GPU => DeviceType::IntegratedGpu,
        vk::PhysicalDeviceType::VIRTUAL_GPU => DeviceType::VirtualGpu,
        vk::PhysicalDeviceType::CPU => DeviceType::Cpu,
        _ => DeviceType::Other,
    };
    let feedback = api_version >= vk::API_VERSION_1_3
        || has_extension(&exts, vk::EXT_PIPELINE_CREATION_FEEDBACK_NAME);
    let spirv_1_4_ext = has_extension(&exts, vk::KHR_SPIRV_1_4_NAME);
    let supported = if at_least(vk::API_VERSION_1_1) {
        super::features::supported(
            &instance.raw,
            raw,
            &exts,
            api_version.min(instance.api_version),
            feedback,
            spirv_1_4_ext,
        )
    } else {
        VulkanFeatures::default()
    };
    let mode = super::pipeline_binary::mode_from_env()?;
    let pipeline_binaries = supported.contains(VulkanFeatures::PIPELINE_BINARY)
        && mode != super::pipeline_binary::Mode::Off;
    let binary_kind = if pipeline_binaries {
        super::pipeline_cache::PIPELINE_BINARY_KIND
    } else {
        super::pipeline_cache::PIPELINE_CACHE_KIND
    };
    // Pipelines compiled with and without robust buffer access differ: a binary of one must never
    // serve the other (a non-robust binary would void the safe launch's guarantee).
    let robust = supported.contains(VulkanFeatures::ROBUST_BUFFER_ACCESS)
        && super::features::robust_access_from_env()?;
    let fingerprint = DeviceFingerprint::new(
        BackendKind::Vulkan,
        vec![
            ("vendor_id".into(), format!("{vendor_id:#06x}")),
            ("device_id".into(), format!("{device_id:#06x}")),
            ("device_name".into(), name.clone()),
            (
                "driver_version".into(),
                format!("{:#010x}", props.driver_version),
            ),
            ("driver_id".into(), driver_id),
            ("driver_name".into(), driver_name.clone()),
            ("driver_info".into(), driver_info.clone()),
            (
                "pipeline_cache_uuid".into(),
                hex(&props.pipeline_cache_uuid),
            ),
            ("api_version".into(), version_string(api_version)),
            ("kpc_vulkan_blob".into(), BLOB_FORMAT_VERSION.to_string()),
            (
                super::features::ROBUST_FIELD.into(),
                u8::from(robust).to_string(),
            ),
            (
                super::pipeline_binary::KIND_FIELD.into(),
                binary_kind.into(),
            ),
        ],
    );
    let unusable = if api_version < vk::API_VERSION_1_1 {
        Some(format!(
            "device supports Vulkan {} only; kpc needs 1.1",
            version_string(api_version)
        ))
    } else if instance.api_version < vk::API_VERSION_1_1 {
        Some("the instance is Vulkan 1.0".into())
    } else if queue_family.is_none() {
        Some("no queue family supports compute".into())
    } else if mode == super::pipeline_binary::Mode::Require && !pipeline_binaries {
        Some(format!(
            "{}=require, and the device lacks VK_KHR_pipeline_binary (with VK_KHR_maintenance5 \
             at Vulkan 1.3)",
            super::pipeline_binary::VAR
        ))
    } else {
        None
    };
    let l = &props.limits;
    let driver = match (driver_name.as_str(), driver_info.as_str()) {
        ("unknown", _) => format!("driver {driver_version}"),
        (n, "") => format!("{n} {driver_version}"),
        (n, i) => format!("{n} {i} (driver {driver_version})"),
    };
    let info = DeviceInfo {
        backend: BackendKind::Vulkan,
        index,
        name,
        device_type,
        driver,
        api_version: version_string(api_version),
        fingerprint,
        limits: DeviceLimits {
            max_workgroup_invocations: l.max_compute_work_group_invocations,
            max_workgroup_size: l.max_compute_work_group_size,
            max_workgroup_count: l.max_compute_work_group_count,
            max_shared_memory_bytes: l.max_compute_shared_memory_size,
            max_push_constant_bytes: l.max_push_constants_size,
            subgroup_size: (subgroup.subgroup_size > 0).then_some(subgroup.subgroup_size),
            subgroup_shuffle: subgroup
                .supported_operations
                .contains(vk::SubgroupFeatureFlags::SHUFFLE)
                && subgroup
                    .supported_stages
                    .contains(vk::ShaderStageFlags::COMPUTE),
            storage_16bit: storage16.storage_buffer16_bit_access == vk::TRUE,
            cooperative_matrix_f16,
            cooperative_matrix_f16_acc,
            cooperative_matrix2_workgroup: if cooperative_matrix_f16 && supported.all_coop_matrix2()
            {
                super::coopmat2::max_workgroup(inst, raw)
            } else {
                0
            },
            float16_arithmetic: f16.shader_float16 == vk::TRUE,
            timestamps: timestamp_valid_bits > 0 && l.timestamp_period > 0.0,
            robust_buffer_access: robust,
        },
        unusable,
    };
    Ok(PhysicalDevice {
        raw,
        info,
        api_version,
        vendor_id,
        device_id,
        pipeline_cache_uuid: props.pipeline_cache_uuid,
        limits: props.limits,
        queue_family,
        timestamp_valid_bits,
        feedback,
        spirv_1_4_ext,
        executable_stats: stats_ext && stats.pipeline_executable_info == vk::TRUE,
        subgroup_ops: if subgroup
            .supported_stages
            .contains(vk::ShaderStageFlags::COMPUTE)
        {
            subgroup.supported_operations
        } else {
            vk::SubgroupFeatureFlags::empty()
        },
        supported,
        pipeline_binaries,
    })
}

/// Whether the matrix shapes the device's cooperative-matrix extension lists include the one
/// `is_f16_16x16x16` accepts with accumulators of type `acc`; false where the query fails (the
/// kernels that need it are then never chosen).
fn lists_f16_16x16x16(
    instance: &VkInstance,
    raw: vk::PhysicalDevice,
    acc: vk::ComponentTypeKHR,
) -> bool {
    let ext = ash::khr::cooperative_matrix::Instance::new(&instance.entry, &instance.raw);
    // SAFETY: called only where the device lists VK_KHR_cooperative_matrix; `raw` belongs to this
    // live instance.
    unsafe { ext.get_physical_device_cooperative_matrix_properties(raw) }
        .map(|shapes| shapes.iter().any(|s| is_f16_16x16x16(s, acc)))
        .unwrap_or(false)
}

/// The one product the cooperative-matrix kernels issue: 16x16 f16 times 16x16 f16 plus a 16x16
/// accumulator of type `acc` (f32, or f16 for the fp16-accumulate GEMM), at subgroup scope, without
/// saturation.
fn is_f16_16x16x16(p: &vk::CooperativeMatrixPropertiesKHR, acc: vk::ComponentTypeKHR) -> bool {
    use vk::ComponentTypeKHR as T;
    (p.m_size, p.n_size, p.k_size) == (16, 16, 16)
        && p.a_type == T::FLOAT16
        && p.b_type == T::FLOAT16
        && p.c_type == acc
        && p.result_type == acc
        && p.scope == vk::ScopeKHR::SUBGROUP
        && p.saturating_accumulation == vk::FALSE
}

/// Gives `pd` the fingerprint kpc's own instance computes for the same device. Through an instance
/// below Vulkan 1.2, a device without VK_KHR_driver_properties cannot name its driver, so the
/// fingerprint would differ from an owned context's and silently split the cache by the embedder's
/// instance version; kpc's own instance (1.3 where the loader has it) reads the driver identity
/// instead. The device is matched by vendor, device id and pipeline-cache UUID, which the driver
/// sets per build.
///
/// Errors: [`Error::InvalidArgument`] when kpc's own instance finds no such device (the embedder
/// then has to create its instance with Vulkan 1.2 or later).
pub(crate) fn normalize_fingerprint(pd: &mut PhysicalDevice, api: u32) -> Result<()> {
    let own = instance()?;
    if own.api_version < vk::API_VERSION_1_2 {
        // kpc's own instance sees what the embedder's sees: the fingerprints agree already.
        return Ok(());
    }
    let all = physical_devices(&own)?;
    match all.iter().find(|p| {
        p.vendor_id == pd.vendor_id
            && p.device_id == pd.device_id
            && p.pipeline_cache_uuid == pd.pipeline_cache_uuid
    }) {
        Some(p) => {
            pd.info.fingerprint = p.info.fingerprint.clone();
            Ok(())
        }
        None => Err(Error::InvalidArgument(format!(
            "device {:?} cannot be fingerprinted through an instance of Vulkan {} (its driver \
             identity needs 1.2 or VK_KHR_driver_properties), and kpc's own instance does not \
             list it; create the instance with Vulkan 1.2 or later",
            pd.info.name,
            version_string(api)
        ))),
    }
}

/// The Vulkan devices of this machine, as discovery reports them.
///
/// Errors: [`Error::Unavailable`] ("Vulkan unavailable: …") when there is no loader, no driver or no
/// device.
pub fn devices() -> Result<Vec<DeviceInfo>> {
    let inst = instance()?;
    Ok(physical_devices(&inst)?
        .iter()
        .map(|p| p.info.clone())
        .collect())
}
