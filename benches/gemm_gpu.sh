#!/usr/bin/env bash
# Issue 41 items 1 and 2 on the GPU host in ONE call, so every ratio compares like with like: the
# device's matrix ceiling and the projection GEMM sweep (`kpc bench-mma`), PyTorch's F.linear at the
# same shapes (gemm_torch.py), `kpc attention --layer mha --check` with the new projection, and the
# MHA layer's prefill with the old (`--projection cooperative`: mha_gemm_coop) and new
# (`--projection wide`: mha_gemm_wide) GEMM beside PyTorch (mha_torch.py). Builds nothing.
#   cargo build --release -p kpc-cli; strip target/release/kpc
#   ../shared/gpu/pack.sh benches/gemm_gpu.sh benches/gemm_torch.py benches/gemm_table.py benches/mha_torch.py
#   on the GPU host:  source .gpu/prelude.sh; .gpu/gemm_gpu.sh
# SECTIONS: any of mma torch check layer table (default all). KPC: the kpc binary (default: the one
# beside this script, else .gpu/kpc). MMA_ARGS: extra `kpc bench-mma` arguments (e.g. --gemm ...).
# PREFILL_L (2048 8192), KV_HEADS (32), SHAPES (the GEMM shapes, MxNxK comma separated: the bench's
# and F.linear's; default the issue's four and the layer's fused Q/K/V at L = 2048 and 8192),
# LAYER_TORCH=0 (the layer section without PyTorch), CHECKS (how many of the check shapes, default all).
# Logs go to $OUT (or /tmp): bench-mma.txt, gemm-torch.txt, mha-check.txt, mha-layer.txt, mha-torch.txt, gemm-table.md.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
pick() { if [ -e "$here/$1" ]; then echo "$here/$1"; else echo "$2"; fi; }
KPC=${KPC:-$(pick kpc .gpu/kpc)}
out=${OUT:-/tmp}
prefill_l=${PREFILL_L:-2048 8192}
kv_heads=${KV_HEADS:-32}
shapes=${SHAPES:-2048x4096x4096,8192x4096x4096,2048x1024x4096,8192x1024x4096,2048x12288x4096,8192x12288x4096}
KPC_CACHE_DIR=$(mktemp -d)
export KPC_CACHE_DIR
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,temperature.gpu,power.draw --format=csv,noheader || true

for s in ${SECTIONS:-mma torch check layer table}; do
  case $s in
    mma)
      echo "## kpc bench-mma"
      # shellcheck disable=SC2086
      timeout 400 "$KPC" bench-mma --device vulkan:gpu --shapes "$shapes" ${MMA_ARGS:-} >"$out/bench-mma.txt" 2>&1
      echo "rc=$?"
      grep -E '^(device|bench: kind=(mma|copy))|FAIL|error|kpc:' "$out/bench-mma.txt" | head -40
      ;;
    torch)
      echo "## PyTorch F.linear"
      PYTHONUNBUFFERED=1 timeout 200 python3 "$(pick gemm_torch.py benches/gemm_torch.py)" --shapes "$shapes" >"$out/gemm-torch.txt" 2>&1
      cat "$out/gemm-torch.txt"
      ;;
    check)
      echo "## kpc attention --layer mha --check (Auto projection: mha_gemm_wide where it fits)"
      : >"$out/mha-check.txt"
      n_checks=0
      for shape in "--heads 4 --kv-heads 2 --head-dim 16 --prompt 10 --steps 3 --kv f16" \
        "--heads 4 --kv-heads 2 --head-dim 16 --prompt 10 --steps 3 --kv f32" \
        "--heads 32 --kv-heads 8 --head-dim 128 --prompt 32 --steps 4 --kv f16" \
        "--heads 32 --kv-heads 32 --head-dim 128 --prompt 300 --steps 2 --kv f16" \
        "--heads 32 --kv-heads 8 --head-dim 128 --prompt 130 --steps 2 --kv f16 --batch 4" \
        "--heads 8 --kv-heads 8 --head-dim 64 --prompt 200 --steps 2 --kv f16 --projection wide"; do
        [ "$((n_checks += 1))" -le "${CHECKS:-99}" ] || break
        for cross in "" "--cross 24"; do
          # shellcheck disable=SC2086
          o=$(timeout 120 "$KPC" attention --layer mha --device vulkan:gpu $shape $cross --check 2>&1)
          rc=$?
          echo "$o" >>"$out/mha-check.txt"
          echo "$shape $cross: rc=$rc $(grep -o 'prefill projects with [a-z_]*' <<<"$o") | $(grep '^check:' <<<"$o" || tail -1 <<<"$o")"
        done
      done
      ;;
    layer)
      echo "## MHA layer prefill, old and new projection GEMM"
      : >"$out/mha-layer.txt"
      for hkv in $kv_heads; do
        for L in $prefill_l; do
          for proj in cooperative wide; do
            echo "# Hkv=$hkv L=$L projection=$proj" >>"$out/mha-layer.txt"
            timeout 120 "$KPC" attention --layer mha --device vulkan:gpu --heads 32 --head-dim 128 --kv-heads "$hkv" \
              --kv f16 --prompt "$L" --steps 0 --prefill-runs 5 --projection "$proj" >>"$out/mha-layer.txt" 2>&1
          done
        done
      done
      grep -E '^(# |bench: phase=mha_prefill|prefill:)' "$out/mha-layer.txt"
      [ "${LAYER_TORCH:-1}" = 1 ] || continue
      PYTHONUNBUFFERED=1 timeout 200 python3 "$(pick mha_torch.py benches/mha_torch.py)" --kv-heads "${kv_heads// /,}" \
        --decode "" --prefill "${prefill_l// /,}" >"$out/mha-torch.txt" 2>&1
      grep -E '^torch: phase=(prefill|copy)' "$out/mha-torch.txt"
      ;;
    table)
      python3 "$(pick gemm_table.py benches/gemm_table.py)" "$out" | tee "$out/gemm-table.md"
      ;;
  esac
done
