//! OpenCL platforms and devices as discovery reports them: names, types, limits and fingerprints.

use opencl3::device::{CL_DEVICE_TYPE_ALL, CL_DEVICE_TYPE_CPU, CL_DEVICE_TYPE_GPU, Device};
use opencl3::error_codes::{CL_DEVICE_NOT_FOUND, ClError};
use opencl3::platform::{Platform, get_platforms};
use opencl3::types::cl_device_id;
use std::sync::OnceLock;

use crate::backend::{DeviceFingerprint, DeviceInfo, DeviceLimits, DeviceType};
use crate::config::BackendKind;
use crate::error::{Error, Result};

use super::cl_err;

/// `CL_QUEUE_PROFILING_ENABLE`: the queue property bit profiling events need.
pub(crate) const QUEUE_PROFILING: u64 = 1 << 1;
/// cl3's code for "libOpenCL could not be opened" (dynamic loading).
const LOADER_MISSING: i32 = -2000;
/// cl3's code for "the loader lacks this entry point".
const FUNCTION_MISSING: i32 = -2001;
/// The ICD loader's code for "no platform (ICD) installed".
const NO_PLATFORM: i32 = -1001;

/// One device with its handles, as `open` needs it.
#[derive(Clone)]
pub(crate) struct Found {
    pub(crate) device: Device,
    pub(crate) info: DeviceInfo,
    /// CL_DEVICE_MAX_MEM_ALLOC_SIZE: the largest buffer one allocation may have.
    pub(crate) max_alloc: u64,
    /// CL_DEVICE_MAX_PARAMETER_SIZE: bytes of all kernel arguments together.
    pub(crate) max_parameter_bytes: u64,
    /// The largest global size per dimension: the device's size_t (CL_DEVICE_ADDRESS_BITS).
    pub(crate) max_global: u64,
}

pub(crate) fn unavailable(reason: impl Into<String>) -> Error {
    Error::Unavailable {
        backend: BackendKind::OpenCl,
        reason: reason.into(),
    }
}

/// Driver strings end in NUL on some drivers and in blanks on others.
fn clean(s: String) -> String {
    s.trim_matches(|c: char| c == '\0' || c.is_whitespace())
        .to_string()
}

/// Every OpenCL device of every platform, in platform order then device order: index N is what
/// `KPC_DEVICE=opencl:N` names.
///
/// Errors: [`Error::Unavailable`] when libOpenCL.so.1 (the ICD loader) cannot be opened, no platform
/// (ICD) is installed, or the platforms report no device at all.
pub fn devices() -> Result<Vec<DeviceInfo>> {
    Ok(enumerate()?.into_iter().map(|f| f.info).collect())
}

/// Discovery runs once per process and is remembered: PoCL 3.1 initializes its devices lazily and
/// crashes (a NULL device name in clGetDeviceInfo) when two threads enumerate at once, and device
/// handles stay valid for the life of the process anyway.
pub(crate) fn enumerate() -> Result<Vec<Found>> {
    static FOUND: OnceLock<Result<Vec<Found>>> = OnceLock::new();
    FOUND.get_or_init(enumerate_now).clone()
}

fn enumerate_now() -> Result<Vec<Found>> {
    // Before the loader runs: it rewrites OCL_ICD_FILENAMES in place (see backend::process).
    crate::backend::process::snapshot_loader_environment();
    let platforms = match get_platforms() {
        Ok(p) => p,
        Err(ClError(LOADER_MISSING)) => {
            return Err(unavailable(
                "the OpenCL ICD loader (libOpenCL.so.1) could not be opened; install one \
                 (ocl-icd-libopencl1) and a driver (pocl-opencl-icd, a GPU vendor's), or set \
                 OPENCL_DYLIB_PATH to the loader's path",
            ));
        }
        Err(ClError(NO_PLATFORM)) => {
            return Err(unavailable(
                "the OpenCL loader found no platform: no ICD is installed under /etc/OpenCL/vendors \
                 (install pocl-opencl-icd or a GPU vendor's driver)",
            ));
        }
        Err(ClError(FUNCTION_MISSING)) => {
            return Err(unavailable("the OpenCL loader lacks clGetPlatformIDs"));
        }
        Err(e) => return Err(cl_err("clGetPlatformIDs", e)),
    };
    if platforms.is_empty() {
        return Err(unavailable(
            "the OpenCL loader found no platform (no ICD installed)",
        ));
    }
    let mut found = Vec::new();
    for p in &platforms {
        let ids = match p.get_devices(CL_DEVICE_TYPE_ALL) {
            Ok(ids) => ids,
            Err(ClError(CL_DEVICE_NOT_FOUND)) => continue,
            Err(e) => return Err(cl_err("clGetDeviceIDs", e)),
        };
        for id in ids {
            let index = found.len();
            found.push(describe(p, id, index)?);
        }
    }
    if found.is_empty() {
        return Err(unavailable("no OpenCL platform reports a device"));
    }
    Ok(found)
}

/// "OpenCL 1.2 ..." as (1, 2); `None` when the string does not say.
pub(crate) fn parse_version(s: &str) -> Option<(u32, u32)> {
    let rest = s.strip_prefix("OpenCL ")?;
    let v = rest.split_whitespace().next()?;
    let (maj, min) = v.split_once('.')?;
    Some((maj.parse().ok()?, min.parse().ok()?))
}

