#!/usr/bin/env bash
# What the validation layer costs the Vulkan driver tests: each test binary run twice, without the layer
# and with KPC_VULKAN_VALIDATION=abort (what scripts/test.sh sets), wall seconds each. Run it twice: the
# first pass also warms Mesa's shader cache, which the second pass then measures without.
#   benches/validation_cost.sh            (builds the test binaries first)
#   TESTS="glsl main" benches/validation_cost.sh   (main: kpc-attention's test binary)
set -euo pipefail
cd "$(dirname "$0")/.."
TESTS=${TESTS:-"vulkan_build vulkan_binary vulkan_kernels vulkan_cli vulkan_device_reuse vulkan_shader_checks vulkan_recompiled interop_vulkan glsl spirv_images driver_disk blob main"}
args=()
for t in $TESTS; do args+=(--test "$t"); done
cargo build --release "${args[@]}" >&2
export KPC_TEST_REQUIRE_DRIVERS=1
total_off=0; total_on=0
for t in $TESTS; do
  bin=$(ls -t target/release/deps/"$t"-* | grep -v '\.d$' | head -1)
  for mode in off abort; do
    if [ "$mode" = off ]; then unset KPC_VULKAN_VALIDATION; else export KPC_VULKAN_VALIDATION=abort; fi
    s=$(date +%s.%N)
    "$bin" >"target/validation-cost-$t-$mode.log" 2>&1 || { echo "$t ($mode) failed: target/validation-cost-$t-$mode.log" >&2; exit 1; }
    e=$(date +%s.%N)
    secs=$(echo "$e - $s" | bc)
    printf "%-22s %-5s %7.2f s\n" "$t" "$mode" "$secs"
    if [ "$mode" = off ]; then total_off=$(echo "$total_off + $secs" | bc); else total_on=$(echo "$total_on + $secs" | bc); fi
  done
done
printf "total: %.2f s without the layer, %.2f s with it\n" "$total_off" "$total_on"
