// A Rust embedder that owns its Vulkan device: it creates the instance and device itself (ash),
// lends them to kpc, takes the raw handles of kpc's cached saxpy pipeline, and records and submits
// the dispatch in its own command buffer. kpc never destroys the embedder's instance or device; the
// embedder destroys them after kpc's objects are gone. Then it saves the kernel as a cache blob and
// recreates it in a second context without a build, as an engine with its own storage would.
//
// Run: `cargo run --example embed_vulkan` (any Vulkan 1.1 driver; lavapipe works).
//
// The `unsafe` blocks are the embedder's own Vulkan calls, as in any ash program.

use ash::vk;
use kpc::interop::{VulkanFeatures, VulkanHandles};
use kpc::{BuildOptions, SpecConstants, SpecValue};
use kpc::{Config, Context};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // --- The embedder's own device: one compute queue, no optional features. ---
    // SAFETY: loading the system's Vulkan loader, as every Vulkan application does.
    let entry = unsafe { ash::Entry::load()? };
    let api_version = vk::API_VERSION_1_1;
    let app = vk::ApplicationInfo::default().api_version(api_version);
    // SAFETY: the create info lives across the call.
    let instance = unsafe {
        entry.create_instance(
            &vk::InstanceCreateInfo::default().application_info(&app),
            None,
        )?
    };
    // SAFETY: the instance is alive.
    let pd = unsafe { instance.enumerate_physical_devices()? }[0];
    // SAFETY: `pd` belongs to the instance.
    let family = unsafe { instance.get_physical_device_queue_family_properties(pd) }
        .iter()
        .position(|f| f.queue_flags.contains(vk::QueueFlags::COMPUTE))
        .ok_or("no compute queue")? as u32;
    let queues = [vk::DeviceQueueCreateInfo::default()
        .queue_family_index(family)
        .queue_priorities(&[1.0])];
    // SAFETY: the create info lives across the call.
    let device = unsafe {
        instance.create_device(
            pd,
            &vk::DeviceCreateInfo::default().queue_create_infos(&queues),
            None,
        )?
    };
    // SAFETY: queue 0 of `family` was requested.
    let queue = unsafe { device.get_device_queue(family, 0) };

    // --- kpc over it. ---
    let handles = VulkanHandles {
        get_instance_proc_addr: entry.static_fn().get_instance_proc_addr,
        instance: instance.handle(),
        instance_api_version: api_version,
        physical_device: pd,
        device: device.handle(),
        queue_family_index: family,
        queue,
        enabled: VulkanFeatures::default(),
        queue_lock: None,
    };
    let config = Config::from_env()?;
    // SAFETY: the handles are live and belong together; they outlive every kpc object below
    // (destroyed at the end, after those are dropped); no optional feature is declared.
    let ctx = unsafe {
        Context::builder()
            .vulkan_handles(&handles)
            .config(config.clone())
            .build()?
    };
    let image = kpc::kernels::spirv_image("saxpy")?;
    let request = kpc::KernelRequest::new(&image, "saxpy")
        .spec(SpecConstants::new().with(1, SpecValue::I32(10))) // BIAS
        .options(BuildOptions::default());
    let kernel = ctx.kernel_with(&request)?;
    let h = kernel.vulkan_handles()?;
    println!(
        "kpc kernel {:?} on {} from {}: local size {:?}, bindings {:?}",
        kernel.name(),
        ctx.device().name,
        kernel.source(),
        h.local_size,
        h.bindings
    );

    // --- The embedder's own buffers, descriptor set and command buffer. ---
    let n = 1024usize;
    // SAFETY: `pd` belongs to the live instance.
    let memory = unsafe { instance.get_physical_device_memory_properties(pd) };
    let host = vk::MemoryPropertyFlags::HOST_VISIBLE | vk::MemoryPropertyFlags::HOST_COHERENT;
    let mut buffers = Vec::new();
    for fill in [1.0f32, 2.0, f32::NAN] {
        let info = vk::BufferCreateInfo::default()
            .size(4 * n as u64)
            .usage(vk::BufferUsageFlags::STORAGE_BUFFER);
        // SAFETY: plain creation, binding and mapping of host-visible memory on a live device; all
        // destroyed below after the work finished.
        unsafe {
            let buf = device.create_buffer(&info, None)?;
            let req = device.get_buffer_memory_requirements(buf);
            let ty = (0..memory.memory_type_count)
                .find(|&i| {
                    req.memory_type_bits & (1 << i) != 0
                        && memory.memory_types[i as usize]
                            .property_flags
                            .contains(host)
                })
                .ok_or("no host-visible memory")?;
            let mem = device.allocate_memory(
                &vk::MemoryAllocateInfo::default()
                    .allocation_size(req.size)
                    .memory_type_index(ty),
                None,
            )?;
            device.bind_buffer_memory(buf, mem, 0)?;
            let ptr = device
                .map_memory(mem, 0, vk::WHOLE_SIZE, vk::MemoryMapFlags::empty())?
                .cast::<f32>();
            std::slice::from_raw_parts_mut(ptr, n).fill(fill);
            buffers.push((buf, mem, ptr));
        }
    }
    let sizes = [vk::DescriptorPoolSize {
        ty: vk::DescriptorType::STORAGE_BUFFER,
        descriptor_count: h.bindings.len() as u32,
    }];
    let mut push = (n as u32).to_le_bytes().to_vec();
    push.extend_from_slice(&3.0f32.to_le_bytes()); // a
    // SAFETY: the embedder's pool, set, command pool and fence, on kpc's live set layout, pipeline
    // layout and pipeline (the kernel is alive); the queue is not used by kpc meanwhile (this
    // program is single-threaded); everything is destroyed after the fence signaled.
    let out = unsafe {
        let pool = device.create_descriptor_pool(
            &vk::DescriptorPoolCreateInfo::default()
                .max_sets(1)
                .pool_sizes(&sizes),
            None,
        )?;
        let set = device.allocate_descriptor_sets(
            &vk::DescriptorSetAllocateInfo::default()
                .descriptor_pool(pool)
                .set_layouts(&h.descriptor_set_layouts),
        )?[0];
        let infos: Vec<[vk::DescriptorBufferInfo; 1]> = buffers
            .iter()
            .map(|(b, _, _)| {
                [vk::DescriptorBufferInfo::default()
                    .buffer(*b)
                    .range(vk::WHOLE_SIZE)]
            })
            .collect();
        let writes: Vec<vk::WriteDescriptorSet> = h
            .bindings
            .iter()
            .zip(&infos)
            .map(|((binding, ty), info)| {
                vk::WriteDescriptorSet::default()
                    .dst_set(set)
                    .dst_binding(*binding)
                    .descriptor_type(*ty)
                    .buffer_info(info)
            })
            .collect();
        device.update_descriptor_sets(&writes, &[]);
        let cmd_pool = device.create_command_pool(
            &vk::CommandPoolCreateInfo::default().queue_family_index(family),
            None,
        )?;
        let cmd = device.allocate_command_buffers(
            &vk::CommandBufferAllocateInfo::default()
                .command_pool(cmd_pool)
                .command_buffer_count(1),
        )?[0];
        device.begin_command_buffer(cmd, &vk::CommandBufferBeginInfo::default())?;
        device.cmd_bind_pipeline(cmd, vk::PipelineBindPoint::COMPUTE, h.pipeline);
        device.cmd_bind_descriptor_sets(
            cmd,
            vk::PipelineBindPoint::COMPUTE,
            h.pipeline_layout,
            0,
            &[set],
            &[],
        );
        let range = h.push_constant_range.ok_or("saxpy takes push constants")?;
        device.cmd_push_constants(cmd, h.pipeline_layout, range.stage_flags, 0, &push);
        device.cmd_dispatch(cmd, (n as u32).div_ceil(h.local_size[0]), 1, 1);
        device.cmd_pipeline_barrier(
            cmd,
            vk::PipelineStageFlags::COMPUTE_SHADER,
            vk::PipelineStageFlags::HOST,
            vk::DependencyFlags::empty(),
            &[vk::MemoryBarrier::default()
                .src_access_mask(vk::AccessFlags::SHADER_WRITE)
                .dst_access_mask(vk::AccessFlags::HOST_READ)],
            &[],
            &[],
        );
        device.end_command_buffer(cmd)?;
        let fence = device.create_fence(&vk::FenceCreateInfo::default(), None)?;
        device.queue_submit(
            queue,
            &[vk::SubmitInfo::default().command_buffers(&[cmd])],
            fence,
        )?;
        device.wait_for_fences(&[fence], true, u64::MAX)?;
        let out = std::slice::from_raw_parts(buffers[2].2, n).to_vec();
        device.destroy_fence(fence, None);
        device.destroy_command_pool(cmd_pool, None);
        device.destroy_descriptor_pool(pool, None);
        for (b, m, _) in buffers.drain(..) {
            device.destroy_buffer(b, None);
            device.free_memory(m, None);
        }
        out
    };
    let want = 3.0 * 1.0 + 2.0 + 10.0;
    let wrong = out.iter().filter(|&&v| v != want).count();
    println!(
        "dispatched by the embedder: out[0] = {}, {wrong} of {n} wrong",
        out[0]
    );

    // --- The embedder's own persistence: a blob under its id, back without a build. ---
    let id = ctx.cache_blob_id(&request)?;
    let blob = kernel.cache_blob()?;
    // SAFETY: as for the first context.
    let ctx2 = unsafe {
        Context::builder()
            .vulkan_handles(&handles)
            .config(config.clone())
            .build()?
    };
    let again = ctx2.kernel_from_blob(&request, &blob)?;
    println!(
        "blob: {} bytes under a {}-byte id; second context: kernel from {}, {} programs built",
        blob.len(),
        id.len(),
        again.source(),
        ctx2.stats().backend_counters.programs_built
    );

    // --- kpc's objects go first; then the embedder destroys what it owns. ---
    drop((kernel, again, ctx, ctx2));
    // SAFETY: nothing uses the device or instance any more.
    unsafe {
        device.destroy_device(None);
        instance.destroy_instance(None);
    }
    if wrong > 0 {
        return Err(format!("{wrong} wrong results").into());
    }
    Ok(())
}
