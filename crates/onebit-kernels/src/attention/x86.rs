//! The x86 attention kernels: the fold of partials compiled with FMA, and
//! the AVX2 block kernel (scores four positions at a time on 256-bit
//! registers; at the AVX-512 level the weighted sums of values on 512-bit
//! ones). Each computes the scalar reference's fused operations in its
//! order (`super::scalar`), so every level gives the same bits.

use super::scalar::{finish_score, soft_cap, weights};
use super::{AttnShape, PART_HEAD, TILE_WIDE};
use crate::kv::{KvView, Q8_0_BLOCK};
use core::arch::x86_64::*;

// The fold: `super::scalar`'s [`combine`] and [`finish`] compiled with the
// FMA instruction, so that `exp_fast`'s fused multiply-adds are single
// instructions rather than library calls (the same operations, so the same
// bits).

/// # Safety
/// AVX2 and FMA are available.
#[target_feature(enable = "avx2,fma")]
pub unsafe fn combine(run: &mut [f32], b: &[f32]) {
    super::scalar::combine(run, b)
}

/// # Safety
/// AVX2 and FMA are available.
#[target_feature(enable = "avx2,fma")]
pub unsafe fn finish(run: &[f32], out: &mut [f32]) {
    super::scalar::finish(run, out)
}

/// Cache elements as the kernel reads them: one widened to f32, or
/// eight at a time.
pub trait Elems: Copy {
    fn len(&self) -> usize;
    fn get(&self, i: usize) -> f32;
    /// Elements i..i + 8 widened to f32, the same values as `get`.
    ///
    /// # Safety
    /// i + 8 <= len(); for q8_0, i is a multiple of 8 (so the eight
    /// share one block); AVX2 and F16C are available.
    unsafe fn load8(&self, i: usize) -> __m256;
    /// Elements i..i + 16 widened to f32, the same values as `get`.
    ///
    /// # Safety
    /// i + 16 <= len(); for q8_0, i is a multiple of 16 (so the sixteen
    /// share one block); AVX-512 F is available.
    unsafe fn load16(&self, i: usize) -> __m512;
    /// Elements i..i + 8 widened to f32 in both 256-bit halves (the same
    /// values as `get`).
    ///
    /// # Safety
    /// As `load8`, and AVX-512 F is available.
    unsafe fn load8x2(&self, i: usize) -> __m512;
    /// Asks the cache for the lines of elements i..i + n (a hint: any
    /// i, in bounds or not, is safe).
    fn prefetch(&self, i: usize, n: usize);
}

#[derive(Clone, Copy)]
pub struct F32s<'a>(pub &'a [f32]);
#[derive(Clone, Copy)]
pub struct F16s<'a>(pub &'a [u16]);
#[derive(Clone, Copy)]
pub struct Q8s<'a>(pub &'a [i8], pub &'a [u16]);

impl Elems for F32s<'_> {
    fn len(&self) -> usize {
        self.0.len()
    }
    #[inline(always)]
    fn prefetch(&self, i: usize, n: usize) {
        let mut e = 0;
        while e < n {
            // SAFETY: a prefetch never faults, whatever the address;
            // wrapping_add computes it without claiming it is in bounds.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(self.0.as_ptr().wrapping_add(i + e).cast()) };
            e += 16;
        }
    }
    #[inline(always)]
    fn get(&self, i: usize) -> f32 {
        self.0[i]
    }
    #[inline(always)]
    unsafe fn load8(&self, i: usize) -> __m256 {
        // SAFETY: i + 8 <= len (the caller's contract).
        unsafe { _mm256_loadu_ps(self.0.as_ptr().add(i)) }
    }
    #[inline(always)]
    unsafe fn load16(&self, i: usize) -> __m512 {
        // SAFETY: i + 16 <= len (the caller's contract).
        unsafe { _mm512_loadu_ps(self.0.as_ptr().add(i)) }
    }
    #[inline(always)]
    unsafe fn load8x2(&self, i: usize) -> __m512 {
        // SAFETY: i + 8 <= len (the caller's contract); AVX-512 F.
        unsafe {
            let x = _mm256_castps_pd(_mm256_loadu_ps(self.0.as_ptr().add(i)));
            _mm512_castpd_ps(_mm512_broadcast_f64x4(x))
        }
    }
}

