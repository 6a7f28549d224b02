//! AVX2 + FMA + F16C kernels. No VNNI: `u8 x i8` dot products are
//! `vpmaddubsw` (pairs into i16) then `vpmaddwd` with ones; callers keep every
//! pair sum below 2^15 (codes <= 63 times activations <= 127, or the Q8_0 sign
//! trick |w| * sign(y, w), at most 128 * 127 * 2).

use core::arch::x86_64::*;

/// Tile shape: 16 vector registers fit 4 rows x 2 tokens of accumulators.
const TR: usize = 4;
const TT: usize = 2;
/// The widest token tile of [`tile_q4_kx16`] (here two [`tile_q4_kx8`]s).
const TT16: usize = TT;

/// AVX2 has no unsigned-offset trick for Q8_0 (it would overflow i16).
const Q8_BIAS: bool = false;

/// No VNNI: the interleaved Q4_K kernel sums `vpmaddubsw` pairs in i16.
const VNNI: bool = false;

/// acc + per 32-bit lane, the sum of four products u8 x i8.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn dp(acc: __m256i, u: __m256i, s: __m256i) -> __m256i {
    let p = _mm256_maddubs_epi16(u, s);
    _mm256_add_epi32(acc, _mm256_madd_epi16(p, _mm256_set1_epi16(1)))
}

/// [`dp`]: its product is already summed apart from `acc` (the AVX-512
/// level's `dpa` keeps `vpdpbusd` off the accumulator's chain).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn dpa(acc: __m256i, u: __m256i, s: __m256i) -> __m256i {
    dp(acc, u, s)
}

/// acc + per 32-bit lane, the sum of two products i16 x i16.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn dp16(acc: __m256i, a: __m256i, b: __m256i) -> __m256i {
    _mm256_add_epi32(acc, _mm256_madd_epi16(a, b))
}

/// Q8_0 weights prepared for [`q8_pair`]: (|w|, w).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn q8_prep(w: __m256i) -> (__m256i, __m256i) {
    (_mm256_abs_epi8(w), w)
}

/// acc + per lane the sum of four w x y (i8 x i8), as |w| x sign(y, w).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn q8_pair(acc: __m256i, w: (__m256i, __m256i), y: __m256i) -> __m256i {
    dp(acc, w.0, _mm256_sign_epi8(y, w.1))
}

/// Byte j = 0x10 when bit j of `m` is set, else 0.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn expand_bits(m: u32) -> __m256i {
    let v = _mm256_set1_epi32(m as i32);
    let idx = _mm256_setr_epi8(
        0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3,
        3, 3,
    );
    let bytes = _mm256_shuffle_epi8(v, idx);
    let bits = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
    let set = _mm256_cmpeq_epi8(_mm256_and_si256(bytes, bits), bits);
    _mm256_and_si256(set, _mm256_set1_epi8(0x10))
}

/// Byte j = 0x10 where `x & sel` has every bit of `sel` in byte j, else 0.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn sel_bits(x: __m256i, sel: __m256i) -> __m256i {
    let set = _mm256_cmpeq_epi8(_mm256_and_si256(x, sel), sel);
    _mm256_and_si256(set, _mm256_set1_epi8(0x10))
}

simd_kernels!("avx2,fma,f16c");

/// Groups g and g + 1 of an interleaved Q4_K/Q5_K matrix times tokens
/// t0..t0 + T: AVX2 has 256-bit vectors only, so one group after the other
/// (the AVX-512 level holds both in one vector).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn tile_q4_kx16<const T: usize, const K: u8>(
    ops: &Operands,
    g: usize,
    t0: usize,
    out: *mut f32,
    os: usize,
) {
    tile_q4_kx8::<T, K>(ops, g, t0, out, os);
    tile_q4_kx8::<T, K>(ops, g + 1, t0, out, os);
}

/// Groups g and g + 1 of an interleaved Q6_K matrix times tokens t0..t0 +
/// T, one after the other (as [`tile_q4_kx16`]).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn tile_q6_kx16<const T: usize>(
    ops: &Operands,
    g: usize,
    t0: usize,
    out: *mut f32,
    os: usize,
) {
    tile_q6_kx8::<T>(ops, g, t0, out, os);
    tile_q6_kx8::<T>(ops, g + 1, t0, out, os);
}

/// Groups g and g + 1 of an interleaved Q4_0 (K = 0), Q4_1 (K = 1) or
/// Q5_0 (K = 2) matrix times tokens t0..t0 + T, one after the other (as
/// [`tile_q4_kx16`]); one token runs the one-token tile [`tile_qx8`].
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn tile_qx16_rows<const K: u8, const T: usize>(
    ops: &Operands,
    g: usize,
    t0: usize,
    out: *mut f32,
    os: usize,
) {
    if T == 1 {
        tile_qx8::<K>(ops, g, t0, out, os);
        tile_qx8::<K>(ops, g + 1, t0, out, os);
    } else {
        tile_qx8_rows::<K, T>(ops, g, t0, out, os);
        tile_qx8_rows::<K, T>(ops, g + 1, t0, out, os);
    }
}
