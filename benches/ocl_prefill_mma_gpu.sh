#!/usr/bin/env bash
# Issue 41, item 5 (the OpenCL mma.sync prefill) on the GPU host in ONE call. Builds nothing of kpc;
# compiles the C harness (benches/ocl_prefill_mma.c) with gcc there. Driver caches off (prelude.sh).
#   source .gpu/prelude.sh; .gpu/oclprefill-ocl_prefill_mma_gpu.sh
# SECTIONS (default: harness torch): any of
#   sass     after harness: each variant's PTX through ptxas (sm_90a) and cuobjdump: resources and the
#            SASS instruction mix per variant, the files in sass.tgz;
#   harness  the harness over VARIANTS (its own default list): build logs with ptxas's report, checks
#            against a float64 reference, TFLOP/s at SWEEP_L;
#   sweep    `kpc attention` causal prefill (B=1, H=32, D=128, fp16 K/V) for each `label|device|flags`
#            line of SWEEP_VARIANTS at SWEEP_L, median of RUNS;
#   check    `kpc attention --check` (L=1000, 12 steps) for each `kv B Hkv flags` case of CHECKS;
#   tests    kpc-attention's test binary (TESTS) on the OpenCL device: the mma prefill's tests;
#   torch    PyTorch SDPA (FA2, cuDNN, ...) at the same shape.
# Files: HARNESS_C, KERNEL_CL, KPC, TORCH (defaults: the oclprefill- copies beside this script).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${OUT:-/tmp}
HARNESS_C=${HARNESS_C:-$here/oclprefill-ocl_prefill_mma.c}
KERNEL_CL=${KERNEL_CL:-$here/oclprefill-attn_prefill_mma.cl}
KPC=${KPC:-$here/oclprefill-kpc}
TORCH=${TORCH:-$here/oclprefill-attention_torch.py}
SWEEP_L=${SWEEP_L:-2048 4096 8192}
export SWEEP_L
common=(--heads 32 --head-dim 128)
val() { grep -o " $1=[^ ]*" <<<"$2" | head -1 | cut -d= -f2; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader || true
for s in ${SECTIONS:-harness torch}; do
  case $s in
    harness)
      echo "## harness: attn_prefill_mma variants"
      gcc -O2 -o /tmp/ocl_prefill_mma "$HARNESS_C" -I/usr/local/cuda/include -L/usr/local/cuda/lib64 \
        -lOpenCL -lm 2>&1 | tail -5
      mkdir -p /tmp/ptx && rm -f /tmp/ptx/*
      PTX_DIR=/tmp/ptx /tmp/ocl_prefill_mma NVIDIA "$KERNEL_CL" >"$out/harness.txt" 2>&1
      echo "harness exit: $?"
      if [ -n "${HARNESS_BRIEF:-}" ]; then # failures, then the table (harness.txt has the rest)
        grep -E 'FAIL|failed|error' "$out/harness.txt" | head -20
        sed -n '/^## attn_prefill_mma/,$p' "$out/harness.txt"
      else
        grep -E 'ptxas info.*(Used|spill|bytes stack)|ptx:|FAIL|failed|error|variant|^##|L=' "$out/harness.txt" |
          grep -v 'Compiling\|Function properties' | head -80
      fi
      ;;
    sass)
      # Each harness variant's PTX (the driver's program binary) through ptxas for sm_90a: resources,
      # then the SASS's instruction mix (whole kernel). Everything in $OUT/sass.tgz.
      echo "## SASS (ptxas -arch=sm_90a on the driver's PTX; counts over the whole kernel)"
      cb=/usr/local/cuda/bin
      ls $cb/ptxas $cb/cuobjdump $cb/nvdisasm $cb/ncu 2>&1 | sed 's/^/tools: /'
      mkdir -p /tmp/sass
      for f in /tmp/ptx/*.ptx; do
        n=$(basename "$f" .ptx)
        # The driver's binary ends in NUL bytes, which ptxas reads as a truncated file.
        tr -d '\000' <"$f" >"/tmp/sass/$n.ptx"
        $cb/ptxas -arch=sm_90a -v -o "/tmp/sass/$n.cubin" "/tmp/sass/$n.ptx" >"/tmp/sass/$n.ptxas.txt" 2>&1
        $cb/cuobjdump -sass "/tmp/sass/$n.cubin" >"/tmp/sass/$n.sass" 2>&1
        r=$(grep -o 'Used [0-9]* registers' "/tmp/sass/$n.ptxas.txt" | head -1)
        sp=$(grep -o '[0-9]* bytes spill stores' "/tmp/sass/$n.ptxas.txt" | head -1)
        line="$n: $r, $sp |"
        for op in HMMA LDSM MUFU BAR LDGSTS LDL STL FFMA FMUL FADD FMNMX SHFL F2FP HADD2 ISETP BRA; do
          line="$line $op=$(grep -cE "^ +/\*[0-9a-f]+\*/ +(@!?U?P[0-9T] +)?$op[ .;]" "/tmp/sass/$n.sass")"
        done
        echo "$line total=$(grep -cE '^ +/\*[0-9a-f]+\*/ ' "/tmp/sass/$n.sass")"
      done
      tar -czf "$out/sass.tgz" -C /tmp sass
      ;;
    sweep)
      echo "## kpc attention causal prefill, B=1 H=32 D=128 fp16 K/V, median of ${RUNS:-5}: label -> TFLOP/s"
      for L in $SWEEP_L; do
        line="L=$L"
        while IFS='|' read -r label dev extra; do
          [ -z "$label" ] && continue
          # shellcheck disable=SC2086
          o=$("$KPC" attention --device "$dev" "${common[@]}" --kv f16 --prompt "$L" --steps 0 \
            --prefill-runs "${RUNS:-5}" $extra 2>&1)
          { echo "### $label $dev L=$L $extra"; echo "$o"; } >>"$out/sweep-raw.txt"
          b=$(grep '^bench: phase=prefill' <<<"$o") || { line="$line | $label failed: $(grep -iE 'error' <<<"$o" | head -1)"; continue; }
          line="$line | $label $(val tflops "$b")"
        done <<<"${SWEEP_VARIANTS:-}"
        echo "$line"
      done
      ;;
    check)
      echo "## kpc attention --check, L=1000, 12 steps"
      IFS=';' read -ra cases <<<"${CHECKS:-}"
      for c in "${cases[@]}"; do
        read -r kv b hkv extra <<<"$c"
        # shellcheck disable=SC2086
        o=$("$KPC" attention "${common[@]}" --kv "$kv" --batch "$b" --kv-heads "$hkv" --prompt 1000 \
          --steps 12 --check $extra 2>&1)
        { echo "### $c"; echo "$o"; } >>"$out/checks.txt"
        echo "$kv B=$b Hkv=$hkv $extra: $(grep -E '^kernels' <<<"$o" | head -1) | $(grep -iE '^check|error' <<<"$o" | tr '\n' ' ')"
      done
      ;;
    tests)
      # kpc-attention's test binary (TESTS: its path), run from the crate's folder.
      if [ -x "${TESTS:-}" ]; then
        echo "## attention tests on the device (OpenCL)"
        (cd kpc-attention && KPC_TEST_REQUIRE_DRIVERS=1 "$TESTS" opencl::mma_prefill opencl::prefill_matches \
          opencl::chunked ptx --test-threads 4 2>&1) | tee "$out/tests.txt" | grep -E '^test |test result|panicked' | tail -12
      fi
      ;;
    torch)
      echo "## PyTorch SDPA prefill"
      python3 "$TORCH" --batch 1 --heads 32 --head-dim 128 --decode "" --prefill "${SWEEP_L// /,}" 2>&1 |
        tee "$out/torch.txt" | tail -12
      ;;
  esac
done
