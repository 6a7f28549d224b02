//! Causal softmax attention of query rows over a KV cache of any
//! [`KvType`](crate::kv::KvType), blocked over the cache rows with a running
//! max (the online softmax of flash attention).
//!
//! A query's visible positions `from..to` are cut into blocks of [`BLOCK`]
//! positions counted from `from`. Per block and query head: the scores q·k
//! (8-lane fused multiply-add dot products over K widened to f32), scale,
//! optional soft-cap; their max m; weights e^(s - m) ([`exp_fast`]); their
//! sum l (four f64 lanes); and the unnormalised weighted sum of V rows (a
//! fused multiply-add per element, position by position from zero). The
//! blocks' partials (m, l, acc) are then folded in block order: m' = max(m,
//! m_b), l = l e^(m - m') + l_b e^(m_b - m'), acc likewise (plain products
//! and sums); the output is acc / l.
//!
//! A query's result depends only on that query and the cache rows it reads:
//! the same operations run for it whether it is attended alone or in a
//! batch, with the heads of its KV group together or apart, with its blocks
//! on one thread or spread over all of them. The AVX2 path computes the same
//! fused operations in the same order as the scalar reference, so the two
//! give the same bits; the query heads sharing a KV head run together there,
//! so each K and V load serves all of them. The scores run four positions
//! at a time, one 256-bit register of eight lanes per position (the same
//! per-lane chains as the reference), the four positions' lanes then reduced
//! together by shuffles in the pairing of the scalar reduction. At the
//! AVX-512 level the weighted sums of values run on 512-bit registers (64
//! columns of every head in one pass over the block's V rows); each element
//! is still its own chain of fused multiply-adds in position order, so the
//! bits are the same. (Scores eight positions at a time on 512-bit
//! registers, two positions per register, measured a fifth slower than the
//! four 256-bit ones on Zen 4, so both levels run the latter.) Both passes
//! ask the cache for the rows 32 positions ahead.

use crate::isa::Isa;
use crate::kv::KvView;
use crate::ops::{exp_fast, exp_sub, sum4_f64};
use crate::pool::Pool;

/// Shapes of one attention layer.
#[derive(Clone, Copy, Debug)]
pub struct AttnShape {
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim_k: usize,
    pub head_dim_v: usize,
}

/// Cache positions per block of the running softmax.
pub const BLOCK: usize = 128;

/// A head's partial result: [max score, sum of weights, head_dim_v sums].
const PART_HEAD: usize = 2;

/// Query heads run together at most (their accumulators fill the registers).
const MAX_GROUP: usize = 4;

/// Fused dot product: element i into lane i % 8 with `mul_add`, lanes
/// reduced pairwise as [`crate::quant::scalar::reduce8`].
fn dot_scalar(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        acc[i % 8] = x.mul_add(*y, acc[i % 8]);
    }
    crate::quant::scalar::reduce8(&acc)
}

fn axpy_scalar(o: &mut [f32], w: f32, v: &[f32]) {
    for (o, v) in o.iter_mut().zip(v) {
        *o = w.mul_add(*v, *o);
    }
}

/// A score from its dot product: scale, then the soft-cap.
#[inline]
fn finish_score(dot: f32, scale: f32, softcap: Option<f32>) -> f32 {
    let s = dot * scale;
    match softcap {
        Some(cap) => soft_cap(s, cap),
        None => s,
    }
}

/// The soft-cap of a scaled score: cap tanh(s / cap).
#[inline]
fn soft_cap(s: f32, cap: f32) -> f32 {
    cap * (s / cap).tanh()
}

/// Per head of a block: the max of its scores, the scores replaced by their
/// weights e^(s - max), and the weights' sum; writes max and sum to `part`.
/// (Used by the x86 kernels only.)
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
#[inline(always)]
fn weights(scores: &mut [f32], part: &mut [f32]) {
    let m = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    exp_sub(scores, m);
    part[0] = m;
    part[1] = sum4_f64(scores, |v| v as f64) as f32;
}

/// Scalar reference of one block: the query heads in `q` ([G][dk]), all
/// reading KV head `kvh`, over positions `from..to` (not empty); writes
/// `part` ([G][2 + dv]).
#[allow(clippy::too_many_arguments)]
fn block_scalar(
    shape: AttnShape,
    kvh: usize,
    q: &[f32],
    k: KvView,
    v: KvView,
    from: usize,
    to: usize,
    scale: f32,
    softcap: Option<f32>,
    scores: &mut Vec<f32>,
    part: &mut [f32],
) {
    let (dk, dv) = (shape.head_dim_k, shape.head_dim_v);
    let krow = shape.n_head_kv * dk;
    let vrow = shape.n_head_kv * dv;
    let len = to - from;
    scores.clear();
    scores.resize(len + dk.max(dv), 0.0);
    let (sc, row) = scores.split_at_mut(len);
    for (qg, pg) in q
        .chunks_exact(dk)
        .zip(part.chunks_exact_mut(PART_HEAD + dv))
    {
        for (i, s) in sc.iter_mut().enumerate() {
            let at = (from + i) * krow + kvh * dk;
            for (c, x) in row[..dk].iter_mut().enumerate() {
                *x = k.get(at + c);
            }
            *s = finish_score(dot_scalar(qg, &row[..dk]), scale, softcap);
        }
        let m = sc.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        for s in sc.iter_mut() {
            *s = exp_fast(*s - m);
        }
        pg[0] = m;
        pg[1] = sum4_f64(sc, |x| x as f64) as f32;
        let acc = &mut pg[PART_HEAD..];
        acc.fill(0.0);
        for (i, &w) in sc.iter().enumerate() {
            let at = (from + i) * vrow + kvh * dv;
            for (c, x) in row[..dv].iter_mut().enumerate() {
                *x = v.get(at + c);
            }
            axpy_scalar(acc, w, &row[..dv]);
        }
    }
}

