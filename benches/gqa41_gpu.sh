#!/usr/bin/env bash
# Issue 41 item 4, GQA decode on the GPU host in ONE call: the vectorized kernel's narrow (8-byte
# chunks, 32 lanes per row) and merge-all variants beside main's binary, their checks, and PyTorch's
# cuDNN decode from CUDA graphs. Prebuilt binaries only; driver caches off (prelude.sh).
#   source .gpu/prelude.sh; KPC=.gpu/kpc-gqa BASE=.gpu/kpc-base TORCH=.gpu/attention_torch.py .gpu/gqa41_gpu.sh
# SECTIONS: any of check sweep mha torch (default: check sweep torch). VARIANTS: `label|binary|flags` lines.
set -uo pipefail
KPC=${KPC:-.gpu/kpc-gqa}
BASE=${BASE:-.gpu/kpc-base}
TORCH=${TORCH:-.gpu/attention_torch.py}
common=(--device vulkan:gpu --heads 32 --head-dim 128)
val() { grep -o " $1=[^ ]*" <<<"$2" | head -1 | cut -d= -f2; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader || true
for s in ${SECTIONS:-check sweep torch}; do
  case $s in
    check)
      echo "## --check, L=1000, 12 steps"
      CHECKS=${CHECKS:-"f16 1 8;f16 4 8;f16 1 32;f16 4 32;f32 1 8;f32 4 8;f32 1 32;f32 4 32"}
      IFS=';' read -ra cases <<<"$CHECKS"
      while IFS= read -r flags; do
        for c in "${cases[@]}"; do
          read -r kv b hkv <<<"$c"
          # shellcheck disable=SC2086
          o=$("$KPC" attention "${common[@]}" --kv "$kv" --batch "$b" --kv-heads "$hkv" --prompt 1000 \
            --steps 12 --check $flags 2>&1)
          echo "[$flags] $kv B=$b Hkv=$hkv: $(sed -n 's/^kernels (decode: \(.*\), prefill:.*/\1/p' <<<"$o" | head -1) | $(grep -E '^check|rror' <<<"$o" | tr '\n' ' ')"
        done
      done <<<"${CHECK_FLAGS:-
--decode-narrow true --decode-rows 8
--decode-narrow true --decode-rows 8 --decode-merge-all true
--decode-merge-all true}"
      ;;
    sweep)
      echo "## GQA decode sweep, B=1 Hkv=8, 50 steps back to back: label -> device µs (splits, regs, shared)"
      VARIANTS=${VARIANTS:-"base|$BASE|
new|$KPC|
merge|$KPC|--decode-merge-all true
n4|$KPC|--decode-narrow true --decode-rows 4
n8|$KPC|--decode-narrow true --decode-rows 8
n12|$KPC|--decode-narrow true --decode-rows 12
n16|$KPC|--decode-narrow true --decode-rows 16
n8-merge|$KPC|--decode-narrow true --decode-rows 8 --decode-merge-all true
n8-w528|$KPC|--decode-narrow true --decode-rows 8 --workgroups 528
n8-w2112|$KPC|--decode-narrow true --decode-rows 8 --workgroups 2112
n16-w528|$KPC|--decode-narrow true --decode-rows 16 --workgroups 528
n8-l256|$KPC|--decode-narrow true --decode-rows 8 --decode-local 256
n8-nohl|$KPC|--decode-narrow true --decode-rows 8 --decode-head-lanes false
r6-merge|$KPC|--decode-rows 6 --decode-merge-all true
new2|$KPC|"}
      for L in ${SWEEP_L:-4096 16384 32768}; do
        line="L=$L"
        while IFS='|' read -r label bin extra; do
          [ -z "$label" ] && continue
          # shellcheck disable=SC2086
          o=$("$bin" attention "${common[@]}" --kv f16 --kv-heads 8 --prompt "$L" --steps 50 --fill \
            $extra 2>&1)
          st=$(grep -A1 '^  attn_decode_vec' <<<"$o" | grep -o 'Register Count=[0-9]*\|Shared Memory Size=[0-9]*\|Local Memory Size=[0-9]*' | cut -d= -f2 | tr '\n' '/')
          b=$(grep '^bench: phase=decode' <<<"$o")
          echo "$L $label: $b | stats $st | $(sed -n 's/^kernels (decode: \(.*\), prefill:.*/\1/p' <<<"$o" | head -1)" >>"${OUT:-/tmp}/sweep-full.txt"
          line="$line | $label $(val device_us "$b") ($(val splits "$b"), ${st:-?})"
        done <<<"$VARIANTS"
        echo "$line"
      done
      ;;
    mha)
      echo "## MHA (Hkv=32) and B=4, 50 steps: label -> device µs"
      for shp in ${MHA_SHAPES:-1:32:4096 1:32:32768 4:8:16384}; do
        IFS=: read -r b hkv L <<<"$shp"
        row="B=$b Hkv=$hkv L=$L"
        while IFS='|' read -r label bin extra; do
          [ -z "$label" ] && continue
          # shellcheck disable=SC2086
          o=$("$bin" attention "${common[@]}" --kv f16 --batch "$b" --kv-heads "$hkv" --prompt "$L" \
            --steps 50 --fill $extra 2>&1 | grep '^bench: phase=decode')
          row="$row | $label $(val device_us "$o")"
        done <<<"${MHA_VARIANTS:-"base|$BASE|
new|$KPC|"}"
        echo "$row"
      done
      ;;
    torch)
      echo "## PyTorch SDPA (same call)"
      python3 "$TORCH" --batch 1 --kv-heads 8 --decode "${TORCH_L:-4096,16384,32768}" --prefill ""
      ;;
  esac
done
