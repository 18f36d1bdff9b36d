#!/usr/bin/env bash
# Issue 21 on the GPU host: the baseline binaries against the fixed ones, default test threads.
# Usage (repo root, after `source .gpu/prelude.sh`): bash .gpu/hang1.sh
set -u
B=.gpu/bins
cd "$(dirname "$0")/.."
for f in $B/*.xz; do xz -dkf "$f"; done
chmod +x $B/*/* 2>/dev/null
export KPC_TEST_REQUIRE_DRIVERS=1
nproc; clinfo -l 2>&1 | head; ls /etc/OpenCL/vendors 2>&1
run() { # name binary timeout args...
  local name=$1 bin=$2 t=$3; shift 3
  local start=$(date +%s.%N)
  timeout -s STOP $t "$bin" "$@" > $OUT/$name.log 2>&1 &
  local pid=$!
  # timeout -s STOP freezes the test at the limit so its stacks can be read, then we kill it.
  local rc=0
  while kill -0 $pid 2>/dev/null; do
    if [ "$(ps -o stat= -p $(pgrep -P $pid | head -1) 2>/dev/null | cut -c1)" = "T" ]; then
      local child=$(pgrep -P $pid | head -1)
      echo "HANG $name after ${t}s; stacks:" >> $OUT/hangs.txt
      cuda-gdb -p $child -batch -ex "thread apply all bt 25" >> $OUT/hangs.txt 2>&1 || gdb -p $child -batch -ex "thread apply all bt 25" >> $OUT/hangs.txt 2>&1
      kill -9 $child; rc=124; break
    fi
    sleep 1
  done
  wait $pid; [ $rc -eq 0 ] && rc=$?
  printf "%-28s rc=%-4s %6.1fs %s\n" "$name" "$rc" "$(echo "$(date +%s.%N) - $start" | bc)" "$(grep -E '^test result' $OUT/$name.log | tail -1)"
}
# Baseline: at most 3 tries (each hang is 60 s).
for i in 1 2; do run base_vk_$i $B/base/vulkan_kernels 60; done
for i in 1 2 3 4 5 6 7 8 9 10; do run fix_vk_$i $B/fix/vulkan_kernels 60; done
for i in 1; do run base_cl_$i $B/base/opencl_kernels 60; done
for i in 1 2 3 4 5; do run fix_cl_$i $B/fix/opencl_kernels 60; done
KPC_TEST_STRESS_ROUNDS=30 run stress30 $B/fix/stress_contexts 200