/// Folds a later block's partial `b` into the running partial `run` (one head).
#[inline(always)]
fn combine(run: &mut [f32], b: &[f32]) {
    let m = run[0].max(b[0]);
    let (sa, sb) = (exp_fast(run[0] - m), exp_fast(b[0] - m));
    run[0] = m;
    run[1] = run[1] * sa + b[1] * sb;
    for (r, x) in run[PART_HEAD..].iter_mut().zip(&b[PART_HEAD..]) {
        *r = *r * sa + *x * sb;
    }
}

/// The output of a head from its folded partial.
#[inline(always)]
fn finish(run: &[f32], out: &mut [f32]) {
    let inv = 1.0 / run[1];
    for (o, x) in out.iter_mut().zip(&run[PART_HEAD..]) {
        *o = *x * inv;
    }
}

/// [`combine`] and [`finish`] compiled with the FMA instruction, so that
/// `exp_fast`'s fused multiply-adds are single instructions rather than
/// library calls (the same operations, so the same bits).
#[cfg(target_arch = "x86_64")]
mod fold_fma {
    /// # Safety
    /// AVX2 and FMA are available.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn combine(run: &mut [f32], b: &[f32]) {
        super::combine(run, b)
    }

    /// # Safety
    /// AVX2 and FMA are available.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn finish(run: &[f32], out: &mut [f32]) {
        super::finish(run, out)
    }
}

/// [`combine`] or [`finish`] on the chosen path.
#[derive(Clone, Copy)]
struct Fold {
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    simd: bool,
}

impl Fold {
    #[inline]
    fn combine(self, run: &mut [f32], b: &[f32]) {
        #[cfg(target_arch = "x86_64")]
        if self.simd {
            // SAFETY: `simd` is set only when level() >= Avx2 (AVX2 and FMA
            // detected).
            return unsafe { fold_fma::combine(run, b) };
        }
        combine(run, b)
    }

    #[inline]
    fn finish(self, run: &[f32], out: &mut [f32]) {
        #[cfg(target_arch = "x86_64")]
        if self.simd {
            // SAFETY: as in `combine`.
            return unsafe { fold_fma::finish(run, out) };
        }
        finish(run, out)
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::{finish_score, soft_cap, weights, AttnShape, PART_HEAD};
    use crate::kv::{KvView, Q8_0_BLOCK};
    use core::arch::x86_64::*;

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

    /// `block_scalar` for the G query heads in `q`, K and V read through
    /// `k` and `v`: the same operations in the same order per head. A K row
    /// pair gives 2G independent accumulator chains; each V load serves all
    /// G heads.
    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub fn block<E: Elems, const G: usize>(
        shape: AttnShape,
        kvh: usize,
        q: &[f32],
        k: E,
        v: E,
        from: usize,
        to: usize,
        scale: f32,
        softcap: Option<f32>,
        wide: bool,
        scores: &mut Vec<f32>,
        part: &mut [f32],
    ) {
        let (dk, dv) = (shape.head_dim_k, shape.head_dim_v);
        let krow = shape.n_head_kv * dk;
        let vrow = shape.n_head_kv * dv;
        let ph = PART_HEAD + dv;
        assert!(kvh < shape.n_head_kv && from < to, "attention block: span");
        assert!(
            q.len() == G * dk && part.len() == G * ph,
            "attention block: q/part shape"
        );
        assert!(
            to * krow <= k.len() && to * vrow <= v.len(),
            "attention block: cache rows"
        );
        let len = to - from;
        let dk8 = dk / 8 * 8;
        scores.clear();
        scores.resize(G * len, 0.0);
        let k_at = |p: usize| p * krow + kvh * dk;

        // What the passes ask the cache for ahead of each row: the whole
        // cache row for the first KV head (the next KV heads of the block,
        // read next, find their part there), else the head's part.
        let (ahead, ahead_v) = if kvh == 0 { (krow, vrow) } else { (dk, dv) };
        // Scores: four positions at a time (at the AVX-512 level too: eight
        // at a time on 512-bit registers measured slower on Zen 4), then the
        // rest two at a time.
        let mut i = 0;
        if dk == dk8 {
            // SAFETY: every K row read, k_at(from + i) + dk <= to * krow, is
            // within `k` (checked above); dk is a multiple of 8, and k_at(p)
            // is for q8_0 (its head dims are multiples of 32); AVX2, FMA and
            // F16C are enabled here.
            i = unsafe { scores4::<E, G>(k, q, k_at(from), krow, dk, len, scale, ahead, scores) };
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
                    scores[g * len + i + 1] =
                        finish_score(reduce(acc[1], qg, k, k1), scale, softcap);
                }
            }
            i += 2;
        }
        for g in 0..G {
            weights(
                &mut scores[g * len..(g + 1) * len],
                &mut part[g * ph..g * ph + 2],
            );
        }

