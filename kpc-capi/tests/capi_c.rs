//! The C API tested from C: programs in tests/c/ are compiled with the system's `cc` against
//! include/kpc.h and the cdylib cargo built for this test run, and run as child processes on the real
//! drivers (lavapipe, PoCL). Each program prints what it does and exits non-zero on a failed check;
//! this harness asserts on exit codes and output.
//!
//! A missing `cc` or driver is a skip (a failure under `KPC_TEST_REQUIRE_DRIVERS=1`, hence in CI).

// The support code all of the workspace's integration tests share.
use crate::common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::disk::TempDir;
use common::drivers;

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The directory holding this test's executable: `target/<profile>/deps`, where `cargo build -p
/// kpc-capi` of the same profile writes the C library (`libkpc.so`, `libkpc.a`). `cargo test` itself
/// builds no cdylib (tests link only rlibs), so scripts/test.sh builds it first.
fn deps_dir() -> PathBuf {
    std::env::current_exe()
        .expect("the test executable's path")
        .parent()
        .expect("its directory")
        .to_path_buf()
}

/// The cdylib built for this run, checked to be from the same rustc invocation as the staticlib
/// (both are written together; an older `.so` means the crate type was dropped and a stale library
/// would be tested).
fn cdylib() -> PathBuf {
    let dir = deps_dir();
    let so = dir.join("libkpc.so");
    let rlib = dir.join("libkpc.a");
    let mtime = |p: &Path| {
        std::fs::metadata(p)
            .and_then(|m| m.modified())
            .unwrap_or_else(|e| {
                panic!(
                    "{}: {e}; build the C library first with `cargo build --release -p kpc-capi` \
                     (scripts/test.sh does), and keep crate-type cdylib and staticlib in \
                     kpc-capi/Cargo.toml",
                    p.display()
                )
            })
    };
    let (so_t, rlib_t) = (mtime(&so), mtime(&rlib));
    let lag = rlib_t.duration_since(so_t).unwrap_or_default();
    assert!(
        lag.as_secs() < 120,
        "{} is {lag:?} older than {}: not built with it",
        so.display(),
        rlib.display()
    );
    so
}

/// `Some` when `cc` runs; a reported skip (a failure in CI) otherwise. Checked before the driver, so
/// that a skipped test is not also logged as run.
fn cc_available(backend: &str, test: &str) -> Option<()> {
    match Command::new("cc").arg("--version").output() {
        Ok(o) if o.status.success() => Some(()),
        Ok(o) => drivers::skip(
            backend,
            test,
            &format!(
                "cc --version failed: {}",
                String::from_utf8_lossy(&o.stderr)
            ),
        ),
        Err(e) => drivers::skip(backend, test, &format!("no C compiler `cc`: {e}")),
    }
}

/// Compiles tests/c/`name`.c against include/kpc.h and the cdylib, plus `libs` (`-lvulkan`, ...),
/// into `out`.
fn compile(name: &str, libs: &[&str], out: &Path) -> PathBuf {
    let so = cdylib();
    let exe = out.join(name);
    let src = repo().join("tests/c").join(format!("{name}.c"));
    let output = Command::new("cc")
        .args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-g"])
        // `VkFooInfo x = {VK_STRUCTURE_TYPE_FOO}` (the rest zeroed) is the Vulkan C idiom.
        .arg("-Wno-missing-field-initializers")
        .arg("-I")
        .arg(repo().join("include"))
        .arg(&src)
        .arg("-o")
        .arg(&exe)
        .arg(format!("-L{}", so.parent().unwrap().display()))
        .arg(format!("-Wl,-rpath,{}", so.parent().unwrap().display()))
        .arg("-lkpc")
        .args(libs)
        .output()
        .expect("run cc");
    assert!(
        output.status.success(),
        "cc {} failed:\n{}",
        src.display(),
        String::from_utf8_lossy(&output.stderr)
    );
    exe
}

