//! `kpc_kernel`: a kernel acquired through a context's caches from a `kpc_image` (image.rs), with
//! spec constants, build options and where the kernel came from.

use std::ffi::c_char;
use std::sync::{Arc, OnceLock};

use super::context::{c_backend, kpc_context};
use super::image::{check_format, kpc_image};
use super::registry::{self, Object};
use super::util::{check_out, opt_str_arg, slice_arg, str_arg, write_out, write_versioned};
use super::{Failure, guard, kpc_status};
use kpc::BackendKind;
use kpc::DeviceImage;
use kpc::{BuildOptions, SpecConstants, SpecValue};
use kpc::{Context, Kernel, Source};

/// The type of a specialization constant's value.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum kpc_spec_type {
    /// A boolean: `value.u32` is 0 or 1.
    KPC_SPEC_BOOL = 1,
    /// `value.i32`.
    KPC_SPEC_I32 = 2,
    /// `value.u32`.
    KPC_SPEC_U32 = 3,
    /// `value.f32`.
    KPC_SPEC_F32 = 4,
    /// `value.i64`.
    KPC_SPEC_I64 = 5,
    /// `value.u64`.
    KPC_SPEC_U64 = 6,
    /// `value.f64`.
    KPC_SPEC_F64 = 7,
}

/// A specialization constant's value; the member read is the one `kpc_spec_constant.kind` names.
#[repr(C)]
#[derive(Clone, Copy)]
pub union kpc_spec_value {
    /// For `KPC_SPEC_BOOL` (0 or 1) and `KPC_SPEC_U32`.
    pub u32: u32,
    /// For `KPC_SPEC_I32`.
    pub i32: i32,
    /// For `KPC_SPEC_F32`.
    pub f32: f32,
    /// For `KPC_SPEC_U64`.
    pub u64: u64,
    /// For `KPC_SPEC_I64`.
    pub i64: i64,
    /// For `KPC_SPEC_F64`.
    pub f64: f64,
}

/// One specialization constant: its id (Vulkan `constant_id`; for OpenCL C, the id the source's
/// `// kpc-spec-constant <id> <NAME> [<TYPE>]` line declares), its type and value.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct kpc_spec_constant {
    /// The constant's id.
    pub id: u32,
    /// A `kpc_spec_type` value (a plain integer, so that any value a caller passes can be checked).
    pub kind: u32,
    /// The value.
    pub value: kpc_spec_value,
}

/// Which layer served a kernel request.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum kpc_source {
    /// The context's in-memory cache.
    KPC_SOURCE_MEMORY = 1,
    /// A verified binary from the disk cache: loaded, not compiled.
    KPC_SOURCE_DISK = 2,
    /// Compiled from the device image.
    KPC_SOURCE_BUILT = 3,
    /// Loaded from a cache blob the caller passed (`kpc_kernel_create_from_blob`), not compiled.
    KPC_SOURCE_BLOB = 4,
    /// A verified binary from a read-only cache layer (`KPC_CACHE_READONLY_DIRS`), copied to the
    /// local disk cache.
    KPC_SOURCE_READONLY = 5,
    /// A verified binary from another store (an embedder's own), copied to the first writable one.
    KPC_SOURCE_STORE = 6,
    /// A verified binary from the remote tier (`KPC_CACHE_REMOTE`), copied to the local disk cache.
    KPC_SOURCE_REMOTE = 7,
}

fn c_source(s: Source) -> kpc_source {
    match s {
        Source::Memory => kpc_source::KPC_SOURCE_MEMORY,
        Source::Disk => kpc_source::KPC_SOURCE_DISK,
        Source::Built => kpc_source::KPC_SOURCE_BUILT,
        Source::Blob => kpc_source::KPC_SOURCE_BLOB,
        Source::ReadOnly => kpc_source::KPC_SOURCE_READONLY,
        Source::Store => kpc_source::KPC_SOURCE_STORE,
        Source::Remote => kpc_source::KPC_SOURCE_REMOTE,
    }
}