impl Elems for F16s<'_> {
    fn len(&self) -> usize {
        self.0.len()
    }
    #[inline(always)]
    fn prefetch(&self, i: usize, n: usize) {
        let mut e = 0;
        while e < n {
            // SAFETY: a prefetch never faults, whatever the address;
            // wrapping_add computes it without claiming it is in bounds.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(self.0.as_ptr().wrapping_add(i + e).cast()) };
            e += 32;
        }
    }
    #[inline(always)]
    fn get(&self, i: usize) -> f32 {
        KvView::F16(self.0).get(i)
    }
    #[inline(always)]
    unsafe fn load8(&self, i: usize) -> __m256 {
        // SAFETY: i + 8 <= len, 16 bytes; F16C is available (the
        // caller's contract). vcvtph2ps widens exactly, as `get` does.
        unsafe { _mm256_cvtph_ps(_mm_loadu_si128(self.0.as_ptr().add(i).cast())) }
    }
    #[inline(always)]
    unsafe fn load16(&self, i: usize) -> __m512 {
        // SAFETY: i + 16 <= len, 32 bytes; AVX-512 F is available (the
        // caller's contract). vcvtph2ps widens exactly, as `get` does.
        unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(self.0.as_ptr().add(i).cast())) }
    }
    #[inline(always)]
    unsafe fn load8x2(&self, i: usize) -> __m512 {
        // SAFETY: i + 8 <= len, 16 bytes; AVX-512 F is available (the
        // caller's contract). vcvtph2ps widens exactly, as `get` does.
        unsafe {
            let h = _mm_loadu_si128(self.0.as_ptr().add(i).cast());
            _mm512_cvtph_ps(_mm256_broadcastsi128_si256(h))
        }
    }
}

impl Elems for Q8s<'_> {
    fn len(&self) -> usize {
        self.0.len().min(self.1.len() * Q8_0_BLOCK)
    }
    #[inline(always)]
    fn prefetch(&self, i: usize, n: usize) {
        let mut e = 0;
        while e < n {
            // SAFETY: a prefetch never faults, whatever the address;
            // wrapping_add computes it without claiming it is in bounds.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(self.0.as_ptr().wrapping_add(i + e).cast()) };
            e += 64;
        }
    }
    #[inline(always)]
    fn get(&self, i: usize) -> f32 {
        KvView::Q8_0 {
            q: self.0,
            d: self.1,
        }
        .get(i)
    }
    #[inline(always)]
    unsafe fn load8(&self, i: usize) -> __m256 {
        // SAFETY: i + 8 <= len, so 8 quant bytes and the scale i / 32
        // exist (len counts only elements whose scale is stored).
        unsafe {
            let q = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(
                self.0.as_ptr().add(i).cast(),
            )));
            let d = *self.1.get_unchecked(i / Q8_0_BLOCK);
            let d = _mm256_cvtph_ps(_mm_set1_epi16(d as i16));
            // d * q, exact (see crate::kv), as `get`.
            _mm256_mul_ps(d, q)
        }
    }
    #[inline(always)]
    unsafe fn load16(&self, i: usize) -> __m512 {
        // SAFETY: i + 16 <= len, so 16 quant bytes and the scale i / 32
        // exist; i is a multiple of 16, so all sixteen share that scale.
        unsafe {
            let q = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(
                self.0.as_ptr().add(i).cast(),
            )));
            let d = *self.1.get_unchecked(i / Q8_0_BLOCK);
            let d = _mm512_cvtph_ps(_mm256_set1_epi16(d as i16));
            // d * q, exact (see crate::kv), as `get`.
            _mm512_mul_ps(d, q)
        }
    }
    #[inline(always)]
    unsafe fn load8x2(&self, i: usize) -> __m512 {
        // SAFETY: i + 8 <= len, so 8 quant bytes and the scale i / 32
        // exist; i is a multiple of 8, so the eight share that scale.
        unsafe {
            let b = _mm_loadl_epi64(self.0.as_ptr().add(i).cast());
            let q = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_unpacklo_epi64(b, b)));
            let d = *self.1.get_unchecked(i / Q8_0_BLOCK);
            let d = _mm512_cvtph_ps(_mm256_set1_epi16(d as i16));
            // d * q, exact (see crate::kv), as `get`.
            _mm512_mul_ps(d, q)
        }
    }
}

