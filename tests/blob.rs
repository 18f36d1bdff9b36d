//! Cache blobs on real drivers (lavapipe and PoCL in CI): a kernel's blob recreates it in a fresh
//! context (and another process) without a build; a blob for another key, device field, format or
//! backend is refused naming the field; damaged bytes are refused; nothing refused reaches the driver
//! or leaves a cached failure behind.

use crate::common;
use crate::common::req;

use kpc::BackendKind;
use kpc::DeviceImage;
use kpc::Source;
use kpc::kernels::{opencl_image, spirv_image};
use kpc::{BuildOptions, SpecConstants, SpecValue};
use kpc::{CacheBlob, Context, Error, Kernel, PushConstants};

use common::disk::{TempDir, child_role};
use common::drivers::{opencl_context, random_f32, vulkan_context};

fn context(kind: BackendKind, test: &str) -> Option<Context> {
    match kind {
        BackendKind::Vulkan => vulkan_context(test),
        BackendKind::OpenCl => opencl_context(test),
    }
}

fn image(kind: BackendKind, name: &str) -> DeviceImage {
    match kind {
        BackendKind::Vulkan => spirv_image(name).unwrap(),
        BackendKind::OpenCl => opencl_image(name).unwrap(),
    }
}

/// A build option each backend accepts, so that a blob made without it is for another key.
fn other_options(kind: BackendKind) -> BuildOptions {
    match kind {
        BackendKind::Vulkan => BuildOptions::new("-O"),
        BackendKind::OpenCl => BuildOptions::new("-cl-mad-enable"),
    }
}

fn bias(b: i32) -> SpecConstants {
    SpecConstants::new().with(1, SpecValue::I32(b))
}

fn saxpy(ctx: &Context, spec: &SpecConstants) -> Kernel {
    let kind = ctx.backend();
    ctx.kernel_with(&kpc::KernelRequest::new(&image(kind, "saxpy"), "saxpy").spec(spec.clone()))
        .unwrap()
}

fn from_blob(ctx: &Context, spec: &SpecConstants, blob: &[u8]) -> kpc::Result<Kernel> {
    let kind = ctx.backend();
    ctx.kernel_from_blob(
        &req(
            &image(kind, "saxpy"),
            "saxpy",
            spec,
            &BuildOptions::default(),
        ),
        blob,
    )
}

/// Runs `k` (saxpy) through kpc's queue and checks `a * x + y + bias`.
fn check_saxpy(ctx: &Context, k: &Kernel, bias: f32) {
    let n = 777;
    let (x, y) = (random_f32(n), random_f32(n));
    let (bx, by) = (ctx.buffer_from(&x).unwrap(), ctx.buffer_from(&y).unwrap());
    let out = ctx.buffer_from(&vec![f32::NAN; n]).unwrap();
    ctx.queue()
        .launch(
            k,
            k.groups_for([n as u64, 1, 1]).unwrap(),
            &[&bx, &by, &out],
            PushConstants::new().u32(n as u32).f32(2.0).as_bytes(),
        )
        .unwrap()
        .wait()
        .unwrap();
    for (i, v) in out.read().unwrap().iter().enumerate() {
        let want = 2.0 * x[i] + y[i] + bias;
        assert!(
            (v - want).abs() <= 1e-5 * (1.0 + want.abs()),
            "out[{i}] = {v}, want {want}"
        );
    }
}

fn mismatch_field(r: kpc::Result<Kernel>) -> String {
    match r {
        Err(Error::BlobMismatch { field, .. }) => field,
        other => panic!("expected Error::BlobMismatch, got {other:?}"),
    }
}

fn assert_corrupt(r: kpc::Result<Kernel>, what: &str) {
    assert!(
        matches!(r, Err(Error::CorruptBlob { .. })),
        "{what}: expected Error::CorruptBlob, got {r:?}"
    );
}

/// The container of the documented layout, written independently of kpc's encoder.
fn encode(fields: &[(String, String)], payload: &[u8]) -> Vec<u8> {
    let mut key = (fields.len() as u32).to_le_bytes().to_vec();
    for (n, v) in fields {
        for part in [n, v] {
            key.extend_from_slice(&(part.len() as u32).to_le_bytes());
            key.extend_from_slice(part.as_bytes());
        }
    }
    let mut out = b"KPCBLOB\0".to_vec();
    out.extend_from_slice(&1u32.to_le_bytes());
    out.extend_from_slice(&(key.len() as u32).to_le_bytes());
    out.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    let mut h = blake3::Hasher::new();
    h.update(&out);
    h.update(&key);
    h.update(payload);
    out.extend_from_slice(h.finalize().as_bytes());
    out.extend_from_slice(&key);
    out.extend_from_slice(payload);
    out
}

