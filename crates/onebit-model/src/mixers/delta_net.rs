//! Qwen3.5's gated delta-net (linear attention). The projections run
//! batched over every row; the convolution and the recurrence run token by
//! token within each sequence, carrying their state in `SeqState`, so a
//! batch and one token at a time compute the same bits.

use onebit_kernels::ops::{rmsnorm_inplace, silu};

use super::{conv_step, sigmoid, At, Run, Scratch, SeqRows, TokenMixer};
use crate::error::Result;
use crate::state::{LayerState, SeqState};
use crate::weights::DeltaNetWeights;

fn softplus(x: f32) -> f32 {
    // ln(1 + e^x) without overflow for large x.
    if x > 20.0 {
        x
    } else {
        x.exp().ln_1p()
    }
}

/// L2-normalises a head: x / sqrt(sum x^2 + eps).
fn l2_normalize(x: &mut [f32], eps: f32) {
    let ss: f64 = x.iter().map(|&v| v as f64 * v as f64).sum();
    let inv = (1.0 / (ss + eps as f64).sqrt()) as f32;
    x.iter_mut().for_each(|v| *v *= inv);
}

/// Qwen3.5's gated delta-net over the rows of each sequence.
impl TokenMixer for DeltaNetWeights {
    fn mix(
        &self,
        run: &Run,
        at: At,
        seqs: &mut [SeqRows],
        h: &[f32],
        _: &mut Scratch,
        out: &mut Vec<f32>,
    ) -> Result<()> {
        let w = self;
        let dn = &run.sem.delta_net.as_ref().expect("checked at load").value;
        let (nk, nv, dk, dv) = (dn.n_k_heads, dn.n_v_heads, dn.head_k_dim, dn.head_v_dim);
        let e = run.sem.dims.n_embd;
        let eps = run.sem.norm_eps.value;
        let n = h.len() / e;
        let qk = nk * dk;
        let channels = 2 * qk + nv * dv;
        let qkv = run.mm(&w.qkv, h, n);
        let z = run.mm(&w.gate, h, n);
        let beta = run.mm(&w.beta, h, n);
        let alpha = run.mm(&w.alpha, h, n);
        let q_scale = 1.0 / (dk as f32).sqrt();

        let mut o = vec![0f32; n * nv * dv];
        let mut conv = vec![0f32; channels];
        let mut sk = vec![0f32; dv];
        for sq in seqs.iter_mut() {
            let SeqState { layers, trail, .. } = &mut *sq.state;
            let LayerState::DeltaNet { history, s: state } = &mut layers[at.slot] else {
                unreachable!("linear layers hold delta-net states (SeqState::new)")
            };
            for t in sq.rows.clone() {
                conv_step(
                    &w.conv,
                    dn.conv_kernel,
                    history,
                    &qkv[t * channels..(t + 1) * channels],
                    &mut conv,
                );
                conv.iter_mut().for_each(|v| *v = silu(*v));
                let (q, rest) = conv.split_at_mut(qk);
                let (k, v) = rest.split_at_mut(qk);
                for head in q.chunks_exact_mut(dk) {
                    l2_normalize(head, eps);
                    head.iter_mut().for_each(|x| *x *= q_scale);
                }
                for head in k.chunks_exact_mut(dk) {
                    l2_normalize(head, eps);
                }
                for hv in 0..nv {
                    // V head hv reads q/k head hv % nk (the converter's tiled order).
                    let hk = hv % nk;
                    let (qh, kh) = (&q[hk * dk..(hk + 1) * dk], &k[hk * dk..(hk + 1) * dk]);
                    let vh = &v[hv * dv..(hv + 1) * dv];
                    let b = sigmoid(beta[t * nv + hv]);
                    let g = w.a[hv] * softplus(alpha[t * nv + hv] + w.dt_bias[hv]);
                    let decay = g.exp();
                    let st = &mut state[hv * dk * dv..(hv + 1) * dk * dv];
                    st.iter_mut().for_each(|x| *x *= decay);
                    // sk = S^T k; d = beta (v - sk); S += k d^T; o = S^T q
                    sk.fill(0.0);
                    for (i, &ki) in kh.iter().enumerate() {
                        let row = &st[i * dv..(i + 1) * dv];
                        sk.iter_mut().zip(row).for_each(|(a, s)| *a += ki * s);
                    }
                    sk.iter_mut()
                        .zip(vh)
                        .for_each(|(a, &vj)| *a = b * (vj - *a));
                    for (i, &ki) in kh.iter().enumerate() {
                        let row = &mut st[i * dv..(i + 1) * dv];
                        row.iter_mut().zip(&sk).for_each(|(s, dj)| *s += ki * dj);
                    }
                    let oh = &mut o[(t * nv + hv) * dv..(t * nv + hv + 1) * dv];
                    oh.fill(0.0);
                    for (i, &qi) in qh.iter().enumerate() {
                        let row = &st[i * dv..(i + 1) * dv];
                        oh.iter_mut().zip(row).for_each(|(a, s)| *a += qi * s);
                    }
                    rmsnorm_inplace(oh, &w.norm, eps);
                    let zh = &z[(t * nv + hv) * dv..(t * nv + hv + 1) * dv];
                    oh.iter_mut().zip(zh).for_each(|(a, &zz)| *a *= silu(zz));
                }
                if let Some(tr) = trail {
                    let (history, s) = (history.clone(), state.clone());
                    tr.record(at.slot, LayerState::DeltaNet { history, s });
                }
            }
        }
        *out = run.mm(&w.out, &o, n);
        Ok(())
    }
}