/// A dot product's eight lanes with the tail elements added into lanes
/// 0.., reduced pairwise as `dot_scalar`.
#[target_feature(enable = "avx2,fma,f16c")]
fn reduce<E: Elems>(acc: __m256, q: &[f32], k: E, at: usize) -> f32 {
    let n8 = q.len() / 8 * 8;
    if n8 == q.len() {
        // reduce8 in registers: [l0+l4, l1+l5, l2+l6, l3+l7], then
        // [(l0+l4)+(l2+l6), (l1+l5)+(l3+l7)], then their sum.
        let s = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps::<1>(acc));
        let t = _mm_add_ps(s, _mm_movehl_ps(s, s));
        return _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)));
    }
    let mut lanes = [0f32; 8];
    // SAFETY: `lanes` has 8 elements.
    unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), acc) };
    for i in n8..q.len() {
        lanes[i - n8] = q[i].mul_add(k.get(at + i), lanes[i - n8]);
    }
    crate::quant::scalar::reduce8(&lanes)
}

/// `block_scalar` for the G query vectors in `q`, vector g over the
/// positions `ranges[g]`, K and V read through `k` and `v`: the same
/// operations in the same order per vector. The scores run over the union
/// of the ranges (a position outside a vector's range gets a score that
/// nothing reads); the weights and sums of each vector over its own range;
/// the weighted sums of values over the union, a vector's accumulators
/// left untouched at the positions outside its range. So every K and V
/// load serves all G vectors (heads of one KV head, of one row or of
/// several rows of a sequence), and each vector's partial is the bits it
/// has alone. `ahead` is how many elements of the K and V rows the passes
/// ask the cache for, per position, [`AHEAD`] positions on (0: none).
///
/// # Safety
/// AVX2, FMA and F16C are available, and AVX-512 F/BW/VL when `wide`.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn block<E: Elems, const G: usize>(
    shape: AttnShape,
    kvh: usize,
    q: &[f32],
    ranges: &[(usize, usize)],
    k: E,
    v: E,
    scale: f32,
    softcap: Option<f32>,
    wide: bool,
    ahead: (usize, usize),
    scores: &mut Vec<f32>,
    part: &mut [f32],
) {
    let (dk, dv) = (shape.head_dim_k, shape.head_dim_v);
    let krow = shape.n_head_kv * dk;
    let vrow = shape.n_head_kv * dv;
    let ph = PART_HEAD + dv;
    assert!(
        kvh < shape.n_head_kv && ranges.len() == G && ranges.iter().all(|&(f, t)| f < t),
        "attention block: spans"
    );
    let from = ranges.iter().map(|r| r.0).min().unwrap_or(0);
    let to = ranges.iter().map(|r| r.1).max().unwrap_or(0);
    assert!(
        q.len() == G * dk && part.len() == G * ph && (G <= 4 || wide),
        "attention block: q/part shape"
    );
    assert!(
        to * krow <= k.len() && to * vrow <= v.len(),
        "attention block: cache rows"
    );
    let len = to - from;
    // Vector g's positions, counted from `from`.
    let lo: [usize; G] = core::array::from_fn(|g| ranges[g].0 - from);
    let hi: [usize; G] = core::array::from_fn(|g| ranges[g].1 - from);
    let masked = lo.iter().zip(&hi).any(|(&l, &h)| l != 0 || h != len);
    let dk8 = dk / 8 * 8;
    // Past the scores: the queries in pairs when G > 4.
    let pairs = if G > 4 { G.div_ceil(2) * 2 * dk } else { 0 };
    scores.clear();
    scores.resize(G * len + pairs, 0.0);
    let (scores, qpair) = scores.split_at_mut(G * len);
    let k_at = |p: usize| p * krow + kvh * dk;

    // Scores: four positions at a time (at the AVX-512 level too: eight
    // at a time on 512-bit registers measured slower on Zen 4), then the
    // rest two at a time.
    let mut i = 0;
    if dk == dk8 {
        // SAFETY: every K row read, k_at(from + i) + dk <= to * krow, is
        // within `k` (checked above); dk is a multiple of 8, and k_at(p)
        // is for q8_0 (its head dims are multiples of 32); AVX2, FMA and
        // F16C are enabled here.
        i = unsafe {
            if G > 4 {
                // SAFETY: as above, and G > 4 only with `wide` (asserted):
                // AVX-512 F/BW/VL were detected.
                scores4_wide::<E, G>(
                    k,
                    q,
                    k_at(from),
                    krow,
                    dk,
                    len,
                    scale,
                    ahead.0,
                    scores,
                    qpair,
                )
            } else {
                scores4::<E, G>(k, q, k_at(from), krow, dk, len, scale, ahead.0, scores)
            }
        };
        if let Some(cap) = softcap {
            for g in 0..G {
                for s in &mut scores[g * len..g * len + i] {
                    *s = soft_cap(*s, cap);
                }
            }
        }
    }
    while i < len {
        let pair = i + 1 < len;
        let k0 = k_at(from + i);
        let k1 = if pair { k_at(from + i + 1) } else { k0 };
        let mut acc = [[_mm256_setzero_ps(); 2]; G];
        let mut j = 0;
        while j < dk8 {
            // SAFETY: k0 + j + 8 <= k0 + dk <= to * krow <= k.len(), the
            // same for k1; j is a multiple of 8 and so is k0 for q8_0
            // (its head dims are multiples of 32); g * dk + j + 8 <= G *
            // dk = q.len(). AVX2 and F16C are enabled here.
            unsafe {
                let a = k.load8(k0 + j);
                let b = k.load8(k1 + j);
                for (g, acc) in acc.iter_mut().enumerate() {
                    let qv = _mm256_loadu_ps(q.as_ptr().add(g * dk + j));
                    acc[0] = _mm256_fmadd_ps(qv, a, acc[0]);
                    acc[1] = _mm256_fmadd_ps(qv, b, acc[1]);
                }
            }
            j += 8;
        }
        for (g, acc) in acc.iter().enumerate() {
            let qg = &q[g * dk..(g + 1) * dk];
            scores[g * len + i] = finish_score(reduce(acc[0], qg, k, k0), scale, softcap);
            if pair {
                scores[g * len + i + 1] = finish_score(reduce(acc[1], qg, k, k1), scale, softcap);
            }
        }
        i += 2;
    }
    for g in 0..G {
        weights(
            &mut scores[g * len + lo[g]..g * len + hi[g]],
            &mut part[g * ph..g * ph + 2],
        );
    }

    // Weighted sums of values.
    let vs = Vals {
        v,
        scores: &scores[..],
        len,
        v0: from * vrow + kvh * dv,
        vrow,
        dv,
        ahead: ahead.1,
        lo,
        hi,
    };
    // SAFETY: the cache rows were checked above (every row v0 + i * vrow
    // + dv, i < len, is within `v`); v0 and vrow are multiples of 32 for
    // q8_0 (its head dims are); `wide` only with AVX-512 F/BW/VL (the
    // caller's contract); AVX2, FMA and F16C are enabled here.
    unsafe {
        match (masked, wide) {
            (false, true) => vs.run::<false, true>(part),
            (false, false) => vs.run::<false, false>(part),
            (true, true) => vs.run::<true, true>(part),
            (true, false) => vs.run::<true, false>(part),
        }
    }
}

