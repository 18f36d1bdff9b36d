//! The shipped SPIR-V: fresh against its GLSL, valid, and reflected correctly. Needs no driver.

mod common;

use std::path::Path;
use std::process::Command;

use kpc::Error;
use kpc::backend::DeviceImage;
use kpc::backend::spirv::{DescriptorKind, LocalDim, SpecType};
use kpc::kernels::{SPIRV, spirv_image};

#[test]
fn saxpy_is_reflected_from_its_spirv() {
    let image = spirv_image("saxpy").unwrap();
    let m = image.spirv_module().unwrap();
    assert_eq!(m.version, (1, 3));
    assert_eq!(m.entry_points.len(), 1);
    let e = &m.entry_points[0];
    assert_eq!(e.name, "saxpy");
    assert_eq!(
        e.local_size[0],
        LocalDim {
            default: 64,
            spec_id: Some(0)
        }
    );
    assert_eq!(
        e.local_size[1],
        LocalDim {
            default: 1,
            spec_id: None
        }
    );
    assert_eq!(e.push_constant_bytes, 8);
    let b: Vec<(u32, bool, &DescriptorKind)> = e
        .bindings
        .iter()
        .map(|b| (b.binding, b.read_only, &b.kind))
        .collect();
    assert_eq!(
        b,
        [
            (0, true, &DescriptorKind::StorageBuffer),
            (1, true, &DescriptorKind::StorageBuffer),
            (2, false, &DescriptorKind::StorageBuffer)
        ]
    );
    assert!(e.bindings.iter().all(|b| b.set == 0 && b.min_bytes == 0));
    let spec: Vec<(u32, SpecType, u64)> = m
        .spec_constants
        .iter()
        .map(|c| (c.id, c.ty, c.default_bits))
        .collect();
    assert_eq!(
        spec,
        [
            (
                0,
                SpecType::Int {
                    width: 32,
                    signed: false
                },
                64
            ),
            (
                1,
                SpecType::Int {
                    width: 32,
                    signed: true
                },
                0
            )
        ]
    );
    assert_eq!(m.spec_constants[1].name, "BIAS");
}

#[test]
fn copy_is_reflected_from_its_spirv() {
    let image = spirv_image("copy").unwrap();
    let m = image.spirv_module().unwrap();
    let e = m.entry("copy", "copy").unwrap();
    assert_eq!(
        e.local_size[0],
        LocalDim {
            default: 256,
            spec_id: Some(0)
        }
    );
    assert_eq!(e.push_constant_bytes, 4);
    assert_eq!(e.bindings.len(), 2);
    assert!(e.bindings[0].read_only && !e.bindings[1].read_only);
    let err = m.entry("copy", "main").unwrap_err();
    assert!(matches!(err, Error::UnknownKernel { .. }), "{err}");
}

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
        e.local_size[0],
        LocalDim {
            default: 128,
            spec_id: Some(0)
        }
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
        e.local_size[0],
        LocalDim {
            default: 256,
            spec_id: Some(0)
        }
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

#[test]
fn garbage_is_invalid_spirv() {
    for (what, bytes) in [
        ("empty", Vec::new()),
        ("odd length", vec![3u8; 21]),
        ("wrong magic", vec![0u8; 64]),
        (
            "truncated",
            spirv_image("saxpy").unwrap().bytes()[..100].to_vec(),
        ),
    ] {
        let e = DeviceImage::spirv(what, bytes).unwrap_err();
        assert!(matches!(e, Error::InvalidSpirv { .. }), "{what}: {e}");
    }
    // Big-endian SPIR-V is SPIR-V too.
    let be: Vec<u8> = spirv_image("copy")
        .unwrap()
        .bytes()
        .chunks_exact(4)
        .flat_map(|w| [w[3], w[2], w[1], w[0]])
        .collect();
    assert!(DeviceImage::spirv("copy-be", be).is_ok());
}

