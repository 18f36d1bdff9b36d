#!/usr/bin/env bash
# Start time of the S3-compatible servers the S3 tests could use (BENCHMARKS.md, "S3 test server
# choice"): for each one found on PATH (s3s-fs, s3rver, moto_server), RUNS starts (default 10) on a
# free loopback port, each timed from the spawn to the first HTTP answer of any status to `GET /`
# (s3s-fs refuses an unsigned request, the others list their buckets: either is the server up), then
# killed. Prints the median and the range in milliseconds.
#   scripts/bench-s3-servers.sh [RUNS]
# Only s3s-fs is installed (by scripts/test.sh); to compare, put the others on PATH, e.g.
#   python3 -m venv /tmp/moto && /tmp/moto/bin/pip install 'moto[server]'
#   npm install --prefix /tmp/s3rver s3rver@3.7.1
#   PATH=/tmp/moto/bin:/tmp/s3rver/node_modules/.bin:$PATH scripts/bench-s3-servers.sh
set -euo pipefail
runs=${1:-10}

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# One start: prints the milliseconds from the spawn to the first answer.
start_once() {
  local name=$1 port dir pid t0 t1
  port=$(free_port)
  dir=$(mktemp -d)
  case "$name" in
    s3s-fs) s3s-fs --host 127.0.0.1 --port "$port" --access-key k --secret-key s "$dir" >/dev/null 2>&1 & ;;
    s3rver) s3rver --directory "$dir" --address 127.0.0.1 --port "$port" --silent >/dev/null 2>&1 & ;;
    moto_server) moto_server -H 127.0.0.1 -p "$port" >/dev/null 2>&1 & ;;
  esac
  pid=$!
  t0=$(date +%s%N)
  until [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/" || true)" != "000" ]; do
    kill -0 "$pid" 2>/dev/null || { echo "$name exited at start" >&2; rm -rf "$dir"; return 1; }
    sleep 0.005
  done
  t1=$(date +%s%N)
  kill "$pid"
  wait "$pid" 2>/dev/null || true
  rm -rf "$dir"
  echo $(((t1 - t0) / 1000000))
}

for name in s3s-fs s3rver moto_server; do
  if ! command -v "$name" >/dev/null 2>&1; then
    echo "$name: not on PATH"
    continue
  fi
  times=()
  for _ in $(seq "$runs"); do times+=("$(start_once "$name")"); done
  sorted=$(printf '%s\n' "${times[@]}" | sort -n)
  median=$(echo "$sorted" | sed -n "$(((runs + 1) / 2))p")
  echo "$name: start to first answer, median ${median} ms (min $(echo "$sorted" | head -1), max $(echo "$sorted" | tail -1); $runs runs)"
done
