//! GLSL images on lavapipe: compiled to SPIR-V at run time through shaderc, the SPIR-V cached in
//! memory and in the stores in front of the program cache.

// The support code all of the workspace's integration tests share.
use crate::common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use kpc::DeviceImage;
use kpc::Source;
use kpc::admin::glsl::{DirIncludes, GlslSource};
use kpc::kernels::{SPIRV, glsl_image};
use kpc::{Config, Context, Error, PushConstants};

use common::drivers::{check_read_kernel, random_f32, vulkan_context, vulkan_device};

const CHILD: &str = "KPC_TEST_GLSL_CHILD";

/// out[i] = x[i] * SCALE + OFFSET, SCALE a define, OFFSET from the included "offset.glsl".
const SCALED: &str = "#version 450
#extension GL_GOOGLE_include_directive : require
#include \"offset.glsl\"
layout(local_size_x = 64) in;
layout(std430, set = 0, binding = 0) readonly buffer X { float x[]; };
layout(std430, set = 0, binding = 1) writeonly buffer Out { float o[]; };
layout(push_constant) uniform P { uint n; } p;
void main() {
    uint i = gl_GlobalInvocationID.x;
    if (i < p.n) { o[i] = x[i] * float(SCALE) + OFFSET; }
}
";

/// out[i] = x[i] + 1, no define, no include.
const PLUS_ONE: &str = "#version 450
layout(local_size_x = 64) in;
layout(std430, set = 0, binding = 0) readonly buffer X { float x[]; };
layout(std430, set = 0, binding = 1) writeonly buffer Out { float o[]; };
layout(push_constant) uniform P { uint n; } p;
void main() {
    uint i = gl_GlobalInvocationID.x;
    if (i < p.n) { o[i] = x[i] + 1.0; }
}
";

fn temp_dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("kpc-glsl-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn includes_with_offset(dir: &Path, offset: &str) -> Arc<DirIncludes> {
    std::fs::write(
        dir.join("offset.glsl"),
        format!("const float OFFSET = {offset};\n"),
    )
    .unwrap();
    Arc::new(DirIncludes::new(dir))
}

fn scaled(scale: &str, includes: Arc<DirIncludes>) -> DeviceImage {
    DeviceImage::glsl(
        GlslSource::compute("scaled", SCALED)
            .define("SCALE", scale)
            .includes(includes),
    )
    .unwrap()
}

fn plus_one() -> DeviceImage {
    DeviceImage::glsl(GlslSource::compute("plus_one", PLUS_ONE)).unwrap()
}

fn disk_context(root: &Path) -> Context {
    let config = Config::builder()
        .persistent(true)
        .cache_dir(root)
        .build()
        .unwrap();
    let d = vulkan_device("glsl disk context").expect("checked by the caller");
    Context::builder()
        .device(&d)
        .config(config.clone())
        .build()
        .unwrap()
}

/// Runs a two-buffer kernel of `image` on 1000 random floats and checks `f`.
fn run_and_check(ctx: &Context, image: &DeviceImage, f: impl Fn(f32) -> f32) -> kpc::Kernel {
    let k = ctx.kernel(image, image.name()).unwrap();
    let n = 1000;
    let x = random_f32(n);
    let bx = ctx.buffer_from(&x).unwrap();
    let out = ctx.buffer_from(&vec![f32::NAN; n]).unwrap();
    ctx.queue()
        .launch(
            &k,
            k.groups_for([n as u64, 1, 1]).unwrap(),
            &[&bx, &out],
            PushConstants::new().u32(n as u32).as_bytes(),
        )
        .unwrap()
        .wait()
        .unwrap();
    let out = out.read().unwrap();
    for i in 0..n {
        let want = f(x[i]);
        assert!(
            (out[i] - want).abs() <= 1e-5 * (1.0 + want.abs()),
            "{}: out[{i}] = {}, want {want}",
            image.name(),
            out[i]
        );
    }
    k
}

