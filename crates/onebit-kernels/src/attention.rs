//! Causal softmax attention of query rows over a KV cache.
//!
//! Per query head: scores q·k over the visible positions (8-lane fused
//! multiply-add dot products), scale, optional soft-cap, softmax, then the
//! weighted sum of values (a fused multiply-add per element). The result for
//! a query depends only on that query and the cache rows it reads: the same
//! operations run for it whether it is attended alone, in a batch, or on any
//! thread, and the AVX2 and scalar paths compute the same fused operations in
//! the same order, so they give the same bits.

use crate::ops::softmax;
use crate::pool::Pool;

/// Shapes of one attention layer.
#[derive(Clone, Copy, Debug)]
pub struct AttnShape {
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim_k: usize,
    pub head_dim_v: usize,
}

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

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::{softmax, AttnShape};
    use core::arch::x86_64::*;

    /// As `dot_scalar`, eight lanes at a time.
    #[target_feature(enable = "avx2,fma")]
    pub fn dot(a: &[f32], b: &[f32]) -> f32 {
        let n = a.len().min(b.len());
        let n8 = n / 8 * 8;
        let mut acc = _mm256_setzero_ps();
        let mut i = 0;
        while i < n8 {
            // SAFETY: i + 8 <= n8 <= len of both slices.
            let (x, y) = unsafe {
                (
                    _mm256_loadu_ps(a.as_ptr().add(i)),
                    _mm256_loadu_ps(b.as_ptr().add(i)),
                )
            };
            acc = _mm256_fmadd_ps(x, y, acc);
            i += 8;
        }
        let mut lanes = [0f32; 8];
        // SAFETY: `lanes` has 8 elements.
        unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), acc) };
        for i in n8..n {
            lanes[i - n8] = a[i].mul_add(b[i], lanes[i - n8]);
        }
        crate::quant::scalar::reduce8(&lanes)
    }

    /// o = w * v + o, fused, elementwise.
    #[target_feature(enable = "avx2,fma")]
    pub fn axpy(o: &mut [f32], w: f32, v: &[f32]) {
        let n = o.len().min(v.len());
        let n8 = n / 8 * 8;
        let wv = _mm256_set1_ps(w);
        let mut i = 0;
        while i < n8 {
            // SAFETY: i + 8 <= n8 <= len of both slices.
            unsafe {
                let p = o.as_mut_ptr().add(i);
                let r = _mm256_fmadd_ps(wv, _mm256_loadu_ps(v.as_ptr().add(i)), _mm256_loadu_ps(p));
                _mm256_storeu_ps(p, r);
            }
            i += 8;
        }
        for i in n8..n {
            o[i] = w.mul_add(v[i], o[i]);
        }
    }

    /// A score from a dot product's lane sums: the tail elements into lanes
    /// 0.., the pairwise reduction, then scale and soft-cap, as `attend_head`.
    #[target_feature(enable = "avx2,fma")]
    fn finish_score(acc: __m256, q: &[f32], k: &[f32], scale: f32, softcap: Option<f32>) -> f32 {
        let n8 = q.len() / 8 * 8;
        let sum = if n8 == q.len() {
            // reduce8 in registers: [l0+l4, l1+l5, l2+l6, l3+l7], then
            // [(l0+l4)+(l2+l6), (l1+l5)+(l3+l7)], then their sum.
            let s = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps::<1>(acc));
            let t = _mm_add_ps(s, _mm_movehl_ps(s, s));
            _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)))
        } else {
            let mut lanes = [0f32; 8];
            // SAFETY: `lanes` has 8 elements.
            unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), acc) };
            for i in n8..q.len() {
                lanes[i - n8] = q[i].mul_add(k[i], lanes[i - n8]);
            }
            crate::quant::scalar::reduce8(&lanes)
        };
        let mut s = sum * scale;
        if let Some(cap) = softcap {
            s = cap * (s / cap).tanh();
        }
        s
    }

    /// `attend_head` for the G query heads whose vectors are `q` ([G][dk])
    /// and which all read KV head `kvh`, over positions `from..to`: writes
    /// `out` ([G][dv]). Each K and V load serves all G heads (and a K row pair
    /// gives 2G independent accumulator chains), while every head sees the
    /// same operations in the same order as `attend_head`: its dot products
    /// with one 8-lane accumulator per position, its softmax, and its
    /// weighted sum accumulated position by position from zero.
    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx2,fma")]
    pub fn attend_group<const G: usize>(
        shape: AttnShape,
        kvh: usize,
        q: &[f32],
        k_cache: &[f32],
        v_cache: &[f32],
        from: usize,
        to: usize,
        scale: f32,
        softcap: Option<f32>,
        scores: &mut Vec<f32>,
        out: &mut [f32],
    ) {
        let (dk, dv) = (shape.head_dim_k, shape.head_dim_v);
        let krow = shape.n_head_kv * dk;
        let vrow = shape.n_head_kv * dv;
        assert!(
            kvh < shape.n_head_kv && from <= to,
            "attend_group: head or span"
        );
        assert!(
            q.len() == G * dk && out.len() == G * dv,
            "attend_group: q/out shape"
        );
        assert!(
            to * krow <= k_cache.len() && to * vrow <= v_cache.len(),
            "attend_group: cache rows"
        );
        let len = to - from;
        let dk8 = dk / 8 * 8;
        scores.clear();
        scores.resize(G * len, 0.0);
        let k_at = |p: usize| &k_cache[p * krow + kvh * dk..p * krow + (kvh + 1) * dk];

        // Scores, two positions at a time.
        let mut i = 0;
        while i < len {
            let pair = i + 1 < len;
            let k0 = k_at(from + i);
            let k1 = if pair { k_at(from + i + 1) } else { k0 };
            let mut acc = [[_mm256_setzero_ps(); 2]; G];
            let mut j = 0;
            while j < dk8 {
                // SAFETY: j + 8 <= dk8 <= dk, the length of k0, k1 and of each
                // head's part of q (g * dk + j + 8 <= G * dk = q.len()).
                unsafe {
                    let a = _mm256_loadu_ps(k0.as_ptr().add(j));
                    let b = _mm256_loadu_ps(k1.as_ptr().add(j));
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
                scores[g * len + i] = finish_score(acc[0], qg, k0, scale, softcap);
                if pair {
                    scores[g * len + i + 1] = finish_score(acc[1], qg, k1, scale, softcap);
                }
            }
            i += 2;
        }
        for g in 0..G {
            softmax(&mut scores[g * len..(g + 1) * len]);
        }

        // Weighted sums of values, 16 then 8 columns of all G heads at a
        // time, then the remaining columns one by one.
        let sp = scores.as_ptr();
        let v_at = |p: usize, c: usize| {
            debug_assert!(c < dv);
            // SAFETY: p < to and c < dv, so the index is below to * vrow <=
            // v_cache.len() (asserted above).
            unsafe { v_cache.as_ptr().add(p * vrow + kvh * dv + c) }
        };
        let mut c = 0;
        while c + 16 <= dv {
            let mut acc = [[_mm256_setzero_ps(); 2]; G];
            for i in 0..len {
                let vp = v_at(from + i, c);
                // SAFETY: columns c..c + 16 <= dv of row from + i (see v_at);
                // g * len + i < G * len = scores.len().
                unsafe {
                    let v0 = _mm256_loadu_ps(vp);
                    let v1 = _mm256_loadu_ps(vp.add(8));
                    for (g, acc) in acc.iter_mut().enumerate() {
                        let w = _mm256_set1_ps(*sp.add(g * len + i));
                        acc[0] = _mm256_fmadd_ps(w, v0, acc[0]);
                        acc[1] = _mm256_fmadd_ps(w, v1, acc[1]);
                    }
                }
            }
            for (g, acc) in acc.iter().enumerate() {
                // SAFETY: g * dv + c + 16 <= G * dv = out.len().
                unsafe {
                    _mm256_storeu_ps(out.as_mut_ptr().add(g * dv + c), acc[0]);
                    _mm256_storeu_ps(out.as_mut_ptr().add(g * dv + c + 8), acc[1]);
                }
            }
            c += 16;
        }
        if c + 8 <= dv {
            let mut acc = [_mm256_setzero_ps(); G];
            for i in 0..len {
                let vp = v_at(from + i, c);
                // SAFETY: as above, for columns c..c + 8 <= dv.
                unsafe {
                    let v0 = _mm256_loadu_ps(vp);
                    for (g, acc) in acc.iter_mut().enumerate() {
                        let w = _mm256_set1_ps(*sp.add(g * len + i));
                        *acc = _mm256_fmadd_ps(w, v0, *acc);
                    }
                }
            }
            for (g, acc) in acc.iter().enumerate() {
                // SAFETY: g * dv + c + 8 <= G * dv = out.len().
                unsafe { _mm256_storeu_ps(out.as_mut_ptr().add(g * dv + c), *acc) };
            }
            c += 8;
        }
        for c in c..dv {
            for g in 0..G {
                let mut acc = 0f32;
                for i in 0..len {
                    let p = from + i;
                    acc = scores[g * len + i].mul_add(v_cache[p * vrow + kvh * dv + c], acc);
                }
                out[g * dv + c] = acc;
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
fn use_avx2() -> bool {
    crate::quant::x86::Isa::best() >= crate::quant::x86::Isa::Avx2
}

#[inline]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if use_avx2() {
        // SAFETY: Isa::best() >= Avx2 means AVX2 and FMA were detected.
        return unsafe { avx2::dot(a, b) };
    }
    dot_scalar(a, b)
}

#[inline]
fn axpy(o: &mut [f32], w: f32, v: &[f32]) {
    #[cfg(target_arch = "x86_64")]
    if use_avx2() {
        // SAFETY: Isa::best() >= Avx2 means AVX2 and FMA were detected.
        return unsafe { avx2::axpy(o, w, v) };
    }
    axpy_scalar(o, w, v)
}

/// One query head over positions `from..to`: writes `oh` ([head_dim_v]).
#[allow(clippy::too_many_arguments)]
fn attend_head(
    shape: AttnShape,
    h: usize,
    qh: &[f32],
    k_cache: &[f32],
    v_cache: &[f32],
    from: usize,
    to: usize,
    scale: f32,
    softcap: Option<f32>,
    scores: &mut Vec<f32>,
    oh: &mut [f32],
) {
    let (dk, dv) = (shape.head_dim_k, shape.head_dim_v);
    let kvh = h / (shape.n_head / shape.n_head_kv);
    let kv_row_k = shape.n_head_kv * dk;
    let kv_row_v = shape.n_head_kv * dv;
    scores.clear();
    for p in from..to {
        let kh = &k_cache[p * kv_row_k + kvh * dk..p * kv_row_k + (kvh + 1) * dk];
        let mut s = dot(qh, kh) * scale;
        if let Some(cap) = softcap {
            s = cap * (s / cap).tanh();
        }
        scores.push(s);
    }
    softmax(scores);
    oh.fill(0.0);
    for (i, p) in (from..to).enumerate() {
        let vh = &v_cache[p * kv_row_v + kvh * dv..p * kv_row_v + (kvh + 1) * dv];
        axpy(oh, scores[i], vh);
    }
}

/// Attention for one query row over cache positions `from..to` (the query's own
/// position is `to - 1`). `q` is [n_head * head_dim_k], already scaled by nothing;
/// `k_cache` rows are [n_head_kv * head_dim_k] per position, `v_cache` likewise.
/// Query head h reads KV head h / (n_head / n_head_kv). Writes [n_head * head_dim_v].
#[allow(clippy::too_many_arguments)]
pub fn attend(
    shape: AttnShape,
    q: &[f32],
    k_cache: &[f32],
    v_cache: &[f32],
    from: usize,
    to: usize,
    scale: f32,
    softcap: Option<f32>,
    scores: &mut Vec<f32>,
    out: &mut [f32],
) {
    let (dk, dv) = (shape.head_dim_k, shape.head_dim_v);
    for h in 0..shape.n_head {
        attend_head(
            shape,
            h,
            &q[h * dk..(h + 1) * dk],
            k_cache,
            v_cache,
            from,
            to,
            scale,
            softcap,
            scores,
            &mut out[h * dv..(h + 1) * dv],
        );
    }
}

/// A pointer to the output that several threads write disjoint heads of.
#[derive(Clone, Copy)]
struct OutPtr(*mut f32);
// SAFETY: each (row, head) work item writes only its own head_dim_v elements,
// which no other item reads or writes; the buffer outlives the call.
unsafe impl Send for OutPtr {}
unsafe impl Sync for OutPtr {}

/// [`attend`] for `spans.len()` query rows at once. `q` is [rows][n_head *
/// head_dim_k], row i sees cache positions `spans[i].0..spans[i].1`; `out` is
/// [rows][n_head * head_dim_v]. Each row's result is the same bits as
/// [`attend`] gives for it.
///
/// With several rows (prefill) the work items are (row, KV head) pairs, and
/// the query heads sharing a KV head run together so each K and V row load
/// serves all of them; with few rows (decode) they are (row, query head)
/// pairs, so a single query still uses every thread.
#[allow(clippy::too_many_arguments)]
pub fn attend_rows(
    pool: &Pool,
    shape: AttnShape,
    q: &[f32],
    spans: &[(usize, usize)],
    k_cache: &[f32],
    v_cache: &[f32],
    scale: f32,
    softcap: Option<f32>,
    out: &mut [f32],
) {
    let (nh, dk, dv) = (shape.n_head, shape.head_dim_k, shape.head_dim_v);
    let rows = spans.len();
    assert_eq!(q.len(), rows * nh * dk, "attend_rows: q shape");
    assert_eq!(out.len(), rows * nh * dv, "attend_rows: out shape");
    let dst = OutPtr(out.as_mut_ptr());
    #[cfg(target_arch = "x86_64")]
    if use_avx2() && rows * shape.n_head_kv >= 2 * pool.threads() {
        let nkv = shape.n_head_kv;
        let group = nh / nkv;
        let items = rows * nkv;
        // Work per item grows with its span; aim for ~8 chunks per thread.
        let per = items.div_ceil(pool.threads() * 8).max(1);
        pool.for_each_chunk(items.div_ceil(per), |c| {
            let mut scores = Vec::new();
            for it in c * per..((c + 1) * per).min(items) {
                let (r, kvh) = (it / nkv, it % nkv);
                let (from, to) = spans[r];
                let heads_end = (kvh + 1) * group;
                let mut h = kvh * group;
                while h < heads_end {
                    let g = (heads_end - h).min(4);
                    let at = r * nh + h;
                    let qs = &q[at * dk..(at + g) * dk];
                    let d = dst;
                    // SAFETY: at + g <= (r + 1) * nh, so the slice is inside
                    // `out` (length rows * nh * dv, checked above); each
                    // (row, KV head) item is claimed by exactly one participant
                    // and writes only its own heads.
                    let os = unsafe { std::slice::from_raw_parts_mut(d.0.add(at * dv), g * dv) };
                    let args = (shape, kvh, qs, k_cache, v_cache, from, to, scale, softcap);
                    // SAFETY (each call): use_avx2() means AVX2 and FMA were detected.
                    unsafe {
                        match g {
                            4 => call_group::<4>(args, &mut scores, os),
                            3 => call_group::<3>(args, &mut scores, os),
                            2 => call_group::<2>(args, &mut scores, os),
                            _ => call_group::<1>(args, &mut scores, os),
                        }
                    }
                    h += g;
                }
            }
        });
        return;
    }
    let items = rows * nh;
    // Work per item grows with its span; aim for ~4 chunks per thread.
    let per = items.div_ceil(pool.threads() * 4).max(1);
    pool.for_each_chunk(items.div_ceil(per), |c| {
        let mut scores = Vec::new();
        for it in c * per..((c + 1) * per).min(items) {
            let (r, h) = (it / nh, it % nh);
            let (from, to) = spans[r];
            let d = dst;
            // SAFETY: (r, h) < (rows, n_head), so the slice is inside `out`
            // (length rows * nh * dv, checked above); each item is claimed by
            // exactly one participant and writes only its own head.
            let oh = unsafe { std::slice::from_raw_parts_mut(d.0.add(it * dv), dv) };
            attend_head(
                shape,
                h,
                &q[it * dk..(it + 1) * dk],
                k_cache,
                v_cache,
                from,
                to,
                scale,
                softcap,
                &mut scores,
                oh,
            );
        }
    });
}

/// The arguments of [`avx2::attend_group`] before its buffers.
#[cfg(target_arch = "x86_64")]
type GroupArgs<'a> = (
    AttnShape,
    usize,
    &'a [f32],
    &'a [f32],
    &'a [f32],
    usize,
    usize,
    f32,
    Option<f32>,
);

/// # Safety
/// AVX2 and FMA must be available.
#[cfg(target_arch = "x86_64")]
unsafe fn call_group<const G: usize>(a: GroupArgs<'_>, scores: &mut Vec<f32>, out: &mut [f32]) {
    // SAFETY: the caller guarantees AVX2 and FMA.
    unsafe { avx2::attend_group::<G>(a.0, a.1, a.2, a.3, a.4, a.5, a.6, a.7, a.8, scores, out) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_head_two_positions_by_hand() {
        // q = [1, 0]; keys [1, 0] and [0, 1]: scores 1 and 0 (scale 1);
        // weights e/(e+1) = 0.7310586 and 0.2689414; values [10], [20].
        let shape = AttnShape {
            n_head: 1,
            n_head_kv: 1,
            head_dim_k: 2,
            head_dim_v: 1,
        };
        let mut out = [0.0];
        attend(
            shape,
            &[1.0, 0.0],
            &[1.0, 0.0, 0.0, 1.0],
            &[10.0, 20.0],
            0,
            2,
            1.0,
            None,
            &mut Vec::new(),
            &mut out,
        );
        assert!((out[0] - (10.0 * 0.731_058_6 + 20.0 * 0.268_941_4)).abs() < 1e-4);
        // A window that starts at position 1 sees only the second value.
        attend(
            shape,
            &[1.0, 0.0],
            &[1.0, 0.0, 0.0, 1.0],
            &[10.0, 20.0],
            1,
            2,
            1.0,
            None,
            &mut Vec::new(),
            &mut out,
        );
        assert_eq!(out[0], 20.0);
    }

    #[test]
    fn grouped_heads_share_kv() {
        // 2 query heads, 1 kv head: both read the same single value.
        let shape = AttnShape {
            n_head: 2,
            n_head_kv: 1,
            head_dim_k: 1,
            head_dim_v: 1,
        };
        let mut out = [0.0; 2];
        attend(
            shape,
            &[1.0, -1.0],
            &[0.5],
            &[7.0],
            0,
            1,
            1.0,
            None,
            &mut Vec::new(),
            &mut out,
        );
        assert_eq!(out, [7.0, 7.0]);
    }

    #[test]
    fn rows_equal_one_at_a_time_and_levels_agree() {
        let f = |i: usize| ((i * 7919 % 1000) as f32 / 500.0 - 1.0) * 1.3;
        // (n_head, n_head_kv, head_dim_k, head_dim_v, rows): query groups of
        // 1, 3, 4, 5 (4 + 1) and 8 (4 + 4) heads; value widths with 16-, 8-
        // and 1-column parts; row counts that take the grouped path and the
        // per-head one (fewer rows than 2 * threads).
        let cases = [
            (6, 2, 20, 13, 5),
            (4, 1, 256, 256, 7),
            (5, 1, 24, 24, 6),
            (8, 1, 9, 31, 4),
            (3, 3, 16, 8, 4),
            (4, 1, 32, 40, 1),
            (6, 2, 20, 13, 2),
        ];
        for (nh, nkv, dk, dv, rows) in cases {
            let shape = AttnShape {
                n_head: nh,
                n_head_kv: nkv,
                head_dim_k: dk,
                head_dim_v: dv,
            };
            let n_pos = 37;
            let kc: Vec<f32> = (0..n_pos * nkv * dk).map(f).collect();
            let vc: Vec<f32> = (0..n_pos * nkv * dv).map(|i| f(i + 5)).collect();
            let q: Vec<f32> = (0..rows * nh * dk).map(|i| f(i + 11)).collect();
            // Spans of odd and even lengths (the K rows go in pairs), and one
            // that starts late (a sliding window).
            let spans: Vec<(usize, usize)> =
                (0..rows).map(|r| (r * 3, n_pos - rows + r + 1)).collect();
            for cap in [Some(5.0), None] {
                for threads in [1, 2, 3] {
                    let pool = Pool::new(threads);
                    let mut batch = vec![0f32; rows * nh * dv];
                    attend_rows(&pool, shape, &q, &spans, &kc, &vc, 0.3, cap, &mut batch);
                    for (r, &(from, to)) in spans.iter().enumerate() {
                        let mut one = vec![0f32; nh * dv];
                        let qr = &q[r * nh * dk..(r + 1) * nh * dk];
                        attend(
                            shape,
                            qr,
                            &kc,
                            &vc,
                            from,
                            to,
                            0.3,
                            cap,
                            &mut Vec::new(),
                            &mut one,
                        );
                        let got = &batch[r * nh * dv..(r + 1) * nh * dv];
                        assert!(
                            one.iter().zip(got).all(|(a, b)| a.to_bits() == b.to_bits()),
                            "shape {shape:?} rows {rows} row {r} threads {threads} cap {cap:?}"
                        );
                    }
                }
            }
        }
        // The scalar and AVX2 inner loops give the same bits.
        let a: Vec<f32> = (0..77).map(f).collect();
        let b: Vec<f32> = (0..77).map(|i| f(i + 3)).collect();
        for n in [0, 1, 8, 9, 64, 77] {
            #[cfg(target_arch = "x86_64")]
            if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
                // SAFETY: the features were just detected.
                let simd = unsafe { avx2::dot(&a[..n], &b[..n]) };
                assert_eq!(simd.to_bits(), dot_scalar(&a[..n], &b[..n]).to_bits());
                let (mut o1, mut o2) = (b[..n].to_vec(), b[..n].to_vec());
                // SAFETY: as above.
                unsafe { avx2::axpy(&mut o1, 0.37, &a[..n]) };
                axpy_scalar(&mut o2, 0.37, &a[..n]);
                assert_eq!(o1, o2);
            }
        }
    }
}
