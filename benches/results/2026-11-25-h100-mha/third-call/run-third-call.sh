#!/usr/bin/env bash
# The third device call of 2026-11-25 (issue 27 item 10), from the folder holding kpc (with
# MultiHeadAttention::with_options, so --decode-split-min reaches the layer). 1) The layer's decode
# with shorter splits than the defaults (Vulkan 128 positions, OpenCL 64): in the layer the weights
# stream through L2 between steps, so K/V come from DRAM, unlike the back-to-back SDPA benchmark
# the defaults were tuned on; 2) the table with the defaults, without the checks (PREFILL_L="" was
# meant to skip the prefill too, but mha_gpu.sh then read an empty value as unset, fixed since: the
# prefill rows ran as well).
#   source .gpu/h27/prelude.sh; cd .gpu/h27; ./run-third-call.sh
set -uo pipefail
out=${OUT:-/tmp}
export KPC_CACHE_DIR=$(mktemp -d)
unset KPC_DEVICE
sha256sum kpc
{
  for v in vulkan:32 vulkan:64 opencl:32; do
    dev=${v%%:*} split=${v##*:}
    for hkv in 32 8; do
      for L in 1024 4096 16384; do
        echo "# $dev split-min=$split decode Hkv=$hkv L=$L"
        ./kpc attention --layer mha --device "$dev:gpu" --heads 32 --head-dim 128 --kv-heads "$hkv" \
          --kv f16 --prompt $((L - 25)) --steps 50 --prefill-runs 3 --decode-split-min "$split" 2>&1
      done
    done
  done
} >"$out/split-sweep.txt"
grep -E '^(# |bench: phase=mha_self)' "$out/split-sweep.txt"
SECTIONS="kpc torch" PREFILL_L="" KPC=./kpc ./mha_gpu.sh 2>&1 | tail -40
