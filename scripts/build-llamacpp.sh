#!/usr/bin/env bash
# Builds llama.cpp's llama-bench from the copy vendored in the llama-cpp-python
# 0.3.36 sdist on PyPI (build 0c1e570, the one the fixtures and the speed
# issue were measured with), outside the repository:
#   ~/.cache/onebit/llamacpp/build/bin/llama-bench
# GGML_NATIVE, CPU only. About 20 minutes on 2 cores. cmake comes from PyPI
# when the machine has none.
set -euo pipefail
dir="${ONEBIT_LLAMACPP:-$HOME/.cache/onebit/llamacpp}"
mkdir -p "$dir"
cd "$dir"
if [ ! -f llama_cpp_python-0.3.36.tar.gz ]; then
    pip download --quiet --no-deps --no-binary llama-cpp-python llama-cpp-python==0.3.36 -d .
fi
if [ ! -d src ]; then
    mkdir -p src
    tar -xzf llama_cpp_python-0.3.36.tar.gz -C src --strip-components=3 llama_cpp_python-0.3.36/vendor/llama.cpp
fi
command -v cmake >/dev/null || pip install --quiet cmake
cmake -S src -B build -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TOOLS=ON >/dev/null
cmake --build build --target llama-bench -j "${JOBS:-2}"
echo "$dir/build/bin/llama-bench"
