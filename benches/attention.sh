#!/usr/bin/env bash
# Runs kpc's attention over the benchmark shapes on whatever device KPC_DEVICE (or --backend) picks and
# prints markdown tables for BENCHMARKS.md. Extra arguments go to every kpc call.
#
# Decode: fp16 K/V, H=32 (HEADS), D=128, shapes B:Hkv in DECODE_SHAPES (default 1:32 1:8 4:32 16:32) at each L
# in DECODE_L; the prompt's K/V are uploaded (--fill), then 100 steps of append + split + reduce run
# back to back; the last four columns time the copy kernel moving one step's bytes and the read
# kernel reading them (the floors at that size). Shapes whose K or V would pass 4 GiB are skipped.
# Prefill: causal, B=1, H=32, D=128 at each L in PREFILL_L, with each kernel in PREFILL_KERNELS (default: auto tiled; auto is the
# cooperative-matrix kernel where the device has one), the median of 3 runs.
#   benches/attention.sh [--backend vulkan|opencl] [kpc attention args]  (KPC=path/to/kpc)
set -euo pipefail
kpc=${KPC:-$(dirname "$0")/../target/release/kpc}
base=(--heads "${HEADS:-32}" --head-dim 128 --kv f16)
decode_shapes=${DECODE_SHAPES:-1:32 1:8 4:32 16:32}
decode_l=${DECODE_L:-1024 4096 16384 32768}
prefill_l=${PREFILL_L:-512 1024 2048 4096 8192}
prefill_kernels=${PREFILL_KERNELS:-auto tiled}
val() { grep -o " $1=[^ ]*" <<<"$2" | cut -d= -f2; }

# Correctness first, on the same device and kernels: MHA and GQA decode, and prefill (also with
# queries scaled by 30, whose scores move the softmax's running max).
"$kpc" attention "${base[@]}" --prompt 1000 --steps 8 --check "$@" | grep -E '^(device: [a-z]|kernels|check)'
"$kpc" attention "${base[@]}" --kv-heads 8 --batch 2 --prompt 3000 --steps 8 --fill --check "$@" |
  grep -E '^(kernels|check)'
"$kpc" attention "${base[@]}" --prompt 777 --steps 2 --check --q-scale 30 "$@" | grep -E '^(kernels|check)'
echo
echo "| phase | B | Hkv | L | splits | wall µs/step | host µs/step | device µs/step | µs per launch | GB/s (device) | copy GB/s | device / copy | wall / copy | copy of a step's bytes µs | device / that copy | read of a step's bytes µs | device / that read |"
echo "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
for sh in $decode_shapes; do
  b=${sh%%:*} hkv=${sh##*:}
  for L in $decode_l; do
    if (( b * hkv * (L + 100) * 128 * 2 > 4294967295 )); then continue; fi
    out=$("$kpc" attention "${base[@]}" --batch "$b" --kv-heads "$hkv" --prompt "$L" --steps 100 \
      --fill "$@" 2>/dev/null | grep '^bench: phase=decode')
    echo "| decode | $b | $hkv | $L | $(val splits "$out") | $(val wall_us "$out") |" \
      "$(val host_us "$out") | $(val device_us "$out") |" \
      "$(val launches_us "$out") |" \
      "$(val gbs "$out") | $(val copy_gbs "$out") | $(val pct_device "$out")% |" \
      "$(val pct_wall "$out")% | $(val copy_same_us "$out") | $(val pct_same "$out")% |" \
      "$(val read_same_us "$out") | $(val pct_read "$out")% |"
  done
done
echo
echo "| phase | kernel | B | H | L | ms | TFLOP/s |"
echo "|---|---|---|---|---|---|---|"
for L in $prefill_l; do
  for k in $prefill_kernels; do
    all=$("$kpc" attention "${base[@]}" --prompt "$L" --steps 0 --prefill-kernel "$k" --prefill-runs 3 \
      "$@" 2>/dev/null)
    out=$(grep '^bench: phase=prefill' <<<"$all")
    chosen=$(grep -o 'prefill: [A-Z][A-Za-z]*' <<<"$all" | head -1 | cut -d' ' -f2)
    echo "| prefill | $chosen | 1 | ${HEADS:-32} | $L | $(val ms "$out") | $(val tflops "$out") |"
  done
done