/// The weighted-sum pass of [`block`]: G vectors' weights ([G][len], a
/// vector's weights at positions lo[g]..hi[g]) times the V rows from
/// element `v0` on, `vrow` apart.
struct Vals<'a, E, const G: usize> {
    v: E,
    scores: &'a [f32],
    len: usize,
    v0: usize,
    vrow: usize,
    dv: usize,
    ahead: usize,
    lo: [usize; G],
    hi: [usize; G],
}

impl<E: Elems, const G: usize> Vals<'_, E, G> {
    /// Whether vector g weighs position i (always, unless MASKED).
    #[inline(always)]
    fn on<const MASKED: bool>(&self, g: usize, i: usize) -> bool {
        !MASKED || (self.lo[g] <= i && i < self.hi[g])
    }

    /// Every column of `part` ([G][2 + dv]): on 512-bit registers when
    /// WIDE (64, then 16 columns of all G vectors at a time), then 16 and
    /// 8 columns on 256-bit ones, then one by one. Each element is its own
    /// chain of fused multiply-adds in position order from zero over the
    /// vector's positions.
    ///
    /// # Safety
    /// AVX2, FMA and F16C are available, and AVX-512 F/BW/VL when WIDE;
    /// every row v0 + i * vrow + dv, i < len, is within `v`; for q8_0, v0
    /// and vrow are multiples of 32; scores.len() == G * len.
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn run<const MASKED: bool, const WIDE: bool>(&self, part: &mut [f32]) {
        let (len, dv, vrow) = (self.len, self.dv, self.vrow);
        let ph = PART_HEAD + dv;
        let mut c = 0;
        if WIDE {
            // SAFETY: the caller's contract.
            c = unsafe { self.values512::<MASKED>(part) };
        }
        // SAFETY (each call): the columns c..c + 16 (c + 8) are within
        // dv; AVX2, FMA and F16C are enabled here; the rest is the
        // caller's contract.
        while c + 16 <= dv {
            unsafe { self.columns::<__m256, 2, MASKED>(part, c) };
            c += 16;
        }
        if c + 8 <= dv {
            unsafe { self.columns::<__m256, 1, MASKED>(part, c) };
            c += 8;
        }
        for c in c..dv {
            for g in 0..G {
                let mut acc = 0f32;
                for i in self.lo[g]..self.hi[g] {
                    acc = self.scores[g * len + i].mul_add(self.v.get(self.v0 + i * vrow + c), acc);
                }
                part[g * ph + PART_HEAD + c] = acc;
            }
        }
    }

    /// The 512-bit columns of [`Vals::run`]: 64 (more than four vectors:
    /// 32, their accumulators fill the registers), then 16 columns of all
    /// G vectors at a time; returns the first column left for the narrower
    /// loops.
    ///
    /// # Safety
    /// As [`Vals::run`] with WIDE.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
    unsafe fn values512<const MASKED: bool>(&self, part: &mut [f32]) -> usize {
        let dv = self.dv;
        let mut c = 0;
        // SAFETY (each call): the columns are within dv; AVX-512 F is
        // enabled here; the rest is the caller's contract.
        while G > 4 && c + 32 <= dv {
            unsafe { self.columns::<__m512, 2, MASKED>(part, c) };
            c += 32;
        }
        while G <= 4 && c + 64 <= dv {
            unsafe { self.columns::<__m512, 4, MASKED>(part, c) };
            c += 64;
        }
        while c + 16 <= dv {
            unsafe { self.columns::<__m512, 1, MASKED>(part, c) };
            c += 16;
        }
        c
    }

    /// Columns c..c + M * V::LANES of `part` for all G vectors: M registers
    /// of V per vector, each element a chain of fused multiply-adds in
    /// position order from zero. With more than one register per vector,
    /// the cache is asked for `ahead` elements from column 0 of the
    /// position [`AHEAD`] on (while c is 0).
    ///
    /// # Safety
    /// V's instructions are available (the caller's target features);
    /// c + M * V::LANES <= dv; every row v0 + i * vrow + dv, i < len, is
    /// within `v`; for q8_0, v0, vrow and c are multiples of V::LANES;
    /// scores.len() == G * len.
    #[inline(always)]
    unsafe fn columns<V: Lanes, const M: usize, const MASKED: bool>(
        &self,
        part: &mut [f32],
        c: usize,
    ) {
        let (v, len, vrow) = (self.v, self.len, self.vrow);
        let ph = PART_HEAD + self.dv;
        let sp = self.scores.as_ptr();
        // SAFETY: V's instructions are available (the caller's contract).
        let mut acc = [[unsafe { V::zero() }; M]; G];
        for i in 0..len {
            let at = self.v0 + i * vrow + c;
            if M > 1 && c == 0 {
                v.prefetch(at + AHEAD * vrow, self.ahead);
            }
            // SAFETY: at + M * LANES <= v0 + i * vrow + dv, within `v`
            // (the caller's contract); at + n * LANES is a multiple of
            // LANES for q8_0; g * len + i < G * len = scores.len().
            unsafe {
                let x: [V; M] = core::array::from_fn(|n| V::load(&v, at + n * V::LANES));
                for (g, acc) in acc.iter_mut().enumerate() {
                    if self.on::<MASKED>(g, i) {
                        let w = V::splat(*sp.add(g * len + i));
                        for (a, x) in acc.iter_mut().zip(x) {
                            *a = V::fmadd(w, x, *a);
                        }
                    }
                }
            }
        }
        for (g, acc) in acc.iter().enumerate() {
            let o = g * ph + PART_HEAD + c;
            for (n, a) in acc.iter().enumerate() {
                // SAFETY: o + LANES * (n + 1) <= g * ph + ph <= G * ph =
                // part.len().
                unsafe { a.store(part.as_mut_ptr().add(o + V::LANES * n)) };
            }
        }
    }
}

