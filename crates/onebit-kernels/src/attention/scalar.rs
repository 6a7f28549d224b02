//! The scalar reference of attention: one block of positions for a group of
//! query heads (scores, running max, weights, weighted sum of values), the
//! fold of a later block's partial into the running one, and the output
//! from the folded partial. Every SIMD path computes these same operations
//! in this order, so it gives these bits.

use super::{AttnShape, PART_HEAD};
use crate::kv::KvView;
use crate::ops::{exp_fast, exp_sub, sum4_f64};

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
pub(super) fn finish_score(dot: f32, scale: f32, softcap: Option<f32>) -> f32 {
    let s = dot * scale;
    match softcap {
        Some(cap) => soft_cap(s, cap),
        None => s,
    }
}

/// The soft-cap of a scaled score: cap tanh(s / cap).
#[inline]
pub(super) fn soft_cap(s: f32, cap: f32) -> f32 {
    cap * (s / cap).tanh()
}

/// Per head of a block: the max of its scores, the scores replaced by their
/// weights e^(s - max), and the weights' sum; writes max and sum to `part`.
/// (Used by the x86 kernels only.)
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
#[inline(always)]
pub(super) fn weights(scores: &mut [f32], part: &mut [f32]) {
    let m = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    exp_sub(scores, m);
    part[0] = m;
    part[1] = sum4_f64(scores, |v| v as f64) as f32;
}

/// Scalar reference of one block: the query heads in `q` ([G][dk]), all
/// reading KV head `kvh`, query vector g over the positions `ranges[g]` (not
/// empty); writes `part` ([G][2 + dv]). Each vector's partial is computed
/// on its own: the same bits whatever the other vectors and their ranges.
#[allow(clippy::too_many_arguments)]
pub(super) fn block_scalar(
    shape: AttnShape,
    kvh: usize,
    q: &[f32],
    ranges: &[(usize, usize)],
    k: KvView,
    v: KvView,
    scale: f32,
    softcap: Option<f32>,
    scores: &mut Vec<f32>,
    part: &mut [f32],
) {
    let (dk, dv) = (shape.head_dim_k, shape.head_dim_v);
    let krow = shape.n_head_kv * dk;
    let vrow = shape.n_head_kv * dv;
    for ((qg, pg), &(from, to)) in q
        .chunks_exact(dk)
        .zip(part.chunks_exact_mut(PART_HEAD + dv))
        .zip(ranges)
    {
        let len = to - from;
        scores.clear();
        scores.resize(len + dk.max(dv), 0.0);
        let (sc, row) = scores.split_at_mut(len);
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
pub(super) fn combine(run: &mut [f32], b: &[f32]) {
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
pub(super) fn finish(run: &[f32], out: &mut [f32]) {
    let inv = 1.0 / run[1];
    for (o, x) in out.iter_mut().zip(&run[PART_HEAD..]) {
        *o = *x * inv;
    }
}
