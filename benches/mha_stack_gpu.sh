#!/usr/bin/env bash
# One call on the GPU host for issue 40's decoder table: kpc's MultiHeadAttention layers chained on
# the device (`kpc attention --layer mha --layers N`, one submission per step) on Vulkan and
# NVIDIA's OpenCL, one layer and an N-layer stack, beside PyTorch doing the same steps by CUDA-graph
# replay (benches/mha_torch.py --stack N), then a table. Builds nothing.
#   source .gpu/prelude.sh; KPC=.gpu/kpc .gpu/mha_stack_gpu.sh
# SECTIONS: any of check kpc torch (default all). DECODE_L (1024 4096 16384), KV_HEADS (32 8),
# LAYERS (8), DEVICES (vulkan:gpu opencl:gpu). Logs and the table go to $OUT (or /tmp):
# stack-check.txt, stack-vulkan.txt, stack-opencl.txt, stack-torch.txt, stack-table.md.
#
# kpc's rows: fp16 weights, K/V and activations, E=4096, H=32, D=128, B=1; a row at L prefills L-25
# positions and takes 50 steps, so the median step attends L. Per step: device time (the step's one
# submission, first launch's start to last launch's end), wall time (the step call until the host's
# wait returns, the input already on the device), and the floor (weights + K/V read at the copy
# bandwidth measured in the same run); medians of 50 steps.
set -uo pipefail
export KPC=${KPC:-.gpu/kpc}
out=${OUT:-/tmp}
here=$(dirname "$0")
sections=${SECTIONS:-check kpc torch}
decode_l=${DECODE_L-1024 4096 16384}
kv_heads=${KV_HEADS:-32 8}
layers=${LAYERS:-8}
devices=${DEVICES:-vulkan:gpu opencl:gpu}
KPC_CACHE_DIR=$(mktemp -d)
export KPC_CACHE_DIR
unset KPC_DEVICE
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader || true

for s in $sections; do
  case $s in
    check)
      for dev in $devices; do
        for act in f16 f32; do
          o=$("$KPC" attention --layer mha --device "$dev" --heads 32 --kv-heads 8 --head-dim 128 --prompt 12 \
            --steps 4 --layers 4 --cross 8 --kv "$act" --activations "$act" --check 2>&1)
          echo "$o" >>"$out/stack-check.txt"
          echo "$dev $act: $(grep -E '^(check|bench):' <<<"$o" | tr '\n' ' ')"
        done
      done
      ;;
    kpc)
      for sel in $devices; do
        dev=${sel%%:*}
        {
          for hkv in $kv_heads; do
            for L in $decode_l; do
              for n in 1 "$layers"; do
                echo "# Hkv=$hkv L=$L layers=$n"
                "$KPC" attention --layer mha --device "$sel" --heads 32 --head-dim 128 --kv-heads "$hkv" \
                  --kv f16 --activations f16 --prompt $((L - 25)) --steps 50 --layers "$n" 2>&1
              done
            done
          done
        } >"$out/stack-$dev.txt"
        echo "## kpc $sel"
        grep -E '^(# |bench: |step:|device:|kernels|error|Error|kpc:)' "$out/stack-$dev.txt"
      done
      ;;
    torch)
      PYTHONUNBUFFERED=1 python3 "$here/mha_torch.py" --embed 4096 --heads 32 --kv-heads "${kv_heads// /,}" \
        --decode "${decode_l// /,}" --prefill "" --stack "$layers" 2>&1 | grep '^torch:' | tee "$out/stack-torch.txt"
      ;;
  esac
done

val() { grep -o " $1=[^ ]*" <<<" $2" | head -1 | cut -d= -f2; }
line() { # the bench line of a kpc log section
  local f=$out/stack-$1.txt
  [ -f "$f" ] || return
  awk -v h="# $2" '$0 == h {on = 1; next} /^# / {on = 0} on && /^bench: phase=mha_stack/ {print; exit}' "$f"
}
r() { awk -v a="$1" -v b="$2" 'BEGIN { if (a == "" || b == "" || b == 0) print "-"; else printf "%.2f", a / b }'; }
{
  echo "| backend | Hkv | L | 1 layer: wall / device / floor µs | wall − device µs | $layers layers: wall / device / floor µs | wall − device µs | $layers-layer device / 1-layer device | PyTorch 1 layer / $layers layers µs (graph) | device / PyTorch, 1 layer / $layers layers |"
  echo "|---|---|---|---|---|---|---|---|---|---|"
  for sel in $devices; do
    dev=${sel%%:*}
    for hkv in $kv_heads; do
      for L in $decode_l; do
        a=$(line "$dev" "Hkv=$hkv L=$L layers=1")
        b=$(line "$dev" "Hkv=$hkv L=$L layers=$layers")
        t1=$(val step_us "$(grep "^torch: phase=decode Hkv=$hkv L=$L " "$out/stack-torch.txt" 2>/dev/null)")
        tn=$(val step_us "$(grep "^torch: phase=stack layers=$layers Hkv=$hkv L=$L " "$out/stack-torch.txt" 2>/dev/null)")
        aw=$(val wall_us "$a") ad=$(val device_us "$a") af=$(val floor_us "$a")
        bw=$(val wall_us "$b") bd=$(val device_us "$b") bf=$(val floor_us "$b")
        echo "| $dev | $hkv | $L | $aw / $ad / $af | $(awk -v a="$aw" -v b="$ad" 'BEGIN{printf "%.1f", a-b}') |" \
          "$bw / $bd / $bf | $(awk -v a="$bw" -v b="$bd" 'BEGIN{printf "%.1f", a-b}') | $(r "$bd" "$ad") |" \
          "${t1:--} / ${tn:--} | $(r "$ad" "$t1") / $(r "$bd" "$tn") |"
      done
    done
  done
} | tee "$out/stack-table.md"
