#!/usr/bin/env python3
"""Revert one model rule at a time and check that the test suite notices.

Each mutant is (name, file, exact text, replacement, test filter). The script
applies it, runs `cargo test` on the given target, expects a failure, and
restores the file. It prints one line per mutant: CAUGHT or SURVIVED.

    scripts/mutants.py            # all mutants
    scripts/mutants.py gemma3     # those whose name contains "gemma3"
"""
import subprocess, sys, pathlib

ROOT = pathlib.Path(__file__).resolve().parent.parent
G3 = "crates/onebit-model/src/families/gemma3.rs"
COMMON = "crates/onebit-model/src/families/common.rs"
MIXERS = "crates/onebit-model/src/mixers.rs"
MODEL_TESTS = ["-p", "onebit-model"]

MUTANTS = [
    ("gemma3: every 6th layer full -> i % 6 == 0", G3,
     "if (i + 1) % p == 0 {", "if i % p == 0 {", MODEL_TESTS),
    ("gemma3: sliding base 10000 when absent -> the model's base", G3,
     "sliding.base = DEFAULT_SWA_BASE;", "", MODEL_TESTS),
    ("gemma3: sandwich norms off", G3,
     's.sandwich_norms = Sourced::new(true,', 's.sandwich_norms = Sourced::new(false,', MODEL_TESTS),
    ("gemma3: +1 added again to stored norms", G3,
     "        NormForm::Plain,\n        \"gemma3 GGUF", "        NormForm::OnePlus,\n        \"gemma3 GGUF", MODEL_TESTS),
    ("gemma3: no embedding scale", G3,
     "Some((s.dims.n_embd as f32).sqrt())", "None", MODEL_TESTS),
    ("gemma3: attention scale from n_embd/n_head instead of key_length", COMMON,
     "1.0 / (head_dim_k as f32).sqrt()", "1.0 / ((n_embd / n_head) as f32).sqrt()", MODEL_TESTS),
    ("gemma3: linear scaling on sliding layers too", G3,
     "sliding.scaling = RopeScaling::None;", "", MODEL_TESTS),
    ("gemma3: q/k norm off", G3,
     "        true,\n        QkNorm::BeforeRope,\n        \"gemma3", "        false,\n        QkNorm::BeforeRope,\n        \"gemma3", MODEL_TESTS),
    ("llama: halves instead of interleaved RoPE", "crates/onebit-model/src/families/llama.rs",
     "RopeStyle::Interleaved,", "RopeStyle::Halves,", MODEL_TESTS),
    ("sliding window off by one", "crates/onebit-model/src/forward.rs",
     "(p + 1).saturating_sub(w)", "p.saturating_sub(w)", MODEL_TESTS),
    ("qwen3: q/k norm off", "crates/onebit-model/src/families/qwen3.rs",
     "        true,\n        QkNorm::BeforeRope,", "        false,\n        QkNorm::BeforeRope,", MODEL_TESTS),
    ("hunyuan: q/k norm before RoPE instead of after", "crates/onebit-model/src/families/hunyuan.rs",
     "QkNorm::AfterRope,", "QkNorm::BeforeRope,", MODEL_TESTS),
    ("qwen2: q bias not added", "crates/onebit-model/src/forward.rs",
     "add_bias(&mut q, aw.bq.as_deref());", "", MODEL_TESTS),
    ("phi3: LongRoPE attention factor dropped", "crates/onebit-model/src/families/phi3.rs",
     "rope.attn_factor = f;", "", MODEL_TESTS),
    ("lfm2: conv window misaligned (current input on tap 0)", MIXERS,
     "acc += taps[l - 1] * input[ch];", "acc += taps[0] * input[ch];", MODEL_TESTS),
    ("lfm2: conv state not carried across decode steps", MIXERS,
     "        for t in rows.clone() {\n            let row = &bcx", "        history.fill(0.0);\n        for t in rows.clone() {\n            let row = &bcx", MODEL_TESTS),
    ("lfm2: C gate dropped", MIXERS,
     "yt.iter_mut().zip(c).for_each(|(v, c)| *v *= c);", "", MODEL_TESTS),
    ("lfm2: layer kinds ignore the container (all attention)", "crates/onebit-model/src/families/lfm2.rs",
     "                if h == 0 {\n                    LayerKind::ShortConv", "                if h == 999 {\n                    LayerKind::ShortConv", MODEL_TESTS),
    ("qwen35: no state decay", MIXERS,
     "st.iter_mut().for_each(|x| *x *= decay);", "", MODEL_TESTS),
    ("qwen35: grouped instead of tiled v-to-k head map", MIXERS,
     "let hk = hv % nk;", "let hk = hv / (nv / nk);", MODEL_TESTS),
    ("qwen35: recurrent state not carried across decode steps", MIXERS,
     "        for t in rows.clone() {\n            conv_step(", "        state.fill(0.0);\n        for t in rows.clone() {\n            conv_step(", MODEL_TESTS),
    ("qwen35: attention output gate dropped", "crates/onebit-model/src/forward.rs",
     "ctx.iter_mut().zip(&g).for_each(|(c, g)| *c *= sigmoid(*g));", "let _ = g;", MODEL_TESTS),
]


def main():
    pick = sys.argv[1] if len(sys.argv) > 1 else ""
    survived = 0
    for name, rel, old, new, target in MUTANTS:
        if pick not in name:
            continue
        path = ROOT / rel
        src = path.read_text()
        if src.count(old) != 1:
            print(f"STALE     {name}: text not found exactly once in {rel}")
            survived += 1
            continue
        path.write_text(src.replace(old, new))
        try:
            r = subprocess.run(["cargo", "test", "-q", *target], cwd=ROOT, capture_output=True, text=True)
        finally:
            path.write_text(src)
        if "could not compile" in r.stderr:
            print(f"BROKEN    {name}: the mutant does not compile", flush=True)
            survived += 1
            continue
        caught = r.returncode != 0
        survived += not caught
        print(f"{'CAUGHT  ' if caught else 'SURVIVED'}  {name}", flush=True)
    sys.exit(1 if survived else 0)


if __name__ == "__main__":
    main()
