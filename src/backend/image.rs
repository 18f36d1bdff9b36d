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

/// The reflected module and whether spirv-tools accepted it. Only success is remembered: an invalid
/// image is validated (and rejected) again on every use, so nothing about it outlives the request.
#[cfg(not(loom))]
#[derive(Debug, Default)]
struct SpirvMemo {
    module: OnceLock<super::spirv::SpirvModule>,
    validated: OnceLock<()>,
}

/// An immutable device image. Cloning is cheap; the digest is computed once.
#[derive(Debug, Clone)]
pub struct DeviceImage {
    name: Arc<str>,
    format: ImageFormat,
    bytes: Arc<[u8]>,
    digest: Digest,
    /// What is known about a SPIR-V image, shared by clones.
    #[cfg(not(loom))]
    spirv: Arc<SpirvMemo>,
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

    /// The validated module and its reflected interface: validated with spirv-tools and reflected on
    /// first use, shared by every clone of this image afterwards (a hit is two atomic loads).
    ///
    /// Errors: [`crate::Error::InvalidSpirv`] with the validator's message when the bytes are not
    /// valid SPIR-V for Vulkan, or when the image is not a SPIR-V image at all.
    #[cfg(not(loom))]
    pub fn spirv_module(&self) -> Result<&super::spirv::SpirvModule> {
        if self.spirv.validated.get().is_none() {
            self.check_spirv_format()?;
            let words = super::spirv::words_from_bytes(&self.name, &self.bytes)?;
            super::spirv::validate(&self.name, &words)?;
            let _ = self.spirv.validated.set(());
        }
        self.spirv_reflection()
    }

    /// The reflected module without requiring validation: for a caller that knows these bytes are
    /// valid by other means (a persisted binary keyed by this image's digest exists only because an
    /// identical image passed validation before).
    ///
    /// Errors: [`crate::Error::InvalidSpirv`] when the bytes do not parse as SPIR-V.
    #[cfg(not(loom))]
    pub fn spirv_reflection(&self) -> Result<&super::spirv::SpirvModule> {
        if let Some(m) = self.spirv.module.get() {
            return Ok(m);
        }
        self.check_spirv_format()?;
        let m = super::spirv::SpirvModule::reflect(&self.name, &self.bytes)?;
        // Two threads may both reflect; either result is the same, and the first one stored wins.
        Ok(self.spirv.module.get_or_init(|| m))
    }

    #[cfg(not(loom))]
    fn check_spirv_format(&self) -> Result<()> {
        if self.format == ImageFormat::SpirV {
            Ok(())
        } else {
            Err(crate::Error::InvalidSpirv {
                image: self.name.to_string(),
                message: format!("the image holds {:?}, not SPIR-V", self.format),
            })
        }
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
