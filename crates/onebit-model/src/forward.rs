//! The forward pass, in reading order: embed, then per layer attention and
//! feed-forward with their norms, then the output norm and the logits.
//!
//! A batch of tokens (a prompt) and one token at a time go through the same
//! code, and every per-row computation (norms, matmul outputs, one query's
//! attention) depends only on that row and the cache, so prefilling a prompt in
//! one batch gives the same logits, bit for bit, as feeding it token by token.

use onebit_kernels::attention::{attend, AttnShape};
use onebit_kernels::ops::{gelu_tanh, rmsnorm, rmsnorm_inplace, silu, softcap};
use onebit_kernels::rope::Rope;
use onebit_kernels::{matmul, Pool, Precision, QMatrix};

use crate::error::{ModelError, Result};
use crate::semantics::{Activation, LayerKind, QkNorm, Semantics};
use crate::state::SeqState;
use crate::weights::Weights;

/// How the forward runs: threads and arithmetic.
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

pub struct Model {
    pub sem: Semantics,
    pub weights: Weights,
    rope_full: Rope,
    rope_sliding: Rope,
    pool: Pool,
    precision: Precision,
    max_context: usize,
}

/// Which logits the caller wants back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Logits {
    /// Only the last position's ([n_vocab]).
    Last,
    /// Every position's ([n_tokens][n_vocab]).
    All,
}

