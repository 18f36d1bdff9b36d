//! Starting child processes from a process that has loaded an OpenCL driver.
//!
//! Found on the NVIDIA H200 host: the ocl-icd loader splits `OCL_ICD_FILENAMES` in place (strtok on
//! the string `getenv` returned), so after the first OpenCL call this process's own environment says
//! `libpocl.so.2` where the shell said `libpocl.so.2:libnvidia-opencl.so.1`, and every child it spawns
//! loses the NVIDIA platform. kpc snapshots the loader's variables before its first OpenCL call, and
//! children get the snapshot.

use std::ffi::OsString;
use std::process::Command;
use std::sync::OnceLock;

/// The ICD loader's variables that it may rewrite in place.
const LOADER_VARS: &[&str] = &["OCL_ICD_FILENAMES", "OCL_ICD_VENDORS", "OPENCL_VENDOR_PATH"];

static ORIGINAL: OnceLock<Vec<(&'static str, Option<OsString>)>> = OnceLock::new();

/// Records the loader's variables as they are now. OpenCL discovery calls this before loading any
/// driver; later calls keep the first snapshot.
pub fn snapshot_loader_environment() {
    ORIGINAL.get_or_init(|| {
        LOADER_VARS
            .iter()
            .map(|v| (*v, std::env::var_os(v)))
            .collect()
    });
}

/// Gives `cmd` the loader variables as they were before any driver rewrote them, so the child sees
/// the same OpenCL platforms this process saw.
pub fn with_original_loader_environment(cmd: &mut Command) -> &mut Command {
    snapshot_loader_environment();
    for (var, value) in ORIGINAL.get().into_iter().flatten() {
        match value {
            Some(v) => cmd.env(var, v),
            None => cmd.env_remove(var),
        };
    }
    cmd
}
