//! GLSL to SPIR-V through shaderc: resolving the includes (which fixes the SPIR-V cache key, without
//! starting glslang), compiling, and naming the entry point.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
#[cfg(feature = "glsl")]
use std::sync::OnceLock;

#[cfg(feature = "glsl")]
use shaderc::{
    CompileOptions, Compiler, EnvVersion, IncludeType, OptimizationLevel, ShaderKind, SpirvVersion,
    TargetEnv,
};

use super::GlslSource;
#[cfg(feature = "glsl")]
use super::{GlslOptimization, GlslStage, SpirvTarget};
use crate::cache::Digest;
use crate::error::{Error, Result};

/// Includes deeper than this are refused (a cycle without include guards, say).
const MAX_INCLUDE_DEPTH: usize = 32;

/// What one `#include` resolved to: its text, or the resolver's message.
type Included = std::result::Result<super::ResolvedInclude, String>;

/// A GLSL image with its includes resolved: the digest of its source and of every include it
/// names (found by scanning `#include` lines, recursively, and read through its resolver once), the
/// source part of the SPIR-V cache key. Computing it does not start the compiler, so a SPIR-V cache
/// hit costs no glslang at all. The compile is served exactly these includes.
#[derive(Debug, Clone)]
pub struct Preprocessed {
    /// BLAKE3 over the source and, in order, each include's request, includer, name and text.
    pub digest: Digest,
    /// Bytes of the source and of each distinct include (by resolved name), each counted once.
    pub len: u64,
    // Served to the compiler, which exists only with the `glsl` feature; the digest covers them either way.
    #[cfg_attr(not(feature = "glsl"), allow(dead_code))]
    includes: Arc<HashMap<(String, String, bool), Included>>,
}

/// `#include "x"` or `#include <x>` on one line: (x, relative).
fn include_of(line: &str) -> Option<(&str, bool)> {
    let rest = line.trim_start().strip_prefix('#')?.trim_start();
    let rest = rest.strip_prefix("include")?.trim_start();
    let (close, relative) = match rest.chars().next()? {
        '"' => ('"', true),
        '<' => ('>', false),
        _ => return None,
    };
    let body = &rest[1..];
    Some((&body[..body.find(close)?], relative))
}

struct Scan<'a> {
    src: &'a GlslSource,
    hasher: blake3::Hasher,
    len: u64,
    seen: HashSet<String>,
    includes: HashMap<(String, String, bool), Included>,
}

impl Scan<'_> {
    fn part(&mut self, p: &[u8]) {
        self.hasher.update(&(p.len() as u64).to_le_bytes());
        self.hasher.update(p);
    }

    fn text(&mut self, text: &str, from: &str, depth: usize) -> Result<()> {
        for line in text.lines() {
            let Some((requested, relative)) = include_of(line) else {
                continue;
            };
            if depth >= MAX_INCLUDE_DEPTH {
                return Err(compile_error(
                    self.src,
                    format!(
                        "{from}: #include {requested:?} nests deeper than {MAX_INCLUDE_DEPTH} levels"
                    ),
                ));
            }
            let key = (requested.to_owned(), from.to_owned(), relative);
            if self.includes.contains_key(&key) {
                continue;
            }
            let got = match &self.src.includes {
                Some(r) => r.resolve(requested, from, relative),
                None => Err(format!(
                    "#include {requested:?}: this GLSL image has no include resolver"
                )),
            };
            self.part(requested.as_bytes());
            self.part(from.as_bytes());
            match &got {
                Ok(inc) => {
                    self.part(inc.name.as_bytes());
                    self.part(inc.content.as_bytes());
                }
                // Unresolved: part of the key as such; the compile reports it if the line is live.
                Err(m) => self.part(format!("unresolved: {m}").as_bytes()),
            }
            self.includes.insert(key, got.clone());
            if let Ok(inc) = got {
                if self.seen.insert(inc.name.clone()) {
                    // One file however many files include it: its bytes count once in the size.
                    self.len += inc.content.len() as u64;
                    self.text(&inc.content, &inc.name, depth + 1)?;
                }
            }
        }
        Ok(())
    }
}

/// Resolves the includes of `src` through its resolver (each once, now) and digests source and
/// includes: the source part of its SPIR-V cache key.
///
/// Errors: [`Error::GlslCompile`] for includes nested deeper than 32 levels;
/// [`Error::InvalidArgument`] for a malformed define or entry point name.
pub fn preprocess(src: &GlslSource) -> Result<Preprocessed> {
    src.check()?;
    let mut scan = Scan {
        src,
        hasher: blake3::Hasher::new(),
        len: src.text.len() as u64,
        seen: HashSet::new(),
        includes: HashMap::new(),
    };
    scan.part(b"kpc-glsl-source-v1");
    scan.part(src.text.as_bytes());
    scan.text(&src.text, &src.name, 0)?;
    Ok(Preprocessed {
        digest: Digest(*scan.hasher.finalize().as_bytes()),
        len: scan.len,
        includes: Arc::new(scan.includes),
    })
}