        // Weighted sums of values, 16 then 8 columns of all G heads at a
        // time, then the remaining columns one by one.
        let sp = scores.as_ptr();
        let v_at = |p: usize, c: usize| p * vrow + kvh * dv + c;
        let mut c = 0;
        if wide {
            // SAFETY: `wide` is set only when AVX-512 F/BW/VL was detected;
            // the cache rows were checked above.
            c = unsafe {
                values512::<E, G>(
                    v,
                    &scores[..G * len],
                    len,
                    v_at(from, 0),
                    vrow,
                    dv,
                    ahead_v,
                    part,
                )
            };
        }
        while c + 16 <= dv {
            let mut acc = [[_mm256_setzero_ps(); 2]; G];
            for i in 0..len {
                let at = v_at(from + i, c);
                if c == 0 {
                    v.prefetch(at + AHEAD * vrow, ahead_v);
                }
                // SAFETY: at + 16 <= (from + i) * vrow + kvh * dv + dv <= to
                // * vrow <= v.len(); at is a multiple of 8 for q8_0 (head
                // dims multiples of 32); g * len + i < G * len = scores.len().
                unsafe {
                    let v0 = v.load8(at);
                    let v1 = v.load8(at + 8);
                    for (g, acc) in acc.iter_mut().enumerate() {
                        let w = _mm256_set1_ps(*sp.add(g * len + i));
                        acc[0] = _mm256_fmadd_ps(w, v0, acc[0]);
                        acc[1] = _mm256_fmadd_ps(w, v1, acc[1]);
                    }
                }
            }
            for (g, acc) in acc.iter().enumerate() {
                let o = g * ph + PART_HEAD + c;
                // SAFETY: o + 16 <= g * ph + ph <= G * ph = part.len().
                unsafe {
                    _mm256_storeu_ps(part.as_mut_ptr().add(o), acc[0]);
                    _mm256_storeu_ps(part.as_mut_ptr().add(o + 8), acc[1]);
                }
            }
            c += 16;
        }
        if c + 8 <= dv {
            let mut acc = [_mm256_setzero_ps(); G];
            for i in 0..len {
                // SAFETY: as above, for columns c..c + 8 <= dv.
                unsafe {
                    let v0 = v.load8(v_at(from + i, c));
                    for (g, acc) in acc.iter_mut().enumerate() {
                        let w = _mm256_set1_ps(*sp.add(g * len + i));
                        *acc = _mm256_fmadd_ps(w, v0, *acc);
                    }
                }
            }
            for (g, acc) in acc.iter().enumerate() {
                // SAFETY: g * ph + 2 + c + 8 <= G * ph = part.len().
                unsafe { _mm256_storeu_ps(part.as_mut_ptr().add(g * ph + PART_HEAD + c), *acc) };
            }
            c += 8;
        }
        for c in c..dv {
            for g in 0..G {
                let mut acc = 0f32;
                for i in 0..len {
                    acc = scores[g * len + i].mul_add(v.get(v_at(from + i, c)), acc);
                }
                part[g * ph + PART_HEAD + c] = acc;
            }
        }
    }

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
        // After the last step, 128-bit lane 0 holds [p0, p2, ..] and lane 1
        // [p1, p3, ..]: lanes 0, 4, 1, 5 are positions 0..4.
        let order = _mm256_setr_epi32(0, 4, 1, 5, 0, 4, 1, 5);
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
                // Lane 0 of u: position 0's [l0 + l4, l1 + l5, l2 + l6, l3 +
                // l7], lane 1: position 1's (v: positions 2 and 3).
                let u = _mm256_add_ps(
                    _mm256_permute2f128_ps::<0x20>(a, b),
                    _mm256_permute2f128_ps::<0x31>(a, b),
                );
                let v = _mm256_add_ps(
                    _mm256_permute2f128_ps::<0x20>(c, d),
                    _mm256_permute2f128_ps::<0x31>(c, d),
                );
                // Lane 0: [(04) + (26), (15) + (37)] of position 0, then of
                // 2; lane 1: of positions 1 and 3.
                let w = _mm256_add_ps(
                    _mm256_shuffle_ps::<0b01_00_01_00>(u, v),
                    _mm256_shuffle_ps::<0b11_10_11_10>(u, v),
                );
                let s = _mm256_add_ps(
                    _mm256_shuffle_ps::<0b10_00_10_00>(w, w),
                    _mm256_shuffle_ps::<0b11_01_11_01>(w, w),
                );
                let s = _mm256_castps256_ps128(_mm256_permutevar8x32_ps(s, order));
                // SAFETY: g * len + i + 4 <= G * len <= scores.len().
                unsafe { _mm_storeu_ps(sp.add(g * len + i), _mm_mul_ps(s, scale)) };
            }
            i += 4;
        }
        n
    }

    /// How many positions ahead the passes ask the cache for K and V rows
    /// (16 to 128 measured alike at depth 4096).
    const AHEAD: usize = 32;

    /// The weighted sums of values of `block` on 512-bit registers: 64, then
    /// 16 columns of all G heads at a time, each element the same fused
    /// multiply-adds in the same position order; returns the first column
    /// left for the narrower loops. `v0` is the first position's column 0,
    /// `vrow` the cache row width; the cache is asked for `ahead` elements
    /// from column 0 of the position [`AHEAD`] on.
    ///
    /// # Safety
    /// AVX-512 F is available; every row v0 + i * vrow + dv, i < len, is
    /// within `v`; for q8_0, v0 and vrow are multiples of 32.
    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
    unsafe fn values512<E: Elems, const G: usize>(
        v: E,
        scores: &[f32],
        len: usize,
        v0: usize,
        vrow: usize,
        dv: usize,
        ahead: usize,
        part: &mut [f32],
    ) -> usize {
        let ph = PART_HEAD + dv;
        let sp = scores.as_ptr();
        let mut c = 0;
        while c + 64 <= dv {
            let mut acc = [[_mm512_setzero_ps(); 4]; G];
            for i in 0..len {
                let at = v0 + i * vrow + c;
                if c == 0 {
                    v.prefetch(at + AHEAD * vrow, ahead);
                }
                // SAFETY: at + 64 <= v0 + i * vrow + dv, within `v` (the
                // caller's contract); at is a multiple of 16 for q8_0; g *
                // len + i < G * len = scores.len().
                unsafe {
                    let x = [
                        v.load16(at),
                        v.load16(at + 16),
                        v.load16(at + 32),
                        v.load16(at + 48),
                    ];
                    for (g, acc) in acc.iter_mut().enumerate() {
                        let w = _mm512_set1_ps(*sp.add(g * len + i));
                        for (a, x) in acc.iter_mut().zip(x) {
                            *a = _mm512_fmadd_ps(w, x, *a);
                        }
                    }
                }
            }
            for (g, acc) in acc.iter().enumerate() {
                let o = g * ph + PART_HEAD + c;
                for (n, a) in acc.iter().enumerate() {
                    // SAFETY: o + 16 n + 16 <= g * ph + ph <= part.len().
                    unsafe { _mm512_storeu_ps(part.as_mut_ptr().add(o + 16 * n), *a) };
                }
            }
            c += 64;
        }
        while c + 16 <= dv {
            let mut acc = [_mm512_setzero_ps(); G];
            for i in 0..len {
                // SAFETY: as above, for columns c..c + 16 <= dv.
                unsafe {
                    let x = v.load16(v0 + i * vrow + c);
                    for (g, acc) in acc.iter_mut().enumerate() {
                        let w = _mm512_set1_ps(*sp.add(g * len + i));
                        *acc = _mm512_fmadd_ps(w, x, *acc);
                    }
                }
            }
            for (g, acc) in acc.iter().enumerate() {
                // SAFETY: g * ph + 2 + c + 16 <= G * ph = part.len().
                unsafe { _mm512_storeu_ps(part.as_mut_ptr().add(g * ph + PART_HEAD + c), *acc) };
            }
            c += 16;
        }
        c
    }
}