/// A kernel (opaque) acquired from a context: valid, with every handle it exposes, until
/// `kpc_kernel_destroy`, even if the context's cache evicts it or the context is destroyed first.
pub struct kpc_kernel {
    _opaque: [u8; 0],
}

/// What a `kpc_kernel` handle holds: the kernel, the backend it runs on, and what C was handed by
/// pointer from it (kept here so the pointers stay valid until the handle is destroyed).
pub(crate) struct KernelObject {
    pub(crate) kernel: Kernel,
    pub(crate) backend: BackendKind,
    /// The arrays `kpc_kernel_vulkan_handles` points into, made on first request.
    pub(crate) vulkan: OnceLock<crate::arrays::VulkanArrays>,
    /// The cache blob, made on first request, so that the two calls of the size-then-copy pattern
    /// see the same bytes.
    pub(crate) blob: OnceLock<Vec<u8>>,
}

impl KernelObject {
    pub(crate) fn new(kernel: Kernel, backend: BackendKind) -> KernelObject {
        KernelObject {
            kernel,
            backend,
            vulkan: OnceLock::new(),
            blob: OnceLock::new(),
        }
    }
}

impl Object for KernelObject {
    type Handle = kpc_kernel;
    const NAME: &'static str = "kpc_kernel";
}

/// The spec constants of a C array, each checked.
///
/// # Safety
/// As [`slice_arg`].
pub(crate) unsafe fn spec_arg(
    spec: *const kpc_spec_constant,
    count: usize,
) -> Result<SpecConstants, Failure> {
    // SAFETY: forwarded to the caller.
    let items = unsafe { slice_arg(spec, count, "spec_constants")? };
    let mut out = SpecConstants::new();
    let mut seen = std::collections::HashSet::new();
    for (i, c) in items.iter().enumerate() {
        if !seen.insert(c.id) {
            return Err(Failure::invalid(format!(
                "spec_constants[{i}] repeats id {}: each id may appear once",
                c.id
            )));
        }
        // SAFETY: union members all start at offset 0 and are at least 4 bytes, so the first 4
        // bytes are initialized whichever member the caller set; any bits are a valid u32.
        let low = unsafe { c.value.u32 };
        let wide = || {
            // SAFETY: called only for the 64-bit kinds, whose 8-byte member the caller set; any
            // bits are a valid u64.
            unsafe { c.value.u64 }
        };
        let v = match c.kind {
            t if t == kpc_spec_type::KPC_SPEC_BOOL as u32 => match low {
                0 => SpecValue::Bool(false),
                1 => SpecValue::Bool(true),
                b => {
                    return Err(Failure::invalid(format!(
                        "spec_constants[{i}] is a KPC_SPEC_BOOL of value {b}: expected 0 or 1"
                    )));
                }
            },
            t if t == kpc_spec_type::KPC_SPEC_I32 as u32 => SpecValue::I32(low as i32),
            t if t == kpc_spec_type::KPC_SPEC_U32 as u32 => SpecValue::U32(low),
            t if t == kpc_spec_type::KPC_SPEC_F32 as u32 => SpecValue::F32Bits(low),
            t if t == kpc_spec_type::KPC_SPEC_I64 as u32 => SpecValue::I64(wide() as i64),
            t if t == kpc_spec_type::KPC_SPEC_U64 as u32 => SpecValue::U64(wide()),
            t if t == kpc_spec_type::KPC_SPEC_F64 as u32 => SpecValue::F64Bits(wide()),
            t => {
                return Err(Failure::invalid(format!(
                    "spec_constants[{i}].kind is {t}: expected a kpc_spec_type value (1..=7)"
                )));
            }
        };
        out = out.with(c.id, v);
    }
    Ok(out)
}

/// The common arguments of every call that names a kernel's key.
pub(crate) struct KeyArgs {
    pub(crate) context: Arc<Context>,
    pub(crate) image: Arc<DeviceImage>,
    pub(crate) spec: SpecConstants,
    pub(crate) options: BuildOptions,
}

