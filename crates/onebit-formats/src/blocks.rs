//! ggml block formats: byte layouts and scalar dequantizers.
//!
//! Every quantized ggml type stores a row as a sequence of fixed-size blocks;
//! each block carries one or more scales (f16, or f32 for Q8_K) and packed
//! integer codes. The layouts below are those of ggml's `block_*` structs
//! (`ggml-common.h`, QK_K = 256). Offsets are written out as constants so that
//! the dot-product kernels (`onebit-kernels`) read the same bytes the same way.
//!
//! Arithmetic follows ggml's `dequantize_row_*` exactly, in f32 and in the same
//! operation order (products are never fused into FMAs), so the results are
//! bit-identical to ggml's and to gguf-py's `gguf.quants.dequantize`; the test
//! `tests/block_vectors.rs` checks this against vectors made by gguf-py.

use crate::dtype::GgmlType;

/// Elements per K-quant super-block.
pub const QK_K: usize = 256;

/// Why a byte buffer could not be dequantized.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BlockError {
    #[error("{dtype}: {n} elements is not a whole number of {block_len}-element blocks")]
    PartialBlock {
        dtype: GgmlType,
        n: usize,
        block_len: usize,
    },
    #[error("{dtype}: {n} elements take {expected} bytes, but {got} bytes were given")]
    ByteCount {
        dtype: GgmlType,
        n: usize,
        expected: usize,
        got: usize,
    },
    #[error("{dtype}: dequantization of this type is not supported")]
    Unsupported { dtype: GgmlType },
}

/// Checks that `src` holds exactly the bytes of `n` elements of `dtype`.
pub fn check_len(dtype: GgmlType, src_len: usize, n: usize) -> Result<(), BlockError> {
    let block_len = dtype.block_len();
    if !n.is_multiple_of(block_len) {
        return Err(BlockError::PartialBlock {
            dtype,
            n,
            block_len,
        });
    }
    let expected = n / block_len * dtype.block_bytes();
    if src_len != expected {
        return Err(BlockError::ByteCount {
            dtype,
            n,
            expected,
            got: src_len,
        });
    }
    Ok(())
}

/// Decodes `dst.len()` elements of `dtype` from `src` (whole blocks, exactly
/// `dtype.row_bytes(dst.len())` bytes).
pub fn dequantize(dtype: GgmlType, src: &[u8], dst: &mut [f32]) -> Result<(), BlockError> {
    check_len(dtype, src.len(), dst.len())?;
    let decode = block_decoder(dtype);
    let bb = dtype.block_bytes();
    let bl = dtype.block_len();
    for (block, out) in src.chunks_exact(bb).zip(dst.chunks_exact_mut(bl)) {
        decode(block, out);
    }
    Ok(())
}

/// Decodes one block: `block` is `block_bytes()` long, `out` `block_len()` long.
pub type BlockDecoder = fn(&[u8], &mut [f32]);

/// The decoder of one block of `dtype`: one table, one row per type.
pub fn block_decoder(dtype: GgmlType) -> BlockDecoder {
    match dtype {
        GgmlType::F32 => dequant_f32,
        GgmlType::F16 => dequant_f16,
        GgmlType::BF16 => dequant_bf16,
        GgmlType::Q4_0 => dequant_q4_0,
        GgmlType::Q4_1 => dequant_q4_1,
        GgmlType::Q5_0 => dequant_q5_0,
        GgmlType::Q5_1 => dequant_q5_1,
        GgmlType::Q8_0 => dequant_q8_0,
        GgmlType::Q8_1 => dequant_q8_1,
        GgmlType::Q2K => dequant_q2_k,
        GgmlType::Q3K => dequant_q3_k,
        GgmlType::Q4K => dequant_q4_k,
        GgmlType::Q5K => dequant_q5_k,
        GgmlType::Q6K => dequant_q6_k,
        GgmlType::Q8K => dequant_q8_k,
        GgmlType::MXFP4 => dequant_mxfp4,
    }
}

// ---------------------------------------------------------------------------
// Field readers shared with the kernels.

/// An IEEE half (little-endian, at `b[at..at + 2]`) as f32 (exact).
#[inline]
pub fn f16_at(b: &[u8], at: usize) -> f32 {
    half::f16::from_bits(u16::from_le_bytes([b[at], b[at + 1]])).to_f32()
}

