//! AVX-512 (F, BW, VL, VNNI) kernels, mostly on 256-bit vectors: `vpdpbusd`
//! and `vpdpwssd` do the integer dot products in one instruction, masks
//! expand Q5 fifth bits, and 32 registers hold 4 rows x 4 tokens of
//! accumulators. The few-row tiles of the interleaved types (`tile_*x16`)
//! hold two groups of 8 rows in one 512-bit vector. The results are the
//! same bits as the AVX2 and scalar kernels.

use core::arch::x86_64::*;

const TR: usize = 4;
const TT: usize = 4;
/// The widest token tile of [`tile_q4_kx16`]: 8 tokens keep 16 `vpdpbusd`
/// chains in flight (4 tokens: 8, too few for its 5-cycle latency at two a
/// cycle). Qwen2.5-1.5B's Q4_K ffn up (8960 x 1536) at 8 tokens, 2 threads:
/// 422-429 us with tiles of 4, 388-389 with tiles of 8 (examples/kernels.rs,
/// alternating binaries, Intel Xeon).
const TT16: usize = 8;

/// The wide Q8_0 kernel may sum (w + 128) * y in i32 (`vpdpbusd`) and
/// subtract 128 * sum(y).
const Q8_BIAS: bool = true;

/// VNNI: the interleaved Q4_K kernel sums codes with `vpdpbusd` into i32.
const VNNI: bool = true;

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
fn dp(acc: __m256i, u: __m256i, s: __m256i) -> __m256i {
    _mm256_dpbusd_epi32(acc, u, s)
}

/// As [`dp`], with the product summed on its own and then added: the
/// one-token kernels' accumulators then wait on a 1-cycle add rather than
/// on a chain of `vpdpbusd`s. Streaming a 1.2 GB Q4_0 matrix from memory,
/// one thread took 16.0 ms of CPU time with the chain and 12.0 without
/// (the AVX2 kernel: 12.0); from cache 0.33 and 0.36 ms (AVX2: 0.43);
/// examples/kernels.rs on a Zen 4 VM. A long chain keeps instructions in
/// the reorder buffer, and with them the loads behind them.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
fn dpa(acc: __m256i, u: __m256i, s: __m256i) -> __m256i {
    _mm256_add_epi32(acc, _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s))
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
fn dp16(acc: __m256i, a: __m256i, b: __m256i) -> __m256i {
    _mm256_dpwssd_epi32(acc, a, b)
}

/// Q8_0 weights prepared for [`q8_pair`]: (|w|, w).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
fn q8_prep(w: __m256i) -> (__m256i, __m256i) {
    (_mm256_abs_epi8(w), w)
}

