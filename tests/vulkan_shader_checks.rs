//! Shaders as engines write them, on lavapipe (under the validation layer in CI, see
//! scripts/test.sh): several buffer blocks on one binding become one binding; a shader whose
//! capabilities the device lacks is a typed, cached build error before the driver sees it; one whose
//! features the device has runs, because kpc enabled them.

use crate::common;

use kpc::DeviceImage;
use kpc::admin::glsl::{GlslOptimization, GlslSource};
use kpc::{BuildOptions, SpecConstants};
use kpc::{Error, PushConstants};

use common::drivers::{assert_no_validation_errors, vulkan_context};

fn glsl(name: &str, text: &str) -> DeviceImage {
    DeviceImage::glsl(GlslSource::compute(name, text.to_string())).unwrap()
}

/// `a` and `a4` view binding 0 as floats and as vec4s (both read); `o` and `o4` view binding 1 as
/// floats (read) and as vec4s (written): out4[i] = a4[i] + vec4(a[4i] + o[4i]).
const ALIASED: &str = "#version 450
layout(local_size_x = 8) in;
layout(std430, binding = 0) readonly buffer A { float a[]; };
layout(std430, binding = 0) readonly buffer A4 { vec4 a4[]; };
layout(std430, binding = 1) readonly buffer O { float o[]; };
layout(std430, binding = 1) buffer O4 { vec4 o4[]; };
layout(push_constant) uniform P { uint n; } p;
void main() {
    uint i = gl_GlobalInvocationID.x;
    if (i < p.n) { o4[i] = a4[i] + vec4(a[4 * i] + o[4 * i]); }
}
";

#[test]
fn aliased_blocks_are_one_binding_each() {
    let Some(ctx) = vulkan_context("aliased_blocks_are_one_binding_each") else {
        return;
    };
    let none = SpecConstants::new();
    for (opt, tag) in [
        (GlslOptimization::None, "plain"),
        (GlslOptimization::Performance, "optimized"),
    ] {
        let image = DeviceImage::glsl(
            GlslSource::compute(&format!("aliased_{tag}"), ALIASED).optimization(opt),
        )
        .unwrap();
        let k = ctx
            .kernel_with(
                &kpc::KernelRequest::new(&image, &format!("aliased_{tag}")).spec(none.clone()),
            )
            .unwrap();
        let b = &k.info().buffers;
        assert_eq!(b.len(), 2, "{tag}: {b:?}");
        assert_eq!((b[0].binding, b[1].binding), (0, 1), "{b:?}");
        assert!(
            b[0].read_only,
            "both blocks of binding 0 are readonly: {b:?}"
        );
        assert!(!b[1].read_only, "binding 1 is written through O4: {b:?}");
        assert!(b.iter().all(|p| !p.name.is_empty()), "{b:?}");
        if opt == GlslOptimization::None {
            let mut names: Vec<&str> = b[0].name.split('/').collect();
            names.sort();
            assert_eq!(names, ["A", "A4"], "{b:?}");
        }
        let handles = k.vulkan_handles().expect("a Vulkan kernel");
        assert_eq!(handles.bindings.len(), 2, "{:?}", handles.bindings);

        let n = 64u32;
        let a: Vec<f32> = (0..4 * n).map(|i| i as f32).collect();
        let o: Vec<f32> = (0..4 * n).map(|i| (i % 7) as f32).collect();
        let ba = ctx.buffer_from(&a).unwrap();
        let bo = ctx.buffer_from(&o).unwrap();
        ctx.queue()
            .launch(
                &k,
                [n / 8, 1, 1],
                &[&ba, &bo],
                PushConstants::new().u32(n).as_bytes(),
            )
            .unwrap()
            .wait()
            .unwrap();
        let got = bo.read().unwrap();
        for i in 0..n as usize {
            for c in 0..4 {
                let want = a[4 * i + c] + a[4 * i] + o[4 * i];
                assert_eq!(got[4 * i + c], want, "{tag}: element {i}.{c}");
            }
        }
        // One buffer per binding: passing one per block is refused, naming the bindings.
        let e = ctx
            .queue()
            .launch(
                &k,
                [1, 1, 1],
                &[&ba, &ba, &bo],
                PushConstants::new().u32(n).as_bytes(),
            )
            .expect_err("three buffers for two bindings");
        assert!(e.to_string().contains("2 buffer(s)"), "{e}");
    }
    assert_no_validation_errors("aliased_blocks_are_one_binding_each");
}

