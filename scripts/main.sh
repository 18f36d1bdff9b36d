#!/usr/bin/env bash
# The main job: install what is needed, build kpc in release mode and run attention with a KV cache
# (prefill + decode, checked against the float64 reference). Arguments replace the default
# `attention --check`, e.g. `./scripts/main.sh attention --backend opencl` or `./scripts/main.sh devices`.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/setup.sh
cargo build --release --quiet
if [ $# -eq 0 ]; then set -- attention --check; fi
exec target/release/kpc "$@"
