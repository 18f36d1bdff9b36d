#!/usr/bin/env bash
# What the validation layer costs the Vulkan driver tests: each area run twice, without the layer and
# with KPC_VULKAN_VALIDATION=abort (what scripts/test.sh sets), wall seconds each. Run it twice: the
# first pass also warms Mesa's shader cache, which the second pass then measures without.
# Every crate has one integration-test binary (`--test main`); an area is a package and a module
# filter of that binary.
#   benches/validation_cost.sh
#   AREAS="kpc-cli:glsl kpc-attention:" benches/validation_cost.sh   (an empty filter: the whole binary)
set -euo pipefail
cd "$(dirname "$0")/.."
AREAS=${AREAS:-"kpc:vulkan_build kpc:vulkan_binary kpc:vulkan_kernels kpc-cli:vulkan_cli kpc:vulkan_device_reuse kpc:vulkan_shader_checks kpc:vulkan_recompiled kpc:interop_vulkan kpc-cli:glsl kpc:spirv_images kpc:driver_disk kpc:blob kpc-attention:"}
export KPC_TEST_REQUIRE_DRIVERS=1
total_off=0; total_on=0
for area in $AREAS; do
  pkg=${area%%:*}; filter=${area#*:}
  bin=$(cargo test --release -p "$pkg" --test main --no-run --message-format=json 2>/dev/null |
    python3 -c 'import json,sys; print([m["executable"] for m in map(json.loads,sys.stdin) if m.get("executable")][-1])')
  name="$pkg-${filter:-all}"
  for mode in off abort; do
    if [ "$mode" = off ]; then unset KPC_VULKAN_VALIDATION; else export KPC_VULKAN_VALIDATION=abort; fi
    s=$(date +%s.%N)
    "$bin" $filter >"target/validation-cost-$name-$mode.log" 2>&1 || { echo "$name ($mode) failed: target/validation-cost-$name-$mode.log" >&2; exit 1; }
    e=$(date +%s.%N)
    secs=$(echo "$e - $s" | bc)
    printf "%-32s %-5s %7.2f s\n" "$name" "$mode" "$secs"
    if [ "$mode" = off ]; then total_off=$(echo "$total_off + $secs" | bc); else total_on=$(echo "$total_on + $secs" | bc); fi
  done
done
printf "total: %.2f s without the layer, %.2f s with it\n" "$total_off" "$total_on"
