//! VK_KHR_pipeline_binary: a pipeline's compiled code taken out of the driver after a build and
//! handed back on a warm load, so the pipeline is created straight from it (no lookup in a
//! VkPipelineCache, no compile). ash 0.38 (Vulkan 1.3.281) predates the extension, so its
//! structures and commands are declared here from the Vulkan registry (extension 484). What is
//! persisted is in `payload.rs`; which devices use it, and how their fingerprint says so, in
//! `choice.rs`.

mod choice;
mod payload;

pub(crate) use choice::{KIND_FIELD, Mode, VAR, fingerprint_for, mode_from_env};
pub use payload::{BinaryData, decode, encode};

use std::ffi::c_void;

use ash::vk;

use crate::error::{Error, Result};

/// The extension's name.
pub(crate) const NAME: &std::ffi::CStr = c"VK_KHR_pipeline_binary";

/// VK_MAX_PIPELINE_BINARY_KEY_SIZE_KHR.
pub(crate) const MAX_KEY_SIZE: usize = 32;

const ST_FEATURES: i32 = 1_000_483_000;
const ST_CREATE_INFO: i32 = 1_000_483_001;
const ST_INFO: i32 = 1_000_483_002;
const ST_KEY: i32 = 1_000_483_003;
const ST_RELEASE_CAPTURED: i32 = 1_000_483_005;
const ST_DATA_INFO: i32 = 1_000_483_006;
const ST_HANDLES_INFO: i32 = 1_000_483_009;

/// VK_PIPELINE_CREATE_2_CAPTURE_DATA_BIT_KHR.
pub(crate) const CAPTURE_DATA: vk::PipelineCreateFlags2KHR =
    vk::PipelineCreateFlags2KHR::from_raw(0x8000_0000);

/// VkPipelineBinaryKHR (a non-dispatchable handle).
type BinaryHandle = u64;

/// VkPhysicalDevicePipelineBinaryFeaturesKHR.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub(crate) struct FeaturesKhr {
    s_type: vk::StructureType,
    p_next: *mut c_void,
    pub(crate) pipeline_binaries: vk::Bool32,
}

impl Default for FeaturesKhr {
    fn default() -> Self {
        FeaturesKhr {
            s_type: vk::StructureType::from_raw(ST_FEATURES),
            p_next: std::ptr::null_mut(),
            pipeline_binaries: vk::FALSE,
        }
    }
}

// SAFETY: the struct starts with sType/pNext like every Vulkan structure, and the registry lists it
// as extending both VkPhysicalDeviceFeatures2 and VkDeviceCreateInfo.
unsafe impl vk::ExtendsPhysicalDeviceFeatures2 for FeaturesKhr {}
// SAFETY: as above.
unsafe impl vk::ExtendsDeviceCreateInfo for FeaturesKhr {}

/// VkPipelineBinaryInfoKHR: the binaries a pipeline is created from.
#[repr(C)]
pub(crate) struct InfoKhr {
    s_type: vk::StructureType,
    p_next: *const c_void,
    binary_count: u32,
    p_pipeline_binaries: *const BinaryHandle,
}

// SAFETY: sType/pNext header; the registry lists it as extending VkComputePipelineCreateInfo.
unsafe impl vk::ExtendsComputePipelineCreateInfo for InfoKhr {}

#[repr(C)]
#[derive(Clone, Copy)]
struct KeyKhr {
    s_type: vk::StructureType,
    p_next: *mut c_void,
    key_size: u32,
    key: [u8; MAX_KEY_SIZE],
}

impl Default for KeyKhr {
    fn default() -> Self {
        KeyKhr {
            s_type: vk::StructureType::from_raw(ST_KEY),
            p_next: std::ptr::null_mut(),
            key_size: 0,
            key: [0; MAX_KEY_SIZE],
        }
    }
}

#[repr(C)]
struct DataKhr {
    data_size: usize,
    p_data: *mut c_void,
}

#[repr(C)]
struct KeysAndDataKhr {
    binary_count: u32,
    p_pipeline_binary_keys: *const KeyKhr,
    p_pipeline_binary_data: *const DataKhr,
}