#[test]
fn a_glsl_kernel_with_a_define_runs_correctly() {
    let Some(ctx) = vulkan_context("a_glsl_kernel_with_a_define_runs_correctly") else {
        return;
    };
    let dir = temp_dir("define");
    let inc = includes_with_offset(&dir, "0.25");
    let k = run_and_check(&ctx, &scaled("3", inc.clone()), |x| x * 3.0 + 0.25);
    assert_eq!(k.spirv_step().unwrap().source, Source::Built);
    let k = run_and_check(&ctx, &scaled("-2", inc), |x| x * -2.0 + 0.25);
    assert_eq!(k.spirv_step().unwrap().source, Source::Built);
    assert_eq!(ctx.stats().spirv.compiles, 2);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_changed_define_or_include_misses_only_its_own_entries() {
    if vulkan_device("a_changed_define_or_include_misses_only_its_own_entries").is_none() {
        return;
    }
    let root = temp_dir("miss-root");
    let dir = temp_dir("miss-inc");
    let inc = includes_with_offset(&dir, "1.0");
    {
        let ctx = disk_context(&root);
        run_and_check(&ctx, &scaled("2", inc.clone()), |x| x * 2.0 + 1.0);
        run_and_check(&ctx, &plus_one(), |x| x + 1.0);
        let s = ctx.stats().spirv;
        assert_eq!((s.compiles, s.store_hits), (2, 0), "{s:?}");
    }
    // A new context (empty memory) with the same disk: one define changed.
    {
        let ctx = disk_context(&root);
        let k = run_and_check(&ctx, &scaled("5", inc.clone()), |x| x * 5.0 + 1.0);
        assert_eq!(k.spirv_step().unwrap().source, Source::Built);
        let k = run_and_check(&ctx, &scaled("2", inc.clone()), |x| x * 2.0 + 1.0);
        assert_eq!(k.spirv_step().unwrap().source, Source::Disk);
        assert_eq!(k.source(), Source::Disk, "the program too");
        let k = run_and_check(&ctx, &plus_one(), |x| x + 1.0);
        assert_eq!(k.spirv_step().unwrap().source, Source::Disk);
        let s = ctx.stats().spirv;
        assert_eq!((s.compiles, s.store_hits), (1, 2), "{s:?}");
    }
    // The included file changed: only the images that include it miss.
    let inc = includes_with_offset(&dir, "-4.0");
    {
        let ctx = disk_context(&root);
        let k = run_and_check(&ctx, &scaled("2", inc.clone()), |x| x * 2.0 - 4.0);
        assert_eq!(k.spirv_step().unwrap().source, Source::Built);
        let k = run_and_check(&ctx, &plus_one(), |x| x + 1.0);
        assert_eq!(k.spirv_step().unwrap().source, Source::Disk);
        let s = ctx.stats().spirv;
        assert_eq!((s.compiles, s.store_hits), (1, 1), "{s:?}");
    }
    let _ = std::fs::remove_dir_all(&root);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_compile_error_carries_its_line_and_is_cached() {
    let Some(ctx) = vulkan_context("a_compile_error_carries_its_line_and_is_cached") else {
        return;
    };
    // `y` is undeclared on line 5.
    let bad = "#version 450\nlayout(local_size_x = 1) in;\nvoid main() {\n    int x = 1;\n    x = y;\n}\n";
    let image = || DeviceImage::glsl(GlslSource::compute("broken", bad)).unwrap();
    let err = ctx.kernel(&image(), "broken").unwrap_err();
    let Error::GlslCompile {
        image: name,
        message,
    } = &err
    else {
        panic!("expected a GLSL compile error, got {err:?}");
    };
    assert_eq!(name, "broken");
    assert!(message.contains("broken:5:"), "no line 5 in: {message}");
    assert!(message.contains("'y'"), "{message}");
    assert_eq!(ctx.stats().spirv.compiles, 1);
    // A new image of the same source: the cached failure, no second compile.
    let again = ctx.kernel(&image(), "broken").unwrap_err();
    assert_eq!(again.to_string(), err.to_string());
    let s = ctx.stats().spirv;
    assert_eq!((s.compiles, s.compile_errors), (1, 1), "{s:?}");

    // An include without a resolver is a compile error that says so, at its line.
    let inc = "#version 450\n#extension GL_GOOGLE_include_directive : require\n#include \"x.glsl\"\nlayout(local_size_x = 1) in;\nvoid main() {}\n";
    let err = ctx
        .kernel(
            &DeviceImage::glsl(GlslSource::compute("needs_x", inc)).unwrap(),
            "needs_x",
        )
        .unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("needs_x:3:") && msg.contains("no include resolver"),
        "{msg}"
    );
    // A define that is not an identifier is refused before anything compiles.
    let bad = DeviceImage::glsl(GlslSource::compute("d", PLUS_ONE).define("2X", "1")).unwrap_err();
    assert!(matches!(bad, Error::InvalidArgument(_)), "{bad:?}");
}

#[test]
fn child_acquires_a_glsl_kernel() {
    // Does something only as a child of the fresh-process test below.
    let Some(root) = std::env::var_os(CHILD) else {
        return;
    };
    let ctx = disk_context(Path::new(&root));
    let k = run_and_check(&ctx, &plus_one(), |x| x + 1.0);
    let s = ctx.stats().backend_counters;
    println!(
        "KPCGLSL spirv={} program={} compiles={} built={}",
        k.spirv_step().unwrap().source,
        k.source(),
        ctx.stats().spirv.compiles,
        s.programs_built
    );
}

fn child(root: &Path) -> String {
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            &common::disk::test_path("child_acquires_a_glsl_kernel"),
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD, root)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    text.lines()
        .find_map(|l| l.split_once("KPCGLSL ").map(|(_, r)| r.to_owned()))
        .unwrap_or_else(|| panic!("no result line:\n{text}"))
}

