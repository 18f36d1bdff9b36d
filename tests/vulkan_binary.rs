//! Persisting programs: the pipeline-cache blob round trip, and blobs that must be rejected before
//! they reach the driver. Drives the backend traits directly, as the runtime (and the disk cache)
//! does.

use crate::common;

use std::sync::Arc;

use kpc::admin::backend::{Backend, ComputeBackend, KernelObject, Launch};
use kpc::admin::vulkan::VulkanOptions;
use kpc::admin::vulkan::pipeline_cache::{PIPELINE_CACHE_HEADER_BYTES, Payload, decode};
use kpc::kernels::spirv_image;
use kpc::{BuildOptions, SpecConstants, SpecValue};
use kpc::{Error, PushConstants};

use common::drivers::{random_f32, vulkan_backend};

/// Offset of the pipeline cache data in kpc's container (no optimized SPIR-V).
const CACHE_AT: usize = 32;

#[test]
fn a_program_comes_back_from_its_binary_and_computes() {
    let Some(b) = vulkan_backend(
        "a_program_comes_back_from_its_binary_and_computes",
        &VulkanOptions::default(),
    ) else {
        return;
    };
    let image = spirv_image("saxpy").unwrap();
    let spec = SpecConstants::new().with(1, SpecValue::I32(5));
    let opts = BuildOptions::default();
    let built = b.build_program(&image, &spec, &opts).unwrap();
    let blob = b
        .program_binary(&built)
        .unwrap()
        .expect("Vulkan persists every program");
    let parsed = decode(&blob).unwrap();
    assert!(parsed.optimized_spirv.is_none());
    match parsed.payload {
        // lavapipe's VkPipelineCache is a stub that keeps only its header; real drivers keep more.
        Payload::PipelineCache(c) => {
            assert!(c.is_empty() || c.len() >= PIPELINE_CACHE_HEADER_BYTES)
        }
        // One pipeline (saxpy's one entry point), with at least one binary of non-empty data.
        Payload::PipelineBinaries(b) => {
            let sets = kpc::admin::vulkan::pipeline_binary::decode(b).unwrap();
            assert_eq!(sets.len(), 1);
            assert!(!sets[0].is_empty() && sets[0].iter().all(|x| !x.data.is_empty()));
        }
    }
    assert_eq!(
        b.device_info()
            .fingerprint
            .fields
            .iter()
            .find(|(k, _)| k == "kpc_vulkan_binary")
            .map(|(_, v)| v.as_str()),
        Some(parsed.payload.kind()),
        "the fingerprint names the kind of binary the device persists"
    );

    let loaded = Arc::new(b.program_from_binary(&image, &spec, &opts, &blob).unwrap());
    assert_eq!(b.stats().programs_loaded, 1);
    let k = b.create_kernel(&loaded, "saxpy").unwrap();
    // Whether the driver reported a pipeline-cache hit is recorded, never assumed (lavapipe: no).
    let fb = k.info().driver_cache_hit;
    let s = b.stats();
    assert_eq!(
        s.driver_cache_hits + s.driver_cache_misses + s.driver_cache_unknown,
        2
    );
    if !b.has_creation_feedback() {
        assert_eq!(fb, None);
    }

    let n = 1000;
    let (x, y) = (random_f32(n), random_f32(n));
    let bufs: Vec<Arc<_>> = (0..3)
        .map(|_| Arc::new(b.create_buffer(4 * n as u64).unwrap()))
        .collect();
    b.write_buffer(&bufs[0], 0, kpc::admin::backend::as_bytes(&x))
        .unwrap();
    b.write_buffer(&bufs[1], 0, kpc::admin::backend::as_bytes(&y))
        .unwrap();
    let push = PushConstants::new().u32(n as u32).f32(2.0);
    let ev = b
        .submit(&[Launch {
            kernel: &k,
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
        let want = 2.0 * x[i] + y[i] + 5.0;
        assert!((out[i] - want).abs() <= 1e-5, "{} vs {want}", out[i]);
    }
}

#[test]
fn a_blob_whose_header_does_not_match_is_rejected() {
    let Some(b) = vulkan_backend(
        "a_blob_whose_header_does_not_match_is_rejected",
        &VulkanOptions::default(),
    ) else {
        return;
    };
    let image = spirv_image("saxpy").unwrap();
    let (spec, opts) = (SpecConstants::new(), BuildOptions::default());
    let blob = b
        .program_binary(&b.build_program(&image, &spec, &opts).unwrap())
        .unwrap()
        .unwrap();
    let payload = decode(&blob).unwrap().payload;
    let cache_len = match payload {
        Payload::PipelineCache(c) => c.len(),
        Payload::PipelineBinaries(_) => 0,
    };
    let mut tampered: Vec<(&str, Vec<u8>)> = vec![
        ("truncated", blob[..blob.len() - 1].to_vec()),
        ("not a kpc container", b"garbage!".repeat(8)),
    ];
    // The other kind of payload, whole and well formed, is refused as of the wrong kind.
    let other = match payload {
        Payload::PipelineCache(c) => kpc::admin::vulkan::pipeline_cache::encode(
            None,
            Payload::PipelineBinaries(&kpc::admin::vulkan::pipeline_binary::encode(&[vec![
                kpc::admin::vulkan::pipeline_binary::BinaryData::new(
                    vec![1; 32],
                    c.iter().copied().chain([0u8]).collect(),
                ),
            ]])),
        ),
        Payload::PipelineBinaries(_) => {
            kpc::admin::vulkan::pipeline_cache::encode(None, Payload::PipelineCache(&[]))
        }
    };
    tampered.push(("the other kind", other));
    if let Payload::PipelineBinaries(p) = payload {
        // A forged key length (33 bytes, one past Vulkan's maximum) is refused by kpc's parser.
        let mut t = blob.clone();
        let len_at = blob.len() - p.len() + 4 + 4;
        t[len_at..len_at + 4].copy_from_slice(&33u32.to_le_bytes());
        tampered.push(("a binary key length", t));
    }
    if cache_len >= PIPELINE_CACHE_HEADER_BYTES {
        for (what, field) in [
            ("headerSize", 0),
            ("headerVersion", 4),
            ("vendorID", 8),
            ("deviceID", 12),
            ("UUID", 16),
        ] {
            let mut t = blob.clone();
            t[CACHE_AT + field] ^= 0x5a;
            tampered.push((what, t));
        }
    } else {
        eprintln!(
            "note: this driver's pipeline cache data is {cache_len} bytes; header fields not tampered"
        );
    }
    let rejected_before = b.stats().binaries_rejected;
    for (what, bytes) in &tampered {
        match b.program_from_binary(&image, &spec, &opts, bytes) {
            Err(Error::BinaryRejected { reason, .. }) => eprintln!("{what}: rejected: {reason}"),
            other => panic!("{what}: expected a rejection, got {other:?}"),
        }
    }
    assert_eq!(
        b.stats().binaries_rejected - rejected_before,
        tampered.len() as u64
    );
    assert_eq!(
        b.stats().programs_loaded,
        0,
        "nothing tampered reached the driver"
    );
}

#[test]
fn an_optimized_program_persists_its_optimized_spirv() {
    let Some(b) = vulkan_backend(
        "an_optimized_program_persists_its_optimized_spirv",
        &VulkanOptions::default(),
    ) else {
        return;
    };
    let image = spirv_image("copy").unwrap();
    let spec = SpecConstants::new();
    let o = BuildOptions::new("-O");
    let blob = b
        .program_binary(&b.build_program(&image, &spec, &o).unwrap())
        .unwrap()
        .unwrap();
    assert!(decode(&blob).unwrap().optimized_spirv.is_some());
    let p = Arc::new(b.program_from_binary(&image, &spec, &o, &blob).unwrap());
    assert_eq!(
        b.create_kernel(&p, "copy")
            .unwrap()
            .info()
            .push_constant_bytes,
        4
    );

    // The same blob without -O, or with its SPIR-V damaged, is a miss.
    let e = b
        .program_from_binary(&image, &spec, &BuildOptions::default(), &blob)
        .unwrap_err();
    assert!(matches!(e, Error::BinaryRejected { .. }), "{e}");
    let mut bad = blob.clone();
    bad[32] ^= 0xff; // first byte of the optimized module's magic
    let e = b.program_from_binary(&image, &spec, &o, &bad).unwrap_err();
    assert!(matches!(e, Error::BinaryRejected { .. }), "{e}");
}
