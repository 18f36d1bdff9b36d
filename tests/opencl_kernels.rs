//! Real kernels on a real OpenCL driver (PoCL in CI): outputs checked against the host, the memory
//! cache, spec constants as -D definitions, reflection, launch checking, batches, timing, and one
//! cached kernel launched from 32 threads under every kernel-sharing strategy.

use crate::common;

use kpc::DeviceImage;
use kpc::admin::opencl::{KernelSharing, OpenClBackend, OpenClKernel, OpenClOptions};
use kpc::kernels::opencl_image;
use kpc::{Buffer, Context, Error, PushConstants};
use kpc::{BuildOptions, SpecConstants, SpecValue};
use kpc::{LaunchDesc, Source};

use common::drivers::{check_read_kernel, opencl_backend, opencl_context, random_f32, test_config};

fn saxpy(ctx: &Context, spec: &SpecConstants) -> kpc::Kernel {
    ctx.kernel_with(
        &kpc::KernelRequest::new(&opencl_image("saxpy").unwrap(), "saxpy").spec(spec.clone()),
    )
    .expect("saxpy builds")
}

/// Runs saxpy over `n` elements with an output of `n + 16` poisoned elements, returns the output.
fn run_saxpy(ctx: &Context, kernel: &kpc::Kernel, a: f32, x: &[f32], y: &[f32]) -> Vec<f32> {
    let n = x.len();
    let bx = ctx.buffer_from(x).unwrap();
    let by = ctx.buffer_from(y).unwrap();
    let out: Buffer<f32> = ctx.buffer_from(&vec![f32::NAN; n + 16]).unwrap();
    let push = PushConstants::new().u32(n as u32).f32(a);
    let groups = kernel.groups_for([n as u64, 1, 1]).unwrap();
    ctx.queue()
        .launch(kernel, groups, &[&bx, &by, &out], push.as_bytes())
        .unwrap()
        .wait()
        .unwrap();
    out.read().unwrap()
}

/// [`run_saxpy`] for a saxpy image without declared access bounds (a user's copy).
fn run_saxpy_unchecked(
    ctx: &Context,
    kernel: &kpc::Kernel,
    a: f32,
    x: &[f32],
    y: &[f32],
) -> Vec<f32> {
    let n = x.len();
    let bx = ctx.buffer_from(x).unwrap();
    let by = ctx.buffer_from(y).unwrap();
    let out: Buffer<f32> = ctx.buffer_from(&vec![f32::NAN; n + 16]).unwrap();
    let push = PushConstants::new().u32(n as u32).f32(a);
    let groups = kernel.groups_for([n as u64, 1, 1]).unwrap();
    // SAFETY: saxpy touches element i < n of each buffer, and each holds at least n elements.
    unsafe {
        ctx.queue()
            .launch_unchecked(kernel, groups, &[&bx, &by, &out], push.as_bytes())
    }
    .unwrap()
    .wait()
    .unwrap();
    out.read().unwrap()
}

fn check_saxpy(out: &[f32], a: f32, x: &[f32], y: &[f32], bias: f32) {
    for i in 0..x.len() {
        let want = a * x[i] + y[i] + bias;
        assert!(
            (out[i] - want).abs() <= 1e-5 * (1.0 + want.abs()),
            "out[{i}] = {}, expected {want}",
            out[i]
        );
    }
    assert!(
        out[x.len()..].iter().all(|v| v.is_nan()),
        "the kernel wrote past n"
    );
}

#[test]
fn saxpy_output_matches_the_host() {
    let Some(ctx) = opencl_context("saxpy_output_matches_the_host") else {
        return;
    };
    let n = 64 * 37 + 13;
    let (x, y) = (random_f32(n), random_f32(n));
    let k = saxpy(&ctx, &SpecConstants::new());
    // Reflected: reqd_work_group_size, three buffers (x and y const), two scalars = 8 bytes.
    let info = k.info();
    assert_eq!(info.local_size, [64, 1, 1]);
    assert_eq!(info.push_constant_bytes, 8);
    let names: Vec<(&str, bool, u32)> = info
        .buffers
        .iter()
        .map(|b| (b.name.as_str(), b.read_only, b.binding))
        .collect();
    assert_eq!(
        names,
        [("x", true, 0), ("y", true, 1), ("result", false, 2)]
    );
    let out = run_saxpy(&ctx, &k, 1.75, &x, &y);
    check_saxpy(&out, 1.75, &x, &y, 0.0);
}

#[test]
fn read_kernel_xors_what_it_reads() {
    let Some(ctx) = opencl_context("read_kernel_xors_what_it_reads") else {
        return;
    };
    check_read_kernel(&ctx, &opencl_image("read").unwrap());
}

