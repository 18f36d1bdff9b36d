#!/usr/bin/env bash
# Every test: unit, integration (real files, child processes, real drivers), loom models, and a check
# that no driver test was skipped. Installs what it needs first.
set -euo pipefail
cd "$(dirname "$0")/.."
# Each section says when it starts, in seconds since this script did: the fresh-machine timing
# (BENCHMARKS.md, "Test command timing") is read from these lines.
section() { echo "== $* [${SECONDS}s]"; }
. scripts/setup.sh
section "setup done"
# s3s-fs (crates.io): the S3 tests start their own on a loopback port (tests/common/s3.rs; BENCHMARKS.md,
# "S3 test server choice", says why this server). Installed here rather than in setup.sh because the
# main job never needs it. Pinned and built with its own lock file (0.17 needs rustc 1.96, newer than
# some machines have); about 3 CPU-minutes on 2 cores, once per machine (cargo's bin directory).
s3s_version=0.14.1
if [ "$(s3s-fs --version 2>/dev/null || true)" != "s3s-fs $s3s_version" ]; then
  echo "test: building s3s-fs $s3s_version (cargo install)" >&2
  cargo install --quiet --locked "s3s-fs@$s3s_version" --features binary
fi
export RUST_BACKTRACE=1
# A driver test that finds no driver fails instead of skipping (CI installs lavapipe, PoCL, glslang),
# and every driver test logs whether it ran, so the count below shows they did.
export KPC_TEST_REQUIRE_DRIVERS=1
export KPC_TEST_DRIVER_LOG="$PWD/target/driver-tests.log"
# kpc's Vulkan instances run under Khronos' validation layer; the first validation error aborts the
# process that made it, so any error fails the run (ENVIRONMENT.md, KPC_VULKAN_VALIDATION).
export KPC_VULKAN_VALIDATION=abort
# The CPU drivers compile every kernel variant the tests launch with LLVM at full optimization; on a
# fresh machine (their shader caches empty) that was most of the attention tests' 6 minutes. The tests
# check results, not the drivers' speed, so both compile without LLVM's optimization passes: lavapipe's
# `nopt` and PoCL's `-cl-opt-disable` (BENCHMARKS.md, "Fresh-machine build"). kpc's caches in the tests
# are temporary directories, so no unoptimized binary outlives the run.
export GALLIVM_PERF=nopt POCL_EXTRA_BUILD_FLAGS=-cl-opt-disable
mkdir -p target
: > "$KPC_TEST_DRIVER_LOG"
section "public structs non-exhaustive (scripts/exhaustive-structs.py)"
python3 scripts/exhaustive-structs.py
section "the C library (kpc-capi/tests/capi_c.rs compiles C programs against it)"
# `cargo test` builds no cdylib or staticlib (tests link only rlibs), so the C library the C tests
# link is built here, by the same profile, before them.
cargo build --release -p kpc-capi
section "cargo test (unit, integration, driver tests)"
status=0
cargo test --release --workspace --all-targets --no-fail-fast 2>&1 | tee target/test-output.txt || status=$?
if [ "$status" -ne 0 ]; then
  # The log is long and a CI view may show only its ends: repeat here what failed and how, including
  # test binaries that died without a test failure (a signal, an abort, a watchdog's exit).
  echo "== cargo test failed (exit $status); what failed:" >&2
  grep -E "^test .* FAILED$|panicked at|process didn't exit successfully|validation error|HANG|aborting|signal: " \
    target/test-output.txt | head -60 >&2 || true
  grep -A4 "^error: .*targets\? failed" target/test-output.txt >&2 || true
  exit "$status"
fi
section "the C package as installed (scripts/check-capi-install.sh: shared and static links, both drivers)"
scripts/check-capi-install.sh
section "driver tests"
for backend in vulkan opencl glslang redis s3; do
  ran=$(grep -c "^ran $backend " "$KPC_TEST_DRIVER_LOG" || true)
  skipped=$(grep -c "^skipped $backend " "$KPC_TEST_DRIVER_LOG" || true)
  echo "driver tests: $backend ran $ran, skipped $skipped"
  # A backend whose tests never ran at all (deleted, renamed, filtered out) is as bad as a skip.
  if [ "$ran" -eq 0 ]; then
    echo "no $backend driver test ran" >&2
    exit 1
  fi
done
if grep -q "^skipped " "$KPC_TEST_DRIVER_LOG"; then
  echo "driver tests were skipped:" >&2
  grep "^skipped " "$KPC_TEST_DRIVER_LOG" >&2
  exit 1
fi
section "kill -9 cycles on a shared cache dir (scripts/kill9.sh; the full run is 1000, BENCHMARKS.md)"
KPC=target/release/kpc scripts/kill9.sh 16 4
section "loom models (separate target dir so the main build stays warm)"
RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom cargo test --release -p kpc --test loom
section "all tests passed"
