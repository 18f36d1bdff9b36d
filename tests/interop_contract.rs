//! kpc's interop contract on a real Vulkan driver (lavapipe in CI), checked from the outside: the
//! test is an engine that owns its instance (with the Khronos validation layer and a debug-utils
//! messenger that counts errors), device and one compute queue, and hands kpc a pass-through
//! `vkGetInstanceProcAddr` (tests/common/vk_counting.rs) that counts every device-level call kpc
//! makes, with its thread.
//!
//! What is asserted, per scenario:
//! - no kpc call after the engine's last kpc object was dropped (the drop returned), checked for a
//!   while afterwards;
//! - no two kpc calls on the queue at once, with several contexts over one queue;
//! - no validation error.
//!
//! The engine is tests/common/vk_engine.rs; the counting entry point tests/common/vk_counting.rs.

use crate::common;
use crate::common::{vk_counting, vk_engine};

use std::ffi::c_void;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use ash::vk;
use kpc::KernelRequest;
use kpc::admin::vulkan::queue_lock_sharers;
use kpc::interop::{VulkanHandles, VulkanQueueLock};
use kpc::kernels::spirv_image;
use kpc::{Buffer, Config, Context, PushConstants};
use kpc::{SpecConstants, SpecValue};

use common::disk::TempDir;
use common::drivers::test_config;
use vk_engine::{Engine, VALIDATION_ERRORS};

/// `n` saxpy variants (the bias is a specialization constant): `n` programs to build.
fn variants(n: i32) -> Vec<KernelRequest> {
    let image = spirv_image("saxpy").unwrap();
    (0..n)
        .map(|bias| {
            KernelRequest::new(&image, "saxpy")
                .spec(SpecConstants::new().with(1, SpecValue::I32(bias)))
        })
        .collect()
}

/// Waits until kpc has made `n` calls (background work is under way), at most 60 s.
fn wait_for_calls(n: u64) {
    let t = std::time::Instant::now();
    while vk_counting::counts().calls < n {
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "kpc made fewer than {n} calls in 60 s"
        );
        std::thread::sleep(Duration::from_micros(200));
    }
}

/// How long the test keeps watching for kpc calls after the last drop.
const WATCH: Duration = Duration::from_millis(400);

/// Closes the counter (the last kpc object is gone), watches for calls, and returns the counts.
fn calls_after_last_drop() -> vk_counting::Counts {
    vk_counting::close();
    std::thread::sleep(WATCH);
    vk_counting::counts()
}

fn assert_clean(what: &str, c: &vk_counting::Counts) {
    eprintln!(
        "{what}: {} kpc calls, {} after the last drop ({:?}), {} queue overlaps, {} validation \
         errors",
        c.calls,
        c.after_close,
        c.after_threads,
        c.overlaps,
        VALIDATION_ERRORS.load(Ordering::SeqCst)
    );
    let after: Vec<_> = c.per_fn.iter().filter(|(_, v)| v.1 > 0).collect();
    assert_eq!(
        c.after_close, 0,
        "{what}: kpc called the device after the last drop: {after:?} from {:?}",
        c.after_threads
    );
    assert_eq!(
        c.overlaps, 0,
        "{what}: two kpc calls used the queue at once"
    );
    assert_eq!(
        VALIDATION_ERRORS.load(Ordering::SeqCst),
        0,
        "{what}: validation errors (printed above)"
    );
}

fn begin() -> parking_lot::MutexGuard<'static, ()> {
    let g = vk_counting::scenario();
    VALIDATION_ERRORS.store(0, Ordering::SeqCst);
    g
}

/// One context's work: `n` saxpy launches, each waited for, and the result checked once.
fn launches(ctx: &Context, n: usize) {
    let image = spirv_image("saxpy").unwrap();
    let spec = SpecConstants::new().with(1, SpecValue::I32(0));
    let k = ctx
        .kernel_with(&kpc::KernelRequest::new(&image, "saxpy").spec(spec.clone()))
        .unwrap();
    let len = 64usize;
    let x: Vec<f32> = (0..len).map(|i| i as f32).collect();
    let y = vec![1.0f32; len];
    let bx = ctx.buffer_from(&x).unwrap();
    let by = ctx.buffer_from(&y).unwrap();
    let out: Buffer<f32> = ctx.buffer_from(&vec![0.0f32; len]).unwrap();
    let push = PushConstants::new().u32(len as u32).f32(2.0);
    let groups = k.groups_for([len as u64, 1, 1]).unwrap();
    for _ in 0..n {
        ctx.queue()
            .launch(&k, groups, &[&bx, &by, &out], push.as_bytes())
            .unwrap()
            .wait()
            .unwrap();
    }
    let got = out.read().unwrap();
    assert!(got.iter().zip(&x).all(|(g, x)| *g == 2.0 * x + 1.0));
}

