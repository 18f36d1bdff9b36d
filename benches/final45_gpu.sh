#!/usr/bin/env bash
# The end-of-session call for issues 45 and 41 on the GPU host, prebuilt binaries only:
#   lazy    benches/lazy45_gpu.sh: time to the first correct decode step, plain / --lazy / generic
#           seal, and the per-step cost of attn_generic (Vulkan, then NVIDIA OpenCL);
#   herd    benches/herd_gpu.sh at issue 45 item 5's shape: 8 cold processes on one cache dir against
#           one, with the device opening alone beside it and each process's breakdown;
#   decode  benches/decode41_gpu.sh's GQA sweep at 16k and 32k and PyTorch's cuDNN in the same call.
# Driver caches off (source .gpu/prelude.sh first).  OUT: where the logs go (default .gpu/out).
#   source .gpu/prelude.sh; benches/final45_gpu.sh
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${OUT:-${OUT_DIR:-.gpu/out}}
mkdir -p "$out"
export KPC=${KPC:-.gpu/kpc}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$out/device.txt"
for s in ${SECTIONS:-lazy herd decode}; do
  case $s in
    lazy)
      RUNS=${RUNS:-3} DEVICES=vulkan:gpu OUT="$out/lazy-vulkan" bash "$here/lazy45_gpu.sh" 2>&1 | tee "$out/lazy-vulkan.txt"
      OCL_ICD_FILENAMES=libnvidia-opencl.so.1 OCL_ICD_VENDORS=/nonexistent RUNS=${RUNS:-3} DEVICES=opencl:gpu \
        OUT="$out/lazy-opencl" bash "$here/lazy45_gpu.sh" 2>&1 | tee "$out/lazy-opencl.txt"
      ;;
    herd)
      ARGS="--heads 32 --head-dim 128 --prompt 1024 --steps 4" ROUNDS=${HERD_ROUNDS:-3} DEVICES=vulkan:gpu \
        bash "$here/herd_gpu.sh" 2>&1 | tee "$out/herd-vulkan.txt"
      OCL_ICD_FILENAMES=libnvidia-opencl.so.1 OCL_ICD_VENDORS=/nonexistent \
        ARGS="--heads 32 --head-dim 128 --prompt 1024 --steps 4" ROUNDS=${HERD_ROUNDS:-3} DEVICES=opencl:gpu \
        bash "$here/herd_gpu.sh" 2>&1 | tee "$out/herd-opencl.txt"
      ;;
    decode)
      SECTIONS="sweep torch" SWEEP_L=${SWEEP_L:-"4096 16384 32768"} BASE=$KPC TORCH_L=4096,16384,32768 \
        VARIANTS=${DECODE_VARIANTS:-"new|$KPC|
old-reduce|$KPC|--decode-head-lanes false
r6|$KPC|--decode-rows 6
r8|$KPC|--decode-rows 8
w1056|$KPC|--workgroups 1056
w792|$KPC|--workgroups 792
w528|$KPC|--workgroups 528
r8-w528|$KPC|--decode-rows 8 --workgroups 528
local128|$KPC|--decode-local 128
split-min64|$KPC|--decode-split-min 64"} \
        bash "$here/decode41_gpu.sh" 2>&1 | tee "$out/decode.txt"
      ;;
    swap)
      # A cold --lazy run: attn_generic answers first, the specialized kernels swap in; the timed steps
      # (after the untimed first runs) against a plain run on the same (now warm) disk.
      for dev in vulkan:gpu opencl:gpu; do
        env=(); [ "$dev" = opencl:gpu ] && env=(OCL_ICD_FILENAMES=libnvidia-opencl.so.1 OCL_ICD_VENDORS=/nonexistent)
        d=$(mktemp -d)
        for mode in lazy-cold plain-warm; do
          flag=(); [ "$mode" = lazy-cold ] && flag=(--lazy)
          o=$(env "${env[@]}" KPC_CACHE_DIR="$d" POCL_CACHE_DIR="$d/pocl" "$KPC" attention --device "$dev" --heads 32 \
            --head-dim 128 --prompt 1024 --steps 64 --check "${flag[@]}" 2>&1)
          echo "$dev $mode: $(grep -E '^bench: phase=decode' <<<"$o" | grep -o 'device_us=[^ ]*') $(grep -E '^bench: phase=prefill' <<<"$o" | grep -o 'ms=[^ ]*') | $(grep -E 'check|^  lazy|generic fallbacks' <<<"$o" | tr -s ' ' | tr '\n' ' ')"
        done
        rm -rf "$d"
      done 2>&1 | tee "$out/swap.txt"
      ;;
  esac
done
