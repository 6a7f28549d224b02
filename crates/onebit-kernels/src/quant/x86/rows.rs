//! Kernels for a few rows of activations at once (2 to 16: a batched
//! decode step, a speculative verify), instantiated per level inside
//! [`simd_kernels!`]: each interleaved weight group is decoded once per
//! tile of tokens and applied to every token of the tile while it is in
//! registers, so a step of k rows streams the weights once. Every output
//! equals the scalar reference's bits, and so each row's result equals that
//! row computed alone: the integer sums are exact, and each token's float
//! terms are the one-token kernel's operations in its order.

macro_rules! x86_rows {
    ($feat:literal) => {
        // -------------------------------------------------------------------
        // Q4_0 (K = 0), Q5_0 (K = 2) · Q8_0 and Q4_1 (K = 1) · Q8_1, rows
        // interleaved by 8 (`super::Q4_0_X8`, `super::Q5_0_X8`,
        // `super::Q4_1_X8`), T tokens at a time.

        /// Rows 8g..8g + 8 times tokens t0..t0 + T: per block and row
        /// (lane) the code vectors are decoded once (nibbles, Q5_0's fifth
        /// bits) and multiplied with every token's activation words; then,
        /// per token, exactly [`tile_qx8`]'s float operations: (dx * dy) *
        /// (sumi - offset x code sum) (Q4_1: (dx * dy) * sumi + m * s)
        /// added into float vector b % 8, the
        /// eight vectors transposed at the end so each row's lanes reduce as
        /// `reduce8`. The integer sums are exact (as in [`tile_qx8`]: i16
        /// pairs of at most 2 x 31 x 128, four of them summed before they
        /// are widened), so the bits are [`tile_qx8`]'s whatever the tile.
        #[target_feature(enable = $feat)]
        #[inline]
        unsafe fn tile_qx8_rows<const K: u8, const T: usize>(
            ops: &Operands,
            g: usize,
            t0: usize,
            out: *mut f32,
            os: usize,
        ) {
            let (gb, qo) = super::x8_group(K);
            let nb = ops.cols / 32;
            let gw = ops.w.as_ptr().add(g * 8 * ops.wrb);
            let ap = row_ptrs::<T>(ops.a.as_ptr(), t0, ops.arb);
            let zero = _mm256_setzero_si256();
            let m4 = _mm256_set1_epi8(0x0F);
            let ones = _mm256_set1_epi16(1);
            // Q5_0: byte u of each 32-bit lane to all four of its bytes, as
            // in `tile_qx8`.
            let spread = |u: i8| {
                let l = |k: i8| 4 * k + u;
                let (a, b, c, d) = (l(0), l(1), l(2), l(3));
                _mm256_setr_epi8(
                    a, a, a, a, b, b, b, b, c, c, c, c, d, d, d, d, a, a, a, a, b, b, b, b, c, c,
                    c, c, d, d, d, d,
                )
            };
            let spreads = [spread(0), spread(1), spread(2), spread(3)];
            let sel_lo = _mm256_set1_epi32(0x0804_0201);
            let sel_hi = _mm256_set1_epi32(0x8040_2010u32 as i32);
            let mut facc = [[_mm256_setzero_ps(); 8]; T];
            for bg in 0..nb.div_ceil(8) {
                let n = (nb - 8 * bg).min(8);
                let gx = gw.add(bg * 8 * gb);
                prefetch(gx.wrapping_add(PF_AHEAD), n * gb);
                // Each token's activations for this group: d[n] f32, code
                // sums[n] i32, code word k of block l at 8n + 4n * k + 4l.
                let mut ag = ap;
                for j in 0..T {
                    ag[j] = ap[j].add(bg * 8 * 40);
                }
                for l in 0..n {
                    let bx = gx.add(l * gb);
                    let qh = if K == 2 { ld(bx.add(16)) } else { zero };
                    let mut s = [zero; T];
                    let mut s2 = [zero; T];
                    for u in 0..4 {
                        let v = ld(bx.add(qo + 32 * u));
                        let mut lo = _mm256_and_si256(v, m4);
                        let mut hi = _mm256_and_si256(_mm256_srli_epi16::<4>(v), m4);
                        if K == 2 {
                            let x = _mm256_shuffle_epi8(qh, spreads[u]);
                            lo = _mm256_or_si256(lo, sel_bits(x, sel_lo));
                            hi = _mm256_or_si256(hi, sel_bits(x, sel_hi));
                        }
                        for j in 0..T {
                            let yw = ag[j].add(8 * n + 4 * l);
                            let word = |k: usize| {
                                _mm256_set1_epi32(
                                    (yw.add(4 * n * k) as *const i32).read_unaligned(),
                                )
                            };
                            if VNNI {
                                s[j] = dp(s[j], lo, word(u));
                                s2[j] = dp(s2[j], hi, word(u + 4));
                            } else {
                                s[j] = _mm256_add_epi16(s[j], _mm256_maddubs_epi16(lo, word(u)));
                                s2[j] =
                                    _mm256_add_epi16(s2[j], _mm256_maddubs_epi16(hi, word(u + 4)));
                            }
                        }
                    }
                    let dx = _mm256_cvtph_ps(_mm_loadu_si128(bx as *const __m128i));
                    let mx = if K == 1 {
                        _mm256_cvtph_ps(_mm_loadu_si128(bx.add(16) as *const __m128i))
                    } else {
                        _mm256_setzero_ps()
                    };
                    for j in 0..T {
                        let isum = if VNNI {
                            _mm256_add_epi32(s[j], s2[j])
                        } else {
                            _mm256_add_epi32(
                                _mm256_madd_epi16(s[j], ones),
                                _mm256_madd_epi16(s2[j], ones),
                            )
                        };
                        let second = ag[j].add(4 * n + 4 * l);
                        let dy = _mm256_set1_ps((ag[j].add(4 * l) as *const f32).read_unaligned());
                        let term = if K == 1 {
                            // (dx * dy) * sumi + m * s, as `tile_qx8`.
                            let sy = _mm256_set1_ps((second as *const f32).read_unaligned());
                            let scaled =
                                _mm256_mul_ps(_mm256_mul_ps(dx, dy), _mm256_cvtepi32_ps(isum));
                            _mm256_add_ps(scaled, _mm256_mul_ps(mx, sy))
                        } else {
                            let sy = (second as *const i32).read_unaligned();
                            let off = x8_offset::<K>(sy);
                            let isum = _mm256_sub_epi32(isum, _mm256_set1_epi32(off));
                            _mm256_mul_ps(_mm256_mul_ps(dx, dy), _mm256_cvtepi32_ps(isum))
                        };
                        facc[j][l] = _mm256_add_ps(facc[j][l], term);
                    }
                }
            }
            // facc[j][l] lane r = token j's row r, lane l: transpose, reduce.
            for (j, fj) in facc.iter().enumerate() {
                let mut lanes = [[0f32; 8]; 8];
                for (l, f) in fj.iter().enumerate() {
                    _mm256_storeu_ps(lanes[l].as_mut_ptr(), *f);
                }
                for r in 0..8 {
                    let row: [f32; 8] = core::array::from_fn(|l| lanes[l][r]);
                    *out.add((t0 + j) * os + 8 * g + r) = reduce8(&row);
                }
            }
        }
    };
}
