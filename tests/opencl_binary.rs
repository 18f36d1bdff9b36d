//! Persisting OpenCL programs: the CL_PROGRAM_BINARIES round trip through kpc's container, and
//! binaries that must be refused (a miss, never an error to the user). Drives the backend traits
//! directly, as the runtime and the disk cache do.

use crate::common;

use std::sync::Arc;

use kpc::BackendKind;
use kpc::admin::backend::{Backend, ComputeBackend, DeviceFingerprint, Launch};
use kpc::admin::opencl::{OpenClBinary, OpenClOptions, Origin};
use kpc::kernels::opencl_image;
use kpc::{BuildOptions, SpecConstants, SpecValue};
use kpc::{Error, PushConstants};

use common::drivers::{opencl_backend, random_f32};

fn run_saxpy<B: ComputeBackend>(b: &B, k: &B::Kernel, a: f32, bias: f32) {
    let n = 1000;
    let (x, y) = (random_f32(n), random_f32(n));
    let bufs: Vec<Arc<B::Buffer>> = (0..3)
        .map(|_| Arc::new(b.create_buffer(4 * n as u64).unwrap()))
        .collect();
    b.write_buffer(&bufs[0], 0, kpc::admin::backend::as_bytes(&x))
        .unwrap();
    b.write_buffer(&bufs[1], 0, kpc::admin::backend::as_bytes(&y))
        .unwrap();
    b.write_buffer(
        &bufs[2],
        0,
        kpc::admin::backend::as_bytes(&vec![f32::NAN; n]),
    )
    .unwrap();
    let push = PushConstants::new().u32(n as u32).f32(a);
    let ev = b
        .submit(&[Launch {
            kernel: k,
            groups: [n.div_ceil(64) as u32, 1, 1],
            buffers: bufs.clone(),
            push_constants: push.as_bytes(),
        }])
        .unwrap();
    b.wait(&ev).unwrap();
    let mut out = vec![0f32; n];
    b.read_buffer(&bufs[2], 0, kpc::admin::backend::as_bytes_mut(&mut out))
        .unwrap();
    for i in 0..n {
        let want = a * x[i] + y[i] + bias;
        assert!(
            (out[i] - want).abs() <= 1e-5 * (1.0 + want.abs()),
            "out[{i}] = {}, want {want}",
            out[i]
        );
    }
}

#[test]
fn a_program_comes_back_from_its_binary_and_computes() {
    let Some(b) = opencl_backend(
        "a_program_comes_back_from_its_binary_and_computes",
        &OpenClOptions::default(),
    ) else {
        return;
    };
    let image = opencl_image("saxpy").unwrap();
    let spec = SpecConstants::new().with(1, SpecValue::I32(5));
    let opts = BuildOptions::default();
    let built = b.build_program(&image, &spec, &opts).unwrap();
    assert_eq!(built.origin(), Origin::Built);
    assert!(
        !built.has_binary(),
        "the binary is made only when asked for"
    );
    let blob = b
        .program_binary(&built)
        .unwrap()
        .expect("OpenCL persists every program");
    assert!(built.binary_time().is_some());
    // Asking again returns the same bytes without querying the driver again.
    assert_eq!(b.program_binary(&built).unwrap().unwrap(), blob);
    let parsed = OpenClBinary::decode(&blob).unwrap();
    assert_eq!(parsed.device, b.fingerprint().digest);
    assert_eq!(parsed.kernels.len(), 1);
    assert!(!parsed.driver_binary.is_empty());

    let loaded = Arc::new(b.program_from_binary(&image, &spec, &opts, &blob).unwrap());
    assert_eq!(loaded.origin(), Origin::Loaded);
    assert_eq!(b.stats().programs_loaded, 1);
    assert_eq!(b.stats().programs_built, 1);
    // A loaded program persists as the very bytes it came from.
    assert_eq!(b.program_binary(&loaded).unwrap().unwrap(), blob);
    let k = b.create_kernel(&loaded, "saxpy").unwrap();
    let built_k = b.create_kernel(&Arc::new(built), "saxpy").unwrap();
    assert_eq!(
        kpc::admin::backend::KernelObject::info(&k),
        kpc::admin::backend::KernelObject::info(&built_k),
        "the interface travels with the binary"
    );
    run_saxpy(&b, &k, 2.0, 5.0);
}

