//! OpenCL programs: built from OpenCL C, reflected, serialized to a kpc container and loaded back.

use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use opencl3::error_codes::{
    CL_BUILD_PROGRAM_FAILURE, CL_COMPILER_NOT_AVAILABLE, CL_INVALID_BUILD_OPTIONS,
    CL_KERNEL_ARG_INFO_NOT_AVAILABLE, ClError,
};
use opencl3::kernel::{
    CL_KERNEL_ARG_ADDRESS_CONSTANT, CL_KERNEL_ARG_ADDRESS_GLOBAL, CL_KERNEL_ARG_ADDRESS_LOCAL,
    CL_KERNEL_ARG_ADDRESS_PRIVATE, CL_KERNEL_ARG_TYPE_CONST, Kernel,
};
use opencl3::program::Program;
use opencl3::types::cl_device_id;
use parking_lot::Mutex;

use crate::backend::{DeviceFingerprint, DeviceImage, ProgramOrigin};
use crate::cache::{BuildOptions, CacheCost, Digest, SpecConstants};
use crate::config::BackendKind;
use crate::error::{Error, Result};

use super::cl_err;
use super::container::OpenClBinary;
use super::meta::{KernelMeta, Param, ParamKind};

/// Bytes of an OpenCL C scalar type.
fn scalar_bytes(t: &str) -> Option<u32> {
    Some(match t {
        "char" | "uchar" | "unsigned char" | "signed char" => 1,
        "short" | "ushort" | "unsigned short" | "half" => 2,
        "int" | "uint" | "unsigned int" | "float" => 4,
        "long" | "ulong" | "unsigned long" | "double" => 8,
        _ => return None,
    })
}

/// Size and alignment of a by-value argument type as the driver names it (`uint`, `float4`), or
/// `None` for anything that is not a scalar or vector of one.
pub(crate) fn value_layout(type_name: &str) -> Option<(u32, u32)> {
    let t = type_name.trim();
    let t = t.strip_prefix("const ").unwrap_or(t).trim();
    if let Some(b) = scalar_bytes(t) {
        return Some((b, b));
    }
    let split = t.find(|c: char| c.is_ascii_digit())?;
    let (base, n) = t.split_at(split);
    let n: u32 = n.parse().ok()?;
    let b = scalar_bytes(base)?;
    let lanes = match n {
        2 | 4 | 8 | 16 => n,
        3 => 4,
        _ => return None,
    };
    Some((b * lanes, b * lanes))
}

fn reflect_param(k: &Kernel, index: u32) -> std::result::Result<Param, ClError> {
    let name = k.get_arg_name(index)?.trim_end_matches('\0').to_string();
    let type_name = k
        .get_arg_type_name(index)?
        .trim_end_matches('\0')
        .to_string();
    let address = k.get_arg_address_qualifier(index)?;
    let qualifier = k.get_arg_type_qualifier(index)?;
    let kind = if address == CL_KERNEL_ARG_ADDRESS_GLOBAL
        || address == CL_KERNEL_ARG_ADDRESS_CONSTANT
    {
        if type_name.ends_with('*') {
            ParamKind::Buffer {
                read_only: address == CL_KERNEL_ARG_ADDRESS_CONSTANT
                    || qualifier & u64::from(CL_KERNEL_ARG_TYPE_CONST) != 0,
            }
        } else {
            ParamKind::Unsupported(format!(
                "{type_name} (images and pipes are not supported; pass a buffer)"
            ))
        }
    } else if address == CL_KERNEL_ARG_ADDRESS_LOCAL {
        ParamKind::Unsupported(format!(
            "local {type_name} (declare local arrays inside the kernel, sized by a spec constant)"
        ))
    } else if address == CL_KERNEL_ARG_ADDRESS_PRIVATE {
        match value_layout(&type_name) {
            Some((size, align)) => ParamKind::Scalar { size, align },
            None => ParamKind::Unsupported(format!(
                "{type_name} by value (kpc passes scalars and vectors of them)"
            )),
        }
    } else {
        ParamKind::Unsupported(format!("{type_name} in address space {address:#x}"))
    };
    Ok(Param { name, kind })
}