impl KeyArgs {
    /// The request for kernel `entry` of this key (`""` where only the program matters: a blob id).
    pub(crate) fn request(&self, entry: &str) -> kpc::KernelRequest {
        kpc::KernelRequest::new(&self.image, entry)
            .spec(self.spec.clone())
            .options(self.options.clone())
    }
}

/// Reads and checks a key's arguments.
///
/// # Safety
/// As [`spec_arg`] and [`opt_str_arg`].
pub(crate) unsafe fn key_args(
    context: *const kpc_context,
    image: *const kpc_image,
    spec: *const kpc_spec_constant,
    spec_count: usize,
    build_options: *const c_char,
) -> Result<KeyArgs, Failure> {
    let context = registry::get::<Context>(context, "context")?;
    let image = registry::get::<DeviceImage>(image, "image")?;
    // SAFETY: forwarded to the caller.
    let spec = unsafe { spec_arg(spec, spec_count)? };
    // SAFETY: forwarded to the caller.
    let options = unsafe { opt_str_arg(build_options, "build_options")? }.unwrap_or("");
    Ok(KeyArgs {
        context,
        image,
        spec,
        options: BuildOptions::new(options),
    })
}

/// Acquires the kernel `entry` of `image` on `context`, specialized with `spec_count` constants at
/// `spec` (NULL when 0) and built with `build_options` (NULL for none; OpenCL compiler options,
/// whitespace-normalized; part of the cache key on both backends): from the context's memory cache,
/// the disk cache, or a fresh build. `kpc_kernel_info` says which.
///
/// Ownership: `*out` receives a new kernel handle (a fresh handle on every call, to the same cached
/// kernel); destroy it with `kpc_kernel_destroy`.
/// Errors: `KPC_STATUS_INVALID_ARGUMENT` (bad handle, NULL `entry` or `out`, NULL `spec` with a
/// non-zero count, an unknown spec type, a repeated id, non-UTF-8 strings, an image of a format the
/// context's backend cannot build); `KPC_STATUS_UNKNOWN_KERNEL` (the message lists the entry points);
/// `KPC_STATUS_INVALID_SPIRV`; `KPC_STATUS_BUILD_FAILED` (with the build log);
/// `KPC_STATUS_OUT_OF_RESOURCES`.
///
/// # Safety
/// `entry` and `build_options` are NULL or NUL-terminated strings; `spec` is NULL or has
/// `spec_count` elements; `out` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kpc_kernel_create(
    context: *const kpc_context,
    image: *const kpc_image,
    entry: *const c_char,
    spec: *const kpc_spec_constant,
    spec_count: usize,
    build_options: *const c_char,
    out: *mut *mut kpc_kernel,
) -> kpc_status {
    guard("kpc_kernel_create", || {
        check_out(out, "out")?;
        // SAFETY: forwarded to the caller.
        let k = unsafe { key_args(context, image, spec, spec_count, build_options)? };
        // SAFETY: forwarded to the caller.
        let entry = unsafe { str_arg(entry, "entry")? };
        check_format(&k.context, &k.image)?;
        let kernel = k.context.kernel_with(&k.request(entry))?;
        let h = registry::insert(KernelObject::new(kernel, k.context.backend()));
        // SAFETY: checked above; writable by the caller's promise.
        unsafe { write_out(out, h, "out") }
    })
}

