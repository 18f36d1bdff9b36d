//! The shipped SPIR-V: fresh against its GLSL, valid, and reflected correctly. Needs no driver.

use crate::common;

use std::path::Path;

use kpc::DeviceImage;
use kpc::Error;
use kpc::admin::spirv::{DescriptorKind, SpecType};
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
        (e.local_size[0].default, e.local_size[0].spec_id),
        (64, Some(0))
    );
    assert_eq!(
        (e.local_size[1].default, e.local_size[1].spec_id),
        (1, None)
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
        (e.local_size[0].default, e.local_size[0].spec_id),
        (256, Some(0))
    );
    assert_eq!(e.push_constant_bytes, 4);
    assert_eq!(e.bindings.len(), 2);
    assert!(e.bindings[0].read_only && !e.bindings[1].read_only);
    let err = m.entry("copy", "main").unwrap_err();
    assert!(matches!(err, Error::UnknownKernel { .. }), "{err}");
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
/// one is embedded (kpc-attention checks its own kernels with the same helper).
#[test]
fn committed_spirv_is_fresh() {
    common::shipped::committed_spirv_is_fresh(
        Path::new(env!("CARGO_MANIFEST_DIR")),
        SPIRV,
        "committed_spirv_is_fresh",
    );
}