/// Every kernel of a freshly built program, reflected from the driver.
fn reflect(program: &Program, device: cl_device_id, image: &str) -> Result<Vec<KernelMeta>> {
    let kernels = opencl3::kernel::create_program_kernels(program)
        .map_err(|e| cl_err("clCreateKernelsInProgram", e))?;
    let mut out = Vec::with_capacity(kernels.len());
    for k in &kernels {
        let name = k
            .function_name()
            .map_err(|e| cl_err("clGetKernelInfo", e))?
            .trim_end_matches('\0')
            .to_string();
        let n = k.num_args().map_err(|e| cl_err("clGetKernelInfo", e))?;
        let mut params = Vec::with_capacity(n as usize);
        for i in 0..n {
            match reflect_param(k, i) {
                Ok(p) => params.push(p),
                Err(ClError(CL_KERNEL_ARG_INFO_NOT_AVAILABLE)) => {
                    return Err(Error::Build {
                        backend: BackendKind::OpenCl,
                        image: image.to_string(),
                        code: CL_KERNEL_ARG_INFO_NOT_AVAILABLE,
                        message: format!(
                            "the driver keeps no argument info for kernel {name:?} although the \
                             program was built with -cl-kernel-arg-info; kpc reflects parameters \
                             from it"
                        ),
                        log: String::new(),
                    });
                }
                Err(e) => return Err(cl_err("clGetKernelArgInfo", e)),
            }
        }
        let reqd = k.get_compile_work_group_size(device).unwrap_or_default();
        let dim = |i: usize| {
            reqd.get(i)
                .map_or(0, |&s| u32::try_from(s).unwrap_or(u32::MAX))
        };
        out.push(KernelMeta {
            name,
            params,
            reqd_local_size: [dim(0), dim(1), dim(2)],
        });
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

/// What a program was built from, exactly: a binary carries it, and loading it for anything else is
/// refused.
pub(crate) fn build_digest(
    image: &DeviceImage,
    spec: &SpecConstants,
    options: &BuildOptions,
) -> Digest {
    let mut h = blake3::Hasher::new();
    h.update(b"kpc-opencl-build");
    h.update(&image.digest().0);
    let spec = spec.canonical_bytes();
    h.update(&(spec.len() as u64).to_le_bytes());
    h.update(&spec);
    h.update(options.as_str().as_bytes());
    Digest(*h.finalize().as_bytes())
}

/// Where a program came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// Built from OpenCL C with clBuildProgram.
    Built,
    /// Created from a persisted binary.
    Loaded,
}

/// A built OpenCL program (a `cl_program` for one device) with its reflected kernels.
///
/// Guarantees: the program is built for the backend's device; `kernels` lists every kernel it
/// contains; the persisted binary is made at most once (see [`OpenClProgram::binary_time`]).
pub struct OpenClProgram {
    pub(crate) program: Program,
    pub(crate) image: String,
    pub(crate) kernels: Vec<KernelMeta>,
    device_digest: Digest,
    build: Digest,
    origin: Origin,
    build_time: Duration,
    source_bytes: u64,
    /// The kpc container, once made: querying CL_PROGRAM_BINARIES is expensive on PoCL (it
    /// compiles every kernel's work-group function), so it is done once and remembered.
    binary: OnceLock<Arc<[u8]>>,
    /// Serializes the first query so that two callers do not both pay for it.
    binary_lock: Mutex<()>,
    binary_time: OnceLock<Duration>,
    /// What it was built from (for cache blobs).
    pub(crate) built_from: ProgramOrigin,
    // Released after `program`: the context outlives every program built in it.
    _device: Arc<super::Shared>,
}

impl std::fmt::Debug for OpenClProgram {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpenClProgram")
            .field("image", &self.image)
            .field("kernels", &self.kernel_names().collect::<Vec<_>>())
            .field("origin", &self.origin)
            .finish()
    }
}

impl CacheCost for OpenClProgram {
    /// The persisted binary's size once it is known, else the source's: what the program would
    /// cost to keep is not known before the (expensive) binary query, and the source is a floor.
    fn cache_bytes(&self) -> u64 {
        self.binary
            .get()
            .map_or(self.source_bytes, |b| b.len() as u64)
            .max(1)
    }
}