#[test]
fn contexts_over_one_queue_never_submit_at_once() {
    let test = "contexts_over_one_queue_never_submit_at_once";
    let _g = begin();
    let Some(engine) = Engine::new(test) else {
        return;
    };
    let contexts: Vec<Context> = (0..6).map(|_| engine.context(&test_config())).collect();
    let sharers = || queue_lock_sharers(engine.device.handle(), engine.queue);
    assert_eq!(
        sharers(),
        6,
        "one submit lock for the queue, shared by every context"
    );
    std::thread::scope(|s| {
        for ctx in &contexts {
            s.spawn(move || launches(ctx, 60));
        }
    });
    drop(contexts);
    assert_eq!(sharers(), 0, "the queue's entry goes with its last context");
    let c = calls_after_last_drop();
    let submitters = c.threads.len();
    assert!(submitters >= 6, "calls came from {submitters} threads");
    assert_clean(test, &c);
}

#[test]
fn a_dropped_prefetch_makes_no_call_after_the_last_drop() {
    let test = "a_dropped_prefetch_makes_no_call_after_the_last_drop";
    let _g = begin();
    let Some(engine) = Engine::new(test) else {
        return;
    };
    let ctx = engine.context(&test_config());
    let p = ctx.prefetch(variants(300));
    // Mid-flight: a few programs built, most not begun.
    wait_for_calls(30);
    drop(p);
    drop(ctx);
    let c = calls_after_last_drop();
    assert!(c.calls > 0, "the prefetch made calls before the drop");
    assert_clean(test, &c);
}

fn warm_config(root: &Path) -> Config {
    Config::builder()
        .cache_dir(root)
        .warm_start(Some("contract"))
        .build()
        .unwrap()
}

/// Builds `n` variants under `root` and leaves their manifest behind for the next context.
fn record_manifest(engine: &Engine, root: &Path, n: i32) {
    let ctx = engine.context(&warm_config(root));
    for r in ctx.prefetch(variants(n)).wait() {
        r.unwrap();
    }
    assert_eq!(ctx.save_warm_start().unwrap(), Some(n as usize));
}

#[test]
fn a_context_dropped_during_its_warm_start_makes_no_call_after() {
    let test = "a_context_dropped_during_its_warm_start_makes_no_call_after";
    let _g = begin();
    let Some(engine) = Engine::new(test) else {
        return;
    };
    let dir = TempDir::new("contract-warm");
    record_manifest(&engine, dir.path(), 300);
    vk_counting::reset();
    let ctx = engine.context(&warm_config(dir.path()));
    // Mid-flight: a few kernels loaded, most not begun.
    wait_for_calls(30);
    drop(ctx);
    let c = calls_after_last_drop();
    assert_clean(test, &c);

    // The same through quiesce, without dropping: nothing in flight once it returns.
    vk_counting::reset();
    let ctx = engine.context(&warm_config(dir.path()));
    wait_for_calls(30);
    ctx.quiesce().unwrap();
    let c = calls_after_last_drop();
    assert_clean("quiesce during a warm start", &c);
    vk_counting::reopen();
    let rep = ctx.wait_warm_start().unwrap();
    assert!(rep.loaded < 300, "the warm start was stopped: {rep:?}");
    launches(&ctx, 2);
}

/// The engine's own lock over its queue, handed to kpc as its hook.
struct EngineLock {
    raw: parking_lot::RawMutex,
    /// Times kpc took it.
    taken_by_kpc: AtomicU64,
}