/// A register of f32 lanes the weighted sums of values run on: 256-bit
/// (AVX2 and FMA) or 512-bit (AVX-512 F).
///
/// # Safety
/// Every function needs its register's instructions: callers run where
/// they are available.
trait Lanes: Copy {
    const LANES: usize;
    unsafe fn zero() -> Self;
    unsafe fn splat(x: f32) -> Self;
    /// a * b + c, fused.
    unsafe fn fmadd(a: Self, b: Self, c: Self) -> Self;
    /// Cache elements i..i + LANES widened to f32 ([`Elems::load8`],
    /// [`Elems::load16`], with their contracts).
    unsafe fn load<E: Elems>(v: &E, i: usize) -> Self;
    /// Writes the lanes to p..p + LANES.
    unsafe fn store(self, p: *mut f32);
}

/// Implements [`Lanes`] for a register type with its intrinsics and its
/// [`Elems`] load.
macro_rules! lanes {
    ($t:ty, $n:literal, $zero:ident, $splat:ident, $fmadd:ident, $load:ident, $store:ident) => {
        impl Lanes for $t {
            const LANES: usize = $n;
            #[inline(always)]
            unsafe fn zero() -> Self {
                // SAFETY (each function): the register's instructions are
                // available (the trait's contract); loads and stores are
                // within their callers' bounds (their contracts).
                unsafe { $zero() }
            }
            #[inline(always)]
            unsafe fn splat(x: f32) -> Self {
                unsafe { $splat(x) }
            }
            #[inline(always)]
            unsafe fn fmadd(a: Self, b: Self, c: Self) -> Self {
                unsafe { $fmadd(a, b, c) }
            }
            #[inline(always)]
            unsafe fn load<E: Elems>(v: &E, i: usize) -> Self {
                unsafe { v.$load(i) }
            }
            #[inline(always)]
            unsafe fn store(self, p: *mut f32) {
                unsafe { $store(p, self) }
            }
        }
    };
}

