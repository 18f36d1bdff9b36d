//! Interop on a real OpenCL driver (PoCL in CI): the test is the embedder. It creates its own
//! cl_context and queue, hands them to kpc, leases kpc's saxpy kernel object, sets its arguments and
//! enqueues it itself, and checks the output; kpc retains what it borrows and releases exactly that.
//! Also: an interop context and an owned one on the same device share fingerprint and disk cache,
//! and what kpc refuses.
//!
//! `unsafe` here is the embedder's own OpenCL code, each block with the reason it holds.

use crate::common;

use std::ffi::c_void;

use kpc::BackendKind;
use kpc::Source;
use kpc::interop::OpenClHandles;
use kpc::kernels::opencl_image;
use kpc::{BuildOptions, SpecConstants, SpecValue};
use kpc::{Config, Context, Error};
use opencl3::command_queue::{
    CL_QUEUE_OUT_OF_ORDER_EXEC_MODE_ENABLE, CL_QUEUE_REFERENCE_COUNT, CommandQueue,
    get_command_queue_info,
};
use opencl3::context::Context as ClContext;
use opencl3::context::context::{CL_CONTEXT_REFERENCE_COUNT, get_context_info};
use opencl3::device::{CL_DEVICE_TYPE_ALL, Device};
use opencl3::kernel::{CL_KERNEL_REFERENCE_COUNT, get_kernel_info, release_kernel, retain_kernel};
use opencl3::memory::{Buffer, CL_MEM_READ_WRITE, ClMem};
use opencl3::types::{CL_BLOCKING, cl_kernel, cl_mem};

use common::disk::TempDir;
use common::drivers::{opencl_device, random_f32, test_config};

/// The embedder: its own context and in-order queue on device `index` of the loader's enumeration
/// (platform order, then device order: what kpc's `opencl:N` names).
struct Embedder {
    // Field order is drop order: the queue before the context.
    queue: CommandQueue,
    context: ClContext,
    device: Device,
}

impl Embedder {
    fn new(index: usize) -> Embedder {
        let ids: Vec<_> = opencl3::platform::get_platforms()
            .unwrap()
            .iter()
            .flat_map(|p| p.get_devices(CL_DEVICE_TYPE_ALL).unwrap_or_default())
            .collect();
        let device = Device::new(ids[index]);
        let context = ClContext::from_device(&device).unwrap();
        let queue = CommandQueue::create_default(&context, 0).unwrap();
        Embedder {
            queue,
            context,
            device,
        }
    }

    fn handles(&self) -> OpenClHandles {
        OpenClHandles {
            context: self.context.get(),
            device: self.device.id(),
            queue: self.queue.get(),
        }
    }

    fn context(&self, config: &Config) -> Context {
        // SAFETY: the handles are this embedder's live objects, a root device of the context and an
        // in-order queue of both.
        unsafe {
            Context::builder()
                .opencl_handles(&self.handles())
                .config(config.clone())
                .build()
        }
        .expect("an interop context")
    }

    fn buffer(&self, data: &[f32]) -> Buffer<f32> {
        // SAFETY: no host pointer: the driver allocates.
        let mut b = unsafe {
            Buffer::<f32>::create(
                &self.context,
                CL_MEM_READ_WRITE,
                data.len(),
                std::ptr::null_mut(),
            )
        }
        .unwrap();
        // SAFETY: a blocking write of `data`, which fits the buffer.
        unsafe {
            self.queue
                .enqueue_write_buffer(&mut b, CL_BLOCKING, 0, data, &[])
        }
        .unwrap();
        b
    }

    /// saxpy through a leased kernel object: this embedder sets every argument and enqueues it on
    /// its own queue.
    fn saxpy(&self, kernel: cl_kernel, local: usize, a: f32, x: &[f32], y: &[f32]) -> Vec<f32> {
        let n = x.len();
        let (bx, by) = (self.buffer(x), self.buffer(y));
        let bout = self.buffer(&vec![f32::NAN; n]);
        let mems: [cl_mem; 3] = [bx.get(), by.get(), bout.get()];
        let n32 = n as u32;
        let arg = |i: u32, size: usize, p: *const c_void| {
            // SAFETY: the lease makes this thread the only user of `kernel`; `p` points at `size`
            // readable bytes that the driver copies before returning.
            unsafe { opencl3::kernel::set_kernel_arg(kernel, i, size, p) }.unwrap()
        };
        for (i, m) in mems.iter().enumerate() {
            arg(i as u32, size_of::<cl_mem>(), std::ptr::from_ref(m).cast());
        }
        arg(3, 4, std::ptr::from_ref(&n32).cast());
        arg(4, 4, std::ptr::from_ref(&a).cast());
        let global = [n.div_ceil(local) * local];
        let local = [local];
        // SAFETY: every argument is set; the size arrays hold one entry for one dimension.
        let ev = unsafe {
            self.queue.enqueue_nd_range_kernel(
                kernel,
                1,
                std::ptr::null(),
                global.as_ptr(),
                local.as_ptr(),
                &[],
            )
        }
        .unwrap();
        ev.wait().unwrap();
        let mut out = vec![0f32; n];
        // SAFETY: a blocking read into `out`, which the buffer's size matches.
        unsafe {
            self.queue
                .enqueue_read_buffer(&bout, CL_BLOCKING, 0, &mut out, &[])
        }
        .unwrap();
        out
    }