/// As `kpc_kernel_create`, with a generic fallback (`generic_image`'s `generic_entry`, its own spec
/// constants and build options): while the specialized kernel (the first six arguments) is in no
/// cache layer (memory, disk, read-only layer, remote), `*out` receives the fallback at once and the
/// specialized kernel builds in the background, under the same single flight as every request; a
/// call after it is ready receives the specialized kernel. `kpc_kernel_is_generic` says which one a
/// handle holds, since their launch parameters may differ. A failed background build is warned
/// about once (through the log callback) and the fallback goes on serving it. Under
/// `KPC_SEAL_GENERIC` the fallback is served and nothing specialized is built; under
/// `KPC_SEAL_ERROR` a specialized kernel that would build is refused (`KPC_STATUS_SEALED`) as by
/// `kpc_kernel_create`. `kpc_stats.lazy` counts what was served and built.
///
/// Ownership: `*out` receives a new kernel handle; destroy it with `kpc_kernel_destroy`.
/// Errors: those of `kpc_kernel_create`, for either kernel's arguments (checked before anything is
/// acquired) and for the fallback's acquisition when it is served; when the fallback fails, the
/// specialized kernel is acquired as by `kpc_kernel_create`.
///
/// # Safety
/// `entry`, `build_options`, `generic_entry` and `generic_build_options` are NULL or NUL-terminated
/// strings; `spec` and `generic_spec` are NULL or have their counts' elements; `out` is NULL or
/// writable.
#[allow(clippy::too_many_arguments)]
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kpc_kernel_get_or_generic(
    context: *const kpc_context,
    image: *const kpc_image,
    entry: *const c_char,
    spec: *const kpc_spec_constant,
    spec_count: usize,
    build_options: *const c_char,
    generic_image: *const kpc_image,
    generic_entry: *const c_char,
    generic_spec: *const kpc_spec_constant,
    generic_spec_count: usize,
    generic_build_options: *const c_char,
    out: *mut *mut kpc_kernel,
) -> kpc_status {
    guard("kpc_kernel_get_or_generic", || {
        check_out(out, "out")?;
        // SAFETY: forwarded to the caller.
        let k = unsafe { key_args(context, image, spec, spec_count, build_options)? };
        // SAFETY: forwarded to the caller.
        let entry = unsafe { str_arg(entry, "entry")? };
        let generic_image = registry::get::<DeviceImage>(generic_image, "generic_image")?;
        // SAFETY: forwarded to the caller.
        let generic_spec = unsafe { spec_arg(generic_spec, generic_spec_count)? };
        // SAFETY: forwarded to the caller.
        let generic_options =
            unsafe { opt_str_arg(generic_build_options, "generic_build_options")? }.unwrap_or("");
        // SAFETY: forwarded to the caller.
        let generic_entry = unsafe { str_arg(generic_entry, "generic_entry")? };
        check_format(&k.context, &k.image)?;
        check_format(&k.context, &generic_image)?;
        let generic = kpc::KernelRequest::new(&generic_image, generic_entry)
            .spec(generic_spec)
            .options(BuildOptions::new(generic_options));
        let kernel = k
            .context
            .kernel_with(&k.request(entry).or_generic(generic))?;
        let h = registry::insert(KernelObject::new(kernel, k.context.backend()));
        // SAFETY: checked above; writable by the caller's promise.
        unsafe { write_out(out, h, "out") }
    })
}

/// Writes 1 to `*out` when `kernel` is the generic fallback of a `kpc_kernel_get_or_generic`
/// request (launch it with the fallback's parameters), else 0 (the specialized kernel, or any
/// kernel from `kpc_kernel_create`).
///
/// Errors: `KPC_STATUS_INVALID_ARGUMENT` for a bad handle or a NULL `out`.
///
/// # Safety
/// `out` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kpc_kernel_is_generic(
    kernel: *const kpc_kernel,
    out: *mut u32,
) -> kpc_status {
    guard("kpc_kernel_is_generic", || {
        let k = registry::get::<KernelObject>(kernel, "kernel")?;
        // SAFETY: forwarded to the caller.
        unsafe { write_out(out, u32::from(k.kernel.is_generic()), "out") }
    })
}

/// Destroys a kernel handle. NULL is accepted and does nothing. The kernel itself stays in its
/// context's cache; raw handles obtained from this kernel handle must not be used afterwards.
///
/// Errors: `KPC_STATUS_INVALID_ARGUMENT` when `kernel` is not a live kernel; nothing is freed then.
///
/// # Safety
/// None beyond the handle's (which is checked).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kpc_kernel_destroy(kernel: *mut kpc_kernel) -> kpc_status {
    guard("kpc_kernel_destroy", || {
        registry::remove::<KernelObject>(kernel, "kernel")
    })
}

