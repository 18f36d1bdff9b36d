//! SPIR-V device images: validation and optimization with spirv-tools, and reflection with rspirv.
//!
//! Every SPIR-V image is validated here before any driver sees it. What a launch needs to know about
//! a kernel (entry points, descriptor bindings, push-constant size, workgroup size and the
//! specialization constants that set it) is read from the module itself, never from hand-written
//! tables, so a kernel edited in kernels/ cannot disagree with its description.

use std::fmt;

use crate::cache::{SpecConstants, SpecValue};
use crate::error::{Error, Result};

mod capabilities;
mod reflect;
mod validate;

pub use capabilities::ModuleNeeds;
use reflect::Reflector;
pub use validate::{optimize, required_vulkan, validate};

const SPIRV_MAGIC: u32 = 0x0723_0203;

/// The type of a specialization constant, as the module declares it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpecType {
    /// `bool` (passed to Vulkan as a 32-bit VkBool32).
    Bool,
    /// An integer of `width` bits.
    Int {
        /// Bits: 8, 16, 32 or 64.
        width: u32,
        /// Whether it is signed.
        signed: bool,
    },
    /// A float of `width` bits.
    Float {
        /// Bits: 16, 32 or 64.
        width: u32,
    },
}

impl SpecType {
    /// Bytes of its specialization data entry.
    pub fn data_bytes(self) -> usize {
        match self {
            SpecType::Bool => 4,
            SpecType::Int { width, .. } | SpecType::Float { width } => width as usize / 8,
        }
    }
}

impl fmt::Display for SpecType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SpecType::Bool => f.write_str("bool"),
            SpecType::Int {
                width,
                signed: true,
            } => write!(f, "i{width}"),
            SpecType::Int {
                width,
                signed: false,
            } => write!(f, "u{width}"),
            SpecType::Float { width } => write!(f, "f{width}"),
        }
    }
}

/// A specialization constant the module declares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpecConstantInfo {
    /// Its `SpecId`: the id a `SpecConstants` set uses.
    pub id: u32,
    /// Its name in the module's debug info (may be empty).
    pub name: String,
    /// Its type.
    pub ty: SpecType,
    /// Its default value's bits (zero-extended).
    pub default_bits: u64,
}

/// One dimension of a workgroup size: a literal, or a specialization constant with a default.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct LocalDim {
    /// The value when not specialized.
    pub default: u32,
    /// The specialization constant that overrides it, if any.
    pub spec_id: Option<u32>,
}

/// What kind of descriptor a binding is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DescriptorKind {
    /// A storage buffer (`buffer` block).
    StorageBuffer,
    /// A uniform buffer (`uniform` block).
    UniformBuffer,
    /// Anything else (images, samplers, arrays of descriptors): kpc cannot bind it; building fails.
    Unsupported(String),
}

/// A descriptor binding an entry point uses: one per (set, binding), however many blocks the module
/// declares on it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BindingInfo {
    /// Descriptor set.
    pub set: u32,
    /// Binding number in the set.
    pub binding: u32,
    /// What it is.
    pub kind: DescriptorKind,
    /// Its block or variable name from debug info; the names of every block declared on the
    /// binding joined by `/`; `binding N` where the module names none (stripped by an optimizer).
    pub name: String,
    /// Whether every block on the binding has every member `NonWritable` (GLSL `readonly`).
    pub read_only: bool,
    /// Bytes of the largest fixed part of the blocks on the binding: the least a bound buffer may
    /// have.
    pub min_bytes: u64,
}

/// A compute entry point and its interface.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EntryPointInfo {
    /// Its name: what a kernel is requested by.
    pub name: String,
    /// Workgroup size per dimension.
    pub local_size: [LocalDim; 3],
    /// Descriptor bindings it uses, sorted by (set, binding), each binding once.
    pub bindings: Vec<BindingInfo>,
    /// Bytes of its push-constant block (0 when it has none).
    pub push_constant_bytes: u32,
}

impl EntryPointInfo {
    /// The workgroup size once `spec` is applied.
    pub fn local_size_with(&self, spec: &SpecConstants) -> [u32; 3] {
        self.local_size.map(|d| {
            d.spec_id
                .and_then(|id| spec.iter().find(|(i, _)| *i == id))
                .map_or(d.default, |(_, v)| match *v {
                    SpecValue::Bool(b) => b as u32,
                    SpecValue::I32(v) => v as u32,
                    SpecValue::U32(v) | SpecValue::F32Bits(v) => v,
                    SpecValue::I64(v) => v as u32,
                    SpecValue::U64(v) | SpecValue::F64Bits(v) => v as u32,
                })
        })
    }
}

/// Specialization data as Vulkan takes it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Specialization {
    /// Per constant: (constant id, byte offset into `data`, byte size).
    pub entries: Vec<(u32, u32, usize)>,
    /// The constants' values, little endian, back to back.
    pub data: Vec<u8>,
}

