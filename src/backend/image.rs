//! Device images: the inputs of a build (SPIR-V words or OpenCL C source), identified by a digest of
//! their bytes.

use std::sync::Arc;
#[cfg(not(loom))]
use std::sync::OnceLock;

use crate::cache::Digest;
#[cfg(not(loom))]
use crate::error::Result;

/// What a device image contains.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ImageFormat {
    /// A SPIR-V module (Vulkan).
    SpirV,
    /// OpenCL C source text.
    OpenClC,
}

/// An immutable device image. Cloning is cheap; the digest is computed once.
#[derive(Debug, Clone)]
pub struct DeviceImage {
    name: Arc<str>,
    format: ImageFormat,
    bytes: Arc<[u8]>,
    digest: Digest,
    /// The validated, reflected module of a SPIR-V image, once known; shared by clones. Only success
    /// is remembered: an invalid image is re-validated (and rejected) on every use, so nothing about
    /// it outlives the request.
    #[cfg(not(loom))]
    spirv: Arc<OnceLock<Arc<super::spirv::SpirvModule>>>,
}

impl DeviceImage {
    /// An image named `name` (used in errors and `kpc cache ls`) holding `bytes`.
    pub fn new(name: &str, format: ImageFormat, bytes: impl Into<Arc<[u8]>>) -> Self {
        let bytes = bytes.into();
        DeviceImage {
            name: name.into(),
            format,
            digest: Digest::of(&bytes),
            bytes,
            #[cfg(not(loom))]
            spirv: Arc::default(),
        }
    }

    /// A SPIR-V image, validated with spirv-tools and reflected now.
    ///
    /// Errors: [`crate::Error::InvalidSpirv`] with the validator's message.
    #[cfg(not(loom))]
    pub fn spirv(name: &str, bytes: impl Into<Arc<[u8]>>) -> Result<Self> {
        let image = DeviceImage::new(name, ImageFormat::SpirV, bytes);
        image.spirv_module()?;
        Ok(image)
    }

    /// The validated module and its reflected interface: computed on first use and shared by every
    /// clone of this image afterwards.
    ///
    /// Errors: [`crate::Error::InvalidSpirv`] when the bytes are not valid SPIR-V for Vulkan, or when
    /// the image is not a SPIR-V image at all.
    #[cfg(not(loom))]
    pub fn spirv_module(&self) -> Result<Arc<super::spirv::SpirvModule>> {
        if let Some(m) = self.spirv.get() {
            return Ok(m.clone());
        }
        if self.format != ImageFormat::SpirV {
            return Err(crate::Error::InvalidSpirv {
                image: self.name.to_string(),
                message: format!("the image holds {:?}, not SPIR-V", self.format),
            });
        }
        let m = Arc::new(super::spirv::SpirvModule::parse(&self.name, &self.bytes)?);
        // Two threads may both parse; either result is the same, and the first one stored wins.
        Ok(self.spirv.get_or_init(|| m).clone())
    }
    /// The image's name.
    pub fn name(&self) -> &str {
        &self.name
    }
    /// What it contains.
    pub fn format(&self) -> ImageFormat {
        self.format
    }
    /// Its bytes.
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }
    /// BLAKE3 of its bytes: the image part of every cache key.
    pub fn digest(&self) -> Digest {
        self.digest
    }
}
