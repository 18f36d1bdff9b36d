#!/usr/bin/env bash
# Regenerates the committed SPIR-V in kernels/ from its GLSL sources. Building the crate never runs this:
# the .spv files are committed and embedded with include_bytes!. Run it after editing a .comp file; the
# test `committed_spirv_is_fresh` fails until you do.
#
# Each kernels/NAME.comp becomes kernels/NAME.spv, whose entry point is named NAME (glslang renames
# GLSL's `main`), targeting Vulkan 1.1 (SPIR-V 1.3). The glslang version used is recorded in
# kernels/GLSLANG_VERSION, because another version may emit different (equally valid) words.
set -euo pipefail
cd "$(dirname "$0")/../kernels"
command -v glslangValidator >/dev/null || { echo "build-kernels: glslangValidator not found (apt install glslang-tools)" >&2; exit 1; }
for src in *.comp; do
  name="${src%.comp}"
  glslangValidator --quiet --target-env vulkan1.1 -e "$name" --source-entrypoint main -o "$name.spv" "$src"
  echo "build-kernels: $src -> $name.spv"
done
glslangValidator --version | head -1 > GLSLANG_VERSION
