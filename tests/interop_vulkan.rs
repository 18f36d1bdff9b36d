//! Interop on a real Vulkan driver (lavapipe in CI): the test is the embedder. It creates its own
//! VkInstance and VkDevice through ash, hands them to kpc, takes the raw handles of kpc's saxpy
//! pipeline, records and submits its own dispatch, and checks the output; after kpc's context is
//! gone it uses its device again and destroys it itself. Also: an interop context and an owned one
//! on the same device share fingerprint and disk cache, and what kpc refuses on a borrowed device.
//!
//! `unsafe` here is the embedder's own Vulkan code, each block with the reason it holds.

use crate::common;
use crate::common::req;

use ash::vk;
use kpc::Source;
use kpc::interop::{VulkanFeatures, VulkanHandles, VulkanKernelHandles};
use kpc::kernels::spirv_image;
use kpc::{BuildOptions, SpecConstants, SpecValue};
use kpc::{Config, Context, DeviceImage, Error};

use common::disk::TempDir;
use common::drivers::{random_f32, test_config, vulkan_device};

/// The embedder: its own instance and device with one compute queue, no optional feature enabled.
struct Embedder {
    _entry: ash::Entry,
    instance: ash::Instance,
    api_version: u32,
    pd: vk::PhysicalDevice,
    device: ash::Device,
    family: u32,
    queue: vk::Queue,
    memory: vk::PhysicalDeviceMemoryProperties,
    messenger: common::validation::Messenger,
}

impl Embedder {
    /// Opens device `index` of the loader's enumeration (the order kpc's `vulkan:N` uses).
    fn new(index: usize) -> Embedder {
        // SAFETY: loading the system's Vulkan loader, as any Vulkan application does.
        let entry = unsafe { ash::Entry::load() }.expect("the Vulkan loader");
        // SAFETY: no preconditions.
        let loader = unsafe { entry.try_enumerate_instance_version() }
            .unwrap()
            .unwrap_or(vk::API_VERSION_1_0);
        // The same version kpc asks for on its own instance, so the fingerprints can be compared.
        let api_version = loader.min(vk::API_VERSION_1_3);
        let app = vk::ApplicationInfo::default()
            .application_name(c"kpc interop test")
            .api_version(api_version);
        // Under the validation layer when the run asks for it (scripts/test.sh), so that kpc's
        // calls on this borrowed device are checked too.
        let (layers, extensions) = common::validation::instance_layers_and_extensions();
        // SAFETY: the create info and the name arrays live across the call.
        let instance = unsafe {
            entry.create_instance(
                &vk::InstanceCreateInfo::default()
                    .application_info(&app)
                    .enabled_layer_names(&layers)
                    .enabled_extension_names(&extensions),
                None,
            )
        }
        .expect("vkCreateInstance");
        let messenger = common::validation::install_messenger(&entry, &instance);
        // SAFETY: the instance is alive.
        let pd = unsafe { instance.enumerate_physical_devices() }.unwrap()[index];
        let (device, family, queue) = common::vk_device::open_compute_device(&instance, pd);
        // SAFETY: `pd` belongs to the instance.
        let memory = unsafe { instance.get_physical_device_memory_properties(pd) };
        Embedder {
            _entry: entry,
            instance,
            api_version,
            pd,
            device,
            family,
            queue,
            memory,
            messenger,
        }
    }

    fn handles(&self, enabled: VulkanFeatures) -> VulkanHandles {
        VulkanHandles {
            get_instance_proc_addr: self._entry.static_fn().get_instance_proc_addr,
            instance: self.instance.handle(),
            instance_api_version: self.api_version,
            physical_device: self.pd,
            device: self.device.handle(),
            queue_family_index: self.family,
            queue: self.queue,
            enabled,
            queue_lock: None,
        }
    }

    /// A kpc context over this device.
    fn context(&self, config: &Config) -> Context {
        // SAFETY: the handles are this embedder's live objects, which outlive every kpc object of
        // the test (they are destroyed in Drop, after the tests drop kpc's objects); what is
        // declared (robustBufferAccess where the device has it) is what was enabled.
        let enabled = if common::vk_device::robust(&self.instance, self.pd) {
            VulkanFeatures::ROBUST_BUFFER_ACCESS
        } else {
            VulkanFeatures::empty()
        };
        unsafe {
            Context::builder()
                .vulkan_handles(&self.handles(enabled))
                .config(config.clone())
                .build()
        }
        .expect("an interop context")
    }

