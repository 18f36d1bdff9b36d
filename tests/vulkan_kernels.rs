//! Real kernels on a real Vulkan driver (lavapipe in CI): outputs checked against the host, the
//! memory cache, specialization, launch checking, batches and timing.

use crate::common;

use kpc::Source;
use kpc::admin::vulkan::{BufferStrategy, VulkanBackend, VulkanOptions};
use kpc::kernels::spirv_image;
use kpc::{Buffer, Context, Error, PushConstants};
use kpc::{BuildOptions, SpecConstants, SpecValue};

use common::drivers::{check_read_kernel, random_f32, test_config, vulkan_backend, vulkan_context};

fn saxpy(ctx: &Context, spec: &SpecConstants) -> kpc::Kernel {
    ctx.kernel_with(
        &kpc::KernelRequest::new(&spirv_image("saxpy").unwrap(), "saxpy").spec(spec.clone()),
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
    let Some(ctx) = vulkan_context("saxpy_output_matches_the_host") else {
        return;
    };
    let n = 64 * 37 + 13;
    let (x, y) = (random_f32(n), random_f32(n));
    let k = saxpy(&ctx, &SpecConstants::new());
    assert_eq!(k.info().local_size, [64, 1, 1]);
    let out = run_saxpy(&ctx, &k, 1.75, &x, &y);
    check_saxpy(&out, 1.75, &x, &y, 0.0);
}

#[test]
fn staging_buffers_carry_the_same_results() {
    let Some(b) = vulkan_backend(
        "staging_buffers_carry_the_same_results",
        &VulkanOptions::default().buffers(BufferStrategy::Staging),
    ) else {
        return;
    };
    assert!(!b.host_visible_buffers());
    let ctx = Context::builder()
        .backend(b)
        .config(test_config())
        .build()
        .unwrap();
    let n = 5000;
    let (x, y) = (random_f32(n), random_f32(n));
    let k = saxpy(&ctx, &SpecConstants::new());
    let out = run_saxpy(&ctx, &k, -0.5, &x, &y);
    check_saxpy(&out, -0.5, &x, &y, 0.0);

    // Partial writes and reads at offsets go through staging too.
    let buf = ctx.buffer_from(&vec![0u32; 100]).unwrap();
    buf.write_at(40, &[7, 8, 9]).unwrap();
    let mut mid = [0u32; 5];
    buf.read_at(39, &mut mid).unwrap();
    assert_eq!(mid, [0, 7, 8, 9, 0]);
}

#[test]
fn read_kernel_xors_what_it_reads() {
    let Some(ctx) = vulkan_context("read_kernel_xors_what_it_reads") else {
        return;
    };
    check_read_kernel(&ctx, &spirv_image("read").unwrap());
}

#[test]
fn copy_kernel_copies_with_a_grid_stride_loop() {
    let Some(ctx) = vulkan_context("copy_kernel_copies_with_a_grid_stride_loop") else {
        return;
    };
    let k = ctx.kernel(&spirv_image("copy").unwrap(), "copy").unwrap();
    assert_eq!(k.info().push_constant_bytes, 4);
    let n = 100_003usize; // uvec4 elements
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
        assert!(t.is_some(), "the device can time launches");
    }
    assert_eq!(bdst.read().unwrap(), src);
}

#[test]
fn second_request_is_a_memory_hit() {
    let Some(ctx) = vulkan_context("second_request_is_a_memory_hit") else {
        return;
    };
    let image = spirv_image("saxpy").unwrap();
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
    // A clone of the image and a fresh copy of its bytes are the same key.
    let again = kpc::DeviceImage::spirv("saxpy", image.bytes().to_vec()).unwrap();
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
}

#[test]
fn spec_constants_80_and_70_are_two_pipelines_with_different_results() {
    let Some(ctx) =
        vulkan_context("spec_constants_80_and_70_are_two_pipelines_with_different_results")
    else {
        return;
    };
    let n = 777;
    let (x, y) = (random_f32(n), random_f32(n));
    let k80 = saxpy(&ctx, &SpecConstants::new().with(1, SpecValue::I32(80)));
    let k70 = saxpy(&ctx, &SpecConstants::new().with(1, SpecValue::I32(70)));
    assert_eq!(k80.source(), Source::Built);
    assert_eq!(
        k70.source(),
        Source::Built,
        "a different constant is a different program"
    );
    let o80 = run_saxpy(&ctx, &k80, 2.0, &x, &y);
    let o70 = run_saxpy(&ctx, &k70, 2.0, &x, &y);
    check_saxpy(&o80, 2.0, &x, &y, 80.0);
    check_saxpy(&o70, 2.0, &x, &y, 70.0);
    assert_eq!(ctx.stats().memory.programs, 2);
    assert_eq!(ctx.stats().backend_counters.programs_built, 2);

    // The workgroup size is a spec constant too, and the kernel reports the specialized one.
    let k32 = saxpy(&ctx, &SpecConstants::new().with(0, SpecValue::U32(32)));
    assert_eq!(k32.info().local_size, [32, 1, 1]);
    let out = run_saxpy(&ctx, &k32, 1.0, &x, &y);
    check_saxpy(&out, 1.0, &x, &y, 0.0);
}

