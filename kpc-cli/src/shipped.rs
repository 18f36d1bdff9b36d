//! The kernels the `kpc` binary knows by name: kpc's own (`saxpy`, `copy`, `read`) and the
//! attention workload's (`kpc_attention::kernels`), one list for the commands that build, time or
//! explain shipped kernels.

use kpc::kernels::{ShippedOpenCl, ShippedSpirv};
use kpc::{DeviceImage, Error, Result};

/// Every shipped SPIR-V kernel: kpc's, then the attention workload's.
pub(crate) fn spirv() -> impl Iterator<Item = &'static ShippedSpirv> {
    kpc::kernels::SPIRV
        .iter()
        .chain(kpc_attention::kernels::SPIRV)
}

/// Every shipped OpenCL C kernel: kpc's, then the attention workload's.
pub(crate) fn opencl() -> impl Iterator<Item = &'static ShippedOpenCl> {
    kpc::kernels::OPENCL
        .iter()
        .chain(kpc_attention::kernels::OPENCL)
}

/// The shipped SPIR-V kernel `name`, or [`Error::InvalidArgument`] listing every name.
pub(crate) fn spirv_kernel(name: &str) -> Result<&'static ShippedSpirv> {
    spirv().find(|k| k.name == name).ok_or_else(|| {
        Error::InvalidArgument(format!(
            "no shipped SPIR-V kernel {name:?}; there are: {}",
            spirv().map(|k| k.name).collect::<Vec<_>>().join(", ")
        ))
    })
}

/// The shipped SPIR-V image `name`, validated.
pub(crate) fn spirv_image(name: &str) -> Result<DeviceImage> {
    spirv_kernel(name)?.image()
}

/// The shipped kernel `name` as a GLSL image of its source.
pub(crate) fn glsl_image(name: &str) -> Result<DeviceImage> {
    spirv_kernel(name)?.glsl_image()
}

/// The shipped OpenCL C image `name`.
pub(crate) fn opencl_image(name: &str) -> Result<DeviceImage> {
    let k = opencl().find(|k| k.name == name).ok_or_else(|| {
        Error::InvalidArgument(format!(
            "no shipped OpenCL kernel {name:?}; there are: {}",
            opencl().map(|k| k.name).collect::<Vec<_>>().join(", ")
        ))
    })?;
    Ok(k.image())
}