#[test]
fn blocks_of_different_kinds_on_one_binding_are_refused() {
    let Some(ctx) = vulkan_context("blocks_of_different_kinds_on_one_binding_are_refused") else {
        return;
    };
    let src = "#version 450
layout(local_size_x = 1) in;
layout(std430, binding = 0) buffer S { float s[]; };
layout(std140, binding = 0) uniform U { vec4 u; };
void main() { s[0] = u.x; }
";
    let e = ctx
        .kernel(&glsl("mixed_kinds", src), "mixed_kinds")
        .expect_err("a storage and a uniform block on one binding");
    assert!(e.to_string().contains("binding 0"), "{e}");
}

/// A clustered reduction: lavapipe supports no CLUSTERED subgroup operations.
const CLUSTERED: &str = "#version 450
#extension GL_KHR_shader_subgroup_clustered : require
layout(local_size_x = 8) in;
layout(std430, binding = 0) buffer X { float x[]; };
void main() {
    uint i = gl_GlobalInvocationID.x;
    x[i] = subgroupClusteredAdd(x[i], 4);
}
";

#[test]
fn missing_subgroup_operation_is_a_typed_cached_error() {
    let Some(ctx) = vulkan_context("missing_subgroup_operation_is_a_typed_cached_error") else {
        return;
    };
    let supports = ctx.device().limits.subgroup_size.is_some();
    assert!(supports, "lavapipe reports subgroups");
    let image = glsl("clustered", CLUSTERED);
    let none = SpecConstants::new();
    let first = ctx
        .kernel_with(&kpc::KernelRequest::new(&image, "clustered").spec(none.clone()))
        .expect_err("lavapipe has no clustered subgroup operations");
    match &first {
        Error::Unsupported { needs, reason, .. } => {
            assert!(needs.contains("GroupNonUniformClustered"), "{first}");
            assert!(reason.contains("CLUSTERED"), "{first}");
        }
        other => panic!("expected Error::Unsupported, got {other}"),
    }
    let builds = ctx.stats().memory.builds;
    let again = ctx
        .kernel_with(&kpc::KernelRequest::new(&image, "clustered").spec(none.clone()))
        .expect_err("still refused");
    assert_eq!(again, first);
    assert_eq!(
        ctx.stats().memory.builds,
        builds,
        "the failure is cached: no second build"
    );
    assert_no_validation_errors("missing_subgroup_operation_is_a_typed_cached_error");
}

/// An f16 subgroup sum over a float16 buffer: needs shaderFloat16, storageBuffer16BitAccess and
/// shaderSubgroupExtendedTypes, which lavapipe has and kpc enables.
const F16_SUBGROUP: &str = "#version 450
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_EXT_shader_16bit_storage : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#extension GL_EXT_shader_subgroup_extended_types_float16 : require
layout(local_size_x = 8) in;
layout(std430, binding = 0) readonly buffer X { float16_t x[]; };
layout(std430, binding = 1) writeonly buffer Y { float y[]; };
void main() {
    uint i = gl_GlobalInvocationID.x;
    float16_t s = subgroupAdd(x[i]);
    y[i] = float(s);
}
";

