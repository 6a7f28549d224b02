#!/usr/bin/env bash
# Serving throughput: onebit serve against llama-server on the same GGUF,
# same threads, alternately, with scripts/serve-bench.py's streaming chat
# clients (every number measured from the client side over HTTP).
#
#   scripts/bench-serve.sh [MODEL.gguf]
#
#   MODEL    default ~/.cache/onebit/models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf
#   CLIENTS  ("1 8 32") concurrent clients; each server gets as many parallel
#            sequences (onebit --max-seqs N, llama-server -np N)
#   THREADS (2)  TG (64: max_tokens of each request)  REQUESTS (2 per client)
#   CTX (1024: context per sequence; llama-server -c N x CTX)
#   ROUNDS (1: alternations of the two servers per client count)
#   LLAMA=0 leaves llama-server out
#
# Prints the CPU's flags and the load average before and after: on a shared
# machine, repeat when the load is high. Needs llama-server from
# scripts/build-llamacpp.sh (outside the repository) and target/release/onebit
# (built here).
set -euo pipefail
cd "$(dirname "$0")/.."
models="${ONEBIT_MODELS:-$HOME/.cache/onebit/models}"
model="${1:-$models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf}"
clients="${CLIENTS:-1 8 32}"; threads="${THREADS:-2}"; tg="${TG:-64}"
requests="${REQUESTS:-2}"; ctx="${CTX:-1024}"; rounds="${ROUNDS:-1}"
llama_server="$(scripts/build-llamacpp.sh --bin-dir)/llama-server"
if [ "${LLAMA:-1}" != 0 ] && [ ! -x "$llama_server" ]; then
    echo "error: no llama-server at $llama_server (run scripts/build-llamacpp.sh, or LLAMA=0)" >&2
    exit 1
fi
[ -f "$model" ] || { echo "error: no model at $model" >&2; exit 1; }
cargo build --release --quiet -p onebit
onebit=target/release/onebit
port=18471
pid=""
cleanup() { [ -n "$pid" ] && kill "$pid" 2>/dev/null; wait 2>/dev/null || true; }
trap cleanup EXIT

wait_ready() { # url
    for _ in $(seq 1 600); do
        if curl -sf "$1/health" >/dev/null 2>&1; then return 0; fi
        sleep 0.2
    done
    echo "error: the server at $1 did not become ready" >&2
    exit 1
}

run_one() { # engine clients results-file: appends "engine JSON"
    local engine="$1" n="$2" url="http://127.0.0.1:$port"
    if [ "$engine" = onebit ]; then
        "$onebit" serve --model "$model" --port "$port" --threads "$threads" --max-seqs "$n" \
            --max-queue $((n * 2 + 8)) --ctx "$ctx" >/tmp/bench-serve-onebit.log 2>&1 &
    else
        "$llama_server" -m "$model" --port "$port" -t "$threads" -np "$n" -c $((n * ctx)) \
            >/tmp/bench-serve-llama.log 2>&1 &
    fi
    pid=$!
    wait_ready "$url"
    # one warm-up request (first touch of the weights), not counted
    python3 scripts/serve-bench.py --url "$url" --clients 1 --requests 1 --max-tokens 8 >/dev/null || true
    local line
    line=$(python3 scripts/serve-bench.py --url "$url" --clients "$n" --requests "$requests" \
        --max-tokens "$tg" --json || true)
    echo "$engine $line" >> "$3"
    echo "$engine, $n clients: $line" >&2
    kill "$pid"; wait "$pid" 2>/dev/null || true; pid=""
}

echo "cpu: $(grep -m1 '^model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //')"
echo "flags:$(grep -m1 '^flags' /proc/cpuinfo | cut -d: -f2-)"
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "model: $model, threads $threads, max_tokens $tg, $requests requests per client, $rounds round(s)"
engines="onebit"
[ "${LLAMA:-1}" != 0 ] && engines="onebit llama"
results=$(mktemp)
for n in $clients; do
    for _ in $(seq 1 "$rounds"); do
        for e in $engines; do
            run_one "$e" "$n" "$results"
        done
    done
done
python3 - "$results" "$clients" <<'PY'
import json, statistics, sys
rows = {}
for line in open(sys.argv[1]):
    e, _, j = line.partition(" ")
    try:
        o = json.loads(j)
    except ValueError:
        continue
    rows.setdefault((e, o["clients"]), []).append(o)
def med(e, n, k):
    xs = [o[k] for o in rows.get((e, n), [])]
    return statistics.median(xs) if xs else None
print("| clients | onebit tok/s | over 1 client | ttft median / p90 s | lost | llama-server tok/s | over 1 client | ttft median / p90 s | lost | ratio |")
print("|---|---|---|---|---|---|---|---|---|---|")
for n in [int(c) for c in sys.argv[2].split()]:
    cells = []
    for e in ("onebit", "llama"):
        t = med(e, n, "throughput_tps")
        one = med(e, 1, "throughput_tps")
        if t is None:
            cells += ["-", "-", "-", "-"]
            continue
        lost = sum(o["lost"] for o in rows[(e, n)])
        cells += [f"{t:.1f}", f"{t / one:.2f}x" if one else "-",
                  f"{med(e, n, 'ttft_median_s'):.2f} / {med(e, n, 'ttft_p90_s'):.2f}", str(lost)]
    a, b = med("onebit", n, "throughput_tps"), med("llama", n, "throughput_tps")
    ratio = f"{a / b:.2f}x" if a and b else "-"
    print(f"| {n} | " + " | ".join(cells) + f" | {ratio} |")
PY
rm -f "$results"
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
