//! What a module must pass against the opened device before vkCreateComputePipelines sees it.

use ash::vk;

use crate::backend::spirv::{DescriptorKind, SpirvModule, required_vulkan};
use crate::cache::SpecConstants;
use crate::config::BackendKind;
use crate::error::{Error, Result};

use super::device::Device;

/// Checks everything about `module` with `spec` that the device must accept, so that nothing
/// undefined reaches vkCreateComputePipelines: SPIR-V version, capabilities and extensions against
/// what the device enabled, workgroup size, descriptors and push constants against its limits.
pub(crate) fn check_against_device(
    dev: &Device,
    image: &str,
    module: &SpirvModule,
    spec: &SpecConstants,
) -> Result<()> {
    let (maj, min) = required_vulkan(module.version);
    let needs = vk::make_api_version(0, maj, min, 0);
    let spirv14_ok = module.version == (1, 4) && dev.spirv_1_4_ext;
    if dev.api_version < needs && !spirv14_ok {
        return Err(build_error(
            image,
            vk::Result::ERROR_INITIALIZATION_FAILED.as_raw(),
            format!(
                "SPIR-V {}.{} needs Vulkan {maj}.{min}; the device supports {}",
                module.version.0,
                module.version.1,
                super::instance::version_string(dev.api_version)
            ),
        ));
    }
    dev.caps.check(image, &module.needs)?;
    let l = &dev.limits;
    for e in &module.entry_points {
        let ls = e.local_size_with(spec);
        let invocations = ls.iter().map(|&v| u64::from(v)).product::<u64>();
        if ls.contains(&0)
            || (0..3).any(|k| ls[k] > l.max_compute_work_group_size[k])
            || invocations > u64::from(l.max_compute_work_group_invocations)
        {
            return Err(build_error(
                image,
                vk::Result::ERROR_INITIALIZATION_FAILED.as_raw(),
                format!(
                    "entry point {:?}: workgroup size {}x{}x{} is outside the device's limits \
                     (at most {:?} per dimension and {} invocations)",
                    e.name,
                    ls[0],
                    ls[1],
                    ls[2],
                    l.max_compute_work_group_size,
                    l.max_compute_work_group_invocations
                ),
            ));
        }
        if e.push_constant_bytes > l.max_push_constants_size {
            return Err(build_error(
                image,
                vk::Result::ERROR_INITIALIZATION_FAILED.as_raw(),
                format!(
                    "entry point {:?}: {} bytes of push constants, the device allows {}",
                    e.name, e.push_constant_bytes, l.max_push_constants_size
                ),
            ));
        }
        for b in &e.bindings {
            if b.set != 0 {
                return Err(build_error(
                    image,
                    -1,
                    format!(
                        "entry point {:?}: binding {} is in descriptor set {}; kpc binds set 0 only",
                        e.name, b.binding, b.set
                    ),
                ));
            }
            if let DescriptorKind::Unsupported(what) = &b.kind {
                return Err(build_error(
                    image,
                    -1,
                    format!(
                        "entry point {:?}: binding {} is a {what}; kpc binds storage and uniform buffers only",
                        e.name, b.binding
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// A build error of `image` with the driver's (or kpc's, -1) `code`.
pub(crate) fn build_error(image: &str, code: i32, message: String) -> Error {
    Error::Build {
        backend: BackendKind::Vulkan,
        image: image.to_string(),
        code,
        message,
        log: String::new(),
    }
}
