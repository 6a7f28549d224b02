//! The recurrent token mixers: LFM2's gated short convolution and Qwen3.5's
//! gated delta-net. Projections run batched over every row; the recurrence
//! runs token by token within each sequence, carrying its state in
//! `SeqState`, so a batch and one token at a time compute the same bits.

use std::ops::Range;

use onebit_kernels::ops::{rmsnorm_inplace, silu};

use crate::error::Result;
use crate::forward::{sigmoid, Model, SeqInput};
use crate::state::{LayerState, SeqState};
use crate::weights::{DeltaNetWeights, ShortConvWeights};

/// Causal depthwise convolution of one step: `history` holds the previous
/// (L - 1) inputs (oldest first), `input` the current one; tap j multiplies
/// input t - (L - 1) + j. Writes `out` and shifts `input` into the history.
fn conv_step(kernel: &[f32], l: usize, history: &mut [f32], input: &[f32], out: &mut [f32]) {
    let c = input.len();
    for ch in 0..c {
        let taps = &kernel[ch * l..(ch + 1) * l];
        let mut acc = 0f32;
        for j in 0..l - 1 {
            acc += taps[j] * history[j * c + ch];
        }
        acc += taps[l - 1] * input[ch];
        out[ch] = acc;
    }
    if l > 1 {
        history.copy_within(c.., 0);
        history[(l - 2) * c..].copy_from_slice(input);
    }
}

/// LFM2: in_proj -> B, C, x; y = C * conv(B * x); out_proj(y).
pub(crate) fn short_conv(
    m: &Model,
    il: usize,
    w: &ShortConvWeights,
    seqs: &mut [SeqInput],
    segs: &[Range<usize>],
    h: &[f32],
) -> Result<Vec<f32>> {
    let e = m.sem.dims.n_embd;
    let n = h.len() / e;
    let l = w.kernel.len() / e;
    let bcx = m.mm(&w.in_proj, h, n);
    let mut y = vec![0f32; n * e];
    let mut bx = vec![0f32; e];
    for (s, rows) in seqs.iter_mut().zip(segs) {
        let SeqState { layers, trail, .. } = &mut *s.state;
        let LayerState::ShortConv { history } = &mut layers[il] else {
            unreachable!("short-conv layers hold conv histories (SeqState::new)")
        };
        for t in rows.clone() {
            let row = &bcx[t * 3 * e..(t + 1) * 3 * e];
            let (b, rest) = row.split_at(e);
            let (c, x) = rest.split_at(e);
            bx.iter_mut()
                .zip(b.iter().zip(x))
                .for_each(|(o, (b, x))| *o = b * x);
            let yt = &mut y[t * e..(t + 1) * e];
            conv_step(&w.kernel, l, history, &bx, yt);
            yt.iter_mut().zip(c).for_each(|(v, c)| *v *= c);
            if let Some(tr) = trail {
                let history = history.clone();
                tr.record(il, LayerState::ShortConv { history });
            }
        }
    }
    Ok(m.mm(&w.out_proj, &y, n))
}

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
pub(crate) fn delta_net(
    m: &Model,
    il: usize,
    w: &DeltaNetWeights,
    seqs: &mut [SeqInput],
    segs: &[Range<usize>],
    h: &[f32],
) -> Result<Vec<f32>> {
    let dn = &m.sem.delta_net.as_ref().expect("checked at load").value;
    let (nk, nv, dk, dv) = (dn.n_k_heads, dn.n_v_heads, dn.head_k_dim, dn.head_v_dim);
    let e = m.sem.dims.n_embd;
    let eps = m.sem.norm_eps.value;
    let n = h.len() / e;
    let qk = nk * dk;
    let channels = 2 * qk + nv * dv;
    let qkv = m.mm(&w.qkv, h, n);
    let z = m.mm(&w.gate, h, n);
    let beta = m.mm(&w.beta, h, n);
    let alpha = m.mm(&w.alpha, h, n);
    let q_scale = 1.0 / (dk as f32).sqrt();

    let mut o = vec![0f32; n * nv * dv];
    let mut conv = vec![0f32; channels];
    let mut sk = vec![0f32; dv];
    for (s, rows) in seqs.iter_mut().zip(segs) {
        let SeqState { layers, trail, .. } = &mut *s.state;
        let LayerState::DeltaNet { history, s: state } = &mut layers[il] else {
            unreachable!("linear layers hold delta-net states (SeqState::new)")
        };
        for t in rows.clone() {
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
                tr.record(il, LayerState::DeltaNet { history, s });
            }
        }
    }
    Ok(m.mm(&w.out, &o, n))
}
