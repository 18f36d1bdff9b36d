//! Miss explanations among thousands of entries: after an edit to an include shared by half of 2 000
//! GLSL variants, every variant that includes it is explained as "image changed" under its own name
//! (the search reads the entries one key part away and the name index, not a bounded walk of the
//! device directory); a cached key is reported as cached; eviction compacts the name index. On
//! lavapipe, the same edit through a context names the SPIR-V and the program misses, and
//! `kpc cache explain --glsl` explains both keys of a shader.

// The support code all of the workspace's integration tests share.
use crate::common;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use common::disk::{TempDir, capture, payload, settings};
use common::drivers::vulkan_device;
use kpc::DeviceImage;
use kpc::TraceFlags;
use kpc::admin::disk::{FieldDiff, MissCause, PersistentCache};
use kpc::admin::glsl::{DirIncludes, GlslOptimization, GlslSource, MapIncludes, SpirvTarget};
use kpc::admin::runtime::spirv_key;
use kpc::{Config, Context};
use kpc::{PutOutcome, StoreKey};
use kpc::{SpecConstants, SpecValue};
use serde_json::Value;

const SHADERS: usize = 100;
const VARIANTS: usize = 20;

/// Shader `i` (even ones include common.glsl, odd ones other.glsl) with define `V=j`.
fn source(i: usize, j: usize, common: &str) -> GlslSource {
    let inc = if i % 2 == 0 {
        "common.glsl"
    } else {
        "other.glsl"
    };
    let text = format!(
        "#version 450\n#include \"{inc}\"\nlayout(local_size_x = 64) in;\nvoid main() {{ float x = K * float(V) + {i}.0; }}\n"
    );
    let includes = MapIncludes::new()
        .with("common.glsl", common)
        .with("other.glsl", "const float K = 7.0;\n");
    GlslSource::compute(&format!("s{i}.comp"), text)
        .entry_point("main_s")
        .define("V", &j.to_string())
        .includes(Arc::new(includes))
}

fn key_of(src: GlslSource) -> StoreKey {
    let image = DeviceImage::glsl(src).unwrap();
    let pre = image.glsl_preprocessed().unwrap().as_ref().unwrap();
    spirv_key(image.glsl_source().unwrap(), pre)
}

fn quick_cache(root: &Path) -> PersistentCache {
    PersistentCache::new(settings(root).sync(false).max_size(0))
}

#[test]
fn an_include_edit_among_2000_entries_is_named_for_every_variant() {
    let t = TempDir::new("explain-many");
    let c = quick_cache(t.path());
    let (v1, v2) = ("const float K = 1.0;\n", "const float K = 2.0;\n");
    for i in 0..SHADERS {
        for j in 0..VARIANTS {
            let k = key_of(source(i, j, v1));
            let out = c.put(&k, &payload((i * VARIANTS + j) as u64, 256), Duration::ZERO);
            assert!(matches!(out, PutOutcome::Published(_)), "{out:?}");
        }
    }
    assert_eq!(c.entries().unwrap().len(), SHADERS * VARIANTS);

    let mut changed = 0;
    for i in 0..SHADERS {
        for j in 0..VARIANTS {
            let k = key_of(source(i, j, v2));
            let why = c.explain_miss(&k);
            assert!(!why.truncated, "{why}");
            if i % 2 == 1 {
                // Not including the edited file: the same key, still cached.
                assert_eq!(why.cause, MissCause::Cached, "s{i} V={j}: {why}");
                continue;
            }
            assert_eq!(why.cause, MissCause::ImageChanged, "s{i} V={j}: {why}");
            let name = format!("s{i}.comp");
            assert!(
                matches!(&why.diffs[..], [FieldDiff::Image { name: n, .. }] if *n == name),
                "s{i} V={j}: {why:?}"
            );
            assert_eq!(
                why.to_string(),
                format!("image digest changed (same name \"{name}\")")
            );
            changed += 1;
        }
    }
    assert_eq!(changed, SHADERS / 2 * VARIANTS);

    // The counters agree: every lookup of an edited variant misses with cause image-changed.
    let fresh = quick_cache(t.path());
    for i in (0..SHADERS).step_by(2) {
        assert!(fresh.get(&key_of(source(i, 3, v2))).is_none());
    }
    let s = fresh.stats();
    assert_eq!((s.misses, s.misses_image_changed), (50, 50), "{s:?}");

    // Other single-field changes among the same 2 000 entries.
    let why = c.explain_miss(&key_of(source(7, VARIANTS + 5, v1)));
    assert_eq!(why.cause, MissCause::SpecChanged, "{why}");
    let why = c.explain_miss(&key_of(source(4, 2, v2).entry_point("other_entry")));
    assert_eq!(why.cause, MissCause::ImageChanged, "{why}");
    assert_eq!(why.diffs.len(), 2, "image and options: {why}");
    let new = GlslSource::compute("brand_new.comp", "#version 450\nvoid main() {}\n")
        .entry_point("main_s");
    let why = c.explain_miss(&key_of(new));
    assert_eq!(
        (why.cause, why.truncated),
        (MissCause::NewKey, false),
        "{why}"
    );
}

