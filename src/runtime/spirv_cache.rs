//! The SPIR-V cache: GLSL images compiled to SPIR-V once, in front of the program cache (ncnn's
//! SPIR-V cache).
//!
//! A GLSL image's SPIR-V is looked up in memory (one map per context, single flight per key, compile
//! errors cached like any deterministic build failure), then in the context's stores (the same
//! [`StoreChain`] the programs use: local disk, read-only layers, remote, an embedder's), then compiled
//! and stored. The store key is a [`StoreKey`] whose device part describes the compile, not a GPU:
//! `backend=glsl`, the compiler's identity and the target environment and SPIR-V version; its image
//! part is the digest of the source and its includes; its spec part the defines; its
//! options part the stage, entry point and optimization level. So editing one shader, one include
//! or one define misses only the entries compiled from it.
//!
//! Freshly compiled SPIR-V is validated by spirv-tools before it is used or stored; SPIR-V from a store
//! (checksummed, under its full key) was stored only after that validation, so it is parsed, not
//! validated again, exactly as a persisted program's image is. The SPIR-V image then takes the same
//! path as a precompiled one (program cache, pipeline cache, stores), and a cold pipeline build
//! validates it before the driver sees it.

use std::cell::Cell;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use dashmap::DashMap;

use super::seal::Seal;
use super::source::Source;
use crate::backend::glsl::GlslSource;
use crate::backend::glsl::compile::{self, Preprocessed};
use crate::backend::{DeviceImage, ImageFormat};
use crate::cache::store::Turn;
use crate::cache::{BuildResult, Digest, StoreChain, StoreKey};
use crate::config::{Config, TraceFlags};
use crate::error::{Error, Result};

/// How the SPIR-V of one request for a GLSL image was obtained.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct SpirvStep {
    /// [`Source::Built`] when it was compiled now; else the layer that had it (memory, disk, ...).
    pub source: Source,
    /// Wall time of the step (preprocessing, lookup, compile and validation).
    pub elapsed: Duration,
}

impl fmt::Display for SpirvStep {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = match self.source {
            Source::Built => "compiled".to_owned(),
            s => s.to_string(),
        };
        write!(f, "{what} {:.3} ms", self.elapsed.as_secs_f64() * 1e3)
    }
}

/// What a context's SPIR-V cache did (this process only): a snapshot, consistent per counter.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct SpirvStats {
    /// GLSL compiles run (successful or not).
    pub compiles: u64,
    /// Compiles that failed with a compile error.
    pub compile_errors: u64,
    /// Requests served from memory (this context's map, or the image's own memo).
    pub memory_hits: u64,
    /// Requests served by a store (disk, read-only layer, remote, an embedder's).
    pub store_hits: u64,
    /// Stored SPIR-V that failed validation and was removed (then compiled again).
    pub rejected: u64,
}

#[derive(Debug, Default)]
struct Counters {
    compiles: AtomicU64,
    compile_errors: AtomicU64,
    memory_hits: AtomicU64,
    store_hits: AtomicU64,
    rejected: AtomicU64,
}

fn bump(a: &AtomicU64) {
    a.fetch_add(1, Ordering::Relaxed);
}

/// One context's SPIR-V cache.
///
/// Guarantees: a GLSL image with the same key is compiled at most once per context while cached (a
/// compile error is kept and returned again); nothing that spirv-tools did not accept is returned;
/// no store failure fails a request.
#[derive(Default)]
pub struct SpirvCache {
    map: DashMap<Digest, Arc<BuildResult<DeviceImage, Error>>>,
    counters: Counters,
}

impl fmt::Debug for SpirvCache {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SpirvCache")
            .field("entries", &self.map.len())
            .field("stats", &self.stats())
            .finish()
    }
}

/// The store key of `src` whose includes resolved to `pre`.
pub fn spirv_key(src: &GlslSource, pre: &Preprocessed) -> StoreKey {
    let (major, minor) = src.spirv_target().spirv_version();
    let device = format!(
        "backend=glsl\ncompiler={}\ntarget_env={}\nspirv={major}.{minor}",
        compile::compiler_identity(),
        src.spirv_target().name()
    );
    StoreKey::new(
        &device,
        Digest::of(device.as_bytes()),
        pre.digest,
        pre.len,
        &src.defines_bytes(),
        &src.options_string(),
    )
    .with_label(src.name())
}

impl SpirvCache {
    /// The counters so far.
    pub fn stats(&self) -> SpirvStats {
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let c = &self.counters;
        SpirvStats {
            compiles: l(&c.compiles),
            compile_errors: l(&c.compile_errors),
            memory_hits: l(&c.memory_hits),
            store_hits: l(&c.store_hits),
            rejected: l(&c.rejected),
        }
    }