/// What a kernel is and where it came from. Versioned: set `struct_size = sizeof(kpc_kernel_info)`
/// before the call; kpc fills what fits and sets `struct_size` to the bytes it wrote.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct kpc_kernel_info {
    /// In: the caller's `sizeof(kpc_kernel_info)`. Out: the bytes kpc wrote.
    pub struct_size: u32,
    /// The backend it runs on (a `kpc_backend` value).
    pub backend: u32,
    /// Which layer served the request that created this handle (a `kpc_source` value).
    pub source: u32,
    /// Buffer parameters (Vulkan: bindings of set 0; OpenCL: buffer arguments), in launch order.
    pub buffer_count: u32,
    /// Bytes of push constants (Vulkan) or of the scalar arguments after the buffers (OpenCL).
    pub push_constant_bytes: u32,
    /// The workgroup size after specialization.
    pub local_size: [u32; 3],
    /// Nanoseconds the acquisition took.
    pub acquire_time_ns: u64,
}

/// Writes what `kernel` is (backend, source layer, parameters, local size) to `*out`. Set
/// `out->struct_size = sizeof(kpc_kernel_info)` first.
///
/// Errors: `KPC_STATUS_INVALID_ARGUMENT` for a bad handle, a NULL `out`, or an unset `struct_size`.
///
/// # Safety
/// `out` is NULL or points to a writable `kpc_kernel_info` whose `struct_size` the caller set.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kpc_kernel_info_get(
    kernel: *const kpc_kernel,
    out: *mut kpc_kernel_info,
) -> kpc_status {
    guard("kpc_kernel_info_get", || {
        let k = registry::get::<KernelObject>(kernel, "kernel")?;
        let info = k.kernel.info();
        let v = kpc_kernel_info {
            struct_size: 0,
            backend: c_backend(k.backend) as u32,
            source: c_source(k.kernel.source()) as u32,
            buffer_count: u32::try_from(info.buffers.len()).unwrap_or(u32::MAX),
            push_constant_bytes: info.push_constant_bytes,
            local_size: info.local_size,
            acquire_time_ns: u64::try_from(k.kernel.acquire_time().as_nanos()).unwrap_or(u64::MAX),
        };
        // SAFETY: forwarded to the caller.
        unsafe { write_versioned(out, v, |s| &mut s.struct_size, "kpc_kernel_info") }
    })
}

/// Writes which layer served the request that created `kernel` to `*out` (a shortcut for
/// `kpc_kernel_info_get`'s `source`).
///
/// Errors: `KPC_STATUS_INVALID_ARGUMENT` for a bad handle or a NULL `out`.
///
/// # Safety
/// `out` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kpc_kernel_source(
    kernel: *const kpc_kernel,
    out: *mut kpc_source,
) -> kpc_status {
    guard("kpc_kernel_source", || {
        let k = registry::get::<KernelObject>(kernel, "kernel")?;
        // SAFETY: forwarded to the caller.
        unsafe { write_out(out, c_source(k.kernel.source()), "out") }
    })
}

/// Writes the name of a `kpc_source` value ("memory", "disk", "built", "blob", "readonly", "store"), or "unknown", as a static
/// string the caller must not free. Takes an `int` so that any value is accepted.
#[unsafe(no_mangle)]
pub extern "C" fn kpc_source_name(source: i32) -> *const c_char {
    let s: &'static [u8] = match source {
        x if x == kpc_source::KPC_SOURCE_MEMORY as i32 => b"memory\0",
        x if x == kpc_source::KPC_SOURCE_DISK as i32 => b"disk\0",
        x if x == kpc_source::KPC_SOURCE_BUILT as i32 => b"built\0",
        x if x == kpc_source::KPC_SOURCE_BLOB as i32 => b"blob\0",
        x if x == kpc_source::KPC_SOURCE_READONLY as i32 => b"readonly\0",
        x if x == kpc_source::KPC_SOURCE_STORE as i32 => b"store\0",
        x if x == kpc_source::KPC_SOURCE_REMOTE as i32 => b"remote\0",
        _ => b"unknown\0",
    };
    s.as_ptr().cast()
}
