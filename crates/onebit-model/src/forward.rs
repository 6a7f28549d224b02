//! The forward pass, in reading order: embed, then per layer a token mixer
//! (attention, short convolution or delta-net) and the feed-forward with their
//! norms, then the output norm and the logits.
//!
//! Several sequences run in one pass: their tokens are stacked into one
//! activation matrix so every matmul reads its weights once for all of them,
//! while each sequence's mixer reads and extends only its own state. Every
//! per-row computation (norms, matmul outputs, one query's attention, one
//! recurrent step) depends only on that row and its own sequence's state, so
//! a prompt prefilled in one batch, fed token by token, or run beside other
//! sequences gives the same logits, bit for bit.

use onebit_kernels::kv::KvType;
use onebit_kernels::ops::{gelu_tanh, glu_par, rmsnorm, rmsnorm_inplace, softcap, GluAct};
use onebit_kernels::rope::{imrope_axes, Rope};
use onebit_kernels::{matmul, matmul_many, Pool, Precision, QMatrix};
use std::cell::OnceCell;

use crate::error::{ModelError, Result};
use crate::mixers::{At, Run, Scratch, SeqRows};
use crate::rows::{par_rows, sized};
use crate::semantics::{proportional_factors, Activation, Mask, RopeSpec, Semantics};
use crate::state::{GridSpan, LayerState, SeqState};
use crate::weights::{Ffn, Weights};

/// Prompt tokens per forward pass of [`Model::forward`]: enough rows for
/// the wide matmul kernels, few enough that the activations of a long prompt
/// stay a few MB.
const UBATCH: usize = 128;

/// How the forward runs: threads, arithmetic and the context limit.
#[derive(Clone, Debug)]
pub struct ExecConfig {
    pub threads: usize,
    pub precision: Precision,
    /// Positions a sequence may reach; 0 = the model's trained context.
    pub max_context: usize,
    /// What the KV caches of new sequences store.
    pub kv_type: KvType,
}

impl Default for ExecConfig {
    fn default() -> Self {
        ExecConfig {
            threads: 0,
            precision: Precision::Quantized,
            max_context: 0,
            kv_type: KvType::default(),
        }
    }
}

/// Which logits the caller wants back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Logits {
    /// Only the last position's (\[n_vocab\]).
    Last,
    /// Every position's (\[n_tokens\]\[n_vocab\]).
    All,
    /// None (an empty vector): the state advances, the output matrix is not
    /// run (the leading micro-batches of a long prompt).
    None,
    /// Every position's final normed hidden state (\[n_tokens\]\[n_embd\]),
    /// the output matrix not run: what embeddings pool.
    Hidden,
}

/// Rows given in place of token embeddings: an image's soft tokens at
/// `at..at + n` of a sequence's `tokens` (the ids there are placeholders,
/// checked against the vocabulary but not looked up). The rows enter as
/// they are: no embedding scale (llama.cpp's gemma3 graph scales only
/// token rows, `ubatch.token ? sqrt(n_embd) : 1`). A row is the embedding,
/// then the deepstack features the model declares (`Body::deepstack`),
/// which are added to the first layers' outputs. The rows always run whole
/// in one forward call.
#[derive(Clone, Copy, Debug)]
pub struct Embeds<'a> {
    /// Index in the sequence's tokens of the first row.
    pub at: usize,
    /// [n][n_embd x (1 + deepstack)] (`Semantics::input_width`)
    pub rows: &'a [f32],
    /// The rows laid out as `(nx, ny)`: ny rows of nx, row-major. A model
    /// with multi-axis RoPE (`RopeSpec::sections`) places them on that
    /// grid of positions; others (and None) at consecutive positions.
    pub grid: Option<(usize, usize)>,
    /// The rows attend to each other both ways (and, as every row, to the
    /// positions before them): what llama.cpp does for a Gemma 3 image by
    /// decoding its chunk with causal attention off (mtmd's
    /// `mtmd_decode_use_non_causal`). The image must then run whole in one
    /// forward call.
    pub bidirectional: bool,
}

impl Embeds<'_> {
    /// How many rows, of `width` values each.
    pub fn n_rows(&self, width: usize) -> usize {
        self.rows.len() / width.max(1)
    }
}

