//! kpc's error type. Every bad input gets its own variant that says what was wrong and what is
//! accepted. Errors are `Clone` because the in-memory cache hands the same failed build to every caller.

use crate::cache::BuildFailure;
use crate::config::{BackendKind, ConfigError};

/// Every error kpc returns. Non-exhaustive: new kinds may be added, so a `match` needs a `_` arm.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A configuration value was malformed.
    #[error(transparent)]
    Config(#[from] ConfigError),

    /// The backend cannot be used at all on this machine (no loader, no ICD, no device).
    #[error("{} unavailable: {reason}", api(backend))]
    Unavailable {
        /// Which backend.
        backend: BackendKind,
        /// Why, in words (the loader error, "no devices", ...).
        reason: String,
    },

    /// No device matched `KPC_DEVICE` (or the requested selector).
    #[error("no device matches {selector:?}; available: {available}")]
    NoSuchDevice {
        /// The selector as given.
        selector: String,
        /// The devices that exist, one per line or "none".
        available: String,
    },

    /// A SPIR-V image failed validation; nothing was cached for it.
    #[error("invalid SPIR-V in image {image:?}: {message}")]
    InvalidSpirv {
        /// The image's name.
        image: String,
        /// The validator's message.
        message: String,
    },

    /// A GLSL image did not compile to SPIR-V: the compiler's messages, each citing `name:line`.
    /// Deterministic, so cached.
    #[error("GLSL image {image:?} did not compile:\n{message}")]
    GlslCompile {
        /// The image's name.
        image: String,
        /// The compiler's messages.
        message: String,
    },

    /// The driver rejected a program: a compile or link error. Deterministic, so cached.
    #[error("building {image:?} failed on {backend} (code {code}): {message}{}", log_suffix(.log))]
    Build {
        /// Which backend.
        backend: BackendKind,
        /// The image's name.
        image: String,
        /// The backend's error code (VkResult or cl_int).
        code: i32,
        /// What failed.
        message: String,
        /// The driver's build log, if any.
        log: String,
    },

    /// A kernel needs something the device does not have enabled: a SPIR-V capability, an
    /// extension, or a feature its operations imply (subgroup operations on 16-bit types need
    /// `shaderSubgroupExtendedTypes`). Found before the driver sees the module; deterministic, so
    /// cached.
    #[error("{image:?} cannot run on this {backend} device: it needs {needs}, but {reason}")]
    Unsupported {
        /// Which backend.
        backend: BackendKind,
        /// The image's name.
        image: String,
        /// What the kernel needs (`SPIR-V capability GroupNonUniformClustered`, ...).
        needs: String,
        /// Why the device does not provide it.
        reason: String,
    },

    /// A persisted binary that cannot be used on this device: its header names another device or
    /// driver, or it is malformed. The runtime treats this as a miss and builds from the image.
    #[error("{backend} binary for {image:?} rejected: {reason}")]
    BinaryRejected {
        /// Which backend.
        backend: BackendKind,
        /// The image's name.
        image: String,
        /// What did not match.
        reason: String,
    },

    /// A kernel launch whose arguments do not match the kernel's parameters.
    #[error("bad launch of kernel {kernel:?}: {message}")]
    Launch {
        /// The kernel's entry point name.
        kernel: String,
        /// What was wrong, with what the kernel expects.
        message: String,
    },

    /// An entry point that the image does not contain.
    #[error("unknown kernel {entry:?} in image {image:?}; it has: {available}")]
    UnknownKernel {
        /// The image's name.
        image: String,
        /// The entry point asked for.
        entry: String,
        /// The entry points that exist, comma separated.
        available: String,
    },

    /// A safe launch of a kernel that nothing keeps inside its buffers on this device: the device
    /// has no robust buffer access (OpenCL; Vulkan without `robustBufferAccess`) and the kernel has
    /// no declared access bounds. Nothing was submitted.
    #[error(
        "kernel {kernel:?} cannot be launched safely on {device}: the device does not keep buffer \
         accesses in bounds and the kernel declares no access bounds; check that every buffer is as \
         large as the kernel indexes and launch it with the unsafe Queue::submit_unchecked, or \
         declare its bounds (kpc::runtime::declare_access_bounds)"
    )]
    Unbounded {
        /// The kernel's entry point name.
        kernel: String,
        /// The device, in words.
        device: String,
    },

    /// A buffer or argument does not fit what the kernel or API expects.
    #[error("wrong size for {what}: got {got}, expected {expected}")]
    Size {
        /// Which buffer or argument.
        what: String,
        /// What was passed.
        got: String,
        /// What is accepted.
        expected: String,
    },

    /// A shape or argument the operation does not support.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),

    /// A call made in a state that does not allow it: a cross-attention step before its memory
    /// is set, a self-attention call on a cross-attention layer, a decode step with caching off.
    /// Nothing was written or launched.
    #[error("{call} cannot run now: {needs}")]
    CallOrder {
        /// The call, as the API names it.
        call: String,
        /// What it needs first, or which calls this object accepts instead.
        needs: String,
    },

    /// The device or driver ran out of something; may succeed later, so never cached.
    #[error("{backend} out of resources (code {code}): {message}")]
    OutOfResources {
        /// Which backend.
        backend: BackendKind,
        /// The backend's error code.
        code: i32,
        /// What ran out.
        message: String,
    },

    /// Any other backend call that failed.
    #[error("{backend} call {call} failed (code {code})")]
    Backend {
        /// Which backend.
        backend: BackendKind,
        /// The API call.
        call: &'static str,
        /// Its error code.
        code: i32,
    },

    /// An I/O error outside the disk cache (whose own errors never surface).
    #[error("I/O error: {0}")]
    Io(String),

    /// Work kpc had not begun when it was cancelled: a prefetch request whose batch was dropped, or
    /// whose context was quiesced, before a worker took it. Nothing was built or cached for it.
    #[error("cancelled: {0}")]
    Cancelled(String),

    /// A build panicked on another thread; this caller gave up waiting for a retry.
    #[error("{0}")]
    Panicked(String),

    /// A cache blob made for another key: another device or driver, kpc format, image, spec
    /// constants or build options. It was refused before anything of it reached the driver.
    #[error(
        "cache blob refused: its {field} is {found:?}, but this context and key need {expected:?}"
    )]
    BlobMismatch {
        /// The key field that differs (a device fingerprint field such as `driver_version`, or
        /// `kpc_format`, `backend`, `image_digest`, `image_len`, `spec`, `options`).
        field: String,
        /// Its value for this context and key.
        expected: String,
        /// Its value in the blob (`(absent)` where the blob lacks the field).
        found: String,
    },

    /// Bytes that are not an intact kpc cache blob: truncated, tampered with, another format or
    /// format version. Nothing of them reached the driver.
    #[error("not an intact kpc cache blob: {reason}")]
    CorruptBlob {
        /// What is wrong, with what is accepted.
        reason: String,
    },

    /// A file given as a bundle (`kpc cache import`) that is not one kpc can read: another file, an
    /// unknown format, or damaged so that its entries cannot be located. Nothing of it was stored.
    #[error(
        "{path} is not a usable kpc bundle: {problem}; expected a file written by `kpc cache export`"
    )]
    Bundle {
        /// The file.
        path: String,
        /// What is wrong with it.
        problem: String,
    },

    /// A sealed context ([`crate::Context::seal`], `KPC_CACHE_SEAL=error`) was asked for a kernel no
    /// layer could serve, so serving it would have meant a build; nothing was built. Not cached: once
    /// a store holds the kernel (or the context is unsealed) the same request succeeds.
    #[error("sealed: {kernel} is not cached and this context does not build after sealing ({why})")]
    Sealed {
        /// The kernel: `image:entry` (the image's name alone for a program acquired without one).
        kernel: String,
        /// Why no layer served it: the miss cause and the key fields that differ from the nearest
        /// cached entry, e.g. `spec-changed: spec constant 3: 64 → 128`.
        why: String,
    },

    /// An operation of one backend asked of another backend's object (Vulkan handles of an OpenCL
    /// kernel, say).
    #[error("{operation} needs a {} kernel; this one is {}", api(expected), found.as_ref().map_or("from a backend outside kpc", api))]
    WrongBackend {
        /// The operation, as the API names it.
        operation: &'static str,
        /// The backend it needs.
        expected: BackendKind,
        /// The backend of the object passed; `None` for a backend outside kpc.
        found: Option<BackendKind>,
    },
}

/// The API's own spelling, for messages a person reads ("Vulkan unavailable: ...").
fn api(b: &BackendKind) -> &'static str {
    match b {
        BackendKind::Vulkan => "Vulkan",
        BackendKind::OpenCl => "OpenCL",
    }
}

fn log_suffix(log: &str) -> String {
    if log.trim().is_empty() {
        String::new()
    } else {
        format!("\n--- build log ---\n{}", log.trim_end())
    }
}

impl BuildFailure for Error {
    fn is_transient(&self) -> bool {
        matches!(
            self,
            Error::OutOfResources { .. } | Error::Io(_) | Error::Panicked(_)
        )
    }
    fn from_panic(message: String) -> Self {
        Error::Panicked(message)
    }
    fn is_cacheable(&self) -> bool {
        // Invalid SPIR-V is the caller's input to fix; caching it would pin a failure on an image
        // digest the issue says must leave no trace.
        // A sealed refusal depends on the stores and the seal, not the key: asked again once either
        // changed, the request must look again.
        !matches!(self, Error::InvalidSpirv { .. } | Error::Sealed { .. })
    }
}

/// `Result` with kpc's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