/// Runs `exe` with `args` and the extra environment `env` (everything `KPC_*` of this process is
/// removed first, so the program sees only what the test sets). Returns its stdout; panics with
/// both streams when it fails.
fn run(exe: &Path, args: &[&str], env: &[(&str, &Path)]) -> String {
    run_both(exe, args, env).0
}

/// [`run`], returning stdout and stderr.
fn run_both(exe: &Path, args: &[&str], env: &[(&str, &Path)]) -> (String, String) {
    let mut cmd = Command::new(exe);
    cmd.args(args);
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("KPC_") {
            cmd.env_remove(k);
        }
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    // cargo runs tests with LD_LIBRARY_PATH naming target/<profile>, whose libkpc.so only
    // `cargo build` refreshes; it would win over the program's RUNPATH. Put this run's first.
    let mut paths = vec![deps_dir()];
    paths.extend(
        std::env::var_os("LD_LIBRARY_PATH")
            .map_or_else(Vec::new, |p| std::env::split_paths(&p).collect::<Vec<_>>()),
    );
    cmd.env("LD_LIBRARY_PATH", std::env::join_paths(paths).unwrap());
    let o = cmd.output().expect("run the C program");
    let stdout = String::from_utf8_lossy(&o.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&o.stderr);
    println!("--- {} {}\n{stdout}{stderr}", exe.display(), args.join(" "));
    assert!(
        o.status.success(),
        "{} exited with {}:\n{stdout}\n{stderr}",
        exe.display(),
        o.status
    );
    (stdout, stderr.into_owned())
}

fn kernel_file(name: &str) -> String {
    repo().join("../kernels").join(name).display().to_string()
}

/// e: NULL and garbage into every entry point: error codes and messages, never a crash.
#[test]
fn c_bad_arguments() {
    let test = "c_bad_arguments";
    let Some(()) = cc_available("vulkan", test) else {
        return;
    };
    let Some(dev) = drivers::vulkan_device(test) else {
        return;
    };
    let dir = TempDir::new("capi-bad");
    let exe = compile("bad_args", &[], dir.path());
    let selector = format!("vulkan:{}", dev.index);
    let out = run(
        &exe,
        &[
            &selector,
            &kernel_file("saxpy.spv"),
            &kernel_file("saxpy.cl"),
        ],
        &[],
    );
    assert!(
        out.contains("saxpy: first from built, second from memory"),
        "{out}"
    );
    for status in [
        "KPC_STATUS_INVALID_ARGUMENT",
        "KPC_STATUS_CONFIG",
        "KPC_STATUS_NO_SUCH_DEVICE",
        "KPC_STATUS_BUFFER_TOO_SMALL",
        "KPC_STATUS_INVALID_SPIRV",
        "KPC_STATUS_UNKNOWN_KERNEL",
    ] {
        assert!(
            out.contains(&format!("ok {status}")),
            "no {status} check ran:\n{out}"
        );
    }
    // The messages say what was wrong.
    for msg in [
        "is not a live kpc_context",
        "is a kpc_config, not a kpc_context",
        "is NULL",
        "not valid UTF-8",
        "expected 0 or 1",
        "repeats id 1",
        "not aligned",
    ] {
        assert!(out.contains(msg), "no message with {msg:?}:\n{out}");
    }
    let checks: usize = out
        .lines()
        .find_map(|l| {
            l.strip_prefix("bad_args: ")?
                .strip_suffix(" checks passed")?
                .parse()
                .ok()
        })
        .expect("the summary line");
    assert!(checks > 100, "{checks} checks");
}

