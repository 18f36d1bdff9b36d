#!/usr/bin/env bash
# Issue 18 on the GPU host, in one call, with prebuilt binaries only (no cargo there):
#   hit   the hit-path table at 1..N threads: runs HIT_PATH_BIN (the built benches/hit_path.rs,
#         target/release/deps/hit_path-*; skipped with a note when unset);
#   warm  a warm process's time to have every attention kernel in memory: warm start (prefetch from
#         the last run's manifest) vs Context::prefetch vs today's serial acquisition vs the process
#         floor (a process that only opens the device), each a fresh process, RUNS rounds, medians;
#   cold  a cold process building every shipped kernel in parallel (Context::prefetch) vs the sum of
#         single builds (each alone in a fresh process) and the longest one, COLD_RUNS rounds, medians.
# Driver caches are off throughout (__GL_SHADER_DISK_CACHE=0, CUDA_CACHE_DISABLE=1,
# MESA_SHADER_CACHE_DISABLE=true, a fresh POCL_CACHE_DIR), and every cold process gets a fresh
# KPC_CACHE_DIR, so "cold" is cold and "warm" is kpc's own disk cache only.
#
#   source .gpu/prelude.sh; HIT_PATH_BIN=.gpu/hit_path benches/hot_path_gpu.sh
#   # NVIDIA OpenCL through the ICD loader:
#   OCL_ICD_FILENAMES=libnvidia-opencl.so.1 OCL_ICD_VENDORS=/nonexistent benches/hot_path_gpu.sh
# Variables: KPC (kpc binary; default .gpu/kpc, else target/release/kpc), DEVICES (KPC_DEVICE
# selectors, default "vulkan:gpu opencl:gpu"; "vulkan:0 opencl:0" on a CPU-only machine), SECTIONS
# (default "hit warm cold"), RUNS (default 15), COLD_RUNS (default 3), HIT_PATH_ARGS, OUT (logs;
# default a temporary directory).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
if [ -z "${KPC:-}" ]; then
  if [ -x .gpu/kpc ]; then KPC=.gpu/kpc; else KPC=$here/../target/release/kpc; fi
fi
devices=${DEVICES:-vulkan:gpu opencl:gpu}
sections=${SECTIONS:-hit warm cold}
runs=${RUNS:-15}
cold_runs=${COLD_RUNS:-3}
out=${OUT:-$(mktemp -d /tmp/kpc-hot-path.XXXXXX)}
mkdir -p "$out"
scratch=$(mktemp -d /tmp/kpc-hot-path-scratch.XXXXXX)
trap 'rm -rf "$scratch"' EXIT
export __GL_SHADER_DISK_CACHE=0 CUDA_CACHE_DISABLE=1 MESA_SHADER_CACHE_DISABLE=true
unset KPC_CACHE_PREFETCH

val() { grep -o " $1=[^ ]*" <<<"$2" | head -1 | cut -d= -f2; }
median() { sort -g | awk '{a[NR]=$1} END {if (NR==0) {print "n/a"} else if (NR%2) {print a[(NR+1)/2]} else {printf "%.2f\n", (a[NR/2]+a[NR/2+1])/2}}'; }
# A fresh POCL_CACHE_DIR and KPC_CACHE_DIR (unless one is given) for one process.
fresh() { local d; d=$(mktemp -d "$scratch/run.XXXXXX"); echo "$d"; }
run_phase() { # device phase cache-dir [args...] -> the bench-start line, or a failure on stderr
  local dev=$1 phase=$2 cache=$3
  shift 3
  local pocl line
  pocl=$(fresh)
  line=$(POCL_CACHE_DIR=$pocl KPC_CACHE_DIR=$cache "$KPC" bench-start --device "$dev" --phase "$phase" "$@" 2>>"$out/stderr.log" |
    tee -a "$out/raw.log" | grep '^bench-start:')
  rm -rf "$pocl"
  if [ -z "$line" ]; then echo "($dev $phase failed: see $out/stderr.log)" >&2; fi
  echo "$line"
}

echo "# kpc issue 18: hot path and start-up ($(date -u +%FT%TZ))"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null || true
echo "host: $(nproc) cores, $(uname -r); kpc: $KPC; logs: $out"

