//! Generic while specialized on real drivers (lavapipe and PoCL in CI): a specialized kernel whose
//! build fails on the device keeps the generic fallback serving, correct, with one warning. (The
//! cold-run swap on the attention kernels is in kpc-attention's tests; the logic with the counting
//! fake backend in `lazy.rs`.)

use crate::common;

use std::time::{Duration, Instant};

use common::disk::TempDir;
use kpc::{BackendKind, Config, Context, DeviceImage, KernelRequest, PushConstants, Warning};
use kpc::{SpecConstants, SpecValue};

/// A saxpy request that only its build can refuse: on OpenCL, C source naming an undeclared
/// variable (the compiler's error); on Vulkan, the shipped saxpy with its spec constant 1 (an
/// `int`) given as a float, which the build refuses before anything reaches the driver. (A SPIR-V
/// image that fails validation is refused when the image is made, before any request.)
fn broken_saxpy(backend: BackendKind) -> KernelRequest {
    match backend {
        BackendKind::OpenCl => KernelRequest::new(
            &DeviceImage::opencl_c(
                "saxpy_broken",
                "kernel void saxpy(global const float *x, global const float *y, global float *out, \
                 uint n, float a) { out[get_global_id(0)] = undeclared_name; }",
            ),
            "saxpy",
        ),
        BackendKind::Vulkan => {
            let good = kpc::kernels::shipped("saxpy", backend).unwrap();
            KernelRequest::new(&good, "saxpy")
                .spec(SpecConstants::new().with(1, SpecValue::f32(1.5)))
        }
    }
}

fn saxpy_runs(ctx: &Context, kernel: &kpc::Kernel) {
    let n = 256;
    let x = ctx.buffer_from(&vec![1.0f32; n]).unwrap();
    let y = ctx.buffer_from(&vec![2.0f32; n]).unwrap();
    let out = ctx.buffer::<f32>(n).unwrap();
    let push = PushConstants::new().u32(n as u32).f32(3.0);
    let groups = kernel.groups_for([n as u64, 1, 1]).unwrap();
    ctx.queue()
        .launch(kernel, groups, &[&x, &y, &out], push.as_bytes())
        .unwrap()
        .wait()
        .unwrap();
    assert_eq!(out.read().unwrap(), vec![5.0f32; n]);
}

crate::backend_tests! {
    fn a_failing_specialized_build_keeps_the_generic_serving_with_one_warning(backend, test) {
        let Some(d) = crate::common::drivers::device(backend, test) else {
            return;
        };
        let dir = TempDir::new("lazy-drv-fail");
        let (seen, record) = crate::common::warning_recorder();
        let config = Config::builder().cache_dir(dir.path()).build().unwrap();
        let ctx = Context::builder()
            .device(&d)
            .config(config)
            .on_warning(record)
            .build()
            .unwrap();
        let good = kpc::kernels::shipped("saxpy", ctx.backend()).unwrap();
        let request =
            broken_saxpy(ctx.backend()).or_generic(KernelRequest::new(&good, "saxpy"));
        let first = ctx.kernel_with(&request).unwrap();
        assert!(first.is_generic(), "the fallback answers a cold request");
        saxpy_runs(&ctx, &first);
        let deadline = Instant::now() + Duration::from_secs(120);
        while ctx.stats().lazy.pending > 0 {
            assert!(Instant::now() < deadline, "the background build never ended");
            std::thread::yield_now();
        }
        for _ in 0..3 {
            let k = ctx.kernel_with(&request).unwrap();
            assert!(k.is_generic(), "the failed specialized kernel is not served");
            saxpy_runs(&ctx, &k);
        }
        let failed: Vec<Warning> = seen
            .lock()
            .iter()
            .filter(|w| w.cause == "background-build-failed")
            .cloned()
            .collect();
        assert_eq!(failed.len(), 1, "{failed:?}");
        assert!(failed[0].message.contains("saxpy"), "{}", failed[0].message);
        let s = ctx.stats().lazy;
        // `background_builds` counts the builds that compiled: none did.
        assert_eq!(
            (s.served_generic, s.background_builds, s.background_failures, s.swapped_in),
            (4, 0, 1, 0)
        );
    }
}
