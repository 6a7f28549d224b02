//! The one-token and few-row K-quant kernels (Q4_K, Q5_K and Q6_K,
//! standard rows and rows interleaved by 8), instantiated per level inside
//! [`simd_kernels!`]. Q5_K is Q4_K's family (the same scales and mins, the
//! fifth bit of each code from the 32 qh bytes): its kernels are Q4_K's with
//! `K = 5`.
//! Every output equals the scalar reference's bits: exact integer
//! super-block sums, then its float formula per row, unfused.

macro_rules! x86_k_quants {
    ($feat:literal) => {
        // -------------------------------------------------------------------
        // Q4_K (K = 4), Q5_K (K = 5) · Q8_K, standard layout: the rows past
        // an interleaved matrix's last whole group of 8.

        /// Q4_K's eight 6-bit scales (bytes 0..8) and mins (bytes 8..16)
        /// from the 12 packed bytes at `p`, as `k4_scale_min` decodes them:
        /// sub-block j < 4 from the low 6 bits of bytes j and j + 4; j >= 4
        /// from the nibbles of byte j + 4 and the top 2 bits of bytes j - 4
        /// and j.
        #[target_feature(enable = $feat)]
        #[inline]
        unsafe fn k4_scales_mins(p: *const u8) -> __m128i {
            let a = (p as *const u32).read_unaligned();
            let b = (p.add(4) as *const u32).read_unaligned();
            let c = (p.add(8) as *const u32).read_unaligned();
            let sc_lo = a & 0x3F3F_3F3F;
            let m_lo = b & 0x3F3F_3F3F;
            let sc_hi = (c & 0x0F0F_0F0F) | (((a >> 6) & 0x0303_0303) << 4);
            let m_hi = ((c >> 4) & 0x0F0F_0F0F) | (((b >> 6) & 0x0303_0303) << 4);
            _mm_setr_epi32(sc_lo as i32, sc_hi as i32, m_lo as i32, m_hi as i32)
        }

        /// The 64 codes of 32 code bytes `v` of a Q4_K (K = 4) or Q5_K (K =
        /// 5) super-block, run `c` (sub-blocks 2c and 2c + 1): (low nibbles,
        /// high nibbles); Q5_K's with their fifth bit from the qh bytes `qh`
        /// ([`with_fifth_bits`]).
        #[target_feature(enable = $feat)]
        #[inline]
        unsafe fn q45_codes<const K: u8>(v: __m256i, qh: __m256i, c: usize) -> (__m256i, __m256i) {
            let m4 = _mm256_set1_epi8(0x0F);
            let lo = _mm256_and_si256(v, m4);
            let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(v), m4);
            if K == 5 {
                with_fifth_bits(lo, hi, qh, c)
            } else {
                (lo, hi)
            }
        }

        /// Q5_K's fifth bits on the codes of sub-blocks 2c (`lo`) and 2c + 1
        /// (`hi`): bit 2c (2c + 1) of qh[l] is element l's fifth bit in
        /// sub-block 2c (2c + 1), added as 0x10.
        #[target_feature(enable = $feat)]
        #[inline]
        unsafe fn with_fifth_bits(
            lo: __m256i,
            hi: __m256i,
            qh: __m256i,
            c: usize,
        ) -> (__m256i, __m256i) {
            let b = 1i8 << (2 * c);
            (
                _mm256_or_si256(lo, sel_bits(qh, _mm256_set1_epi8(b))),
                _mm256_or_si256(hi, sel_bits(qh, _mm256_set1_epi8(b << 1))),
            )
        }

        /// Q6_K codes (0..63, before the offset of -32), byte by byte: code
        /// vector k of byte l is the low (k < 2) or high nibble of `q1` (k
        /// even) or `q2` (k odd) with bits 2k, 2k + 1 of `qh` on top. With
        /// `q1`, `q2`, `qh` a half super-block's ql[64h..], ql[64h + 32..]
        /// and qh[32h..] (standard rows; interleaved rows: the same bytes'
        /// 4-byte units), vector k holds elements 128h + 32k...
        #[target_feature(enable = $feat)]
        #[inline]
        unsafe fn q6_codes(q1: __m256i, q2: __m256i, qh: __m256i) -> [__m256i; 4] {
            let m4 = _mm256_set1_epi8(0x0F);
            let m3 = _mm256_set1_epi8(3);
            let top = |b: __m256i| _mm256_slli_epi16::<4>(_mm256_and_si256(b, m3));
            [
                _mm256_or_si256(_mm256_and_si256(q1, m4), top(qh)),
                _mm256_or_si256(_mm256_and_si256(q2, m4), top(_mm256_srli_epi16::<2>(qh))),
                _mm256_or_si256(
                    _mm256_and_si256(_mm256_srli_epi16::<4>(q1), m4),
                    top(_mm256_srli_epi16::<4>(qh)),
                ),
                _mm256_or_si256(
                    _mm256_and_si256(_mm256_srli_epi16::<4>(q2), m4),
                    top(_mm256_srli_epi16::<6>(qh)),
                ),
            ]
        }

        /// Byte shuffle of a 128-bit vector of eight i16 (in both halves)
        /// that broadcasts element `lo` to the low half and `hi` to the high
        /// half.
        #[target_feature(enable = $feat)]
        #[inline]
        unsafe fn bcast16_idx(lo: i8, hi: i8) -> __m256i {
            let (l0, l1, h0, h1) = (2 * lo, 2 * lo + 1, 2 * hi, 2 * hi + 1);
            _mm256_setr_epi8(
                l0, l1, l0, l1, l0, l1, l0, l1, l0, l1, l0, l1, l0, l1, l0, l1, h0, h1, h0, h1, h0,
                h1, h0, h1, h0, h1, h0, h1, h0, h1, h0, h1,
            )
        }

        #[target_feature(enable = $feat)]
        #[inline]
        unsafe fn tile_q4_k<const R: usize, const T: usize, const K: u8>(
            ops: &Operands,
            r0: usize,
            t0: usize,
            out: *mut f32,
            os: usize,
        ) {
            let nsb = ops.cols / 256;
            let wp = row_ptrs::<R>(ops.w.as_ptr(), r0, ops.wrb);
            let ap = row_ptrs::<T>(ops.a.as_ptr(), t0, ops.arb);
            let zero = _mm256_setzero_si256();
            // Each min twice: bytes 8..16 of `k4_scales_mins` as 16 i16.
            let dup = _mm_setr_epi8(8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13, 14, 14, 15, 15);
            let idx = [
                bcast16_idx(0, 0),
                bcast16_idx(1, 1),
                bcast16_idx(2, 2),
                bcast16_idx(3, 3),
                bcast16_idx(4, 4),
                bcast16_idx(5, 5),
                bcast16_idx(6, 6),
                bcast16_idx(7, 7),
            ];
            // Q5_K: the 176-byte block, codes after the 32 qh bytes at 16.
            let (bb, qo) = if K == 5 { (176, 48) } else { (144, 16) };
            let mut acc = [[0f32; T]; R];
            for s in 0..nsb {
                let mut ya = [ap[0]; T];
                let mut dy = [0f32; T];
                let mut bs = [zero; T];
                for j in 0..T {
                    ya[j] = ap[j].add(s * 292);
                    dy[j] = (ya[j] as *const f32).read_unaligned();
                    bs[j] = ld(ya[j].add(260));
                }
                // Per (row, token): the scaled code sums (Q5_K's codes 0..31:
                // `vpmaddubsw` pairs at most 2 x 31 x 128), then the mins
                // times the activations' 16-element sums; exact integers,
                // reduced four vectors at a time.
                let mut sv = [[zero; T]; R];
                let mut mv = [[zero; T]; R];
                for i in 0..R {
                    let bx = wp[i].add(s * bb);
                    prefetch(bx.wrapping_add(PF_AHEAD), bb);
                    let sm = k4_scales_mins(bx.add(4));
                    let mdup = _mm256_cvtepu8_epi16(_mm_shuffle_epi8(sm, dup));
                    let sc16 = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(sm));
                    let qh = if K == 5 { ld(bx.add(16)) } else { zero };
                    for c in 0..4 {
                        let (lo, hi) = q45_codes::<K>(ld(bx.add(qo + 32 * c)), qh, c);
                        let slo = _mm256_shuffle_epi8(sc16, idx[2 * c]);
                        let shi = _mm256_shuffle_epi8(sc16, idx[2 * c + 1]);
                        for j in 0..T {
                            let p = _mm256_maddubs_epi16(lo, ld(ya[j].add(4 + 64 * c)));
                            sv[i][j] = dp16(sv[i][j], p, slo);
                            let p = _mm256_maddubs_epi16(hi, ld(ya[j].add(4 + 64 * c + 32)));
                            sv[i][j] = dp16(sv[i][j], p, shi);
                        }
                    }
                    for j in 0..T {
                        mv[i][j] = _mm256_madd_epi16(bs[j], mdup);
                    }
                }
                let isum = hsum_all::<R>(&core::array::from_fn(|i| sv[i][0]));
                let summ = hsum_all::<R>(&core::array::from_fn(|i| mv[i][0]));
                for i in 0..R {
                    let bx = wp[i].add(s * bb);
                    let dm = _mm_cvtph_ps(_mm_cvtsi32_si128((bx as *const i32).read_unaligned()));
                    let dx = _mm_cvtss_f32(dm);
                    let dmx = _mm_cvtss_f32(_mm_shuffle_ps::<1>(dm, dm));
                    for j in 0..T {
                        let (is, sm) = if j == 0 {
                            (isum[i], summ[i])
                        } else {
                            (hsum_i32(sv[i][j]), hsum_i32(mv[i][j]))
                        };
                        let d = dx * dy[j];
                        let dmin = dmx * dy[j];
                        acc[i][j] += d * is as f32 - dmin * sm as f32;
                    }
                }
            }
            for i in 0..R {
                for j in 0..T {
                    *out.add((t0 + j) * os + r0 + i) = acc[i][j];
                }
            }
        }

        // -------------------------------------------------------------------
        // Q4_K (K = 4), Q5_K (K = 5) · Q8_K, rows interleaved by 8
        // (`super::Q4K_X8`, `super::Q5K_X8`): each 32-bit lane is one row,
        // so a row's sums stay in its lane and no horizontal reduction is
        // needed; every activation word is broadcast to all lanes. A tile
        // of T tokens (one token, or a few: a batched decode step, a
        // speculative verify) decodes each group once for all of them.

        /// Whole groups of 8 rows run [`tile_q4_kx8`]; the rows past the
        /// last whole group are standard and run [`tile_q4_k`].
        #[target_feature(enable = $feat)]
        unsafe fn gemm_q4_kx8<const K: u8>(
            ops: &Operands,
            nrows: usize,
            ntok: usize,
            out: *mut f32,
            os: usize,
        ) {
            let groups = nrows / 8;
            let mut g = 0;
            // Two groups at a time ([`tile_q4_kx16`]), one token too: at
            // AVX-512 one instruction then covers 16 rows, and the two
            // groups are two streams. On the Intel Xeon (2 threads,
            // examples/kernels.rs, alternating binaries) one token of a
            // 1.1 GB Q4_K matrix from memory went from 22.0-23.0 to
            // 27.0-29.0 GB/s, Qwen2.5-1.5B's attn q (1536 x 1536) from 39 to
            // 19 us, Qwen3-30B-A3B's Q5_K expert down from 22 to 18-20 us;
            // AVX2 runs the 8-row one-token tile twice, as before.
            while g + 2 <= groups {
                token_tiles!(ntok, TT16, |t, T| tile_q4_kx16::<T, K>(ops, g, t, out, os));
                g += 2;
            }
            for g in g..groups {
                token_tiles!(ntok, |t, T| tile_q4_kx8::<T, K>(ops, g, t, out, os));
            }
            for r in groups * 8..nrows {
                for t in 0..ntok {
                    tile_q4_k::<1, 1, K>(ops, r, t, out, os);
                }
            }
        }

        /// Rows 8g..8g + 8 times T Q8_K rows. Per super-block and row (lane):
        /// the scaled code sums and the mins times the activations'
        /// 16-element sums, exact integers as the scalar reference; then its
        /// float formula lane by lane, unfused.
        ///
        /// Code sums: with VNNI, `vpdpbusd` of the low nibbles and of the
        /// high nibbles left in place (16 x the code, so the sum is 16 x the
        /// true one, shifted back exactly) into i32; without, `vpmaddubsw`
        /// pairs (at most 2 x 15 x 128) added in i16 over a sub-block's 8
        /// vectors (at most 30,720), then `vpmaddwd` with the scale.
        /// Q5_K (K = 5): the codes with their fifth bit (0..31; VNNI: the
        /// high ones shifted down too); without VNNI pairs of at most 2 x
        /// 31 x 128 added in i16 over 4 vectors (at most 31,744), then
        /// `vpmaddwd` with the scale, twice per sub-block.
        #[target_feature(enable = $feat)]
        #[inline]
        unsafe fn tile_q4_kx8<const T: usize, const K: u8>(
            ops: &Operands,
            g: usize,
            t0: usize,
            out: *mut f32,
            os: usize,
        ) {
            let nsb = ops.cols / 256;
            let gw = ops.w.as_ptr().add(g * 8 * ops.wrb);
            let ap = row_ptrs::<T>(ops.a.as_ptr(), t0, ops.arb);
            let zero = _mm256_setzero_si256();
            let m4 = _mm256_set1_epi8(0x0F);
            let mf0 = _mm256_set1_epi8(0xF0u8 as i8);
            let m6 = _mm256_set1_epi32(0x3F3F_3F3F);
            let m4w = _mm256_set1_epi32(0x0F0F_0F0F);
            let m2 = _mm256_set1_epi32(0x0303_0303);
            // Byte j of each lane as i32 (VNNI) or as an i16 pair (AVX2).
            let pick = |j: i8| {
                let z = -128i8;
                if VNNI {
                    _mm256_setr_epi8(
                        j,
                        z,
                        z,
                        z,
                        j + 4,
                        z,
                        z,
                        z,
                        j + 8,
                        z,
                        z,
                        z,
                        j + 12,
                        z,
                        z,
                        z,
                        j,
                        z,
                        z,
                        z,
                        j + 4,
                        z,
                        z,
                        z,
                        j + 8,
                        z,
                        z,
                        z,
                        j + 12,
                        z,
                        z,
                        z,
                    )
                } else {
                    _mm256_setr_epi8(
                        j,
                        z,
                        j,
                        z,
                        j + 4,
                        z,
                        j + 4,
                        z,
                        j + 8,
                        z,
                        j + 8,
                        z,
                        j + 12,
                        z,
                        j + 12,
                        z,
                        j,
                        z,
                        j,
                        z,
                        j + 4,
                        z,
                        j + 4,
                        z,
                        j + 8,
                        z,
                        j + 8,
                        z,
                        j + 12,
                        z,
                        j + 12,
                        z,
                    )
                }
            };
            let picks = [pick(0), pick(1), pick(2), pick(3)];
            // Each min as an i16 pair, whatever the level.
            let pair = |j: i8| {
                let z = -128i8;
                _mm256_setr_epi8(
                    j,
                    z,
                    j,
                    z,
                    j + 4,
                    z,
                    j + 4,
                    z,
                    j + 8,
                    z,
                    j + 8,
                    z,
                    j + 12,
                    z,
                    j + 12,
                    z,
                    j,
                    z,
                    j,
                    z,
                    j + 4,
                    z,
                    j + 4,
                    z,
                    j + 8,
                    z,
                    j + 8,
                    z,
                    j + 12,
                    z,
                    j + 12,
                    z,
                )
            };
            let pairs = [pair(0), pair(1), pair(2), pair(3)];
            // Q5_K: qh word k (unit 3 + k) at 128 + 32k, codes 8 units on.
            let (gb, qo) = if K == 5 {
                (super::Q5K_X8, 384)
            } else {
                (super::Q4K_X8, 128)
            };
            // Without VNNI, vectors summed in i16 before `vpmaddwd`.
            let run16 = if K == 5 { 4 } else { 8 };
            let mut acc = [_mm256_setzero_ps(); T];
            for s in 0..nsb {
                let bx = gw.add(s * gb);
                prefetch(bx.wrapping_add(PF_AHEAD), gb);
                let a = ld(bx.add(32));
                let b = ld(bx.add(64));
                let c = ld(bx.add(96));
                let sc_lo = _mm256_and_si256(a, m6);
                let mn_lo = _mm256_and_si256(b, m6);
                let sc_hi = _mm256_or_si256(
                    _mm256_and_si256(c, m4w),
                    _mm256_slli_epi32::<4>(_mm256_and_si256(_mm256_srli_epi32::<6>(a), m2)),
                );
                let mn_hi = _mm256_or_si256(
                    _mm256_and_si256(_mm256_srli_epi32::<4>(c), m4w),
                    _mm256_slli_epi32::<4>(_mm256_and_si256(_mm256_srli_epi32::<6>(b), m2)),
                );
                let mut ya = [ap[0]; T];
                for j in 0..T {
                    ya[j] = ap[j].add(s * 292);
                }
                // Mins: sum_j m_j * (bsums[2j] + bsums[2j + 1]), the pair of
                // sums broadcast as one 32-bit word.
                let mut summ = [zero; T];
                for j in 0..8 {
                    let mn = if j < 4 { mn_lo } else { mn_hi };
                    let mp = _mm256_shuffle_epi8(mn, pairs[j % 4]);
                    for t in 0..T {
                        let bs = _mm256_set1_epi32(
                            (ya[t].add(260 + 4 * j) as *const i32).read_unaligned(),
                        );
                        summ[t] = _mm256_add_epi32(summ[t], _mm256_madd_epi16(mp, bs));
                    }
                }
                let mut isum = [zero; T];
                for cc in 0..4 {
                    // Sub-blocks 2cc (low nibbles) and 2cc + 1 (high).
                    let (j0, j1) = (2 * cc, 2 * cc + 1);
                    let sc = |j: usize| {
                        let v = if j < 4 { sc_lo } else { sc_hi };
                        _mm256_shuffle_epi8(v, picks[j % 4])
                    };
                    let (s0, s1) = (sc(j0), sc(j1));
                    let mut slo = [zero; T];
                    let mut shi = [zero; T];
                    for k in 0..8 {
                        let v = ld(bx.add(qo + 256 * cc + 32 * k));
                        let (lo, hi) = if VNNI && K == 4 {
                            (_mm256_and_si256(v, m4), _mm256_and_si256(v, mf0))
                        } else {
                            let qh = if K == 5 {
                                ld(bx.add(128 + 32 * k))
                            } else {
                                zero
                            };
                            q45_codes::<K>(v, qh, cc)
                        };
                        for t in 0..T {
                            let y = ya[t].add(4 + 64 * cc + 4 * k);
                            let ylo = _mm256_set1_epi32((y as *const i32).read_unaligned());
                            let yhi = _mm256_set1_epi32((y.add(32) as *const i32).read_unaligned());
                            if VNNI {
                                if T == 1 {
                                    slo[t] = dpa(slo[t], lo, ylo);
                                    shi[t] = dpa(shi[t], hi, yhi);
                                } else {
                                    slo[t] = dp(slo[t], lo, ylo);
                                    shi[t] = dp(shi[t], hi, yhi);
                                }
                            } else {
                                slo[t] = _mm256_add_epi16(slo[t], _mm256_maddubs_epi16(lo, ylo));
                                shi[t] = _mm256_add_epi16(shi[t], _mm256_maddubs_epi16(hi, yhi));
                            }
                        }
                        if !VNNI && (k + 1) % run16 == 0 {
                            for t in 0..T {
                                isum[t] = _mm256_add_epi32(isum[t], _mm256_madd_epi16(slo[t], s0));
                                isum[t] = _mm256_add_epi32(isum[t], _mm256_madd_epi16(shi[t], s1));
                                slo[t] = zero;
                                shi[t] = zero;
                            }
                        }
                    }
                    if VNNI {
                        for t in 0..T {
                            let hi = if K == 4 {
                                _mm256_srai_epi32::<4>(shi[t])
                            } else {
                                shi[t]
                            };
                            isum[t] = _mm256_add_epi32(isum[t], _mm256_mullo_epi32(slo[t], s0));
                            isum[t] = _mm256_add_epi32(isum[t], _mm256_mullo_epi32(hi, s1));
                        }
                    }
                }
                let dx = _mm256_cvtph_ps(_mm_loadu_si128(bx as *const __m128i));
                let dmx = _mm256_cvtph_ps(_mm_loadu_si128(bx.add(16) as *const __m128i));
                for t in 0..T {
                    let dy = _mm256_set1_ps((ya[t] as *const f32).read_unaligned());
                    let d = _mm256_mul_ps(dx, dy);
                    let dmin = _mm256_mul_ps(dmx, dy);
                    let term = _mm256_sub_ps(
                        _mm256_mul_ps(d, _mm256_cvtepi32_ps(isum[t])),
                        _mm256_mul_ps(dmin, _mm256_cvtepi32_ps(summ[t])),
                    );
                    acc[t] = _mm256_add_ps(acc[t], term);
                }
            }
            for (t, a) in acc.iter().enumerate() {
                _mm256_storeu_ps(out.add((t0 + t) * os + 8 * g), *a);
            }
        }

        // -------------------------------------------------------------------
        // Q6_K · Q8_K, standard layout: the rows past an interleaved
        // matrix's last whole group of 8.

        #[target_feature(enable = $feat)]
        #[inline]
        unsafe fn tile_q6_k<const R: usize, const T: usize>(
            ops: &Operands,
            r0: usize,
            t0: usize,
            out: *mut f32,
            os: usize,
        ) {
            let nsb = ops.cols / 256;
            let wp = row_ptrs::<R>(ops.w.as_ptr(), r0, ops.wrb);
            let ap = row_ptrs::<T>(ops.a.as_ptr(), t0, ops.arb);
            let zero = _mm256_setzero_si256();
            // Code vector k of a half covers sub-blocks 2k (low 128 bits)
            // and 2k + 1 (high): their scales from the half's eight.
            let idx = [
                bcast16_idx(0, 1),
                bcast16_idx(2, 3),
                bcast16_idx(4, 5),
                bcast16_idx(6, 7),
            ];
            let mut acc = [[0f32; T]; R];
            for s in 0..nsb {
                let mut ya = [ap[0]; T];
                let mut dy = [0f32; T];
                let mut bs = [zero; T];
                for j in 0..T {
                    ya[j] = ap[j].add(s * 292);
                    dy[j] = (ya[j] as *const f32).read_unaligned();
                    bs[j] = ld(ya[j].add(260));
                }
                // Per (row, token): sum(scale * code * y) - 32 * sum(scale *
                // 16-element sums of y), exact integers, reduced four rows
                // at a time.
                let mut sv = [[zero; T]; R];
                for i in 0..R {
                    let bx = wp[i].add(s * 210);
                    prefetch(bx.wrapping_add(PF_AHEAD), 210);
                    let scp = bx.add(192);
                    let sc_all = _mm256_cvtepi8_epi16(_mm_loadu_si128(scp as *const __m128i));
                    for h in 0..2 {
                        let q1 = ld(bx.add(64 * h));
                        let q2 = ld(bx.add(64 * h + 32));
                        let qh = ld(bx.add(128 + 32 * h));
                        let sch = _mm256_broadcastsi128_si256(_mm_cvtepi8_epi16(_mm_loadl_epi64(
                            scp.add(8 * h) as *const __m128i,
                        )));
                        let codes = q6_codes(q1, q2, qh);
                        for (k, code) in codes.iter().enumerate() {
                            let scv = _mm256_shuffle_epi8(sch, idx[k]);
                            for j in 0..T {
                                let p = _mm256_maddubs_epi16(
                                    *code,
                                    ld(ya[j].add(4 + 128 * h + 32 * k)),
                                );
                                sv[i][j] = dp16(sv[i][j], p, scv);
                            }
                        }
                    }
                    for j in 0..T {
                        let corr = _mm256_slli_epi32::<5>(_mm256_madd_epi16(bs[j], sc_all));
                        sv[i][j] = _mm256_sub_epi32(sv[i][j], corr);
                    }
                }
                let isum0 = hsum_all::<R>(&core::array::from_fn(|i| sv[i][0]));
                for i in 0..R {
                    let d = f16v(wp[i].add(s * 210 + 208));
                    for j in 0..T {
                        let isum = if j == 0 { isum0[i] } else { hsum_i32(sv[i][j]) };
                        acc[i][j] += (d * dy[j]) * isum as f32;
                    }
                }
            }
            for i in 0..R {
                for j in 0..T {
                    *out.add((t0 + j) * os + r0 + i) = acc[i][j];
                }
            }
        }

        // -------------------------------------------------------------------
        // Q6_K · Q8_K, rows interleaved by 8 (`super::Q6K_X8`), one row per
        // 32-bit lane as for Q4_K.

        /// Whole groups of 8 rows run [`tile_q6_kx8`]; the rows past the
        /// last whole group are standard and run [`tile_q6_k`].
        #[target_feature(enable = $feat)]
        unsafe fn gemm_q6_kx8(ops: &Operands, nrows: usize, ntok: usize, out: *mut f32, os: usize) {
            let groups = nrows / 8;
            let mut g = 0;
            // Several tokens: two groups at a time ([`tile_q6_kx16`]). One
            // token stays on the 8-row tile: two groups per vector gained
            // nothing for Q6_K (Qwen2.5-1.5B's 233 MB output 8.3 against
            // 8.8 ms, Llama-3.2-3B's 14.6 against 14.3; Qwen2.5-1.5B decode
            // 23.3-23.8 tok/s either way; Intel Xeon, 2 threads). Tiles of
            // TT16 tokens (8 at AVX-512): Qwen2.5-1.5B's ffn down (2
            // threads) 613-623 -> 538-542 us at 8 tokens and 1151-1214 ->
            // 1033-1035 at 16, its output 14.1-14.2 -> 13.2-13.4 ms at 8;
            // Gemma 3's ffn down (1 thread) 103-104 -> 92-96 us at 8.
            while ntok > 1 && g + 2 <= groups {
                token_tiles!(ntok, TT16, |t, T| tile_q6_kx16::<T>(ops, g, t, out, os));
                g += 2;
            }
            for g in g..groups {
                token_tiles!(ntok, |t, T| tile_q6_kx8::<T>(ops, g, t, out, os));
            }
            for r in groups * 8..nrows {
                for t in 0..ntok {
                    tile_q6_k::<1, 1>(ops, r, t, out, os);
                }
            }
        }

        /// Rows 8g..8g + 8 times T Q8_K rows: per row (lane) the exact
        /// integer sum(sc_s * sum(code * y)) - 32 * sum(sc_s * bsums_s) of
        /// the scalar reference's sum(sc_s * sum((code - 32) * y)), then
        /// (d * dy) * isum lane by lane. Codes (0..63) times activations:
        /// with VNNI `vpdpbusd` into i32 per 16-element sub-block, then the
        /// scale; without, `vpmaddubsw` pairs (at most 2 x 63 x 128) added
        /// in i16 two vectors at a time (at most 32,256), then `vpmaddwd`
        /// with the scale.
        #[target_feature(enable = $feat)]
        #[inline]
        unsafe fn tile_q6_kx8<const T: usize>(
            ops: &Operands,
            g: usize,
            t0: usize,
            out: *mut f32,
            os: usize,
        ) {
            let nsb = ops.cols / 256;
            let gw = ops.w.as_ptr().add(g * 8 * ops.wrb);
            let ap = row_ptrs::<T>(ops.a.as_ptr(), t0, ops.arb);
            let zero = _mm256_setzero_si256();
            let z = -128i8;
            // Byte b of each lane into the top of an i32 (VNNI: shifted
            // down to a sign-extended scale) or of both i16 halves.
            let top32 = |b: i8| {
                _mm256_setr_epi8(
                    z,
                    z,
                    z,
                    b,
                    z,
                    z,
                    z,
                    b + 4,
                    z,
                    z,
                    z,
                    b + 8,
                    z,
                    z,
                    z,
                    b + 12,
                    z,
                    z,
                    z,
                    b,
                    z,
                    z,
                    z,
                    b + 4,
                    z,
                    z,
                    z,
                    b + 8,
                    z,
                    z,
                    z,
                    b + 12,
                )
            };
            let top16 = |b0: i8, b1: i8| {
                _mm256_setr_epi8(
                    z,
                    b0,
                    z,
                    b1,
                    z,
                    b0 + 4,
                    z,
                    b1 + 4,
                    z,
                    b0 + 8,
                    z,
                    b1 + 8,
                    z,
                    b0 + 12,
                    z,
                    b1 + 12,
                    z,
                    b0,
                    z,
                    b1,
                    z,
                    b0 + 4,
                    z,
                    b1 + 4,
                    z,
                    b0 + 8,
                    z,
                    b1 + 8,
                    z,
                    b0 + 12,
                    z,
                    b1 + 12,
                )
            };
            let sel32 = [top32(0), top32(1), top32(2), top32(3)];
            let sel16 = [top16(0, 0), top16(1, 1), top16(2, 2), top16(3, 3)];
            let (sel01, sel23) = (top16(0, 1), top16(2, 3));
            let mut acc = [_mm256_setzero_ps(); T];
            for s in 0..nsb {
                let bx = gw.add(s * super::Q6K_X8);
                prefetch(bx.wrapping_add(PF_AHEAD), super::Q6K_X8);
                let unit = |u: usize| ld(bx.add(16 + 32 * u));
                let mut ya = [ap[0]; T];
                for j in 0..T {
                    ya[j] = ap[j].add(s * 292);
                }
                let scu = [unit(48), unit(49), unit(50), unit(51)];
                // The scale of sub-block sb in every lane, as the kernel
                // multiplies it.
                let scale = |sb: usize| {
                    let v = scu[sb / 4];
                    if VNNI {
                        _mm256_srai_epi32::<24>(_mm256_shuffle_epi8(v, sel32[sb % 4]))
                    } else {
                        _mm256_srai_epi16::<8>(_mm256_shuffle_epi8(v, sel16[sb % 4]))
                    }
                };
                // 32 * sum_s sc_s * bsums_s, the 16-element sums broadcast
                // two at a time against scale pairs.
                let mut corr = [zero; T];
                for (m, v) in scu.iter().enumerate() {
                    let p01 = _mm256_srai_epi16::<8>(_mm256_shuffle_epi8(*v, sel01));
                    let p23 = _mm256_srai_epi16::<8>(_mm256_shuffle_epi8(*v, sel23));
                    for t in 0..T {
                        let bsp = ya[t].add(260 + 8 * m) as *const i32;
                        let b01 = _mm256_set1_epi32(bsp.read_unaligned());
                        let b23 = _mm256_set1_epi32(bsp.add(1).read_unaligned());
                        corr[t] = _mm256_add_epi32(corr[t], _mm256_madd_epi16(p01, b01));
                        corr[t] = _mm256_add_epi32(corr[t], _mm256_madd_epi16(p23, b23));
                    }
                }
                let mut isum = [zero; T];
                for h in 0..2 {
                    for part in 0..2 {
                        // Sub-blocks 8h + 2k + part, k = 0..4: elements
                        // 128h + 32k + 16 part.., lanes' units u = 4 part..
                        let sbs = [0, 1, 2, 3].map(|k| 8 * h + 2 * k + part);
                        let scs = sbs.map(scale);
                        let mut sk = [[zero; T]; 4];
                        let mut pk = [[zero; T]; 4];
                        for uu in 0..4 {
                            let u = 4 * part + uu;
                            let qa = unit(16 * h + u);
                            let qb = unit(16 * h + 8 + u);
                            let codes = q6_codes(qa, qb, unit(32 + 8 * h + u));
                            for (k, code) in codes.iter().enumerate() {
                                for t in 0..T {
                                    let y = ya[t].add(4 + 128 * h + 32 * k + 4 * u) as *const i32;
                                    let yv = _mm256_set1_epi32(y.read_unaligned());
                                    if VNNI {
                                        sk[k][t] = if T == 1 {
                                            dpa(sk[k][t], *code, yv)
                                        } else {
                                            dp(sk[k][t], *code, yv)
                                        };
                                    } else {
                                        pk[k][t] = _mm256_add_epi16(
                                            pk[k][t],
                                            _mm256_maddubs_epi16(*code, yv),
                                        );
                                    }
                                }
                            }
                            // Without VNNI the scaled pair sums go into
                            // the token's total at once (exact i32 adds in
                            // any order), so no per-sub-block sums stay
                            // live beside the i16 ones: AVX2 has 16
                            // registers.
                            if !VNNI && uu % 2 == 1 {
                                for k in 0..4 {
                                    for t in 0..T {
                                        let v = _mm256_madd_epi16(pk[k][t], scs[k]);
                                        isum[t] = _mm256_add_epi32(isum[t], v);
                                        pk[k][t] = zero;
                                    }
                                }
                            }
                        }
                        if VNNI {
                            for k in 0..4 {
                                for t in 0..T {
                                    let v = _mm256_mullo_epi32(sk[k][t], scs[k]);
                                    isum[t] = _mm256_add_epi32(isum[t], v);
                                }
                            }
                        }
                    }
                }
                let dx = _mm256_cvtph_ps(_mm_loadu_si128(bx as *const __m128i));
                for t in 0..T {
                    let isum = _mm256_sub_epi32(isum[t], _mm256_slli_epi32::<5>(corr[t]));
                    let dy = _mm256_set1_ps((ya[t] as *const f32).read_unaligned());
                    let term = _mm256_mul_ps(_mm256_mul_ps(dx, dy), _mm256_cvtepi32_ps(isum));
                    acc[t] = _mm256_add_ps(acc[t], term);
                }
            }
            for (t, a) in acc.iter().enumerate() {
                _mm256_storeu_ps(out.add((t0 + t) * os + 8 * g), *a);
            }
        }
    };
}
