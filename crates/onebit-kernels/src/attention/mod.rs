//! Causal softmax attention of query rows over a KV cache of any
//! [`KvType`](crate::kv::KvType), blocked over the cache rows with a running
//! max (the online softmax of flash attention), for the rows of one
//! sequence or of several (each over its own cache) in one call.
//!
//! The cache positions are cut into blocks of [`BLOCK`] positions at fixed
//! places, block b holding positions b·BLOCK..(b + 1)·BLOCK; a query sees
//! the part of each block its visible positions `from..to` cover. Per
//! (block, query head) part: the scores q·k (8-lane fused multiply-add dot
//! products over K widened to f32), scale, optional soft-cap; their max m;
//! weights e^(s - m) ([`exp_fast`](crate::ops::exp_fast)); their sum l (four
//! f64 lanes); and the unnormalised weighted sum of V rows (a fused
//! multiply-add per element, position by position from zero). The parts
//! (m, l, acc) are then folded in block order: m' = max(m, m_b), l =
//! l e^(m - m') + l_b e^(m_b - m'), acc likewise (plain products and sums);
//! the output is acc / l.
//!
//! A query's result depends only on that query and the cache rows it reads:
//! the same operations run for it whether it is attended alone or with
//! other rows (of its sequence or of others), with the heads of its KV
//! group together or apart, with its blocks on one thread or spread over
//! all of them. The blocks sit at fixed positions (not counted from each
//! row's `from`) so that the rows of one sequence cut the cache alike: a
//! verify step's rows, which see the same cache rows but for the last few
//! (causality) or the first few (a sliding window), read each block once
//! for all of them. The work is cut into units (a sequence's rows, up to
//! [`ROW_GROUP`] at a time, with the query heads of one KV head); a unit
//! walks its blocks and, per block, runs its query vectors (row x head) in
//! tiles of `TILE` (`TILE_WIDE` at the AVX-512 level) through one
//! kernel call, every K and V load serving the whole tile, each vector over
//! its own part of the block.
//!
//! The AVX2 path computes the same fused operations in the same order as
//! the scalar reference, so the two give the same bits. The scores run four
//! positions at a time, one 256-bit register of eight lanes per position
//! (the same per-lane chains as the reference), the four positions' lanes
//! then reduced together by shuffles in the pairing of the scalar
//! reduction. At the AVX-512 level the weighted sums of values run on
//! 512-bit registers (64 columns of every vector in one pass over the
//! block's V rows); each element is still its own chain of fused
//! multiply-adds in position order, so the bits are the same. (Scores eight
//! positions at a time on 512-bit registers, two positions per register,
//! measured a fifth slower than the four 256-bit ones on Zen 4, so both
//! levels run the latter.) A tile of five to eight vectors, AVX-512 only,
//! holds two vectors per 512-bit register in the scores (each K load
//! widened into both halves, the halves then reduced as before) and runs
//! the weighted sums 32 columns at a time. Both passes ask the cache for
//! the rows 32 positions ahead.
//!
//! Attention sinks (gpt-oss's `attn_sinks`: one learned logit per query
//! head in its softmax's denominator, weighing no value) join each head's
//! folded partial as one more partial, (m, l, acc) = (sink, 1, 0), through
//! the same fold, just before the output: the head's weights then sum to
//! 1 - e^(sink - m') / l' instead of 1. A sink of -inf changes no bit.
//!
//! Files: `scalar.rs` the reference, `x86.rs` the AVX2/AVX-512 kernels and
//! the FMA fold, this file the dispatch and the work split over threads;
//! `full.rs` a separate kernel for rows that all see every key both ways
//! (a vision tower's patches), tiled like a matrix product, with its own
//! reference.

use crate::isa::Isa;
use crate::kv::KvView;
use crate::pool::Pool;
use std::ops::Range;

mod full;
mod scalar;
#[cfg(target_arch = "x86_64")]
mod x86;

