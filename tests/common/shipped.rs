//! Checks every crate that ships kernels (kpc's examples, kpc-attention's workload) runs on its own
//! tables: the committed SPIR-V is fresh against its GLSL, and each OpenCL C image mirrors its
//! SPIR-V twin.

use std::path::Path;
use std::process::Command;

use kpc::Context;
use kpc::kernels::{ShippedOpenCl, ShippedSpirv};

/// Each OpenCL image of `opencl` mirrors its SPIR-V twin in `spirv`: the same entry point, buffers
/// (count and read-only-ness, in order), push-constant bytes, default workgroup size and
/// spec-constant ids. Only the cooperative-matrix kernels have no twin.
pub fn both_backends_agree(ctx: &Context, opencl: &[ShippedOpenCl], spirv: &[ShippedSpirv]) {
    let names: Vec<&str> = opencl.iter().map(|k| k.name).collect();
    let twins: Vec<&str> = spirv
        .iter()
        .filter(|k| !k.cooperative_matrix)
        .map(|k| k.name)
        .collect();
    assert_eq!(names, twins);
    for (cl_kernel, spv_kernel) in opencl
        .iter()
        .zip(spirv.iter().filter(|k| !k.cooperative_matrix))
    {
        let name = cl_kernel.name;
        let image = cl_kernel.image();
        let k = ctx.kernel(&image, name).unwrap();
        let spv = spv_kernel.image().unwrap();
        let module = spv.spirv_module().unwrap();
        let entry = module.entry(name, name).unwrap();
        let cl = k.info();
        assert_eq!(cl.push_constant_bytes, entry.push_constant_bytes, "{name}");
        assert_eq!(
            cl.buffers.iter().map(|b| b.read_only).collect::<Vec<_>>(),
            entry
                .bindings
                .iter()
                .map(|b| b.read_only)
                .collect::<Vec<_>>(),
            "{name}"
        );
        assert_eq!(cl.local_size, entry.local_size.map(|d| d.default), "{name}");
        let mut cl_ids: Vec<u32> = kpc::admin::opencl::spec_constants(&image)
            .unwrap()
            .iter()
            .map(|d| d.id)
            .collect();
        let mut spv_ids: Vec<u32> = module.spec_constants.iter().map(|c| c.id).collect();
        cl_ids.sort();
        spv_ids.sort();
        assert_eq!(cl_ids, spv_ids, "{name}");
    }
}

/// Every `root`/kernels/*.comp has a committed .spv that glslangValidator still produces from it,
/// and every one is embedded in `table`. Kernels with cooperative matrices need a newer glslang than
/// the test machines have (see scripts/build-kernels.sh): theirs must come from the current source
/// by its recorded digest, and validate. `test` names the calling test in the driver log.
pub fn committed_spirv_is_fresh(root: &Path, table: &[ShippedSpirv], test: &str) {
    let dir = root.join("kernels");
    let mut sources: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter_map(|n| n.strip_suffix(".comp").map(str::to_string))
        .collect();
    sources.sort();
    let mut shipped: Vec<String> = table.iter().map(|k| k.name.to_string()).collect();
    shipped.sort();
    assert_eq!(
        sources,
        shipped,
        "{}/*.comp and the crate's kernels::SPIRV must list the same kernels",
        dir.display()
    );
    for k in table {
        let on_disk = std::fs::read(dir.join(format!("{}.spv", k.name))).unwrap();
        assert_eq!(
            on_disk, k.spirv,
            "{}.spv on disk differs from the embedded one",
            k.name
        );
    }

    let version = match Command::new("glslangValidator").arg("--version").output() {
        Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout)
            .lines()
            .next()
            .unwrap_or("")
            .to_string(),
        _ => {
            let _: Option<()> =
                super::drivers::skip("glslang", test, "glslangValidator is not installed");
            return;
        }
    };
    super::drivers::ran("glslang", test);
    let recorded = std::fs::read_to_string(dir.join("GLSLANG_VERSION")).unwrap_or_default();
    let out = std::env::temp_dir().join(format!("kpc-spv-fresh-{}-{}", std::process::id(), test));
    std::fs::create_dir_all(&out).unwrap();
    for k in table {
        let source = std::fs::read_to_string(root.join(k.source)).unwrap();
        assert_eq!(
            source.contains("GL_KHR_cooperative_matrix"),
            k.cooperative_matrix,
            "{}: ShippedSpirv::cooperative_matrix disagrees with its source",
            k.name
        );
        if k.cooperative_matrix {
            coopmat_kernel_is_fresh(&dir, k);
            continue;
        }
        let spv = out.join(format!("{}.spv", k.name));
        let status = Command::new("glslangValidator")
            .current_dir(&dir)
            .args([
                "--quiet",
                "--target-env",
                "vulkan1.1",
                "-e",
                k.name,
                "--source-entrypoint",
                "main",
                "-o",
            ])
            .arg(&spv)
            .arg(format!("{}.comp", k.name))
            .status()
            .unwrap();
        assert!(status.success(), "glslangValidator failed on {}", k.source);
        let fresh = std::fs::read(&spv).unwrap();
        assert!(
            fresh == k.spirv,
            "{}/{}.spv is stale against {}: run scripts/build-kernels.sh and commit the result \
             (committed with {:?}, this machine has {version:?})",
            dir.display(),
            k.name,
            k.source,
            recorded.trim()
        );
    }
    let _ = std::fs::remove_dir_all(&out);
}

/// A cooperative-matrix kernel's .spv was built from the source as it is now: the SHA-256 that
/// scripts/build-kernels.sh recorded in NAME.spv.source matches the source's, and the module
/// passes spirv-tools validation.
fn coopmat_kernel_is_fresh(dir: &Path, k: &ShippedSpirv) {
    let (name, source) = (k.name, k.source);
    let recorded = std::fs::read_to_string(dir.join(format!("{name}.spv.source")))
        .unwrap_or_else(|e| panic!("kernels/{name}.spv.source: {e}; run scripts/build-kernels.sh"));
    let out = Command::new("sha256sum")
        .arg(format!("{name}.comp"))
        .current_dir(dir)
        .output()
        .expect("sha256sum runs");
    assert!(out.status.success(), "sha256sum failed on {source}");
    let digest = String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .unwrap_or("")
        .to_string();
    assert_eq!(digest.len(), 64, "sha256sum printed {:?}", out.stdout);
    assert_eq!(
        recorded.lines().next().unwrap_or(""),
        format!("sha256 {digest}"),
        "kernels/{name}.spv is stale against {source}: run scripts/build-kernels.sh with \
         KPC_GLSLANG_COOPMAT set to a glslang of 13 or later, and commit the result"
    );
    k.image()
        .unwrap_or_else(|e| panic!("kernels/{name}.spv is invalid: {e}"));
}