    fn context_refs(&self) -> u32 {
        get_context_info(self.context.get(), CL_CONTEXT_REFERENCE_COUNT)
            .unwrap()
            .to_uint()
    }

    fn queue_refs(&self) -> u32 {
        get_command_queue_info(self.queue.get(), CL_QUEUE_REFERENCE_COUNT)
            .unwrap()
            .to_uint()
    }
}

fn check(out: &[f32], a: f32, x: &[f32], y: &[f32], bias: f32) {
    for i in 0..x.len() {
        let want = a * x[i] + y[i] + bias;
        assert!(
            (out[i] - want).abs() <= 1e-5 * (1.0 + want.abs()),
            "out[{i}] = {}, want {want}",
            out[i]
        );
    }
}

fn kernel_refs(k: cl_kernel) -> u32 {
    get_kernel_info(k, CL_KERNEL_REFERENCE_COUNT)
        .unwrap()
        .to_uint()
}

#[test]
fn an_embedder_enqueues_kpcs_saxpy_through_a_lease() {
    let test = "an_embedder_enqueues_kpcs_saxpy_through_a_lease";
    let Some(d) = opencl_device(test) else {
        return;
    };
    let e = Embedder::new(d.index);
    let (context_refs, queue_refs) = (e.context_refs(), e.queue_refs());
    let ctx = e.context(&test_config());
    // kpc holds one reference of its own to each.
    assert_eq!(e.context_refs(), context_refs + 1);
    assert_eq!(e.queue_refs(), queue_refs + 1);
    assert_eq!(ctx.device().name, d.name);

    let spec = SpecConstants::new().with(1, SpecValue::I32(4));
    let k = ctx
        .kernel_with(
            &kpc::KernelRequest::new(&opencl_image("saxpy").unwrap(), "saxpy").spec(spec.clone()),
        )
        .unwrap();
    let local = k.info().local_size[0] as usize;
    let n = 1000;
    let (x, y) = (random_f32(n), random_f32(n));
    let lease = k.opencl_lease().unwrap();
    let first = lease.raw();
    check(&e.saxpy(first, local, 2.0, &x, &y), 2.0, &x, &y, 4.0);

    // While the lease is held, kpc's own launches and another lease use other kernel objects.
    let (bx, by) = (ctx.buffer_from(&x).unwrap(), ctx.buffer_from(&y).unwrap());
    let out = ctx.buffer_from(&vec![f32::NAN; n]).unwrap();
    ctx.queue()
        .launch(
            &k,
            k.groups_for([n as u64, 1, 1]).unwrap(),
            &[&bx, &by, &out],
            kpc::PushConstants::new().u32(n as u32).f32(-3.0).as_bytes(),
        )
        .unwrap()
        .wait()
        .unwrap();
    check(&out.read().unwrap(), -3.0, &x, &y, 4.0);
    let second = k.opencl_lease().unwrap();
    assert_ne!(second.raw(), first);
    check(&e.saxpy(second.raw(), local, 0.5, &x, &y), 0.5, &x, &y, 4.0);
    // Leases are OpenCL's; Vulkan handles are Vulkan's.
    assert!(matches!(
        k.vulkan_handles(),
        Err(Error::WrongBackend {
            expected: BackendKind::Vulkan,
            found: Some(BackendKind::OpenCl),
            ..
        })
    ));

    // A dropped lease goes back to kpc's pool, not to clReleaseKernel: with a reference of the
    // test's own, the count shows kpc still holding the object, and the next lease gets it again.
    // SAFETY: `first` is alive (leased); the test releases its reference below.
    unsafe { retain_kernel(first) }.unwrap();
    assert_eq!(kernel_refs(first), 2);
    drop(lease);
    assert_eq!(
        kernel_refs(first),
        2,
        "kpc released the object of a returned lease"
    );
    let again = k.opencl_lease().unwrap();
    assert_eq!(again.raw(), first);
    // SAFETY: the test's own reference, taken above.
    unsafe { release_kernel(first) }.unwrap();
    drop((again, second));

    // kpc's last object gone: it released exactly the references it took; the embedder's objects
    // still work.
    drop((bx, by, out));
    drop(ctx);
    // The kernel keeps its program, and through it kpc's reference, alive.
    assert!(e.context_refs() > context_refs);
    drop(k);
    // PoCL drops its own internal references (held by finished commands) from its worker threads,
    // after clFinish has returned: wait for them, boundedly, before counting kpc's.
    assert_eq!(settled(|| e.context_refs(), context_refs), context_refs);
    assert_eq!(settled(|| e.queue_refs(), queue_refs), queue_refs);
    let b = e.buffer(&[7.0; 16]);
    let mut back = [0f32; 16];
    // SAFETY: a blocking read of 16 floats from a 16-float buffer.
    unsafe {
        e.queue
            .enqueue_read_buffer(&b, CL_BLOCKING, 0, &mut back, &[])
    }
    .unwrap();
    assert_eq!(back, [7.0; 16]);
}

