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

The mixture-of-experts shapes (MOE_SHAPES) are written already quantized:
an F16 Qwen3-30B-A3B would take 61 GB. Each tensor gets the type
llama-quantize gives it for the named file type (read from llama.cpp's
src/llama-quant.cpp, llama_tensor_get_type_impl: for Q4_K_M, Q6_K for
output.weight and for attn_v / ffn_down_exps in the use_more_bits layers,
Q4_K elsewhere; for Q4_0, Q6_K for the output matrix, which a tied model's
token_embd is; ffn_gate_inp, exp_probs_b, norms and conv taps stay F32;
checked tensor by tensor against `llama-quantize --dry-run` on a sparse F16
file of each shape: 289 Q4_K, 49 Q6_K, 241 F32 for Qwen3-30B-A3B, 132 Q4_0,
1 Q6_K, 123 F32 for LFM2-8B-A1B, no difference) and
seeded random bytes that are valid blocks: random codes and sub-block
scales, and f16 block scales drawn from a small range so the weights are
about 0.02 in size. The router (ffn_gate_inp) is seeded normal noise, as
it is the part whose values decide which experts a token reads.

    scripts/gen-shapes.py --router-histogram FILE.gguf [TOKENS]

prints, for a MoE shape file, the expert-load histogram of the first
routed layer over a prompt: each token's RMS-normed embedding row through
the router, top-k, counted per expert. It leaves out the attention (or
conv) block before the FFN, so it shows how evenly random router weights
spread tokens, not what a trained router does.

    scripts/gen-shapes.py mmproj-siglip-so400m-896 OUT.gguf
    scripts/gen-shapes.py gemma3-text-2560 OUT.gguf

write a vision tower (VISION_SHAPES) and the text model llama.cpp's mtmd
needs beside it. The tower is Gemma 3's SigLIP So400m at 896 px (google/
gemma-3-4b-it config.json vision_config: hidden 1152, 27 layers, 16 heads,
intermediate 4304, patch 14, image 896, layer_norm_eps 1e-6; mm_tokens_per_image
256, i.e. mtmd's default 4 x 4 pooling of the 64 x 64 patch grid; text
hidden 2560), with the tensor names and `clip.*` keys of
scripts/gen-vision-fixtures.py's gemma3 tower (which llama.cpp's
tools/mtmd/clip.cpp reads; the fixtures test them), stored as llama.cpp's
converter stores a real one with --outtype f16: the patch and position
embeddings and 1-D tensors F32, every other matrix F16. The text model is
that fixture's gemma3 text model at width 2560 with one layer: mtmd only
checks that the tower's projection width equals the text model's.
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


# Mixture-of-experts shapes, written quantized (see the module docstring).
# Sources: Qwen/Qwen3-30B-A3B config.json (hidden 2048, 48 layers, 32 heads,
# 4 KV heads, head_dim 128, 128 experts, 8 per token, moe_intermediate_size
# 768, intermediate_size 6144, vocab 151936, rope_theta 1e6, rms_norm_eps
# 1e-6, max_position_embeddings 40960, untied); LiquidAI/LFM2-8B-A1B
# config.json (hidden 2048, 24 layers, attention at layers 2, 6, 10, 14, 18,
# 21 and gated short convolutions (conv_L_cache 3) elsewhere, 32 heads, 8 KV
# heads, 32 experts, 4 per token, moe_intermediate_size 1792, 2 leading
# dense layers of intermediate_size 7168, sigmoid routing with an expert
# bias, norm_topk_prob, routed_scaling_factor 1.0, vocab 65536, rope_theta
# 1e6, norm_eps 1e-5, max_position_embeddings 128000, tied embeddings).
MOE_SHAPES = {
    "qwen3-30b-a3b": (
        "qwen3moe",
        "qwen2",
        "Q4_K_M",
        dict(
            n_vocab=151936, n_embd=2048, n_layer=48, n_head=32, n_head_kv=4, head_dim=128,
            n_ff=6144, n_expert=128, n_used=8, n_ff_exp=768, ctx=40960, rope_base=1000000.0,
            eps=1e-6, specials=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        ),
    ),
    "lfm2-8b-a1b": (
        "lfm2moe",
        "lfm2",
        "Q4_0",
        dict(
            n_vocab=65536, n_embd=2048, n_layer=24, n_head=32, n_head_kv=8, head_dim=64,
            n_ff=7168, n_expert=32, n_used=4, n_ff_exp=1792, n_dense=2,
            attn_layers=(2, 6, 10, 14, 18, 21), conv_l=3, ctx=128000, rope_base=1000000.0,
            eps=1e-5, specials=["<|startoftext|>", "<|im_start|>", "<|im_end|>"],
        ),
    ),
    # openai/gpt-oss-20b config.json: hidden_size 2880, 24 layers, 64 heads of
    # head_dim 64, 8 KV heads, 32 local experts, 4 per token, intermediate_size
    # 2880, sliding_window 128 (even layers; llama.cpp's pattern 2), vocab
    # 201088, rope_theta 150000, yarn factor 32 over 4096 positions,
    # max_position_embeddings 131072, rms_norm_eps 1e-5, untied output.
    # MXFP4_MOE: the stacked experts MXFP4, every other matrix Q8_0 (token_embd
    # and output too), router, norms, biases and sinks F32 (llama-quant.cpp).
    "gpt-oss-20b": (
        "gpt-oss",
        "gpt-4o",
        "MXFP4_MOE",
        dict(
            n_vocab=201088, n_embd=2880, n_layer=24, n_head=64, n_head_kv=8, head_dim=64,
            n_ff=2880, n_expert=32, n_used=4, n_ff_exp=2880, ctx=131072, rope_base=150000.0,
            eps=1e-5, sliding_window=128, yarn_factor=32.0, yarn_orig_ctx=4096,
            specials=["<|startoftext|>", "<|endoftext|>", "<|return|>"],
        ),
    ),
}

