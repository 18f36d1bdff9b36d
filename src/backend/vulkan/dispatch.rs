//! Recording and submitting a batch of launches: limits checked, one descriptor pool per batch,
//! descriptor sets written, pipelines bound, in-order barriers between launches, and timestamps
//! where the queue supports them.

use std::any::Any;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use ash::vk;

use crate::backend::BackendLaunch;
use crate::error::{Error, Result};

use super::VulkanBackend;
use super::device::{BufferPlace, vk_err};
use super::submit::{Record, in_order_barrier};
use super::submit_profile::{self, Phase};

impl VulkanBackend {
    pub(super) fn dispatch(&self, launches: &[BackendLaunch<'_, Self>]) -> Result<Arc<Record>> {
        let limits = &self.dev.limits;
        for l in launches {
            if (0..3).any(|k| l.groups[k] > limits.max_compute_work_group_count[k]) {
                return Err(Error::Launch {
                    kernel: l.kernel.pipeline.info.name.clone(),
                    message: format!(
                        "{:?} workgroups exceed the device's maximum of {:?} per dimension",
                        l.groups, limits.max_compute_work_group_count
                    ),
                });
            }
        }
        let whole = submit_profile::start();
        let t = submit_profile::start();
        let mut rec = Record::new(&self.dev, launches.len() as u32)?;
        submit_profile::end(Phase::Record, t);
        let t = submit_profile::start();
        // One descriptor pool per batch: a reset spare where it fits, else sized exactly.
        let mut storage = 0;
        let mut uniform = 0;
        // What each set's layout holds, which for the shared layout is more than the kernel binds.
        for l in launches.iter().filter(|l| !l.buffers.is_empty()) {
            storage += l.kernel.pipeline.set_storage;
            uniform += l.kernel.pipeline.set_uniform;
        }
        let d = &self.dev.raw;
        let mut sets = vec![vk::DescriptorSet::null(); launches.len()];
        if storage + uniform > 0 {
            rec.descriptor_pool(launches.len() as u32, storage, uniform)?;
            for (i, l) in launches.iter().enumerate() {
                if l.buffers.is_empty() {
                    continue;
                }
                let layouts = [l.kernel.pipeline.set_layout];
                let alloc = vk::DescriptorSetAllocateInfo::default()
                    .descriptor_pool(rec.descriptor_pool)
                    .set_layouts(&layouts);
                // SAFETY: the pool was sized for every set of this batch.
                sets[i] = unsafe { d.allocate_descriptor_sets(&alloc) }
                    .map_err(|e| vk_err("vkAllocateDescriptorSets", e))?[0];
                let infos: Vec<[vk::DescriptorBufferInfo; 1]> = l
                    .buffers
                    .iter()
                    .map(|b| {
                        [vk::DescriptorBufferInfo {
                            buffer: b.raw,
                            offset: b.offset,
                            // An embedder's buffer is bound only over the bytes it gave kpc.
                            range: if b.owned() { vk::WHOLE_SIZE } else { b.size },
                        }]
                    })
                    .collect();
                let writes: Vec<vk::WriteDescriptorSet> = l
                    .kernel
                    .pipeline
                    .info
                    .buffers
                    .iter()
                    .zip(&l.kernel.pipeline.descriptor_types)
                    .zip(&infos)
                    .map(|((param, ty), info)| {
                        vk::WriteDescriptorSet::default()
                            .dst_set(sets[i])
                            .dst_binding(param.binding)
                            .descriptor_type(*ty)
                            .buffer_info(info)
                    })
                    .collect();
                // SAFETY: the set is fresh and not in use; every buffer is alive and kept by the record.
                unsafe { d.update_descriptor_sets(&writes, &[]) };
            }
        }
        for l in launches {
            rec.keep_alive
                .push(l.kernel.pipeline.clone() as Arc<dyn Any + Send + Sync>);
            for b in &l.buffers {
                rec.keep_alive.push(b.clone() as Arc<dyn Any + Send + Sync>);
            }
        }
        submit_profile::end(Phase::Descriptors, t);
        let timed = rec.timed > 0;
        let query_pool = rec.query_pool;
        // Launches write buffers the host reads directly only where they are mapped.
        let host_reads = self.place == BufferPlace::HostVisible;
        let rec = self.submitter.submit(rec, host_reads, |d, cmd| {
            for (i, l) in launches.iter().enumerate() {
                let p = &l.kernel.pipeline;
                // SAFETY: recording state; the pipeline, layout and set are alive (kept by the
                // record); push-constant bytes match the layout's range (checked by the runtime);
                // the group counts are within the device's limits (checked above); each timestamp
                // query index is below 2 * launches.
                unsafe {
                    if i > 0 {
                        in_order_barrier(d, cmd);
                    }
                    d.cmd_bind_pipeline(cmd, vk::PipelineBindPoint::COMPUTE, p.raw);
                    if sets[i] != vk::DescriptorSet::null() {
                        d.cmd_bind_descriptor_sets(
                            cmd,
                            vk::PipelineBindPoint::COMPUTE,
                            p.layout,
                            0,
                            &[sets[i]],
                            &[],
                        );
                    }
                    if !l.push_constants.is_empty() {
                        d.cmd_push_constants(
                            cmd,
                            p.layout,
                            vk::ShaderStageFlags::COMPUTE,
                            0,
                            l.push_constants,
                        );
                    }
                    if timed {
                        d.cmd_write_timestamp(
                            cmd,
                            vk::PipelineStageFlags::TOP_OF_PIPE,
                            query_pool,
                            2 * i as u32,
                        );
                    }
                    d.cmd_dispatch(cmd, l.groups[0], l.groups[1], l.groups[2]);
                    if timed {
                        d.cmd_write_timestamp(
                            cmd,
                            vk::PipelineStageFlags::BOTTOM_OF_PIPE,
                            query_pool,
                            2 * i as u32 + 1,
                        );
                    }
                }
            }
            Ok(())
        })?;
        self.counters
            .launches
            .fetch_add(launches.len() as u64, Ordering::Relaxed);
        self.counters.batches.fetch_add(1, Ordering::Relaxed);
        submit_profile::end(Phase::Dispatch, whole);
        Ok(rec)
    }
}