#[test]
fn eviction_compacts_the_name_index() {
    let t = TempDir::new("explain-compact");
    let c = quick_cache(t.path());
    let v1 = "const float K = 1.0;\n";
    for i in 0..10 {
        c.put(&key_of(source(i, 0, v1)), b"x", Duration::ZERO);
    }
    let names = t.join("v1/names");
    let index: Vec<_> = std::fs::read_dir(&names).unwrap().collect();
    assert_eq!(index.len(), 1, "one index for the one device directory");
    let index = index[0].as_ref().unwrap().path();
    let lines = || std::fs::read_to_string(&index).unwrap().lines().count();
    assert_eq!(lines(), 10);
    // Evict about half: the index keeps exactly the image directories left.
    let before = c.tracked_size().unwrap();
    let r = c.evict(Some(before / 2), None).unwrap();
    assert!(r.removed >= 4 && r.removed < 10, "{r:?}");
    assert_eq!(lines() as u64, 10 - r.removed);
    for i in 0..10 {
        let k = key_of(source(i, 0, v1));
        let why = c.explain_miss(&k);
        let cached = c.get(&k).is_some();
        assert_eq!(why.cause == MissCause::Cached, cached, "{why}");
    }
    // A cleared cache leaves no index behind.
    c.clear().unwrap();
    assert!(!names.exists());
}

fn trace_config(root: &Path) -> Config {
    Config::builder()
        .persistent(true)
        .cache_dir(root)
        .trace(TraceFlags::DISK)
        .build()
        .unwrap()
}

const SHADER: &str = "#version 450
#extension GL_GOOGLE_include_directive : require
#include \"k.glsl\"
layout(local_size_x = 64) in;
layout(std430, set = 0, binding = 0) buffer Out { float o[]; };
void main() { o[gl_GlobalInvocationID.x] = K; }
";

fn kpc_explain_glsl(root: &Path, shader: &Path, dir: &Path, device: &str) -> Value {
    kpc_explain_glsl_with(root, shader, dir, device, &[])
}

fn kpc_explain_glsl_with(
    root: &Path,
    shader: &Path,
    dir: &Path,
    device: &str,
    extra: &[&str],
) -> Value {
    let o = common::cli::kpc_command()
        .args(["cache", "explain", "--json", "--device", device, "--glsl"])
        .arg(shader)
        .arg("--include-dir")
        .arg(dir)
        .args(extra)
        .env("KPC_CACHE_DIR", root)
        .env_remove("KPC_CACHE_REMOTE")
        .env_remove("KPC_CACHE_READONLY_DIRS")
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{text}");
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {text}"))
}

