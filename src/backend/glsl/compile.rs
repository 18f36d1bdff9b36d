//! GLSL to SPIR-V through shaderc: preprocessing (which reads the includes and fixes the SPIR-V
//! cache key), compiling, and naming the entry point.

use std::sync::{Arc, OnceLock};

use parking_lot::Mutex;
use shaderc::{
    CompileOptions, Compiler, EnvVersion, IncludeType, OptimizationLevel, ShaderKind, SpirvVersion,
    TargetEnv,
};

use super::{GlslOptimization, GlslSource, GlslStage, SpirvTarget};
use crate::cache::Digest;
use crate::error::{Error, Result};

/// A GLSL image after preprocessing: the text the compiler will see (includes inlined, macros
/// expanded) and its digest, which is the source part of the SPIR-V cache key.
#[derive(Debug, Clone)]
pub struct Preprocessed {
    /// The preprocessed text.
    pub text: Arc<str>,
    /// BLAKE3 of `text`.
    pub digest: Digest,
}

fn compile_error(src: &GlslSource, message: impl Into<String>) -> Error {
    Error::GlslCompile {
        image: src.name.to_string(),
        message: message.into(),
    }
}

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

/// The compiler, created once per process (shaderc's compiler object is thread-safe to share).
fn compiler() -> Result<&'static Compiler> {
    static C: OnceLock<std::result::Result<Compiler, String>> = OnceLock::new();
    C.get_or_init(|| Compiler::new().map_err(|e| e.to_string()))
        .as_ref()
        .map_err(|m| Error::Io(format!("libshaderc could not create a compiler: {m}")))
}

fn options(src: &GlslSource, includes: Arc<Mutex<Vec<String>>>) -> Result<CompileOptions<'static>> {
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
    let resolver = src.includes.clone();
    o.set_include_callback(move |requested, kind, requesting, _depth| {
        let Some(r) = &resolver else {
            return Err(format!(
                "#include {requested:?}: this GLSL image has no include resolver"
            ));
        };
        let got = r.resolve(requested, requesting, kind == IncludeType::Relative)?;
        includes.lock().push(got.name.clone());
        Ok(shaderc::ResolvedInclude {
            resolved_name: got.name,
            content: got.content,
        })
    });
    Ok(o)
}

fn kind(stage: GlslStage) -> ShaderKind {
    match stage {
        GlslStage::Compute => ShaderKind::Compute,
    }
}

/// Preprocesses `src`: defines applied, includes read through its resolver (each once, now).
///
/// Errors: [`Error::GlslCompile`] with the preprocessor's message (an unresolvable include, `#error`);
/// [`Error::InvalidArgument`] for a malformed define or entry point name.
pub fn preprocess(src: &GlslSource) -> Result<Preprocessed> {
    src.check()?;
    let o = options(src, Arc::default())?;
    let out = compiler()?
        .preprocess(&src.text, &src.name, "main", Some(&o))
        .map_err(|e| shaderc_error(src, e))?;
    let text: Arc<str> = out.as_text().into();
    Ok(Preprocessed {
        digest: Digest::of(text.as_bytes()),
        text,
    })
}

/// Compiles the preprocessed text of `src` to SPIR-V bytes whose entry point is named
/// [`GlslSource::entry_point_name`]. The bytes are not validated here (the caller validates them
/// as it would any SPIR-V image).
///
/// Errors: [`Error::GlslCompile`] with the compiler's messages, each citing `name:line`.
pub fn compile(src: &GlslSource, pre: &Preprocessed) -> Result<Vec<u8>> {
    let o = options(src, Arc::default())?;
    // The preprocessed text keeps the line numbering of the source (and `#line`s for includes), so
    // messages cite the lines the author wrote.
    let out = compiler()?
        .compile_into_spirv(&pre.text, kind(src.stage), &src.name, "main", Some(&o))
        .map_err(|e| shaderc_error(src, e))?;
    let words = out.as_binary();
    rename_entry(src, words)
}

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
        format!("shaderc-rs 0.9; libshaderc spirv {v}.{r}; {lib}")
    })
}
