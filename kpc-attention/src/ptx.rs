//! Whether an OpenCL device takes the inline PTX that kpc's `mma.sync` kernels are written in
//! (`asm` in OpenCL C: `mma.sync.aligned.m16n8k16` fp16 products into fp32 sums, `ldmatrix`,
//! `cp.async`; PTX for sm_80 and later), and the typed refusal where it does not.
//!
//! The answer comes from building a probe program through the context ([`PROBE`],
//! kernels/ptx_probe.cl: every construct the kernels use, written as they write it), never from
//! vendor or device names: NVIDIA's OpenCL hands `asm` to ptxas, which accepts these instructions
//! from sm_80 on; PoCL and other compilers refuse `asm` itself. The build goes through the
//! context's caches like any kernel, so a context probes once, and a refusal (a failed build) is
//! cached with it. The Vulkan backend takes SPIR-V, which has no inline PTX: refused without a build.

use kpc::{BackendKind, Context, DeviceImage, KernelRequest};
use kpc::{Error, Result};

/// The probe kernel's name (and its image's).
pub const PROBE: &str = "ptx_probe";

/// The probe's OpenCL C source.
const PROBE_SOURCE: &str = include_str!("../kernels/ptx_probe.cl");

/// What the inline-PTX kernels need, in words (the `needs` of their refusals).
pub const NEEDS: &str = "an OpenCL C compiler that takes inline PTX (`asm`) with sm_80 instructions \
                         (NVIDIA's OpenCL on an Ampere GPU or later): mma.sync.aligned.m16n8k16 \
                         fp16 -> fp32, ldmatrix.sync.aligned.m8n8.x4, cp.async.cg.shared.global";

/// Why `ctx`'s device cannot run kpc's inline-PTX kernels, if it cannot: `None` where the probe
/// program built.
///
/// Errors: what building the probe returns other than a refusal of the program (a lost device,
/// memory), which says nothing about the device's compiler.
pub fn inline_ptx_unfit(ctx: &Context) -> Result<Option<String>> {
    if ctx.backend() != BackendKind::OpenCl {
        return Ok(Some(format!(
            "the {} backend takes SPIR-V, which has no inline PTX; these kernels are OpenCL C",
            ctx.backend()
        )));
    }
    let image = DeviceImage::opencl_c(PROBE, PROBE_SOURCE);
    match ctx.kernel_with(&KernelRequest::new(&image, PROBE)) {
        Ok(_) => Ok(None),
        Err(Error::Build { message, log, .. }) => Ok(Some(format!(
            "the driver refused a program with these instructions ({message}): {}",
            log_excerpt(&log)
        ))),
        Err(Error::Unsupported { reason, .. }) => Ok(Some(reason)),
        Err(e) => Err(e),
    }
}

/// Whether an `Auto` choice takes kpc's inline-PTX kernels on `ctx`: an NVIDIA OpenCL device (PCI
/// vendor 0x10de in its fingerprint, or NVIDIA's platform) whose compiler builds the probe. PTX is
/// NVIDIA's, and a probe the compiler refuses is not kept on disk, so probing every other device
/// would cost each process a failed build, and a sealed context a refused one; an explicit choice
/// ([`require_inline_ptx`]) probes any device, for its typed refusal. A probe that could not be
/// built at all (a sealed context, a lost device) counts as no: `Auto` then takes another kernel.
pub fn auto_takes_inline_ptx(ctx: &Context) -> bool {
    ctx.backend() == BackendKind::OpenCl
        && ctx.device().fingerprint.fields.iter().any(|(k, v)| {
            (k == "vendor_id" && v == NVIDIA_VENDOR_ID)
                || (k == "platform_name" && v.contains("NVIDIA"))
        })
        && matches!(inline_ptx_unfit(ctx), Ok(None))
}

/// NVIDIA's PCI vendor id as the OpenCL device fingerprint writes it.
const NVIDIA_VENDOR_ID: &str = "0x10de";

/// `Ok` where `ctx`'s device runs kpc's inline-PTX kernels; else [`Error::Unsupported`] for
/// `image`, saying what is needed ([`NEEDS`]) and why the device does not provide it.
///
/// Errors: that refusal; [`inline_ptx_unfit`]'s errors.
pub fn require_inline_ptx(ctx: &Context, image: &str) -> Result<()> {
    match inline_ptx_unfit(ctx)? {
        None => Ok(()),
        Some(reason) => Err(Error::Unsupported {
            backend: ctx.backend(),
            image: image.into(),
            needs: NEEDS.into(),
            reason,
        }),
    }
}

/// The first lines of a build log that say something (at most 400 characters): enough to name the
/// refused construct without carrying a whole log into an error message.
fn log_excerpt(log: &str) -> String {
    let text: Vec<&str> = log
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .take(4)
        .collect();
    if text.is_empty() {
        return "(the build log is empty)".into();
    }
    let joined = text.join(" / ");
    match joined.char_indices().nth(400) {
        Some((at, _)) => format!("{}...", &joined[..at]),
        None => joined,
    }
}

#[cfg(test)]
mod tests {
    use super::log_excerpt;

    #[test]
    fn log_excerpts_keep_the_first_lines_and_stay_short() {
        assert_eq!(log_excerpt(""), "(the build log is empty)");
        assert_eq!(
            log_excerpt("\n a.cl:3: error: use of undeclared identifier 'asm'\n\n1 error\nx\ny\n"),
            "a.cl:3: error: use of undeclared identifier 'asm' / 1 error / x / y"
        );
        let long = "é".repeat(1000);
        let e = log_excerpt(&long);
        assert_eq!(e.chars().count(), 403);
        assert!(e.ends_with("..."));
    }
}