thread_local! {
    /// Whether this thread is one of the engine's own submitters (its lock calls are not kpc's).
    static ENGINE_THREAD: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

unsafe extern "C" fn engine_lock(user: *mut c_void) {
    use parking_lot::lock_api::RawMutex as _;
    // SAFETY: `user` is the EngineLock the test handed kpc, alive for the whole scenario.
    let l = unsafe { &*user.cast::<EngineLock>() };
    l.raw.lock();
    if !ENGINE_THREAD.get() {
        l.taken_by_kpc.fetch_add(1, Ordering::SeqCst);
    }
}

unsafe extern "C" fn engine_unlock(user: *mut c_void) {
    use parking_lot::lock_api::RawMutex as _;
    // SAFETY: as in `engine_lock`; the calling thread holds the lock (the hook's contract).
    unsafe { (*user.cast::<EngineLock>()).raw.unlock() };
}

impl Engine {
    /// The engine's own submissions: `n` command buffers with a barrier each, submitted to the
    /// shared queue under its lock (as it would with its own work), each waited for.
    fn submit_own(&self, lock: &EngineLock, n: usize) {
        ENGINE_THREAD.set(true);
        let d = &self.device;
        // SAFETY: the pool, buffer and fence are this thread's; the queue is used only under the
        // engine's lock, which kpc takes too (its hook); everything is destroyed after its fence.
        unsafe {
            let pool = d
                .create_command_pool(
                    &vk::CommandPoolCreateInfo::default()
                        .queue_family_index(self.family)
                        .flags(vk::CommandPoolCreateFlags::RESET_COMMAND_BUFFER),
                    None,
                )
                .unwrap();
            let cmd = d
                .allocate_command_buffers(
                    &vk::CommandBufferAllocateInfo::default()
                        .command_pool(pool)
                        .level(vk::CommandBufferLevel::PRIMARY)
                        .command_buffer_count(1),
                )
                .unwrap()[0];
            let fence = d
                .create_fence(&vk::FenceCreateInfo::default(), None)
                .unwrap();
            for _ in 0..n {
                d.begin_command_buffer(cmd, &vk::CommandBufferBeginInfo::default())
                    .unwrap();
                d.cmd_pipeline_barrier(
                    cmd,
                    vk::PipelineStageFlags::COMPUTE_SHADER,
                    vk::PipelineStageFlags::COMPUTE_SHADER,
                    vk::DependencyFlags::empty(),
                    &[vk::MemoryBarrier::default()
                        .src_access_mask(vk::AccessFlags::SHADER_WRITE)
                        .dst_access_mask(vk::AccessFlags::SHADER_READ)],
                    &[],
                    &[],
                );
                d.end_command_buffer(cmd).unwrap();
                let cmds = [cmd];
                {
                    engine_lock(std::ptr::from_ref(lock).cast_mut().cast());
                    d.queue_submit(
                        self.queue,
                        &[vk::SubmitInfo::default().command_buffers(&cmds)],
                        fence,
                    )
                    .unwrap();
                    engine_unlock(std::ptr::from_ref(lock).cast_mut().cast());
                }
                d.wait_for_fences(&[fence], true, u64::MAX).unwrap();
                d.reset_fences(&[fence]).unwrap();
            }
            d.destroy_fence(fence, None);
            d.destroy_command_pool(pool, None);
        }
    }
}

#[test]
fn kpc_and_the_engine_serialize_on_the_engines_lock() {
    let test = "kpc_and_the_engine_serialize_on_the_engines_lock";
    let _g = begin();
    let Some(engine) = Engine::new(test) else {
        return;
    };
    let lock = EngineLock {
        raw: <parking_lot::RawMutex as parking_lot::lock_api::RawMutex>::INIT,
        taken_by_kpc: AtomicU64::new(0),
    };
    let handles = VulkanHandles {
        queue_lock: Some(VulkanQueueLock {
            lock: engine_lock,
            unlock: engine_unlock,
            user_data: std::ptr::from_ref(&lock).cast_mut().cast(),
        }),
        ..engine.handles()
    };
    // SAFETY: as in Engine::context; the hook's callbacks lock and unlock `lock`, which outlives
    // every context, from any thread.
    let contexts: Vec<Context> = (0..4)
        .map(|_| {
            unsafe {
                Context::builder()
                    .vulkan_handles(&handles)
                    .config(test_config())
                    .build()
            }
            .unwrap()
        })
        .collect();
    std::thread::scope(|s| {
        for ctx in &contexts {
            s.spawn(move || launches(ctx, 40));
        }
        s.spawn(|| engine.submit_own(&lock, 200));
    });
    drop(contexts);
    let c = calls_after_last_drop();
    let submits = c.per_fn.get("vkQueueSubmit").map_or(0, |v| v.0);
    assert!(submits > 0);
    assert_eq!(
        lock.taken_by_kpc.load(Ordering::SeqCst),
        submits,
        "kpc took the engine's lock around each of its submissions, and only then"
    );
    assert_clean(test, &c);
}

#[test]
fn quiesce_leaves_nothing_in_flight() {
    let test = "quiesce_leaves_nothing_in_flight";
    let _g = begin();
    let Some(engine) = Engine::new(test) else {
        return;
    };
    let ctx = engine.context(&test_config());
    let p = ctx.prefetch(variants(300));
    wait_for_calls(30);
    ctx.quiesce().unwrap();
    let c = calls_after_last_drop();
    assert_clean(test, &c);
    vk_counting::reopen();
    let results = p.wait();
    let cancelled = results
        .iter()
        .filter(|r| matches!(r, Err(kpc::Error::Cancelled(_))))
        .count();
    eprintln!("{test}: {cancelled} of 300 requests cancelled by quiesce");
    assert!(
        results
            .iter()
            .all(|r| r.is_ok() || matches!(r, Err(kpc::Error::Cancelled(_))))
    );
    // Still usable afterwards.
    launches(&ctx, 2);
}

#[test]
fn an_instance_api_version_never_splits_the_cache_and_a_malformed_one_is_refused() {
    let test = "an_instance_api_version_never_splits_the_cache_and_a_malformed_one_is_refused";
    let _g = begin();
    let Some(engine) = Engine::new(test) else {
        return;
    };
    let owned = kpc::admin::vulkan::devices().unwrap()[0]
        .fingerprint
        .clone();
    // 1.1 declared for an instance made at a higher version (or truly 1.1): a device that cannot
    // name its driver through 1.1 is fingerprinted through kpc's own instance instead.
    for v in [vk::API_VERSION_1_1, engine.api_version] {
        let h = VulkanHandles {
            instance_api_version: v,
            ..engine.handles()
        };
        // SAFETY: as in Engine::context; a declared version at or below the instance's own uses
        // nothing the instance lacks.
        let ctx = unsafe {
            Context::builder()
                .vulkan_handles(&h)
                .config(test_config())
                .build()
        }
        .unwrap();
        assert_eq!(ctx.device().fingerprint, owned, "instance API {v:#x}");
    }
    for bad in [
        vk::make_api_version(0, 2, 0, 0),
        vk::make_api_version(1, 1, 3, 0),
        0,
    ] {
        let h = VulkanHandles {
            instance_api_version: bad,
            ..engine.handles()
        };
        // SAFETY: refused before any handle is used.
        let e = unsafe {
            Context::builder()
                .vulkan_handles(&h)
                .config(test_config())
                .build()
        }
        .unwrap_err();
        assert!(
            matches!(&e, kpc::Error::InvalidArgument(m) if m.contains("API") || m.contains("Vulkan")),
            "{bad:#x}: {e}"
        );
    }
    assert_clean(test, &calls_after_last_drop());
}

#[test]
fn kernel_handles_are_made_once_and_the_eviction_threshold_counts_the_code() {
    let test = "kernel_handles_are_made_once_and_the_eviction_threshold_counts_the_code";
    let _g = begin();
    let Some(engine) = Engine::new(test) else {
        return;
    };
    let image = spirv_image("saxpy").unwrap();
    let config = Config::builder()
        .persistent(false)
        .in_mem_eviction_threshold(2 * image.bytes().len() as u64)
        .build()
        .unwrap();
    let ctx = engine.context(&config);
    let kernels: Vec<kpc::Kernel> = (0..4)
        .map(|b| {
            let spec = SpecConstants::new().with(1, SpecValue::I32(b));
            ctx.kernel_with(&kpc::KernelRequest::new(&image, "saxpy").spec(spec.clone()))
                .unwrap()
        })
        .collect();
    // Lent, not made per call: the same handles, with the same arrays, every time.
    let (a, b) = (
        kernels[0].vulkan_handles().unwrap(),
        kernels[0].vulkan_handles().unwrap(),
    );
    assert!(std::ptr::eq(a, b) && a.bindings.as_ptr() == b.bindings.as_ptr());
    // Each program counts at least its SPIR-V, so a threshold of two images' bytes keeps at most
    // two of the four programs (lavapipe's pipeline-cache data alone is a 32-byte stub).
    let s = ctx.stats().memory;
    assert!(s.programs <= 2 && s.evictions >= 2, "{s:?}");
    assert!(s.program_bytes >= image.bytes().len() as u64, "{s:?}");
    drop(kernels);
    drop(ctx);
    assert_clean(test, &calls_after_last_drop());
}
