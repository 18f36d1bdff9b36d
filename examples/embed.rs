// README "Embedding kpc", the first program: open a context, get kpc's shipped `saxpy` for the
// context's backend, launch it, read the result and the counters. Runs on either backend:
// `KPC_DEVICE=vulkan:0` or `KPC_DEVICE=opencl:0 cargo run --release --example embed`.
use kpc::{Context, PushConstants};

fn main() -> kpc::Result<()> {
    let ctx = Context::builder().build()?; // the device KPC_DEVICE selects
    let image = kpc::kernels::shipped("saxpy", ctx.backend())?; // SPIR-V or OpenCL C
    let kernel = ctx.kernel(&image, "saxpy")?; // from memory, a store, or a build
    let n = 1024;
    let x = ctx.buffer_from(&vec![1.0f32; n])?;
    let y = ctx.buffer_from(&vec![2.0f32; n])?;
    let out = ctx.buffer::<f32>(n)?;
    let push = PushConstants::new().u32(n as u32).f32(3.0); // saxpy(x, y, out; n, a)
    let groups = kernel.groups_for([n as u64, 1, 1])?;
    let event = ctx
        .queue()
        .launch(&kernel, groups, &[&x, &y, &out], push.as_bytes())?;
    event.wait()?;
    assert_eq!(out.read()?, vec![5.0f32; n]); // 3 * 1 + 2
    println!("saxpy on {}, from {}", ctx.device().name, kernel.source());
    println!("{:?}", ctx.stats().memory); // and disk, stores, backend counters, ...
    Ok(())
}
