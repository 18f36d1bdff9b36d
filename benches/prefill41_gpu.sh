#!/usr/bin/env bash
# Issue 41, item 3 on the GPU host in ONE call: causal prefill (B=1, H=32, D=128, fp16 K/V) with the
# cooperative-matrix kernel's tiles (16-row blocks per subgroup, keys per tile, prefetch), main's
# binary beside it, the device's matrix ceiling (kpc bench-mma), PyTorch's FA2 and cuDNN, the checks,
# and the OpenCL inline-PTX probe (item 5). Driver caches off (prelude.sh). Builds nothing.
#   source .gpu/prelude.sh; KPC=.gpu/kpc-prefill BASE=.gpu/kpc-base .gpu/prefill41_gpu.sh
# SECTIONS: any of ceiling tests check sweep torch probe (default all but check's extra cases). VARIANTS: `label|binary|flags` lines;
# SWEEP_L: prompt lengths; RUNS: timed prefills per figure (median).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
KPC=${KPC:-.gpu/kpc-prefill}
BASE=${BASE:-.gpu/kpc-base}
TORCH=${TORCH:-$here/attention_torch.py}
out=${OUT:-/tmp}
common=(--device vulkan:gpu --heads 32 --head-dim 128)
val() { grep -o " $1=[^ ]*" <<<"$2" | head -1 | cut -d= -f2; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader || true
for s in ${SECTIONS:-ceiling tests sweep torch check probe}; do
  case $s in
    tests)
      # kpc-attention's test binary (TESTS: its path), run from the crate's folder.
      if [ -x "${TESTS:-}" ]; then
        echo "## attention tests on the device (Vulkan prefill)"
        (cd kpc-attention && KPC_TEST_REQUIRE_DRIVERS=1 "$TESTS" vulkan::coop_prefill vulkan::prefill_matches \
          vulkan::chunked vulkan::cm2_prefill --test-threads 4 2>&1) | tee "$out/tests.txt" | grep -E '^test |test result|panicked' | tail -12
      fi
      ;;
    ceiling)
      echo "## kpc bench-mma (peak, copy)"
      "$KPC" bench-mma --device vulkan:gpu --sections peak,copy 2>&1 | tee "$out/bench-mma.txt" | tail -20
      ;;
    check)
      echo "## --check, L=1000, 12 steps (auto unless said)"
      CHECKS=${CHECKS:-"f16 1 32;f16 4 32;f16 1 8;f16 4 8;f32 1 32;f32 4 32;f32 1 8;f32 4 8"}
      IFS=';' read -ra cases <<<"$CHECKS"
      for c in "${cases[@]}"; do
        read -r kv b hkv extra <<<"$c"
        # shellcheck disable=SC2086
        o=$("$KPC" attention "${common[@]}" --kv "$kv" --batch "$b" --kv-heads "$hkv" --prompt 1000 \
          --steps 12 --check $extra 2>&1)
        echo "$o" >>"$out/checks.txt"
        echo "$kv B=$b Hkv=$hkv $extra: $(sed -n 's/^kernels (decode: .*, prefill: \(.*\)):$/\1/p' <<<"$o" | head -1) | $(grep -iE '^check|error' <<<"$o" | tr '\n' ' ')"
      done
      ;;
    sweep)
      echo "## causal prefill, B=1 H=32 D=128 fp16 K/V, median of ${RUNS:-5}: label -> TFLOP/s (registers, local memory bytes)"
      VARIANTS=${VARIANTS:-"base|$BASE|"}
      for L in ${SWEEP_L:-2048 4096 8192}; do
        line="L=$L"
        while IFS='|' read -r label bin extra; do
          [ -z "$label" ] && continue
          # shellcheck disable=SC2086
          o=$("$bin" attention "${common[@]}" --kv f16 --prompt "$L" --steps 0 --prefill-runs "${RUNS:-5}" \
            $extra 2>&1)
          echo "### $label L=$L $extra" >>"$out/sweep-raw.txt"
          echo "$o" >>"$out/sweep-raw.txt"
          st=$(grep -A1 '^  attn_prefill_coop' <<<"$o" | grep driver: | head -1)
          regs=$(grep -o 'Register Count=[0-9]*' <<<"$st" | cut -d= -f2)
          lm=$(grep -o 'Local Memory Size=[0-9]*' <<<"$st" | cut -d= -f2)
          [ -n "$lm" ] && lm=$((lm % 68719476736))
          b=$(grep '^bench: phase=prefill' <<<"$o") || { line="$line | $label failed: $(grep -iE 'error' <<<"$o" | head -1)"; continue; }
          line="$line | $label $(val tflops "$b") (${regs:-?}r ${lm:-?}B)"
        done <<<"$VARIANTS"
        echo "$line"
      done
      ;;
    torch)
      echo "## PyTorch SDPA prefill"
      python3 "$TORCH" --batch 1 --heads 32 --head-dim 128 --decode "" --prefill 2048,4096,8192 2>&1 | tee "$out/torch.txt" | tail -12
      ;;
    probe)
      echo "## OpenCL inline PTX mma.sync probe"
      src=$here/ocl_mma_probe.c
      [ -e "$src" ] || src=benches/ocl_mma_probe.c
      bin=$here/ocl_mma_probe
      if ! "$bin" NVIDIA 2>&1 | tee "$out/ocl-mma-probe.txt"; then
        echo "(the carried build failed: building here)"
        gcc -O2 -o /tmp/ocl_mma_probe "$src" -I/usr/local/cuda/include -L/usr/local/cuda/lib64 -lOpenCL 2>&1 | tail -3
        /tmp/ocl_mma_probe NVIDIA 2>&1 | tee "$out/ocl-mma-probe.txt"
      fi
      ;;
  esac
done
