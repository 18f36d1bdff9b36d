#!/usr/bin/env bash
# Issue 41, item 4 on the GPU host in ONE call: GQA decode (B=1, H=32, Hkv=8, D=128, fp16 K/V) with
# the vectorized kernel's variants, the previous binary beside it, the checks, and PyTorch's cuDNN
# decode from CUDA graphs. Driver caches off (prelude.sh). Builds nothing.
#   source .gpu/prelude.sh; KPC=.gpu/kpc BASE=.gpu/kpc-base benches/decode41_gpu.sh
# SECTIONS: any of check stats sweep mha torch (default all, in that order; the second call ran
# SECTIONS="sweep check mha" with VARIANTS and CHECKS narrowed, see BENCHMARKS.md). Each sweep variant is
# `label|binary|flags`; SWEEP_L the prompt lengths. TORCH: attention_torch.py's path.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
KPC=${KPC:-.gpu/kpc}
BASE=${BASE:-.gpu/kpc-base}
TORCH=${TORCH:-$here/attention_torch.py}
common=(--device vulkan:gpu --heads 32 --head-dim 128)
val() { grep -o " $1=[^ ]*" <<<"$2" | head -1 | cut -d= -f2; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader || true
for s in ${SECTIONS:-check stats sweep mha torch}; do
  case $s in
    check)
      echo "## --check, L=1000, 12 steps (auto unless said)"
      CHECKS=${CHECKS:-"f16 1 8;f16 4 8;f16 1 32;f16 4 32;f32 1 8;f32 4 8;f32 1 32;f32 4 32;f16 1 4;f16 1 16;f16 2 8 --decode-head-lanes false;f16 1 8 --decode-prefetch true --decode-rows 2;f16 1 8 --decode-rows 8;f16 1 8 --decode-cyclic true"}
      IFS=';' read -ra cases <<<"$CHECKS"
      for c in "${cases[@]}"; do
        read -r kv b hkv extra <<<"$c"
        # shellcheck disable=SC2086
        o=$("$KPC" attention "${common[@]}" --kv "$kv" --batch "$b" --kv-heads "$hkv" --prompt 1000 \
          --steps 12 --check $extra 2>&1)
        echo "$kv B=$b Hkv=$hkv $extra: $(sed -n 's/^kernels (decode: \(.*\), prefill:.*/\1/p' <<<"$o" | head -1) | $(grep -iE '^check|error' <<<"$o" | tr '\n' ' ')"
      done
      ;;
    stats)
      echo "## driver statistics of the decode kernel per variant (Hkv=8, L=4096)"
      for extra in "" "--decode-head-lanes false" "--decode-prefetch true --decode-rows 2" \
                   "--decode-prefetch true --decode-rows 4" "--decode-rows 6" "--decode-rows 8"; do
        # shellcheck disable=SC2086
        o=$("$KPC" attention "${common[@]}" --kv f16 --kv-heads 8 --prompt 4096 --steps 2 $extra 2>&1)
        echo "[$extra] $(grep -A1 '^  attn_decode_vec' <<<"$o" | grep driver: | head -1)"
      done
      ;;
    sweep)
      echo "## GQA decode sweep, B=1 Hkv=8, 50 steps back to back: label -> device µs (splits)"
      VARIANTS=${VARIANTS:-"base|$BASE|
new|$KPC|
old-reduce|$KPC|--decode-head-lanes false
pf2|$KPC|--decode-prefetch true --decode-rows 2
pf2-w1056|$KPC|--decode-prefetch true --decode-rows 2 --workgroups 1056
pf3-w784|$KPC|--decode-prefetch true --decode-rows 3 --workgroups 784
pf4-w784|$KPC|--decode-prefetch true --decode-rows 4 --workgroups 784
r6-w784|$KPC|--decode-rows 6 --workgroups 784
r8-w784|$KPC|--decode-rows 8 --workgroups 784
r8-w528|$KPC|--decode-rows 8 --workgroups 528
w1056|$KPC|--workgroups 1056
w512|$KPC|--workgroups 512
cyclic|$KPC|--decode-cyclic true"}
      for L in ${SWEEP_L:-4096 16384 32768}; do
        line="L=$L"
        while IFS='|' read -r label bin extra; do
          [ -z "$label" ] && continue
          # shellcheck disable=SC2086
          o=$("$bin" attention "${common[@]}" --kv f16 --kv-heads 8 --prompt "$L" --steps 50 --fill \
            $extra 2>&1 | grep -E '^bench: phase=decode|Register Count=[0-9]*, Binary Size=[0-9]*, Stack Size=0, Local Memory Size=[0-9]*, Shared Memory Size=10820')
          regs=$(grep -o 'Register Count=[0-9]*' <<<"$o" | head -1 | cut -d= -f2)
          o=$(grep '^bench' <<<"$o")
          line="$line | $label $(val device_us "$o") ($(val splits "$o"), ${regs:-?} regs)"
          case $label in base|new) echo "$o" ;; esac
        done <<<"$VARIANTS"
        echo "$line"
      done
      ;;
    mha)
      echo "## MHA and B=4 unchanged? base then new, device µs per step (50 steps)"
      for shp in ${MHA_SHAPES:-1:32:4096 1:32:32768 4:32:4096 4:8:16384}; do
        IFS=: read -r b hkv L <<<"$shp"
        row="B=$b Hkv=$hkv L=$L"
        for bin in "$BASE" "$KPC"; do
          o=$("$bin" attention "${common[@]}" --kv f16 --batch "$b" --kv-heads "$hkv" --prompt "$L" \
            --steps 50 --fill 2>&1 | grep '^bench: phase=decode')
          row="$row | $(val device_us "$o") ($(val splits "$o"))"
        done
        echo "$row"
      done
      ;;
    torch)
      echo "## PyTorch SDPA (same call)"
      python3 "$TORCH" --batch 1 --kv-heads 8 --decode "${TORCH_L:-4096,16384,32768}" --prefill ""
      ;;
  esac
done