#[test]
fn f16_subgroup_operations_run_with_extended_types_enabled() {
    let Some(ctx) = vulkan_context("f16_subgroup_operations_run_with_extended_types_enabled")
    else {
        return;
    };
    let k = ctx
        .kernel(&glsl("f16_subgroup", F16_SUBGROUP), "f16_subgroup")
        .unwrap();
    let sub = ctx.device().limits.subgroup_size.unwrap() as usize;
    let n = 64usize;
    // Small integers are exact in f16, and so are their sums over a subgroup.
    let halves: Vec<u16> = (0..n).map(|i| f16_bits((i % 5) as f32)).collect();
    let words: Vec<u32> = halves
        .chunks(2)
        .map(|p| u32::from(p[0]) | (u32::from(p[1]) << 16))
        .collect();
    let x = ctx.buffer_from(&words).unwrap();
    let y = ctx.buffer_from(&vec![f32::NAN; n]).unwrap();
    ctx.queue()
        .launch(&k, [(n / 8) as u32, 1, 1], &[&x, &y], &[])
        .unwrap()
        .wait()
        .unwrap();
    let got = y.read().unwrap();
    for (i, g) in got.iter().enumerate() {
        let group = i / sub * sub;
        let want: f32 = (group..group + sub).map(|j| (j % 5) as f32).sum();
        assert_eq!(*g, want, "element {i}");
    }
    assert_no_validation_errors("f16_subgroup_operations_run_with_extended_types_enabled");
}

/// IEEE half bits of a small non-negative integer (exact).
fn f16_bits(v: f32) -> u16 {
    if v == 0.0 {
        return 0;
    }
    let bits = v.to_bits();
    let exp = ((bits >> 23) & 0xff) as i32 - 127 + 15;
    let mant = (bits >> 13) & 0x3ff;
    ((exp as u32) << 10 | mant) as u16
}

/// A uniform block at binding 0 and a storage buffer at binding 20: neither fits the layout kpc's
/// pipelines share (storage buffers below binding 16), so the kernel gets layouts of its own.
const UNIFORM_AND_HIGH_BINDING: &str = "#version 450
layout(local_size_x = 8) in;
layout(std140, binding = 0) uniform U { vec4 u; };
layout(std430, binding = 20) buffer O { float o[]; };
void main() {
    uint i = gl_GlobalInvocationID.x;
    o[i] = u.x + float(i);
}
";

#[test]
fn storage_kernels_share_one_layout_and_others_get_their_own() {
    let Some(ctx) = vulkan_context("storage_kernels_share_one_layout_and_others_get_their_own")
    else {
        return;
    };
    let (none, opts) = (SpecConstants::new(), BuildOptions::default());
    let get = |name: &str| {
        let image = kpc::kernels::spirv_image(name).unwrap();
        ctx.kernel_with(
            &kpc::KernelRequest::new(&image, name)
                .spec(none.clone())
                .options(opts.clone()),
        )
        .unwrap()
    };
    let (copy, read) = (get("copy"), get("read"));
    let (hc, hr) = (
        copy.vulkan_handles().unwrap(),
        read.vulkan_handles().unwrap(),
    );
    assert_eq!(hc.pipeline_layout, hr.pipeline_layout);
    assert_eq!(hc.descriptor_set_layouts, hr.descriptor_set_layouts);
    assert_ne!(hc.pipeline, hr.pipeline);

    let own = ctx
        .kernel_with(
            &kpc::KernelRequest::new(
                &glsl("uniform_high", UNIFORM_AND_HIGH_BINDING),
                "uniform_high",
            )
            .spec(none.clone())
            .options(opts.clone()),
        )
        .unwrap();
    let ho = own.vulkan_handles().unwrap();
    assert_ne!(ho.pipeline_layout, hc.pipeline_layout);
    assert_ne!(ho.descriptor_set_layouts, hc.descriptor_set_layouts);
    // And it computes, with its uniform and its high binding written through its own layout, in
    // one batch with a kernel on the shared layout.
    let n = 32usize;
    let u = ctx.buffer_from(&[2.5f32, 0.0, 0.0, 0.0]).unwrap();
    let o = ctx.buffer_from(&vec![f32::NAN; n]).unwrap();
    ctx.queue()
        .launch(&own, [(n / 8) as u32, 1, 1], &[&u, &o], &[])
        .unwrap()
        .wait()
        .unwrap();
    let got = o.read().unwrap();
    for (i, g) in got.iter().enumerate() {
        assert_eq!(*g, 2.5 + i as f32, "element {i}");
    }
    drop((copy, read));
    // The shared layout outlives the kernels that used it: a kernel acquired afterwards runs.
    common::drivers::check_read_kernel(&ctx, &kpc::kernels::spirv_image("read").unwrap());
    assert_no_validation_errors("storage_kernels_share_one_layout_and_others_get_their_own");
}
