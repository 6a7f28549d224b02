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
use onebit_kernels::ops::{glu_par, rmsnorm, rmsnorm_inplace, softcap, GluAct};
use onebit_kernels::rope::Rope;
use onebit_kernels::{matmul, matmul_many, Pool, Precision, QMatrix};

use crate::error::{ModelError, Result};
use crate::mixers;
use crate::semantics::{Activation, LayerKind, QkNorm, RopeSpec, Semantics};
use crate::state::{LayerState, SeqState};
use crate::weights::{AttnWeights, Mixer, Weights};

/// How the forward runs: threads, arithmetic and the context limit.
#[derive(Clone, Debug)]
pub struct ExecConfig {
    pub threads: usize,
    pub precision: Precision,
    /// Positions a sequence may reach; 0 = the model's trained context.
    pub max_context: usize,
}

impl Default for ExecConfig {
    fn default() -> Self {
        ExecConfig {
            threads: 0,
            precision: Precision::Quantized,
            max_context: 0,
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
        }
    }

    pub fn threads(&self) -> usize {
        self.pool.threads()
    }

    pub fn max_context(&self) -> usize {
        self.max_context
    }

    pub fn new_state(&self) -> SeqState {
        SeqState::new(&self.sem)
    }

    pub(crate) fn mm(&self, w: &QMatrix, x: &[f32], n: usize) -> Vec<f32> {
        let mut out = vec![0f32; n * w.rows];
        matmul(&self.pool, self.precision, w, x, n, &mut out);
        out
    }

    /// Several matrices over the same input: the input is quantized once.
    fn mm_many<const N: usize>(&self, ws: [&QMatrix; N], x: &[f32], n: usize) -> [Vec<f32>; N] {
        let mut outs = ws.map(|w| vec![0f32; n * w.rows]);
        let mut refs: Vec<&mut [f32]> = outs.iter_mut().map(|o| &mut o[..]).collect();
        matmul_many(&self.pool, self.precision, &ws, x, n, &mut refs);
        outs
    }

