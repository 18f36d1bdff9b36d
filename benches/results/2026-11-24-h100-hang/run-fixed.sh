#!/usr/bin/env bash
# Issue 21 on the GPU host: the fixed binaries (devices kept, never destroyed), default test threads.
set -u
B=.gpu/bins
cd "$(dirname "$0")/.."
for f in $B/fix/*.xz; do python3 -c "import lzma,sys; open(sys.argv[1][:-3],'wb').write(lzma.open(sys.argv[1]).read())" "$f"; done
chmod +x $B/fix/*
export KPC_TEST_REQUIRE_DRIVERS=1
hangs=0
run() { # name timeout cmd...   (never waits on a hung process: stacks, kill, move on)
  local name=$1 t=$2; shift 2
  local start=$(date +%s%N)
  timeout -s STOP $t "$@" > $OUT/cur.log 2>&1 &
  local pid=$! child="" rc=""
  sleep 0.2; child=$(pgrep -P $pid | head -1)
  while kill -0 $pid 2>/dev/null; do
    if [ -n "$child" ] && [ "$(ps -o stat= -p $child 2>/dev/null | cut -c1)" = "T" ]; then
      echo "HANG $name after ${t}s" >> $OUT/hangs.txt
      timeout 30 gdb -p $child -batch -ex "thread apply all bt 25" >> $OUT/hangs.txt 2>&1
      kill -9 $child; rc=HANG; hangs=$((hangs+1)); break
    fi
    sleep 0.2
  done
  [ -z "$rc" ] && { wait $pid; rc=$?; }
  { echo "=== $name"; cat $OUT/cur.log; } >> $OUT/all.log
  printf "%-22s rc=%-4s %6.1fs %s\n" "$name" "$rc" "$(( ($(date +%s%N) - start) / 1000000 ))e-3" "$(grep -hE '^test result|threads x' $OUT/cur.log | tr '\n' ' ')"
}
run reuse 60 $B/fix/vulkan_device_reuse
for i in $(seq 1 10); do run fix_vk_$i 40 $B/fix/vulkan_kernels; [ $hangs -ge 3 ] && break; done
for i in $(seq 1 3); do run fix_cl_pocl_$i 60 $B/fix/opencl_kernels; done
for i in $(seq 1 3); do OCL_ICD_FILENAMES=libnvidia-opencl.so.1 run fix_cl_nv_$i 60 $B/fix/opencl_kernels; done
KPC_TEST_STRESS_ROUNDS=100 run stress100_vk 240 $B/fix/stress_contexts vulkan_contexts
KPC_TEST_STRESS_ROUNDS=100 OCL_ICD_FILENAMES=libnvidia-opencl.so.1 run stress100_nvcl 200 $B/fix/stress_contexts
rm -f $OUT/cur.log