lanes!(
    __m256,
    8,
    _mm256_setzero_ps,
    _mm256_set1_ps,
    _mm256_fmadd_ps,
    load8,
    _mm256_storeu_ps
);
lanes!(
    __m512,
    16,
    _mm512_setzero_ps,
    _mm512_set1_ps,
    _mm512_fmadd_ps,
    load16,
    _mm512_storeu_ps
);

/// The scaled dot products q·k of `block` (before the soft-cap) for the
/// first len / 4 * 4 positions, four at a time, into `scores` ([G][len]);
/// returns how many positions it did. Each position's eight lanes are
/// one register, every lane the same chain of fused multiply-adds as in
/// `dot_scalar`; the four positions' lanes are then reduced together by
/// shuffles in reduce8's pairing (((l0 + l4) + (l2 + l6)) + ((l1 + l5) +
/// (l3 + l7))), so each score is the same bits as
/// `finish_score(dot_scalar(..), scale, None)`. `k0` is the first
/// position's K head, `krow` the cache row width; the cache is asked for
/// `ahead` elements from the K head of the position [`AHEAD`] on.
///
/// # Safety
/// AVX2, FMA and F16C are available; dk is a multiple of 8 and q.len()
/// == G * dk; every row k0 + p * krow + dk, p < len, is within `k`; for
/// q8_0, k0 and krow are multiples of 32; scores.len() >= G * len.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn scores4<E: Elems, const G: usize>(
    k: E,
    q: &[f32],
    k0: usize,
    krow: usize,
    dk: usize,
    len: usize,
    scale: f32,
    ahead: usize,
    scores: &mut [f32],
) -> usize {
    let n = len / 4 * 4;
    let (qp, sp) = (q.as_ptr(), scores.as_mut_ptr());
    let scale = _mm_set1_ps(scale);
    let mut i = 0;
    while i < n {
        let row = |p: usize| k0 + (i + p) * krow;
        for p in AHEAD..AHEAD + 4 {
            k.prefetch(row(p), ahead);
        }
        let mut acc = [[_mm256_setzero_ps(); 4]; G];
        let mut j = 0;
        while j < dk {
            for t in 0..4 {
                // SAFETY: row(t) + j + 8 <= row(t) + dk, within `k` (the
                // caller's contract), j a multiple of 8; g * dk + j + 8
                // <= q.len().
                unsafe {
                    let x = k.load8(row(t) + j);
                    for (g, acc) in acc.iter_mut().enumerate() {
                        let qv = _mm256_loadu_ps(qp.add(g * dk + j));
                        acc[t] = _mm256_fmadd_ps(qv, x, acc[t]);
                    }
                }
            }
            j += 8;
        }
        for (g, &[a, b, c, d]) in acc.iter().enumerate() {
            let s = reduce4(a, b, c, d);
            // SAFETY: g * len + i + 4 <= G * len <= scores.len().
            unsafe { _mm_storeu_ps(sp.add(g * len + i), _mm_mul_ps(s, scale)) };
        }
        i += 4;
    }
    n
}