/// A validated SPIR-V module and what reflection found in it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpirvModule {
    /// The module's words (host byte order), validated.
    pub words: Vec<u32>,
    /// SPIR-V version (major, minor).
    pub version: (u8, u8),
    /// Compute entry points, in declaration order.
    pub entry_points: Vec<EntryPointInfo>,
    /// Specialization constants, sorted by id.
    pub spec_constants: Vec<SpecConstantInfo>,
    /// The capabilities and extensions it declares, and what its subgroup operations need.
    pub needs: ModuleNeeds,
}

impl SpirvModule {
    /// Validates `bytes` as a SPIR-V module for Vulkan and reflects its interface.
    ///
    /// Errors: [`Error::InvalidSpirv`] with the validator's (or the parser's) message.
    pub fn parse(image: &str, bytes: &[u8]) -> Result<SpirvModule> {
        let words = words_from_bytes(image, bytes)?;
        validate(image, &words)?;
        SpirvModule::reflect_words(image, words)
    }

    /// Reflects `bytes` without validating them: only for bytes whose validity is already known (an
    /// image whose digest a persisted binary vouches for, see `VulkanBackend::program_from_binary`).
    ///
    /// Errors: [`Error::InvalidSpirv`] when the bytes do not even parse.
    pub fn reflect(image: &str, bytes: &[u8]) -> Result<SpirvModule> {
        SpirvModule::reflect_words(image, words_from_bytes(image, bytes)?)
    }

    fn reflect_words(image: &str, words: Vec<u32>) -> Result<SpirvModule> {
        let version = version_of(&words);
        let module = rspirv::dr::load_words(for_rspirv(&words).as_ref())
            .map_err(|e| invalid(image, e.to_string()))?;
        let r = Reflector::new(&module);
        let spec_constants = r.spec_constants();
        let entry_points = r.entry_points(version).map_err(|m| invalid(image, m))?;
        let mut needs = ModuleNeeds::of(&module);
        needs.newer_capabilities = capabilities::newer_capabilities(&words);
        Ok(SpirvModule {
            words,
            version,
            entry_points,
            spec_constants,
            needs,
        })
    }

    /// The entry point `name`, or [`Error::UnknownKernel`] listing the ones there are.
    pub fn entry(&self, image: &str, name: &str) -> Result<&EntryPointInfo> {
        self.entry_points
            .iter()
            .find(|e| e.name == name)
            .ok_or_else(|| Error::UnknownKernel {
                image: image.to_string(),
                entry: name.to_string(),
                available: self.entry_names(),
            })
    }

