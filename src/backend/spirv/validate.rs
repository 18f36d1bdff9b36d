//! spirv-tools over a module: validation for the Vulkan environment its version implies, and the
//! optional performance passes (`-O`).

use spirv_tools::TargetEnv;
use spirv_tools::opt::Optimizer;
use spirv_tools::val::Validator;

use crate::error::{Error, Result};

use super::{invalid, version_of};

/// The Vulkan environment a module of this SPIR-V version is validated for: the oldest Vulkan that
/// accepts the version, so that validation is as strict as the version allows.
fn target_env(version: (u8, u8)) -> TargetEnv {
    match version {
        (1, 0..=3) => TargetEnv::Vulkan_1_1,
        (1, 4) => TargetEnv::Vulkan_1_1_Spirv_1_4,
        (1, 5) => TargetEnv::Vulkan_1_2,
        _ => TargetEnv::Vulkan_1_3,
    }
}

/// The Vulkan API version (major, minor) a device needs to accept a module of this SPIR-V version.
pub fn required_vulkan(version: (u8, u8)) -> (u32, u32) {
    match version {
        (1, 0) => (1, 0),
        (1, 1..=3) => (1, 1),
        (1, 4 | 5) => (1, 2),
        _ => (1, 3),
    }
}

/// Validates `words` with spirv-tools for the Vulkan environment its version implies.
///
/// Errors: [`Error::InvalidSpirv`] carrying the validator's message.
pub fn validate(image: &str, words: &[u32]) -> Result<()> {
    let env = target_env(version_of(words));
    let validator = spirv_tools::val::create(Some(env));
    validator
        .validate(words, None)
        .map_err(|e| invalid(image, e.to_string()))
}

/// Runs spirv-tools' performance passes over a validated module, keeping every binding and
/// specialization constant, and validates the result.
///
/// Errors: [`Error::Build`] when the optimizer fails or emits something invalid (an optimizer bug;
/// deterministic, so the runtime caches it).
pub fn optimize(image: &str, words: &[u32]) -> Result<Vec<u32>> {
    let env = target_env(version_of(words));
    let mut opt = spirv_tools::opt::create(Some(env));
    opt.register_performance_passes();
    let options = spirv_tools::opt::Options {
        preserve_bindings: true,
        preserve_spec_constants: true,
        ..Default::default()
    };
    let mut messages = Vec::new();
    let out = opt
        .optimize(
            words,
            &mut |m: spirv_tools::error::Message| messages.push(m.message),
            Some(options),
        )
        .map_err(|e| Error::Build {
            backend: crate::config::BackendKind::Vulkan,
            image: image.to_string(),
            code: -1,
            message: format!("spirv-tools optimizer failed: {e}"),
            log: messages.join("\n"),
        })?;
    let words = out.as_words().to_vec();
    validate(image, &words).map_err(|e| Error::Build {
        backend: crate::config::BackendKind::Vulkan,
        image: image.to_string(),
        code: -1,
        message: format!("the spirv-tools optimizer produced invalid SPIR-V: {e}"),
        log: messages.join("\n"),
    })?;
    Ok(words)
}
