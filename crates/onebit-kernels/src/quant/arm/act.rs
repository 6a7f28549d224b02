//! NEON activation quantizers (Q8_0/Q8_1 and Q8_K blocks): the same IEEE
//! operations as the scalar code in `quant/act.rs` (multiply by the same
//! multiplier, round half to even with `frintn`, clamp to +-127), so the
//! same codes. Blocks holding a NaN or an infinity are left to the scalar
//! code. Base Advanced SIMD only: every aarch64 level runs them.

use core::arch::aarch64::*;
use onebit_formats::blocks::layout::q8_k::{BSUMS, D, QS};

/// Codes of 16 values times `id` (round half even, clamp to +-127) as i8.
#[target_feature(enable = "neon")]
#[inline]
fn codes16(v: [float32x4_t; 4], id: float32x4_t) -> int8x16_t {
    let lim = vdupq_n_f32(127.0);
    let nlim = vdupq_n_f32(-127.0);
    let q = v.map(|v| {
        let r = vrndnq_f32(vmulq_f32(v, id));
        vcvtq_s32_f32(vmaxq_f32(vminq_f32(r, lim), nlim))
    });
    let a = vcombine_s16(vmovn_s32(q[0]), vmovn_s32(q[1]));
    let b = vcombine_s16(vmovn_s32(q[2]), vmovn_s32(q[3]));
    vcombine_s8(vmovn_s16(a), vmovn_s16(b))
}

/// Whether all four values are finite (x - x is 0 for them, NaN otherwise).
#[target_feature(enable = "neon")]
#[inline]
fn finite(v: float32x4_t) -> bool {
    let z = vsubq_f32(v, v);
    vminvq_u32(vceqq_f32(z, z)) == u32::MAX
}

/// Loads 16 values from `p`.
///
/// # Safety
/// `p` is valid for reading 16 f32.
#[target_feature(enable = "neon")]
#[inline]
unsafe fn load16(p: *const f32) -> [float32x4_t; 4] {
    [
        vld1q_f32(p),
        vld1q_f32(p.add(4)),
        vld1q_f32(p.add(8)),
        vld1q_f32(p.add(12)),
    ]
}

/// The largest |v| of the vectors.
#[target_feature(enable = "neon")]
#[inline]
fn amax(v: &[float32x4_t]) -> f32 {
    let m = v
        .iter()
        .fold(vdupq_n_f32(0.0), |m, &v| vmaxq_f32(m, vabsq_f32(v)));
    vmaxvq_f32(m)
}

/// A Q8_0/Q8_1 block: codes into `qs`, returns d; None (nothing written)
/// when a value is not finite.
///
/// # Safety
/// NEON is available (always on aarch64); `x` and `qs` have at least 32 elements.
#[target_feature(enable = "neon")]
pub unsafe fn q8_block(x: &[f32], qs: &mut [u8]) -> Option<f32> {
    let p = x.as_ptr();
    let (a, b) = (load16(p), load16(p.add(16)));
    if !a.iter().chain(&b).all(|&v| finite(v)) {
        return None;
    }
    let m = amax(&[a[0], a[1], a[2], a[3], b[0], b[1], b[2], b[3]]);
    let (d, id) = crate::quant::scale::q8_scales(m);
    let id = vdupq_n_f32(id);
    let q = qs.as_mut_ptr() as *mut i8;
    vst1q_s8(q, codes16(a, id));
    vst1q_s8(q.add(16), codes16(b, id));
    Some(d)
}

/// A Q8_K block into `b`; false (nothing written) when a value is not finite.
///
/// # Safety
/// NEON is available (always on aarch64); `x` has 256 elements, `b` is a Q8_K block.
#[target_feature(enable = "neon")]
pub unsafe fn q8k_block(x: &[f32], b: &mut [u8]) -> bool {
    let p = x.as_ptr();
    let mut m = vdupq_n_f32(0.0);
    for i in 0..64 {
        let v = vld1q_f32(p.add(4 * i));
        if !finite(v) {
            return false;
        }
        m = vmaxq_f32(m, vabsq_f32(v));
    }
    let amax = vmaxvq_f32(m);
    // The first value of largest magnitude, as the scalar scan finds it.
    let max = x.iter().copied().find(|v| v.abs() == amax).unwrap_or(0.0);
    let iscale = if amax == 0.0 { 0.0 } else { -127.0 / max };
    let (iscale, d) = if iscale != 0.0 && iscale.is_finite() {
        (iscale, 1.0 / iscale)
    } else {
        (0.0, 0.0)
    };
    b[D..D + 4].copy_from_slice(&d.to_le_bytes());
    let id = vdupq_n_f32(iscale);
    for g in 0..16 {
        let c = codes16(load16(p.add(16 * g)), id);
        vst1q_s8(b.as_mut_ptr().add(QS + 16 * g) as *mut i8, c);
        // Sum of the 16 codes, widened (|sum| <= 2032 fits i16).
        let sum = vaddlvq_s8(c);
        b[BSUMS + 2 * g..BSUMS + 2 * g + 2].copy_from_slice(&sum.to_le_bytes());
    }
    true
}
