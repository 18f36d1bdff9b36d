//! The safe launch is sound on every backend: a buffer shorter than a kernel indexes is refused
//! with `Error::Size` before anything runs (a kernel with declared access bounds, like the shipped
//! `saxpy`), a kernel nothing bounds is refused with `Error::Unbounded` on a device without robust
//! buffer access (PoCL; lavapipe with `KPC_VULKAN_ROBUST_ACCESS=0`), and runs through the safe API
//! on a robust Vulkan device. Each case runs in a child process, so a regression that writes out of
//! bounds (on PoCL: into the process's heap) kills the child, not this test binary.

use crate::common;

use common::disk::{child, child_role};
use common::drivers;
use kpc::prelude::*;
use kpc::{BufferBound, Extent, declare_access_bounds};

/// What every child prints last when all its checks passed.
const DONE: &str = "launch-bounds child: all checks passed";

/// Runs `test` again in a child process in `role`, with `env`, and asserts it passed.
fn in_child(test: &str, role: &str, env: &[(&str, &str)]) -> String {
    let mut c = child(test, role);
    for (k, v) in env {
        c.env(k, v);
    }
    let out = c.output().expect("run the child");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stdout.contains(DONE),
        "child {role} of {test} failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
    stdout
}

fn saxpy_push(n: u32) -> PushConstants {
    PushConstants::new().u32(n).f32(3.0)
}

/// The shipped saxpy over `n` elements into an output of 10: refused with `Error::Size` naming the
/// output binding, and nothing written; then a launch that fits runs.
fn short_output_is_refused(ctx: &Context, image: &DeviceImage) {
    let k = ctx.kernel(image, "saxpy").unwrap();
    assert!(
        k.has_access_bounds(),
        "the shipped saxpy declares its bounds"
    );
    for n in [1000usize, 100_000] {
        let x = ctx.buffer_from(&vec![1.0f32; n]).unwrap();
        let y = ctx.buffer_from(&vec![2.0f32; n]).unwrap();
        let out = ctx.buffer_from(&[7.0f32; 10]).unwrap();
        let groups = k.groups_for([n as u64, 1, 1]).unwrap();
        let push = saxpy_push(n as u32);
        let e = ctx
            .queue()
            .launch(&k, groups, &[&x, &y, &out], push.as_bytes())
            .unwrap_err();
        let Error::Size {
            what,
            got,
            expected,
        } = &e
        else {
            panic!("expected Error::Size, got {e:?}");
        };
        assert!(what.contains("binding 2") && what.contains("saxpy"), "{e}");
        assert_eq!(got, "40 bytes", "{e}");
        assert!(
            expected.contains(&format!("at least {} bytes", 4 * n)),
            "{e}"
        );
        // The extent in words, not as a Rust value.
        assert!(
            expected.contains("the smaller of the u32 push constant at byte 0 and the work-items")
                && !expected.contains("PushOrGlobal"),
            "{e}"
        );
        // The same refusal through the unsafe path: declared bounds are checked there too.
        // SAFETY: nothing is launched (the declared bound refuses it), and were it launched the
        // bound would have been met.
        let unchecked = unsafe {
            ctx.queue()
                .launch_unchecked(&k, groups, &[&x, &y, &out], push.as_bytes())
        };
        assert!(
            matches!(unchecked, Err(Error::Size { .. })),
            "{unchecked:?}"
        );
        ctx.queue().finish().unwrap();
        assert_eq!(out.read().unwrap(), vec![7.0f32; 10], "nothing was written");
        // A launch the output fits (n = 10) runs: 3 * 1 + 2.
        let fits = saxpy_push(10);
        let g10 = k.groups_for([10, 1, 1]).unwrap();
        ctx.queue()
            .launch(&k, g10, &[&x, &y, &out], fits.as_bytes())
            .unwrap()
            .wait()
            .unwrap();
        assert_eq!(out.read().unwrap(), vec![5.0f32; 10]);
        // More work-items than n do not raise the bound: n caps what each buffer must hold.
        let wide = k.groups_for([4096, 1, 1]).unwrap();
        ctx.queue()
            .launch(&k, wide, &[&x, &y, &out], fits.as_bytes())
            .unwrap()
            .wait()
            .unwrap();
    }
    println!("short output refused with Error::Size, nothing written");
}