#[test]
fn copy_kernel_copies_with_a_grid_stride_loop() {
    let Some(ctx) = opencl_context("copy_kernel_copies_with_a_grid_stride_loop") else {
        return;
    };
    let k = ctx.kernel(&opencl_image("copy").unwrap(), "copy").unwrap();
    assert_eq!(k.info().push_constant_bytes, 4);
    assert_eq!(k.info().local_size, [256, 1, 1]);
    let n = 100_003usize; // uint4 elements
    let src: Vec<u32> = (0..4 * n as u32)
        .map(|i| i.wrapping_mul(2_654_435_761))
        .collect();
    let bsrc = ctx.buffer_from(&src).unwrap();
    let bdst: Buffer<u32> = ctx.buffer_from(&vec![0xdead_beef; 4 * n]).unwrap();
    // Far fewer groups than elements: the loop must cover the rest.
    let ev = ctx
        .queue()
        .launch(
            &k,
            [3, 1, 1],
            &[&bsrc, &bdst],
            PushConstants::new().u32(n as u32).as_bytes(),
        )
        .unwrap();
    let t = ev.device_time().unwrap();
    if ctx.device().limits.timestamps {
        assert!(
            t.is_some_and(|t| t.as_nanos() > 0),
            "the device can time launches: {t:?}"
        );
    }
    assert_eq!(bdst.read().unwrap(), src);
}

#[test]
fn second_request_is_a_memory_hit() {
    let Some(ctx) = opencl_context("second_request_is_a_memory_hit") else {
        return;
    };
    let image = opencl_image("saxpy").unwrap();
    let (spec, opts) = (SpecConstants::new(), BuildOptions::default());
    let first = ctx
        .kernel_with(
            &kpc::KernelRequest::new(&image, "saxpy")
                .spec(spec.clone())
                .options(opts.clone()),
        )
        .unwrap();
    assert_eq!(first.source(), Source::Built);
    let before = ctx.stats().memory;
    // A fresh copy of the same bytes is the same key.
    let again = kpc::DeviceImage::new("saxpy", kpc::ImageFormat::OpenClC, image.bytes().to_vec());
    let second = ctx
        .kernel_with(
            &kpc::KernelRequest::new(&again, "saxpy")
                .spec(spec.clone())
                .options(opts.clone()),
        )
        .unwrap();
    assert_eq!(second.source(), Source::Memory);
    let after = ctx.stats().memory;
    assert_eq!(after.builds, before.builds, "nothing was built again");
    assert_eq!(after.hits, before.hits + 1);
    assert_eq!(ctx.stats().backend_counters.programs_built, 1);
    // The hit is the same kernel: it still computes.
    let (x, y) = (random_f32(300), random_f32(300));
    check_saxpy(&run_saxpy(&ctx, &second, -1.0, &x, &y), -1.0, &x, &y, 0.0);
}

#[test]
fn spec_constants_are_definitions_and_part_of_the_key() {
    let Some(ctx) = opencl_context("spec_constants_are_definitions_and_part_of_the_key") else {
        return;
    };
    let n = 777;
    let (x, y) = (random_f32(n), random_f32(n));
    let k80 = saxpy(&ctx, &SpecConstants::new().with(1, SpecValue::I32(80)));
    let k70 = saxpy(&ctx, &SpecConstants::new().with(1, SpecValue::I32(-70)));
    assert_eq!(k80.source(), Source::Built);
    assert_eq!(
        k70.source(),
        Source::Built,
        "a different constant is a different program"
    );
    check_saxpy(&run_saxpy(&ctx, &k80, 2.0, &x, &y), 2.0, &x, &y, 80.0);
    check_saxpy(&run_saxpy(&ctx, &k70, 2.0, &x, &y), 2.0, &x, &y, -70.0);
    // The shipped saxpy declares BIAS as i32: a float is refused, as its SPIR-V twin refuses it.
    let e = ctx
        .kernel_with(
            &kpc::KernelRequest::new(&opencl_image("saxpy").unwrap(), "saxpy")
                .spec(SpecConstants::new().with(1, SpecValue::f32(0.1))),
        )
        .unwrap_err();
    assert!(
        e.to_string().contains("is i32, but f32 0.1 was given"),
        "{e}"
    );
    // With an untyped declaration, a float constant goes through -D exactly.
    let shipped = opencl_image("saxpy").unwrap();
    let untyped = String::from_utf8(shipped.bytes().to_vec())
        .unwrap()
        .replace("kpc-spec-constant 1 BIAS i32", "kpc-spec-constant 1 BIAS");
    let untyped = DeviceImage::opencl_c("saxpy", untyped);
    let kf = ctx
        .kernel_with(
            &kpc::KernelRequest::new(&untyped, "saxpy")
                .spec(SpecConstants::new().with(1, SpecValue::f32(0.1))),
        )
        .unwrap();
    check_saxpy(
        &run_saxpy_unchecked(&ctx, &kf, 1.0, &x, &y),
        1.0,
        &x,
        &y,
        0.1,
    );
    // Three built, and the refused float BIAS cached as the deterministic failure it is.
    assert_eq!(ctx.stats().memory.programs, 4);
    assert_eq!(ctx.stats().backend_counters.programs_built, 3);

    // The workgroup size is a spec constant too, and the kernel reports the specialized one.
    let k32 = saxpy(&ctx, &SpecConstants::new().with(0, SpecValue::U32(32)));
    assert_eq!(k32.info().local_size, [32, 1, 1]);
    check_saxpy(&run_saxpy(&ctx, &k32, 1.0, &x, &y), 1.0, &x, &y, 0.0);

    // An id the image does not declare is a typed error that lists the declared ones.
    let e = ctx
        .kernel_with(
            &kpc::KernelRequest::new(&opencl_image("saxpy").unwrap(), "saxpy")
                .spec(SpecConstants::new().with(9, SpecValue::I32(1))),
        )
        .unwrap_err();
    assert!(
        matches!(&e, Error::InvalidArgument(m) if m.contains("0 LOCAL_SIZE, 1 BIAS")),
        "{e}"
    );
}

