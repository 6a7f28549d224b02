//! FEAT_I8MM kernels: for blocks of 32 (Q4_0, Q4_1, Q5_0, Q8_0), tiles of
//! 2 weight rows x 2 tokens whose four integer block sums come from four
//! `smmla` (each a 2x8 by 8x2 product of i8 into a 2x2 of i32); rows and
//! tokens left over at the edges, decode (one token) and the K-quant and F32
//! kernels run the `dotprod` bodies (`sdot`), which this level includes.

use core::arch::aarch64::*;

use super::dotprod::dot;

arm_kernels!("neon,dotprod,i8mm");

/// acc + the 2x2 product of a's two 8-byte rows with b's two 8-byte rows:
/// lanes (a0·b0, a0·b1, a1·b0, a1·b1) (`smmla`).
#[target_feature(enable = "neon,dotprod,i8mm")]
#[inline]
fn mmla(acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t {
    let mut acc = acc;
    // SAFETY: `smmla` needs FEAT_I8MM, which this function's target
    // features (checked by the dispatcher before any call) provide; it
    // reads and writes only the three registers.
    unsafe {
        core::arch::asm!(
            "smmla {0:v}.4s, {1:v}.16b, {2:v}.16b",
            inout(vreg) acc,
            in(vreg) a,
            in(vreg) b,
            options(pure, nomem, nostack)
        );
    }
    acc
}

/// This level's kernel for weight type `t`, if it has one.
pub fn gemm_fn(t: GgmlType) -> Option<GemmFn> {
    let f: GemmFn = match t {
        GgmlType::Q4_0 => gemm_mm::<0>,
        GgmlType::Q4_1 => gemm_mm::<1>,
        GgmlType::Q5_0 => gemm_mm::<2>,
        GgmlType::Q8_0 => gemm_mm::<3>,
        _ => return base_gemm_fn(t),
    };
    Some(f)
}

/// 2 x 2 `smmla` tiles; a row or token left over runs `tile_b32`.
#[target_feature(enable = "neon,dotprod,i8mm")]
unsafe fn gemm_mm<const K: u8>(
    ops: &Operands,
    nrows: usize,
    ntok: usize,
    out: *mut f32,
    os: usize,
) {
    let mut r = 0;
    while r + 2 <= nrows {
        let mut t = 0;
        while t + 2 <= ntok {
            tile_mm::<K>(ops, r, t, out, os);
            t += 2;
        }
        if t < ntok {
            tile_b32::<K, 1>(ops, r, t, out, os);
            tile_b32::<K, 1>(ops, r + 1, t, out, os);
        }
        r += 2;
    }
    if r < nrows {
        drive!(tile_b32, K; ops, r..nrows, ntok, out, os);
    }
}

/// The low 8 bytes of `x` and `y` as one vector, and their high 8 bytes.
#[target_feature(enable = "neon,dotprod,i8mm")]
#[inline]
fn zip_halves(x: int8x16_t, y: int8x16_t) -> (int8x16_t, int8x16_t) {
    let (x, y) = (vreinterpretq_s64_s8(x), vreinterpretq_s64_s8(y));
    (
        vreinterpretq_s8_s64(vzip1q_s64(x, y)),
        vreinterpretq_s8_s64(vzip2q_s64(x, y)),
    )
}

/// Rows r, r + 1 times tokens t0, t0 + 1. Per block, the four pairs' integer
/// sums in one vector (pair p = 2 * row + token), their float terms
/// (dx * dy) * sumi [+ m * s] lane-wise, added into accumulator b % 8: lane p
/// of accumulator k is lane k of pair p's scalar reference.
#[target_feature(enable = "neon,dotprod,i8mm")]
#[inline]
unsafe fn tile_mm<const K: u8>(ops: &Operands, r: usize, t0: usize, out: *mut f32, os: usize) {
    let nb = ops.cols / 32;
    let (wbb, abb, aq) = b32_sizes(K);
    let wp = [
        ops.w.as_ptr().add(r * ops.wrb),
        ops.w.as_ptr().add((r + 1) * ops.wrb),
    ];
    let ap = [
        ops.a.as_ptr().add(t0 * ops.arb),
        ops.a.as_ptr().add((t0 + 1) * ops.arb),
    ];
    let zero = vdupq_n_s32(0);
    let mut facc = [vdupq_n_f32(0.0); 8];
    for b in 0..nb {
        let (bx0, bx1) = (wp[0].add(b * wbb), wp[1].add(b * wbb));
        let (by0, by1) = (ap[0].add(b * abb), ap[1].add(b * abb));
        let (a0, a1) = codes::<K>(bx0);
        let (b0, b1) = codes::<K>(bx1);
        let ld = |p: *const u8| vld1q_s8(p as *const i8);
        let (w00, w01) = zip_halves(a0, b0);
        let (w10, w11) = zip_halves(a1, b1);
        let (y00, y01) = zip_halves(ld(by0.add(aq)), ld(by1.add(aq)));
        let (y10, y11) = zip_halves(ld(by0.add(aq + 16)), ld(by1.add(aq + 16)));
        let s = mmla(
            mmla(mmla(mmla(zero, w00, y00), w01, y01), w10, y10),
            w11,
            y11,
        );
        let f = |p: *const u8, at: usize| f16_at(core::slice::from_raw_parts(p, at + 2), at);
        let v4 = |a: f32, b: f32, c: f32, d: f32| vld1q_f32([a, b, c, d].as_ptr());
        let (dx0, dx1, dy0, dy1) = (f(bx0, 0), f(bx1, 0), f(by0, 0), f(by1, 0));
        let mut term = vmulq_f32(
            vmulq_f32(v4(dx0, dx0, dx1, dx1), v4(dy0, dy1, dy0, dy1)),
            vcvtq_f32_s32(s),
        );
        if K == 1 {
            let (m0, m1, s0, s1) = (f(bx0, 2), f(bx1, 2), f(by0, 2), f(by1, 2));
            term = vaddq_f32(term, vmulq_f32(v4(m0, m0, m1, m1), v4(s0, s1, s0, s1)));
        }
        facc[b % 8] = vaddq_f32(facc[b % 8], term);
    }
    // lanes[p][k]: lane p of accumulator k, pair p's reference lane k.
    let mut lanes = [[0f32; 8]; 4];
    for (k, v) in facc.iter().enumerate() {
        let mut l4 = [0f32; 4];
        vst1q_f32(l4.as_mut_ptr(), *v);
        for (p, x) in l4.into_iter().enumerate() {
            lanes[p][k] = x;
        }
    }
    for (p, lanes) in lanes.iter().enumerate() {
        *out.add((t0 + p % 2) * os + r + p / 2) = reduce8(lanes);
    }
}