/// a, c, d on one backend: `exe` runs as the embedder three times, each a new process: `build` on
/// an empty cache directory (the kernel is compiled, and the program records its own dispatch),
/// `disk` on the same directory (the kernel comes from disk; the program saves its cache blob),
/// and `blob` on a fresh, empty directory (the kernel comes from the blob with no build).
fn build_disk_blob(exe: &Path, index: usize, kernel: &str, dir: &TempDir) -> [String; 3] {
    let cache = dir.join("cache");
    let fresh = dir.join("fresh-cache");
    let blob = dir.join("saxpy.blob").display().to_string();
    let index = index.to_string();
    let kernel = kernel_file(kernel);
    let args = |mode| [mode, index.as_str(), kernel.as_str(), blob.as_str()];
    let build = run(exe, &args("build"), &[("KPC_CACHE_DIR", &cache)]);
    let disk = run(exe, &args("disk"), &[("KPC_CACHE_DIR", &cache)]);
    // d: a cache directory with nothing in it; the blob file is all the program has.
    std::fs::create_dir_all(&fresh).unwrap();
    let from_blob = run(exe, &args("blob"), &[("KPC_CACHE_DIR", &fresh)]);
    let entries = walk_files(&fresh);
    assert!(
        entries.is_empty(),
        "a kernel made from a blob wrote to the disk cache: {entries:?}"
    );
    [build, disk, from_blob]
}

fn walk_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                out.extend(walk_files(&p));
            } else {
                out.push(p);
            }
        }
    }
    out
}

fn assert_runs(out: &[String; 3], mode_lines: [&str; 3], checked: &str) {
    for ((o, source), mode) in out.iter().zip(mode_lines).zip(["build", "disk", "blob"]) {
        assert!(o.contains(source), "{mode}: no {source:?} in:\n{o}");
        assert!(o.contains(checked), "{mode}: output not checked:\n{o}");
        assert!(o.contains(": passed ("), "{mode}: no summary:\n{o}");
    }
    assert!(out[1].contains("saved the cache blob"), "{}", out[1]);
    assert!(
        out[2].contains("stats: programs built 0, loaded 1"),
        "the blob run built something:\n{}",
        out[2]
    );
}

/// a (+ c, d): the C program owns its VkInstance and VkDevice on lavapipe, records and submits its
/// own command buffer with kpc's saxpy pipeline.
#[test]
fn c_vulkan_embedder() {
    let test = "c_vulkan_embedder";
    let Some(()) = cc_available("vulkan", test) else {
        return;
    };
    let Some(dev) = drivers::vulkan_device(test) else {
        return;
    };
    let dir = TempDir::new("capi-vk");
    let exe = compile("vulkan_interop", &["-lvulkan"], dir.path());
    let out = build_disk_blob(&exe, dev.index, "saxpy.spv", &dir);
    assert_runs(
        &out,
        ["saxpy from built", "saxpy from disk", "saxpy from blob"],
        "own command buffer: saxpy of 1000 elements checked",
    );
    assert!(out[0].contains("raw handles: pipeline 0x"), "{}", out[0]);
    for o in &out {
        assert!(o.contains("ok KPC_STATUS_WRONG_BACKEND"), "{o}");
    }
    assert!(out[2].contains("ok KPC_STATUS_BLOB_MISMATCH"), "{}", out[2]);
    assert!(out[2].contains("ok KPC_STATUS_CORRUPT_BLOB"), "{}", out[2]);
}

/// The same embedder with saxpy as GLSL (kernels/saxpy.comp through `kpc_image_from_glsl`): the
/// first process compiles it and builds the pipeline, the second finds both on disk.
#[test]
fn c_vulkan_embedder_glsl() {
    let test = "c_vulkan_embedder_glsl";
    let Some(()) = cc_available("vulkan", test) else {
        return;
    };
    let Some(dev) = drivers::vulkan_device(test) else {
        return;
    };
    let dir = TempDir::new("capi-glsl");
    let exe = compile("vulkan_interop", &["-lvulkan"], dir.path());
    let cache = dir.join("cache");
    let blob = dir.join("saxpy.blob").display().to_string();
    let index = dev.index.to_string();
    let kernel = kernel_file("saxpy.comp");
    let args = |mode| [mode, index.as_str(), kernel.as_str(), blob.as_str()];
    let build = run(&exe, &args("build"), &[("KPC_CACHE_DIR", &cache)]);
    let disk = run(&exe, &args("disk"), &[("KPC_CACHE_DIR", &cache)]);
    for (o, source) in [(&build, "saxpy from built"), (&disk, "saxpy from disk")] {
        assert!(o.contains(source), "no {source:?} in:\n{o}");
        assert!(
            o.contains("own command buffer: saxpy of 1000 elements checked"),
            "{o}"
        );
        assert!(o.contains("ok KPC_STATUS_GLSL_COMPILE"), "{o}");
        assert!(o.contains(": passed ("), "{o}");
    }
}

