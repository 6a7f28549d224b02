#!/usr/bin/env bash
# Runs onebit bench and llama.cpp's llama-bench alternately on the same GGUF,
# same thread count, and prints the ratios (ours / theirs), with the decode's
# fraction of the memory-bandwidth limit.
#
#   scripts/bench-vs-llamacpp.sh [MODEL.gguf ...]
#
# Default models: the two real ones in ~/.cache/onebit/models, then the
# realistic shapes of scripts/gen-shapes.sh (Qwen2.5-1.5B in Q4_K_M,
# Llama-3.2-3B in Q4_0, in $ONEBIT_SHAPES or ~/.cache/onebit/shapes) that
# exist; SHAPES=0 leaves the shapes out (they take most of the run's time).
#
# Each round runs, in turn: a read-bandwidth probe (THREADS threads reading a
# 1 GiB array, crates/onebit-kernels/examples/bandwidth.rs), onebit, the
# probe again, then llama-bench. A round's limit is the better of its two
# probes over the bytes of weights one token reads (every tensor but the
# token embedding, of which a token reads one row; a tied embedding is read
# whole as the output matrix): the bandwidth the machine gave just before
# and just after the runs it brackets. On a VM the bandwidth moves with the
# neighbours (on the Zen 4 VM this was written on, one probe read 35 GB/s
# and the next 61), so each run is held to the bandwidth of its own time,
# not to the best of the whole script. "of limit" is the median over rounds
# of onebit's decode over its round's limit, "llama.cpp of limit" the same
# for llama.cpp, and "ratio at the limit" the median of the limit over
# llama.cpp's decode: the highest ratio any engine could reach at that
# bandwidth (reading the weights once per token). The last lines give the
# best probe's limit too, the stricter bar. For a mixture of experts the
# bytes are the active weights: the stacked expert tensors count at the share
# of experts a token uses (expert_used_count / expert_count), everything else
# whole (attention, router, shared experts, output).
# The CPU's flags line and the load average before and after are printed:
# on a shared machine, repeat when the load is high.
#
# Levels: ISAS (default "native avx2") runs every model once per level.
# onebit is forced with ONEBIT_ISA; llama.cpp cannot be forced at run time,
# so the avx2 rows use an AVX2-only llama-bench when one is built
# (LLAMACPP_ISA=avx2 scripts/build-llamacpp.sh, or LLAMA_BENCH_AVX2), and
# otherwise llama.cpp at its native level; the table's "llama.cpp build"
# column names the build each row ran (its build-<isa> directory).
#
# Long contexts: DEPTH=4096 adds ppDEPTH and tgTG at depth DEPTH, with an f16
# KV cache on both sides (onebit bench --depth/--kv-type, llama-bench -d -ctk
# -ctv); KV_TYPE (f16) names the cache type for those rows.
#
#   THREADS (2)  PP (512)  TG (64)  ROUNDS (3: alternations of the two engines)
#   ISAS ("native avx2")  DEPTH (unset)  KV_TYPE (f16)  SHAPES (1)  IK (1)
#   ROWS (unset; e.g. "1 2 4 8 16": one forward of k rows, --prompt-tokens k
#   --gen-tokens 0 against llama-bench -p k -n 0, with each k's cost in ms
#   and over one row's after the table)
#   BATCH (unset; e.g. "8"): aggregate decode of N sequences in one step,
#   onebit bench --batch N against llama-batched-bench -npl N (built by
#   scripts/build-llamacpp.sh), BATCH_PP (128) prompt tokens each, TG steps
#
# Third engine: ik_llama.cpp (PyPI ik-llama-cpp-python 0.1.5, an AVX2 build
# with no llama-bench), timed by scripts/ik-bench.c over its C API
# (scripts/build-ikllama.sh installs it and builds the timer outside the
# repository). Each round runs it twice after llama-bench, with its run-time
# repacking on ("ik") and off ("ik plain"), on the pp/tg rows of every level
# (it is the same AVX2 build at every level: the avx2 rows compare like with
# like, the native rows say what onebit's best gives against it). IK=0
# leaves it out; the depth rows have no ik column. A model ik_llama.cpp
# refuses (0.1.5 lacks lfm2moe, for one) is named on stderr and its ik
# cells are dashes.
#
# Images: VISION (1) adds, after the table, scripts/bench-vision.sh's row:
# images per second of the SigLIP So400m tower at 896 px (Gemma 3's mmproj
# shape from scripts/gen-shapes.sh), onebit bench --mmproj against
# llama.cpp's mtmd_encode_chunk, same threads, and the ratio; when the shape
# files exist, and not with SHAPES=0 or VISION=0 (it takes minutes a round).
#
# Needs llama-bench: $LLAMA_BENCH, else the build for this CPU made by
# scripts/build-llamacpp.sh (about 20 minutes on 2 cores), outside the repository.
set -euo pipefail
cd "$(dirname "$0")/.."

