//! What a module asks of the device beyond core compute: its `OpCapability` and `OpExtension`
//! declarations, and whether its subgroup operations work on 8-, 16- or 64-bit types (which needs
//! `shaderSubgroupExtendedTypes` without any capability saying so). The backend checks them against
//! what the device enabled before the driver sees the module.

use std::collections::HashMap;

use rspirv::dr::{Module, Operand};
use rspirv::spirv::{Capability, Op};

/// What a SPIR-V module needs from the device.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ModuleNeeds {
    /// Every `OpCapability`, in declaration order.
    pub capabilities: Vec<Capability>,
    /// Every `OpExtension` name, in declaration order.
    pub extensions: Vec<String>,
    /// Whether a group (subgroup) operation takes or returns 8-, 16- or 64-bit integers or 16-bit
    /// floats, scalar or vector (Vulkan: `shaderSubgroupExtendedTypes`, VUID-RuntimeSpirv-None-06275).
    pub subgroup_extended_types: bool,
    /// Every `OpCapability` newer than the SPIR-V grammar kpc parses with (SDK 1.3.268), by number,
    /// in declaration order: for example SPV_NV_cooperative_matrix2's `CooperativeMatrixReductionsNV`
    /// (5430). `capabilities` does not list them.
    pub newer_capabilities: Vec<u32>,
}

/// The capability that `inst` (one instruction's words) declares, if it is an `OpCapability` whose
/// value the parser's grammar does not know.
pub(super) fn newer_capability(inst: &[u32]) -> Option<u32> {
    const OP_CAPABILITY: u32 = 17;
    match inst {
        [head, cap] if head & 0xffff == OP_CAPABILITY && Capability::from_u32(*cap).is_none() => {
            Some(*cap)
        }
        _ => None,
    }
}

/// Every capability [`newer_capability`] finds in `words` (a whole module, header included).
pub(super) fn newer_capabilities(words: &[u32]) -> Vec<u32> {
    let mut out = Vec::new();
    let mut at = 5;
    while at < words.len() {
        let count = (words[at] >> 16) as usize;
        if count == 0 || at + count > words.len() {
            break;
        }
        out.extend(newer_capability(&words[at..at + count]));
        at += count;
    }
    out
}

/// Whether `op` is one of the `OpGroupNonUniform*` instructions (SPIR-V 1.3's subgroup operations,
/// 333..=366, and the later rotate).
fn is_group_non_uniform(op: Op) -> bool {
    (Op::GroupNonUniformElect as u32..=Op::GroupNonUniformQuadSwap as u32).contains(&(op as u32))
        || op == Op::GroupNonUniformRotateKHR
}

impl ModuleNeeds {
    /// Reads them from a parsed module.
    pub(super) fn of(module: &Module) -> ModuleNeeds {
        let capabilities = module
            .capabilities
            .iter()
            .filter_map(|i| match i.operands.first() {
                Some(Operand::Capability(c)) => Some(*c),
                _ => None,
            })
            .collect();
        let extensions = module
            .extensions
            .iter()
            .filter_map(|i| match i.operands.first() {
                Some(Operand::LiteralString(s)) => Some(s.clone()),
                _ => None,
            })
            .collect();
        ModuleNeeds {
            capabilities,
            extensions,
            subgroup_extended_types: uses_subgroup_extended_types(module),
            newer_capabilities: Vec::new(),
        }
    }
}

/// Whether a group operation's result or any of its value operands has an extended type.
fn uses_subgroup_extended_types(module: &Module) -> bool {
    // Types whose scalar (or vector component) is an extended one.
    let mut extended: HashMap<u32, bool> = HashMap::new();
    for t in &module.types_global_values {
        let Some(id) = t.result_id else { continue };
        let width = |i: usize| match t.operands.get(i) {
            Some(Operand::LiteralBit32(w)) => Some(*w),
            _ => None,
        };
        let ext = match t.class.opcode {
            Op::TypeInt => matches!(width(0), Some(8 | 16 | 64)),
            Op::TypeFloat => width(0) == Some(16),
            Op::TypeVector => match t.operands.first() {
                Some(Operand::IdRef(c)) => extended.get(c).copied().unwrap_or(false),
                _ => false,
            },
            _ => continue,
        };
        extended.insert(id, ext);
    }
    if !extended.values().any(|e| *e) {
        return false;
    }
    // The type of every value: constants and variables' pointers do not matter here; what a group
    // operation takes is a result of another instruction (or a constant) with a result type.
    let mut type_of: HashMap<u32, u32> = HashMap::new();
    let globals = module.types_global_values.iter();
    let body = module
        .functions
        .iter()
        .flat_map(|f| f.blocks.iter())
        .flat_map(|b| b.instructions.iter());
    for i in globals.chain(body.clone()) {
        if let (Some(id), Some(ty)) = (i.result_id, i.result_type) {
            type_of.insert(id, ty);
        }
    }
    let is_ext = |ty: Option<u32>| ty.is_some_and(|t| extended.get(&t).copied().unwrap_or(false));
    body.filter(|i| is_group_non_uniform(i.class.opcode))
        .any(|i| {
            is_ext(i.result_type)
                || i.operands.iter().any(|o| match o {
                    Operand::IdRef(v) => is_ext(type_of.get(v).copied()),
                    _ => false,
                })
        })
}
