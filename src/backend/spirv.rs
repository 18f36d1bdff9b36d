//! SPIR-V device images: validation and optimization with spirv-tools, and reflection with rspirv.
//!
//! Every SPIR-V image is validated here before any driver sees it. What a launch needs to know about
//! a kernel (entry points, descriptor bindings, push-constant size, workgroup size and the
//! specialization constants that set it) is read from the module itself, never from hand-written
//! tables, so a kernel edited in kernels/ cannot disagree with its description.

use std::collections::HashMap;
use std::fmt;

use rspirv::dr::{Instruction, Module, Operand};
use rspirv::spirv::{BuiltIn, Decoration, ExecutionMode, ExecutionModel, Op, StorageClass};
use spirv_tools::TargetEnv;
use spirv_tools::opt::Optimizer;
use spirv_tools::val::Validator;

use crate::cache::{SpecConstants, SpecValue};
use crate::error::{Error, Result};

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

/// A descriptor binding an entry point uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BindingInfo {
    /// Descriptor set.
    pub set: u32,
    /// Binding number in the set.
    pub binding: u32,
    /// What it is.
    pub kind: DescriptorKind,
    /// Its block or variable name from debug info (may be empty).
    pub name: String,
    /// Whether every member is `NonWritable` (GLSL `readonly`).
    pub read_only: bool,
    /// Bytes of the block's fixed part: the least a bound buffer may have.
    pub min_bytes: u64,
}

