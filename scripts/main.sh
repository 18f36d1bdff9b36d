#!/usr/bin/env bash
# The main job: install what is needed, build kpc in release mode and run attention with a KV cache
# (prefill + decode, checked against the float64 reference). Arguments replace the default
# `attention --check`, e.g. `./scripts/main.sh attention --backend opencl` or `./scripts/main.sh devices`.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/setup.sh
# The remote tier (feature `remote`: OpenDAL, redis, s3) adds about 100 s to a fresh 2-core build, which a
# first run does not need: it is left out unless KPC_CACHE_REMOTE asks for a remote. scripts/test.sh and a
# plain `cargo build --release` build it.
features=(--no-default-features --features glsl)
if [ -n "${KPC_CACHE_REMOTE:-}" ]; then features=(); fi
cargo build --release --quiet -p kpc-cli "${features[@]}"
if [ $# -eq 0 ]; then set -- attention --check; fi
exec target/release/kpc "$@"
