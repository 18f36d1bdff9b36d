#!/usr/bin/env bash
# Issues 28 and 29 on the GPU host in ONE call, so every ratio compares like with like: kpc before
# (BASE, the binary of the previous round) and after (KPC), PyTorch's SDPA backends, the checks, and
# the pipeline-binary tables. Driver caches off (prelude.sh). Builds nothing.
#   source .gpu/prelude.sh; BASE=/tmp/kpc-base KPC=/tmp/kpc benches/round2_gpu.sh
# SECTIONS: any of check decode prefill torch binary herd (default all). OUT: logs (default /tmp).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
KPC=${KPC:-.gpu/kpc}
BASE=${BASE:-}
out=${OUT:-/tmp}
common=(--device vulkan:gpu --heads 32 --head-dim 128)
val() { grep -o " $1=[^ ]*" <<<"$2" | head -1 | cut -d= -f2; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader || true
for s in ${SECTIONS:-check decode prefill torch binary herd}; do
  case $s in
    check)
      echo "## --check (after): decode and prefill, GQA and MHA, B=1 and 4, fp16 and fp32 K/V"
      for kv in f16 f32; do
        for b in 1 4; do
          for hkv in 32 8; do
            o=$("$KPC" attention "${common[@]}" --kv "$kv" --batch "$b" --kv-heads "$hkv" --prompt 1000 \
              --steps 12 --check 2>&1)
            echo "kv=$kv B=$b Hkv=$hkv: $(grep -E '^kernels|^prefill:' <<<"$o" | tr '\n' ' ' | cut -c1-160) | $(grep -iE '^check' <<<"$o" | tr '\n' ' ')"
          done
        done
      done
      for hkv in 32 8; do
        o=$("$KPC" attention "${common[@]}" --kv f16 --kv-heads "$hkv" --prompt 1000 --steps 4 \
          --prefill-kernel cm2 --check 2>&1)
        echo "cm2 forced Hkv=$hkv: $(grep -iE '^check' <<<"$o" | tr '\n' ' ')"
      done
      ;;
    decode)
      echo "## decode, fp16 K/V, 100 steps back to back (µs per step)"
      echo "| B | Hkv | L | before wall | before device | after wall | after device | after wall - device |"
      echo "|---|---|---|---|---|---|---|---|"
      for shp in 1:32:1024 1:32:4096 1:32:16384 1:32:32768 1:8:4096 1:8:16384 1:8:32768 4:32:4096 4:32:16384; do
        IFS=: read -r b hkv L <<<"$shp"
        row="| $b | $hkv | $L |"
        for bin in "$BASE" "$KPC"; do
          o=$("$bin" attention "${common[@]}" --kv f16 --batch "$b" --kv-heads "$hkv" --prompt "$L" \
            --steps 100 --fill 2>&1 | grep '^bench: phase=decode')
          w=$(val wall_us "$o") d=$(val device_us "$o")
          row="$row $w | $d |"
        done
        echo "$row $(awk -v w="$w" -v d="$d" 'BEGIN { printf "%.2f", w - d }') |"
      done
      ;;
    prefill)
      echo "## causal prefill B=1 H=32 D=128 fp16 K/V (TFLOP/s, median of 3)"
      echo "| L | before auto | after auto (kernel) | after cm2 |"
      echo "|---|---|---|---|"
      for L in 2048 4096 8192; do
        p() { "$1" attention "${common[@]}" --kv f16 --prompt "$L" --steps 0 --prefill-runs 3 "${@:2}" 2>&1; }
        a=$(p "$BASE") b=$(p "$KPC") c=$(p "$KPC" --prefill-kernel cm2)
        k=$(grep -o 'prefill: [A-Z][A-Za-z0-9]*' <<<"$b" | head -1 | cut -d' ' -f2)
        echo "| $L | $(val tflops "$(grep '^bench: phase=prefill' <<<"$a")") |" \
          "$(val tflops "$(grep '^bench: phase=prefill' <<<"$b")") ($k) |" \
          "$(val tflops "$(grep '^bench: phase=prefill' <<<"$c")") |"
      done
      ;;
    torch)
      echo "## PyTorch SDPA (same call)"
      python3 "$here/attention_torch.py" --batch 1 --kv-heads 32 --decode 1024,4096,16384,32768 --prefill 2048,4096,8192
      python3 "$here/attention_torch.py" --batch 1 --kv-heads 8 --decode 4096,16384,32768 --prefill ""
      python3 "$here/attention_torch.py" --batch 4 --kv-heads 32 --decode 4096,16384 --prefill ""
      ;;
    binary)
      KPC=$KPC SECTIONS="devices tests warm kernels" RUNS=${RUNS:-11} OUT=$out "$here/pipeline_binary_gpu.sh"
      if [ -n "$BASE" ]; then
        echo "## warm process, before (the previous round's binary: pipeline-cache data, a layout pair per pipeline)"
        KPC=$BASE SECTIONS=warm DEVICES=vulkan:gpu RUNS=${RUNS:-11} OUT=$out/hot-base "$here/hot_path_gpu.sh" 2>&1 | tail -n +4 | grep -v '^('
      fi
      ;;
    herd)
      KPC=$KPC ROUNDS=${ROUNDS:-2} DEVICES=vulkan:gpu "$here/herd_gpu.sh"
      ;;
  esac
done
