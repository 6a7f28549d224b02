#!/usr/bin/env python3
"""Dequantization test vectors for every ggml block type onebit reads.

Requires the `gguf` and `numpy` PyPI packages:

    pip install gguf numpy

For each type it makes a few blocks of random bytes, overwrites the f16 (or
f32) scale fields with finite values chosen to cover the edge cases (zero
scales, negative scales, codes all zero or all ones, large and subnormal
scales), decodes them with gguf-py's `gguf.quants.dequantize` (an independent
NumPy implementation of ggml's `dequantize_row_*`), and writes one GGUF:

    crates/onebit-formats/tests/data/block_vectors.gguf

holding, per type, a tensor `<TYPE>` (the raw blocks, in that type) and a
tensor `<TYPE>.f32` (gguf-py's decoding). `crates/onebit-formats/tests/
block_vectors.rs` requires onebit's dequantizers to agree bit for bit.

gguf-py has no decoder for Q8_1 and Q8_K (ggml uses them for activations
only); their expected values are computed here from the format definition
(d * code) and marked in the metadata (`onebit.expected_from.<TYPE>`).

Deterministic: a fixed seed; rerun and commit both the script and its output.
"""

from __future__ import annotations

import pathlib

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize

SEED = 20240607
OUT = pathlib.Path(__file__).resolve().parent.parent / "crates/onebit-formats/tests/data/block_vectors.gguf"

# (type, block length, block bytes, offsets of f16 scale fields, offset of an f32 scale field)
# Block byte sizes are ggml's current structs (gguf-py's table still gives Q8_1
# as 40 bytes, an older layout with f32 d and s; ggml's block_q8_1 is 2 + 2 + 32).
BLOCK_TYPES = [
    (T.Q4_0, 32, 18, [0], None),
    (T.Q4_1, 32, 20, [0, 2], None),
    (T.Q5_0, 32, 22, [0], None),
    (T.Q5_1, 32, 24, [0, 2], None),
    (T.Q8_0, 32, 34, [0], None),
    (T.Q8_1, 32, 36, [0, 2], None),
    (T.Q2_K, 256, 84, [80, 82], None),
    (T.Q3_K, 256, 110, [108], None),
    (T.Q4_K, 256, 144, [0, 2], None),
    (T.Q5_K, 256, 176, [0, 2], None),
    (T.Q6_K, 256, 210, [208], None),
    (T.Q8_K, 256, 292, [], 0),
]

# MXFP4 (last, so the vectors above keep their random stream): the scale is
# one E8M0 byte at offset 0, 2^(e - 127). Block 0 takes e = 0 and block 1
# e = 1 (the two f32-subnormal halves), block 2 (all codes 0xF, -6.0) the
# largest e whose codes stay finite (252), block 3 e = 127 (scale 1); the rest
# draw e around 1. 253 and up overflow a code of 6 doubled to inf.
MXFP4_E = {0: 0, 1: 1, 2: 252, 3: 127}
N_BLOCKS = {32: 12, 256: 8}


def scale_fields(rng: np.random.Generator, block: int, k: int) -> np.ndarray:
    """k finite scale values for block number `block`: the first blocks are edge cases."""
    if block == 0:
        return np.zeros(k)  # zero scales (and zero mins)
    if block == 1:
        return -(10.0 ** rng.uniform(-3, 0, k))  # negative scales
    if block == 4:
        return rng.choice([-1, 1], k) * 10.0 ** rng.uniform(3, 4.8, k)  # large (up to ~63000)
    if block == 5:
        return rng.choice([-1, 1], k) * rng.integers(1, 1024, k) * 2.0**-24  # f16 subnormals
    return rng.choice([-1, 1], k) * 10.0 ** rng.uniform(-4, 0.5, k)


def make_blocks(rng: np.random.Generator, block_bytes: int, f16_at: list[int], f32_at: int | None, n: int) -> np.ndarray:
    blocks = rng.integers(0, 256, (n, block_bytes), dtype=np.uint8)
    blocks[2, :] = 0xFF  # every code (and packed sub-scale) at its maximum
    blocks[3, :] = 0x00  # every code at its minimum
    for b in range(n):
        if f16_at:
            vals = scale_fields(rng, b, len(f16_at)).astype(np.float16)
            assert np.all(np.isfinite(vals))
            for off, v in zip(f16_at, vals):
                blocks[b, off : off + 2] = np.frombuffer(v.tobytes(), dtype=np.uint8)
        if f32_at is not None:
            v = np.float32(scale_fields(rng, b, 1)[0])
            blocks[b, f32_at : f32_at + 4] = np.frombuffer(v.tobytes(), dtype=np.uint8)
    return blocks