/// The level the attention kernels run at: [`Isa::best`] (so `ONEBIT_ISA`
/// forces them like every kernel), capped at the highest level with code
/// here (AVX-512 on x86-64; other architectures run the scalar reference).
pub fn level() -> Isa {
    #[cfg(target_arch = "x86_64")]
    {
        Isa::best().min(Isa::Avx512)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        Isa::Scalar
    }
}

/// One block on the chosen path; `q` holds 1..=4 heads.
#[allow(clippy::too_many_arguments)]
fn run_block(
    simd: bool,
    wide: bool,
    shape: AttnShape,
    kvh: usize,
    q: &[f32],
    k: KvView,
    v: KvView,
    from: usize,
    to: usize,
    scale: f32,
    softcap: Option<f32>,
    scores: &mut Vec<f32>,
    part: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    if simd {
        use avx2::{block, Elems, F16s, F32s, Q8s};
        /// # Safety
        /// AVX2, FMA and F16C must be available.
        #[allow(clippy::too_many_arguments)]
        unsafe fn by_group<E: Elems>(
            shape: AttnShape,
            kvh: usize,
            q: &[f32],
            k: E,
            v: E,
            from: usize,
            to: usize,
            scale: f32,
            softcap: Option<f32>,
            wide: bool,
            scores: &mut Vec<f32>,
            part: &mut [f32],
        ) {
            let a = (shape, kvh, q, k, v, from, to, scale, softcap);
            // SAFETY (each call): the caller guarantees the features.
            unsafe {
                match q.len() / shape.head_dim_k {
                    4 => block::<E, 4>(
                        a.0, a.1, a.2, a.3, a.4, a.5, a.6, a.7, a.8, wide, scores, part,
                    ),
                    3 => block::<E, 3>(
                        a.0, a.1, a.2, a.3, a.4, a.5, a.6, a.7, a.8, wide, scores, part,
                    ),
                    2 => block::<E, 2>(
                        a.0, a.1, a.2, a.3, a.4, a.5, a.6, a.7, a.8, wide, scores, part,
                    ),
                    _ => block::<E, 1>(
                        a.0, a.1, a.2, a.3, a.4, a.5, a.6, a.7, a.8, wide, scores, part,
                    ),
                }
            }
        }
        let a = (shape, kvh, q, from, to, scale, softcap);
        // SAFETY (each call): `simd` is true only when level() >= Avx2, which
        // means AVX2, FMA and F16C were detected.
        unsafe {
            match (k, v) {
                (KvView::F32(k), KvView::F32(v)) => {
                    let (k, v) = (F32s(k), F32s(v));
                    return by_group(a.0, a.1, a.2, k, v, a.3, a.4, a.5, a.6, wide, scores, part);
                }
                (KvView::F16(k), KvView::F16(v)) => {
                    let (k, v) = (F16s(k), F16s(v));
                    return by_group(a.0, a.1, a.2, k, v, a.3, a.4, a.5, a.6, wide, scores, part);
                }
                (KvView::Q8_0 { q: kq, d: kd }, KvView::Q8_0 { q: vq, d: vd }) => {
                    let (k, v) = (Q8s(kq, kd), Q8s(vq, vd));
                    return by_group(a.0, a.1, a.2, k, v, a.3, a.4, a.5, a.6, wide, scores, part);
                }
                // K and V of different types: the scalar reference.
                _ => {}
            }
        }
    }
    let _ = (simd, wide);
    block_scalar(shape, kvh, q, k, v, from, to, scale, softcap, scores, part)
}

