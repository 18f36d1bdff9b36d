//! `kpc cache explain`: for each kernel `kpc attention` would use on the selected device (same
//! arguments), whether the disk cache (and each read-only layer) holds it, and if not, why: the
//! nearest cached entry and the key fields that differ (see `kpc::admin::disk`).
//! `--blob-id HEX` explains one key given as a cache blob id instead; `--glsl FILE` the keys of a
//! GLSL compute shader: the SPIR-V compiled from it (source, includes and defines) and the program
//! built from that SPIR-V on the selected Vulkan device.
//!
//! To learn the exact keys `kpc attention` looks up, the kernels are acquired on a context whose only
//! store records the keys it is asked for and holds nothing: every kernel is built in memory (what
//! `kpc attention` does on a cold cache), and nothing is written to any cache directory. The lookups
//! that follow are read-only ([`PersistentCache::get_read_only`]), so the command changes nothing.

use std::io;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kpc::BackendKind;
use kpc::DeviceImage;
use kpc::StoreKey;
use kpc::admin::disk::{DiskCacheSettings, MissExplanation, PersistentCache};
use kpc::admin::glsl::{DirIncludes, GlslOptimization, GlslSource, SpirvTarget};
use kpc::admin::runtime::{BLOB_ID_MAGIC, CACHE_BLOB_VERSION};
use kpc::{Access, PutOutcome, Removal, Store, StoreEntry, StoreHit, StoreStats};
use kpc::{BuildOptions, Digest, SpecConstants, SpecValue, StoreChain};
use kpc::{Config, Context, Error};
use serde_json::{Value, json};

use crate::attention;

/// Arguments of `kpc cache explain`.
#[derive(clap::Args, Debug)]
pub struct ExplainArgs {
    /// Explain the key of this cache blob id (hex, as `Context::cache_blob_id` makes it) instead of
    /// the kernels of `kpc attention`.
    #[arg(long, conflicts_with = "glsl")]
    blob_id: Option<String>,
    /// Explain the keys of this GLSL compute shader instead, as an application that makes it with
    /// `DeviceImage::glsl` looks them up (with the target, optimization, spec constants and build
    /// options given below; by default vulkan1.1, no optimization, none).
    #[arg(long, value_name = "FILE")]
    glsl: Option<PathBuf>,
    /// The GLSL image's name, as the application gives it (default: FILE's file name).
    #[arg(long, value_name = "NAME", requires = "glsl")]
    glsl_name: Option<String>,
    /// The SPIR-V entry point's name (default: FILE's stem).
    #[arg(long, value_name = "NAME", requires = "glsl")]
    entry: Option<String>,
    /// Where `#include`s are resolved (as `DirIncludes`).
    #[arg(long, value_name = "DIR", requires = "glsl")]
    include_dir: Option<PathBuf>,
    /// A macro definition, NAME or NAME=VALUE; repeat for more.
    #[arg(long, value_name = "NAME[=VALUE]", requires = "glsl")]
    define: Vec<String>,
    /// The Vulkan environment the application compiles for (`GlslSource::target`).
    #[arg(long, value_enum, default_value = "vulkan1.1", requires = "glsl")]
    target_env: TargetEnv,
    /// The optimization the application asks for (`GlslSource::optimization`).
    #[arg(long, value_enum, default_value = "none", requires = "glsl")]
    optimize: Optimize,
    /// A specialization constant the application passes, ID=TYPE:VALUE with TYPE one of bool,
    /// i32, u32, f32, i64, u64, f64 (e.g. 0=u32:128); repeat for more.
    #[arg(long = "spec", value_name = "ID=TYPE:VALUE", requires = "glsl", value_parser = parse_spec)]
    spec: Vec<(u32, SpecValue)>,
    /// The build options the application passes (`BuildOptions`).
    #[arg(long, value_name = "OPTIONS", default_value = "", requires = "glsl")]
    build_options: String,
    /// Machine-readable output.
    #[arg(long)]
    json: bool,
    /// The `kpc attention` arguments whose kernels are explained.
    #[command(flatten)]
    attention: attention::Args,
}

