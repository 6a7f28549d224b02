#!/usr/bin/env bash
# Builds llama.cpp's llama-bench, llama-quantize, llama-batched-bench,
# llama-server and libmtmd from the copy vendored in
# the llama-cpp-python 0.3.36 sdist on PyPI (build 0c1e570, the one the
# fixtures and the speed issue were measured with), outside the repository,
# for the CPU this runs on:
#   ~/.cache/onebit/llamacpp/build-<isa>/bin/{llama-bench,llama-quantize,
#       llama-batched-bench,llama-server,libmtmd.so}
# (llama-batched-bench and llama-server for scripts/bench-vs-llamacpp.sh's
# BATCH rows and scripts/bench-serve.sh; the server listens where it is told,
# the scripts point it at loopback)
#
#   scripts/build-llamacpp.sh             build (or reuse) the build for this CPU
#   scripts/build-llamacpp.sh --bin-dir   print that build's bin directory, build nothing
#   LLAMACPP_ISA=avx2 scripts/build-llamacpp.sh   an AVX2-only build (build-avx2),
#                                         to compare both engines at the AVX2 level
#
# The ISA is named from /proc/cpuinfo's flags, not -march=native: ggml's
# native build would compile its AMX kernels when the CPU advertises AMX, and
# some VMs advertise AMX but trap it with SIGILL, so AMX stays off. AVX-512
# (F, CD, BW, DQ, VL) and its VBMI, VNNI and BF16 extensions, and AVX-VNNI,
# are switched on only when the CPU has them. <isa> names the set (e.g.
# avx2, avx2-avx512-vbmi-vnni-bf16), so a build made for one CPU is never
# used on a CPU that lacks its instructions. About 20 minutes on 2 cores;
# cmake comes from PyPI when the machine has none.
set -euo pipefail
dir="${ONEBIT_LLAMACPP:-$HOME/.cache/onebit/llamacpp}"

cpu_flags=" $(grep -m1 '^flags' /proc/cpuinfo | cut -d: -f2) "
has() { [[ "$cpu_flags" == *" $1 "* ]]; }
for f in avx2 fma f16c; do
    if ! has "$f"; then
        echo "error: this CPU lacks $f; scripts/build-llamacpp.sh builds for AVX2 CPUs and up" >&2
        exit 1
    fi
done
opts=(-DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON)
tag=avx2
want="${LLAMACPP_ISA:-native}"
case "$want" in
    native | avx2) ;;
    *) echo "error: LLAMACPP_ISA is '$want'; expected avx2 or unset (this CPU's level)" >&2; exit 1 ;;
esac
on() { if [ "$want" = native ] && has "$1"; then echo ON; else echo OFF; fi; }
bmi2=$(has bmi2 && echo ON || echo OFF)
avxvnni=$(on avx_vnni)
avx512=OFF
if [ "$want" = native ] && has avx512f && has avx512cd && has avx512bw && has avx512dq && has avx512vl; then
    avx512=ON
fi
vbmi=OFF; vnni=OFF; bf16=OFF
if [ $avx512 = ON ]; then
    vbmi=$(on avx512vbmi); vnni=$(on avx512_vnni); bf16=$(on avx512_bf16)
fi
opts+=(-DGGML_BMI2=$bmi2 -DGGML_AVX_VNNI=$avxvnni -DGGML_AVX512=$avx512
    -DGGML_AVX512_VBMI=$vbmi -DGGML_AVX512_VNNI=$vnni -DGGML_AVX512_BF16=$bf16
    -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF)
[ $avxvnni = ON ] && tag+=-avxvnni
[ $avx512 = ON ] && tag+=-avx512
[ $vbmi = ON ] && tag+=-vbmi
[ $vnni = ON ] && tag+=-vnni
[ $bf16 = ON ] && tag+=-bf16
build="$dir/build-$tag"

# A build made by the earlier version of this script (one "build" directory,
# AVX-512 with VBMI, VNNI and BF16) is adopted when its options are exactly
# this CPU's.
if [ ! -e "$build" ] && [ -f "$dir/build/CMakeCache.txt" ]; then
    same=1
    for o in "${opts[@]}"; do
        kv="${o#-D}"
        grep -q "^${kv%%=*}:BOOL=${kv#*=}\$" "$dir/build/CMakeCache.txt" || same=0
    done
    [ $same = 1 ] && ln -s build "$build"
fi

if [ "${1:-}" = --bin-dir ]; then
    echo "$build/bin"
    exit 0
fi

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
real="$(readlink -f "$build" 2>/dev/null || echo "$build")"
cmake -S src -B "$real" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF -DLLAMA_CURL=OFF "${opts[@]}" \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TOOLS=ON >/dev/null
cmake --build "$real" --target llama-bench llama-quantize mtmd llama-batched-bench llama-server -j "${JOBS:-2}"
echo "$build/bin"