/// A pointer to a buffer several threads write disjoint parts of.
#[derive(Clone, Copy)]
struct SharedMut(*mut f32);
// SAFETY: every user writes only the elements of its own work item, which
// no other item reads or writes while the parallel call runs; the buffer
// outlives the call.
unsafe impl Send for SharedMut {}
unsafe impl Sync for SharedMut {}

impl SharedMut {
    /// # Safety
    /// `at + len` is within the buffer and no other thread touches that range
    /// while the slice lives.
    #[allow(clippy::mut_from_ref)]
    unsafe fn slice(&self, at: usize, len: usize) -> &mut [f32] {
        // SAFETY: the caller's contract.
        unsafe { std::slice::from_raw_parts_mut(self.0.add(at), len) }
    }
}

/// The `g`-head groups of query heads of KV head `kvh`: (first head, count).
fn head_groups(shape: AttnShape, kvh: usize, g: usize) -> impl Iterator<Item = (usize, usize)> {
    let group = shape.n_head / shape.n_head_kv;
    let end = (kvh + 1) * group;
    (kvh * group..end)
        .step_by(g)
        .map(move |h| (h, g.min(end - h)))
}

/// Attention for `spans.len()` query rows. `q` is [rows][n_head *
/// head_dim_k]; row i sees cache positions `spans[i].0..spans[i].1` (its own
/// position is `spans[i].1 - 1`); the cache rows of `k` are [n_head_kv *
/// head_dim_k] per position, of `v` likewise. Query head h reads KV head h /
/// (n_head / n_head_kv). Writes `out`, [rows][n_head * head_dim_v]. Each
/// row's result is the same bits whatever the other rows and the threads.
///
/// With many rows (prefill) the work items are (row, KV head) pairs, each
/// folding its blocks as it goes; with few (decode), the blocks themselves
/// are the items, so one query at a long context uses every thread, and
/// their partials are folded afterwards in the same order.
#[allow(clippy::too_many_arguments)]
pub fn attend_rows(
    pool: &Pool,
    shape: AttnShape,
    q: &[f32],
    spans: &[(usize, usize)],
    k: KvView,
    v: KvView,
    scale: f32,
    softcap: Option<f32>,
    out: &mut [f32],
) {
    let (nh, nkv, dk, dv) = (
        shape.n_head,
        shape.n_head_kv,
        shape.head_dim_k,
        shape.head_dim_v,
    );
    let rows = spans.len();
    assert!(
        nkv > 0 && nh.is_multiple_of(nkv),
        "attend_rows: {nh} query heads over {nkv} KV heads"
    );
    assert_eq!(q.len(), rows * nh * dk, "attend_rows: q shape");
    assert_eq!(out.len(), rows * nh * dv, "attend_rows: out shape");
    #[cfg(target_arch = "x86_64")]
    let (simd, wide) = (level() >= Isa::Avx2, level() >= Isa::Avx512);
    #[cfg(not(target_arch = "x86_64"))]
    let (simd, wide) = (false, false);
    let ph = PART_HEAD + dv;
    let fold = Fold { simd };
    let threads = pool.threads();
    let dst = SharedMut(out.as_mut_ptr());
    let n_blocks = |(from, to): (usize, usize)| to.saturating_sub(from).div_ceil(BLOCK);
    let block_span =
        |(from, to): (usize, usize), b: usize| (from + b * BLOCK, (from + (b + 1) * BLOCK).min(to));

    if rows * nkv >= 2 * threads {
        let items = rows * nkv;
        // Work per item grows with its span; aim for ~8 chunks per thread.
        let per = items.div_ceil(threads * 8).max(1);
        pool.for_each_chunk(items.div_ceil(per), |c| {
            let mut scores = Vec::new();
            let mut run = vec![0f32; MAX_GROUP * ph];
            let mut part = vec![0f32; MAX_GROUP * ph];
            for it in c * per..((c + 1) * per).min(items) {
                let (r, kvh) = (it / nkv, it % nkv);
                for (h, g) in head_groups(shape, kvh, MAX_GROUP) {
                    let at = r * nh + h;
                    let qs = &q[at * dk..(at + g) * dk];
                    // SAFETY: at + g <= (r + 1) * nh, inside `out` (rows * nh
                    // * dv, checked above); each (row, KV head) item is
                    // claimed by one participant and writes only its heads.
                    let os = unsafe { dst.slice(at * dv, g * dv) };
                    let nb = n_blocks(spans[r]);
                    if nb == 0 {
                        os.fill(0.0);
                        continue;
                    }
                    let (run, part) = (&mut run[..g * ph], &mut part[..g * ph]);
                    for b in 0..nb {
                        let (f, t) = block_span(spans[r], b);
                        let dstp = if b == 0 { &mut *run } else { &mut *part };
                        run_block(
                            simd,
                            wide,
                            shape,
                            kvh,
                            qs,
                            k,
                            v,
                            f,
                            t,
                            scale,
                            softcap,
                            &mut scores,
                            dstp,
                        );
                        if b > 0 {
                            for (rh, bh) in run.chunks_exact_mut(ph).zip(part.chunks_exact(ph)) {
                                fold.combine(rh, bh);
                            }
                        }
                    }
                    for (rh, oh) in run.chunks_exact(ph).zip(os.chunks_exact_mut(dv)) {
                        fold.finish(rh, oh);
                    }
                }
            }
        });
        return;
    }

    // Few rows: every (row, block, head group) is an item with its own
    // partial. Heads go one by one when groups of four leave threads idle.
    // The items run block by block, all KV heads of a block together, so a
    // chunk of items reads whole cache rows one after another (the KV heads
    // of a position sit side by side) rather than a strided slice of each.
    let total_blocks: usize = spans.iter().map(|&s| n_blocks(s)).sum();
    let gsize = if total_blocks * nkv >= 2 * threads {
        MAX_GROUP
    } else {
        1
    };
    // (kv head, first head, heads) of every head group, KV head order.
    let groups: Vec<(usize, usize, usize)> = (0..nkv)
        .flat_map(|kvh| head_groups(shape, kvh, gsize).map(move |(h, g)| (kvh, h, g)))
        .collect();
    let ng = groups.len();
    // Partials lie [row][group][block], so each head group's blocks are
    // consecutive for the fold; `starts[r * ng + gi]` is where they begin.
    let mut starts = Vec::with_capacity(rows * ng);
    // (row, group, block, partial offset), in run order [row][block][group].
    let mut tasks = Vec::with_capacity(total_blocks * ng);
    let mut len = 0;
    for (r, &span) in spans.iter().enumerate() {
        let nb = n_blocks(span);
        for &(_, _, g) in &groups {
            starts.push(len);
            len += nb * g * ph;
        }
        for b in 0..nb {
            for (gi, &(_, _, g)) in groups.iter().enumerate() {
                tasks.push((r, gi, b, starts[r * ng + gi] + b * g * ph));
            }
        }
    }
    let mut parts = vec![0f32; len];
    let pp = SharedMut(parts.as_mut_ptr());
    let per = tasks.len().div_ceil(threads * 4).max(1);
    pool.for_each_chunk(tasks.len().div_ceil(per), |c| {
        let mut scores = Vec::new();
        for &(r, gi, b, off) in &tasks[c * per..((c + 1) * per).min(tasks.len())] {
            let (kvh, h, g) = groups[gi];
            let at = r * nh + h;
            let (f, t) = block_span(spans[r], b);
            // SAFETY: tasks own disjoint ranges off..off + g * ph of `parts`
            // (laid out one after another above); each task is claimed once.
            let part = unsafe { pp.slice(off, g * ph) };
            let qs = &q[at * dk..(at + g) * dk];
            run_block(
                simd,
                wide,
                shape,
                kvh,
                qs,
                k,
                v,
                f,
                t,
                scale,
                softcap,
                &mut scores,
                part,
            );
        }
    });
    // Fold each head group's blocks in order, block 0 first.
    out.fill(0.0);
    let mut run = vec![0f32; MAX_GROUP * ph];
    for (r, &span) in spans.iter().enumerate() {
        let nb = n_blocks(span);
        if nb == 0 {
            continue;
        }
        for (gi, &(_, h, g)) in groups.iter().enumerate() {
            let gp = g * ph;
            let first = starts[r * ng + gi];
            let run = &mut run[..gp];
            run.copy_from_slice(&parts[first..first + gp]);
            for b in 1..nb {
                let o = first + b * gp;
                for (rh, bh) in run
                    .chunks_exact_mut(ph)
                    .zip(parts[o..o + gp].chunks_exact(ph))
                {
                    fold.combine(rh, bh);
                }
            }
            let at = r * nh + h;
            for (rh, oh) in run
                .chunks_exact(ph)
                .zip(out[at * dv..(at + g) * dv].chunks_exact_mut(dv))
            {
                fold.finish(rh, oh);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv::{KvRows, KvType};

    fn shape(n_head: usize, n_head_kv: usize, head_dim_k: usize, head_dim_v: usize) -> AttnShape {
        AttnShape {
            n_head,
            n_head_kv,
            head_dim_k,
            head_dim_v,
        }
    }

    /// One row attended alone on one thread.
    #[allow(clippy::too_many_arguments)]
    fn attend_one(
        s: AttnShape,
        q: &[f32],
        k: KvView,
        v: KvView,
        from: usize,
        to: usize,
        scale: f32,
        cap: Option<f32>,
    ) -> Vec<f32> {
        let mut out = vec![0f32; s.n_head * s.head_dim_v];
        attend_rows(
            &Pool::new(1),
            s,
            q,
            &[(from, to)],
            k,
            v,
            scale,
            cap,
            &mut out,
        );
        out
    }

    #[test]
    fn one_head_two_positions_by_hand() {
        // q = [1, 0]; keys [1, 0] and [0, 1]: scores 1 and 0 (scale 1);
        // weights e/(e+1) = 0.7310586 and 0.2689414; values [10], [20].
        let s = shape(1, 1, 2, 1);
        let (k, v) = ([1.0, 0.0, 0.0, 1.0], [10.0, 20.0]);
        let (k, v) = (KvView::F32(&k), KvView::F32(&v));
        let out = attend_one(s, &[1.0, 0.0], k, v, 0, 2, 1.0, None);
        assert!((out[0] - (10.0 * 0.731_058_6 + 20.0 * 0.268_941_4)).abs() < 1e-4);
        // A window that starts at position 1 sees only the second value.
        let out = attend_one(s, &[1.0, 0.0], k, v, 1, 2, 1.0, None);
        assert_eq!(out[0], 20.0);
    }

    #[test]
    fn grouped_heads_share_kv() {
        // 2 query heads, 1 kv head: both read the same single value.
        let s = shape(2, 1, 1, 1);
        let out = attend_one(
            s,
            &[1.0, -1.0],
            KvView::F32(&[0.5]),
            KvView::F32(&[7.0]),
            0,
            1,
            1.0,
            None,
        );
        assert_eq!(out, [7.0, 7.0]);
    }

    fn val(i: usize) -> f32 {
        ((i * 7919 % 1000) as f32 / 500.0 - 1.0) * 1.3
    }

    /// A cache of `n_pos` rows of `width` values stored as `ty`.
    fn cache(ty: KvType, n_pos: usize, width: usize, salt: usize) -> KvRows {
        let mut r = KvRows::new(ty, width);
        let x: Vec<f32> = (0..n_pos * width).map(|i| val(i + salt)).collect();
        r.push(&x);
        r
    }

    /// The same rows widened to f32.
    fn widened(r: &KvRows) -> Vec<f32> {
        let mut x = vec![0f32; r.rows() * r.width()];
        for (p, row) in x.chunks_exact_mut(r.width()).enumerate() {
            r.row_f32(p, row);
        }
        x
    }

    /// (n_head, n_head_kv, head_dim_k, head_dim_v, rows): query groups of 1,
    /// 3, 4, 5 (4 + 1) and 8 (4 + 4) heads; value widths with 16-, 8- and
    /// 1-column parts; row counts that take the per-row path and the
    /// per-block one (fewer rows than 2 * threads).
    const CASES: [(usize, usize, usize, usize, usize); 8] = [
        (6, 2, 20, 13, 5),
        (4, 1, 256, 256, 7),
        (5, 1, 24, 24, 6),
        (8, 1, 9, 31, 4),
        (3, 3, 16, 8, 4),
        (4, 1, 32, 40, 1),
        (6, 2, 20, 13, 2),
        (9, 3, 64, 64, 1),
    ];

    /// Positions in the test caches: three blocks and a part.
    const N_POS: usize = 2 * BLOCK + BLOCK / 2 + 7;

    #[test]
    fn rows_equal_one_at_a_time_for_every_kv_type() {
        for ty in KvType::ALL {
            for (nh, nkv, dk, dv, rows) in CASES {
                if ty.check_head_dim(dk).is_err() || ty.check_head_dim(dv).is_err() {
                    continue;
                }
                let s = shape(nh, nkv, dk, dv);
                let (kc, vc) = (cache(ty, N_POS, nkv * dk, 0), cache(ty, N_POS, nkv * dv, 5));
                let q: Vec<f32> = (0..rows * nh * dk).map(|i| val(i + 11)).collect();
                // Spans of odd and even lengths (the K rows go in pairs),
                // over one to three blocks, one that starts late (a sliding
                // window).
                let spans: Vec<(usize, usize)> = (0..rows)
                    .map(|r| (r * 37, N_POS - rows + r + 1 - (r % 3) * BLOCK))
                    .collect();
                for cap in [Some(5.0), None] {
                    for threads in [1, 2, 3] {
                        let pool = Pool::new(threads);
                        let mut batch = vec![0f32; rows * nh * dv];
                        let (k, v) = (kc.view(), vc.view());
                        attend_rows(&pool, s, &q, &spans, k, v, 0.3, cap, &mut batch);
                        for (r, &(from, to)) in spans.iter().enumerate() {
                            let qr = &q[r * nh * dk..(r + 1) * nh * dk];
                            let one = attend_one(s, qr, k, v, from, to, 0.3, cap);
                            let got = &batch[r * nh * dv..(r + 1) * nh * dv];
                            assert!(
                                one.iter().zip(got).all(|(a, b)| a.to_bits() == b.to_bits()),
                                "{ty}: {s:?} rows {rows} row {r} threads {threads} cap {cap:?}"
                            );
                        }
                    }
                }
            }
        }
    }

    /// Attention over an f16 or q8_0 cache is the f32 attention over the
    /// cache's widened values, bit for bit: the types differ only in what
    /// they store.
    #[test]
    fn every_type_attends_as_f32_over_its_widened_values() {
        let (nh, nkv, dk, dv) = (9, 3, 64, 64);
        let s = shape(nh, nkv, dk, dv);
        let q: Vec<f32> = (0..nh * dk).map(|i| val(i + 11)).collect();
        for ty in [KvType::F16, KvType::Q8_0] {
            let (kc, vc) = (cache(ty, N_POS, nkv * dk, 0), cache(ty, N_POS, nkv * dv, 5));
            let (kw, vw) = (widened(&kc), widened(&vc));
            let a = attend_one(s, &q, kc.view(), vc.view(), 0, N_POS, 0.125, None);
            let b = attend_one(
                s,
                &q,
                KvView::F32(&kw),
                KvView::F32(&vw),
                0,
                N_POS,
                0.125,
                None,
            );
            assert_eq!(a, b, "{ty}");
        }
    }

    /// Against softmax attention in f64 over the same (widened) values: a
    /// block left out of the running max or the fold, or a fold with the
    /// wrong rescaling, is far outside the bound.
    #[test]
    fn blocked_softmax_matches_a_float64_reference() {
        let (nh, nkv, dk, dv) = (4, 2, 32, 24);
        let s = shape(nh, nkv, dk, dv);
        let q: Vec<f32> = (0..nh * dk).map(|i| val(i + 11) * 2.0).collect();
        let kc = cache(KvType::F32, N_POS, nkv * dk, 0);
        let vw = widened(&cache(KvType::F32, N_POS, nkv * dv, 5));
        // The largest scores sit in later blocks, so the running max
        // changes after the first block: by a few units, then by hundreds in
        // the second block and by somewhat less in the last (beyond what e^x
        // spans in f32 without the max subtracted).
        for boost in [3.0, 100.0] {
            let mut kw = widened(&kc);
            let row = nkv * dk;
            for x in &mut kw[(BLOCK + 10) * row..(BLOCK + 13) * row] {
                *x *= boost;
            }
            for x in &mut kw[(N_POS - 3) * row..] {
                *x *= boost * 0.6;
            }
            for (from, to) in [(0, N_POS), (5, 2 * BLOCK + 1), (BLOCK, BLOCK + 1)] {
                let got = attend_one(
                    s,
                    &q,
                    KvView::F32(&kw),
                    KvView::F32(&vw),
                    from,
                    to,
                    0.2,
                    None,
                );
                for h in 0..nh {
                    let kvh = h / (nh / nkv);
                    let sc: Vec<f64> = (from..to)
                        .map(|p| {
                            let kr = &kw[p * nkv * dk + kvh * dk..][..dk];
                            let qh = &q[h * dk..(h + 1) * dk];
                            0.2 * qh
                                .iter()
                                .zip(kr)
                                .map(|(a, b)| *a as f64 * *b as f64)
                                .sum::<f64>()
                        })
                        .collect();
                    let m = sc.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                    let w: Vec<f64> = sc.iter().map(|x| (x - m).exp()).collect();
                    let l: f64 = w.iter().sum();
                    for c in 0..dv {
                        let want: f64 = (from..to)
                            .zip(&w)
                            .map(|(p, w)| w * vw[p * nkv * dv + kvh * dv + c] as f64)
                            .sum::<f64>()
                            / l;
                        let g = got[h * dv + c] as f64;
                        assert!(
                            (g - want).abs() <= 2e-6 * (1.0 + want.abs()),
                            "boost {boost} span {from}..{to} head {h} col {c}: {g} vs {want}"
                        );
                    }
                }
            }
        }
    }

    /// The AVX2 and AVX-512 block kernels and the scalar reference give the
    /// same bits, for every type and head group, over spans whose lengths
    /// take the four-position score tiles with and without a remainder.
    #[test]
    fn simd_block_equals_scalar_reference() {
        #[cfg(target_arch = "x86_64")]
        {
            if !Isa::Avx2.supported() {
                eprintln!("attention levels: ran scalar; this CPU cannot run avx2");
                return;
            }
            let levels: Vec<Isa> = [Isa::Avx2, Isa::Avx512]
                .into_iter()
                .filter(|i| i.supported())
                .collect();
            for (ty, &level) in KvType::ALL
                .iter()
                .flat_map(|t| levels.iter().map(move |l| (*t, l)))
            {
                for (nh, nkv, dk, dv, _) in CASES {
                    if ty.check_head_dim(dk).is_err() || ty.check_head_dim(dv).is_err() {
                        continue;
                    }
                    let s = shape(nh, nkv, dk, dv);
                    let (kc, vc) = (cache(ty, N_POS, nkv * dk, 0), cache(ty, N_POS, nkv * dv, 5));
                    let q: Vec<f32> = (0..nh * dk).map(|i| val(i + 11)).collect();
                    for (h, g) in head_groups(s, nkv - 1, MAX_GROUP) {
                        for (from, to) in [(0, BLOCK), (3, 4), (7, 7 + BLOCK - 1)] {
                            for cap in [None, Some(5.0)] {
                                let qs = &q[h * dk..(h + g) * dk];
                                let mut a = vec![0f32; g * (dv + PART_HEAD)];
                                let mut b = a.clone();
                                let (k, v) = (kc.view(), vc.view());
                                let args = (s, nkv - 1, qs, k, v, from, to, 0.3, cap);
                                run_block(
                                    true,
                                    level == Isa::Avx512,
                                    args.0,
                                    args.1,
                                    args.2,
                                    args.3,
                                    args.4,
                                    args.5,
                                    args.6,
                                    args.7,
                                    args.8,
                                    &mut Vec::new(),
                                    &mut a,
                                );
                                block_scalar(
                                    args.0,
                                    args.1,
                                    args.2,
                                    args.3,
                                    args.4,
                                    args.5,
                                    args.6,
                                    args.7,
                                    args.8,
                                    &mut Vec::new(),
                                    &mut b,
                                );
                                assert!(
                                    a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()),
                                    "{level:?} {ty} {s:?} heads {h}+{g} span {from}..{to} cap {cap:?}"
                                );
                            }
                        }
                    }
                }
            }
            eprintln!("attention {}", Isa::levels_line());
        }
        #[cfg(not(target_arch = "x86_64"))]
        eprintln!("attention levels: ran scalar; no SIMD attention on this architecture");
    }
}
