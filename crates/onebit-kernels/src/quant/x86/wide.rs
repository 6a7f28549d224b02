//! The wide (prefill) kernels of the blocks of 32 (Q4_0, Q4_1, Q5_0,
//! Q8_0, MXFP4), over weight rows expanded once per call into the
//! `super::WIDE_GROUP` layout, instantiated per level inside
//! [`simd_kernels!`]. Every output equals the scalar reference's bits
//! whatever tile or cache block it falls in.

macro_rules! x86_wide {
    ($feat:literal) => {
        // -------------------------------------------------------------------
        // Wide kernels for several tokens (prefill): Q4_0 (K = 0), Q4_1
        // (K = 1), Q5_0 (K = 2), Q8_0 (K = 3), MXFP4 (K = 5: codes expanded
        // to doubled E2M1 + 12, scales 2^(e - 128) as f32, 12 x sum(y) taken
        // off as Q4_0's 8). See `super::WIDE_GROUP`.

        /// [`expand_row`] of row `r` of the operands.
        #[target_feature(enable = $feat)]
        #[inline]
        unsafe fn expand_row_at<const K: u8>(ops: &Operands, nrows: usize, r: usize, dst: *mut u8) {
            if K <= 2 && r < nrows / 8 * 8 {
                // Q4_0 / Q4_1 / Q5_0 rows in a whole group are interleaved
                // (`super::Q4_0_X8`, `super::Q4_1_X8`, `super::Q5_0_X8`):
                // each group of 8 blocks of row r is gathered straight into
                // the per-row packed layout (d[n] at 2l; Q4_1's mins at
                // 2n + 2l; Q5_0's fifth bits at 2n, qh bit
                // 4k + i of block l at bit 4n * k + 4l + i; code vector k at
                // `codes` + 4n * k + 4l) and expanded. In the interleaved
                // qh, byte u holds qh bits 4u.. in its low nibble and
                // 16 + 4u.. in its high one, so nibble k of the packed
                // fifth-bit area is a half-byte of it.
                let (x8, units) = super::x8_group(K);
                let grp = ops.w.as_ptr().add(r / 8 * 8 * ops.wrb);
                let i = r % 8;
                let nb = ops.cols / 32;
                let mut tmp = [0u8; 8 * 22];
                let tp = tmp.as_mut_ptr();
                for g in 0..nb.div_ceil(8) {
                    let n = (nb - 8 * g).min(8);
                    let codes = super::wgroup(super::x8_type(K), n).1;
                    if K == 2 {
                        core::ptr::write_bytes(tp.add(2 * n), 0, 4 * n);
                    }
                    for l in 0..n {
                        let bx = grp.add((8 * g + l) * x8);
                        core::ptr::copy_nonoverlapping(bx.add(2 * i), tp.add(2 * l), 2);
                        if K == 1 {
                            core::ptr::copy_nonoverlapping(
                                bx.add(16 + 2 * i),
                                tp.add(2 * n + 2 * l),
                                2,
                            );
                        }
                        if K == 2 {
                            let x =
                                u32::from_le((bx.add(16 + 4 * i) as *const u32).read_unaligned());
                            for k in 0..8 {
                                let nib = if k < 4 {
                                    (x >> (8 * k)) & 0xF
                                } else {
                                    (x >> (8 * (k - 4) + 4)) & 0xF
                                } as u8;
                                let at = n * k + l;
                                *tp.add(2 * n + at / 2) |= nib << (4 * (at % 2));
                            }
                        }
                        for k in 0..4 {
                            core::ptr::copy_nonoverlapping(
                                bx.add(units + 32 * k + 4 * i),
                                tp.add(codes + 4 * n * k + 4 * l),
                                4,
                            );
                        }
                    }
                    expand_row::<K>(tp, 32 * n, dst.add(g * super::WIDE_GROUP));
                }
                return;
            }
            expand_row::<K>(ops.w.as_ptr().add(r * ops.wrb), ops.cols, dst);
        }

        /// [`expand_k_row`] of row `r` of `nrows` interleaved K-quant rows
        /// (`super::Q4K_X8`, `super::Q5K_X8`, `super::Q6K_X8`): each super-block of a row in
        /// a whole group is gathered back into a standard block first; the
        /// rows past the last whole group are standard already.
        #[target_feature(enable = $feat)]
        #[inline]
        unsafe fn expand_k_row_at<const K: u8>(
            ops: &Operands,
            nrows: usize,
            r: usize,
            dst: *mut u8,
        ) {
            let src = ops.w.as_ptr();
            if r >= nrows / 8 * 8 {
                expand_k_row::<K>(src.add(r * ops.wrb), ops.cols, dst);
                return;
            }
            let (bb, units, d_at, unit0) = if K == 4 {
                (144, 35, [0, 16], 32)
            } else if K == 5 {
                (176, 43, [0, 16], 32)
            } else {
                (210, 52, [0, 0], 16)
            };
            let grp = src.add(r / 8 * 8 * ops.wrb);
            let i = r % 8;
            let mut blk = [0u8; 256];
            let bp = blk.as_mut_ptr();
            let cp = |from: *const u8, to: *mut u8, n: usize| {
                core::ptr::copy_nonoverlapping(from, to, n);
            };
            for s in 0..ops.cols / 256 {
                let g = grp.add(s * 8 * bb);
                if K == 4 || K == 5 {
                    cp(g.add(d_at[0] + 2 * i), bp, 2);
                    cp(g.add(d_at[1] + 2 * i), bp.add(2), 2);
                    for u in 0..units {
                        cp(g.add(unit0 + 32 * u + 4 * i), bp.add(4 + 4 * u), 4);
                    }
                } else {
                    for u in 0..units {
                        cp(g.add(unit0 + 32 * u + 4 * i), bp.add(4 * u), 4);
                    }
                    cp(g.add(2 * i), bp.add(208), 2);
                }
                expand_k_row::<K>(bp, 256, dst.add(s * super::WIDE_KW));
            }
        }

        /// Expands one packed weight row (`cols` elements) into the wide
        /// layout at `dst` (`ceil(cols / 256)` groups of `WIDE_GROUP` bytes):
        /// per group d[8] and m[8] as f32, then 8 code vectors of unsigned
        /// codes (Q4: 0..15, Q5: 0..31, Q8_0: w + 128, MXFP4: the doubled
        /// E2M1 value plus 12, 0..=24); lanes past the
        /// row's last block are zero.
        #[target_feature(enable = $feat)]
        #[inline]
        unsafe fn expand_row<const K: u8>(src: *const u8, cols: usize, dst: *mut u8) {
            let nb = cols / 32;
            let wbb = match K {
                0 => 18,
                1 => 20,
                2 => 22,
                3 => 34,
                _ => 17,
            };
            let m4 = _mm256_set1_epi8(0x0F);
            let lut = _mm256_setr_epi8(
                12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0, 12, 13, 14, 15, 16, 18,
                20, 24, 12, 11, 10, 9, 8, 6, 4, 0,
            );
            for g in 0..nb.div_ceil(8) {
                let n = (nb - 8 * g).min(8);
                let s = src.add(g * 8 * wbb);
                let d = dst.add(g * super::WIDE_GROUP);
                let st = |at: usize, v: __m256i| _mm256_storeu_si256(d.add(at) as *mut __m256i, v);
                if n == 8 {
                    let cvt = |p: *const u8| _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i));
                    _mm256_storeu_ps(d as *mut f32, if K == 5 { e8m0_half8(s) } else { cvt(s) });
                    if K == 1 {
                        _mm256_storeu_ps(d.add(32) as *mut f32, cvt(s.add(16)));
                    }
                    if K == 3 {
                        for k in 0..8 {
                            st(
                                64 + 32 * k,
                                _mm256_xor_si256(ld(s.add(16 + 32 * k)), _mm256_set1_epi8(-128)),
                            );
                        }
                        continue;
                    }
                    let qo = match K {
                        0 => 16,
                        1 => 32,
                        2 => 48,
                        _ => 8,
                    };
                    for k in 0..4 {
                        let v = ld(s.add(qo + 32 * k));
                        let mut lo = _mm256_and_si256(v, m4);
                        let mut hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
                        if K == 5 {
                            lo = _mm256_shuffle_epi8(lut, lo);
                            hi = _mm256_shuffle_epi8(lut, hi);
                        }
                        if K == 2 {
                            // Fifth bits of code vector k at bit 32k (group of 8).
                            let fb = |at: usize| (s.add(16 + at) as *const u32).read_unaligned();
                            lo = _mm256_or_si256(lo, expand_bits(fb(4 * k)));
                            hi = _mm256_or_si256(hi, expand_bits(fb(16 + 4 * k)));
                        }
                        st(64 + 32 * k, lo);
                        st(64 + 32 * (k + 4), hi);
                    }
                } else {
                    // A partial group: byte by byte, lanes >= n left zero.
                    // Of 2 or 4 blocks, the code vectors are stored
                    // compact (see `super::WIDE_GROUP`).
                    let cv = super::wide_code_stride(n);
                    core::ptr::write_bytes(d, 0, super::WIDE_GROUP);
                    for l in 0..n {
                        let dl = if K == 5 {
                            onebit_formats::blocks::e8m0_half(*s.add(l))
                        } else {
                            f16v(s.add(2 * l))
                        };
                        (d.add(4 * l) as *mut f32).write_unaligned(dl);
                        if K == 1 {
                            (d.add(32 + 4 * l) as *mut f32)
                                .write_unaligned(f16v(s.add(2 * n + 2 * l)));
                        }
                        for k in 0..8 {
                            for i in 0..4 {
                                let c = if K == 3 {
                                    *s.add(2 * n + 4 * n * k + 4 * l + i) ^ 0x80
                                } else {
                                    let qo = match K {
                                        0 => 2 * n,
                                        1 => 4 * n,
                                        2 => 6 * n,
                                        _ => n,
                                    };
                                    let b = *s.add(qo + 4 * n * (k % 4) + 4 * l + i);
                                    let mut c = if k < 4 { b & 0x0F } else { b >> 4 };
                                    if K == 5 {
                                        let v = onebit_formats::blocks::MXFP4_CODES[c as usize];
                                        c = (v + 12) as u8;
                                    }
                                    if K == 2 {
                                        let bit = 4 * n * k + 4 * l + i;
                                        c |= ((*s.add(2 * n + bit / 8) >> (bit % 8)) & 1) << 4;
                                    }
                                    c
                                };
                                *d.add(64 + cv * k + 4 * l + i) = c;
                            }
                        }
                    }
                }
            }
        }

        #[target_feature(enable = $feat)]
        unsafe fn gemm_wide<const K: u8>(
            ops: &Operands,
            nrows: usize,
            ntok: usize,
            out: *mut f32,
            os: usize,
        ) {
            let ng = (ops.cols / 32).div_ceil(8);
            let ws = ng * super::WIDE_GROUP;
            drive_wide!(
                expand_row_at,
                tile_wide,
                K,
                ops,
                nrows,
                ntok,
                out,
                os,
                ws,
                ng
            );
        }

        /// The integer sums of one wide group (at byte `go` of the rows) for
        /// R rows x T tokens, per lane sum((w - offset) * y): over NV code
        /// vectors, 8 for a whole group; 2 or 4 for a last group of as many
        /// blocks, stored compact (`super::wide_code_stride`), whose lanes
        /// are then folded (lanes past NV hold copies). Integer sums are
        /// exact, so the order (the offset taken first or last) is free.
        #[target_feature(enable = $feat)]
        #[inline]
        unsafe fn wide_sums<const R: usize, const T: usize, const K: u8, const NV: usize>(
            wp: &[*const u8; R],
            ap: &[*const u8; T],
            go: usize,
        ) -> [[__m256i; T]; R] {
            let zero = _mm256_setzero_si256();
            let mut acc = [[zero; T]; R];
            let offset = |acc: &mut [[__m256i; T]; R]| {
                for j in 0..T {
                    let ys = ld(ap[j].add(go + 32));
                    let off = match K {
                        0 => _mm256_slli_epi32::<3>(ys),
                        2 => _mm256_slli_epi32::<4>(ys),
                        5 => {
                            _mm256_add_epi32(_mm256_slli_epi32::<3>(ys), _mm256_slli_epi32::<2>(ys))
                        }
                        _ => _mm256_slli_epi32::<7>(ys),
                    };
                    for row in acc.iter_mut() {
                        row[j] = _mm256_sub_epi32(row[j], off);
                    }
                }
            };
            if K != 1 && NV == 8 {
                offset(&mut acc);
            }
            if !VNNI && K != 3 {
                // Without VNNI: `vpmaddubsw` pair sums added in i16 over
                // as many code vectors as stay below 2^15 (Q4: 8, |sum|
                // <= 8 * 2 * 15 * 127 = 30,480; Q5_0: 4, <= 31,496;
                // MXFP4: 4, <= 4 * 2 * 24 * 127 = 24,384), then one
                // `vpmaddwd` by ones into the i32 sums.
                let step = if K == 2 || K == 5 { 4 } else { 8 };
                let ones = _mm256_set1_epi16(1);
                let mut k = 0;
                while k < NV {
                    let mut a16 = [[zero; T]; R];
                    for kk in k..(k + step).min(NV) {
                        let mut y = [zero; T];
                        for j in 0..T {
                            y[j] = ld(ap[j].add(go + 64 + 32 * kk));
                        }
                        for i in 0..R {
                            let wv = ld(wp[i].add(go + 64 + 32 * kk));
                            for j in 0..T {
                                a16[i][j] =
                                    _mm256_add_epi16(a16[i][j], _mm256_maddubs_epi16(wv, y[j]));
                            }
                        }
                    }
                    for i in 0..R {
                        for j in 0..T {
                            acc[i][j] =
                                _mm256_add_epi32(acc[i][j], _mm256_madd_epi16(a16[i][j], ones));
                        }
                    }
                    k += step;
                }
            } else {
                for k in 0..NV {
                    let mut y = [zero; T];
                    for j in 0..T {
                        y[j] = ld(ap[j].add(go + 64 + 32 * k));
                    }
                    for i in 0..R {
                        let wv = ld(wp[i].add(go + 64 + 32 * k));
                        for j in 0..T {
                            acc[i][j] = dp(acc[i][j], wv, y[j]);
                        }
                    }
                }
            }
            if NV < 8 {
                fold_all(&mut acc, &mut [zero; T], NV);
                if K != 1 {
                    offset(&mut acc);
                }
            }
            acc
        }

        /// R expanded rows (at `w`, `ws` bytes apart) times T wide activation
        /// rows from token `t0`: per group, the integer sums
        /// ([`wide_sums`]), then (dx * dy) * sumi [+ m * s] per lane, as
        /// the scalar reference.
        #[target_feature(enable = $feat)]
        #[inline]
        #[allow(clippy::too_many_arguments)]
        unsafe fn tile_wide<const R: usize, const T: usize, const K: u8>(
            w: *const u8,
            ws: usize,
            ops: &Operands,
            ng: usize,
            r0: usize,
            t0: usize,
            out: *mut f32,
            os: usize,
        ) {
            let wp = row_ptrs::<R>(w, 0, ws);
            let ap = row_ptrs::<T>(ops.a.as_ptr(), t0, ops.arb);
            // A last group of 2 or 4 blocks is stored compact.
            let tail = ops.cols / 32 % 8;
            let compact = super::wide_code_stride(tail) != 32;
            let mut facc = [[_mm256_setzero_ps(); T]; R];
            for g in 0..ng {
                let go = g * super::WIDE_GROUP;
                let last = compact && g + 1 == ng;
                let acc = if !last {
                    wide_sums::<R, T, K, 8>(&wp, &ap, go)
                } else if tail == 2 {
                    wide_sums::<R, T, K, 2>(&wp, &ap, go)
                } else {
                    wide_sums::<R, T, K, 4>(&wp, &ap, go)
                };
                let mut dy = [_mm256_setzero_ps(); T];
                let mut sy = [_mm256_setzero_ps(); T];
                for j in 0..T {
                    dy[j] = _mm256_loadu_ps(ap[j].add(go) as *const f32);
                    if K == 1 {
                        sy[j] = _mm256_loadu_ps(ap[j].add(go + 32) as *const f32);
                    }
                }
                for i in 0..R {
                    let dx = _mm256_loadu_ps(wp[i].add(go) as *const f32);
                    let mx = if K == 1 {
                        _mm256_loadu_ps(wp[i].add(go + 32) as *const f32)
                    } else {
                        _mm256_setzero_ps()
                    };
                    for j in 0..T {
                        let mut term =
                            _mm256_mul_ps(_mm256_mul_ps(dx, dy[j]), _mm256_cvtepi32_ps(acc[i][j]));
                        if K == 1 {
                            term = _mm256_add_ps(term, _mm256_mul_ps(mx, sy[j]));
                        }
                        if last {
                            // Lanes past the tail's blocks hold folded
                            // copies; their d is 0, but 0 x a negative sum
                            // is -0: +0 instead, as a whole group's padded
                            // lane gives.
                            term = _mm256_and_ps(term, lane_mask(tail));
                        }
                        facc[i][j] = _mm256_add_ps(facc[i][j], term);
                    }
                }
            }
            write_facc(&facc, r0, t0, out, os);
        }
    };
}
