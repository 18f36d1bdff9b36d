//! A kernel's interface as OpenCL reflects it: what a launch must pass, shared by programs built from
//! source and programs loaded from kpc's binary container (which records it, since a binary has no
//! argument info).

/// How a kernel parameter is passed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ParamKind {
    /// A `global` or `constant` pointer: one of the launch's buffers.
    Buffer {
        /// Declared `const` (or in the `constant` address space).
        read_only: bool,
    },
    /// A by-value scalar or vector: bytes of the launch's push constants.
    Scalar {
        /// Bytes.
        size: u32,
        /// Alignment in the push-constant bytes (its own size; 4 elements for a 3-vector).
        align: u32,
    },
    /// Something kpc cannot pass (a `local` pointer, an image, a struct by value): launching the
    /// kernel is an error that says why.
    Unsupported(String),
}

/// One kernel parameter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Param {
    /// Its name in the source.
    pub name: String,
    /// How it is passed.
    pub kind: ParamKind,
}

/// A kernel's interface, reflected with clGetKernelArgInfo and CL_KERNEL_COMPILE_WORK_GROUP_SIZE.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelMeta {
    /// The entry point name.
    pub name: String,
    /// Parameters in argument order.
    pub params: Vec<Param>,
    /// `reqd_work_group_size`, or zeros when the kernel does not declare one.
    pub reqd_local_size: [u32; 3],
}
