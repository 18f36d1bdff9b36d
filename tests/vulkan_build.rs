//! Builds that must fail, and how failures are (or are not) cached.

use crate::common;

use kpc::kernels::spirv_image;
use kpc::{BuildOptions, SpecConstants, SpecValue};
use kpc::{DeviceImage, ImageFormat};
use kpc::{Error, PushConstants};

use common::drivers::{random_f32, vulkan_context};

/// saxpy with its id bound lowered below the ids it uses: well-formed words, invalid module.
fn invalid_saxpy() -> Vec<u8> {
    let mut b = spirv_image("saxpy").unwrap().bytes().to_vec();
    b[12..16].copy_from_slice(&5u32.to_le_bytes());
    b
}

#[test]
fn invalid_spirv_is_a_typed_error_and_nothing_is_cached() {
    let Some(ctx) = vulkan_context("invalid_spirv_is_a_typed_error_and_nothing_is_cached") else {
        return;
    };
    let bytes = invalid_saxpy();
    let e = DeviceImage::spirv("broken", bytes.clone()).unwrap_err();
    let Error::InvalidSpirv { image, message } = &e else {
        panic!("{e}")
    };
    assert_eq!(image, "broken");
    assert!(
        message.to_lowercase().contains("bound"),
        "the validator's message: {message}"
    );

    // The same bytes passed unvalidated reach the context, whose build path validates them; the failure
    // is not cached, so each request validates again and nothing is left in the cache.
    let raw = DeviceImage::new("broken", ImageFormat::SpirV, bytes);
    for _ in 0..2 {
        let e2 = ctx.kernel(&raw, "saxpy").unwrap_err();
        assert_eq!(e2, e);
    }
    let s = ctx.stats().memory;
    assert_eq!((s.programs, s.kernels, s.hits), (0, 0, 0), "{s:?}");
    assert!(
        s.failed_builds >= 2,
        "both requests went to the build path: {s:?}"
    );
    assert_eq!(ctx.stats().backend_counters.programs_built, 0);
}

#[test]
fn a_failed_build_returns_the_same_error_from_the_cache() {
    let Some(ctx) = vulkan_context("a_failed_build_returns_the_same_error_from_the_cache") else {
        return;
    };
    let image = spirv_image("saxpy").unwrap();
    // A workgroup of 2^20 invocations: valid SPIR-V, beyond every device's limits.
    let spec = SpecConstants::new().with(0, SpecValue::U32(1 << 20));
    let opts = BuildOptions::default();
    let e1 = ctx
        .kernel_with(
            &kpc::KernelRequest::new(&image, "saxpy")
                .spec(spec.clone())
                .options(opts.clone()),
        )
        .unwrap_err();
    assert!(
        matches!(&e1, Error::Build { message, .. } if message.contains("workgroup size")),
        "{e1}"
    );
    let after_first = ctx.stats().memory;
    let e2 = ctx
        .kernel_with(
            &kpc::KernelRequest::new(&image, "saxpy")
                .spec(spec.clone())
                .options(opts.clone()),
        )
        .unwrap_err();
    assert_eq!(e1, e2);
    let after_second = ctx.stats().memory;
    assert_eq!(
        after_second.builds, after_first.builds,
        "the failure was not rebuilt"
    );
    assert_eq!(after_second.failed_builds, after_first.failed_builds);
    assert!(after_second.failed_builds >= 1);

    // An option the backend does not know is refused, and cached like any failed build.
    let e = ctx
        .kernel_with(
            &kpc::KernelRequest::new(&image, "saxpy")
                .options(BuildOptions::new("-O -cl-mad-enable")),
        )
        .unwrap_err();
    assert!(
        matches!(&e, Error::InvalidArgument(m) if m.contains("-cl-mad-enable")),
        "{e}"
    );

    // A bad specialization constant (wrong type, unknown id) fails the same way.
    for spec in [
        SpecConstants::new().with(1, SpecValue::f32(80.0)),
        SpecConstants::new().with(9, SpecValue::U32(1)),
    ] {
        let e1 = ctx
            .kernel_with(
                &kpc::KernelRequest::new(&image, "saxpy")
                    .spec(spec.clone())
                    .options(opts.clone()),
            )
            .unwrap_err();
        assert!(matches!(e1, Error::InvalidArgument(_)), "{e1}");
        let builds = ctx.stats().memory.builds;
        assert_eq!(
            ctx.kernel_with(
                &kpc::KernelRequest::new(&image, "saxpy")
                    .spec(spec.clone())
                    .options(opts.clone())
            )
            .unwrap_err(),
            e1
        );
        assert_eq!(ctx.stats().memory.builds, builds);
    }
}

#[test]
fn optimized_build_is_its_own_program_with_the_same_results() {
    let Some(ctx) = vulkan_context("optimized_build_is_its_own_program_with_the_same_results")
    else {
        return;
    };
    let image = spirv_image("saxpy").unwrap();
    let spec = SpecConstants::new().with(1, SpecValue::I32(3));
    let plain = ctx
        .kernel_with(&kpc::KernelRequest::new(&image, "saxpy").spec(spec.clone()))
        .unwrap();
    let opt = ctx
        .kernel_with(
            &kpc::KernelRequest::new(&image, "saxpy")
                .spec(spec.clone())
                .options(BuildOptions::new("-O")),
        )
        .unwrap();
    assert_eq!(ctx.stats().memory.programs, 2);
    assert_eq!(
        plain.info(),
        opt.info(),
        "the optimizer keeps bindings, push constants and spec constants"
    );
    let n = 300;
    let (x, y) = (random_f32(n), random_f32(n));
    let bx = ctx.buffer_from(&x).unwrap();
    let by = ctx.buffer_from(&y).unwrap();
    let push = PushConstants::new().u32(n as u32).f32(0.25);
    let mut outs = Vec::new();
    for k in [&plain, &opt] {
        let out = ctx.buffer::<f32>(n).unwrap();
        ctx.queue()
            .launch(
                k,
                k.groups_for([n as u64, 1, 1]).unwrap(),
                &[&bx, &by, &out],
                push.as_bytes(),
            )
            .unwrap();
        outs.push(out.read().unwrap());
    }
    for i in 0..n {
        let want = 0.25 * x[i] + y[i] + 3.0;
        for o in &outs {
            assert!((o[i] - want).abs() <= 1e-5, "{} vs {want}", o[i]);
        }
    }
}
