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
MODEL_TESTS = ["-p", "onebit-model"]

MUTANTS = [
    ("gemma3: every 6th layer full -> i % 6 == 0", G3,
     "if (i + 1) % p == 0 { LayerKind::Full }", "if i % p == 0 { LayerKind::Full }", MODEL_TESTS),
    ("gemma3: sliding base 10000 when absent -> the model's base", G3,
     "sliding.base = DEFAULT_SWA_BASE;", "", MODEL_TESTS),
    ("gemma3: sandwich norms off", G3,
     's.sandwich_norms = Sourced::new(true,', 's.sandwich_norms = Sourced::new(false,', MODEL_TESTS),
    ("gemma3: +1 added again to stored norms", G3,
     "s.norm_form = Sourced::new(NormForm::Plain,", "s.norm_form = Sourced::new(NormForm::OnePlus,", MODEL_TESTS),
    ("gemma3: no embedding scale", G3,
     "Some((s.dims.n_embd as f32).sqrt())", "None", MODEL_TESTS),
    ("gemma3: attention scale from n_embd/n_head instead of key_length", COMMON,
     "1.0 / (head_dim_k as f32).sqrt()", "1.0 / ((n_embd / n_head) as f32).sqrt()", MODEL_TESTS),
    ("gemma3: linear scaling on sliding layers too", G3,
     "sliding.scaling = RopeScaling::None;", "", MODEL_TESTS),
    ("gemma3: q/k norm off", G3,
     "s.qk_norm = Sourced::new(QkNorm::BeforeRope,", "s.qk_norm = Sourced::new(QkNorm::None,", MODEL_TESTS),
    ("llama: halves instead of interleaved RoPE", "crates/onebit-model/src/families/llama.rs",
     "RopeStyle::Interleaved,", "RopeStyle::Halves,", MODEL_TESTS),
    ("sliding window off by one", "crates/onebit-model/src/forward.rs",
     "(p + 1).saturating_sub(w)", "p.saturating_sub(w)", MODEL_TESTS),
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
