#!/usr/bin/env bash
# Issue 41, item 5 on the GPU host in ONE call: the OpenCL `mma.sync` projection GEMM
# (kpc-attention/kernels/mha_gemm_mma.cl) beside cuBLAS, the Vulkan mha_gemm_wide and the OpenCL
# register-fed mma.sync peak, all measured in the same call, then the MHA layer on the OpenCL backend
# with main's kpc (BASE) and this branch's (KPC), and the layer's --check. Builds the C harnesses with
# gcc there; nothing else.
#   files flat in .gpu/ as oclgemm-*: this script, ocl_gemm_mma.c, ocl_mma_probe.c, mha_gemm_mma.cl,
#   ptx_probe.cl, gemm_torch.py, kpc-base.xz, kpc.xz (stripped, xz)
#   source .gpu/prelude.sh; OUT=$OUT .gpu/oclgemm-gpu.sh
# SECTIONS: any of harness peak torch vulkan layer check (default all). VARIANT: harness variant
# filter (substring of e.g. 128x256/2x4s2:a16). LAYER_L: prompt lengths (2048 8192). LAYER_VARIANTS:
# `label|binary|device|projection` entries separated by `;`.
set -uo pipefail
g=.gpu
out=${OUT:-/tmp}
shapes=2048x4096x4096,8192x4096x4096,2048x1024x4096,8192x1024x4096
unpack() { [ -x "/tmp/$1" ] || { xz -dc "$g/oclgemm-$1.xz" >"/tmp/$1" && chmod +x "/tmp/$1"; }; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,temperature.gpu,power.draw --format=csv,noheader || true
export KPC_CACHE_DIR=$(mktemp -d)
for s in ${SECTIONS:-harness peak torch vulkan layer check}; do
  case $s in
    harness)
      echo "## OpenCL mma.sync GEMM harness"
      gcc -O2 -o /tmp/ocl_gemm_mma $g/oclgemm-ocl_gemm_mma.c -I/usr/local/cuda/include \
        -L/usr/local/cuda/lib64 -lOpenCL -lm 2>&1 | tail -5
      timeout 300 /tmp/ocl_gemm_mma $g/oclgemm-mha_gemm_mma.cl $g/oclgemm-ptx_probe.cl "${VARIANT:-}" \
        >"$out/harness.txt" 2>&1
      echo "rc=$?"
      grep -E 'probe|FAIL|time|cast|registers|spill|device' "$out/harness.txt" | head -120
      ;;
    peak)
      echo "## OpenCL register-fed mma.sync peak (ocl_mma_probe)"
      gcc -O2 -o /tmp/ocl_mma_probe $g/oclgemm-ocl_mma_probe.c -I/usr/local/cuda/include \
        -L/usr/local/cuda/lib64 -lOpenCL 2>&1 | tail -3
      timeout 60 /tmp/ocl_mma_probe NVIDIA >"$out/ocl-mma-probe.txt" 2>&1
      grep -E 'peak|against' "$out/ocl-mma-probe.txt"
      ;;
    torch)
      echo "## PyTorch F.linear (cuBLAS)"
      PYTHONUNBUFFERED=1 timeout 200 python3 $g/oclgemm-gemm_torch.py --shapes "$shapes" >"$out/gemm-torch.txt" 2>&1
      grep -E '^torch' "$out/gemm-torch.txt"
      ;;
    vulkan)
      echo "## Vulkan mha_gemm_wide (kpc bench-mma, main's binary)"
      unpack kpc-base
      timeout 200 /tmp/kpc-base bench-mma --device vulkan:gpu --sections gemm --shapes "$shapes" \
        --gemm 128x256x32/2x4:a16:acc32,128x128x64/2x4a2:a16:acc32,128x256x32/2x4:a32:acc32 \
        >"$out/bench-mma-vulkan.txt" 2>&1
      echo "rc=$?"
      grep -E '^bench: kind=gemm|FAIL|error' "$out/bench-mma-vulkan.txt" | head -20
      ;;
    layer)
      echo "## MHA layer prefill (E=4096, H=32, D=128, fp16 weights and K/V), OpenCL and Vulkan"
      unpack kpc-base
      [ -e $g/oclgemm-kpc.xz ] && unpack kpc
      : >"$out/mha-layer.txt"
      for L in ${LAYER_L:-2048 8192}; do
        IFS=';' read -ra variants <<<"${LAYER_VARIANTS:-base|/tmp/kpc-base|opencl:gpu|auto;base|/tmp/kpc-base|vulkan:gpu|auto;new|/tmp/kpc|opencl:gpu|auto;new|/tmp/kpc|opencl:gpu|tiled;new|/tmp/kpc|opencl:gpu|mma}"
        for v in "${variants[@]}"; do
          IFS='|' read -r label bin dev proj <<<"$v"
          [ -x "$bin" ] || continue
          echo "# $label $dev L=$L projection=$proj" >>"$out/mha-layer.txt"
          o=$(timeout 120 "$bin" attention --layer mha --device "$dev" --heads 32 --head-dim 128 --kv f16 \
            --prompt "$L" --steps 0 --prefill-runs 5 --projection "$proj" 2>&1)
          echo "$o" >>"$out/mha-layer.txt"
          echo "$label $dev L=$L $proj: $(grep -o 'prefill projects with [a-z_]*' <<<"$o") | $(grep -E '^prefill:|^device:' <<<"$o" | tr '\n' ' ') $(grep -iE '^error|kpc:' <<<"$o" | head -1)"
        done
      done
      ;;
    check)
      echo "## kpc attention --layer mha --check on OpenCL (this branch)"
      [ -e $g/oclgemm-kpc.xz ] || continue
      unpack kpc
      : >"$out/mha-check.txt"
      for shape in "--heads 4 --kv-heads 2 --head-dim 16 --prompt 10 --steps 3 --kv f16" \
        "--heads 4 --kv-heads 2 --head-dim 16 --prompt 10 --steps 3 --kv f32" \
        "--heads 32 --kv-heads 8 --head-dim 128 --prompt 32 --steps 4 --kv f16" \
        "--heads 32 --kv-heads 32 --head-dim 128 --prompt 300 --steps 2 --kv f16" \
        "--heads 32 --kv-heads 8 --head-dim 128 --prompt 130 --steps 2 --kv f16 --batch 4" \
        "--heads 8 --kv-heads 8 --head-dim 64 --prompt 200 --steps 2 --kv f16 --batch 4 --projection mma" \
        "--heads 8 --kv-heads 8 --head-dim 64 --prompt 200 --steps 2 --kv f32 --batch 4"; do
        for cross in "" "--cross 24"; do
          # shellcheck disable=SC2086
          o=$(timeout 120 /tmp/kpc attention --layer mha --device opencl:gpu $shape $cross --check 2>&1)
          rc=$?
          echo "$o" >>"$out/mha-check.txt"
          echo "$shape $cross: rc=$rc $(grep -o 'prefill projects with [a-z_]*' <<<"$o") | $(grep '^check:' <<<"$o" || tail -1 <<<"$o")"
        done
      done
      ;;
  esac
done
