//! Reflection: what a launch needs to know about each compute entry point (bindings, push
//! constants, workgroup size) and the module's specialization constants, read with rspirv.

use std::collections::HashMap;

use rspirv::dr::{Instruction, Module, Operand};
use rspirv::spirv::{BuiltIn, Decoration, ExecutionMode, ExecutionModel, Op, StorageClass};

use super::{BindingInfo, DescriptorKind, EntryPointInfo, LocalDim, SpecConstantInfo, SpecType};

/// Indexes a parsed module for the queries reflection needs.
pub(super) struct Reflector<'m> {
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
    pub(super) fn new(module: &'m Module) -> Self {
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

    pub(super) fn spec_constants(&self) -> Vec<SpecConstantInfo> {
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

    pub(super) fn entry_points(&self, version: (u8, u8)) -> Result<Vec<EntryPointInfo>, String> {
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
            out.push(EntryPointInfo {
                name: name.clone(),
                local_size: self.local_size(func, builtin)?,
                bindings: merge_aliases(bindings)?,
                push_constant_bytes: u32::try_from(push_constant_bytes)
                    .map_err(|_| "push-constant block larger than 4 GiB".to_string())?,
            });
        }
        Ok(out)
    }
}

/// One binding per (set, binding), sorted by them. Engines declare several blocks on one binding to
/// view the same buffer as different types (`float[]` and `vec4[]`); they are one descriptor, so
/// they become one binding: written if any block writes, as large as the largest fixed part, named
/// after every named block (`A/A4`), or `binding N` where none has a name (`-O` strips names).
///
/// Errors: blocks on one binding that disagree on the descriptor type (a storage and a uniform
/// buffer), which no descriptor can satisfy.
pub(super) fn merge_aliases(mut bindings: Vec<BindingInfo>) -> Result<Vec<BindingInfo>, String> {
    bindings.sort_by_key(|b| (b.set, b.binding));
    let mut out: Vec<BindingInfo> = Vec::with_capacity(bindings.len());
    for b in bindings {
        match out.last_mut() {
            Some(m) if (m.set, m.binding) == (b.set, b.binding) => {
                if m.kind != b.kind {
                    return Err(format!(
                        "set {} binding {} is declared as {:?} and as {:?}; blocks sharing a \
                         binding must be the same kind of descriptor",
                        b.set, b.binding, m.kind, b.kind
                    ));
                }
                m.read_only &= b.read_only;
                m.min_bytes = m.min_bytes.max(b.min_bytes);
                if !b.name.is_empty() && !m.name.split('/').any(|n| n == b.name) {
                    if !m.name.is_empty() {
                        m.name.push('/');
                    }
                    m.name.push_str(&b.name);
                }
            }
            _ => out.push(b),
        }
    }
    for b in &mut out {
        if b.name.is_empty() {
            b.name = format!("binding {}", b.binding);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block(binding: u32, name: &str, read_only: bool, min_bytes: u64) -> BindingInfo {
        BindingInfo {
            set: 0,
            binding,
            kind: DescriptorKind::StorageBuffer,
            name: name.into(),
            read_only,
            min_bytes,
        }
    }

    #[test]
    fn aliases_merge_into_the_strictest_binding() {
        let merged = merge_aliases(vec![
            block(1, "", true, 0),
            block(0, "A4", true, 16),
            block(0, "A", true, 4),
            block(2, "W", true, 8),
            block(2, "W4", false, 0),
        ])
        .unwrap();
        assert_eq!(merged.len(), 3);
        assert_eq!((merged[0].name.as_str(), merged[0].min_bytes), ("A4/A", 16));
        assert!(merged[0].read_only);
        assert_eq!(merged[1].name, "binding 1");
        assert_eq!(
            (merged[2].name.as_str(), merged[2].read_only),
            ("W/W4", false)
        );
        assert_eq!(merged[2].min_bytes, 8);
        let mut uniform = block(0, "U", true, 16);
        uniform.kind = DescriptorKind::UniformBuffer;
        assert!(merge_aliases(vec![block(0, "S", false, 0), uniform]).is_err());
    }
}
