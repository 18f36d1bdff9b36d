//! Links what Debian's libshaderc.so leaves undefined (issue 20: GLSL device images).
//!
//! Debian's libshaderc.so.1 (package libshaderc-dev/libshaderc1) contains shaderc, glslang's SPIR-V
//! back end and SPIRV-Tools, but not glslang's front end (TShader, TProgram, the pool allocator) nor
//! SPIRV-Tools' timer, and it names no library that has them: a program linking it must link those
//! itself, from glslang-dev's static libraries and a member of spirv-tools' libSPIRV-Tools.a. The
//! shaderc-sys crate links libshaderc.so (found through pkg-config); this script adds the rest. Nothing
//! here compiles C++: the build-time goal holds.
//!
//! The C library (kpc-capi's libkpc.so) exports those symbols again for libshaderc.so: see
//! kpc-capi/build.rs.

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

const GLSLANG: &[&str] = &[
    "SPIRV",
    "glslang",
    "MachineIndependent",
    "GenericCodeGen",
    "OSDependent",
    "OGLCompiler",
];

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    // Only GLSL images (feature `glsl`) need shaderc; the loom build has no backends at all.
    if env::var("CARGO_CFG_LOOM").is_ok() || env::var("CARGO_FEATURE_GLSL").is_err() {
        return;
    }
    let dir = lib_dir();
    for lib in GLSLANG {
        if !dir.join(format!("lib{lib}.a")).exists() {
            panic!(
                "kpc: {}/lib{lib}.a not found: GLSL images link glslang's static libraries from \
                 Debian's glslang-dev (apt install libshaderc-dev glslang-dev spirv-tools)",
                dir.display()
            );
        }
    }
    let out = PathBuf::from(env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    extract_timer(&dir, &out);
    println!("cargo:rustc-link-search=native={}", dir.display());
    println!("cargo:rustc-link-search=native={}", out.display());
    // whole-archive: libshaderc.so's references are not seen by the linker when it picks members.
    for lib in GLSLANG {
        println!("cargo:rustc-link-lib=static:+whole-archive,-bundle={lib}");
    }
    println!("cargo:rustc-link-lib=static:+whole-archive,-bundle=kpc_spirv_timer");
}

/// Where the system's shaderc lives: pkg-config's answer, else Debian's multiarch directory.
fn lib_dir() -> PathBuf {
    if let Ok(o) = Command::new("pkg-config")
        .args(["--variable=libdir", "shaderc"])
        .output()
    {
        let s = String::from_utf8_lossy(&o.stdout).trim().to_owned();
        if o.status.success() && !s.is_empty() {
            return PathBuf::from(s);
        }
    }
    let arch = env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_else(|_| "x86_64".into());
    PathBuf::from(format!("/usr/lib/{arch}-linux-gnu"))
}

/// SPIRV-Tools' timer (timer.cpp.o of libSPIRV-Tools.a) as its own archive: only that member, so no
/// other SPIRV-Tools code of Debian's version mixes with the one spirv-tools-sys compiles.
fn extract_timer(dir: &Path, out: &Path) {
    let full = dir.join("libSPIRV-Tools.a");
    let run = |cmd: &mut Command| {
        let st = cmd
            .current_dir(out)
            .status()
            .unwrap_or_else(|e| panic!("kpc: running {cmd:?}: {e}"));
        assert!(st.success(), "kpc: {cmd:?} failed ({st})");
    };
    run(Command::new("ar").arg("x").arg(&full).arg("timer.cpp.o"));
    let _ = std::fs::remove_file(out.join("libkpc_spirv_timer.a"));
    run(Command::new("ar").args(["rcs", "libkpc_spirv_timer.a", "timer.cpp.o"]));
}
