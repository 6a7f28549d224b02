#!/usr/bin/env bash
# Runs onebit bench and llama.cpp's llama-bench alternately on the same GGUF,
# same thread count, and prints the ratios (ours / theirs).
#
#   scripts/bench-vs-llamacpp.sh [MODEL.gguf ...]
#
# Needs a llama-bench binary: $LLAMA_BENCH, else ~/.cache/onebit/llamacpp/build/bin/llama-bench.
# scripts/build-llamacpp.sh builds one from the llama.cpp vendored in the
# llama-cpp-python 0.3.36 sdist on PyPI (about 20 minutes on 2 cores), outside
# the repository.
#
#   THREADS (2)  PP (512)  TG (64)  ROUNDS (3: alternations of the two engines)
#   DEPTH (0: tokens in the context before each test, llama-bench -d)
#   KV (f16: the KV cache type of both engines)
set -euo pipefail
cd "$(dirname "$0")/.."

threads="${THREADS:-2}"; pp="${PP:-512}"; tg="${TG:-64}"; rounds="${ROUNDS:-3}"
depth="${DEPTH:-0}"; kv="${KV:-f16}"
llama_bench="${LLAMA_BENCH:-$HOME/.cache/onebit/llamacpp/build/bin/llama-bench}"
models_dir="${ONEBIT_MODELS:-$HOME/.cache/onebit/models}"
if [ ! -x "$llama_bench" ]; then
    echo "error: no llama-bench at $llama_bench (set LLAMA_BENCH or run scripts/build-llamacpp.sh)" >&2
    exit 1
fi
if [ $# -eq 0 ]; then
    set -- "$models_dir/SmolLM2-135M-Instruct.Q4_1.gguf" "$models_dir/gemma-3-270m-q4_k_m.gguf"
fi
cargo build --release --quiet -p onebit
onebit=target/release/onebit

python3 - "$onebit" "$llama_bench" "$threads" "$pp" "$tg" "$rounds" "$depth" "$kv" "$@" <<'PY'
import json, statistics, subprocess, sys
onebit, llama, threads, pp, tg, rounds, depth, kv, *models = sys.argv[1:]
def ours(m):
    out = subprocess.run([onebit, "bench", "--model", m, "--threads", threads, "--prompt-tokens", pp,
                          "--gen-tokens", tg, "--depth", depth, "--kv-type", kv, "--repetitions", "1", "--json"],
                         capture_output=True, text=True, check=True).stdout
    o = json.loads(out)
    return o["prompt_tps"], o["decode_tps"]
def theirs(m):
    out = subprocess.run([llama, "-m", m, "-t", threads, "-p", pp, "-n", tg, "-d", depth, "-ctk", kv, "-ctv", kv,
                          "-r", "1", "-o", "json"],
                         capture_output=True, text=True, check=True).stdout
    rows = json.loads(out)
    p = next(r["avg_ts"] for r in rows if r["n_prompt"] > 0 and r["n_gen"] == 0)
    g = next(r["avg_ts"] for r in rows if r["n_gen"] > 0 and r["n_prompt"] == 0)
    return p, g
print(f"threads {threads}, pp{pp}, tg{tg}, depth {depth}, {kv} KV, {rounds} alternating rounds; medians (min..max)")
print("| model | test | onebit | llama.cpp | ratio |")
print("|---|---|---|---|---|")
for m in models:
    o, t = [], []
    for _ in range(int(rounds)):
        o.append(ours(m)); t.append(theirs(m))
    name = m.rsplit("/", 1)[-1]
    for i, test in enumerate([f"pp{pp}", f"tg{tg}"]):
        a = [x[i] for x in o]; b = [x[i] for x in t]
        ma, mb = statistics.median(a), statistics.median(b)
        print(f"| {name} | {test} | {ma:.1f} ({min(a):.1f}..{max(a):.1f}) | {mb:.1f} ({min(b):.1f}..{max(b):.1f}) | {ma/mb:.2f}x |")
PY