#[repr(C)]
struct CreateInfoKhr {
    s_type: vk::StructureType,
    p_next: *const c_void,
    p_keys_and_data_info: *const KeysAndDataKhr,
    pipeline: vk::Pipeline,
    p_pipeline_create_info: *const c_void,
}

#[repr(C)]
struct HandlesInfoKhr {
    s_type: vk::StructureType,
    p_next: *const c_void,
    pipeline_binary_count: u32,
    p_pipeline_binaries: *mut BinaryHandle,
}

#[repr(C)]
struct DataInfoKhr {
    s_type: vk::StructureType,
    p_next: *mut c_void,
    pipeline_binary: BinaryHandle,
}

#[repr(C)]
struct ReleaseCapturedKhr {
    s_type: vk::StructureType,
    p_next: *mut c_void,
    pipeline: vk::Pipeline,
}

type CreateBinaries = unsafe extern "system" fn(
    vk::Device,
    *const CreateInfoKhr,
    *const vk::AllocationCallbacks<'_>,
    *mut HandlesInfoKhr,
) -> vk::Result;
type DestroyBinary =
    unsafe extern "system" fn(vk::Device, BinaryHandle, *const vk::AllocationCallbacks<'_>);
type GetPipelineKey =
    unsafe extern "system" fn(vk::Device, *const c_void, *mut KeyKhr) -> vk::Result;
type GetBinaryData = unsafe extern "system" fn(
    vk::Device,
    *const DataInfoKhr,
    *mut KeyKhr,
    *mut usize,
    *mut c_void,
) -> vk::Result;
type ReleaseCaptured = unsafe extern "system" fn(
    vk::Device,
    *const ReleaseCapturedKhr,
    *const vk::AllocationCallbacks<'_>,
) -> vk::Result;

/// The extension's device commands, loaded once per device.
pub(crate) struct PipelineBinaryFns {
    device: vk::Device,
    create: CreateBinaries,
    destroy: DestroyBinary,
    get_key: GetPipelineKey,
    get_data: GetBinaryData,
    release: ReleaseCaptured,
}

fn failed(call: &'static str, r: vk::Result) -> Error {
    super::vk_error::vk_err(call, r)
}

impl PipelineBinaryFns {
    /// Loads the commands of `device`, on which the extension is enabled; `None` where the driver
    /// does not return one of them.
    pub(crate) fn load(instance: &ash::Instance, device: &ash::Device) -> Option<Self> {
        let get = |name: &std::ffi::CStr| {
            // SAFETY: `device` is a live device of `instance`; a null result is handled below.
            unsafe { instance.get_device_proc_addr(device.handle(), name.as_ptr()) }
        };
        let create = get(c"vkCreatePipelineBinariesKHR")?;
        let destroy = get(c"vkDestroyPipelineBinaryKHR")?;
        let get_key = get(c"vkGetPipelineKeyKHR")?;
        let get_data = get(c"vkGetPipelineBinaryDataKHR")?;
        let release = get(c"vkReleaseCapturedPipelineDataKHR")?;
        // SAFETY: each pointer is the driver's entry point of the command named, whose C
        // signature the type it becomes spells (Vulkan registry, VK_KHR_pipeline_binary).
        unsafe {
            Some(PipelineBinaryFns {
                device: device.handle(),
                create: std::mem::transmute::<unsafe extern "system" fn(), CreateBinaries>(create),
                destroy: std::mem::transmute::<unsafe extern "system" fn(), DestroyBinary>(destroy),
                get_key: std::mem::transmute::<unsafe extern "system" fn(), GetPipelineKey>(
                    get_key,
                ),
                get_data: std::mem::transmute::<unsafe extern "system" fn(), GetBinaryData>(
                    get_data,
                ),
                release: std::mem::transmute::<unsafe extern "system" fn(), ReleaseCaptured>(
                    release,
                ),
            })
        }
    }

    /// The driver's global pipeline key: binaries stored under another key are not usable here.
    pub(crate) fn global_key(&self) -> Result<Vec<u8>> {
        let mut key = KeyKhr::default();
        // SAFETY: a null create info asks for the global key; `key` is a valid output structure.
        let r = unsafe { (self.get_key)(self.device, std::ptr::null(), &mut key) };
        if r != vk::Result::SUCCESS {
            return Err(failed("vkGetPipelineKeyKHR", r));
        }
        let n = (key.key_size as usize).min(MAX_KEY_SIZE);
        Ok(key.key[..n].to_vec())
    }

    /// Destroys binaries made by `create`.
    fn destroy_all(&self, handles: &[BinaryHandle]) {
        for &h in handles {
            // SAFETY: `h` was created on this device and is destroyed once; no pipeline creation
            // that uses it is in flight (callers destroy after vkCreateComputePipelines returned).
            unsafe { (self.destroy)(self.device, h, std::ptr::null()) };
        }
    }

    /// Runs vkCreatePipelineBinariesKHR's two calls (count, then handles) for `info`.
    fn create(&self, info: &CreateInfoKhr) -> Result<Vec<BinaryHandle>> {
        let mut handles = HandlesInfoKhr {
            s_type: vk::StructureType::from_raw(ST_HANDLES_INFO),
            p_next: std::ptr::null(),
            pipeline_binary_count: 0,
            p_pipeline_binaries: std::ptr::null_mut(),
        };
        // SAFETY: `info` and what it points to live across the call; a null handle array asks
        // for the count only.
        let r = unsafe { (self.create)(self.device, info, std::ptr::null(), &mut handles) };
        // VK_PIPELINE_BINARY_MISSING_KHR, a success code, means nothing came out: a failure here.
        if r != vk::Result::SUCCESS {
            return Err(failed("vkCreatePipelineBinariesKHR", r));
        }
        let mut out = vec![0 as BinaryHandle; handles.pipeline_binary_count as usize];
        handles.p_pipeline_binaries = out.as_mut_ptr();
        // SAFETY: as above; `out` has room for the count the first call returned.
        let r = unsafe { (self.create)(self.device, info, std::ptr::null(), &mut handles) };
        out.truncate(handles.pipeline_binary_count as usize);
        if r != vk::Result::SUCCESS {
            // Handles that were written are valid and must go (null ones are ignored).
            self.destroy_all(&out);
            return Err(failed("vkCreatePipelineBinariesKHR", r));
        }
        Ok(out)
    }

    /// Takes the binaries of `pipeline`, created with [`CAPTURE_DATA`], and releases the data the
    /// driver captured for it.
    pub(crate) fn capture(&self, pipeline: vk::Pipeline) -> Result<Vec<BinaryData>> {
        let info = CreateInfoKhr {
            s_type: vk::StructureType::from_raw(ST_CREATE_INFO),
            p_next: std::ptr::null(),
            p_keys_and_data_info: std::ptr::null(),
            pipeline,
            p_pipeline_create_info: std::ptr::null(),
        };
        let handles = self.create(&info);
        let release = ReleaseCapturedKhr {
            s_type: vk::StructureType::from_raw(ST_RELEASE_CAPTURED),
            p_next: std::ptr::null_mut(),
            pipeline,
        };
        // SAFETY: `pipeline` was created with CAPTURE_DATA on this device and its data is
        // released once, here, whether or not binaries could be made from it.
        let released = unsafe { (self.release)(self.device, &release, std::ptr::null()) };
        let handles = handles?;
        let result = handles.iter().map(|&h| self.data_of(h)).collect();
        self.destroy_all(&handles);
        if released != vk::Result::SUCCESS {
            return Err(failed("vkReleaseCapturedPipelineDataKHR", released));
        }
        result
    }

    fn data_of(&self, binary: BinaryHandle) -> Result<BinaryData> {
        let info = DataInfoKhr {
            s_type: vk::StructureType::from_raw(ST_DATA_INFO),
            p_next: std::ptr::null_mut(),
            pipeline_binary: binary,
        };
        let mut key = KeyKhr::default();
        let mut size = 0usize;
        // SAFETY: `binary` is alive; a null data pointer asks for the size only.
        let r = unsafe {
            (self.get_data)(
                self.device,
                &info,
                &mut key,
                &mut size,
                std::ptr::null_mut(),
            )
        };
        if r != vk::Result::SUCCESS {
            return Err(failed("vkGetPipelineBinaryDataKHR", r));
        }
        let mut data = vec![0u8; size];
        // SAFETY: `data` has `size` bytes, the size the driver asked for.
        let r = unsafe {
            (self.get_data)(
                self.device,
                &info,
                &mut key,
                &mut size,
                data.as_mut_ptr().cast(),
            )
        };
        if r != vk::Result::SUCCESS {
            return Err(failed("vkGetPipelineBinaryDataKHR", r));
        }
        data.truncate(size);
        let n = (key.key_size as usize).min(MAX_KEY_SIZE);
        Ok(BinaryData {
            key: key.key[..n].to_vec(),
            data,
        })
    }

    /// Hands `binaries` (as [`decode`] checked them) to the driver: the handles a pipeline is then
    /// created from, destroyed when the returned guard goes.
    ///
    /// Errors: the driver's refusal (the data does not fit this driver).
    pub(crate) fn upload<'a>(&'a self, binaries: &[BinaryData]) -> Result<Uploaded<'a>> {
        let keys: Vec<KeyKhr> = binaries
            .iter()
            .map(|b| {
                let mut k = KeyKhr {
                    key_size: b.key.len() as u32,
                    ..KeyKhr::default()
                };
                k.key[..b.key.len()].copy_from_slice(&b.key);
                k
            })
            .collect();
        let data: Vec<DataKhr> = binaries
            .iter()
            .map(|b| DataKhr {
                data_size: b.data.len(),
                // The driver only reads it (the member is non-const in the C declaration).
                p_data: b.data.as_ptr() as *mut c_void,
            })
            .collect();
        let kd = KeysAndDataKhr {
            binary_count: binaries.len() as u32,
            p_pipeline_binary_keys: keys.as_ptr(),
            p_pipeline_binary_data: data.as_ptr(),
        };
        let info = CreateInfoKhr {
            s_type: vk::StructureType::from_raw(ST_CREATE_INFO),
            p_next: std::ptr::null(),
            p_keys_and_data_info: &kd,
            pipeline: vk::Pipeline::null(),
            p_pipeline_create_info: std::ptr::null(),
        };
        Ok(Uploaded {
            fns: self,
            handles: self.create(&info)?,
        })
    }
}