#[test]
fn interop_and_owned_contexts_share_fingerprint_and_disk_cache() {
    let test = "opencl_interop_and_owned_contexts_share_fingerprint_and_disk_cache";
    let Some(d) = opencl_device(test) else {
        return;
    };
    let dir = TempDir::new("interop-cl");
    let config = Config::builder()
        .persistent(true)
        .cache_dir(dir.path())
        .build()
        .unwrap();
    let e = Embedder::new(d.index);
    let owned = Context::builder()
        .device(&d)
        .config(config.clone())
        .build()
        .unwrap();
    let interop = e.context(&config);
    assert_eq!(owned.device().fingerprint, interop.device().fingerprint);
    assert_eq!(interop.device().index, d.index);
    let image = opencl_image("saxpy").unwrap();
    let opts = BuildOptions::default();
    let get = |ctx: &Context, bias: i32| {
        let spec = SpecConstants::new().with(1, SpecValue::I32(bias));
        ctx.kernel_with(
            &kpc::KernelRequest::new(&image, "saxpy")
                .spec(spec.clone())
                .options(opts.clone()),
        )
        .unwrap()
    };
    assert_eq!(get(&owned, 1).source(), Source::Built);
    assert_eq!(get(&interop, 1).source(), Source::Disk);
    assert_eq!(get(&interop, 2).source(), Source::Built);
    assert_eq!(get(&owned, 2).source(), Source::Disk);
    assert_eq!(interop.stats().backend_counters.programs_built, 1);
    assert_eq!(interop.stats().backend_counters.programs_loaded, 1);
    // The binary the owned context built computes through the embedder's queue.
    let k = get(&interop, 1);
    let lease = k.opencl_lease().unwrap();
    let n = 333;
    let (x, y) = (random_f32(n), random_f32(n));
    let local = k.info().local_size[0] as usize;
    check(&e.saxpy(lease.raw(), local, 1.5, &x, &y), 1.5, &x, &y, 1.0);
}

#[test]
fn handles_that_do_not_belong_together_are_refused() {
    let test = "opencl_handles_that_do_not_belong_together_are_refused";
    let Some(d) = opencl_device(test) else {
        return;
    };
    let e = Embedder::new(d.index);
    let other = Embedder::new(d.index);
    let try_handles = |h: OpenClHandles| {
        // SAFETY: every handle is a live object of the two embedders; the mismatch is what is
        // refused, before kpc uses any of them.
        unsafe {
            Context::builder()
                .opencl_handles(&h)
                .config(test_config())
                .build()
        }
    };
    let mismatched = OpenClHandles {
        queue: other.queue.get(),
        ..e.handles()
    };
    assert!(matches!(
        try_handles(mismatched),
        Err(Error::InvalidArgument(m)) if m.contains("another context")
    ));
    let null = OpenClHandles {
        context: std::ptr::null_mut(),
        ..e.handles()
    };
    assert!(matches!(try_handles(null), Err(Error::InvalidArgument(_))));
    // An out-of-order queue, where the driver makes one.
    if let Ok(q) = CommandQueue::create_default(&e.context, CL_QUEUE_OUT_OF_ORDER_EXEC_MODE_ENABLE)
    {
        let ooo = OpenClHandles {
            queue: q.get(),
            ..e.handles()
        };
        assert!(matches!(
            try_handles(ooo),
            Err(Error::InvalidArgument(m)) if m.contains("out of order")
        ));
    } else {
        eprintln!("{test}: the driver makes no out-of-order queue; that refusal is not exercised");
    }
    // Nothing refused kept a reference.
    assert_eq!(e.queue_refs(), 1);
}

