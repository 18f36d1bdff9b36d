#!/usr/bin/env bash
# GLSL images on one device (issue 20): GLSL compile time per shipped kernel against SPIR-V cache hits,
# and the whole cold path (GLSL -> SPIR-V -> pipeline) against the warm one (`kpc bench-glsl`); then
# `kpc attention --from-source --check` twice on one fresh cache directory (first run: "spirv: compiled"
# and programs built; second: SPIR-V and programs from disk). Builds nothing; runs on the GPU host with
# the prebuilt binary:
#   source .gpu/prelude.sh; benches/glsl_gpu.sh
# kpc links Debian's libshaderc.so.1 (glslang's front end is linked into kpc itself): the host needs it,
# e.g. `apt-get download libshaderc1` into .gpu/debs, which prelude.sh unpacks.
# KPC: the kpc binary (default .gpu/kpc). DEVICE: the device (default vulkan:gpu). REPEAT: runs per
# figure (default 5). Driver shader caches are turned off so that cold figures are cold.
set -euo pipefail
KPC=${KPC:-.gpu/kpc}
dev=${DEVICE:-vulkan:gpu}
if ldd "$KPC" | grep -q "not found"; then
  echo "glsl_gpu: $KPC misses shared libraries:" >&2
  ldd "$KPC" | grep "not found" >&2
  echo "glsl_gpu: libshaderc.so.1 comes with Debian's libshaderc1 (put its .deb in .gpu/debs)" >&2
  exit 1
fi
export __GL_SHADER_DISK_CACHE=0 MESA_SHADER_CACHE_DISABLE=true
unset KPC_DEVICE
echo "## kpc bench-glsl --device $dev"
"$KPC" bench-glsl --device "$dev" --repeat "${REPEAT:-5}"
cache=$(mktemp -d)
for run in first second; do
  echo "## kpc attention --device $dev --from-source --check ($run run on $cache)"
  KPC_CACHE_DIR=$cache KPC_CACHE_PERSISTENT=1 "$KPC" attention --device "$dev" --from-source --check \
    --prompt 512 --steps 16
done
rm -rf "$cache"
