//! The backend layer: devices, fingerprints, building programs, serializing them to binaries and
//! back, kernels. Backends know nothing of caching; the runtime layer decides when to build and what to
//! persist.

pub mod image;

pub use image::{DeviceImage, ImageFormat};

use std::sync::Arc;

use crate::cache::{BuildOptions, CacheCost, Digest, SpecConstants};
use crate::config::BackendKind;
use crate::error::Result;

/// kpc's own binary-format version. It is part of every device fingerprint, so bumping it invalidates
/// every persisted binary at once.
pub const KPC_FORMAT_VERSION: u32 = 1;

/// What identifies a device and driver for the purpose of reusing a binary: every field that, if it
/// changed, could make an old binary wrong.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct DeviceFingerprint {
    /// The backend.
    pub backend: BackendKind,
    /// Named fields (vendor id, device id, driver version, pipeline cache UUID, ...), in a fixed order.
    pub fields: Vec<(String, String)>,
    /// BLAKE3 over the backend, every field and [`KPC_FORMAT_VERSION`].
    pub digest: Digest,
}

impl DeviceFingerprint {
    /// A fingerprint of `fields`; the digest covers their names and values and kpc's format version.
    pub fn new(backend: BackendKind, fields: Vec<(String, String)>) -> Self {
        let mut h = blake3::Hasher::new();
        h.update(b"kpc-device-fingerprint");
        h.update(&KPC_FORMAT_VERSION.to_le_bytes());
        h.update(backend.to_string().as_bytes());
        for (k, v) in &fields {
            for part in [k.as_bytes(), v.as_bytes()] {
                h.update(&(part.len() as u64).to_le_bytes());
                h.update(part);
            }
        }
        DeviceFingerprint {
            backend,
            fields,
            digest: Digest(*h.finalize().as_bytes()),
        }
    }

    /// The fields as `name=value` lines: what a disk entry's `.src` stores and compares exactly.
    pub fn describe(&self) -> String {
        let mut s = format!(
            "backend={}\nkpc_format={KPC_FORMAT_VERSION}\n",
            self.backend
        );
        for (k, v) in &self.fields {
            s.push_str(k);
            s.push('=');
            s.push_str(v);
            s.push('\n');
        }
        s
    }
}

/// One device of one backend, as the runtime builds on it.
///
/// Program methods are called by the runtime's `ProgramManager` only on a cache miss; none of them
/// caches anything itself.
pub trait Backend: Send + Sync + 'static {
    /// A built program (Vulkan: shader module + pipeline cache; OpenCL: cl_program).
    type Program: CacheCost + Send + Sync + 'static;
    /// A kernel of a program, ready to launch (Vulkan: compute pipeline; OpenCL: cl_kernel).
    type Kernel: Send + Sync + 'static;

    /// Which backend this is.
    fn kind(&self) -> BackendKind;

    /// The device and driver identity that binaries are keyed on.
    fn fingerprint(&self) -> &DeviceFingerprint;

    /// Builds `image` from scratch with these specialization constants and options.
    fn build_program(
        &self,
        image: &DeviceImage,
        spec: &SpecConstants,
        options: &BuildOptions,
    ) -> Result<Self::Program>;

    /// The bytes to persist for `program`, or `None` when this backend has nothing worth persisting.
    fn program_binary(&self, program: &Self::Program) -> Result<Option<Vec<u8>>>;

    /// Recreates a program from bytes [`Backend::program_binary`] returned, possibly in another
    /// process. An `Err` means the binary was not usable (rejected by the driver, mismatched header):
    /// the runtime treats it as a miss and builds from scratch.
    fn program_from_binary(
        &self,
        image: &DeviceImage,
        spec: &SpecConstants,
        options: &BuildOptions,
        binary: &[u8],
    ) -> Result<Self::Program>;

    /// Creates the kernel for entry point `entry` of `program`.
    fn create_kernel(&self, program: &Arc<Self::Program>, entry: &str) -> Result<Self::Kernel>;
}
