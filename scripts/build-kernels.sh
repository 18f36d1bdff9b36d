#!/usr/bin/env bash
# Regenerates the committed SPIR-V in kernels/ (kpc's example kernels) and kpc-attention/kernels/ (the
# attention workload's) from their GLSL sources. Building a crate never runs this: the .spv files are
# committed and embedded with include_bytes!. Run it after editing a .comp file; the tests
# `committed_spirv_is_fresh` (kpc) and `committed_attention_spirv_is_fresh` (kpc-attention) fail until
# you do.
#
# Each DIR/NAME.comp becomes DIR/NAME.spv, whose entry point is named NAME (glslang renames
# GLSL's `main`), targeting Vulkan 1.1 (SPIR-V 1.3). The glslang version used is recorded in
# DIR/GLSLANG_VERSION, because another version may emit different (equally valid) words.
#
# Kernels that use cooperative matrices (GL_KHR_cooperative_matrix) need glslang 13 or later and
# target Vulkan 1.3 (SPIR-V 1.6); attn_prefill_cm2, which also uses GL_NV_cooperative_matrix2, needs
# glslang 15 (built from the source shaderc-sys vendors: cmake -DENABLE_OPT=OFF -DENABLE_HLSL=OFF,
# target glslang-standalone). Debian bookworm ships glslang 12, so they are built with the glslang
# that KPC_GLSLANG_COOPMAT names (default: glslangValidator), and the SHA-256 of the source each was
# built from is recorded in DIR/NAME.spv.source with that glslang's version: the freshness test
# checks that digest, since the machine running it may have no glslang new enough to rebuild them.
# Where the source is unchanged since its recorded build, such a kernel is left alone.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v glslangValidator >/dev/null || { echo "build-kernels: glslangValidator not found (apt install glslang-tools)" >&2; exit 1; }
coopmat_glslang="${KPC_GLSLANG_COOPMAT:-glslangValidator}"
for dir in kernels kpc-attention/kernels; do
  (
  cd "$dir"
  for src in *.comp; do
    name="${src%.comp}"
    if grep -q 'GL_KHR_cooperative_matrix' "$src"; then
      digest="sha256 $(sha256sum "$src" | cut -d' ' -f1)"
      if [ -f "$name.spv" ] && [ -f "$name.spv.source" ] && [ "$(head -1 "$name.spv.source")" = "$digest" ] \
          && [ -z "${KPC_GLSLANG_COOPMAT:-}" ]; then
        echo "build-kernels: $dir/$src unchanged since its recorded build, left alone"
        continue
      fi
      if ! "$coopmat_glslang" --quiet --target-env vulkan1.3 -e "$name" --source-entrypoint main -o "$name.spv" "$src"; then
        echo "build-kernels: $dir/$src needs a glslang with GL_KHR_cooperative_matrix (13 or later); set KPC_GLSLANG_COOPMAT to one ($coopmat_glslang: $("$coopmat_glslang" --version | head -1))" >&2
        exit 1
      fi
      { echo "$digest"; "$coopmat_glslang" --version | head -1; } > "$name.spv.source"
      echo "build-kernels: $dir/$src -> $name.spv (cooperative matrices, $("$coopmat_glslang" --version | head -1))"
      continue
    fi
    glslangValidator --quiet --target-env vulkan1.1 -e "$name" --source-entrypoint main -o "$name.spv" "$src"
    echo "build-kernels: $dir/$src -> $name.spv"
  done
  glslangValidator --version | head -1 > GLSLANG_VERSION
  )
done
