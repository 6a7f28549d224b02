//! Activation quantizers: Q8_0, Q8_1 (blocks of 32) and Q8_K (blocks of 256).
//! Rounding and the overflow rules are described in the module docs of
//! [`crate::quant`].

use half::f16;
use onebit_formats::blocks::{layout, QK_K};

use super::scale::{q8_scales, F16_MAX};

const QK8: usize = 32;

/// The f16 bytes of `v`, rounded to nearest even and clamped to the finite range.
fn f16_sat_bytes(v: f32) -> [u8; 2] {
    f16::from_f32(v.clamp(-F16_MAX, F16_MAX)).to_le_bytes()
}

/// Rounds `v` to the nearest integer (ties to even) and clamps it to i8's
/// symmetric range [-127, 127]; NaN gives 0.
#[inline]
fn round_code(v: f32) -> i8 {
    // `as` saturates and maps NaN to 0; the clamp keeps -128 out.
    v.round_ties_even().clamp(-127.0, 127.0) as i8
}

/// Codes and scale of one 32-element block: returns (d as f32 before f16
/// rounding, the codes). `d` is amax/127, or F16_MAX when that overflows f16.
fn q8_block(x: &[f32], qs: &mut [u8]) -> f32 {
    let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
    let (d, id) = q8_scales(amax);
    for (q, &v) in qs.iter_mut().zip(x) {
        *q = round_code(v * id) as u8;
    }
    d
}

/// Whether the AVX2 block quantizers run (they give the scalar code's bits).
#[inline]
fn simd() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        crate::quant::x86::Isa::best() >= crate::quant::x86::Isa::Avx2
    }
    #[cfg(target_arch = "aarch64")]
    {
        crate::quant::Isa::best() >= crate::quant::Isa::Neon
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        false
    }
}

/// One Q8_0/Q8_1 block: the AVX2 path when `simd` and every value is finite,
/// the scalar one otherwise. Returns d before f16 rounding.
#[inline]
fn block(simd: bool, x: &[f32], qs: &mut [u8]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if simd {
        // SAFETY: `simd` is true only when AVX2 (and F16C, FMA) were
        // detected; `x` and `qs` have 32 elements (chunks_exact of 32).
        if let Some(d) = unsafe { avx2::q8_block(x, qs) } {
            return d;
        }
    }
    #[cfg(target_arch = "aarch64")]
    if simd {
        // SAFETY: `simd` is true only at a NEON level; `x` and `qs` have 32
        // elements (chunks_exact of 32).
        if let Some(d) = unsafe { crate::quant::arm::act::q8_block(x, qs) } {
            return d;
        }
    }
    let _ = simd;
    q8_block(x, qs)
}

/// Quantizes `x` (a multiple of 32 elements) to Q8_0 blocks in `out`.
pub fn quantize_q8_0(x: &[f32], out: &mut [u8]) {
    quantize_q8_0_with(simd(), x, out)
}

/// [`quantize_q8_0`], on the SIMD path or not.
pub(crate) fn quantize_q8_0_with(simd: bool, x: &[f32], out: &mut [u8]) {
    use layout::q8_0::*;
    assert!(
        x.len().is_multiple_of(QK8),
        "Q8_0 rows need a multiple of 32 elements"
    );
    assert_eq!(out.len(), x.len() / QK8 * 34, "Q8_0 output length");
    for (x, b) in x.chunks_exact(QK8).zip(out.chunks_exact_mut(34)) {
        let d = block(simd, x, &mut b[QS..QS + QK8]);
        b[D..D + 2].copy_from_slice(&f16_sat_bytes(d));
    }
}

/// Quantizes `x` (a multiple of 32 elements) to Q8_1 blocks in `out`: Q8_0's
/// codes and scale plus `s` = f16(d * sum of codes), with d the f32 scale
/// before its f16 rounding (as llama.cpp computes it).
pub fn quantize_q8_1(x: &[f32], out: &mut [u8]) {
    quantize_q8_1_with(simd(), x, out)
}

/// [`quantize_q8_1`], on the SIMD path or not.
pub(crate) fn quantize_q8_1_with(simd: bool, x: &[f32], out: &mut [u8]) {
    use layout::q8_1::*;
    assert!(
        x.len().is_multiple_of(QK8),
        "Q8_1 rows need a multiple of 32 elements"
    );
    assert_eq!(out.len(), x.len() / QK8 * 36, "Q8_1 output length");
    for (x, b) in x.chunks_exact(QK8).zip(out.chunks_exact_mut(36)) {
        let d = block(simd, x, &mut b[QS..QS + QK8]);
        let sum: i32 = b[QS..QS + QK8].iter().map(|&q| q as i8 as i32).sum();
        b[D..D + 2].copy_from_slice(&f16_sat_bytes(d));
        b[S..S + 2].copy_from_slice(&f16_sat_bytes(d * sum as f32));
    }
}

