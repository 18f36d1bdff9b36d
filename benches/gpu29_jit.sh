#!/usr/bin/env bash
# Issue 29, item 5: a warm kpc process on NVIDIA's OpenCL with the driver's JIT cache off (as
# ../shared/gpu/prelude.sh sets it) and on (CUDA_CACHE_PATH in a fresh directory, CUDA_CACHE_DISABLE
# unset). NVIDIA's OpenCL binary is PTX, so kpc's disk hit still JIT-compiles it to SASS; the question
# is what the driver's own cache saves on top. Each row: median of RUNS fresh processes of
# `kpc bench-start --phase serial` (the attention kernels from kpc's disk cache), and the floor
# (a process that only opens the device). Builds nothing.
#   source .gpu/prelude.sh; .gpu/gpu29_jit.sh
set -uo pipefail
KPC=${KPC:-.gpu/kpc}
dev=${DEVICE:-opencl:gpu}
runs=${RUNS:-9}
val() { grep -o " $1=[^ ]*" <<<"$2" | head -1 | cut -d= -f2; }
median() { sort -g | awk '{a[NR]=$1} END {if (NR==0) {print "n/a"} else if (NR%2) {print a[(NR+1)/2]} else {printf "%.2f\n", (a[NR/2]+a[NR/2+1])/2}}'; }
cache=$(mktemp -d)
jit=$(mktemp -d)
export KPC_CACHE_DIR=$cache
unset KPC_CACHE_PREFETCH
CUDA_CACHE_DISABLE=1 "$KPC" bench-start --device "$dev" --phase record >/dev/null 2>&1 || { echo "record failed"; exit 1; }
one() { # mode phase -> bench-start line
  if [ "$1" = on ]; then
    env -u CUDA_CACHE_DISABLE CUDA_CACHE_PATH="$jit" "$KPC" bench-start --device "$dev" --phase "$2" 2>/dev/null | grep '^bench-start:'
  else
    CUDA_CACHE_DISABLE=1 "$KPC" bench-start --device "$dev" --phase "$2" 2>/dev/null | grep '^bench-start:'
  fi
}
echo "# first process with the JIT cache on, empty ($jit): $(one on serial)"
echo "JIT cache after it: $(du -sk "$jit" | cut -f1) KiB, $(find "$jit" -type f | wc -l) files"
declare -A tot=() ker=()
for ((i = 0; i < runs; i++)); do
  for m in floor:off floor:on serial:off serial:on; do
    line=$(one "${m#*:}" "${m%%:*}")
    tot[$m]+="$(val total_ms "$line") "
    ker[$m]+="$(val kernels_ms "$line") "
  done
done
echo "| device | phase | JIT cache | total ms | kernels ms |"
echo "|---|---|---|---|---|"
for m in floor:off floor:on serial:off serial:on; do
  echo "| $dev | ${m%%:*} | ${m#*:} | $(tr ' ' '\n' <<<"${tot[$m]}" | grep . | median) | $(tr ' ' '\n' <<<"${ker[$m]}" | grep . | median) |"
done
