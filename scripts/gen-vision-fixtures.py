#!/usr/bin/env python3
"""Writes one llama.cpp vision fixture: a tiny seeded random-weight text
model (with a small SentencePiece vocabulary llama.cpp can tokenize, holding
the image markers), its seeded random-weight mmproj GGUF, a fixed image at
the encoder's own size, and what llama.cpp's mtmd makes of one prompt holding
that image: the image embeddings and the logits of every text position. The
layout is testdata/llamacpp/README.md's ("Vision towers"); run it through
scripts/gen-vision-fixtures.sh, which pins the Python packages and builds the
libmtmd driver (scripts/gen-vision-driver.c).

    scripts/gen-vision-fixtures.sh TOWER OUT_DIR

TOWER is a key of TOWERS below. Beside llama.cpp's embeddings it writes an
independent float64 NumPy forward of the tower with exact tanh-GELU
(`numpy.embd.bin`), so a test can tell llama.cpp's own rounding (GELU from
an F16 table) from a real difference.

Not part of CI: it needs llama.cpp built by scripts/build-llamacpp.sh.
"""

import argparse
import json
import math
import subprocess
from pathlib import Path

import numpy as np
import gguf

from load_script import gen_fixtures

gf = gen_fixtures()

U32, F32, STR, BOOL, ARR = (gguf.GGUFValueType.UINT32, gguf.GGUFValueType.FLOAT32, gguf.GGUFValueType.STRING,
                            gguf.GGUFValueType.BOOL, gguf.GGUFValueType.ARRAY)

# ---------------------------------------------------------------- vocabulary
#
# A SentencePiece ("llama") vocabulary of N_VOCAB pieces: the four special
# tokens, the two image markers (CONTROL, so parse_special matches them),
# the 256 byte pieces (every text tokenizes, by byte fallback at worst), then
# "▁" and letters and a few words, scored so longer pieces win.

SPECIAL = ["<pad>", "<eos>", "<bos>", "<unk>"]
WORDS = ["▁", *"abcdefghijklmnopqrstuvwxyz", "▁a", "▁i", "▁o", "▁t", "▁s", "▁w", "▁h", "▁d", "▁l", "▁is",
         "▁the", "▁this", "▁what", "▁look", "▁here", "▁image", "▁describe", "▁it", "ok", "hi", "▁ok", "▁hi", "."]


def vocab(n_vocab, markers=("<start_of_image>", "<end_of_image>")):
    toks = list(SPECIAL) + list(markers) + [f"<0x{b:02X}>" for b in range(256)] + WORDS
    types = [3, 3, 3, 2, 3, 3] + [6] * 256 + [1] * len(WORDS)
    while len(toks) < n_vocab:
        toks.append(f"<unused{len(toks)}>")
        types.append(5)
    assert len(toks) == n_vocab, len(toks)
    scores = [0.0] * (len(SPECIAL) + 2) + [0.0] * 256 + [-10.0 + len(t) for t in WORDS]
    scores += [-100.0] * (n_vocab - len(scores))
    return [("tokenizer.ggml.model", "llama", STR), ("tokenizer.ggml.tokens", toks, ARR),
            ("tokenizer.ggml.scores", scores, ARR), ("tokenizer.ggml.token_type", types, ARR),
            ("tokenizer.ggml.eos_token_id", 1, U32), ("tokenizer.ggml.unknown_token_id", 3, U32),
            ("tokenizer.ggml.padding_token_id", 0, U32), ("tokenizer.ggml.add_eos_token", False, BOOL)]


def text_spec(hp):
    """gen-fixtures.py's gemma3 text model, its "none" tokenizer replaced by vocab()."""
    keys, tensors = gf.spec_gemma3(hp)
    keys = [k for k in keys if k[0] != "tokenizer.ggml.model"]
    return keys + vocab(hp["n_vocab"]), tensors


