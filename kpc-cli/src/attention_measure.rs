//! What `kpc attention` measures with besides attention itself: the device's copy and read
//! bandwidth (the floor a decode step is compared with), launch timing, and its random inputs.

use std::time::{Duration, Instant};

use kpc::BackendKind;
use kpc::{Context, Event, PushConstants};

/// Uniform numbers in [-1, 1) from a xorshift generator seeded by the clock: fresh inputs each run.
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn new() -> Rng {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64);
        Rng(t | 1)
    }
    pub(crate) fn vec(&mut self, n: usize) -> Vec<f32> {
        (0..n)
            .map(|_| {
                self.0 ^= self.0 << 13;
                self.0 ^= self.0 >> 7;
                self.0 ^= self.0 << 17;
                ((self.0 >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
            })
            .collect()
    }
}

/// `[h][len][d]` → the first `n` positions of each head.
pub(crate) fn prefix(x: &[f32], heads: usize, len: usize, d: usize, n: usize) -> Vec<f32> {
    (0..heads)
        .flat_map(|h| x[h * len * d..][..n * d].iter().copied())
        .collect()
}

/// A shipped kernel of the context's backend, with its default spec constants.
pub(crate) fn shipped(ctx: &Context, name: &str) -> kpc::Result<kpc::Kernel> {
    let image = match ctx.backend() {
        BackendKind::Vulkan => crate::shipped::spirv_image(name)?,
        BackendKind::OpenCl => crate::shipped::opencl_image(name)?,
    };
    ctx.kernel(&image, name)
}

/// The device's copy bandwidth in bytes per second (read + write), from the copy kernel.
pub(crate) fn copy_bandwidth(ctx: &Context) -> kpc::Result<(f64, kpc::Kernel)> {
    let k = shipped(ctx, "copy")?;
    // 256 MiB each way on a GPU, well past its L2, so the copy measures device memory; 16 MiB on a CPU.
    let n = if ctx.device().device_type.is_gpu() {
        1usize << 24
    } else {
        1usize << 20
    };
    let time = stream_time(ctx, &k, n, false)?;
    Ok((2.0 * (16 * n) as f64 / time.as_secs_f64(), k))
}

/// Median time of one copy (`read_only` false: the copy kernel) or one read (`read_only`: the
/// read kernel, which writes one element per workgroup) of `n` 16-byte elements, each launch
/// waited for; device time where the backend has timestamps. Ten warm-up launches (clocks leave
/// idle under load), then the median of twenty.
pub(crate) fn stream_time(
    ctx: &Context,
    k: &kpc::Kernel,
    n: usize,
    read_only: bool,
) -> kpc::Result<Duration> {
    let n = n.max(1);
    // The read kernel keeps four loads in flight per invocation.
    let per = if read_only { 4 } else { 1 };
    let mut groups = k.groups_for([n.div_ceil(per) as u64, 1, 1])?;
    groups[0] = groups[0].min(ctx.device().limits.max_workgroup_count[0]);
    let src = ctx.buffer::<u32>(4 * n)?;
    let dst = ctx.buffer::<u32>(4 * if read_only { groups[0] as usize } else { n })?;
    let push = PushConstants::new().u32(n as u32);
    let mut times = Vec::with_capacity(20);
    for i in 0..30 {
        let time = timed(|| {
            ctx.queue()
                .launch(k, groups, &[&src, &dst], push.as_bytes())
        })?;
        if i >= 10 {
            times.push(time);
        }
    }
    times.sort();
    Ok(times[times.len() / 2])
}

/// Runs `launch` and waits for it: its device time, or the wall time where the backend has no
/// timestamps.
pub(crate) fn timed(launch: impl FnOnce() -> kpc::Result<Event>) -> kpc::Result<Duration> {
    let t = Instant::now();
    let ev = launch()?;
    ev.wait()?;
    Ok(ev.device_time()?.unwrap_or_else(|| t.elapsed()))
}
