//! The kernel bodies, written once over a level's integer dot product and
//! instantiated by `neon.rs`, `dotprod.rs` and `i8mm.rs` with their
//! `#[target_feature]` set: the one-token kernels here, the few-row
//! K-quant kernels in `rows.rs` ([`arm_rows!`], expanded into the same
//! level module).
//!
//! Every function here is an `unsafe fn` with the level's target features:
//! callers must run on a CPU with those features (the dispatcher checks them,
//! see [`crate::quant::Isa::supported`]) and pass operands as
//! [`super::GemmFn`] describes. Reads are unaligned loads inside the blocks of
//! the operand rows; the only writes are the `out` elements of the call.

/// Runs `$tile::<.., T>(ops, r, t, out, os)` for every row and every
/// token, TT tokens at a time, then single tokens.
macro_rules! drive {
    ($tile:ident $(, $g:expr)*; $ops:expr, $rows:expr, $ntok:expr, $out:expr, $os:expr) => {{
        let (ops, rows, ntok, out, os) = ($ops, $rows, $ntok, $out, $os);
        for r in rows {
            let mut t = 0;
            while t + TT <= ntok {
                $tile::<$({ $g },)* TT>(ops, r, t, out, os);
                t += TT;
            }
            while t < ntok {
                $tile::<$({ $g },)* 1>(ops, r, t, out, os);
                t += 1;
            }
        }
    }};
}

/// Runs 2-row tiles over rows `0..nrows`: for each pair of rows r, r + 1,
/// `$quads::<.., 2>(ops, r, t, out, os)` over 4 tokens at a time, then
/// `$quads::<.., 1>` over 2; `$odd_token` with (r, t) for a token left
/// over; then `$odd_row` with r for a row left over.
macro_rules! drive_pairs {
    ($quads:ident $(, $g:expr)*; $ops:expr, $nrows:expr, $ntok:expr, $out:expr, $os:expr;
     |$tr:ident, $tt:ident| $odd_token:expr; |$rr:ident| $odd_row:expr) => {{
        let (ops, nrows, ntok, out, os) = ($ops, $nrows, $ntok, $out, $os);
        let mut r = 0;
        while r + 2 <= nrows {
            let mut t = 0;
            while t + 4 <= ntok {
                $quads::<$({ $g },)* 2>(ops, r, t, out, os);
                t += 4;
            }
            while t + 2 <= ntok {
                $quads::<$({ $g },)* 1>(ops, r, t, out, os);
                t += 2;
            }
            if t < ntok {
                let ($tr, $tt) = (r, t);
                $odd_token;
            }
            r += 2;
        }
        if r < nrows {
            let $rr = r;
            $odd_row;
        }
    }};
}

