#!/usr/bin/env bash
# Issue 41's end-of-session call on the GPU host, for the merged main (prebuilt binaries only, driver
# caches off: source .gpu/prelude.sh first): what Auto picks and whether it is right on both
# backends, and causal prefill beside FA2 and cuDNN in the same call.
#   tests    kpc-attention's test binary (TESTS) on the device: the mma GEMM's tiles against float64,
#            the mma prefill, the inline-PTX probe, the prefill references (OpenCL and Vulkan)
#   check    kpc attention --check (L=1000, 12 steps) on opencl:gpu and vulkan:gpu, B=1/4, Hkv=32/8,
#            fp16 and f32 K/V; kpc attention --layer mha --check on opencl:gpu
#   prefill  causal prefill, B=1 H=32 D=128 fp16, Auto on opencl:gpu and vulkan:gpu, median of 5
#   torch    PyTorch SDPA (FA2, cuDNN) at the same lengths
#   cargo build --release -p kpc-cli; cargo test --release -p kpc-attention --no-run
#   ../shared/gpu/pack.sh benches/final41_gpu.sh benches/attention_torch.py   (+ the test binary as .gpu/attention-test)
#   on the GPU host:  source .gpu/prelude.sh; TESTS=.gpu/attention-test bash .gpu/final41_gpu.sh
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
KPC=${KPC:-.gpu/kpc}
out=${OUT:-/tmp}
L=${PREFILL_L:-2048 4096 8192}
val() { grep -o " $1=[^ ]*" <<<"$2" | head -1 | cut -d= -f2; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader || true
for s in ${SECTIONS:-tests check prefill torch}; do
  case $s in
    tests)
      [ -x "${TESTS:-}" ] || { echo "tests: no TESTS binary"; continue; }
      echo "## kpc-attention tests on the device"
      (cd kpc-attention && KPC_TEST_REQUIRE_DRIVERS=1 timeout ${TESTS_TIMEOUT:-150} "$OLDPWD/$TESTS" gemm_mma mma_prefill ptx prefill_matches \
        chunked --test-threads 4 2>&1) | tee "$out/tests.txt" | grep -E '^test |test result|panicked' | tail -40
      ;;
    check)
      echo "## --check (Auto): device B Hkv kv -> kernels | result"
      for dev in opencl:gpu vulkan:gpu; do
        for c in "1 32 f16" "4 32 f16" "1 8 f16" "4 8 f16" "1 8 f32" "4 32 f32"; do
          read -r b hkv kv <<<"$c"
          o=$("$KPC" attention --device "$dev" --heads 32 --head-dim 128 --kv "$kv" --batch "$b" --kv-heads "$hkv" \
            --prompt 1000 --steps 12 --check 2>&1)
          echo "$o" >>"$out/checks.txt"
          echo "$dev B=$b Hkv=$hkv $kv: $(grep -m1 '^kernels' <<<"$o") | $(grep -iE '^check|error|^kpc: ' <<<"$o" | tr '\n' ' ')"
        done
      done
      for shape in "--heads 32 --kv-heads 8 --head-dim 128 --prompt 130 --steps 2 --kv f16 --batch 4" \
        "--heads 8 --kv-heads 8 --head-dim 64 --prompt 200 --steps 2 --kv f16 --batch 4" \
        "--heads 4 --kv-heads 2 --head-dim 16 --prompt 10 --steps 3 --kv f32"; do
        for cross in "" "--cross 24"; do
          # shellcheck disable=SC2086
          o=$("$KPC" attention --layer mha --device opencl:gpu $shape $cross --check 2>&1)
          echo "$o" >>"$out/mha-checks.txt"
          echo "mha opencl:gpu $shape $cross: $(grep -o 'prefill projects with [a-z_]*' <<<"$o") | $(grep -iE '^check|error|^kpc: ' <<<"$o" | tr '\n' ' ')"
        done
      done
      ;;
    prefill)
      echo "## causal prefill, B=1 H=32 D=128 fp16, Auto, median of 5: TFLOP/s"
      for n in $L; do
        row="L=$n"
        for dev in opencl:gpu vulkan:gpu; do
          o=$("$KPC" attention --device "$dev" --heads 32 --head-dim 128 --kv f16 --prompt "$n" --steps 0 \
            --prefill-runs 5 2>&1)
          echo "$o" >>"$out/prefill.txt"
          row="$row | $dev $(val tflops "$(grep '^bench: phase=prefill' <<<"$o")") ($(grep -m1 -o 'prefill: [A-Za-z]*' <<<"$o"))"
        done
        echo "$row"
      done
      ;;
    torch)
      echo "## PyTorch SDPA prefill"
      python3 "$here/attention_torch.py" --batch 1 --heads 32 --head-dim 128 --decode "" --prefill "${L// /,}" 2>&1 |
        tee "$out/torch.txt" | tail -12
      ;;
  esac
done
