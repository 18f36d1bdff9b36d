#!/usr/bin/env bash
# Issue 27 coop GEMM: check + prefill vs PyTorch, Vulkan only, plus the tiled projection side by side.
set -uo pipefail
cd "$(dirname "$0")/.."
export KPC=.gpu/kpc
export OUT=${OUT:-/tmp}
SECTIONS=check DEVICES=vulkan:gpu .gpu/mha_gpu.sh 2>&1 | tail -8
export KPC_CACHE_DIR=$(mktemp -d)
for L in 2048 8192; do
  for proj in tiled cooperative; do
    echo "# prefill Hkv=8 L=$L projection=$proj"
    $KPC attention --layer mha --device vulkan:gpu --heads 32 --head-dim 128 --kv-heads 8 --kv f16 --prompt $L --steps 0 --prefill-runs 5 --projection $proj 2>&1 | grep -E "^(bench|device|prefill|kernels|  mha)"
  done
done
SECTIONS="kpc torch" DEVICES=vulkan:gpu DECODE_L="" PREFILL_L="2048 8192" .gpu/mha_gpu.sh 2>&1 | tail -12
