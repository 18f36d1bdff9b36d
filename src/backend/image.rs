//! Device images: the inputs of a build (SPIR-V words, OpenCL C source, or GLSL source that is
//! compiled to SPIR-V first), identified by a digest of their bytes.

use std::sync::Arc;
#[cfg(not(loom))]
use std::sync::OnceLock;

use crate::cache::Digest;
#[cfg(not(loom))]
use crate::error::Result;

/// What a device image contains: SPIR-V for a Vulkan context, OpenCL C for an OpenCL one, GLSL
/// (compiled to SPIR-V through the context's SPIR-V cache) for Vulkan.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ImageFormat {
    /// A SPIR-V module (Vulkan).
    SpirV,
    /// OpenCL C source text.
    OpenClC,
    /// GLSL source (Vulkan): compiled to SPIR-V, through the SPIR-V cache, before it is built.
    Glsl,
}

impl ImageFormat {
    /// Which functions make an image of this format, for messages that send a caller to the right
    /// one.
    pub fn made_by(self) -> &'static str {
        match self {
            ImageFormat::SpirV => {
                "kpc::kernels::spirv_image for a shipped kernel, DeviceImage::spirv for yours; C: \
                 KPC_IMAGE_SPIRV"
            }
            ImageFormat::OpenClC => {
                "kpc::kernels::opencl_image for a shipped kernel, DeviceImage::opencl_c for yours; C: \
                 KPC_IMAGE_OPENCL_C"
            }
            ImageFormat::Glsl => "DeviceImage::glsl; C: kpc_image_from_glsl",
        }
    }
}

impl std::fmt::Display for ImageFormat {
    /// The format in words: `SPIR-V`, `OpenCL C source`, `GLSL source`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ImageFormat::SpirV => "SPIR-V",
            ImageFormat::OpenClC => "OpenCL C source",
            ImageFormat::Glsl => "GLSL source",
        })
    }
}

/// The reflected module and whether spirv-tools accepted it. Only success is remembered: an invalid
/// image is validated (and rejected) again on every use, so nothing about it outlives the request.
#[cfg(not(loom))]
#[derive(Debug, Default)]
struct SpirvMemo {
    module: OnceLock<super::spirv::SpirvModule>,
    validated: OnceLock<()>,
}

/// What a GLSL image holds besides its text: its options and resolver, and what became of it (the
/// resolved includes and the compiled SPIR-V image), shared by clones.
#[cfg(not(loom))]
#[derive(Debug)]
struct GlslMemo {
    source: super::glsl::GlslSource,
    preprocessed: OnceLock<Result<super::glsl::compile::Preprocessed>>,
    spirv: OnceLock<DeviceImage>,
}

/// An immutable device image. Cloning is cheap; the digest is computed once.
#[derive(Debug, Clone)]
pub struct DeviceImage {
    name: Arc<str>,
    format: ImageFormat,
    bytes: Arc<[u8]>,
    digest: Digest,
    /// What is known about a SPIR-V image, shared by clones.
    #[cfg(not(loom))]
    spirv: Arc<SpirvMemo>,
    /// The GLSL part of a GLSL image.
    #[cfg(not(loom))]
    glsl: Option<Arc<GlslMemo>>,
}

impl DeviceImage {
    /// An image named `name` (used in errors and `kpc cache ls`) holding `bytes`.
    pub fn new(name: &str, format: ImageFormat, bytes: impl Into<Arc<[u8]>>) -> Self {
        let bytes = bytes.into();
        DeviceImage {
            name: name.into(),
            format,
            digest: Digest::of(&bytes),
            bytes,
            #[cfg(not(loom))]
            spirv: Arc::default(),
            #[cfg(not(loom))]
            glsl: None,
        }
    }

    /// A GLSL image of `source`. Its bytes are the source text; its digest covers the text, defines,
    /// stage, entry point, target and optimization level (not the includes, which are read when it is
    /// first used). A kernel request compiles it to SPIR-V through the context's SPIR-V cache, keyed by
    /// the source and its includes, the defines, target, optimization level and compiler,
    /// and then builds that SPIR-V like any SPIR-V image. Its includes are read once, on first use, and
    /// the SPIR-V it compiled to is kept by the image and its clones: make a new image to pick up an
    /// edited include.
    ///
    /// Errors: [`crate::Error::InvalidArgument`] for a define or entry point name that is not a GLSL
    /// identifier, or a define value with a line break.
    #[cfg(not(loom))]
    pub fn glsl(source: super::glsl::GlslSource) -> Result<Self> {
        source.check()?;
        let id = source.identity_bytes();
        Ok(DeviceImage {
            name: source.name.clone(),
            format: ImageFormat::Glsl,
            bytes: source.text.as_bytes().into(),
            digest: Digest::of(&id),
            spirv: Arc::default(),
            glsl: Some(Arc::new(GlslMemo {
                source,
                preprocessed: OnceLock::new(),
                spirv: OnceLock::new(),
            })),
        })
    }

