//! `kpc attention --layer mha --check` on each backend, with and without cross-attention: the run
//! passes the float64 reference check of the whole layer, lists the projection kernels with the cache
//! layer that served them, and splits the step time into projections and attention.

// The support code all of the workspace's integration tests share.
use crate::common;

use common::disk::TempDir;
use common::drivers::vulkan_device;

fn mha_check(backend: &str, cross: bool, extra: &[&str]) -> String {
    let cache = TempDir::new(&format!("mha-cli-{backend}"));
    let mut cmd = common::cli::kpc_command();
    cmd.args([
        "attention",
        "--layer",
        "mha",
        "--check",
        "--backend",
        backend,
    ])
    .args(["--heads", "4", "--kv-heads", "2", "--head-dim", "16"])
    .args(["--prompt", "10", "--steps", "3"])
    .env("KPC_CACHE_DIR", cache.path())
    .env("KPC_CACHE_PERSISTENT", "1")
    .env_remove("KPC_DEVICE")
    .env_remove("KPC_CACHE_REMOTE_KEY");
    if cross {
        cmd.args(["--cross", "6"]);
    }
    cmd.args(extra);
    let out = cmd.output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("check:") && text.contains(": ok"), "{text}");
    for kernel in ["mha_gemm", "mha_gemv", "attn_append"] {
        assert!(
            text.lines().any(|l| l.trim_start().starts_with(kernel)),
            "{kernel}: {text}"
        );
    }
    assert!(
        text.contains("self: ") && text.contains("projections"),
        "{text}"
    );
    assert_eq!(text.contains("cross: "), cross, "{text}");
    text
}

/// The bench line's value of `key` (`key=value`).
fn field<'a>(line: &'a str, key: &str) -> &'a str {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(key)?.strip_prefix('='))
        .unwrap_or_else(|| panic!("no {key}= in {line}"))
}

crate::backend_tests! {
    fn mha_layer_checks(backend, test) {
        if crate::common::drivers::device(backend, test).is_some() {
            mha_check(&backend.to_string(), false, &[]);
            mha_check(&backend.to_string(), true, &[]);
        }
    }
}

/// `--prefill-runs N` with `--layer mha`: N timed whole-layer prefills into an emptied cache, the
/// median on a bench line, and the steps after them still continue that prompt (the check passes).
#[test]
fn mha_prefill_runs_report_a_median() {
    if vulkan_device("mha_prefill_runs").is_none() {
        return;
    }
    let backend = "vulkan";
    let text = mha_check(backend, false, &["--prefill-runs", "3"]);
    let line = text
        .lines()
        .find(|l| l.starts_with("bench: phase=mha_prefill"))
        .unwrap_or_else(|| panic!("no prefill bench line: {text}"));
    assert_eq!(field(line, "runs"), "3", "{line}");
    assert_eq!(field(line, "L"), "10", "{line}");
    let ms: f64 = field(line, "device_ms").parse().unwrap();
    let proj: f64 = field(line, "proj_ms").parse().unwrap();
    let attn: f64 = field(line, "attn_ms").parse().unwrap();
    let tflops: f64 = field(line, "tflops").parse().unwrap();
    assert!(ms > 0.0 && tflops > 0.0, "{line}");
    assert!((proj + attn - ms).abs() <= 1e-3 * ms.max(1.0), "{line}");
    // One run (the default) reports the same line with runs=1.
    let one = mha_check(backend, false, &[]);
    assert!(
        one.contains("bench: phase=mha_prefill L=10 runs=1 "),
        "{one}"
    );
}

/// The attention flags reach the layer's SDPA: `--decode-kernel generic` makes its steps decode with
/// `attn_decode` instead of the vectorized kernel, and the check still passes.
#[test]
fn mha_takes_the_attention_options() {
    if vulkan_device("mha_attention_options").is_none() {
        return;
    }
    let kernels = |text: &str| -> Vec<String> {
        text.lines()
            .skip_while(|l| !l.starts_with("kernels"))
            .skip(1)
            .take_while(|l| l.starts_with("  "))
            .filter_map(|l| l.split_whitespace().next().map(str::to_string))
            .collect()
    };
    let default = kernels(&mha_check("vulkan", false, &[]));
    let generic = kernels(&mha_check("vulkan", false, &["--decode-kernel", "generic"]));
    assert!(
        default.iter().any(|k| k == "attn_decode_vec"),
        "{default:?}"
    );
    assert!(generic.iter().any(|k| k == "attn_decode"), "{generic:?}");
    assert!(
        !generic.iter().any(|k| k == "attn_decode_vec"),
        "{generic:?}"
    );
}

/// `--layers N --cross S`: the chained decoder stack passes the reference check, one submission
/// per step, and reports wall and device time and the floor per step.
fn stack_check(backend: &str, activations: &str) {
    let cache = TempDir::new(&format!("mha-stack-cli-{backend}"));
    let out = common::cli::kpc_command()
        .args([
            "attention",
            "--layer",
            "mha",
            "--check",
            "--backend",
            backend,
        ])
        .args(["--heads", "4", "--kv-heads", "2", "--head-dim", "16"])
        .args([
            "--prompt", "6", "--steps", "4", "--layers", "3", "--cross", "5",
        ])
        .args(["--activations", activations, "--kv", activations])
        .env("KPC_CACHE_DIR", cache.path())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("over 6 sublayers") && text.contains(": ok"),
        "{text}"
    );
    let bench = text
        .lines()
        .find(|l| l.starts_with("bench: phase=mha_stack"))
        .unwrap_or_else(|| panic!("{text}"));
    assert_eq!(field(bench, "submissions"), "1", "{bench}");
    assert_eq!(field(bench, "layers"), "3", "{bench}");
    for key in ["wall_us", "device_us", "floor_us", "copy_gbs"] {
        let v: f64 = field(bench, key).parse().unwrap();
        assert!(v > 0.0, "{key}: {bench}");
    }
}

crate::backend_tests! {
    fn mha_stack_checks(backend, test) {
        if crate::common::drivers::device(backend, test).is_some() {
            stack_check(&backend.to_string(), "f16");
            stack_check(&backend.to_string(), "f32");
        }
    }
}
