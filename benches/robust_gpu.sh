#!/usr/bin/env bash
# Issue 39 on the GPU host: what robustBufferAccess (on by default on the Vulkan devices kpc opens,
# KPC_VULKAN_ROBUST_ACCESS=0 turns it off) costs the attention kernels, both settings side by side in
# one call, interleaved per shape. Driver caches off (prelude.sh). Builds nothing.
#   source .gpu/prelude.sh; benches/robust_gpu.sh
set -uo pipefail
KPC=${KPC:-.gpu/kpc}
common=(--device vulkan:gpu --heads 32 --head-dim 128)
val() { grep -o " $1=[^ ]*" <<<"$2" | head -1 | cut -d= -f2; }
run() { # robust(0/1) args...
  local r=$1; shift
  KPC_VULKAN_ROBUST_ACCESS=$r KPC_CACHE_DIR=$(mktemp -d) "$KPC" attention "${common[@]}" "$@" 2>&1
}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader || true
echo "## check with robust access on and off"
for r in 1 0; do
  o=$(run "$r" --kv f16 --kv-heads 8 --prompt 1000 --steps 8 --check)
  echo "robust=$r: $(grep -iE '^check' <<<"$o" | tr '\n' ' ' | cut -c1-200)"
done
echo "## decode, fp16 K/V, 100 steps back to back (µs per step, device / wall)"
echo "| B | Hkv | L | robust device | robust wall | off device | off wall | device ratio |"
echo "|---|---|---|---|---|---|---|---|"
for shp in 1:32:4096 1:32:16384 1:8:16384 1:8:32768; do
  IFS=: read -r b hkv L <<<"$shp"
  row="| $b | $hkv | $L |"
  ds=()
  for r in 1 0; do
    o=$(run "$r" --kv f16 --batch "$b" --kv-heads "$hkv" --prompt "$L" --steps 100 --fill | grep '^bench: phase=decode')
    d=$(val device_us "$o"); ds+=("$d")
    row="$row $d | $(val wall_us "$o") |"
  done
  echo "$row $(awk -v a="${ds[0]}" -v b="${ds[1]}" 'BEGIN { if (b > 0) printf "%.3f", a / b }') |"
done
echo "## causal prefill B=1 H=32 D=128 fp16 (TFLOP/s, median of 3)"
echo "| L | robust | off |"
echo "|---|---|---|"
for L in 2048 8192; do
  row="| $L |"
  for r in 1 0; do
    o=$(run "$r" --kv f16 --prompt "$L" --steps 0 --prefill-runs 3 | grep '^bench: phase=prefill')
    row="$row $(val tflops "$o") |"
  done
  echo "$row"
done
echo "## MHA layer (E=4096, H=32, D=128), prefill L=2048 then 20 decode steps"
for r in 1 0; do
  o=$(run "$r" --layer mha --kv f16 --prompt 2048 --steps 20 --fill)
  echo "robust=$r: $(grep -E '^bench' <<<"$o" | tr '\n' ' ' | cut -c1-400)"
done
