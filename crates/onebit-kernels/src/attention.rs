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

/// [`attend`] for `spans.len()` query rows at once, parallel over (row, head)
/// pairs, so a single decode query uses every thread. `q` is [rows][n_head *
/// head_dim_k], row i sees cache positions `spans[i].0..spans[i].1`; `out` is
/// [rows][n_head * head_dim_v]. Each row's result is the same bits as
/// [`attend`] gives for it.
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
    let items = rows * nh;
    // Work per item grows with its span; aim for ~4 chunks per thread.
    let per = items.div_ceil(pool.threads() * 4).max(1);
    let dst = OutPtr(out.as_mut_ptr());
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
        let shape = AttnShape {
            n_head: 6,
            n_head_kv: 2,
            head_dim_k: 20,
            head_dim_v: 13,
        };
        let n_pos = 37;
        let f = |i: usize| ((i * 7919 % 1000) as f32 / 500.0 - 1.0) * 1.3;
        let kc: Vec<f32> = (0..n_pos * 2 * 20).map(f).collect();
        let vc: Vec<f32> = (0..n_pos * 2 * 13).map(|i| f(i + 5)).collect();
        let rows = 5;
        let q: Vec<f32> = (0..rows * 6 * 20).map(|i| f(i + 11)).collect();
        let spans: Vec<(usize, usize)> = (0..rows).map(|r| (r * 3, n_pos - rows + r + 1)).collect();
        for threads in [1, 2, 3] {
            let pool = Pool::new(threads);
            let mut batch = vec![0f32; rows * 6 * 13];
            attend_rows(
                &pool,
                shape,
                &q,
                &spans,
                &kc,
                &vc,
                0.3,
                Some(5.0),
                &mut batch,
            );
            for (r, &(from, to)) in spans.iter().enumerate() {
                let mut one = vec![0f32; 6 * 13];
                let qr = &q[r * 120..(r + 1) * 120];
                attend(
                    shape,
                    qr,
                    &kc,
                    &vc,
                    from,
                    to,
                    0.3,
                    Some(5.0),
                    &mut Vec::new(),
                    &mut one,
                );
                assert_eq!(one, batch[r * 78..(r + 1) * 78]);
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