/// Every kernels/*.comp has a committed .spv that glslangValidator still produces from it, and every
/// one is embedded. Kernels with cooperative matrices need a newer glslang than the test machines
/// have (see scripts/build-kernels.sh): theirs must come from the current source by its recorded
/// digest, and validate.
#[test]
fn committed_spirv_is_fresh() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = root.join("kernels");
    let mut sources: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter_map(|n| n.strip_suffix(".comp").map(str::to_string))
        .collect();
    sources.sort();
    let mut shipped: Vec<String> = SPIRV.iter().map(|k| k.name.to_string()).collect();
    shipped.sort();
    assert_eq!(
        sources, shipped,
        "kernels/*.comp and kpc::kernels::SPIRV must list the same kernels"
    );
    for k in SPIRV {
        let on_disk = std::fs::read(dir.join(format!("{}.spv", k.name))).unwrap();
        assert_eq!(
            on_disk, k.spirv,
            "{}.spv on disk differs from the embedded one",
            k.name
        );
    }

    let version = match Command::new("glslangValidator").arg("--version").output() {
        Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout)
            .lines()
            .next()
            .unwrap_or("")
            .to_string(),
        _ => {
            let _: Option<()> = common::drivers::skip(
                "glslang",
                "committed_spirv_is_fresh",
                "glslangValidator is not installed",
            );
            return;
        }
    };
    common::drivers::ran("glslang", "committed_spirv_is_fresh");
    let recorded = std::fs::read_to_string(dir.join("GLSLANG_VERSION")).unwrap_or_default();
    let out = std::env::temp_dir().join(format!("kpc-spv-fresh-{}", std::process::id()));
    std::fs::create_dir_all(&out).unwrap();
    for k in SPIRV {
        let source = std::fs::read_to_string(root.join(k.source)).unwrap();
        assert_eq!(
            source.contains("GL_KHR_cooperative_matrix"),
            k.cooperative_matrix,
            "{}: ShippedSpirv::cooperative_matrix disagrees with its source",
            k.name
        );
        if k.cooperative_matrix {
            coopmat_kernel_is_fresh(&dir, k.name, k.source);
            continue;
        }
        let spv = out.join(format!("{}.spv", k.name));
        let status = Command::new("glslangValidator")
            .current_dir(&dir)
            .args([
                "--quiet",
                "--target-env",
                "vulkan1.1",
                "-e",
                k.name,
                "--source-entrypoint",
                "main",
                "-o",
            ])
            .arg(&spv)
            .arg(format!("{}.comp", k.name))
            .status()
            .unwrap();
        assert!(status.success(), "glslangValidator failed on {}", k.source);
        let fresh = std::fs::read(&spv).unwrap();
        assert!(
            fresh == k.spirv,
            "kernels/{}.spv is stale against {}: run scripts/build-kernels.sh and commit the result \
             (committed with {:?}, this machine has {version:?})",
            k.name,
            k.source,
            recorded.trim()
        );
    }
    let _ = std::fs::remove_dir_all(&out);
}

/// A cooperative-matrix kernel's .spv was built from the source as it is now: the SHA-256 that
/// scripts/build-kernels.sh recorded in NAME.spv.source matches the source's, and the module
/// passes spirv-tools validation.
fn coopmat_kernel_is_fresh(dir: &Path, name: &str, source: &str) {
    let recorded = std::fs::read_to_string(dir.join(format!("{name}.spv.source")))
        .unwrap_or_else(|e| panic!("kernels/{name}.spv.source: {e}; run scripts/build-kernels.sh"));
    let out = Command::new("sha256sum")
        .arg(format!("{name}.comp"))
        .current_dir(dir)
        .output()
        .expect("sha256sum runs");
    assert!(out.status.success(), "sha256sum failed on {source}");
    let digest = String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .unwrap_or("")
        .to_string();
    assert_eq!(digest.len(), 64, "sha256sum printed {:?}", out.stdout);
    assert_eq!(
        recorded.lines().next().unwrap_or(""),
        format!("sha256 {digest}"),
        "kernels/{name}.spv is stale against {source}: run scripts/build-kernels.sh with \
         KPC_GLSLANG_COOPMAT set to a glslang of 13 or later, and commit the result"
    );
    spirv_image(name).unwrap_or_else(|e| panic!("kernels/{name}.spv is invalid: {e}"));
}