pub use full::{attend_full, attend_full_at, attend_full_reference};

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

/// Query vectors (heads of one KV head, of one row or several) that one
/// kernel call runs together, every K and V load serving all of them (their
/// accumulators fill the registers): four on AVX2's sixteen registers...
const TILE: usize = 4;

/// ...and eight at the AVX-512 level (thirty-two registers; the scores two
/// vectors to a 512-bit register), so a KV head's six or seven query heads
/// (Qwen2.5's) share each load in a decode step.
const TILE_WIDE: usize = 8;

/// Rows of one sequence that read the cache together (a verify step's rows,
/// or a part of a prefill's).
pub const ROW_GROUP: usize = 16;

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
            // SAFETY: `simd` is set only when the call's level is Avx2 or
            // above, and that level is at most level() (asserted in
            // `attend_seqs_at`): AVX2 and FMA were detected.
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

/// One block for the 1..=[`TILE`] query vectors in `q` ([n][dk]) (up to
/// [`TILE_WIDE`] when `wide`), vector g over the positions `ranges[g]` (not
/// empty, within one block), on the chosen path; writes `part` ([n][2 +
/// dv]).
#[allow(clippy::too_many_arguments)]
fn run_tile(
    simd: bool,
    wide: bool,
    shape: AttnShape,
    kvh: usize,
    q: &[f32],
    ranges: &[(usize, usize)],
    k: KvView,
    v: KvView,
    scale: f32,
    softcap: Option<f32>,
    ahead: (usize, usize),
    scores: &mut Vec<f32>,
    part: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    if simd {
        use x86::{block, Elems, F16s, F32s, Q8s};
        /// # Safety
        /// AVX2, FMA and F16C must be available.
        #[allow(clippy::too_many_arguments)]
        unsafe fn by_tile<E: Elems>(
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
            // One instance of `block` per tile width G, 1..=8.
            macro_rules! by_width {
                ($($g:literal)*) => {
                    match ranges.len() {
                        $($g => block::<E, $g>(
                            shape, kvh, q, ranges, k, v, scale, softcap, wide, ahead, scores, part,
                        ),)*
                        _ => block::<E, 1>(
                            shape, kvh, q, ranges, k, v, scale, softcap, wide, ahead, scores, part,
                        ),
                    }
                };
            }
            // SAFETY (each call): the caller guarantees the features.
            unsafe { by_width!(8 7 6 5 4 3 2) }
        }
        let a = (shape, kvh, q, ranges, scale, softcap, wide, ahead);
        // SAFETY (each call): `simd` is true only when the call's level, at
        // most level() (asserted in `attend_seqs_at`), is Avx2 or above:
        // AVX2, FMA and F16C were detected; `wide` only when it is Avx512:
        // AVX-512 F/BW/VL were detected.
        unsafe {
            match (k, v) {
                (KvView::F32(k), KvView::F32(v)) => {
                    let (k, v) = (F32s(k), F32s(v));
                    return by_tile(a.0, a.1, a.2, a.3, k, v, a.4, a.5, a.6, a.7, scores, part);
                }
                (KvView::F16(k), KvView::F16(v)) => {
                    let (k, v) = (F16s(k), F16s(v));
                    return by_tile(a.0, a.1, a.2, a.3, k, v, a.4, a.5, a.6, a.7, scores, part);
                }
                (KvView::Q8_0 { q: kq, d: kd }, KvView::Q8_0 { q: vq, d: vd }) => {
                    let (k, v) = (Q8s(kq, kd), Q8s(vq, vd));
                    return by_tile(a.0, a.1, a.2, a.3, k, v, a.4, a.5, a.6, a.7, scores, part);
                }
                // K and V of different types: the scalar reference.
                _ => {}
            }
        }
    }
    let _ = (simd, wide, ahead);
    block_scalar(shape, kvh, q, ranges, k, v, scale, softcap, scores, part)
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

/// The blocks a span reaches (none for an empty span).
fn blocks_of((from, to): (usize, usize)) -> Range<usize> {
    if from >= to {
        0..0
    } else {
        from / BLOCK..(to - 1) / BLOCK + 1
    }
}

/// A span's positions in block `b` (empty if it does not reach it).
fn in_block((from, to): (usize, usize), b: usize) -> (usize, usize) {
    (from.max(b * BLOCK), to.min((b + 1) * BLOCK))
}

/// One sequence's part of [`attend_seqs`]: its query rows `q`
/// ([rows][n_head x head_dim_k]), what each row sees (`spans[i]`: cache
/// positions `from..to`; its own position is `to - 1` when causal), its
/// cache (`k`: [positions][n_head_kv x head_dim_k], `v` likewise) and its
/// output rows (`out`: [rows][n_head x head_dim_v]).
pub struct SeqAttn<'a> {
    pub q: &'a [f32],
    pub spans: &'a [(usize, usize)],
    pub k: KvView<'a>,
    pub v: KvView<'a>,
    pub out: &'a mut [f32],
}

