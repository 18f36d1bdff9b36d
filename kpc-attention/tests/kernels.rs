//! The attention kernels this crate ships: fresh against their GLSL, valid, reflected correctly,
//! and each OpenCL C image the twin of its SPIR-V one.

use std::path::Path;

use kpc_attention::kernels::{OPENCL, SPIRV, spirv_image};

use crate::common::drivers::opencl_context;

/// SPIR-V 1.6 with cooperative matrices: its workgroup size comes from OpExecutionModeId
/// (LocalSizeId) on specialization constants, and its matrix types must not stop reflection.
#[test]
fn coopmat_projection_has_the_tiled_projections_interface() {
    // mha_gemm_coop stands in for mha_gemm where it fits: the host launches either with the same
    // buffers and push constants, so their reflected interfaces must agree.
    let coop = spirv_image("mha_gemm_coop").unwrap();
    let m = coop.spirv_module().unwrap();
    assert_eq!(m.version, (1, 6));
    let c = m.entry("mha_gemm_coop", "mha_gemm_coop").unwrap();
    let tiled = spirv_image("mha_gemm").unwrap();
    let tm = tiled.spirv_module().unwrap();
    let t = tm.entry("mha_gemm", "mha_gemm").unwrap();
    assert_eq!(c.local_size[0].default, 256);
    assert_eq!(c.push_constant_bytes, t.push_constant_bytes);
    assert_eq!(c.push_constant_bytes, 36);
    assert_eq!(c.bindings.len(), 6);
    assert_eq!(c.bindings.len(), t.bindings.len());
    for (a, b) in c.bindings.iter().zip(&t.bindings) {
        assert_eq!(
            (a.set, a.binding, a.read_only),
            (b.set, b.binding, b.read_only)
        );
    }
    assert!(c.bindings[..3].iter().all(|b| b.read_only) && !c.bindings[3].read_only);
}

#[test]
fn coopmat_prefill_is_reflected_from_its_spirv() {
    let image = spirv_image("attn_prefill_coop").unwrap();
    let m = image.spirv_module().unwrap();
    assert_eq!(m.version, (1, 6));
    let e = m.entry("attn_prefill_coop", "attn_prefill_coop").unwrap();
    assert_eq!(
        (e.local_size[0].default, e.local_size[0].spec_id),
        (128, Some(0))
    );
    assert_eq!(e.local_size[1].default, 1);
    assert_eq!(e.push_constant_bytes, 24);
    assert_eq!(e.bindings.len(), 4);
    assert!(e.bindings[..3].iter().all(|b| b.read_only) && !e.bindings[3].read_only);
    let ids: Vec<u32> = m.spec_constants.iter().map(|c| c.id).collect();
    for id in [0, 3, 4] {
        assert!(ids.contains(&id), "spec constant {id} missing from {ids:?}");
    }
    // The layout probe: one subgroup, one output buffer, no push constants.
    let probe = spirv_image("coop_layout").unwrap();
    let m = probe.spirv_module().unwrap();
    let e = m.entry("coop_layout", "coop_layout").unwrap();
    assert_eq!(e.local_size[0].default, 32);
    assert_eq!(e.push_constant_bytes, 0);
    assert_eq!(e.bindings.len(), 1);
    assert!(!e.bindings[0].read_only);
}

/// The VK_NV_cooperative_matrix2 prefill passes validation and is reflected although the SPIR-V
/// parser's grammar predates its instructions: the prefills' interface, its tile's spec constants,
/// and the NV capabilities it needs (read from the words) for the device check.
#[test]
fn cm2_prefill_is_reflected_from_its_spirv() {
    let image = spirv_image("attn_prefill_cm2").unwrap();
    let m = image.spirv_module().unwrap();
    assert_eq!(m.version, (1, 6));
    let e = m.entry("attn_prefill_cm2", "attn_prefill_cm2").unwrap();
    assert_eq!(
        (e.local_size[0].default, e.local_size[0].spec_id),
        (256, Some(0))
    );
    assert_eq!(e.push_constant_bytes, 24);
    assert_eq!(e.bindings.len(), 4);
    assert!(e.bindings[..3].iter().all(|b| b.read_only) && !e.bindings[3].read_only);
    let ids: Vec<u32> = m.spec_constants.iter().map(|c| c.id).collect();
    for id in [0, 3, 4, 5] {
        assert!(ids.contains(&id), "spec constant {id} missing from {ids:?}");
    }
    // Reductions, conversions, per-element operations, tensor addressing (SPIR-V registry values).
    for cap in [5430, 5431, 5432, 5439] {
        assert!(
            m.needs.newer_capabilities.contains(&cap),
            "capability {cap} missing from {:?}",
            m.needs.newer_capabilities
        );
    }
    assert!(
        m.needs
            .extensions
            .iter()
            .any(|x| x == "SPV_NV_cooperative_matrix2"),
        "{:?}",
        m.needs.extensions
    );
}

/// Every kernels/*.comp of this crate has a committed .spv that glslangValidator still produces
/// from it (the cooperative-matrix ones by their recorded source digest), and every one is embedded.
#[test]
fn committed_attention_spirv_is_fresh() {
    crate::common::shipped::committed_spirv_is_fresh(
        Path::new(env!("CARGO_MANIFEST_DIR")),
        SPIRV,
        "committed_attention_spirv_is_fresh",
    );
}

#[test]
fn both_backends_ship_the_same_attention_kernels() {
    let Some(ctx) = opencl_context("both_backends_ship_the_same_attention_kernels") else {
        return;
    };
    crate::common::shipped::both_backends_agree(&ctx, OPENCL, SPIRV);
}
