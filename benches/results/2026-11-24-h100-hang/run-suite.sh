#!/usr/bin/env bash
# Issue 21, item 4: every test binary on the GPU host with libtest's default threads (16), on the
# NVIDIA Vulkan driver and on NVIDIA OpenCL (PoCL, the host's other platform, removed from the ICD list),
# three times each; then the stress test. Binaries: a fresh clone's `cargo test --release`, carried
# compressed in .gpu/suite/; CARGO_BIN_EXE paths recreated by a link to this checkout.
set -u
cd "$(dirname "$0")/.."
S=.gpu/suite
base=$(cat $S/ROOT)          # the clone's path baked into the binaries
mkdir -p "$(dirname "$base")"; ln -sfn "$PWD" "$base"
mkdir -p target/release; cp .gpu/kpc target/release/kpc
for f in $S/bin/*.xz; do python3 -c "import lzma,sys; open(sys.argv[1][:-3],'wb').write(lzma.open(sys.argv[1]).read())" "$f"; done
chmod +x $S/bin/*
export KPC_TEST_REQUIRE_DRIVERS=1 OCL_ICD_FILENAMES=libnvidia-opencl.so.1
run() { # name timeout cmd...
  local name=$1 t=$2; shift 2
  local start=$(date +%s%N)
  timeout -k 5 $t "$@" > $OUT/cur.log 2>&1; local rc=$?
  { echo "=== $name rc=$rc"; cat $OUT/cur.log; } >> $OUT/suite.log
  printf "%-34s rc=%-3s %6s ms %s\n" "$name" "$rc" "$(( ($(date +%s%N) - start) / 1000000 ))" "$(grep -hE '^test result' $OUT/cur.log | sed 's/; 0 measured.*//' | tr '\n' ' ')"
}
for b in $S/bin/*; do
  case $b in *.xz) continue ;; esac
  n=$(basename $b)
  runs=3; [ $n = attention ] && runs=2
  for i in $(seq 1 $runs); do run "$n#$i" 150 $b; done
done
KPC_TEST_STRESS_ROUNDS=100 run "stress vulkan 100 rounds" 300 $S/bin/stress_contexts vulkan_contexts
KPC_TEST_STRESS_ROUNDS=10 run "stress nv-opencl 10 rounds" 300 $S/bin/stress_contexts opencl_contexts
KPC_TEST_STRESS_ROUNDS=10 run "stress both 10 rounds" 300 $S/bin/stress_contexts both_backends
rm -f $OUT/cur.log