def text_spec_qwen3vl(hp):
    """gen-fixtures.py's qwen3vl (the qwen3 body as llama.cpp's qwen3vl arch,
    src/models/qwen3vl.cpp: IMROPE sections and the deepstack count), the Qwen-VL image
    markers in the vocabulary."""
    keys, tensors = gf.spec_qwen3vl(hp)
    keys = [k for k in keys if k[0] != "tokenizer.ggml.model"]
    return keys + vocab(hp["n_vocab"], ("<|vision_start|>", "<|vision_end|>")), tensors


def text_spec_qwen35(hp):
    """gen-fixtures.py's qwen35 (gated delta-net and gated attention layers, IMROPE on the
    attention layers: llama.cpp's QWEN35 rope type), the Qwen-VL image markers in the
    vocabulary: the text side of Qwen3.5's vision checkpoints (no deepstack)."""
    keys, tensors = gf.spec_qwen35(hp)
    keys = [k for k in keys if k[0] != "tokenizer.ggml.model"]
    return keys + vocab(hp["n_vocab"], ("<|vision_start|>", "<|vision_end|>")), tensors


# ---------------------------------------------------------------- towers


def spec_gemma3_tower(vp, n_text):
    """llama.cpp's mmproj for projector gemma3 (tools/mtmd/clip-impl.h names)."""
    e, ff, p, L = vp["n_embd"], vp["n_ff"], vp["patch_size"], vp["n_layer"]
    n_patches = (vp["image_size"] // p) ** 2
    keys = [("clip.projector_type", "gemma3", STR), ("clip.has_vision_encoder", True, BOOL),
            ("clip.use_gelu", True, BOOL),
            ("clip.vision.image_size", vp["image_size"], U32), ("clip.vision.patch_size", p, U32),
            ("clip.vision.embedding_length", e, U32), ("clip.vision.feed_forward_length", ff, U32),
            ("clip.vision.projection_dim", n_text, U32), ("clip.vision.block_count", L, U32),
            ("clip.vision.attention.head_count", vp["n_head"], U32),
            ("clip.vision.attention.layer_norm_epsilon", vp["eps"], F32),
            ("clip.vision.image_mean", vp["mean"], ARR), ("clip.vision.image_std", vp["std"], ARR)]
    t = [("v.patch_embd.weight", ("normal", (e, 3, p, p), 1 / math.sqrt(3 * p * p), 0.0)),
         ("v.patch_embd.bias", gf.vec(e, 0.1)),
         ("v.position_embd.weight", ("normal", (n_patches, e), 0.5, 0.0))]
    for i in range(L):
        b = f"v.blk.{i}."
        t += [(b + "ln1.weight", gf.norm(e)), (b + "ln1.bias", gf.vec(e, 0.1)),
              (b + "attn_q.weight", gf.w(e, e)), (b + "attn_q.bias", gf.vec(e, 0.1)),
              (b + "attn_k.weight", gf.w(e, e)), (b + "attn_k.bias", gf.vec(e, 0.1)),
              (b + "attn_v.weight", gf.w(e, e)), (b + "attn_v.bias", gf.vec(e, 0.1)),
              (b + "attn_out.weight", gf.w(e, e, 0.5)), (b + "attn_out.bias", gf.vec(e, 0.1)),
              (b + "ln2.weight", gf.norm(e)), (b + "ln2.bias", gf.vec(e, 0.1)),
              (b + "ffn_up.weight", gf.w(ff, e)), (b + "ffn_up.bias", gf.vec(ff, 0.1)),
              (b + "ffn_down.weight", gf.w(e, ff, 0.5)), (b + "ffn_down.bias", gf.vec(e, 0.1))]
    t += [("v.post_ln.weight", gf.norm(e)), ("v.post_ln.bias", gf.vec(e, 0.1)),
          ("mm.soft_emb_norm.weight", gf.norm(e)),
          # NumPy [n_embd_v][n_text]: ggml [n_text, n_embd_v], used transposed by siglip.cpp.
          ("mm.input_projection.weight", ("normal", (e, n_text), 1 / math.sqrt(e), 0.0))]
    return keys, t


def spec_qwen3vl_tower(vp, n_text):
    """llama.cpp's mmproj for projector qwen3vl_merger (conversion/qwen3vl.py names)."""
    e, ff, p, L = vp["n_embd"], vp["n_ff"], vp["patch_size"], vp["n_layer"]
    side = vp["image_size"] // p
    keys = [("clip.projector_type", "qwen3vl_merger", STR), ("clip.has_vision_encoder", True, BOOL),
            ("clip.use_gelu", True, BOOL),
            ("clip.vision.image_size", vp["image_size"], U32), ("clip.vision.patch_size", p, U32),
            ("clip.vision.embedding_length", e, U32), ("clip.vision.feed_forward_length", ff, U32),
            ("clip.vision.projection_dim", n_text, U32), ("clip.vision.block_count", L, U32),
            ("clip.vision.attention.head_count", vp["n_head"], U32),
            ("clip.vision.attention.layer_norm_epsilon", vp["eps"], F32),
            ("clip.vision.image_mean", vp["mean"], ARR), ("clip.vision.image_std", vp["std"], ARR),
            ("clip.vision.spatial_merge_size", 2, U32),
            ("clip.vision.is_deepstack_layers", [i in vp["deepstack"] for i in range(L)], ARR)]
    g = 1 / math.sqrt(2 * 3 * p * p)
    t = [("v.patch_embd.weight", ("normal", (e, 3, p, p), g, 0.0)),
         ("v.patch_embd.weight.1", ("normal", (e, 3, p, p), g, 0.0)),
         ("v.patch_embd.bias", gf.vec(e, 0.1)),
         ("v.position_embd.weight", ("normal", (side * side, e), 0.5, 0.0))]
    for i in range(L):
        b = f"v.blk.{i}."
        t += [(b + "ln1.weight", gf.norm(e)), (b + "ln1.bias", gf.vec(e, 0.1)),
              (b + "attn_qkv.weight", gf.w(3 * e, e)), (b + "attn_qkv.bias", gf.vec(3 * e, 0.1)),
              (b + "attn_out.weight", gf.w(e, e, 0.5)), (b + "attn_out.bias", gf.vec(e, 0.1)),
              (b + "ln2.weight", gf.norm(e)), (b + "ln2.bias", gf.vec(e, 0.1)),
              (b + "ffn_up.weight", gf.w(ff, e)), (b + "ffn_up.bias", gf.vec(ff, 0.1)),
              (b + "ffn_down.weight", gf.w(e, ff, 0.5)), (b + "ffn_down.bias", gf.vec(e, 0.1))]
        if i in vp["deepstack"]:
            d = f"v.deepstack.{i}."
            t += [(d + "norm.weight", gf.norm(4 * e)), (d + "norm.bias", gf.vec(4 * e, 0.1)),
                  (d + "fc1.weight", gf.w(4 * e, 4 * e)), (d + "fc1.bias", gf.vec(4 * e, 0.1)),
                  (d + "fc2.weight", gf.w(n_text, 4 * e)), (d + "fc2.bias", gf.vec(n_text, 0.1))]
    t += [("v.post_ln.weight", gf.norm(e)), ("v.post_ln.bias", gf.vec(e, 0.1)),
          ("mm.0.weight", gf.w(4 * e, 4 * e)), ("mm.0.bias", gf.vec(4 * e, 0.1)),
          ("mm.2.weight", gf.w(n_text, 4 * e)), ("mm.2.bias", gf.vec(n_text, 0.1))]
    return keys, t


def reference_qwen3vl_tower(t, vp, pixels):
    """float64 NumPy: qwen3vl.cpp's forward, exact tanh-GELU, for any image size."""
    t = {k: v.astype(np.float64) for k, v in t.items()}
    e, p, nh, eps = vp["n_embd"], vp["patch_size"], vp["n_head"], vp["eps"]
    _, hgt, wid = pixels.shape
    ph, pw = hgt // p, wid // p
    patches = pixels.astype(np.float64).reshape(3, ph, p, pw, p).transpose(1, 3, 0, 2, 4).reshape(ph, pw, -1)
    kern = (t["v.patch_embd.weight"] + t["v.patch_embd.weight.1"]).reshape(e, -1)
    grid = patches @ kern.T + t["v.patch_embd.bias"]  # [ph][pw][e]
    s = int(round(math.sqrt(t["v.position_embd.weight"].shape[0])))
    pos = t["v.position_embd.weight"].reshape(s, s, e)
    if (ph, pw) != (s, s):  # bilinear, aligned corners
        ys = np.arange(ph) * ((s - 1) / (ph - 1) if ph > 1 else s / ph)
        xs = np.arange(pw) * ((s - 1) / (pw - 1) if pw > 1 else s / pw)
        y0 = np.clip(np.floor(ys).astype(int), 0, s - 1); y1 = np.clip(y0 + 1, 0, s - 1)
        x0 = np.clip(np.floor(xs).astype(int), 0, s - 1); x1 = np.clip(x0 + 1, 0, s - 1)
        dy = np.clip(ys - y0, 0, 1)[:, None, None]; dx = np.clip(xs - x0, 0, 1)[None, :, None]
        pos = (pos[y0][:, x0] * (1 - dx) * (1 - dy) + pos[y0][:, x1] * dx * (1 - dy)
               + pos[y1][:, x0] * (1 - dx) * dy + pos[y1][:, x1] * dx * dy)
    grid = grid + pos
    order = [(2 * by + dy_, 2 * bx + dx_) for by in range(ph // 2) for bx in range(pw // 2)
             for dy_ in range(2) for dx_ in range(2)]
    x = np.stack([grid[y, xx] for y, xx in order])
    dh = e // nh
    q4 = dh // 4
    inv = 10000.0 ** (-4.0 * np.arange(q4) / dh)
    ang = np.array([np.concatenate([y * inv, xx * inv]) for y, xx in order])  # [n][dh/2]
    cos, sin = np.cos(ang), np.sin(ang)

    def rope(v):  # v [n][dh]: pairs (j, j + dh/2)
        a, b = v[:, :dh // 2], v[:, dh // 2:]
        return np.concatenate([a * cos - b * sin, a * sin + b * cos], 1)

    feats = []
    for i in range(vp["n_layer"]):
        b = lambda n: t[f"v.blk.{i}.{n}"]  # noqa: E731
        h = layer_norm(x, b("ln1.weight"), b("ln1.bias"), eps)
        qkv = h @ b("attn_qkv.weight").T + b("attn_qkv.bias")
        heads = []
        for hh in range(nh):
            q = rope(qkv[:, hh * dh:(hh + 1) * dh])
            k = rope(qkv[:, e + hh * dh:e + (hh + 1) * dh])
            v = qkv[:, 2 * e + hh * dh:2 * e + (hh + 1) * dh]
            a = q @ k.T / math.sqrt(dh)
            a = np.exp(a - a.max(1, keepdims=True))
            heads.append((a / a.sum(1, keepdims=True)) @ v)
        x = x + np.concatenate(heads, 1) @ b("attn_out.weight").T + b("attn_out.bias")
        h = layer_norm(x, b("ln2.weight"), b("ln2.bias"), eps)
        x = x + gelu_tanh(h @ b("ffn_up.weight").T + b("ffn_up.bias")) @ b("ffn_down.weight").T + b("ffn_down.bias")
        if i in vp["deepstack"]:
            d = lambda n: t[f"v.deepstack.{i}.{n}"]  # noqa: E731
            f = layer_norm(x.reshape(-1, 4 * e), d("norm.weight"), d("norm.bias"), eps)
            feats.append(gelu_tanh(f @ d("fc1.weight").T + d("fc1.bias")) @ d("fc2.weight").T + d("fc2.bias"))
    x = layer_norm(x, t["v.post_ln.weight"], t["v.post_ln.bias"], eps).reshape(-1, 4 * e)
    main = gelu_tanh(x @ t["mm.0.weight"].T + t["mm.0.bias"]) @ t["mm.2.weight"].T + t["mm.2.bias"]
    return np.concatenate([main] + feats, 1)


def gelu_tanh(x):
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))


def layer_norm(x, w, b, eps):
    m = x.mean(-1, keepdims=True)
    v = ((x - m) ** 2).mean(-1, keepdims=True)
    return (x - m) / np.sqrt(v + eps) * w + b


def reference_gemma3_tower(t, vp, pixels):
    """float64 NumPy: the SigLIP forward of siglip.cpp (gemma3), exact tanh-GELU."""
    t = {k: v.astype(np.float64) for k, v in t.items()}
    e, p, s, nh, eps = vp["n_embd"], vp["patch_size"], vp["image_size"], vp["n_head"], vp["eps"]
    side = s // p
    x = pixels.astype(np.float64).reshape(3, side, p, side, p).transpose(1, 3, 0, 2, 4).reshape(side * side, -1)
    x = x @ t["v.patch_embd.weight"].reshape(e, -1).T + t["v.patch_embd.bias"] + t["v.position_embd.weight"]
    dh = e // nh
    for i in range(vp["n_layer"]):
        b = lambda n: t[f"v.blk.{i}.{n}"]  # noqa: E731
        h = layer_norm(x, b("ln1.weight"), b("ln1.bias"), eps)
        q, k, v = (h @ b(f"attn_{n}.weight").T + b(f"attn_{n}.bias") for n in "qkv")
        heads = []
        for hh in range(nh):
            sl = slice(hh * dh, (hh + 1) * dh)
            a = q[:, sl] @ k[:, sl].T / math.sqrt(dh)
            a = np.exp(a - a.max(1, keepdims=True))
            heads.append((a / a.sum(1, keepdims=True)) @ v[:, sl])
        x = x + np.concatenate(heads, 1) @ b("attn_out.weight").T + b("attn_out.bias")
        h = layer_norm(x, b("ln2.weight"), b("ln2.bias"), eps)
        x = x + gelu_tanh(h @ b("ffn_up.weight").T + b("ffn_up.bias")) @ b("ffn_down.weight").T + b("ffn_down.bias")
    x = layer_norm(x, t["v.post_ln.weight"], t["v.post_ln.bias"], eps)
    k = vp.get("n_merge", 4)
    o = side // k
    x = x.reshape(o, k, o, k, e).mean((1, 3)).reshape(o * o, e)
    x = x / np.sqrt((x ** 2).mean(-1, keepdims=True) + eps) * t["mm.soft_emb_norm.weight"]
    return x @ t["mm.input_projection.weight"]


TEXT_HP = dict(gf.BASE, n_embd=64, n_head=2, n_head_kv=1, head_dim=32, n_ff=128, n_layer=6, eps=1e-6,
               embd_std=0.125, sliding_window=8, rope_base=1000000.0, rope_base_swa=10000.0,
               rope_linear_factor=8.0, bos=2, n_ctx_train=4096)

QWEN3VL_TEXT_HP = dict(gf.BASE, n_embd=64, n_head=4, n_head_kv=2, head_dim=16, n_ff=128, n_layer=4, eps=1e-6,
                       rope_base=10000.0, rope_sections=[4, 2, 2, 0], n_deepstack=2, bos=None, tied=False,
                       n_ctx_train=4096)

# gen-fixtures.py's qwen35 model, the RoPE base 100 so that the h and w pairs (1 and 2 of
# the 4 rotated, sections [1, 1, 1, 0]: t h w t) turn measurably across the image's grid.
QWEN35_TEXT_HP = dict(gf.FAMILIES["qwen35"]["hp"], rope_base=100.0, rope_sections=[1, 1, 1, 0], n_ctx_train=4096)

TOWERS = {
    "gemma3-vision": dict(
        text_seed=1101, tower_seed=1102, image_seed=1103, text_hp=TEXT_HP, spec=spec_gemma3_tower,
        reference=reference_gemma3_tower,
        # 16 x 16 patches of 2 x 2 pixels, pooled 4 x 4 (llama.cpp's default n_merge: no scale_factor key)
        # into 16 soft tokens: more than the text model's sliding window of 8.
        vp=dict(n_embd=32, n_ff=64, n_layer=2, n_head=2, image_size=32, patch_size=2, eps=1e-6,
                mean=[0.48, 0.5, 0.52], std=[0.26, 0.27, 0.28]),
        prompt="hi<__media__>what is this ok",
        # Two images (the first, then a second draw), two chunks: each image's rows
        # attend both ways among themselves only.
        prompt2="hi<__media__>ok<__media__>what is this",
        model={"projector": "gemma3 (tools/mtmd/models/siglip.cpp)",
               "patch_embedding": "conv2d p x p stride p as a matmul over (channel, row, column), + bias, + position_embd",
               "blocks": "pre-LN (LayerNorm + bias): attention (q/k/v/out with biases, scale 1/sqrt(head_dim), "
                         "every patch), GELU(tanh) MLP with biases",
               "post_ln": "LayerNorm + bias", "pooling": "average 4 x 4 over the row-major 16 x 16 grid",
               "soft_emb_norm": "RMSNorm (eps = layer_norm_epsilon) x mm.soft_emb_norm.weight",
               "projection": "mm.input_projection (ggml [n_text, n_embd_v], used transposed)",
               "text_attention": "the image chunk is decoded with causal attention off "
                                 "(mtmd_decode_use_non_causal): image rows see every image row, "
                                 "the sliding window still bounds what lies behind",
               "markers": "<start_of_image> before, <end_of_image> after (text tokens)"}),
    "qwen3vl-vision": dict(
        text_seed=1201, tower_seed=1202, image_seed=1203, text_hp=QWEN3VL_TEXT_HP, text_spec=text_spec_qwen3vl,
        text_arch="qwen3vl", spec=spec_qwen3vl_tower, reference=reference_qwen3vl_tower,
        # A rectangular image (48 wide, 32 high: 12 x 8 patches of 4 px, 6 x 4 tokens) against
        # a learned 8 x 8 position grid, so the grid is resized; 3 blocks, deepstack mergers
        # after blocks 0 and 2 (the text model adds them after its layers 0 and 1).
        vp=dict(n_embd=32, n_ff=64, n_layer=3, n_head=2, image_size=32, patch_size=4, eps=1e-6,
                mean=[0.48, 0.5, 0.52], std=[0.26, 0.27, 0.28], deepstack=[0, 2], width=48, height=32),
        prompt="hi<__media__>what is this ok", f16=False,
        # Two images, two chunks: the second image's positions and the text after it follow
        # from the first image's n_pos (max(nx, ny) = 6), not its 24 rows.
        prompt2="hi<__media__>ok<__media__>what is this",
        model={"projector": "qwen3vl_merger (tools/mtmd/models/qwen3vl.cpp)",
               "patch_embedding": "two p x p kernels (the temporal pair) summed, + bias; patches in 2 x 2 merge-block order",
               "position_embedding": "the 8 x 8 learned grid resized to 8 x 4 (bilinear, aligned corners)",
               "blocks": "pre-LN, fused qkv with bias, 2-D rotary (rows on the first quarter of pairs, columns on "
                         "the second, base 10000), GELU(tanh) MLP with biases",
               "deepstack": "after blocks 0 and 2: 4 patches side by side, LayerNorm, fc1, GELU, fc2",
               "merger": "post_ln per patch, 4 side by side, mm.0, GELU, mm.2; rows = [merger | deepstack 0 | "
                         "deepstack 2]",
               "text": "gen-fixtures.py's qwen3vl: IMROPE sections [4, 2, 2, 0] over 8 pairs (t h w t h w t e), "
                       "base 10000; text tokens at (p, p, p, 0); an image's token i at (p0, p0 + i / nx, "
                       "p0 + i % nx, 0) with nx = 6, ny = 4 and the text after it at p0 + max(nx, ny) "
                       "(mtmd MTMD_POS_TYPE_MROPE); n_deepstack_layers 2: deepstack feature k added to layer k's "
                       "output for the image rows (0 for text)",
               "attention": "causal (mtmd_decode_use_non_causal is false for qwen3vl); the M-RoPE KQ mask "
                            "(same t position: masked when the key's (y, x) is after the query's) is causal "
                            "in row order"}),
    "qwen35-vision": dict(
        text_seed=1301, tower_seed=1302, image_seed=1303, text_hp=QWEN35_TEXT_HP, text_spec=text_spec_qwen35,
        text_arch="qwen35", spec=spec_qwen3vl_tower, reference=reference_qwen3vl_tower,
        # qwen3vl-vision's tower without deepstack (Qwen3.5's mmproj has none), the same image size.
        vp=dict(n_embd=32, n_ff=64, n_layer=3, n_head=2, image_size=32, patch_size=4, eps=1e-6,
                mean=[0.48, 0.5, 0.52], std=[0.26, 0.27, 0.28], deepstack=[], width=48, height=32),
        prompt="hi<__media__>what is this ok", f16=False, prompt2="hi<__media__>ok<__media__>what is this",
        model={"projector": "qwen3vl_merger (tools/mtmd/models/qwen3vl.cpp), no deepstack",
               "merger": "post_ln per patch, 4 side by side, mm.0, GELU, mm.2; rows = the merger's output",
               "text": "gen-fixtures.py's qwen35 (8 layers LLLFLLLF: gated delta-net, gated attention), RoPE "
                       "base 100, IMROPE sections [1, 1, 1, 0] over the 4 rotated pairs (t h w t); text at "
                       "(p, p, p, 0), image token i at (p0, p0 + i / nx, p0 + i % nx, 0), nx = 6, ny = 4, the "
                       "text after it at p0 + 6 (mtmd MTMD_POS_TYPE_MROPE); the delta-net layers take the "
                       "image rows in order"}),
}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("tower", choices=sorted(TOWERS))
    ap.add_argument("out", type=Path)
    ap.add_argument("--driver", type=Path, required=True, help="the built gen-vision-driver")
    a = ap.parse_args()
    spec = TOWERS[a.tower]
    out = a.out
    out.mkdir(parents=True, exist_ok=True)
    hp = dict(spec["text_hp"], family=a.tower)
    keys, tensors = spec.get("text_spec", text_spec)(hp)
    gf.write_gguf(out / "text.gguf", spec.get("text_arch", "gemma3"), keys, gf.make_tensors(tensors, spec["text_seed"]))
    vp = spec["vp"]
    vkeys, vt = spec["spec"](vp, hp["n_embd"])
    vtensors = gf.make_tensors(vt, spec["tower_seed"])
    gf.write_gguf(out / "mmproj.gguf", "clip", vkeys, vtensors)

    s = vp["image_size"]
    iw, ih = vp.get("width", s), vp.get("height", s)
    rgb = np.random.default_rng(spec["image_seed"]).integers(0, 256, size=(ih, iw, 3), dtype=np.uint8)
    (out / "image.rgb").write_bytes(rgb.tobytes())
    # mtmd's normalization (clip_image_f32::from_u8, normalize), in float32, CHW.
    mean, std = np.array(vp["mean"], np.float32), np.array(vp["std"], np.float32)
    pixels = ((rgb.astype(np.float32) / np.float32(255.0) - mean) / std).transpose(2, 0, 1)
    ref = spec["reference"](dict(vtensors), vp, pixels)
    ref.astype("<f4").tofile(out / "numpy.embd.bin")

    def mtmd(images, prompt, prefix, mmproj="mmproj.gguf"):
        (out / f"{prefix}.rgb").write_bytes(b"".join(i.tobytes() for i in images))
        res = subprocess.run([str(a.driver), str(out / "text.gguf"), str(out / mmproj),
                              str(out / f"{prefix}.rgb"), str(iw), str(ih), prompt, str(out / prefix)],
                             check=True, capture_output=True, text=True)
        (out / f"{prefix}.rgb").unlink()
        chunks = json.loads(res.stdout)
        (out / f"{prefix}.chunks.json").write_text(json.dumps(chunks, indent=1) + "\n")
        n_text = sum(len(c["tokens"]) for c in chunks["chunks"] if c["type"] == "text")
        return np.fromfile(out / f"{prefix}.logits.bin", "<f4").reshape(n_text, -1)

    logits = mtmd([rgb], spec["prompt"], "llamacpp")
    emb = np.fromfile(out / "llamacpp.embd.bin", "<f4").reshape(ref.shape)
    d = np.abs(emb.astype(np.float64) - ref)
    n_text = logits.shape[0]
    extra = {}
    if spec.get("two_images", True):
        rgb2 = np.random.default_rng(spec["image_seed"] + 1).integers(0, 256, size=(ih, iw, 3), dtype=np.uint8)
        (out / "image2.rgb").write_bytes(rgb2.tobytes())
        logits2 = mtmd([rgb, rgb2], spec["prompt2"], "llamacpp2")
        extra.update({"prompt2": spec["prompt2"], "image2": f"image2.rgb: default_rng({spec['image_seed'] + 1}), as image.rgb",
                      "logits2": {"n_text_positions": int(logits2.shape[0]), **gf.stats(logits2)}})
    if spec.get("f16", True):
        # The tower as llama.cpp's converter stores a real one (conversion/gemma.py
        # Gemma3VisionModel with --outtype f16): the embeddings (patch and
        # position) and 1-D tensors F32, every other matrix F16 (input_projection
        # forced F16), the values the F32 file's rounded to nearest.
        def f16_type(name, arr):
            keep = arr.ndim < 2 or name in ("v.patch_embd.weight", "v.position_embd.weight")
            return arr if keep else arr.astype(np.float16)
        gf.write_gguf(out / "mmproj-f16.gguf", "clip", vkeys, [(n, f16_type(n, x)) for n, x in vtensors])
        logits_f16 = mtmd([rgb], spec["prompt"], "llamacpp-f16", "mmproj-f16.gguf")
        extra["f16"] = {"file": "mmproj-f16.gguf: the tower's matrices F16 (patch and position embeddings, 1-D tensors F32)",
                        "logits_f16_vs_f32": gf.compare(logits_f16, logits)}
    meta = {
        "tower": a.tower, "prompt": spec["prompt"], "text_hparams": {k: v for k, v in hp.items() if k != "family"},
        "vision_hparams": vp, "seeds": {k: spec[k] for k in ("text_seed", "tower_seed", "image_seed")},
        "model": spec["model"],
        "files": {"text.gguf": gf.describe_gguf(out / "text.gguf"), "mmproj.gguf": gf.describe_gguf(out / "mmproj.gguf")},
        "image": {"file": "image.rgb", "width": iw, "height": ih, "layout": "8-bit RGB, row-major, no header",
                  "draw": f"default_rng({spec['image_seed']}).integers(0, 256, ({ih}, {iw}, 3), uint8)"},
        "llamacpp_embd_vs_numpy_float64": {"max_abs_diff": float(d.max()), "max_abs": float(np.abs(ref).max()),
                                           "max_abs_diff_rel_to_max_abs": float(d.max() / np.abs(ref).max())},
        "logits": {"n_text_positions": n_text, **gf.stats(logits)},
        **extra,
        "method": {
            "generator": f"scripts/gen-vision-fixtures.sh {a.tower} (gguf-py, numpy {np.__version__})",
            "driver": "scripts/gen-vision-driver.c over libmtmd + libllama: mtmd_tokenize(add_special, parse_special), "
                      "text chunks one llama_decode each with logits for every token, the image chunk "
                      "mtmd_encode_chunk + mtmd_helper_decode_image_chunk; n_ctx = n_batch = n_ubatch = 128, "
                      "2 threads, F32 KV, flash attention off",
            "numpy": "float64 forward of the tower with exact tanh-GELU, from the same weights and the normalized pixels",
        },
        "llama_cpp": {"commit": "0c1e57098bba43ac29e6e3b677cdceebdd22334f",
                      "source": "llama.cpp vendored in the PyPI sdist llama-cpp-python 0.3.36, built by scripts/build-llamacpp.sh"},
    }
    (out / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")


if __name__ == "__main__":
    main()
