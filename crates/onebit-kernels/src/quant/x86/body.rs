//! The kernel bodies, written once over a level's primitives and instantiated
//! by `avx2.rs` and `avx512.rs` with their `#[target_feature]` set.
//!
//! Every function here is an `unsafe fn` with the level's target features:
//! callers must run on a CPU with those features (the dispatcher checks them
//! once, see [`super::Isa::supported`]) and pass in-bounds pointers as
//! [`super::GemmFn`] describes. Reads are unaligned loads within the operand
//! slices; the only writes are the `out` elements of the tile.

/// Runs `$tile::<R, T, ...>` over nrows x ntok in TR x TT tiles and
/// 1-row / 1-token edges.
macro_rules! drive {
    ($tile:ident, $ops:expr, $nrows:expr, $ntok:expr, $out:expr, $os:expr $(, $g:expr)*) => {{
        let (ops, nrows, ntok, out, os) = ($ops, $nrows, $ntok, $out, $os);
        let mut r = 0;
        while r + TR <= nrows {
            let mut t = 0;
            while t + TT <= ntok {
                $tile::<TR, TT $(, $g)*>(ops, r, t, out, os);
                t += TT;
            }
            while t < ntok {
                $tile::<TR, 1 $(, $g)*>(ops, r, t, out, os);
                t += 1;
            }
            r += TR;
        }
        while r < nrows {
            let mut t = 0;
            while t + TT <= ntok {
                $tile::<1, TT $(, $g)*>(ops, r, t, out, os);
                t += TT;
            }
            while t < ntok {
                $tile::<1, 1 $(, $g)*>(ops, r, t, out, os);
                t += 1;
            }
            r += 1;
        }
    }};
}

/// Runs a wide kernel in cache blocks: a block of rows (a multiple of TR,
/// about `WIDE_W_BYTES` once expanded) is expanded by `$expand` into a
/// buffer of `$ws` bytes per row, each weight row once per call; then, a
/// block of tokens at a time (a multiple of TT, about `WIDE_A_BYTES` of
/// activations, so they stay in L2 while every row tile of the block reads
/// them), `$tile::<R, T, K>` runs each TR-row tile (single rows at the edge)
/// against every TT-token tile (single tokens at the edge). An output's
/// value does not depend on the blocks: every tile computes each of its
/// elements with the same operations.
macro_rules! drive_wide {
    ($expand:ident, $tile:ident, $k:expr, $ops:expr, $nrows:expr, $ntok:expr, $out:expr, $os:expr, $ws:expr, $n:expr) => {{
        let (ops, nrows, ntok, out, os, ws, n) = ($ops, $nrows, $ntok, $out, $os, $ws, $n);
        let rb = (super::body::WIDE_W_BYTES / ws.max(1) / TR).max(1) * TR;
        let tb = (super::body::WIDE_A_BYTES / ops.arb.max(1) / TT).max(1) * TT;
        let mut buf = vec![0u8; rb.min(nrows) * ws];
        let bp = buf.as_mut_ptr();
        let mut r_blk = 0;
        while r_blk < nrows {
            let r_end = (r_blk + rb).min(nrows);
            for r in r_blk..r_end {
                $expand::<{ $k }>(ops, nrows, r, bp.add((r - r_blk) * ws));
            }
            let mut t_blk = 0;
            while t_blk < ntok {
                let t_end = (t_blk + tb).min(ntok);
                let mut r = r_blk;
                while r < r_end {
                    let rr = (r_end - r).min(TR);
                    let w0 = bp.add((r - r_blk) * ws);
                    if rr == TR {
                        let mut t = t_blk;
                        while t + TT <= t_end {
                            $tile::<TR, TT, { $k }>(w0, ws, ops, n, r, t, out, os);
                            t += TT;
                        }
                        while t < t_end {
                            $tile::<TR, 1, { $k }>(w0, ws, ops, n, r, t, out, os);
                            t += 1;
                        }
                    } else {
                        for i in 0..rr {
                            let w = w0.add(i * ws);
                            let mut t = t_blk;
                            while t + TT <= t_end {
                                $tile::<1, TT, { $k }>(w, ws, ops, n, r + i, t, out, os);
                                t += TT;
                            }
                            while t < t_end {
                                $tile::<1, 1, { $k }>(w, ws, ops, n, r + i, t, out, os);
                                t += 1;
                            }
                        }
                    }
                    r += rr;
                }
                t_blk = t_end;
            }
            r_blk = r_end;
        }
    }};
}

/// Expanded weight bytes per block of rows in the wide kernels (L2-sized,
/// with the activation block beside it).
pub(super) const WIDE_W_BYTES: usize = 192 * 1024;
/// Activation bytes per block of tokens in the wide kernels.
pub(super) const WIDE_A_BYTES: usize = 96 * 1024;
/// Bytes of one expanded super-block of a group of 8 interleaved Q4_K rows
/// in the wide interleaved kernel (`expand_q4_kx8`): 64 code vectors, then
/// per sub-block the scales as i32 and as i16 pairs and the mins as i16
/// pairs, then d and dmin as f32.
pub(super) const WIDE_KX8: usize = 2880;
/// The same for Q6_K (`expand_q6_kx8`): 64 code vectors, the 16 scales as
/// i32 and as i16 pairs, 32 x the scales as i16 pairs, d as f32.
pub(super) const WIDE_Q6X8: usize = 3360;