/// b (+ c, d): the C program owns its cl_context and queue on PoCL and enqueues kpc's saxpy through
/// a cl_kernel lease.
#[test]
fn c_opencl_embedder() {
    let test = "c_opencl_embedder";
    let Some(()) = cc_available("opencl", test) else {
        return;
    };
    let Some(dev) = drivers::opencl_device(test) else {
        return;
    };
    let dir = TempDir::new("capi-cl");
    let exe = compile("opencl_interop", &["-lOpenCL"], dir.path());
    let out = build_disk_blob(&exe, dev.index, "saxpy.cl", &dir);
    assert_runs(
        &out,
        ["saxpy from built", "saxpy from disk", "saxpy from blob"],
        "own queue: saxpy of 1000 elements checked",
    );
    assert!(out[0].contains("leased cl_kernel"), "{}", out[0]);
    assert!(out[2].contains("ok KPC_STATUS_BLOB_MISMATCH"), "{}", out[2]);
}

/// The MultiHeadAttention layer from C on each backend: a prompt's prefill, decode steps and
/// cross-attention steps checked against float64 reference values written here, the cache in both
/// ncnn layouts, status codes for wrong sizes and call orders.
fn mha_from_c(backend: &str, selector: String, test: &str) {
    use kpc_attention::KvDtype;
    use kpc_attention::mha::reference::{RefCall, multi_head_attention};
    use kpc_attention::mha::{MhaKind, MhaParams, MhaWeights};
    let (e, h, hkv, prompt, steps, s) = (32usize, 4usize, 2usize, 5usize, 3usize, 6usize);
    let total = prompt + steps;
    let p = MhaParams {
        num_kv_heads: hkv,
        capacity: total,
        weight_dtype: KvDtype::F16,
        cache_dtype: KvDtype::F16,
        ..MhaParams::new(e, h)
    };
    let kv = hkv * e / h;
    let wn = 2 * e * e + 2 * e + 2 * (kv * e + kv);
    let weights =
        |scale: f32| -> Vec<f32> { drivers::random_f32(wn).iter().map(|x| x * scale).collect() };
    let (self_w, cross_w) = (weights(0.3), weights(0.3));
    let x = drivers::random_f32(total * e);
    let memory = drivers::random_f32(s * e);
    let self_ref = multi_head_attention(
        &p,
        &MhaWeights::from_ncnn(&self_w, &p).unwrap(),
        &RefCall {
            q_in: &x,
            k_in: &x,
            v_in: &x,
            q_len: total,
            kv_len: total,
            mask: None,
            causal: true,
        },
    )
    .unwrap();
    let pc = MhaParams {
        kind: MhaKind::CrossAttention,
        capacity: s,
        ..p
    };
    let q = &x[prompt * e..];
    let cross_ref = multi_head_attention(
        &pc,
        &MhaWeights::from_ncnn(&cross_w, &pc).unwrap(),
        &RefCall {
            q_in: q,
            k_in: &memory,
            v_in: &memory,
            q_len: steps,
            kv_len: s,
            mask: None,
            causal: false,
        },
    )
    .unwrap();
    let mut data = Vec::new();
    for v in [
        0x4d43_504b_u32,
        e as u32,
        h as u32,
        hkv as u32,
        prompt as u32,
        steps as u32,
        s as u32,
        0,
    ] {
        data.extend(v.to_le_bytes());
    }
    let want_self: Vec<f32> = self_ref.iter().map(|&v| v as f32).collect();
    let want_cross: Vec<f32> = cross_ref.iter().map(|&v| v as f32).collect();
    for a in [&self_w, &x, &want_self, &cross_w, &memory, &want_cross] {
        for v in a.iter() {
            data.extend(v.to_le_bytes());
        }
    }
    let dir = TempDir::new(&format!("capi-mha-{backend}"));
    let file = dir.join("mha.bin");
    std::fs::write(&file, data).unwrap();
    let exe = compile("mha_decode", &["-lm"], dir.path());
    let out = run(&exe, &[&selector, &file.display().to_string()], &[]);
    for line in [
        "prefill of 5 positions checked",
        "step 2 checked",
        "cross step 2 checked",
        "bit-exact",
        "ok KPC_STATUS_CALL_ORDER",
        "ok KPC_STATUS_SIZE",
        "ok KPC_STATUS_BUFFER_TOO_SMALL",
        "checks passed",
    ] {
        assert!(out.contains(line), "{test}: no {line:?} in:\n{out}");
    }
}

