//! Prebuild: after a driver update every key of the new fingerprint misses; instead of every machine
//! recompiling on first use, `kpc cache prebuild` (and [`crate::Context::prebuild`]) builds, in
//! parallel, every kernel an application's warm-start manifests name, for the current device. A
//! manifest carries the device images, so one recorded under the old fingerprint serves too.
//!
//! Each kernel goes through the ordinary acquisition path (memory, the stores, then a build that is
//! put into every writable store), so the store chain's single flight applies: the local disk's lock
//! per machine and, with a redis remote, the fleet lock per key: N machines that prebuild at once
//! build each kernel once in the fleet and load it from the remote elsewhere.

use std::collections::HashSet;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::backend::ImageFormat;
use crate::config::BackendKind;
use crate::error::{Error, Result};

use super::prefetch::{KernelRequest, Prefetch, default_workers};
use super::source::Source;
use super::warm_start::manifest;

/// What a prebuild did: every distinct kernel asked for is counted once, as built, present or
/// failed (a failure does not stop the others).
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct PrebuildReport {
    /// Kernels asked for (distinct).
    pub kernels: usize,
    /// Kernels this process built (and stored).
    pub built: usize,
    /// Kernels a store already held (this machine's disk, a read-only layer, the remote: another
    /// machine built them), now loaded and on the local disk.
    pub present: usize,
    /// Kernels that failed: `image:entry` and the error.
    pub failed: Vec<(String, Error)>,
    /// Wall time of the whole prebuild.
    pub elapsed: Duration,
}

/// Every kernel the warm-start manifests of application `app` under cache root `root` name, for any
/// device fingerprint of `backend` (the images decide: SPIR-V and GLSL for Vulkan, OpenCL C for
/// OpenCL), with the manifests read. A manifest that cannot be read is skipped.
pub fn app_manifests(
    root: &Path,
    app: &str,
    backend: BackendKind,
) -> (Vec<PathBuf>, Vec<KernelRequest>) {
    let fits = |r: &KernelRequest| fits(backend, r);
    let name = format!("{app}.manifest");
    let mut paths: Vec<PathBuf> = fs::read_dir(root.join("warm").join("v1"))
        .into_iter()
        .flatten()
        .filter_map(|d| Some(d.ok()?.path().join(&name)))
        .filter(|p| p.is_file())
        .collect();
    paths.sort();
    let (mut used, mut requests) = (Vec::new(), Vec::new());
    for p in paths {
        let Ok(rs) = fs::read(&p).map(|b| manifest::decode(&b)) else {
            continue;
        };
        let rs: Vec<KernelRequest> = rs.unwrap_or_default().into_iter().filter(fits).collect();
        if !rs.is_empty() {
            used.push(p);
            requests.extend(rs);
        }
    }
    (used, distinct(requests))
}

/// Whether `r` builds on `backend`: SPIR-V and GLSL images on Vulkan, OpenCL C on OpenCL.
fn fits(backend: BackendKind, r: &KernelRequest) -> bool {
    match backend {
        BackendKind::Vulkan => r.image.format() != ImageFormat::OpenClC,
        BackendKind::OpenCl => r.image.format() == ImageFormat::OpenClC,
    }
}

/// The distinct requests of `requests` (the same image, entry, spec constants and options once),
/// in order.
pub fn distinct(requests: impl IntoIterator<Item = KernelRequest>) -> Vec<KernelRequest> {
    let mut seen = HashSet::new();
    requests
        .into_iter()
        .filter(|r| {
            seen.insert((
                r.image.digest(),
                r.entry.clone(),
                r.spec.canonical_bytes(),
                r.options.as_str().to_owned(),
            ))
        })
        .collect()
}

