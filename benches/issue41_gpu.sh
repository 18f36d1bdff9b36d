#!/usr/bin/env bash
# Issue 41 in ONE call on the GPU host: the matrix ceiling, the projection GEMMs, causal prefill and
# GQA decode, each beside PyTorch (cuBLAS, FA2, cuDNN) measured in the same call, then the reference
# checks and the attention tests on the device. Prebuilt binaries only; source .gpu/prelude.sh first
# (driver caches off). Files flat in .gpu/: kpc, attention-test (kpc-attention's test binary), this
# script, attention_torch.py, mha_torch.py, gemm_torch.py, ocl_mma_probe.c, ocl_gemm_mma.c, mha_gemm_mma.cl,
# ptx_probe.cl.
#   cargo build --release -p kpc-cli; cargo test --release -p kpc-attention --no-run
#   ../shared/gpu/pack.sh benches/{issue41_gpu.sh,attention_torch.py,mha_torch.py,gemm_torch.py,ocl_mma_probe.c,ocl_gemm_mma.c} \
#     kpc-attention/kernels/{mha_gemm_mma,ptx_probe}.cl      (+ the test binary, stripped, as .gpu/attention-test)
#   on the GPU host: source .gpu/prelude.sh; OUT=$OUT bash .gpu/issue41_gpu.sh
#   Every section takes ~10 minutes on an H200, past one call's limit: run it as two calls,
#   SECTIONS='prefill gemm ceiling layer decode' and SECTIONS='check tests'.
# Sections (SECTIONS; default all, prefill gemm ceiling layer decode check tests):
#   ceiling  Vulkan: kpc bench-mma peak and copy (KHR and cm2 register-fed and shared-fed, copy
#            bandwidth); OpenCL: the register-fed inline-PTX mma.sync peak (ocl_mma_probe)
#   gemm     the four projection shapes: Vulkan mha_gemm_wide (VK_GEMM tiles, bench-mma, checked
#            against float64), OpenCL mha_gemm_mma (the harness once per OCL_GEMM variant filter,
#            checked against float64), cuBLAS F.linear
#   prefill  causal prefill B=1 H=32 D=128 fp16, Auto on opencl:gpu and vulkan:gpu; FA2 and cuDNN
#   layer    the MHA layer's prefill (projections and attention) through kpc on both backends
#            (LAYER_L), beside PyTorch's F.linear + SDPA from CUDA graphs (mha_torch.py)
#   decode   GQA (Hkv=8) and MHA decode, B=1 H=32 D=128 fp16 K/V, 50 steps, Auto on vulkan:gpu;
#            cuDNN's SDPA from CUDA graphs
#   check    kpc attention --check on both backends (B=1/4, Hkv=32/8, fp16 and f32) and
#            kpc attention --layer mha --check (three shapes on OpenCL, one on Vulkan; self and cross)
#   tests    the attention tests that need the device's kernels (TESTS_FILTER)
set -uo pipefail
g=$(cd "$(dirname "$0")" && pwd)
KPC=${KPC:-$g/kpc}
out=${OUT:-/tmp}
shapes=${SHAPES:-2048x4096x4096,8192x4096x4096,2048x1024x4096,8192x1024x4096}
VK_GEMM=${VK_GEMM:-128x256x32/2x4:a16:acc32,128x128x64/2x4a2:a16:acc32,128x128x32/2x2s1:a16:acc32}
PREFILL_L=${PREFILL_L:-2048 4096 8192}
DECODE_L=${DECODE_L:-4096 16384 32768}
val() { grep -o " $1=[^ ]*" <<<"$2" | head -1 | cut -d= -f2; }
ocl() { OCL_ICD_FILENAMES=libnvidia-opencl.so.1 OCL_ICD_VENDORS=/nonexistent "$@"; }
cc_ocl() { gcc -O2 -o "$1" "$2" -I/usr/local/cuda/include -L/usr/local/cuda/lib64 -lOpenCL -lm 2>&1 | tail -5; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,temperature.gpu,power.draw \
  --format=csv,noheader || true
python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)' 2>&1 | tail -1
for s in ${SECTIONS:-prefill gemm ceiling layer decode check tests}; do
  case $s in
    ceiling)
      echo "## ceiling: Vulkan (kpc bench-mma peak,copy)"
      timeout 200 "$KPC" bench-mma --device vulkan:gpu --sections peak,copy >"$out/ceiling-vulkan.txt" 2>&1
      echo "rc=$?"
      grep -E '^device|^bench' "$out/ceiling-vulkan.txt"
      echo "## ceiling: OpenCL register-fed mma.sync (ocl_mma_probe)"
      cc_ocl /tmp/ocl_mma_probe "$g/ocl_mma_probe.c"
      ocl timeout 60 /tmp/ocl_mma_probe NVIDIA >"$out/ceiling-opencl.txt" 2>&1
      grep -E 'peak|against|device' "$out/ceiling-opencl.txt"
      ;;
    gemm)
      echo "## GEMM: Vulkan mha_gemm_wide (kpc bench-mma gemm)"
      timeout 300 "$KPC" bench-mma --device vulkan:gpu --sections gemm --shapes "$shapes" --gemm "$VK_GEMM" \
        >"$out/gemm-vulkan.txt" 2>&1
      echo "rc=$?"
      grep -E '^bench: kind=gemm|FAIL|rror' "$out/gemm-vulkan.txt"
      cc_ocl /tmp/ocl_gemm_mma "$g/ocl_gemm_mma.c"
      for v in ${OCL_GEMM:-2x4s3+hrs:a16 2x2s3+pipe:a16}; do
        echo "## GEMM: OpenCL mha_gemm_mma (harness, variants matching '$v')"
        ocl timeout 200 /tmp/ocl_gemm_mma "$g/mha_gemm_mma.cl" "$g/ptx_probe.cl" "$v" \
          >>"$out/gemm-opencl.txt" 2>&1
        echo "rc=$?"
      done
      grep -E 'probe|FAIL|time|registers|spill|device' "$out/gemm-opencl.txt" | head -60
      echo "## GEMM: cuBLAS (F.linear)"
      PYTHONUNBUFFERED=1 timeout 200 python3 "$g/gemm_torch.py" --shapes "$shapes" >"$out/gemm-torch.txt" 2>&1
      grep -E '^torch' "$out/gemm-torch.txt"
      ;;
    prefill)
      echo "## causal prefill, B=1 H=32 D=128 fp16, Auto, median of 5: TFLOP/s"
      for n in $PREFILL_L; do
        row="L=$n"
        for dev in opencl:gpu vulkan:gpu; do
          o=$(ocl "$KPC" attention --device "$dev" --heads 32 --head-dim 128 --kv f16 --prompt "$n" --steps 0 \
            --prefill-runs 5 2>&1)
          echo "$o" >>"$out/prefill.txt"
          row="$row | $dev $(val tflops "$(grep '^bench: phase=prefill' <<<"$o")") ($(grep -m1 -o 'prefill: [A-Za-z]*' <<<"$o"))"
        done
        echo "$row"
      done
      echo "## PyTorch SDPA prefill (FA2, cuDNN)"
      python3 "$g/attention_torch.py" --batch 1 --heads 32 --head-dim 128 --decode "" --prefill "${PREFILL_L// /,}" 2>&1 |
        tee "$out/prefill-torch.txt" | tail -12
      ;;
    layer)
      echo "## MHA layer prefill (E=4096, H=32, D=128, fp16 weights and K/V, B=1), Auto, median of 5"
      for n in ${LAYER_L:-2048 8192}; do
        for dev in opencl:gpu vulkan:gpu; do
          o=$(ocl timeout 120 "$KPC" attention --layer mha --device "$dev" --heads 32 --head-dim 128 --kv f16 \
            --prompt "$n" --steps 0 --prefill-runs 5 2>&1)
          echo "$o" >>"$out/layer.txt"
          echo "L=$n $dev: $(grep -o 'prefill projects with [a-z_]*' <<<"$o") | $(grep -E '^bench: phase=mha_prefill' <<<"$o" | head -1) $(grep -iE '^error|^kpc: ' <<<"$o" | head -1)"
        done
      done
      echo "## PyTorch MHA prefill (F.linear + SDPA, CUDA graphs)"
      L=${LAYER_L:-2048 8192}
      timeout 200 python3 "$g/mha_torch.py" --kv-heads 32 --decode "" --prefill "${L// /,}" 2>&1 |
        tee "$out/layer-torch.txt" | grep -E '^torch: phase=prefill'
      ;;
    decode)
      echo "## decode, B=1 H=32 D=128 fp16 K/V, 50 steps back to back, Auto on vulkan:gpu: device µs per step"
      for hkv in 8 32; do
        for n in $DECODE_L; do
          o=$("$KPC" attention --device vulkan:gpu --heads 32 --head-dim 128 --kv f16 --kv-heads "$hkv" \
            --prompt "$n" --steps 50 --fill 2>&1)
          echo "$o" >>"$out/decode.txt"
          b=$(grep '^bench: phase=decode' <<<"$o")
          echo "Hkv=$hkv L=$n: device_us=$(val device_us "$b") gbs=$(val gbs "$b") copy_gbs=$(val copy_gbs "$b") | $(sed -n 's/^kernels (decode: \(.*\), prefill:.*/\1/p' <<<"$o" | head -1)"
        done
      done
      echo "## PyTorch SDPA decode (cuDNN, CUDA graphs)"
      for hkv in 8 32; do
        python3 "$g/attention_torch.py" --batch 1 --heads 32 --head-dim 128 --kv-heads "$hkv" \
          --decode "${DECODE_L// /,}" --prefill "" 2>&1 | tee -a "$out/decode-torch.txt" | tail -8
      done
      ;;
    check)
      echo "## --check (Auto), L=1000, 12 steps: device B Hkv kv -> kernels | result"
      for dev in opencl:gpu vulkan:gpu; do
        for c in "1 32 f16" "4 32 f16" "1 8 f16" "4 8 f16" "1 8 f32" "4 32 f32"; do
          read -r b hkv kv <<<"$c"
          o=$(ocl "$KPC" attention --device "$dev" --heads 32 --head-dim 128 --kv "$kv" --batch "$b" \
            --kv-heads "$hkv" --prompt 1000 --steps 12 --check 2>&1)
          echo "$o" >>"$out/checks.txt"
          echo "$dev B=$b Hkv=$hkv $kv: $(grep -m1 '^kernels' <<<"$o") | $(grep -iE '^check|error|^kpc: ' <<<"$o" | tr '\n' ' ')"
        done
      done
      echo "## --layer mha --check (Auto)"
      while read -r dev shape; do
        for cross in "" "--cross 24"; do
          # shellcheck disable=SC2086
          o=$(ocl timeout 120 "$KPC" attention --layer mha --device "$dev" $shape $cross --check 2>&1)
          echo "$o" >>"$out/mha-checks.txt"
          echo "mha $dev $shape $cross: $(grep -o 'prefill projects with [a-z_]*' <<<"$o") | $(grep -iE '^check|error|^kpc: ' <<<"$o" | tr '\n' ' ')"
        done
      done <<<"opencl:gpu --heads 32 --kv-heads 8 --head-dim 128 --prompt 130 --steps 2 --kv f16 --batch 4
opencl:gpu --heads 8 --kv-heads 8 --head-dim 64 --prompt 200 --steps 2 --kv f16 --batch 4
opencl:gpu --heads 4 --kv-heads 2 --head-dim 16 --prompt 10 --steps 3 --kv f32
vulkan:gpu --heads 32 --kv-heads 8 --head-dim 128 --prompt 130 --steps 2 --kv f16 --batch 4"
      ;;
    tests)
      [ -x "$g/attention-test" ] || { echo "tests: no $g/attention-test"; continue; }
      echo "## kpc-attention tests on the device"
      # shellcheck disable=SC2086
      (cd kpc-attention && ocl env KPC_TEST_REQUIRE_DRIVERS=1 timeout "${TESTS_TIMEOUT:-150}" "$g/attention-test" \
        ${TESTS_FILTER:-gemm_mma mma_prefill ptx prefill_matches chunked} --test-threads 4 2>&1) |
        tee "$out/tests.txt" | grep -E '^test |test result|panicked' | tail -40
      ;;
  esac
done