#[test]
fn bad_launches_are_typed_errors() {
    let Some(ctx) = vulkan_context("bad_launches_are_typed_errors") else {
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
    let e = a.write_at(10, &[1.0; 7]).unwrap_err();
    assert!(matches!(e, Error::Size { .. }), "{e}");
    let e = a.read_at(usize::MAX, &mut [0.0; 2]).unwrap_err();
    assert!(matches!(e, Error::Size { .. }), "{e}");

    let max = ctx.device().limits.max_workgroup_count[0];
    if max < u32::MAX {
        let e = q
            .launch(&k, [max + 1, 1, 1], &[&a, &b, &a], push.as_bytes())
            .unwrap_err();
        assert!(matches!(e, Error::Launch { .. }), "{e}");
    }

    // Handles from another context are refused, not misused.
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
    let e = other
        .queue()
        .launch(
            &k,
            [1, 1, 1],
            &[&foreign, &foreign, &foreign],
            push.as_bytes(),
        )
        .unwrap_err();
    assert!(matches!(e, Error::InvalidArgument(_)), "{e}");

    let e = ctx
        .kernel(&spirv_image("saxpy").unwrap(), "main")
        .unwrap_err();
    assert!(
        matches!(&e, Error::UnknownKernel { available, .. } if available == "saxpy"),
        "{e}"
    );
}

#[test]
fn a_batch_runs_in_order_and_is_timed_per_launch() {
    let Some(ctx) = vulkan_context("a_batch_runs_in_order_and_is_timed_per_launch") else {
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
            kpc::LaunchDesc {
                kernel: &k,
                groups: g,
                buffers: &[&bx, &by, &t1],
                push_constants: push.as_bytes(),
            },
            kpc::LaunchDesc {
                kernel: &k,
                groups: g,
                buffers: &[&t1, &by, &t2],
                push_constants: push.as_bytes(),
            },
        ])
        .unwrap();
    if let Some(times) = ev.launch_times().unwrap() {
        assert_eq!(times.len(), 2);
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

/// Many one-launch batches submitted back to back, as decode steps are: the submitter may carry
/// several in one command buffer while the device is busy. Each must still run after the one
/// before it, an event waited out of order must still finish (and be timed), and a read with every
/// event dropped unwaited must still see all of them.
#[test]
fn back_to_back_batches_run_in_order_and_each_event_waits() {
    let Some(b) = vulkan_backend(
        "back_to_back_batches_run_in_order_and_each_event_waits",
        &VulkanOptions::default().buffers(BufferStrategy::Staging),
    ) else {
        return;
    };
    let ctx = Context::builder()
        .backend(b)
        .config(test_config())
        .build()
        .unwrap();
    let k = saxpy(&ctx, &SpecConstants::new());
    let n = 20_000;
    let (x, y) = (random_f32(n), random_f32(n));
    let by = ctx.buffer_from(&y).unwrap();
    let bufs: [Buffer<f32>; 2] = [ctx.buffer_from(&x).unwrap(), ctx.buffer(n).unwrap()];
    let push = PushConstants::new().u32(n as u32).f32(1.0);
    let g = k.groups_for([n as u64, 1, 1]).unwrap();
    let steps = 40;
    // Step i: bufs[(i + 1) % 2] = bufs[i % 2] + y, so after `steps` of them x + steps * y.
    let mut events = Vec::new();
    for i in 0..steps {
        let (src, dst) = (&bufs[i % 2], &bufs[(i + 1) % 2]);
        events.push(
            ctx.queue()
                .launch(&k, g, &[src, &by, dst], push.as_bytes())
                .unwrap(),
        );
    }
    events[steps / 2].wait().unwrap();
    if let Some(t) = events[steps / 2].device_time().unwrap() {
        assert!(t.as_nanos() > 0);
    }
    drop(events);
    let out = bufs[steps % 2].read().unwrap();
    for i in 0..n {
        let want = x[i] + steps as f32 * y[i];
        assert!(
            (out[i] - want).abs() <= 1e-4 * (1.0 + want.abs()),
            "out[{i}] = {}, want {want}",
            out[i]
        );
    }
}

#[test]
fn kernels_launch_from_many_threads() {
    let Some(ctx) = vulkan_context("kernels_launch_from_many_threads") else {
        return;
    };
    let k = saxpy(&ctx, &SpecConstants::new());
    std::thread::scope(|s| {
        for t in 0..8 {
            let (ctx, k) = (ctx.clone(), k.clone());
            s.spawn(move || {
                let n = 1000 + t * 17;
                let (x, y) = (random_f32(n), random_f32(n));
                let out = run_saxpy(&ctx, &k, t as f32, &x, &y);
                check_saxpy(&out, t as f32, &x, &y, 0.0);
            });
        }
    });
}

#[test]
fn opening_a_missing_device_is_a_typed_error() {
    let Some(_) = common::drivers::vulkan_device("opening_a_missing_device_is_a_typed_error")
    else {
        return;
    };
    let e = VulkanBackend::open(10_000, &test_config()).unwrap_err();
    assert!(matches!(e, Error::NoSuchDevice { .. }), "{e}");
}
