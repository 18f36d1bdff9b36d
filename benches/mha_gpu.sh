#!/usr/bin/env bash
# One call on the GPU host for issue 27's table: kpc's MultiHeadAttention layer on Vulkan and on
# NVIDIA's OpenCL (the GPU device of each; opencl:0 is PoCL there), and PyTorch doing the same work
# (benches/mha_torch.py), in the same call, then a side-by-side table with ratios. Builds nothing.
#   source .gpu/prelude.sh; benches/mha_gpu.sh          (or .gpu/mha_gpu.sh after pack.sh)
# SECTIONS: any of check kpc torch (default all three). KPC: the kpc binary (default .gpu/kpc).
# DECODE_L, PREFILL_L, KV_HEADS: the shapes (defaults 1024 4096 16384 / 2048 8192 / 32 8; an empty
# DECODE_L or PREFILL_L runs none); HEADS and HEAD_DIM (32, 128: E = 4096) only to try the script on
# a small device. DEVICES: the kpc devices (default vulkan:gpu opencl:gpu; each log is named after
# its backend).
# Full logs go to $OUT (or /tmp): mha-check.txt, mha-vulkan.txt, mha-opencl.txt, mha-torch.txt,
# mha-table.md.
#
# kpc's figures are device time (GPU timestamps around each of a step's submissions: the fused Q/K/V
# projection, the K/V append and attention, the output projection; summed), median of 50 steps; a
# decode row at L runs a prompt of L-25 and 50 steps, so the median step attends L positions. Prefill
# rows are the median of 5 whole-layer prefills (--prefill-runs 5). PyTorch's are CUDA-graph replays.
set -uo pipefail
export KPC=${KPC:-.gpu/kpc}
out=${OUT:-/tmp}
here=$(dirname "$0")
sections=${SECTIONS:-check kpc torch}
decode_l=${DECODE_L-1024 4096 16384}
prefill_l=${PREFILL_L-2048 8192}
kv_heads=${KV_HEADS:-32 8}
heads=${HEADS:-32}
head_dim=${HEAD_DIM:-128}
devices=${DEVICES:-vulkan:gpu opencl:gpu}
KPC_CACHE_DIR=$(mktemp -d)
export KPC_CACHE_DIR
unset KPC_DEVICE
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader || true
"$KPC" devices 2>&1 | grep -v '^$' | head -20

for s in $sections; do
  case $s in
    check)
      echo "## kpc attention --layer mha --check"
      for dev in $devices; do
        # A small shape in both storage types, and the benchmark's E = 4096 (GQA, fp16).
        for shape in "--heads 4 --kv-heads 2 --head-dim 16 --prompt 10 --steps 3 --kv f16" \
          "--heads 4 --kv-heads 2 --head-dim 16 --prompt 10 --steps 3 --kv f32" \
          "--heads 32 --kv-heads 8 --head-dim 128 --prompt 32 --steps 4 --kv f16"; do
          for cross in "" "--cross 24"; do
            {
              # shellcheck disable=SC2086
              o=$("$KPC" attention --layer mha --device "$dev" $shape $cross --check 2>&1)
              rc=$?
              echo "$o" >>"$out/mha-check.txt"
              echo "$dev $shape $cross: rc=$rc $(grep '^check:' <<<"$o" || tail -1 <<<"$o")"
            }
          done
        done
      done 2>&1 | tee -a "$out/mha-check.txt.summary"
      cat "$out/mha-check.txt.summary" >>"$out/mha-check.txt"
      rm -f "$out/mha-check.txt.summary"
      ;;
    kpc)
      for sel in $devices; do
        dev=${sel%%:*}
        echo "## kpc $sel"
        {
          for hkv in $kv_heads; do
            for L in $decode_l; do
              echo "# decode Hkv=$hkv L=$L"
              "$KPC" attention --layer mha --device "$sel" --heads "$heads" --head-dim "$head_dim" --kv-heads "$hkv" \
                --kv f16 --prompt $((L - 25)) --steps 50 --prefill-runs 3 2>&1
            done
            for L in $prefill_l; do
              echo "# prefill Hkv=$hkv L=$L"
              "$KPC" attention --layer mha --device "$sel" --heads "$heads" --head-dim "$head_dim" --kv-heads "$hkv" \
                --kv f16 --prompt "$L" --steps 0 --prefill-runs 5 2>&1
            done
          done
        } >"$out/mha-$dev.txt"
        grep -E '^(# |bench: |device:|kernels|  mha|error|Error)' "$out/mha-$dev.txt"
      done
      ;;
    torch)
      echo "## PyTorch"
      PYTHONUNBUFFERED=1 python3 "$here/mha_torch.py" --embed $((heads * head_dim)) --heads "$heads" --kv-heads "${kv_heads// /,}" \
        --decode "${decode_l// /,}" --prefill "${prefill_l// /,}" 2>&1 | tee "$out/mha-torch.txt"
      ;;
  esac