/// `--target-env`: [`SpirvTarget`] as glslangValidator spells it.
#[derive(clap::ValueEnum, Clone, Copy, Debug)]
enum TargetEnv {
    #[value(name = "vulkan1.0")]
    Vulkan1_0,
    #[value(name = "vulkan1.1")]
    Vulkan1_1,
    #[value(name = "vulkan1.2")]
    Vulkan1_2,
    #[value(name = "vulkan1.3")]
    Vulkan1_3,
}

impl TargetEnv {
    fn target(self) -> SpirvTarget {
        match self {
            TargetEnv::Vulkan1_0 => SpirvTarget::Vulkan1_0,
            TargetEnv::Vulkan1_1 => SpirvTarget::Vulkan1_1,
            TargetEnv::Vulkan1_2 => SpirvTarget::Vulkan1_2,
            TargetEnv::Vulkan1_3 => SpirvTarget::Vulkan1_3,
        }
    }
}

/// `--optimize`: [`GlslOptimization`].
#[derive(clap::ValueEnum, Clone, Copy, Debug)]
enum Optimize {
    None,
    Size,
    Performance,
}

/// Parses `--spec ID=TYPE:VALUE`.
fn parse_spec(s: &str) -> Result<(u32, SpecValue), String> {
    const ACCEPTED: &str =
        "ID=TYPE:VALUE with TYPE bool, i32, u32, f32, i64, u64 or f64, e.g. 0=u32:128";
    let bad = |why: &str| format!("{s:?}: {why}; expected {ACCEPTED}");
    let (id, typed) = s.split_once('=').ok_or_else(|| bad("no '='"))?;
    let id = id
        .trim()
        .parse::<u32>()
        .map_err(|_| bad("the id is not a whole number"))?;
    let (ty, v) = typed
        .split_once(':')
        .ok_or_else(|| bad("no ':' after the type"))?;
    let v = v.trim();
    let value = match ty.trim() {
        "bool" => v.parse().map(SpecValue::Bool).ok(),
        "i32" => v.parse().map(SpecValue::I32).ok(),
        "u32" => v.parse().map(SpecValue::U32).ok(),
        "f32" => v.parse().map(SpecValue::f32).ok(),
        "i64" => v.parse().map(SpecValue::I64).ok(),
        "u64" => v.parse().map(SpecValue::U64).ok(),
        "f64" => v
            .parse::<f64>()
            .map(|f| SpecValue::F64Bits(f.to_bits()))
            .ok(),
        _ => return Err(bad("unknown type")),
    };
    value
        .map(|value| (id, value))
        .ok_or_else(|| bad("the value does not parse as its type"))
}

/// A store that records every key it is asked for and holds nothing.
#[derive(Debug, Default)]
struct KeyRecorder(Mutex<Vec<StoreKey>>);

impl Store for KeyRecorder {
    fn name(&self) -> String {
        "key-recorder".into()
    }
    fn get(&self, key: &StoreKey, _: Access) -> Option<StoreHit> {
        let mut keys = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if !keys.iter().any(|k| k.digest() == key.digest()) {
            keys.push(key.clone());
        }
        None
    }
    fn put(&self, _: &StoreKey, _: &[u8], _: Duration) -> PutOutcome {
        PutOutcome::Skipped
    }
    fn remove(&self, _: &StoreKey, _: Removal<'_>) -> bool {
        false
    }
    fn list(&self) -> io::Result<Vec<StoreEntry>> {
        Ok(Vec::new())
    }
    fn stats(&self) -> StoreStats {
        StoreStats::default()
    }
}

/// What one store says about one key.
struct Verdict {
    store: String,
    cached: bool,
    why: Option<MissExplanation>,
    /// Who built the cached entry, where its record says.
    provenance: Option<kpc::admin::store::Provenance>,
}

