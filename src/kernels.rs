//! The kernels kpc ships, embedded at build time so that building the crate needs no shader compiler.
//!
//! GLSL sources and their SPIR-V (compiled by scripts/build-kernels.sh, committed) live in kernels/.
//! Each image's entry point is named after its file. What a kernel takes (buffers, push constants,
//! workgroup size, specialization constants) is reflected from the SPIR-V at run time, never listed
//! here.

#[cfg(not(loom))]
use crate::backend::DeviceImage;
#[cfg(not(loom))]
use crate::error::{Error, Result};

/// A shipped SPIR-V kernel image.
#[derive(Debug, Clone, Copy)]
pub struct ShippedSpirv {
    /// Image name, which is also its entry point's name.
    pub name: &'static str,
    /// Path of its GLSL source, relative to the repository root.
    pub source: &'static str,
    /// The committed SPIR-V.
    pub spirv: &'static [u8],
}

/// Every shipped SPIR-V kernel.
pub const SPIRV: &[ShippedSpirv] = &[
    ShippedSpirv {
        name: "saxpy",
        source: "kernels/saxpy.comp",
        spirv: include_bytes!("../kernels/saxpy.spv"),
    },
    ShippedSpirv {
        name: "copy",
        source: "kernels/copy.comp",
        spirv: include_bytes!("../kernels/copy.spv"),
    },
];

/// The shipped SPIR-V image `name`, validated.
///
/// Errors: [`Error::InvalidArgument`] for a name kpc does not ship; [`Error::InvalidSpirv`] if the
/// committed module is invalid (a broken build of kpc).
#[cfg(not(loom))]
pub fn spirv_image(name: &str) -> Result<DeviceImage> {
    let k = SPIRV.iter().find(|k| k.name == name).ok_or_else(|| {
        Error::InvalidArgument(format!(
            "no shipped SPIR-V kernel {name:?}; there are: {}",
            SPIRV.iter().map(|k| k.name).collect::<Vec<_>>().join(", ")
        ))
    })?;
    DeviceImage::spirv(k.name, k.spirv)
}
