//! Builds that fail on a real OpenCL driver: the typed error carries the driver's build log, a
//! cached failure comes back without rebuilding, and images or kernels kpc cannot use are typed
//! errors too.

use crate::common;

use kpc::Error;
use kpc::Source;
use kpc::kernels::opencl_image;
use kpc::{BuildOptions, SpecConstants, SpecValue};
use kpc::{DeviceImage, ImageFormat};

use common::drivers::opencl_context;

fn cl(name: &str, src: &str) -> DeviceImage {
    DeviceImage::new(name, ImageFormat::OpenClC, src.as_bytes().to_vec())
}

const BROKEN: &str =
    "kernel void broken(global float *out)\n{\n    out[0] = undeclared_name * 2.0f;\n}\n";

fn none() -> (SpecConstants, BuildOptions) {
    (SpecConstants::new(), BuildOptions::default())
}

#[test]
fn a_compile_error_carries_the_build_log() {
    let Some(ctx) = opencl_context("a_compile_error_carries_the_build_log") else {
        return;
    };
    let (spec, opts) = none();
    let e = ctx
        .kernel_with(
            &kpc::KernelRequest::new(&cl("broken", BROKEN), "broken")
                .spec(spec.clone())
                .options(opts.clone()),
        )
        .unwrap_err();
    match &e {
        Error::Build {
            image, log, code, ..
        } => {
            assert_eq!(image, "broken");
            assert_eq!(*code, -11, "CL_BUILD_PROGRAM_FAILURE");
            assert!(
                log.contains("undeclared_name"),
                "the log names the error: {log}"
            );
        }
        other => panic!("expected a build error, got {other:?}"),
    }
    // The message a person sees includes the log.
    assert!(e.to_string().contains("undeclared_name"), "{e}");
}

#[test]
fn a_cached_failed_build_returns_the_same_error_without_rebuilding() {
    let Some(ctx) =
        opencl_context("a_cached_failed_build_returns_the_same_error_without_rebuilding")
    else {
        return;
    };
    let (spec, opts) = none();
    let image = cl("broken", BROKEN);
    let first = ctx
        .kernel_with(
            &kpc::KernelRequest::new(&image, "broken")
                .spec(spec.clone())
                .options(opts.clone()),
        )
        .unwrap_err();
    let builds = ctx.stats().memory.builds;
    let failed = ctx.stats().memory.failed_builds;
    let started = std::time::Instant::now();
    let second = ctx
        .kernel_with(
            &kpc::KernelRequest::new(&image, "broken")
                .spec(spec.clone())
                .options(opts.clone()),
        )
        .unwrap_err();
    let third = ctx
        .kernel_with(
            &kpc::KernelRequest::new(&cl("broken", BROKEN), "broken")
                .spec(spec.clone())
                .options(opts.clone()),
        )
        .unwrap_err();
    assert_eq!(first, second, "the same error, log and all");
    assert_eq!(first, third);
    assert_eq!(ctx.stats().memory.builds, builds, "nothing was rebuilt");
    assert_eq!(
        ctx.stats().memory.failed_builds,
        failed,
        "{:?}",
        ctx.stats().memory
    );
    // Only a timing hint for a person reading a failure: the two cached answers took no compile.
    eprintln!("two cached failures took {:?}", started.elapsed());
    // The failure is per key: a fixed source under the same name builds.
    let fixed = cl("broken", &BROKEN.replace("undeclared_name", "1.0f"));
    let k = ctx
        .kernel_with(
            &kpc::KernelRequest::new(&fixed, "broken")
                .spec(spec.clone())
                .options(opts.clone()),
        )
        .unwrap();
    assert_eq!(k.source(), Source::Built);
}

#[test]
fn bad_build_options_are_a_cached_build_error() {
    let Some(ctx) = opencl_context("bad_build_options_are_a_cached_build_error") else {
        return;
    };
    let e = ctx
        .kernel_with(
            &kpc::KernelRequest::new(&opencl_image("saxpy").unwrap(), "saxpy")
                .options(BuildOptions::new("-cl-no-such-option-kpc")),
        )
        .unwrap_err();
    assert!(matches!(e, Error::Build { .. }), "{e}");
}

