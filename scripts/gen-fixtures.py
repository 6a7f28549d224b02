#!/usr/bin/env python3
"""Writes one llama.cpp golden-logits fixture: a tiny seeded random-weight GGUF
for a family, its llama-quantize'd copy, and llama.cpp's logits for every
position (one call, one token per call, default F16 KV), plus the
dequantized reference. The layout and the settings are those of
testdata/llamacpp/README.md; run it through scripts/gen-fixtures.sh, which
pins the Python packages and builds the libllama driver.

    scripts/gen-fixtures.sh FAMILY OUT_DIR [--compare DIR]

FAMILY is a key of FAMILIES below (the fixture directory name). --compare DIR compares every file written
with the same file in DIR (bytes for GGUFs and logits; the reproducible
fields for meta.json) and exits 1 on a difference.

Not part of CI: it needs llama.cpp built by scripts/build-llamacpp.sh.
"""

import argparse
import hashlib
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import gguf

N_VOCAB = 384
TOKEN_SEED = 4242  # the 40 ids every family shares: default_rng(4242).integers(3, 384, 40)
N_TOKENS = 40


# ---------------------------------------------------------------- families
#
# A family spec is a function of the generator's settings returning the
# metadata (key, value, gguf type) in file order and the tensors in file
# order, each with its initialiser. Random draws are taken from one
# default_rng(seed) stream in tensor order, one standard_normal draw of the
# tensor's NumPy shape per random tensor, so the order below is the recipe.


def w(n_out, n_in, gain=1.0):
    """A matmul weight, NumPy shape [n_out, n_in], std gain/sqrt(n_in)."""
    return ("normal", (n_out, n_in), gain / math.sqrt(n_in), 0.0)


def norm(n, std=0.1):
    """A norm weight as stored in GGUF: 1 + N(0, std^2) (0.1, or 0.2 for q/k norms)."""
    return ("normal", (n,), std, 1.0)


def qk_norm(n):
    """A q/k norm weight of about 0.4 (attention scale 1 models)."""
    return ("normal", (n,), 0.05, 0.4)


def vec(n, std):
    return ("normal", (n,), std, 0.0)


def llama3_rope_freqs(hp):
    """The Llama-3 RoPE divisors of convert_hf_to_gguf.py (LlamaModel)."""
    s = hp["llama3_rope"]
    factor, lo, hi, old = s["factor"], s["low_freq_factor"], s["high_freq_factor"], s["original_max_position_embeddings"]
    base, dim = hp["rope_base"], hp["head_dim"]
    freqs = 1.0 / (base ** (np.arange(0, dim, 2, dtype=np.float32) / dim))
    low_wl, high_wl = old / lo, old / hi
    out = []
    for f in freqs:
        wl = 2 * math.pi / f
        if wl < high_wl:
            out.append(1.0)
        elif wl > low_wl:
            out.append(factor)
        else:
            smooth = (old / wl - lo) / (hi - lo)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return ("const", np.array(out, dtype=np.float32))


def common_keys(arch, hp, after_kv=()):
    """The keys every family writes; after_kv goes between head_count_kv and the RMS epsilon."""
    u32, f32 = gguf.GGUFValueType.UINT32, gguf.GGUFValueType.FLOAT32
    keys = [
        ("general.name", f"tiny-random-{hp['family']}", gguf.GGUFValueType.STRING),
        (f"{arch}.context_length", hp["n_ctx_train"], u32),
        (f"{arch}.embedding_length", hp["n_embd"], u32),
        (f"{arch}.block_count", hp["n_layer"], u32),
        (f"{arch}.feed_forward_length", hp["n_ff"], u32),
        (f"{arch}.attention.head_count", hp["n_head"], u32),
        (f"{arch}.vocab_size", hp["n_vocab"], u32),
        ("tokenizer.ggml.model", "none", gguf.GGUFValueType.STRING),
    ]
    if hp["bos"] is not None:
        keys.append(("tokenizer.ggml.bos_token_id", hp["bos"], u32))
    keys += [
        ("tokenizer.ggml.add_bos_token", hp["bos"] is not None, gguf.GGUFValueType.BOOL),
        (f"{arch}.attention.head_count_kv", hp["n_head_kv"], u32),
        *after_kv,
        (f"{arch}.attention.layer_norm_rms_epsilon", hp["eps"], f32),
        (f"{arch}.rope.freq_base", hp["rope_base"], f32),
    ]
    return keys


def llama_like_block(i, hp, biases=None, qk_norms=()):
    """attn_norm, q, k, v (with optional biases), output, qk_norms (q/k norm names), ffn_norm, gate, up, down."""
    e, hd, nh, nkv, ff = hp["n_embd"], hp["head_dim"], hp["n_head"], hp["n_head_kv"], hp["n_ff"]
    b = f"blk.{i}."
    t = [(b + "attn_norm.weight", norm(e)), (b + "attn_q.weight", w(nh * hd, e))]
    if biases:
        t.append((b + "attn_q.bias", vec(nh * hd, biases[0])))
    t.append((b + "attn_k.weight", w(nkv * hd, e)))
    if biases:
        t.append((b + "attn_k.bias", vec(nkv * hd, biases[1])))
    t.append((b + "attn_v.weight", w(nkv * hd, e)))
    if biases:
        t.append((b + "attn_v.bias", vec(nkv * hd, biases[2])))
    t.append((b + "attn_output.weight", w(e, nh * hd, 0.5)))
    t += [(b + n, norm(hd, 0.2)) for n in qk_norms]
    t += [
        (b + "ffn_norm.weight", norm(e)),
        (b + "ffn_gate.weight", w(ff, e)),
        (b + "ffn_up.weight", w(ff, e)),
        (b + "ffn_down.weight", w(e, ff, 0.5)),
    ]
    return t


def head(hp):
    t = [("output_norm.weight", norm(hp["n_embd"]))]
    if not hp.get("tied", False):
        t.append(("output.weight", w(hp["n_vocab"], hp["n_embd"], hp["out_gain"])))
    return t


def spec_llama(hp):
    keys = common_keys("llama", hp) + [("llama.rope.dimension_count", hp["head_dim"], gguf.GGUFValueType.UINT32)]
    t = [("token_embd.weight", ("normal", (hp["n_vocab"], hp["n_embd"]), hp["embd_std"], 0.0)),
         ("rope_freqs.weight", llama3_rope_freqs(hp))]
    for i in range(hp["n_layer"]):
        t += llama_like_block(i, hp)
    return keys, t + head(hp)


def spec_qwen2(hp):
    t = [("token_embd.weight", ("normal", (hp["n_vocab"], hp["n_embd"]), hp["embd_std"], 0.0))]
    for i in range(hp["n_layer"]):
        t += llama_like_block(i, hp, biases=(0.2, 0.5, 0.1))
    return common_keys("qwen2", hp), t + head(hp)


def head_dim_keys(arch, hp):
    u32 = gguf.GGUFValueType.UINT32
    return [(f"{arch}.attention.key_length", hp["head_dim"], u32), (f"{arch}.attention.value_length", hp["head_dim"], u32)]


def qk_norm_spec(arch, hp):
    """A llama-like body with q/k RMSNorm weights (1 + N(0, 0.2^2)) and its own head_dim;
    where the norms sit relative to RoPE is the loader's fact, not the file's."""
    keys = common_keys(arch, hp, head_dim_keys(arch, hp)) + [
        (f"{arch}.rope.dimension_count", hp["head_dim"], gguf.GGUFValueType.UINT32)]
    t = [("token_embd.weight", ("normal", (hp["n_vocab"], hp["n_embd"]), hp["embd_std"], 0.0))]
    for i in range(hp["n_layer"]):
        t += llama_like_block(i, hp, qk_norms=("attn_q_norm.weight", "attn_k_norm.weight"))
    return keys, t + head(hp)


def spec_qwen3(hp):
    """q/k RMSNorm before RoPE, head_dim != n_embd / n_head."""
    return qk_norm_spec("qwen3", hp)


def imrope_keys(arch, hp):
    """Qwen3-VL's own keys (src/models/qwen3vl.cpp, qwen3vlmoe.cpp): the IMROPE sections
    (required) and the deepstack count."""
    return [(f"{arch}.rope.dimension_sections", hp["rope_sections"], gguf.GGUFValueType.ARRAY),
            (f"{arch}.n_deepstack_layers", hp["n_deepstack"], gguf.GGUFValueType.UINT32)]


def imrope_text_inv(hp, inv):
    """The inverse frequencies a text position turns each pair by under IMROPE: ggml's
    ggml_mrope_cache_init (is_imrope) gives pair i of sector s = i % sum(sections) the h axis
    if s % 3 == 1 and s < 3 sections[1], w if s % 3 == 2 and s < 3 sections[2], t if
    s % 3 == 0 and s < 3 sections[0], else e; a text token is (p, p, p, 0), so an e pair
    does not turn."""
    sec = hp.get("rope_sections")
    if not sec:
        return inv
    total = sum(sec)
    on_e = [not ((i % total) % 3 == 1 and i % total < 3 * sec[1] or (i % total) % 3 == 2 and i % total < 3 * sec[2]
                 or (i % total) % 3 == 0 and i % total < 3 * sec[0]) for i in range(len(inv))]
    return np.where(on_e, 0.0, inv)


def spec_qwen3vl(hp):
    """The qwen3 body as llama.cpp's qwen3vl arch (src/models/qwen3vl.cpp): IMROPE over the
    whole head, deepstack count (text rows carry no features)."""
    keys, t = qk_norm_spec("qwen3vl", hp)
    return keys + imrope_keys("qwen3vl", hp), t


def spec_qwen3vlmoe(hp):
    """qwen3moe's routed body as llama.cpp's qwen3vlmoe arch (src/models/qwen3vlmoe.cpp):
    IMROPE, deepstack count."""
    keys, t = spec_qwen3moe(hp, "qwen3vlmoe")
    return keys + imrope_keys("qwen3vlmoe", hp), t


def spec_hunyuan_dense(hp):
    """q/k RMSNorm after RoPE; the NTK alpha pre-folded into rope.freq_base."""
    return qk_norm_spec("hunyuan-dense", hp)


def spec_lfm2(hp):
    """Short-conv layers (head_count_kv 0) mixed with attention layers; final norm token_embd_norm."""
    arch, u32 = "lfm2", gguf.GGUFValueType.UINT32
    e, L = hp["n_embd"], hp["n_layer"]
    kv = [hp["n_head_kv"] if i in hp["attn_layers"] else 0 for i in range(L)]
    keys = [(k, kv, gguf.GGUFValueType.ARRAY) if k == f"{arch}.attention.head_count_kv" else (k, v, ty)
            for k, v, ty in common_keys(arch, hp)] + [(f"{arch}.shortconv.l_cache", hp["l_cache"], u32)]
    t = [("token_embd.weight", ("normal", (hp["n_vocab"], e), hp["embd_std"], 0.0))]
    for i in range(L):
        if i in hp["attn_layers"]:
            t += llama_like_block(i, hp, qk_norms=("attn_q_norm.weight", "attn_k_norm.weight"))
            continue
        b = f"blk.{i}."
        t += [(b + "attn_norm.weight", norm(e)), (b + "shortconv.in_proj.weight", w(3 * e, e)),
              (b + "shortconv.conv.weight", ("normal", (e, hp["l_cache"]), 0.4, 0.0)),
              (b + "shortconv.out_proj.weight", w(e, e, 0.5))]
        t += llama_like_block(i, hp)[-4:]
    return keys, t + [("token_embd_norm.weight", norm(e))]


def spec_phi3(hp):
    """Fused QKV and gate|up, partial rotary, LongRoPE factor tables and attention factor."""
    arch, u32, f32 = "phi3", gguf.GGUFValueType.UINT32, gguf.GGUFValueType.FLOAT32
    e, hd, nh, nkv, ff, lr = hp["n_embd"], hp["head_dim"], hp["n_head"], hp["n_head_kv"], hp["n_ff"], hp["longrope"]
    scale = hp["n_ctx_train"] / lr["original_max_position_embeddings"]
    attn_factor = math.sqrt(1 + math.log(scale) / math.log(lr["original_max_position_embeddings"]))
    keys = common_keys(arch, hp) + [
        (f"{arch}.rope.dimension_count", hp["n_rot"], u32),
        (f"{arch}.attention.sliding_window", hp["sliding_window"], u32),
        (f"{arch}.rope.scaling.original_context_length", lr["original_max_position_embeddings"], u32),
        (f"{arch}.rope.scaling.attn_factor", attn_factor, f32),
    ]
    n = hp["n_rot"] // 2
    # long: geometric from 1 to long_max; short: linspace(1, short_max) times 1 + N(0, 0.02^2).
    long_f = np.array([lr["long_max"] ** (i / (n - 1)) for i in range(n)], dtype=np.float32)
    t = [("token_embd.weight", ("normal", (hp["n_vocab"], e), hp["embd_std"], 0.0)),
         ("rope_factors_long.weight", ("const", long_f)),
         ("rope_factors_short.weight", ("normal", (n,), 0.02, 1.0, np.linspace(1.0, lr["short_max"], n)))]
    order = [name for name, _ in t]
    for i in range(hp["n_layer"]):
        b = f"blk.{i}."
        # The recipe draws the two fused matrices of a layer first, then the rest in file order.
        t += [(b + "attn_qkv.weight", w((nh + 2 * nkv) * hd, e)), (b + "ffn_up.weight", w(2 * ff, e)),
              (b + "attn_norm.weight", norm(e)), (b + "attn_output.weight", w(e, nh * hd, 0.5)),
              (b + "ffn_norm.weight", norm(e)), (b + "ffn_down.weight", w(e, ff, 0.5))]
        order += [b + n for n in ("attn_norm.weight", "attn_qkv.weight", "attn_output.weight", "ffn_norm.weight",
                                  "ffn_up.weight", "ffn_down.weight")]
    t += head(hp)
    return keys, t, order + [name for name, _ in head(hp)]