/// A kernel nothing bounds (`image`, not a shipped image): refused by the safe launch on a device
/// without robust access, run by the unsafe one with buffers that fit; where the device is
/// robust, the safe launch runs it.
fn unbounded_kernel(ctx: &Context, image: &DeviceImage) {
    let k = ctx.kernel(image, "saxpy").unwrap();
    assert!(!k.has_access_bounds());
    let n = 64usize;
    let x = ctx.buffer_from(&vec![1.0f32; n]).unwrap();
    let y = ctx.buffer_from(&vec![2.0f32; n]).unwrap();
    let out = ctx.buffer::<f32>(n).unwrap();
    let groups = k.groups_for([n as u64, 1, 1]).unwrap();
    let push = saxpy_push(n as u32);
    let safe = ctx
        .queue()
        .launch(&k, groups, &[&x, &y, &out], push.as_bytes());
    if ctx.device().limits.robust_buffer_access {
        safe.unwrap().wait().unwrap();
        println!("robust device: an undeclared kernel runs through the safe launch");
    } else {
        let e = safe.unwrap_err();
        assert!(matches!(e, Error::Unbounded { .. }), "{e:?}");
        assert!(e.to_string().contains("submit_unchecked"), "{e}");
        // SAFETY: every buffer holds n elements and the kernel touches element i < n only.
        unsafe {
            ctx.queue()
                .launch_unchecked(&k, groups, &[&x, &y, &out], push.as_bytes())
        }
        .unwrap()
        .wait()
        .unwrap();
        println!("no robust access: an undeclared kernel is Error::Unbounded, runs unchecked");
    }
    assert_eq!(out.read().unwrap(), vec![5.0f32; n]);
    // Declaring its bounds makes the safe launch check (and run) it on any device.
    // SAFETY: saxpy touches element i of each of its three buffers only while i < n and i is
    // below the work-item count, which is what PushOrGlobal(0, 0) of 4-byte elements says.
    unsafe {
        declare_access_bounds(
            image,
            "saxpy",
            &[0, 1, 2].map(|p| BufferBound::new(p, Extent::PushOrGlobal(0, 0), 4)),
        )
    }
    .unwrap();
    let k = ctx.kernel(image, "saxpy").unwrap();
    assert!(k.has_access_bounds());
    let short = ctx.buffer::<f32>(n / 2).unwrap();
    let e = ctx
        .queue()
        .launch(&k, groups, &[&x, &y, &short], push.as_bytes())
        .unwrap_err();
    assert!(matches!(e, Error::Size { .. }), "{e:?}");
    // Two bounds on one parameter are refused.
    // SAFETY: refused before it is recorded.
    let twice = unsafe {
        declare_access_bounds(
            image,
            "saxpy",
            &[0, 0].map(|p| BufferBound::new(p, Extent::Push(0), 4)),
        )
    };
    assert!(matches!(twice, Err(Error::InvalidArgument(_))), "{twice:?}");
}

/// A user OpenCL C kernel: saxpy's source with a comment of its own, so no declaration covers it.
fn user_opencl_saxpy() -> DeviceImage {
    let shipped = kpc::kernels::opencl_image("saxpy").unwrap();
    let mut src = String::from_utf8(shipped.bytes().to_vec()).unwrap();
    src.push_str("\n// a user's copy\n");
    DeviceImage::new("user_saxpy", kpc::ImageFormat::OpenClC, src.into_bytes())
}

#[test]
fn short_buffer_refused_opencl() {
    let test = "short_buffer_refused_opencl";
    match child_role().as_deref() {
        Some("opencl") => {
            let ctx = drivers::opencl_context(test).expect("the parent found a device");
            assert!(!ctx.device().limits.robust_buffer_access);
            short_output_is_refused(&ctx, &kpc::kernels::opencl_image("saxpy").unwrap());
            unbounded_kernel(&ctx, &user_opencl_saxpy());
            println!("{DONE}");
        }
        Some(_) => {}
        None => {
            if drivers::opencl_device(test).is_none() {
                return;
            }
            let out = in_child(test, "opencl", &[]);
            assert!(out.contains("Error::Unbounded, runs unchecked"), "{out}");
        }
    }
}

#[test]
fn short_buffer_refused_vulkan() {
    let test = "short_buffer_refused_vulkan";
    match child_role().as_deref() {
        Some(role @ ("robust" | "fragile")) => {
            let ctx = drivers::vulkan_context(test).expect("the parent found a device");
            assert_eq!(ctx.device().limits.robust_buffer_access, role == "robust");
            let robust = ctx.device().fingerprint.describe();
            assert!(
                robust.contains(&format!(
                    "robust_buffer_access={}",
                    u8::from(role == "robust")
                )),
                "{robust}"
            );
            short_output_is_refused(&ctx, &kpc::kernels::spirv_image("saxpy").unwrap());
            // kpc's own GLSL compile of saxpy is SPIR-V no declaration covers.
            unbounded_kernel(&ctx, &kpc::kernels::glsl_image("saxpy").unwrap());
            println!("{DONE}");
        }
        Some(_) => {}
        None => {
            let Some(dev) = drivers::vulkan_device(test) else {
                return;
            };
            assert!(
                dev.limits.robust_buffer_access,
                "lavapipe has robustBufferAccess, and kpc enables it"
            );
            let out = in_child(test, "robust", &[]);
            assert!(
                out.contains("robust device: an undeclared kernel runs"),
                "{out}"
            );
            let out = in_child(test, "fragile", &[("KPC_VULKAN_ROBUST_ACCESS", "0")]);
            assert!(out.contains("Error::Unbounded, runs unchecked"), "{out}");
        }
    }
}

#[test]
fn robust_access_variable_is_checked() {
    let test = "robust_access_variable_is_checked";
    match child_role().as_deref() {
        Some("bad") => {
            let vulkan = kpc::DeviceSelector::parse("vulkan:0").unwrap();
            let e = kpc::select_device(&vulkan)
                .and_then(|d| {
                    Context::builder()
                        .device(&d)
                        .config(drivers::test_config())
                        .build()
                })
                .unwrap_err()
                .to_string();
            assert!(
                e.contains("KPC_VULKAN_ROBUST_ACCESS") && e.contains("sometimes"),
                "{e}"
            );
            println!("{DONE}");
        }
        Some(_) => {}
        None => {
            if drivers::vulkan_device(test).is_none() {
                return;
            }
            in_child(test, "bad", &[("KPC_VULKAN_ROBUST_ACCESS", "sometimes")]);
        }
    }
}
