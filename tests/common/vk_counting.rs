//! A pass-through `vkGetInstanceProcAddr` for checking kpc's interop contract from the outside:
//! kpc is handed [`counting_gipa`] instead of the loader's, and every device-level function kpc
//! calls (each one its code uses, listed below) goes through a wrapper that counts the call,
//! records the calling thread, and forwards to the real function (the loader's trampoline, so the
//! validation layer still sees the call).
//!
//! What the wrappers check:
//! - calls made while [`close`] is in force (after the test dropped its last kpc object): counted
//!   apart, with the names of the threads that made them;
//! - two kpc calls on a queue (vkQueueSubmit) at once: each wrapper of a queue call holds the
//!   queue for a while (100 µs) so that two kpc threads that would submit together do overlap,
//!   and counts the overlaps.
//!
//! The state is global (the wrappers are plain functions), so a test binary runs its scenarios
//! one at a time ([`scenario`]).

use std::collections::BTreeMap;
use std::ffi::{CStr, c_char, c_void};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

use ash::vk;
use parking_lot::{Mutex, MutexGuard};

static REAL_GIPA: AtomicUsize = AtomicUsize::new(0);
static REAL_GDPA: AtomicUsize = AtomicUsize::new(0);

/// Calls counted since [`reset`].
static CALLS: AtomicU64 = AtomicU64::new(0);
/// Calls made while closed, since [`reset`].
static AFTER: AtomicU64 = AtomicU64::new(0);
static CLOSED: AtomicBool = AtomicBool::new(false);
/// kpc calls inside a queue function right now, and how often a second one joined.
static IN_QUEUE: AtomicU64 = AtomicU64::new(0);
static OVERLAPS: AtomicU64 = AtomicU64::new(0);
/// Per function: (calls, calls while closed); per thread name: calls; the closed calls' threads.
static DETAIL: Mutex<Option<Detail>> = Mutex::new(None);
static SERIAL: Mutex<()> = Mutex::new(());

#[derive(Default)]
struct Detail {
    per_fn: BTreeMap<&'static str, (u64, u64)>,
    threads: BTreeMap<String, u64>,
    after_threads: BTreeMap<String, u64>,
}

/// What the wrappers saw since [`reset`].
#[derive(Debug, Clone)]
pub struct Counts {
    /// Device-level calls kpc made.
    pub calls: u64,
    /// Of them, made while closed (after the last kpc object was dropped).
    pub after_close: u64,
    /// Times a kpc queue call began while another kpc queue call was running.
    pub overlaps: u64,
    /// Per function: (calls, calls while closed).
    pub per_fn: BTreeMap<&'static str, (u64, u64)>,
    /// Per calling thread (by name): calls.
    pub threads: BTreeMap<String, u64>,
    /// Per thread that called while closed: calls.
    pub after_threads: BTreeMap<String, u64>,
}

/// Runs one scenario at a time in this process; the guard resets the counts.
pub fn scenario() -> MutexGuard<'static, ()> {
    let g = SERIAL.lock();
    reset();
    g
}

/// Zeroes the counts and opens.
pub fn reset() {
    CALLS.store(0, Ordering::SeqCst);
    AFTER.store(0, Ordering::SeqCst);
    OVERLAPS.store(0, Ordering::SeqCst);
    CLOSED.store(false, Ordering::SeqCst);
    *DETAIL.lock() = Some(Detail::default());
}

/// From now on every call is a call after the last drop.
pub fn close() {
    CLOSED.store(true, Ordering::SeqCst);
}

/// Calls are expected again (a test that quiesced and now drops its objects).
pub fn reopen() {
    CLOSED.store(false, Ordering::SeqCst);
}

/// The counts so far.
pub fn counts() -> Counts {
    let d = DETAIL.lock();
    let d = d.as_ref();
    Counts {
        calls: CALLS.load(Ordering::SeqCst),
        after_close: AFTER.load(Ordering::SeqCst),
        overlaps: OVERLAPS.load(Ordering::SeqCst),
        per_fn: d.map(|d| d.per_fn.clone()).unwrap_or_default(),
        threads: d.map(|d| d.threads.clone()).unwrap_or_default(),
        after_threads: d.map(|d| d.after_threads.clone()).unwrap_or_default(),
    }
}