fn compile_error(src: &GlslSource, message: impl Into<String>) -> Error {
    Error::GlslCompile {
        image: src.name.to_string(),
        message: message.into(),
    }
}

#[cfg(feature = "glsl")]
fn shaderc_error(src: &GlslSource, e: shaderc::Error) -> Error {
    match e {
        shaderc::Error::CompilationError(_, m) | shaderc::Error::InvalidStage(m) => {
            compile_error(src, m.trim_end().to_owned())
        }
        shaderc::Error::InvalidAssembly(m) => compile_error(src, m),
        shaderc::Error::InternalError(m) => compile_error(src, format!("internal error: {m}")),
        shaderc::Error::NullResultObject(m) => compile_error(src, format!("no result: {m}")),
        // Only a failure of the library to start: not the source's fault and may not recur.
        shaderc::Error::InitializationError(m) => Error::Io(format!(
            "libshaderc could not be initialized ({m}); GLSL images need Debian's libshaderc1"
        )),
        shaderc::Error::ParseError(m) => compile_error(src, m),
    }
}

#[cfg(feature = "glsl")]
/// The compiler, created once per process (shaderc's compiler object is thread-safe to share).
fn compiler() -> Result<&'static Compiler> {
    static C: OnceLock<std::result::Result<Compiler, String>> = OnceLock::new();
    C.get_or_init(|| Compiler::new().map_err(|e| e.to_string()))
        .as_ref()
        .map_err(|m| Error::Io(format!("libshaderc could not create a compiler: {m}")))
}

#[cfg(feature = "glsl")]
fn options(src: &GlslSource, pre: &Preprocessed) -> Result<CompileOptions<'static>> {
    let mut o = CompileOptions::new().map_err(|e| shaderc_error(src, e))?;
    let (env, spv) = match src.target {
        SpirvTarget::Vulkan1_0 => (EnvVersion::Vulkan1_0, SpirvVersion::V1_0),
        SpirvTarget::Vulkan1_1 => (EnvVersion::Vulkan1_1, SpirvVersion::V1_3),
        SpirvTarget::Vulkan1_2 => (EnvVersion::Vulkan1_2, SpirvVersion::V1_5),
        SpirvTarget::Vulkan1_3 => (EnvVersion::Vulkan1_3, SpirvVersion::V1_6),
    };
    o.set_target_env(TargetEnv::Vulkan, env as u32);
    o.set_target_spirv(spv);
    o.set_optimization_level(match src.optimization {
        GlslOptimization::None => OptimizationLevel::Zero,
        GlslOptimization::Size => OptimizationLevel::Size,
        GlslOptimization::Performance => OptimizationLevel::Performance,
    });
    for (k, v) in &src.defines {
        o.add_macro_definition(k, (!v.is_empty()).then_some(v.as_str()));
    }
    // Exactly what the key was computed from: an include the scan did not see (a computed
    // `#include MACRO`) is refused rather than read unkeyed.
    let includes = pre.includes.clone();
    o.set_include_callback(move |requested, kind, requesting, _depth| {
        let key = (
            requested.to_owned(),
            requesting.to_owned(),
            kind == IncludeType::Relative,
        );
        // glslang asks again as a standard include when a relative one fails: the same answer.
        let flipped = (key.0.clone(), key.1.clone(), !key.2);
        match includes.get(&key).or_else(|| includes.get(&flipped)) {
            Some(Ok(inc)) => Ok(shaderc::ResolvedInclude {
                resolved_name: inc.name.clone(),
                content: inc.content.clone(),
            }),
            Some(Err(m)) => Err(m.clone()),
            None => Err(format!(
                "#include {requested:?} was not found by kpc's include scan: only #include \"...\" \
                 and #include <...> with a literal name are supported"
            )),
        }
    });
    Ok(o)
}

#[cfg(feature = "glsl")]
fn kind(stage: GlslStage) -> ShaderKind {
    match stage {
        GlslStage::Compute => ShaderKind::Compute,
    }
}

#[cfg(feature = "glsl")]
/// Compiles `src` (its includes served from `pre`) to SPIR-V bytes whose entry point is named
/// [`GlslSource::entry_point_name`]. The bytes are not validated here (the caller validates them
/// as it would any SPIR-V image).
///
/// Errors: [`Error::GlslCompile`] with the compiler's messages, each citing `name:line`.
pub fn compile(src: &GlslSource, pre: &Preprocessed) -> Result<Vec<u8>> {
    let o = options(src, pre)?;
    let out = compiler()?
        .compile_into_spirv(&src.text, kind(src.stage), &src.name, "main", Some(&o))
        .map_err(|e| shaderc_error(src, e))?;
    let words = out.as_binary();
    rename_entry(src, words)
}

