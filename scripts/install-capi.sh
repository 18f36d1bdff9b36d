#!/usr/bin/env bash
# Builds kpc's C library and installs it the way cargo-c does, for C and C++ programs:
#   PREFIX/include/kpc.h
#   PREFIX/lib/libkpc.so.0 (soname libkpc.so.0) and the link libkpc.so -> libkpc.so.0
#   PREFIX/lib/libkpc.a
#   PREFIX/lib/pkgconfig/kpc.pc
#   PREFIX/lib/libkpc_spirv_timer.a (one member of SPIRV-Tools that a static link needs; kpc's build.rs)
# Then, shared (kpc.pc carries an rpath to PREFIX/lib, so the program runs without LD_LIBRARY_PATH):
#   cc app.c $(pkg-config --cflags --libs kpc)
# or statically (libkpc.a, then what it needs, in the order static_libs gives):
#   cc app.c $(pkg-config --cflags kpc) "$(pkg-config --variable=libdir kpc)/libkpc.a" \
#      $(pkg-config --variable=static_libs kpc)
# A static link needs the development packages scripts/setup.sh installs (glslang-dev's static
# libraries, libshaderc-dev, libssl-dev, libzstd-dev). scripts/check-capi-install.sh tests both links.
#
# usage: scripts/install-capi.sh PREFIX [PROFILE]
#   PROFILE is a cargo profile, release by default (dev for a quick debug build).
# The header is the committed kpc-capi/include/kpc.h, which `cargo test -p kpc-capi --test main capi_header` keeps current.
set -euo pipefail
prefix=${1:?usage: scripts/install-capi.sh PREFIX [PROFILE]}
profile=${2:-release}
cd "$(dirname "$0")/.."
# Cargo writes where CARGO_TARGET_DIR says (target/ by default); the install reads from there.
target_dir=${CARGO_TARGET_DIR:-target}
case "$profile" in
  dev) outdir=$target_dir/debug ;;
  *) outdir=$target_dir/$profile ;;
esac
version=$(sed -n 's/^version = "\(.*\)"$/\1/p' kpc-capi/Cargo.toml | head -n1)
major=${version%%.*}

echo "install-capi: building kpc $version ($profile)" >&2
# The soname goes into the cdylib only (it is a link argument); the staticlib and rlib ignore it.
# --print native-static-libs names what a static link of libkpc.a needs besides it (cargo replays the
# note when the library is already built).
log=$(mktemp)
trap 'rm -f "$log"' EXIT
cargo rustc -p kpc-capi --lib --profile "$profile" -- \
  -C "link-arg=-Wl,-soname,libkpc.so.$major" --print native-static-libs 2>&1 | tee "$log" >&2
static_libs=$(sed -n 's/.*native-static-libs: //p' "$log" | tail -n1)
if [ -z "$static_libs" ]; then
  echo "install-capi: rustc did not print the native static libraries (see above)" >&2
  exit 1
fi
# glslang's front end and SPIRV-Tools' timer are linked whole (libshaderc.so calls into them and the
# linker would otherwise drop the members nothing in libkpc.a names): wrap them as kpc's build.rs does.
whole="-lSPIRV -lglslang -lMachineIndependent -lGenericCodeGen -lOSDependent -lOGLCompiler -lkpc_spirv_timer"
if [[ " $static_libs " == *" $whole "* ]]; then
  static_libs=${static_libs/"$whole"/"-Wl,--whole-archive $whole -Wl,--no-whole-archive"}
  timer=$(ls -t "$target_dir"/"${outdir##*/}"/build/kpc-*/out/libkpc_spirv_timer.a | head -n1)
fi

install -d "$prefix/include" "$prefix/lib/pkgconfig"
install -m 644 kpc-capi/include/kpc.h "$prefix/include/kpc.h"
install -m 755 "$outdir/libkpc.so" "$prefix/lib/libkpc.so.$major"
ln -sf "libkpc.so.$major" "$prefix/lib/libkpc.so"
install -m 644 "$outdir/libkpc.a" "$prefix/lib/libkpc.a"
if [ -n "${timer:-}" ]; then
  install -m 644 "$timer" "$prefix/lib/libkpc_spirv_timer.a"
fi
cat > "$prefix/lib/pkgconfig/kpc.pc" <<EOF
prefix=$prefix
libdir=\${prefix}/lib
includedir=\${prefix}/include
static_libs=-L\${libdir} $static_libs

Name: kpc
Description: GPU kernel cache with Vulkan and OpenCL backends (C API)
Version: $version
Libs: -L\${libdir} -Wl,-rpath,\${libdir} -lkpc
Libs.private: \${static_libs}
Cflags: -I\${includedir}
EOF
echo "install-capi: installed kpc $version into $prefix (pkg-config: PKG_CONFIG_PATH=$prefix/lib/pkgconfig)" >&2