def spec_gemma3(hp):
    """Sandwich norms, q/k norms, sliding window with its own RoPE base, linear scaling on full layers."""
    arch, u32, f32, st = "gemma3", gguf.GGUFValueType.UINT32, gguf.GGUFValueType.FLOAT32, gguf.GGUFValueType.STRING
    e, hd, nh, nkv, ff = hp["n_embd"], hp["head_dim"], hp["n_head"], hp["n_head_kv"], hp["n_ff"]
    keys = common_keys(arch, hp, head_dim_keys(arch, hp))
    at = [k for k, _, _ in keys].index(f"{arch}.rope.freq_base")
    keys = keys[:at] + [(f"{arch}.attention.sliding_window", hp["sliding_window"], u32)] + keys[at:] + [
        (f"{arch}.rope.freq_base_swa", hp["rope_base_swa"], f32),
        (f"{arch}.rope.scaling.type", "linear", st),
        (f"{arch}.rope.scaling.factor", hp["rope_linear_factor"], f32)]
    t = [("token_embd.weight", ("normal", (hp["n_vocab"], e), hp["embd_std"], 0.0))]
    for i in range(hp["n_layer"]):
        b = f"blk.{i}."
        t += [(b + "attn_norm.weight", norm(e)), (b + "attn_q.weight", w(nh * hd, e)),
              (b + "attn_k.weight", w(nkv * hd, e)), (b + "attn_v.weight", w(nkv * hd, e)),
              (b + "attn_output.weight", w(e, nh * hd, 0.5)), (b + "post_attention_norm.weight", norm(e)),
              (b + "attn_q_norm.weight", norm(hd, 0.2)), (b + "attn_k_norm.weight", norm(hd, 0.2)),
              (b + "ffn_norm.weight", norm(e)), (b + "ffn_gate.weight", w(ff, e)), (b + "ffn_up.weight", w(ff, e)),
              (b + "ffn_down.weight", w(e, ff, 0.5)), (b + "post_ffw_norm.weight", norm(e))]
    return keys, t + [("output_norm.weight", norm(e))]


def spec_qwen35(hp):
    """Gated delta-net layers mixed with gated full-attention layers (every full_attention_interval-th)."""
    arch, u32 = "qwen35", gguf.GGUFValueType.UINT32
    e, hd, nh, nkv, ff = hp["n_embd"], hp["head_dim"], hp["n_head"], hp["n_head_kv"], hp["n_ff"]
    ds, nk, nv, ck = hp["ssm_state"], hp["ssm_k_heads"], hp["ssm_v_heads"], hp["ssm_conv_kernel"]
    keys = common_keys(arch, hp, head_dim_keys(arch, hp)) + [
        (f"{arch}.rope.dimension_count", hp["n_rot"], u32),
        (f"{arch}.rope.dimension_sections", hp["rope_sections"], gguf.GGUFValueType.ARRAY),
        (f"{arch}.ssm.conv_kernel", ck, u32), (f"{arch}.ssm.state_size", ds, u32),
        (f"{arch}.ssm.group_count", nk, u32), (f"{arch}.ssm.time_step_rank", nv, u32),
        (f"{arch}.ssm.inner_size", nv * ds, u32),
        (f"{arch}.full_attention_interval", hp["full_attention_interval"], u32)]
    conv = (2 * nk + nv) * ds
    t = [("token_embd.weight", ("normal", (hp["n_vocab"], e), hp["embd_std"], 0.0))]
    for i in range(hp["n_layer"]):
        b = f"blk.{i}."
        t.append((b + "attn_norm.weight", norm(e)))
        if (i + 1) % hp["full_attention_interval"] == 0:
            t += [(b + "attn_q.weight", w(2 * nh * hd, e)), (b + "attn_k.weight", w(nkv * hd, e)),
                  (b + "attn_v.weight", w(nkv * hd, e)), (b + "attn_output.weight", w(e, nh * hd, 0.5)),
                  (b + "attn_q_norm.weight", norm(hd, 0.2)), (b + "attn_k_norm.weight", norm(hd, 0.2))]
        else:
            t += [(b + "attn_qkv.weight", w(conv, e)), (b + "attn_gate.weight", w(nv * ds, e)),
                  (b + "ssm_conv1d.weight", ("normal", (conv, ck), 0.3, 0.0)),
                  (b + "ssm_dt.bias", ("normal", (nv,), 0.5, -2.0)),
                  (b + "ssm_a", ("uniform", (nv,), 0.5, 4.0, -1.0)),  # -exp(A_log), A = U(0.5, 4)
                  (b + "ssm_beta.weight", w(nv, e)), (b + "ssm_alpha.weight", w(nv, e)),
                  (b + "ssm_norm.weight", norm(ds)), (b + "ssm_out.weight", w(e, nv * ds, 0.5))]
        t += [(b + "post_attention_norm.weight", norm(e)), (b + "ffn_gate.weight", w(ff, e)),
              (b + "ffn_up.weight", w(ff, e)), (b + "ffn_down.weight", w(e, ff, 0.5))]
    return keys, t + head(hp)


def spec_nanbeige(hp):
    keys = common_keys("nanbeige", hp) + [
        ("nanbeige.rope.dimension_count", hp["head_dim"], gguf.GGUFValueType.UINT32),
        ("nanbeige.num_loops", hp["num_loops"], gguf.GGUFValueType.UINT32),
    ]
    t = [("token_embd.weight", ("normal", (hp["n_vocab"], hp["n_embd"]), hp["embd_std"], 0.0))]
    for i in range(hp["n_layer"]):
        t += llama_like_block(i, hp)
    return keys, t + head(hp)


def gemma4_kv_heads(hp):
    """The KV head count of each layer: hp["n_head_kv"] on full layers, hp["n_head_kv_swa"] (when
    given) on sliding ones."""
    return [hp.get("n_head_kv_swa", hp["n_head_kv"]) if s else hp["n_head_kv"] for s in hp["sliding"]]


