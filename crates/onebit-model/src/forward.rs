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

use onebit_kernels::attention::{attend_rows, AttnShape};
use onebit_kernels::kv::KvType;
use onebit_kernels::ops::{glu_par, rmsnorm, rmsnorm_inplace, softcap, GluAct};
use onebit_kernels::rope::Rope;
use onebit_kernels::{matmul, matmul_many, Pool, Precision, QMatrix};
use std::cell::OnceCell;
use std::sync::Mutex;

use crate::error::{ModelError, Result};
use crate::mixers;
use crate::semantics::{Activation, LayerKind, QkNorm, RopeSpec, Semantics};
use crate::state::{LayerState, SeqState};
use crate::weights::{AttnWeights, Mixer, Weights};

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
    /// Only the last position's ([n_vocab]).
    Last,
    /// Every position's ([n_tokens][n_vocab]).
    All,
    /// None (an empty vector): the state advances, the output matrix is not
    /// run (the leading micro-batches of a long prompt).
    None,
    /// Every position's final normed hidden state ([n_tokens][n_embd]),
    /// the output matrix not run: what embeddings pool.
    Hidden,
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

impl Model {
    pub fn new(sem: Semantics, weights: Weights, exec: &ExecConfig) -> Model {
        let max_context = match (exec.max_context, sem.dims.n_ctx_train) {
            (0, 0) => 4096,
            (0, t) => t,
            (c, _) => c,
        };
        let rope = |spec: &RopeSpec| {
            // LongRoPE: the long table when the run's context exceeds the original.
            let name = match &spec.long_factors {
                Some((long, orig)) if max_context > *orig => Some(long),
                _ => spec.freq_factors.as_ref(),
            };
            let factors = name
                .and_then(|n| weights.rope_factors.iter().find(|(m, _)| m == n))
                .map(|(_, f)| &f[..]);
            let mut r = Rope::new(
                spec.style,
                spec.n_rot,
                spec.base,
                spec.freq_scale(),
                factors,
            );
            r.attn_factor = spec.attn_factor;
            r
        };
        let rope_full = rope(&sem.rope_full.value);
        let rope_sliding = rope(&sem.rope_sliding.value);
        let pool = Pool::new(exec.threads);
        if exec.precision == Precision::Quantized {
            // Repack into the kernels' layouts now, not on the first prompt.
            for w in weights.matrices() {
                w.prepare(&pool);
            }
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

    pub(crate) fn mm(&self, w: &QMatrix, x: &[f32], n: usize) -> Vec<f32> {
        let mut out = vec![0f32; n * w.rows];
        matmul(&self.pool, self.precision, w, x, n, &mut out);
        out
    }

    /// Runs `tokens` at the next positions of `state`; returns the logits asked for.
    pub fn forward(&self, state: &mut SeqState, tokens: &[u32], want: Logits) -> Result<Vec<f32>> {
        if tokens.len() > UBATCH {
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
        if state.layers.len() != d.n_layer {
            return Err(ModelError::Input(
                "sequence state belongs to another model".into(),
            ));
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
        let d = &self.sem.dims;
        let mut segs = Vec::with_capacity(seqs.len());
        let mut n = 0;
        for s in seqs.iter() {
            self.check_input(s.state, s.tokens)?;
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
        // Each stacked row's position, and the RoPE angles of every row per
        // table, computed once for all the layers that use them.
        let positions: Vec<usize> = segs
            .iter()
            .flat_map(|s| (0..s.rows.len()).map(move |j| s.pos0 + j))
            .collect();
        let angles_full = OnceCell::new();
        let angles_sliding = OnceCell::new();
        let mut sc = Scratch::default();
        for (il, lw) in layers.iter().enumerate() {
            match &lw.mixer {
                Mixer::Attention(aw) => {
                    let (rope, cell) = if self.sem.layer_kinds.value[il] == LayerKind::Sliding {
                        (&self.rope_sliding, &angles_sliding)
                    } else {
                        (&self.rope_full, &angles_full)
                    };
                    let angles = cell.get_or_init(|| self.angle_table(rope, &positions));
                    self.attention(il, aw, seqs, &segs, &h, rope, angles, &mut sc);
                }
                Mixer::ShortConv(cw) => {
                    sc.mixed = mixers::short_conv(self, il, cw, seqs, &segs_rows(&segs), &h)?
                }
                Mixer::DeltaNet(dw) => {
                    sc.mixed = mixers::delta_net(self, il, dw, seqs, &segs_rows(&segs), &h)?
                }
            }
            let post = lw.post_attn_norm.as_deref();
            self.residual(&mut x, &mut sc.mixed, post, Some(&lw.ffn_norm), &mut h);
            self.feed_forward(il, &h, n, &mut sc);
            let next = layers.get(il + 1).map(|l| &l.attn_norm[..]);
            let post = lw.post_ffn_norm.as_deref();
            self.residual(&mut x, &mut sc.ff, post, next, &mut h);
        }
        for (s, seg) in seqs.iter_mut().zip(&segs) {
            s.state.pos = seg.pos0 + seg.rows.len();
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

    /// `rope`'s cos/sin pairs for every stacked row ([rows][n_rot / 2]).
    fn angle_table(&self, rope: &Rope, positions: &[usize]) -> Vec<(f32, f32)> {
        self.pool
            .map_ranges(positions.len(), 64, |r| {
                positions[r]
                    .iter()
                    .flat_map(|&p| rope.angles(p))
                    .collect::<Vec<_>>()
            })
            .concat()
    }

    /// Writes the attention output into `sc.mixed`.
    #[allow(clippy::too_many_arguments)]
    fn attention(
        &self,
        il: usize,
        aw: &AttnWeights,
        seqs: &mut [SeqInput],
        segs: &[Segment],
        h: &[f32],
        rope: &Rope,
        angles: &[(f32, f32)],
        sc: &mut Scratch,
    ) {
        let d = &self.sem.dims;
        let kind = self.sem.layer_kinds.value[il];
        let n = h.len() / d.n_embd;
        let (dk, dv) = (d.head_dim_k, d.head_dim_v);
        let gated = self.sem.attn_output_gate.value;
        let Scratch {
            q: q_all,
            k,
            v,
            ctx,
            mixed,
            ..
        } = sc;
        let mut outs = [
            sized(q_all, n * aw.wq.rows),
            sized(k, n * aw.wk.rows),
            sized(v, n * aw.wv.rows),
        ];
        matmul_many(
            &self.pool,
            self.precision,
            &[&aw.wq, &aw.wk, &aw.wv],
            h,
            n,
            &mut outs,
        );
        let qw = d.n_head * dk;
        // With an output gate, q rows are [q_h | gate_h] per head.
        let mut q_split = Vec::new();
        let (q, gate): (&mut [f32], _) = if gated {
            let mut g = Vec::with_capacity(n * qw);
            q_split.reserve_exact(n * qw);
            for head in q_all.chunks_exact(2 * dk) {
                q_split.extend_from_slice(&head[..dk]);
                g.extend_from_slice(&head[dk..]);
            }
            (&mut q_split[..], Some(g))
        } else {
            (&mut q_all[..], None)
        };
        add_bias(q, aw.bq.as_deref());
        add_bias(k, aw.bk.as_deref());
        add_bias(v, aw.bv.as_deref());

        let eps = self.sem.norm_eps.value;
        let qk_norm = self.sem.qk_norm.value;
        let norm_heads = |buf: &mut [f32], w: &Option<Vec<f32>>| {
            if let Some(w) = w {
                buf.chunks_exact_mut(dk)
                    .for_each(|head| rmsnorm_inplace(head, w, eps));
            }
        };
        let kw = d.n_head_kv * dk;
        let half = rope.inv_freq.len();
        // Per row: q/k norms and RoPE, rows in parallel.
        par_rows(
            &self.pool,
            n,
            [qw, kw],
            [&mut *q, &mut k[..]],
            |r0, [qs, ks]| {
                for (j, (qt, kt)) in qs
                    .chunks_exact_mut(qw)
                    .zip(ks.chunks_exact_mut(kw))
                    .enumerate()
                {
                    let t = r0 + j;
                    let angles = &angles[t * half..(t + 1) * half];
                    if qk_norm == QkNorm::BeforeRope {
                        norm_heads(qt, &aw.q_norm);
                        norm_heads(kt, &aw.k_norm);
                    }
                    qt.chunks_exact_mut(dk)
                        .for_each(|head| rope.apply(head, angles));
                    kt.chunks_exact_mut(dk)
                        .for_each(|head| rope.apply(head, angles));
                    if qk_norm == QkNorm::AfterRope {
                        norm_heads(qt, &aw.q_norm);
                        norm_heads(kt, &aw.k_norm);
                    }
                }
            },
        );

        let shape = AttnShape {
            n_head: d.n_head,
            n_head_kv: d.n_head_kv,
            head_dim_k: dk,
            head_dim_v: dv,
        };
        let window = match kind {
            LayerKind::Sliding => self.sem.sliding_window.value,
            _ => None,
        };
        let scale = self.sem.attn_scale.value;
        let cap = self.sem.attn_softcap.value;
        let width = d.n_head * dv;
        let vw = d.n_head_kv * dv;
        let ctx = sized(ctx, n * width);
        for (s, seg) in seqs.iter_mut().zip(segs) {
            let LayerState::Attention(cache) = &mut s.state.layers[il] else {
                unreachable!("attention layers hold KV caches (SeqState::new)")
            };
            cache.k.push(&k[seg.rows.start * kw..seg.rows.end * kw]);
            cache.v.push(&v[seg.rows.start * vw..seg.rows.end * vw]);
            let spans: Vec<(usize, usize)> = (0..seg.rows.len())
                .map(|i| {
                    let p = seg.pos0 + i;
                    (window.map_or(0, |w| (p + 1).saturating_sub(w)), p + 1)
                })
                .collect();
            attend_rows(
                &self.pool,
                shape,
                &q[seg.rows.start * qw..seg.rows.end * qw],
                &spans,
                cache.k.view(),
                cache.v.view(),
                scale,
                cap,
                &mut ctx[seg.rows.start * width..seg.rows.end * width],
            );
        }
        if let Some(g) = gate {
            ctx.iter_mut().zip(&g).for_each(|(c, g)| *c *= sigmoid(*g));
        }
        let out = sized(mixed, n * aw.wo.rows);
        matmul(&self.pool, self.precision, &aw.wo, ctx, n, out);
    }

    /// Writes the feed-forward output into `sc.ff`.
    fn feed_forward(&self, il: usize, h: &[f32], n: usize, sc: &mut Scratch) {
        let f = &self.weights.layers[il].ffn;
        let Scratch { gate, up, ff, .. } = sc;
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
        let act = match self.sem.activation.value {
            Activation::SiluGate => GluAct::Silu,
            Activation::GeluTanhGate => GluAct::GeluTanh,
        };
        glu_par(&self.pool, act, g, u);
        let out = sized(ff, n * f.down.rows);
        matmul(&self.pool, self.precision, &f.down, g, n, out);
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

/// Buffers reused from layer to layer within one forward call: the big
/// activations are allocated (and their pages faulted in) once per call
/// instead of once per op.
#[derive(Default)]
struct Scratch {
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    ctx: Vec<f32>,
    mixed: Vec<f32>,
    gate: Vec<f32>,
    up: Vec<f32>,
    ff: Vec<f32>,
}

/// `buf` at length `len`, for a kernel that overwrites every element (what
/// it held before is not cleared).
fn sized(buf: &mut Vec<f32>, len: usize) -> &mut [f32] {
    buf.resize(len, 0.0);
    &mut buf[..]
}

/// Calls `f(first_row, parts)` on consecutive blocks of rows of `N`
/// matrices with `n` rows each (`widths[i]` elements per row of `bufs[i]`),
/// the blocks in parallel. A row's result must depend only on that row.
fn par_rows<const N: usize>(
    pool: &Pool,
    n: usize,
    widths: [usize; N],
    bufs: [&mut [f32]; N],
    f: impl Fn(usize, [&mut [f32]; N]) + Sync,
) {
    for (b, w) in bufs.iter().zip(widths) {
        assert_eq!(b.len(), n * w, "par_rows: buffer shape");
    }
    // Rows per block: at least 8 (a block should outweigh a dispatch), about
    // 4 blocks per thread.
    let per = n.div_ceil(pool.threads() * 4).max(8);
    if n <= per || pool.threads() == 1 {
        return f(0, bufs);
    }
    let mut rest = bufs;
    let mut blocks = Vec::with_capacity(n.div_ceil(per));
    for r0 in (0..n).step_by(per) {
        let rows = per.min(n - r0);
        let part: [&mut [f32]; N] = std::array::from_fn(|i| {
            let (a, b) = std::mem::take(&mut rest[i]).split_at_mut(rows * widths[i]);
            rest[i] = b;
            a
        });
        blocks.push(Mutex::new(Some((r0, part))));
    }
    pool.for_each_chunk(blocks.len(), |c| {
        let taken = blocks[c].lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some((r0, part)) = taken {
            f(r0, part);
        }
    });
}

fn segs_rows(segs: &[Segment]) -> Vec<std::ops::Range<usize>> {
    segs.iter().map(|s| s.rows.clone()).collect()
}

pub(crate) fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

fn add_bias(x: &mut [f32], b: Option<&[f32]>) {
    if let Some(b) = b {
        for row in x.chunks_exact_mut(b.len()) {
            row.iter_mut().zip(b).for_each(|(v, bb)| *v += bb);
        }
    }
}