/// One sequence's part of a batched forward call.
pub struct SeqInput<'a> {
    pub state: &'a mut SeqState,
    pub tokens: &'a [u32],
    pub want: Logits,
}

pub struct Model {
    pub sem: Semantics,
    pub weights: Weights,
    rope_full: Rope,
    rope_sliding: Rope,
    pool: Pool,
    precision: Precision,
    max_context: usize,
    kv_type: KvType,
}

/// A sequence's rows in the stacked activations.
struct Segment {
    rows: std::ops::Range<usize>,
    pos0: usize,
}

/// The context limit of a run: the configured one, else the model's trained
/// context, else 4096.
pub fn context_limit(exec: &ExecConfig, sem: &Semantics) -> usize {
    match (exec.max_context, sem.dims.n_ctx_train) {
        (0, 0) => 4096,
        (0, t) => t,
        (c, _) => c,
    }
}

impl Model {
    pub fn new(sem: Semantics, weights: Weights, exec: &ExecConfig) -> Model {
        Self::new_reporting(sem, weights, exec, &mut |_, _| {})
    }

    /// [`new`](Self::new), reporting the preparation of the weights (the
    /// long part of a load) as `progress(done, total)` in bytes.
    pub fn new_reporting(
        sem: Semantics,
        weights: Weights,
        exec: &ExecConfig,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Model {
        let max_context = context_limit(exec, &sem);
        // Table choices that depend on the context, resolved for this run.
        let sem = sem.at_context(max_context);
        let rope = |spec: &RopeSpec| {
            let proportional = spec
                .proportional
                .map(|r| proportional_factors(spec.n_rot / 2, r));
            let factors = spec
                .freq_factors
                .as_ref()
                .and_then(|n| weights.rope_factors.iter().find(|(m, _)| m == n))
                .map(|(_, f)| &f[..])
                .or(proportional.as_deref());
            // Unscaled angles, then the spec's scaling (linear or YaRN).
            let mut r = Rope::new(spec.style, spec.n_rot, spec.base, 1.0, factors);
            r.axes = spec.sections.and_then(|s| imrope_axes(s, spec.n_rot / 2));
            let (inv_freq, mscale) = spec.scaled_inv_freq(&r.inv_freq);
            r.inv_freq = inv_freq;
            r.attn_factor = mscale;
            r
        };
        let rope_full = rope(&sem.rope_full.value);
        let rope_sliding = rope(&sem.rope_sliding.value);
        let pool = Pool::new(exec.threads);
        if exec.precision == Precision::Quantized {
            // Prepare (rows interleaved into the SIMD kernels' layout) now,
            // not on the first prompt, in one mapping in reading order.
            QMatrix::prepare_all_reporting(&pool, &weights.matrices(), progress);
        }
        Model {
            sem,
            weights,
            rope_full,
            rope_sliding,
            pool,
            precision: exec.precision,
            max_context,
            kv_type: exec.kv_type,
        }
    }

    pub fn threads(&self) -> usize {
        self.pool.threads()
    }

    /// Runs this model's work on `other`'s thread pool from now on (a draft
    /// model beside its target: the two never run at once, and one set of
    /// spinning workers keeps the other's from taking the cores). Results
    /// do not depend on the pool.
    pub fn share_pool(&mut self, other: &Model) {
        self.pool = other.pool.clone();
    }

    pub fn max_context(&self) -> usize {
        self.max_context
    }

    /// What new sequences' KV caches store.
    pub fn kv_type(&self) -> KvType {
        self.kv_type
    }

    pub fn new_state(&self) -> SeqState {
        SeqState::new(&self.sem, self.kv_type)
    }

    fn mm(&self, w: &QMatrix, x: &[f32], n: usize) -> Vec<f32> {
        let mut out = vec![0f32; n * w.rows];
        matmul(&self.pool, self.precision, w, x, n, &mut out);
        out
    }

    /// Runs `tokens` at the next positions of `state`; returns the logits asked for.
    pub fn forward(&self, state: &mut SeqState, tokens: &[u32], want: Logits) -> Result<Vec<f32>> {
        // A bidirectional sequence attends to all of itself: one batch.
        if tokens.len() > UBATCH && self.sem.mask.value == Mask::Causal {
            // A long prompt runs in micro-batches: the same bits (every row
            // is computed the same way in any batch), a quarter of the
            // activation memory of one 512-token batch. Input errors are
            // refused before the state changes, as for one batch.
            self.check_input(state, tokens)?;
            // The KV cache grows once, to its final size, not per batch.
            for layer in state.layers.iter_mut() {
                if let LayerState::Attention(c) = layer {
                    c.k.reserve_rows(tokens.len());
                    c.v.reserve_rows(tokens.len());
                }
            }
            let mut out = Vec::new();
            let n_chunks = tokens.len().div_ceil(UBATCH);
            for (i, chunk) in tokens.chunks(UBATCH).enumerate() {
                // Only the last batch's last row is wanted for `Last`.
                let part = match want {
                    Logits::Last if i + 1 < n_chunks => Logits::None,
                    w => w,
                };
                out.extend(self.forward(state, chunk, part)?);
            }
            return Ok(out);
        }
        let mut seqs = [SeqInput {
            state,
            tokens,
            want,
        }];
        Ok(self
            .forward_batch(&mut seqs)?
            .pop()
            .expect("one sequence in, one out"))
    }

    /// [`Model::forward`] with some rows given as embeddings ([`Embeds`],
    /// sorted by `at`). A long prompt runs in micro-batches as `forward`
    /// does, a batch never cutting a bidirectional span.
    pub fn forward_embeds(
        &self,
        state: &mut SeqState,
        tokens: &[u32],
        embeds: &[Embeds],
        want: Logits,
    ) -> Result<Vec<f32>> {
        self.check_input(state, tokens)?;
        self.check_embeds(tokens, embeds)?;
        let mut out = Vec::new();
        let mut start = 0;
        while start < tokens.len() {
            let mut end = (start + UBATCH).min(tokens.len());
            if self.sem.mask.value == Mask::Bidirectional {
                end = tokens.len();
            }
            // Extend the batch to the end of a span it cuts (its rows
            // run whole: both-ways attention, grid positions).
            for e in embeds {
                let n = e.n_rows(self.sem.input_width());
                if e.at < end && e.at + n > end {
                    end = e.at + n;
                }
            }
            let part = match want {
                Logits::Last if end < tokens.len() => Logits::None,
                w => w,
            };
            let local: Vec<Embeds> = embeds
                .iter()
                .filter(|e| e.at >= start && e.at < end)
                .map(|e| Embeds {
                    at: e.at - start,
                    ..*e
                })
                .collect();
            let mut seqs = [SeqInput {
                state: &mut *state,
                tokens: &tokens[start..end],
                want: part,
            }];
            out.extend(
                self.forward_batch_embeds(&mut seqs, &[&local])?
                    .pop()
                    .expect("one sequence in, one out"),
            );
            start = end;
        }
        Ok(out)
    }

    /// Refuses embedding rows that do not fit the tokens they stand in for.
    fn check_embeds(&self, tokens: &[u32], embeds: &[Embeds]) -> Result<()> {
        let e = self.sem.input_width();
        if embeds.is_empty() {
            return Ok(());
        }
        if self.weights.per_layer_input.is_some() {
            return Err(ModelError::Input(format!(
                "{}: rows given as embeddings (an image) are not supported: this model's per-layer embeddings are looked up by token id",
                self.sem.family
            )));
        }
        let mut next = 0;
        for em in embeds {
            if em.rows.is_empty() || em.rows.len() % e != 0 {
                return Err(ModelError::Input(format!(
                    "embedding rows at token {}: {} values are not whole rows of the model's input width {e} ({})",
                    em.at,
                    em.rows.len(),
                    match self.sem.body.value.deepstack {
                        0 => "n_embd".to_string(),
                        k => format!("n_embd x (1 + {k} deepstack features)"),
                    }
                )));
            }
            let n = em.rows.len() / e;
            if let Some((nx, ny)) = em.grid {
                if nx.checked_mul(ny) != Some(n) {
                    return Err(ModelError::Input(format!(
                        "embedding rows at token {}: a grid of {nx} x {ny} for {n} rows",
                        em.at
                    )));
                }
            }
            if em.at < next || em.at + n > tokens.len() {
                return Err(ModelError::Input(format!(
                    "embedding rows at tokens {}..{}: outside the {} tokens or overlapping the rows before",
                    em.at,
                    em.at + n,
                    tokens.len()
                )));
            }
            if let Some(bad) = em.rows.iter().position(|v| !v.is_finite()) {
                return Err(ModelError::Input(format!(
                    "embedding rows at token {}: value {bad} is not finite",
                    em.at
                )));
            }
            next = em.at + n;
        }
        Ok(())
    }

    /// The pooled embedding through the model's pooled head (its
    /// `pooled_head` matrices in order; unchanged when it declares none).
    pub fn pooled_head(&self, pooled: &[f32]) -> Vec<f32> {
        let mut v = pooled.to_vec();
        for m in &self.weights.pooled_head {
            v = self.mm(m, &v, 1);
        }
        v
    }

    /// Refuses tokens that one forward call of this sequence could not run.
    fn check_input(&self, state: &SeqState, tokens: &[u32]) -> Result<()> {
        let d = &self.sem.dims;
        if tokens.is_empty() {
            return Err(ModelError::Input("no tokens to run".into()));
        }
        if let Some(&bad) = tokens.iter().find(|&&t| t as usize >= d.n_vocab) {
            return Err(ModelError::Input(format!(
                "token id {bad} is outside the vocabulary (size {})",
                d.n_vocab
            )));
        }
        if state.layers.len() != self.sem.n_slots() {
            return Err(ModelError::Input(
                "sequence state belongs to another model".into(),
            ));
        }
        if self.sem.mask.value == Mask::Bidirectional && state.pos > 0 {
            return Err(ModelError::Input(format!(
                "{}: attention is bidirectional ({}), so a sequence runs whole in one call; this one already holds {} positions",
                self.sem.family, self.sem.mask.source, state.pos
            )));
        }
        let end = state.pos + tokens.len();
        if end > self.max_context {
            return Err(ModelError::Input(format!(
                "sequence of {end} positions exceeds the context limit {}",
                self.max_context
            )));
        }
        Ok(())
    }

    /// Runs several sequences in one pass; returns each one's logits in order.
    /// Each sequence's logits are exactly what `forward` alone would give.
    pub fn forward_batch(&self, seqs: &mut [SeqInput]) -> Result<Vec<Vec<f32>>> {
        self.forward_batch_embeds(seqs, &[])
    }

    /// [`Model::forward_batch`] with some rows of each sequence given as
    /// embeddings: `embeds` is empty (none) or holds one list per sequence
    /// (sorted by `at`). A bidirectional span must lie whole in its
    /// sequence's tokens of this call.
    pub fn forward_batch_embeds(
        &self,
        seqs: &mut [SeqInput],
        embeds: &[&[Embeds]],
    ) -> Result<Vec<Vec<f32>>> {
        let d = &self.sem.dims;
        if !embeds.is_empty() && embeds.len() != seqs.len() {
            return Err(ModelError::Input(format!(
                "{} embedding lists for {} sequences",
                embeds.len(),
                seqs.len()
            )));
        }
        let mut segs = Vec::with_capacity(seqs.len());
        let mut n = 0;
        for (i, s) in seqs.iter().enumerate() {
            self.check_input(s.state, s.tokens)?;
            if let Some(em) = embeds.get(i) {
                self.check_embeds(s.tokens, em)?;
            }
            segs.push(Segment {
                rows: n..n + s.tokens.len(),
                pos0: s.state.pos,
            });
            n += s.tokens.len();
        }

        // Embedding rows, scaled where the family says so.
        let e = d.n_embd;
        let mut x = vec![0f32; n * e];
        for (row, &id) in seqs.iter().flat_map(|s| s.tokens.iter()).enumerate() {
            self.weights
                .token_embd
                .dequantize_row(id as usize, &mut x[row * e..(row + 1) * e]);
        }
        if let Some(s) = self.sem.embed_scale.value {
            x.iter_mut().for_each(|v| *v *= s);
        }
        // Rows given as embeddings replace their tokens' rows, unscaled;
        // their deepstack features wait for the layers they join.
        let iw = self.sem.input_width();
        let mut deep: Vec<(usize, &[f32])> = Vec::new();
        for (seg, em) in segs.iter().zip(embeds) {
            for r in em.iter() {
                for (j, row) in r.rows.chunks_exact(iw).enumerate() {
                    let t = seg.rows.start + r.at + j;
                    x[t * e..(t + 1) * e].copy_from_slice(&row[..e]);
                    if iw > e {
                        deep.push((t, &row[e..]));
                    }
                }
            }
        }
        let ids: Vec<u32> = seqs.iter().flat_map(|s| s.tokens.iter().copied()).collect();
        let per_layer = self.per_layer_inputs(&ids, &x);

        let eps = self.sem.norm_eps.value;
        let layers = &self.weights.layers;
        let mut h = vec![0f32; n * e];
        if let Some(first) = layers.first() {
            par_rows(
                &self.pool,
                n,
                [e, e],
                [&mut x[..], &mut h[..]],
                |_, [xs, hs]| {
                    for (xr, hr) in xs.chunks_exact(e).zip(hs.chunks_exact_mut(e)) {
                        rmsnorm(xr, &first.attn_norm, eps, hr);
                    }
                },
            );
        }
        // Each stacked row's position; the RoPE angles of every row per
        // table are computed once for all the layers that use them.
        let mut positions = Vec::with_capacity(n);
        let mut new_grids = Vec::with_capacity(seqs.len());
        for (i, (s, seg)) in seqs.iter().zip(&segs).enumerate() {
            let (p, grids) = self.row_positions(s.state, seg, embeds.get(i).copied());
            positions.extend(p);
            new_grids.push(grids);
        }
        let run = Run {
            sem: &self.sem,
            pool: &self.pool,
            precision: self.precision,
            rope_full: &self.rope_full,
            rope_sliding: &self.rope_sliding,
            positions: &positions,
            angles_full: OnceCell::new(),
            angles_sliding: OnceCell::new(),
        };
        let mut rows: Vec<SeqRows> = seqs
            .iter_mut()
            .zip(&segs)
            .enumerate()
            .map(|(i, (s, seg))| SeqRows {
                state: &mut *s.state,
                rows: seg.rows.clone(),
                pos0: seg.pos0,
                both_ways: embeds.get(i).map_or(Vec::new(), |em| {
                    em.iter()
                        .filter(|r| r.bidirectional)
                        .map(|r| {
                            let p = seg.pos0 + r.at;
                            p..p + r.rows.len() / e
                        })
                        .collect()
                }),
            })
            .collect();
        // The layer bodies: every layer, `loops` passes of the stack, each
        // pass with its own state slots.
        let body = &self.sem.body.value;
        let n_slots = layers.len() * body.loops;
        let mut sc = Scratch::default();
        let mut fb = FfnBufs::default();
        let mut mixed = Vec::new();
        for slot in 0..n_slots {
            let il = slot % layers.len();
            let lw = &layers[il];
            let at = At { layer: il, slot };
            lw.mixer
                .mixer()
                .mix(&run, at, &mut rows, &h, &mut sc, &mut mixed)?;
            let post = lw.post_attn_norm.as_deref();
            self.residual(&mut x, &mut mixed, post, Some(&lw.ffn_norm), &mut h);
            self.feed_forward(il, &x, &h, n, &mut fb);
            let post = lw.post_ffn_norm.as_deref();
            let last = slot + 1 == n_slots;
            let pass_ends = (slot + 1) % layers.len() == 0;
            let between = !last && pass_ends && body.loop_norm;
            // Deepstack feature k joins layer k's output (llama.cpp: il <
            // n_deepstack_layers adds inp_embd's slice il + 1).
            let deep_here = (slot < body.deepstack).then_some(slot);
            let tail = lw.per_layer.is_some() || lw.out_scale.is_some() || deep_here.is_some();
            let next = (!last).then(|| &layers[(slot + 1) % layers.len()].attn_norm[..]);
            let fused_next = if between || tail { None } else { next };
            self.residual(&mut x, &mut fb.ff, post, fused_next, &mut h);
            if tail {
                self.layer_tail(il, &mut x, per_layer.as_deref(), n);
            }
            if let Some(k) = deep_here {
                for &(t, f) in &deep {
                    let add = &f[k * e..(k + 1) * e];
                    x[t * e..(t + 1) * e]
                        .iter_mut()
                        .zip(add)
                        .for_each(|(a, b)| *a += b);
                }
            }
            if between {
                // Between passes: x = norm(x; output_norm), then the first
                // layer's norm.
                self.renorm(
                    &mut x,
                    &self.weights.output_norm,
                    &layers[0].attn_norm,
                    &mut h,
                );
            } else if let (true, Some(next)) = (tail, next) {
                self.norm_rows(&x, next, &mut h);
            }
        }
        drop(rows);
        for ((s, seg), grids) in seqs.iter_mut().zip(&segs).zip(new_grids) {
            s.state.pos = seg.pos0 + seg.rows.len();
            s.state.grids.extend(grids);
        }

        // Output norm and logits, for the rows asked for.
        let rows: Vec<usize> = seqs
            .iter()
            .zip(&segs)
            .flat_map(|(s, seg)| match s.want {
                Logits::Last => seg.rows.end - 1..seg.rows.end,
                Logits::All | Logits::Hidden => seg.rows.clone(),
                Logits::None => seg.rows.end..seg.rows.end,
            })
            .collect();
        let mut hn = vec![0f32; rows.len() * e];
        for (j, &t) in rows.iter().enumerate() {
            rmsnorm(
                &x[t * e..(t + 1) * e],
                &self.weights.output_norm,
                eps,
                &mut hn[j * e..(j + 1) * e],
            );
        }
        // Hidden rows are answered as they are; the others go through the
        // output matrix (gathered when both kinds share the batch).
        let hidden = |s: &SeqInput| matches!(s.want, Logits::Hidden);
        let mut want_logits = Vec::new();
        let mut at = 0;
        for s in seqs.iter() {
            let k = match s.want {
                Logits::Last => 1,
                Logits::All | Logits::Hidden => s.tokens.len(),
                Logits::None => 0,
            };
            if !hidden(s) {
                want_logits.extend_from_slice(&hn[at * e..(at + k) * e]);
            }
            at += k;
        }
        let n_logit_rows = want_logits.len() / e;
        let mut logits = if n_logit_rows == 0 {
            Vec::new()
        } else {
            self.mm(&self.weights.output, &want_logits, n_logit_rows)
        };
        if let Some(cap) = self.sem.final_softcap.value {
            softcap(&mut logits, cap);
        }
        let v = d.n_vocab;
        let mut out = Vec::with_capacity(seqs.len());
        let (mut at, mut at_logit) = (0, 0);
        for s in seqs.iter() {
            let k = match s.want {
                Logits::Last => 1,
                Logits::All | Logits::Hidden => s.tokens.len(),
                Logits::None => 0,
            };
            if hidden(s) {
                out.push(hn[at * e..(at + k) * e].to_vec());
            } else {
                out.push(logits[at_logit * v..(at_logit + k) * v].to_vec());
                at_logit += k;
            }
            at += k;
        }
        Ok(out)
    }

    /// The four-component rotary positions (t, h, w, e) of one sequence's
    /// rows in this call, and the grid images among them. A text row sits
    /// at (p, p, p, 0), p its text position (`SeqState::text_pos`). With
    /// multi-axis RoPE, rows given with a grid of nx x ny sit at (p, p +
    /// row, p + column, 0) and the next row at p + max(nx, ny) (mtmd's
    /// `mtmd_image_tokens_get_decoder_pos` and `_get_n_pos` for
    /// MTMD_POS_TYPE_MROPE); without it every row at the next position.
    fn row_positions(
        &self,
        state: &SeqState,
        seg: &Segment,
        embeds: Option<&[Embeds]>,
    ) -> (Vec<[usize; 4]>, Vec<GridSpan>) {
        let n = seg.rows.len();
        let mut out = Vec::with_capacity(n);
        let mut grids = Vec::new();
        let mut p = state.text_pos(seg.pos0);
        let multi = self.sem.rope_full.value.sections.is_some();
        let mut spans = embeds
            .unwrap_or_default()
            .iter()
            .filter_map(|e| e.grid.filter(|_| multi).map(|g| (e.at, g)))
            .peekable();
        let mut j = 0;
        while j < n {
            match spans.peek() {
                Some(&(at, (nx, ny))) if at == j => {
                    spans.next();
                    for k in 0..nx * ny {
                        out.push([p, p + k / nx, p + k % nx, 0]);
                    }
                    grids.push(GridSpan {
                        at: seg.pos0 + j,
                        rows: nx * ny,
                        n_pos: nx.max(ny),
                    });
                    p += nx.max(ny);
                    j += nx * ny;
                }
                _ => {
                    out.push([p, p, p, 0]);
                    p += 1;
                    j += 1;
                }
            }
        }
        (out, grids)
    }

    /// Writes the feed-forward output into `ff`: the layer's dense FFN of
    /// `h`, or its routed experts (`moe.rs`), which may also read the
    /// residual `x`.
    fn feed_forward(&self, il: usize, x: &[f32], h: &[f32], n: usize, bufs: &mut FfnBufs) {
        let act = match self.sem.activation.value {
            Activation::SiluGate => GluAct::Silu,
            Activation::GeluTanhGate => GluAct::GeluTanh,
            Activation::SwigluOai => GluAct::SwigluOai,
        };
        let f = match &self.weights.layers[il].ffn {
            Ffn::Dense(f) => f,
            Ffn::Routed(r) => {
                let m = &self
                    .sem
                    .moe
                    .as_ref()
                    .expect("routed weights are loaded only for a declared Moe")
                    .value;
                let out = sized(&mut bufs.ff, n * self.sem.dims.n_embd);
                let eps = self.sem.norm_eps.value;
                return crate::moe::routed_ffn(
                    &self.pool,
                    self.precision,
                    act,
                    eps,
                    m,
                    r,
                    x,
                    h,
                    n,
                    out,
                );
            }
        };
        let FfnBufs { gate, up, ff } = bufs;
        let mut outs = [sized(gate, n * f.gate.rows), sized(up, n * f.up.rows)];
        matmul_many(
            &self.pool,
            self.precision,
            &[&f.gate, &f.up],
            h,
            n,
            &mut outs,
        );
        let [g, u] = outs;
        glu_par(&self.pool, act, g, u);
        let out = sized(ff, n * f.down.rows);
        matmul(&self.pool, self.precision, &f.down, g, n, out);
    }

    /// Gemma 4's per-layer inputs ([rows][n_layer * width]): the per-layer
    /// token table's row times sqrt(width), plus the scaled embedding `x0`
    /// projected, times 1/sqrt(n_embd), RMS-normed per layer slice; the sum
    /// times 1/sqrt(2). None when the model has no per-layer embeddings.
    fn per_layer_inputs(&self, ids: &[u32], x0: &[f32]) -> Option<Vec<f32>> {
        let p = self.weights.per_layer_input.as_ref()?;
        let pl = self.sem.body.value.per_layer_input;
        let e = self.sem.dims.n_embd;
        let eps = self.sem.norm_eps.value;
        let n = ids.len();
        let w = p.model_proj.rows;
        let mut proj = self.mm(&p.model_proj, x0, n);
        let proj_scale = 1.0 / (e as f32).sqrt();
        let tok_scale = (pl as f32).sqrt();
        let sum_scale = 1.0 / 2f32.sqrt();
        let mut tok = vec![0f32; w];
        for (row, &id) in proj.chunks_exact_mut(w).zip(ids) {
            p.token_embd.dequantize_row(id as usize, &mut tok);
            row.iter_mut().for_each(|v| *v *= proj_scale);
            for slice in row.chunks_exact_mut(pl) {
                rmsnorm_inplace(slice, &p.proj_norm, eps);
            }
            row.iter_mut()
                .zip(&tok)
                .for_each(|(v, t)| *v = (*v + t * tok_scale) * sum_scale);
        }
        Some(proj)
    }

    /// What follows a layer's FFN residual in Gemma 4: the per-layer
    /// embedding branch `x += norm(proj(gelu(inp_gate(x)) * slice); post_norm)`
    /// and the layer output scale.
    fn layer_tail(&self, il: usize, x: &mut [f32], per_layer: Option<&[f32]>, n: usize) {
        let lw = &self.weights.layers[il];
        let e = self.sem.dims.n_embd;
        let eps = self.sem.norm_eps.value;
        if let (Some(p), Some(inputs)) = (&lw.per_layer, per_layer) {
            let pl = p.inp_gate.rows;
            let w = inputs.len() / n;
            let mut g = self.mm(&p.inp_gate, x, n);
            for (t, row) in g.chunks_exact_mut(pl).enumerate() {
                let slice = &inputs[t * w + il * pl..t * w + (il + 1) * pl];
                row.iter_mut()
                    .zip(slice)
                    .for_each(|(a, s)| *a = gelu_tanh(*a) * s);
            }
            let mut branch = self.mm(&p.proj, &g, n);
            par_rows(
                &self.pool,
                n,
                [e, e],
                [x, &mut branch[..]],
                |_, [xs, bs]| {
                    for (xr, br) in xs.chunks_exact_mut(e).zip(bs.chunks_exact_mut(e)) {
                        rmsnorm_inplace(br, &p.post_norm, eps);
                        xr.iter_mut().zip(br.iter()).for_each(|(a, b)| *a += b);
                    }
                },
            );
        }
        if let Some(s) = lw.out_scale {
            x.iter_mut().for_each(|v| *v *= s);
        }
    }

    /// `h = norm(x; w)`, rows in parallel.
    fn norm_rows(&self, x: &[f32], w: &[f32], h: &mut [f32]) {
        let e = self.sem.dims.n_embd;
        let eps = self.sem.norm_eps.value;
        let n = x.len() / e;
        par_rows(&self.pool, n, [e], [h], |r0, [hs]| {
            for (j, hr) in hs.chunks_exact_mut(e).enumerate() {
                let t = r0 + j;
                rmsnorm(&x[t * e..(t + 1) * e], w, eps, hr);
            }
        });
    }

    /// Between two passes of the layer stack: `x = norm(x; w)` in place,
    /// then `h = norm(x; next)`, rows in parallel.
    fn renorm(&self, x: &mut [f32], w: &[f32], next: &[f32], h: &mut [f32]) {
        let e = self.sem.dims.n_embd;
        let eps = self.sem.norm_eps.value;
        let n = x.len() / e;
        par_rows(&self.pool, n, [e, e], [x, h], |_, [xs, hs]| {
            for (xr, hr) in xs.chunks_exact_mut(e).zip(hs.chunks_exact_mut(e)) {
                rmsnorm_inplace(xr, w, eps);
                rmsnorm(xr, next, eps, hr);
            }
        });
    }

    /// The residual step after a mixer or feed-forward, rows in parallel:
    /// `delta` through its post-norm (when the model has one), added into
    /// `x`, then `x` through the next norm into `h` (when one follows).
    fn residual(
        &self,
        x: &mut [f32],
        delta: &mut [f32],
        post: Option<&[f32]>,
        next: Option<&[f32]>,
        h: &mut [f32],
    ) {
        let e = self.sem.dims.n_embd;
        let eps = self.sem.norm_eps.value;
        let n = x.len() / e;
        par_rows(
            &self.pool,
            n,
            [e, e, e],
            [x, delta, h],
            |_, [xs, ds, hs]| {
                let rows = xs.chunks_exact_mut(e).zip(ds.chunks_exact_mut(e));
                for ((xr, dr), hr) in rows.zip(hs.chunks_exact_mut(e)) {
                    if let Some(w) = post {
                        rmsnorm_inplace(dr, w, eps);
                    }
                    xr.iter_mut().zip(dr.iter()).for_each(|(a, b)| *a += b);
                    if let Some(w) = next {
                        rmsnorm(xr, w, eps, hr);
                    }
                }
            },
        );
    }
}

/// The feed-forward's buffers, reused from layer to layer within one call.
#[derive(Default)]
struct FfnBufs {
    gate: Vec<f32>,
    up: Vec<f32>,
    ff: Vec<f32>,
}
