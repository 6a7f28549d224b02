//! Helpers every kernel family uses, instantiated once per level inside
//! [`simd_kernels!`] (horizontal sums, f16 and E8M0 loads, prefetch, lane masks,
//! writing a tile's outputs). Each is exact: integer sums are the exact
//! i32 sums, and float outputs go through `reduce8` as the scalar
//! reference reduces them.

macro_rules! x86_shared {
    ($feat:literal) => {
        /// The eight f32 scales 2^(e - 128) of eight E8M0 bytes at `p`
        /// (`onebit_formats::blocks::e8m0_half` per lane, exactly): e = 0, 1
        /// as the subnormals 0x00200000 << e, the rest (e - 1) << 23.
        #[target_feature(enable = $feat)]
        #[inline]
        unsafe fn e8m0_half8(p: *const u8) -> __m256 {
            let e = _mm256_cvtepu8_epi32(_mm_loadl_epi64(p as *const __m128i));
            let small = _mm256_sllv_epi32(_mm256_set1_epi32(0x0020_0000), e);
            let big = _mm256_slli_epi32::<23>(_mm256_sub_epi32(e, _mm256_set1_epi32(1)));
            let is_big = _mm256_cmpgt_epi32(e, _mm256_set1_epi32(1));
            _mm256_castsi256_ps(_mm256_blendv_epi8(small, big, is_big))
        }

        /// What the interleaved Q4_0 (K = 0) and Q5_0 (K = 2) blocks take
        /// off a block's integer sum for their codes' offset, given the
        /// activations' code sum `sy`: 8 x `sy` or 16 x (exact in i32:
        /// |sy| <= 32 x 128).
        #[inline]
        fn x8_offset<const K: u8>(sy: i32) -> i32 {
            if K == 2 {
                sy << 4
            } else {
                sy << 3
            }
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

        /// Reduces each accumulator's 8 lanes (as `reduce8`) into its output:
        /// eight accumulators at a time in registers ([`reduce8x8`]), any
        /// left over lane by lane.
        #[target_feature(enable = $feat)]
        #[inline]
        unsafe fn write_facc<const R: usize, const T: usize>(
            facc: &[[__m256; T]; R],
            r0: usize,
            t0: usize,
            out: *mut f32,
            os: usize,
        ) {
            let at = |k: usize| (t0 + k % T) * os + r0 + k / T;
            let whole = R * T / 8 * 8;
            for k0 in (0..whole).step_by(8) {
                let v: [__m256; 8] = core::array::from_fn(|m| facc[(k0 + m) / T][(k0 + m) % T]);
                let mut sums = [0f32; 8];
                _mm256_storeu_ps(sums.as_mut_ptr(), reduce8x8(v));
                // Lane l holds accumulator 2l (l < 4), 2(l - 4) + 1 (l >= 4).
                for (l, &x) in sums.iter().enumerate() {
                    let m = if l < 4 { 2 * l } else { 2 * (l - 4) + 1 };
                    *out.add(at(k0 + m)) = x;
                }
            }
            for k in whole..R * T {
                let mut lanes = [0f32; 8];
                _mm256_storeu_ps(lanes.as_mut_ptr(), facc[k / T][k % T]);
                *out.add(at(k)) = reduce8(&lanes);
            }
        }

        /// `reduce8` of eight vectors at once, each sum in `reduce8`'s order
        /// ((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7)): the halves
        /// added, then lanes two apart, then neighbours (`vhaddps` adds
        /// lane 0 and 1 of each pair; float addition is commutative, so the
        /// bits are `reduce8`'s). Lanes 0..4 of the result are v0, v2, v4,
        /// v6; lanes 4..8 are v1, v3, v5, v7.
        #[target_feature(enable = $feat)]
        #[inline]
        unsafe fn reduce8x8(v: [__m256; 8]) -> __m256 {
            let halves = |a: __m256, b: __m256| {
                _mm256_add_ps(
                    _mm256_permute2f128_ps::<0x20>(a, b),
                    _mm256_permute2f128_ps::<0x31>(a, b),
                )
            };
            let (t01, t23) = (halves(v[0], v[1]), halves(v[2], v[3]));
            let (t45, t67) = (halves(v[4], v[5]), halves(v[6], v[7]));
            let apart = |a: __m256, b: __m256| {
                _mm256_add_ps(
                    _mm256_shuffle_ps::<0b01_00_01_00>(a, b),
                    _mm256_shuffle_ps::<0b11_10_11_10>(a, b),
                )
            };
            _mm256_hadd_ps(apart(t01, t23), apart(t45, t67))
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
    };
}