/// The layer's edges found by an independent C client (issue 40, item 6), from C on each backend:
/// refused prefills (and a refused step) change nothing, with caching on and off; `+inf` in a
/// mask and fp16 cache imports out of range are refused; fully masked rows give the output bias,
/// rows of equal finite values the same uniform row.
fn mha_edges_from_c(backend: &str, selector: String) {
    let dir = TempDir::new(&format!("capi-mha-edges-{backend}"));
    let exe = compile("mha_edges", &["-lm"], dir.path());
    let out = run(&exe, &[&selector], &[]);
    for line in [
        "refused prefills (kv_cache 1) left the layer as it was",
        "refused prefills (kv_cache 0) left the layer as it was",
        "imports outside fp16's range refused",
        "fully masked rows: -inf gives the output bias",
        "mha_edges: ",
    ] {
        assert!(out.contains(line), "{backend}: no {line:?} in:\n{out}");
    }
    // Each refusal says what was wrong and what is accepted.
    for msg in [
        "attention mask[1] is NaN",
        "attention mask[1] is inf; masks take finite values",
        "attention mask[2] is inf",
        "imported cache k[5] is 100000, outside the range of an fp16 cache",
        "every call takes a mask",
        "at most the capacity 8",
    ] {
        assert!(
            out.contains(msg),
            "{backend}: no message {msg:?} in:\n{out}"
        );
    }
}

#[test]
fn c_mha_edges_vulkan() {
    let test = "c_mha_edges_vulkan";
    let Some(()) = cc_available("vulkan", test) else {
        return;
    };
    if let Some(dev) = drivers::vulkan_device(test) {
        mha_edges_from_c("vulkan", format!("vulkan:{}", dev.index));
    }
}

#[test]
fn c_mha_edges_opencl() {
    let test = "c_mha_edges_opencl";
    let Some(()) = cc_available("opencl", test) else {
        return;
    };
    if let Some(dev) = drivers::opencl_device(test) {
        mha_edges_from_c("opencl", format!("opencl:{}", dev.index));
    }
}

#[test]
fn c_mha_layer_vulkan() {
    let test = "c_mha_layer_vulkan";
    let Some(()) = cc_available("vulkan", test) else {
        return;
    };
    if let Some(dev) = drivers::vulkan_device(test) {
        mha_from_c("vulkan", format!("vulkan:{}", dev.index), test);
    }
}

#[test]
fn c_mha_layer_opencl() {
    let test = "c_mha_layer_opencl";
    let Some(()) = cc_available("opencl", test) else {
        return;
    };
    if let Some(dev) = drivers::opencl_device(test) {
        mha_from_c("opencl", format!("opencl:{}", dev.index), test);
    }
}

/// Sealed mode from C on one backend: `populate` builds into the disk cache, `sealed` (run with
/// `KPC_CACHE_SEAL=error`) gets that kernel from disk and `KPC_STATUS_SEALED` for another variant.
fn seal_from_c(selector: String, kernel: &str, dir: &TempDir) -> [String; 2] {
    let exe = compile("seal", &[], dir.path());
    let cache = dir.join("cache");
    let kernel = kernel_file(kernel);
    let args = |mode| [mode, selector.as_str(), kernel.as_str()];
    let first = run(&exe, &args("populate"), &[("KPC_CACHE_DIR", &cache)]);
    let sealed = run(
        &exe,
        &args("sealed"),
        &[
            ("KPC_CACHE_DIR", &cache),
            ("KPC_CACHE_SEAL", Path::new("error")),
        ],
    );
    [first, sealed]
}