#[test]
fn a_fresh_process_hits_the_spirv_cache_and_the_program_cache() {
    if vulkan_device("a_fresh_process_hits_the_spirv_cache_and_the_program_cache").is_none() {
        return;
    }
    let root = temp_dir("process");
    assert_eq!(child(&root), "spirv=built program=built compiles=1 built=1");
    assert_eq!(child(&root), "spirv=disk program=disk compiles=0 built=0");
    let _ = std::fs::remove_dir_all(&root);
}

#[test]
fn shipped_glsl_compiles_to_valid_spirv_that_computes_the_same() {
    let Some(ctx) = vulkan_context("shipped_glsl_compiles_to_valid_spirv_that_computes_the_same")
    else {
        return;
    };
    let mut compiled = 0;
    // kpc's kernels and the attention workload's.
    let shipped = SPIRV.iter().chain(kpc_attention::kernels::SPIRV);
    for k in shipped.filter(|k| !k.cooperative_matrix) {
        let image = k.glsl_image().unwrap();
        // Building validates (spirv-tools) and reflects; the entry point is named as committed.
        let kernel = ctx
            .kernel(&image, k.name)
            .unwrap_or_else(|e| panic!("{}: {e}", k.name));
        assert_eq!(kernel.name(), k.name);
        let committed = ctx.kernel(&k.image().unwrap(), k.name).unwrap();
        assert_eq!(
            kernel.info().local_size,
            committed.info().local_size,
            "{}",
            k.name
        );
        assert_eq!(
            kernel.info().buffers,
            committed.info().buffers,
            "{}",
            k.name
        );
        assert_eq!(
            kernel.info().push_constant_bytes,
            committed.info().push_constant_bytes,
            "{}",
            k.name
        );
        compiled += 1;
    }
    assert_eq!(ctx.stats().spirv.compiles, compiled);
    // The read kernel from GLSL computes what the committed one does (the checker's own invariants).
    check_read_kernel(&ctx, &glsl_image("read").unwrap());
    assert!(kpc_attention::kernels::glsl_image("attn_prefill_coop").is_err());
}

#[test]
fn kpc_attention_from_source_checks_and_then_serves_every_step_from_disk() {
    if vulkan_device("kpc_attention_from_source_checks_and_then_serves_every_step_from_disk")
        .is_none()
    {
        return;
    }
    let root = temp_dir("cli");
    let run = || {
        let out = common::cli::kpc_command()
            .args([
                "attention",
                "--backend",
                "vulkan",
                "--from-source",
                "--check",
            ])
            .args([
                "--prompt",
                "64",
                "--steps",
                "4",
                "--heads",
                "4",
                "--kv-heads",
                "2",
            ])
            .env("KPC_CACHE_DIR", &root)
            .env("KPC_CACHE_PERSISTENT", "1")
            .env_remove("KPC_DEVICE")
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        assert!(
            out.status.success(),
            "{text}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        text
    };
    let first = run();
    let spirv = |t: &str| -> Vec<String> {
        t.lines()
            .filter_map(|l| l.trim().strip_prefix("spirv: "))
            .map(|s| s.split(' ').next().unwrap().to_owned())
            .collect()
    };
    let s1 = spirv(&first);
    // Prefill and decode from GLSL (the copy kernel that measures bandwidth keeps its committed SPIR-V).
    assert!(
        s1.iter().filter(|s| *s == "compiled").count() >= 2,
        "{first}"
    );
    assert!(
        s1.iter().all(|s| s == "compiled" || s == "committed"),
        "{first}"
    );
    let second = run();
    let s2 = spirv(&second);
    assert_eq!(s1.len(), s2.len(), "{second}");
    assert!(
        s2.iter().all(|s| s == "disk" || s == "committed"),
        "{second}"
    );
    assert!(
        !second.contains(" built "),
        "every program from disk:\n{second}"
    );
    let _ = std::fs::remove_dir_all(&root);
}