impl OpenClProgram {
    /// The image's name.
    pub fn image(&self) -> &str {
        &self.image
    }
    /// Its kernels' names, sorted.
    pub fn kernel_names(&self) -> impl Iterator<Item = &str> {
        self.kernels.iter().map(|k| k.name.as_str())
    }
    /// Its kernels' reflected interfaces, sorted by name.
    pub fn kernels(&self) -> &[KernelMeta] {
        &self.kernels
    }
    /// Built from source or loaded from a binary.
    pub fn origin(&self) -> Origin {
        self.origin
    }
    /// How long clBuildProgram (with reflection) took, from source or from the binary.
    pub fn build_time(&self) -> Duration {
        self.build_time
    }
    /// How long making the persisted binary took, once it has been made (`None` before, and zero
    /// for a program loaded from one).
    pub fn binary_time(&self) -> Option<Duration> {
        self.binary_time.get().copied()
    }
    /// Whether the persisted binary has been made.
    pub fn has_binary(&self) -> bool {
        self.binary.get().is_some()
    }

    /// The kpc container for this program: made on the first call (CL_PROGRAM_BINARIES), the same
    /// bytes afterwards. Safe to call from any thread, also while the program's kernels run.
    pub fn binary(&self) -> Result<Arc<[u8]>> {
        if let Some(b) = self.binary.get() {
            return Ok(b.clone());
        }
        let _one_at_a_time = self.binary_lock.lock();
        if let Some(b) = self.binary.get() {
            return Ok(b.clone());
        }
        let start = Instant::now();
        let mut blobs = self
            .program
            .get_binaries()
            .map_err(|e| cl_err("clGetProgramInfo(CL_PROGRAM_BINARIES)", e))?;
        let driver_binary = match blobs.len() {
            1 => blobs.swap_remove(0),
            n => {
                return Err(Error::Backend {
                    backend: BackendKind::OpenCl,
                    call: "clGetProgramInfo(CL_PROGRAM_BINARIES) returned other than one binary",
                    code: n as i32,
                });
            }
        };
        if driver_binary.is_empty() {
            return Err(Error::Backend {
                backend: BackendKind::OpenCl,
                call: "clGetProgramInfo(CL_PROGRAM_BINARIES) returned an empty binary",
                code: 0,
            });
        }
        let bytes: Arc<[u8]> = OpenClBinary {
            device: self.device_digest,
            build: self.build,
            kernels: self.kernels.clone(),
            driver_binary,
        }
        .encode()
        .into();
        let _ = self.binary_time.set(start.elapsed());
        Ok(self.binary.get_or_init(|| bytes).clone())
    }
}

/// Maps a failed clBuildProgram onto kpc's errors: out-of-memory is transient, everything else
/// (compile errors, bad options, no compiler) is deterministic and carries the log.
fn build_error(
    image: &str,
    e: ClError,
    program: &Program,
    device: cl_device_id,
    options: &str,
) -> Error {
    let code = e.0;
    if matches!(code, -6..=-4) {
        return cl_err("clBuildProgram", e);
    }
    let log = program
        .get_build_log(device)
        .unwrap_or_default()
        .trim_end_matches('\0')
        .to_string();
    let what = match code {
        CL_BUILD_PROGRAM_FAILURE => "clBuildProgram: the OpenCL C compiler rejected the source",
        CL_INVALID_BUILD_OPTIONS => "clBuildProgram: invalid build options",
        CL_COMPILER_NOT_AVAILABLE => "clBuildProgram: no compiler for this device",
        _ => "clBuildProgram failed",
    };
    Error::Build {
        backend: BackendKind::OpenCl,
        image: image.to_string(),
        code,
        message: format!("{what} (options: {options})"),
        log,
    }
}

/// Builds `image` from source.
pub(crate) fn build(
    shared: &Arc<super::Shared>,
    device: &DeviceFingerprint,
    image: &DeviceImage,
    spec: &SpecConstants,
    options: &BuildOptions,
) -> Result<OpenClProgram> {
    let (device_digest, built_from) = (
        device.digest,
        ProgramOrigin::new(device, image, spec, options),
    );
    let (context, device) = (&shared.context, shared.device.id());
    let source = super::source::OpenClSource::parse(image)?;
    let full_options = source.build_options(image, spec, options)?;
    let start = Instant::now();
    let mut program = Program::create_from_source(context, source.text)
        .map_err(|e| cl_err("clCreateProgramWithSource", e))?;
    // The options were checked for NUL bytes, which is the only way Program::build can panic.
    if let Err(e) = program.build(&[device], &full_options) {
        return Err(build_error(
            image.name(),
            e,
            &program,
            device,
            &full_options,
        ));
    }
    let kernels = reflect(&program, device, image.name())?;
    Ok(OpenClProgram {
        program,
        image: image.name().to_string(),
        kernels,
        device_digest,
        build: build_digest(image, spec, options),
        origin: Origin::Built,
        build_time: start.elapsed(),
        source_bytes: image.bytes().len() as u64,
        binary: OnceLock::new(),
        binary_lock: Mutex::new(()),
        binary_time: OnceLock::new(),
        built_from,
        _device: shared.clone(),
    })
}

