//! The backend seam: the backend traits erased once, for every backend.
//!
//! After wgpu-hal's `dynamic/`: [`DynBackend`] and [`DynComputeBackend`] are object-safe mirrors of
//! [`Backend`] and [`ComputeBackend`](super::ComputeBackend), implemented generically (one blanket
//! impl each) for every type that implements the typed traits. Resources cross the seam type-erased
//! ([`DynProgram`], [`DynKernel`], [`AnyBuffer`], [`AnyEvent`]) and are downcast back to the
//! backend's own types inside the blanket impls; a resource of another backend is a typed error
//! there, never undefined behaviour.
//!
//! Everything above this seam is written once, without a backend type parameter: the runtime's
//! `ProgramManager` holds an `Arc<dyn DynBackend>`, and `Context` holds that manager and an
//! `Arc<dyn DynComputeBackend>` of the same device. So a feature touches two places:
//! - a backend capability: its method on the typed trait (implemented by each backend) and its
//!   mirror here (one generic forward for all backends), which `Context` then calls directly;
//! - a cache or runtime feature: `ProgramManager` and the `Context` method that exposes it.
//!
//! The hit path (`Context::kernel` served from memory) makes no call through the seam: the manager
//! keeps the device digest and backend kind it needs as plain fields.

mod compute;

pub use compute::{AnyBuffer, AnyEvent, DynComputeBackend, DynLaunch};

use std::any::Any;
use std::fmt;
use std::sync::Arc;

use super::{Backend, DeviceFingerprint, DeviceImage, KernelInfo, KernelObject, ProgramOrigin};
use crate::cache::{BuildOptions, CacheCost, Local, SpecConstants};
use crate::config::BackendKind;
use crate::error::{Error, Result};

/// The error for a resource that another backend (or another context's backend) made.
pub(crate) fn foreign(what: &str) -> Error {
    Error::InvalidArgument(format!(
        "{what} belongs to another context (or another backend)"
    ))
}

/// A built program of some backend, its type erased; the backend's own program is inside, shared
/// with the kernels made from it.
pub struct DynProgram {
    program: Arc<dyn ProgramAny>,
}

/// What the seam needs of a program: its cache weight, and itself for downcasting.
trait ProgramAny: CacheCost + Send + Sync + 'static {
    fn as_any(&self) -> &dyn Any;
    fn into_any(self: Arc<Self>) -> Arc<dyn Any + Send + Sync>;
}

impl<P: CacheCost + Send + Sync + 'static> ProgramAny for P {
    fn as_any(&self) -> &dyn Any {
        self
    }
    fn into_any(self: Arc<Self>) -> Arc<dyn Any + Send + Sync> {
        self
    }
}

impl DynProgram {
    /// Erases `program`.
    pub fn new<P: CacheCost + Send + Sync + 'static>(program: P) -> Self {
        DynProgram {
            program: Arc::new(program),
        }
    }

    /// The backend's program, when it is a `P`.
    pub fn downcast_ref<P: 'static>(&self) -> Option<&P> {
        self.program.as_any().downcast_ref::<P>()
    }

    /// The backend's program as the shared handle its kernels hold, when it is a `P`.
    fn downcast_arc<P: Send + Sync + 'static>(&self) -> Option<Arc<P>> {
        self.program.clone().into_any().downcast::<P>().ok()
    }

    /// Whether anything besides this handle holds the program (a kernel made from it, or a backend
    /// that kept a reference).
    pub fn is_shared(&self) -> bool {
        Arc::strong_count(&self.program) > 1
    }
}

impl CacheCost for DynProgram {
    fn cache_bytes(&self) -> u64 {
        self.program.cache_bytes()
    }
}

impl fmt::Debug for DynProgram {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DynProgram")
            .field("bytes", &self.cache_bytes())
            .finish()
    }
}

/// A kernel of some backend, its type erased: it describes itself ([`KernelObject`]) and is
/// recognized again by its backend at launch.
///
/// It holds the erased program it was made from, as the backends' kernels hold theirs: so the memory
/// cache, which counts the holders of each program it keeps, sees a program with a live kernel as
/// in use (never released by `KernelProgramCache::release_unused` or evicted).
pub struct DynKernel {
    // Field order is drop order: the kernel goes before its program.
    kernel: Box<dyn KernelObject>,
    _program: Arc<DynProgram>,
}