/// A compute entry point and its interface.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EntryPointInfo {
    /// Its name: what a kernel is requested by.
    pub name: String,
    /// Workgroup size per dimension.
    pub local_size: [LocalDim; 3],
    /// Descriptor bindings it uses, sorted by (set, binding).
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
        Ok(SpirvModule {
            words,
            version,
            entry_points,
            spec_constants,
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
                    "specialization constant {id} ({}) of image {image:?} is {}, but {value:?} was given",
                    decl.name, decl.ty
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
/// OpExecutionMode, whose operands the loader decodes by the mode, as ids for LocalSizeId. The module
/// that is built keeps every word as it was.
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
        if op == OP_TYPE_COOPERATIVE_MATRIX_KHR || op == OP_EXECUTION_MODE_ID {
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

/// The Vulkan environment a module of this SPIR-V version is validated for: the oldest Vulkan that
/// accepts the version, so that validation is as strict as the version allows.
fn target_env(version: (u8, u8)) -> TargetEnv {
    match version {
        (1, 0..=3) => TargetEnv::Vulkan_1_1,
        (1, 4) => TargetEnv::Vulkan_1_1_Spirv_1_4,
        (1, 5) => TargetEnv::Vulkan_1_2,
        _ => TargetEnv::Vulkan_1_3,
    }
}

/// The Vulkan API version (major, minor) a device needs to accept a module of this SPIR-V version.
pub fn required_vulkan(version: (u8, u8)) -> (u32, u32) {
    match version {
        (1, 0) => (1, 0),
        (1, 1..=3) => (1, 1),
        (1, 4 | 5) => (1, 2),
        _ => (1, 3),
    }
}

/// Validates `words` with spirv-tools for the Vulkan environment its version implies.
///
/// Errors: [`Error::InvalidSpirv`] carrying the validator's message.
pub fn validate(image: &str, words: &[u32]) -> Result<()> {
    let env = target_env(version_of(words));
    let validator = spirv_tools::val::create(Some(env));
    validator
        .validate(words, None)
        .map_err(|e| invalid(image, e.to_string()))
}

/// Runs spirv-tools' performance passes over a validated module, keeping every binding and
/// specialization constant, and validates the result.
///
/// Errors: [`Error::Build`] when the optimizer fails or emits something invalid (an optimizer bug;
/// deterministic, so the runtime caches it).
pub fn optimize(image: &str, words: &[u32]) -> Result<Vec<u32>> {
    let env = target_env(version_of(words));
    let mut opt = spirv_tools::opt::create(Some(env));
    opt.register_performance_passes();
    let options = spirv_tools::opt::Options {
        preserve_bindings: true,
        preserve_spec_constants: true,
        ..Default::default()
    };
    let mut messages = Vec::new();
    let out = opt
        .optimize(
            words,
            &mut |m: spirv_tools::error::Message| messages.push(m.message),
            Some(options),
        )
        .map_err(|e| Error::Build {
            backend: crate::config::BackendKind::Vulkan,
            image: image.to_string(),
            code: -1,
            message: format!("spirv-tools optimizer failed: {e}"),
            log: messages.join("\n"),
        })?;
    let words = out.as_words().to_vec();
    validate(image, &words).map_err(|e| Error::Build {
        backend: crate::config::BackendKind::Vulkan,
        image: image.to_string(),
        code: -1,
        message: format!("the spirv-tools optimizer produced invalid SPIR-V: {e}"),
        log: messages.join("\n"),
    })?;
    Ok(words)
}

/// Indexes a parsed module for the queries reflection needs.
struct Reflector<'m> {
    module: &'m Module,
    defs: HashMap<u32, &'m Instruction>,
    names: HashMap<u32, &'m str>,
}

fn lit32(op: Option<&Operand>) -> Option<u32> {
    match op? {
        Operand::LiteralBit32(v) => Some(*v),
        _ => None,
    }
}

fn lit_bits(op: Option<&Operand>) -> Option<u64> {
    match op? {
        Operand::LiteralBit32(v) => Some(u64::from(*v)),
        Operand::LiteralBit64(v) => Some(*v),
        _ => None,
    }
}

fn id_ref(op: Option<&Operand>) -> Option<u32> {
    match op? {
        Operand::IdRef(v) => Some(*v),
        _ => None,
    }
}

impl<'m> Reflector<'m> {
    fn new(module: &'m Module) -> Self {
        let defs = module
            .types_global_values
            .iter()
            .filter_map(|i| i.result_id.map(|id| (id, i)))
            .collect();
        let names = module
            .debug_names
            .iter()
            .filter(|i| i.class.opcode == Op::Name)
            .filter_map(|i| match (id_ref(i.operands.first()), i.operands.get(1)) {
                (Some(id), Some(Operand::LiteralString(s))) => Some((id, s.as_str())),
                _ => None,
            })
            .collect();
        Reflector {
            module,
            defs,
            names,
        }
    }

    fn name(&self, id: u32) -> String {
        self.names.get(&id).copied().unwrap_or_default().to_string()
    }

    /// Operands after the decoration of every `OpDecorate id <decoration>`.
    fn decoration(&self, id: u32, decoration: Decoration) -> Option<&'m [Operand]> {
        self.module.annotations.iter().find_map(|i| {
            (i.class.opcode == Op::Decorate
                && id_ref(i.operands.first()) == Some(id)
                && i.operands.get(1) == Some(&Operand::Decoration(decoration)))
            .then(|| &i.operands[2..])
        })
    }

    fn member_decoration(
        &self,
        id: u32,
        member: u32,
        decoration: Decoration,
    ) -> Option<&'m [Operand]> {
        self.module.annotations.iter().find_map(|i| {
            (i.class.opcode == Op::MemberDecorate
                && id_ref(i.operands.first()) == Some(id)
                && lit32(i.operands.get(1)) == Some(member)
                && i.operands.get(2) == Some(&Operand::Decoration(decoration)))
            .then(|| &i.operands[3..])
        })
    }

    fn spec_constants(&self) -> Vec<SpecConstantInfo> {
        let mut out: Vec<SpecConstantInfo> = self
            .module
            .types_global_values
            .iter()
            .filter_map(|i| {
                let id = i.result_id?;
                let spec_id = lit32(self.decoration(id, Decoration::SpecId)?.first())?;
                let (ty, default_bits) = match i.class.opcode {
                    Op::SpecConstantTrue => (SpecType::Bool, 1),
                    Op::SpecConstantFalse => (SpecType::Bool, 0),
                    Op::SpecConstant => {
                        let ty = self.scalar_type(i.result_type?)?;
                        (ty, lit_bits(i.operands.first())?)
                    }
                    _ => return None,
                };
                Some(SpecConstantInfo {
                    id: spec_id,
                    name: self.name(id),
                    ty,
                    default_bits,
                })
            })
            .collect();
        out.sort_by_key(|c| c.id);
        out
    }

    fn scalar_type(&self, ty: u32) -> Option<SpecType> {
        let t = self.defs.get(&ty)?;
        match t.class.opcode {
            Op::TypeBool => Some(SpecType::Bool),
            Op::TypeInt => Some(SpecType::Int {
                width: lit32(t.operands.first())?,
                signed: lit32(t.operands.get(1))? != 0,
            }),
            Op::TypeFloat => Some(SpecType::Float {
                width: lit32(t.operands.first())?,
            }),
            _ => None,
        }
    }

    /// A 32-bit constant's default value and, for a specialization constant, its id.
    fn constant_dim(&self, id: u32) -> Result<LocalDim, String> {
        let c = self
            .defs
            .get(&id)
            .ok_or_else(|| format!("workgroup size refers to undefined id %{id}"))?;
        let default = lit32(c.operands.first())
            .ok_or_else(|| format!("workgroup size component %{id} is not a 32-bit constant"))?;
        let spec_id = match c.class.opcode {
            Op::Constant => None,
            Op::SpecConstant => self
                .decoration(id, Decoration::SpecId)
                .and_then(|ops| lit32(ops.first())),
            _ => {
                return Err(format!(
                    "workgroup size component %{id} is an {:?}, not a constant",
                    c.class.opcode
                ));
            }
        };
        Ok(LocalDim { default, spec_id })
    }

    /// The module-wide `WorkgroupSize` built-in, which overrides every LocalSize execution mode.
    fn workgroup_size_builtin(&self) -> Result<Option<[LocalDim; 3]>, String> {
        let Some(id) = self.module.annotations.iter().find_map(|i| {
            (i.class.opcode == Op::Decorate
                && i.operands.get(1) == Some(&Operand::Decoration(Decoration::BuiltIn))
                && i.operands.get(2) == Some(&Operand::BuiltIn(BuiltIn::WorkgroupSize)))
            .then(|| id_ref(i.operands.first()))
            .flatten()
        }) else {
            return Ok(None);
        };
        let c = self
            .defs
            .get(&id)
            .ok_or_else(|| "WorkgroupSize built-in is not a constant".to_string())?;
        let comps: Vec<u32> = c.operands.iter().filter_map(|o| id_ref(Some(o))).collect();
        if comps.len() != 3 {
            return Err("WorkgroupSize built-in is not a 3-component constant".into());
        }
        Ok(Some([
            self.constant_dim(comps[0])?,
            self.constant_dim(comps[1])?,
            self.constant_dim(comps[2])?,
        ]))
    }

    fn local_size(
        &self,
        entry_fn: u32,
        builtin: Option<[LocalDim; 3]>,
    ) -> Result<[LocalDim; 3], String> {
        if let Some(b) = builtin {
            return Ok(b);
        }
        for i in &self.module.execution_modes {
            if id_ref(i.operands.first()) != Some(entry_fn) {
                continue;
            }
            match i.operands.get(1) {
                Some(Operand::ExecutionMode(ExecutionMode::LocalSize)) => {
                    let v: Vec<u32> = i.operands[2..]
                        .iter()
                        .filter_map(|o| lit32(Some(o)))
                        .collect();
                    if v.len() == 3 {
                        return Ok([0, 1, 2].map(|k| LocalDim {
                            default: v[k],
                            spec_id: None,
                        }));
                    }
                }
                Some(Operand::ExecutionMode(ExecutionMode::LocalSizeId)) => {
                    let v: Vec<u32> = i.operands[2..]
                        .iter()
                        .filter_map(|o| id_ref(Some(o)))
                        .collect();
                    if v.len() == 3 {
                        return Ok([
                            self.constant_dim(v[0])?,
                            self.constant_dim(v[1])?,
                            self.constant_dim(v[2])?,
                        ]);
                    }
                }
                _ => {}
            }
        }
        Err(format!(
            "compute entry point %{entry_fn} declares no workgroup size"
        ))
    }

    /// The integer value of a constant (or a specialization constant's default): array lengths.
    fn constant_u64(&self, id: u32) -> Option<u64> {
        let c = self.defs.get(&id)?;
        matches!(c.class.opcode, Op::Constant | Op::SpecConstant)
            .then(|| lit_bits(c.operands.first()))
            .flatten()
    }

    /// Bytes a value of type `ty` occupies in a block; a runtime array counts as 0. `stride` is the
    /// MatrixStride of the member holding it, for matrices.
    fn type_bytes(&self, ty: u32, matrix_stride: Option<u32>, depth: u32) -> Result<u64, String> {
        if depth > 32 {
            return Err("type nesting too deep".into());
        }
        let t = self
            .defs
            .get(&ty)
            .ok_or_else(|| format!("undefined type %{ty}"))?;
        let bad = || format!("malformed type %{ty}");
        match t.class.opcode {
            Op::TypeInt | Op::TypeFloat => {
                Ok(u64::from(lit32(t.operands.first()).ok_or_else(bad)? / 8))
            }
            Op::TypeVector => {
                let comp = id_ref(t.operands.first()).ok_or_else(bad)?;
                let n = lit32(t.operands.get(1)).ok_or_else(bad)?;
                Ok(u64::from(n) * self.type_bytes(comp, None, depth + 1)?)
            }
            Op::TypeMatrix => {
                let col = id_ref(t.operands.first()).ok_or_else(bad)?;
                let n = lit32(t.operands.get(1)).ok_or_else(bad)?;
                let stride = match matrix_stride {
                    Some(s) => u64::from(s),
                    None => self.type_bytes(col, None, depth + 1)?,
                };
                Ok(u64::from(n) * stride)
            }
            Op::TypeArray => {
                let len_id = id_ref(t.operands.get(1)).ok_or_else(bad)?;
                let len = self
                    .constant_u64(len_id)
                    .ok_or_else(|| format!("array type %{ty} has a non-constant length"))?;
                let stride = match self.decoration(ty, Decoration::ArrayStride) {
                    Some(ops) => u64::from(lit32(ops.first()).ok_or_else(bad)?),
                    None => {
                        let elem = id_ref(t.operands.first()).ok_or_else(bad)?;
                        self.type_bytes(elem, matrix_stride, depth + 1)?
                    }
                };
                Ok(len * stride)
            }
            Op::TypeRuntimeArray => Ok(0),
            Op::TypeStruct => {
                let mut end = 0u64;
                for (m, op) in t.operands.iter().enumerate() {
                    let mty = id_ref(Some(op)).ok_or_else(bad)?;
                    let m = m as u32;
                    let offset = self
                        .member_decoration(ty, m, Decoration::Offset)
                        .and_then(|ops| lit32(ops.first()))
                        .unwrap_or(0);
                    let mstride = self
                        .member_decoration(ty, m, Decoration::MatrixStride)
                        .and_then(|ops| lit32(ops.first()));
                    end = end.max(u64::from(offset) + self.type_bytes(mty, mstride, depth + 1)?);
                }
                Ok(end)
            }
            op => Err(format!("type %{ty} ({op:?}) has no size in a block")),
        }
    }

    fn struct_read_only(&self, var: u32, ty: u32) -> bool {
        if self.decoration(var, Decoration::NonWritable).is_some() {
            return true;
        }
        let Some(t) = self.defs.get(&ty) else {
            return false;
        };
        t.class.opcode == Op::TypeStruct
            && (0..t.operands.len() as u32).all(|m| {
                self.member_decoration(ty, m, Decoration::NonWritable)
                    .is_some()
            })
    }

    /// Every global variable of the module with its storage class and pointee type.
    fn globals(&self) -> impl Iterator<Item = (u32, StorageClass, u32)> + '_ {
        self.module.types_global_values.iter().filter_map(|i| {
            if i.class.opcode != Op::Variable {
                return None;
            }
            let class = match i.operands.first()? {
                Operand::StorageClass(c) => *c,
                _ => return None,
            };
            let ptr = self.defs.get(&i.result_type?)?;
            let pointee = id_ref(ptr.operands.get(1))?;
            Some((i.result_id?, class, pointee))
        })
    }

    fn binding(
        &self,
        var: u32,
        class: StorageClass,
        pointee: u32,
    ) -> Result<Option<BindingInfo>, String> {
        let (Some(set), Some(binding)) = (
            self.decoration(var, Decoration::DescriptorSet)
                .and_then(|o| lit32(o.first())),
            self.decoration(var, Decoration::Binding)
                .and_then(|o| lit32(o.first())),
        ) else {
            return Ok(None);
        };
        let is_struct = self
            .defs
            .get(&pointee)
            .is_some_and(|t| t.class.opcode == Op::TypeStruct);
        let kind = match class {
            StorageClass::StorageBuffer if is_struct => DescriptorKind::StorageBuffer,
            StorageClass::Uniform if is_struct => {
                if self.decoration(pointee, Decoration::BufferBlock).is_some() {
                    DescriptorKind::StorageBuffer
                } else {
                    DescriptorKind::UniformBuffer
                }
            }
            other => DescriptorKind::Unsupported(format!("{other:?} variable")),
        };
        let min_bytes = match kind {
            DescriptorKind::Unsupported(_) => 0,
            _ => self.type_bytes(pointee, None, 0)?,
        };
        let mut name = self.name(var);
        if name.is_empty() {
            name = self.name(pointee);
        }
        Ok(Some(BindingInfo {
            set,
            binding,
            read_only: self.struct_read_only(var, pointee),
            kind,
            name,
            min_bytes,
        }))
    }

    fn entry_points(&self, version: (u8, u8)) -> Result<Vec<EntryPointInfo>, String> {
        let builtin = self.workgroup_size_builtin()?;
        let globals: Vec<(u32, StorageClass, u32)> = self.globals().collect();
        let mut out = Vec::new();
        for e in &self.module.entry_points {
            if e.operands.first() != Some(&Operand::ExecutionModel(ExecutionModel::GLCompute)) {
                continue;
            }
            let (Some(func), Some(Operand::LiteralString(name))) =
                (id_ref(e.operands.get(1)), e.operands.get(2))
            else {
                return Err("malformed OpEntryPoint".into());
            };
            // From SPIR-V 1.4 an entry point lists every global it uses, so bindings are exact per
            // entry point; before that only inputs and outputs are listed, and every binding of the
            // module is taken to belong to every entry point (glslang emits one per module).
            let interface: Option<Vec<u32>> = (version >= (1, 4)).then(|| {
                e.operands[3..]
                    .iter()
                    .filter_map(|o| id_ref(Some(o)))
                    .collect()
            });
            let uses = |var: u32| interface.as_ref().is_none_or(|ids| ids.contains(&var));
            let mut bindings = Vec::new();
            let mut push_constant_bytes = 0u64;
            for &(var, class, pointee) in globals.iter().filter(|(v, _, _)| uses(*v)) {
                if class == StorageClass::PushConstant {
                    push_constant_bytes =
                        push_constant_bytes.max(self.type_bytes(pointee, None, 0)?);
                } else if let Some(b) = self.binding(var, class, pointee)? {
                    bindings.push(b);
                }
            }
            bindings.sort_by_key(|b| (b.set, b.binding));
            out.push(EntryPointInfo {
                name: name.clone(),
                local_size: self.local_size(func, builtin)?,
                bindings,
                push_constant_bytes: u32::try_from(push_constant_bytes)
                    .map_err(|_| "push-constant block larger than 4 GiB".to_string())?,
            });
        }
        Ok(out)
    }
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
    fn environment_follows_version() {
        assert_eq!(required_vulkan((1, 3)), (1, 1));
        assert_eq!(required_vulkan((1, 5)), (1, 2));
        assert_eq!(required_vulkan((1, 6)), (1, 3));
    }
}