#[test]
fn bad_launches_are_typed_errors() {
    let Some(ctx) = opencl_context("bad_launches_are_typed_errors") else {
        return;
    };
    let k = saxpy(&ctx, &SpecConstants::new());
    let a = ctx.buffer::<f32>(16).unwrap();
    let b = ctx.buffer::<f32>(16).unwrap();
    let push = PushConstants::new().u32(16).f32(1.0);
    let q = ctx.queue();

    let e = q
        .launch(&k, [1, 1, 1], &[&a, &b], push.as_bytes())
        .unwrap_err();
    assert!(
        matches!(&e, Error::Launch { message, .. } if message.contains("3 buffer")),
        "{e}"
    );
    let e = q
        .launch(&k, [1, 1, 1], &[&a, &b, &a], &push.as_bytes()[..4])
        .unwrap_err();
    assert!(matches!(e, Error::Size { .. }), "{e}");
    let e = a.write(&[1.0; 15]).unwrap_err();
    assert!(matches!(e, Error::Size { .. }), "{e}");

    // An empty grid is a no-op, as on Vulkan, and still yields a (zero) time.
    let ev = q
        .launch(&k, [0, 1, 1], &[&a, &b, &a], push.as_bytes())
        .unwrap();
    ev.wait().unwrap();

    // Handles from another context (or another backend) are refused, not misused.
    let other = Context::builder()
        .device(ctx.device())
        .config(test_config())
        .build()
        .unwrap();
    let foreign = other.buffer::<f32>(16).unwrap();
    let e = q
        .launch(&k, [1, 1, 1], &[&a, &b, &foreign], push.as_bytes())
        .unwrap_err();
    assert!(matches!(e, Error::Launch { .. }), "{e}");

    // A buffer larger than the device allows is a size error, not an allocation failure.
    let e = ctx.buffer::<u8>(usize::MAX / 2).unwrap_err();
    assert!(matches!(e, Error::Size { .. }), "{e}");
    // An empty buffer is fine (OpenCL has none; kpc allocates one byte).
    let empty = ctx.buffer::<f32>(0).unwrap();
    assert!(empty.read().unwrap().is_empty());
}

#[test]
fn a_batch_runs_in_order_and_is_timed_per_launch() {
    let Some(ctx) = opencl_context("a_batch_runs_in_order_and_is_timed_per_launch") else {
        return;
    };
    let k = saxpy(&ctx, &SpecConstants::new());
    let n = 4096;
    let (x, y) = (random_f32(n), random_f32(n));
    let bx = ctx.buffer_from(&x).unwrap();
    let by = ctx.buffer_from(&y).unwrap();
    let t1: Buffer<f32> = ctx.buffer_from(&vec![f32::NAN; n]).unwrap();
    let t2: Buffer<f32> = ctx.buffer_from(&vec![f32::NAN; n]).unwrap();
    let push = PushConstants::new().u32(n as u32).f32(3.0);
    let g = k.groups_for([n as u64, 1, 1]).unwrap();
    // t1 = 3x + y, then t2 = 3*t1 + y: the second reads what the first wrote.
    let ev = ctx
        .queue()
        .submit(&[
            LaunchDesc {
                kernel: &k,
                groups: g,
                buffers: &[&bx, &by, &t1],
                push_constants: push.as_bytes(),
            },
            LaunchDesc {
                kernel: &k,
                groups: g,
                buffers: &[&t1, &by, &t2],
                push_constants: push.as_bytes(),
            },
        ])
        .unwrap();
    let times = ev.launch_times().unwrap();
    if ctx.device().limits.timestamps {
        assert_eq!(times.map(|t| t.len()), Some(2));
    }
    let out = t2.read().unwrap();
    for i in 0..n {
        let want = 3.0 * (3.0 * x[i] + y[i]) + y[i];
        assert!(
            (out[i] - want).abs() <= 1e-4 * (1.0 + want.abs()),
            "t2[{i}] = {}, want {want}",
            out[i]
        );
    }
}

