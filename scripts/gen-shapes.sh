#!/usr/bin/env bash
# Makes random-weight GGUFs of real models' shapes for benchmarks (not for
# the test suite), cached outside the repository:
#   ~/.cache/onebit/shapes/qwen2.5-1.5b-Q4_K_M.gguf   (Qwen2.5-1.5B shape, 1.0 GB)
#   ~/.cache/onebit/shapes/llama3.2-3b-Q4_0.gguf      (Llama-3.2-3B shape, 1.9 GB)
#   ~/.cache/onebit/shapes/lfm2-8b-a1b-Q4_0.gguf      (LFM2-8B-A1B shape, MoE, 4.7 GB)
#   ~/.cache/onebit/shapes/qwen3-30b-a3b-Q4_K_M.gguf  (Qwen3-30B-A3B shape, MoE, 18.6 GB)
#   ~/.cache/onebit/shapes/gpt-oss-20b-MXFP4_MOE.gguf (gpt-oss-20b shape, MoE, MXFP4 experts, 12 GB)
#   ~/.cache/onebit/shapes/mmproj-siglip-so400m-896-F16.gguf (Gemma 3's SigLIP So400m
#       vision tower at 896 px, projecting to 2560: F16 matrices as a real mmproj, 0.8 GB)
#   ~/.cache/onebit/shapes/gemma3-text-2560-F32.gguf  (a one-layer Gemma 3 text model of
#       width 2560, which llama.cpp's mtmd needs beside the mmproj, 0.1 GB)
# and prints their paths. For the dense shapes scripts/gen-shapes.py writes
# an F16 file with the gguf Python package (installed here, pinned),
# llama.cpp's llama-quantize (scripts/build-llamacpp.sh) quantizes it, the
# F16 file is deleted. The MoE shapes are written already quantized, with
# the types llama-quantize would choose (an F16 30B would not fit the disk),
# and their routers' expert-load histogram is printed to stderr. Files
# already there are kept; ONEBIT_SHAPES_ONLY="lfm2-8b-a1b" (names separated
# by spaces; the vision pair is "mmproj-siglip-so400m-896") makes only those. A few minutes per model on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${ONEBIT_SHAPES:-$HOME/.cache/onebit/shapes}"
# llama-quantize, for the dense shapes only.
need_quantize() {
    quantize="${LLAMA_QUANTIZE:-$(scripts/build-llamacpp.sh --bin-dir)/llama-quantize}"
    if [ ! -x "$quantize" ]; then
        echo "error: no llama-quantize at $quantize (set LLAMA_QUANTIZE or run scripts/build-llamacpp.sh)" >&2
        exit 1
    fi
}
python3 -c 'import importlib.metadata as m, sys; sys.exit(m.version("gguf") != "0.19.0")' 2>/dev/null ||
    python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore gguf==0.19.0
mkdir -p "$out"
# The vision pair: written directly, no quantization.
if [ -z "${ONEBIT_SHAPES_ONLY:-}" ] || [[ " $ONEBIT_SHAPES_ONLY " == *" mmproj-siglip-so400m-896 "* ]]; then
    for spec in mmproj-siglip-so400m-896:F16 gemma3-text-2560:F32; do
        dst="$out/${spec%%:*}-${spec#*:}.gguf"
        if [ ! -s "$dst" ]; then
            python3 scripts/gen-shapes.py "${spec%%:*}" "$dst.tmp" >&2
            mv "$dst.tmp" "$dst"
        fi
        echo "$dst"
    done
fi
for spec in qwen2.5-1.5b:Q4_K_M llama3.2-3b:Q4_0 lfm2-8b-a1b:Q4_0:moe qwen3-30b-a3b:Q4_K_M:moe gpt-oss-20b:MXFP4_MOE:moe; do
    shape="${spec%%:*}"; rest="${spec#*:}"; q="${rest%%:*}"
    if [ -n "${ONEBIT_SHAPES_ONLY:-}" ] && [[ " $ONEBIT_SHAPES_ONLY " != *" $shape "* ]]; then
        continue
    fi
    dst="$out/$shape-$q.gguf"
    if [ "${rest#*:}" = moe ]; then
        if [ ! -s "$dst" ]; then
            python3 scripts/gen-shapes.py "$shape" "$dst.tmp" >&2
            mv "$dst.tmp" "$dst"
            python3 scripts/gen-shapes.py --router-histogram "$dst" 512 >&2
        fi
        echo "$dst"
        continue
    fi
    if [ ! -s "$dst" ]; then
        need_quantize
        tmp="$out/$shape-F16.gguf.tmp"
        python3 scripts/gen-shapes.py "$shape" "$tmp" >&2
        "$quantize" "$tmp" "$dst.tmp" "$q" "${THREADS:-2}" >"$out/$shape-$q.quantize.log" 2>&1 ||
            { echo "error: llama-quantize failed, see $out/$shape-$q.quantize.log" >&2; exit 1; }
        rm -f "$tmp"
        mv "$dst.tmp" "$dst"
    fi
    echo "$dst"
done