impl Model {
    pub fn new(sem: Semantics, weights: Weights, exec: &ExecConfig) -> Model {
        let rope = |spec: &crate::semantics::RopeSpec| {
            let factors = if spec.freq_factors {
                weights.rope_freqs.as_deref()
            } else {
                None
            };
            Rope::new(
                spec.style,
                spec.n_rot,
                spec.base,
                spec.freq_scale(),
                factors,
            )
        };
        let rope_full = rope(&sem.rope_full.value);
        let rope_sliding = rope(&sem.rope_sliding.value);
        let max_context = match (exec.max_context, sem.dims.n_ctx_train) {
            (0, 0) => 4096,
            (0, t) => t,
            (c, _) => c,
        };
        Model {
            sem,
            weights,
            rope_full,
            rope_sliding,
            pool: Pool::new(exec.threads),
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
        SeqState::new(self.sem.dims.n_layer)
    }

    fn mm(&self, w: &QMatrix, x: &[f32], n: usize) -> Vec<f32> {
        let mut out = vec![0f32; n * w.rows];
        matmul(&self.pool, self.precision, w, x, n, &mut out);
        out
    }

    /// Runs `tokens` at the next positions of `state` and returns the logits asked for.
    pub fn forward(&self, state: &mut SeqState, tokens: &[u32], want: Logits) -> Result<Vec<f32>> {
        let d = &self.sem.dims;
        let n = tokens.len();
        if n == 0 {
            return Err(ModelError::Input("no tokens to run".into()));
        }
        if let Some(&bad) = tokens.iter().find(|&&t| t as usize >= d.n_vocab) {
            return Err(ModelError::Input(format!(
                "token id {bad} is outside the vocabulary (size {})",
                d.n_vocab
            )));
        }
        let pos0 = state.pos;
        if pos0 + n > self.max_context {
            return Err(ModelError::Input(format!(
                "sequence of {} positions exceeds the context limit {}",
                pos0 + n,
                self.max_context
            )));
        }

        // Embedding rows, scaled where the family says so.
        let e = d.n_embd;
        let mut x = vec![0f32; n * e];
        for (t, &id) in tokens.iter().enumerate() {
            self.weights
                .token_embd
                .dequantize_row(id as usize, &mut x[t * e..(t + 1) * e]);
        }
        if let Some(s) = self.sem.embed_scale.value {
            x.iter_mut().for_each(|v| *v *= s);
        }

        let mut h = vec![0f32; n * e];
        for (il, lw) in self.weights.layers.iter().enumerate() {
            let kind = self.sem.layer_kinds.value[il];
            for t in 0..n {
                rmsnorm(
                    &x[t * e..(t + 1) * e],
                    &lw.attn_norm,
                    self.sem.norm_eps.value,
                    &mut h[t * e..(t + 1) * e],
                );
            }
            let mut attn = self.attention(il, kind, state, pos0, &h, n)?;
            if let Some(w) = &lw.post_attn_norm {
                for row in attn.chunks_exact_mut(e) {
                    rmsnorm_inplace(row, w, self.sem.norm_eps.value);
                }
            }
            x.iter_mut().zip(&attn).for_each(|(a, b)| *a += b);

            for t in 0..n {
                rmsnorm(
                    &x[t * e..(t + 1) * e],
                    &lw.ffn_norm,
                    self.sem.norm_eps.value,
                    &mut h[t * e..(t + 1) * e],
                );
            }
            let mut ff = self.feed_forward(il, &h, n);
            if let Some(w) = &lw.post_ffn_norm {
                for row in ff.chunks_exact_mut(e) {
                    rmsnorm_inplace(row, w, self.sem.norm_eps.value);
                }
            }
            x.iter_mut().zip(&ff).for_each(|(a, b)| *a += b);
        }
        state.pos = pos0 + n;

        // Output norm and logits, for the rows asked for.
        let rows: Vec<usize> = match want {
            Logits::Last => vec![n - 1],
            Logits::All => (0..n).collect(),
        };
        let mut hn = vec![0f32; rows.len() * e];
        for (j, &t) in rows.iter().enumerate() {
            rmsnorm(
                &x[t * e..(t + 1) * e],
                &self.weights.output_norm,
                self.sem.norm_eps.value,
                &mut hn[j * e..(j + 1) * e],
            );
        }
        let mut logits = self.mm(&self.weights.output, &hn, rows.len());
        if let Some(cap) = self.sem.final_softcap.value {
            softcap(&mut logits, cap);
        }
        Ok(logits)
    }

    fn attention(
        &self,
        il: usize,
        kind: LayerKind,
        state: &mut SeqState,
        pos0: usize,
        h: &[f32],
        n: usize,
    ) -> Result<Vec<f32>> {
        let d = &self.sem.dims;
        let lw = &self.weights.layers[il];
        let (dk, dv) = (d.head_dim_k, d.head_dim_v);
        let mut q = self.mm(&lw.wq, h, n);
        let mut k = self.mm(&lw.wk, h, n);
        let mut v = self.mm(&lw.wv, h, n);
        add_bias(&mut q, lw.bq.as_deref());
        add_bias(&mut k, lw.bk.as_deref());
        add_bias(&mut v, lw.bv.as_deref());

        let rope = if kind == LayerKind::Sliding {
            &self.rope_sliding
        } else {
            &self.rope_full
        };
        let eps = self.sem.norm_eps.value;
        let qk_norm = self.sem.qk_norm.value;
        let norm_heads = |buf: &mut [f32], w: &Option<Vec<f32>>| {
            if let Some(w) = w {
                for head in buf.chunks_exact_mut(dk) {
                    rmsnorm_inplace(head, w, eps);
                }
            }
        };
        for t in 0..n {
            let angles = rope.angles(pos0 + t);
            let qt = &mut q[t * d.n_head * dk..(t + 1) * d.n_head * dk];
            let kt = &mut k[t * d.n_head_kv * dk..(t + 1) * d.n_head_kv * dk];
            if qk_norm == QkNorm::BeforeRope {
                norm_heads(qt, &lw.q_norm);
                norm_heads(kt, &lw.k_norm);
            }
            for head in qt.chunks_exact_mut(dk) {
                rope.apply(head, &angles);
            }
            for head in kt.chunks_exact_mut(dk) {
                rope.apply(head, &angles);
            }
            if qk_norm == QkNorm::AfterRope {
                norm_heads(qt, &lw.q_norm);
                norm_heads(kt, &lw.k_norm);
            }
        }

        let cache = state.kv_mut(il);
        cache.append(&k, &v);
        let (kc, vc) = (&cache.k[..], &cache.v[..]);
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
        let parts = self.pool.map_ranges(n, 1, |range| {
            let mut out = vec![0f32; range.len() * width];
            let mut scores = Vec::new();
            for (j, t) in range.enumerate() {
                let p = pos0 + t;
                let from = window.map_or(0, |w| (p + 1).saturating_sub(w));
                let qt = &q[t * d.n_head * dk..(t + 1) * d.n_head * dk];
                attend(
                    shape,
                    qt,
                    kc,
                    vc,
                    from,
                    p + 1,
                    scale,
                    cap,
                    &mut scores,
                    &mut out[j * width..(j + 1) * width],
                );
            }
            out
        });
        let ctx: Vec<f32> = parts.concat();
        Ok(self.mm(&lw.wo, &ctx, n))
    }

    fn feed_forward(&self, il: usize, h: &[f32], n: usize) -> Vec<f32> {
        let lw = &self.weights.layers[il];
        let mut g = self.mm(&lw.gate, h, n);
        let u = self.mm(&lw.up, h, n);
        let act: fn(f32) -> f32 = match self.sem.activation.value {
            Activation::SiluGate => silu,
            Activation::GeluTanhGate => gelu_tanh,
        };
        for (a, b) in g.iter_mut().zip(&u) {
            *a = act(*a) * b;
        }
        self.mm(&lw.down, &g, n)
    }
}

fn add_bias(x: &mut [f32], b: Option<&[f32]>) {
    if let Some(b) = b {
        for row in x.chunks_exact_mut(b.len()) {
            row.iter_mut().zip(b).for_each(|(v, bb)| *v += bb);
        }
    }
}