#[test]
fn kernels_and_images_kpc_cannot_use_are_typed_errors() {
    let Some(ctx) = opencl_context("kernels_and_images_kpc_cannot_use_are_typed_errors") else {
        return;
    };
    let (spec, opts) = none();
    let saxpy = opencl_image("saxpy").unwrap();

    let e = ctx
        .kernel_with(
            &kpc::KernelRequest::new(&saxpy, "main")
                .spec(spec.clone())
                .options(opts.clone()),
        )
        .unwrap_err();
    assert!(
        matches!(&e, Error::UnknownKernel { available, .. } if available == "saxpy"),
        "{e}"
    );

    // A SPIR-V image handed to the OpenCL backend.
    let spirv = DeviceImage::new("spv", ImageFormat::SpirV, vec![0x07, 0x23, 0x02, 0x03]);
    let e = ctx
        .kernel_with(
            &kpc::KernelRequest::new(&spirv, "main")
                .spec(spec.clone())
                .options(opts.clone()),
        )
        .unwrap_err();
    assert!(
        matches!(&e, Error::InvalidArgument(m) if m.contains("OpenCL C")),
        "{e}"
    );

    // A local-memory pointer parameter: kpc has no way to pass one.
    let local = cl(
        "local",
        "kernel void k(global float *o, local float *scratch) { o[0] = 1.0f; }",
    );
    let e = ctx
        .kernel_with(
            &kpc::KernelRequest::new(&local, "k")
                .spec(spec.clone())
                .options(opts.clone()),
        )
        .unwrap_err();
    assert!(
        matches!(&e, Error::InvalidArgument(m) if m.contains("scratch")),
        "{e}"
    );

    // A required workgroup size beyond the device's limit.
    let max = ctx.device().limits.max_workgroup_invocations;
    let too_big = SpecConstants::new().with(0, SpecValue::U32(max * 2));
    let e = ctx
        .kernel_with(
            &kpc::KernelRequest::new(&saxpy, "saxpy")
                .spec(too_big.clone())
                .options(opts.clone()),
        )
        .unwrap_err();
    assert!(
        matches!(e, Error::Build { .. } | Error::InvalidArgument(_)),
        "{e}"
    );

    // A malformed spec-constant declaration.
    let bad_decl = cl(
        "decl",
        "// kpc-spec-constant zero N\nkernel void k(global int *o) { o[0] = 1; }",
    );
    let e = ctx
        .kernel_with(
            &kpc::KernelRequest::new(&bad_decl, "k")
                .spec(spec.clone())
                .options(opts.clone()),
        )
        .unwrap_err();
    assert!(
        matches!(&e, Error::InvalidArgument(m) if m.contains("kpc-spec-constant")),
        "{e}"
    );
}

#[test]
fn both_backends_ship_the_same_kernels() {
    // Each shipped OpenCL image mirrors its SPIR-V twin (kpc-attention checks its own kernels with
    // the same helper).
    let Some(ctx) = opencl_context("both_backends_ship_the_same_kernels") else {
        return;
    };
    common::shipped::both_backends_agree(&ctx, kpc::kernels::OPENCL, kpc::kernels::SPIRV);
}

/// A kernel with a local array (so its local memory is not zero) and a required workgroup size.
const LOCAL_SUM: &str = "__attribute__((reqd_work_group_size(64, 1, 1)))
kernel void local_sum(global const float *x, global float *out)
{
    local float part[64];
    uint i = get_local_id(0);
    part[i] = x[get_global_id(0)];
    barrier(CLK_LOCAL_MEM_FENCE);
    if (i == 0) {
        float s = 0.0f;
        for (uint j = 0; j < 64; j++) {
            s += part[j];
        }
        out[get_group_id(0)] = s;
    }
}
";

/// What the driver says about a built kernel is reported with it: the work-group limit (at least
/// the kernel's own workgroup), its multiple, and the private and local memory it uses (the kernel
/// declares a local array, so its local memory is not zero).
#[test]
fn kernels_carry_the_driver_figures() {
    let Some(ctx) = opencl_context("kernels_carry_the_driver_figures") else {
        return;
    };
    let (spec, options) = none();
    let k = ctx
        .kernel_with(
            &kpc::KernelRequest::new(&cl("local_sum", LOCAL_SUM), "local_sum")
                .spec(spec.clone())
                .options(options.clone()),
        )
        .unwrap();
    let stat = |name: &str| -> u64 {
        k.driver_stats()
            .iter()
            .find(|(n, _)| n == name)
            .unwrap_or_else(|| panic!("no {name:?} in {:?}", k.driver_stats()))
            .1
            .parse()
            .unwrap()
    };
    let local: u64 = k.info().local_size.iter().map(|&s| u64::from(s)).product();
    assert!(stat("work-group size limit") >= local);
    assert!(stat("work-group size multiple") >= 1);
    assert!(stat("local memory bytes") > 0);
    let _ = stat("private memory bytes");
}