fn parse_hex(s: &str) -> kpc::Result<Vec<u8>> {
    let s = s.trim();
    let bad = || {
        Error::InvalidArgument(format!(
            "--blob-id {s:?} is not a blob id: expected an even number of hex digits (0-9, a-f)"
        ))
    };
    if s.len() % 2 != 0 {
        return Err(bad());
    }
    (0..s.len())
        .step_by(2)
        .map(|i| {
            s.get(i..i + 2)
                .and_then(|b| u8::from_str_radix(b, 16).ok())
                .ok_or_else(bad)
        })
        .collect()
}

/// The parts of a blob id (layout in `src/runtime/blob.rs`).
struct BlobIdParts {
    device: Digest,
    image: Digest,
    image_len: u64,
    spec: Vec<u8>,
    options: String,
}

fn parse_blob_id(id: &[u8]) -> kpc::Result<BlobIdParts> {
    let bad = |why: &str| {
        Error::InvalidArgument(format!(
            "--blob-id is not a kpc cache blob id ({why}); expected the bytes Context::cache_blob_id returns, in hex"
        ))
    };
    let mut rest = id;
    let mut take = |n: usize| -> kpc::Result<&[u8]> {
        if rest.len() < n {
            return Err(bad("too short"));
        }
        let (a, b) = rest.split_at(n);
        rest = b;
        Ok(a)
    };
    if take(8)? != BLOB_ID_MAGIC {
        return Err(bad("wrong magic"));
    }
    let version = u32::from_le_bytes(take(4)?.try_into().expect("4 bytes"));
    if version != CACHE_BLOB_VERSION {
        return Err(bad(&format!(
            "blob format version {version}; this kpc reads {CACHE_BLOB_VERSION}"
        )));
    }
    take(4)?; // the kpc format version, which the device digest covers
    let device = Digest(take(32)?.try_into().expect("32 bytes"));
    let image = Digest(take(32)?.try_into().expect("32 bytes"));
    let image_len = u64::from_le_bytes(take(8)?.try_into().expect("8 bytes"));
    let mut part = || -> kpc::Result<Vec<u8>> {
        let n = u32::from_le_bytes(take(4)?.try_into().expect("4 bytes")) as usize;
        Ok(take(n)?.to_vec())
    };
    let spec = part()?;
    let options = String::from_utf8(part()?).map_err(|_| bad("options are not UTF-8"))?;
    if !rest.is_empty() {
        return Err(bad("trailing bytes"));
    }
    Ok(BlobIdParts {
        device,
        image,
        image_len,
        spec,
        options,
    })
}

fn verdicts(stores: &[(String, PersistentCache)], key: &StoreKey) -> Vec<Verdict> {
    stores
        .iter()
        .map(|(name, c)| {
            let cached = c.get_read_only(key).is_some();
            // Read only for a cached key: one listing of that store.
            let provenance = cached
                .then(|| c.entries().ok())
                .flatten()
                .and_then(|es| {
                    es.into_iter()
                        .filter_map(|e| e.record)
                        .find(|r| r.matches(key))
                })
                .and_then(|r| r.provenance);
            Verdict {
                store: name.clone(),
                cached,
                why: (!cached).then(|| c.explain_miss(key)),
                provenance,
            }
        })
        .collect()
}

fn verdict_json(v: &Verdict) -> Value {
    let mut o = json!({"store": v.store, "cached": v.cached});
    if let Some(p) = &v.provenance {
        o["provenance"] = json!({
            "host": p.host,
            "kpc": p.kpc_version,
            "driver": p.driver,
            "built_unix": p.built_unix,
            "build_ms": p.build_time.as_secs_f64() * 1e3,
            "signer": p.signer,
        });
    }
    if let Some(why) = &v.why {
        let diffs: Vec<Value> = why
            .diffs
            .iter()
            .map(|d| {
                let (field, old, new) = d.parts();
                json!({"field": field, "old": old, "new": new, "text": d.to_string()})
            })
            .collect();
        o["cause"] = json!(why.cause.name());
        o["explanation"] = json!(why.to_string());
        o["diffs"] = json!(diffs);
        o["nearest"] = json!(why.nearest);
        o["truncated"] = json!(why.truncated);
    }
    o
}