/// The kernels' (kind, cached, cause of the local store) in `kpc cache explain --json` output.
fn verdicts(v: &Value) -> Vec<(String, bool, String)> {
    v["kernels"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| {
            (
                k["kind"].as_str().unwrap().to_owned(),
                k["cached"].as_bool().unwrap(),
                k["stores"][0]["cause"].as_str().unwrap_or("").to_owned(),
            )
        })
        .collect()
}

#[test]
fn vulkan_include_edit_is_named_for_spirv_and_program_and_by_the_cli() {
    let Some(d) =
        vulkan_device("vulkan_include_edit_is_named_for_spirv_and_program_and_by_the_cli")
    else {
        return;
    };
    let t = TempDir::new("explain-glsl");
    let root = t.join("cache");
    // 2 000 entries of other GLSL shaders around it.
    let c = quick_cache(&root);
    for i in 0..SHADERS {
        for j in 0..VARIANTS {
            c.put(
                &key_of(source(i, j, "const float K = 1.0;\n")),
                b"x",
                Duration::ZERO,
            );
        }
    }
    let inc = t.join("include");
    std::fs::create_dir_all(&inc).unwrap();
    std::fs::write(inc.join("k.glsl"), "const float K = 1.0;\n").unwrap();
    let shader = t.join("fill.comp");
    std::fs::write(&shader, SHADER).unwrap();
    let image = || {
        DeviceImage::glsl(
            GlslSource::compute("fill.comp", SHADER)
                .entry_point("fill")
                .includes(Arc::new(DirIncludes::new(&inc))),
        )
        .unwrap()
    };
    let acquire = || {
        let ctx = Context::builder()
            .device(&d)
            .config(trace_config(&root))
            .build()
            .unwrap();
        let (r, ev) = capture(|| ctx.kernel(&image(), "fill"));
        r.unwrap();
        let whys: Vec<String> = ev
            .iter()
            .filter(|e| e.target == "kpc::cache::disk")
            .filter(|e| e.fields.get("message").is_some_and(|m| m == "miss"))
            .filter_map(|e| e.fields.get("why").cloned())
            .collect();
        (whys, ctx.stats().disk.unwrap())
    };
    let sel = format!("vulkan:{}", d.index);
    let (whys, _) = acquire();
    assert_eq!(whys, ["nothing similar cached", "nothing similar cached"]);
    let v = kpc_explain_glsl(&root, &shader, &inc, &sel);
    assert_eq!(
        verdicts(&v),
        [
            ("spirv".into(), true, String::new()),
            ("program".into(), true, String::new())
        ],
        "{v}"
    );

    // Edit the include: the SPIR-V and the program it compiles to both change, and both misses name
    // the image under its name, among the 2 000 others.
    std::fs::write(inc.join("k.glsl"), "const float K = 2.0;\n").unwrap();
    let v = kpc_explain_glsl(&root, &shader, &inc, &sel);
    assert_eq!(
        verdicts(&v),
        [
            ("spirv".into(), false, "image-changed".into()),
            ("program".into(), false, "image-changed".into())
        ],
        "{v}"
    );
    let (whys, s) = acquire();
    assert_eq!(
        whys,
        [
            "image digest changed (same name \"fill.comp\")",
            "image digest changed (same name \"fill.comp\")"
        ]
    );
    assert_eq!((s.misses, s.misses_image_changed), (2, 2), "{s:?}");
}

/// [`SHADER`] with a specialization constant, as an engine's shaders have.
const SPEC_SHADER: &str = "#version 450
#extension GL_GOOGLE_include_directive : require
#include \"k.glsl\"
layout(local_size_x = 64) in;
layout(constant_id = 0) const uint N = 1;
layout(std430, set = 0, binding = 0) buffer Out { float o[]; };
void main() { o[gl_GlobalInvocationID.x] = K * float(N); }
";

