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
//!
//! Attention sinks (gpt-oss's `attn_sinks`: one learned logit per query
//! head in its softmax's denominator, weighing no value) join each head's
//! folded partial as one more partial, (m, l, acc) = (sink, 1, 0), through
//! the same fold, just before the output: the head's weights then sum to
//! 1 - e^(sink - m') / l' instead of 1. A sink of -inf changes no bit.
//!
//! Files: `scalar.rs` the reference, `x86.rs` the AVX2/AVX-512 kernels and
//! the FMA fold, this file the dispatch and the work split over threads.

use crate::isa::Isa;
use crate::kv::KvView;
use crate::pool::Pool;

mod scalar;
#[cfg(target_arch = "x86_64")]
mod x86;

use scalar::{block_scalar, combine, finish};

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
            return unsafe { x86::combine(run, b) };
        }
        combine(run, b)
    }

    #[inline]
    fn finish(self, run: &[f32], out: &mut [f32]) {
        #[cfg(target_arch = "x86_64")]
        if self.simd {
            // SAFETY: as in `combine`.
            return unsafe { x86::finish(run, out) };
        }
        finish(run, out)
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
        use x86::{block, Elems, F16s, F32s, Q8s};
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
    attend_rows_sinks(pool, shape, q, spans, k, v, scale, softcap, None, out)
}

/// [`attend_rows`] with attention sinks: `sinks[h]` is query head h's
/// sink logit (one per query head), folded into that head's softmax
/// denominator (see the module header).
#[allow(clippy::too_many_arguments)]
pub fn attend_rows_sinks(
    pool: &Pool,
    shape: AttnShape,
    q: &[f32],
    spans: &[(usize, usize)],
    k: KvView,
    v: KvView,
    scale: f32,
    softcap: Option<f32>,
    sinks: Option<&[f32]>,
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
    if let Some(s) = sinks {
        assert_eq!(s.len(), nh, "attend_rows: one sink per query head");
    }
    #[cfg(target_arch = "x86_64")]
    let (simd, wide) = (level() >= Isa::Avx2, level() >= Isa::Avx512);
    #[cfg(not(target_arch = "x86_64"))]
    let (simd, wide) = (false, false);
    let ph = PART_HEAD + dv;
    let fold = Fold { simd };
    // Head h's sink as a partial: [sink, 1, 0...], folded in last.
    let sink_parts: Option<Vec<f32>> = sinks.map(|s| {
        let mut p = vec![0f32; nh * ph];
        for (h, part) in p.chunks_exact_mut(ph).enumerate() {
            part[0] = s[h];
            part[1] = 1.0;
        }
        p
    });
    let sink_part = |h: usize| sink_parts.as_ref().map(|p| &p[h * ph..(h + 1) * ph]);
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
                    for (i, (rh, oh)) in run
                        .chunks_exact_mut(ph)
                        .zip(os.chunks_exact_mut(dv))
                        .enumerate()
                    {
                        if let Some(sp) = sink_part(h + i) {
                            fold.combine(rh, sp);
                        }
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
            for (i, (rh, oh)) in run
                .chunks_exact_mut(ph)
                .zip(out[at * dv..(at + g) * dv].chunks_exact_mut(dv))
                .enumerate()
            {
                if let Some(sp) = sink_part(h + i) {
                    fold.combine(rh, sp);
                }
                fold.finish(rh, oh);
            }
        }
    }
}

#[cfg(test)]
mod tests;