fn verdict_text(v: &Verdict) -> String {
    match &v.why {
        None => match &v.provenance {
            None => format!("cached ({})", v.store),
            Some(p) => format!(
                "cached ({}; built by {} with kpc {} at {}, {:.1} ms{})",
                v.store,
                p.host,
                p.kpc_version,
                crate::entry_fmt::utc(p.built_unix),
                p.build_time.as_secs_f64() * 1e3,
                p.signer
                    .as_ref()
                    .map_or(String::new(), |s| format!(", signed by {s}"))
            ),
        },
        Some(why) => format!("miss in {} [{}]: {why}", v.store, why.cause),
    }
}

/// The GLSL image `--glsl` and its options describe.
fn glsl_image(file: &Path, args: &ExplainArgs) -> kpc::Result<(DeviceImage, String)> {
    let text = std::fs::read_to_string(file)
        .map_err(|e| Error::InvalidArgument(format!("--glsl {}: {e}", file.display())))?;
    let lossy = |p: Option<&std::ffi::OsStr>| p.map(|s| s.to_string_lossy().into_owned());
    let name = args
        .glsl_name
        .clone()
        .or_else(|| lossy(file.file_name()))
        .unwrap_or_else(|| file.display().to_string());
    let entry = args
        .entry
        .clone()
        .or_else(|| lossy(file.file_stem()))
        .unwrap_or_else(|| name.clone());
    let optimization = match args.optimize {
        Optimize::None => GlslOptimization::None,
        Optimize::Size => GlslOptimization::Size,
        Optimize::Performance => GlslOptimization::Performance,
    };
    let mut src = GlslSource::compute(&name, text)
        .entry_point(&entry)
        .target(args.target_env.target())
        .optimization(optimization);
    for d in &args.define {
        let (k, v) = d.split_once('=').unwrap_or((d.as_str(), ""));
        src = src.define(k, v);
    }
    if let Some(dir) = &args.include_dir {
        src = src.includes(Arc::new(DirIncludes::new(dir)));
    }
    Ok((DeviceImage::glsl(src)?, entry))
}

/// Whether `key` is a SPIR-V cache key (compiled from GLSL) rather than a program's.
fn is_spirv_key(key: &StoreKey) -> bool {
    key.device().starts_with("backend=glsl\n")
}