    /// Runs `tokens` at the next positions of `state`; returns the logits asked for.
    pub fn forward(&self, state: &mut SeqState, tokens: &[u32], want: Logits) -> Result<Vec<f32>> {
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

    /// Runs several sequences in one pass; returns each one's logits in order.
    /// Each sequence's logits are exactly what `forward` alone would give.
    pub fn forward_batch(&self, seqs: &mut [SeqInput]) -> Result<Vec<Vec<f32>>> {
        let d = &self.sem.dims;
        let mut segs = Vec::with_capacity(seqs.len());
        let mut n = 0;
        for s in seqs.iter() {
            if s.tokens.is_empty() {
                return Err(ModelError::Input("no tokens to run".into()));
            }
            if let Some(&bad) = s.tokens.iter().find(|&&t| t as usize >= d.n_vocab) {
                return Err(ModelError::Input(format!(
                    "token id {bad} is outside the vocabulary (size {})",
                    d.n_vocab
                )));
            }
            if s.state.layers.len() != d.n_layer {
                return Err(ModelError::Input(
                    "sequence state belongs to another model".into(),
                ));
            }
            let end = s.state.pos + s.tokens.len();
            if end > self.max_context {
                return Err(ModelError::Input(format!(
                    "sequence of {end} positions exceeds the context limit {}",
                    self.max_context
                )));
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

        let eps = self.sem.norm_eps.value;
        let mut h = vec![0f32; n * e];
        for (il, lw) in self.weights.layers.iter().enumerate() {
            norm_rows(&x, &lw.attn_norm, eps, &mut h, e);
            let mut mixed = match &lw.mixer {
                Mixer::Attention(aw) => self.attention(il, aw, seqs, &segs, &h),
                Mixer::ShortConv(cw) => {
                    mixers::short_conv(self, il, cw, seqs, &segs_rows(&segs), &h)?
                }
                Mixer::DeltaNet(dw) => {
                    mixers::delta_net(self, il, dw, seqs, &segs_rows(&segs), &h)?
                }
            };
            if let Some(w) = &lw.post_attn_norm {
                mixed
                    .chunks_exact_mut(e)
                    .for_each(|r| rmsnorm_inplace(r, w, eps));
            }
            x.iter_mut().zip(&mixed).for_each(|(a, b)| *a += b);

            norm_rows(&x, &lw.ffn_norm, eps, &mut h, e);
            let mut ff = self.feed_forward(il, &h, n);
            if let Some(w) = &lw.post_ffn_norm {
                ff.chunks_exact_mut(e)
                    .for_each(|r| rmsnorm_inplace(r, w, eps));
            }
            x.iter_mut().zip(&ff).for_each(|(a, b)| *a += b);
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
                Logits::All => seg.rows.clone(),
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
        let mut logits = self.mm(&self.weights.output, &hn, rows.len());
        if let Some(cap) = self.sem.final_softcap.value {
            softcap(&mut logits, cap);
        }
        let v = d.n_vocab;
        let mut out = Vec::with_capacity(seqs.len());
        let mut at = 0;
        for s in seqs.iter() {
            let k = match s.want {
                Logits::Last => 1,
                Logits::All => s.tokens.len(),
            };
            out.push(logits[at * v..(at + k) * v].to_vec());
            at += k;
        }
        Ok(out)
    }

    fn attention(
        &self,
        il: usize,
        aw: &AttnWeights,
        seqs: &mut [SeqInput],
        segs: &[Segment],
        h: &[f32],
    ) -> Vec<f32> {
        let d = &self.sem.dims;
        let kind = self.sem.layer_kinds.value[il];
        let n = h.len() / d.n_embd;
        let (dk, dv) = (d.head_dim_k, d.head_dim_v);
        let gated = self.sem.attn_output_gate.value;
        let [q_all, mut k, mut v] = self.mm_many([&aw.wq, &aw.wk, &aw.wv], h, n);
        let qw = d.n_head * dk;
        // With an output gate, q rows are [q_h | gate_h] per head.
        let (mut q, gate) = if gated {
            let mut q = Vec::with_capacity(n * qw);
            let mut g = Vec::with_capacity(n * qw);
            for head in q_all.chunks_exact(2 * dk) {
                q.extend_from_slice(&head[..dk]);
                g.extend_from_slice(&head[dk..]);
            }
            (q, Some(g))
        } else {
            (q_all, None)
        };
        add_bias(&mut q, aw.bq.as_deref());
        add_bias(&mut k, aw.bk.as_deref());
        add_bias(&mut v, aw.bv.as_deref());

        let rope = if kind == LayerKind::Sliding {
            &self.rope_sliding
        } else {
            &self.rope_full
        };
        let eps = self.sem.norm_eps.value;
        let qk_norm = self.sem.qk_norm.value;
        let norm_heads = |buf: &mut [f32], w: &Option<Vec<f32>>| {
            if let Some(w) = w {
                buf.chunks_exact_mut(dk)
                    .for_each(|head| rmsnorm_inplace(head, w, eps));
            }
        };
        let kw = d.n_head_kv * dk;
        for seg in segs {
            for (j, t) in seg.rows.clone().enumerate() {
                let angles = rope.angles(seg.pos0 + j);
                let qt = &mut q[t * qw..(t + 1) * qw];
                let kt = &mut k[t * kw..(t + 1) * kw];
                if qk_norm == QkNorm::BeforeRope {
                    norm_heads(qt, &aw.q_norm);
                    norm_heads(kt, &aw.k_norm);
                }
                qt.chunks_exact_mut(dk)
                    .for_each(|head| rope.apply(head, &angles));
                kt.chunks_exact_mut(dk)
                    .for_each(|head| rope.apply(head, &angles));
                if qk_norm == QkNorm::AfterRope {
                    norm_heads(qt, &aw.q_norm);
                    norm_heads(kt, &aw.k_norm);
                }
            }
        }

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
        let mut ctx = vec![0f32; n * width];
        for (s, seg) in seqs.iter_mut().zip(segs) {
            let LayerState::Attention(cache) = &mut s.state.layers[il] else {
                unreachable!("attention layers hold KV caches (SeqState::new)")
            };
            append_kv(&mut cache.k, &k[seg.rows.start * kw..seg.rows.end * kw]);
            append_kv(&mut cache.v, &v[seg.rows.start * vw..seg.rows.end * vw]);
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
                &cache.k,
                &cache.v,
                scale,
                cap,
                &mut ctx[seg.rows.start * width..seg.rows.end * width],
            );
        }
        if let Some(g) = gate {
            ctx.iter_mut().zip(&g).for_each(|(c, g)| *c *= sigmoid(*g));
        }
        self.mm(&aw.wo, &ctx, n)
    }

    fn feed_forward(&self, il: usize, h: &[f32], n: usize) -> Vec<f32> {
        let f = &self.weights.layers[il].ffn;
        let [mut g, u] = self.mm_many([&f.gate, &f.up], h, n);
        let act = match self.sem.activation.value {
            Activation::SiluGate => GluAct::Silu,
            Activation::GeluTanhGate => GluAct::GeluTanh,
        };
        glu_par(&self.pool, act, &mut g, &u);
        self.mm(&f.down, &g, n)
    }
}

/// Appends rows to a KV cache growing it by a quarter at a time rather than
/// doubling: after a long prompt, the first decoded token would otherwise
/// leave the cache with twice the memory it uses.
fn append_kv(cache: &mut Vec<f32>, rows: &[f32]) {
    if cache.capacity() - cache.len() < rows.len() {
        cache.reserve_exact(rows.len().max(cache.len() / 4));
    }
    cache.extend_from_slice(rows);
}

fn segs_rows(segs: &[Segment]) -> Vec<std::ops::Range<usize>> {
    segs.iter().map(|s| s.rows.clone()).collect()
}

fn norm_rows(x: &[f32], w: &[f32], eps: f32, out: &mut [f32], e: usize) {
    for (xr, or) in x.chunks_exact(e).zip(out.chunks_exact_mut(e)) {
        rmsnorm(xr, w, eps, or);
    }
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
