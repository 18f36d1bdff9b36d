//! GLSL compute source as a device image: the source text, its stage, its macro definitions, the
//! SPIR-V it targets, and where its `#include`s come from. Compiled to SPIR-V by shaderc (Debian's
//! libshaderc, see build.rs) in [`compile`]; the runtime caches the SPIR-V
//! (`src/runtime/spirv_cache.rs`) and then treats it exactly like a precompiled SPIR-V image.

pub mod compile;
pub mod includes;

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

pub use includes::{DirIncludes, IncludeResolver, MapIncludes, ResolvedInclude};

use crate::error::{Error, Result};

/// The shader stage of a GLSL image. kpc runs compute work only, so compute is the one stage.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum GlslStage {
    /// A compute shader (`.comp`).
    #[default]
    Compute,
}

/// The Vulkan environment a GLSL image is compiled for, which fixes the SPIR-V version.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum SpirvTarget {
    /// Vulkan 1.0, SPIR-V 1.0.
    Vulkan1_0,
    /// Vulkan 1.1, SPIR-V 1.3: what scripts/build-kernels.sh targets for the shipped kernels.
    #[default]
    Vulkan1_1,
    /// Vulkan 1.2, SPIR-V 1.5.
    Vulkan1_2,
    /// Vulkan 1.3, SPIR-V 1.6: needed by cooperative-matrix kernels.
    Vulkan1_3,
}

impl SpirvTarget {
    /// `vulkan1.1` and so on, as glslangValidator's `--target-env` spells it.
    pub fn name(self) -> &'static str {
        match self {
            SpirvTarget::Vulkan1_0 => "vulkan1.0",
            SpirvTarget::Vulkan1_1 => "vulkan1.1",
            SpirvTarget::Vulkan1_2 => "vulkan1.2",
            SpirvTarget::Vulkan1_3 => "vulkan1.3",
        }
    }
    /// The SPIR-V version (major, minor) it implies.
    pub fn spirv_version(self) -> (u8, u8) {
        match self {
            SpirvTarget::Vulkan1_0 => (1, 0),
            SpirvTarget::Vulkan1_1 => (1, 3),
            SpirvTarget::Vulkan1_2 => (1, 5),
            SpirvTarget::Vulkan1_3 => (1, 6),
        }
    }
}

/// How hard the compiler optimizes the SPIR-V it emits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum GlslOptimization {
    /// No optimization passes: glslangValidator's default, and what the committed SPIR-V used.
    #[default]
    None,
    /// Optimize for size.
    Size,
    /// Optimize for performance.
    Performance,
}

impl GlslOptimization {
    fn name(self) -> &'static str {
        match self {
            GlslOptimization::None => "none",
            GlslOptimization::Size => "size",
            GlslOptimization::Performance => "performance",
        }
    }
}

/// GLSL source with everything that decides the SPIR-V compiled from it. Build it, then make a
/// [`DeviceImage`](crate::backend::DeviceImage) of it with
/// [`DeviceImage::glsl`](crate::backend::DeviceImage::glsl).
#[derive(Clone)]
pub struct GlslSource {
    pub(crate) name: Arc<str>,
    pub(crate) text: Arc<str>,
    pub(crate) stage: GlslStage,
    pub(crate) defines: BTreeMap<String, String>,
    pub(crate) target: SpirvTarget,
    pub(crate) optimization: GlslOptimization,
    pub(crate) entry_point: Option<String>,
    pub(crate) includes: Option<Arc<dyn IncludeResolver>>,
}

impl fmt::Debug for GlslSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GlslSource")
            .field("name", &self.name)
            .field("bytes", &self.text.len())
            .field("stage", &self.stage)
            .field("defines", &self.defines)
            .field("target", &self.target)
            .field("optimization", &self.optimization)
            .field("entry_point", &self.entry_point_name())
            .field("includes", &self.includes)
            .finish()
    }
}

impl GlslSource {
    /// Compute-shader source `text` named `name` (errors and `#line`s cite it; `kpc cache ls` shows
    /// it). The SPIR-V entry point is named `name` unless [`GlslSource::entry_point`] says otherwise,
    /// as in the shipped kernels; GLSL's own entry is always `main`.
    pub fn compute(name: &str, text: impl Into<Arc<str>>) -> GlslSource {
        GlslSource {
            name: name.into(),
            text: text.into(),
            stage: GlslStage::Compute,
            defines: BTreeMap::new(),
            target: SpirvTarget::default(),
            optimization: GlslOptimization::default(),
            entry_point: None,
            includes: None,
        }
    }