    /// The GLSL source and options of a GLSL image; `None` for other formats.
    #[cfg(not(loom))]
    pub fn glsl_source(&self) -> Option<&super::glsl::GlslSource> {
        self.glsl.as_ref().map(|g| &g.source)
    }

    /// A GLSL image's includes, resolved (read through its resolver) on first use, and the digest of
    /// source and includes; `None` for other formats. An error is kept too: the same image fails the
    /// same way.
    #[cfg(not(loom))]
    pub fn glsl_preprocessed(&self) -> Option<&Result<super::glsl::compile::Preprocessed>> {
        let g = self.glsl.as_ref()?;
        Some(
            g.preprocessed
                .get_or_init(|| super::glsl::compile::preprocess(&g.source)),
        )
    }

    /// The SPIR-V image this GLSL image compiled to, once some context compiled or loaded it.
    #[cfg(not(loom))]
    pub(crate) fn glsl_spirv(&self) -> Option<&DeviceImage> {
        self.glsl.as_ref()?.spirv.get()
    }

    /// Records the (validated) SPIR-V image this GLSL image compiles to; the first one recorded wins
    /// and is returned (every context compiles it to the same bytes).
    #[cfg(not(loom))]
    pub(crate) fn set_glsl_spirv(&self, spirv: DeviceImage) -> DeviceImage {
        match &self.glsl {
            Some(g) => g.spirv.get_or_init(|| spirv).clone(),
            None => spirv,
        }
    }

    /// An OpenCL C image named `name` of `source`, for an OpenCL context: the source is read (and its
    /// `// kpc-spec-constant` declarations parsed) when a kernel is first requested from it, not
    /// now; equal to `DeviceImage::new(name, ImageFormat::OpenClC, source)`.
    pub fn opencl_c(name: &str, source: impl Into<String>) -> Self {
        DeviceImage::new(name, ImageFormat::OpenClC, source.into().into_bytes())
    }

    /// A SPIR-V image, validated with spirv-tools and reflected now.
    ///
    /// Errors: [`crate::Error::InvalidSpirv`] with the validator's message.
    #[cfg(not(loom))]
    pub fn spirv(name: &str, bytes: impl Into<Arc<[u8]>>) -> Result<Self> {
        let image = DeviceImage::new(name, ImageFormat::SpirV, bytes);
        image.spirv_module()?;
        Ok(image)
    }

    /// The validated module and its reflected interface: validated with spirv-tools and reflected on
    /// first use, shared by every clone of this image afterwards (a hit is two atomic loads).
    ///
    /// Errors: [`crate::Error::InvalidSpirv`] with the validator's message when the bytes are not
    /// valid SPIR-V for Vulkan, or when the image is not a SPIR-V image at all.
    #[cfg(not(loom))]
    pub fn spirv_module(&self) -> Result<&super::spirv::SpirvModule> {
        if self.spirv.validated.get().is_none() {
            self.check_spirv_format()?;
            let words = super::spirv::words_from_bytes(&self.name, &self.bytes)?;
            super::spirv::validate(&self.name, &words)?;
            let _ = self.spirv.validated.set(());
        }
        self.spirv_reflection()
    }

    /// The reflected module without requiring validation: for a caller that knows these bytes are
    /// valid by other means (a persisted binary keyed by this image's digest exists only because an
    /// identical image passed validation before).
    ///
    /// Errors: [`crate::Error::InvalidSpirv`] when the bytes do not parse as SPIR-V.
    #[cfg(not(loom))]
    pub fn spirv_reflection(&self) -> Result<&super::spirv::SpirvModule> {
        if let Some(m) = self.spirv.module.get() {
            return Ok(m);
        }
        self.check_spirv_format()?;
        let m = super::spirv::SpirvModule::reflect(&self.name, &self.bytes)?;
        // Two threads may both reflect; either result is the same, and the first one stored wins.
        Ok(self.spirv.module.get_or_init(|| m))
    }

    #[cfg(not(loom))]
    fn check_spirv_format(&self) -> Result<()> {
        if self.format == ImageFormat::SpirV {
            Ok(())
        } else {
            Err(crate::Error::InvalidSpirv {
                image: self.name.to_string(),
                message: format!(
                    "the image holds {}, not SPIR-V: a Vulkan context builds SPIR-V ({}) or GLSL \
                     ({})",
                    self.format,
                    ImageFormat::SpirV.made_by(),
                    ImageFormat::Glsl.made_by()
                ),
            })
        }
    }

    /// The image's name.
    pub fn name(&self) -> &str {
        &self.name
    }
    /// What it contains.
    pub fn format(&self) -> ImageFormat {
        self.format
    }
    /// Its bytes.
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }
    /// BLAKE3 of its bytes: the image part of every cache key.
    pub fn digest(&self) -> Digest {
        self.digest
    }
}
