#!/usr/bin/env bash
# Issue 27 follow-up: is the L=16384 Vulkan decode slowdown of the 2026-11-27 call reproducible? Two rounds,
# each shape with the default projections and with --projection tiled (which forces mha_gemm on decode too).
# After cargo build --release -p kpc-cli and ../shared/gpu/pack.sh benches/decode16k_gpu.sh:
#   source .gpu/prelude.sh; .gpu/decode16k_gpu.sh
export KPC_CACHE_DIR=$(mktemp -d)
for round in 1 2; do
  for hkv in 32 8; do
    for proj in auto tiled; do
      echo "# round $round Hkv=$hkv L=16384 projection=$proj"
      .gpu/kpc attention --layer mha --device vulkan:gpu --heads 32 --head-dim 128 --kv-heads $hkv --kv f16 \
        --prompt 16359 --steps 50 --prefill-runs 3 --projection $proj 2>&1 | grep -E "^(bench|step|decode)" | head -4
    done
  done
done