#[cfg(feature = "glsl")]
/// Renames the `main` entry point to the image's entry name (what glslangValidator's `-e NAME
/// --source-entrypoint main` does for the committed SPIR-V).
fn rename_entry(src: &GlslSource, words: &[u32]) -> Result<Vec<u8>> {
    use rspirv::binary::Assemble;
    use rspirv::dr::Operand;
    let entry = src.entry_point_name();
    let mut module = rspirv::dr::load_words(words)
        .map_err(|e| compile_error(src, format!("shaderc emitted unreadable SPIR-V: {e}")))?;
    let mut renamed = 0;
    for ep in &mut module.entry_points {
        for op in &mut ep.operands {
            if let Operand::LiteralString(s) = op {
                if s == "main" {
                    *s = entry.to_owned();
                    renamed += 1;
                }
            }
        }
    }
    if renamed != 1 {
        return Err(compile_error(
            src,
            format!("expected one entry point named main, found {renamed}"),
        ));
    }
    Ok(module
        .assemble()
        .iter()
        .flat_map(|w| w.to_le_bytes())
        .collect())
}

#[cfg(feature = "glsl")]
/// The compiler's identity for the SPIR-V cache key: the shaderc crate's API version, the SPIR-V
/// version libshaderc reports, and the loaded libshaderc file (path, size, modification time), so
/// that installing another libshaderc changes every key. Computed once per process.
pub fn compiler_identity() -> &'static str {
    static ID: OnceLock<String> = OnceLock::new();
    ID.get_or_init(|| {
        let (v, r) = shaderc::get_spirv_version();
        let lib = std::fs::read_to_string("/proc/self/maps")
            .ok()
            .and_then(|maps| {
                maps.lines()
                    .filter_map(|l| l.split_whitespace().nth(5))
                    .find(|p| p.contains("libshaderc"))
                    .map(str::to_owned)
            })
            .map(|path| {
                let meta = std::fs::metadata(&path).ok();
                let len = meta.as_ref().map_or(0, |m| m.len());
                let mtime = meta
                    .and_then(|m| m.modified().ok())
                    .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                    .map_or(0, |d| d.as_secs());
                format!("{path} len={len} mtime={mtime}")
            })
            .unwrap_or_else(|| "linked statically".to_owned());
        // SPIR-V's version word: 0x00MMmm00.
        format!(
            "shaderc-rs 0.9; libshaderc emits SPIR-V up to {}.{} rev {r}; {lib}",
            v >> 16,
            (v >> 8) & 0xff
        )
    })
}

/// Without the `glsl` feature there is no compiler: a GLSL image is a typed error, not a link-time
/// dependency on libshaderc for embedders that only load SPIR-V and OpenCL C.
#[cfg(not(feature = "glsl"))]
pub fn compile(src: &GlslSource, _pre: &Preprocessed) -> Result<Vec<u8>> {
    Err(Error::Unavailable {
        backend: crate::config::BackendKind::Vulkan,
        reason: format!(
            "GLSL image {:?}: kpc was built without its `glsl` feature (GLSL compiles through \
             Debian's libshaderc); enable the feature, or pass SPIR-V",
            src.name()
        ),
    })
}

/// The compiler identity without a compiler: no GLSL image is ever compiled, so no key uses it.
#[cfg(not(feature = "glsl"))]
pub fn compiler_identity() -> &'static str {
    "no GLSL compiler (kpc built without the `glsl` feature)"
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::backend::glsl::MapIncludes;

    #[test]
    fn an_include_reached_from_two_files_counts_once() {
        let common = "const float K = 2.0;\n";
        let a = "#include \"common.glsl\"\nfloat fa() { return K; }\n";
        let b = "#include \"common.glsl\"\nfloat fb() { return K + 1.0; }\n";
        let text = "#version 450\n#include \"a.glsl\"\n#include \"b.glsl\"\n#include \"a.glsl\"\nvoid main() {}\n";
        let inc = MapIncludes::new()
            .with("common.glsl", common)
            .with("a.glsl", a)
            .with("b.glsl", b);
        let src = GlslSource::compute("k", text).includes(Arc::new(inc));
        let pre = preprocess(&src).unwrap();
        assert_eq!(
            pre.len,
            (text.len() + a.len() + b.len() + common.len()) as u64
        );
        // Every include is still in the key: another text for the shared one is another digest.
        let inc2 = MapIncludes::new()
            .with("common.glsl", "const float K = 3.0;\n")
            .with("a.glsl", a)
            .with("b.glsl", b);
        let src2 = GlslSource::compute("k", text).includes(Arc::new(inc2));
        assert_ne!(preprocess(&src2).unwrap().digest, pre.digest);
    }
}