def spec_gemma4(hp):
    """llama.cpp's gemma4 (src/models/gemma4.cpp): dense layers, or with hp["n_expert"] expert
    layers (the dense MLP beside routed experts, the routing code of routing_code()). With
    hp["n_head_kv_swa"], attention.head_count_kv is a per-layer array (n_head_kv(il)); with
    hp["k_eq_v"], the full layers with their own KV have no attn_v (V = K, HF's attention_k_eq_v)."""
    arch, u32, f32 = "gemma4", gguf.GGUFValueType.UINT32, gguf.GGUFValueType.FLOAT32
    e, nh, ff, L = hp["n_embd"], hp["n_head"], hp["n_ff"], hp["n_layer"]
    hd, hd_swa, pl = hp["head_dim"], hp["head_dim_swa"], hp["n_embd_per_layer"]
    swa = hp["sliding"]
    kv_heads = gemma4_kv_heads(hp)
    moe = hp.get("n_expert")
    # With experts: no matrix writes the routing code's dims into the residual stream.
    rc = routing_code(hp) if moe else None
    out_w = (lambda n_out, n_in: ("normal", (n_out, n_in), 0.5 / math.sqrt(n_in), 0.0, rc["out_rows"])) if moe \
        else (lambda n_out, n_in: w(n_out, n_in, 0.5))
    moe_keys = [(f"{arch}.expert_count", moe, u32), (f"{arch}.expert_used_count", hp["n_expert_used"], u32),
                (f"{arch}.expert_feed_forward_length", hp["n_ff_exp"], u32)] if moe else []
    keys = common_keys(arch, hp) + moe_keys + [
        (f"{arch}.rope.freq_base_swa", hp["rope_base_swa"], f32),
        (f"{arch}.attention.sliding_window", hp["window"], u32),
        (f"{arch}.attention.sliding_window_pattern", swa, gguf.GGUFValueType.ARRAY),
        (f"{arch}.attention.key_length", hd, u32),
        (f"{arch}.attention.value_length", hd, u32),
        (f"{arch}.attention.key_length_swa", hd_swa, u32),
        (f"{arch}.attention.value_length_swa", hd_swa, u32),
        (f"{arch}.rope.dimension_count", hd, u32),
        (f"{arch}.rope.dimension_count_swa", hd_swa, u32),
        (f"{arch}.embedding_length_per_layer_input", pl, u32),
        (f"{arch}.attention.shared_kv_layers", hp["shared_kv_layers"], u32),
        (f"{arch}.final_logit_softcapping", hp["final_softcap"], f32),
    ]
    if "n_head_kv_swa" in hp:
        keys = [(k, kv_heads, gguf.GGUFValueType.ARRAY) if k == f"{arch}.attention.head_count_kv" else (k, v, ty)
                for k, v, ty in keys]
    # Proportional RoPE on full layers: the first n_rot/2 pairs rotate, the
    # rest get divisor 1e30 (no rotation), as conversion/gemma.py writes it.
    n_rot_pairs = hp["rot_pairs_full"]
    freqs = np.array([1.0] * n_rot_pairs + [1e30] * (hd // 2 - n_rot_pairs), dtype=np.float32)
    t = [("token_embd.weight", rc["embd"] if moe else ("normal", (hp["n_vocab"], e), hp["embd_std"], 0.0))]
    if pl:
        t += [("per_layer_token_embd.weight", ("normal", (hp["n_vocab"], pl * L), hp["embd_std"], 0.0)),
              ("per_layer_model_proj.weight", w(pl * L, e)),
              ("per_layer_proj_norm.weight", norm(pl))]
    t.append(("rope_freqs.weight", ("const", freqs)))
    kv_from = L - hp["shared_kv_layers"]
    for i in range(L):
        b = f"blk.{i}."
        d, nkv = (hd_swa if swa[i] else hd), kv_heads[i]
        t += [(b + "attn_norm.weight", norm(e)), (b + "attn_q.weight", w(nh * d, e))]
        if i < kv_from:
            t.append((b + "attn_k.weight", w(nkv * d, e)))
            if swa[i] or not hp.get("k_eq_v"):
                t.append((b + "attn_v.weight", w(nkv * d, e)))
        # q/k norm weights ~0.4: with attention scale 1, unit-RMS q and k
        # would make every softmax one-hot (and the quantized runs chaotic).
        t += [(b + "attn_output.weight", out_w(e, nh * d)), (b + "attn_q_norm.weight", qk_norm(d))]
        if i < kv_from:
            t.append((b + "attn_k_norm.weight", qk_norm(d)))
        t += [(b + "post_attention_norm.weight", norm(e)),
              (b + "layer_output_scale.weight", ("normal", (1,), 0.1, 0.8)),
              (b + "ffn_norm.weight", norm(e)),
              (b + "ffn_gate.weight", w(ff, e)), (b + "ffn_up.weight", w(ff, e)),
              (b + "ffn_down.weight", out_w(e, ff)),
              (b + "post_ffw_norm.weight", norm(e))]
        if moe:
            # The router's scale is exactly 1 on the code dims; the stacked tensors' NumPy
            # shapes are [experts, outputs, inputs], gate rows before up rows in gate_up.
            ne, fe = moe, hp["n_ff_exp"]
            t += [(b + "ffn_gate_inp.weight", rc["router"](i)),
                  (b + "ffn_gate_inp.scale", ("normal", (e,), 0.1, 1.0, *rc["norm"])),
                  (b + "pre_ffw_norm_2.weight", norm(e)), (b + "post_ffw_norm_1.weight", norm(e)),
                  (b + "post_ffw_norm_2.weight", norm(e)),
                  (b + "ffn_gate_up_exps.weight", ("normal", (ne, 2 * fe, e), 1 / math.sqrt(e), 0.0)),
                  (b + "ffn_down_exps.weight",
                   ("normal", (ne, e, fe), hp["exp_down_gain"] / math.sqrt(fe), 0.0, rc["down_rows"])),
                  (b + "ffn_down_exps.scale", ("uniform", (ne,), 0.5, 1.5, 1.0))]
        if pl:
            t += [(b + "inp_gate.weight", w(pl, e)), (b + "proj.weight", out_w(e, pl)),
                  (b + "post_norm.weight", norm(e))]
    return keys, t + head(hp)


def spec_gemma_embedding(hp):
    """llama.cpp's gemma-embedding (src/models/gemma-embedding.cpp): Gemma 3
    layers, bidirectional, symmetric sliding window, mean pooling, then the
    sentence-transformers dense layers (dense_2: n_embd -> dense, dense_3:
    dense -> n_embd)."""
    arch, u32, f32 = "gemma-embedding", gguf.GGUFValueType.UINT32, gguf.GGUFValueType.FLOAT32
    e, nh, nkv, hd, ff, dn = hp["n_embd"], hp["n_head"], hp["n_head_kv"], hp["head_dim"], hp["n_ff"], hp["dense"]
    keys = common_keys(arch, hp) + [
        (f"{arch}.attention.key_length", hd, u32),
        (f"{arch}.attention.value_length", hd, u32),
        (f"{arch}.rope.freq_base_swa", hp["rope_base_swa"], f32),
        (f"{arch}.attention.sliding_window", hp["window"], u32),
        (f"{arch}.attention.sliding_window_pattern", hp["pattern"], u32),
        (f"{arch}.pooling_type", 1, u32),
        (f"{arch}.dense_2_feat_in", e, u32),
        (f"{arch}.dense_2_feat_out", dn, u32),
        (f"{arch}.dense_3_feat_in", dn, u32),
        (f"{arch}.dense_3_feat_out", e, u32),
    ]
    t = [("token_embd.weight", ("normal", (hp["n_vocab"], e), hp["embd_std"], 0.0))]
    for i in range(hp["n_layer"]):
        b = f"blk.{i}."
        t += [(b + "attn_norm.weight", norm(e)), (b + "attn_q.weight", w(nh * hd, e)),
              (b + "attn_k.weight", w(nkv * hd, e)), (b + "attn_v.weight", w(nkv * hd, e)),
              (b + "attn_output.weight", w(e, nh * hd, 0.5)),
              (b + "post_attention_norm.weight", norm(e)),
              (b + "attn_k_norm.weight", norm(hd)), (b + "attn_q_norm.weight", norm(hd)),
              (b + "ffn_norm.weight", norm(e)),
              (b + "ffn_gate.weight", w(ff, e)), (b + "ffn_up.weight", w(ff, e)),
              (b + "ffn_down.weight", w(e, ff, 0.5)),
              (b + "post_ffw_norm.weight", norm(e))]
    t += [("output_norm.weight", norm(e)), ("dense_2.weight", w(dn, e)), ("dense_3.weight", w(e, dn))]
    return keys, t


def routing_code(hp):
    """The routed families' fixture design, so that every token's k-th and (k+1)-th router
    scores are far apart (a choice that flips between two engines moves the logits far):
    the first n_expert dims of each token embedding hold a code, the ranks 1..n_expert of a
    random permutation times code_scale / n_expert; no matrix writes those dims back into
    the residual stream (their rows of attn_output and ffn_down_exps are 0) and the norm
    weights there are exactly 1, so the code reaches every layer's router unchanged but for
    the RMS scale. Layer i's router reads code dim (e + 3 i) % n_expert for expert e with
    weight router_gain, plus N(0, (router_noise/sqrt(n_embd))^2) on every dim."""
    e, ne = hp["n_embd"], hp["n_expert"]
    keep = np.ones(e)
    keep[:ne] = 0.0
    one = 1.0 - keep

    def router(i):
        p = np.zeros((ne, e))
        for x in range(ne):
            p[x, (x + 3 * i) % ne] = hp["router_gain"]
        return ("normal", (ne, e), hp.get("router_noise", 0.1) / math.sqrt(e), 0.0, np.ones((ne, e)), p)

    return {"embd": ("routing_code", (hp["n_vocab"], e), hp["embd_std"], ne, hp["code_scale"]),
            "out_rows": keep[:, None], "down_rows": keep[None, :, None], "norm": (keep, one), "router": router}


def spec_qwen3moe(hp, arch="qwen3moe"):
    """The qwen3 body (q/k RMSNorm before NEOX RoPE) with routed experts in every layer
    (src/models/qwen3moe.cpp): ffn_gate_inp, stacked ffn_{gate,up,down}_exps; the routing
    code of routing_code()."""
    u32 = gguf.GGUFValueType.UINT32
    e, ne, ff, nh, hd = hp["n_embd"], hp["n_expert"], hp["n_ff_exp"], hp["n_head"], hp["head_dim"]
    rc = routing_code(hp)
    keys = common_keys(arch, hp, head_dim_keys(arch, hp)) + [
        (f"{arch}.rope.dimension_count", hd, u32),
        (f"{arch}.expert_count", ne, u32), (f"{arch}.expert_used_count", hp["n_expert_used"], u32),
        (f"{arch}.expert_feed_forward_length", ff, u32)]
    t = [("token_embd.weight", rc["embd"])]
    for i in range(hp["n_layer"]):
        b = f"blk.{i}."
        # attn_norm .. ffn_norm of the llama-like block, then the routed FFN; a stacked
        # tensor's NumPy shape is [experts, outputs, inputs] (ggml [inputs, outputs, experts]).
        blk = llama_like_block(i, hp, qk_norms=("attn_q_norm.weight", "attn_k_norm.weight"))[:-3]
        blk = [(n, ("normal", (e, nh * hd), 0.5 / math.sqrt(nh * hd), 0.0, rc["out_rows"]))
               if n.endswith("attn_output.weight") else
               (n, ("normal", (e,), 0.1, 0.0, *rc["norm"])) if n.endswith("ffn_norm.weight") else (n, init)
               for n, init in blk]
        t += blk + [(b + "ffn_gate_inp.weight", rc["router"](i)),
                    (b + "ffn_gate_exps.weight", ("normal", (ne, ff, e), 1 / math.sqrt(e), 0.0)),
                    (b + "ffn_up_exps.weight", ("normal", (ne, ff, e), 1 / math.sqrt(e), 0.0)),
                    (b + "ffn_down_exps.weight", ("normal", (ne, e, ff), 0.5 / math.sqrt(ff), 0.0, rc["down_rows"]))]
    return keys, t + head(hp)


def spec_gpt_oss(hp):
    """llama.cpp's gpt-oss (src/models/openai-moe.cpp): sliding layers (even) alternating with
    full ones (llama.cpp's pattern 2), sinks, q/k/v/o biases, YaRN, every FFN routed: the top
    n_expert_used router logits (+ ffn_gate_inp.bias), softmax over those, each expert
    swiglu_oai with biased gate/up/down. The routing code of routing_code(); attn_output.bias
    and ffn_down_exps.bias are 0 on the code dims as their matrices' rows are."""
    arch, u32, f32, st = "gpt-oss", gguf.GGUFValueType.UINT32, gguf.GGUFValueType.FLOAT32, gguf.GGUFValueType.STRING
    e, ne, ff, nh, nkv, hd = hp["n_embd"], hp["n_expert"], hp["n_ff_exp"], hp["n_head"], hp["n_head_kv"], hp["head_dim"]
    rc = routing_code(hp)
    keep = rc["out_rows"][:, 0]
    keys = common_keys(arch, hp, head_dim_keys(arch, hp)) + [
        (f"{arch}.rope.dimension_count", hd, u32),
        (f"{arch}.attention.sliding_window", hp["sliding_window"], u32),
        (f"{arch}.rope.scaling.type", "yarn", st),
        (f"{arch}.rope.scaling.factor", hp["yarn_factor"], f32),
        (f"{arch}.rope.scaling.original_context_length", hp["yarn_orig_ctx"], u32),
        (f"{arch}.expert_count", ne, u32), (f"{arch}.expert_used_count", hp["n_expert_used"], u32),
        (f"{arch}.expert_feed_forward_length", ff, u32)]
    t = [("token_embd.weight", rc["embd"])]
    for i in range(hp["n_layer"]):
        b = f"blk.{i}."
        t += [(b + "attn_norm.weight", norm(e)),
              (b + "attn_q.weight", w(nh * hd, e)), (b + "attn_q.bias", vec(nh * hd, 0.2)),
              (b + "attn_k.weight", w(nkv * hd, e)), (b + "attn_k.bias", vec(nkv * hd, 0.2)),
              (b + "attn_v.weight", w(nkv * hd, e)), (b + "attn_v.bias", vec(nkv * hd, 0.2)),
              (b + "attn_output.weight", ("normal", (e, nh * hd), 0.5 / math.sqrt(nh * hd), 0.0, rc["out_rows"])),
              (b + "attn_output.bias", ("normal", (e,), 0.1, 0.0, keep)),
              (b + "attn_sinks.weight", ("normal", (nh,), hp["sink_std"], hp["sink_mean"])),
              (b + "post_attention_norm.weight", ("normal", (e,), 0.1, 0.0, *rc["norm"])),
              (b + "ffn_gate_inp.weight", rc["router"](i)),
              (b + "ffn_gate_inp.bias", vec(ne, hp["router_bias_std"])),
              (b + "ffn_gate_exps.weight", ("normal", (ne, ff, e), hp["exp_gain"] / math.sqrt(e), 0.0)),
              (b + "ffn_gate_exps.bias", ("normal", (ne, ff), 0.5, 0.0)),
              (b + "ffn_up_exps.weight", ("normal", (ne, ff, e), hp["exp_gain"] / math.sqrt(e), 0.0)),
              (b + "ffn_up_exps.bias", ("normal", (ne, ff), 0.5, 0.0)),
              (b + "ffn_down_exps.weight", ("normal", (ne, e, ff), hp["exp_down_gain"] / math.sqrt(ff), 0.0,
                                            rc["down_rows"])),
              (b + "ffn_down_exps.bias", ("normal", (ne, e), 0.1, 0.0, keep[None, :]))]
    return keys, t + head(hp)


def spec_lfm2moe(hp):
    """lfm2's short-conv and attention layers; the first leading_dense layers' FFNs dense, the
    others routed (src/models/lfm2.cpp, lfm2moe): sigmoid gating, exp_probs_b choosing; the
    routing code of routing_code(), whose dims no conv, attention or FFN output writes."""
    arch, u32 = "lfm2moe", gguf.GGUFValueType.UINT32
    e, L, ne, ff = hp["n_embd"], hp["n_layer"], hp["n_expert"], hp["n_ff_exp"]
    rc = routing_code(hp)
    kv = [hp["n_head_kv"] if i in hp["attn_layers"] else 0 for i in range(L)]
    keys = [(k, kv, gguf.GGUFValueType.ARRAY) if k == f"{arch}.attention.head_count_kv" else (k, v, ty)
            for k, v, ty in common_keys(arch, hp)] + [
        (f"{arch}.shortconv.l_cache", hp["l_cache"], u32),
        (f"{arch}.expert_count", ne, u32), (f"{arch}.expert_used_count", hp["n_expert_used"], u32),
        (f"{arch}.expert_feed_forward_length", ff, u32), (f"{arch}.expert_gating_func", 2, u32),
        (f"{arch}.leading_dense_block_count", hp["leading_dense"], u32)]
    out_rows = lambda n_out, n_in: ("normal", (n_out, n_in), 0.5 / math.sqrt(n_in), 0.0, rc["out_rows"])
    t = [("token_embd.weight", rc["embd"])]
    for i in range(L):
        b = f"blk.{i}."
        if i in hp["attn_layers"]:
            blk = llama_like_block(i, hp, qk_norms=("attn_q_norm.weight", "attn_k_norm.weight"))[:-4]
            t += [(n, out_rows(e, e)) if n.endswith("attn_output.weight") else (n, init) for n, init in blk]
        else:
            t += [(b + "attn_norm.weight", norm(e)), (b + "shortconv.in_proj.weight", w(3 * e, e)),
                  (b + "shortconv.conv.weight", ("normal", (e, hp["l_cache"]), 0.4, 0.0)),
                  (b + "shortconv.out_proj.weight", out_rows(e, e))]
        t.append((b + "ffn_norm.weight", ("normal", (e,), 0.1, 0.0, *rc["norm"])))
        if i < hp["leading_dense"]:
            t += [(b + "ffn_gate.weight", w(hp["n_ff"], e)), (b + "ffn_up.weight", w(hp["n_ff"], e)),
                  (b + "ffn_down.weight", out_rows(e, hp["n_ff"]))]
        else:
            t += [(b + "ffn_gate_inp.weight", rc["router"](i)),
                  (b + "ffn_gate_exps.weight", ("normal", (ne, ff, e), 1 / math.sqrt(e), 0.0)),
                  (b + "ffn_up_exps.weight", ("normal", (ne, ff, e), 1 / math.sqrt(e), 0.0)),
                  (b + "ffn_down_exps.weight", ("normal", (ne, e, ff), 0.5 / math.sqrt(ff), 0.0, rc["down_rows"])),
                  (b + "exp_probs_b.bias", ("const", np.array(hp["exp_probs_b"], dtype=np.float32)))]
    return keys, t + [("token_embd_norm.weight", norm(e))]


def spec_qwen35moe(hp):
    """qwen35's gated delta-net and gated attention layers, every FFN routed experts plus a
    shared expert gated by sigmoid(ffn_gate_inp_shexp h) (src/models/qwen35moe.cpp); the
    routing code of routing_code()."""
    arch, u32 = "qwen35moe", gguf.GGUFValueType.UINT32
    e, hd, nh, nkv = hp["n_embd"], hp["head_dim"], hp["n_head"], hp["n_head_kv"]
    ds, nk, nv, ck = hp["ssm_state"], hp["ssm_k_heads"], hp["ssm_v_heads"], hp["ssm_conv_kernel"]
    ne, ff, fs = hp["n_expert"], hp["n_ff_exp"], hp["n_ff_shexp"]
    rc = routing_code(hp)
    keys = common_keys(arch, hp, head_dim_keys(arch, hp)) + [
        (f"{arch}.rope.dimension_count", hp["n_rot"], u32),
        (f"{arch}.rope.dimension_sections", hp["rope_sections"], gguf.GGUFValueType.ARRAY),
        (f"{arch}.ssm.conv_kernel", ck, u32), (f"{arch}.ssm.state_size", ds, u32),
        (f"{arch}.ssm.group_count", nk, u32), (f"{arch}.ssm.time_step_rank", nv, u32),
        (f"{arch}.ssm.inner_size", nv * ds, u32),
        (f"{arch}.full_attention_interval", hp["full_attention_interval"], u32),
        (f"{arch}.expert_count", ne, u32), (f"{arch}.expert_used_count", hp["n_expert_used"], u32),
        (f"{arch}.expert_feed_forward_length", ff, u32),
        (f"{arch}.expert_shared_feed_forward_length", fs, u32)]
    conv = (2 * nk + nv) * ds
    out_rows = lambda n_out, n_in: ("normal", (n_out, n_in), 0.5 / math.sqrt(n_in), 0.0, rc["out_rows"])
    t = [("token_embd.weight", rc["embd"])]
    for i in range(hp["n_layer"]):
        b = f"blk.{i}."
        t.append((b + "attn_norm.weight", norm(e)))
        if (i + 1) % hp["full_attention_interval"] == 0:
            t += [(b + "attn_q.weight", w(2 * nh * hd, e)), (b + "attn_k.weight", w(nkv * hd, e)),
                  (b + "attn_v.weight", w(nkv * hd, e)), (b + "attn_output.weight", out_rows(e, nh * hd)),
                  (b + "attn_q_norm.weight", norm(hd, 0.2)), (b + "attn_k_norm.weight", norm(hd, 0.2))]
        else:
            t += [(b + "attn_qkv.weight", w(conv, e)), (b + "attn_gate.weight", w(nv * ds, e)),
                  (b + "ssm_conv1d.weight", ("normal", (conv, ck), 0.3, 0.0)),
                  (b + "ssm_dt.bias", ("normal", (nv,), 0.5, -2.0)),
                  (b + "ssm_a", ("uniform", (nv,), 0.5, 4.0, -1.0)),
                  (b + "ssm_beta.weight", w(nv, e)), (b + "ssm_alpha.weight", w(nv, e)),
                  (b + "ssm_norm.weight", norm(ds)), (b + "ssm_out.weight", out_rows(e, nv * ds))]
        t += [(b + "post_attention_norm.weight", ("normal", (e,), 0.1, 0.0, *rc["norm"])),
              (b + "ffn_gate_inp.weight", rc["router"](i)),
              (b + "ffn_gate_exps.weight", ("normal", (ne, ff, e), 1 / math.sqrt(e), 0.0)),
              (b + "ffn_up_exps.weight", ("normal", (ne, ff, e), 1 / math.sqrt(e), 0.0)),
              (b + "ffn_down_exps.weight", ("normal", (ne, e, ff), 0.5 / math.sqrt(ff), 0.0, rc["down_rows"])),
              (b + "ffn_gate_inp_shexp.weight", ("normal", (e,), 2 / math.sqrt(e), 0.0)),
              (b + "ffn_gate_shexp.weight", w(fs, e)), (b + "ffn_up_shexp.weight", w(fs, e)),
              (b + "ffn_down_shexp.weight", out_rows(e, fs))]
    return keys, t + head(hp)


def rms(x, w, eps):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def reference_qwen3moe(path, hp, toks):
    """An independent float64 NumPy forward of qwen3moe (the semantics in meta.json:model),
    returning the logits, per layer and token the gap between the k-th and (k+1)-th router
    score (softmax probability), and the chosen experts."""
    T = {t.name: np.array(t.data, dtype=np.float64) for t in gguf.GGUFReader(str(path)).tensors}
    e, nh, nkv, hd, eps = hp["n_embd"], hp["n_head"], hp["n_head_kv"], hp["head_dim"], hp["eps"]
    k_used, n = hp["n_expert_used"], len(toks)
    x = T["token_embd.weight"][toks]
    pos = np.arange(n)
    inv = imrope_text_inv(hp, hp["rope_base"] ** (-np.arange(0, hd, 2) / hd))
    ang = pos[:, None] * inv[None, :]
    cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]

    def rope(v):  # NEOX: pairs (i, i + hd/2)
        a, b = v[..., : hd // 2], v[..., hd // 2:]
        return np.concatenate([a * cos - b * sin, a * sin + b * cos], -1)

    gaps, chosen = [], []
    for i in range(hp["n_layer"]):
        g = lambda s: T[f"blk.{i}.{s}"]
        h = rms(x, g("attn_norm.weight"), eps)
        q = rope(rms((h @ g("attn_q.weight").T).reshape(n, nh, hd), g("attn_q_norm.weight"), eps))
        kk = rope(rms((h @ g("attn_k.weight").T).reshape(n, nkv, hd), g("attn_k_norm.weight"), eps))
        v = (h @ g("attn_v.weight").T).reshape(n, nkv, hd)
        o = np.zeros((n, nh, hd))
        for hh in range(nh):
            kv = hh // (nh // nkv)
            sc = q[:, hh] @ kk[:, kv].T / math.sqrt(hd)
            sc[np.triu_indices(n, 1)] = -np.inf
            p = np.exp(sc - sc.max(1, keepdims=True))
            o[:, hh] = (p / p.sum(1, keepdims=True)) @ v[:, kv]
        x = x + o.reshape(n, nh * hd) @ g("attn_output.weight").T
        h = rms(x, g("ffn_norm.weight"), eps)
        lg = h @ g("ffn_gate_inp.weight").T
        pr = np.exp(lg - lg.max(1, keepdims=True))
        pr /= pr.sum(1, keepdims=True)
        f = np.zeros_like(x)
        for t in range(n):
            order = np.argsort(-pr[t], kind="stable")
            gaps.append(float(pr[t, order[k_used - 1]] - pr[t, order[k_used]]))
            chosen.append(sorted(int(c) for c in order[:k_used]))
            wts = pr[t, order[:k_used]] / pr[t, order[:k_used]].sum()
            for ex, wt in zip(order[:k_used], wts):
                gt = g("ffn_gate_exps.weight")[ex] @ h[t]
                up = g("ffn_up_exps.weight")[ex] @ h[t]
                f[t] += wt * (g("ffn_down_exps.weight")[ex] @ (gt / (1 + np.exp(-gt)) * up))
        x = x + f
    out = T["output.weight"] if "output.weight" in T else T["token_embd.weight"]
    return rms(x, T["output_norm.weight"], eps) @ out.T, np.array(gaps).reshape(hp["n_layer"], n), chosen


def attention_neox(x_h, g, hp, n, qk_norm=True):
    """Causal GQA attention with q/k RMSNorm before NEOX RoPE over the whole head (float64)."""
    nh, nkv, hd, eps = hp["n_head"], hp["n_head_kv"], hp["head_dim"], hp["eps"]
    inv = hp["rope_base"] ** (-np.arange(0, hd, 2) / hd)
    ang = np.arange(n)[:, None] * inv[None, :]
    cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]

    def rope(v):
        a, b = v[..., : hd // 2], v[..., hd // 2:]
        return np.concatenate([a * cos - b * sin, a * sin + b * cos], -1)

    q = (x_h @ g("attn_q.weight").T).reshape(n, nh, hd)
    k = (x_h @ g("attn_k.weight").T).reshape(n, nkv, hd)
    if qk_norm:
        q, k = rms(q, g("attn_q_norm.weight"), eps), rms(k, g("attn_k_norm.weight"), eps)
    q, k = rope(q), rope(k)
    v = (x_h @ g("attn_v.weight").T).reshape(n, nkv, hd)
    o = np.zeros((n, nh, hd))
    for hh in range(nh):
        kv = hh // (nh // nkv)
        sc = q[:, hh] @ k[:, kv].T / math.sqrt(hd)
        sc[np.triu_indices(n, 1)] = -np.inf
        p = np.exp(sc - sc.max(1, keepdims=True))
        o[:, hh] = (p / p.sum(1, keepdims=True)) @ v[:, kv]
    return o.reshape(n, nh * hd) @ g("attn_output.weight").T


def reference_lfm2moe(path, hp, toks):
    """An independent float64 NumPy forward of lfm2moe (meta.json:model): logits, the gap between
    the k-th and (k+1)-th selection score (sigmoid + exp_probs_b) per routed layer and token,
    and the chosen experts."""
    T = {t.name: np.array(t.data, dtype=np.float64) for t in gguf.GGUFReader(str(path)).tensors}
    e, eps, L, k_used, n = hp["n_embd"], hp["eps"], hp["l_cache"], hp["n_expert_used"], len(toks)
    x = T["token_embd.weight"][toks]
    gaps, chosen = [], []
    for i in range(hp["n_layer"]):
        g = lambda s: T[f"blk.{i}.{s}"]
        h = rms(x, g("attn_norm.weight"), eps)
        if i in hp["attn_layers"]:
            x = x + attention_neox(h, g, hp, n)
        else:
            bcx = h @ g("shortconv.in_proj.weight").T
            b_, c_, xx = bcx[:, :e], bcx[:, e:2 * e], bcx[:, 2 * e:]
            bx = np.vstack([np.zeros((L - 1, e)), b_ * xx])
            kern = g("shortconv.conv.weight")  # [e, L]: tap j multiplies input t - (L - 1) + j
            conv = np.stack([(bx[t:t + L] * kern.T).sum(0) for t in range(n)])
            x = x + (c_ * conv) @ g("shortconv.out_proj.weight").T
        h = rms(x, g("ffn_norm.weight"), eps)
        if i < hp["leading_dense"]:
            gt, up = h @ g("ffn_gate.weight").T, h @ g("ffn_up.weight").T
            x = x + (gt / (1 + np.exp(-gt)) * up) @ g("ffn_down.weight").T
            continue
        sc = 1 / (1 + np.exp(-(h @ g("ffn_gate_inp.weight").T)))
        sel = sc + g("exp_probs_b.bias")
        f = np.zeros_like(x)
        for t in range(n):
            order = np.argsort(-sel[t], kind="stable")
            gaps.append(float(sel[t, order[k_used - 1]] - sel[t, order[k_used]]))
            chosen.append(sorted(int(c) for c in order[:k_used]))
            wts = sc[t, order[:k_used]] / sc[t, order[:k_used]].sum()
            for ex, wt in zip(order[:k_used], wts):
                gt = g("ffn_gate_exps.weight")[ex] @ h[t]
                up = g("ffn_up_exps.weight")[ex] @ h[t]
                f[t] += wt * (g("ffn_down_exps.weight")[ex] @ (gt / (1 + np.exp(-gt)) * up))
        x = x + f
    out = T["output.weight"] if "output.weight" in T else T["token_embd.weight"]
    routed = hp["n_layer"] - hp["leading_dense"]
    return rms(x, T["token_embd_norm.weight"], eps) @ out.T, np.array(gaps).reshape(routed, n), chosen


def gelu(x, table=False):
    """GELU (tanh form), exact in float64, or (table) as ggml-cpu evaluates it in f32: the input
    rounded to fp16, the tanh form in f32, the result rounded to fp16 (its fp16 lookup table),
    and x itself past +-10 (0 below -10)."""
    if not table:
        return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * x * (1 + 0.044715 * x * x)))
    x16 = x.astype(np.float16).astype(np.float32)
    c = np.float32(math.sqrt(2 / math.pi))
    y = (np.float32(0.5) * x16 * (np.float32(1) + np.tanh(c * x16 * (np.float32(1) + np.float32(0.044715) * x16 * x16))))
    y = y.astype(np.float16).astype(np.float64)
    return np.where(x <= -10, 0.0, np.where(x >= 10, x, y))


