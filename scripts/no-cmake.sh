#!/bin/sh
# Stands in for cmake during cargo builds (.cargo/config.toml): the only crate that would run cmake is
# shaderc-sys, and only when the system libshaderc is missing, to build shaderc from source. kpc never
# wants that; install the system library instead.
echo "kpc: shaderc-sys did not find the system libshaderc and tried to build shaderc from source with cmake." >&2
echo "kpc: install it instead: apt-get install libshaderc-dev glslang-dev spirv-tools (see README)." >&2
exit 1