    /// A host-visible, coherent buffer of `bytes` bytes, mapped.
    fn buffer(&self, bytes: u64) -> HostBuffer {
        let d = &self.device;
        let info = vk::BufferCreateInfo::default()
            .size(bytes)
            .usage(vk::BufferUsageFlags::STORAGE_BUFFER | vk::BufferUsageFlags::TRANSFER_DST);
        // SAFETY: plain creation on a live device; destroyed by `HostBuffer::destroy`.
        let buf = unsafe { d.create_buffer(&info, None) }.unwrap();
        // SAFETY: `buf` is alive.
        let req = unsafe { d.get_buffer_memory_requirements(buf) };
        let want = vk::MemoryPropertyFlags::HOST_VISIBLE | vk::MemoryPropertyFlags::HOST_COHERENT;
        let ty = (0..self.memory.memory_type_count)
            .find(|&i| {
                req.memory_type_bits & (1 << i) != 0
                    && self.memory.memory_types[i as usize]
                        .property_flags
                        .contains(want)
            })
            .expect("host-visible coherent memory");
        let alloc = vk::MemoryAllocateInfo::default()
            .allocation_size(req.size)
            .memory_type_index(ty);
        // SAFETY: an allowed memory type of sufficient size; bound and mapped once.
        unsafe {
            let mem = d.allocate_memory(&alloc, None).unwrap();
            d.bind_buffer_memory(buf, mem, 0).unwrap();
            let ptr = d
                .map_memory(mem, 0, vk::WHOLE_SIZE, vk::MemoryMapFlags::empty())
                .unwrap()
                .cast::<f32>();
            HostBuffer {
                buf,
                mem,
                ptr,
                len: (bytes / 4) as usize,
            }
        }
    }

