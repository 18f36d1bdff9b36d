#!/usr/bin/env bash
# Installs what kpc needs on a fresh Debian/Ubuntu machine: a Rust toolchain (if none), the CPU drivers
# kpc's tests run on (Mesa lavapipe for Vulkan, PoCL for OpenCL), their loaders, and glslangValidator.
# Idempotent; sourced by main.sh and test.sh.
set -euo pipefail
# libvulkan-dev, ocl-icd-opencl-dev and opencl-c-headers: the C API tests (kpc-capi/tests/c/) are embedders that
# call Vulkan and OpenCL themselves, so they need the headers and the -lvulkan/-lOpenCL link names.
# redis-server: the remote tier's tests start their own on a loopback port. libshaderc-dev: the shaderc
# crate links Debian's library instead of building shaderc's C++ (GLSL images); build.rs adds what that
# library leaves undefined: glslang-dev's static front end and one member of spirv-tools' libSPIRV-Tools.a.
# libzstd-dev: bundles are zstd frames; zstd-sys links the system library instead of compiling zstd.
# vulkan-validationlayers: test.sh runs the Vulkan tests under VK_LAYER_KHRONOS_validation (and the
# interop contract tests run their embedder's own instance under it); a validation error fails them.
pkgs=(mesa-vulkan-drivers libvulkan1 vulkan-tools vulkan-validationlayers pocl-opencl-icd ocl-icd-libopencl1
      clinfo glslang-tools libvulkan-dev ocl-icd-opencl-dev opencl-c-headers
      redis-server libshaderc-dev glslang-dev spirv-tools libzstd-dev
      build-essential cmake python3 pkg-config curl ca-certificates)
missing=()
for p in "${pkgs[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
  sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
  echo "setup: installing ${missing[*]}" >&2
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
fi
if ! command -v cargo >/dev/null 2>&1; then
  [ -f "$HOME/.cargo/env" ] || curl -sSf https://sh.rustup.rs | sh -s -- -y --profile minimal
  # shellcheck disable=SC1091
  . "$HOME/.cargo/env"
fi