/// Attention for `spans.len()` query rows of one sequence: [`attend_seqs`]
/// with one sequence and no sinks. Query head h reads KV head h / (n_head /
/// n_head_kv).
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
    let mut seq = [SeqAttn {
        q,
        spans,
        k,
        v,
        out,
    }];
    attend_seqs(pool, shape, &mut seq, scale, softcap, sinks)
}

/// A unit of work: rows `row0..row0 + rows` of sequence `seq` with the
/// query heads of KV head `kvh` (its vectors, row-major: vector j is row
/// row0 + j / group, head kvh * group + j % group), over the blocks its rows
/// reach.
struct Unit {
    seq: usize,
    row0: usize,
    rows: usize,
    kvh: usize,
    blocks: Range<usize>,
    /// Vector-blocks to compute.
    work: usize,
    /// For a unit whose blocks are spread over the threads: where its
    /// partials begin in the partial buffer ([vector][block of `blocks`]).
    split: Option<usize>,
}

/// A work item: a whole unit (its blocks in order, folded as it goes), or
/// one block of a split unit for its vectors `vecs`.
enum Item {
    Whole(usize),
    Block {
        unit: usize,
        b: usize,
        vecs: Range<usize>,
    },
}

/// Per-participant buffers.
struct Bufs {
    scores: Vec<f32>,
    /// A tile's queries, [tile][dk].
    qt: Vec<f32>,
    /// A tile's partials, [tile][2 + dv].
    part: Vec<f32>,
    /// A whole unit's running partials, [vector][2 + dv].
    run: Vec<f32>,
    /// The vectors that reach the current block.
    active: Vec<usize>,
}

/// What every item of one call reads.
struct Call<'a> {
    shape: AttnShape,
    /// Query vectors per kernel call.
    tile: usize,
    group: usize,
    ph: usize,
    simd: bool,
    wide: bool,
    scale: f32,
    softcap: Option<f32>,
    fold: Fold,
    sink_parts: Option<Vec<f32>>,
    qs: Vec<&'a [f32]>,
    spans: Vec<&'a [(usize, usize)]>,
    kv: Vec<(KvView<'a>, KvView<'a>)>,
    outs: Vec<SharedMut>,
    units: Vec<Unit>,
    parts: SharedMut,
}