Q = gguf.GGMLQuantizationType


def use_more_bits(i, n):
    """llama-quantize's layers that get more bits (src/llama-quant.cpp)."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def moe_tensors(arch, ftype, d):
    """(name, numpy shape outermost first, ggml type) of a MoE shape file."""
    e, v, hd = d["n_embd"], d["n_vocab"], d["head_dim"]
    q, kv = d["n_head"] * hd, d["n_head_kv"] * hd
    ex, ff_e, n = d["n_expert"], d["n_ff_exp"], d["n_layer"]
    base = Q.Q4_K if ftype == "Q4_K_M" else Q.Q4_0
    out = []
    if arch == "gpt-oss":
        # openai-moe.cpp's tensors; 1-D ones (norms, biases, sinks) and the router stay F32.
        out += [("token_embd.weight", (v, e), Q.Q8_0), ("output_norm.weight", (e,), Q.F32),
                ("output.weight", (v, e), Q.Q8_0)]
        for i in range(n):
            b = f"blk.{i}."
            out += [(b + "attn_norm.weight", (e,), Q.F32),
                    (b + "attn_q.weight", (q, e), Q.Q8_0), (b + "attn_q.bias", (q,), Q.F32),
                    (b + "attn_k.weight", (kv, e), Q.Q8_0), (b + "attn_k.bias", (kv,), Q.F32),
                    (b + "attn_v.weight", (kv, e), Q.Q8_0), (b + "attn_v.bias", (kv,), Q.F32),
                    (b + "attn_output.weight", (e, q), Q.Q8_0), (b + "attn_output.bias", (e,), Q.F32),
                    (b + "attn_sinks.weight", (d["n_head"],), Q.F32),
                    (b + "post_attention_norm.weight", (e,), Q.F32),
                    (b + "ffn_gate_inp.weight", (ex, e), Q.F32), (b + "ffn_gate_inp.bias", (ex,), Q.F32),
                    (b + "ffn_gate_exps.weight", (ex, ff_e, e), Q.MXFP4),
                    (b + "ffn_gate_exps.bias", (ex, ff_e), Q.F32),
                    (b + "ffn_up_exps.weight", (ex, ff_e, e), Q.MXFP4),
                    (b + "ffn_up_exps.bias", (ex, ff_e), Q.F32),
                    (b + "ffn_down_exps.weight", (ex, e, ff_e), Q.MXFP4),
                    (b + "ffn_down_exps.bias", (ex, e), Q.F32)]
        return out
    if arch == "qwen3moe":
        out += [("token_embd.weight", (v, e), base), ("output_norm.weight", (e,), Q.F32),
                ("output.weight", (v, e), Q.Q6_K)]
    else:
        # Tied: the token table is the output matrix, quantized as one.
        out += [("token_embd.weight", (v, e), Q.Q6_K), ("token_embd_norm.weight", (e,), Q.F32)]
    for i in range(n):
        b = f"blk.{i}."
        more = ftype == "Q4_K_M" and use_more_bits(i, n)
        out.append((b + "attn_norm.weight", (e,), Q.F32))
        if arch == "qwen3moe" or i in d["attn_layers"]:
            out += [(b + "attn_q.weight", (q, e), base), (b + "attn_k.weight", (kv, e), base),
                    (b + "attn_v.weight", (kv, e), Q.Q6_K if more else base),
                    (b + "attn_output.weight", (e, q), base),
                    (b + "attn_q_norm.weight", (hd,), Q.F32), (b + "attn_k_norm.weight", (hd,), Q.F32)]
        else:
            out += [(b + "shortconv.in_proj.weight", (3 * e, e), base),
                    (b + "shortconv.out_proj.weight", (e, e), base),
                    (b + "shortconv.conv.weight", (e, d["conv_l"]), Q.F32)]
        out.append((b + "ffn_norm.weight", (e,), Q.F32))
        if i < d.get("n_dense", 0):
            out += [(b + "ffn_gate.weight", (d["n_ff"], e), base), (b + "ffn_up.weight", (d["n_ff"], e), base),
                    (b + "ffn_down.weight", (e, d["n_ff"]), base)]
            continue
        out += [(b + "ffn_gate_inp.weight", (ex, e), Q.F32),
                (b + "ffn_gate_exps.weight", (ex, ff_e, e), base),
                (b + "ffn_up_exps.weight", (ex, ff_e, e), base),
                (b + "ffn_down_exps.weight", (ex, e, ff_e), Q.Q6_K if more else base)]
        if arch == "lfm2moe":
            out.append((b + "exp_probs_b.bias", (ex,), Q.F32))
    return out


def random_blocks(rng, qtype, n_blocks):
    """n_blocks valid blocks of qtype: random codes, small f16 scales."""
    bs = gguf.GGML_QUANT_SIZES[qtype][1]
    raw = rng.integers(0, 256, size=(n_blocks, bs), dtype=np.uint8)

    def f16s(lo, hi):
        return rng.uniform(lo, hi, size=n_blocks).astype(np.float16).view(np.uint8).reshape(n_blocks, 2)

    if qtype == Q.Q4_0:  # d, 16 code bytes: |w| <= 8 d
        raw[:, 0:2] = f16s(0.001, 0.005)
    elif qtype == Q.Q4_K:  # d, dmin, 12 six-bit scale/min bytes, 128 code bytes
        # w = d * sc * q - dmin * m with sc, m, q uniform: dmin = 7.5 d makes
        # the weights zero-mean, so embedding rows share no direction that
        # would send every token to the same experts.
        d = rng.uniform(0.00005, 0.0002, size=n_blocks)
        raw[:, 0:2] = d.astype(np.float16).view(np.uint8).reshape(n_blocks, 2)
        raw[:, 2:4] = (7.5 * d).astype(np.float16).view(np.uint8).reshape(n_blocks, 2)
    elif qtype == Q.Q8_0:  # d, 32 int8 codes: |w| <= 127 d
        raw[:, 0:2] = f16s(0.00005, 0.0002)
    elif qtype == Q.MXFP4:  # E8M0 exponent e, 16 bytes of E2M1 nibbles: |w| <= 6 * 2^(e - 128)
        raw[:, 0] = rng.integers(119, 123, size=n_blocks, dtype=np.uint8)
    elif qtype == Q.Q6_K:  # 128 + 64 code bytes, 16 int8 scales, d last
        raw[:, 192:208] = rng.integers(-32, 32, size=(n_blocks, 16), dtype=np.int8).view(np.uint8)
        raw[:, 208:210] = f16s(0.00005, 0.0002)
    else:
        raise ValueError(qtype)
    return raw


def write_moe(name, out):
    arch, pre, ftype, d = MOE_SHAPES[name]
    e = d["n_embd"]
    w = gguf.GGUFWriter(out, arch)
    w.add_name(f"random-weight {name} shape")
    w.add_context_length(d["ctx"])
    w.add_embedding_length(e)
    w.add_block_count(d["n_layer"])
    w.add_feed_forward_length(d["n_ff"])
    w.add_head_count(d["n_head"])
    w.add_rope_freq_base(d["rope_base"])
    w.add_layer_norm_rms_eps(d["eps"])
    w.add_vocab_size(d["n_vocab"])
    w.add_expert_count(d["n_expert"])
    w.add_expert_used_count(d["n_used"])
    w.add_expert_feed_forward_length(d["n_ff_exp"])
    if arch == "gpt-oss":
        w.add_head_count_kv(d["n_head_kv"])
        w.add_key_length(d["head_dim"])
        w.add_value_length(d["head_dim"])
        w.add_rope_dimension_count(d["head_dim"])
        w.add_sliding_window(d["sliding_window"])
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(d["yarn_factor"])
        w.add_rope_scaling_orig_ctx_len(d["yarn_orig_ctx"])
        w.add_file_type(gguf.LlamaFileType.MOSTLY_MXFP4_MOE)
    elif arch == "qwen3moe":
        w.add_head_count_kv(d["n_head_kv"])
        w.add_key_length(d["head_dim"])
        w.add_value_length(d["head_dim"])
        w.add_rope_dimension_count(d["head_dim"])
        w.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_K_M)
    else:
        w.add_head_count_kv([d["n_head_kv"] if i in d["attn_layers"] else 0 for i in range(d["n_layer"])])
        w.add_shortconv_l_cache(d["conv_l"])
        w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
        w.add_leading_dense_block_count(d["n_dense"])
        w.add_expert_weights_norm(True)
        w.add_expert_weights_scale(1.0)
        w.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_0)
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

    tensors = moe_tensors(arch, ftype, d)
    for tname, shape, qt in tensors:
        if qt == Q.F32:
            w.add_tensor_info(tname, shape, np.dtype(np.float32), int(np.prod(shape)) * 4)
        else:
            blk, bs = gguf.GGML_QUANT_SIZES[qt]
            row = shape[-1] // blk * bs
            w.add_tensor_info(tname, (*shape[:-1], row), np.dtype(np.uint8), int(np.prod(shape[:-1])) * row,
                              raw_dtype=qt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    rng = np.random.default_rng(20261202)
    total = 0
    for tname, shape, qt in tensors:
        n = int(np.prod(shape))
        if qt == Q.F32:
            if tname.endswith("norm.weight"):
                data = (1.0 + 0.02 * rng.standard_normal(n, dtype=np.float32)).reshape(shape)
            elif tname.endswith("ffn_gate_inp.weight"):
                data = (0.05 * rng.standard_normal(n, dtype=np.float32)).reshape(shape)
            elif tname.endswith("attn_sinks.weight"):
                data = rng.standard_normal(n, dtype=np.float32).reshape(shape)
            else:  # conv taps, expert bias, gpt-oss's biases
                data = (0.02 * rng.standard_normal(n, dtype=np.float32)).reshape(shape)
        else:
            blk = gguf.GGML_QUANT_SIZES[qt][0]
            data = random_blocks(rng, qt, n // blk)
        total += data.nbytes
        w.write_tensor_data(data)
    w.close()
    print(f"{out}: {len(tensors)} tensors, {total / 1e9:.2f} GB of data", file=sys.stderr)


def rms_norm(x, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)


def router_histogram(path, n_tokens):
    """Expert load of the first routed layer's router over n_tokens token ids."""
    r = gguf.GGUFReader(path)
    arch = r.fields["general.architecture"].contents()
    f = {k: r.fields[k].contents() for k in r.fields if k.startswith(arch + ".")}
    k_used, eps = f[f"{arch}.expert_used_count"], f[f"{arch}.attention.layer_norm_rms_epsilon"]
    by = {t.name: t for t in r.tensors}
    first = f.get(f"{arch}.leading_dense_block_count", 0)
    rt = by[f"blk.{first}.ffn_gate_inp.weight"]
    router = gguf.dequantize(rt.data, rt.tensor_type).astype(np.float64)
    emb = by["token_embd.weight"]
    rng = np.random.default_rng(7)
    ids = rng.integers(0, int(emb.shape[1]), size=n_tokens)
    rows = np.stack([gguf.dequantize(emb.data[i], emb.tensor_type) for i in ids]).reshape(n_tokens, -1)
    h = rms_norm(rows.astype(np.float64), eps)
    scores = h @ router.T
    rb = f"blk.{first}.ffn_gate_inp.bias"
    if rb in by:
        scores = scores + gguf.dequantize(by[rb].data, by[rb].tensor_type)
    if f.get(f"{arch}.expert_gating_func", 1) == 2:
        scores = 1.0 / (1.0 + np.exp(-scores))
        b = f"blk.{first}.exp_probs_b.bias"
        if b in by:
            scores = scores + gguf.dequantize(by[b].data, by[b].tensor_type)
    chosen = np.argsort(-scores, axis=1)[:, :k_used]
    load = np.bincount(chosen.ravel(), minlength=router.shape[0])
    mean = load.mean()
    print(f"{path}: layer {first} router, {n_tokens} random tokens, top-{k_used} of {router.shape[0]} experts")
    print(f"  tokens per expert: min {load.min()}, max {load.max()}, mean {mean:.1f}, "
          f"max/mean {load.max() / mean:.2f}, experts never chosen {int((load == 0).sum())}")
    width = 40 / max(1, load.max())
    for i, c in enumerate(load):
        print(f"  expert {i:3d} {c:5d} {'#' * int(round(c * width))}")


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


