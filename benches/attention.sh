#!/usr/bin/env bash
# Runs kpc's attention over the benchmark shapes on whatever device KPC_DEVICE (or --backend) picks and
# prints a markdown table for BENCHMARKS.md. Shapes: fp16 K/V, B=1, H=32, D=128; decode at
# L = 1k, 4k, 16k, 32k; causal prefill at L = 512 ... 8k. Extra arguments go to every kpc call.
#   benches/attention.sh [--backend vulkan|opencl]        (KPC=path/to/kpc to use another binary)
set -euo pipefail
kpc=${KPC:-$(dirname "$0")/../target/release/kpc}
shape=(--batch 1 --heads 32 --head-dim 128 --kv f16)
decode_l=${DECODE_L:-1024 4096 16384 32768}
prefill_l=${PREFILL_L:-512 1024 2048 4096 8192}
"$kpc" attention "${shape[@]}" --prompt 64 --steps 2 --check "$@" | sed -n 2p
echo
echo "| phase | L | time | rate | device copy GB/s | decode / copy |"
echo "|---|---|---|---|---|---|"
for L in $decode_l; do
  out=$("$kpc" attention "${shape[@]}" --prompt "$L" --steps 50 "$@" 2>/dev/null)
  dec=$(grep '^decode:' <<<"$out" | sed -E 's/decode: +([0-9.]+) us\/step.*, ([0-9.]+) GB\/s.*/\1 us|\2 GB\/s/')
  cp=$(grep '^copy:' <<<"$out" | sed -E 's/copy: +([0-9.]+) GB\/s.*= ([0-9.]+%)/\1|\2/')
  echo "| decode | $L | ${dec%%|*} | ${dec#*|} | ${cp%%|*} | ${cp#*|} |"
done
for L in $prefill_l; do
  out=$("$kpc" attention "${shape[@]}" --prompt "$L" --steps 1 "$@" 2>/dev/null)
  pre=$(grep '^prefill:' <<<"$out" | sed -E 's/prefill: +([0-9.]+) ms, ([0-9.]+) TFLOP\/s.*/\1 ms|\2 TFLOP\/s/')
  echo "| prefill | $L | ${pre%%|*} | ${pre#*|} | | |"
done
