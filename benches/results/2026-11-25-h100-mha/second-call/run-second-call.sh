#!/usr/bin/env bash
# The second device call of 2026-11-25 (issue 27 item 10), run from the folder that holds both
# binaries: kpc-old (e30e13f, Vulkan start timestamps at TOP_OF_PIPE) and kpc (start timestamps at
# COMPUTE_SHADER). 1) Vulkan MHA decode with the old binary (the "before"); 2) kpc's bare SDPA decode
# (`kpc attention --fill`, 50 back-to-back steps after a warm-up, first start to last end) at the same
# shapes on both backends, for the attention part alone; 3) the whole table with the new binary.
#   source .gpu/h27/prelude.sh; cd .gpu/h27; ./run-second-call.sh
set -uo pipefail
out=${OUT:-/tmp}
export KPC_CACHE_DIR=$(mktemp -d)
unset KPC_DEVICE
sha256sum kpc kpc-old
{
  for hkv in 32 8; do
    for L in 1024 4096 16384; do
      echo "# decode Hkv=$hkv L=$L"
      ./kpc-old attention --layer mha --device vulkan:gpu --heads 32 --head-dim 128 --kv-heads "$hkv" \
        --kv f16 --prompt $((L - 25)) --steps 50 --prefill-runs 3 2>&1
    done
  done
} >"$out/before-vulkan.txt"
grep -E '^(# |bench: phase=mha_self)' "$out/before-vulkan.txt"
{
  for dev in vulkan:gpu opencl:gpu; do
    for hkv in 32 8; do
      for L in 1024 4096 16384; do
        echo "# sdpa $dev Hkv=$hkv L=$L"
        ./kpc attention --device "$dev" --heads 32 --head-dim 128 --kv-heads "$hkv" --kv f16 \
          --prompt "$L" --steps 50 --fill 2>&1 | grep -E '^(decode|device|host):'
      done
    done
  done
} 2>&1 | tee "$out/sdpa-decode.txt"
KPC=./kpc ./mha_gpu.sh 2>&1 | tail -40
