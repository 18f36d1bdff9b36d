//! The inline-PTX probe on real drivers: Vulkan refuses without building anything; an OpenCL device
//! either builds the probe (NVIDIA from sm_80) or refuses it with a typed error that names what is
//! needed and the driver's reason (PoCL in CI: its compiler refuses `asm`); the answer is the same
//! when asked again (the context caches the probe's build, success or failure).

use kpc::{BackendKind, Context, Error};
use kpc_attention::ptx::{NEEDS, PROBE, inline_ptx_unfit, require_inline_ptx};

use crate::common::drivers::{opencl_context, vulkan_context};

fn probe_twice(ctx: &Context) -> Option<String> {
    let first = inline_ptx_unfit(ctx).expect("probing is not an error");
    let again = inline_ptx_unfit(ctx).expect("probing is not an error");
    assert_eq!(
        first, again,
        "the probe's answer is stable within a context"
    );
    match require_inline_ptx(ctx, "some_kernel") {
        Ok(()) => assert!(first.is_none()),
        Err(Error::Unsupported {
            backend,
            image,
            needs,
            reason,
        }) => {
            assert_eq!(backend, ctx.backend());
            assert_eq!(image, "some_kernel");
            assert_eq!(needs, NEEDS);
            assert_eq!(Some(reason), first);
        }
        Err(e) => panic!("expected Ok or Error::Unsupported, got {e}"),
    }
    first
}

#[test]
fn inline_ptx_is_refused_on_vulkan_without_a_build() {
    let Some(ctx) = vulkan_context("inline_ptx_is_refused_on_vulkan_without_a_build") else {
        return;
    };
    let why = probe_twice(&ctx).expect("Vulkan has no inline PTX");
    assert!(why.contains("SPIR-V"), "{why}");
    assert_eq!(ctx.backend(), BackendKind::Vulkan);
}

#[test]
fn inline_ptx_probe_on_opencl_builds_or_says_why_not() {
    let Some(ctx) = opencl_context("inline_ptx_probe_on_opencl_builds_or_says_why_not") else {
        return;
    };
    let name = ctx.device().name.to_lowercase();
    match probe_twice(&ctx) {
        // Only a compiler that hands `asm` to ptxas builds it.
        None => assert!(!name.contains("pthread") && !name.contains("cpu"), "{name}"),
        Some(why) => {
            assert!(why.contains("refused"), "{why}");
            // PoCL's compiler names the construct it refuses.
            if name.contains("pthread") || name.contains("cpu") {
                assert!(why.contains("asm"), "{why}");
            }
        }
    }
    assert!(!PROBE.is_empty());
}