done

# The side-by-side table, from the logs of this call.
[ -f "$out/mha-torch.txt" ] || exit 0
val() { grep -o " $1=[^ ]*" <<<" $2" | head -1 | cut -d= -f2; }
# The bench line of a kpc log section ("# decode Hkv=32 L=1024").
kpc_line() {
  local f=$out/mha-$1.txt
  [ -f "$f" ] || return
  awk -v h="# $2" -v p="bench: phase=$3" '$0 == h {on = 1; next} /^# / {on = 0} on && index($0, p) == 1 {print; exit}' "$f"
}
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a == "" || b == "" || b == 0 || a == "nan" || b == "nan") print "-"; else printf "%.2f", a / b }'; }
{
  copy=$(val gbs "$(grep '^torch: phase=copy' "$out/mha-torch.txt")")
  echo "Decode step, fp16 weights and K/V, E=$((heads * head_dim)) H=$heads D=$head_dim B=1; µs per step (kpc: device time, sum of"
  echo "the step's submissions; PyTorch: CUDA-graph replay). Floor: projection weights + K/V at the copy"
  echo "bandwidth of this call (${copy} GB/s, 256 MiB copy_, read+write)."
  echo
  echo "| Hkv | L | kpc Vulkan µs (proj + attn) | kpc Vulkan wall µs | kpc OpenCL µs (proj + attn) | kpc OpenCL wall µs | PyTorch µs (SDPA) | PyTorch proj / attn µs | PyTorch best µs | floor µs | Vulkan / PyTorch | OpenCL / PyTorch | Vulkan / floor | OpenCL / floor |"
  echo "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
  for hkv in $kv_heads; do
    for L in $decode_l; do
      t=$(grep "^torch: phase=decode Hkv=$hkv L=$L " "$out/mha-torch.txt")
      vk=$(kpc_line vulkan "decode Hkv=$hkv L=$L" mha_self)
      cl=$(kpc_line opencl "decode Hkv=$hkv L=$L" mha_self)
      ts=$(val step_us "$t") fl=$(val floor_us "$t")
      vd=$(val device_us "$vk") cd=$(val device_us "$cl")
      echo "| $hkv | $L | ${vd:--} ($(val proj_us "$vk") + $(val attn_us "$vk")) | $(val wall_us "$vk") |" \
        "${cd:--} ($(val proj_us "$cl") + $(val attn_us "$cl")) | $(val wall_us "$cl") |" \
        "$ts ($(val sdpa "$t")) | $(val proj_us "$t") / $(val attn_us "$t") | $(val best_us "$t") ($(val best "$t")) |" \
        "$fl | $(ratio "$vd" "$ts") | $(ratio "$cd" "$ts") | $(ratio "$vd" "$fl") | $(ratio "$cd" "$fl") |"
    done
  done
  echo
  echo "Prefill (projections + K/V append + causal attention), TFLOP/s = (2·L·E·(E + 2·Hkv·D) + 2·L·E² +"
  echo "2·H·L²·D) / time; kpc: median of 5, device time; PyTorch: CUDA-graph replay."
  echo
  echo "| Hkv | L | kpc Vulkan ms (TFLOP/s) | kpc Vulkan proj / attn ms | kpc OpenCL ms (TFLOP/s) | kpc OpenCL proj / attn ms | PyTorch ms (TFLOP/s, SDPA) | PyTorch best TFLOP/s | Vulkan / PyTorch | OpenCL / PyTorch |"
  echo "|---|---|---|---|---|---|---|---|---|---|"
  for hkv in $kv_heads; do
    for L in $prefill_l; do
      t=$(grep "^torch: phase=prefill Hkv=$hkv L=$L " "$out/mha-torch.txt")
      vk=$(kpc_line vulkan "prefill Hkv=$hkv L=$L" mha_prefill)
      cl=$(kpc_line opencl "prefill Hkv=$hkv L=$L" mha_prefill)
      tt=$(val tflops "$t")
      echo "| $hkv | $L | $(val device_ms "$vk") ($(val tflops "$vk")) | $(val proj_ms "$vk") / $(val attn_ms "$vk") |" \
        "$(val device_ms "$cl") ($(val tflops "$cl")) | $(val proj_ms "$cl") / $(val attn_ms "$cl") |" \
        "$(val ms "$t") ($tt, $(val sdpa "$t")) | $(val best_tflops "$t") ($(val best "$t")) |" \
        "$(ratio "$(val tflops "$vk")" "$tt") | $(ratio "$(val tflops "$cl")" "$tt") |"
    done
  done
} | tee "$out/mha-table.md"