/// Instantiates the kernels. Expects in scope: `FEAT`-enabled primitives
/// `dp(acc, u8s, i8s)`, `dpa(acc, u8s, i8s)` (the same sum, the product
/// added to `acc` last: the one-token kernels' form), `dp16(acc, i16s, i16s)`, `q8_prep(w)`,
/// `q8_pair(acc, prepped, y)` (the exact i8 x i8 dot product), `expand_bits(u32)`,
/// `sel_bits(x, sel)` (0x10 in the bytes where `x` has `sel`'s one bit),
/// the constant `Q8_BIAS` (whether the wide Q8_0 kernel may sum (w + 128) * y
/// in i32), and the tile shape `TR` x `TT`.
macro_rules! simd_kernels {
    ($feat:literal) => {
        use onebit_formats::GgmlType;

        use super::{GemmFn, Operands};
        use crate::quant::scalar::reduce8;

        /// This level's kernel for weight type `t`, if it has one.
        pub fn gemm_fn(t: GgmlType) -> Option<GemmFn> {
            let f: GemmFn = match t {
                GgmlType::Q4_0 => gemm_qx8::<0>,
                GgmlType::Q4_1 => gemm_q4::<1>,
                GgmlType::Q5_0 => gemm_qx8::<2>,
                GgmlType::Q8_0 => gemm_q8_0,
                GgmlType::Q4K => gemm_q4_kx8,
                GgmlType::Q6K => gemm_q6_kx8,
                GgmlType::F32 => gemm_f32,
                _ => return None,
            };
            Some(f)
        }

        /// Sum of the eight i32 lanes (exact up to i32 wrap, which the
        /// formats' ranges rule out).
        #[target_feature(enable = $feat)]
        #[inline]
        unsafe fn hsum_i32(v: __m256i) -> i32 {
            let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
            let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
            let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
            _mm_cvtsi128_si32(s)
        }

        /// The f16 at `p` as f32 (exact).
        #[target_feature(enable = $feat)]
        #[inline]
        unsafe fn f16v(p: *const u8) -> f32 {
            let bits = (p as *const u16).read_unaligned();
            _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32)))
        }

        #[target_feature(enable = $feat)]
        #[inline]
        unsafe fn ld(p: *const u8) -> __m256i {
            _mm256_loadu_si256(p as *const __m256i)
        }

        #[target_feature(enable = $feat)]
        #[inline]
        unsafe fn row_ptrs<const N: usize>(
            base: *const u8,
            first: usize,
            stride: usize,
        ) -> [*const u8; N] {
            let mut p = [base; N];
            for (i, p) in p.iter_mut().enumerate() {
                *p = base.add((first + i) * stride);
            }
            p
        }

        #[target_feature(enable = $feat)]
        #[inline]
        unsafe fn write_tile<const R: usize, const T: usize>(
            lanes: &[[[f32; 8]; T]; R],
            r0: usize,
            t0: usize,
            out: *mut f32,
            os: usize,
        ) {
            for (i, row) in lanes.iter().enumerate() {
                for (j, l) in row.iter().enumerate() {
                    *out.add((t0 + j) * os + r0 + i) = reduce8(l);
                }
            }
        }

        // -------------------------------------------------------------------
        // Q4_0 (K = 0), Q4_1 (K = 1), Q5_0 (K = 2), packed rows.

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

        /// How far ahead of the bytes being read the kernels prefetch
        /// weights: a tile's rows are consecutive, so this lands a few rows
        /// (tiles) ahead. Measured on SmolLM2-shaped decode: 2 KiB gave
        /// ~12% less time per token than none (the hardware prefetcher alone
        /// leaves the kernels waiting on L3), 1 and 4 KiB about the same.
        /// Matrices that stream from DRAM want more: on a Zen 4 VM, one
        /// thread's on-CPU time for the 233 MB Q6_K output of a Qwen2.5-1.5B
        /// shape went from 8-9.5 GB/s at 2 KiB to 12-13 GB/s at 8 KiB (the
        /// Q8_0 Gemma 3 output from 7-8 to 7-10; 16 KiB no better;
        /// examples/kernels.rs, 1 thread).
        const PF_AHEAD: usize = 8192;

        /// Prefetches the `len` bytes at `p` into L2 (`T1`): the hardware
        /// brings them on into L1. A `T0` prefetch into L1 holds one of the
        /// core's few L1 miss buffers until the line arrives, which caps the
        /// reads in flight: on a Zen 4 VM the 178 MB Q8_0 Gemma 3 output
        /// streamed at 9 GB/s of one thread's on-CPU time with T0 and
        /// 16-22 GB/s with T1 (the Q6_K Qwen2.5-1.5B output 12-13 -> 15-20);
        /// matrices already in cache ran at the same speed either way
        /// (examples/kernels.rs, 1 thread, alternating runs). A prefetch never
        /// faults, and `wrapping_add` keeps the address arithmetic defined
        /// past the end of the matrix.
        #[target_feature(enable = $feat)]
        #[inline]
        unsafe fn prefetch(p: *const u8, len: usize) {
            let mut o = 0;
            while o < len {
                _mm_prefetch::<_MM_HINT_T1>(p.wrapping_add(o) as *const i8);
                o += 64;
            }
        }

        /// Lane l < n becomes the sum of lanes l, l + n, l + 2n, ... (n is
        /// 2 or 4); the other lanes are left with partial sums.
        #[target_feature(enable = $feat)]
        #[inline]
        unsafe fn fold_lanes(v: __m256i, n: usize) -> __m256i {
            let v = _mm256_add_epi32(v, _mm256_permute2x128_si256::<1>(v, v));
            if n == 2 {
                _mm256_add_epi32(v, _mm256_shuffle_epi32::<0x4E>(v))
            } else {
                v
            }
        }

        /// [`fold_lanes`] on every integer accumulator of a tile.
        #[target_feature(enable = $feat)]
        #[inline]
        unsafe fn fold_all<const R: usize, const T: usize>(
            acc: &mut [[__m256i; T]; R],
            ys: &mut [__m256i; T],
            n: usize,
        ) {
            for row in acc.iter_mut() {
                for a in row.iter_mut() {
                    *a = fold_lanes(*a, n);
                }
            }
            for y in ys.iter_mut() {
                *y = fold_lanes(*y, n);
            }
        }

        /// Lanes below `n` all ones, the others zero.
        #[target_feature(enable = $feat)]
        #[inline]
        unsafe fn lane_mask(n: usize) -> __m256 {
            let idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
            _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(n as i32), idx))
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
                _ => 22,
            };
            let abb = 40;
            let wp = row_ptrs::<R>(ops.w.as_ptr(), r0, ops.wrb);
            let ap = row_ptrs::<T>(ops.a.as_ptr(), t0, ops.arb);
            let m4 = _mm256_set1_epi8(0x0F);
            let zero = _mm256_setzero_si256();
            let mut facc = [[_mm256_setzero_ps(); T]; R];
            for g in 0..nb.div_ceil(8) {
                let n = (nb - 8 * g).min(8);
                // Offsets in this group: weight codes, activation codes.
                let wqo = match K {
                    0 => 2 * n,
                    1 => 4 * n,
                    _ => 6 * n,
                };
                let aqo = 8 * n;
                let (wg, ag) = (g * 8 * wbb, g * 8 * abb);
                for i in 0..R {
                    prefetch(wp[i].wrapping_add(wg + PF_AHEAD), n * wbb);
                }
                let mut acc = [[zero; T]; R];
                // Without VNNI, Q4_0/Q4_1 products are summed in i16 over
                // the group (`vpmaddubsw` pairs of at most 2 x 15 x 128, at
                // most 8 of them: 30,720) and widened once, not per vector.
                let sum16 = !VNNI && K != 2;
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
                        ys[j] = if K == 2 {
                            _mm256_slli_epi32::<4>(sums)
                        } else {
                            _mm256_slli_epi32::<3>(sums)
                        };
                    }
                }
                let mask = lane_mask(n);
                for i in 0..R {
                    let dx = _mm256_cvtph_ps(_mm_loadu_si128(wp[i].add(wg) as *const __m128i));
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
        // Q4_0 (K = 0), Q5_0 (K = 2) · Q8_0, rows interleaved by 8
        // (`super::Q4_0_X8`, `super::Q5_0_X8`), one row per 32-bit lane: one
        // sequential stream per group of rows, every activation word
        // broadcast to all lanes, no horizontal sums.

        /// Whole groups of 8 rows run [`tile_qx8`], one token at a time
        /// (a group's few KiB stay in L1 for the next token; several tokens
        /// are the wide kernel's job); the rows past the last whole group
        /// are packed per row and run [`tile_q4`].
        #[target_feature(enable = $feat)]
        unsafe fn gemm_qx8<const K: u8>(
            ops: &Operands,
            nrows: usize,
            ntok: usize,
            out: *mut f32,
            os: usize,
        ) {
            let groups = nrows / 8;
            for g in 0..groups {
                for t in 0..ntok {
                    tile_qx8::<K>(ops, g, t, out, os);
                }
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
        /// offset (Q4_0 8, Q5_0 16) x the activations' code sum; then (dx * dy) * sumi added into float
        /// vector b % 8, as the scalar reference adds block b into lane
        /// b % 8 of each row; the eight vectors are transposed at the end so
        /// each row's eight lanes reduce as `reduce8`.
        ///
        /// Code sums: Q4_0 with VNNI, `vpdpbusd` of the low nibbles and of
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
            let (gb, qo) = if K == 2 {
                (super::Q5_0_X8, 48)
            } else {
                (super::Q4_0_X8, 16)
            };
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
                        if VNNI && K == 0 {
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
                    let isum = if VNNI && K == 0 {
                        _mm256_add_epi32(s, _mm256_srai_epi32::<4>(s2))
                    } else if VNNI {
                        _mm256_add_epi32(s, s2)
                    } else {
                        _mm256_add_epi32(_mm256_madd_epi16(s, ones), _mm256_madd_epi16(s2, ones))
                    };
                    let sy = (ag.add(4 * n + 4 * l) as *const i32).read_unaligned();
                    let off = if K == 2 { sy << 4 } else { sy << 3 };
                    let isum = _mm256_sub_epi32(isum, _mm256_set1_epi32(off));
                    let dx = _mm256_cvtph_ps(_mm_loadu_si128(bx as *const __m128i));
                    let dy = _mm256_set1_ps((ag.add(4 * l) as *const f32).read_unaligned());
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

        /// Reduces each accumulator's 8 lanes (as `reduce8`) into its output.
        #[target_feature(enable = $feat)]
        #[inline]
        unsafe fn write_facc<const R: usize, const T: usize>(
            facc: &[[__m256; T]; R],
            r0: usize,
            t0: usize,
            out: *mut f32,
            os: usize,
        ) {
            let mut lanes = [[[0f32; 8]; T]; R];
            for i in 0..R {
                for j in 0..T {
                    _mm256_storeu_ps(lanes[i][j].as_mut_ptr(), facc[i][j]);
                }
            }
            write_tile(&lanes, r0, t0, out, os);
        }

        // -------------------------------------------------------------------
        // Wide kernels for several tokens (prefill): Q4_0 (K = 0), Q4_1
        // (K = 1), Q5_0 (K = 2), Q8_0 (K = 3). See `super::WIDE_GROUP`.

        /// This level's wide kernel for weight type `t`, if it has one.
        /// Q8_0 needs the unsigned-offset trick (`Q8_BIAS`).
        pub fn wide_fn(t: GgmlType) -> Option<GemmFn> {
            let f: GemmFn = match t {
                GgmlType::Q4_0 => gemm_wide::<0>,
                GgmlType::Q4_1 => gemm_wide::<1>,
                GgmlType::Q5_0 => gemm_wide::<2>,
                GgmlType::Q8_0 if Q8_BIAS => gemm_wide::<3>,
                GgmlType::Q4K => gemm_wide_kx8::<4>,
                GgmlType::Q6K => gemm_wide_kx8::<6>,
                _ => return None,
            };
            Some(f)
        }

        /// [`expand_row`] of row `r` of the operands.
        #[target_feature(enable = $feat)]
        #[inline]
        unsafe fn expand_row_at<const K: u8>(ops: &Operands, nrows: usize, r: usize, dst: *mut u8) {
            if (K == 0 || K == 2) && r < nrows / 8 * 8 {
                // Q4_0 / Q5_0 rows in a whole group are interleaved
                // (`super::Q4_0_X8`, `super::Q5_0_X8`): each group of 8
                // blocks of row r is gathered straight into the per-row
                // packed layout (d[n] at 2l; Q5_0's fifth bits at 2n, qh bit
                // 4k + i of block l at bit 4n * k + 4l + i; code vector k at
                // `codes` + 4n * k + 4l) and expanded. In the interleaved
                // qh, byte u holds qh bits 4u.. in its low nibble and
                // 16 + 4u.. in its high one, so nibble k of the packed
                // fifth-bit area is a half-byte of it.
                let (x8, units) = if K == 0 {
                    (super::Q4_0_X8, 16)
                } else {
                    (super::Q5_0_X8, 48)
                };
                let grp = ops.w.as_ptr().add(r / 8 * 8 * ops.wrb);
                let i = r % 8;
                let nb = ops.cols / 32;
                let mut tmp = [0u8; 8 * 22];
                let tp = tmp.as_mut_ptr();
                for g in 0..nb.div_ceil(8) {
                    let n = (nb - 8 * g).min(8);
                    let codes = if K == 0 { 2 * n } else { 6 * n };
                    if K == 2 {
                        core::ptr::write_bytes(tp.add(2 * n), 0, 4 * n);
                    }
                    for l in 0..n {
                        let bx = grp.add((8 * g + l) * x8);
                        core::ptr::copy_nonoverlapping(bx.add(2 * i), tp.add(2 * l), 2);
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
        /// (`super::Q4K_X8`, `super::Q6K_X8`): each super-block of a row in
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
                if K == 4 {
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
        /// codes (Q4: 0..15, Q5: 0..31, Q8_0: w + 128); lanes past the
        /// row's last block are zero.
        #[target_feature(enable = $feat)]
        #[inline]
        unsafe fn expand_row<const K: u8>(src: *const u8, cols: usize, dst: *mut u8) {
            let nb = cols / 32;
            let wbb = [18usize, 20, 22, 34][K as usize];
            let m4 = _mm256_set1_epi8(0x0F);
            for g in 0..nb.div_ceil(8) {
                let n = (nb - 8 * g).min(8);
                let s = src.add(g * 8 * wbb);
                let d = dst.add(g * super::WIDE_GROUP);
                let st = |at: usize, v: __m256i| _mm256_storeu_si256(d.add(at) as *mut __m256i, v);
                if n == 8 {
                    let cvt = |p: *const u8| _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i));
                    _mm256_storeu_ps(d as *mut f32, cvt(s));
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
                    let qo = [16usize, 32, 48][K as usize];
                    for k in 0..4 {
                        let v = ld(s.add(qo + 32 * k));
                        let mut lo = _mm256_and_si256(v, m4);
                        let mut hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
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
                    core::ptr::write_bytes(d, 0, super::WIDE_GROUP);
                    for l in 0..n {
                        (d.add(4 * l) as *mut f32).write_unaligned(f16v(s.add(2 * l)));
                        if K == 1 {
                            (d.add(32 + 4 * l) as *mut f32)
                                .write_unaligned(f16v(s.add(2 * n + 2 * l)));
                        }
                        for k in 0..8 {
                            for i in 0..4 {
                                let c = if K == 3 {
                                    *s.add(2 * n + 4 * n * k + 4 * l + i) ^ 0x80
                                } else {
                                    let qo = [2 * n, 4 * n, 6 * n][K as usize];
                                    let b = *s.add(qo + 4 * n * (k % 4) + 4 * l + i);
                                    let mut c = if k < 4 { b & 0x0F } else { b >> 4 };
                                    if K == 2 {
                                        let bit = 4 * n * k + 4 * l + i;
                                        c |= ((*s.add(2 * n + bit / 8) >> (bit % 8)) & 1) << 4;
                                    }
                                    c
                                };
                                *d.add(64 + 32 * k + 4 * l + i) = c;
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

        /// R expanded rows (at `w`, `ws` bytes apart) times T wide activation
        /// rows from token `t0`: per group, integer sums started at
        /// -offset * sum(y) (so they end as sum((w - offset) * y)), then
        /// (dx * dy) * sumi [+ m * s] per lane, as the scalar reference.
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
            let zero = _mm256_setzero_si256();
            let mut facc = [[_mm256_setzero_ps(); T]; R];
            for g in 0..ng {
                let go = g * super::WIDE_GROUP;
                let mut acc = [[zero; T]; R];
                if K != 1 {
                    for j in 0..T {
                        let ys = ld(ap[j].add(go + 32));
                        let off = match K {
                            0 => _mm256_slli_epi32::<3>(ys),
                            2 => _mm256_slli_epi32::<4>(ys),
                            _ => _mm256_slli_epi32::<7>(ys),
                        };
                        let start = _mm256_sub_epi32(zero, off);
                        for row in acc.iter_mut() {
                            row[j] = start;
                        }
                    }
                }
                if !VNNI && K != 3 {
                    // Without VNNI: `vpmaddubsw` pair sums added in i16 over
                    // as many code vectors as stay below 2^15 (Q4: 8, |sum|
                    // <= 8 * 2 * 15 * 127 = 30,480; Q5_0: 4, <= 31,496),
                    // then one `vpmaddwd` by ones into the i32 sums.
                    let step = if K == 2 { 4 } else { 8 };
                    let ones = _mm256_set1_epi16(1);
                    let mut k = 0;
                    while k < 8 {
                        let mut a16 = [[zero; T]; R];
                        for kk in k..k + step {
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
                    for k in 0..8 {
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
                        facc[i][j] = _mm256_add_ps(facc[i][j], term);
                    }
                }
            }
            write_facc(&facc, r0, t0, out, os);
        }

        // -------------------------------------------------------------------
        // Wide K-quant kernels (Q4_K: K = 4, Q6_K: K = 6), see
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

        /// Expands one Q4_K or Q6_K row into `super::WIDE_KW` bytes per super-block.
        #[target_feature(enable = $feat)]
        #[inline]
        unsafe fn expand_k_row<const K: u8>(src: *const u8, cols: usize, dst: *mut u8) {
            let m4 = _mm256_set1_epi8(0x0F);
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
                if K == 4 {
                    let bx = src.add(s * 144);
                    for c in 0..4 {
                        let v = ld(bx.add(16 + 32 * c));
                        _mm256_storeu_si256(
                            rp.add(64 * c) as *mut __m256i,
                            _mm256_and_si256(v, m4),
                        );
                        _mm256_storeu_si256(
                            rp.add(64 * c + 32) as *mut __m256i,
                            _mm256_and_si256(_mm256_srli_epi16(v, 4), m4),
                        );
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
                    let m3 = _mm256_set1_epi8(3);
                    for h in 0..2 {
                        let q1 = ld(bx.add(64 * h));
                        let q2 = ld(bx.add(64 * h + 32));
                        let qh = ld(bx.add(128 + 32 * h));
                        let top = |b: __m256i| _mm256_slli_epi16(_mm256_and_si256(b, m3), 4);
                        let codes = [
                            _mm256_or_si256(_mm256_and_si256(q1, m4), top(qh)),
                            _mm256_or_si256(
                                _mm256_and_si256(q2, m4),
                                top(_mm256_srli_epi16(qh, 2)),
                            ),
                            _mm256_or_si256(
                                _mm256_and_si256(_mm256_srli_epi16(q1, 4), m4),
                                top(_mm256_srli_epi16(qh, 4)),
                            ),
                            _mm256_or_si256(
                                _mm256_and_si256(_mm256_srli_epi16(q2, 4), m4),
                                top(_mm256_srli_epi16(qh, 6)),
                            ),
                        ];
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

        /// The sums of four vectors' eight i32 lanes, as [s0, s1, s2, s3].
        #[target_feature(enable = $feat)]
        #[inline]
        unsafe fn hsum4(v: [__m256i; 4]) -> __m128i {
            let a = _mm256_hadd_epi32(v[0], v[1]);
            let b = _mm256_hadd_epi32(v[2], v[3]);
            let c = _mm256_hadd_epi32(a, b);
            _mm_add_epi32(_mm256_castsi256_si128(c), _mm256_extracti128_si256::<1>(c))
        }

        /// Per token of the tile, the sum of the lanes of `v[j]`.
        #[target_feature(enable = $feat)]
        #[inline]
        unsafe fn hsums<const T: usize>(v: &[__m256i; T]) -> [i32; T] {
            let mut s = [0i32; T];
            if T == 4 {
                let r = hsum4([v[0], v[1], v[2], v[3]]);
                _mm_storeu_si128(s.as_mut_ptr() as *mut __m128i, r);
            } else {
                for j in 0..T {
                    s[j] = hsum_i32(v[j]);
                }
            }
            s
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
                // Q4_K: one phase of 8 code vectors; Q6_K: two of 4, each
                // with its own sub-block scales.
                let phases: &[(usize, usize)] = if K == 4 {
                    &[(0, 256)]
                } else {
                    &[(0, 256), (4, 288)]
                };
                let nk = if K == 4 { 8 } else { 4 };
                for &(k0, sc_at) in phases {
                    if !VNNI {
                        // Without VNNI: `vpmaddubsw` pair sums added in i16
                        // (Q4_K: all 8 code vectors, |sum| <= 8 * 2 * 15 *
                        // 127 = 30,480; Q6_K: 2 at a time, <= 2 * 2 * 63 *
                        // 127 = 32,004), then one `vpmaddwd` by the lane's
                        // scale (as i16 in both halves of the lane): the
                        // same exact integer as the VNNI path's sums times
                        // the scale, in fewer instructions.
                        let step = if K == 4 { 8 } else { 2 };
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
                            if K == 4 {
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
                        let term = if K == 4 {
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
                        // Q4_K: mins x pair sums; Q6_K: 32 * scales x sums.
                        let m16 = ld(wp[i].add(wo + 320));
                        let mut corr = [zero; T];
                        for j in 0..T {
                            corr[j] = _mm256_madd_epi16(m16, bs[j]);
                        }
                        let dx = (wp[i].add(wo + 352) as *const f32).read_unaligned();
                        if K == 4 {
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

        /// Lane n = the sum of the eight i32 lanes of `v[at + n]`.
        #[target_feature(enable = $feat)]
        #[inline]
        unsafe fn hsum8(v: &[__m256i; 16], at: usize) -> __m256i {
            let a01 = _mm256_hadd_epi32(v[at], v[at + 1]);
            let a23 = _mm256_hadd_epi32(v[at + 2], v[at + 3]);
            let a45 = _mm256_hadd_epi32(v[at + 4], v[at + 5]);
            let a67 = _mm256_hadd_epi32(v[at + 6], v[at + 7]);
            // Per 128-bit half: v[at]..v[at + 3]'s partial sums (lanes 0..4,
            // then 4..8 in the high half), and v[at + 4]..v[at + 7]'s.
            let b0 = _mm256_hadd_epi32(a01, a23);
            let b1 = _mm256_hadd_epi32(a45, a67);
            let lo = _mm256_permute2x128_si256::<0x20>(b0, b1);
            let hi = _mm256_permute2x128_si256::<0x31>(b0, b1);
            _mm256_add_epi32(lo, hi)
        }

        // -------------------------------------------------------------------
        // Wide Q4_K and Q6_K on the interleaved groups of 8 rows
        // (`super::Q4K_X8`, `super::Q6K_X8`):
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
                * if K == 4 {
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
                        if K == 4 {
                            expand_q4_kx8(ops, g, dst);
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
        unsafe fn expand_q4_kx8(ops: &Operands, g: usize, dst: *mut u8) {
            let grp = ops.w.as_ptr().add(g * 8 * ops.wrb);
            let m4 = _mm256_set1_epi8(0x0F);
            for s in 0..ops.cols / 256 {
                let gp = grp.add(s * super::Q4K_X8);
                let d = dst.add(s * super::body::WIDE_KX8);
                let st = |at: usize, v: __m256i| _mm256_storeu_si256(d.add(at) as *mut __m256i, v);
                for c in 0..4 {
                    for k in 0..8 {
                        // Unit 3 + 8c + k: code bytes 32c + 4k.. of each row,
                        // low nibbles sub-block 2c, high nibbles 2c + 1.
                        let v = ld(gp.add(32 + 32 * (3 + 8 * c + k)));
                        st(32 * (16 * c + k), _mm256_and_si256(v, m4));
                        st(
                            32 * (16 * c + 8 + k),
                            _mm256_and_si256(_mm256_srli_epi16::<4>(v), m4),
                        );
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
        /// 30,720) times its scale, and the mins times the activations'
        /// 16-element sums, exact integers as the scalar reference; then its
        /// float formula lane by lane, unfused.
        #[target_feature(enable = $feat)]
        #[inline]
        #[allow(clippy::too_many_arguments)]
        unsafe fn tile_wide_q4_kx8<const G: usize, const T: usize>(
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
                for b in 0..8 {
                    let mut acc = [[zero; T]; G];
                    for k in 0..8 {
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

        /// [`tile_wide_q4_kx8`] (K = 4) or [`tile_wide_q6_kx8`] (K = 6).
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
            if K == 4 {
                tile_wide_q4_kx8::<G, T>(w, gs, ops, nsb, r0, t0, out, os);
            } else {
                tile_wide_q6_kx8::<G, T>(w, gs, ops, nsb, r0, t0, out, os);
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
                            let w = q8_prep(ld(wp[i].add(wg + 2 * n + stride * k)));
                            for j in 0..T {
                                acc[i][j] = q8_pair(acc[i][j], w, y[j]);
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
                let mut dy = [_mm256_setzero_ps(); T];
                for j in 0..T {
                    dy[j] = _mm256_loadu_ps(ap[j].add(ag) as *const f32);
                }
                let mask = lane_mask(n);
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
        // Q4_K · Q8_K, standard layout: the rows past an interleaved
        // matrix's last whole group of 8.

        /// The sums of the eight lanes of every vector of `v`, in order;
        /// four vectors at a time share one horizontal-add tree.
        #[target_feature(enable = $feat)]
        #[inline]
        unsafe fn hsum_all<const N: usize>(v: &[__m256i; N]) -> [i32; N] {
            let mut s = [0i32; N];
            let mut k = 0;
            while k + 4 <= N {
                let r = hsum4([v[k], v[k + 1], v[k + 2], v[k + 3]]);
                _mm_storeu_si128(s.as_mut_ptr().add(k) as *mut __m128i, r);
                k += 4;
            }
            while k < N {
                s[k] = hsum_i32(v[k]);
                k += 1;
            }
            s
        }

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
        unsafe fn tile_q4_k<const R: usize, const T: usize>(
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
            let m4 = _mm256_set1_epi8(0x0F);
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
                // Per (row, token): the scaled code sums, then the mins
                // times the activations' 16-element sums; exact integers,
                // reduced four vectors at a time.
                let mut sv = [[zero; T]; R];
                let mut mv = [[zero; T]; R];
                for i in 0..R {
                    let bx = wp[i].add(s * 144);
                    prefetch(bx.wrapping_add(PF_AHEAD), 144);
                    let sm = k4_scales_mins(bx.add(4));
                    let mdup = _mm256_cvtepu8_epi16(_mm_shuffle_epi8(sm, dup));
                    let sc16 = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(sm));
                    for c in 0..4 {
                        let v = ld(bx.add(16 + 32 * c));
                        let lo = _mm256_and_si256(v, m4);
                        let hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
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
                    let bx = wp[i].add(s * 144);
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
        // Q4_K · Q8_K, rows interleaved by 8 (`super::Q4K_X8`): each 32-bit
        // lane is one row, so a row's sums stay in its lane and no
        // horizontal reduction is needed; every activation word is
        // broadcast to all lanes.

        /// Whole groups of 8 rows run [`tile_q4_kx8`]; the rows past the
        /// last whole group are standard and run [`tile_q4_k`].
        #[target_feature(enable = $feat)]
        unsafe fn gemm_q4_kx8(ops: &Operands, nrows: usize, ntok: usize, out: *mut f32, os: usize) {
            let groups = nrows / 8;
            for g in 0..groups {
                let mut t = 0;
                while t + TT <= ntok {
                    tile_q4_kx8::<TT>(ops, g, t, out, os);
                    t += TT;
                }
                while t < ntok {
                    tile_q4_kx8::<1>(ops, g, t, out, os);
                    t += 1;
                }
            }
            for r in groups * 8..nrows {
                for t in 0..ntok {
                    tile_q4_k::<1, 1>(ops, r, t, out, os);
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
        #[target_feature(enable = $feat)]
        #[inline]
        unsafe fn tile_q4_kx8<const T: usize>(
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
            let mut acc = [_mm256_setzero_ps(); T];
            for s in 0..nsb {
                let bx = gw.add(s * super::Q4K_X8);
                prefetch(bx.wrapping_add(PF_AHEAD), super::Q4K_X8);
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
                    let mut slo = [zero; T];
                    let mut shi = [zero; T];
                    for k in 0..8 {
                        let v = ld(bx.add(128 + 256 * cc + 32 * k));
                        let lo = _mm256_and_si256(v, m4);
                        let hi = if VNNI {
                            _mm256_and_si256(v, mf0)
                        } else {
                            _mm256_and_si256(_mm256_srli_epi16::<4>(v), m4)
                        };
                        for t in 0..T {
                            let y = ya[t].add(4 + 64 * cc + 4 * k);
                            let ylo = _mm256_set1_epi32((y as *const i32).read_unaligned());
                            let yhi = _mm256_set1_epi32((y.add(32) as *const i32).read_unaligned());
                            if VNNI {
                                slo[t] = dpa(slo[t], lo, ylo);
                                shi[t] = dpa(shi[t], hi, yhi);
                            } else {
                                slo[t] = _mm256_add_epi16(slo[t], _mm256_maddubs_epi16(lo, ylo));
                                shi[t] = _mm256_add_epi16(shi[t], _mm256_maddubs_epi16(hi, yhi));
                            }
                        }
                    }
                    // Sub-blocks 2cc (low nibbles) and 2cc + 1 (high).
                    let (j0, j1) = (2 * cc, 2 * cc + 1);
                    let sc = |j: usize| {
                        let v = if j < 4 { sc_lo } else { sc_hi };
                        _mm256_shuffle_epi8(v, picks[j % 4])
                    };
                    let (s0, s1) = (sc(j0), sc(j1));
                    for t in 0..T {
                        if VNNI {
                            let hi = _mm256_srai_epi32::<4>(shi[t]);
                            isum[t] = _mm256_add_epi32(isum[t], _mm256_mullo_epi32(slo[t], s0));
                            isum[t] = _mm256_add_epi32(isum[t], _mm256_mullo_epi32(hi, s1));
                        } else {
                            isum[t] = _mm256_add_epi32(isum[t], _mm256_madd_epi16(slo[t], s0));
                            isum[t] = _mm256_add_epi32(isum[t], _mm256_madd_epi16(shi[t], s1));
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
            let m4 = _mm256_set1_epi8(0x0F);
            let m3 = _mm256_set1_epi8(3);
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
                        let top = |b: __m256i| _mm256_slli_epi16(_mm256_and_si256(b, m3), 4);
                        let codes = [
                            _mm256_or_si256(_mm256_and_si256(q1, m4), top(qh)),
                            _mm256_or_si256(
                                _mm256_and_si256(q2, m4),
                                top(_mm256_srli_epi16(qh, 2)),
                            ),
                            _mm256_or_si256(
                                _mm256_and_si256(_mm256_srli_epi16(q1, 4), m4),
                                top(_mm256_srli_epi16(qh, 4)),
                            ),
                            _mm256_or_si256(
                                _mm256_and_si256(_mm256_srli_epi16(q2, 4), m4),
                                top(_mm256_srli_epi16(qh, 6)),
                            ),
                        ];
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
            for g in 0..groups {
                let mut t = 0;
                while t + TT <= ntok {
                    tile_q6_kx8::<TT>(ops, g, t, out, os);
                    t += TT;
                }
                while t < ntok {
                    tile_q6_kx8::<1>(ops, g, t, out, os);
                    t += 1;
                }
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
            let m4 = _mm256_set1_epi8(0x0F);
            let m3 = _mm256_set1_epi8(3);
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
                            let qh = unit(32 + 8 * h + u);
                            let top = |b: __m256i| _mm256_slli_epi16::<4>(_mm256_and_si256(b, m3));
                            let codes = [
                                _mm256_or_si256(_mm256_and_si256(qa, m4), top(qh)),
                                _mm256_or_si256(
                                    _mm256_and_si256(qb, m4),
                                    top(_mm256_srli_epi16::<2>(qh)),
                                ),
                                _mm256_or_si256(
                                    _mm256_and_si256(_mm256_srli_epi16::<4>(qa), m4),
                                    top(_mm256_srli_epi16::<4>(qh)),
                                ),
                                _mm256_or_si256(
                                    _mm256_and_si256(_mm256_srli_epi16::<4>(qb), m4),
                                    top(_mm256_srli_epi16::<6>(qh)),
                                ),
                            ];
                            for (k, code) in codes.iter().enumerate() {
                                for t in 0..T {
                                    let y = ya[t].add(4 + 128 * h + 32 * k + 4 * u) as *const i32;
                                    let yv = _mm256_set1_epi32(y.read_unaligned());
                                    if VNNI {
                                        sk[k][t] = dpa(sk[k][t], *code, yv);
                                    } else {
                                        pk[k][t] = _mm256_add_epi16(
                                            pk[k][t],
                                            _mm256_maddubs_epi16(*code, yv),
                                        );
                                    }
                                }
                            }
                            if !VNNI && uu % 2 == 1 {
                                for k in 0..4 {
                                    for t in 0..T {
                                        let v = _mm256_madd_epi16(pk[k][t], scs[k]);
                                        sk[k][t] = _mm256_add_epi32(sk[k][t], v);
                                        pk[k][t] = zero;
                                    }
                                }
                            }
                        }
                        for k in 0..4 {
                            for t in 0..T {
                                let v = if VNNI {
                                    _mm256_mullo_epi32(sk[k][t], scs[k])
                                } else {
                                    sk[k][t]
                                };
                                isum[t] = _mm256_add_epi32(isum[t], v);
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