    /// The entry point names, comma separated.
    pub fn entry_names(&self) -> String {
        if self.entry_points.is_empty() {
            return "no compute entry points".into();
        }
        self.entry_points
            .iter()
            .map(|e| e.name.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// The Vulkan specialization data for `spec`.
    ///
    /// Errors: [`Error::InvalidArgument`] for an id the module does not declare or a value whose type
    /// does not fit the declared one (integers may be passed signed or unsigned).
    pub fn specialization(&self, image: &str, spec: &SpecConstants) -> Result<Specialization> {
        let mut entries = Vec::new();
        let mut data = Vec::new();
        for (id, value) in spec.iter() {
            let Some(decl) = self.spec_constants.iter().find(|c| c.id == *id) else {
                return Err(Error::InvalidArgument(format!(
                    "specialization constant {id} is not declared in image {image:?}; it declares: {}",
                    self.describe_spec_constants()
                )));
            };
            let fits = matches!(
                (decl.ty, value),
                (SpecType::Bool, SpecValue::Bool(_))
                    | (
                        SpecType::Int { width: 32, .. },
                        SpecValue::I32(_) | SpecValue::U32(_)
                    )
                    | (
                        SpecType::Int { width: 64, .. },
                        SpecValue::I64(_) | SpecValue::U64(_)
                    )
                    | (SpecType::Float { width: 32 }, SpecValue::F32Bits(_))
                    | (SpecType::Float { width: 64 }, SpecValue::F64Bits(_))
            );
            if !fits {
                return Err(Error::InvalidArgument(format!(
                    "specialization constant {id} ({}) of image {image:?} is {}, but {value} was \
                     given; pass a {} value (integers may be signed or unsigned)",
                    decl.name, decl.ty, decl.ty
                )));
            }
            let bytes = value.to_le_bytes();
            entries.push((*id, data.len() as u32, bytes.len()));
            data.extend_from_slice(&bytes);
        }
        Ok(Specialization { entries, data })
    }

    fn describe_spec_constants(&self) -> String {
        if self.spec_constants.is_empty() {
            return "none".into();
        }
        self.spec_constants
            .iter()
            .map(|c| format!("{} {} {}", c.id, c.name, c.ty))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

fn invalid(image: &str, message: impl Into<String>) -> Error {
    Error::InvalidSpirv {
        image: image.to_string(),
        message: message.into(),
    }
}

/// The words of a SPIR-V module stored as bytes, in host order. Accepts either byte order, as the
/// SPIR-V specification does, by looking at the magic number.
pub fn words_from_bytes(image: &str, bytes: &[u8]) -> Result<Vec<u32>> {
    if bytes.len() % 4 != 0 || bytes.len() < 20 {
        return Err(invalid(
            image,
            format!(
                "{} bytes is not a SPIR-V module (a whole number of 32-bit words, at least the 5-word header)",
                bytes.len()
            ),
        ));
    }
    let le: Vec<u32> = bytes
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    if le[0] == SPIRV_MAGIC {
        Ok(le)
    } else if le[0].swap_bytes() == SPIRV_MAGIC {
        Ok(le.into_iter().map(u32::swap_bytes).collect())
    } else {
        Err(invalid(
            image,
            format!(
                "bad magic number {:#010x} (SPIR-V's is {SPIRV_MAGIC:#010x})",
                le[0]
            ),
        ))
    }
}

/// `words` as rspirv 0.12's loader can take them. Its loader places neither
/// OpTypeCooperativeMatrixKHR (it does not class it as a type) nor OpExecutionModeId (SPIR-V 1.2+,
/// how glslang declares a specialized workgroup size in SPIR-V 1.6) and rejects both. Reflection
/// never needs the matrix types (they are not interface types, and what refers to them keeps its
/// ids, which the loader does not resolve), so they are dropped; OpExecutionModeId is read as
/// OpExecutionMode, whose operands the loader decodes by the mode, as ids for LocalSizeId. Nor does it
/// know instructions or capabilities newer than its grammar (SDK 1.3.268), such as
/// SPV_NV_cooperative_matrix2's and SPV_NV_tensor_addressing's: those are dropped too (reflection
/// needs none of them; their capabilities are read from the words, see
/// [`ModuleNeeds::newer_capabilities`]). The module that is built keeps every word as it was.
fn for_rspirv(words: &[u32]) -> std::borrow::Cow<'_, [u32]> {
    const OP_EXECUTION_MODE: u32 = 16;
    const OP_EXECUTION_MODE_ID: u32 = 331;
    const OP_TYPE_COOPERATIVE_MATRIX_KHR: u32 = 4456;
    let mut at = 5;
    let mut out: Option<Vec<u32>> = None;
    while at < words.len() {
        let count = (words[at] >> 16) as usize;
        if count == 0 || at + count > words.len() {
            // Malformed: let the loader report it on the untouched words.
            return std::borrow::Cow::Borrowed(words);
        }
        let op = words[at] & 0xffff;
        let newer = rspirv::spirv::Op::from_u32(op).is_none()
            || capabilities::newer_capability(&words[at..at + count]).is_some();
        if newer || op == OP_TYPE_COOPERATIVE_MATRIX_KHR || op == OP_EXECUTION_MODE_ID {
            let o = out.get_or_insert_with(|| words[..at].to_vec());
            if op == OP_EXECUTION_MODE_ID {
                o.push((words[at] & 0xffff_0000) | OP_EXECUTION_MODE);
                o.extend_from_slice(&words[at + 1..at + count]);
            }
        } else if let Some(o) = out.as_mut() {
            o.extend_from_slice(&words[at..at + count]);
        }
        at += count;
    }
    match out {
        Some(o) => std::borrow::Cow::Owned(o),
        None => std::borrow::Cow::Borrowed(words),
    }
}

fn version_of(words: &[u32]) -> (u8, u8) {
    (
        ((words[1] >> 16) & 0xff) as u8,
        ((words[1] >> 8) & 0xff) as u8,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_non_spirv_bytes() {
        for bytes in [&b""[..], &[1, 2, 3][..], &[0u8; 24][..]] {
            assert!(matches!(
                SpirvModule::parse("junk", bytes),
                Err(Error::InvalidSpirv { .. })
            ));
        }
    }

    #[test]
    fn messages_speak_the_users_terms() {
        // saxpy declares spec constant 1 (BIAS) as i32: an f32 is refused in words, not bits.
        let saxpy = include_bytes!("../../../kernels/saxpy.spv");
        let m = SpirvModule::parse("saxpy", saxpy).unwrap();
        let e = m
            .specialization("saxpy", &SpecConstants::new().with(1, SpecValue::f32(1.0)))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("is i32, but f32 1 was given") && !e.contains("Bits"),
            "{e}"
        );
        // The other backend's image says which functions make the right one.
        let cl = crate::backend::DeviceImage::new(
            "saxpy",
            crate::backend::ImageFormat::OpenClC,
            b"kernel void saxpy() {}".to_vec(),
        );
        let e = cl.spirv_reflection().unwrap_err().to_string();
        assert!(
            e.contains("holds OpenCL C source, not SPIR-V")
                && e.contains("kpc::kernels::spirv_image"),
            "{e}"
        );
        assert!(!e.contains("OpenClC,") && !e.contains("OpenClC "), "{e}");
    }

    #[test]
    fn environment_follows_version() {
        assert_eq!(required_vulkan((1, 3)), (1, 1));
        assert_eq!(required_vulkan((1, 5)), (1, 2));
        assert_eq!(required_vulkan((1, 6)), (1, 3));
    }
}