/// Quantizes `x` (a multiple of 256 elements) to Q8_K blocks in `out`.
///
/// As llama.cpp's `quantize_row_q8_K_ref`: the multiplier is -127/max where
/// max is the signed value of largest magnitude (the first one on ties), so
/// that value gets code -127; codes are capped at 127; d = 1/multiplier (f32,
/// negative when max is positive); bsums hold the sums of each 16 codes.
pub fn quantize_q8_k(x: &[f32], out: &mut [u8]) {
    quantize_q8_k_with(simd(), x, out)
}

/// [`quantize_q8_k`], on the SIMD path or not.
pub(crate) fn quantize_q8_k_with(simd: bool, x: &[f32], out: &mut [u8]) {
    use layout::q8_k::*;
    let bb = onebit_formats::GgmlType::Q8K.block_bytes();
    assert!(
        x.len().is_multiple_of(QK_K),
        "Q8_K rows need a multiple of 256 elements"
    );
    assert_eq!(out.len(), x.len() / QK_K * bb, "Q8_K output length");
    for (x, b) in x.chunks_exact(QK_K).zip(out.chunks_exact_mut(bb)) {
        #[cfg(target_arch = "x86_64")]
        if simd {
            // SAFETY: `simd` is true only when AVX2 was detected; `x` has 256
            // elements and `b` is one Q8_K block.
            if unsafe { avx2::q8k_block(x, b) } {
                continue;
            }
        }
        #[cfg(target_arch = "aarch64")]
        if simd {
            // SAFETY: `simd` is true only at a NEON level; `x` has 256
            // elements and `b` is one Q8_K block.
            if unsafe { crate::quant::arm::act::q8k_block(x, b) } {
                continue;
            }
        }
        let (mut amax, mut max) = (0f32, 0f32);
        for &v in x {
            if v.abs() > amax {
                amax = v.abs();
                max = v;
            }
        }
        let iscale = if amax == 0.0 { 0.0 } else { -127.0 / max };
        let (iscale, d) = if iscale != 0.0 && iscale.is_finite() {
            (iscale, 1.0 / iscale)
        } else {
            (0.0, 0.0)
        };
        b[D..D + 4].copy_from_slice(&d.to_le_bytes());
        let qs = &mut b[QS..QS + QK_K];
        for (q, &v) in qs.iter_mut().zip(x) {
            *q = round_code(v * iscale) as u8;
        }
        let mut sums = [0i16; QK_K / 16];
        for (s, group) in sums.iter_mut().zip(qs.chunks_exact(16)) {
            *s = group.iter().map(|&q| q as i8 as i16).sum();
        }
        for (j, s) in sums.iter().enumerate() {
            b[BSUMS + 2 * j..BSUMS + 2 * j + 2].copy_from_slice(&s.to_le_bytes());
        }
    }
}

/// AVX2 block quantizers: the same IEEE operations as the scalar code (the
/// multiply by the same multiplier, round half to even, clamp), so the same
/// codes. Blocks with a NaN or infinity go to the scalar code.
#[cfg(target_arch = "x86_64")]
mod avx2 {
    use core::arch::x86_64::*;
    use onebit_formats::blocks::layout::q8_k::{BSUMS, D, QS};

