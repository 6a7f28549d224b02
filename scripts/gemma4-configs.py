#!/usr/bin/env python3
"""Gemma 4 across its configuration space: the `gemma4` fixture's model (seed 1010,
gen-fixtures.py's spec_gemma4) with one feature changed at a time, each checked against
llama.cpp and against the float64 reference forward `reference_gemma4` (gen-fixtures.py).

Invariant: every configuration is a deterministic function of the table below and the
fixture generator; nothing here is compared with onebit's own output except onebit's
column, which is measured against llama.cpp and the reference, never the other way round.

    scripts/gemma4-configs.py [--onebit PATH] [NAME ...]

For each configuration it writes, under ~/.cache/onebit/gemma4-configs/NAME/, the f32 GGUF
and llama.cpp's logits (one batch, and one token per call), and prints, relative to M (the
largest |logit| of llama.cpp's batch run):
  spread     llama.cpp batch vs sequential (its own noise);
  ref        the float64 reference with an exact tanh GELU vs llama.cpp;
  ref_tab    the same with ggml-cpu's fp16 GELU table emulated (ggml/src/ggml-cpu/vec.h,
             GGML_GELU_FP16: input rounded to fp16, the result read from an fp16 table);
  onebit     `onebit logits` on the GGUF vs llama.cpp (with --onebit, the built binary);
  onebit_ref onebit vs the exact-GELU reference.
ref close to onebit and ref_tab within the spread separates arithmetic (the fp16 GELU
table) from rules: a rule onebit or the reference got wrong would move ref_tab too.

Run through the fixture generator's pins (gguf-py 0.19.0, NumPy 2.4.6) and the llama.cpp
build of scripts/build-llamacpp.sh; not part of CI.
"""

import argparse
import json
import subprocess
import sys
from pathlib import Path

import numpy as np

from load_script import gen_fixtures

HERE = Path(__file__).resolve().parent
gf = gen_fixtures()

BASE = dict(gf.GEMMA4_HP, n_embd_per_layer=32)
SEED = gf.FAMILIES["gemma4"]["seed"]
# name: (changes to the gemma4 fixture's settings, what it varies)
CONFIGS = {
    "base": ({}, "the gemma4 fixture itself"),
    "no_shared_kv": (dict(shared_kv_layers=0), "every layer its own KV"),
    "no_ple": (dict(n_embd_per_layer=0), "no per-layer embeddings (the gemma4-nople fixture)"),
    "softcap_0": (dict(final_softcap=0.0), "final_logit_softcapping 0: no soft-cap"),
    "softcap_absent": (dict(final_softcap=None), "no final_logit_softcapping key: llama.cpp's default 30"),
    "partial_half": (dict(rot_pairs_full=8), "full layers rotate half of the head's pairs, not a quarter"),
    "equal_heads": (dict(head_dim_swa=32), "sliding and full layers' heads both 32"),
    "out_scale_off": (dict(out_scale=None), "no layer_output_scale tensors"),
    "out_scale_0.2": (dict(out_scale=(0.2, 0.05)), "layer output scales N(0.2, 0.05^2)"),
    "out_scale_0.05": (dict(out_scale=(0.05, 0.01)), "layer output scales N(0.05, 0.01^2)"),
    "out_scale_0.05_no_ple": (dict(out_scale=(0.05, 0.01), n_embd_per_layer=0), "as out_scale_0.05, no per-layer embeddings"),
    "out_scale_2": (dict(out_scale=(2.0, 0.2)), "layer output scales N(2, 0.2^2)"),
    "deep": (dict(n_layer=14, sliding=[True, True, False, True, False, True, False] * 2), "14 layers"),
}


def build(name, out):
    changes, _ = CONFIGS[name]
    hp = dict(BASE, family=f"gemma4-{name}", **changes)
    keys, specs = gf.spec_gemma4(hp)
    if hp["final_softcap"] is None:
        keys = [k for k in keys if not k[0].endswith("final_logit_softcapping")]
    scale = hp.get("out_scale", (0.8, 0.1))
    if scale is None:
        specs = [s for s in specs if "layer_output_scale" not in s[0]]
    else:
        specs = [(n, ("normal", (1,), scale[1], scale[0])) if "layer_output_scale" in n else (n, i) for n, i in specs]
    gf.write_gguf(out / "f32.gguf", "gemma4", keys, gf.make_tensors(specs, SEED))
    # The reference's soft-cap: llama.cpp's (0: none; absent: 30).
    cap = hp["final_softcap"]
    return dict(hp, final_softcap=30.0 if cap is None else (1e30 if cap == 0.0 else cap))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("names", nargs="*", help=f"configurations (default: all of {', '.join(CONFIGS)})")
    ap.add_argument("--onebit", type=Path, help="the onebit binary, to add its column")
    ap.add_argument("--bin-dir", type=Path, help="llama.cpp's bin directory (default: scripts/build-llamacpp.sh --bin-dir)")
    a = ap.parse_args()
    bin_dir = a.bin_dir or Path(subprocess.run([str(HERE / "build-llamacpp.sh"), "--bin-dir"], check=True,
                                               capture_output=True, text=True).stdout.strip())
    driver = bin_dir / ".." / "gen-fixtures-driver"
    if not driver.exists():
        sys.exit(f"{driver}: not built (scripts/gen-fixtures.sh builds it)")
    toks = np.random.default_rng(gf.TOKEN_SEED).integers(3, gf.N_VOCAB, size=gf.N_TOKENS).tolist()
    toks[0] = BASE["bos"]
    root = Path.home() / ".cache" / "onebit" / "gemma4-configs"
    results = {}
    for name in a.names or CONFIGS:
        out = root / name
        out.mkdir(parents=True, exist_ok=True)
        hp = build(name, out)
        lg = {}
        for mode in ("batch", "sequential"):
            subprocess.run([str(driver), mode, str(out / "f32.gguf"), str(out / f"llamacpp.{mode}.bin")] +
                           [str(t) for t in toks], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            lg[mode] = np.fromfile(out / f"llamacpp.{mode}.bin", "<f4").reshape(len(toks), -1)
        ref = gf.reference_gemma4(out / "f32.gguf", hp, toks)[0]
        tab = gf.reference_gemma4(out / "f32.gguf", hp, toks, True)[0]
        b = lg["batch"]
        m = float(np.abs(b).max())
        rel = lambda x, y: float(np.abs(x - y).max() / m)
        r = {"M": m, "spread": rel(b, lg["sequential"]), "ref": rel(ref, b), "ref_tab": rel(tab, b)}
        if a.onebit:
            # llama.cpp's settings: f32 KV cache, a 128-position context, 2 threads.
            subprocess.run([str(a.onebit), "logits", "--model", str(out / "f32.gguf"), "--kv-type", "f32",
                            "--ctx", "128", "--threads", "2", "--ids",
                            ",".join(map(str, toks)), "--out", str(out / "onebit.bin")],
                           check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            o = np.fromfile(out / "onebit.bin", "<f4").reshape(len(toks), -1)
            r["onebit"] = rel(o, b)
            r["onebit_ref"] = rel(o, ref)
        results[name] = r
        cols = " ".join(f"{k} {v:.2e}" for k, v in r.items() if k != "M")
        ratio = f" (onebit {r['onebit'] / r['spread']:.1f}x spread)" if "onebit" in r and r["spread"] > 0 else ""
        print(f"{name:24s} M {m:6.2f}  {cols}{ratio}", flush=True)
    (root / "results.json").write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