/// Four positions' dot products from their eight lanes each (`a` to `d`),
/// reduced together by shuffles in reduce8's pairing (((l0 + l4) + (l2 +
/// l6)) + ((l1 + l5) + (l3 + l7))): the same bits as four `reduce8`s.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn reduce4(a: __m256, b: __m256, c: __m256, d: __m256) -> __m128 {
    // Lane 0 of u: position 0's [l0 + l4, l1 + l5, l2 + l6, l3 + l7], lane
    // 1: position 1's (v: positions 2 and 3).
    let u = _mm256_add_ps(
        _mm256_permute2f128_ps::<0x20>(a, b),
        _mm256_permute2f128_ps::<0x31>(a, b),
    );
    let v = _mm256_add_ps(
        _mm256_permute2f128_ps::<0x20>(c, d),
        _mm256_permute2f128_ps::<0x31>(c, d),
    );
    // Lane 0: [(04) + (26), (15) + (37)] of position 0, then of 2; lane 1:
    // of positions 1 and 3.
    let w = _mm256_add_ps(
        _mm256_shuffle_ps::<0b01_00_01_00>(u, v),
        _mm256_shuffle_ps::<0b11_10_11_10>(u, v),
    );
    let s = _mm256_add_ps(
        _mm256_shuffle_ps::<0b10_00_10_00>(w, w),
        _mm256_shuffle_ps::<0b11_01_11_01>(w, w),
    );
    // 128-bit lane 0 now holds [p0, p2, ..] and lane 1 [p1, p3, ..]: lanes
    // 0, 4, 1, 5 are positions 0..4.
    let order = _mm256_setr_epi32(0, 4, 1, 5, 0, 4, 1, 5);
    _mm256_castps256_ps128(_mm256_permutevar8x32_ps(s, order))
}