    /// Adds `#define name value` (an empty `value` defines it with no value). A later definition of
    /// the same name replaces the earlier one. Checked by [`DeviceImage::glsl`](crate::backend::DeviceImage::glsl).
    pub fn define(mut self, name: &str, value: &str) -> GlslSource {
        self.defines.insert(name.to_owned(), value.to_owned());
        self
    }

    /// The Vulkan environment and SPIR-V version to compile for (default Vulkan 1.1, SPIR-V 1.3).
    pub fn target(mut self, target: SpirvTarget) -> GlslSource {
        self.target = target;
        self
    }

    /// The optimization level (default none).
    pub fn optimization(mut self, level: GlslOptimization) -> GlslSource {
        self.optimization = level;
        self
    }

    /// Names the SPIR-V entry point `entry` instead of the image's name.
    pub fn entry_point(mut self, entry: &str) -> GlslSource {
        self.entry_point = Some(entry.to_owned());
        self
    }

    /// Where `#include` directives are resolved (`GL_GOOGLE_include_directive`); without one, an
    /// `#include` is a compile error.
    pub fn includes(mut self, resolver: Arc<dyn IncludeResolver>) -> GlslSource {
        self.includes = Some(resolver);
        self
    }

    /// The image's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The SPIR-V entry point's name.
    pub fn entry_point_name(&self) -> &str {
        self.entry_point.as_deref().unwrap_or(&self.name)
    }

    /// The stage.
    pub fn stage(&self) -> GlslStage {
        self.stage
    }

    /// The macro definitions, sorted by name.
    pub fn defines(&self) -> &BTreeMap<String, String> {
        &self.defines
    }

    /// The target.
    pub fn spirv_target(&self) -> SpirvTarget {
        self.target
    }

    /// The optimization level.
    pub fn optimization_level(&self) -> GlslOptimization {
        self.optimization
    }

    /// The source text.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// Checks what the compiler would otherwise reject obscurely.
    ///
    /// Errors: [`Error::InvalidArgument`] for a define or entry point name that is not a GLSL
    /// identifier, or a define value with a line break.
    pub(crate) fn check(&self) -> Result<()> {
        let ident = |s: &str| {
            let mut c = s.chars();
            c.next()
                .is_some_and(|f| f.is_ascii_alphabetic() || f == '_')
                && c.all(|x| x.is_ascii_alphanumeric() || x == '_')
        };
        for (k, v) in &self.defines {
            if !ident(k) {
                return Err(Error::InvalidArgument(format!(
                    "GLSL image {:?}: define name {k:?} is not an identifier (letters, digits and _, \
                     not starting with a digit)",
                    self.name
                )));
            }
            if v.contains(['\n', '\r']) {
                return Err(Error::InvalidArgument(format!(
                    "GLSL image {:?}: the value of define {k} contains a line break; a define is one line",
                    self.name
                )));
            }
        }
        if !ident(self.entry_point_name()) {
            return Err(Error::InvalidArgument(format!(
                "GLSL image {:?}: entry point name {:?} is not an identifier; name the image (or set \
                 entry_point) with letters, digits and _",
                self.name,
                self.entry_point_name()
            )));
        }
        Ok(())
    }

    /// The defines as canonical bytes: `NAME=VALUE\n` in name order. Part of the SPIR-V cache key.
    pub(crate) fn defines_bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        for (k, v) in &self.defines {
            out.extend_from_slice(k.as_bytes());
            out.push(b'=');
            out.extend_from_slice(v.as_bytes());
            out.push(b'\n');
        }
        out
    }

    /// What besides the source, defines and target decides the SPIR-V: stage, entry point and
    /// optimization level. The options part of the SPIR-V cache key.
    pub(crate) fn options_string(&self) -> String {
        // One line: `kpc cache ls` shows it in a column.
        format!(
            "glsl stage={} entry={} optimization={}",
            match self.stage {
                GlslStage::Compute => "compute",
            },
            self.entry_point_name(),
            self.optimization.name()
        )
    }

    /// What identifies the image before its includes are read: the image digest of a GLSL
    /// [`DeviceImage`](crate::backend::DeviceImage).
    pub(crate) fn identity_bytes(&self) -> Vec<u8> {
        let mut out = b"kpc-glsl-image-v1\n".to_vec();
        for part in [
            self.text.as_bytes(),
            &self.defines_bytes(),
            self.options_string().as_bytes(),
            self.target.name().as_bytes(),
        ] {
            out.extend_from_slice(&(part.len() as u64).to_le_bytes());
            out.extend_from_slice(part);
        }
        out
    }
}
