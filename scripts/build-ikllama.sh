#!/usr/bin/env bash
# Installs ik_llama.cpp's library from PyPI (ik-llama-cpp-python 0.1.5: an
# AVX2 build of libllama/libggml with its C header, no llama-bench) outside
# the repository, and compiles scripts/ik-bench.c, a small timer over its C
# API, against it:
#   ~/.cache/onebit/ik_llama/ik-bench
#
#   scripts/build-ikllama.sh          install (or reuse) and build; prints the timer's path
#   scripts/build-ikllama.sh --path   print the timer's path, build nothing
#
# Used by scripts/bench-vs-llamacpp.sh for its third column (ik_llama.cpp at
# ONEBIT_ISA=avx2, with its run-time repacking on and off).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
dir="${ONEBIT_IKLLAMA:-$HOME/.cache/onebit/ik_llama}"
timer="$dir/ik-bench"
if [ "${1:-}" = --path ]; then echo "$timer"; exit 0; fi
pkg="$dir/pkg"
if [ ! -f "$pkg/include/llama.h" ]; then
    mkdir -p "$dir"
    python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore \
        --no-deps --target "$pkg" ik-llama-cpp-python==0.1.5
fi
lib="$pkg/lib64"
[ -f "$lib/libllama.so" ] || lib="$pkg/ik_llama_cpp/lib"
if [ ! -x "$timer" ] || [ "$here/ik-bench.c" -nt "$timer" ]; then
    cc -O2 -o "$timer" "$here/ik-bench.c" -I"$pkg/include" -L"$lib" -lllama -lggml \
        -Wl,-rpath,"$lib" -Wl,-rpath,"$pkg/ik_llama_cpp_python.libs"
fi
echo "$timer"
