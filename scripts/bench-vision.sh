#!/usr/bin/env bash
# Images per second of a vision tower: onebit bench --mmproj against
# llama.cpp's mtmd (mtmd_encode_chunk, timed by scripts/vision-bench.c over
# libmtmd) on the same mmproj, same thread count, alternately, and the
# ratio (ours / theirs). Called by scripts/bench-vs-llamacpp.sh; runs alone.
#
#   scripts/bench-vision.sh [MMPROJ.gguf TEXT.gguf]
#
# Default: the SigLIP So400m tower at 896 px (Gemma 3's, F16 matrices) and
# its one-layer text model of width 2560 from scripts/gen-shapes.sh, in
# $ONEBIT_SHAPES or ~/.cache/onebit/shapes. TEXT.gguf is for llama.cpp
# only (mtmd needs a text model whose width is the projector's output).
# Each engine encodes one synthetic image at the tower's own size: one
# untimed warm-up, then REPS timed encodes; a round runs onebit, then
# llama.cpp; the table gives the median over rounds of each engine's median
# encode. llama.cpp runs mtmd's default context parameters (flash attention
# as mtmd picks it), on the build of scripts/build-llamacpp.sh (its native
# level); onebit at its best level (ONEBIT_ISA forces another). The CPU's
# flags line and the load average before and after are printed: on a
# shared machine, repeat when the load is high. An 896 px encode is about
# 5.5 TFLOP (3.4 in the matrices, 2.1 in attention): minutes per round on
# 2 cores.
#
#   THREADS (2)  REPS (2)  ROUNDS (1)
set -euo pipefail
cd "$(dirname "$0")/.."
threads="${THREADS:-2}"; reps="${REPS:-2}"; rounds="${ROUNDS:-1}"
shapes_dir="${ONEBIT_SHAPES:-$HOME/.cache/onebit/shapes}"
mmproj="${1:-$shapes_dir/mmproj-siglip-so400m-896-F16.gguf}"
text="${2:-$shapes_dir/gemma3-text-2560-F32.gguf}"
for f in "$mmproj" "$text"; do
    if [ ! -f "$f" ]; then
        echo "error: no $f (ONEBIT_SHAPES_ONLY=mmproj-siglip-so400m-896 scripts/gen-shapes.sh makes it)" >&2
        exit 1
    fi
done
bin="$(scripts/build-llamacpp.sh --bin-dir)"
if [ ! -e "$bin/libmtmd.so" ]; then
    echo "error: no libmtmd.so in $bin (run scripts/build-llamacpp.sh)" >&2
    exit 1
fi
src="${ONEBIT_LLAMACPP:-$HOME/.cache/onebit/llamacpp}/src"
timer="$bin/../vision-bench"
if [ ! -x "$timer" ] || [ scripts/vision-bench.c -nt "$timer" ]; then
    cc -O2 -o "$timer" scripts/vision-bench.c -I"$src/include" -I"$src/ggml/include" -I"$src/tools/mtmd" \
        -L"$bin" -lmtmd -lllama -Wl,-rpath,"$bin"
fi
cargo build --release --quiet -p onebit
onebit=target/release/onebit

echo "cpu: $(grep -m1 '^model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //')"
echo "flags:$(grep -m1 '^flags' /proc/cpuinfo | cut -d: -f2-)"
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
python3 - "$onebit" "$timer" "$mmproj" "$text" "$threads" "$reps" "$rounds" <<'PY'
import json, os, statistics, subprocess, sys
onebit, timer, mmproj, text, threads, reps, rounds = sys.argv[1:]
ours, theirs, isa, toks = [], [], "?", "?"
for r in range(int(rounds)):
    o = json.loads(subprocess.run([onebit, "bench", "--mmproj", mmproj, "--threads", threads,
                                   "--repetitions", reps, "--json"],
                                  check=True, capture_output=True, text=True).stdout)
    ours.append(o["ms_per_image"])
    isa, toks = o["isa"], o["n_tokens"]
    print(f"round {r + 1}: onebit {o['ms_per_image']:.0f} ms per image (isa {o['isa']})", flush=True)
    t = json.loads(subprocess.run([timer, text, mmproj, threads, reps],
                                  check=True, capture_output=True, text=True).stdout)
    theirs.append(t["ms_median"])
    print(f"round {r + 1}: llama.cpp {t['ms_median']:.0f} ms per image ({t['ms']})", flush=True)
o, t = statistics.median(ours), statistics.median(theirs)
print()
print("| mmproj | image tokens | threads | onebit isa | onebit img/s | llama.cpp img/s | ratio |")
print("|---|---|---|---|---|---|---|")
print(f"| {os.path.basename(mmproj)} | {toks} | {threads} | {isa} | {1e3 / o:.4f} | {1e3 / t:.4f} | {t / o:.2f}x |")
PY
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