/// Describes device `id` of platform `p` as discovery reports it (index `index`): also what interop
/// reuses, so that an embedder's device gets the same fingerprint as an owned one.
pub(crate) fn describe(p: &Platform, id: cl_device_id, index: usize) -> Result<Found> {
    let d = Device::new(id);
    let q = |call: &'static str| move |e: ClError| cl_err(call, e);
    let platform_name = clean(p.name().map_err(q("clGetPlatformInfo"))?);
    let platform_version = clean(p.version().map_err(q("clGetPlatformInfo"))?);
    let name = clean(d.name().map_err(q("clGetDeviceInfo"))?);
    let version = clean(d.version().map_err(q("clGetDeviceInfo"))?);
    let driver_version = clean(d.driver_version().map_err(q("clGetDeviceInfo"))?);
    let vendor_id = d.vendor_id().map_err(q("clGetDeviceInfo"))?;
    let dev_type = d.dev_type().map_err(q("clGetDeviceInfo"))?;
    let extensions = clean(d.extensions().unwrap_or_default());
    let device_type = if dev_type & CL_DEVICE_TYPE_GPU != 0 {
        // OpenCL does not tell discrete from integrated without vendor extensions; unified host
        // memory is the portable hint.
        match d.host_unified_memory() {
            Ok(true) => DeviceType::IntegratedGpu,
            _ => DeviceType::DiscreteGpu,
        }
    } else if dev_type & CL_DEVICE_TYPE_CPU != 0 {
        DeviceType::Cpu
    } else {
        // Accelerators and custom devices.
        DeviceType::Other
    };
    let sizes = d.max_work_item_sizes().unwrap_or_default();
    let dim = |k: usize| {
        sizes
            .get(k)
            .map_or(1, |&s| u32::try_from(s).unwrap_or(u32::MAX))
    };
    let max_parameter_bytes = d.max_parameter_size().unwrap_or(1024) as u64;
    let limits = DeviceLimits {
        max_workgroup_invocations: u32::try_from(d.max_work_group_size().unwrap_or(1))
            .unwrap_or(u32::MAX),
        max_workgroup_size: [dim(0), dim(1), dim(2)],
        // OpenCL bounds only the global size (by size_t); kpc's group counts are u32.
        max_workgroup_count: [u32::MAX; 3],
        max_shared_memory_bytes: u32::try_from(d.local_mem_size().unwrap_or(0)).unwrap_or(u32::MAX),
        max_push_constant_bytes: u32::try_from(max_parameter_bytes).unwrap_or(u32::MAX),
        subgroup_size: None,
        subgroup_shuffle: false,
        cooperative_matrix_f16: false,
        cooperative_matrix_f16_acc: false,
        cooperative_matrix2_workgroup: 0,
        // vload_half / vstore_half are core OpenCL C: fp16 K/V storage works everywhere.
        storage_16bit: true,
        float16_arithmetic: extensions.split_whitespace().any(|e| e == "cl_khr_fp16"),
        timestamps: d.queue_on_host_properties().unwrap_or(0) & QUEUE_PROFILING != 0,
        // OpenCL has no robust-access guarantee a host can switch on.
        robust_buffer_access: false,
    };
    let unusable = match parse_version(&version) {
        None => Some(format!("cannot read the OpenCL version from {version:?}")),
        Some(v) if v < (1, 2) => Some(format!(
            "{version}: kpc needs OpenCL 1.2 (kernel argument reflection)"
        )),
        Some(_) if !d.available().unwrap_or(false) => {
            Some("the driver reports it unavailable".into())
        }
        Some(_) if !d.compiler_available().unwrap_or(false) => {
            Some("the driver has no OpenCL C compiler for it".into())
        }
        Some(_) => None,
    };
    let fingerprint = DeviceFingerprint::new(
        BackendKind::OpenCl,
        vec![
            ("platform_name".into(), platform_name.clone()),
            ("platform_version".into(), platform_version.clone()),
            ("device_name".into(), name.clone()),
            ("device_version".into(), version.clone()),
            ("driver_version".into(), driver_version.clone()),
            ("vendor_id".into(), format!("{vendor_id:#06x}")),
        ],
    );
    Ok(Found {
        device: d,
        max_alloc: d.max_mem_alloc_size().unwrap_or(u64::MAX),
        max_parameter_bytes,
        max_global: match d.address_bits() {
            Ok(bits) if bits < 64 => (1u64 << bits) - 1,
            _ => u64::MAX,
        },
        info: DeviceInfo {
            backend: BackendKind::OpenCl,
            index,
            name,
            device_type,
            driver: format!("{platform_name} {driver_version}"),
            api_version: version,
            fingerprint,
            limits,
            unusable,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::parse_version;

    #[test]
    fn versions() {
        assert_eq!(parse_version("OpenCL 3.0 PoCL 3.1+debian"), Some((3, 0)));
        assert_eq!(parse_version("OpenCL 1.2 CUDA"), Some((1, 2)));
        assert_eq!(parse_version("OpenCL1.2"), None);
        assert_eq!(parse_version("garbage"), None);
    }
}
