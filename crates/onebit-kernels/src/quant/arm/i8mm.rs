//! FEAT_I8MM kernels: `smmla` (a 2x8 by 8x2 product of i8 into a 2x2 of
//! i32) is built for 2 weight rows x 2 tokens, so from two tokens on the
//! tiles are 2 rows x 2 or 4 tokens (one or two token pairs), each weight
//! block of the two rows decoded once for the tile's tokens. Blocks of 32
//! (Q4_0, Q4_1, Q5_0, Q8_0, MXFP4) run the shared 2-row tiles of `rows.rs`
//! with this level's [`quad32`] (four `smmla` per block and token pair);
//! K-quants (Q4_K, Q5_K, Q6_K) the tiles here, four `smmla` per 32-element
//! sub-block, times the rows' scales lane-wise. Rows and tokens left over
//! at the edges, decode (one token) and F32 run the `dotprod` bodies
//! (`sdot`), which this level includes. Each (row, token) lane follows the
//! scalar reference's float order, so every output is its bits.

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
        GgmlType::Q4K => gemm_kq_mm::<4>,
        GgmlType::Q5K => gemm_kq_mm::<5>,
        GgmlType::Q6K => gemm_kq_mm::<6>,
        _ => return base_gemm_fn(t),
    };
    Some(f)
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

/// The four sums over 32 elements of 2 weight rows (`w0`, `w1`: elements
/// 0..16, 16..32) times 2 tokens (`y0`, `y1`), lane 2 * row + token: four
/// `smmla` on the rows' and the tokens' 8-byte halves zipped.
#[target_feature(enable = "neon,dotprod,i8mm")]
#[inline]
fn quad32(
    w0: (int8x16_t, int8x16_t),
    w1: (int8x16_t, int8x16_t),
    y0: (int8x16_t, int8x16_t),
    y1: (int8x16_t, int8x16_t),
) -> int32x4_t {
    let (a0, a1) = zip_halves(w0.0, w1.0);
    let (a2, a3) = zip_halves(w0.1, w1.1);
    let (b0, b1) = zip_halves(y0.0, y1.0);
    let (b2, b3) = zip_halves(y0.1, y1.1);
    let zero = vdupq_n_s32(0);
    mmla(mmla(mmla(mmla(zero, a0, b0), a1, b1), a2, b2), a3, b3)
}

// ---------------------------------------------------------------------------
// K-quants (Q4_K: K = 4, Q5_K: K = 5, Q6_K: K = 6), 2 rows x 2P tokens.

/// One token runs the one-token kernel; more, 2 rows x 4 (then 2) tokens
/// `smmla` tiles, a token left over `tile_kq_rows` (2 x 1), a row left
/// over `tile_kq_rows` (1 x 4, then 1 x 1).
#[target_feature(enable = "neon,dotprod,i8mm")]
unsafe fn gemm_kq_mm<const K: u8>(
    ops: &Operands,
    nrows: usize,
    ntok: usize,
    out: *mut f32,
    os: usize,
) {
    if ntok < 2 {
        let f = base_gemm_fn(if K == 6 {
            GgmlType::Q6K
        } else if K == 5 {
            GgmlType::Q5K
        } else {
            GgmlType::Q4K
        })
        .expect("every level has the K-quant kernels");
        f(ops, nrows, ntok, out, os);
        return;
    }
    drive_pairs!(tile_kq_mm, K; ops, nrows, ntok, out, os;
        |r, t| tile_kq_rows::<K, 2, 1>(ops, r, t, out, os);
        |r| drive!(tile_kq_rows, K, 1; ops, r..nrows, ntok, out, os));
}

