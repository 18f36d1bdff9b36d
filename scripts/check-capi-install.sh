#!/usr/bin/env bash
# The C package as installed: scripts/install-capi.sh into a fresh prefix, then
# kpc-capi/tests/c/installed.c (it includes only <kpc.h>) compiled with `cc` the two ways the
# install script documents — shared through pkg-config (no LD_LIBRARY_PATH: kpc.pc's rpath) and
# static through libkpc.a and static_libs — and each run on Vulkan and OpenCL CPU devices (lavapipe and
# PoCL in CI): a first run builds saxpy, a second loads it from the disk cache.
#   scripts/check-capi-install.sh          (scripts/test.sh runs it)
set -euo pipefail
cd "$(dirname "$0")/.."
target_dir=${CARGO_TARGET_DIR:-target}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
prefix=$work/prefix
scripts/install-capi.sh "$prefix" release 2>"$work/install.log" || { cat "$work/install.log" >&2; exit 1; }
export PKG_CONFIG_PATH=$prefix/lib/pkgconfig
src=kpc-capi/tests/c/installed.c
# shellcheck disable=SC2046 # pkg-config's words are separate arguments
cc -Wall -Werror "$src" $(pkg-config --cflags --libs kpc) -o "$work/shared"
# shellcheck disable=SC2046
cc -Wall -Werror "$src" $(pkg-config --cflags kpc) "$(pkg-config --variable=libdir kpc)/libkpc.a" \
  $(pkg-config --variable=static_libs kpc) -o "$work/static"
if ldd "$work/static" | grep -q libkpc; then
  echo "check-capi-install: the static program loads libkpc.so" >&2
  exit 1
fi
unset LD_LIBRARY_PATH
for backend in vulkan opencl; do
  export KPC_CACHE_DIR=$work/cache-$backend
  "$work/shared" "$backend:cpu" built
  "$work/static" "$backend:cpu" disk
done
echo "check-capi-install: shared and static programs ran on vulkan and opencl"