threads="${THREADS:-2}"; pp="${PP:-512}"; tg="${TG:-64}"; rounds="${ROUNDS:-3}"
isas="${ISAS:-native avx2}"; depth="${DEPTH:-0}"; kv_type="${KV_TYPE:-f16}"
bin_dir="$(scripts/build-llamacpp.sh --bin-dir)"
llama_bench="${LLAMA_BENCH:-$bin_dir/llama-bench}"
llama_bench_avx2="${LLAMA_BENCH_AVX2:-$(LLAMACPP_ISA=avx2 scripts/build-llamacpp.sh --bin-dir)/llama-bench}"
models_dir="${ONEBIT_MODELS:-$HOME/.cache/onebit/models}"
if [ ! -x "$llama_bench" ]; then
    echo "error: no llama-bench at $llama_bench (set LLAMA_BENCH or run scripts/build-llamacpp.sh)" >&2
    exit 1
fi
[ -x "$llama_bench_avx2" ] || llama_bench_avx2=""
shapes_dir="${ONEBIT_SHAPES:-$HOME/.cache/onebit/shapes}"
if [ $# -eq 0 ]; then
    set -- "$models_dir/SmolLM2-135M-Instruct.Q4_1.gguf" "$models_dir/gemma-3-270m-q4_k_m.gguf"
    if [ "${SHAPES:-1}" != 0 ]; then
        for shape in qwen2.5-1.5b-Q4_K_M llama3.2-3b-Q4_0; do
            if [ -f "$shapes_dir/$shape.gguf" ]; then
                set -- "$@" "$shapes_dir/$shape.gguf"
            else
                echo "note: no $shapes_dir/$shape.gguf (scripts/gen-shapes.sh makes it); its rows are left out" >&2
            fi
        done
    fi
fi
ik_bench=""
if [ "${IK:-1}" != 0 ]; then
    ik_bench="$(scripts/build-ikllama.sh | tail -1)"
fi
cargo build --release --quiet -p onebit
cargo build --release --quiet -p onebit-kernels --example bandwidth
onebit=target/release/onebit
probe=target/release/examples/bandwidth
if [ "$depth" -gt 0 ] && ! "$onebit" bench --help | grep -q -- '--depth'; then
    echo "error: DEPTH=$depth needs 'onebit bench --depth' and '--kv-type', which this build of onebit lacks" >&2
    exit 1
fi

echo "cpu: $(grep -m1 '^model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //')"
echo "flags:$(grep -m1 '^flags' /proc/cpuinfo | cut -d: -f2-)"
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
python3 - "$onebit" "$llama_bench" "$llama_bench_avx2" "$probe" "$threads" "$pp" "$tg" "$rounds" \
    "$isas" "$depth" "$kv_type" "$ik_bench" "$@" <<'PY'
import json, os, re, statistics, struct, subprocess, sys
(onebit, llama, llama_avx2, probe, threads, pp, tg, rounds, isas, depth, kv_type, ik_bench,
 *models) = sys.argv[1:]
pp, tg, rounds, depth = int(pp), int(tg), int(rounds), int(depth)
rows = [int(k) for k in os.environ.get("ROWS", "").split()]
sweep = {}  # (model, isa) -> {k: (onebit ms, llama.cpp ms)}

def weight_bytes(path):
    """Bytes of tensor data a decoded token reads: every tensor but the token
    embedding, unless the embedding is also the output matrix (no output.weight);
    of a mixture of experts' stacked expert tensors (names with "_exps"), only
    the share of the experts a token uses (expert_used_count / expert_count):
    the active weights."""
    from_gguf, keys = gguf_tensor_sizes(path)
    tied = "output.weight" not in from_gguf
    arch = keys.get("general.architecture", "")
    count, used = keys.get(f"{arch}.expert_count"), keys.get(f"{arch}.expert_used_count")
    share = used / count if count and used else 1.0
    return sum(n * (share if "_exps" in name else 1.0)
               for name, n in from_gguf.items() if tied or name != "token_embd.weight")

def gguf_tensor_sizes(path):
    """({tensor name: bytes}, {key: scalar or string value}) from a GGUF file's
    header (sizes from the offsets; array values are skipped)."""
    with open(path, "rb") as f:
        def u(fmt):
            return struct.unpack("<" + fmt, f.read(struct.calcsize(fmt)))[0]
        def s():
            return f.read(u("Q")).decode("utf-8", "replace")
        scalar = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
        def value(t):
            if t == 8:
                return s()
            if t == 9:
                et, n = u("I"), u("Q")
                if et in scalar:
                    f.seek(struct.calcsize(scalar[et]) * n, 1)
                    return None
                return [value(et) for _ in range(n)]
            return u(scalar[t])
        assert f.read(4) == b"GGUF", f"{path} is not a GGUF file"
        u("I"); n_t, n_kv = u("Q"), u("Q")
        align = 32
        keys = {}
        for _ in range(n_kv):
            k = s(); v = value(u("I"))
            keys[k] = v
            if k == "general.alignment":
                align = v
        offs = []
        for _ in range(n_t):
            name = s(); nd = u("I"); [u("Q") for _ in range(nd)]; u("I")
            offs.append((u("Q"), name))
        data_start = (f.tell() + align - 1) // align * align
    end = os.path.getsize(path) - data_start
    offs.sort()
    return {name: (offs[i + 1][0] if i + 1 < len(offs) else end) - o for i, (o, name) in enumerate(offs)}, keys

def run_probe():
    out = subprocess.run([probe, threads], capture_output=True, text=True, check=True).stdout
    return float(re.search(r"read bandwidth: ([0-9.]+) GB/s", out).group(1))

def ours(m, isa, args):
    env = dict(os.environ)
    if isa != "native":
        env["ONEBIT_ISA"] = isa
    out = subprocess.run([onebit, "bench", "--model", m, "--threads", threads, "--repetitions", "1",
                          "--json", *args], capture_output=True, text=True, check=True, env=env).stdout
    o = json.loads(out)
    return o["prompt_tps"], o["decode_tps"]

def llama_for(isa):
    """The llama-bench an ISA level's rows compare against."""
    return llama_avx2 if isa == "avx2" and llama_avx2 else llama

def build_name(exe):
    """The build directory's name (build-<isa> of scripts/build-llamacpp.sh), or the path."""
    d = os.path.dirname(os.path.dirname(os.path.abspath(exe)))
    return os.path.basename(d) if os.path.basename(os.path.dirname(exe)) == "bin" else exe

def theirs(m, isa, args):
    exe = llama_for(isa)
    out = subprocess.run([exe, "-m", m, "-t", threads, "-r", "1", "-o", "json", *args],
                         capture_output=True, text=True, check=True).stdout
    rows = json.loads(out)
    p = next((r["avg_ts"] for r in rows if r["n_prompt"] > 0 and r["n_gen"] == 0), 0.0)
    g = next((r["avg_ts"] for r in rows if r["n_gen"] > 0 and r["n_prompt"] == 0), 0.0)
    return p, g

ik_refused = set()

def ik(m, t, repack):
    """ik_llama.cpp's (prompt, decode) tok/s for a pp/tg test, or None."""
    if not ik_bench or t[6] is None:
        return None
    p, g = t[6]
    r = subprocess.run([ik_bench, m, threads, str(p), str(g), "1", str(repack)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        # ik_llama.cpp 0.1.5 refuses architectures it lacks (lfm2moe): say
        # so once per model and leave its columns empty, rather than stop.
        if m not in ik_refused:
            why = [l for l in r.stderr.splitlines() if "error" in l.lower()][-1:] or ["exit status %d" % r.returncode]
            print(f"ik_llama.cpp refused {os.path.basename(m)}: {why[0].strip()}", file=sys.stderr)
            ik_refused.add(m)
        return None
    o = json.loads(r.stdout)
    return (o["pp"][0] if o["pp"] else 0.0), (o["tg"][0] if o["tg"] else 0.0)

def cell(xs):
    return f"{statistics.median(xs):.1f} ({min(xs):.1f}..{max(xs):.1f})"

# (test name, field 0 = prompt / 1 = decode, onebit args, llama-bench args,
#  (pp, tg) for the ik timer or None)
tests = [(f"pp{pp}", 0, f"tg{tg}", 1, ["--prompt-tokens", str(pp), "--gen-tokens", str(tg)],
          ["-p", str(pp), "-n", str(tg)], (pp, tg))]
if depth > 0:
    kv = ["-ctk", kv_type, "-ctv", kv_type]
    tests.append((f"pp{depth} kv {kv_type}", 0, None, None,
                  ["--prompt-tokens", str(depth), "--gen-tokens", "0", "--kv-type", kv_type],
                  ["-p", str(depth), "-n", "0", *kv], None))
    tests.append((None, None, f"tg{tg} @ depth {depth} kv {kv_type}", 1,
                  ["--depth", str(depth), "--prompt-tokens", "0", "--gen-tokens", str(tg), "--kv-type", kv_type],
                  ["-p", "0", "-n", str(tg), "-d", str(depth), *kv], None))

# The rows sweep (ROWS="1 2 4 8 16"): one forward of k prompt rows, no
# decode, as a verify step or a batched decode step costs; each engine's
# prompt tok/s, and after the table the cost of each k in ms and over k = 1.
for k in rows:
    tests.append((f"rows{k}", 0, None, None, ["--prompt-tokens", str(k), "--gen-tokens", "0"],
                  ["-p", str(k), "-n", "0"], None))

print(f"threads {threads}, {rounds} alternating rounds (probe, onebit, llama.cpp); medians (min..max)")
if not llama_avx2 and "avx2" in isas.split():
    print("avx2 rows: llama.cpp runs at its native level (no AVX2-only build; "
          "LLAMACPP_ISA=avx2 scripts/build-llamacpp.sh makes one)")
for isa in isas.split():
    print(f"{isa} rows: llama.cpp is {llama_for(isa)}")
if ik_bench:
    print(f"ik columns: {ik_bench} (ik_llama.cpp 0.1.5, AVX2 build): 'ik' with repack_tensors on, 'ik plain' off")
print("| model | level | llama.cpp build | test | onebit | llama.cpp | ratio | of limit | llama.cpp of limit | ratio at the limit "
      "| ik | ratio vs ik | ik plain | ratio vs ik plain |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
probes = []
for m in models:
    wb = weight_bytes(m)
    name = m.rsplit("/", 1)[-1]
    for isa in isas.split():
        for t in tests:
            o, th, bws, iks, ikp = [], [], [], [], []
            for _ in range(rounds):
                before = run_probe()
                o.append(ours(m, isa, t[4]))
                after = run_probe()
                th.append(theirs(m, isa, t[5]))
                r1, r0 = ik(m, t, 1), ik(m, t, 0)
                if r1 is not None:
                    iks.append(r1)
                if r0 is not None:
                    ikp.append(r0)
                probes += [before, after]
                bws.append(max(before, after))
            for label, field in ((t[0], t[1]), (t[2], t[3])):
                if label is None:
                    continue
                a = [x[field] for x in o]; b = [x[field] for x in th]
                ma, mb = statistics.median(a), statistics.median(b)
                frac = their_frac = ceiling = ""
                if field == 1 and "depth" not in label:
                    limits = [bw * 1e9 / wb for bw in bws]
                    frac = f"{statistics.median(x / l for x, l in zip(a, limits)):.0%}"
                    if all(x > 0 for x in b):
                        their_frac = f"{statistics.median(x / l for x, l in zip(b, limits)):.0%}"
                        # The highest decode ratio each round's probes allow:
                        # an engine reading every weight once per token at
                        # that bandwidth, against llama.cpp's speed.
                        ceiling = f"{statistics.median(l / x for x, l in zip(b, limits)):.2f}x"
                    else:
                        their_frac = ceiling = "-"
                ratio = f"{ma / mb:.2f}x" if mb > 0 else "-"
                ik_cells = []
                for runs in (iks, ikp):
                    c = [x[field] for x in runs]
                    if c and statistics.median(c) > 0:
                        ik_cells += [cell(c), f"{ma / statistics.median(c):.2f}x"]
                    else:
                        ik_cells += ["-", "-"]
                if label.startswith("rows") and ma > 0 and mb > 0:
                    k = int(label[4:])
                    sweep.setdefault((name, isa), {})[k] = (k / ma * 1e3, k / mb * 1e3)
                print(f"| {name} | {isa} | {build_name(llama_for(isa))} | {label} | {cell(a)} | "
                      f"{cell(b)} | {ratio} | {frac} | {their_frac} | {ceiling} | {' | '.join(ik_cells)} |", flush=True)
    print(f"{name}: {wb / 1e6:.1f} MB of weights read per token; limit {max(probes) * 1e9 / wb:.1f} tok/s "
          f"at the best probe bandwidth so far, {statistics.median(probes) * 1e9 / wb:.1f} at the median",
          flush=True)
# Batched decode (BATCH="8"): N independent sequences, each its own prompt of
# BATCH_PP tokens (128), then TG decode steps of one token each, all N in one
# forward: onebit bench --batch N against llama-batched-bench -npl N (its
# S_TG, the same aggregate), and each against its own N = 1.
batch = [int(n) for n in os.environ.get("BATCH", "").split()]
batch_pp = int(os.environ.get("BATCH_PP", "128"))
def ours_batch(m, isa, n):
    env = dict(os.environ)
    if isa != "native":
        env["ONEBIT_ISA"] = isa
    out = subprocess.run([onebit, "bench", "--model", m, "--threads", threads, "--repetitions", "1", "--json",
                          "--batch", str(n), "--prompt-tokens", str(batch_pp), "--gen-tokens", str(tg)],
                         capture_output=True, text=True, check=True, env=env).stdout
    return json.loads(out)["decode_tps"]
def theirs_batch(m, isa, n):
    exe = os.path.join(os.path.dirname(llama_for(isa)), "llama-batched-bench")
    if not os.path.exists(exe):
        return None
    out = subprocess.run([exe, "-m", m, "-t", threads, "-c", str(n * (batch_pp + tg) + 16), "-npp", str(batch_pp),
                          "-ntg", str(tg), "-npl", str(n), "--output-format", "jsonl"],
                         capture_output=True, text=True, check=True)
    for line in (out.stdout + out.stderr).splitlines():
        if line.startswith("{") and '"speed_tg"' in line:
            return json.loads(line)["speed_tg"]
    return None
if batch:
    print("| model | level | sequences | onebit aggregate tok/s | over its 1 | llama-batched-bench S_TG | over its 1 | ratio |")
    print("|---|---|---|---|---|---|---|---|")
for m in (models if batch else []):
    name = m.rsplit("/", 1)[-1]
    for isa in isas.split():
        res = {}
        for n in sorted(set([1] + batch)):
            a, b = [], []
            for _ in range(rounds):
                a.append(ours_batch(m, isa, n))
                t = theirs_batch(m, isa, n)
                if t is not None:
                    b.append(t)
            res[n] = (statistics.median(a), statistics.median(b) if b else None)
        for n in batch:
            a, b = res[n]
            a1, b1 = res[1]
            bcell = f"{b:.1f}" if b else "-"
            brel = f"{b / b1:.2f}x" if b and b1 else "-"
            ratio = f"{a / b:.2f}x" if b else "-"
            print(f"| {name} | {isa} | {n} | {a:.1f} | {a / a1:.2f}x | {bcell} | {brel} | {ratio} |", flush=True)

for (name, isa), ks in sweep.items():
    one = ks.get(1)
    parts = []
    for k, (a, b) in sorted(ks.items()):
        rel = f" = {a / one[0]:.2f}x / {b / one[1]:.2f}x of 1 row" if one else ""
        parts.append(f"k={k}: {a:.1f} / {b:.1f} ms{rel}")
    print(f"rows sweep {name} {isa} (onebit / llama.cpp, one forward): " + "; ".join(parts))
print(f"read bandwidth probe ({threads} threads): best {max(probes):.1f} GB/s, "
      f"median {statistics.median(probes):.1f} over {len(probes)} runs")
PY
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
if [ "${VISION:-1}" != 0 ] && [ "${SHAPES:-1}" != 0 ]; then
    if [ -f "$shapes_dir/mmproj-siglip-so400m-896-F16.gguf" ] && [ -f "$shapes_dir/gemma3-text-2560-F32.gguf" ]; then
        echo
        THREADS="$threads" scripts/bench-vision.sh
    else
        echo "note: no $shapes_dir/mmproj-siglip-so400m-896-F16.gguf (scripts/gen-shapes.sh makes it); the images row is left out" >&2
    fi
fi