/// 32 threads launch the same cached kernel at once, each with its own buffers, sizes and scale,
/// several times each; every thread must get exactly its own result.
fn thirty_two_threads(ctx: &Context) {
    let k = saxpy(ctx, &SpecConstants::new().with(1, SpecValue::I32(3)));
    let barrier = std::sync::Barrier::new(32);
    std::thread::scope(|s| {
        for t in 0..32usize {
            let (ctx, barrier) = (ctx.clone(), &barrier);
            let image = opencl_image("saxpy").unwrap();
            s.spawn(move || {
                // Every thread asks the cache for the kernel itself: one build, 31 waits or hits.
                let k = ctx
                    .kernel_with(
                        &kpc::KernelRequest::new(&image, "saxpy")
                            .spec(SpecConstants::new().with(1, SpecValue::I32(3))),
                    )
                    .unwrap();
                barrier.wait();
                for round in 0..4 {
                    let n = 500 + 37 * t + round;
                    let (x, y) = (random_f32(n), random_f32(n));
                    let a = t as f32 - 16.0 + round as f32 * 0.25;
                    let out = run_saxpy(&ctx, &k, a, &x, &y);
                    check_saxpy(&out, a, &x, &y, 3.0);
                }
            });
        }
    });
    assert_eq!(ctx.stats().backend_counters.programs_built, 1);
    assert_eq!(ctx.stats().backend_counters.launches, 32 * 4);
    drop(k);
}

#[test]
fn thirty_two_threads_launch_one_cached_kernel_pool() {
    let Some(b) = opencl_backend(
        "thirty_two_threads_launch_one_cached_kernel_pool",
        &OpenClOptions::default().kernel_sharing(KernelSharing::Pool),
    ) else {
        return;
    };
    let ctx = Context::builder()
        .backend(b)
        .config(test_config())
        .build()
        .unwrap();
    thirty_two_threads(&ctx);
    // The pool grew to at most one object per concurrent launch.
    let pm = ctx.program_manager();
    let a = pm
        .kernel(
            &opencl_image("saxpy").unwrap(),
            "saxpy",
            &SpecConstants::new().with(1, SpecValue::I32(3)),
            &BuildOptions::default(),
        )
        .unwrap();
    let k = a.value.downcast_ref::<OpenClKernel>().unwrap();
    assert_eq!(k.sharing(), KernelSharing::Pool);
    assert!(
        (1..=32).contains(&k.pooled_objects()),
        "{}",
        k.pooled_objects()
    );
}

#[test]
fn thirty_two_threads_launch_one_cached_kernel_clone() {
    let Some(b) = opencl_backend(
        "thirty_two_threads_launch_one_cached_kernel_clone",
        &OpenClOptions::default().kernel_sharing(KernelSharing::ClonePerLaunch),
    ) else {
        return;
    };
    thirty_two_threads(
        &Context::builder()
            .backend(b)
            .config(test_config())
            .build()
            .unwrap(),
    );
}

#[test]
fn thirty_two_threads_launch_one_cached_kernel_lock() {
    let Some(b) = opencl_backend(
        "thirty_two_threads_launch_one_cached_kernel_lock",
        &OpenClOptions::default().kernel_sharing(KernelSharing::Lock),
    ) else {
        return;
    };
    thirty_two_threads(
        &Context::builder()
            .backend(b)
            .config(test_config())
            .build()
            .unwrap(),
    );
}

#[test]
fn opening_a_missing_device_is_a_typed_error() {
    let Some(_) = common::drivers::opencl_device("opening_a_missing_device_is_a_typed_error")
    else {
        return;
    };
    let e = OpenClBackend::open(10_000, &test_config()).unwrap_err();
    assert!(matches!(e, Error::NoSuchDevice { .. }), "{e}");
}
