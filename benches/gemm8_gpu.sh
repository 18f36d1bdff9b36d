#!/usr/bin/env bash
# Session 8, issue 41 item 2 (helper gemm8): mha_gemm_mma's BK = 16 tiles (more stages, or 128 x 256 /
# 256 x 128 in 48 KiB) and the same-tile L2 diagnostic in the harness at the four projection shapes
# plus the fused Q/K/V projection (N = 12288), their SASS counts, the register-fed peak and cuBLAS, in
# one call.
#   files flat in .gpu/ as gemm8-*: this script, ocl_gemm_mma.c, mha_gemm_mma.cl, ocl_mma_probe.c,
#   gemm_torch.py; for the layer and check sections kpc.xz and kpc-base.xz (this branch's kpc and
#   the same tree before the layer's tile changed, stripped)
#   source .gpu/prelude.sh; export OCL_ICD_FILENAMES=libnvidia-opencl.so.1 OCL_ICD_VENDORS=/nonexistent;
#   OUT=$OUT bash .gpu/gemm8-gpu.sh
# SECTIONS: any of harness sass peak torch layer check (default the first four). VARIANT: harness
# filter.
set -uo pipefail
g=.gpu
out=${OUT:-/tmp}
shapes=2048x4096x4096,8192x4096x4096,2048x1024x4096,8192x1024x4096,2048x12288x4096,8192x12288x4096
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader || true
for s in ${SECTIONS:-harness peak torch sass}; do
  case $s in
    harness)
      echo "## harness"
      gcc -O2 -o /tmp/ocl_gemm_mma $g/gemm8-ocl_gemm_mma.c -I/usr/local/cuda/include \
        -L/usr/local/cuda/lib64 -lOpenCL -lm 2>&1 | tail -5
      mkdir -p "$out/ptx"
      t0=$(date +%s)
      GEMM_PTX_DIR="$out/ptx" timeout ${HARNESS_TIMEOUT:-230} /tmp/ocl_gemm_mma $g/gemm8-mha_gemm_mma.cl kpc-attention/kernels/ptx_probe.cl "${VARIANT:-:a16}" \
        >"$out/harness.txt" 2>&1
      echo "rc=$? in $(( $(date +%s) - t0 )) s"
      grep -E 'FAIL|registers|spill|build FAILED' "$out/harness.txt" | sed 's/gemm-mma: //' | grep -v ': ok' | grep -v 'diag' | head -40
      grep -E 'registers' "$out/harness.txt" | sed 's/gemm-mma: //; s/log: ptxas info *: //'
      grep -E '^gemm-mma: time' "$out/harness.txt" | sed -E 's/gemm-mma: time //; s/; with the cast.*//'
      tar czf "$out/ptx.tgz" -C "$out" ptx && rm -rf "$out/ptx"
      ;;
    sass)
      echo "## SASS (ptxas -arch=sm_90 on the driver's PTX)"
      mkdir -p "$out/sass" /tmp/ptxx && tar xzf "$out/ptx.tgz" -C /tmp/ptxx
      for f in /tmp/ptxx/ptx/*.ptx; do
        b=$(basename "$f" .ptx)
        case "$b" in *diag*) continue ;; esac
        tr -d '\000' <"$f" >"/tmp/$b.ptx"; f="/tmp/$b.ptx"
        timeout 20 /usr/local/cuda/bin/ptxas -arch=sm_90 -v "$f" -o "/tmp/$b.cubin" >"$out/sass/$b.ptxas.txt" 2>&1 || { echo "$b: ptxas failed"; continue; }
        /usr/local/cuda/bin/cuobjdump -sass "/tmp/$b.cubin" >"/tmp/$b.sass" 2>&1
        printf '%-36s %s | HMMA %s LDSM %s LDGSTS %s BAR %s DEPBAR %s instr %s\n' "$b" \
          "$(grep -o 'Used [0-9]* registers' "$out/sass/$b.ptxas.txt" | head -1)" \
          "$(grep -c 'HMMA' "/tmp/$b.sass")" "$(grep -c 'LDSM' "/tmp/$b.sass")" \
          "$(grep -c 'LDGSTS' "/tmp/$b.sass")" "$(grep -c ' BAR\.' "/tmp/$b.sass")" \
          "$(grep -c 'DEPBAR' "/tmp/$b.sass")" "$(grep -cE '^ +/\*[0-9a-f]{4}\*/' "/tmp/$b.sass")"
      done
      tar czf "$out/sass.tgz" -C "$out" sass && rm -rf "$out/sass"
      ;;
    peak)
      echo "## register-fed mma.sync peak"
      gcc -O2 -o /tmp/ocl_mma_probe $g/gemm8-ocl_mma_probe.c -I/usr/local/cuda/include \
        -L/usr/local/cuda/lib64 -lOpenCL 2>&1 | tail -3
      timeout 60 /tmp/ocl_mma_probe NVIDIA >"$out/ocl-mma-probe.txt" 2>&1
      grep -E 'peak|against' "$out/ocl-mma-probe.txt"
      ;;
    torch)
      echo "## PyTorch F.linear (cuBLAS)"
      PYTHONUNBUFFERED=1 timeout 120 python3 $g/gemm8-gemm_torch.py --shapes "$shapes" >"$out/gemm-torch.txt" 2>&1
      grep -E '^torch' "$out/gemm-torch.txt"
      ;;
    layer)
      echo "## MHA layer prefill on opencl:gpu: before (base) and after (new) the layer's tile change, Auto"
      for b in kpc kpc-base; do [ -x /tmp/$b ] || { xz -dc $g/gemm8-$b.xz >/tmp/$b && chmod +x /tmp/$b; }; done
      export KPC_CACHE_DIR=$(mktemp -d)
      : >"$out/mha-layer.txt"
      for L in ${LAYER_L:-2048 8192}; do
        for b in kpc-base kpc kpc-base kpc; do
          o=$(timeout ${LAYER_TIMEOUT:-40} /tmp/$b attention --layer mha --device opencl:gpu --heads 32 --head-dim 128 --kv f16 \
            --prompt "$L" --steps 0 --prefill-runs 5 2>&1)
          echo "# $b L=$L" >>"$out/mha-layer.txt"; echo "$o" >>"$out/mha-layer.txt"
          echo "$b L=$L: $(grep -o 'prefill projects with [a-z_]*' <<<"$o") | $(grep -iE 'project|^prefill' <<<"$o" | head -4 | tr '\n' ' ') $(grep -iE '^error|kpc:' <<<"$o" | head -1)"
        done
      done
      ;;
    check)
      echo "## kpc attention --layer mha --check on opencl:gpu (this branch)"
      [ -x /tmp/kpc ] || { xz -dc $g/gemm8-kpc.xz >/tmp/kpc && chmod +x /tmp/kpc; }
      export KPC_CACHE_DIR=$(mktemp -d)
      : >"$out/mha-check.txt"
      for shape in "--heads 32 --kv-heads 32 --head-dim 128 --prompt 300 --steps 2 --kv f16" \
        "--heads 8 --kv-heads 8 --head-dim 64 --prompt 200 --steps 2 --kv f16 --batch 4 --projection mma"; do
        # shellcheck disable=SC2086
        o=$(timeout 40 /tmp/kpc attention --layer mha --device opencl:gpu $shape --check 2>&1)
        echo "$o" >>"$out/mha-check.txt"
        echo "$shape: $(grep -o 'prefill projects with [a-z_]*' <<<"$o") | $(grep '^check:' <<<"$o" || tail -1 <<<"$o")"
      done
      ;;
  esac
done
