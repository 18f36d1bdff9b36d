#!/usr/bin/env bash
# kill -9 at random moments (issue 25): CYCLES cold `kpc attention` runs on one shared cache directory,
# alternating Vulkan and OpenCL, each killed with SIGKILL after a random delay, so kills land in
# builds, publishes, size-file updates, eviction passes and sweeps (the cache limit is small, so puts
# cross it and passes run). Every CLEAR_EVERY cycles the cache is cleared by `kpc cache clear`, itself
# killed at a random moment every other time.
#
# Checked after every kill: the size record is either exact (tracked size == bytes of the .src/.bin
# files under v1/) or flagged for a recount by the killed process (a kill inside a change or a pass),
# never silently wrong. At the end: `kpc cache verify` is clean; an eviction pass (`kpc cache prune`)
# settles any flagged record and the tracked size equals the bytes on disk; a warm run of each backend
# hits the disk for every kernel.
#
# Usage: scripts/kill9.sh [CYCLES [CLEAR_EVERY [MAX_DELAY_MS]]]   (default 1000, 7, 1500; variable: KPC)
set -euo pipefail
cd "$(dirname "$0")/.."
CYCLES=${1:-1000}
CLEAR_EVERY=${2:-7}
MAX_DELAY_MS=${3:-1500}
KPC=${KPC:-target/release/kpc}
work=$(mktemp -d /tmp/kpc-kill9.XXXXXX)
trap 'rm -rf "$work"' EXIT
# set -e ends the script at a failed command; say which, instead of exiting without a word.
trap 'echo "kill9: failed at line $LINENO: $BASH_COMMAND" >&2' ERR
# A limit under one backend's entries (PoCL's binaries are 64-450 KB each), so puts cross it and
# eviction passes and sweeps run in the killed processes.
export KPC_CACHE_DIR="$work/cache" KPC_CACHE_PERSISTENT=1 KPC_CACHE_MAX_SIZE=600K
# kpc's cache is what is cold; the drivers' own caches stay on and warm (a first run warms them), so a
# run takes about a second and a random kill lands anywhere in it rather than always in the first
# compile.
export POCL_CACHE_DIR="$work/pocl" MESA_SHADER_CACHE_DIR="$work/mesa" POCL_WORK_GROUP_SPECIALIZATION=0
unset KPC_DEVICE KPC_CACHE_REMOTE KPC_CACHE_REMOTE_KEY KPC_CACHE_READONLY_DIRS

attention() { # BACKEND [extra args]
  local b=$1
  shift
  # exec: in a background job, the job's pid is then kpc's own, which is what gets the SIGKILL.
  exec "$KPC" attention --backend "$b" --prompt 16 --steps 2 "$@"
}
# Bytes of the counted files: every .src and .bin under v1/ (count.rs).
on_disk() {
  # A kill right after a clear can leave no v1/ at all: that is 0 bytes, not a failure (pipefail).
  { find "$KPC_CACHE_DIR/v1" -type f \( -name '*.src' -o -name '*.bin' \) -printf '%s\n' 2>/dev/null || true; } |
    awk '{s += $1} END {print s + 0}'
}
# The tracked size, or "null" when the record is missing or flagged for a recount.
tracked() {
  "$KPC" cache stats --json | tr -d ' \n' | sed -E 's/.*"tracked_size":(null|[0-9]+).*/\1/'
}
random_ms() { echo $(((RANDOM * 32768 + RANDOM) % $1)); }

(KPC_CACHE_PERSISTENT=0 attention vulkan >/dev/null)
(KPC_CACHE_PERSISTENT=0 attention opencl >/dev/null)
exact=0 flagged=0 killed=0 finished=0 clears=0
start=$(date +%s)
for i in $(seq 1 "$CYCLES"); do
  if [ $((i % 2)) -eq 0 ]; then backend=opencl; else backend=vulkan; fi
  if [ $((i % CLEAR_EVERY)) -eq 0 ]; then
    clears=$((clears + 1))
    (exec "$KPC" cache clear >/dev/null 2>&1) &
    pid=$!
    if [ $((clears % 2)) -eq 0 ]; then
      sleep "0.$(printf '%03d' "$(random_ms 200)")"
      kill -9 "$pid" 2>/dev/null || true
    fi
    wait "$pid" 2>/dev/null || true
  fi
  attention "$backend" >/dev/null 2>&1 &
  pid=$!
  delay=$(random_ms "$MAX_DELAY_MS")
  sleep "$((delay / 1000)).$(printf '%03d' $((delay % 1000)))"
  if kill -9 "$pid" 2>/dev/null; then killed=$((killed + 1)); else finished=$((finished + 1)); fi
  wait "$pid" 2>/dev/null || true
  t=$(tracked)
  d=$(on_disk)
  if [ "$t" = null ]; then
    flagged=$((flagged + 1))
  elif [ "$t" = "$d" ]; then
    exact=$((exact + 1))
  else
    echo "cycle $i ($backend, killed after ${delay} ms): tracked $t but $d bytes on disk" >&2
    ls -la "$KPC_CACHE_DIR/v1" >&2
    cat "$KPC_CACHE_DIR/v1/size" >&2 || true
    exit 1
  fi
  if [ $((i % 50)) -eq 0 ]; then
    echo "cycle $i: killed $killed, finished before the kill $finished; record exact $exact, flagged $flagged; $(($(date +%s) - start)) s"
  fi
done

echo "== after $CYCLES cycles ($killed killed, $finished finished first, $clears clears): verify"
"$KPC" cache verify
echo "== settle the record with one eviction pass, then compare"
"$KPC" cache prune --max-size 1T >/dev/null
t=$(tracked)
d=$(on_disk)
echo "tracked $t, on disk $d"
[ "$t" = "$d" ] || { echo "tracked size differs from the bytes on disk" >&2; exit 1; }
echo "== warm runs hit the disk"
for b in vulkan opencl; do
  # Fills the cache for this backend if the last cycles left it cold, then the warm run.
  (KPC_CACHE_MAX_SIZE=0 attention "$b" >/dev/null)
  out=$(KPC_CACHE_MAX_SIZE=0 attention "$b" --check)
  sources=$(echo "$out" | awk '$1 ~ /^attn_/ {print $2}' | sort -u | tr '\n' ' ')
  echo "$b warm run: kernel sources: $sources"
  [ "$sources" = "disk " ] || { echo "$out" >&2; exit 1; }
done
"$KPC" cache verify >/dev/null
echo "kill9: $CYCLES cycles, $killed killed at random moments, record exact after $exact and flagged after $flagged; verify clean; size exact; warm runs hit disk; $(($(date +%s) - start)) s"
