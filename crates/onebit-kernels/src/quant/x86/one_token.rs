//! The one-token kernels of the blocks of 32 (Q4_0, Q4_1, Q5_0, MXFP4 per packed
//! row; Q4_0, Q4_1 and Q5_0 interleaved by 8 rows; Q8_0 per packed row) and F32,
//! instantiated per level inside [`simd_kernels!`]. Every output equals
//! the scalar reference's bits: exact integer block sums, then the
//! reference's float operations in its order (block b into lane b % 8).

macro_rules! x86_one_token {
    ($feat:literal) => {
        // -------------------------------------------------------------------
        // Q4_0 (K = 0), Q4_1 (K = 1), Q5_0 (K = 2), MXFP4 (K = 3), packed rows.
        //
        // MXFP4's codes go through a 16-byte table to their doubled E2M1
        // values plus 12 (0..=24, unsigned for `vpdpbusd`/`vpmaddubsw`); 12
        // times the block's activation code sum is then taken off, as Q4_0's
        // 8, so the block sum is the exact integer sum of value x code. The
        // block's scale 2^(e - 128) is built from its exponent byte as f32
        // bits, exactly, and multiplies the activation scale first, as the
        // scalar reference does.

        #[target_feature(enable = $feat)]
        unsafe fn gemm_q4<const K: u8>(
            ops: &Operands,
            nrows: usize,
            ntok: usize,
            out: *mut f32,
            os: usize,
        ) {
            drive!(tile_q4, ops, nrows, ntok, out, os, K);
        }

        #[target_feature(enable = $feat)]
        #[inline]
        unsafe fn tile_q4<const R: usize, const T: usize, const K: u8>(
            ops: &Operands,
            r0: usize,
            t0: usize,
            out: *mut f32,
            os: usize,
        ) {
            let nb = ops.cols / 32;
            let wbb = match K {
                0 => 18,
                1 => 20,
                2 => 22,
                _ => 17,
            };
            let abb = 40;
            let wp = row_ptrs::<R>(ops.w.as_ptr(), r0, ops.wrb);
            let ap = row_ptrs::<T>(ops.a.as_ptr(), t0, ops.arb);
            let m4 = _mm256_set1_epi8(0x0F);
            let zero = _mm256_setzero_si256();
            // MXFP4: code -> doubled E2M1 value + 12, per 128-bit half.
            let lut = _mm256_setr_epi8(
                12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0, 12, 13, 14, 15, 16, 18,
                20, 24, 12, 11, 10, 9, 8, 6, 4, 0,
            );
            let mut facc = [[_mm256_setzero_ps(); T]; R];
            for g in 0..nb.div_ceil(8) {
                let n = (nb - 8 * g).min(8);
                // Offsets in this group: weight codes, activation codes.
                let wqo = match K {
                    0 => 2 * n,
                    1 => 4 * n,
                    2 => 6 * n,
                    _ => n,
                };
                let aqo = 8 * n;
                let (wg, ag) = (g * 8 * wbb, g * 8 * abb);
                for i in 0..R {
                    prefetch(wp[i].wrapping_add(wg + PF_AHEAD), n * wbb);
                }
                let mut acc = [[zero; T]; R];
                // Without VNNI, Q4_0/Q4_1 products are summed in i16 over
                // the group (`vpmaddubsw` pairs of at most 2 x 15 x 128, at
                // most 8 of them: 30,720) and widened once, not per vector
                // (MXFP4's 2 x 24 x 128 would not fit 8 times).
                let sum16 = !VNNI && K < 2;
                let mut acc16 = [[zero; T]; R];
                // With VNNI and one token, each accumulator would be a chain
                // of 2 dependent `vpdpbusd` per code vector (4 rows: too few
                // chains to hide the latency), so the high nibbles go to a
                // second set, added once per group (integer sums: exact in
                // any order).
                let split = VNNI && T == 1;
                let mut acc2 = [[zero; T]; R];
                // Code vector k of the group sits at `stride * k` (low
                // nibbles' activations; the high nibbles' 16n bytes later).
                // A partial group of 2 or 4 blocks packs 8/n of its short
                // vectors into one 32-byte load (`stride` 32): lane j then
                // sums block j % n, and `fold_lanes` adds those lanes up
                // (integer sums: exact in any order).
                let mut run = |iters: usize, stride: usize| {
                    for k in 0..iters {
                        let mut ylo = [zero; T];
                        let mut yhi = [zero; T];
                        for j in 0..T {
                            ylo[j] = ld(ap[j].add(ag + aqo + stride * k));
                            yhi[j] = ld(ap[j].add(ag + aqo + 16 * n + stride * k));
                        }
                        for i in 0..R {
                            let v = ld(wp[i].add(wg + wqo + stride * k));
                            let mut lo = _mm256_and_si256(v, m4);
                            let mut hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
                            if K == 3 {
                                lo = _mm256_shuffle_epi8(lut, lo);
                                hi = _mm256_shuffle_epi8(lut, hi);
                            }
                            if K == 2 {
                                let hb = wp[i].add(wg + 2 * n);
                                // `stride` fifth bits from bit `at`.
                                let bits = |at: usize| {
                                    let w =
                                        (hb.add(at / 8) as *const u64).read_unaligned() >> (at % 8);
                                    w as u32 & (((1u64 << stride) - 1) as u32)
                                };
                                lo = _mm256_or_si256(lo, expand_bits(bits(stride * k)));
                                hi = _mm256_or_si256(hi, expand_bits(bits(16 * n + stride * k)));
                            }
                            for j in 0..T {
                                if sum16 {
                                    let p = _mm256_add_epi16(
                                        _mm256_maddubs_epi16(lo, ylo[j]),
                                        _mm256_maddubs_epi16(hi, yhi[j]),
                                    );
                                    acc16[i][j] = _mm256_add_epi16(acc16[i][j], p);
                                } else if split {
                                    acc[i][j] = dp(acc[i][j], lo, ylo[j]);
                                    acc2[i][j] = dp(acc2[i][j], hi, yhi[j]);
                                } else {
                                    acc[i][j] = dp(acc[i][j], lo, ylo[j]);
                                    acc[i][j] = dp(acc[i][j], hi, yhi[j]);
                                }
                            }
                        }
                    }
                };
                let widen = |acc: &mut [[__m256i; T]; R],
                             acc16: &[[__m256i; T]; R],
                             acc2: &[[__m256i; T]; R]| {
                    if split {
                        for i in 0..R {
                            for j in 0..T {
                                acc[i][j] = _mm256_add_epi32(acc[i][j], acc2[i][j]);
                            }
                        }
                    }
                    if sum16 {
                        let ones = _mm256_set1_epi16(1);
                        for i in 0..R {
                            for j in 0..T {
                                acc[i][j] = _mm256_madd_epi16(acc16[i][j], ones);
                            }
                        }
                    }
                };
                if n == 8 {
                    run(4, 32);
                    widen(&mut acc, &acc16, &acc2);
                } else if n == 2 || n == 4 {
                    run(n / 2, 32);
                    widen(&mut acc, &acc16, &acc2);
                    fold_all(&mut acc, &mut [zero; T], n);
                } else {
                    run(4, 4 * n);
                    widen(&mut acc, &acc16, &acc2);
                }
                let mut dy = [_mm256_setzero_ps(); T];
                let mut sy = [_mm256_setzero_ps(); T];
                // Q4_0, Q5_0: offset x each block's code sum (stored with
                // the activations), taken off the code products per lane.
                let mut ys = [zero; T];
                for j in 0..T {
                    dy[j] = _mm256_loadu_ps(ap[j].add(ag) as *const f32);
                    if K == 1 {
                        sy[j] = _mm256_loadu_ps(ap[j].add(ag + 4 * n) as *const f32);
                    } else {
                        let sums = ld(ap[j].add(ag + 4 * n));
                        ys[j] = match K {
                            2 => _mm256_slli_epi32::<4>(sums),
                            // 12 x the sum: 8x + 4x, exact in i32.
                            3 => _mm256_add_epi32(
                                _mm256_slli_epi32::<3>(sums),
                                _mm256_slli_epi32::<2>(sums),
                            ),
                            _ => _mm256_slli_epi32::<3>(sums),
                        };
                    }
                }
                let mask = lane_mask(n);
                if n < 8 {
                    // See `tile_q8_0`: no subnormal operand in the lanes
                    // past the group's blocks.
                    for j in 0..T {
                        dy[j] = _mm256_and_ps(dy[j], mask);
                        sy[j] = _mm256_and_ps(sy[j], mask);
                    }
                }
                for i in 0..R {
                    let dx = if K == 3 {
                        e8m0_half8(wp[i].add(wg))
                    } else {
                        _mm256_cvtph_ps(_mm_loadu_si128(wp[i].add(wg) as *const __m128i))
                    };
                    let mx = if K == 1 {
                        _mm256_cvtph_ps(_mm_loadu_si128(wp[i].add(wg + 2 * n) as *const __m128i))
                    } else {
                        _mm256_setzero_ps()
                    };
                    for j in 0..T {
                        let isum = if K == 1 {
                            acc[i][j]
                        } else {
                            _mm256_sub_epi32(acc[i][j], ys[j])
                        };
                        // (dx * dy) * sumi [+ m * s], as the scalar reference.
                        let mut term =
                            _mm256_mul_ps(_mm256_mul_ps(dx, dy[j]), _mm256_cvtepi32_ps(isum));
                        if K == 1 {
                            term = _mm256_add_ps(term, _mm256_mul_ps(mx, sy[j]));
                        }
                        if n < 8 {
                            term = _mm256_and_ps(term, mask);
                        }
                        facc[i][j] = _mm256_add_ps(facc[i][j], term);
                    }
                }
            }
            write_facc(&facc, r0, t0, out, os);
        }

        // -------------------------------------------------------------------
        // Q4_0 (K = 0), Q5_0 (K = 2) · Q8_0 and Q4_1 (K = 1) · Q8_1, rows
        // interleaved by 8 (`super::Q4_0_X8`, `super::Q5_0_X8`,
        // `super::Q4_1_X8`), one row per 32-bit lane: one
        // sequential stream per group of rows, every activation word
        // broadcast to all lanes, no horizontal sums.

        /// Pairs of whole groups of 8 rows run [`tile_qx16_rows`] (AVX2:
        /// [`tile_qx8`] for one token, [`tile_qx8_rows`] for several), a
        /// last odd group [`tile_qx8`] for one token and [`tile_qx8_rows`]
        /// for tiles of several (each group decoded once per tile, its few
        /// KiB in L1 for the next tile; prefill widths are the wide
        /// kernel's job); the rows past the last whole group are packed per
        /// row and run [`tile_q4`].
        #[target_feature(enable = $feat)]
        unsafe fn gemm_qx8<const K: u8>(
            ops: &Operands,
            nrows: usize,
            ntok: usize,
            out: *mut f32,
            os: usize,
        ) {
            let groups = nrows / 8;
            let mut g = 0;
            // Two groups at a time ([`tile_qx16_rows`]), one token too (as
            // `gemm_q4_kx8`): one token of a 1.2 GB Q4_0 matrix from
            // memory went from 23.3-23.6 to 26.8-27.2 GB/s, Q4_1 from 23.1-
            // 23.5 to 26.1-26.3, Q5_0 from 22.0-22.6 to 23.8-24.0 (Intel
            // Xeon, 2 threads, examples/kernels.rs, alternating binaries).
            // AVX2's pair tile runs [`tile_qx8`] twice for one token.
            // Tiles of TT16 tokens (8 at AVX-512, as the Q4_K pair tile):
            // each group's decoded codes serve twice the tokens, which
            // frees ports 0 and 5 for `vpdpbusd` and the float terms. One
            // thread, examples/kernels.rs, alternating binaries on the Intel
            // Xeon: SmolLM2's Q4_1 ffn up 55-60 -> 49-51 us at 8 tokens and
            // 108-119 -> 100-101 at 16, Gemma 3's Q5_0 ffn up 103-109 -> 89-91
            // at 8 and 408-422 -> 348-359 at 32; Llama-3.2-3B's Q4_0 ffn up
            // on 2 threads 811-816 -> 670-748 us at 8 tokens.
            while g + 2 <= groups {
                token_tiles!(ntok, TT16, |t, T| tile_qx16_rows::<K, T>(
                    ops, g, t, out, os
                ));
                g += 2;
            }
            for g in g..groups {
                token_tiles!(ntok, |t, T| if T == 1 {
                    tile_qx8::<K>(ops, g, t, out, os)
                } else {
                    tile_qx8_rows::<K, T>(ops, g, t, out, os)
                });
            }
            let r0 = groups * 8;
            if r0 < nrows {
                let tail = Operands {
                    w: &ops.w[r0 * ops.wrb..],
                    ..*ops
                };
                drive!(tile_q4, &tail, nrows - r0, ntok, out.add(r0), os, K);
            }
        }

        /// Rows 8g..8g + 8 times token `t`. Per block and row (lane): the
        /// exact integer sum of codes times activation codes, less the
        /// offset (Q4_0 8, Q5_0 16) x the activations' code sum; then (dx * dy) * sumi
        /// (Q4_1: plus m * s) added into float
        /// vector b % 8, as the scalar reference adds block b into lane
        /// b % 8 of each row; the eight vectors are transposed at the end so
        /// each row's eight lanes reduce as `reduce8`.
        ///
        /// Code sums: Q4_0 and Q4_1 with VNNI, `vpdpbusd` of the low nibbles and of
        /// the high nibbles left in place (16 x the code: the sum is
        /// shifted back exactly). Otherwise `vpmaddubsw` pairs (at most
        /// 2 x 31 x 128), the low and the high nibbles' added in two i16
        /// sums over the block's 4 units (at most 31,744), widened by
        /// `vpmaddwd` (VNNI: `vpdpbusd` into i32). Q5_0's fifth bits: byte
        /// u of a row's word (`super::q5_qh_x8`) spread over the unit's four
        /// bytes, then bit i (low nibbles) or 4 + i (high) of byte i picked.
        #[target_feature(enable = $feat)]
        #[inline]
        unsafe fn tile_qx8<const K: u8>(
            ops: &Operands,
            g: usize,
            t: usize,
            out: *mut f32,
            os: usize,
        ) {
            let (gb, qo) = super::x8_group(K);
            let nb = ops.cols / 32;
            let gw = ops.w.as_ptr().add(g * 8 * ops.wrb);
            let ap = ops.a.as_ptr().add(t * ops.arb);
            let zero = _mm256_setzero_si256();
            let m4 = _mm256_set1_epi8(0x0F);
            let mf0 = _mm256_set1_epi8(0xF0u8 as i8);
            let ones = _mm256_set1_epi16(1);
            // Q5_0: byte u of each 32-bit lane to all four of its bytes;
            // bit i (low nibbles) and bit 4 + i (high) of byte i.
            let spread = |u: i8| {
                let l = |k: i8| 4 * k + u;
                _mm256_setr_epi8(
                    l(0),
                    l(0),
                    l(0),
                    l(0),
                    l(1),
                    l(1),
                    l(1),
                    l(1),
                    l(2),
                    l(2),
                    l(2),
                    l(2),
                    l(3),
                    l(3),
                    l(3),
                    l(3),
                    l(0),
                    l(0),
                    l(0),
                    l(0),
                    l(1),
                    l(1),
                    l(1),
                    l(1),
                    l(2),
                    l(2),
                    l(2),
                    l(2),
                    l(3),
                    l(3),
                    l(3),
                    l(3),
                )
            };
            let spreads = [spread(0), spread(1), spread(2), spread(3)];
            let sel_lo = _mm256_set1_epi32(0x0804_0201);
            let sel_hi = _mm256_set1_epi32(0x8040_2010u32 as i32);
            let mut facc = [_mm256_setzero_ps(); 8];
            for bg in 0..nb.div_ceil(8) {
                let n = (nb - 8 * bg).min(8);
                let gx = gw.add(bg * 8 * gb);
                prefetch(gx.wrapping_add(PF_AHEAD), n * gb);
                // This group's activations: d[n] f32, code sums[n] i32,
                // code word k of block l at 8n + 4n * k + 4l.
                let ag = ap.add(bg * 8 * 40);
                let term = |l: usize| {
                    let bx = gx.add(l * gb);
                    let yw = ag.add(8 * n + 4 * l);
                    let word = |k: usize| {
                        _mm256_set1_epi32((yw.add(4 * n * k) as *const i32).read_unaligned())
                    };
                    let qh = if K == 2 { ld(bx.add(16)) } else { zero };
                    let mut s = zero;
                    let mut s2 = zero;
                    for u in 0..4 {
                        let v = ld(bx.add(qo + 32 * u));
                        let (ylo, yhi) = (word(u), word(u + 4));
                        if VNNI && K != 2 {
                            s = dpa(s, _mm256_and_si256(v, m4), ylo);
                            s2 = dpa(s2, _mm256_and_si256(v, mf0), yhi);
                            continue;
                        }
                        let mut lo = _mm256_and_si256(v, m4);
                        let mut hi = _mm256_and_si256(_mm256_srli_epi16::<4>(v), m4);
                        if K == 2 {
                            let x = _mm256_shuffle_epi8(qh, spreads[u]);
                            lo = _mm256_or_si256(lo, sel_bits(x, sel_lo));
                            hi = _mm256_or_si256(hi, sel_bits(x, sel_hi));
                        }
                        if VNNI {
                            s = dpa(s, lo, ylo);
                            s2 = dpa(s2, hi, yhi);
                        } else {
                            s = _mm256_add_epi16(s, _mm256_maddubs_epi16(lo, ylo));
                            s2 = _mm256_add_epi16(s2, _mm256_maddubs_epi16(hi, yhi));
                        }
                    }
                    let isum = if VNNI && K != 2 {
                        _mm256_add_epi32(s, _mm256_srai_epi32::<4>(s2))
                    } else if VNNI {
                        _mm256_add_epi32(s, s2)
                    } else {
                        _mm256_add_epi32(_mm256_madd_epi16(s, ones), _mm256_madd_epi16(s2, ones))
                    };
                    let dx = _mm256_cvtph_ps(_mm_loadu_si128(bx as *const __m128i));
                    let dy = _mm256_set1_ps((ag.add(4 * l) as *const f32).read_unaligned());
                    let second = ag.add(4 * n + 4 * l);
                    if K == 1 {
                        // (dx * dy) * sumi + m * s, as the scalar reference.
                        let mx = _mm256_cvtph_ps(_mm_loadu_si128(bx.add(16) as *const __m128i));
                        let sy = _mm256_set1_ps((second as *const f32).read_unaligned());
                        let scaled = _mm256_mul_ps(_mm256_mul_ps(dx, dy), _mm256_cvtepi32_ps(isum));
                        return _mm256_add_ps(scaled, _mm256_mul_ps(mx, sy));
                    }
                    let sy = (second as *const i32).read_unaligned();
                    let isum = _mm256_sub_epi32(isum, _mm256_set1_epi32(x8_offset::<K>(sy)));
                    _mm256_mul_ps(_mm256_mul_ps(dx, dy), _mm256_cvtepi32_ps(isum))
                };
                // Constant indices only (written out: the compiler does not
                // unroll a loop this size), so the eight accumulators can
                // live in registers rather than on the stack.
                macro_rules! add_block {
                    ($l:literal) => {
                        if $l < n {
                            facc[$l] = _mm256_add_ps(facc[$l], term($l));
                        }
                    };
                }
                add_block!(0);
                add_block!(1);
                add_block!(2);
                add_block!(3);
                add_block!(4);
                add_block!(5);
                add_block!(6);
                add_block!(7);
            }
            // facc[l] lane r = row r's lane l: transpose, reduce per row.
            let mut lanes = [[0f32; 8]; 8];
            for (l, f) in facc.iter().enumerate() {
                _mm256_storeu_ps(lanes[l].as_mut_ptr(), *f);
            }
            for r in 0..8 {
                let row: [f32; 8] = core::array::from_fn(|l| lanes[l][r]);
                *out.add(t * os + 8 * g + r) = reduce8(&row);
            }
        }

        // -------------------------------------------------------------------
        // Q8_0, packed rows.

        #[target_feature(enable = $feat)]
        unsafe fn gemm_q8_0(ops: &Operands, nrows: usize, ntok: usize, out: *mut f32, os: usize) {
            drive!(tile_q8_0, ops, nrows, ntok, out, os);
        }

        #[target_feature(enable = $feat)]
        #[inline]
        unsafe fn tile_q8_0<const R: usize, const T: usize>(
            ops: &Operands,
            r0: usize,
            t0: usize,
            out: *mut f32,
            os: usize,
        ) {
            let nb = ops.cols / 32;
            let wp = row_ptrs::<R>(ops.w.as_ptr(), r0, ops.wrb);
            let ap = row_ptrs::<T>(ops.a.as_ptr(), t0, ops.arb);
            let zero = _mm256_setzero_si256();
            // With VNNI: (w + 128) x y summed by `vpdpbusd` (u8 x i8
            // into i32, exact), the weight vector biased once for all
            // the tile's tokens, then 128 x each block's code sum
            // (stored with the activations) taken off: one instruction
            // per vector and token where the sign trick takes two (the
            // one-token form adds each product apart, see `dpa`). The
            // same i32 sums, so the same bits. On the Intel Xeon (2
            // threads, alternating binaries) Gemma 3 270M, whose 178 MB
            // Q8_0 output is 70 % of a token's bytes, decoded at 93.6-
            // 96.5 tok/s with the sign trick and 98.9-103.4 this way;
            // SmolLM2's Q8_0 output at 8 tokens went from 1844-1871 to
            // 1605-1721 us.
            let bias = Q8_BIAS && VNNI;
            let x80 = _mm256_set1_epi8(0x80u8 as i8);
            let mut facc = [[_mm256_setzero_ps(); T]; R];
            for g in 0..nb.div_ceil(8) {
                let n = (nb - 8 * g).min(8);
                let (wg, ag) = (g * 8 * 34, g * 8 * 40);
                for i in 0..R {
                    prefetch(wp[i].wrapping_add(wg + PF_AHEAD), n * 34);
                }
                let mut acc = [[zero; T]; R];
                // As in `tile_q4`: a partial group of 2 or 4 blocks is read
                // 32 bytes (8/n code vectors) at a time, then folded.
                let mut run = |iters: usize, stride: usize| {
                    for k in 0..iters {
                        let mut y = [zero; T];
                        for j in 0..T {
                            y[j] = ld(ap[j].add(ag + 8 * n + stride * k));
                        }
                        for i in 0..R {
                            let v = ld(wp[i].add(wg + 2 * n + stride * k));
                            if bias {
                                let wb = _mm256_xor_si256(v, x80);
                                for j in 0..T {
                                    acc[i][j] = if T == 1 {
                                        dpa(acc[i][j], wb, y[j])
                                    } else {
                                        dp(acc[i][j], wb, y[j])
                                    };
                                }
                                continue;
                            }
                            let w = q8_prep(v);
                            for j in 0..T {
                                // Several tokens: chains enough to hide
                                // `vpdpbusd`'s latency, so the product goes
                                // straight into the accumulator (see `dpa`).
                                acc[i][j] = if T == 1 {
                                    q8_pair(acc[i][j], w, y[j])
                                } else {
                                    dp(acc[i][j], w.0, _mm256_sign_epi8(y[j], w.1))
                                };
                            }
                        }
                    }
                };
                if n == 8 {
                    run(8, 32);
                } else if n == 2 || n == 4 {
                    run(n, 32);
                    fold_all(&mut acc, &mut [zero; T], n);
                } else {
                    run(8, 4 * n);
                }
                if bias {
                    // Lane l < n: block l's sum less 128 x its code sum
                    // (the lanes past n are masked off below).
                    for j in 0..T {
                        let ys = _mm256_slli_epi32::<7>(ld(ap[j].add(ag + 4 * n)));
                        for acc_i in acc.iter_mut() {
                            acc_i[j] = _mm256_sub_epi32(acc_i[j], ys);
                        }
                    }
                }
                let mut dy = [_mm256_setzero_ps(); T];
                for j in 0..T {
                    dy[j] = _mm256_loadu_ps(ap[j].add(ag) as *const f32);
                }
                let mask = lane_mask(n);
                if n < 8 {
                    // In a partial group the lanes past its n blocks load
                    // the next bytes: the blocks' code sums, small i32s,
                    // which read as f32 are subnormal. Intel cores multiply
                    // a subnormal through a microcode assist (about 100
                    // cycles; the Zen 4 VM showed no such cost), and Gemma 3's rows of 20
                    // blocks end in such a group: its 262144 x 640 Q8_0
                    // output ran at 7.4 GB/s from memory and 8.4 from L2
                    // on one thread of an Intel Xeon (Q6_K: 12 and 27).
                    // Zeroed here, they multiply nothing and their terms are
                    // still masked off below: the same bits.
                    for y in dy.iter_mut() {
                        *y = _mm256_and_ps(*y, mask);
                    }
                }
                for i in 0..R {
                    let dx = _mm256_cvtph_ps(_mm_loadu_si128(wp[i].add(wg) as *const __m128i));
                    for j in 0..T {
                        let mut term =
                            _mm256_mul_ps(_mm256_mul_ps(dx, dy[j]), _mm256_cvtepi32_ps(acc[i][j]));
                        if n < 8 {
                            term = _mm256_and_ps(term, mask);
                        }
                        facc[i][j] = _mm256_add_ps(facc[i][j], term);
                    }
                }
            }
            write_facc(&facc, r0, t0, out, os);
        }

        // -------------------------------------------------------------------
        // F32 · F32: element i into lane i % 8, mul then add, as the reference.

        #[target_feature(enable = $feat)]
        unsafe fn gemm_f32(ops: &Operands, nrows: usize, ntok: usize, out: *mut f32, os: usize) {
            drive!(tile_f32, ops, nrows, ntok, out, os);
        }

        #[target_feature(enable = $feat)]
        #[inline]
        unsafe fn tile_f32<const R: usize, const T: usize>(
            ops: &Operands,
            r0: usize,
            t0: usize,
            out: *mut f32,
            os: usize,
        ) {
            let n = ops.cols;
            let n8 = n / 8 * 8;
            let wp = row_ptrs::<R>(ops.w.as_ptr(), r0, ops.wrb);
            let ap = row_ptrs::<T>(ops.a.as_ptr(), t0, ops.arb);
            let mut acc = [[_mm256_setzero_ps(); T]; R];
            let mut e = 0;
            while e < n8 {
                let mut x = [_mm256_setzero_ps(); T];
                for j in 0..T {
                    x[j] = _mm256_loadu_ps((ap[j] as *const f32).add(e));
                }
                for i in 0..R {
                    let w = _mm256_loadu_ps((wp[i] as *const f32).add(e));
                    for j in 0..T {
                        acc[i][j] = _mm256_add_ps(acc[i][j], _mm256_mul_ps(w, x[j]));
                    }
                }
                e += 8;
            }
            let mut lanes = [[[0f32; 8]; T]; R];
            for i in 0..R {
                for j in 0..T {
                    _mm256_storeu_ps(lanes[i][j].as_mut_ptr(), acc[i][j]);
                    for e in n8..n {
                        let w = (wp[i] as *const f32).add(e).read_unaligned();
                        let x = (ap[j] as *const f32).add(e).read_unaligned();
                        lanes[i][j][e - n8] += w * x;
                    }
                }
            }
            write_tile(&lanes, r0, t0, out, os);
        }
    };
}
