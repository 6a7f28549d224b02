//! AVX-512 (F, BW, VL, VNNI) kernels on 256-bit vectors: `vpdpbusd` and
//! `vpdpwssd` do the integer dot products in one instruction, masks expand
//! Q5 fifth bits, and 32 registers hold 4 rows x 4 tokens of accumulators.
//! The results are the same bits as the AVX2 and scalar kernels.

use core::arch::x86_64::*;

const TR: usize = 4;
const TT: usize = 4;

/// `q8_pair` sums (w + 128) * y; the kernels subtract 128 * sum(y).
const Q8_BIAS: bool = true;

/// VNNI: the interleaved Q4_K kernel sums codes with `vpdpbusd` into i32.
const VNNI: bool = true;

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
fn dp(acc: __m256i, u: __m256i, s: __m256i) -> __m256i {
    _mm256_dpbusd_epi32(acc, u, s)
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
fn dp16(acc: __m256i, a: __m256i, b: __m256i) -> __m256i {
    _mm256_dpwssd_epi32(acc, a, b)
}

/// Q8_0 weights as unsigned codes w + 128 (the second half is unused).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
fn q8_prep(w: __m256i) -> (__m256i, __m256i) {
    (_mm256_xor_si256(w, _mm256_set1_epi8(-128)), w)
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
fn q8_pair(acc: __m256i, w: (__m256i, __m256i), y: __m256i) -> __m256i {
    _mm256_dpbusd_epi32(acc, w.0, y)
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
fn expand_bits(m: u32) -> __m256i {
    _mm256_maskz_mov_epi8(m, _mm256_set1_epi8(0x10))
}

simd_kernels!("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni");