/// Runs `acquire` (an acquisition through the stores, returning where the kernel came from) on every
/// distinct request, on a pool of one worker per core, and counts what each came to.
pub fn prebuild(
    requests: impl IntoIterator<Item = KernelRequest>,
    acquire: impl Fn(&KernelRequest) -> Result<Source> + Send + Sync + 'static,
) -> PrebuildReport {
    prebuild_with_progress(requests, acquire, |_: &Progress<'_>| {})
}

/// One finished kernel of a prebuild, as [`prebuild_with_progress`] reports it.
#[derive(Debug)]
#[non_exhaustive]
pub struct Progress<'a> {
    /// Kernels finished so far, this one included.
    pub done: usize,
    /// Kernels in the prebuild.
    pub total: usize,
    /// This kernel, `image:entry`.
    pub kernel: &'a str,
    /// Where it came from, or why it failed.
    pub result: &'a Result<Source>,
}

/// [`prebuild`], calling `progress` (from the worker that finished it) after each kernel.
pub fn prebuild_with_progress(
    requests: impl IntoIterator<Item = KernelRequest>,
    acquire: impl Fn(&KernelRequest) -> Result<Source> + Send + Sync + 'static,
    progress: impl Fn(&Progress<'_>) + Send + Sync + 'static,
) -> PrebuildReport {
    let start = Instant::now();
    let requests = distinct(requests);
    let (total, finished) = (requests.len(), AtomicUsize::new(0));
    let acquire = move |r: &KernelRequest| {
        let result = acquire(r);
        progress(&Progress {
            done: finished.fetch_add(1, Ordering::Relaxed) + 1,
            total,
            kernel: &format!("{}:{}", r.image.name(), r.entry),
            result: &result,
        });
        result
    };
    let names: Vec<String> = requests
        .iter()
        .map(|r| format!("{}:{}", r.image.name(), r.entry))
        .collect();
    let workers = default_workers(requests.len());
    let results = Prefetch::spawn(requests, workers, acquire).wait();
    let mut report = PrebuildReport {
        kernels: names.len(),
        ..PrebuildReport::default()
    };
    for (name, r) in names.into_iter().zip(results) {
        match r {
            Ok(Source::Built) => report.built += 1,
            Ok(_) => report.present += 1,
            Err(e) => report.failed.push((name, e)),
        }
    }
    report.elapsed = start.elapsed();
    report
}

impl super::Context {
    /// The kernels of application `app`'s manifest that the fleet shares through this context's
    /// stores (the remote: every process with warm start on merges its manifest into it), for
    /// [`super::Context::prebuild`] on a machine that never ran the application; those of another
    /// backend included (their images decide, as for [`app_manifests`]). Empty when no store shares
    /// one or it does not verify.
    pub fn shared_manifest(&self, app: &str) -> Vec<KernelRequest> {
        let backend = self.device().backend;
        super::warm_start::shared_requests(self.inner.programs.stores().stores(), app)
            .into_iter()
            .filter(|r| fits(backend, r))
            .collect()
    }

    /// Builds every kernel of `requests` (typically an application's warm-start manifests, also
    /// those recorded under another fingerprint of this backend: they carry the images) that no
    /// store holds for this device, in parallel, and stores each in every writable store; with a
    /// redis remote each key is built under the fleet lock, so machines prebuilding at once build
    /// it once in the fleet. Run it on an unsealed context (`kpc cache prebuild` opens its own): on
    /// a sealed one a kernel that would build fails with [`Error::Sealed`]. Returns what it did.
    pub fn prebuild(&self, requests: impl IntoIterator<Item = KernelRequest>) -> PrebuildReport {
        self.prebuild_with_progress(requests, |_: &Progress<'_>| {})
    }

    /// [`super::Context::prebuild`], calling `progress` after each kernel (for a progress line).
    pub fn prebuild_with_progress(
        &self,
        requests: impl IntoIterator<Item = KernelRequest>,
        progress: impl Fn(&Progress<'_>) + Send + Sync + 'static,
    ) -> PrebuildReport {
        let ctx = self.internal();
        let acquire = move |r: &KernelRequest| ctx.kernel_with(r).map(|k| k.source());
        prebuild_with_progress(requests, acquire, progress)
    }
}
