#!/usr/bin/env bash
# Issue 29 (items 1-3) on the GPU host, in one call, with prebuilt binaries only:
#   devices  what `kpc devices` says of the Vulkan device (kpc_vulkan_binary, the features);
#   tests    the Vulkan test binaries in .gpu/tests/ (xz-compressed, built with `cargo test --no-run`)
#            run with KPC_VULKAN_PIPELINE_BINARY=require: every program persisted and loaded as
#            VK_KHR_pipeline_binary binaries;
#   warm     benches/hot_path_gpu.sh's warm section (floor, serial, prefetch, warm start), once with
#            pipeline-cache data (KPC_VULKAN_PIPELINE_BINARY=off) and once with pipeline binaries;
#   kernels  per kernel, a cold `kpc attention` then a warm one on its cache dir, for each kind, with
#            the build trace (vkCreateComputePipelines time and the driver's creation feedback).
# Driver caches are off (prelude.sh, hot_path_gpu.sh).
#   source .gpu/prelude.sh; SECTIONS="devices tests warm kernels" benches/pipeline_binary_gpu.sh
# Variables: KPC (default .gpu/kpc), SECTIONS, RUNS (warm rounds, default 11), OUT (logs, default /tmp).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
export KPC=${KPC:-.gpu/kpc}
out=${OUT:-/tmp}
mkdir -p "$out"
export __GL_SHADER_DISK_CACHE=0 CUDA_CACHE_DISABLE=1
for s in ${SECTIONS:-devices tests warm kernels}; do
  case $s in
    devices)
      echo "## kpc devices (Vulkan)"
      "$KPC" devices 2>&1 | sed -n '/^vulkan/,/^opencl/p' | grep -v '^opencl'
      ;;
    tests)
      echo "## Vulkan test binaries, KPC_VULKAN_PIPELINE_BINARY=require"
      mkdir -p "$out/tests"
      for t in .gpu/tests/*.xz; do
        name=$(basename "$t" .xz)
        xz -dc "$t" >"$out/tests/$name" && chmod +x "$out/tests/$name"
        KPC_VULKAN_PIPELINE_BINARY=require KPC_CACHE_DIR=$(mktemp -d) timeout 300 \
          "$out/tests/$name" --test-threads=4 >"$out/test-$name.log" 2>&1
        rc=$?
        echo "$name: rc=$rc $(grep '^test result' "$out/test-$name.log" | tail -1)"
        [ $rc -ne 0 ] && grep -E 'panicked|FAILED|^---- ' "$out/test-$name.log" | head -20
      done
      ;;
    warm)
      for mode in off auto; do
        echo "## warm process, KPC_VULKAN_PIPELINE_BINARY=$mode"
        KPC_VULKAN_PIPELINE_BINARY=$mode SECTIONS=warm DEVICES=vulkan:gpu RUNS=${RUNS:-11} \
          OUT=$out/hot-$mode "$here/hot_path_gpu.sh" 2>&1 | tail -n +4
      done
      ;;
    kernels)
      for mode in off auto; do
        d=$(mktemp -d)
        for phase in cold warm; do
          echo "## kpc attention, $phase, KPC_VULKAN_PIPELINE_BINARY=$mode"
          KPC_VULKAN_PIPELINE_BINARY=$mode KPC_CACHE_DIR=$d KPC_CACHE_TRACE=4 "$KPC" attention \
            --device vulkan:gpu --heads 32 --kv-heads 8 --head-dim 128 --prompt 512 --steps 4 \
            >"$out/attn-$mode-$phase.log" 2>&1
          grep -iE 'acquire|vkCreateComputePipelines|kernels:' "$out/attn-$mode-$phase.log" | head -20
        done
        echo "cache entries: $(find "$d" -name '*.bin' | wc -l), bytes: $(find "$d" -name '*.bin' -printf '%s\n' | awk '{s+=$1} END {print s}')"
      done
      ;;
  esac
done
