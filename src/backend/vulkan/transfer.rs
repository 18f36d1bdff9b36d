//! Host <-> device copies: mapped buffers directly, device-local ones through a staging buffer in
//! chunks, one reused staging buffer per backend.

use std::any::Any;
use std::sync::Arc;

use ash::vk;

use crate::error::Result;

use super::device::{BufferPlace, VulkanBuffer};
use super::submit::Record;
use super::{STAGING_CHUNK, STAGING_KEEP, VulkanBackend};

impl VulkanBackend {
    pub(super) fn write(&self, buffer: &VulkanBuffer, offset: u64, data: &[u8]) -> Result<()> {
        if data.is_empty() {
            return Ok(());
        }
        if buffer.mapped.is_some() {
            // In-order rule: earlier launches may still read or write this buffer.
            self.submitter.finish()?;
            buffer.copy_in(offset, data);
            return Ok(());
        }
        self.staging_copy(buffer, offset, data.len() as u64, true, |staging, at, n| {
            staging.copy_in(0, &data[at as usize..(at + n) as usize]);
        })
    }

    pub(super) fn read(&self, buffer: &VulkanBuffer, offset: u64, out: &mut [u8]) -> Result<()> {
        if out.is_empty() {
            return Ok(());
        }
        if buffer.mapped.is_some() {
            self.submitter.finish()?;
            buffer.copy_out(offset, out);
            return Ok(());
        }
        self.staging_copy(buffer, offset, out.len() as u64, false, |staging, at, n| {
            staging.copy_out(0, &mut out[at as usize..(at + n) as usize]);
        })
    }

    fn staging_copy(
        &self,
        buffer: &VulkanBuffer,
        offset: u64,
        len: u64,
        upload: bool,
        mut chunk: impl FnMut(&VulkanBuffer, u64, u64),
    ) -> Result<()> {
        let chunk_len = len.min(STAGING_CHUNK);
        // Taken out of the slot, so that concurrent copies never share one; a copy that fails leaves
        // the slot empty and the next one allocates afresh.
        let cached = self.staging.lock().take();
        let staging = match cached {
            Some(b) if b.size >= chunk_len => b,
            _ => Arc::new(VulkanBuffer::new(
                &self.dev,
                chunk_len.max(STAGING_KEEP.min(STAGING_CHUNK)),
                BufferPlace::HostVisible,
            )?),
        };
        let mut done = 0;
        while done < len {
            let n = (len - done).min(chunk_len);
            if upload {
                chunk(&staging, done, n);
            }
            // The record keeps the staging buffer alive until the copy has finished, even if this
            // call returns early; `buffer` is borrowed for the whole call, which waits for the copy.
            let mut rec = Record::new(&self.dev, 0)?;
            rec.keep_alive
                .push(staging.clone() as Arc<dyn Any + Send + Sync>);
            let (src, dst, src_off, dst_off) = if upload {
                (staging.raw, buffer.raw, 0, buffer.offset + offset + done)
            } else {
                (buffer.raw, staging.raw, buffer.offset + offset + done, 0)
            };
            let rec = self.submitter.submit(rec, !upload, |d, cmd| {
                let region = vk::BufferCopy {
                    src_offset: src_off,
                    dst_offset: dst_off,
                    size: n,
                };
                // SAFETY: recording state; both buffers are alive (see above) and the region
                // lies inside each (the caller checked offset + len against the buffer's size).
                unsafe { d.cmd_copy_buffer(cmd, src, dst, &[region]) };
                Ok(())
            })?;
            rec.wait()?;
            if !upload {
                chunk(&staging, done, n);
            }
            done += n;
        }
        // Every copy through it has finished (waited above), so the next copy may reuse it even
        // while a finished record still holds a reference.
        *self.staging.lock() = Some(staging);
        Ok(())
    }
}
