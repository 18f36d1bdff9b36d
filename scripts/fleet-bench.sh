#!/usr/bin/env bash
# Fleet cold start against a loopback redis-server: one `kpc attention` process with an empty local
# cache and an empty remote, then N processes at once, each with its own empty local cache, sharing one
# empty remote (the fleet build lock), then N at once without a remote. Prints the wall time of each and
# how many times each kernel was built across the N processes. Driver caches are off so cold builds are
# real builds: each process gets its own empty PoCL kernel cache and Mesa shader cache (turning PoCL's
# cache off makes concurrent PoCL processes collide on their temporary files).
# Usage: scripts/fleet-bench.sh   (variables: KPC, N, BACKEND; ENVIRONMENT.md)
set -euo pipefail
cd "$(dirname "$0")/.."
KPC=${KPC:-target/release/kpc}
N=${N:-8}
BACKEND=${BACKEND:-opencl}
tmp=$(mktemp -d)
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no --dir "$tmp" >/dev/null &
rpid=$!
trap 'kill $rpid 2>/dev/null; rm -rf "$tmp"' EXIT
until redis-cli -p "$port" ping >/dev/null 2>&1; do sleep 0.05; done
unset KPC_CACHE_REMOTE_KEY KPC_DEVICE

# run NAME DB|none: one attention run with its own empty local cache; DB picks a redis database, so
# each experiment starts with an empty remote.
run() {
  local remote=""
  [ "$2" != none ] && remote="redis://127.0.0.1:$port/$2"
  POCL_CACHE_DIR="$tmp/pocl-$1" MESA_SHADER_CACHE_DIR="$tmp/mesa-$1" \
    KPC_CACHE_DIR="$tmp/local-$1" KPC_CACHE_REMOTE="$remote" "$KPC" attention --backend "$BACKEND" \
    --prompt 40 --steps 8 --heads 4 --kv-heads 2 >"$tmp/out-$1.txt"
}
now() { date +%s.%N; }
builds() { cat "$tmp"/out-$1*.txt | awk '$1 ~ /^attn_/ && $2 == "built"' | wc -l; }

t0=$(now); run single 1; t1=$(now)
kernels=$(awk '$1 ~ /^attn_/' "$tmp/out-single.txt" | wc -l)
# Waits for the runs only (a bare `wait` would wait for redis-server too).
pids=(); for i in $(seq 1 "$N"); do run "fleet$i" 2 & pids+=($!); done; wait "${pids[@]}"
t2=$(now)
pids=(); for i in $(seq 1 "$N"); do run "alone$i" none & pids+=($!); done; wait "${pids[@]}"
t3=$(now)
echo "backend $BACKEND, $kernels attention kernels, $N processes, $(nproc) cores"
echo "one process, cold:               wall $(echo "$t1 - $t0" | bc) s, builds $(builds single)"
echo "$N processes, one remote:         wall $(echo "$t2 - $t1" | bc) s, builds $(builds fleet) ($(echo "scale=2; $(builds fleet) / $kernels" | bc) per kernel)"
echo "$N processes, no remote:          wall $(echo "$t3 - $t2" | bc) s, builds $(builds alone) ($(echo "scale=2; $(builds alone) / $kernels" | bc) per kernel)"
grep -h "^remote:" "$tmp"/out-fleet*.txt | head -3