/// Rows r, r + 1 times tokens t0..t0 + 2P. Per super-block and 32-element
/// sub-block: both rows' codes ([`kq_codes`]) zipped once, then per token
/// pair four `smmla` (Q6_K: two per 16-element scale), times the rows'
/// scales lane-wise (lane q = 2 * row + token): the exact integer sums of
/// the scalar reference; then its float formula per lane, unfused.
#[target_feature(enable = "neon,dotprod,i8mm")]
#[inline]
unsafe fn tile_kq_mm<const K: u8, const P: usize>(
    ops: &Operands,
    r: usize,
    t0: usize,
    out: *mut f32,
    os: usize,
) {
    let bb = kq_block(K);
    let wp = ops.w_rows::<2>(r);
    let ap: [[*const u8; 2]; P] = core::array::from_fn(|p| ops.a_rows::<2>(t0 + 2 * p));
    let zero = vdupq_n_s32(0);
    let v4i = |a: i32, b: i32, c: i32, d: i32| vld1q_s32([a, b, c, d].as_ptr());
    let v4 = |a: f32, b: f32, c: f32, d: f32| vld1q_f32([a, b, c, d].as_ptr());
    let ld = |p: *const u8| vld1q_s8(p as *const i8);
    let mut acc = [vdupq_n_f32(0.0); P];
    for s in 0..ops.cols / 256 {
        let (bx0, bx1) = (wp[0].add(s * bb), wp[1].add(s * bb));
        let (sc0, mn0) = kq_scales::<K>(bx0);
        let (sc1, mn1) = kq_scales::<K>(bx1);
        let mut isum = [zero; P];
        for sub in 0..8 {
            let (a0, a1) = kq_codes::<K>(bx0, sub);
            let (b0, b1) = kq_codes::<K>(bx1, sub);
            let (w00, w01) = zip_halves(a0, b0);
            let (w10, w11) = zip_halves(a1, b1);
            let (j0, j1) = (2 * sub, 2 * sub + 1);
            let s_lo = v4i(sc0[j0], sc0[j0], sc1[j0], sc1[j0]);
            let s_hi = v4i(sc0[j1], sc0[j1], sc1[j1], sc1[j1]);
            for p in 0..P {
                let ya = ap[p][0].add(s * 292 + 4 + 32 * sub);
                let yb = ap[p][1].add(s * 292 + 4 + 32 * sub);
                let (y00, y01) = zip_halves(ld(ya), ld(yb));
                let (y10, y11) = zip_halves(ld(ya.add(16)), ld(yb.add(16)));
                if K == 6 {
                    let lo = mmla(mmla(zero, w00, y00), w01, y01);
                    let hi = mmla(mmla(zero, w10, y10), w11, y11);
                    isum[p] = vmlaq_s32(vmlaq_s32(isum[p], lo, s_lo), hi, s_hi);
                } else {
                    let t = mmla(
                        mmla(mmla(mmla(zero, w00, y00), w01, y01), w10, y10),
                        w11,
                        y11,
                    );
                    isum[p] = vmlaq_s32(isum[p], t, s_lo);
                }
            }
        }
        let (dx0, dm0) = kq_d::<K>(bx0);
        let (dx1, dm1) = kq_d::<K>(bx1);
        for p in 0..P {
            let (ya, yb) = (ap[p][0].add(s * 292), ap[p][1].add(s * 292));
            let (dya, dyb) = (
                (ya as *const f32).read_unaligned(),
                (yb as *const f32).read_unaligned(),
            );
            let dy = v4(dya, dyb, dya, dyb);
            let d = vmulq_f32(v4(dx0, dx0, dx1, dx1), dy);
            let isv = vcvtq_f32_s32(isum[p]);
            let term = if K == 6 {
                vmulq_f32(d, isv)
            } else {
                let sm = v4i(
                    kq_min_sum(ya, &mn0),
                    kq_min_sum(yb, &mn0),
                    kq_min_sum(ya, &mn1),
                    kq_min_sum(yb, &mn1),
                );
                let dmin = vmulq_f32(v4(dm0, dm0, dm1, dm1), dy);
                vsubq_f32(vmulq_f32(d, isv), vmulq_f32(dmin, vcvtq_f32_s32(sm)))
            };
            acc[p] = vaddq_f32(acc[p], term);
        }
    }
    for (p, a) in acc.iter().enumerate() {
        let mut l4 = [0f32; 4];
        vst1q_f32(l4.as_mut_ptr(), *a);
        for (q, x) in l4.into_iter().enumerate() {
            *out.add((t0 + 2 * p + q % 2) * os + r + q / 2) = x;
        }
    }
}
