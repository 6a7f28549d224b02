#!/usr/bin/env python3
"""Compares onebit with llama.cpp on a wide random-weight model, position by position.

    scripts/gap-probe.py VARIANT [--quant Q8_0] [--n 8] [--onebit target/release/onebit]

Made for the 2,880-wide gap of issue 26 (gpt-oss-20b's width); see "Wide models" in
testdata/llamacpp/README.md for what it found. VARIANT is a key of VARIANTS: a model of
gen-fixtures.py's recipe (its spec functions and seeded weights, with wider dimensions),
or "shapes-gpt-oss" (gen-shapes.py's gpt-oss-20b random-block file cut to 2 layers and 4
experts, full vocabulary, already MXFP4_MOE). The files go to ~/.cache/onebit/gap/VARIANT/,
never into the repository. llama.cpp runs through scripts/gen-fixtures-driver.c (batch and
sequential with an F32 KV cache, and kvf16: F16 KV with flash attention auto), on the
quantized file and on its F32 dequantization (llama-quantize); onebit runs `onebit logits`
with --kv-type f32 and f16. Every file is kept and reused; delete the directory to redo.
Printed: per position, max |diff| / M (M = max |logit| of llama.cpp's quantized batch run).

Needs llama.cpp built by scripts/build-llamacpp.sh and the driver built by
scripts/gen-fixtures.sh (run any family once), gguf-py and NumPy as gen-fixtures.sh pins.
"""
import argparse
import subprocess
from pathlib import Path

import numpy as np

from load_script import gen_fixtures, load

HERE = Path(__file__).resolve().parent

gf = gen_fixtures()


def gpt_oss(**kw):
    """The gpt-oss fixture's recipe at gpt-oss-20b's widths, 2 layers, 4 experts (all used)."""
    hp = dict(gf.FAMILIES["gpt-oss"]["hp"], n_embd=2880, n_head=64, n_head_kv=8, head_dim=64, n_ff=2880,
              n_layer=2, n_expert=4, n_expert_used=4, n_ff_exp=2880)
    hp.update(kw)
    return dict(spec=gf.spec_gpt_oss, arch="gpt-oss", seed=1017, hp=hp)


def llama(e, nh, nkv):
    """The llama fixture's recipe (Llama-3 RoPE table, SiLU FFN) at width e, 2 layers, heads of 64."""
    hp = dict(gf.FAMILIES["llama"]["hp"], n_embd=e, n_head=nh, n_head_kv=nkv, head_dim=e // nh, n_ff=e, n_layer=2)
    return dict(spec=gf.spec_llama, arch="llama", seed=1001, hp=hp)


VARIANTS = {
    "gpt-oss-2880": gpt_oss(),
    "gpt-oss-2816": gpt_oss(n_embd=2816, n_head=44, n_head_kv=4, n_ff=2816, n_ff_exp=2816),
    "llama-256": llama(256, 4, 2),
    "llama-2816": llama(2816, 44, 4),
    "llama-2880": llama(2880, 45, 5),
    "llama-3072": llama(3072, 48, 8),
    "shapes-gpt-oss": None,
}


def run(args):
    subprocess.run([str(a) for a in args], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def build(name, quant, out, bin_dir):
    """The quantized file and its F32 dequantization in out/; returns the quantized path."""
    out.mkdir(parents=True, exist_ok=True)
    v = VARIANTS[name]
    if v is None:
        q = out / "MXFP4_MOE.gguf"
        if not q.exists():
            gs = load("gen-shapes.py", "gen_shapes")
            arch, pre, ftype, d = gs.MOE_SHAPES["gpt-oss-20b"]
            gs.MOE_SHAPES["cut"] = (arch, pre, ftype, dict(d, n_layer=2, n_expert=4))
            gs.write_moe("cut", str(q))
    else:
        q = out / f"{quant}.gguf"
        if not (out / "f32.gguf").exists():
            keys, specs = v["spec"](dict(v["hp"], family=name))[:2]
            gf.write_gguf(out / "f32.gguf", v["arch"], keys, gf.make_tensors(specs, v["seed"]))
        if not q.exists():
            run([bin_dir / "llama-quantize", out / "f32.gguf", q, quant])
    dq = q.with_suffix(".dequant.gguf")
    if not dq.exists():
        run([bin_dir / "llama-quantize", "--allow-requantize", q, dq, "F32"])
    return q, dq


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("variant", choices=sorted(VARIANTS))
    ap.add_argument("--quant", default="Q8_0", help="llama-quantize type (not for shapes-gpt-oss)")
    ap.add_argument("--n", type=int, default=8, help="tokens: the first n of the fixtures' 40 ids (BOS first where the family adds one)")
    ap.add_argument("--onebit", type=Path, default=HERE.parent / "target/release/onebit")
    a = ap.parse_args()
    bin_dir = Path(subprocess.run([HERE / "build-llamacpp.sh", "--bin-dir"], capture_output=True, text=True,
                                  check=True).stdout.strip())
    driver = bin_dir / ".." / "gen-fixtures-driver"
    out = Path.home() / ".cache/onebit/gap" / a.variant
    q, dq = build(a.variant, a.quant, out, bin_dir)
    v = VARIANTS[a.variant]
    toks = gf.fixture_tokens(v["hp"]["bos"] if v else None)[:a.n]
    ids = [str(t) for t in toks]

    def logits(tag, cmd):
        f = out / f"{tag}.n{a.n}.bin"
        if not f.exists():
            run(cmd(f))
        return np.fromfile(f, "<f4").reshape(a.n, -1).astype(np.float64)

    L = {}
    for w, model in (("q", q), ("dq", dq)):
        for mode in ("batch", "sequential", "kvf16"):
            L[f"llama {w} {mode}"] = logits(f"{model.stem}.llama.{mode}", lambda f: [driver, mode, model, f] + ids)
        for kv in ("f32", "f16"):
            L[f"onebit {w} kv {kv}"] = logits(
                f"{model.stem}.onebit.kv{kv}",
                lambda f: [a.onebit, "logits", "--model", model, "--ids", ",".join(ids), "--out", f, "--threads", "2",
                           "--kv-type", kv])
    m = np.abs(L["llama q batch"]).max()
    print(f"{a.variant}: {q.name}, M = {m:.3f}, {a.n} tokens; per position max |diff| / M, then the largest")
    for x, y in (("onebit q kv f32", "llama q batch"), ("llama q sequential", "llama q batch"),
                 ("onebit q kv f16", "llama q kvf16"), ("onebit q kv f16", "llama q batch"),
                 ("llama q kvf16", "llama q batch"), ("llama dq batch", "llama q batch"),
                 ("onebit dq kv f32", "llama dq batch"), ("onebit dq kv f16", "llama dq batch"),
                 ("llama dq kvf16", "llama dq batch")):
        d = np.abs(L[x] - L[y]).max(1) / m
        print(f"  {x:18s} vs {y:18s} " + " ".join(f"{v:.0e}" for v in d) + f"  | {d.max():.1e}")


if __name__ == "__main__":
    main()
