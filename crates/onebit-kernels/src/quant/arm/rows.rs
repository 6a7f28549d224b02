//! The few-row kernels (every quantized type times 2 or more activation
//! rows: a batched decode step, a speculative verify, prefill),
//! instantiated per level inside [`arm_kernels!`]: a tile of 2 weight rows
//! times up to 4 tokens decodes each weight block (K-quants: sub-block)
//! once for all the tile's tokens, and loads each activation vector once
//! for both rows, so the weights stream once per call and every decoded
//! code serves 4 tokens. Blocks of 32 get each block's four (row, token)
//! sums from the level's `quad32` (`sdot` and pairwise adds, or `smmla` at
//! i8mm); K-quants keep per-(row, token) integer sums over the super-block
//! (the i8mm level's `smmla` K-quant tiles are in `i8mm.rs`). Every output equals the scalar reference's bits: the super-
//! block's integer sums are exact (any order gives the same i32), and its
//! float formula runs per (row, token) lane in the reference's order,
//! unfused; so each row equals that row computed alone. The `i8mm` level's
//! `smmla` tiles (`i8mm.rs`) decode through [`kq_codes`] too.

/// The `quad32` primitive of the levels without `smmla` (neon, dotprod),
/// over their `dot`: each (row, token) sum of 32 products in four lanes,
/// then two pairwise adds put the four totals in lanes 2 * row + token.
macro_rules! arm_quad_by_dot {
    ($feat:literal) => {
        /// The four sums over 32 elements of 2 weight rows (`w0`, `w1`:
        /// elements 0..16, 16..32) times 2 tokens (`y0`, `y1`), lane 2 * row
        /// + token, exact.
        #[target_feature(enable = $feat)]
        #[inline]
        fn quad32(
            w0: (int8x16_t, int8x16_t),
            w1: (int8x16_t, int8x16_t),
            y0: (int8x16_t, int8x16_t),
            y1: (int8x16_t, int8x16_t),
        ) -> int32x4_t {
            let zero = vdupq_n_s32(0);
            let p = |w: (int8x16_t, int8x16_t), y: (int8x16_t, int8x16_t)| {
                dot(dot(zero, w.0, y.0), w.1, y.1)
            };
            vpaddq_s32(
                vpaddq_s32(p(w0, y0), p(w0, y1)),
                vpaddq_s32(p(w1, y0), p(w1, y1)),
            )
        }
    };
}

