//! libkpc.so links glslang's static front end (through the kpc library's build script, for GLSL
//! images), and Debian's libshaderc.so resolves those symbols at load time. rustc's version script
//! for a cdylib hides everything but the C API, so they are exported explicitly here.

use std::env;
use std::path::PathBuf;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    let out = PathBuf::from(env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let map = out.join("kpc-glslang.map");
    std::fs::write(
        &map,
        "{ global: extern \"C++\" { glslang::*; spv::*; spvtools::utils::*; vtable?for?glslang::*; vtable?for?spvtools::utils::*; typeinfo?for?glslang::*; }; };\n",
    )
    .expect("write the version script");
    println!(
        "cargo:rustc-cdylib-link-arg=-Wl,--version-script={}",
        map.display()
    );
}