#[test]
fn c_seal_vulkan() {
    let test = "c_seal_vulkan";
    let Some(()) = cc_available("vulkan", test) else {
        return;
    };
    let Some(dev) = drivers::vulkan_device(test) else {
        return;
    };
    let dir = TempDir::new("capi-seal-vk");
    let [first, sealed] = seal_from_c(format!("vulkan:{}", dev.index), "saxpy.spv", &dir);
    assert!(first.contains("populated: saxpy bias 2 built"), "{first}");
    assert!(sealed.contains("ok KPC_STATUS_SEALED"), "{sealed}");
    assert!(
        sealed.contains("sealed: disk hit served, build refused then built under warn"),
        "{sealed}"
    );
}

#[test]
fn c_seal_opencl() {
    let test = "c_seal_opencl";
    let Some(()) = cc_available("opencl", test) else {
        return;
    };
    let Some(dev) = drivers::opencl_device(test) else {
        return;
    };
    let dir = TempDir::new("capi-seal-cl");
    let [first, sealed] = seal_from_c(format!("opencl:{}", dev.index), "saxpy.cl", &dir);
    assert!(first.contains("populated: saxpy bias 2 built"), "{first}");
    assert!(sealed.contains("ok KPC_STATUS_SEALED"), "{sealed}");
}

/// Generic while specialized from C on one backend (tests/c/lazy.c), on a fresh cache directory.
fn lazy_from_c(backend: &str, test: &str, kernel: &str) {
    let Some(()) = cc_available(backend, test) else {
        return;
    };
    let selector = match backend {
        "vulkan" => drivers::vulkan_device(test).map(|d| format!("vulkan:{}", d.index)),
        _ => drivers::opencl_device(test).map(|d| format!("opencl:{}", d.index)),
    };
    let Some(selector) = selector else {
        return;
    };
    let dir = TempDir::new(&format!("capi-lazy-{backend}"));
    let exe = compile("lazy", &[], dir.path());
    let cache = dir.join("cache");
    let out = run(
        &exe,
        &[selector.as_str(), kernel_file(kernel).as_str()],
        &[("KPC_CACHE_DIR", &cache)],
    );
    assert!(
        out.contains("sealed: the fallback served, nothing specialized queued"),
        "{out}"
    );
    assert!(
        out.contains(
            "unsealed: the fallback served while the specialized kernel built, then swapped in"
        ),
        "{out}"
    );
    assert!(out.contains("arguments: checked"), "{out}");
}

#[test]
fn c_lazy_vulkan() {
    lazy_from_c("vulkan", "c_lazy_vulkan", "saxpy.spv");
}

#[test]
fn c_lazy_opencl() {
    lazy_from_c("opencl", "c_lazy_opencl", "saxpy.cl");
}

/// A C program sees kpc's warnings: an unusable cache directory (a regular file) is delivered to
/// its `kpc_set_log_callback` callback, reported by `kpc_context_disk_unusable_reason` and
/// `kpc_stats.disk.enabled` = 0; without a callback it goes to stderr, and `KPC_LOG_STDERR=0`
/// silences that.
#[test]
fn c_warnings_reach_the_program() {
    let test = "c_warnings_reach_the_program";
    let Some(()) = cc_available("vulkan", test) else {
        return;
    };
    let Some(dev) = drivers::vulkan_device(test) else {
        return;
    };
    let dir = TempDir::new("capi-warnings");
    let exe = compile("warnings", &[], dir.path());
    let file = dir.join("not-a-dir");
    std::fs::write(&file, b"a file where the cache directory should be").unwrap();
    let selector = format!("vulkan:{}", dev.index);
    let args = [selector.as_str(), file.to_str().unwrap()];
    let (out, err) = run_both(&exe, &args, &[]);
    assert!(
        out.contains("callback: target=kpc::cache::disk cause=unusable-root"),
        "{out}"
    );
    assert!(
        out.contains("warnings: callback, stats and reason checked"),
        "{out}"
    );
    // The second context, without the callback: one line on stderr, naming the file.
    let lines: Vec<&str> = err
        .lines()
        .filter(|l| l.starts_with("kpc: warning:"))
        .collect();
    assert_eq!(lines.len(), 1, "{err}");
    assert!(
        lines[0].contains("not a directory") && lines[0].contains("unusable-root"),
        "{err}"
    );
    let (_, quiet) = run_both(&exe, &args, &[("KPC_LOG_STDERR", Path::new("0"))]);
    assert!(!quiet.contains("kpc: warning:"), "{quiet}");
}