/// `count()` once it equals `want`, or its value after 10 s: reference counts that a driver's worker
/// threads bring down asynchronously, read without racing them.
fn settled(count: impl Fn() -> u32, want: u32) -> u32 {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let n = count();
        if n == want || std::time::Instant::now() > deadline {
            return n;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

// The contract after the last drop. OpenCL gives no way to interpose on kpc's calls short of an ICD
// layer, but every object kpc makes on the borrowed context (program, kernel, buffer) holds a
// reference to that context while it exists (PoCL, as the specification's implicit retain), and
// kpc's own retains of context and queue are released only when its last object goes. So the
// context's and queue's reference counts back at the embedder's own, right after the last drop
// returns and still after a while, mean kpc holds nothing on them and made nothing new: a build
// still running after the drop would hold a program on the context.

/// The reference counts of the embedder's context and queue.
fn cl_refs(e: &Embedder) -> (u32, u32) {
    let c = get_context_info(e.context.get(), CL_CONTEXT_REFERENCE_COUNT)
        .unwrap()
        .to_uint();
    let q = get_command_queue_info(e.queue.get(), CL_QUEUE_REFERENCE_COUNT)
        .unwrap()
        .to_uint();
    (c, q)
}

/// Watches the counts for a while after the last drop: every sample must be the embedder's own.
fn assert_released(what: &str, e: &Embedder, own: (u32, u32)) {
    let samples: Vec<(u32, u32)> = (0..40)
        .map(|_| {
            let r = cl_refs(e);
            std::thread::sleep(std::time::Duration::from_millis(10));
            r
        })
        .collect();
    let held: Vec<_> = samples.iter().filter(|r| **r != own).collect();
    eprintln!(
        "{what}: (context, queue) references after the last drop {:?}, embedder's own {own:?}",
        samples.first()
    );
    assert!(
        held.is_empty(),
        "{what}: kpc still held or made objects on the borrowed context after the last drop: \
         {held:?} (embedder's own {own:?})"
    );
}

/// Waits until the context's reference count reaches `n` (kpc's retain plus an object of its), at
/// most 60 s.
fn wait_for_refs(e: &Embedder, n: u32) {
    let t = std::time::Instant::now();
    while cl_refs(e).0 < n {
        assert!(t.elapsed().as_secs() < 60, "no kpc object appeared in 60 s");
        std::thread::sleep(std::time::Duration::from_micros(200));
    }
}

fn cl_variants(n: i32) -> Vec<kpc::KernelRequest> {
    let image = opencl_image("saxpy").unwrap();
    (0..n)
        .map(|bias| {
            kpc::KernelRequest::new(&image, "saxpy")
                .spec(SpecConstants::new().with(1, SpecValue::I32(bias)))
        })
        .collect()
}

#[test]
fn nothing_of_kpc_stays_on_the_borrowed_context_after_a_dropped_prefetch() {
    let test = "nothing_of_kpc_stays_on_the_borrowed_context_after_a_dropped_prefetch";
    let Some(d) = opencl_device(test) else {
        return;
    };
    let e = Embedder::new(d.index);
    let own = cl_refs(&e);
    let ctx = e.context(&test_config());
    // The probe sees kpc's objects: a kernel held adds references beyond kpc's own retain.
    let k = ctx
        .kernel(&opencl_image("saxpy").unwrap(), "saxpy")
        .unwrap();
    assert!(cl_refs(&e).0 > own.0 + 1, "{:?} vs {own:?}", cl_refs(&e));
    drop(k);
    let p = ctx.prefetch(cl_variants(24));
    // Mid-flight: a build under way (its program holds the context), most not begun.
    wait_for_refs(&e, own.0 + 2);
    drop(p);
    drop(ctx);
    assert_released(test, &e, own);
}

#[test]
fn nothing_of_kpc_stays_on_the_borrowed_context_after_a_warm_start_is_cut_short() {
    let test = "nothing_of_kpc_stays_on_the_borrowed_context_after_a_warm_start_is_cut_short";
    let Some(d) = opencl_device(test) else {
        return;
    };
    let e = Embedder::new(d.index);
    let own = cl_refs(&e);
    let dir = TempDir::new("cl-contract-warm");
    let config = Config::builder()
        .cache_dir(dir.path())
        .warm_start(Some("contract"))
        .build()
        .unwrap();
    {
        let ctx = e.context(&config);
        for r in ctx.prefetch(cl_variants(24)).wait() {
            r.unwrap();
        }
        assert_eq!(ctx.save_warm_start().unwrap(), Some(24));
    }
    assert_released("after the recording context", &e, own);
    let ctx = e.context(&config);
    // Mid-flight: a load under way (its program holds the context).
    wait_for_refs(&e, own.0 + 2);
    drop(ctx);
    assert_released(test, &e, own);
}