fn round_trip(kind: BackendKind, test: &str) {
    let Some(ctx1) = context(kind, test) else {
        return;
    };
    let spec = bias(7);
    let k1 = saxpy(&ctx1, &spec);
    let id = ctx1
        .cache_blob_id(&req(
            &image(kind, "saxpy"),
            "saxpy",
            &spec,
            &BuildOptions::default(),
        ))
        .unwrap();
    // The blob comes from the kernel alone: its context may be gone.
    drop(ctx1);
    let blob = k1.cache_blob().unwrap();
    let parsed = CacheBlob::parse(&blob).unwrap();
    assert_eq!(parsed.field("backend"), Some(kind.to_string().as_str()));
    assert_eq!(parsed.field("options"), Some(""));
    assert!(parsed.field("driver_version").is_some());
    assert!(!parsed.payload.is_empty());

    // A fresh context, disk cache off: the kernel comes from the blob, without a build.
    let ctx2 = context(kind, test).unwrap();
    assert_eq!(
        ctx2.cache_blob_id(&req(
            &image(kind, "saxpy"),
            "saxpy",
            &spec,
            &BuildOptions::default()
        ))
        .unwrap(),
        id
    );
    let k2 = from_blob(&ctx2, &spec, &blob).unwrap();
    assert_eq!(k2.source(), Source::Blob);
    let s = ctx2.stats().backend_counters;
    assert_eq!((s.programs_built, s.programs_loaded), (0, 1));
    check_saxpy(&ctx2, &k2, 7.0);
    // Now in the context's memory cache: a plain request hits it, and the blob is not loaded twice.
    assert_eq!(saxpy(&ctx2, &spec).source(), Source::Memory);
    assert_eq!(
        from_blob(&ctx2, &spec, &blob).unwrap().source(),
        Source::Memory
    );
    let s = ctx2.stats().backend_counters;
    assert_eq!((s.programs_built, s.programs_loaded), (0, 1));
    // The recreated kernel's blob carries the same key.
    assert_eq!(
        CacheBlob::parse(&k2.cache_blob().unwrap()).unwrap().fields,
        parsed.fields
    );
}

crate::backend_tests! {
    fn a_blob_recreates_the_kernel_in_a_fresh_context_without_a_build(backend, test) {
        round_trip(
            backend,
            test,
        );
    }
}

fn other_keys(kind: BackendKind, test: &str) {
    let Some(ctx) = context(kind, test) else {
        return;
    };
    let saxpy_image = image(kind, "saxpy");
    let copy_image = image(kind, "copy");
    let plain = BuildOptions::default();
    let id = |img: &DeviceImage, spec: &SpecConstants, o: &BuildOptions| {
        ctx.cache_blob_id(&req(img, "saxpy", spec, o)).unwrap()
    };
    // The entry point is not part of the id: a blob holds the whole program.
    assert_eq!(
        ctx.cache_blob_id(&req(&saxpy_image, "saxpy", &bias(1), &plain))
            .unwrap(),
        ctx.cache_blob_id(&req(&saxpy_image, "any_entry", &bias(1), &plain))
            .unwrap()
    );
    // Equal ids exactly for equal keys.
    assert_eq!(
        id(&saxpy_image, &bias(1), &plain),
        id(&saxpy_image, &bias(1), &plain)
    );
    assert_ne!(
        id(&saxpy_image, &bias(1), &plain),
        id(&saxpy_image, &bias(2), &plain)
    );
    assert_ne!(
        id(&saxpy_image, &bias(1), &plain),
        id(&saxpy_image, &bias(1), &other_options(kind))
    );
    assert_ne!(
        id(&saxpy_image, &bias(1), &plain),
        id(&copy_image, &bias(1), &plain)
    );

    let blob = saxpy(&ctx, &bias(1)).cache_blob().unwrap();
    let fresh = context(kind, test).unwrap();
    assert_eq!(mismatch_field(from_blob(&fresh, &bias(2), &blob)), "spec");
    let other_image = fresh.kernel_from_blob(&req(&copy_image, "copy", &bias(1), &plain), &blob);
    assert_eq!(mismatch_field(other_image), "image_digest");
    let other_opts = fresh.kernel_from_blob(
        &req(&saxpy_image, "saxpy", &bias(1), &other_options(kind)),
        &blob,
    );
    assert_eq!(mismatch_field(other_opts), "options");
    // Refused before the backend: nothing loaded, nothing built, nothing cached.
    let s = fresh.stats().backend_counters;
    assert_eq!((s.programs_built, s.programs_loaded), (0, 0));
    assert_eq!(fresh.stats().memory.programs, 0);
    // The right key is accepted by the same context.
    assert_eq!(
        from_blob(&fresh, &bias(1), &blob).unwrap().source(),
        Source::Blob
    );
}