/// acc + per lane the sum of four w x y (i8 x i8), as |w| x sign(y, w)
/// (|-128| is 128 as u8: exact). The packed Q8_0 tiles at this level sum
/// (w + 128) * y instead and take off 128 x the code sums the packed
/// activations carry (`tile_q8_0`), so this form is the AVX2 level's. Summing
/// (w + 128) * y with 128 * sum(y) computed by one more `vpdpbusd` per
/// activation vector was slower: on a Zen 4 VM
/// (load 6-8, 1 thread, alternating runs of examples/kernels.rs) the
/// one-token kernel took ~20% less on-CPU time on the Gemma 3 output
/// (262144 x 640) and ~10% less wall time on the SmolLM2 output this way.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
fn q8_pair(acc: __m256i, w: (__m256i, __m256i), y: __m256i) -> __m256i {
    dpa(acc, w.0, _mm256_sign_epi8(y, w.1))
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
fn expand_bits(m: u32) -> __m256i {
    _mm256_maskz_mov_epi8(m, _mm256_set1_epi8(0x10))
}

/// Byte j = 0x10 where `x & sel` is not zero in byte j, else 0 (`sel`
/// has one bit per byte).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
fn sel_bits(x: __m256i, sel: __m256i) -> __m256i {
    _mm256_maskz_mov_epi8(_mm256_test_epi8_mask(x, sel), _mm256_set1_epi8(0x10))
}

simd_kernels!("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni");

/// Groups g and g + 1 of an interleaved Q4_K or Q5_K matrix (rows 8g..8g + 16)
/// times tokens t0..t0 + T, both groups in one 512-bit vector: lanes 0..8
/// are group g's rows, lanes 8..16 group g + 1's, each half loaded from its
/// own group. Every lane runs [`tile_q4_kx8`]'s operations for its row in
/// the same order (the exact integer sums, then the unfused float formula),
/// so the bits are that tile's; each `vpdpbusd` does 64 products instead of
/// 32, and the per-token scale, min and float work covers 16 rows per
/// instruction. Measured on an Intel Xeon (Sapphire Rapids class), which
/// issues two 512-bit `vpdpbusd` a cycle as it does 256-bit ones. Q5_K
/// (K = 5) adds each code's fifth bit as [`tile_q4_kx8`] does.
///
/// Safety: as the 8-row tile's, for both groups: the caller passes whole
/// groups g and g + 1 of the matrix (`ops.w` holds their rows).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
unsafe fn tile_q4_kx16<const T: usize, const K: u8>(
    ops: &Operands,
    g: usize,
    t0: usize,
    out: *mut f32,
    os: usize,
) {
    let nsb = ops.cols / 256;
    let gw = ops.w.as_ptr().add(g * 8 * ops.wrb);
    // Group g + 1 starts 8 rows on.
    let gs = 8 * ops.wrb;
    let ap = row_ptrs::<T>(ops.a.as_ptr(), t0, ops.arb);
    let ld2 = |p: *const u8| ld_pair(p, gs);
    let zero = _mm512_setzero_si512();
    let m4 = _mm512_set1_epi8(0x0F);
    let mf0 = _mm512_set1_epi8(0xF0u8 as i8);
    let m6 = _mm512_set1_epi32(0x3F3F_3F3F);
    let m4w = _mm512_set1_epi32(0x0F0F_0F0F);
    let m2 = _mm512_set1_epi32(0x0303_0303);
    // Byte j of each lane's word as an i32 (scales) or as an i16 pair
    // (mins).
    let z = -128i8;
    let pick = |j: i8| per_word(|w| [j + w, z, z, z]);
    let pair = |j: i8| per_word(|w| [j + w, z, j + w, z]);
    let picks = [pick(0), pick(1), pick(2), pick(3)];
    let pairs = [pair(0), pair(1), pair(2), pair(3)];
    // Q5_K: qh word k (unit 3 + k) at 128 + 32k, codes 8 units on.
    let (gb, qo) = if K == 5 {
        (super::Q5K_X8, 384)
    } else {
        (super::Q4K_X8, 128)
    };
    let bit5 = _mm512_set1_epi8(0x10);
    let mut acc = [_mm512_setzero_ps(); T];
    for s in 0..nsb {
        let bx = gw.add(s * gb);
        prefetch_pair(gw, gs, s * gb, gb);
        let a = ld2(bx.add(32));
        let b = ld2(bx.add(64));
        let c = ld2(bx.add(96));
        let sc_lo = _mm512_and_si512(a, m6);
        let mn_lo = _mm512_and_si512(b, m6);
        let sc_hi = _mm512_or_si512(
            _mm512_and_si512(c, m4w),
            _mm512_slli_epi32::<4>(_mm512_and_si512(_mm512_srli_epi32::<6>(a), m2)),
        );
        let mn_hi = _mm512_or_si512(
            _mm512_and_si512(_mm512_srli_epi32::<4>(c), m4w),
            _mm512_slli_epi32::<4>(_mm512_and_si512(_mm512_srli_epi32::<6>(b), m2)),
        );
        let mut ya = [ap[0]; T];
        for j in 0..T {
            ya[j] = ap[j].add(s * 292);
        }
        // Mins: sum_j m_j * (bsums[2j] + bsums[2j + 1]).
        let mut summ = [zero; T];
        for j in 0..8 {
            let mn = if j < 4 { mn_lo } else { mn_hi };
            let mp = _mm512_shuffle_epi8(mn, pairs[j % 4]);
            for t in 0..T {
                let bs = _mm512_set1_epi32((ya[t].add(260 + 4 * j) as *const i32).read_unaligned());
                summ[t] = _mm512_add_epi32(summ[t], _mm512_madd_epi16(mp, bs));
            }
        }
        let mut isum = [zero; T];
        for cc in 0..4 {
            let (j0, j1) = (2 * cc, 2 * cc + 1);
            let sc = |j: usize| {
                let v = if j < 4 { sc_lo } else { sc_hi };
                _mm512_shuffle_epi8(v, picks[j % 4])
            };
            let (s0, s1) = (sc(j0), sc(j1));
            let mut slo = [zero; T];
            let mut shi = [zero; T];
            for k in 0..8 {
                let v = ld2(bx.add(qo + 256 * cc + 32 * k));
                let (lo, hi) = if K == 4 {
                    (_mm512_and_si512(v, m4), _mm512_and_si512(v, mf0))
                } else {
                    // `q45_codes`: the nibbles with bit 2cc (2cc + 1) of
                    // qh as their fifth bit.
                    let qh = ld2(bx.add(128 + 32 * k));
                    let b = 1i8 << (2 * cc);
                    let fifth = |b: i8| {
                        _mm512_maskz_mov_epi8(_mm512_test_epi8_mask(qh, _mm512_set1_epi8(b)), bit5)
                    };
                    (
                        _mm512_or_si512(_mm512_and_si512(v, m4), fifth(b)),
                        _mm512_or_si512(
                            _mm512_and_si512(_mm512_srli_epi16::<4>(v), m4),
                            fifth(b << 1),
                        ),
                    )
                };
                for t in 0..T {
                    let y = ya[t].add(4 + 64 * cc + 4 * k);
                    let ylo = _mm512_set1_epi32((y as *const i32).read_unaligned());
                    let yhi = _mm512_set1_epi32((y.add(32) as *const i32).read_unaligned());
                    slo[t] = _mm512_dpbusd_epi32(slo[t], lo, ylo);
                    shi[t] = _mm512_dpbusd_epi32(shi[t], hi, yhi);
                }
            }
            for t in 0..T {
                // Q4_K's high nibbles were summed in place (16 x the code).
                let hi = if K == 4 {
                    _mm512_srai_epi32::<4>(shi[t])
                } else {
                    shi[t]
                };
                isum[t] = _mm512_add_epi32(isum[t], _mm512_mullo_epi32(slo[t], s0));
                isum[t] = _mm512_add_epi32(isum[t], _mm512_mullo_epi32(hi, s1));
            }
        }
        let dx = f16_pair(bx, gs);
        let dmx = f16_pair(bx.add(16), gs);
        for t in 0..T {
            let dy = _mm512_set1_ps((ya[t] as *const f32).read_unaligned());
            let d = _mm512_mul_ps(dx, dy);
            let dmin = _mm512_mul_ps(dmx, dy);
            let term = _mm512_sub_ps(
                _mm512_mul_ps(d, _mm512_cvtepi32_ps(isum[t])),
                _mm512_mul_ps(dmin, _mm512_cvtepi32_ps(summ[t])),
            );
            acc[t] = _mm512_add_ps(acc[t], term);
        }
    }
    for (t, a) in acc.iter().enumerate() {
        _mm512_storeu_ps(out.add((t0 + t) * os + 8 * g), *a);
    }
}

/// Groups g and g + 1 of an interleaved Q6_K matrix (rows 8g..8g + 16)
/// times tokens t0..t0 + T, both groups in one 512-bit vector as in
/// [`tile_q4_kx16`]: every lane runs [`tile_q6_kx8`]'s operations for its
/// row in the same order, so the bits are that tile's.
///
/// Safety: as the 8-row tile's, for both groups: the caller passes whole
/// groups g and g + 1 of the matrix (`ops.w` holds their rows).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
unsafe fn tile_q6_kx16<const T: usize>(
    ops: &Operands,
    g: usize,
    t0: usize,
    out: *mut f32,
    os: usize,
) {
    let nsb = ops.cols / 256;
    let gw = ops.w.as_ptr().add(g * 8 * ops.wrb);
    let gs = 8 * ops.wrb;
    let ap = row_ptrs::<T>(ops.a.as_ptr(), t0, ops.arb);
    let ld2 = |p: *const u8| ld_pair(p, gs);
    let zero = _mm512_setzero_si512();
    let m4 = _mm512_set1_epi8(0x0F);
    let m3 = _mm512_set1_epi8(3);
    let z = -128i8;
    // Byte b of each lane into the top of an i32, and bytes b0, b1 into
    // the tops of its i16 halves: `tile_q6_kx8`'s shuffles per 128-bit lane.
    let top32 = |b: i8| per_word(|w| [z, z, z, b + w]);
    let top16 = |b0: i8, b1: i8| per_word(|w| [z, b0 + w, z, b1 + w]);
    let sel32 = [top32(0), top32(1), top32(2), top32(3)];
    let (sel01, sel23) = (top16(0, 1), top16(2, 3));
    let mut acc = [_mm512_setzero_ps(); T];
    for s in 0..nsb {
        let bx = gw.add(s * super::Q6K_X8);
        prefetch_pair(gw, gs, s * super::Q6K_X8, super::Q6K_X8);
        let unit = |u: usize| ld2(bx.add(16 + 32 * u));
        let mut ya = [ap[0]; T];
        for j in 0..T {
            ya[j] = ap[j].add(s * 292);
        }
        let scu = [unit(48), unit(49), unit(50), unit(51)];
        let scale =
            |sb: usize| _mm512_srai_epi32::<24>(_mm512_shuffle_epi8(scu[sb / 4], sel32[sb % 4]));
        let mut corr = [zero; T];
        for (m, v) in scu.iter().enumerate() {
            let p01 = _mm512_srai_epi16::<8>(_mm512_shuffle_epi8(*v, sel01));
            let p23 = _mm512_srai_epi16::<8>(_mm512_shuffle_epi8(*v, sel23));
            for t in 0..T {
                let bsp = ya[t].add(260 + 8 * m) as *const i32;
                let b01 = _mm512_set1_epi32(bsp.read_unaligned());
                let b23 = _mm512_set1_epi32(bsp.add(1).read_unaligned());
                corr[t] = _mm512_add_epi32(corr[t], _mm512_madd_epi16(p01, b01));
                corr[t] = _mm512_add_epi32(corr[t], _mm512_madd_epi16(p23, b23));
            }
        }
        let mut isum = [zero; T];
        for h in 0..2 {
            for part in 0..2 {
                let scs = [0, 1, 2, 3].map(|k| scale(8 * h + 2 * k + part));
                let mut sk = [[zero; T]; 4];
                for uu in 0..4 {
                    let u = 4 * part + uu;
                    let (q1, q2) = (unit(16 * h + u), unit(16 * h + 8 + u));
                    let qh = unit(32 + 8 * h + u);
                    let top = |b: __m512i| _mm512_slli_epi16::<4>(_mm512_and_si512(b, m3));
                    let codes = [
                        _mm512_or_si512(_mm512_and_si512(q1, m4), top(qh)),
                        _mm512_or_si512(_mm512_and_si512(q2, m4), top(_mm512_srli_epi16::<2>(qh))),
                        _mm512_or_si512(
                            _mm512_and_si512(_mm512_srli_epi16::<4>(q1), m4),
                            top(_mm512_srli_epi16::<4>(qh)),
                        ),
                        _mm512_or_si512(
                            _mm512_and_si512(_mm512_srli_epi16::<4>(q2), m4),
                            top(_mm512_srli_epi16::<6>(qh)),
                        ),
                    ];
                    for (k, code) in codes.iter().enumerate() {
                        for t in 0..T {
                            let y = ya[t].add(4 + 128 * h + 32 * k + 4 * u) as *const i32;
                            let yv = _mm512_set1_epi32(y.read_unaligned());
                            sk[k][t] = _mm512_dpbusd_epi32(sk[k][t], *code, yv);
                        }
                    }
                }
                for k in 0..4 {
                    for t in 0..T {
                        let v = _mm512_mullo_epi32(sk[k][t], scs[k]);
                        isum[t] = _mm512_add_epi32(isum[t], v);
                    }
                }
            }
        }
        let dx = f16_pair(bx, gs);
        for t in 0..T {
            let isum = _mm512_sub_epi32(isum[t], _mm512_slli_epi32::<5>(corr[t]));
            let dy = _mm512_set1_ps((ya[t] as *const f32).read_unaligned());
            let term = _mm512_mul_ps(_mm512_mul_ps(dx, dy), _mm512_cvtepi32_ps(isum));
            acc[t] = _mm512_add_ps(acc[t], term);
        }
    }
    for (t, a) in acc.iter().enumerate() {
        _mm512_storeu_ps(out.add((t0 + t) * os + 8 * g), *a);
    }
}

/// Prefetches for a pair of interleaved groups read side by side (groups g
/// and g + 1 at `gw` and `gw + gs`, each `gs` bytes, both at offset `o`):
/// [`PF_AHEAD`] bytes on in each group's own stream, and once that passes
/// the group's end, into the group that stream reads next (g + 2 after g,
/// g + 3 after g + 1). Prefetching `PF_AHEAD` on from each half instead
/// lands the low half's prefetches in g + 1, already being read, and leaves
/// g + 3's start cold: Qwen2.5-1.5B's Q6_K output (151936 x 1536, 233 MB,
/// from memory) took 14.8 ms at 4 tokens that way against 10.5 with one
/// group at a time (Intel Xeon, 2 threads).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
unsafe fn prefetch_pair(gw: *const u8, gs: usize, o: usize, len: usize) {
    let o = o + PF_AHEAD;
    let lo = if o < gs { o } else { gs + o };
    prefetch(gw.wrapping_add(lo), len);
    prefetch(gw.wrapping_add(gs + lo), len);
}

/// Groups g and g + 1 of an interleaved Q4_0 (K = 0), Q4_1 (K = 1) or
/// Q5_0 (K = 2) matrix (rows 8g..8g + 16) times tokens t0..t0 + T, both groups in one
/// 512-bit vector as in [`tile_q4_kx16`]: every lane runs
/// [`tile_qx8_rows`]'s operations for its row in the same order (exact
/// block sums, (dx * dy) * sumi (Q4_1: + m * s) into float vector b % 8, `reduce8` per
/// row), so the bits are that tile's.
///
/// Safety: as the 8-row tile's, for both groups: the caller passes whole
/// groups g and g + 1 of the matrix (`ops.w` holds their rows).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
// The block, unit and row indices each address several arrays (codes,
// activation words, accumulators), as in the macro-built tiles.
#[allow(clippy::needless_range_loop)]
unsafe fn tile_qx16_rows<const K: u8, const T: usize>(
    ops: &Operands,
    g: usize,
    t0: usize,
    out: *mut f32,
    os: usize,
) {
    let (gb, qo) = super::x8_group(K);
    let nb = ops.cols / 32;
    let gw = ops.w.as_ptr().add(g * 8 * ops.wrb);
    let gs = 8 * ops.wrb;
    let ap = row_ptrs::<T>(ops.a.as_ptr(), t0, ops.arb);
    let ld2 = |p: *const u8| ld_pair(p, gs);
    let zero = _mm512_setzero_si512();
    let m4 = _mm512_set1_epi8(0x0F);
    let bit5 = _mm512_set1_epi8(0x10);
    // Q5_0: byte u of each 32-bit lane to all four of its bytes, as in
    // `tile_qx8`.
    let spread = |u: i8| per_word(|w| [u + w; 4]);
    let spreads = [spread(0), spread(1), spread(2), spread(3)];
    let sel_lo = _mm512_set1_epi32(0x0804_0201);
    let sel_hi = _mm512_set1_epi32(0x8040_2010u32 as i32);
    let mut facc = [[_mm512_setzero_ps(); 8]; T];
    for bg in 0..nb.div_ceil(8) {
        let n = (nb - 8 * bg).min(8);
        let gx = gw.add(bg * 8 * gb);
        prefetch_pair(gw, gs, bg * 8 * gb, n * gb);
        let mut ag = ap;
        for j in 0..T {
            ag[j] = ap[j].add(bg * 8 * 40);
        }
        for l in 0..n {
            let bx = gx.add(l * gb);
            let qh = if K == 2 { ld2(bx.add(16)) } else { zero };
            let mut s = [zero; T];
            let mut s2 = [zero; T];
            for u in 0..4 {
                let v = ld2(bx.add(qo + 32 * u));
                let mut lo = _mm512_and_si512(v, m4);
                let mut hi = _mm512_and_si512(_mm512_srli_epi16::<4>(v), m4);
                if K == 2 {
                    let x = _mm512_shuffle_epi8(qh, spreads[u]);
                    lo = _mm512_or_si512(
                        lo,
                        _mm512_maskz_mov_epi8(_mm512_test_epi8_mask(x, sel_lo), bit5),
                    );
                    hi = _mm512_or_si512(
                        hi,
                        _mm512_maskz_mov_epi8(_mm512_test_epi8_mask(x, sel_hi), bit5),
                    );
                }
                for j in 0..T {
                    let yw = ag[j].add(8 * n + 4 * l);
                    let word = |k: usize| {
                        _mm512_set1_epi32((yw.add(4 * n * k) as *const i32).read_unaligned())
                    };
                    s[j] = _mm512_dpbusd_epi32(s[j], lo, word(u));
                    s2[j] = _mm512_dpbusd_epi32(s2[j], hi, word(u + 4));
                }
            }
            let dx = f16_pair(bx, gs);
            let mx = if K == 1 {
                f16_pair(bx.add(16), gs)
            } else {
                _mm512_setzero_ps()
            };
            for j in 0..T {
                let isum = _mm512_add_epi32(s[j], s2[j]);
                let second = ag[j].add(4 * n + 4 * l);
                let dy = _mm512_set1_ps((ag[j].add(4 * l) as *const f32).read_unaligned());
                let term = if K == 1 {
                    // (dx * dy) * sumi + m * s, as `tile_qx8`.
                    let sy = _mm512_set1_ps((second as *const f32).read_unaligned());
                    let scaled = _mm512_mul_ps(_mm512_mul_ps(dx, dy), _mm512_cvtepi32_ps(isum));
                    _mm512_add_ps(scaled, _mm512_mul_ps(mx, sy))
                } else {
                    let sy = (second as *const i32).read_unaligned();
                    let isum = _mm512_sub_epi32(isum, _mm512_set1_epi32(x8_offset::<K>(sy)));
                    _mm512_mul_ps(_mm512_mul_ps(dx, dy), _mm512_cvtepi32_ps(isum))
                };
                facc[j][l] = _mm512_add_ps(facc[j][l], term);
            }
        }
    }
    // facc[j][l] lane r = token j's row r (of 16), lane l: transpose, reduce.
    for (j, fj) in facc.iter().enumerate() {
        let mut lanes = [[0f32; 16]; 8];
        for (l, f) in fj.iter().enumerate() {
            _mm512_storeu_ps(lanes[l].as_mut_ptr(), *f);
        }
        for r in 0..16 {
            let row: [f32; 8] = core::array::from_fn(|l| lanes[l][r]);
            *out.add((t0 + j) * os + 8 * g + r) = reduce8(&row);
        }
    }
}

/// The 32 bytes at `p` (group g) and at `p + gs` (group g + 1) as the low
/// and high halves of one vector: the x16 tiles' load.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
unsafe fn ld_pair(p: *const u8, gs: usize) -> __m512i {
    _mm512_inserti64x4::<1>(_mm512_castsi256_si512(ld(p)), ld(p.add(gs)))
}

/// Eight f16 at `p` (group g's rows) and eight at `p + gs` (group g + 1's)
/// as sixteen f32 lanes, exactly.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
unsafe fn f16_pair(p: *const u8, gs: usize) -> __m512 {
    let lo = _mm_loadu_si128(p as *const __m128i);
    let hi = _mm_loadu_si128(p.add(gs) as *const __m128i);
    _mm512_cvtph_ps(_mm256_inserti128_si256::<1>(_mm256_castsi128_si256(lo), hi))
}

/// A `vpshufb` control with the same pattern in every 128-bit lane (it
/// shuffles within lanes): the four bytes of the lane's 32-bit word w
/// (w = 0, 4, 8, 12: the word's first byte) are `f(w)`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
fn per_word(f: impl Fn(i8) -> [i8; 4]) -> __m512i {
    let mut b = [0i8; 16];
    for (w, dst) in b.chunks_exact_mut(4).enumerate() {
        dst.copy_from_slice(&f(4 * w as i8));
    }
    // SAFETY: `b` is 16 bytes, the unaligned load's size.
    _mm512_broadcast_i32x4(unsafe { _mm_loadu_si128(b.as_ptr() as *const __m128i) })
}