macro_rules! arm_rows {
    ($feat:literal) => {
        /// Bytes of one super-block of K-quant `K` (4: Q4_K, 5: Q5_K, 6: Q6_K).
        pub(super) const fn kq_block(k: u8) -> usize {
            match k {
                4 => 144,
                5 => 176,
                _ => 210,
            }
        }

        /// The 32 codes of sub-block `sub` (elements 32 sub..32 sub + 32) of
        /// the K-quant `K` super-block at `bx`, as i8 in element order, in
        /// two halves (elements 0..16, 16..32): Q4_K the nibble (low for
        /// even `sub`) of code bytes 32 (sub / 2)..; Q5_K the same with bit
        /// `sub` of qh[l] as the fifth bit (0..31); Q6_K (h, k = sub / 4,
        /// sub % 4) the nibble of ql[64h + 32 (k & 1) + l] (low for k < 2)
        /// with bits 2k.. of qh[32h + l] on top, minus 32.
        #[target_feature(enable = $feat)]
        #[inline]
        pub(super) unsafe fn kq_codes<const K: u8>(
            bx: *const u8,
            sub: usize,
        ) -> (int8x16_t, int8x16_t) {
            let m4 = vdupq_n_u8(0x0F);
            if K == 6 {
                let (h, k) = (sub / 4, sub % 4);
                let ql = bx.add(64 * h + 32 * (k & 1));
                let qh = bx.add(128 + 32 * h);
                let shift = vdupq_n_s8(-(2 * k as i8));
                let code = |q: uint8x16_t, hb: uint8x16_t| {
                    let nib = if k < 2 {
                        vandq_u8(q, m4)
                    } else {
                        vshrq_n_u8::<4>(q)
                    };
                    let top = vandq_u8(vshlq_u8(hb, shift), vdupq_n_u8(3));
                    let c = vorrq_u8(nib, vshlq_n_u8::<4>(top));
                    vsubq_s8(vreinterpretq_s8_u8(c), vdupq_n_s8(32))
                };
                return (
                    code(vld1q_u8(ql), vld1q_u8(qh)),
                    code(vld1q_u8(ql.add(16)), vld1q_u8(qh.add(16))),
                );
            }
            let qs = bx.add(if K == 5 { 48 } else { 16 } + 32 * (sub / 2));
            let (v0, v1) = (vld1q_u8(qs), vld1q_u8(qs.add(16)));
            let (mut c0, mut c1) = if sub % 2 == 0 {
                (vandq_u8(v0, m4), vandq_u8(v1, m4))
            } else {
                (vshrq_n_u8::<4>(v0), vshrq_n_u8::<4>(v1))
            };
            if K == 5 {
                let bit = vdupq_n_u8(1 << sub);
                let x10 = vdupq_n_u8(0x10);
                c0 = vorrq_u8(c0, vandq_u8(vtstq_u8(vld1q_u8(bx.add(16)), bit), x10));
                c1 = vorrq_u8(c1, vandq_u8(vtstq_u8(vld1q_u8(bx.add(32)), bit), x10));
            }
            (vreinterpretq_s8_u8(c0), vreinterpretq_s8_u8(c1))
        }

        /// A K-quant super-block's integer scales per 16 elements (Q4_K,
        /// Q5_K: each sub-block's 6-bit scale twice; Q6_K: its 16 i8
        /// scales) and, for Q4_K / Q5_K, the sub-blocks' mins.
        #[target_feature(enable = $feat)]
        #[inline]
        pub(super) unsafe fn kq_scales<const K: u8>(bx: *const u8) -> ([i32; 16], [i32; 8]) {
            let (mut sc, mut mins) = ([0i32; 16], [0i32; 8]);
            if K == 6 {
                for (i, s) in sc.iter_mut().enumerate() {
                    *s = *(bx.add(192 + i) as *const i8) as i32;
                }
            } else {
                let packed = core::slice::from_raw_parts(bx.add(4), 12);
                for sub in 0..8 {
                    let (a, m) = onebit_formats::blocks::k4_scale_min(packed, sub);
                    sc[2 * sub] = a as i32;
                    sc[2 * sub + 1] = a as i32;
                    mins[sub] = m as i32;
                }
            }
            (sc, mins)
        }

        /// sum over sub-blocks of min x (the two 16-element sums of the
        /// activation block `ya`'s sub-block): Q4_K / Q5_K's min term,
        /// exact.
        #[target_feature(enable = $feat)]
        #[inline]
        pub(super) unsafe fn kq_min_sum(ya: *const u8, mins: &[i32; 8]) -> i32 {
            let b0 = vpaddlq_s16(vld1q_s16(ya.add(260) as *const i16));
            let b1 = vpaddlq_s16(vld1q_s16(ya.add(276) as *const i16));
            let m0 = vld1q_s32(mins.as_ptr());
            let m1 = vld1q_s32(mins.as_ptr().add(4));
            vaddvq_s32(vaddq_s32(vmulq_s32(b0, m0), vmulq_s32(b1, m1)))
        }

        /// (d, dmin) of a Q4_K / Q5_K super-block, d of a Q6_K one (dmin 0).
        #[target_feature(enable = $feat)]
        #[inline]
        pub(super) unsafe fn kq_d<const K: u8>(bx: *const u8) -> (f32, f32) {
            if K == 6 {
                (f16_at(core::slice::from_raw_parts(bx.add(208), 2), 0), 0.0)
            } else {
                let b = core::slice::from_raw_parts(bx, 4);
                (f16_at(b, 0), f16_at(b, 2))
            }
        }

        // -------------------------------------------------------------------
        // Blocks of 32 (Q4_0, Q4_1, Q5_0, Q8_0, MXFP4), 2 rows x 4 (then 2)
        // tokens: the level's `quad32` gives a block's four (row, token)
        // sums in one vector (sdot and pairwise adds, or four `smmla`).

        /// Two tokens or more: rows in pairs, tokens in tiles of 4, then 2
        /// ([`tile_b32_quads`]); a token left over runs `tile_b32` for each
        /// row of the pair, a row left over `tile_b32` (1 row x 4 tokens).
        #[target_feature(enable = $feat)]
        pub(super) unsafe fn gemm_b32_rows<const K: u8>(
            ops: &Operands,
            nrows: usize,
            ntok: usize,
            out: *mut f32,
            os: usize,
        ) {
            drive_pairs!(tile_b32_quads, K; ops, nrows, ntok, out, os;
                |r, t| {
                    tile_b32::<K, 1>(ops, r, t, out, os);
                    tile_b32::<K, 1>(ops, r + 1, t, out, os);
                };
                |r| drive!(tile_b32, K; ops, r..nrows, ntok, out, os));
        }

        /// Rows r, r + 1 times tokens t0..t0 + 2P (P token pairs). Per block, the
        /// two rows' codes decoded once; per token pair, the four (row, token)
        /// integer sums in one vector ([`quad32`], lane q = 2 * row + token), their float terms
        /// (dx * dy) * sumi [+ m * s] lane-wise, added into accumulator b % 8: lane
        /// q of accumulator k is lane k of that pair's scalar reference. MXFP4 (K =
        /// 4): dx is the block's 2^(e - 128), and dy * dx is dx * dy.
        #[target_feature(enable = $feat)]
        #[inline]
        pub(super) unsafe fn tile_b32_quads<const K: u8, const P: usize>(
            ops: &Operands,
            r: usize,
            t0: usize,
            out: *mut f32,
            os: usize,
        ) {
            let nb = ops.cols / 32;
            let (wbb, abb, aq) = b32_sizes(K);
            let wp = ops.w_rows::<2>(r);
            let ap: [[*const u8; 2]; P] = core::array::from_fn(|p| ops.a_rows::<2>(t0 + 2 * p));
            let mut facc = [[vdupq_n_f32(0.0); 8]; P];
            let f = |p: *const u8, at: usize| f16_at(core::slice::from_raw_parts(p, at + 2), at);
            let v4 = |a: f32, b: f32, c: f32, d: f32| vld1q_f32([a, b, c, d].as_ptr());
            let ld = |p: *const u8| vld1q_s8(p as *const i8);
            for b in 0..nb {
                let (bx0, bx1) = (wp[0].add(b * wbb), wp[1].add(b * wbb));
                let (w0, w1) = (codes::<K>(bx0), codes::<K>(bx1));
                let (dx0, dx1) = if K == 4 {
                    (e8m0_half(*bx0), e8m0_half(*bx1))
                } else {
                    (f(bx0, 0), f(bx1, 0))
                };
                let dx = v4(dx0, dx0, dx1, dx1);
                for p in 0..P {
                    let (by0, by1) = (ap[p][0].add(b * abb), ap[p][1].add(b * abb));
                    let y0 = (ld(by0.add(aq)), ld(by0.add(aq + 16)));
                    let y1 = (ld(by1.add(aq)), ld(by1.add(aq + 16)));
                    let s = quad32(w0, w1, y0, y1);
                    let (dy0, dy1) = (f(by0, 0), f(by1, 0));
                    let mut term = vmulq_f32(vmulq_f32(dx, v4(dy0, dy1, dy0, dy1)), vcvtq_f32_s32(s));
                    if K == 1 {
                        let (m0, m1, s0, s1) = (f(bx0, 2), f(bx1, 2), f(by0, 2), f(by1, 2));
                        term = vaddq_f32(term, vmulq_f32(v4(m0, m0, m1, m1), v4(s0, s1, s0, s1)));
                    }
                    facc[p][b % 8] = vaddq_f32(facc[p][b % 8], term);
                }
            }
            for (p, fp) in facc.iter().enumerate() {
                // lanes[q][k]: lane q of accumulator k, pair q's reference lane k.
                let mut lanes = [[0f32; 8]; 4];
                for (k, v) in fp.iter().enumerate() {
                    let mut l4 = [0f32; 4];
                    vst1q_f32(l4.as_mut_ptr(), *v);
                    for (q, x) in l4.into_iter().enumerate() {
                        lanes[q][k] = x;
                    }
                }
                for (q, lanes) in lanes.iter().enumerate() {
                    *out.add((t0 + 2 * p + q % 2) * os + r + q / 2) = reduce8(lanes);
                }
            }
        }


        // -------------------------------------------------------------------
        // K-quants, 2 rows x 4 (then 2, 1) tokens.

        /// Rows in pairs, tokens in tiles of 4, then 2, then 1 (each pair
        /// or lone row decodes a sub-block once per tile); a row left over
        /// runs as a tile of one row.
        #[target_feature(enable = $feat)]
        pub(super) unsafe fn gemm_kq_rows<const K: u8>(
            ops: &Operands,
            nrows: usize,
            ntok: usize,
            out: *mut f32,
            os: usize,
        ) {
            let mut r = 0;
            while r < nrows {
                let pair = r + 2 <= nrows;
                let mut t = 0;
                while t + 4 <= ntok {
                    tile_kq_pair_or_row::<K, 4>(pair, ops, r, t, out, os);
                    t += 4;
                }
                while t + 2 <= ntok {
                    tile_kq_pair_or_row::<K, 2>(pair, ops, r, t, out, os);
                    t += 2;
                }
                while t < ntok {
                    tile_kq_pair_or_row::<K, 1>(pair, ops, r, t, out, os);
                    t += 1;
                }
                r += if pair { 2 } else { 1 };
            }
        }

        /// [`tile_kq_rows`] of rows r, r + 1 (`pair`) or of row r alone.
        #[target_feature(enable = $feat)]
        #[inline]
        unsafe fn tile_kq_pair_or_row<const K: u8, const T: usize>(
            pair: bool,
            ops: &Operands,
            r: usize,
            t: usize,
            out: *mut f32,
            os: usize,
        ) {
            if pair {
                tile_kq_rows::<K, 2, T>(ops, r, t, out, os);
            } else {
                tile_kq_rows::<K, 1, T>(ops, r, t, out, os);
            }
        }

        /// Rows r0..r0 + R times tokens t0..t0 + T (T <= 4). Per
        /// super-block: each sub-block of each row decoded once
        /// ([`kq_codes`]), each activation vector loaded once for the R
        /// rows, the exact integer sums per (row, token); then, per row,
        /// the scalar reference's float formula with the tile's tokens in
        /// the lanes of one vector: Q4_K / Q5_K acc + ((dx * dy) * isum -
        /// (dmin * dy) * summ), Q6_K acc + (dx * dy) * isum.
        #[target_feature(enable = $feat)]
        #[inline]
        pub(super) unsafe fn tile_kq_rows<const K: u8, const R: usize, const T: usize>(
            ops: &Operands,
            r0: usize,
            t0: usize,
            out: *mut f32,
            os: usize,
        ) {
            let bb = kq_block(K);
            let wp = ops.w_rows::<R>(r0);
            let ap = ops.a_rows::<T>(t0);
            let zero = vdupq_n_s32(0);
            let mut acc = [vdupq_n_f32(0.0); R];
            for s in 0..ops.cols / 256 {
                let bx: [*const u8; R] = core::array::from_fn(|i| wp[i].add(s * bb));
                let ya: [*const u8; T] = core::array::from_fn(|j| ap[j].add(s * 292));
                let scales: [([i32; 16], [i32; 8]); R] =
                    core::array::from_fn(|i| kq_scales::<K>(bx[i]));
                let mut isum = [[zero; T]; R];
                for sub in 0..8 {
                    let codes: [(int8x16_t, int8x16_t); R] =
                        core::array::from_fn(|i| kq_codes::<K>(bx[i], sub));
                    for j in 0..T {
                        let y = ya[j].add(4 + 32 * sub) as *const i8;
                        let (y0, y1) = (vld1q_s8(y), vld1q_s8(y.add(16)));
                        for i in 0..R {
                            let (c0, c1) = codes[i];
                            let sc = &scales[i].0;
                            if K == 6 {
                                let p0 = dot(zero, c0, y0);
                                let p1 = dot(zero, c1, y1);
                                isum[i][j] = vmlaq_n_s32(isum[i][j], p0, sc[2 * sub]);
                                isum[i][j] = vmlaq_n_s32(isum[i][j], p1, sc[2 * sub + 1]);
                            } else {
                                let p = dot(dot(zero, c0, y0), c1, y1);
                                isum[i][j] = vmlaq_n_s32(isum[i][j], p, sc[2 * sub]);
                            }
                        }
                    }
                }
                let mut dy = [0f32; 4];
                for j in 0..T {
                    dy[j] = (ya[j] as *const f32).read_unaligned();
                }
                let dyv = vld1q_f32(dy.as_ptr());
                for i in 0..R {
                    let (dx, dmx) = kq_d::<K>(bx[i]);
                    let mut is = [0i32; 4];
                    let mut sm = [0i32; 4];
                    for j in 0..T {
                        is[j] = vaddvq_s32(isum[i][j]);
                        if K != 6 {
                            sm[j] = kq_min_sum(ya[j], &scales[i].1);
                        }
                    }
                    let isv = vcvtq_f32_s32(vld1q_s32(is.as_ptr()));
                    let d = vmulq_f32(vdupq_n_f32(dx), dyv);
                    let term = if K == 6 {
                        vmulq_f32(d, isv)
                    } else {
                        let dmin = vmulq_f32(vdupq_n_f32(dmx), dyv);
                        let smv = vcvtq_f32_s32(vld1q_s32(sm.as_ptr()));
                        vsubq_f32(vmulq_f32(d, isv), vmulq_f32(dmin, smv))
                    };
                    acc[i] = vaddq_f32(acc[i], term);
                }
            }
            for i in 0..R {
                let mut lanes = [0f32; 4];
                vst1q_f32(lanes.as_mut_ptr(), acc[i]);
                for j in 0..T {
                    *out.add((t0 + j) * os + r0 + i) = lanes[j];
                }
            }
        }
    };
}