crate::backend_tests! {
    fn a_blob_for_another_key_is_refused_naming_the_field(backend, test) {
        other_keys(
            backend,
            test,
        );
    }
}

fn damaged(kind: BackendKind, test: &str) {
    let Some(ctx) = context(kind, test) else {
        return;
    };
    let blob = saxpy(&ctx, &bias(3)).cache_blob().unwrap();
    let parsed = CacheBlob::parse(&blob).unwrap();
    // The documented layout, written independently, is byte for byte what kpc made.
    assert_eq!(encode(&parsed.fields, &parsed.payload), blob);
    let fresh = context(kind, test).unwrap();

    // One flipped bit anywhere: in the payload, the key record, the header.
    for at in [blob.len() - 1, blob.len() / 2, 60, 20, 3] {
        let mut t = blob.clone();
        t[at] ^= 0x04;
        assert_corrupt(
            from_blob(&fresh, &bias(3), &t),
            &format!("bit flipped at {at}"),
        );
    }
    for n in [0, 7, 55, 56, blob.len() - 1] {
        assert_corrupt(
            from_blob(&fresh, &bias(3), &blob[..n]),
            &format!("cut to {n}"),
        );
    }
    let mut longer = blob.clone();
    longer.extend_from_slice(b"tail");
    assert_corrupt(from_blob(&fresh, &bias(3), &longer), "extended");
    let garbage: Vec<u8> = (0..4096u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    assert_corrupt(from_blob(&fresh, &bias(3), &garbage), "garbage");
    let mut v2 = blob.clone();
    v2[8] = 2;
    assert_corrupt(from_blob(&fresh, &bias(3), &v2), "format version 2");

    // A device field edited, the checksum fixed: refused by name. Likewise kpc's format version.
    for (field, value) in [("driver_version", "0x7fffffff"), ("kpc_format", "999")] {
        let mut fields = parsed.fields.clone();
        let slot = fields.iter_mut().find(|(n, _)| n == field).unwrap();
        assert_ne!(slot.1, value);
        slot.1 = value.to_string();
        let edited = encode(&fields, &parsed.payload);
        match from_blob(&fresh, &bias(3), &edited) {
            Err(Error::BlobMismatch {
                field: f, found, ..
            }) => {
                assert_eq!((f.as_str(), found.as_str()), (field, value))
            }
            other => panic!("{field} edited: expected Error::BlobMismatch, got {other:?}"),
        }
    }
    let s = fresh.stats().backend_counters;
    assert_eq!((s.programs_built, s.programs_loaded), (0, 0));

    // A payload that is not the backend's binary, under a valid key and checksum: the backend
    // refuses it before its driver sees it, and the key is not poisoned.
    let forged = encode(&parsed.fields, b"not a program binary at all");
    assert!(
        matches!(
            from_blob(&fresh, &bias(3), &forged),
            Err(Error::BinaryRejected { .. })
        ),
        "forged payload"
    );
    assert_eq!(fresh.stats().backend_counters.binaries_rejected, 1);
    assert_eq!(fresh.stats().memory.programs, 0);
    let k = saxpy(&fresh, &bias(3));
    assert_eq!(k.source(), Source::Built);
    check_saxpy(&fresh, &k, 3.0);
}

crate::backend_tests! {
    fn damaged_and_edited_blobs_are_refused(backend, test) {
        damaged(
            backend,
            test,
        );
    }
}

#[test]
fn a_blob_of_the_other_backend_is_refused() {
    let test = "a_blob_of_the_other_backend_is_refused";
    let (Some(vk), Some(cl)) = (
        context(BackendKind::Vulkan, test),
        context(BackendKind::OpenCl, test),
    ) else {
        return;
    };
    let vk_blob = saxpy(&vk, &bias(1)).cache_blob().unwrap();
    assert_eq!(
        mismatch_field(from_blob(&cl, &bias(1), &vk_blob)),
        "backend"
    );
    let cl_blob = saxpy(&cl, &bias(1)).cache_blob().unwrap();
    assert_eq!(
        mismatch_field(from_blob(&vk, &bias(1), &cl_blob)),
        "backend"
    );
    // An image of the other backend's format is a typed error too.
    let r = cl.kernel_from_blob(
        &req(
            &spirv_image("saxpy").unwrap(),
            "saxpy",
            &bias(1),
            &BuildOptions::default(),
        ),
        &cl_blob,
    );
    assert!(matches!(r, Err(Error::InvalidArgument(_))), "{r:?}");
}

/// The child role: makes the id and blob of saxpy (bias 5) on `KPC_TEST_BACKEND` in its own process.
#[test]
fn child() {
    let Some(role) = child_role() else { return };
    assert_eq!(role, "blob-maker");
    let dir = std::path::PathBuf::from(std::env::var_os("KPC_TEST_OUT").unwrap());
    let kind = match std::env::var("KPC_TEST_BACKEND").unwrap().as_str() {
        "vulkan" => BackendKind::Vulkan,
        _ => BackendKind::OpenCl,
    };
    let ctx = context(kind, "child").unwrap();
    let spec = bias(5);
    let id = ctx
        .cache_blob_id(&req(
            &image(kind, "saxpy"),
            "saxpy",
            &spec,
            &BuildOptions::default(),
        ))
        .unwrap();
    std::fs::write(dir.join("id"), id).unwrap();
    std::fs::write(dir.join("blob"), saxpy(&ctx, &spec).cache_blob().unwrap()).unwrap();
}

fn across_processes(kind: BackendKind, test: &str) {
    let Some(ctx) = context(kind, test) else {
        return;
    };
    let dir = TempDir::new("blob-child");
    let st = common::disk::child("child", "blob-maker")
        .env("KPC_TEST_OUT", dir.path())
        .env("KPC_TEST_BACKEND", kind.to_string())
        .status()
        .unwrap();
    assert!(st.success(), "the child failed: {st}");
    let spec = bias(5);
    let id = ctx
        .cache_blob_id(&req(
            &image(kind, "saxpy"),
            "saxpy",
            &spec,
            &BuildOptions::default(),
        ))
        .unwrap();
    assert_eq!(std::fs::read(dir.join("id")).unwrap(), id);
    let k = from_blob(&ctx, &spec, &std::fs::read(dir.join("blob")).unwrap()).unwrap();
    assert_eq!(k.source(), Source::Blob);
    assert_eq!(ctx.stats().backend_counters.programs_built, 0);
    check_saxpy(&ctx, &k, 5.0);
}

crate::backend_tests! {
    fn a_blob_and_its_id_made_in_another_process_are_accepted(backend, test) {
        across_processes(
            backend,
            test,
        );
    }
}

/// A blob refused for its entry point (the program has no such kernel) leaves nothing in the memory
/// cache: the genuine request that follows loads from its blob again instead of finding the refused
/// one's program in memory. On Vulkan the entry point is answered from reflection before anything
/// loads; on OpenCL only the loaded program knows its kernels.
fn unknown_entry(kind: BackendKind, test: &str) {
    let Some(ctx) = context(kind, test) else {
        return;
    };
    let blob = saxpy(&ctx, &bias(3)).cache_blob().unwrap();
    let fresh = context(kind, test).unwrap();
    let img = image(kind, "saxpy");
    let plain = BuildOptions::default();
    let refused = fresh.kernel_from_blob(&req(&img, "no_such_kernel", &bias(3), &plain), &blob);
    assert!(
        matches!(refused, Err(Error::UnknownKernel { .. })),
        "{refused:?}"
    );
    assert_eq!(fresh.stats().memory.programs, 0, "nothing of it is cached");
    let k = from_blob(&fresh, &bias(3), &blob).unwrap();
    assert_eq!(
        k.source(),
        Source::Blob,
        "the genuine blob is loaded, not found"
    );
    assert_eq!(fresh.stats().backend_counters.programs_built, 0);
}

crate::backend_tests! {
    fn a_blob_refused_for_its_entry_point_leaves_nothing_cached(backend, test) {
        unknown_entry(
            backend,
            test,
        );
    }
}
