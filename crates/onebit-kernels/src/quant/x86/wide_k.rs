//! The wide (prefill) K-quant kernels (Q4_K, Q5_K, Q6_K): standard rows in the
//! `super::WIDE_KW` layout and interleaved groups of 8 rows expanded once
//! per call, instantiated per level inside [`simd_kernels!`]. Every output
//! equals the scalar reference's bits whatever tile or cache block it
//! falls in.

macro_rules! x86_wide_k {
    ($feat:literal) => {
        // -------------------------------------------------------------------
        // Wide K-quant kernels (Q4_K: K = 4, Q5_K: K = 5, Q6_K: K = 6), see
        // `super::WIDE_KW` and `super::WIDE_KA`. Lane l of a code vector is
        // the l-th run of 32 elements of the super-block, so an integer lane
        // sum belongs to one scale (Q6_K: the first four code vectors to one
        // 16-element sub-block, the last four to the next).

        /// 8 x 8 transpose of 4-byte words: word 8c + k of `src` (run c,
        /// elements 4k..4k+4) goes to word 8k + c of `dst`.
        #[inline]
        unsafe fn transpose_words(src: &[u32; 64], dst: *mut u8) {
            for c in 0..8 {
                for k in 0..8 {
                    (dst.add(32 * k + 4 * c) as *mut u32).write_unaligned(src[8 * c + k]);
                }
            }
        }

        /// Expands one Q4_K, Q5_K or Q6_K row into `super::WIDE_KW` bytes per
        /// super-block (Q5_K: Q4_K's, each code with its fifth bit).
        #[target_feature(enable = $feat)]
        #[inline]
        unsafe fn expand_k_row<const K: u8>(src: *const u8, cols: usize, dst: *mut u8) {
            let mut runs = [0u32; 64];
            let rp = runs.as_mut_ptr() as *mut u8;
            for s in 0..cols / 256 {
                let d = dst.add(s * super::WIDE_KW);
                let st32 = |at: usize, v: [i32; 8]| {
                    for (l, x) in v.iter().enumerate() {
                        (d.add(at + 4 * l) as *mut i32).write_unaligned(*x);
                    }
                };
                let st16 = |at: usize, v: [i16; 16]| {
                    for (l, x) in v.iter().enumerate() {
                        (d.add(at + 2 * l) as *mut i16).write_unaligned(*x);
                    }
                };
                if K == 4 || K == 5 {
                    let (bb, qo) = if K == 5 { (176, 48) } else { (144, 16) };
                    let bx = src.add(s * bb);
                    let qh = if K == 5 {
                        ld(bx.add(16))
                    } else {
                        _mm256_setzero_si256()
                    };
                    for c in 0..4 {
                        let (lo, hi) = q45_codes::<K>(ld(bx.add(qo + 32 * c)), qh, c);
                        _mm256_storeu_si256(rp.add(64 * c) as *mut __m256i, lo);
                        _mm256_storeu_si256(rp.add(64 * c + 32) as *mut __m256i, hi);
                    }
                    let packed = core::slice::from_raw_parts(bx.add(4), 12);
                    let (mut sc, mut mins) = ([0i32; 8], [0i16; 16]);
                    for sub in 0..8 {
                        let (a, m) = onebit_formats::blocks::k4_scale_min(packed, sub);
                        sc[sub] = a as i32;
                        mins[2 * sub] = m as i16;
                        mins[2 * sub + 1] = m as i16;
                    }
                    st32(256, sc);
                    st16(320, mins);
                    (d.add(352) as *mut f32).write_unaligned(f16v(bx));
                    (d.add(356) as *mut f32).write_unaligned(f16v(bx.add(2)));
                } else {
                    let bx = src.add(s * 210);
                    for h in 0..2 {
                        let codes = q6_codes(
                            ld(bx.add(64 * h)),
                            ld(bx.add(64 * h + 32)),
                            ld(bx.add(128 + 32 * h)),
                        );
                        for (k, v) in codes.iter().enumerate() {
                            _mm256_storeu_si256(rp.add(128 * h + 32 * k) as *mut __m256i, *v);
                        }
                    }
                    let scp = bx.add(192) as *const i8;
                    let (mut sa, mut sb, mut s32) = ([0i32; 8], [0i32; 8], [0i16; 16]);
                    for c in 0..8 {
                        sa[c] = *scp.add(2 * c) as i32;
                        sb[c] = *scp.add(2 * c + 1) as i32;
                    }
                    for (i, x) in s32.iter_mut().enumerate() {
                        *x = 32 * *scp.add(i) as i16;
                    }
                    st32(256, sa);
                    st32(288, sb);
                    st16(320, s32);
                    (d.add(352) as *mut f32).write_unaligned(f16v(bx.add(208)));
                }
                transpose_words(&runs, d);
            }
        }

        #[target_feature(enable = $feat)]
        unsafe fn gemm_wide_k<const K: u8>(
            ops: &Operands,
            nrows: usize,
            ntok: usize,
            out: *mut f32,
            os: usize,
        ) {
            let nsb = ops.cols / 256;
            let ws = nsb * super::WIDE_KW;
            drive_wide!(
                expand_k_row_at,
                tile_wide_k,
                K,
                ops,
                nrows,
                ntok,
                out,
                os,
                ws,
                nsb
            );
        }

        /// R expanded K-quant rows times T wide Q8_K rows: per super-block
        /// the exact integer sums of the scalar reference (scaled lane sums,
        /// minus the min or offset term from the activations' 16-element
        /// sums), then its float formula per token.
        #[target_feature(enable = $feat)]
        #[inline]
        #[allow(clippy::too_many_arguments)]
        unsafe fn tile_wide_k<const R: usize, const T: usize, const K: u8>(
            w: *const u8,
            ws: usize,
            ops: &Operands,
            nsb: usize,
            r0: usize,
            t0: usize,
            out: *mut f32,
            os: usize,
        ) {
            let wp = row_ptrs::<R>(w, 0, ws);
            let ap = row_ptrs::<T>(ops.a.as_ptr(), t0, ops.arb);
            let zero = _mm256_setzero_si256();
            let mut facc = [[0f32; T]; R];
            let mut fv = [_mm256_setzero_ps(); 2];
            for s in 0..nsb {
                let (wo, ao) = (s * super::WIDE_KW, s * super::WIDE_KA);
                let mut tot = [[zero; T]; R];
                // Q4_K, Q5_K: one phase of 8 code vectors; Q6_K: two of 4,
                // each with its own sub-block scales.
                let phases: &[(usize, usize)] = if K != 6 {
                    &[(0, 256)]
                } else {
                    &[(0, 256), (4, 288)]
                };
                let nk = if K != 6 { 8 } else { 4 };
                for &(k0, sc_at) in phases {
                    if !VNNI {
                        // Without VNNI: `vpmaddubsw` pair sums added in i16
                        // (Q4_K: all 8 code vectors, |sum| <= 8 * 2 * 15 *
                        // 127 = 30,480; Q5_K: 4 at a time, <= 4 * 2 * 31 *
                        // 127 = 31,496; Q6_K: 2 at a time, <= 2 * 2 * 63 *
                        // 127 = 32,004), then one `vpmaddwd` by the lane's
                        // scale (as i16 in both halves of the lane): the
                        // same exact integer as the VNNI path's sums times
                        // the scale, in fewer instructions.
                        let step = match K {
                            4 => 8,
                            5 => 4,
                            _ => 2,
                        };
                        let dup = _mm256_setr_epi8(
                            0, 1, 0, 1, 4, 5, 4, 5, 8, 9, 8, 9, 12, 13, 12, 13, 0, 1, 0, 1, 4, 5,
                            4, 5, 8, 9, 8, 9, 12, 13, 12, 13,
                        );
                        let mut sc = [zero; R];
                        for i in 0..R {
                            sc[i] = _mm256_shuffle_epi8(ld(wp[i].add(wo + sc_at)), dup);
                        }
                        let mut k = k0;
                        while k < k0 + nk {
                            let mut acc = [[zero; T]; R];
                            for kk in k..k + step {
                                let mut y = [zero; T];
                                for j in 0..T {
                                    y[j] = ld(ap[j].add(ao + 32 * kk));
                                }
                                for i in 0..R {
                                    let wv = ld(wp[i].add(wo + 32 * kk));
                                    for j in 0..T {
                                        acc[i][j] = _mm256_add_epi16(
                                            acc[i][j],
                                            _mm256_maddubs_epi16(wv, y[j]),
                                        );
                                    }
                                }
                            }
                            for i in 0..R {
                                for j in 0..T {
                                    tot[i][j] = _mm256_add_epi32(
                                        tot[i][j],
                                        _mm256_madd_epi16(acc[i][j], sc[i]),
                                    );
                                }
                            }
                            k += step;
                        }
                        continue;
                    }
                    let mut acc = [[zero; T]; R];
                    for k in k0..k0 + nk {
                        let mut y = [zero; T];
                        for j in 0..T {
                            y[j] = ld(ap[j].add(ao + 32 * k));
                        }
                        for i in 0..R {
                            let wv = ld(wp[i].add(wo + 32 * k));
                            for j in 0..T {
                                acc[i][j] = dp(acc[i][j], wv, y[j]);
                            }
                        }
                    }
                    for i in 0..R {
                        let sc = ld(wp[i].add(wo + sc_at));
                        for j in 0..T {
                            tot[i][j] =
                                _mm256_add_epi32(tot[i][j], _mm256_mullo_epi32(acc[i][j], sc));
                        }
                    }
                }
                let mut dy = [0f32; T];
                let mut bs = [zero; T];
                for j in 0..T {
                    dy[j] = (ap[j].add(ao + 288) as *const f32).read_unaligned();
                    bs[j] = ld(ap[j].add(ao + 256));
                }
                if (R * T).is_multiple_of(8) {
                    // Whole vectors of (row, token) pairs: eight lane sums
                    // reduced at once (`hsum8`) and the float formula run
                    // per lane, the scalar reference's operations in its
                    // order, instead of one horizontal sum per pair.
                    let mut ti = [zero; 16];
                    let mut cr = [zero; 16];
                    let (mut dxa, mut dma, mut dya) = ([0f32; 16], [0f32; 16], [0f32; 16]);
                    for i in 0..R {
                        let m16 = ld(wp[i].add(wo + 320));
                        let dx = (wp[i].add(wo + 352) as *const f32).read_unaligned();
                        let dmx = (wp[i].add(wo + 356) as *const f32).read_unaligned();
                        for j in 0..T {
                            let n = i * T + j;
                            let c = _mm256_madd_epi16(m16, bs[j]);
                            if K != 6 {
                                ti[n] = tot[i][j];
                                cr[n] = c;
                            } else {
                                ti[n] = _mm256_sub_epi32(tot[i][j], c);
                            }
                            dxa[n] = dx;
                            dma[n] = dmx;
                            dya[n] = dy[j];
                        }
                    }
                    for (g, f) in fv.iter_mut().enumerate().take(R * T / 8) {
                        let at = 8 * g;
                        let isum = _mm256_cvtepi32_ps(hsum8(&ti, at));
                        let dyv = _mm256_loadu_ps(dya.as_ptr().add(at));
                        let d = _mm256_mul_ps(_mm256_loadu_ps(dxa.as_ptr().add(at)), dyv);
                        let term = if K != 6 {
                            let summ = _mm256_cvtepi32_ps(hsum8(&cr, at));
                            let dmin = _mm256_mul_ps(_mm256_loadu_ps(dma.as_ptr().add(at)), dyv);
                            _mm256_sub_ps(_mm256_mul_ps(d, isum), _mm256_mul_ps(dmin, summ))
                        } else {
                            _mm256_mul_ps(d, isum)
                        };
                        *f = _mm256_add_ps(*f, term);
                    }
                } else {
                    for i in 0..R {
                        // Q4_K, Q5_K: mins x pair sums; Q6_K: 32 * scales x sums.
                        let m16 = ld(wp[i].add(wo + 320));
                        let mut corr = [zero; T];
                        for j in 0..T {
                            corr[j] = _mm256_madd_epi16(m16, bs[j]);
                        }
                        let dx = (wp[i].add(wo + 352) as *const f32).read_unaligned();
                        if K != 6 {
                            let isum = hsums::<T>(&tot[i]);
                            let summ = hsums::<T>(&corr);
                            let dmx = (wp[i].add(wo + 356) as *const f32).read_unaligned();
                            for j in 0..T {
                                let d = dx * dy[j];
                                let dmin = dmx * dy[j];
                                facc[i][j] += d * isum[j] as f32 - dmin * summ[j] as f32;
                            }
                        } else {
                            let mut v = [zero; T];
                            for j in 0..T {
                                v[j] = _mm256_sub_epi32(tot[i][j], corr[j]);
                            }
                            let isum = hsums::<T>(&v);
                            for j in 0..T {
                                facc[i][j] += (dx * dy[j]) * isum[j] as f32;
                            }
                        }
                    }
                }
            }
            if (R * T).is_multiple_of(8) {
                let mut lanes = [0f32; 16];
                for (g, f) in fv.iter().enumerate().take(R * T / 8) {
                    _mm256_storeu_ps(lanes.as_mut_ptr().add(8 * g), *f);
                }
                for i in 0..R {
                    for j in 0..T {
                        facc[i][j] = lanes[i * T + j];
                    }
                }
            }
            for i in 0..R {
                for j in 0..T {
                    *out.add((t0 + j) * os + r0 + i) = facc[i][j];
                }
            }
        }

        // -------------------------------------------------------------------
        // Wide Q4_K, Q5_K and Q6_K on the interleaved groups of 8 rows
        // (`super::Q4K_X8`, `super::Q5K_X8`, `super::Q6K_X8`):
        // each 32-bit lane is one row, as in the one-token kernel, so a
        // row's sums never need a horizontal reduction; the groups are
        // expanded once per call into unsigned codes and decoded scales
        // (`WIDE_KX8`), and each activation word is broadcast to all lanes.

        /// Groups of 8 rows times tokens per tile of the wide interleaved
        /// K-quant kernels: with VNNI 2 x 6 (24 accumulators of 32 registers),
        /// else 1 x 4 (8 of 16). On the Zen 4 VM (load 8, 1 thread, on-CPU
        /// time, alternated runs of examples/kernels.rs, 512 tokens) 2 x 6
        /// beat 2 x 4 by ~5% on Qwen1.5B ffn up and ~10% on ffn down, and at
        /// AVX2 1 x 4 beat 2 x 2 by ~10% on ffn down, equal on ffn up.
        const TG: usize = if VNNI { 2 } else { 1 };
        const TX: usize = if VNNI { 6 } else { 4 };

        /// Whole groups of 8 rows run [`tile_kx8`] in cache blocks
        /// (a block of groups expanded into about `WIDE_W_BYTES`, a block of
        /// tokens of about `WIDE_A_BYTES`, as [`drive_wide!`]); the rows past
        /// the last whole group are standard and run [`gemm_wide_k`].
        #[target_feature(enable = $feat)]
        unsafe fn gemm_wide_kx8<const K: u8>(
            ops: &Operands,
            nrows: usize,
            ntok: usize,
            out: *mut f32,
            os: usize,
        ) {
            let nsb = ops.cols / 256;
            let groups = nrows / 8;
            let gs = nsb
                * if K != 6 {
                    super::body::WIDE_KX8
                } else {
                    super::body::WIDE_Q6X8
                };
            if groups > 0 && gs > 0 {
                let gb = (super::body::WIDE_W_BYTES / gs / TG).max(1) * TG;
                let tb = (super::body::WIDE_A_BYTES / ops.arb.max(1) / TX).max(1) * TX;
                let mut buf = vec![0u8; gb.min(groups) * gs];
                let bp = buf.as_mut_ptr();
                let mut g_blk = 0;
                while g_blk < groups {
                    let g_end = (g_blk + gb).min(groups);
                    for g in g_blk..g_end {
                        let dst = bp.add((g - g_blk) * gs);
                        if K != 6 {
                            expand_q4_kx8::<K>(ops, g, dst);
                        } else {
                            expand_q6_kx8(ops, g, dst);
                        }
                    }
                    let mut t_blk = 0;
                    while t_blk < ntok {
                        let t_end = (t_blk + tb).min(ntok);
                        let mut g = g_blk;
                        while g < g_end {
                            let w = bp.add((g - g_blk) * gs);
                            let r0 = 8 * g;
                            let mut t = t_blk;
                            if g + TG <= g_end {
                                while t + TX <= t_end {
                                    tile_kx8::<TG, TX, K>(w, gs, ops, nsb, r0, t, out, os);
                                    t += TX;
                                }
                                while t < t_end {
                                    tile_kx8::<TG, 1, K>(w, gs, ops, nsb, r0, t, out, os);
                                    t += 1;
                                }
                                g += TG;
                            } else {
                                while t + TX <= t_end {
                                    tile_kx8::<1, TX, K>(w, gs, ops, nsb, r0, t, out, os);
                                    t += TX;
                                }
                                while t < t_end {
                                    tile_kx8::<1, 1, K>(w, gs, ops, nsb, r0, t, out, os);
                                    t += 1;
                                }
                                g += 1;
                            }
                        }
                        t_blk = t_end;
                    }
                    g_blk = g_end;
                }
            }
            if groups * 8 < nrows {
                let r0 = groups * 8;
                let tail = Operands {
                    w: &ops.w[r0 * ops.wrb..],
                    wrb: ops.wrb,
                    a: ops.a,
                    arb: ops.arb,
                    cols: ops.cols,
                };
                gemm_wide_k::<K>(&tail, nrows - r0, ntok, out.add(r0), os);
            }
        }

        /// Expands group `g` (rows 8g..8g + 8, interleaved) into
        /// `WIDE_KX8` bytes per super-block: code vector (sub-block b,
        /// word k) at 32 * (8b + k) holding in lane r the codes (0..15) of
        /// elements 32b + 4k..32b + 4k + 4 of row r; then per sub-block b
        /// the rows' scales as i32 at 2048 + 32b, as i16 pairs at 2304 +
        /// 32b, their mins as i16 pairs at 2560 + 32b; d and dmin as f32
        /// at 2816 and 2848.
        #[target_feature(enable = $feat)]
        #[inline]
        unsafe fn expand_q4_kx8<const K: u8>(ops: &Operands, g: usize, dst: *mut u8) {
            let grp = ops.w.as_ptr().add(g * 8 * ops.wrb);
            for s in 0..ops.cols / 256 {
                let gp = grp.add(s * if K == 5 { super::Q5K_X8 } else { super::Q4K_X8 });
                let d = dst.add(s * super::body::WIDE_KX8);
                let st = |at: usize, v: __m256i| _mm256_storeu_si256(d.add(at) as *mut __m256i, v);
                for c in 0..4 {
                    for k in 0..8 {
                        // Unit 3 + 8c + k (Q5_K: 11 + 8c + k): code bytes
                        // 32c + 4k.. of each row, low nibbles sub-block 2c,
                        // high nibbles 2c + 1; Q5_K's fifth bits 2c and
                        // 2c + 1 of qh bytes 4k.. (unit 3 + k).
                        let u0 = if K == 5 { 11 } else { 3 };
                        let v = ld(gp.add(32 + 32 * (u0 + 8 * c + k)));
                        let qh = if K == 5 {
                            ld(gp.add(32 + 32 * (3 + k)))
                        } else {
                            _mm256_setzero_si256()
                        };
                        let (lo, hi) = q45_codes::<K>(v, qh, c);
                        st(32 * (16 * c + k), lo);
                        st(32 * (16 * c + 8 + k), hi);
                    }
                }
                let mut sc = [[0i32; 8]; 8];
                let mut sc2 = [[0i16; 16]; 8];
                let mut mn2 = [[0i16; 16]; 8];
                for r in 0..8 {
                    // Units 0..3: the row's 12 packed scale bytes.
                    let mut packed = [0u8; 12];
                    for u in 0..3 {
                        core::ptr::copy_nonoverlapping(
                            gp.add(32 + 32 * u + 4 * r),
                            packed.as_mut_ptr().add(4 * u),
                            4,
                        );
                    }
                    for sub in 0..8 {
                        let (a, m) = onebit_formats::blocks::k4_scale_min(&packed, sub);
                        sc[sub][r] = a as i32;
                        sc2[sub][2 * r] = a as i16;
                        sc2[sub][2 * r + 1] = a as i16;
                        mn2[sub][2 * r] = m as i16;
                        mn2[sub][2 * r + 1] = m as i16;
                    }
                }
                for sub in 0..8 {
                    st(
                        2048 + 32 * sub,
                        _mm256_loadu_si256(sc[sub].as_ptr() as *const __m256i),
                    );
                    st(
                        2304 + 32 * sub,
                        _mm256_loadu_si256(sc2[sub].as_ptr() as *const __m256i),
                    );
                    st(
                        2560 + 32 * sub,
                        _mm256_loadu_si256(mn2[sub].as_ptr() as *const __m256i),
                    );
                }
                let cvt = |p: *const u8| _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i));
                _mm256_storeu_ps(d.add(2816) as *mut f32, cvt(gp));
                _mm256_storeu_ps(d.add(2848) as *mut f32, cvt(gp.add(16)));
            }
        }

        /// G expanded groups (at `w`, `gs` bytes apart; rows r0.. ) times T
        /// wide Q8_K rows from token `t0`. Per super-block and row (lane):
        /// per sub-block the code sum (VNNI: `vpdpbusd` into i32; else
        /// `vpmaddubsw` pairs added in i16, at most 8 x 2 x 15 x 128 =
        /// 30,720; Q5_K's codes 0..31 four vectors at a time, at most 4 x 2
        /// x 31 x 128 = 31,744) times its scale, and the mins times the activations'
        /// 16-element sums, exact integers as the scalar reference; then its
        /// float formula lane by lane, unfused.
        #[target_feature(enable = $feat)]
        #[inline]
        #[allow(clippy::too_many_arguments)]
        unsafe fn tile_wide_q4_kx8<const G: usize, const T: usize, const K: u8>(
            w: *const u8,
            gs: usize,
            ops: &Operands,
            nsb: usize,
            r0: usize,
            t0: usize,
            out: *mut f32,
            os: usize,
        ) {
            let wg = row_ptrs::<G>(w, 0, gs);
            let ap = row_ptrs::<T>(ops.a.as_ptr(), t0, ops.arb);
            let zero = _mm256_setzero_si256();
            let word = |p: *const u8| _mm256_set1_epi32((p as *const i32).read_unaligned());
            let mut facc = [[_mm256_setzero_ps(); T]; G];
            for s in 0..nsb {
                let (wo, ao) = (s * super::body::WIDE_KX8, s * super::WIDE_KA);
                let mut isum = [[zero; T]; G];
                // The code vectors summed before the scale: all 8, or
                // (without VNNI, Q5_K) 4 at a time.
                let kruns: &[(usize, usize)] = if !VNNI && K == 5 {
                    &[(0, 4), (4, 8)]
                } else {
                    &[(0, 8)]
                };
                for (b, &(k0, k1)) in (0..8).flat_map(|b| kruns.iter().map(move |r| (b, r))) {
                    let mut acc = [[zero; T]; G];
                    for k in k0..k1 {
                        let mut wv = [zero; G];
                        for g in 0..G {
                            wv[g] = ld(wg[g].add(wo + 32 * (8 * b + k)));
                        }
                        for j in 0..T {
                            // Word k of the activation's sub-block b.
                            let y = word(ap[j].add(ao + 32 * k + 4 * b));
                            for g in 0..G {
                                acc[g][j] = if VNNI {
                                    dp(acc[g][j], wv[g], y)
                                } else {
                                    _mm256_add_epi16(acc[g][j], _mm256_maddubs_epi16(wv[g], y))
                                };
                            }
                        }
                    }
                    for g in 0..G {
                        if VNNI {
                            let sc = ld(wg[g].add(wo + 2048 + 32 * b));
                            for j in 0..T {
                                isum[g][j] =
                                    _mm256_add_epi32(isum[g][j], _mm256_mullo_epi32(acc[g][j], sc));
                            }
                        } else {
                            let sc = ld(wg[g].add(wo + 2304 + 32 * b));
                            for j in 0..T {
                                isum[g][j] =
                                    _mm256_add_epi32(isum[g][j], _mm256_madd_epi16(acc[g][j], sc));
                            }
                        }
                    }
                }
                // Mins: sum_b m_b * (bsums[2b] + bsums[2b + 1]), the pair of
                // sums broadcast as one 32-bit word.
                let mut summ = [[zero; T]; G];
                for b in 0..8 {
                    for j in 0..T {
                        let bs = word(ap[j].add(ao + 256 + 4 * b));
                        for g in 0..G {
                            summ[g][j] = dp16(summ[g][j], ld(wg[g].add(wo + 2560 + 32 * b)), bs);
                        }
                    }
                }
                for g in 0..G {
                    let dx = _mm256_loadu_ps(wg[g].add(wo + 2816) as *const f32);
                    let dmx = _mm256_loadu_ps(wg[g].add(wo + 2848) as *const f32);
                    for j in 0..T {
                        let dy =
                            _mm256_set1_ps((ap[j].add(ao + 288) as *const f32).read_unaligned());
                        let d = _mm256_mul_ps(dx, dy);
                        let dmin = _mm256_mul_ps(dmx, dy);
                        let term = _mm256_sub_ps(
                            _mm256_mul_ps(d, _mm256_cvtepi32_ps(isum[g][j])),
                            _mm256_mul_ps(dmin, _mm256_cvtepi32_ps(summ[g][j])),
                        );
                        facc[g][j] = _mm256_add_ps(facc[g][j], term);
                    }
                }
            }
            for g in 0..G {
                for j in 0..T {
                    _mm256_storeu_ps(out.add((t0 + j) * os + r0 + 8 * g), facc[g][j]);
                }
            }
        }

        /// Expands group `g` (rows 8g..8g + 8, interleaved `super::Q6K_X8`)
        /// into `WIDE_Q6X8` bytes per super-block: code vector (32-element
        /// run b, word k) at 32 * (8b + k) holding in lane r the codes
        /// (0..63) of elements 32b + 4k..32b + 4k + 4 of row r; the rows'
        /// 16 scales as i32 at 2048 + 32j and as i16 pairs at 2560 + 32j;
        /// (32 x scale 2p, 32 x scale 2p + 1) as i16 at 3072 + 32p; d as f32
        /// at 3328.
        #[target_feature(enable = $feat)]
        #[inline]
        unsafe fn expand_q6_kx8(ops: &Operands, g: usize, dst: *mut u8) {
            let grp = ops.w.as_ptr().add(g * 8 * ops.wrb);
            let m4 = _mm256_set1_epi8(0x0F);
            let m3 = _mm256_set1_epi8(3);
            for s in 0..ops.cols / 256 {
                let gp = grp.add(s * super::Q6K_X8);
                let d = dst.add(s * super::body::WIDE_Q6X8);
                let st = |at: usize, v: __m256i| _mm256_storeu_si256(d.add(at) as *mut __m256i, v);
                // Unit u of the rows at 16 + 32u: units 0..32 ql, 32..48 qh,
                // 48..52 the scales. Element 128h + 32k + l: the nibble of
                // ql[64h + 32(k & 1) + l] (low for k < 2), top bits 2k.. of
                // qh[32h + l].
                for h in 0..2 {
                    for k in 0..4 {
                        let b = 4 * h + k;
                        let shift = _mm_cvtsi32_si128(2 * k as i32);
                        for wd in 0..8 {
                            let q = ld(gp.add(16 + 32 * (16 * h + 8 * (k & 1) + wd)));
                            let nib = if k < 2 {
                                _mm256_and_si256(q, m4)
                            } else {
                                _mm256_and_si256(_mm256_srli_epi16::<4>(q), m4)
                            };
                            let qh = ld(gp.add(16 + 32 * (32 + 8 * h + wd)));
                            let top = _mm256_and_si256(_mm256_srl_epi16(qh, shift), m3);
                            st(
                                32 * (8 * b + wd),
                                _mm256_or_si256(nib, _mm256_slli_epi16::<4>(top)),
                            );
                        }
                    }
                }
                let mut sc = [[0i32; 8]; 16];
                let mut sc2 = [[0i16; 16]; 16];
                let mut cr = [[0i16; 16]; 8];
                for r in 0..8 {
                    for j in 0..16 {
                        let v = *gp.add(16 + 32 * (48 + j / 4) + 4 * r + j % 4) as i8;
                        sc[j][r] = v as i32;
                        sc2[j][2 * r] = v as i16;
                        sc2[j][2 * r + 1] = v as i16;
                        cr[j / 2][2 * r + j % 2] = 32 * v as i16;
                    }
                }
                for j in 0..16 {
                    st(
                        2048 + 32 * j,
                        _mm256_loadu_si256(sc[j].as_ptr() as *const __m256i),
                    );
                    st(
                        2560 + 32 * j,
                        _mm256_loadu_si256(sc2[j].as_ptr() as *const __m256i),
                    );
                }
                for p in 0..8 {
                    st(
                        3072 + 32 * p,
                        _mm256_loadu_si256(cr[p].as_ptr() as *const __m256i),
                    );
                }
                let cvt = |p: *const u8| _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i));
                _mm256_storeu_ps(d.add(3328) as *mut f32, cvt(gp));
            }
        }

        /// As [`tile_wide_q4_kx8`] for Q6_K: per 16-element sub-block the
        /// code sum (VNNI: `vpdpbusd` into i32; else `vpmaddubsw` pairs added
        /// in i16 two words at a time, at most 2 x 2 x 63 x 128 = 32,256)
        /// times its scale, minus 32 x the scales times the activations'
        /// 16-element sums; then (dx * dy) * isum lane by lane.
        #[target_feature(enable = $feat)]
        #[inline]
        #[allow(clippy::too_many_arguments)]
        unsafe fn tile_wide_q6_kx8<const G: usize, const T: usize>(
            w: *const u8,
            gs: usize,
            ops: &Operands,
            nsb: usize,
            r0: usize,
            t0: usize,
            out: *mut f32,
            os: usize,
        ) {
            let wg = row_ptrs::<G>(w, 0, gs);
            let ap = row_ptrs::<T>(ops.a.as_ptr(), t0, ops.arb);
            let zero = _mm256_setzero_si256();
            let word = |p: *const u8| _mm256_set1_epi32((p as *const i32).read_unaligned());
            let mut facc = [[_mm256_setzero_ps(); T]; G];
            for s in 0..nsb {
                let (wo, ao) = (s * super::body::WIDE_Q6X8, s * super::WIDE_KA);
                let mut isum = [[zero; T]; G];
                for b in 0..8 {
                    for part in 0..2 {
                        // Words 4 part..4 part + 4 of run b: sub-block 2b + part.
                        let sj = 2 * b + part;
                        let steps: &[usize] = if VNNI { &[4] } else { &[2, 2] };
                        let mut k0 = 4 * part;
                        for &n in steps {
                            let mut acc = [[zero; T]; G];
                            for k in k0..k0 + n {
                                let mut wv = [zero; G];
                                for g in 0..G {
                                    wv[g] = ld(wg[g].add(wo + 32 * (8 * b + k)));
                                }
                                for j in 0..T {
                                    let y = word(ap[j].add(ao + 32 * k + 4 * b));
                                    for g in 0..G {
                                        acc[g][j] = if VNNI {
                                            dp(acc[g][j], wv[g], y)
                                        } else {
                                            _mm256_add_epi16(
                                                acc[g][j],
                                                _mm256_maddubs_epi16(wv[g], y),
                                            )
                                        };
                                    }
                                }
                            }
                            for g in 0..G {
                                if VNNI {
                                    let sc = ld(wg[g].add(wo + 2048 + 32 * sj));
                                    for j in 0..T {
                                        isum[g][j] = _mm256_add_epi32(
                                            isum[g][j],
                                            _mm256_mullo_epi32(acc[g][j], sc),
                                        );
                                    }
                                } else {
                                    let sc = ld(wg[g].add(wo + 2560 + 32 * sj));
                                    for j in 0..T {
                                        isum[g][j] = _mm256_add_epi32(
                                            isum[g][j],
                                            _mm256_madd_epi16(acc[g][j], sc),
                                        );
                                    }
                                }
                            }
                            k0 += n;
                        }
                    }
                }
                // 32 x sum_j scale_j * bsums[j], the pair of sums broadcast
                // as one 32-bit word.
                let mut corr = [[zero; T]; G];
                for p in 0..8 {
                    for j in 0..T {
                        let bs = word(ap[j].add(ao + 256 + 4 * p));
                        for g in 0..G {
                            corr[g][j] = dp16(corr[g][j], ld(wg[g].add(wo + 3072 + 32 * p)), bs);
                        }
                    }
                }
                for g in 0..G {
                    let dx = _mm256_loadu_ps(wg[g].add(wo + 3328) as *const f32);
                    for j in 0..T {
                        let dy =
                            _mm256_set1_ps((ap[j].add(ao + 288) as *const f32).read_unaligned());
                        let v = _mm256_sub_epi32(isum[g][j], corr[g][j]);
                        let term = _mm256_mul_ps(_mm256_mul_ps(dx, dy), _mm256_cvtepi32_ps(v));
                        facc[g][j] = _mm256_add_ps(facc[g][j], term);
                    }
                }
            }
            for g in 0..G {
                for j in 0..T {
                    _mm256_storeu_ps(out.add((t0 + j) * os + r0 + 8 * g), facc[g][j]);
                }
            }
        }

        /// [`tile_wide_q4_kx8`] (K = 4, 5) or [`tile_wide_q6_kx8`] (K = 6).
        #[target_feature(enable = $feat)]
        #[inline]
        #[allow(clippy::too_many_arguments)]
        unsafe fn tile_kx8<const G: usize, const T: usize, const K: u8>(
            w: *const u8,
            gs: usize,
            ops: &Operands,
            nsb: usize,
            r0: usize,
            t0: usize,
            out: *mut f32,
            os: usize,
        ) {
            if K != 6 {
                tile_wide_q4_kx8::<G, T, K>(w, gs, ops, nsb, r0, t0, out, os);
            } else {
                tile_wide_q6_kx8::<G, T>(w, gs, ops, nsb, r0, t0, out, os);
            }
        }
    };
}
