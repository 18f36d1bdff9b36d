#!/usr/bin/env bash
# Session 7, issue 41 item 2 (helper gemm7): every knob variant of mha_gemm_mma in the harness, their
# PTX through ptxas -> SASS (cuobjdump), the register-fed peak and cuBLAS, in one call.
#   files flat in .gpu/ as gemm7-*: this script, ocl_gemm_mma.c, ocl_mma_probe.c, mha_gemm_mma.cl,
#   ptx_probe.cl, gemm_torch.py; kpc.xz and kpc-base.xz (this branch's and main's kpc, stripped) for
#   the layer and check sections, test.xz (kpc-attention's test binary) for the tests section
#   source .gpu/prelude.sh; export OCL_ICD_FILENAMES=libnvidia-opencl.so.1 OCL_ICD_VENDORS=/nonexistent;
#   OUT=$OUT bash .gpu/gemm7-gpu.sh
# SECTIONS: any of harness sass peak torch layer check tests (default harness sass). VARIANT: harness
# filter (GEMM_SET=1: the first round's variants); A32_VARIANT: a second harness run (f32 A).
set -uo pipefail
g=.gpu
out=${OUT:-/tmp}
shapes=2048x4096x4096,8192x4096x4096,2048x1024x4096,8192x1024x4096
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader || true
ls -la /usr/local/cuda/bin/ptxas /usr/local/cuda/bin/cuobjdump /usr/local/cuda/bin/nvdisasm /usr/local/cuda/bin/ncu 2>&1 | awk '{print $NF}'
for s in ${SECTIONS:-harness sass}; do
  case $s in
    harness)
      echo "## harness"
      gcc -O2 -o /tmp/ocl_gemm_mma $g/gemm7-ocl_gemm_mma.c -I/usr/local/cuda/include \
        -L/usr/local/cuda/lib64 -lOpenCL -lm 2>&1 | tail -5
      mkdir -p "$out/ptx"
      GEMM_PTX_DIR="$out/ptx" timeout ${HARNESS_TIMEOUT:-330} /tmp/ocl_gemm_mma $g/gemm7-mha_gemm_mma.cl kpc-attention/kernels/ptx_probe.cl "${VARIANT:-:a16}" \
        >"$out/harness.txt" 2>&1
      echo "rc=$?"
      grep -E 'FAIL|registers|spill' "$out/harness.txt" | sed 's/gemm-mma: //' | grep -v ': ok' | head -60
      grep -E '^gemm-mma: time' "$out/harness.txt" | sed -E 's/gemm-mma: time //; s/; with the cast.*//'
      if [ -n "${A32_VARIANT:-}" ]; then
        timeout 120 /tmp/ocl_gemm_mma $g/gemm7-mha_gemm_mma.cl kpc-attention/kernels/ptx_probe.cl "$A32_VARIANT" >"$out/harness-a32.txt" 2>&1
        echo "a32 rc=$?"; grep -E 'FAIL|^gemm-mma: time' "$out/harness-a32.txt" | sed -E 's/gemm-mma: time //'
      fi
      tar czf "$out/ptx.tgz" -C "$out" ptx && rm -rf "$out/ptx"
      GEMM_LOCAL_PROBE=1 timeout 60 /tmp/ocl_gemm_mma $g/gemm7-mha_gemm_mma.cl kpc-attention/kernels/ptx_probe.cl none >"$out/local-probe.txt" 2>&1
      grep local-probe "$out/local-probe.txt"
      ;;
    sass)
      echo "## SASS (ptxas -arch=sm_90 on the driver's PTX)"
      mkdir -p "$out/sass"
      mkdir -p /tmp/ptxx && tar xzf "$out/ptx.tgz" -C /tmp/ptxx
      for f in /tmp/ptxx/ptx/*.ptx; do
        b=$(basename "$f" .ptx)
        case "$b" in *a32*) continue ;; esac
        tr -d '\000' <"$f" >"/tmp/$b.ptx"; f="/tmp/$b.ptx"
        /usr/local/cuda/bin/ptxas -arch=sm_90 -v "$f" -o "/tmp/$b.cubin" >"$out/sass/$b.ptxas.txt" 2>&1 || { echo "$b: ptxas failed"; continue; }
        /usr/local/cuda/bin/cuobjdump -sass "/tmp/$b.cubin" >"$out/sass/$b.sass" 2>&1
        printf '%-32s %s | HMMA %s LDSM %s LDGSTS %s BAR %s MEMBAR %s DEPBAR %s instr %s\n' "$b" \
          "$(grep -o 'Used [0-9]* registers' "$out/sass/$b.ptxas.txt" | head -1)" \
          "$(grep -c 'HMMA' "$out/sass/$b.sass")" "$(grep -c 'LDSM' "$out/sass/$b.sass")" \
          "$(grep -c 'LDGSTS' "$out/sass/$b.sass")" "$(grep -c ' BAR\.' "$out/sass/$b.sass")" \
          "$(grep -c 'MEMBAR' "$out/sass/$b.sass")" "$(grep -c 'DEPBAR' "$out/sass/$b.sass")" \
          "$(grep -cE '^ +/\*[0-9a-f]{4}\*/' "$out/sass/$b.sass")"
      done
      ;;
    peak)
      echo "## register-fed mma.sync peak"
      gcc -O2 -o /tmp/ocl_mma_probe benches/ocl_mma_probe.c -I/usr/local/cuda/include \
        -L/usr/local/cuda/lib64 -lOpenCL 2>&1 | tail -3
      timeout 60 /tmp/ocl_mma_probe NVIDIA >"$out/ocl-mma-probe.txt" 2>&1
      grep -E 'peak|against' "$out/ocl-mma-probe.txt"
      ;;
    torch)
      echo "## PyTorch F.linear (cuBLAS)"
      PYTHONUNBUFFERED=1 timeout 200 python3 benches/gemm_torch.py --shapes "$shapes" >"$out/gemm-torch.txt" 2>&1
      grep -E '^torch' "$out/gemm-torch.txt"
      ;;
    layer)
      echo "## MHA layer prefill on opencl:gpu: main's kpc (base) and this branch's (new), Auto"
      for b in kpc kpc-base; do [ -x /tmp/$b ] || { xz -dc $g/gemm7-$b.xz >/tmp/$b && chmod +x /tmp/$b; }; done
      export KPC_CACHE_DIR=$(mktemp -d)
      : >"$out/mha-layer.txt"
      for L in ${LAYER_L:-2048 8192}; do
        for b in kpc-base kpc; do
          o=$(timeout 120 /tmp/$b attention --layer mha --device opencl:gpu --heads 32 --head-dim 128 --kv f16 \
            --prompt "$L" --steps 0 --prefill-runs 5 2>&1)
          echo "# $b L=$L" >>"$out/mha-layer.txt"; echo "$o" >>"$out/mha-layer.txt"
          echo "$b L=$L: $(grep -o 'prefill projects with [a-z_]*' <<<"$o") | $(grep -iE 'project|^prefill' <<<"$o" | head -4 | tr '\n' ' ') $(grep -iE '^error|kpc:' <<<"$o" | head -1)"
        done
      done
      ;;
    check)
      echo "## kpc attention --layer mha --check on opencl:gpu"
      [ -x /tmp/kpc ] || { xz -dc $g/gemm7-kpc.xz >/tmp/kpc && chmod +x /tmp/kpc; }
      export KPC_CACHE_DIR=$(mktemp -d)
      : >"$out/mha-check.txt"
      for shape in "--heads 32 --kv-heads 8 --head-dim 128 --prompt 32 --steps 4 --kv f16" \
        "--heads 32 --kv-heads 32 --head-dim 128 --prompt 300 --steps 2 --kv f16" \
        "--heads 32 --kv-heads 8 --head-dim 128 --prompt 130 --steps 2 --kv f16 --batch 4 --cross 24" \
        "--heads 8 --kv-heads 8 --head-dim 64 --prompt 200 --steps 2 --kv f16 --batch 4 --projection mma"; do
        # shellcheck disable=SC2086
        o=$(timeout 100 /tmp/kpc attention --layer mha --device opencl:gpu $shape --check 2>&1)
        echo "$o" >>"$out/mha-check.txt"
        echo "$shape: $(grep -o 'prefill projects with [a-z_]*' <<<"$o") | $(grep '^check:' <<<"$o" || tail -1 <<<"$o")"
      done
      ;;
    tests)
      echo "## kpc-attention tests gemm_mma and ptx on the device (this branch)"
      xz -dc $g/gemm7-test.xz >/tmp/kpc-attention-test && chmod +x /tmp/kpc-attention-test
      (cd kpc-attention && KPC_TEST_REQUIRE_DRIVERS=1 KPC_CACHE_DIR=$(mktemp -d) timeout 150 /tmp/kpc-attention-test gemm_mma ptx \
        --test-threads 2 2>&1) | tee "$out/tests.txt" | grep -E '^test |test result|panicked' | tail -20
      ;;
  esac
done