impl DynKernel {
    /// The backend's kernel, when it is a `K`.
    pub fn downcast_ref<K: 'static>(&self) -> Option<&K> {
        self.kernel.as_any().downcast_ref::<K>()
    }
}

impl fmt::Debug for DynKernel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DynKernel")
            .field("name", &self.kernel.info().name)
            .finish()
    }
}

impl KernelObject for DynKernel {
    fn info(&self) -> &KernelInfo {
        self.kernel.info()
    }
    fn as_any(&self) -> &dyn Any {
        self.kernel.as_any()
    }
    fn origin(&self) -> Option<&ProgramOrigin> {
        self.kernel.origin()
    }
    fn program_binary(&self) -> Result<Option<Vec<u8>>> {
        self.kernel.program_binary()
    }
}

/// A thread's own handle is the kernel to everything downstream: launches and interop recover the
/// backend's type through `as_any`, which answers for the kernel inside.
impl<K: KernelObject> KernelObject for Local<K> {
    fn info(&self) -> &KernelInfo {
        (**self).info()
    }
    fn as_any(&self) -> &dyn Any {
        (**self).as_any()
    }
    fn origin(&self) -> Option<&ProgramOrigin> {
        (**self).origin()
    }
    fn program_binary(&self) -> Result<Option<Vec<u8>>> {
        (**self).program_binary()
    }
}

/// [`Backend`], object safe: what the runtime's program manager drives. Implemented for every
/// [`Backend`]; see [`Backend`] for what each method guarantees.
pub trait DynBackend: Send + Sync + 'static {
    /// As [`Backend::kind`].
    fn kind(&self) -> BackendKind;
    /// As [`Backend::fingerprint`].
    fn fingerprint(&self) -> &DeviceFingerprint;
    /// As [`Backend::build_program`].
    fn build_program(
        &self,
        image: &DeviceImage,
        spec: &SpecConstants,
        options: &BuildOptions,
    ) -> Result<DynProgram>;
    /// As [`Backend::program_binary`].
    ///
    /// Errors: [`Error::InvalidArgument`] for a program of another backend.
    fn program_binary(&self, program: &DynProgram) -> Result<Option<Vec<u8>>>;
    /// As [`Backend::program_from_binary`].
    fn program_from_binary(
        &self,
        image: &DeviceImage,
        spec: &SpecConstants,
        options: &BuildOptions,
        binary: &[u8],
    ) -> Result<DynProgram>;
    /// As [`Backend::load_avoided_compile`] (`None` for a program of another backend).
    fn load_avoided_compile(&self, program: &DynProgram) -> Option<bool>;
    /// As [`Backend::create_kernel`].
    ///
    /// Errors: [`Error::InvalidArgument`] for a program of another backend.
    fn create_kernel(&self, program: &Arc<DynProgram>, entry: &str) -> Result<DynKernel>;
    /// The backend itself, for callers that know its type.
    fn as_any(&self) -> &dyn Any;
}

impl<B: Backend> DynBackend for B {
    fn kind(&self) -> BackendKind {
        Backend::kind(self)
    }
    fn fingerprint(&self) -> &DeviceFingerprint {
        Backend::fingerprint(self)
    }
    fn build_program(
        &self,
        image: &DeviceImage,
        spec: &SpecConstants,
        options: &BuildOptions,
    ) -> Result<DynProgram> {
        Backend::build_program(self, image, spec, options).map(DynProgram::new)
    }
    fn program_binary(&self, program: &DynProgram) -> Result<Option<Vec<u8>>> {
        let p = program
            .downcast_ref::<B::Program>()
            .ok_or_else(|| foreign("a program"))?;
        Backend::program_binary(self, p)
    }
    fn program_from_binary(
        &self,
        image: &DeviceImage,
        spec: &SpecConstants,
        options: &BuildOptions,
        binary: &[u8],
    ) -> Result<DynProgram> {
        Backend::program_from_binary(self, image, spec, options, binary).map(DynProgram::new)
    }
    fn load_avoided_compile(&self, program: &DynProgram) -> Option<bool> {
        Backend::load_avoided_compile(self, program.downcast_ref::<B::Program>()?)
    }
    fn create_kernel(&self, program: &Arc<DynProgram>, entry: &str) -> Result<DynKernel> {
        let p = program
            .downcast_arc::<B::Program>()
            .ok_or_else(|| foreign("a program"))?;
        let kernel = Backend::create_kernel(self, &p, entry)?;
        Ok(DynKernel {
            kernel: Box::new(kernel),
            _program: program.clone(),
        })
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}