/// A little-endian f32 at `b[at..at + 4]`.
#[inline]
pub fn f32_at(b: &[u8], at: usize) -> f32 {
    f32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// A little-endian u32 at `b[at..at + 4]`.
#[inline]
pub fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// Byte layouts of the blocks (offsets of each field within a block).
pub mod layout {
    /// Q4_0: d (f16), 16 bytes of nibbles. Element j < 16 is the low nibble
    /// of qs\[j\], element j + 16 its high nibble; value d * (q - 8).
    pub mod q4_0 {
        pub const D: usize = 0;
        pub const QS: usize = 2;
    }
    /// Q4_1: d, m (f16), 16 bytes of nibbles (as Q4_0); value d * q + m.
    pub mod q4_1 {
        pub const D: usize = 0;
        pub const M: usize = 2;
        pub const QS: usize = 4;
    }
    /// Q5_0: d (f16), qh (u32: bit j is bit 4 of element j), nibbles as Q4_0;
    /// value d * (q - 16).
    pub mod q5_0 {
        pub const D: usize = 0;
        pub const QH: usize = 2;
        pub const QS: usize = 6;
    }
    /// Q5_1: d, m (f16), qh (u32), nibbles; value d * q + m.
    pub mod q5_1 {
        pub const D: usize = 0;
        pub const M: usize = 2;
        pub const QH: usize = 4;
        pub const QS: usize = 8;
    }
    /// Q8_0: d (f16), 32 i8; value d * q.
    pub mod q8_0 {
        pub const D: usize = 0;
        pub const QS: usize = 2;
    }
    /// Q8_1: d (f16), s (f16: d times the sum of the codes), 32 i8.
    pub mod q8_1 {
        pub const D: usize = 0;
        pub const S: usize = 2;
        pub const QS: usize = 4;
    }
    /// Q2_K: 16 bytes of 4-bit scale | 4-bit min per 16 elements, 64 bytes of
    /// 2-bit codes, d and dmin (f16).
    pub mod q2_k {
        pub const SCALES: usize = 0;
        pub const QS: usize = 16;
        pub const D: usize = 80;
        pub const DMIN: usize = 82;
    }
    /// Q3_K: 32 bytes of high bits, 64 bytes of low 2-bit codes, 12 bytes of
    /// sixteen packed 6-bit scales, d (f16).
    pub mod q3_k {
        pub const HMASK: usize = 0;
        pub const QS: usize = 32;
        pub const SCALES: usize = 96;
        pub const D: usize = 108;
    }
    /// Q4_K: d, dmin (f16), 12 bytes of eight 6-bit scales and mins, 128 bytes
    /// of nibbles.
    pub mod q4_k {
        pub const D: usize = 0;
        pub const DMIN: usize = 2;
        pub const SCALES: usize = 4;
        pub const QS: usize = 16;
    }
    /// Q5_K: as Q4_K plus 32 bytes of fifth bits before the nibbles.
    pub mod q5_k {
        pub const D: usize = 0;
        pub const DMIN: usize = 2;
        pub const SCALES: usize = 4;
        pub const QH: usize = 16;
        pub const QS: usize = 48;
    }
    /// Q6_K: 128 bytes of low nibbles, 64 bytes of high 2-bit pairs, 16 i8
    /// scales, d (f16).
    pub mod q6_k {
        pub const QL: usize = 0;
        pub const QH: usize = 128;
        pub const SCALES: usize = 192;
        pub const D: usize = 208;
    }
    /// Q8_K: d (f32), 256 i8, 16 i16 sums of 16 codes each.
    pub mod q8_k {
        pub const D: usize = 0;
        pub const QS: usize = 4;
        pub const BSUMS: usize = 260;
    }
    /// MXFP4: e (E8M0 exponent byte), 16 bytes of E2M1 nibbles placed as
    /// Q4_0's (element j < 16 the low nibble of qs\[j\], j + 16 its high one);
    /// value `MXFP4_CODES[q] * e8m0_half(e)`.
    pub mod mxfp4 {
        pub const E: usize = 0;
        pub const QS: usize = 1;
    }
}

/// The sixteen E2M1 values doubled, so each is a small integer: code q has
/// sign bit 3 and magnitude {0, 0.5, 1, 1.5, 2, 3, 4, 6}[q & 7]; doubled,
/// {0, 1, 2, 3, 4, 6, 8, 12}. The halving goes into [`e8m0_half`], so
/// `MXFP4_CODES[q] * e8m0_half(e)` is the element exactly (OCP Microscaling
/// Formats v1.0, section 5.3.3; ggml's `kvalues_mxfp4`).
pub const MXFP4_CODES: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// Half the E8M0 scale `2^(e - 127)`, i.e. `2^(e - 128)`, exactly: e = 0 and
/// 1 are f32 subnormals (2^-128, 2^-127), the rest normal. E8M0's NaN code
/// (0xFF) reads as 2^127, as ggml's `ggml_e8m0_to_fp32_half` reads it.
#[inline]
pub fn e8m0_half(e: u8) -> f32 {
    let bits = if e < 2 {
        0x0020_0000u32 << e
    } else {
        (e as u32 - 1) << 23
    };
    f32::from_bits(bits)
}

/// Q4_K/Q5_K: the 6-bit (scale, min) of sub-block `j` (0..8) from the 12
/// packed bytes. Sub-blocks 0..4 keep their six bits in the low bits of bytes
/// j (scale) and j + 4 (min); sub-blocks 4..8 take four bits from byte j + 4
/// (scale low nibble, min high nibble) and their top two bits from the top of
/// bytes j - 4 (scale) and j (min).
#[inline]
pub fn k4_scale_min(scales: &[u8], j: usize) -> (u8, u8) {
    if j < 4 {
        (scales[j] & 63, scales[j + 4] & 63)
    } else {
        (
            (scales[j + 4] & 0x0F) | ((scales[j - 4] >> 6) << 4),
            (scales[j + 4] >> 4) | ((scales[j] >> 6) << 4),
        )
    }
}

/// Q3_K: the sixteen signed scales (-32..=31) from the 12 packed bytes. Scale
/// i's low four bits are the low (i < 8) or high (i >= 8) nibble of byte
/// i % 8; its top two bits are bits 2*(i/4)..+2 of byte 8 + i % 4.
#[inline]
pub fn q3k_scales(packed: &[u8]) -> [i8; 16] {
    let mut out = [0i8; 16];
    for (i, s) in out.iter_mut().enumerate() {
        let low = (packed[i % 8] >> (4 * (i / 8))) & 0x0F;
        let high = (packed[8 + i % 4] >> (2 * (i / 4))) & 3;
        *s = (low | (high << 4)) as i8 - 32;
    }
    out
}

// ---------------------------------------------------------------------------
// Per-block decoders.

fn dequant_f32(b: &[u8], y: &mut [f32]) {
    y[0] = f32_at(b, 0);
}

fn dequant_f16(b: &[u8], y: &mut [f32]) {
    y[0] = f16_at(b, 0);
}

fn dequant_bf16(b: &[u8], y: &mut [f32]) {
    // bf16 is the top half of an f32.
    y[0] = f32::from_bits((u16::from_le_bytes([b[0], b[1]]) as u32) << 16);
}

fn dequant_mxfp4(b: &[u8], y: &mut [f32]) {
    use layout::mxfp4::*;
    let d = e8m0_half(b[E]);
    let (lo, hi) = y.split_at_mut(16);
    for (j, &q) in b[QS..QS + 16].iter().enumerate() {
        lo[j] = MXFP4_CODES[(q & 0x0F) as usize] as f32 * d;
        hi[j] = MXFP4_CODES[(q >> 4) as usize] as f32 * d;
    }
}

fn dequant_q4_0(b: &[u8], y: &mut [f32]) {
    use layout::q4_0::*;
    let d = f16_at(b, D);
    let (lo, hi) = y.split_at_mut(16);
    for (j, &q) in b[QS..QS + 16].iter().enumerate() {
        lo[j] = ((q & 0x0F) as i32 - 8) as f32 * d;
        hi[j] = ((q >> 4) as i32 - 8) as f32 * d;
    }
}

fn dequant_q4_1(b: &[u8], y: &mut [f32]) {
    use layout::q4_1::*;
    let d = f16_at(b, D);
    let m = f16_at(b, M);
    let (lo, hi) = y.split_at_mut(16);
    for (j, &q) in b[QS..QS + 16].iter().enumerate() {
        lo[j] = (q & 0x0F) as f32 * d + m;
        hi[j] = (q >> 4) as f32 * d + m;
    }
}

/// The 5-bit codes of a Q5_0/Q5_1 block: nibbles plus a fifth bit from `qh`.
#[inline]
pub fn q5_codes(qh: u32, qs: &[u8]) -> [u8; 32] {
    let mut q = [0u8; 32];
    for j in 0..16 {
        let h0 = ((qh >> j) & 1) as u8;
        let h1 = ((qh >> (j + 16)) & 1) as u8;
        q[j] = (qs[j] & 0x0F) | (h0 << 4);
        q[j + 16] = (qs[j] >> 4) | (h1 << 4);
    }
    q
}

fn dequant_q5_0(b: &[u8], y: &mut [f32]) {
    use layout::q5_0::*;
    let d = f16_at(b, D);
    let q = q5_codes(u32_at(b, QH), &b[QS..QS + 16]);
    for (y, &q) in y.iter_mut().zip(&q) {
        *y = (q as i32 - 16) as f32 * d;
    }
}

fn dequant_q5_1(b: &[u8], y: &mut [f32]) {
    use layout::q5_1::*;
    let d = f16_at(b, D);
    let m = f16_at(b, M);
    let q = q5_codes(u32_at(b, QH), &b[QS..QS + 16]);
    for (y, &q) in y.iter_mut().zip(&q) {
        *y = q as f32 * d + m;
    }
}

fn dequant_q8_0(b: &[u8], y: &mut [f32]) {
    use layout::q8_0::*;
    let d = f16_at(b, D);
    for (y, &q) in y.iter_mut().zip(&b[QS..QS + 32]) {
        *y = (q as i8) as f32 * d;
    }
}

fn dequant_q8_1(b: &[u8], y: &mut [f32]) {
    use layout::q8_1::*;
    // `s` is redundant (d times the code sum), used only by dot products.
    let d = f16_at(b, D);
    for (y, &q) in y.iter_mut().zip(&b[QS..QS + 32]) {
        *y = (q as i8) as f32 * d;
    }
}

fn dequant_q8_k(b: &[u8], y: &mut [f32]) {
    use layout::q8_k::*;
    let d = f32_at(b, D);
    for (y, &q) in y.iter_mut().zip(&b[QS..QS + QK_K]) {
        *y = (q as i8) as f32 * d;
    }
}

fn dequant_q2_k(b: &[u8], y: &mut [f32]) {
    use layout::q2_k::*;
    let d = f16_at(b, D);
    let dmin = f16_at(b, DMIN);
    let scales = &b[SCALES..SCALES + 16];
    // Two halves of 128; in each, byte l of the 32 code bytes holds elements
    // l, l + 32, l + 64, l + 96 in bit pairs 0, 2, 4, 6. Each 16 elements
    // have their own scale byte (low nibble scale, high nibble min).
    for half in 0..2 {
        let qs = &b[QS + 32 * half..QS + 32 * half + 32];
        for j in 0..4 {
            for part in 0..2 {
                let sc = scales[8 * half + 2 * j + part];
                let dl = d * (sc & 0x0F) as f32;
                let ml = dmin * (sc >> 4) as f32;
                for l in 16 * part..16 * part + 16 {
                    let q = (qs[l] >> (2 * j)) & 3;
                    y[128 * half + 32 * j + l] = dl * q as f32 - ml;
                }
            }
        }
    }
}

fn dequant_q3_k(b: &[u8], y: &mut [f32]) {
    use layout::q3_k::*;
    let d = f16_at(b, D);
    let scales = q3k_scales(&b[SCALES..SCALES + 12]);
    let hmask = &b[HMASK..HMASK + 32];
    // Same bit-pair layout as Q2_K; the third bit of element 32*k + l is bit
    // k of hmask[l], and a *clear* bit subtracts 4 (codes -4..=3).
    for half in 0..2 {
        let qs = &b[QS + 32 * half..QS + 32 * half + 32];
        for j in 0..4 {
            let bit = 4 * half + j;
            for part in 0..2 {
                let dl = d * scales[8 * half + 2 * j + part] as f32;
                for l in 16 * part..16 * part + 16 {
                    let low = ((qs[l] >> (2 * j)) & 3) as i32;
                    let q = if hmask[l] >> bit & 1 != 0 {
                        low
                    } else {
                        low - 4
                    };
                    y[128 * half + 32 * j + l] = dl * q as f32;
                }
            }
        }
    }
}

fn dequant_q4_k(b: &[u8], y: &mut [f32]) {
    use layout::q4_k::*;
    let d = f16_at(b, D);
    let dmin = f16_at(b, DMIN);
    let scales = &b[SCALES..SCALES + 12];
    // Four chunks of 64: 32 bytes whose low nibbles are sub-block 2c and high
    // nibbles sub-block 2c + 1.
    for c in 0..4 {
        let qs = &b[QS + 32 * c..QS + 32 * c + 32];
        for (nib, sub) in [(0, 2 * c), (4, 2 * c + 1)] {
            let (sc, m) = k4_scale_min(scales, sub);
            let d1 = d * sc as f32;
            let m1 = dmin * m as f32;
            for (l, &q) in qs.iter().enumerate() {
                y[32 * sub + l] = d1 * ((q >> nib) & 0x0F) as f32 - m1;
            }
        }
    }
}

fn dequant_q5_k(b: &[u8], y: &mut [f32]) {
    use layout::q5_k::*;
    let d = f16_at(b, D);
    let dmin = f16_at(b, DMIN);
    let scales = &b[SCALES..SCALES + 12];
    let qh = &b[QH..QH + 32];
    // As Q4_K; the fifth bit of sub-block s's element l is bit s of qh[l].
    for c in 0..4 {
        let qs = &b[QS + 32 * c..QS + 32 * c + 32];
        for (nib, sub) in [(0, 2 * c), (4, 2 * c + 1)] {
            let (sc, m) = k4_scale_min(scales, sub);
            let d1 = d * sc as f32;
            let m1 = dmin * m as f32;
            for (l, &q) in qs.iter().enumerate() {
                let q = ((q >> nib) & 0x0F) | (((qh[l] >> sub) & 1) << 4);
                y[32 * sub + l] = d1 * q as f32 - m1;
            }
        }
    }
}

/// Q6_K: the 6-bit code (0..64, before subtracting 32) of element `i` of a
/// block whose low nibbles are `ql` (128 bytes) and high pairs `qh` (64 bytes).
#[inline]
pub fn q6k_code(ql: &[u8], qh: &[u8], i: usize) -> u8 {
    // Halves of 128; within one, element 32*k + l (k = 0..4, l = 0..32) takes
    // its nibble from ql[64*half + l + 32*(k & 1)] (low nibble for k < 2,
    // high for k >= 2) and its top two bits from bits 2k..2k+2 of
    // qh[32*half + l].
    let half = i / 128;
    let k = (i % 128) / 32;
    let l = i % 32;
    let byte = ql[64 * half + l + 32 * (k & 1)];
    let nib = if k < 2 { byte & 0x0F } else { byte >> 4 };
    let hi = (qh[32 * half + l] >> (2 * k)) & 3;
    nib | (hi << 4)
}

fn dequant_q6_k(b: &[u8], y: &mut [f32]) {
    use layout::q6_k::*;
    let d = f16_at(b, D);
    let ql = &b[QL..QL + 128];
    let qh = &b[QH..QH + 64];
    let scales = &b[SCALES..SCALES + 16];
    for (i, y) in y.iter_mut().enumerate() {
        let q = q6k_code(ql, qh, i) as i32 - 32;
        let sc = scales[i / 16] as i8;
        *y = d * sc as f32 * q as f32;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_type_has_a_decoder_and_lengths_are_checked() {
        let mut out = [0f32; 64];
        assert_eq!(
            dequantize(GgmlType::Q4_0, &[0u8; 18], &mut out[..33]),
            Err(BlockError::PartialBlock {
                dtype: GgmlType::Q4_0,
                n: 33,
                block_len: 32
            })
        );
        let e = dequantize(GgmlType::Q4_0, &[0u8; 17], &mut out[..32]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "Q4_0: 32 elements take 18 bytes, but 17 bytes were given"
        );
        assert!(dequantize(GgmlType::Q4_0, &[0u8; 36], &mut out).is_ok());
    }

    #[test]
    fn q4_0_by_hand() {
        // d = 0.5 (f16 0x3800); byte 0 = 0x1F: element 0 code 15 -> 3.5,
        // element 16 code 1 -> -3.5; all other bytes 0x88 -> codes 8 -> 0.
        let mut b = vec![0x00, 0x38];
        b.extend([0x1F]);
        b.extend([0x88; 15]);
        let mut y = [9f32; 32];
        dequantize(GgmlType::Q4_0, &b, &mut y).unwrap();
        assert_eq!(y[0], 3.5);
        assert_eq!(y[16], -3.5);
        assert!(y
            .iter()
            .enumerate()
            .all(|(i, &v)| i == 0 || i == 16 || v == 0.0));
    }

    #[test]
    fn k4_scales_unpack_both_halves() {
        // sub-block 5: scale = low nibble of byte 9 | top bits of byte 1 << 4,
        // min = high nibble of byte 9 | top bits of byte 5 << 4.
        let mut s = [0u8; 12];
        s[9] = 0xA3;
        s[1] = 0b1100_0000;
        s[5] = 0b0100_0000;
        assert_eq!(k4_scale_min(&s, 5), (0x03 | 0x30, 0x0A | 0x10));
        s[2] = 0x3F | 0x80;
        s[6] = 0x15;
        assert_eq!(k4_scale_min(&s, 2), (0x3F, 0x15));
    }

    #[test]
    fn q3k_scales_unpack() {
        // Scale 13: low nibble = high nibble of byte 5, top bits = bits 6..8 of byte 9.
        let mut p = [0u8; 12];
        p[5] = 0x70;
        p[9] = 0b1000_0000;
        let s = q3k_scales(&p);
        assert_eq!(s[13], (0x07 | 0x20) - 32);
        assert_eq!(s[0], -32);
    }
}