    /// Records `record` into a fresh command buffer, submits it to the shared queue, waits.
    fn run(&self, record: impl FnOnce(vk::CommandBuffer)) {
        let d = &self.device;
        // SAFETY: every object is created, used and destroyed here, after the fence signaled; the
        // queue is not used by kpc concurrently (the test is single-threaded).
        unsafe {
            let pool = d
                .create_command_pool(
                    &vk::CommandPoolCreateInfo::default().queue_family_index(self.family),
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
            d.begin_command_buffer(cmd, &vk::CommandBufferBeginInfo::default())
                .unwrap();
            record(cmd);
            d.cmd_pipeline_barrier(
                cmd,
                vk::PipelineStageFlags::ALL_COMMANDS,
                vk::PipelineStageFlags::HOST,
                vk::DependencyFlags::empty(),
                &[vk::MemoryBarrier::default()
                    .src_access_mask(vk::AccessFlags::MEMORY_WRITE)
                    .dst_access_mask(vk::AccessFlags::HOST_READ)],
                &[],
                &[],
            );
            d.end_command_buffer(cmd).unwrap();
            let fence = d
                .create_fence(&vk::FenceCreateInfo::default(), None)
                .unwrap();
            let cmds = [cmd];
            d.queue_submit(
                self.queue,
                &[vk::SubmitInfo::default().command_buffers(&cmds)],
                fence,
            )
            .unwrap();
            d.wait_for_fences(&[fence], true, u64::MAX).unwrap();
            d.destroy_fence(fence, None);
            d.destroy_command_pool(pool, None);
        }
    }

    /// saxpy through kpc's pipeline handles, in this embedder's own descriptor set and command
    /// buffer: returns `a * x + y + BIAS` as the device computed it.
    fn saxpy(&self, h: &VulkanKernelHandles, a: f32, x: &[f32], y: &[f32]) -> Vec<f32> {
        let n = x.len();
        let bufs = [
            self.buffer(4 * n as u64),
            self.buffer(4 * n as u64),
            self.buffer(4 * n as u64),
        ];
        bufs[0].write(x);
        bufs[1].write(y);
        bufs[2].write(&vec![f32::NAN; n]);
        let d = &self.device;
        let mut sizes: Vec<vk::DescriptorPoolSize> = Vec::new();
        for (_, ty) in &h.bindings {
            match sizes.iter_mut().find(|s| s.ty == *ty) {
                Some(s) => s.descriptor_count += 1,
                None => sizes.push(vk::DescriptorPoolSize {
                    ty: *ty,
                    descriptor_count: 1,
                }),
            }
        }
        assert_eq!(h.bindings.len(), 3, "saxpy binds x, y and the output");
        let push = h.push_constant_range.expect("saxpy takes n and a");
        assert_eq!(push.size, 8);
        let mut push_bytes = (n as u32).to_le_bytes().to_vec();
        push_bytes.extend_from_slice(&a.to_le_bytes());
        // SAFETY: the pool and set are this embedder's, the set layout is kpc's live one (the
        // kernel is alive); every buffer is alive until after the submission finished.
        let (pool, set) = unsafe {
            let pool = d
                .create_descriptor_pool(
                    &vk::DescriptorPoolCreateInfo::default()
                        .max_sets(1)
                        .pool_sizes(&sizes),
                    None,
                )
                .unwrap();
            let set = d
                .allocate_descriptor_sets(
                    &vk::DescriptorSetAllocateInfo::default()
                        .descriptor_pool(pool)
                        .set_layouts(&h.descriptor_set_layouts),
                )
                .unwrap()[0];
            let infos: Vec<[vk::DescriptorBufferInfo; 1]> = bufs
                .iter()
                .map(|b| {
                    [vk::DescriptorBufferInfo {
                        buffer: b.buf,
                        offset: 0,
                        range: vk::WHOLE_SIZE,
                    }]
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
            d.update_descriptor_sets(&writes, &[]);
            (pool, set)
        };
        let groups = (n as u32).div_ceil(h.local_size[0]);
        self.run(|cmd| {
            // SAFETY: recording state; kpc's pipeline and layout are alive (the kernel is); the
            // push bytes match the pipeline layout's range.
            unsafe {
                d.cmd_bind_pipeline(cmd, vk::PipelineBindPoint::COMPUTE, h.pipeline);
                d.cmd_bind_descriptor_sets(
                    cmd,
                    vk::PipelineBindPoint::COMPUTE,
                    h.pipeline_layout,
                    0,
                    &[set],
                    &[],
                );
                d.cmd_push_constants(
                    cmd,
                    h.pipeline_layout,
                    push.stage_flags,
                    push.offset,
                    &push_bytes,
                );
                d.cmd_dispatch(cmd, groups, 1, 1);
            }
        });
        let out = bufs[2].read();
        // SAFETY: the submission finished; the pool frees its set.
        unsafe { d.destroy_descriptor_pool(pool, None) };
        for b in bufs {
            b.destroy(d);
        }
        out
    }
}

impl Drop for Embedder {
    fn drop(&mut self) {
        // SAFETY: the embedder destroys what it created, last: every kpc object over these handles
        // was dropped before (the tests drop them first), and nothing of its own is left.
        unsafe {
            self.device.device_wait_idle().unwrap();
            self.device.destroy_device(None);
            self.messenger.destroy();
            self.instance.destroy_instance(None);
        }
    }
}

struct HostBuffer {
    buf: vk::Buffer,
    mem: vk::DeviceMemory,
    ptr: *mut f32,
    len: usize,
}

impl HostBuffer {
    fn write(&self, v: &[f32]) {
        assert!(v.len() <= self.len);
        // SAFETY: the mapping holds `len` floats; no device work uses the buffer now.
        unsafe { std::ptr::copy_nonoverlapping(v.as_ptr(), self.ptr, v.len()) };
    }
    fn read(&self) -> Vec<f32> {
        let mut out = vec![0f32; self.len];
        // SAFETY: as in `write`; the device's writes were made visible to the host by the barrier
        // and the fence wait in `Embedder::run`.
        unsafe { std::ptr::copy_nonoverlapping(self.ptr, out.as_mut_ptr(), self.len) };
        out
    }
    fn destroy(self, d: &ash::Device) {
        // SAFETY: no submission uses the buffer any more.
        unsafe {
            d.destroy_buffer(self.buf, None);
            d.free_memory(self.mem, None);
        }
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

#[test]
fn an_embedder_records_kpcs_saxpy_pipeline_in_its_own_command_buffer() {
    let test = "an_embedder_records_kpcs_saxpy_pipeline_in_its_own_command_buffer";
    let Some(d) = vulkan_device(test) else {
        return;
    };
    let e = Embedder::new(d.index);
    let ctx = e.context(&test_config());
    assert_eq!(ctx.device().name, d.name);
    let spec = SpecConstants::new().with(1, SpecValue::I32(3));
    let k = ctx
        .kernel_with(
            &kpc::KernelRequest::new(&spirv_image("saxpy").unwrap(), "saxpy").spec(spec.clone()),
        )
        .unwrap();
    let h = k.vulkan_handles().unwrap();
    assert_eq!(h.local_size, k.info().local_size);
    assert_eq!(h.descriptor_set_layouts.len(), 1);
    let n = 64 * 21 + 5;
    let (x, y) = (random_f32(n), random_f32(n));
    check(&e.saxpy(h, 2.5, &x, &y), 2.5, &x, &y, 3.0);
    // A kernel of the interop context also launches through kpc's own queue, on the shared queue.
    let (bx, by) = (ctx.buffer_from(&x).unwrap(), ctx.buffer_from(&y).unwrap());
    let out = ctx.buffer_from(&vec![f32::NAN; n]).unwrap();
    ctx.queue()
        .launch(
            &k,
            k.groups_for([n as u64, 1, 1]).unwrap(),
            &[&bx, &by, &out],
            kpc::PushConstants::new().u32(n as u32).f32(-1.0).as_bytes(),
        )
        .unwrap()
        .wait()
        .unwrap();
    check(&out.read().unwrap(), -1.0, &x, &y, 3.0);
    // OpenCL leases are for OpenCL kernels only.
    assert!(matches!(
        k.opencl_lease(),
        Err(Error::WrongBackend {
            expected: kpc::BackendKind::OpenCl,
            found: Some(kpc::BackendKind::Vulkan),
            ..
        })
    ));

    // The context goes; the kernel it handed out keeps its handles valid.
    drop((bx, by, out));
    drop(ctx);
    check(&e.saxpy(h, 0.5, &x, &y), 0.5, &x, &y, 3.0);
    drop(k);

    // kpc destroyed neither the device nor the instance: the embedder's device still works.
    let b = e.buffer(4 * 256);
    b.write(&[0.0; 256]);
    let d = &e.device;
    e.run(|cmd| {
        // SAFETY: recording state; the buffer is alive and 1 KiB long.
        unsafe { d.cmd_fill_buffer(cmd, b.buf, 0, vk::WHOLE_SIZE, 1.25f32.to_bits()) };
    });
    assert!(b.read().iter().all(|&v| v == 1.25));
    b.destroy(d);
    // Drop destroys device and instance: a double destroy (had kpc destroyed them) would crash here.
}

#[test]
fn interop_and_owned_contexts_share_fingerprint_and_disk_cache() {
    let test = "interop_and_owned_contexts_share_fingerprint_and_disk_cache";
    let Some(d) = vulkan_device(test) else {
        return;
    };
    let dir = TempDir::new("interop-vk");
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
    // A device declared without robustBufferAccess is another device to the cache: pipelines built
    // without it never serve a robust one (whose safe launches rely on it), nor the reverse.
    // SAFETY: as in Embedder::context; declaring less than was enabled promises nothing untrue.
    let fragile = unsafe {
        Context::builder()
            .vulkan_handles(&e.handles(VulkanFeatures::default()))
            .config(config.clone())
            .build()
    }
    .unwrap();
    assert!(!fragile.device().limits.robust_buffer_access);
    assert!(interop.device().limits.robust_buffer_access);
    assert!(
        fragile
            .device()
            .fingerprint
            .describe()
            .contains("robust_buffer_access=0")
    );
    assert_ne!(
        fragile.device().fingerprint.digest,
        owned.device().fingerprint.digest
    );
    drop(fragile);
    let image = spirv_image("saxpy").unwrap();
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
    let kind = |ctx: &Context| {
        let f = &ctx.device().fingerprint.fields;
        f.iter()
            .find(|(k, _)| k == "kpc_vulkan_binary")
            .map(|(_, v)| v.clone())
    };
    // The embedder enabled nothing optional (nor VK_KHR_pipeline_binary): it persists cache data.
    assert_eq!(kind(&interop).as_deref(), Some("pipeline-cache"));
    if kind(&owned).as_deref() == Some("pipeline-binary") {
        // A device whose owned contexts persist pipeline binaries (the H100): the fingerprints
        // agree on everything but the binary kind and the driver's key, and no entry of one kind
        // reaches the other context.
        let other = |ctx: &Context| {
            let mut f = ctx.device().fingerprint.fields.clone();
            f.retain(|(k, _)| k != "kpc_vulkan_binary" && k != "pipeline_binary_key");
            f
        };
        assert_eq!(other(&owned), other(&interop));
        assert_eq!(get(&owned, 1).source(), Source::Built);
        assert_eq!(get(&interop, 1).source(), Source::Built);
        assert_eq!(interop.stats().backend_counters.programs_loaded, 0);
        assert_eq!(interop.stats().backend_counters.binaries_rejected, 0);
        return;
    }
    assert_eq!(owned.device().fingerprint, interop.device().fingerprint);
    assert_eq!(
        owned.device().fingerprint.describe(),
        interop.device().fingerprint.describe()
    );
    // Built by the owned context, a disk hit for the interop one, and the other way round.
    assert_eq!(get(&owned, 1).source(), Source::Built);
    assert_eq!(get(&interop, 1).source(), Source::Disk);
    assert_eq!(get(&interop, 2).source(), Source::Built);
    assert_eq!(get(&owned, 2).source(), Source::Disk);
    assert_eq!(owned.stats().backend_counters.programs_built, 1);
    assert_eq!(interop.stats().backend_counters.programs_built, 1);
    assert_eq!(interop.stats().backend_counters.programs_loaded, 1);
    // And the binary the owned context built computes on the embedder's device.
    let k = get(&interop, 1);
    assert_eq!(k.source(), Source::Memory);
    let n = 300;
    let (x, y) = (random_f32(n), random_f32(n));
    check(
        &e.saxpy(k.vulkan_handles().unwrap(), 1.5, &x, &y),
        1.5,
        &x,
        &y,
        1.0,
    );
}

#[test]
fn a_borrowed_device_gets_only_the_features_declared_and_supported() {
    let test = "a_borrowed_device_gets_only_the_features_declared_and_supported";
    let Some(d) = vulkan_device(test) else {
        return;
    };
    let e = Embedder::new(d.index);
    let ctx = e.context(&test_config());
    // Nothing optional declared: the fp16 limits say so, and a kernel whose SPIR-V needs Float16,
    // cooperative matrices and the Vulkan memory model is refused before the driver sees it.
    assert!(!ctx.device().limits.float16_arithmetic);
    assert!(!ctx.device().limits.cooperative_matrix_f16);
    // A kernel that needs all three: kpc-attention's cooperative-matrix prefill, as committed.
    let coop = DeviceImage::spirv(
        "attn_prefill_coop",
        include_bytes!("../kpc-attention/kernels/attn_prefill_coop.spv").as_slice(),
    )
    .unwrap();
    let entry = coop.spirv_reflection().unwrap().entry_points[0]
        .name
        .clone();
    let spec = SpecConstants::new();
    match ctx.kernel_with(&kpc::KernelRequest::new(&coop, &entry).spec(spec.clone())) {
        Err(Error::Unsupported { needs, reason, .. }) => {
            assert!(needs.contains("Float16"), "{needs}");
            assert!(
                reason.contains("VulkanFeatures::SHADER_FLOAT16"),
                "{reason}"
            )
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    assert_eq!(ctx.stats().backend_counters.programs_built, 0);

    // A declaration the device cannot support is refused: it cannot have been enabled.
    // SAFETY: `pd` belongs to the live instance.
    let exts = unsafe { e.instance.enumerate_device_extension_properties(e.pd) }.unwrap();
    let has_coop = exts.iter().any(|x| {
        x.extension_name_as_c_str()
            .is_ok_and(|n| n == vk::KHR_COOPERATIVE_MATRIX_NAME)
    });
    if !has_coop {
        let claims = VulkanFeatures::COOPERATIVE_MATRIX;
        // SAFETY: live handles; the (false) declaration is what is being refused, before use.
        match unsafe {
            Context::builder()
                .vulkan_handles(&e.handles(claims))
                .config(test_config())
                .build()
        } {
            Err(Error::InvalidArgument(m)) => {
                assert!(m.contains("VulkanFeatures::COOPERATIVE_MATRIX"), "{m}")
            }
            other => panic!("expected a refusal, got {other:?}"),
        }
    }
    // Null handles and a Vulkan 1.0 instance are refused before any call.
    let mut bad = e.handles(VulkanFeatures::default());
    bad.device = vk::Device::null();
    // SAFETY: refused before any handle is used.
    let r = unsafe {
        Context::builder()
            .vulkan_handles(&bad)
            .config(test_config())
            .build()
    };
    assert!(matches!(r, Err(Error::InvalidArgument(_))), "{r:?}");
    let mut old = e.handles(VulkanFeatures::default());
    old.instance_api_version = vk::API_VERSION_1_0;
    // SAFETY: as above.
    let r = unsafe {
        Context::builder()
            .vulkan_handles(&old)
            .config(test_config())
            .build()
    };
    assert!(matches!(r, Err(Error::InvalidArgument(m)) if m.contains("1.1")));
    let mut family = e.handles(VulkanFeatures::default());
    family.queue_family_index = 1000;
    // SAFETY: as above: the family is checked against the device's before the device is used.
    let r = unsafe {
        Context::builder()
            .vulkan_handles(&family)
            .config(test_config())
            .build()
    };
    assert!(matches!(r, Err(Error::InvalidArgument(m)) if m.contains("queue family 1000")));
}

#[test]
fn handles_and_blobs_outlive_in_memory_eviction() {
    let test = "handles_and_blobs_outlive_in_memory_eviction";
    let Some(d) = vulkan_device(test) else {
        return;
    };
    let e = Embedder::new(d.index);
    // A one-byte threshold: every new program evicts the ones before it.
    let config = Config::builder()
        .persistent(false)
        .in_mem_eviction_threshold(1)
        .build()
        .unwrap();
    let ctx = e.context(&config);
    let image = spirv_image("saxpy").unwrap();
    let opts = BuildOptions::default();
    let get = |bias: i32| {
        let spec = SpecConstants::new().with(1, SpecValue::I32(bias));
        ctx.kernel_with(
            &kpc::KernelRequest::new(&image, "saxpy")
                .spec(spec.clone())
                .options(opts.clone()),
        )
        .unwrap()
    };
    let first = get(11);
    let h = first.vulkan_handles().unwrap();
    let _second = get(12);
    assert!(ctx.stats().memory.evictions >= 1);
    // The evicted kernel's pipeline is still alive and computes, and its blob is still there.
    let n = 200;
    let (x, y) = (random_f32(n), random_f32(n));
    check(&e.saxpy(h, 1.0, &x, &y), 1.0, &x, &y, 11.0);
    let blob = first.cache_blob().unwrap();
    // It was evicted indeed: asking the context again builds it anew.
    assert_eq!(get(11).source(), Source::Built);
    let other = e.context(&test_config());
    let spec = SpecConstants::new().with(1, SpecValue::I32(11));
    let again = other
        .kernel_from_blob(&req(&image, "saxpy", &spec, &opts), &blob)
        .unwrap();
    assert_eq!(again.source(), Source::Blob);
    assert_eq!(other.stats().backend_counters.programs_built, 0);
    check(
        &e.saxpy(again.vulkan_handles().unwrap(), 2.0, &x, &y),
        2.0,
        &x,
        &y,
        11.0,
    );
}