#[test]
fn binaries_that_do_not_fit_are_rejected_as_misses() {
    let Some(b) = opencl_backend(
        "binaries_that_do_not_fit_are_rejected_as_misses",
        &OpenClOptions::default(),
    ) else {
        return;
    };
    let image = opencl_image("saxpy").unwrap();
    let spec = SpecConstants::new();
    let opts = BuildOptions::default();
    let built = b.build_program(&image, &spec, &opts).unwrap();
    let blob = b.program_binary(&built).unwrap().unwrap();
    let good = OpenClBinary::decode(&blob).unwrap();
    let rejected = |bytes: &[u8], why: &str| {
        let before = b.stats().binaries_rejected;
        match b.program_from_binary(&image, &spec, &opts, bytes) {
            Err(Error::BinaryRejected {
                backend: BackendKind::OpenCl,
                reason,
                ..
            }) => {
                assert!(reason.contains(why), "{why}: {reason}");
            }
            Err(other) => panic!("{why}: expected a rejection, got {other}"),
            Ok(_) => panic!("{why}: accepted"),
        }
        assert_eq!(b.stats().binaries_rejected, before + 1);
    };

    // Garbage of several sizes, and every truncation of a real binary's header.
    rejected(b"", "truncated");
    rejected(&[0x5a; 4096], "magic");
    rejected(&blob[..blob.len() / 2], "");
    rejected(&blob[..100], "");

    // A binary from another device description (any fingerprint field differs).
    let mut fields = b.fingerprint().fields.clone();
    fields[4].1.push_str("-other");
    let other = DeviceFingerprint::new(BackendKind::OpenCl, fields);
    assert_ne!(other.digest, b.fingerprint().digest);
    let mut foreign = good.clone();
    foreign.device = other.digest;
    rejected(&foreign.encode(), "another device");

    // A binary of another build: other spec constants, options or image.
    rejected_for(
        &b,
        &blob,
        &image,
        &SpecConstants::new().with(1, SpecValue::I32(1)),
        &opts,
    );
    rejected_for(
        &b,
        &blob,
        &image,
        &spec,
        &BuildOptions::new("-cl-fast-relaxed-math"),
    );
    rejected_for(&b, &blob, &opencl_image("copy").unwrap(), &spec, &opts);

    // The right header around bytes the driver cannot load: the driver refuses, still a miss.
    let mut junk = good.clone();
    junk.driver_binary = vec![0xa5; 2048];
    rejected(&junk.encode(), "refused");

    // The real binary still loads after all that.
    b.program_from_binary(&image, &spec, &opts, &blob).unwrap();
}

fn rejected_for(
    b: &kpc::admin::opencl::OpenClBackend,
    blob: &[u8],
    image: &kpc::DeviceImage,
    spec: &SpecConstants,
    opts: &BuildOptions,
) {
    let e = b
        .program_from_binary(image, spec, opts, blob)
        .expect_err("refused");
    assert!(
        matches!(&e, Error::BinaryRejected { reason, .. } if reason.contains("another image")),
        "{e}"
    );
}

#[test]
fn concurrent_binary_requests_query_the_driver_once() {
    let Some(b) = opencl_backend(
        "concurrent_binary_requests_query_the_driver_once",
        &OpenClOptions::default(),
    ) else {
        return;
    };
    let image = opencl_image("copy").unwrap();
    let built = b
        .build_program(&image, &SpecConstants::new(), &BuildOptions::default())
        .unwrap();
    let blobs: Vec<Vec<u8>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..8)
            .map(|_| s.spawn(|| b.program_binary(&built).unwrap().unwrap()))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert!(blobs.windows(2).all(|w| w[0] == w[1]));
}

#[test]
fn the_backend_checks_launch_arguments_itself() {
    // The runtime's queue checks these before a launch reaches the backend; a caller driving the
    // backend directly gets the same typed error, not a panic or a driver fault.
    let Some(b) = opencl_backend(
        "the_backend_checks_launch_arguments_itself",
        &OpenClOptions::default(),
    ) else {
        return;
    };
    let image = opencl_image("saxpy").unwrap();
    let p = Arc::new(
        b.build_program(&image, &SpecConstants::new(), &BuildOptions::default())
            .unwrap(),
    );
    let k = b.create_kernel(&p, "saxpy").unwrap();
    let buf = Arc::new(b.create_buffer(256).unwrap());
    let push = PushConstants::new().u32(64).f32(1.0);
    for (buffers, push) in [
        (vec![buf.clone(), buf.clone()], push.as_bytes()),
        (
            vec![buf.clone(), buf.clone(), buf.clone()],
            &push.as_bytes()[..4],
        ),
    ] {
        let e = b
            .submit(&[Launch {
                kernel: &k,
                groups: [1, 1, 1],
                buffers,
                push_constants: push,
            }])
            .unwrap_err();
        assert!(matches!(e, Error::Launch { .. }), "{e}");
    }
}
