//! The memory miss: a verified binary from the first store that has one, else a build (sealed
//! mode's report or refusal first), published back into the writable stores; cache debug mode builds
//! every miss and compares it with what the stores hold.

use std::time::{Duration, Instant};

use super::ProgramManager;
use crate::backend::DeviceImage;
use crate::backend::dynamic::DynProgram;
use crate::cache::events::BuildCause;
use crate::cache::store::acquire::Acquire;
use crate::cache::{BuildOptions, SpecConstants, StoreKey};
use crate::config::TraceFlags;
use crate::error::Result;
use crate::runtime::seal::kernel_name;
use crate::runtime::source::Source;

impl ProgramManager {
    /// [`ProgramManager::build_fresh`], reported by the seal when `sealed` holds the reason it let
    /// the build through (`warn`).
    fn build_sealed(
        &self,
        image: &DeviceImage,
        spec: &SpecConstants,
        options: &BuildOptions,
        sealed: Option<String>,
        kernel: &str,
    ) -> Result<(DynProgram, Duration)> {
        let start = Instant::now();
        let r = self.build_fresh(image, spec, options);
        if let Some(why) = sealed {
            self.seal.built(kernel, &why, start.elapsed(), r.is_ok());
        }
        r
    }

    /// A memory miss: a persisted binary if a store has a usable one, else a build (stored afterwards).
    pub(super) fn build_program(
        &self,
        image: &DeviceImage,
        spec: &SpecConstants,
        options: &BuildOptions,
        entry: Option<&str>,
    ) -> Result<(DynProgram, Source)> {
        let key = self.disk_key(image, spec, options);
        let kernel = kernel_name(image.name(), entry);
        let seal = || {
            self.seal.before_build(&kernel, || {
                crate::runtime::seal::explain(&self.stores, &key)
            })
        };
        if self.stores.is_empty() {
            let (p, took) = self.build_sealed(image, spec, options, seal()?, &kernel)?;
            self.stores.built(&key, took, None, BuildCause::NoStores);
            return Ok((p, Source::Built));
        }
        if self.config.cache_debug {
            return self.build_debug(image, spec, options, &key, seal, &kernel);
        }
        let loaded = self.stores.acquire(&key, |bytes| {
            // Out of resources is not a refusal of the binary: retried, then returned.
            let p = self.retry_out_of_resources("binary load", || {
                self.backend
                    .program_from_binary(image, spec, options, bytes)
            })?;
            let recompiled = self.backend.load_avoided_compile(&p) == Some(false);
            Ok((p, recompiled))
        })?;
        let ticket = match loaded {
            Acquire::Build(ticket) => ticket,
            Acquire::Loaded(l) => {
                let source = Source::of_store(l.kind);
                let ms = |d: Duration| d.as_secs_f64() * 1e3;
                let (lookup, record) = (ms(l.lookup), ms(l.guard));
                let what = format!(
                    "loaded from {source} (lookup {lookup:.3} ms, load record {record:.3} ms)"
                );
                self.trace_build(image, &what, true, Some(l.load));
                return Ok((l.program, source));
            }
        };
        // A refused or failed build drops the ticket here, releasing its locks for a waiting process.
        let (program, took) = self.build_sealed(image, spec, options, seal()?, &kernel)?;
        ticket.publish(took, self.backend.program_binary(&program));
        Ok((program, Source::Built))
    }

    /// Cache debug mode's miss: every program is built by design, and told with what the stores hold
    /// (`cache_debug.rs` compares them); only a genuine miss is a sealed build.
    fn build_debug(
        &self,
        image: &DeviceImage,
        spec: &SpecConstants,
        options: &BuildOptions,
        key: &StoreKey,
        seal: impl Fn() -> Result<Option<String>>,
        kernel: &str,
    ) -> Result<(DynProgram, Source)> {
        let cached = self.stores.peek(key);
        let sealed = if cached.is_none() { seal()? } else { None };
        let (program, took) = self.build_sealed(image, spec, options, sealed, kernel)?;
        let fresh = self.backend.program_binary(&program);
        let (fresh, cached) = (fresh.as_ref().ok(), cached.as_ref().map(|h| h.bytes()));
        let cause = BuildCause::Debug { cached };
        self.stores
            .built(key, took, fresh.and_then(Option::as_deref), cause);
        Ok((program, Source::Built))
    }

    fn build_fresh(
        &self,
        image: &DeviceImage,
        spec: &SpecConstants,
        options: &BuildOptions,
    ) -> Result<(DynProgram, Duration)> {
        let start = Instant::now();
        let r = self
            .retry_out_of_resources("build", || self.backend.build_program(image, spec, options));
        let took = start.elapsed();
        self.trace_build(image, "build program", r.is_ok(), Some(took));
        Ok((r?, took))
    }

    pub(super) fn trace_build(
        &self,
        image: &DeviceImage,
        what: &str,
        ok: bool,
        took: Option<Duration>,
    ) {
        if self.config.trace.contains(TraceFlags::BUILDS) {
            tracing::info!(
                target: "kpc::build",
                backend = %self.kind,
                image = image.name(),
                ok,
                ms = took.map(|t| t.as_secs_f64() * 1e3),
                "{what}"
            );
        }
    }
}