/// Issue 40, item 4: the layer on device tensors from C, in an embedder that owns its device and
/// passes its own buffers (a VkBuffer at an offset, a cl_mem) without a copy; every bad buffer and
/// tensor argument a status with a message, the layer unchanged after each.
fn mha_tensor_from_c(backend: &str, index: usize) {
    let dir = TempDir::new(&format!("capi-mha-tensor-{backend}"));
    let exe = compile("mha_tensor", &["-lvulkan", "-lOpenCL"], dir.path());
    let cache = dir.join("cache");
    let out = run(
        &exe,
        &[backend, &index.to_string()],
        &[("KPC_CACHE_DIR", &cache)],
    );
    for line in [
        "prefill: 3 positions, tensor call = host call (bit-exact)",
        "on the embedder's own buffers",
        "read from the embedder's memory",
        "refused tensor calls left the layer as it was",
        "mha_tensor: ",
        "ok KPC_STATUS_SIZE",
        "ok KPC_STATUS_CALL_ORDER",
    ] {
        assert!(out.contains(line), "{backend}: no {line:?} in:\n{out}");
    }
    for msg in [
        "belongs to another context",
        "imported",
        "a F16 tensor; this call takes F32",
        "is NULL",
        "outside fp16's range",
    ] {
        assert!(
            out.contains(msg),
            "{backend}: no message {msg:?} in:\n{out}"
        );
    }
}

#[test]
fn c_mha_tensor_vulkan_embedder() {
    let test = "c_mha_tensor_vulkan_embedder";
    let Some(()) = cc_available("vulkan", test) else {
        return;
    };
    if let Some(dev) = drivers::vulkan_device(test) {
        mha_tensor_from_c("vulkan", dev.index);
    }
}

#[test]
fn c_mha_tensor_opencl_embedder() {
    let test = "c_mha_tensor_opencl_embedder";
    let Some(()) = cc_available("opencl", test) else {
        return;
    };
    if let Some(dev) = drivers::opencl_device(test) {
        mha_tensor_from_c("opencl", dev.index);
    }
}

crate::backend_tests! {
    /// tests/c/installed.c, the program scripts/check-capi-install.sh builds against an installed
    /// package, against this build: kpc's shipped saxpy for the context's backend (built, then from
    /// disk in a second process), launched on kpc's own queue over kpc buffers with no Vulkan or
    /// OpenCL code of its own, and the launch's refusals (short buffers, a missing buffer, no
    /// groups, push constants of the wrong size), which leave the output as it was.
    fn c_program_launches_a_shipped_kernel_on_kpcs_queue(backend, test) {
        let Some(()) = cc_available(&backend.to_string(), test) else {
            return;
        };
        let Some(dev) = drivers::device(backend, test) else {
            return;
        };
        let dir = TempDir::new("capi-installed");
        let exe = compile("installed", &[], dir.path());
        let selector = format!("{backend}:{}", dev.index);
        let cache = dir.join("cache");
        let first = run(&exe, &[&selector, "built"], &[("KPC_CACHE_DIR", &cache)]);
        let second = run(&exe, &[&selector, "disk"], &[("KPC_CACHE_DIR", &cache)]);
        for (out, source) in [(first, "built"), (second, "disk")] {
            assert!(
                out.contains(&format!("installed: {backend} saxpy {source}, launched: 12 24 36")),
                "{out}"
            );
        }
    }
}
