//! Activation quantizers: Q8_0, Q8_1 (blocks of 32) and Q8_K (blocks of 256).
//! Rounding and the overflow rules are described in the module docs of
//! [`crate::quant`].

use half::f16;
use onebit_formats::blocks::{layout, QK_K};

/// The largest finite f16, the scale a Q8_0/Q8_1 block saturates to.
pub const F16_MAX: f32 = 65504.0;

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
    let mut d = amax / 127.0;
    let id = if f16::from_f32(d).is_infinite() {
        // amax/127 does not fit an f16 scale: saturate the scale and the codes.
        d = F16_MAX;
        1.0 / F16_MAX
    } else if amax == 0.0 {
        0.0
    } else {
        // Not finite only when amax is subnormal; then d rounds to 0 anyway.
        let id = 127.0 / amax;
        if id.is_finite() {
            id
        } else {
            0.0
        }
    };
    for (q, &v) in qs.iter_mut().zip(x) {
        *q = round_code(v * id) as u8;
    }
    d
}

/// Quantizes `x` (a multiple of 32 elements) to Q8_0 blocks in `out`.
pub fn quantize_q8_0(x: &[f32], out: &mut [u8]) {
    use layout::q8_0::*;
    assert!(
        x.len().is_multiple_of(QK8),
        "Q8_0 rows need a multiple of 32 elements"
    );
    assert_eq!(out.len(), x.len() / QK8 * 34, "Q8_0 output length");
    for (x, b) in x.chunks_exact(QK8).zip(out.chunks_exact_mut(34)) {
        let d = q8_block(x, &mut b[QS..QS + QK8]);
        b[D..D + 2].copy_from_slice(&f16_sat_bytes(d));
    }
}

/// Quantizes `x` (a multiple of 32 elements) to Q8_1 blocks in `out`: Q8_0's
/// codes and scale plus `s` = f16(d * sum of codes), with d the f32 scale
/// before its f16 rounding (as llama.cpp computes it).
pub fn quantize_q8_1(x: &[f32], out: &mut [u8]) {
    use layout::q8_1::*;
    assert!(
        x.len().is_multiple_of(QK8),
        "Q8_1 rows need a multiple of 32 elements"
    );
    assert_eq!(out.len(), x.len() / QK8 * 36, "Q8_1 output length");
    for (x, b) in x.chunks_exact(QK8).zip(out.chunks_exact_mut(36)) {
        let d = q8_block(x, &mut b[QS..QS + QK8]);
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
    use layout::q8_k::*;
    let bb = onebit_formats::GgmlType::Q8K.block_bytes();
    assert!(
        x.len().is_multiple_of(QK_K),
        "Q8_K rows need a multiple of 256 elements"
    );
    assert_eq!(out.len(), x.len() / QK_K * bb, "Q8_K output length");
    for (x, b) in x.chunks_exact(QK_K).zip(out.chunks_exact_mut(bb)) {
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
