//! The x86 micro-kernels of [`super`]: AVX-512 (8 rows x 3 panels, 24 zmm
//! accumulators, each panel one 256-bit load widened by `vcvtph2ps`) and
//! AVX2 (6 rows x 1 panel, 12 ymm accumulators, a panel two 128-bit loads
//! widened). Invariant: lane j of accumulator (i, v) is output element
//! (row i, column 16 p + lanes * v + j) and only ever receives
//! `_mm*_fmadd_ps(w, x, acc)` of its own weight and activation, inputs in
//! order: the reference's chain (see the module above), so the bits equal
//! [`super::matmul_reference`]'s.

use std::arch::x86_64::*;

use super::{Tile, NR};

/// Runs an AVX-512 tile of `m` (1..=8) rows by `np` (1..=3) panels.
///
/// # Safety
/// The CPU has AVX-512F and F16C; `a` describes `np` readable panels of
/// `a.kn` inputs, `m` readable activation rows of `a.kn` values and a
/// writable `m` x `np * 16` block of `out`.
pub(super) unsafe fn run_avx512(a: &Tile, m: usize, np: usize) {
    macro_rules! go {
        ($($m:literal)*) => {
            match (m, np) {
                $(($m, 1) => tile512::<$m, 1>(a),
                ($m, 2) => tile512::<$m, 2>(a),
                ($m, _) => tile512::<$m, 3>(a),)*
                _ => unreachable!("AVX-512 tiles have 1 to 8 rows"),
            }
        };
    }
    go!(1 2 3 4 5 6 7 8)
}

/// Runs an AVX2 tile of `m` (1..=6) rows by one panel.
///
/// # Safety
/// As [`run_avx512`], for a CPU with AVX2, FMA and F16C and `np` = 1.
pub(super) unsafe fn run_avx2(a: &Tile, m: usize, np: usize) {
    debug_assert_eq!(np, 1);
    match m {
        1 => tile256::<1>(a),
        2 => tile256::<2>(a),
        3 => tile256::<3>(a),
        4 => tile256::<4>(a),
        5 => tile256::<5>(a),
        6 => tile256::<6>(a),
        _ => unreachable!("AVX2 tiles have 1 to 6 rows"),
    }
}

#[target_feature(enable = "avx512f,avx2,fma,f16c")]
unsafe fn tile512<const M: usize, const P: usize>(a: &Tile) {
    let mut acc = [[_mm512_setzero_ps(); P]; M];
    if !a.first {
        for (i, row) in acc.iter_mut().enumerate() {
            for (v, r) in row.iter_mut().enumerate() {
                *r = _mm512_loadu_ps(a.out.add(i * a.os + v * NR));
            }
        }
    }
    let mut xp = [a.x; M];
    for (i, p) in xp.iter_mut().enumerate() {
        *p = a.x.add(i * a.xs);
    }
    for k in 0..a.kn {
        let mut w = [_mm512_setzero_ps(); P];
        for (v, wv) in w.iter_mut().enumerate() {
            *wv = _mm512_cvtph_ps(_mm256_loadu_si256(
                a.w.add(v * a.ps + k * NR) as *const __m256i
            ));
        }
        for i in 0..M {
            let xv = _mm512_set1_ps(*xp[i].add(k));
            for v in 0..P {
                acc[i][v] = _mm512_fmadd_ps(w[v], xv, acc[i][v]);
            }
        }
    }
    for (i, row) in acc.iter().enumerate() {
        for (v, r) in row.iter().enumerate() {
            _mm512_storeu_ps(a.out.add(i * a.os + v * NR), *r);
        }
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn tile256<const M: usize>(a: &Tile) {
    let mut acc = [[_mm256_setzero_ps(); 2]; M];
    if !a.first {
        for (i, row) in acc.iter_mut().enumerate() {
            for (h, r) in row.iter_mut().enumerate() {
                *r = _mm256_loadu_ps(a.out.add(i * a.os + h * 8));
            }
        }
    }
    let mut xp = [a.x; M];
    for (i, p) in xp.iter_mut().enumerate() {
        *p = a.x.add(i * a.xs);
    }
    for k in 0..a.kn {
        let wk = a.w.add(k * NR);
        let w0 = _mm256_cvtph_ps(_mm_loadu_si128(wk as *const __m128i));
        let w1 = _mm256_cvtph_ps(_mm_loadu_si128(wk.add(8) as *const __m128i));
        for i in 0..M {
            let xv = _mm256_set1_ps(*xp[i].add(k));
            acc[i][0] = _mm256_fmadd_ps(w0, xv, acc[i][0]);
            acc[i][1] = _mm256_fmadd_ps(w1, xv, acc[i][1]);
        }
    }
    for (i, row) in acc.iter().enumerate() {
        for (h, r) in row.iter().enumerate() {
            _mm256_storeu_ps(a.out.add(i * a.os + h * 8), *r);
        }
    }
}
