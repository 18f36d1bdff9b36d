//! Helpers for tests that need a real driver.
//!
//! A driver test may skip only where no driver is installed, and the skip must be visible:
//! - it prints `SKIPPED <test>: <reason>` on stderr;
//! - with `KPC_TEST_REQUIRE_DRIVERS=1` (set by scripts/test.sh, hence CI) a missing driver fails the
//!   test instead;
//! - with `KPC_TEST_DRIVER_LOG=<file>` every driver test appends `ran <backend> <test>` or
//!   `skipped <backend> <test>` to the file, which scripts/test.sh counts and prints.
use std::io::Write;

use kpc::DeviceInfo;
use kpc::admin::opencl::{OpenClBackend, OpenClOptions};
use kpc::admin::vulkan::{VulkanBackend, VulkanOptions};
use kpc::{Config, Context};

/// Declares each case once for every backend: `fn name(backend, test) { body }` becomes
/// `mod name { fn vulkan(); fn opencl(); }`, two tests whose body runs with `backend` (a
/// [`kpc::BackendKind`]) and `test` (the test's name, `name::vulkan`) bound. The body gets
/// its device through [`device`] (or a helper built on it), which reports a skip, or fails under
/// `KPC_TEST_REQUIRE_DRIVERS`, where that backend's driver is missing: no twin functions per backend.
#[macro_export]
macro_rules! backend_tests {
    ($( $(#[$m:meta])* fn $name:ident($backend:ident, $test:ident) $body:block )+) => {$(
        $(#[$m])*
        mod $name {
            #[allow(unused_imports)]
            use super::*;
            fn case($backend: kpc::BackendKind, $test: &'static str) $body
            #[test]
            fn vulkan() {
                case(kpc::BackendKind::Vulkan, concat!(stringify!($name), "::vulkan"))
            }
            #[test]
            fn opencl() {
                case(kpc::BackendKind::OpenCl, concat!(stringify!($name), "::opencl"))
            }
        }
    )+};
}

/// The first usable device of `backend`, or a reported skip: [`vulkan_device`] or [`opencl_device`].
pub fn device(backend: kpc::BackendKind, test: &str) -> Option<DeviceInfo> {
    match backend {
        kpc::BackendKind::Vulkan => vulkan_device(test),
        kpc::BackendKind::OpenCl => opencl_device(test),
    }
}

/// Whether a missing driver fails the test run (CI) rather than skipping.
pub fn drivers_required() -> bool {
    std::env::var("KPC_TEST_REQUIRE_DRIVERS").is_ok_and(|v| v.trim() == "1")
}

fn log(what: &str, backend: &str, test: &str) {
    if let Some(path) = std::env::var_os("KPC_TEST_DRIVER_LOG") {
        // One short O_APPEND write per line: lines from parallel tests do not interleave.
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
        {
            let _ = f.write_all(format!("{what} {backend} {test}\n").as_bytes());
        }
    }
}

/// Records that `test` ran with `backend` (a driver, or a tool such as glslang) present.
pub fn ran(backend: &str, test: &str) {
    log("ran", backend, test);
}

/// Reports that `test` cannot run for `reason`: a failure under `KPC_TEST_REQUIRE_DRIVERS=1`, a
/// visible skip otherwise.
pub fn skip<T>(backend: &str, test: &str, reason: &str) -> Option<T> {
    if drivers_required() {
        panic!("{test} needs a {backend} driver, and KPC_TEST_REQUIRE_DRIVERS=1: {reason}");
    }
    eprintln!("SKIPPED {test}: {reason}");
    log("skipped", backend, test);
    None
}

/// The first usable Vulkan device, or a reported skip. Counts the test as run when it returns one.
pub fn vulkan_device(test: &str) -> Option<DeviceInfo> {
    match kpc::admin::vulkan::devices() {
        Ok(devs) => match devs.into_iter().find(|d| d.unusable.is_none()) {
            Some(d) => {
                ran("vulkan", test);
                Some(d)
            }
            None => skip("vulkan", test, "no usable Vulkan device"),
        },
        Err(e) => skip("vulkan", test, &e.to_string()),
    }
}

/// A configuration for tests: no disk cache (tests never touch the user's), memory cache on.
pub fn test_config() -> Config {
    Config::builder()
        .persistent(false)
        .build()
        .expect("valid test config")
}

/// A context on the first usable Vulkan device, or a reported skip.
pub fn vulkan_context(test: &str) -> Option<Context> {
    let d = vulkan_device(test)?;
    Some(
        Context::builder()
            .device(&d)
            .config(test_config())
            .build()
            .expect("open the Vulkan device"),
    )
}

/// The first usable Vulkan device opened directly, with `options`, or a reported skip.
pub fn vulkan_backend(test: &str, options: &VulkanOptions) -> Option<VulkanBackend> {
    let d = vulkan_device(test)?;
    Some(
        VulkanBackend::open_with(d.index, &test_config(), options).expect("open the Vulkan device"),
    )
}

/// The first usable OpenCL device (PoCL in CI), or a reported skip. Counts the test as run when it
/// returns one.
pub fn opencl_device(test: &str) -> Option<DeviceInfo> {
    match kpc::admin::opencl::devices() {
        Ok(devs) => match devs.into_iter().find(|d| d.unusable.is_none()) {
            Some(d) => {
                ran("opencl", test);
                Some(d)
            }
            None => skip("opencl", test, "no usable OpenCL device"),
        },
        Err(e) => skip("opencl", test, &e.to_string()),
    }
}

/// A context on the first usable OpenCL device, or a reported skip.
pub fn opencl_context(test: &str) -> Option<Context> {
    let d = opencl_device(test)?;
    Some(
        Context::builder()
            .device(&d)
            .config(test_config())
            .build()
            .expect("open the OpenCL device"),
    )
}

/// The first usable OpenCL device opened directly, with `options`, or a reported skip.
pub fn opencl_backend(test: &str, options: &OpenClOptions) -> Option<OpenClBackend> {
    let d = opencl_device(test)?;
    Some(
        OpenClBackend::open_with(d.index, &test_config(), options).expect("open the OpenCL device"),
    )
}

/// `n` random floats in [-1, 1).
pub fn random_f32(n: usize) -> Vec<f32> {
    use rand::Rng;
    let mut r = rand::rng();
    (0..n).map(|_| r.random_range(-1.0f32..1.0)).collect()
}

/// Runs the shipped read kernel on `ctx` (`image` is its image for the context's backend) with
/// far fewer workgroups than elements, and checks that the XOR of its per-workgroup outputs is the
/// XOR of its input, also after one bit of the last element is flipped.
pub fn check_read_kernel(ctx: &Context, image: &kpc::DeviceImage) {
    use kpc::{Buffer, PushConstants};
    let k = ctx.kernel(image, "read").unwrap();
    assert_eq!(k.info().push_constant_bytes, 4);
    let n = 100_003usize; // 16-byte elements
    let groups = 5;
    let xor4 = |x: &[u32]| {
        let mut r = [0u32; 4];
        for (i, w) in x.iter().enumerate() {
            r[i % 4] ^= w;
        }
        r
    };
    let mut src: Vec<u32> = (0..4 * n as u32)
        .map(|i| i.wrapping_mul(2_654_435_761) ^ (i >> 3))
        .collect();
    let bsrc = ctx.buffer_from(&src).unwrap();
    let bdst: Buffer<u32> = ctx.buffer_from(&vec![0xdead_beef; 4 * groups]).unwrap();
    // Far fewer groups than elements: the loop must cover the rest, and each group writes one.
    let run = || {
        ctx.queue()
            .launch(
                &k,
                [groups as u32, 1, 1],
                &[&bsrc, &bdst],
                PushConstants::new().u32(n as u32).as_bytes(),
            )
            .unwrap()
            .wait()
            .unwrap();
        xor4(&bdst.read().unwrap())
    };
    let want = xor4(&src);
    assert_ne!(want, [0; 4]);
    assert_eq!(run(), want);
    // Every element counts: one flipped bit anywhere changes the result.
    src[4 * (n - 1) + 2] ^= 1 << 17;
    bsrc.write(&src).unwrap();
    assert_eq!(run(), xor4(&src));
}

/// Fails `test` if the validation layer reported an error on kpc's own Vulkan instance. Where the
/// run asks for validation (`KPC_VULKAN_VALIDATION`, which scripts/test.sh sets), also fails unless
/// kpc really runs under the layer, so that "no errors" cannot mean "not checked".
pub fn assert_no_validation_errors(test: &str) {
    let asked = std::env::var("KPC_VULKAN_VALIDATION")
        .is_ok_and(|v| !matches!(v.trim(), "" | "0" | "false" | "no" | "off"));
    if asked {
        assert!(
            kpc::admin::vulkan::validation_enabled(),
            "{test}: KPC_VULKAN_VALIDATION is set but kpc's instance runs without the layer"
        );
    }
    assert_eq!(
        kpc::admin::vulkan::validation_errors(),
        0,
        "{test}: the validation layer reported errors (printed on stderr)"
    );
}
