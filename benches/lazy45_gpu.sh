#!/usr/bin/env bash
# Issue 45 (generic while specialized) on the GPU host, with prebuilt binaries only (no cargo there):
#   first  a cold process's time to its first correct decode step (`kpc bench-start --phase
#          first-step`: open the device, make the attention layer, prefill PROMPT positions, one
#          decode step, checked against the float64 reference outside the clock), in three modes:
#            plain    every specialized kernel built before the first answer (today);
#            lazy     --lazy: attn_generic answers while the specialized kernels build in the
#                     background (the step answers on whichever is ready when it runs);
#            generic  --lazy under KPC_CACHE_SEAL=generic: nothing specialized is built, the cost of
#                     attn_generic alone (its build, once per device, and its first runs);
#          each a fresh process with a fresh KPC_CACHE_DIR, RUNS rounds, medians;
#   step   the per-step time of attn_generic vs the specialized kernels on a warm disk: `kpc
#          attention` (its "bench: phase=decode" and "phase=prefill" lines) with --lazy under
#          KPC_CACHE_SEAL=generic, and without --lazy.
# Driver caches are off throughout (__GL_SHADER_DISK_CACHE=0, CUDA_CACHE_DISABLE=1,
# MESA_SHADER_CACHE_DISABLE=true, POCL_KERNEL_CACHE=0 with a fresh POCL_CACHE_DIR), so "cold" is cold.
#
#   source .gpu/prelude.sh; benches/lazy45_gpu.sh
#   # NVIDIA OpenCL through the ICD loader:
#   OCL_ICD_FILENAMES=libnvidia-opencl.so.1 OCL_ICD_VENDORS=/nonexistent DEVICES=opencl:gpu benches/lazy45_gpu.sh
# Variables: KPC (kpc binary; default .gpu/kpc, else target/release/kpc), DEVICES (KPC_DEVICE
# selectors, default "vulkan:gpu opencl:gpu"; "vulkan:0 opencl:0" on a CPU-only machine), SECTIONS
# (default "first step"), RUNS (default 3), HEADS (32), KV_HEADS (32), HEAD_DIM (128), PROMPT
# (first: 64), STEP_PROMPT (step: 1024), STEPS (step: 16), OUT (logs; default a temporary directory).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
if [ -z "${KPC:-}" ]; then
  if [ -x .gpu/kpc ]; then KPC=.gpu/kpc; else KPC=$here/../target/release/kpc; fi
fi
devices=${DEVICES:-vulkan:gpu opencl:gpu}
sections=${SECTIONS:-first step}
runs=${RUNS:-3}
heads=${HEADS:-32}
kv_heads=${KV_HEADS:-32}
head_dim=${HEAD_DIM:-128}
prompt=${PROMPT:-64}
step_prompt=${STEP_PROMPT:-1024}
steps=${STEPS:-16}
out=${OUT:-$(mktemp -d /tmp/kpc-lazy45.XXXXXX)}
mkdir -p "$out"
scratch=$(mktemp -d /tmp/kpc-lazy45-scratch.XXXXXX)
trap 'rm -rf "$scratch"' EXIT
export __GL_SHADER_DISK_CACHE=0 CUDA_CACHE_DISABLE=1 MESA_SHADER_CACHE_DISABLE=true POCL_KERNEL_CACHE=0
unset KPC_CACHE_PREFETCH KPC_CACHE_SEAL KPC_CACHE_BUILD_BUDGET

val() { grep -o " $1=[^ ]*" <<<"$2" | head -1 | cut -d= -f2; }
median() { sort -g | awk '{a[NR]=$1} END {if (NR==0) {print "n/a"} else if (NR%2) {print a[(NR+1)/2]} else {printf "%.2f\n", (a[NR/2]+a[NR/2+1])/2}}'; }
fresh() { mktemp -d "$scratch/run.XXXXXX"; }

echo "kpc: $KPC ($("$KPC" --version 2>/dev/null | head -1)); logs in $out"
echo "shape: B=1 Hq=$heads Hkv=$kv_heads D=$head_dim f16 K/V; first: prompt $prompt, $runs rounds; step: prompt $step_prompt, $steps steps"

for dev in $devices; do
  if [[ " $sections " == *" first "* ]]; then
    for mode in plain lazy generic; do
      : > "$out/first-$dev-$mode.txt"
      for r in $(seq "$runs"); do
        d=$(fresh)
        flags=()
        seal=
        case $mode in
          lazy) flags=(--lazy) ;;
          generic) flags=(--lazy); seal=generic ;;
        esac
        line=$(KPC_CACHE_SEAL=$seal KPC_CACHE_DIR=$d/kpc POCL_CACHE_DIR=$d/pocl "$KPC" bench-start \
          --phase first-step --device "$dev" --heads "$heads" --kv-heads "$kv_heads" \
          --head-dim "$head_dim" --prompt "$prompt" "${flags[@]}" 2>>"$out/first-$dev-$mode.err" | grep '^bench-start:')
        echo "$line" >> "$out/first-$dev-$mode.txt"
        rm -rf "$d"
      done
      f=$out/first-$dev-$mode.txt
      med() { while read -r l; do val "$1" "$l"; done < "$f" | median; }
      echo "first $dev $mode: first_step_ms median $(med first_step_ms) (open $(med open_ms), layer $(med layer_ms), prefill $(med prefill_ms)); step on generic: $(grep -c 'step_generic=true' "$f")/$(grep -c . "$f"); errors: $(while read -r l; do val error "$l"; done < "$f" | tr '\n' ' ')"
    done
  fi
  if [[ " $sections " == *" step "* ]]; then
    d=$(fresh)
    g=$(fresh)
    common=(attention --device "$dev" --heads "$heads" --kv-heads "$kv_heads" --head-dim "$head_dim"
      --prompt "$step_prompt" --steps "$steps" --check)
    # A first run of each fills its own kpc disk cache, so the measured runs build nothing. The
    # generic runs have a cache of their own: a specialized kernel on disk would be served even
    # under the generic seal.
    KPC_CACHE_DIR=$d/kpc POCL_CACHE_DIR=$d/pocl "$KPC" "${common[@]}" > "$out/step-$dev-warmup.txt" 2>&1
    KPC_CACHE_SEAL=generic KPC_CACHE_DIR=$g/kpc POCL_CACHE_DIR=$g/pocl "$KPC" "${common[@]}" --lazy > "$out/step-$dev-generic-warmup.txt" 2>&1
    KPC_CACHE_SEAL=generic KPC_CACHE_DIR=$g/kpc POCL_CACHE_DIR=$g/pocl "$KPC" "${common[@]}" --lazy > "$out/step-$dev-generic.txt" 2>&1
    KPC_CACHE_DIR=$d/kpc POCL_CACHE_DIR=$d/pocl "$KPC" "${common[@]}" > "$out/step-$dev-specialized.txt" 2>&1
    for m in generic specialized; do
      f=$out/step-$dev-$m.txt
      dl=$(grep '^bench: phase=decode' "$f" | head -1)
      pl=$(grep '^bench: phase=prefill' "$f" | head -1)
      echo "step $dev $m: decode wall_us=$(val wall_us "$dl") device_us=$(val device_us "$dl"); prefill ms=$(val ms "$pl"); $(grep -o 'check: .*' "$f" | head -1) $(grep -o 'lazy: .*' "$f" | head -1)"
    done
    rm -rf "$d" "$g"
  fi
done
