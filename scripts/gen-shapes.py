#!/usr/bin/env python3
"""Writes a random-weight F16 GGUF with the shape of a real model, for benchmarks.

    scripts/gen-shapes.py SHAPE OUT.gguf

SHAPE is one of the names in SHAPES below. Every tensor, key and the size of
the vocabulary follow the named model's published config (its config.json on
the Hugging Face hub: hidden size, layers, heads, KV heads, FFN width,
vocabulary, tied embeddings, rope base, norm epsilon); the weights are
seeded random numbers (a kernel's speed does not depend on their values), so
the file says nothing about the model's outputs. scripts/gen-shapes.sh
quantizes the result with llama-quantize; it is not used by the test suite.

The vocabulary is synthetic but complete, so both onebit and llama.cpp load
it: a byte-level BPE ("gpt2") of the 256 byte symbols, then two- and
three-symbol tokens, each with the merge that makes it, then the special
tokens; exactly as many tokens as the real model's embedding has rows.
"""

import sys

import numpy as np
import gguf

# name: (architecture, tokenizer pre, dims). Sources: Qwen/Qwen2.5-1.5B and
# meta-llama/Llama-3.2-3B config.json.
SHAPES = {
    "qwen2.5-1.5b": (
        "qwen2",
        "qwen2",
        dict(
            n_vocab=151936,
            n_embd=1536,
            n_layer=28,
            n_head=12,
            n_head_kv=2,
            n_ff=8960,
            ctx=32768,
            rope_base=1000000.0,
            eps=1e-6,
            qkv_bias=True,
            specials=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        ),
    ),
    "llama3.2-3b": (
        "llama",
        "llama-bpe",
        dict(
            n_vocab=128256,
            n_embd=3072,
            n_layer=28,
            n_head=24,
            n_head_kv=8,
            n_ff=8192,
            ctx=131072,
            rope_base=500000.0,
            eps=1e-5,
            qkv_bias=False,
            specials=["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"],
        ),
    ),
}


def byte_symbols():
    """GPT-2's printable stand-ins for the 256 byte values, in byte order."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0xFF + 1))
    out, extra = {}, 0
    for b in range(256):
        if b in keep:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + extra)
            extra += 1
    return [out[b] for b in range(256)]


def vocabulary(n_vocab, specials):
    """(tokens, types, merges): byte symbols, then pairs, then triples, then specials."""
    syms = byte_symbols()
    n_plain = n_vocab - len(specials)
    tokens, merges = list(syms), []
    for a in syms:
        for b in syms:
            if len(tokens) == n_plain:
                break
            tokens.append(a + b)
            merges.append(f"{a} {b}")
    pairs = tokens[256:]
    i = 0
    while len(tokens) < n_plain:
        ab, c = pairs[i // 256], syms[i % 256]
        tokens.append(ab + c)
        merges.append(f"{ab} {c}")
        i += 1
    types = [gguf.TokenType.NORMAL] * n_plain + [gguf.TokenType.CONTROL] * len(specials)
    return tokens + specials, types, merges


def main():
    if len(sys.argv) != 3 or sys.argv[1] not in SHAPES:
        sys.exit(f"usage: gen-shapes.py {{{','.join(SHAPES)}}} OUT.gguf")
    name, out = sys.argv[1], sys.argv[2]
    arch, pre, d = SHAPES[name]
    e, ff, hd = d["n_embd"], d["n_ff"], d["n_embd"] // d["n_head"]
    kv = d["n_head_kv"] * hd

    w = gguf.GGUFWriter(out, arch)
    w.add_name(f"random-weight {name} shape")
    w.add_context_length(d["ctx"])
    w.add_embedding_length(e)
    w.add_block_count(d["n_layer"])
    w.add_feed_forward_length(ff)
    w.add_head_count(d["n_head"])
    w.add_head_count_kv(d["n_head_kv"])
    w.add_rope_freq_base(d["rope_base"])
    w.add_layer_norm_rms_eps(d["eps"])
    w.add_rope_dimension_count(hd)
    w.add_vocab_size(d["n_vocab"])
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    tokens, types, merges = vocabulary(d["n_vocab"], d["specials"])
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    first_special = d["n_vocab"] - len(d["specials"])
    w.add_bos_token_id(first_special)
    w.add_eos_token_id(first_special + 1)
    w.add_add_bos_token(False)

    # (name, numpy shape rows x cols, dtype); tied embeddings: no output.weight.
    f16, f32 = np.dtype(np.float16), np.dtype(np.float32)
    tensors = [("token_embd.weight", (d["n_vocab"], e), f16), ("output_norm.weight", (e,), f32)]
    for i in range(d["n_layer"]):
        b = f"blk.{i}."
        tensors += [
            (b + "attn_norm.weight", (e,), f32),
            (b + "attn_q.weight", (e, e), f16),
            (b + "attn_k.weight", (kv, e), f16),
            (b + "attn_v.weight", (kv, e), f16),
            (b + "attn_output.weight", (e, e), f16),
            (b + "ffn_norm.weight", (e,), f32),
            (b + "ffn_gate.weight", (ff, e), f16),
            (b + "ffn_up.weight", (ff, e), f16),
            (b + "ffn_down.weight", (e, ff), f16),
        ]
        if d["qkv_bias"]:
            tensors += [
                (b + "attn_q.bias", (e,), f32),
                (b + "attn_k.bias", (kv,), f32),
                (b + "attn_v.bias", (kv,), f32),
            ]
    for tname, shape, dt in tensors:
        w.add_tensor_info(tname, shape, dt, int(np.prod(shape)) * dt.itemsize)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()

    # A pool of seeded normal values, read from a different offset per
    # tensor: fast, and every quantization block sees varied values.
    rng = np.random.default_rng(20261130)
    pool = (rng.standard_normal(1 << 24, dtype=np.float32) * 0.02).astype(np.float16)
    for k, (tname, shape, dt) in enumerate(tensors):
        n = int(np.prod(shape))
        if dt == f32:
            # Norm weights near 1, biases small.
            base = 1.0 if tname.endswith("norm.weight") else 0.0
            data = (base + pool[:n].astype(np.float32)).reshape(shape)
        else:
            start = (k * 7919 * 64) % pool.size
            data = np.resize(np.roll(pool, -start), n).reshape(shape)
        w.write_tensor_data(data)
    w.close()


if __name__ == "__main__":
    main()
