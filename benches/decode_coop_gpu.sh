#!/usr/bin/env bash
# Issue 28, item 2 on the GPU host in ONE call: the cooperative-matrix decode (attn_decode_coop)
# beside the vectorized one (attn_decode_vec) and PyTorch's cuDNN decode, with the checks. Driver
# caches off (prelude.sh). Builds nothing.
#   source .gpu/prelude.sh; benches/decode_coop_gpu.sh
# SECTIONS: any of check compare torch sweep (default all, in that order). In a 560 s call the
# PyTorch section, run last, did not finish, so it now runs before the sweep; where time is short,
# run it alone (SECTIONS=torch) in the same lease. KPC: the kpc binary (default .gpu/kpc).
# SHAPES: B:Hkv:L triples for compare; SWEEP: workgroups:local:split_min variants.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
KPC=${KPC:-.gpu/kpc}
common=(--device vulkan:gpu --heads 32 --head-dim 128)
val() { grep -o " $1=[^ ]*" <<<"$2" | head -1 | cut -d= -f2; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader || true
for s in ${SECTIONS:-check compare torch sweep}; do
  case $s in
    check)
      echo "## --check: the cooperative decode forced, and auto (the vectorized one), fp16; auto at fp32"
      for c in "1 8 1000" "4 8 1000" "1 32 1000" "4 32 1000" "2 4 3000" "1 16 777" "1 8 20"; do
        read -r b hkv L <<<"$c"
        for k in cooperative auto; do
          o=$("$KPC" attention "${common[@]}" --kv f16 --batch "$b" --kv-heads "$hkv" --prompt "$L" \
            --steps 12 --decode-kernel "$k" --check 2>&1)
          echo "f16 B=$b Hkv=$hkv L=$L $k: $(grep -o 'decode: [A-Za-z]*' <<<"$o" | head -1) | $(grep -iE '^check|error' <<<"$o" | tr '\n' ' ')"
        done
      done
      o=$("$KPC" attention "${common[@]}" --kv f16 --kv-heads 8 --prompt 1000 --steps 12 \
        --decode-kernel cooperative --q-scale 30 --check 2>&1)
      echo "f16 Hkv=8 q x30 cooperative: $(grep -iE '^check|error' <<<"$o" | tr '\n' ' ')"
      o=$("$KPC" attention "${common[@]}" --kv f32 --kv-heads 8 --prompt 1000 --steps 12 --check 2>&1)
      echo "f32 Hkv=8 auto: $(grep -o 'decode: [A-Za-z]*' <<<"$o" | head -1) | $(grep -iE '^check|error' <<<"$o" | tr '\n' ' ')"
      "$KPC" attention "${common[@]}" --kv f16 --kv-heads 8 --prompt 4096 --steps 4 --decode-kernel cooperative 2>&1 \
        | grep -E '^kernels|attn_decode|driver:' | head -8
      "$KPC" attention "${common[@]}" --kv f16 --kv-heads 8 --prompt 4096 --steps 4 2>&1 \
        | grep -E '^kernels|attn_decode|driver:' | head -8
      ;;
    compare)
      echo "## decode, fp16 K/V, 100 steps back to back (µs per step): vectorized and cooperative"
      echo "| B | Hkv | L | vec wall | vec device | coop wall | coop device | coop/vec device |"
      echo "|---|---|---|---|---|---|---|---|"
      for shp in ${SHAPES:-1:8:1024 1:8:4096 1:8:16384 1:8:32768 1:32:1024 1:32:4096 1:32:16384 1:32:32768 4:32:4096 4:32:16384 4:8:16384}; do
        IFS=: read -r b hkv L <<<"$shp"
        row="| $b | $hkv | $L |"
        for k in vectorized cooperative; do
          o=$("$KPC" attention "${common[@]}" --kv f16 --batch "$b" --kv-heads "$hkv" --prompt "$L" \
            --steps 100 --fill --decode-kernel "$k" 2>&1 | grep '^bench: phase=decode')
          w=$(val wall_us "$o") d=$(val device_us "$o")
          row="$row $w | $d |"
          [ "$k" = vectorized ] && dv=$d
        done
        echo "$row $(awk -v a="$d" -v b="$dv" 'BEGIN { if (b > 0) printf "%.3f", a / b }') |"
      done
      ;;
    sweep)
      echo "## cooperative decode sweep (B=1 Hkv=8): workgroups:local:split_min -> device µs (splits)"
      for L in ${SWEEP_L:-4096 16384 32768}; do
        line="L=$L"
        for v in ${SWEEP:-1024:128:128 512:128:128 256:128:128 2048:128:128 1024:64:128 512:64:128}; do
          IFS=: read -r w loc split <<<"$v"
          o=$("$KPC" attention "${common[@]}" --kv f16 --kv-heads 8 --prompt "$L" --steps 50 --fill \
            --decode-kernel cooperative --workgroups "$w" --decode-local "$loc" \
            --decode-split-min "$split" 2>&1 | grep '^bench: phase=decode')
          line="$line | $v $(val device_us "$o") ($(val splits "$o"))"
        done
        echo "$line"
      done
      ;;
    torch)
      echo "## PyTorch SDPA (same call)"
      python3 "$here/attention_torch.py" --batch 1 --kv-heads 8 --decode 1024,4096,16384,32768 --prefill ""
      python3 "$here/attention_torch.py" --batch 1 --kv-heads 32 --decode 1024,4096,16384,32768 --prefill ""
      python3 "$here/attention_torch.py" --batch 4 --kv-heads 32 --decode 4096,16384 --prefill ""
      python3 "$here/attention_torch.py" --batch 4 --kv-heads 8 --decode 16384 --prefill ""
      ;;
  esac
done
