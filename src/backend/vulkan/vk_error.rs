//! kpc's error for a failed Vulkan call.

use ash::vk;

use crate::config::BackendKind;
use crate::error::Error;

/// Maps a failed Vulkan call to kpc's error: running out of memory may pass, so it is transient;
/// everything else is a plain backend error.
pub(crate) fn vk_err(call: &'static str, r: vk::Result) -> Error {
    match r {
        vk::Result::ERROR_OUT_OF_HOST_MEMORY
        | vk::Result::ERROR_OUT_OF_DEVICE_MEMORY
        | vk::Result::ERROR_OUT_OF_POOL_MEMORY
        | vk::Result::ERROR_FRAGMENTED_POOL
        | vk::Result::ERROR_TOO_MANY_OBJECTS => Error::OutOfResources {
            backend: BackendKind::Vulkan,
            code: r.as_raw(),
            message: format!("{call}: {r}"),
        },
        _ => Error::Backend {
            backend: BackendKind::Vulkan,
            call,
            code: r.as_raw(),
        },
    }
}