def float_vectors(rng: np.random.Generator) -> dict[str, tuple[np.ndarray, T, np.ndarray]]:
    """F32, F16 and BF16: random values plus signed zeros, extremes and subnormals."""
    out = {}
    # F32: the raw bytes are the values.
    f32 = (rng.standard_normal(64) * 10.0 ** rng.uniform(-6, 6, 64)).astype(np.float32)
    f32[:6] = [0.0, -0.0, np.finfo(np.float32).max, -np.finfo(np.float32).tiny, 1e-45, -3e-39]
    raw = f32.view(np.uint8)
    out["F32"] = (raw, T.F32, dequantize(raw, T.F32).astype(np.float32))
    # F16: random finite bit patterns (exponent field below 31), plus edges.
    bits = rng.integers(0, 1 << 16, 64, dtype=np.uint16)
    bits = np.where((bits & 0x7C00) == 0x7C00, bits & 0xBFFF, bits).astype(np.uint16)
    bits[:6] = [0x0000, 0x8000, 0x7BFF, 0xFBFF, 0x0001, 0x83FF]  # +-0, +-max, subnormals
    raw = bits.view(np.uint8)
    out["F16"] = (raw, T.F16, dequantize(raw, T.F16).astype(np.float32))
    # BF16: random finite bit patterns (exponent field below 255), plus edges.
    bits = rng.integers(0, 1 << 16, 64, dtype=np.uint16)
    bits = np.where((bits & 0x7F80) == 0x7F80, bits & 0xBFFF, bits).astype(np.uint16)
    bits[:6] = [0x0000, 0x8000, 0x7F7F, 0xFF7F, 0x0001, 0x807F]
    raw = bits.view(np.uint8)
    out["BF16"] = (raw, T.BF16, dequantize(raw, T.BF16).astype(np.float32))
    return out


def decode_q8(blocks: np.ndarray, qtype: T) -> np.ndarray:
    """Q8_1 and Q8_K from their definition: value = d * code (s and bsums unused)."""
    if qtype == T.Q8_1:
        d = blocks[:, 0:2].copy().view(np.float16).astype(np.float32)
        q = blocks[:, 4:36].view(np.int8).astype(np.float32)
    else:
        d = blocks[:, 0:4].copy().view(np.float32)
        q = blocks[:, 4:260].view(np.int8).astype(np.float32)
    return (q * d).reshape(-1)


def main() -> None:
    rng = np.random.default_rng(SEED)
    w = gguf.GGUFWriter(str(OUT), "onebit-block-vectors")
    w.add_string("onebit.generator", "scripts/gen_block_vectors.py")
    w.add_uint32("onebit.seed", SEED)

    for name, (raw, qtype, expect) in float_vectors(rng).items():
        w.add_tensor(name, raw, raw_dtype=qtype)
        w.add_tensor(f"{name}.f32", expect)
        w.add_string(f"onebit.expected_from.{name}", "gguf.quants.dequantize")

    for qtype, block_len, block_bytes, f16_at, f32_at in BLOCK_TYPES:
        n = N_BLOCKS[block_len]
        blocks = make_blocks(rng, block_bytes, f16_at, f32_at, n)
        if qtype in (T.Q8_1, T.Q8_K):
            expect = decode_q8(blocks, qtype)
            source = "d * code (scripts/gen_block_vectors.py)"
        else:
            expect = dequantize(blocks.reshape(-1), qtype).astype(np.float32).reshape(-1)
            source = "gguf.quants.dequantize"
        assert expect.shape == (n * block_len,), (qtype.name, expect.shape)
        assert np.all(np.isfinite(expect)), qtype.name
        if qtype == T.Q8_1:
            # gguf-py's size table has the old 40-byte Q8_1; pass the element
            # shape directly (a non-uint8 view keeps the writer from converting it).
            w.add_tensor(qtype.name, blocks.reshape(-1).view(np.int8), raw_shape=(n * block_len,), raw_dtype=qtype)
        else:
            w.add_tensor(qtype.name, blocks.reshape(-1), raw_dtype=qtype)
        w.add_tensor(f"{qtype.name}.f32", expect)
        w.add_string(f"onebit.expected_from.{qtype.name}", source)

    n = N_BLOCKS[32]
    blocks = rng.integers(0, 256, (n, 17), dtype=np.uint8)
    blocks[2, 1:] = 0xFF
    blocks[3, 1:] = 0x00
    for b in range(n):
        blocks[b, 0] = MXFP4_E.get(b, int(rng.integers(100, 150)))
    blocks[0, 1:] = 0x88  # block 0: codes -0.0 everywhere (sign bit only)
    expect = dequantize(blocks.reshape(-1), T.MXFP4).astype(np.float32).reshape(-1)
    assert np.all(np.isfinite(expect)), "MXFP4"
    w.add_tensor("MXFP4", blocks.reshape(-1), raw_dtype=T.MXFP4)
    w.add_tensor("MXFP4.f32", expect)
    w.add_string("onebit.expected_from.MXFP4", "gguf.quants.dequantize")

    OUT.parent.mkdir(parents=True, exist_ok=True)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"wrote {OUT} ({OUT.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