/// An engine's real keys (ggml builds vulkan1.2 with optimization and spec constants):
/// `kpc cache explain --glsl` describes them with `--target-env`, `--optimize`, `--spec` and
/// `--build-options`, and without those flags explains why the default keys are not cached.
#[test]
fn vulkan_explain_glsl_takes_an_engines_target_optimization_and_spec() {
    let test = "vulkan_explain_glsl_takes_an_engines_target_optimization_and_spec";
    let Some(d) = vulkan_device(test) else {
        return;
    };
    let t = TempDir::new("explain-glsl-flags");
    let root = t.join("cache");
    let inc = t.join("include");
    std::fs::create_dir_all(&inc).unwrap();
    std::fs::write(inc.join("k.glsl"), "const float K = 1.0;\n").unwrap();
    let shader = t.join("fill.comp");
    std::fs::write(&shader, SPEC_SHADER).unwrap();
    let image = DeviceImage::glsl(
        GlslSource::compute("fill.comp", SPEC_SHADER)
            .entry_point("fill")
            .target(SpirvTarget::Vulkan1_2)
            .optimization(GlslOptimization::Performance)
            .includes(Arc::new(DirIncludes::new(&inc))),
    )
    .unwrap();
    let spec = SpecConstants::new().with(0, SpecValue::U32(128));
    let ctx = Context::builder()
        .device(&d)
        .config(trace_config(&root))
        .build()
        .unwrap();
    ctx.kernel_with(&kpc::KernelRequest::new(&image, "fill").spec(spec.clone()))
        .unwrap();
    drop(ctx);
    let sel = format!("vulkan:{}", d.index);
    let flags = [
        "--target-env",
        "vulkan1.2",
        "--optimize",
        "performance",
        "--spec",
        "0=u32:128",
    ];
    let v = kpc_explain_glsl_with(&root, &shader, &inc, &sel, &flags);
    assert_eq!(
        verdicts(&v),
        [
            ("spirv".into(), true, String::new()),
            ("program".into(), true, String::new())
        ],
        "{v}"
    );
    // The defaults (vulkan1.1, no optimization, no spec constants) are other keys.
    let v = kpc_explain_glsl(&root, &shader, &inc, &sel);
    let cached: Vec<bool> = verdicts(&v).iter().map(|k| k.1).collect();
    assert_eq!(cached, [false, false], "{v}");
    // Another spec constant value: the SPIR-V is cached, the program is not.
    let mut other = flags.to_vec();
    other[5] = "0=u32:64";
    let v = kpc_explain_glsl_with(&root, &shader, &inc, &sel, &other);
    let cached: Vec<bool> = verdicts(&v).iter().map(|k| k.1).collect();
    assert_eq!(cached, [true, false], "{v}");
    // `kpc cache ls` keeps its columns aligned around the long GLSL options of the SPIR-V entry.
    let o = common::cli::kpc_command()
        .args(["cache", "ls"])
        .env("KPC_CACHE_DIR", &root)
        .output()
        .unwrap();
    let ls = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{ls}");
    let mut lines = ls.lines();
    let header = lines.next().unwrap();
    let at = header.find("LAST ACCESS").unwrap();
    let rows: Vec<&str> = lines.filter(|l| !l.ends_with("entries")).collect();
    assert_eq!(rows.len(), 2, "{ls}");
    for row in &rows {
        let chars: Vec<char> = row.chars().collect();
        assert!(
            chars[at - 2..at] == [' ', ' '] && chars[at].is_ascii_digit(),
            "column LAST ACCESS at {at} is not where this row has it:\n{ls}"
        );
    }
    // A malformed --spec is refused by name.
    let o = common::cli::kpc_command()
        .args(["cache", "explain", "--glsl"])
        .arg(&shader)
        .args(["--spec", "0=u33:1"])
        .env("KPC_CACHE_DIR", &root)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("unknown type"), "{err}");
}