impl Call<'_> {
    /// The span of unit `u`'s vector j.
    fn span(&self, u: &Unit, j: usize) -> (usize, usize) {
        self.spans[u.seq][u.row0 + j / self.group]
    }

    /// Where vector j of `u` sits in its sequence's q and out rows, as an
    /// index of (row, head).
    fn at(&self, u: &Unit, j: usize) -> usize {
        let (nh, g) = (self.shape.n_head, self.group);
        (u.row0 + j / g) * nh + u.kvh * g + j % g
    }

    /// Runs block `b` of unit `u` for the vectors `js` that reach it, in
    /// tiles; `done(j, part)` gets each vector's partial.
    fn block(
        &self,
        u: &Unit,
        b: usize,
        js: Range<usize>,
        ahead: (usize, usize),
        bufs: &mut Bufs,
        mut done: impl FnMut(usize, &[f32]),
    ) {
        let (dk, ph) = (self.shape.head_dim_k, self.ph);
        let Bufs {
            scores,
            qt,
            part,
            active,
            ..
        } = bufs;
        active.clear();
        active.extend(js.filter(|&j| {
            let (f, t) = in_block(self.span(u, j), b);
            f < t
        }));
        let q = self.qs[u.seq];
        let (k, v) = self.kv[u.seq];
        for (n, tile) in active.chunks(self.tile).enumerate() {
            let mut ranges = [(0, 0); TILE_WIDE];
            for (i, &j) in tile.iter().enumerate() {
                ranges[i] = in_block(self.span(u, j), b);
                let at = self.at(u, j) * dk;
                qt[i * dk..(i + 1) * dk].copy_from_slice(&q[at..at + dk]);
            }
            let t = tile.len();
            run_tile(
                self.simd,
                self.wide,
                self.shape,
                u.kvh,
                &qt[..t * dk],
                &ranges[..t],
                k,
                v,
                self.scale,
                self.softcap,
                // The first tile asks for the rows ahead; the others
                // read what it brought in.
                if n == 0 { ahead } else { (0, 0) },
                scores,
                &mut part[..t * ph],
            );
            for (i, &j) in tile.iter().enumerate() {
                done(j, &part[i * ph..(i + 1) * ph]);
            }
        }
    }

    /// Vector j's output from its folded partial `run`: the sink folded in,
    /// divided by the sum (zeros for an empty span).
    fn finish(&self, u: &Unit, j: usize, run: &mut [f32]) {
        let dv = self.shape.head_dim_v;
        let at = self.at(u, j);
        // SAFETY: at < rows * n_head of the sequence (the unit's rows and
        // heads), so the row is inside its `out` (checked at entry); each
        // (row, head) belongs to one unit, finished by one participant.
        let out = unsafe { self.outs[u.seq].slice(at * dv, dv) };
        if blocks_of(self.span(u, j)).is_empty() {
            out.fill(0.0);
            return;
        }
        if let Some(p) = &self.sink_parts {
            let h = at % self.shape.n_head;
            self.fold.combine(run, &p[h * self.ph..(h + 1) * self.ph]);
        }
        self.fold.finish(run, out);
    }

    /// A whole unit: its blocks in order, each vector's partials folded as
    /// they come, then its outputs.
    fn whole(&self, u: &Unit, bufs: &mut Bufs) {
        let ph = self.ph;
        let nvec = u.rows * self.group;
        let mut run = std::mem::take(&mut bufs.run);
        run.resize(nvec * ph, 0.0);
        let (dk, dv) = (self.shape.head_dim_k, self.shape.head_dim_v);
        for b in u.blocks.clone() {
            self.block(u, b, 0..nvec, (dk, dv), bufs, |j, p| {
                let r = &mut run[j * ph..(j + 1) * ph];
                if b == blocks_of(self.span(u, j)).start {
                    r.copy_from_slice(p);
                } else {
                    self.fold.combine(r, p);
                }
            });
        }
        for j in 0..nvec {
            self.finish(u, j, &mut run[j * ph..(j + 1) * ph]);
        }
        bufs.run = run;
    }

    /// Where vector j's partial of block b of a split unit lies.
    fn part_at(&self, u: &Unit, j: usize, b: usize) -> usize {
        let nb = u.blocks.len();
        u.split.expect("a split unit") + (j * nb + b - u.blocks.start) * self.ph
    }

    /// One block of a split unit, for the vectors `js`, into the partial
    /// buffer. `ahead` is what to ask the cache for ahead.
    fn split_block(
        &self,
        u: &Unit,
        b: usize,
        js: Range<usize>,
        ahead: (usize, usize),
        bufs: &mut Bufs,
    ) {
        let ph = self.ph;
        self.block(u, b, js, ahead, bufs, |j, p| {
            // SAFETY: (unit, vector, block) triples own disjoint ranges of
            // the partial buffer (laid out one after another), and each is
            // computed by the one item holding that block and vector.
            let dst = unsafe { self.parts.slice(self.part_at(u, j, b), ph) };
            dst.copy_from_slice(p);
        });
    }

    /// A split unit's partials folded in block order, then its outputs.
    fn fold_split(&self, u: &Unit, parts: &[f32], run: &mut [f32]) {
        let ph = self.ph;
        for j in 0..u.rows * self.group {
            let bs = blocks_of(self.span(u, j));
            if let Some(b0) = bs.clone().next() {
                let at = self.part_at(u, j, b0);
                run.copy_from_slice(&parts[at..at + ph]);
                for b in bs.skip(1) {
                    let at = self.part_at(u, j, b);
                    self.fold.combine(run, &parts[at..at + ph]);
                }
            }
            self.finish(u, j, run);
        }
    }
}