def reference_gemma4(path, hp, toks, gelu_table=False, switch=()):
    """An independent float64 NumPy forward of gemma4 (GEMMA4_MODEL and, with experts,
    meta.json:model's ffn), written from src/models/gemma4.cpp: logits, per expert layer and
    token the gap between the k-th and (k+1)-th router probability, and the chosen experts.
    gelu_table emulates ggml-cpu's fp16 GELU. `switch` names rules to revert (a mutant of
    the reference, to see how far a rule moves the logits): "no_expert_scale", "no_renorm",
    "no_dense_branch", "no_post_norm_2", "router_on_ffn_input"; for V from K (a layer without
    attn_v) "v_from_normed_k" (V from K after its k norm) and "v_from_roped_k" (V from K after the
    k norm and RoPE)."""
    T = {t.name: np.array(t.data, dtype=np.float64).reshape([int(x) for x in reversed(t.shape)])
         for t in gguf.GGUFReader(str(path)).tensors}
    e, nh, eps, L, n = hp["n_embd"], hp["n_head"], hp["eps"], hp["n_layer"], len(toks)
    kv_heads = gemma4_kv_heads(hp)
    pl, swa, win = hp["n_embd_per_layer"], hp["sliding"], hp["window"]
    g_ = lambda v: gelu(v, gelu_table)
    x0 = T["token_embd.weight"][toks] * math.sqrt(e)
    x = x0
    if pl:
        proj = (x0 @ T["per_layer_model_proj.weight"].T / math.sqrt(e)).reshape(n, L, pl)
        proj = rms(proj, T["per_layer_proj_norm.weight"], eps)
        tok = T["per_layer_token_embd.weight"][toks].reshape(n, L, pl) * math.sqrt(pl)
        per_layer = (proj + tok) / math.sqrt(2)
    pos = np.arange(n)

    def rope(v, n_rot, base, factors):
        half = n_rot // 2
        inv = base ** (-2 * np.arange(half) / n_rot) / factors
        ang = pos[:, None] * inv[None, :]
        c, s_ = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
        a, b = v[..., :half], v[..., half:n_rot]
        return np.concatenate([a * c - b * s_, a * s_ + b * c, v[..., n_rot:]], -1)

    kv_from = L - hp["shared_kv_layers"]
    cache, gaps, chosen = {}, [], []
    for i in range(L):
        g = lambda s: T[f"blk.{i}.{s}"]
        d = hp["head_dim_swa"] if swa[i] else hp["head_dim"]
        if swa[i]:
            n_rot, base, fac = hp["head_dim_swa"], hp["rope_base_swa"], np.ones(d // 2)
        else:
            n_rot, base, fac = d, hp["rope_base"], T["rope_freqs.weight"]
        h = rms(x, g("attn_norm.weight"), eps)
        q = rope(rms((h @ g("attn_q.weight").T).reshape(n, nh, d), g("attn_q_norm.weight"), eps), n_rot, base, fac)
        if i < kv_from:
            nkv = kv_heads[i]
            k_raw = (h @ g("attn_k.weight").T).reshape(n, nkv, d)
            k_normed = rms(k_raw, g("attn_k_norm.weight"), eps)
            k = rope(k_normed, n_rot, base, fac)
            if f"blk.{i}.attn_v.weight" in T:
                v_raw = (h @ g("attn_v.weight").T).reshape(n, nkv, d)
            else:  # Vcur = Kcur: the K projection before its norm and RoPE
                v_raw = k if "v_from_roped_k" in switch else k_normed if "v_from_normed_k" in switch else k_raw
            v = rms(v_raw, 1.0, eps)
            cache[i] = (k, v)
        else:
            k, v = cache[kv_from - (2 if swa[i] else 1)]
        nkv = k.shape[1]
        o = np.zeros((n, nh, d))
        p1, p0 = np.arange(n)[:, None], np.arange(n)[None, :]
        mask = (p0 <= p1) & ((p1 - p0 < win) if swa[i] else True)
        for hh in range(nh):
            kh = hh // (nh // nkv)
            sc = np.where(mask, q[:, hh] @ k[:, kh].T, -np.inf)
            pr = np.exp(sc - sc.max(1, keepdims=True))
            o[:, hh] = (pr / pr.sum(1, keepdims=True)) @ v[:, kh]
        x = x + rms(o.reshape(n, nh * d) @ g("attn_output.weight").T, g("post_attention_norm.weight"), eps)
        hf = rms(x, g("ffn_norm.weight"), eps)
        dense = (g_(hf @ g("ffn_gate.weight").T) * (hf @ g("ffn_up.weight").T)) @ g("ffn_down.weight").T
        if f"blk.{i}.ffn_gate_inp.weight" in T:
            k_used = hp["n_expert_used"]
            dense = rms(dense, g("post_ffw_norm_1.weight"), eps)
            he = rms(x, g("pre_ffw_norm_2.weight"), eps)
            r = rms(x, 1.0, eps) / math.sqrt(e) * g("ffn_gate_inp.scale")
            if "router_on_ffn_input" in switch:
                r = hf
            lg = r @ g("ffn_gate_inp.weight").T
            pr = np.exp(lg - lg.max(1, keepdims=True))
            pr /= pr.sum(1, keepdims=True)
            gu, down, sc = g("ffn_gate_up_exps.weight"), g("ffn_down_exps.weight"), g("ffn_down_exps.scale")
            fe = gu.shape[1] // 2
            f = np.zeros_like(x)
            for t in range(n):
                order = np.argsort(-pr[t], kind="stable")
                gaps.append(float(pr[t, order[k_used - 1]] - pr[t, order[k_used]]))
                chosen.append(sorted(int(c) for c in order[:k_used]))
                wts = pr[t, order[:k_used]]
                if "no_renorm" not in switch:
                    wts = wts / wts.sum()
                for ex, wt in zip(order[:k_used], wts):
                    a = gu[ex] @ he[t]
                    y = down[ex] @ (g_(a[:fe]) * a[fe:])
                    f[t] += wt * y * (1.0 if "no_expert_scale" in switch else sc[ex])
            if "no_post_norm_2" not in switch:
                f = rms(f, g("post_ffw_norm_2.weight"), eps)
            dense = f + (0 if "no_dense_branch" in switch else dense)
        x = x + rms(dense, g("post_ffw_norm.weight"), eps)
        if pl:
            br = (g_(x @ g("inp_gate.weight").T) * per_layer[:, i]) @ g("proj.weight").T
            x = x + rms(br, g("post_norm.weight"), eps)
        if f"blk.{i}.layer_output_scale.weight" in T:
            x = x * g("layer_output_scale.weight")[0]
    logits = rms(x, T["output_norm.weight"], eps) @ T["token_embd.weight"].T
    cap = hp["final_softcap"]
    logits = cap * np.tanh(logits / cap)
    n_moe = len(gaps) // n
    return logits, np.array(gaps).reshape(n_moe, n), chosen


def gemma4_check(out, hp, toks, f32_logits, dequant_path, dequant_logits):
    """meta.json's numpy_float64_reference_check for gemma4 with experts: router_check's figures
    with the exact GELU, the same with ggml's fp16 GELU table emulated, and how far each rule
    reverted in the reference moves its logits (relative to M)."""
    c = router_check(reference_gemma4)(out, hp, toks, f32_logits, dequant_path, dequant_logits)
    m = float(np.abs(f32_logits).max())
    tab = lambda p, *a: reference_gemma4(p, hp, toks, True, *a)[0]
    base = tab(out / "f32.gguf")
    c["f32_fp16_gelu_table_max_abs_diff_rel_to_max_abs_logit"] = float(np.abs(base - f32_logits).max() / m)
    c["dequant_fp16_gelu_table_max_abs_diff_rel_to_max_abs_logit"] = float(
        np.abs(tab(dequant_path) - dequant_logits).max() / m)
    switches = ("no_expert_scale", "no_renorm", "no_dense_branch", "no_post_norm_2", "router_on_ffn_input")
    if hp.get("k_eq_v"):
        switches += ("v_from_normed_k", "v_from_roped_k")
    c["reference_mutants_max_abs_diff_rel_to_max_abs_logit"] = {
        sw: float(np.abs(tab(out / "f32.gguf", (sw,)) - base).max() / m) for sw in switches}
    return c


def router_check(reference):
    """meta.json's numpy_float64_reference_check for a routed family: the reference forward
    against llama.cpp, and the smallest router gap on the f32 and the dequantized weights."""
    def check(out, hp, toks, f32_logits, dequant_path, dequant_logits):
        l32, g32, c32 = reference(out / "f32.gguf", hp, toks)
        ldq, gdq, cdq = reference(dequant_path, hp, toks)
        m = float(np.abs(f32_logits).max())
        return {"f32_max_abs_diff_rel_to_max_abs_logit": float(np.abs(l32 - f32_logits).max() / m),
                "dequant_max_abs_diff_rel_to_max_abs_logit": float(np.abs(ldq - dequant_logits).max() / m),
                "min_router_gap_f32": float(g32.min()), "min_router_gap_dequant": float(gdq.min()),
                "min_router_gap_f32_at_layer_token": [int(v) for v in np.unravel_index(g32.argmin(), g32.shape)],
                "choices_differing_f32_vs_dequant": sum(a != b for a, b in zip(c32, cdq)),
                "router_gap_note": "gap = k-th minus (k+1)-th router selection score (softmax probability, or "
                                   "sigmoid + exp_probs_b), float64 NumPy forward, routed layers x tokens"}
    return check


BASE = {"n_vocab": N_VOCAB, "embd_std": 0.5, "out_gain": 2.0, "n_ctx_train": 4096}

GEMMA4_HP = dict(BASE, n_embd=64, n_head=4, n_head_kv=2, head_dim=32, head_dim_swa=16, n_ff=128, n_layer=7,
                 sliding=[True, True, False, True, False, True, False], window=8, shared_kv_layers=2,
                 rot_pairs_full=4, eps=1e-6, rope_base=1000000.0, rope_base_swa=10000.0, final_softcap=30.0,
                 tied=True, bos=2)
GEMMA4_MODEL = {
    "layer_kinds": "SSFSFSF (sliding_window_pattern), window 8",
    "shared_kv": "layers 5 and 6 (the last shared_kv_layers = 2) have no K/V of their own: a sliding one reads "
                 "layer 3's KV (kv_from_start - 2), a full one layer 4's (kv_from_start - 1)",
    "heads": "full layers head dim 32 (rotary 32 with rope_freqs: 4 pairs rotate, 12 pairs divisor 1e30), "
             "sliding head dim 16 (rotary 16, base rope.freq_base_swa)",
    "attention": "scale 1; q RMSNorm with weight, k RMSNorm with weight, v RMSNorm without weight; NEOX RoPE",
    "body": "attn_norm -> attention -> post_attention_norm -> +; ffn_norm -> GELU-gated FFN -> post_ffw_norm -> +; "
            "then per-layer embedding branch (when n_embd_per_layer > 0); then x layer_output_scale",
    "per_layer_input": "(per_layer_token_embd[token] * sqrt(n_embd_per_layer) + RMSNorm(per_layer_model_proj(x0) / "
                       "sqrt(n_embd); per_layer_proj_norm)) / sqrt(2), x0 the scaled embedding; layer i's slice i",
    "per_layer_branch": "x + RMSNorm(proj(gelu(inp_gate(x)) * slice_i); post_norm)",
    "embedding_scale": "sqrt(n_embd)", "final_logit_softcapping": 30.0, "tied_embeddings": True,
}

# Gemma 4 with expert layers (Gemma-4-26B-A4B's structure at a tiny size), as
# src/models/gemma4.cpp's is_moe_layer branch builds every layer's FFN.
GEMMA4_MOE_MODEL = dict(
    GEMMA4_MODEL,
    layer_kinds="SSFSF (sliding_window_pattern), window 8",
    shared_kv="layers 3 and 4 (the last shared_kv_layers = 2) have no K/V of their own: layer 3 (sliding) reads "
              "layer 1's KV, layer 4 (full) layer 2's",
    body="attn_norm -> attention -> post_attention_norm -> + (x = attn_out); FFN below -> post_ffw_norm -> +; "
         "then the per-layer embedding branch; then x layer_output_scale",
    ffn="every layer: dense = RMSNorm(ffn_down(gelu(ffn_gate h1) * ffn_up h1); post_ffw_norm_1), h1 = "
        "RMSNorm(x; ffn_norm); router input r = rmsnorm(x) (no weight) / sqrt(n_embd) * ffn_gate_inp.scale; "
        "p = softmax(ffn_gate_inp r) over 8 experts; the 2 largest, weights p_e / their sum; experts read "
        "h2 = RMSNorm(x; pre_ffw_norm_2); moe = RMSNorm(sum_e w_e * ffn_down_exps.scale[e] * ffn_down_exps[e]("
        "gelu(gate_e h2) * up_e h2); post_ffw_norm_2), gate_e|up_e the rows of ffn_gate_up_exps[e] (gate first); "
        "FFN = dense + moe",
    routing_code="routing_code(): the first 8 dims of each embedding hold the code; no attn_output, ffn_down, "
                 "ffn_down_exps or per-layer proj row writes them; ffn_gate_inp.scale is exactly 1 there",
)
# Router gain 32 (the router input carries 1/sqrt(n_embd)): the smallest 2nd-3rd probability gap
# is then 0.12. The experts' down projections have std 0.003/sqrt(n_ff_exp), so that their weighted
# sum has an RMS near sqrt(eps) = 1e-3: post_ffw_norm_2 removes any common factor of the weights but
# for its eps, and renormalization is only visible through it (at the 0.5 of the other fixtures,
# dropping it moves the logits by 3e-5 M; here by 1.3e-2 M).
ROUTER_GAIN_GEMMA4 = 32.0
EXP_DOWN_GAIN_GEMMA4 = 0.003

# Gemma-4-26B-A4B's attention rules on gemma4-moe's body: per-kind KV head counts (2 on sliding
# layers, 1 on full ones: attention.head_count_kv [2, 2, 1, 2, 1, 2, 1]) and no attn_v on the full
# layers (V = K before the k norm and RoPE: HF's attention_k_eq_v), with routed experts, shared KV
# and no per-layer embeddings (as the real 26B-A4B; it has no shared KV, kept here to cover a
# shared full layer reading a V-from-K cache).
GEMMA4_A4B_MODEL = dict(
    GEMMA4_MOE_MODEL,
    layer_kinds="SSFSFSF (sliding_window_pattern), window 8",
    shared_kv="layers 5 and 6 (the last shared_kv_layers = 2) have no K/V of their own: layer 5 (sliding) "
              "reads layer 3's KV, layer 6 (full) layer 4's",
    kv_heads="attention.head_count_kv per layer [2, 2, 1, 2, 1, 2, 1]: 2 KV heads of 16 on sliding layers, "
             "1 of 32 on full layers (llama.cpp n_head_kv(il)); query head h reads KV head h // (4 / n_kv)",
    values_from_keys="full layers with their own KV (2, 4) have no attn_v: V = rmsnorm(attn_k h) without weight, "
                     "the K projection before the k norm and RoPE (Vcur = wv ? wv cur : Kcur)",
    body="attn_norm -> attention -> post_attention_norm -> + (x = attn_out); FFN -> post_ffw_norm -> +; "
         "then x layer_output_scale (no per-layer embeddings)",
)


def qwen3moe_family(seed, quant, n_embd, head_dim, n_layer):
    """A qwen3moe fixture: 4 heads (2 KV) of head_dim, 8 experts of 32 (2 used) in every layer."""
    return dict(
        spec=spec_qwen3moe, arch="qwen3moe", seed=seed, quant=quant, check=router_check(reference_qwen3moe),
        hp=dict(BASE, n_embd=n_embd, n_head=4, n_head_kv=2, head_dim=head_dim, n_ff=128, n_layer=n_layer,
                n_expert=8, n_expert_used=2, n_ff_exp=32, router_gain=4.0, code_scale=2.0, eps=1e-6,
                rope_base=1000000.0, tied=False, bos=None),
        model={"layer_kinds": ["full_attention"] * n_layer,
               "rope": {"type": "NEOX (pairs x[i], x[i + n_rot/2])", "n_rot": head_dim, "freq_base": 1000000.0},
               "qk_norm": "RMSNorm over head_dim with weight, before RoPE",
               "ffn": "routed experts in every layer: p = softmax(ffn_gate_inp h) over all 8 experts; the 2 "
                      "largest, weights p_e / sum of the 2 (norm_w true); f = sum_e w_e ffn_down_exps[e]("
                      "silu(ffn_gate_exps[e] h) * ffn_up_exps[e] h); no shared expert, no scale",
               "tied_embeddings": False})


FAMILIES = {
    "llama": dict(
        spec=spec_llama, arch="llama", seed=1001, quant="Q4_K_M",
        hp=dict(BASE, n_embd=256, n_head=4, n_head_kv=2, head_dim=64, n_ff=256, n_layer=6, eps=1e-5,
                rope_base=500000.0, bos=1,
                llama3_rope=dict(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                 original_max_position_embeddings=8192)),
        model={"layer_kinds": ["full_attention"] * 6,
               "rope": {"type": "NORM (adjacent pairs x[2i], x[2i+1])", "n_rot": 64, "freq_base": 500000.0,
                        "freq_factors": "rope_freqs.weight (Llama-3 table)"},
               "tied_embeddings": False, "ffn": "SiLU-gated"}),
    "qwen2": dict(
        spec=spec_qwen2, arch="qwen2", seed=1002, quant="Q8_0",
        hp=dict(BASE, n_embd=64, n_head=4, n_head_kv=2, head_dim=16, n_ff=128, n_layer=6, eps=1e-6,
                rope_base=1000000.0, tied=True, bos=None),
        model={"layer_kinds": ["full_attention"] * 6,
               "rope": {"type": "NEOX (pairs x[i], x[i + n_rot/2])", "n_rot": 16, "freq_base": 1000000.0},
               "tied_embeddings": True, "qkv_bias": True, "ffn": "SiLU-gated"}),
    "qwen3": dict(
        spec=spec_qwen3, arch="qwen3", seed=1003, quant="Q4_0",
        hp=dict(BASE, n_embd=64, n_head=4, n_head_kv=2, head_dim=32, n_ff=128, n_layer=6, eps=1e-6,
                rope_base=1000000.0, tied=False, bos=None),
        model={"layer_kinds": ["full_attention"] * 6,
               "rope": {"type": "NEOX (pairs x[i], x[i + n_rot/2])", "n_rot": 32, "freq_base": 1000000.0},
               "qk_norm": "RMSNorm over head_dim with weight, before RoPE",
               "tied_embeddings": False, "ffn": "SiLU-gated"}),
    "hunyuan-dense": dict(
        spec=spec_hunyuan_dense, arch="hunyuan-dense", seed=1006, quant="Q4_0",
        hp=dict(BASE, n_embd=64, n_head=4, n_head_kv=2, head_dim=16, n_ff=128, n_layer=6, eps=1e-5,
                rope_base=10000 * 1000 ** (16 / 14),
                rope_note="freq_base = 10000 * alpha^(d/(d-2)) with alpha=1000, d=16 (pre-scaled the way "
                          "convert_hf_to_gguf.py writes HunYuan dense; no rope.scaling.alpha key)",
                tied=True, bos=1),
        model={"layer_kinds": ["full_attention"] * 6,
               "rope": {"type": "NEOX (pairs x[i], x[i + n_rot/2])", "n_rot": 16,
                        "freq_base": "10000 * 1000^(16/14) (NTK alpha pre-folded)"},
               "qk_norm": "RMSNorm over head_dim with weight, after RoPE",
               "tied_embeddings": True, "ffn": "SiLU-gated"}),
    "lfm2": dict(
        spec=spec_lfm2, arch="lfm2", seed=1005, quant="Q5_1",
        hp=dict(BASE, n_embd=64, n_head=4, n_head_kv=2, head_dim=16, n_ff=128, n_layer=8, attn_layers=[2, 5, 7],
                l_cache=3, eps=1e-5, rope_base=1000000.0, tied=True, bos=1, n_ctx_train=128000),
        model={"layer_kinds": ["short_conv", "short_conv", "full_attention", "short_conv", "short_conv",
                               "full_attention", "short_conv", "full_attention"],
               "layer_kind_rule": "llama.cpp: layer il is short-conv (recurrent) iff head_count_kv[il] == 0",
               "rope": {"type": "NEOX", "n_rot": 16, "freq_base": 1000000.0},
               "qk_norm": "RMSNorm over head_dim on Q and K (attention layers), before RoPE",
               "shortconv": "B,C,x = split(in_proj(h), 3) in that order; y = C * conv_causal(B * x); out_proj(y); "
                            "conv kernel length L_cache=3, per channel, no bias",
               "final_norm_tensor": "token_embd_norm.weight", "tied_embeddings": True, "ffn": "SiLU-gated"}),
    "phi3": dict(
        spec=spec_phi3, arch="phi3", seed=1007, quant="Q4_1",
        hp=dict(BASE, n_embd=64, n_head=4, n_head_kv=2, head_dim=16, n_ff=128, n_layer=6, n_rot=12, eps=1e-5,
                rope_base=10000.0, n_ctx_train=131072,
                longrope=dict(original_max_position_embeddings=4096, short_max=1.6, long_max=40.0),
                sliding_window=0, bos=None),
        model={"layer_kinds": ["full_attention"] * 6,
               "rope": {"type": "NEOX", "n_rot": 12, "head_dim": 16, "partial_rotary": True, "freq_base": 10000.0,
                        "longrope": True, "original_context_length": 4096,
                        "factors_used": "rope_factors_short (llama.cpp picks long only when n_ctx > "
                                        "original_context_length; fixtures use n_ctx=128)",
                        "attn_factor_rule": "cos and sin are both multiplied by attn_factor"},
               "fused_qkv": "attn_qkv rows: Q (n_head*head_dim), K (n_head_kv*head_dim), V (n_head_kv*head_dim)",
               "fused_gate_up": "ffn_up rows: first n_ff = gate (SiLU applied), next n_ff = up",
               "tied_embeddings": False}),
    "gemma3": dict(
        spec=spec_gemma3, arch="gemma3", seed=1004, quant="Q5_0", tokens2_block=13,
        hp=dict(BASE, n_embd=256, n_head=4, n_head_kv=1, head_dim=64, n_ff=256, n_layer=7, eps=1e-6, embd_std=0.125,
                sliding_window=8, rope_base=1000000.0, rope_base_swa=10000.0, rope_linear_factor=8.0, bos=2,
                n_ctx_train=32768),
        model={"layer_kinds": ["sliding_attention"] * 5 + ["full_attention", "sliding_attention"],
               "sliding_window": 8,
               "sliding_window_rule": "key position p0 is visible from query position p1 iff 0 <= p1 - p0 < sliding_window",
               "rope": {"type": "NEOX", "n_rot": 64, "full_layers": {"freq_base": 1000000.0, "freq_scale": 0.125},
                        "sliding_layers": {"freq_base": 10000.0, "freq_scale": 1.0}},
               "embedding_scale": "sqrt(n_embd)", "attention_scale": "1/sqrt(head_dim)",
               "norms": "all RMSNorm weights stored with the Gemma '+1' folded in",
               "qk_norm": "RMSNorm over head_dim on Q and K, before RoPE",
               "sandwich_norms": "attn_norm -> attn -> post_attention_norm -> +res; ffn_norm -> ffn -> post_ffw_norm -> +res",
               "ffn": "GELU(tanh)-gated", "tied_embeddings": True, "final_logit_softcapping": None}),
    "qwen35": dict(
        spec=spec_qwen35, arch="qwen35", seed=1008, quant="Q8_0",
        hp=dict(BASE, n_embd=64, n_head=4, n_head_kv=2, head_dim=32, n_ff=128, n_layer=8, n_rot=8,
                rope_sections=[2, 1, 1, 0], eps=1e-6, rope_base=10000000.0, ssm_conv_kernel=4, ssm_state=16,
                ssm_k_heads=2, ssm_v_heads=4, full_attention_interval=4, write_recurrent_layers=False, tied=False,
                bos=None, n_ctx_train=262144),
        model={"layer_kinds": (["linear_attention"] * 3 + ["full_attention"]) * 2,
               "layer_kind_rule": "layer il is linear iff (il + 1) % qwen35.full_attention_interval != 0",
               "rope": {"type": "IMROPE (text positions: NEOX over the first n_rot dims)", "n_rot": 8,
                        "head_dim": 32, "sections": [2, 1, 1, 0], "freq_base": 10000000.0},
               "full_attention": "attn_q rows per head [q_h | gate_h]; q,k RMSNorm before RoPE; "
                                 "out = attn_output(attn(q,k,v) * sigmoid(gate))",
               "linear_attention": "gated delta net; v head h uses q/k head h % n_k_heads; "
                                   "out = ssm_out(RMSNorm(o; ssm_norm) * silu(attn_gate x))",
               "norms": "'+1' folded in, except ssm_norm", "post_attention_norm": "the pre-FFN norm",
               "tied_embeddings": False, "ffn": "SiLU-gated"}),
    "gemma4": dict(
        spec=spec_gemma4, arch="gemma4", seed=1010, quant="Q8_0",
        hp=dict(GEMMA4_HP, n_embd_per_layer=32), model=GEMMA4_MODEL),
    "gemma4-nople": dict(
        spec=spec_gemma4, arch="gemma4", seed=1011, quant="Q8_0",
        hp=dict(GEMMA4_HP, n_embd_per_layer=0), model=GEMMA4_MODEL),
    "qwen3moe": qwen3moe_family(seed=1013, quant="Q4_0", n_embd=64, head_dim=32, n_layer=4),
    # qwen3moe as people download it (Q5_K_M: experts' gate and up in Q5_K): K-quants need
    # rows of 256, so n_embd 256 (head_dim 64 puts attn_output's rows at 256 too); the
    # experts stay 32 wide, so their down (rows of 32) falls back to Q5_1 / Q8_0 as
    # llama-quantize does for a 256-block type that does not fit.
    "qwen3moe-q5k": qwen3moe_family(seed=1018, quant="Q5_K_M", n_embd=256, head_dim=64, n_layer=2),
    "lfm2moe": dict(
        spec=spec_lfm2moe, arch="lfm2moe", seed=1014, quant="Q4_0", check=router_check(reference_lfm2moe),
        hp=dict(BASE, n_embd=64, n_head=4, n_head_kv=2, head_dim=16, n_ff=128, n_layer=6, attn_layers=[2, 5],
                l_cache=3, leading_dense=2, n_expert=8, n_expert_used=2, n_ff_exp=32, router_gain=1.0,
                router_noise=0.02, code_scale=2.0, exp_probs_b=[1.0, 0, 0, 0, 0, 0, 0, 0], eps=1e-5,
                rope_base=1000000.0, tied=True, bos=1, n_ctx_train=128000),
        model={"layer_kinds": ["short_conv", "short_conv", "full_attention", "short_conv", "short_conv",
                               "full_attention"],
               "layer_kind_rule": "llama.cpp: layer il is short-conv (recurrent) iff head_count_kv[il] == 0",
               "ffn": "layers 0-1 dense (leading_dense_block_count 2), SiLU-gated; layers 2-5 routed: s = "
                      "sigmoid(ffn_gate_inp h) (expert_gating_func 2); the 2 largest s + exp_probs_b chosen; "
                      "weights s_e (without the bias) / their sum; f = sum_e w_e ffn_down_exps[e](silu("
                      "ffn_gate_exps[e] h) * ffn_up_exps[e] h)",
               "exp_probs_b": "1 for expert 0, else 0: expert 0 is always chosen, weighted by its own score",
               "rope": {"type": "NEOX", "n_rot": 16, "freq_base": 1000000.0},
               "qk_norm": "RMSNorm over head_dim on Q and K (attention layers), before RoPE",
               "final_norm_tensor": "token_embd_norm.weight", "tied_embeddings": True}),
    "qwen35moe": dict(
        spec=spec_qwen35moe, arch="qwen35moe", seed=1015, quant="Q8_0",
        hp=dict(BASE, n_embd=64, n_head=4, n_head_kv=2, head_dim=32, n_ff=128, n_layer=4, n_rot=8,
                rope_sections=[2, 1, 1, 0], eps=1e-6, rope_base=10000000.0, ssm_conv_kernel=4, ssm_state=16,
                ssm_k_heads=2, ssm_v_heads=4, full_attention_interval=4, n_expert=8, n_expert_used=2,
                n_ff_exp=32, n_ff_shexp=64, router_gain=4.0, code_scale=2.0, tied=False, bos=None,
                n_ctx_train=262144),
        model={"layer_kinds": ["linear_attention"] * 3 + ["full_attention"],
               "layer_kind_rule": "layer il is linear iff (il + 1) % qwen35moe.full_attention_interval != 0",
               "mixers": "as qwen35 (gated delta net; gated full attention, q/k RMSNorm before IMROPE)",
               "ffn": "p = softmax(ffn_gate_inp h) over 8 experts; the 2 largest renormalized; f = sum_e w_e "
                      "ffn_down_exps[e](silu(ffn_gate_exps[e] h) * ffn_up_exps[e] h) + sigmoid("
                      "ffn_gate_inp_shexp . h) * ffn_down_shexp(silu(ffn_gate_shexp h) * ffn_up_shexp h)",
               "norms": "'+1' folded in, except ssm_norm", "post_attention_norm": "the pre-FFN norm",
               "tied_embeddings": False}),
    "gemma4-moe": dict(
        spec=spec_gemma4, arch="gemma4", seed=1016, quant="Q8_0", check=gemma4_check,
        hp=dict(GEMMA4_HP, n_layer=5, sliding=[True, True, False, True, False], n_embd_per_layer=32,
                n_expert=8, n_expert_used=2, n_ff_exp=32, router_gain=ROUTER_GAIN_GEMMA4, code_scale=2.0,
                exp_down_gain=EXP_DOWN_GAIN_GEMMA4),
        model=GEMMA4_MOE_MODEL),
    "gemma4-a4b": dict(
        spec=spec_gemma4, arch="gemma4", seed=1020, quant="Q8_0", check=gemma4_check,
        hp=dict(GEMMA4_HP, n_head_kv=1, n_head_kv_swa=2, k_eq_v=True, n_embd_per_layer=0, n_expert=8,
                n_expert_used=2, n_ff_exp=32, router_gain=ROUTER_GAIN_GEMMA4, code_scale=2.0,
                exp_down_gain=EXP_DOWN_GAIN_GEMMA4),
        model=GEMMA4_A4B_MODEL),
    "gpt-oss": dict(
        spec=spec_gpt_oss, arch="gpt-oss", seed=1017, quant="MXFP4_MOE",
        hp=dict(BASE, n_embd=64, n_head=4, n_head_kv=2, head_dim=32, n_ff=32, n_layer=4, n_expert=8,
                n_expert_used=4, n_ff_exp=32, router_gain=4.0, router_bias_std=0.2, code_scale=2.0, eps=1e-5,
                rope_base=150000.0, sliding_window=8, yarn_factor=32.0, yarn_orig_ctx=4096, sink_mean=1.0,
                sink_std=1.5, exp_gain=4.0, exp_down_gain=0.05, tied=False, bos=None, n_ctx_train=131072),
        model={"layer_kinds": ["sliding_attention", "full_attention"] * 2,
               "layer_kind_rule": "llama.cpp load_swa_pattern(ml, 2) with no pattern key: layer il slides iff il % 2 < 1",
               "sliding_window": 8,
               "sliding_window_rule": "key position p0 is visible from query position p1 iff 0 <= p1 - p0 < sliding_window",
               "rope": {"type": "NEOX", "n_rot": 32, "freq_base": 150000.0,
                        "scaling": "yarn factor 32, original context 4096, ext_factor 1, beta_fast 32, beta_slow 1; "
                                   "cos/sin x (1 + 0.1 ln 32) on both layer kinds"},
               "attention": "q/k/v biases; scale 1/sqrt(n_rot); per-head sink logit attn_sinks in the softmax "
                            "denominator; attn_output with bias",
               "ffn_norm_tensor": "post_attention_norm.weight",
               "ffn": "l = ffn_gate_inp h + ffn_gate_inp.bias; the 4 largest l of 8, weights softmax over those 4 "
                      "(SOFTMAX_WEIGHT, no renormalization); f = sum_e w_e (ffn_down_exps[e] a + b_down[e]), "
                      "a = swiglu_oai(ffn_gate_exps[e] h + b_gate[e], ffn_up_exps[e] h + b_up[e]): x = min(g, 7), "
                      "y = clamp(u, -7, 7), a = x sigmoid(1.702 x) (y + 1)",
               "tied_embeddings": False}),
    "qwen3vl": dict(
        spec=spec_qwen3vl, arch="qwen3vl", seed=1018, quant="Q4_0",
        hp=dict(BASE, n_embd=64, n_head=4, n_head_kv=2, head_dim=32, n_ff=128, n_layer=4, eps=1e-6,
                rope_base=10000.0, rope_sections=[4, 2, 2, 0], n_deepstack=2, tied=False, bos=None),
        model={"layer_kinds": ["full_attention"] * 4,
               "rope": {"type": "IMROPE (ggml_rope_multi, pairs x[i], x[i + n_rot/2])", "n_rot": 32,
                        "freq_base": 10000.0, "sections": [4, 2, 2, 0],
                        "text_positions": "(p, p, p, 0): the 16 pairs are sectors i % 8, t h w t h w t e; "
                                          "pairs 7 and 15 turn by the fourth component, 0 for text"},
               "qk_norm": "RMSNorm over head_dim with weight, before RoPE",
               "deepstack": "n_deepstack_layers 2: text rows carry no features (llama.cpp pads them with 0)",
               "tied_embeddings": False, "ffn": "SiLU-gated"}),
    "qwen3vlmoe": dict(
        spec=spec_qwen3vlmoe, arch="qwen3vlmoe", seed=1019, quant="Q4_0", check=router_check(reference_qwen3moe),
        hp=dict(BASE, n_embd=64, n_head=4, n_head_kv=2, head_dim=32, n_ff=128, n_layer=4, n_expert=8,
                n_expert_used=2, n_ff_exp=32, router_gain=4.0, code_scale=2.0, eps=1e-6, rope_base=10000.0,
                rope_sections=[4, 2, 2, 0], n_deepstack=1, tied=False, bos=None),
        model={"layer_kinds": ["full_attention"] * 4,
               "rope": {"type": "IMROPE, as qwen3vl's", "n_rot": 32, "freq_base": 10000.0, "sections": [4, 2, 2, 0]},
               "qk_norm": "RMSNorm over head_dim with weight, before RoPE",
               "ffn": "qwen3moe's: p = softmax(ffn_gate_inp h) over all 8 experts; the 2 largest, weights "
                      "renormalized; no shared expert",
               "deepstack": "n_deepstack_layers 1 (no effect on text)",
               "tied_embeddings": False}),
    "nanbeige": dict(
        spec=spec_nanbeige, arch="nanbeige", seed=1009, quant="Q8_0",
        hp=dict(BASE, n_embd=64, n_head=4, n_head_kv=2, head_dim=16, n_ff=128, n_layer=3, num_loops=2,
                eps=1e-6, rope_base=10000.0, tied=False, bos=1),
        model={"layer_kinds": ["full_attention"] * 3, "num_loops": 2,
               "loops": "the 3 stored layers run 2 times (6 logical layers, each with its own KV cache); "
                        "between loops (not after the last) the hidden state goes through output_norm",
               "rope": {"type": "NORM (adjacent pairs x[2i], x[2i+1])", "n_rot": 16, "freq_base": 10000.0},
               "tied_embeddings": False, "ffn": "SiLU-gated"}),
    "gemma-embedding": dict(
        spec=spec_gemma_embedding, arch="gemma-embedding", seed=1012, quant="Q8_0", embedding=True,
        hp=dict(BASE, n_embd=64, n_head=4, n_head_kv=2, head_dim=16, n_ff=128, n_layer=4, dense=96,
                pattern=3, window=8, eps=1e-6, rope_base=1000000.0, rope_base_swa=10000.0, tied=True, bos=2),
        model={"layer_kinds": "SSFS (sliding_window_pattern 3), window 8: a sliding layer sees |i - j| <= 4",
               "attention": "bidirectional (causal_attn = false); scale 1/sqrt(head_dim); q/k RMSNorm before NEOX RoPE",
               "body": "gemma3's: sandwich norms, GELU(tanh)-gated FFN, embeddings x sqrt(n_embd)",
               "pooling": "mean over the output_norm'ed hidden states (pooling_type 1), then dense_2 [96x64] "
                          "and dense_3 [64x96], no bias, no activation",
               "tied_embeddings": True}),
}


# ---------------------------------------------------------------- writing


def make_tensors(tensors, seed):
    rng = np.random.default_rng(seed)
    out = []
    for name, init in tensors:
        if init[0] == "const":
            out.append((name, init[1]))
        elif init[0] == "uniform":  # ("uniform", shape, lo, hi, sign)
            _, shape, lo, hi, sign = init
            out.append((name, (sign * rng.uniform(lo, hi, size=shape)).astype(np.float32)))
        elif init[0] == "routing_code":
            out.append((name, None))
        else:
            # times: an optional array the draw is multiplied by; plus: one then added
            _, shape, std, mean, *rest = init
            z = rng.standard_normal(shape)
            x = mean + std * z
            x = x.astype(np.float32)
            if rest:
                x = x * rest[0].astype(np.float32)
            if len(rest) > 1:
                x = x + rest[1].astype(np.float32)
            out.append((name, x))
        if init[0] == "routing_code":  # ("routing_code", shape, std, n_code, scale): see routing_code()
            _, shape, std, n_code, scale = init
            x = std * rng.standard_normal(shape)
            for row in x:
                row[:n_code] = scale * (rng.permutation(n_code) + 1) / n_code
            out[-1] = (name, x.astype(np.float32))
    return out


def fixture_tokens(bos, rng=None):
    """The N_TOKENS ids every fixture shares (TOKEN_SEED's stream, or `rng` to keep drawing
    from it), position 0 replaced by the family's BOS id where the family adds one."""
    rng = np.random.default_rng(TOKEN_SEED) if rng is None else rng
    tokens = rng.integers(3, N_VOCAB, size=N_TOKENS).tolist()
    if bos is not None:
        tokens[0] = bos
    return tokens


def write_gguf(path, arch, keys, tensors):
    wr = gguf.GGUFWriter(str(path), arch)
    for k, v, t in keys:
        if t == gguf.GGUFValueType.STRING:
            wr.add_string(k, v)
        elif t == gguf.GGUFValueType.UINT32:
            wr.add_uint32(k, int(v))
        elif t == gguf.GGUFValueType.FLOAT32:
            wr.add_float32(k, float(v))
        elif t == gguf.GGUFValueType.BOOL:
            wr.add_bool(k, bool(v))
        elif t == gguf.GGUFValueType.ARRAY:
            wr.add_array(k, v)  # a list of ints is written as INT32 by gguf-py
        else:
            raise ValueError(f"metadata {k}: type {t} not handled")
    wr.add_file_type(gguf.LlamaFileType.ALL_F32)
    for name, arr in tensors:
        wr.add_tensor(name, arr)
    wr.write_header_to_file()
    wr.write_kv_data_to_file()
    wr.write_tensors_to_file()
    wr.close()


def sha256(path):
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def describe_gguf(path):
    r = gguf.GGUFReader(str(path))
    tensors, counts = [], {}
    for t in r.tensors:
        ty = t.tensor_type.name
        counts[ty] = counts.get(ty, 0) + 1
        tensors.append({"name": t.name, "type": ty, "shape_ggml": [int(x) for x in t.shape],
                        "n_bytes": int(t.n_bytes)})
    return {"sha256": sha256(path), "size_bytes": Path(path).stat().st_size,
            "tensor_type_counts": counts, "tensors": tensors}


def read_metadata(path):
    """Every key/value as written (floats as their float32 values)."""
    out = {}
    for k, f in gguf.GGUFReader(str(path)).fields.items():
        if not k.startswith("GGUF."):
            v = f.contents()
            out[k] = v.tolist() if hasattr(v, "tolist") else v
    return out


def compare(a, b):
    a, b = a.astype(np.float64), b.astype(np.float64)
    d = np.abs(a - b)
    m = float(np.max(np.abs(a)))
    cos = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
    return {"max_abs_diff": float(d.max()), "max_abs_diff_rel_to_max_abs_logit": float(d.max() / m),
            "mean_abs_diff": float(d.mean()),
            "top1_agreement": float(np.mean(a.argmax(1) == b.argmax(1))),
            "min_cosine": float(np.float32(cos.min())), "mean_cosine": float(np.float32(cos.mean()))}


def stats(l):
    top = np.sort(l, axis=1)
    return {"stats": {"max_abs_logit": float(np.abs(l).max()), "mean_row_std": float(l.std(1).mean()),
                      "distinct_argmax": int(len(set(l.argmax(1).tolist()))), "finite": bool(np.isfinite(l).all())},
            "top1": l.argmax(1).tolist(),
            "top1_margin": [round(float(x), 5) for x in top[:, -1] - top[:, -2]]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("family", choices=sorted(FAMILIES))
    ap.add_argument("out", type=Path)
    ap.add_argument("--bin-dir", type=Path, required=True, help="llama.cpp's bin directory (llama-quantize)")
    ap.add_argument("--driver", type=Path, required=True, help="the built gen-fixtures-driver")
    ap.add_argument("--compare", type=Path, help="a fixture directory to compare every file with")
    a = ap.parse_args()

    fam = FAMILIES[a.family]
    hp = dict(fam["hp"], family=a.family)
    q = fam["quant"]
    out = a.out
    out.mkdir(parents=True, exist_ok=True)

    keys, specs, *order = fam["spec"](hp)  # order: the file's tensor order when it is not the draw order
    tensors = make_tensors(specs, fam["seed"])
    if order:
        tensors = [dict(tensors)[name] for name in order[0]]
        tensors = list(zip(order[0], tensors))
    write_gguf(out / "f32.gguf", fam["arch"], keys, tensors)

    def run(args):
        subprocess.run(args, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    quantize = str(a.bin_dir / "llama-quantize")
    run([quantize, str(out / "f32.gguf"), str(out / f"{q}.gguf"), q])
    dequant = out / f"{q}.dequant.tmp.gguf"
    run([quantize, "--allow-requantize", str(out / f"{q}.gguf"), str(dequant), "F32"])

    token_rng = np.random.default_rng(TOKEN_SEED)
    tokens = fixture_tokens(hp["bos"], token_rng)
    if fam.get("embedding"):
        return embedding_fixture(a, fam, hp, out, tokens, dequant)
    note = "same random ids for every family; position 0 replaced by the family's BOS id where the family adds one"
    extra = ""
    sequences = {"tokens": tokens}
    if fam.get("tokens2_block"):
        # BOS + the next block of ids from the same stream, repeated to N_TOKENS: a repeat
        # distance past the sliding window, so sliding and full layers see different things.
        block = token_rng.integers(3, N_VOCAB, size=fam["tokens2_block"]).tolist()
        sequences["tokens2"] = ([hp["bos"]] + block * N_TOKENS)[:N_TOKENS]
        extra = (f',\n "tokens2": {json.dumps(sequences["tokens2"])},\n "tokens2_note": '
                 f'"BOS + a block of {len(block)} ids repeated: the repeat distance exceeds the sliding window ({hp["sliding_window"]})"')
    (out / "tokens.json").write_text(
        "{\n"
        f' "tokens": {json.dumps(tokens)},\n'
        f' "bos_prepended": {json.dumps(hp["bos"] is not None)},\n'
        f' "bos_id": {json.dumps(hp["bos"])},\n'
        f' "note": {json.dumps(note)}{extra}\n'
        "}\n")

    def logits(mode, model, name, toks):
        run([str(a.driver), mode, str(model), str(out / name)] + [str(t) for t in toks])
        return np.fromfile(out / name, dtype="<f4").reshape(len(toks), -1)

    def load(name, shape):
        return np.fromfile(out / name, "<f4").reshape(shape)

    runs = {}
    for seq, toks in sequences.items():
        x = "" if seq == "tokens" else f".{seq}"
        for wname, model in (("f32", out / "f32.gguf"), (q, out / f"{q}.gguf")):
            b = logits("batch", model, f"{wname}{x}.logits.bin", toks)
            s = logits("sequential", model, f"{wname}{x}.sequential.logits.bin", toks)
            k = logits("kvf16", model, f"{wname}{x}.kvf16.logits.bin", toks)
            r = dict(weights=model.name, token_sequence=seq, n_tokens=len(toks),
                     files={"batch": f"{wname}{x}.logits.bin", "sequential": f"{wname}{x}.sequential.logits.bin",
                            "default_ctx_kvf16": f"{wname}{x}.kvf16.logits.bin"},
                     **stats(b), batch_vs_sequential=compare(b, s),
                     batch_f32kv_vs_default_f16kv_fa_auto=compare(b, k))
            if x:
                runs[wname][seq] = r
            else:
                runs[wname] = r
        dq = logits("batch", dequant, f"{q}{x}.dequant.logits.bin", toks)
        rq = runs[q][seq] if x else runs[q]
        rq["files"]["dequant_f32_batch"] = f"{q}{x}.dequant.logits.bin"
        rq["quant_vs_dequant_f32"] = compare(load(f"{q}{x}.logits.bin", dq.shape), dq)
        rq["f32_vs_quant"] = compare(load(f"f32{x}.logits.bin", dq.shape), load(f"{q}{x}.logits.bin", dq.shape))
    check = None
    if fam.get("check"):
        check = fam["check"](out, hp, tokens, load("f32.logits.bin", (len(tokens), -1)), dequant,
                             load(f"{q}.dequant.logits.bin", (len(tokens), -1)))
    dequant.unlink()

    sysinfo = subprocess.run([str(a.driver), "sysinfo"], check=True, capture_output=True, text=True).stdout.strip()
    meta = {
        "family": a.family, "arch": fam["arch"], "seed": fam["seed"], "n_vocab": hp["n_vocab"],
        "hparams": {k: v for k, v in hp.items() if k != "family"},
        "gguf_metadata_f32": read_metadata(out / "f32.gguf"),
        "model": fam["model"], "tokens": "tokens.json", "quant_type": q,
        "files": {"f32.gguf": describe_gguf(out / "f32.gguf"), f"{q}.gguf": describe_gguf(out / f"{q}.gguf")},
        "llama_cpp": {"commit": "0c1e57098bba43ac29e6e3b677cdceebdd22334f",
                      "source": "llama.cpp vendored in the PyPI sdist llama-cpp-python 0.3.36, built by scripts/build-llamacpp.sh",
                      "system_info": sysinfo, "backend": "CPU only (ggml-cpu), 2 threads"},
        "method": {
            "generator": f"scripts/gen-fixtures.sh {a.family} (gguf-py {gguf.__version__ if hasattr(gguf, '__version__') else ''}, "
                         f"numpy {np.__version__}; weights from one default_rng({fam['seed']}) stream in tensor order)",
            "batch": "one llama_decode call with all tokens at positions 0..n-1, seq 0, logits requested for every token; n_ctx = n_batch = n_ubatch = 128, n_threads = 2, KV cache F32 (type_k = type_v = F32), flash attention disabled; fresh context",
            "sequential": "fresh context, one llama_decode call per token (positions 0..n-1), same settings as batch",
            "default_ctx_kvf16": "one llama_decode call, llama.cpp's default context parameters except n_ctx/n_batch/n_ubatch/threads: KV cache F16 and flash_attn_type AUTO (on CPU this enables flash attention)",
            "quantize": f"llama-quantize f32.gguf {q}.gguf {q} (same build), default tensor-type rules",
            "dequant_f32_batch": f"llama-quantize --allow-requantize {q}.gguf -> F32 (ggml's own dequantization), then the batch run",
        },
        "runs": runs,
    }
    if check is not None:
        meta["numpy_float64_reference_check"] = check
    (out / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")

    if a.compare:
        sys.exit(compare_dirs(out, a.compare, q))


# The sequences of an embedding fixture: cuts of the shared 40 ids, each
# starting with BOS; lengths chosen below, at and above the sliding window.
EMBED_CUTS = [(0, 20), (20, 27), (27, 40)]


def embedding_fixture(a, fam, hp, out, tokens, dequant):
    """An embedding model's fixture: llama.cpp's pooled embedding per sequence."""
    q = fam["quant"]
    seqs = [[hp["bos"]] + tokens[s:e][1 if s == 0 else 0:] for s, e in EMBED_CUTS]
    (out / "tokens.json").write_text(json.dumps({
        "sequences": seqs,
        "note": "cuts of the shared random ids (default_rng(4242)), each led by the BOS id; one pooled embedding each"},
        indent=1) + "\n")
    args = []
    for sq in seqs:
        args += [str(t) for t in sq] + ["/"]
    args = args[:-1]

    def embeddings(model, name):
        subprocess.run([str(a.driver), "embed", str(model), str(out / name)] + args, check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        return np.fromfile(out / name, dtype="<f4").reshape(len(seqs), -1)

    f = embeddings(out / "f32.gguf", "f32.embeddings.bin")
    qe = embeddings(out / f"{q}.gguf", f"{q}.embeddings.bin")
    dq = embeddings(dequant, f"{q}.dequant.embeddings.bin")
    dequant.unlink()

    def cos(x, y):
        return [float(np.float32(v)) for v in (x * y).sum(1) / np.linalg.norm(x, axis=1) / np.linalg.norm(y, axis=1)]

    sysinfo = subprocess.run([str(a.driver), "sysinfo"], check=True, capture_output=True, text=True).stdout.strip()
    meta = {
        "family": a.family, "arch": fam["arch"], "seed": fam["seed"], "n_vocab": hp["n_vocab"],
        "hparams": {k: v for k, v in hp.items() if k != "family"},
        "gguf_metadata_f32": read_metadata(out / "f32.gguf"),
        "model": fam["model"], "tokens": "tokens.json", "quant_type": q,
        "files": {"f32.gguf": describe_gguf(out / "f32.gguf"), f"{q}.gguf": describe_gguf(out / f"{q}.gguf")},
        "llama_cpp": {"commit": "0c1e57098bba43ac29e6e3b677cdceebdd22334f",
                      "source": "llama.cpp vendored in the PyPI sdist llama-cpp-python 0.3.36, built by scripts/build-llamacpp.sh",
                      "system_info": sysinfo, "backend": "CPU only (ggml-cpu), 2 threads"},
        "method": {
            "embed": "per sequence: one llama_decode call with all its tokens at positions 0..n-1, embeddings on, the "
                     "model's pooling; llama_get_embeddings_seq (pooled, through dense_2/dense_3, NOT normalized), "
                     "[n_sequences][n_embd] float32; KV F32, flash attention off, n_ctx 128, 2 threads",
            "quantize": f"llama-quantize f32.gguf {q}.gguf {q} (same build)",
            "dequant": f"llama-quantize --allow-requantize {q}.gguf -> F32, then the same run",
        },
        "runs": {"files": {"f32": "f32.embeddings.bin", q: f"{q}.embeddings.bin",
                           "dequant": f"{q}.dequant.embeddings.bin"},
                 "f32_vs_quant_cosine": cos(f, qe), "quant_vs_dequant_cosine": cos(qe, dq),
                 "norms_f32": [float(np.float32(x)) for x in np.linalg.norm(f, axis=1)]},
    }
    (out / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    if a.compare:
        sys.exit(compare_dirs(out, a.compare, q))


def compare_dirs(new, old, q):
    """Bytes for GGUFs, tokens and logits; sha256 and tensor types for meta.json's files."""
    bad = 0
    for p in sorted(new.iterdir()):
        o = old / p.name
        if p.name == "meta.json":
            mn, mo = json.loads(p.read_text()), json.loads(o.read_text())
            for key in ("hparams", "gguf_metadata_f32", "seed", "quant_type"):
                same = mn[key] == mo[key]
                bad += not same
                print(f"{'same' if same else 'DIFFERENT'}  meta.json:{key}")
            for f in mn["files"]:
                same = mn["files"][f] == mo["files"][f]
                bad += not same
                print(f"{'same' if same else 'DIFFERENT'}  meta.json:files.{f} (sha256, tensor types)")
            continue
        if not o.exists():
            print(f"NEW        {p.name} (not in {old})")
            continue
        if p.name == "tokens.json":
            tn, to = json.loads(p.read_text()), json.loads(o.read_text())
            same = all(tn.get(k) == to.get(k) for k in ("tokens", "tokens2"))
        else:
            same = p.read_bytes() == o.read_bytes()
        bad += not same
        extra = ""
        if not same and p.suffix == ".bin":
            d = np.abs(np.fromfile(p, "<f4") - np.fromfile(o, "<f4")).max()
            extra = f" (max |diff| {d:.3g})"
        print(f"{'same' if same else 'DIFFERENT'}  {p.name}{extra}")
    return 1 if bad else 0


if __name__ == "__main__":
    main()
