//! Tools over kpc's caches and backends: what the `kpc` command (the `kpc-cli` crate), kpc's own
//! tests, benches and examples use beyond the embedder's surface at the crate root.
//!
//! An engine does not need this module: [`crate::Context`] and its builder cover opening devices,
//! acquiring kernels, launching and reading counters. This module opens the layers underneath for
//! inspection and maintenance: the on-disk cache (`kpc cache ...`), the stores and the remote
//! (`kpc cache gc`, bundles, journals), the backends opened with their own options (`kpc bench-*`),
//! warm-start manifests and prebuilds.
//!
//! Guarantees: the same as the root surface's for what they share (typed errors, nothing panics on
//! bad input); beyond that, these items follow the on-disk formats they read and write
//! (`kpc-cache-format` in each cache root says which) and may change with them between minor
//! versions, unlike the root surface.

/// Backends: the typed traits a backend implements, the type-erased seam a [`crate::Context`]
/// holds, and process helpers.
pub mod backend {
    pub use crate::backend::dynamic::{DynKernel, DynProgram};
    pub use crate::backend::pod::{as_bytes, as_bytes_mut};
    pub use crate::backend::process::with_original_loader_environment;
    pub use crate::backend::{
        Backend, BackendLaunch, ComputeBackend, DeviceFingerprint, KernelObject, Launch,
    };
}

/// SPIR-V reflection: what a module declares.
pub mod spirv {
    pub use crate::backend::spirv::{DescriptorKind, LocalDim, SpecType};
}

/// The Vulkan backend opened directly (with [`vulkan::VulkanOptions`]), its process-wide
/// registries and its binary payload formats.
pub mod vulkan {
    pub use crate::backend::vulkan::{
        BufferStrategy, VulkanBackend, VulkanOptions, devices, devices_created, queue_lock_sharers,
        validation_enabled, validation_errors,
    };
    /// The `VkPipelineCache` payload kpc persists (header and data).
    pub mod pipeline_cache {
        pub use crate::backend::vulkan::pipeline_cache::{
            PIPELINE_CACHE_HEADER_BYTES, Payload, decode, encode,
        };
    }
    /// The pipeline-binary payload kpc persists (VK_KHR_pipeline_binary).
    pub mod pipeline_binary {
        pub use crate::backend::vulkan::pipeline_binary::{BinaryData, decode, encode};
    }
}

/// The OpenCL backend opened directly (with [`opencl::OpenClOptions`]) and its binary container.
pub mod opencl {
    pub use crate::backend::opencl::{
        KernelSharing, OpenClBackend, OpenClBinary, OpenClKernel, OpenClOptions, Origin, devices,
        spec_constants,
    };
}

/// GLSL compilation (shaderc), as `kpc glsl` and the SPIR-V cache use it.
pub mod glsl {
    /// The compiler itself (shaderc), below the SPIR-V cache.
    pub mod compile {
        pub use crate::backend::glsl::compile::{compile, compiler_identity, preprocess};
    }
    pub use crate::backend::glsl::{
        DirIncludes, GlslOptimization, GlslSource, MapIncludes, SpirvTarget,
    };
}

/// The in-memory kernel and program cache and its keys.
pub mod cache {
    pub use crate::cache::{
        BuildError, BuildMap, BuildResult, BuildState, CacheCost, KernelKey, KernelProgramCache,
        MAX_TRANSIENT_RETRIES, MemCacheSettings, ProgramKey, Served, get_or_build,
    };
}

/// The verified on-disk cache: open it, look up, explain misses, evict.
pub mod disk {
    pub use crate::cache::disk::evicted::{EVICTED_FILE, EVICTED_RECORDS, size_arg};
    pub use crate::cache::disk::{
        DiskCacheSettings, EntryInfo, FieldDiff, MissCause, MissExplanation, PersistentCache,
        VERSION_DIR,
    };
}

/// Stores beyond the local disk: read-only layers, the remote, entry authentication and
/// provenance.
pub mod store {
    pub use crate::cache::store::auth::is_compressed;
    pub use crate::cache::store::idle::IDLE_LOOKUPS;
    pub use crate::cache::store::provenance::driver_of;
    pub use crate::cache::store::{BuildLock, EntryAuth, Provenance, ReadOnlyStore, WarnCause};
    /// The authenticated envelope around a stored entry (MAC, signature, compression).
    pub mod auth {
        pub use crate::cache::store::auth::{is_compressed, open, wrap};
    }
    #[cfg(all(feature = "remote", not(loom)))]
    pub use crate::cache::store::{GcPolicy, GcReason, RemoteStore};
}

/// The journal of builds and hits a cache root keeps (`kpc cache report`).
pub mod journal {
    pub use crate::cache::journal::{JournalRecord, RecordKind, Report, read_local, report};
}

/// Cache bundles: export, import, and bundles as read-only layers.
pub mod bundle {
    pub use crate::cache::bundle::layer::is_bundle_path;
    pub use crate::cache::bundle::{BundleStore, ImportReport, export, import, read_entries};
}

/// `kpc cache check`: which entries a device can use.
pub mod check {
    pub use crate::cache::check::{
        CheckedEntry, Covered, Target, Usability, coverage, dir_entries, judge,
    };
}

/// The names of kpc's environment variables (ENVIRONMENT.md) and the parsers of their values.
pub mod config {
    pub use crate::config::prefetch::{PREFETCH_ACCEPTED, valid_app_name};
    pub use crate::config::signing::parse_trusted_keys;
    pub use crate::config::{parse_dir_list, parse_duration, parse_size, vars};
}

/// The runtime's parts below [`crate::Context`]: the program manager, warm start, prebuild, blobs.
pub mod runtime {
    pub use crate::runtime::blob::{BLOB_ID_MAGIC, CACHE_BLOB_VERSION};
    pub use crate::runtime::device::cache_fingerprint;
    pub use crate::runtime::lazy::LazyAcquired;
    pub use crate::runtime::prebuild::{Progress, app_manifests, prebuild, prebuild_with_progress};
    pub use crate::runtime::prefetch::default_workers;
    pub use crate::runtime::spirv_cache::spirv_key;
    pub use crate::runtime::warm_start::{
        LoadOutcome, WarmStart, load_if_stored, manifest_dir, shared_requests,
    };
    pub use crate::runtime::{Acquired, ProgramManager, prefetch_kernels};
    /// The warm-start manifest format.
    pub mod manifest {
        pub use crate::runtime::warm_start::manifest::{decode, encode};
    }
}
