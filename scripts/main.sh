#!/usr/bin/env bash
# The main job: install what is needed, build kpc in release mode and run it. Extra arguments go to kpc.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/setup.sh
cargo build --release --quiet
exec target/release/kpc "$@"
