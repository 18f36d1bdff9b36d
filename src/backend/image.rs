//! Device images: the inputs of a build (SPIR-V words or OpenCL C source), identified by a digest of
//! their bytes.

use std::sync::Arc;

use crate::cache::Digest;

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