for s in $sections; do
  case $s in
    hit)
      echo
      echo "## Hit path (ns per hit per thread)"
      if [ -n "${HIT_PATH_BIN:-}" ]; then
        # shellcheck disable=SC2086
        "$HIT_PATH_BIN" --bench ${HIT_PATH_ARGS:-} 2>&1 | tee "$out/hit_path.txt"
      else
        echo "(skipped: set HIT_PATH_BIN to the built hit_path bench binary)"
      fi
      ;;
    warm)
      echo
      echo "## Warm process: every attention kernel in memory (median of $runs fresh processes each)"
      echo "| device | phase | total ms | open ms | kernels ms | kernels | from memory | vs floor ms |"
      echo "|---|---|---|---|---|---|---|---|"
      for dev in $devices; do
        cache=$(fresh)
        # The last run, which leaves the attention kernels in this device's disk cache and manifest.
        if ! KPC_CACHE_DIR=$cache POCL_CACHE_DIR=$(fresh) "$KPC" bench-start --device "$dev" \
          --phase record >>"$out/raw.log" 2>>"$out/stderr.log"; then
          echo "| $dev | record failed: see $out/stderr.log |||||||"
          continue
        fi
        declare -A tot=() opn=() ker=() mem=() nk=()
        for ((i = 0; i < runs; i++)); do
          # Interleaved, so drift (clocks, other load) hits every phase alike.
          for phase in floor serial prefetch warm; do
            line=$(run_phase "$dev" "$phase" "$cache")
            [ -n "$line" ] || continue
            tot[$phase]+="$(val total_ms "$line") "
            opn[$phase]+="$(val open_ms "$line") "
            ker[$phase]+="$(val kernels_ms "$line") "
            mem[$phase]=$(val from_memory "$line")
            nk[$phase]=$(val kernels "$line")
          done
        done
        floor=$(tr ' ' '\n' <<<"${tot[floor]:-}" | grep . | median)
        for phase in floor serial prefetch warm; do
          t=$(tr ' ' '\n' <<<"${tot[$phase]:-}" | grep . | median)
          o=$(tr ' ' '\n' <<<"${opn[$phase]:-}" | grep . | median)
          k=$(tr ' ' '\n' <<<"${ker[$phase]:-}" | grep . | median)
          d=$(awk -v a="$t" -v b="$floor" 'BEGIN { if (a+0 == a && b+0 == b) printf "%+.2f", a-b; else print "n/a" }')
          echo "| $dev | $phase | $t | $o | $k | ${nk[$phase]:-} | ${mem[$phase]:-} | $d |"
        done
        unset tot opn ker mem nk
      done
      echo "(goal: warm <= floor + 2 ms. total = configuration, device discovery and open, then the kernels;"
      echo " serial and prefetch read the disk cache, warm waits for the background load started at creation.)"
      ;;
    cold)
      echo
      echo "## Cold process: every shipped kernel built (median of $cold_runs rounds; driver caches off)"
      echo "| device | kernels | parallel ms | sum of single builds ms | longest single ms (kernel) | parallel / longest | sum / parallel |"
      echo "|---|---|---|---|---|---|---|"
      for dev in $devices; do
        par_all="" sum_all="" max_all="" maxk="" n=""
        for ((r = 0; r < cold_runs; r++)); do
          line=$(run_phase "$dev" cold-parallel "$(fresh)")
          [ -n "$line" ] || continue
          n=$(val kernels "$line")
          par_all+="$(val kernels_ms "$line") "
          names=$(val each "$line" | tr ',' '\n' | cut -d: -f1)
          sum=0 max=0
          for k in $names; do
            one=$(run_phase "$dev" cold-single "$(fresh)" --kernel "$k")
            ms=$(val kernels_ms "$one")
            [ -n "$ms" ] || continue
            sum=$(awk -v a="$sum" -v b="$ms" 'BEGIN { printf "%.2f", a+b }')
            if awk -v a="$ms" -v b="$max" 'BEGIN { exit !(a > b) }'; then max=$ms maxk=$k; fi
          done
          sum_all+="$sum " max_all+="$max "
        done
        p=$(tr ' ' '\n' <<<"$par_all" | grep . | median)
        sm=$(tr ' ' '\n' <<<"$sum_all" | grep . | median)
        mx=$(tr ' ' '\n' <<<"$max_all" | grep . | median)
        ratio=$(awk -v a="$p" -v b="$mx" 'BEGIN { if (b > 0) printf "%.2f", a/b; else print "n/a" }')
        speed=$(awk -v a="$sm" -v b="$p" 'BEGIN { if (b > 0) printf "%.2f", a/b; else print "n/a" }')
        echo "| $dev | $n | $p | $sm | $mx ($maxk) | $ratio | $speed |"
      done
      echo "(goal: parallel <= 1.5x the longest single build. Times from the device being open to every"
      echo " kernel in memory and persisted; each single build in its own fresh process and cache.)"
      ;;
    *) echo "unknown section $s (expected hit, warm, cold)" >&2 ;;
  esac
done