/// When `threads` threads end the `works` (largest first), each dealt to
/// the least loaded thread, with `even` (an even share of all the work, the
/// rest spread evenly) as a floor.
fn makespan(works: impl Iterator<Item = usize>, threads: usize, even: usize) -> usize {
    let mut load = vec![0usize; threads];
    for w in works {
        if let Some(min) = load.iter_mut().min() {
            *min += w;
        }
    }
    load.into_iter().max().unwrap_or(0).max(even)
}

/// How a call's work is cut: its units, the items over them, the chunks of
/// items the threads claim, and the length of the split units' partials.
struct Plan {
    units: Vec<Unit>,
    items: Vec<Item>,
    chunks: Vec<Range<usize>>,
    parts_len: usize,
}

/// The plan for the sequences' `spans`, KV heads of `group` query heads,
/// partials `ph` long, on `threads` threads.
fn plan(spans: &[&[(usize, usize)]], nkv: usize, group: usize, ph: usize, threads: usize) -> Plan {
    // The units, sequence by sequence, row group by row group, KV head by
    // KV head.
    let mut units = Vec::new();
    for (si, s) in spans.iter().enumerate() {
        for row0 in (0..s.len()).step_by(ROW_GROUP) {
            let rows = ROW_GROUP.min(s.len() - row0);
            let spans = &s[row0..row0 + rows];
            let reach = spans
                .iter()
                .map(|&sp| blocks_of(sp))
                .filter(|b| !b.is_empty());
            let start = reach.clone().map(|b| b.start).min().unwrap_or(0);
            let end = reach.clone().map(|b| b.end).max().unwrap_or(0);
            let work = reach.map(|b| b.len()).sum::<usize>() * group;
            for kvh in 0..nkv {
                units.push(Unit {
                    seq: si,
                    row0,
                    rows,
                    kvh,
                    blocks: start..end,
                    work,
                    split: None,
                });
            }
        }
    }
    // A unit goes whole to one thread, which folds its blocks as it goes
    // (no partials stored), unless that loads the threads unevenly: then the
    // largest units, one at a time, have their blocks spread over the
    // threads (partials stored, folded afterwards), until the whole ones,
    // dealt largest first to the least loaded thread, end within a quarter
    // of an even share.
    let total: usize = units.iter().map(|u| u.work).sum();
    let even = total.div_ceil(threads);
    let mut order: Vec<usize> = (0..units.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(units[i].work));
    let mut n_spread = 0;
    while threads > 1
        && n_spread < order.len()
        && 4 * makespan(
            order[n_spread..].iter().map(|&i| units[i].work),
            threads,
            even,
        ) > 5 * even
    {
        n_spread += 1;
    }
    order[..n_spread].sort_unstable();
    let mut parts_len = 0;
    for &i in &order[..n_spread] {
        let u = &mut units[i];
        u.split = Some(parts_len);
        parts_len += u.rows * group * u.blocks.len() * ph;
    }

    // Whole units first, the largest first; then the split units' blocks,
    // block by block with all KV heads of a block together (a chunk of
    // items then reads whole cache rows one after another: the KV heads of
    // a position sit side by side).
    let mut whole: Vec<usize> = (0..units.len())
        .filter(|&i| units[i].split.is_none())
        .collect();
    whole.sort_by_key(|&i| std::cmp::Reverse(units[i].work));
    let mut items: Vec<Item> = whole.into_iter().map(Item::Whole).collect();
    let n_whole = items.len();
    let split_blocks: usize = units
        .iter()
        .filter(|u| u.split.is_some())
        .map(|u| u.blocks.len())
        .sum();
    // Items per split block, so that the threads have work: with enough
    // blocks one (all the unit's vectors: each K and V load serves them
    // all), else the vectors cut into parts of whole tiles where possible.
    let per_block = (2 * threads).div_ceil(split_blocks.max(1));
    let mut first = 0;
    while first < units.len() {
        // The units of one (sequence, row group): its KV heads.
        let us = &units[first..first + nkv];
        let split = || us.iter().enumerate().filter(|(_, u)| u.split.is_some());
        let start = split().map(|(_, u)| u.blocks.start).min().unwrap_or(0);
        let end = split().map(|(_, u)| u.blocks.end).max().unwrap_or(0);
        for b in start..end {
            for (i, u) in split().filter(|(_, u)| u.blocks.contains(&b)) {
                let nvec = u.rows * group;
                let step = nvec.div_ceil(per_block);
                let step = if step > TILE {
                    step.next_multiple_of(TILE)
                } else {
                    step
                };
                for j in (0..nvec).step_by(step) {
                    items.push(Item::Block {
                        unit: first + i,
                        b,
                        vecs: j..(j + step).min(nvec),
                    });
                }
            }
        }
        first += nkv;
    }
    // Chunks: a whole unit each; split blocks several to a chunk (about
    // four chunks per thread).
    let n_split = items.len() - n_whole;
    let per = n_split.div_ceil(threads * 4).max(1);
    let chunks: Vec<Range<usize>> = (0..n_whole)
        .map(|i| i..i + 1)
        .chain(
            (n_whole..items.len())
                .step_by(per)
                .map(|i| i..(i + per).min(items.len())),
        )
        .collect();

    Plan {
        units,
        items,
        chunks,
        parts_len,
    }
}