/// Instantiates the kernels. Expects in scope a `$feat`-enabled
/// `dot(acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t` that adds
/// the 16 products `a[i] * b[i]` to the lanes of `acc` (how they spread over
/// the four lanes is up to the level: only lane totals are used).
macro_rules! arm_kernels {
    ($feat:literal) => {
        use onebit_formats::blocks::{e8m0_half, f16_at, MXFP4_CODES};
        use onebit_formats::GgmlType;

        use super::{GemmFn, Operands};
        use crate::quant::scalar::reduce8;

        /// Tokens per tile: each decoded weight block serves this many.
        const TT: usize = 4;

        /// The kernels every level shares, for weight type `t`.
        pub(super) fn base_gemm_fn(t: GgmlType) -> Option<GemmFn> {
            let f: GemmFn = match t {
                GgmlType::Q4_0 => gemm_b32::<0>,
                GgmlType::Q4_1 => gemm_b32::<1>,
                GgmlType::Q5_0 => gemm_b32::<2>,
                GgmlType::Q8_0 => gemm_b32::<3>,
                GgmlType::MXFP4 => gemm_b32::<4>,
                GgmlType::Q4K => gemm_q4_k::<4>,
                GgmlType::Q5K => gemm_q4_k::<5>,
                GgmlType::Q6K => gemm_q6_k,
                GgmlType::F32 => gemm_f32,
                _ => return None,
            };
            Some(f)
        }

        /// Four f16 values `stride` bytes apart from `p`, widened (exactly) to f32.
        #[target_feature(enable = $feat)]
        #[inline]
        pub(super) unsafe fn f16x4(p: *const u8, stride: usize) -> float32x4_t {
            let rd = |i: usize| (p.add(i * stride) as *const u16).read_unaligned();
            let h = [rd(0), rd(1), rd(2), rd(3)];
            let v = vld1_u16(h.as_ptr());
            let out: float32x4_t;
            // SAFETY: `fcvtl` (f16 -> f32, exact) is base Advanced SIMD.
            core::arch::asm!(
                "fcvtl {0:v}.4s, {1:v}.4h",
                out(vreg) out,
                in(vreg) v,
                options(pure, nomem, nostack)
            );
            out
        }

        /// Byte j = 0x10 when bit j of `m` is set, else 0 (16 bits).
        #[target_feature(enable = $feat)]
        #[inline]
        unsafe fn expand_bits(m: u16) -> uint8x16_t {
            const BITS: [u8; 16] = [1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128];
            let bytes = vcombine_u8(vdup_n_u8(m as u8), vdup_n_u8((m >> 8) as u8));
            let set = vtstq_u8(bytes, vld1q_u8(BITS.as_ptr()));
            vandq_u8(set, vdupq_n_u8(0x10))
        }

        /// The 32 codes of weight block `bx` as signed values (elements 0..16,
        /// 16..32): Q4_0 (K = 0) nibble - 8, Q4_1 (K = 1) nibble, Q5_0 (K = 2)
        /// (nibble | fifth bit << 4) - 16, Q8_0 (K = 3) the code, MXFP4 (K =
        /// 4) the doubled E2M1 value of the nibble (`tbl` over `MXFP4_CODES`).
        #[target_feature(enable = $feat)]
        #[inline]
        pub(super) unsafe fn codes<const K: u8>(bx: *const u8) -> (int8x16_t, int8x16_t) {
            if K == 3 {
                return (
                    vld1q_s8(bx.add(2) as *const i8),
                    vld1q_s8(bx.add(18) as *const i8),
                );
            }
            let qo = match K {
                0 => 2,
                1 => 4,
                2 => 6,
                _ => 1,
            };
            let v = vld1q_u8(bx.add(qo));
            let mut lo = vandq_u8(v, vdupq_n_u8(0x0F));
            let mut hi = vshrq_n_u8::<4>(v);
            if K == 4 {
                let table = vld1q_s8(MXFP4_CODES.as_ptr());
                return (vqtbl1q_s8(table, lo), vqtbl1q_s8(table, hi));
            }
            if K == 2 {
                let qh = (bx.add(2) as *const u32).read_unaligned();
                lo = vorrq_u8(lo, expand_bits(qh as u16));
                hi = vorrq_u8(hi, expand_bits((qh >> 16) as u16));
            }
            let (lo, hi) = (vreinterpretq_s8_u8(lo), vreinterpretq_s8_u8(hi));
            match K {
                0 => (vsubq_s8(lo, vdupq_n_s8(8)), vsubq_s8(hi, vdupq_n_s8(8))),
                2 => (vsubq_s8(lo, vdupq_n_s8(16)), vsubq_s8(hi, vdupq_n_s8(16))),
                _ => (lo, hi),
            }
        }

        /// Bytes of a weight block (Q4_0, Q4_1, Q5_0, Q8_0, MXFP4) and of its
        /// activation block (Q8_0, Q8_1), and where the activation codes start.
        pub(super) const fn b32_sizes(k: u8) -> (usize, usize, usize) {
            let wbb = match k {
                0 => 18,
                1 => 20,
                2 => 22,
                3 => 34,
                _ => 17,
            };
            if k == 1 {
                (wbb, 36, 4)
            } else {
                (wbb, 34, 2)
            }
        }

        // -------------------------------------------------------------------
        // Blocks of 32: Q4_0 (K = 0), Q4_1 (K = 1), Q5_0 (K = 2), Q8_0 (K = 3),
        // MXFP4 (K = 4: its scale 2^(e - 128) from the exponent byte).

        /// Four MXFP4 scales `stride` bytes apart from `p`, as f32 (exact).
        #[target_feature(enable = $feat)]
        #[inline]
        unsafe fn e8m0x4(p: *const u8, stride: usize) -> float32x4_t {
            let v = [0, 1, 2, 3].map(|i| e8m0_half(*p.add(i * stride)));
            vld1q_f32(v.as_ptr())
        }

        #[target_feature(enable = $feat)]
        unsafe fn gemm_b32<const K: u8>(
            ops: &Operands,
            nrows: usize,
            ntok: usize,
            out: *mut f32,
            os: usize,
        ) {
            if ntok >= 2 {
                gemm_b32_rows::<K>(ops, nrows, ntok, out, os);
                return;
            }
            drive!(tile_b32, K; ops, 0..nrows, ntok, out, os);
        }

        /// One weight row times T activation rows from token `t0`.
        #[target_feature(enable = $feat)]
        #[inline]
        pub(super) unsafe fn tile_b32<const K: u8, const T: usize>(
            ops: &Operands,
            r: usize,
            t0: usize,
            out: *mut f32,
            os: usize,
        ) {
            let nb = ops.cols / 32;
            let (wbb, abb, aq) = b32_sizes(K);
            let [wp] = ops.w_rows::<1>(r);
            let ap = ops.a_rows::<T>(t0);
            let zero = vdupq_n_s32(0);
            let mut facc = [[vdupq_n_f32(0.0); 2]; T];
            let ng = nb / 4;
            for g in 0..ng {
                // p[j][l]: partial sums of block 4g + l with token j.
                let mut p = [[zero; 4]; T];
                for l in 0..4 {
                    let b = 4 * g + l;
                    let (w0, w1) = codes::<K>(wp.add(b * wbb));
                    for j in 0..T {
                        let y = ap[j].add(b * abb + aq) as *const i8;
                        p[j][l] = dot(dot(zero, w0, vld1q_s8(y)), w1, vld1q_s8(y.add(16)));
                    }
                }
                let wg = wp.add(4 * g * wbb);
                let dx = if K == 4 {
                    e8m0x4(wg, wbb)
                } else {
                    f16x4(wg, wbb)
                };
                let mx = if K == 1 {
                    f16x4(wg.add(2), wbb)
                } else {
                    vdupq_n_f32(0.0)
                };
                for j in 0..T {
                    // Lane l: the total of block 4g + l.
                    let s = vpaddq_s32(
                        vpaddq_s32(p[j][0], p[j][1]),
                        vpaddq_s32(p[j][2], p[j][3]),
                    );
                    let ag = ap[j].add(4 * g * abb);
                    let dy = f16x4(ag, abb);
                    // (dx * dy) * sumi [+ m * s], as the scalar reference.
                    let mut term = vmulq_f32(vmulq_f32(dx, dy), vcvtq_f32_s32(s));
                    if K == 1 {
                        term = vaddq_f32(term, vmulq_f32(mx, f16x4(ag.add(2), abb)));
                    }
                    facc[j][g % 2] = vaddq_f32(facc[j][g % 2], term);
                }
            }
            for j in 0..T {
                let mut lanes = [0f32; 8];
                vst1q_f32(lanes.as_mut_ptr(), facc[j][0]);
                vst1q_f32(lanes.as_mut_ptr().add(4), facc[j][1]);
                for b in 4 * ng..nb {
                    let bx = wp.add(b * wbb);
                    let by = ap[j].add(b * abb);
                    let (w0, w1) = codes::<K>(bx);
                    let y = by.add(aq) as *const i8;
                    let s = vaddvq_s32(dot(dot(zero, w0, vld1q_s8(y)), w1, vld1q_s8(y.add(16))));
                    let bx = core::slice::from_raw_parts(bx, wbb);
                    let by = core::slice::from_raw_parts(by, abb);
                    let dx = if K == 4 {
                        e8m0_half(bx[0])
                    } else {
                        f16_at(bx, 0)
                    };
                    let mut term = (dx * f16_at(by, 0)) * s as f32;
                    if K == 1 {
                        term += f16_at(bx, 2) * f16_at(by, 2);
                    }
                    lanes[b % 8] += term;
                }
                *out.add((t0 + j) * os + r) = reduce8(&lanes);
            }
        }

        // -------------------------------------------------------------------
        // Q4_K (K = 4), Q5_K (K = 5) · Q8_K, standard layout: one token
        // here; two or more run the few-row kernels (`rows.rs`). Q5_K is Q4_K
        // with the fifth bit of each code from its 32 qh bytes: bit s of
        // qh[l] belongs to element l of sub-block s.

        #[target_feature(enable = $feat)]
        unsafe fn gemm_q4_k<const K: u8>(
            ops: &Operands,
            nrows: usize,
            ntok: usize,
            out: *mut f32,
            os: usize,
        ) {
            if ntok >= 2 {
                gemm_kq_rows::<K>(ops, nrows, ntok, out, os);
                return;
            }
            drive!(tile_q4_k, K; ops, 0..nrows, ntok, out, os);
        }

        #[target_feature(enable = $feat)]
        #[inline]
        unsafe fn tile_q4_k<const K: u8, const T: usize>(
            ops: &Operands,
            r: usize,
            t0: usize,
            out: *mut f32,
            os: usize,
        ) {
            let [wp] = ops.w_rows::<1>(r);
            let ap = ops.a_rows::<T>(t0);
            let zero = vdupq_n_s32(0);
            let m4 = vdupq_n_u8(0x0F);
            let x10 = vdupq_n_u8(0x10);
            // Q5_K: the 176-byte block, codes after the 32 qh bytes at 16.
            let (bb, qo) = if K == 5 { (176, 48) } else { (144, 16) };
            let mut acc = [0f32; T];
            for s in 0..ops.cols / 256 {
                let bx = wp.add(s * bb);
                let packed = core::slice::from_raw_parts(bx.add(4), 12);
                let (mut sc, mut mins) = ([0i32; 8], [0i32; 8]);
                for sub in 0..8 {
                    let (a, m) = onebit_formats::blocks::k4_scale_min(packed, sub);
                    sc[sub] = a as i32;
                    mins[sub] = m as i32;
                }
                // Sum over sub-blocks of scale x partial sums, per lane.
                let mut isum = [zero; T];
                let (qh0, qh1) = if K == 5 {
                    (vld1q_u8(bx.add(16)), vld1q_u8(bx.add(32)))
                } else {
                    (vdupq_n_u8(0), vdupq_n_u8(0))
                };
                for c in 0..4 {
                    let v0 = vld1q_u8(bx.add(qo + 32 * c));
                    let v1 = vld1q_u8(bx.add(qo + 16 + 32 * c));
                    let (mut lo0, mut lo1) = (vandq_u8(v0, m4), vandq_u8(v1, m4));
                    let (mut hi0, mut hi1) = (vshrq_n_u8::<4>(v0), vshrq_n_u8::<4>(v1));
                    if K == 5 {
                        // 0x10 where bit 2c (2c + 1) of qh[l] is set.
                        let fifth = |qh: uint8x16_t, bit: usize| {
                            vandq_u8(vtstq_u8(qh, vdupq_n_u8(1 << bit)), x10)
                        };
                        lo0 = vorrq_u8(lo0, fifth(qh0, 2 * c));
                        lo1 = vorrq_u8(lo1, fifth(qh1, 2 * c));
                        hi0 = vorrq_u8(hi0, fifth(qh0, 2 * c + 1));
                        hi1 = vorrq_u8(hi1, fifth(qh1, 2 * c + 1));
                    }
                    let (lo0, lo1) = (vreinterpretq_s8_u8(lo0), vreinterpretq_s8_u8(lo1));
                    let (hi0, hi1) = (vreinterpretq_s8_u8(hi0), vreinterpretq_s8_u8(hi1));
                    for j in 0..T {
                        let y = ap[j].add(s * 292 + 4 + 64 * c) as *const i8;
                        let plo = dot(dot(zero, lo0, vld1q_s8(y)), lo1, vld1q_s8(y.add(16)));
                        let phi =
                            dot(dot(zero, hi0, vld1q_s8(y.add(32))), hi1, vld1q_s8(y.add(48)));
                        isum[j] = vmlaq_n_s32(isum[j], plo, sc[2 * c]);
                        isum[j] = vmlaq_n_s32(isum[j], phi, sc[2 * c + 1]);
                    }
                }
                let m0 = vld1q_s32(mins.as_ptr());
                let m1 = vld1q_s32(mins.as_ptr().add(4));
                let bxs = core::slice::from_raw_parts(bx, 4);
                let (dx, dmx) = (f16_at(bxs, 0), f16_at(bxs, 2));
                for j in 0..T {
                    let ya = ap[j].add(s * 292);
                    let dy = (ya as *const f32).read_unaligned();
                    // Sub-block sums of the activations: pairs of 16-sums.
                    let b0 = vpaddlq_s16(vld1q_s16(ya.add(260) as *const i16));
                    let b1 = vpaddlq_s16(vld1q_s16(ya.add(276) as *const i16));
                    let summ = vaddvq_s32(vaddq_s32(vmulq_s32(b0, m0), vmulq_s32(b1, m1)));
                    let isum = vaddvq_s32(isum[j]);
                    let d = dx * dy;
                    let dmin = dmx * dy;
                    acc[j] += d * isum as f32 - dmin * summ as f32;
                }
            }
            for j in 0..T {
                *out.add((t0 + j) * os + r) = acc[j];
            }
        }

        // -------------------------------------------------------------------
        // Q6_K · Q8_K, standard layout: one token here; two or more run the
        // few-row kernels (`rows.rs`).

        #[target_feature(enable = $feat)]
        unsafe fn gemm_q6_k(ops: &Operands, nrows: usize, ntok: usize, out: *mut f32, os: usize) {
            if ntok >= 2 {
                gemm_kq_rows::<6>(ops, nrows, ntok, out, os);
                return;
            }
            drive!(tile_q6_k; ops, 0..nrows, ntok, out, os);
        }

        #[target_feature(enable = $feat)]
        #[inline]
        unsafe fn tile_q6_k<const T: usize>(
            ops: &Operands,
            r: usize,
            t0: usize,
            out: *mut f32,
            os: usize,
        ) {
            let [wp] = ops.w_rows::<1>(r);
            let ap = ops.a_rows::<T>(t0);
            let zero = vdupq_n_s32(0);
            let m4 = vdupq_n_u8(0x0F);
            let m3 = vdupq_n_u8(3);
            let off = vdupq_n_s8(32);
            let mut acc = [0f32; T];
            for s in 0..ops.cols / 256 {
                let bx = wp.add(s * 210);
                let scp = bx.add(192) as *const i8;
                let mut isum = [zero; T];
                for h in 0..2 {
                    let ql = bx.add(64 * h);
                    let qh = bx.add(128 + 32 * h);
                    // part 0: elements l < 16 of each run of 32; part 1: l >= 16.
                    for part in 0..2 {
                        let q1 = vld1q_u8(ql.add(16 * part));
                        let q2 = vld1q_u8(ql.add(32 + 16 * part));
                        let hb = vld1q_u8(qh.add(16 * part));
                        let top = |b: uint8x16_t| vshlq_n_u8::<4>(vandq_u8(b, m3));
                        let codes = [
                            vorrq_u8(vandq_u8(q1, m4), top(hb)),
                            vorrq_u8(vandq_u8(q2, m4), top(vshrq_n_u8::<2>(hb))),
                            vorrq_u8(vshrq_n_u8::<4>(q1), top(vshrq_n_u8::<4>(hb))),
                            vorrq_u8(vshrq_n_u8::<4>(q2), top(vshrq_n_u8::<6>(hb))),
                        ];
                        for (k, c) in codes.iter().enumerate() {
                            let q = vsubq_s8(vreinterpretq_s8_u8(*c), off);
                            let scale = *scp.add(8 * h + 2 * k + part) as i32;
                            for j in 0..T {
                                let y = ap[j].add(s * 292 + 4 + 128 * h + 32 * k + 16 * part);
                                let p = dot(zero, q, vld1q_s8(y as *const i8));
                                isum[j] = vmlaq_n_s32(isum[j], p, scale);
                            }
                        }
                    }
                }
                let d = f16_at(core::slice::from_raw_parts(bx.add(208), 2), 0);
                for j in 0..T {
                    let dy = (ap[j].add(s * 292) as *const f32).read_unaligned();
                    acc[j] += (d * dy) * vaddvq_s32(isum[j]) as f32;
                }
            }
            for j in 0..T {
                *out.add((t0 + j) * os + r) = acc[j];
            }
        }

        // -------------------------------------------------------------------
        // F32 · F32: element i into lane i % 8, mul then add, as the reference.

        #[target_feature(enable = $feat)]
        unsafe fn gemm_f32(ops: &Operands, nrows: usize, ntok: usize, out: *mut f32, os: usize) {
            drive!(tile_f32; ops, 0..nrows, ntok, out, os);
        }

        #[target_feature(enable = $feat)]
        #[inline]
        unsafe fn tile_f32<const T: usize>(
            ops: &Operands,
            r: usize,
            t0: usize,
            out: *mut f32,
            os: usize,
        ) {
            let n = ops.cols;
            let n8 = n / 8 * 8;
            let [wp] = ops.w_rows::<1>(r).map(|p| p as *const f32);
            let ap = ops.a_rows::<T>(t0).map(|p| p as *const f32);
            let mut acc = [[vdupq_n_f32(0.0); 2]; T];
            let mut e = 0;
            while e < n8 {
                let w0 = vld1q_f32(wp.add(e));
                let w1 = vld1q_f32(wp.add(e + 4));
                for j in 0..T {
                    let x0 = vld1q_f32(ap[j].add(e));
                    let x1 = vld1q_f32(ap[j].add(e + 4));
                    acc[j][0] = vaddq_f32(acc[j][0], vmulq_f32(w0, x0));
                    acc[j][1] = vaddq_f32(acc[j][1], vmulq_f32(w1, x1));
                }
                e += 8;
            }
            for j in 0..T {
                let mut lanes = [0f32; 8];
                vst1q_f32(lanes.as_mut_ptr(), acc[j][0]);
                vst1q_f32(lanes.as_mut_ptr().add(4), acc[j][1]);
                for e in n8..n {
                    lanes[e - n8] += wp.add(e).read_unaligned() * ap[j].add(e).read_unaligned();
                }
                *out.add((t0 + j) * os + r) = reduce8(&lanes);
            }
        }

        arm_rows!($feat);
    };
}