    /// Codes of 32 values times `id`: round half even, clamp to +-127, as i8.
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    unsafe fn codes32(v: [__m256; 4], id: __m256, out: *mut u8) {
        let lim = _mm256_set1_ps(127.0);
        let nlim = _mm256_set1_ps(-127.0);
        let mut q = [_mm256_setzero_si256(); 4];
        for (q, v) in q.iter_mut().zip(v) {
            let r = _mm256_round_ps(
                _mm256_mul_ps(v, id),
                _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC,
            );
            *q = _mm256_cvtps_epi32(_mm256_max_ps(_mm256_min_ps(r, lim), nlim));
        }
        // Pack i32 -> i16 -> i8 (values fit), then undo the lane interleave.
        let a = _mm256_packs_epi32(q[0], q[1]);
        let b = _mm256_packs_epi32(q[2], q[3]);
        let c = _mm256_packs_epi16(a, b);
        let c = _mm256_permutevar8x32_epi32(c, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256(out as *mut __m256i, c);
    }

    /// Whether all 8 values are finite.
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    fn finite(v: __m256) -> bool {
        // x - x is 0 for finite x, NaN for NaN and infinities.
        let z = _mm256_sub_ps(v, v);
        _mm256_movemask_ps(_mm256_cmp_ps(z, z, _CMP_ORD_Q)) == 0xFF
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    fn hmax(v: __m256) -> f32 {
        let m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
        let m = _mm_max_ss(m, _mm_shuffle_ps(m, m, 1));
        _mm_cvtss_f32(m)
    }

    /// A Q8_0/Q8_1 block: codes into `qs`, returns d; None (nothing written)
    /// when a value is not finite.
    ///
    /// # Safety
    /// AVX2, FMA and F16C are available; `x` and `qs` have at least 32 elements.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn q8_block(x: &[f32], qs: &mut [u8]) -> Option<f32> {
        let p = x.as_ptr();
        let v = [
            _mm256_loadu_ps(p),
            _mm256_loadu_ps(p.add(8)),
            _mm256_loadu_ps(p.add(16)),
            _mm256_loadu_ps(p.add(24)),
        ];
        if !v.iter().all(|&v| finite(v)) {
            return None;
        }
        let abs = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFF_FFFF));
        let mut m = _mm256_and_ps(v[0], abs);
        for &v in &v[1..] {
            m = _mm256_max_ps(m, _mm256_and_ps(v, abs));
        }
        let (d, id) = super::q8_scales(hmax(m));
        codes32(v, _mm256_set1_ps(id), qs.as_mut_ptr());
        Some(d)
    }

    /// A Q8_K block into `b`; false (nothing written) when a value is not finite.
    ///
    /// # Safety
    /// AVX2, FMA and F16C are available; `x` has 256 elements, `b` is a Q8_K block.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn q8k_block(x: &[f32], b: &mut [u8]) -> bool {
        let p = x.as_ptr();
        let abs = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFF_FFFF));
        let mut m = _mm256_setzero_ps();
        for i in 0..32 {
            let v = _mm256_loadu_ps(p.add(8 * i));
            if !finite(v) {
                return false;
            }
            m = _mm256_max_ps(m, _mm256_and_ps(v, abs));
        }
        let amax = hmax(m);
        // The first value of largest magnitude, as the scalar scan finds it.
        let max = x.iter().copied().find(|v| v.abs() == amax).unwrap_or(0.0);
        let iscale = if amax == 0.0 { 0.0 } else { -127.0 / max };
        let (iscale, d) = if iscale != 0.0 && iscale.is_finite() {
            (iscale, 1.0 / iscale)
        } else {
            (0.0, 0.0)
        };
        b[D..D + 4].copy_from_slice(&d.to_le_bytes());
        let id = _mm256_set1_ps(iscale);
        let qs = b.as_mut_ptr().add(QS);
        for c in 0..8 {
            let v = [
                _mm256_loadu_ps(p.add(32 * c)),
                _mm256_loadu_ps(p.add(32 * c + 8)),
                _mm256_loadu_ps(p.add(32 * c + 16)),
                _mm256_loadu_ps(p.add(32 * c + 24)),
            ];
            codes32(v, id, qs.add(32 * c));
        }
        // Sums of each 16 codes: sign-extend to i16, add adjacent, then fold.
        for g in 0..16 {
            let c = _mm_loadu_si128(qs.add(16 * g) as *const __m128i);
            let w = _mm256_cvtepi8_epi16(c);
            let s = _mm256_madd_epi16(w, _mm256_set1_epi16(1));
            let s = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
            let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
            let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
            let sum = _mm_cvtsi128_si32(s) as i16;
            b[BSUMS + 2 * g..BSUMS + 2 * g + 2].copy_from_slice(&sum.to_le_bytes());
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rows with ties (values that land on .5 after scaling), zeros, tiny
    /// and huge magnitudes, and a NaN/inf block.
    fn rows() -> Vec<Vec<f32>> {
        let mut seed = 7u64;
        let mut next = move || {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((seed >> 33) as f32 / (1u64 << 31) as f32) * 2.0 - 1.0
        };
        let mut out = Vec::new();
        for scale in [1.0, 1e-3, 1e-30, 3e4, 1e7, 1e38] {
            out.push((0..512).map(|_| next() * scale).collect());
        }
        // Ties: amax 127 so id = 1, and halves everywhere.
        out.push(
            (0..512)
                .map(|i| {
                    if i % 32 == 0 {
                        127.0
                    } else {
                        (i % 9) as f32 - 4.5
                    }
                })
                .collect(),
        );
        out.push(vec![0.0; 512]);
        let mut special: Vec<f32> = (0..512).map(|_| next()).collect();
        special[3] = f32::NAN;
        special[300] = f32::INFINITY;
        special[40] = -0.0;
        out.push(special);
        out
    }

    #[test]
    fn simd_quantizers_equal_the_scalar_ones() {
        let level = crate::quant::Isa::best().name();
        if !simd() {
            println!("SIMD quantizers not run: the level in use is {level}");
            return;
        }
        println!("SIMD quantizers checked at level {level}");
        for x in rows() {
            for (f, bb, bl) in [
                (quantize_q8_0_with as fn(bool, &[f32], &mut [u8]), 34, 32),
                (quantize_q8_1_with, 36, 32),
                (quantize_q8_k_with, 292, 256),
            ] {
                let (mut a, mut b) = (vec![0u8; x.len() / bl * bb], vec![0u8; x.len() / bl * bb]);
                f(true, &x, &mut a);
                f(false, &x, &mut b);
                assert_eq!(a, b, "block bytes {bb}");
            }
        }
    }
}
