#!/usr/bin/env bash
# Builds llama.cpp's llama-bench from the copy vendored in the llama-cpp-python
# 0.3.36 sdist on PyPI (build 0c1e570, the one the fixtures and the speed
# issue were measured with), outside the repository:
#   ~/.cache/onebit/llamacpp/build/bin/llama-bench
# CPU only, AVX-512 with VNNI named explicitly and AMX off (see below). About
# 20 minutes on 2 cores. cmake comes from PyPI
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
# GGML_NATIVE would compile ggml's AMX kernels (-march=native sees AMX), and
# this VM advertises AMX but traps it with SIGILL; name the ISA instead.
cmake -S src -B build -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF -DLLAMA_CURL=OFF \
    -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON \
    -DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON \
    -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TOOLS=ON >/dev/null
cmake --build build --target llama-bench -j "${JOBS:-2}"
echo "$dir/build/bin/llama-bench"