/// [`scores4`] for 5 to [`TILE_WIDE`] query vectors on 512-bit registers:
/// two vectors per register (vector 2m in the low eight lanes, 2m + 1 in
/// the high), each K load widened into both halves, so one load serves all
/// G vectors. Each lane is the same chain of fused multiply-adds as in
/// `dot_scalar`; the halves are then split and reduced as in `scores4`, so
/// every score is the same bits. `qpair` is scratch.
///
/// # Safety
/// As [`scores4`], and AVX-512 F/BW/VL are available.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
unsafe fn scores4_wide<E: Elems, const G: usize>(
    k: E,
    q: &[f32],
    k0: usize,
    krow: usize,
    dk: usize,
    len: usize,
    scale: f32,
    ahead: usize,
    scores: &mut [f32],
    qpair: &mut [f32],
) -> usize {
    const PAIRS: usize = TILE_WIDE / 2;
    let h = G.div_ceil(2);
    assert!(G <= TILE_WIDE && q.len() == G * dk && qpair.len() == h * 2 * dk);
    // The queries in pairs: [pair][dk / 8][vector 2m's 8 | vector 2m + 1's
    // 8] (zeros for a missing odd one).
    qpair.fill(0.0);
    for (g, qg) in q.chunks_exact(dk).enumerate() {
        for (j, x) in qg.chunks_exact(8).enumerate() {
            let at = (g / 2) * 2 * dk + j * 16 + (g % 2) * 8;
            qpair[at..at + 8].copy_from_slice(x);
        }
    }
    let n = len / 4 * 4;
    let (qp, sp) = (qpair.as_ptr(), scores.as_mut_ptr());
    let scale = _mm_set1_ps(scale);
    let mut i = 0;
    while i < n {
        let row = |p: usize| k0 + (i + p) * krow;
        for p in AHEAD..AHEAD + 4 {
            k.prefetch(row(p), ahead);
        }
        let mut acc = [[_mm512_setzero_ps(); 4]; PAIRS];
        let mut j = 0;
        while j < dk {
            // SAFETY: row(t) + j + 8 <= row(t) + dk, within `k` (the
            // caller's contract), j a multiple of 8; m * 2 dk + 2 j + 16
            // <= h * 2 * dk = qpair.len().
            unsafe {
                let x = [
                    k.load8x2(row(0) + j),
                    k.load8x2(row(1) + j),
                    k.load8x2(row(2) + j),
                    k.load8x2(row(3) + j),
                ];
                for (m, acc) in acc.iter_mut().enumerate().take(h) {
                    let qv = _mm512_loadu_ps(qp.add(m * 2 * dk + 2 * j));
                    for (a, x) in acc.iter_mut().zip(x) {
                        *a = _mm512_fmadd_ps(qv, x, *a);
                    }
                }
            }
            j += 8;
        }
        for (m, acc) in acc.iter().enumerate().take(h) {
            let mut lo = [_mm256_setzero_ps(); 4];
            let mut hi = [_mm256_setzero_ps(); 4];
            for t in 0..4 {
                lo[t] = _mm512_castps512_ps256(acc[t]);
                hi[t] = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(acc[t])));
            }
            for (g, [a, b, c, d]) in [(2 * m, lo), (2 * m + 1, hi)] {
                if g < G {
                    let s = reduce4(a, b, c, d);
                    // SAFETY: g * len + i + 4 <= G * len <= scores.len().
                    unsafe { _mm_storeu_ps(sp.add(g * len + i), _mm_mul_ps(s, scale)) };
                }
            }
        }
        i += 4;
    }
    n
}

/// How many positions ahead the passes ask the cache for K and V rows
/// (16 to 128 measured alike at depth 4096).
const AHEAD: usize = 32;