/// Recreates a program from a container [`OpenClProgram::binary`] made. Every failure is a reason
/// string: the caller turns it into `Error::BinaryRejected` (a miss).
pub(crate) fn load(
    shared: &Arc<super::Shared>,
    device: &DeviceFingerprint,
    image: &DeviceImage,
    spec: &SpecConstants,
    options: &BuildOptions,
    bytes: &[u8],
) -> std::result::Result<OpenClProgram, String> {
    let (device_digest, built_from) = (
        device.digest,
        ProgramOrigin::new(device, image, spec, options),
    );
    let (context, device) = (&shared.context, shared.device.id());
    let c = OpenClBinary::decode(bytes)?;
    if c.device != device_digest {
        return Err(format!(
            "built for another device or driver (fingerprint {}, this device is {})",
            c.device, device_digest
        ));
    }
    if c.build != build_digest(image, spec, options) {
        return Err("built from another image, spec constants or build options".into());
    }
    // The same option string as the source build: spec-constant definitions are ignored for a
    // binary, but drivers may apply linker and optimization options again.
    let full_options = super::source::OpenClSource::parse(image)
        .and_then(|s| s.build_options(image, spec, options))
        .map_err(|e| e.to_string())?;
    let start = Instant::now();
    // SAFETY: `device` belongs to `context` (both come from the backend that opened them), and the
    // binary slice outlives the call, which copies it.
    let created =
        unsafe { Program::create_from_binary(context, &[device], &[c.driver_binary.as_slice()]) };
    let mut program =
        created.map_err(|e| format!("clCreateProgramWithBinary refused it ({})", cl_text(e)))?;
    program
        .build(&[device], &full_options)
        .map_err(|e| format!("clBuildProgram refused it ({})", cl_text(e)))?;
    let mut have: Vec<String> = program
        .kernel_names()
        .split(';')
        .map(|s| s.trim().trim_end_matches('\0').to_string())
        .filter(|s| !s.is_empty())
        .collect();
    have.sort();
    let want: Vec<&str> = c.kernels.iter().map(|k| k.name.as_str()).collect();
    if have != want {
        return Err(format!(
            "the driver's program has kernels {have:?}, the container lists {want:?}"
        ));
    }
    let bytes: Arc<[u8]> = bytes.into();
    Ok(OpenClProgram {
        program,
        image: image.name().to_string(),
        kernels: c.kernels,
        device_digest,
        build: c.build,
        origin: Origin::Loaded,
        build_time: start.elapsed(),
        source_bytes: image.bytes().len() as u64,
        binary: OnceLock::from(bytes),
        binary_lock: Mutex::new(()),
        binary_time: OnceLock::from(Duration::ZERO),
        built_from,
        _device: shared.clone(),
    })
}

/// An OpenCL error code with its name.
pub(crate) fn cl_text(e: ClError) -> String {
    format!("{} {}", e.0, opencl3::error_codes::error_text(e.0))
}

#[cfg(test)]
mod tests {
    use super::value_layout;

    #[test]
    fn value_layouts() {
        assert_eq!(value_layout("uint"), Some((4, 4)));
        assert_eq!(value_layout("const float"), Some((4, 4)));
        assert_eq!(value_layout("double"), Some((8, 8)));
        assert_eq!(value_layout("float4"), Some((16, 16)));
        assert_eq!(value_layout("float3"), Some((16, 16)));
        assert_eq!(value_layout("uchar2"), Some((2, 2)));
        assert_eq!(value_layout("half"), Some((2, 2)));
        assert_eq!(value_layout("float5"), None);
        assert_eq!(value_layout("struct params"), None);
        assert_eq!(value_layout("image2d_t"), None);
        assert_eq!(value_layout("size_t"), None);
    }
}
