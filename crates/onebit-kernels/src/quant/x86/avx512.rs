//! AVX-512 (F, BW, VL, VNNI) kernels on 256-bit vectors: `vpdpbusd` and
//! `vpdpwssd` do the integer dot products in one instruction, masks expand
//! Q5 fifth bits, and 32 registers hold 4 rows x 4 tokens of accumulators.
//! The results are the same bits as the AVX2 and scalar kernels.

use core::arch::x86_64::*;

const TR: usize = 4;
const TT: usize = 4;

/// The wide Q8_0 kernel may sum (w + 128) * y in i32 (`vpdpbusd`) and
/// subtract 128 * sum(y).
const Q8_BIAS: bool = true;

/// VNNI: the interleaved Q4_K kernel sums codes with `vpdpbusd` into i32.
const VNNI: bool = true;

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
fn dp(acc: __m256i, u: __m256i, s: __m256i) -> __m256i {
    _mm256_dpbusd_epi32(acc, u, s)
}

/// As [`dp`], with the product summed on its own and then added: the
/// one-token kernels' accumulators then wait on a 1-cycle add rather than
/// on a chain of `vpdpbusd`s. Streaming a 1.2 GB Q4_0 matrix from memory,
/// one thread took 16.0 ms of CPU time with the chain and 12.0 without
/// (the AVX2 kernel: 12.0); from cache 0.33 and 0.36 ms (AVX2: 0.43);
/// examples/kernels.rs on a Zen 4 VM. A long chain keeps instructions in
/// the reorder buffer, and with them the loads behind them.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
fn dpa(acc: __m256i, u: __m256i, s: __m256i) -> __m256i {
    _mm256_add_epi32(acc, _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s))
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
fn dp16(acc: __m256i, a: __m256i, b: __m256i) -> __m256i {
    _mm256_dpwssd_epi32(acc, a, b)
}

/// Q8_0 weights prepared for [`q8_pair`]: (|w|, w).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
fn q8_prep(w: __m256i) -> (__m256i, __m256i) {
    (_mm256_abs_epi8(w), w)
}

/// acc + per lane the sum of four w x y (i8 x i8), as |w| x sign(y, w)
/// (|-128| is 128 as u8: exact). Summing (w + 128) * y instead needs one
/// more `vpdpbusd` per activation vector for 128 * sum(y): on a Zen 4 VM
/// (load 6-8, 1 thread, alternating runs of examples/kernels.rs) the
/// one-token kernel took ~20% less on-CPU time on the Gemma 3 output
/// (262144 x 640) and ~10% less wall time on the SmolLM2 output this way.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
fn q8_pair(acc: __m256i, w: (__m256i, __m256i), y: __m256i) -> __m256i {
    dpa(acc, w.0, _mm256_sign_epi8(y, w.1))
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
fn expand_bits(m: u32) -> __m256i {
    _mm256_maskz_mov_epi8(m, _mm256_set1_epi8(0x10))
}

/// Byte j = 0x10 where `x & sel` is not zero in byte j, else 0 (`sel`
/// has one bit per byte).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
fn sel_bits(x: __m256i, sel: __m256i) -> __m256i {
    _mm256_maskz_mov_epi8(_mm256_test_epi8_mask(x, sel), _mm256_set1_epi8(0x10))
}

simd_kernels!("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni");
