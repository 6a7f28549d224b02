//! The aarch64 micro-kernel of [`super`]: 6 rows x 1 panel, 24 q-register
//! accumulators (a panel's 16 columns as four f32x4), each input's 16
//! weights two 128-bit loads widened by `fcvtl`/`fcvtl2` (inline assembly:
//! the f16 vector types of `std::arch` are not stable). Invariant: lane j
//! of accumulator (i, v) is output element (row i, column 16 p + 4 v + j)
//! and only receives `vfmaq_n_f32(acc, w, x)` (`fmla`, fused) of its own
//! weight and activation, inputs in order: the reference's chain, so the
//! bits equal [`super::matmul_reference`]'s.

use std::arch::aarch64::*;
use std::arch::asm;

use super::{Tile, NR};

/// Runs a NEON tile of `m` (1..=6) rows by one panel.
///
/// # Safety
/// `a` describes one readable panel of `a.kn` inputs, `m` readable
/// activation rows of `a.kn` values and a writable `m` x 16 block of `out`.
pub(super) unsafe fn run_neon(a: &Tile, m: usize, np: usize) {
    debug_assert_eq!(np, 1);
    match m {
        1 => tile::<1>(a),
        2 => tile::<2>(a),
        3 => tile::<3>(a),
        4 => tile::<4>(a),
        5 => tile::<5>(a),
        6 => tile::<6>(a),
        _ => unreachable!("NEON tiles have 1 to 6 rows"),
    }
}

/// Eight f16 bit patterns widened exactly to two f32x4 (low half first).
#[inline(always)]
unsafe fn widen(h: uint16x8_t) -> (float32x4_t, float32x4_t) {
    let lo: float32x4_t;
    let hi: float32x4_t;
    // SAFETY: register-only conversions (FCVTL/FCVTL2 are base AdvSIMD);
    // `out` registers are distinct from the input, so the second
    // instruction still reads the input.
    asm!(
        "fcvtl {lo:v}.4s, {h:v}.4h",
        "fcvtl2 {hi:v}.4s, {h:v}.8h",
        h = in(vreg) h,
        lo = out(vreg) lo,
        hi = out(vreg) hi,
        options(pure, nomem, nostack)
    );
    (lo, hi)
}

#[target_feature(enable = "neon")]
unsafe fn tile<const M: usize>(a: &Tile) {
    let mut acc = [[vdupq_n_f32(0.0); 4]; M];
    if !a.first {
        for (i, row) in acc.iter_mut().enumerate() {
            for (v, r) in row.iter_mut().enumerate() {
                *r = vld1q_f32(a.out.add(i * a.os + v * 4));
            }
        }
    }
    let mut xp = [a.x; M];
    for (i, p) in xp.iter_mut().enumerate() {
        *p = a.x.add(i * a.xs);
    }
    for k in 0..a.kn {
        let wk = a.w.add(k * NR);
        let (w0, w1) = widen(vld1q_u16(wk));
        let (w2, w3) = widen(vld1q_u16(wk.add(8)));
        for i in 0..M {
            let xv = *xp[i].add(k);
            acc[i][0] = vfmaq_n_f32(acc[i][0], w0, xv);
            acc[i][1] = vfmaq_n_f32(acc[i][1], w1, xv);
            acc[i][2] = vfmaq_n_f32(acc[i][2], w2, xv);
            acc[i][3] = vfmaq_n_f32(acc[i][3], w3, xv);
        }
    }
    for (i, row) in acc.iter().enumerate() {
        for (v, r) in row.iter().enumerate() {
            vst1q_f32(a.out.add(i * a.os + v * 4), *r);
        }
    }
}
