//! Sealed mode on real drivers (lavapipe and PoCL in CI), through `Context` and the configuration
//! (`KPC_CACHE_SEAL`'s `Config::seal`): a context with warm start seals itself when the warm start
//! has finished and then serves what it loaded from memory and refuses a variant no store holds; a
//! context without warm start is sealed from creation and, under `warn`, builds with one warning.

use crate::common;

use std::path::Path;

use common::disk::{TempDir, capture};
use common::drivers::vulkan_device;
use kpc::BackendKind;
use kpc::DeviceInfo;
use kpc::Source;
use kpc::kernels::{opencl_image, spirv_image};
use kpc::{BuildOptions, SpecConstants, SpecValue};
use kpc::{Config, Context, Error, Kernel, SealMode};

fn config(root: &Path, seal: SealMode, app: Option<&str>) -> Config {
    Config::builder()
        .cache_dir(root)
        .warm_start(app)
        .seal(seal)
        .build()
        .unwrap()
}

fn saxpy(ctx: &Context, bias: i32) -> kpc::Result<Kernel> {
    let image = match ctx.backend() {
        BackendKind::Vulkan => spirv_image("saxpy")?,
        BackendKind::OpenCl => opencl_image("saxpy")?,
    };
    let spec = SpecConstants::new().with(1, SpecValue::I32(bias));
    ctx.kernel_with(&kpc::KernelRequest::new(&image, "saxpy").spec(spec.clone()))
}

/// A first run remembers saxpy (bias 7); a sealed second run (`error`) warms it up, seals itself
/// when the warm start ends, serves it from memory and refuses bias 9 without building.
fn sealed_after_warm_start(d: &DeviceInfo) {
    let dir = TempDir::new("seal-drv");
    {
        let ctx = Context::builder()
            .device(d)
            .config(config(dir.path(), SealMode::Off, Some("seal-drv")))
            .build()
            .unwrap();
        assert_eq!(saxpy(&ctx, 7).unwrap().source(), Source::Built);
        assert_eq!(ctx.seal_mode(), SealMode::Off);
    }
    let ctx = Context::builder()
        .device(d)
        .config(config(dir.path(), SealMode::Error, Some("seal-drv")))
        .build()
        .unwrap();
    let report = ctx.wait_warm_start().unwrap();
    assert_eq!((report.listed, report.loaded), (1, 1), "{report:?}");
    assert_eq!(
        ctx.seal_mode(),
        SealMode::Error,
        "sealed once the warm start ended"
    );
    assert_eq!(saxpy(&ctx, 7).unwrap().source(), Source::Memory);
    let e = saxpy(&ctx, 9).unwrap_err();
    let Error::Sealed { kernel, why } = &e else {
        panic!("expected Error::Sealed, got {e:?}");
    };
    assert!(
        kernel.starts_with("saxpy") && kernel.ends_with(":saxpy"),
        "{kernel}"
    );
    assert_eq!(why, "spec-changed: spec constant 1: 7 → 9");
    let s = ctx.stats();
    assert_eq!(
        (s.seal.mode, s.seal.builds, s.seal.refused),
        (SealMode::Error, 0, 1)
    );
    assert_eq!(
        s.backend_counters.programs_built, 0,
        "nothing built after sealing"
    );
    // An explicit seal with the configured mode, then unsealed: it builds.
    assert_eq!(ctx.seal(), SealMode::Error);
    ctx.seal_with(SealMode::Off);
    assert_eq!(saxpy(&ctx, 9).unwrap().source(), Source::Built);
}

/// Without warm start a `warn` context is sealed from creation: a disk hit is silent, a build logs
/// one line naming the kernel and the spec constant that differs.
fn warn_without_warm_start(d: &DeviceInfo) {
    let dir = TempDir::new("seal-drv-warn");
    {
        let ctx = Context::builder()
            .device(d)
            .config(config(dir.path(), SealMode::Off, None))
            .build()
            .unwrap();
        assert_eq!(saxpy(&ctx, 7).unwrap().source(), Source::Built);
    }
    let ctx = Context::builder()
        .device(d)
        .config(config(dir.path(), SealMode::Warn, None))
        .build()
        .unwrap();
    assert_eq!(ctx.seal_mode(), SealMode::Warn);
    let (sources, events) = capture(|| {
        [
            saxpy(&ctx, 7).unwrap().source(),
            saxpy(&ctx, 11).unwrap().source(),
        ]
    });
    assert_eq!(sources, [Source::Disk, Source::Built]);
    let lines: Vec<&String> = events
        .iter()
        .filter(|e| e.target == "kpc::seal" && e.level == tracing::Level::WARN)
        .filter_map(|e| e.fields.get("message"))
        .collect();
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(
        lines[0].starts_with("sealed context built saxpy")
            && lines[0].ends_with(" ms: spec-changed: spec constant 1: 7 → 11"),
        "{}",
        lines[0]
    );
    let s = ctx.stats().seal;
    assert_eq!((s.builds, s.refused), (1, 0));
}

