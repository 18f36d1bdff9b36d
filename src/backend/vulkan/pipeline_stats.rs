//! The driver's statistics about a compiled kernel (VK_KHR_pipeline_executable_properties):
//! registers, shared memory and the like, reported in `KernelInfo::driver_stats`.

use ash::vk;

use super::device::Device;

/// The driver's statistics about `pipeline`'s compiled code, "name" or "executable: name" where it
/// has several executables; empty where the extension is off or a query fails (they only inform).
pub(crate) fn executable_stats(dev: &Device, pipeline: vk::Pipeline) -> Vec<(String, String)> {
    use super::instance::c_chars;
    let Some(ext) = dev.executable_stats.as_ref() else {
        return Vec::new();
    };
    let info = vk::PipelineInfoKHR::default().pipeline(pipeline);
    // SAFETY: `pipeline` is alive and was created with CAPTURE_STATISTICS on a device with the
    // extension enabled.
    let executables = unsafe { ext.get_pipeline_executable_properties(&info) }.unwrap_or_default();
    let several = executables.len() > 1;
    let mut out = Vec::new();
    for (i, e) in executables.iter().enumerate() {
        let exec = vk::PipelineExecutableInfoKHR::default()
            .pipeline(pipeline)
            .executable_index(i as u32);
        // SAFETY: as above; `i` indexes the executables the driver listed.
        let stats = unsafe { ext.get_pipeline_executable_statistics(&exec) }.unwrap_or_default();
        for s in stats {
            // SAFETY: `format` says which member of the union the driver wrote.
            let value = unsafe {
                match s.format {
                    vk::PipelineExecutableStatisticFormatKHR::BOOL32 => {
                        (s.value.b32 != 0).to_string()
                    }
                    vk::PipelineExecutableStatisticFormatKHR::INT64 => s.value.i64.to_string(),
                    vk::PipelineExecutableStatisticFormatKHR::UINT64 => s.value.u64.to_string(),
                    vk::PipelineExecutableStatisticFormatKHR::FLOAT64 => s.value.f64.to_string(),
                    _ => continue,
                }
            };
            let name = c_chars(&s.name);
            let name = if several {
                format!("{}: {name}", c_chars(&e.name))
            } else {
                name
            };
            out.push((name, value));
        }
    }
    out
}