# Vision shapes (see the module docstring): the tower's hyperparameters as
# scripts/gen-vision-fixtures.py's spec_gemma3_tower takes them.
VISION_SHAPES = {
    "mmproj-siglip-so400m-896": dict(n_embd=1152, n_ff=4304, n_layer=27, n_head=16, image_size=896,
                                     patch_size=14, eps=1e-6, mean=[0.5, 0.5, 0.5], std=[0.5, 0.5, 0.5],
                                     n_text=2560),
}
VISION_TEXT_SHAPES = {"gemma3-text-2560": dict(n_embd=2560, n_head=8, n_head_kv=4, head_dim=256, n_ff=512,
                                               n_layer=1)}


def write_vision(name, out):
    """A VISION_SHAPES tower or a VISION_TEXT_SHAPES text model (see the docstring)."""
    from load_script import load, gen_fixtures

    gv = load("gen-vision-fixtures.py", "gen_vision_fixtures")
    gf = gen_fixtures()
    if name in VISION_TEXT_SHAPES:
        hp = dict(gv.TEXT_HP, **VISION_TEXT_SHAPES[name], family=name)
        keys, tensors = gv.text_spec(hp)
        gf.write_gguf(out, "gemma3", keys, gf.make_tensors(tensors, 2561))
        return
    vp = VISION_SHAPES[name]
    keys, spec = gv.spec_gemma3_tower(vp, vp["n_text"])
    # Seeded standard normals, a different offset per tensor, scaled to each
    # tensor's std and mean: quick for 400M values.
    pool = np.random.default_rng(20261204).standard_normal(1 << 24, dtype=np.float32)
    tensors = []
    for k, (tname, (_, shape, std, mean)) in enumerate(spec):
        n = int(np.prod(shape))
        start = (k * 7919 * 64) % pool.size
        x = (mean + std * np.resize(np.roll(pool, -start), n)).astype(np.float32).reshape(shape)
        keep = x.ndim < 2 or tname in ("v.patch_embd.weight", "v.position_embd.weight")
        tensors.append((tname, x if keep else x.astype(np.float16)))
    gf.write_gguf(out, "clip", keys, tensors)


def main():
    if len(sys.argv) == 3 and (sys.argv[1] in VISION_SHAPES or sys.argv[1] in VISION_TEXT_SHAPES):
        write_vision(sys.argv[1], sys.argv[2])
        return
    if len(sys.argv) in (3, 4) and sys.argv[1] == "--router-histogram":
        router_histogram(sys.argv[2], int(sys.argv[3]) if len(sys.argv) == 4 else 512)
        return
    if len(sys.argv) == 3 and sys.argv[1] in MOE_SHAPES:
        write_moe(sys.argv[1], sys.argv[2])
        return
    if len(sys.argv) != 3 or sys.argv[1] not in SHAPES:
        names = ",".join(list(SHAPES) + list(MOE_SHAPES) + list(VISION_SHAPES) + list(VISION_TEXT_SHAPES))
        sys.exit(f"usage: gen-shapes.py {{{names}}} OUT.gguf | --router-histogram FILE.gguf [TOKENS]")
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