/// Attention for the rows of several sequences, each over its own cache, in
/// one parallel call. Query head h reads KV head h / (n_head / n_head_kv).
/// Each row's result is the same bits whatever the other rows and
/// sequences and the threads (see the module header); a row whose span is
/// empty gets zeros. `sinks` as in [`attend_rows_sinks`].
///
/// The rows of a sequence are taken [`ROW_GROUP`] at a time with one KV
/// head's query heads: a unit. A unit that is a large part of the work
/// (one sequence's decode or verify step) has its blocks spread over the
/// threads, their partials folded afterwards in block order; the others
/// (many sequences, a prefill's many row groups) each go to one thread,
/// which folds its blocks as it goes.
pub fn attend_seqs(
    pool: &Pool,
    shape: AttnShape,
    seqs: &mut [SeqAttn],
    scale: f32,
    softcap: Option<f32>,
    sinks: Option<&[f32]>,
) {
    attend_seqs_at(level(), pool, shape, seqs, scale, softcap, sinks)
}

/// [`attend_seqs`] at a given level (at most [`level`]: the tests run every
/// level the CPU has).
fn attend_seqs_at(
    isa: Isa,
    pool: &Pool,
    shape: AttnShape,
    seqs: &mut [SeqAttn],
    scale: f32,
    softcap: Option<f32>,
    sinks: Option<&[f32]>,
) {
    assert!(isa <= level(), "attention at {isa:?}, above {:?}", level());
    let (nh, nkv, dk, dv) = (
        shape.n_head,
        shape.n_head_kv,
        shape.head_dim_k,
        shape.head_dim_v,
    );
    assert!(
        nkv > 0 && nh.is_multiple_of(nkv),
        "attend_rows: {nh} query heads over {nkv} KV heads"
    );
    for s in seqs.iter() {
        let rows = s.spans.len();
        assert_eq!(s.q.len(), rows * nh * dk, "attend_rows: q shape");
        assert_eq!(s.out.len(), rows * nh * dv, "attend_rows: out shape");
    }
    if let Some(s) = sinks {
        assert_eq!(s.len(), nh, "attend_rows: one sink per query head");
    }
    #[cfg(target_arch = "x86_64")]
    let (simd, wide) = (isa >= Isa::Avx2, isa >= Isa::Avx512);
    #[cfg(not(target_arch = "x86_64"))]
    let (simd, wide) = (false, false);
    let group = nh / nkv;
    let ph = PART_HEAD + dv;
    let threads = pool.threads();

    let spans: Vec<&[(usize, usize)]> = seqs.iter().map(|s| s.spans).collect();
    let Plan {
        units,
        items,
        chunks,
        parts_len,
    } = plan(&spans, nkv, group, ph, threads);
    let mut parts = vec![0f32; parts_len];
    let call = Call {
        shape,
        tile: if wide { TILE_WIDE } else { TILE },
        group,
        ph,
        simd,
        wide,
        scale,
        softcap,
        fold: Fold { simd },
        // Head h's sink as a partial: [sink, 1, 0...], folded in last.
        sink_parts: sinks.map(|s| {
            let mut p = vec![0f32; nh * ph];
            for (h, part) in p.chunks_exact_mut(ph).enumerate() {
                part[0] = s[h];
                part[1] = 1.0;
            }
            p
        }),
        qs: seqs.iter().map(|s| s.q).collect(),
        spans,
        kv: seqs.iter().map(|s| (s.k, s.v)).collect(),
        outs: seqs
            .iter_mut()
            .map(|s| SharedMut(s.out.as_mut_ptr()))
            .collect(),
        units,
        parts: SharedMut(parts.as_mut_ptr()),
    };
    let call = &call;
    let items = &items;
    pool.for_each_chunk(chunks.len(), |c| {
        let mut bufs = Bufs {
            scores: Vec::new(),
            qt: vec![0f32; TILE_WIDE * dk],
            part: vec![0f32; TILE_WIDE * ph],
            run: Vec::new(),
            active: Vec::new(),
        };
        for item in &items[chunks[c].clone()] {
            match *item {
                Item::Whole(u) => call.whole(&call.units[u], &mut bufs),
                Item::Block { unit, b, ref vecs } => {
                    let u = &call.units[unit];
                    // The first KV head asks for whole cache rows: the
                    // other heads of the block come next.
                    let ahead = if u.kvh == 0 {
                        (nkv * dk, nkv * dv)
                    } else {
                        (dk, dv)
                    };
                    call.split_block(u, b, vecs.clone(), ahead, &mut bufs);
                }
            }
        }
    });
    if parts_len == 0 {
        return;
    }
    // The split units' folds, a unit per chunk.
    let split: Vec<usize> = (0..call.units.len())
        .filter(|&i| call.units[i].split.is_some())
        .collect();
    let parts = &parts;
    pool.for_each_chunk(split.len(), |c| {
        let mut run = vec![0f32; ph];
        call.fold_split(&call.units[split[c]], parts, &mut run);
    });
}

#[cfg(test)]
mod tests;
