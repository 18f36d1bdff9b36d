#!/usr/bin/env bash
# A frozen remote's cost to a cold run (issue 25): a loopback redis-server stopped with SIGSTOP (its
# kernel still accepts connections, nothing answers), and RUNS cold `kpc attention --backend BACKEND
# --prompt 16 --steps 2 --check` runs against it with KPC_CACHE_REMOTE_TIMEOUT=1s, each with an empty
# kpc cache, interleaved with RUNS with no remote. The drivers' own caches are left on and warmed by a
# first run (a cold PoCL build alone takes seconds on a loaded 2-core VM and would drown the remote's
# share). Prints each wall time and the medians. The goal: at most one timeout (1 s) more than
# without a remote.
# Usage: scripts/frozen-remote.sh [RUNS [BACKEND]]   (default 5, opencl; variable: KPC)
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${1:-5}
BACKEND=${2:-opencl}
KPC=${KPC:-target/release/kpc}
tmp=$(mktemp -d)
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no --dir "$tmp" >/dev/null &
rpid=$!
trap 'kill -CONT $rpid 2>/dev/null; kill $rpid 2>/dev/null; rm -rf "$tmp"' EXIT
until redis-cli -p "$port" ping >/dev/null 2>&1; do sleep 0.05; done
kill -STOP "$rpid"
unset KPC_CACHE_REMOTE_KEY KPC_DEVICE KPC_CACHE_READONLY_DIRS
export POCL_CACHE_DIR="$tmp/pocl" MESA_SHADER_CACHE_DIR="$tmp/mesa"

# run NAME REMOTE: one cold run; prints its wall time in seconds.
run() {
  local t0 t1
  t0=$(date +%s.%N)
  KPC_CACHE_DIR="$tmp/local-$1" KPC_CACHE_REMOTE="$2" \
    KPC_CACHE_REMOTE_TIMEOUT=1s "$KPC" attention --backend "$BACKEND" --prompt 16 --steps 2 --check \
    >"$tmp/out-$1.txt" 2>&1 || { cat "$tmp/out-$1.txt" >&2; exit 1; }
  t1=$(date +%s.%N)
  echo "$t1 - $t0" | bc
}
median() { sort -n | awk '{a[NR] = $1} END {print a[int((NR + 1) / 2)]}'; }

run warmup "" >/dev/null
frozen=()
plain=()
for i in $(seq 1 "$RUNS"); do
  frozen+=("$(run "frozen$i" "redis://127.0.0.1:$port/0")")
  plain+=("$(run "plain$i" "")")
done
echo "frozen remote: ${frozen[*]}"
echo "no remote:     ${plain[*]}"
echo "median: frozen $(printf '%s\n' "${frozen[@]}" | median) s, no remote $(printf '%s\n' "${plain[@]}" | median) s ($BACKEND, $RUNS runs each, KPC_CACHE_REMOTE_TIMEOUT=1s)"
grep -h "warn\|WARN" "$tmp"/out-frozen1.txt | head -5 || true