/// Binaries handed to the driver, destroyed on drop (a pipeline made from them does not need them).
pub(crate) struct Uploaded<'a> {
    fns: &'a PipelineBinaryFns,
    handles: Vec<BinaryHandle>,
}

impl Uploaded<'_> {
    /// The structure that makes vkCreateComputePipelines use these binaries; it points into `self`.
    pub(crate) fn info(&self) -> InfoKhr {
        InfoKhr {
            s_type: vk::StructureType::from_raw(ST_INFO),
            p_next: std::ptr::null(),
            binary_count: self.handles.len() as u32,
            p_pipeline_binaries: self.handles.as_ptr(),
        }
    }
}

impl Drop for Uploaded<'_> {
    fn drop(&mut self) {
        self.fns.destroy_all(&self.handles);
    }
}

/// The extension on one device: its commands and the driver's global pipeline key.
pub(crate) struct BinaryPath {
    pub(crate) fns: PipelineBinaryFns,
    /// `vkGetPipelineKeyKHR` without a create info, read when the device was opened.
    pub(crate) global_key: Vec<u8>,
}

impl BinaryPath {
    /// The path on `device`, where the extension is enabled; `None`, with a warning, where its
    /// commands or the global key cannot be had (the device then persists pipeline-cache data).
    pub(crate) fn open(instance: &ash::Instance, device: &ash::Device, name: &str) -> Option<Self> {
        let Some(fns) = PipelineBinaryFns::load(instance, device) else {
            tracing::warn!(
                target: "kpc::vulkan",
                device = name,
                "VK_KHR_pipeline_binary is enabled but the driver returns no entry point for one \
                 of its commands; persisting pipeline-cache data instead"
            );
            return None;
        };
        match fns.global_key() {
            Ok(global_key) if !global_key.is_empty() => Some(BinaryPath { fns, global_key }),
            Ok(_) | Err(_) => {
                tracing::warn!(
                    target: "kpc::vulkan",
                    device = name,
                    "vkGetPipelineKeyKHR gave no global key; persisting pipeline-cache data instead"
                );
                None
            }
        }
    }
}