pub fn run(config: &Config, local: PersistentCache, args: &ExplainArgs) -> kpc::Result<ExitCode> {
    let mut stores = vec![("disk".to_string(), local)];
    for dir in &config.readonly_dirs {
        stores.push((
            format!("readonly:{}", dir.display()),
            PersistentCache::new(DiskCacheSettings::from_config_at(config, dir)),
        ));
    }
    let plan = attention::plan(config, &args.attention)?;
    let device = &plan.device;
    let description = device.fingerprint.describe();
    // Why the kernel could not be acquired here, if it could not (keys looked up before that are
    // still explained).
    let mut note = None;
    let keys: Vec<StoreKey> = match (&args.blob_id, &args.glsl) {
        (_, Some(file)) => {
            if device.backend != BackendKind::Vulkan {
                return Err(Error::InvalidArgument(format!(
                    "--glsl needs a Vulkan device; {}:{} ({}) is {}: select one with --backend vulkan, --device or KPC_DEVICE",
                    device.backend, device.index, device.name, device.backend
                )));
            }
            let (image, entry) = glsl_image(file, args)?;
            let recorder = Arc::new(KeyRecorder::default());
            let mut quiet = config.clone();
            quiet.cache_debug = false;
            let chain = StoreChain::new().with_store(recorder.clone());
            let ctx = Context::builder()
                .device(device)
                .config(quiet.clone())
                .stores(chain)
                .build()?;
            let spec = args
                .spec
                .iter()
                .fold(SpecConstants::new(), |s, &(id, v)| s.with(id, v));
            let options = BuildOptions::new(&args.build_options);
            if let Err(e) = ctx.kernel_with(
                &kpc::KernelRequest::new(&image, &entry)
                    .spec(spec.clone())
                    .options(options.clone()),
            ) {
                note = Some(e.to_string());
            }
            recorder.0.lock().unwrap_or_else(|p| p.into_inner()).clone()
        }
        (Some(hex), None) => {
            let p = parse_blob_id(&parse_hex(hex)?)?;
            if p.device != device.fingerprint.digest {
                return Err(Error::InvalidArgument(format!(
                    "--blob-id is for device fingerprint {}, but the selected device {}:{} ({}) has {}: select that device (--backend, --device or KPC_DEVICE)",
                    p.device.short_hex(8),
                    device.backend,
                    device.index,
                    device.name,
                    device.fingerprint.digest.short_hex(8)
                )));
            }
            let key = StoreKey::new(
                &description,
                p.device,
                p.image,
                p.image_len,
                &p.spec,
                &p.options,
            );
            // The blob id carries no image name: take it from a shipped kernel with that image.
            let names: Vec<&str> = match device.backend {
                BackendKind::Vulkan => crate::shipped::spirv().map(|k| k.name).collect(),
                BackendKind::OpenCl => crate::shipped::opencl().map(|k| k.name).collect(),
            };
            let label = names
                .into_iter()
                .find(|n| {
                    let img = match device.backend {
                        BackendKind::Vulkan => crate::shipped::spirv_image(n),
                        BackendKind::OpenCl => crate::shipped::opencl_image(n),
                    };
                    img.is_ok_and(|i| i.digest() == p.image)
                })
                .unwrap_or("");
            vec![key.with_label(label)]
        }
        (None, None) => {
            let recorder = Arc::new(KeyRecorder::default());
            let mut quiet = config.clone();
            quiet.cache_debug = false;
            let chain = StoreChain::new().with_store(recorder.clone());
            let ctx = Context::builder()
                .device(device)
                .config(quiet.clone())
                .stores(chain)
                .build()?;
            attention::acquire_kernels(&ctx, &plan, &args.attention)?;
            recorder.0.lock().unwrap_or_else(|p| p.into_inner()).clone()
        }
    };
    let rows: Vec<(StoreKey, Vec<Verdict>)> = keys
        .into_iter()
        .map(|k| {
            let v = verdicts(&stores, &k);
            (k, v)
        })
        .collect();
    if args.json {
        let kernels: Vec<Value> = rows
            .iter()
            .map(|(k, v)| {
                json!({
                    "label": k.label(),
                    "kind": if is_spirv_key(k) { "spirv" } else { "program" },
                    "key": k.digest().to_hex(),
                    "cached": v.iter().any(|v| v.cached),
                    "stores": v.iter().map(verdict_json).collect::<Vec<_>>(),
                })
            })
            .collect();
        crate::output::print_json(&json!({
            "device": format!("{}:{} {}", device.backend, device.index, device.name),
            "fingerprint": device.fingerprint.digest.to_hex(),
            "kernels": kernels,
            "note": note,
        }));
    } else {
        outln!(
            "device: {}:{} {} (fingerprint {})",
            device.backend,
            device.index,
            device.name,
            device.fingerprint.digest.short_hex(8)
        );
        for (k, v) in &rows {
            let name = if k.label().is_empty() {
                "(unnamed)"
            } else {
                k.label()
            };
            let label = if is_spirv_key(k) {
                format!("{name} (SPIR-V from GLSL)")
            } else {
                name.to_owned()
            };
            let first = v.iter().position(|v| v.cached);
            match first {
                Some(i) => outln!(
                    "{label} [{}]: {}",
                    k.digest().short_hex(6),
                    verdict_text(&v[i])
                ),
                None => {
                    outln!("{label} [{}]: not cached", k.digest().short_hex(6));
                    for v in v {
                        outln!("  {}", verdict_text(v));
                    }
                }
            }
        }
        if let Some(n) = note {
            outln!(
                "note: the kernel could not be built on this device ({n}); the keys above are those looked up before that"
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}
