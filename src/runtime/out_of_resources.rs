//! Recovery from a device or host that ran out of resources, as the SYCL runtime does it: release
//! the context's cached programs that no live kernel holds, and try once more.
//!
//! A build, a binary load or a kernel creation that fails with [`Error::OutOfResources`] (OpenCL
//! `CL_OUT_OF_RESOURCES` -5 / `CL_OUT_OF_HOST_MEMORY` -6 / `CL_MEM_OBJECT_ALLOCATION_FAILURE` -4,
//! Vulkan `ERROR_OUT_OF_*_MEMORY`) releases what the cache alone keeps alive
//! ([`KernelProgramCache::release_unused`](crate::cache::KernelProgramCache::release_unused)) and runs
//! again. A second failure goes to the caller; like every transient error it is never cached, so the
//! next request builds again. Both are counted ([`CacheStats`](crate::cache::CacheStats)
//! `out_of_resources_*`) and traced (`kpc::build`, with `KPC_CACHE_TRACE` bit 4).

use super::program_manager::ProgramManager;
use crate::config::TraceFlags;
use crate::error::{Error, Result};

impl ProgramManager {
    /// Runs `op` (`what` names it for the trace); when it runs out of resources, releases the unused
    /// programs and runs it once more.
    pub(crate) fn retry_out_of_resources<T>(
        &self,
        what: &str,
        mut op: impl FnMut() -> Result<T>,
    ) -> Result<T> {
        let first = match op() {
            Err(e @ Error::OutOfResources { .. }) => e,
            r => return r,
        };
        let released = self.memory_cache().release_unused();
        let trace = self.config().trace.contains(TraceFlags::BUILDS);
        if trace {
            tracing::info!(target: "kpc::build", backend = %self.backend().kind(), released,
                error = %first, "{what} ran out of resources: released unused programs, retrying once");
        }
        let r = op();
        let failed_again = matches!(r, Err(Error::OutOfResources { .. }));
        self.memory_cache()
            .count_out_of_resources_retry(failed_again);
        if trace {
            tracing::info!(target: "kpc::build", backend = %self.backend().kind(), ok = r.is_ok(),
                "{what} retried after out of resources");
        }
        r
    }
}