    /// The validated SPIR-V image of the GLSL image `image`, and how it was obtained.
    ///
    /// Errors: [`Error::GlslCompile`] with the compiler's message (cached: the same key fails again
    /// without compiling); [`Error::InvalidSpirv`] if the compiler's output does not validate;
    /// [`Error::InvalidArgument`] for an image that is not GLSL.
    pub(crate) fn resolve(
        &self,
        image: &DeviceImage,
        stores: &StoreChain,
        config: &Config,
        seal: &Seal,
    ) -> Result<(DeviceImage, SpirvStep)> {
        let start = Instant::now();
        let step = |source| SpirvStep {
            source,
            elapsed: start.elapsed(),
        };
        if let Some(spirv) = image.glsl_spirv() {
            bump(&self.counters.memory_hits);
            return Ok((spirv.clone(), step(Source::Memory)));
        }
        let (Some(src), Some(pre)) = (image.glsl_source(), image.glsl_preprocessed()) else {
            return Err(Error::InvalidArgument(format!(
                "image {:?} holds {}, not GLSL source: GLSL images are made by DeviceImage::glsl",
                image.name(),
                image.format()
            )));
        };
        debug_assert_eq!(image.format(), ImageFormat::Glsl);
        let pre = pre.clone()?;
        let key = spirv_key(src, &pre);
        let source = Cell::new(Source::Memory);
        let build = || {
            let (spirv, s) = self.load_or_compile(src, &pre, &key, stores, config, seal)?;
            source.set(s);
            Ok(spirv)
        };
        let spirv = if config.in_mem {
            let entry = self.map.entry(key.digest()).or_default().clone();
            let (r, _) = entry.get_or_build(build, |_, _| {});
            r.map(|a| (*a).clone())?
        } else {
            build()?
        };
        if source.get() == Source::Memory {
            bump(&self.counters.memory_hits);
        }
        Ok((image.set_glsl_spirv(spirv), step(source.get())))
    }

    /// A memory miss: a store's verified and validated SPIR-V, else a compile (stored afterwards).
    fn load_or_compile(
        &self,
        src: &GlslSource,
        pre: &Preprocessed,
        key: &StoreKey,
        stores: &StoreChain,
        config: &Config,
        seal: &Seal,
    ) -> Result<(DeviceImage, Source)> {
        let mut lock = None;
        if !stores.is_empty() && !config.cache_debug {
            let mut skip = Vec::new();
            // Bounded like the program path: each refusal removes the entry (or skips its level).
            for _ in 0..3 {
                let hit = match stores.get(key, &skip) {
                    Some(hit) => hit,
                    None => match stores.lock_for_build(key, &skip) {
                        Turn::Published(hit) => hit,
                        Turn::Build(l) => {
                            lock = l;
                            break;
                        }
                    },
                };
                // Verified bytes under the full key: they were stored only after an identical compile
                // passed spirv-tools. So they are parsed, not validated again, as a persisted
                // program's image is; a cold pipeline build still validates before the driver.
                let image = DeviceImage::new(src.name(), ImageFormat::SpirV, hit.bytes().to_vec());
                match image.spirv_reflection().map(|_| ()) {
                    Ok(()) => {
                        stores.backfill(key, &hit, false);
                        bump(&self.counters.store_hits);
                        let source = Source::of_store(hit.kind());
                        trace(config, src, &format!("spirv loaded from {source}"), None);
                        return Ok((image, source));
                    }
                    Err(e) => {
                        bump(&self.counters.rejected);
                        if !stores.reject(key, &hit, &e) {
                            skip.push(hit.level());
                        }
                    }
                }
            }
        }
        // A compile is a build: a sealed context reports or refuses it like a program's.
        let what = format!("{} (GLSL compile)", src.name());
        let sealed = seal.before_build(&what, || super::seal::explain(stores, key))?;
        let start = Instant::now();
        bump(&self.counters.compiles);
        let compiled = compile::compile(src, pre).inspect_err(|_| {
            bump(&self.counters.compile_errors);
        });
        let took = start.elapsed();
        if let Some(why) = sealed {
            seal.built(&what, &why, took, compiled.is_ok());
        }
        let bytes = compiled?;
        trace(config, src, "glsl compiled", Some(took));
        let image = compiled_image(src.name(), bytes).inspect_err(|_| {
            bump(&self.counters.compile_errors);
        })?;
        if !config.cache_debug {
            stores.put(key, image.bytes(), took, lock);
        }
        Ok((image, Source::Built))
    }
}

/// The SPIR-V image of `bytes`, which kpc's own GLSL compile of `name` produced. SPIR-V that
/// spirv-tools then refuses is a compile failure of that GLSL, as deterministic as any other, so it
/// is a [`Error::GlslCompile`] (cached like one) that says where the SPIR-V came from, not an
/// [`Error::InvalidSpirv`] (which is never cached: the GLSL would be compiled again on every request).
fn compiled_image(name: &str, bytes: Vec<u8>) -> Result<DeviceImage> {
    DeviceImage::spirv(name, bytes).map_err(|e| match e {
        Error::InvalidSpirv { message, .. } => Error::GlslCompile {
            image: name.to_string(),
            message: format!(
                "the SPIR-V that kpc's GLSL compile (libshaderc) produced fails validation: {message}"
            ),
        },
        other => other,
    })
}

fn trace(config: &Config, src: &GlslSource, what: &str, took: Option<Duration>) {
    if config.trace.contains(TraceFlags::BUILDS) {
        tracing::info!(target: "kpc::build", image = src.name(), ms = took.map(|t| t.as_secs_f64() * 1e3), "{what}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::BuildFailure;

    #[test]
    fn invalid_output_of_kpcs_own_compile_is_a_cacheable_compile_error() {
        // The shipped saxpy with its first instruction after the header cut short: spirv-tools
        // refuses it, as it would refuse a miscompile.
        let mut bytes = include_bytes!("../../kernels/saxpy.spv").to_vec();
        bytes.truncate(bytes.len() - 6);
        let e = compiled_image("mine", bytes).unwrap_err();
        let Error::GlslCompile { image, message } = &e else {
            panic!("expected GlslCompile, got {e:?}");
        };
        assert_eq!(image, "mine");
        assert!(message.contains("kpc's GLSL compile"), "{message}");
        assert!(e.is_cacheable() && !e.is_transient(), "{e:?}");
        let ok = include_bytes!("../../kernels/saxpy.spv").to_vec();
        assert!(compiled_image("saxpy", ok).is_ok());
    }
}