crate::backend_tests! {
    fn sealed_after_warm_start(backend, test) {
        if let Some(d) = crate::common::drivers::device(backend, test) {
            sealed_after_warm_start(&d);
        }
    }
}

crate::backend_tests! {
    fn sealed_warn_without_warm_start(backend, test) {
        if let Some(d) = crate::common::drivers::device(backend, test) {
            warn_without_warm_start(&d);
        }
    }
}

crate::backend_tests! {
    /// `KPC_CACHE_BUILD_BUDGET` through a context: two builds run unsealed after the (absent)
    /// warm-up, the third finds the configured seal (`error`) in force, and hits still serve.
    fn a_spent_build_budget_seals_the_context(backend, test) {
        let Some(d) = crate::common::drivers::device(backend, test) else {
            return;
        };
        let dir = TempDir::new("seal-budget");
        let config = Config::builder()
            .cache_dir(dir.path())
            .seal(SealMode::Error)
            .build_budget(2)
            .build()
            .unwrap();
        let ctx = Context::builder()
            .device(&d)
            .config(config)
            .build()
            .unwrap();
        assert_eq!(ctx.seal_mode(), SealMode::Off, "the budget counts first");
        assert_eq!(ctx.stats().seal.budget_left, Some(2));
        assert_eq!(saxpy(&ctx, 1).unwrap().source(), Source::Built);
        assert_eq!(saxpy(&ctx, 2).unwrap().source(), Source::Built);
        assert_eq!(ctx.stats().seal.budget_left, Some(0));
        let e = saxpy(&ctx, 3).unwrap_err();
        assert!(matches!(e, Error::Sealed { .. }), "{e:?}");
        assert_eq!(saxpy(&ctx, 1).unwrap().source(), Source::Memory);
        let s = ctx.stats().seal;
        assert_eq!((s.mode, s.refused, s.budget_left), (SealMode::Error, 1, None));
    }
}

const GLSL: &str = "#version 450
layout(local_size_x = 8) in;
layout(std430, binding = 0) buffer O { float o[]; };
void main() { o[gl_GlobalInvocationID.x] = 1.0; }
";

/// A GLSL image's compile to SPIR-V is a build too: refused when sealed (`error`), and under `warn`
/// logged on its own line before the pipeline build's.
#[test]
fn vulkan_sealed_glsl_compile_is_refused_then_warned() {
    let Some(d) = vulkan_device("vulkan_sealed_glsl_compile_is_refused_then_warned") else {
        return;
    };
    let dir = TempDir::new("seal-drv-glsl");
    let ctx = Context::builder()
        .device(&d)
        .config(config(dir.path(), SealMode::Error, None))
        .build()
        .unwrap();
    let img = kpc::DeviceImage::glsl(kpc::admin::glsl::GlslSource::compute(
        "sealed_glsl",
        GLSL.to_string(),
    ))
    .unwrap();
    let (spec, opts) = (SpecConstants::new(), BuildOptions::default());
    let e = ctx
        .kernel_with(
            &kpc::KernelRequest::new(&img, "sealed_glsl")
                .spec(spec.clone())
                .options(opts.clone()),
        )
        .unwrap_err();
    let Error::Sealed { kernel, why } = &e else {
        panic!("expected Error::Sealed, got {e:?}");
    };
    assert_eq!(kernel, "sealed_glsl (GLSL compile)");
    assert!(why.starts_with("new-key: "), "{why}");
    assert_eq!(ctx.stats().spirv.compiles, 0, "nothing compiled");

    ctx.seal_with(SealMode::Warn);
    let (k, events) = capture(|| {
        ctx.kernel_with(
            &kpc::KernelRequest::new(&img, "sealed_glsl")
                .spec(spec.clone())
                .options(opts.clone()),
        )
        .unwrap()
    });
    assert_eq!(k.source(), Source::Built);
    let lines: Vec<&String> = events
        .iter()
        .filter(|e| e.target == "kpc::seal" && e.level == tracing::Level::WARN)
        .filter_map(|e| e.fields.get("message"))
        .collect();
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert!(
        lines[0].starts_with("sealed context built sealed_glsl (GLSL compile) in "),
        "{}",
        lines[0]
    );
    assert!(
        lines[1].starts_with("sealed context built sealed_glsl:sealed_glsl in "),
        "{}",
        lines[1]
    );
    assert_eq!(ctx.stats().seal.builds, 2);
}