fn thread_name() -> String {
    let t = std::thread::current();
    t.name()
        .map_or_else(|| format!("{:?}", t.id()), str::to_string)
}

struct Call {
    queue: bool,
}

fn enter(name: &'static str, queue: bool) -> Call {
    CALLS.fetch_add(1, Ordering::SeqCst);
    let closed = CLOSED.load(Ordering::SeqCst);
    if closed {
        AFTER.fetch_add(1, Ordering::SeqCst);
    }
    if let Some(d) = DETAIL.lock().as_mut() {
        let e = d.per_fn.entry(name).or_default();
        e.0 += 1;
        let who = thread_name();
        if closed {
            e.1 += 1;
            *d.after_threads.entry(who.clone()).or_default() += 1;
        }
        *d.threads.entry(who).or_default() += 1;
    }
    if queue {
        if IN_QUEUE.fetch_add(1, Ordering::SeqCst) > 0 {
            OVERLAPS.fetch_add(1, Ordering::SeqCst);
        }
        // Widens the window in which an unserialized second submitter shows up.
        std::thread::sleep(std::time::Duration::from_micros(100));
    }
    Call { queue }
}

impl Drop for Call {
    fn drop(&mut self) {
        if self.queue {
            IN_QUEUE.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

macro_rules! wrap {
    ($($queue:literal $name:ident ($($a:ident : $t:ty),*) $(-> $ret:ty)?;)*) => {
        #[allow(non_upper_case_globals)]
        mod real {
            use std::sync::atomic::AtomicUsize;
            $(pub static $name: AtomicUsize = AtomicUsize::new(0);)*
        }
        $(
            #[allow(non_snake_case)]
            unsafe extern "system" fn $name($($a: $t),*) $(-> $ret)? {
                let _call = enter(stringify!($name), $queue);
                // SAFETY: the slot holds the real function of this name (set by `device_proc`
                // before this wrapper was handed out), whose signature this is.
                let f: unsafe extern "system" fn($($t),*) $(-> $ret)? =
                    unsafe { std::mem::transmute(real::$name.load(Ordering::SeqCst)) };
                // SAFETY: forwarding the caller's arguments unchanged.
                unsafe { f($($a),*) }
            }
        )*
        /// The real function's slot and the wrapper, for a wrapped name.
        fn wrapped(name: &[u8]) -> Option<(&'static AtomicUsize, usize)> {
            $(
                if name == stringify!($name).as_bytes() {
                    return Some((&real::$name, $name as *const () as usize));
                }
            )*
            None
        }
    };
}

type Alloc = *const vk::AllocationCallbacks<'static>;

wrap! {
    true vkQueueSubmit(q: vk::Queue, n: u32, s: *const vk::SubmitInfo<'static>, f: vk::Fence) -> vk::Result;
    true vkQueueWaitIdle(q: vk::Queue) -> vk::Result;
    false vkDeviceWaitIdle(d: vk::Device) -> vk::Result;
    false vkCreateComputePipelines(d: vk::Device, c: vk::PipelineCache, n: u32, i: *const vk::ComputePipelineCreateInfo<'static>, a: Alloc, o: *mut vk::Pipeline) -> vk::Result;
    false vkDestroyPipeline(d: vk::Device, p: vk::Pipeline, a: Alloc);
    false vkCreatePipelineLayout(d: vk::Device, i: *const vk::PipelineLayoutCreateInfo<'static>, a: Alloc, o: *mut vk::PipelineLayout) -> vk::Result;
    false vkDestroyPipelineLayout(d: vk::Device, p: vk::PipelineLayout, a: Alloc);
    false vkCreateDescriptorSetLayout(d: vk::Device, i: *const vk::DescriptorSetLayoutCreateInfo<'static>, a: Alloc, o: *mut vk::DescriptorSetLayout) -> vk::Result;
    false vkDestroyDescriptorSetLayout(d: vk::Device, p: vk::DescriptorSetLayout, a: Alloc);
    false vkCreateShaderModule(d: vk::Device, i: *const vk::ShaderModuleCreateInfo<'static>, a: Alloc, o: *mut vk::ShaderModule) -> vk::Result;
    false vkDestroyShaderModule(d: vk::Device, p: vk::ShaderModule, a: Alloc);
    false vkCreatePipelineCache(d: vk::Device, i: *const vk::PipelineCacheCreateInfo<'static>, a: Alloc, o: *mut vk::PipelineCache) -> vk::Result;
    false vkDestroyPipelineCache(d: vk::Device, p: vk::PipelineCache, a: Alloc);
    false vkGetPipelineCacheData(d: vk::Device, c: vk::PipelineCache, s: *mut usize, o: *mut c_void) -> vk::Result;
    false vkCreateBuffer(d: vk::Device, i: *const vk::BufferCreateInfo<'static>, a: Alloc, o: *mut vk::Buffer) -> vk::Result;
    false vkDestroyBuffer(d: vk::Device, p: vk::Buffer, a: Alloc);
    false vkGetBufferMemoryRequirements(d: vk::Device, b: vk::Buffer, o: *mut vk::MemoryRequirements);
    false vkAllocateMemory(d: vk::Device, i: *const vk::MemoryAllocateInfo<'static>, a: Alloc, o: *mut vk::DeviceMemory) -> vk::Result;
    false vkFreeMemory(d: vk::Device, m: vk::DeviceMemory, a: Alloc);
    false vkBindBufferMemory(d: vk::Device, b: vk::Buffer, m: vk::DeviceMemory, off: u64) -> vk::Result;
    false vkMapMemory(d: vk::Device, m: vk::DeviceMemory, off: u64, s: u64, fl: vk::MemoryMapFlags, o: *mut *mut c_void) -> vk::Result;
    false vkUnmapMemory(d: vk::Device, m: vk::DeviceMemory);
    false vkCreateFence(d: vk::Device, i: *const vk::FenceCreateInfo<'static>, a: Alloc, o: *mut vk::Fence) -> vk::Result;
    false vkDestroyFence(d: vk::Device, p: vk::Fence, a: Alloc);
    false vkResetFences(d: vk::Device, n: u32, f: *const vk::Fence) -> vk::Result;
    false vkWaitForFences(d: vk::Device, n: u32, f: *const vk::Fence, all: vk::Bool32, t: u64) -> vk::Result;
    false vkGetFenceStatus(d: vk::Device, f: vk::Fence) -> vk::Result;
    false vkCreateQueryPool(d: vk::Device, i: *const vk::QueryPoolCreateInfo<'static>, a: Alloc, o: *mut vk::QueryPool) -> vk::Result;
    false vkDestroyQueryPool(d: vk::Device, p: vk::QueryPool, a: Alloc);
    false vkResetQueryPool(d: vk::Device, p: vk::QueryPool, first: u32, n: u32);
    false vkGetQueryPoolResults(d: vk::Device, p: vk::QueryPool, first: u32, n: u32, s: usize, o: *mut c_void, stride: u64, fl: vk::QueryResultFlags) -> vk::Result;
    false vkCreateDescriptorPool(d: vk::Device, i: *const vk::DescriptorPoolCreateInfo<'static>, a: Alloc, o: *mut vk::DescriptorPool) -> vk::Result;
    false vkDestroyDescriptorPool(d: vk::Device, p: vk::DescriptorPool, a: Alloc);
    false vkResetDescriptorPool(d: vk::Device, p: vk::DescriptorPool, fl: vk::DescriptorPoolResetFlags) -> vk::Result;
    false vkAllocateDescriptorSets(d: vk::Device, i: *const vk::DescriptorSetAllocateInfo<'static>, o: *mut vk::DescriptorSet) -> vk::Result;
    false vkUpdateDescriptorSets(d: vk::Device, wn: u32, w: *const vk::WriteDescriptorSet<'static>, cn: u32, c: *const vk::CopyDescriptorSet<'static>);
    false vkCreateCommandPool(d: vk::Device, i: *const vk::CommandPoolCreateInfo<'static>, a: Alloc, o: *mut vk::CommandPool) -> vk::Result;
    false vkDestroyCommandPool(d: vk::Device, p: vk::CommandPool, a: Alloc);
    false vkAllocateCommandBuffers(d: vk::Device, i: *const vk::CommandBufferAllocateInfo<'static>, o: *mut vk::CommandBuffer) -> vk::Result;
    false vkBeginCommandBuffer(c: vk::CommandBuffer, i: *const vk::CommandBufferBeginInfo<'static>) -> vk::Result;
    false vkEndCommandBuffer(c: vk::CommandBuffer) -> vk::Result;
    false vkCmdPipelineBarrier(c: vk::CommandBuffer, s: vk::PipelineStageFlags, t: vk::PipelineStageFlags, dep: vk::DependencyFlags, mn: u32, m: *const vk::MemoryBarrier<'static>, bn: u32, b: *const vk::BufferMemoryBarrier<'static>, im: u32, i: *const vk::ImageMemoryBarrier<'static>);
    false vkCmdCopyBuffer(c: vk::CommandBuffer, s: vk::Buffer, t: vk::Buffer, n: u32, r: *const vk::BufferCopy);
    false vkCmdBindPipeline(c: vk::CommandBuffer, bp: vk::PipelineBindPoint, p: vk::Pipeline);
    false vkCmdBindDescriptorSets(c: vk::CommandBuffer, bp: vk::PipelineBindPoint, l: vk::PipelineLayout, first: u32, n: u32, s: *const vk::DescriptorSet, dn: u32, dy: *const u32);
    false vkCmdPushConstants(c: vk::CommandBuffer, l: vk::PipelineLayout, st: vk::ShaderStageFlags, off: u32, s: u32, v: *const c_void);
    false vkCmdDispatch(c: vk::CommandBuffer, x: u32, y: u32, z: u32);
    false vkCmdWriteTimestamp(c: vk::CommandBuffer, st: vk::PipelineStageFlags, p: vk::QueryPool, q: u32);
    false vkCmdResetQueryPool(c: vk::CommandBuffer, p: vk::QueryPool, first: u32, n: u32);
}

/// The `vkGetDeviceProcAddr` kpc gets: wrappers for the wrapped names, the real function otherwise.
unsafe extern "system" fn device_proc(
    device: vk::Device,
    name: *const c_char,
) -> vk::PFN_vkVoidFunction {
    // SAFETY: set by `counting_gipa` before it handed this function out.
    let real: vk::PFN_vkGetDeviceProcAddr =
        unsafe { std::mem::transmute(REAL_GDPA.load(Ordering::SeqCst)) };
    // SAFETY: forwarding the caller's arguments.
    let f = unsafe { real(device, name) };
    // SAFETY: Vulkan passes a NUL-terminated name.
    let n = unsafe { CStr::from_ptr(name) }.to_bytes();
    match (f, wrapped(n)) {
        (Some(f), Some((slot, wrapper))) => {
            slot.store(f as usize, Ordering::SeqCst);
            // SAFETY: the wrapper has the signature of the function named.
            Some(unsafe { std::mem::transmute::<usize, unsafe extern "system" fn()>(wrapper) })
        }
        (f, _) => f,
    }
}

/// Installs the real `vkGetInstanceProcAddr` the wrappers forward to.
pub fn install(real: vk::PFN_vkGetInstanceProcAddr) {
    REAL_GIPA.store(real as usize, Ordering::SeqCst);
}

/// The `vkGetInstanceProcAddr` to hand kpc: the real one, except that `vkGetDeviceProcAddr` is
/// [`device_proc`], so every device function kpc loads is looked up through it.
///
/// # Safety
/// As `vkGetInstanceProcAddr`; [`install`] was called.
pub unsafe extern "system" fn counting_gipa(
    instance: vk::Instance,
    name: *const c_char,
) -> vk::PFN_vkVoidFunction {
    // SAFETY: `install` stored the loader's function.
    let real: vk::PFN_vkGetInstanceProcAddr =
        unsafe { std::mem::transmute(REAL_GIPA.load(Ordering::SeqCst)) };
    // SAFETY: forwarding the caller's arguments.
    let f = unsafe { real(instance, name) };
    // SAFETY: Vulkan passes a NUL-terminated name.
    if unsafe { CStr::from_ptr(name) }.to_bytes() == b"vkGetDeviceProcAddr" {
        if let Some(f) = f {
            REAL_GDPA.store(f as usize, Ordering::SeqCst);
            // SAFETY: same signature as vkGetDeviceProcAddr.
            return Some(unsafe {
                std::mem::transmute::<vk::PFN_vkGetDeviceProcAddr, unsafe extern "system" fn()>(
                    device_proc,
                )
            });
        }
    }
    f
}
