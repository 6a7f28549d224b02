//! The routed-experts FFN ([`Moe`]): routing, then every chosen expert
//! over the tokens routed to it.
//!
//! Invariant: a token's output depends only on its own row. Its routing is
//! a pure function of its router logits; each expert product of its row is
//! what `matmul` gives for that row alone (`matmul_each`), whatever other
//! tokens share the expert; its experts' outputs are added in its own
//! choice order (largest score first), then the shared expert's; the
//! norms a family declares around the branches (Gemma 4) are per row too.
//! So a batch gives the bits of one token at a time.
//!
//! Work per call: one router product; one dispatch for every chosen
//! expert's gate and up (and the shared expert's, and its gate), each
//! input quantized once; one dispatch for every down product. Decode reads
//! only the chosen experts' rows; prefill groups the tokens by expert, so
//! each expert's rows are read once for all of its tokens.

use onebit_kernels::matmul::{matmul_each, Input, Product};
use onebit_kernels::ops::{glu, rmsnorm, rmsnorm_inplace, GluAct};
use onebit_kernels::{matmul, Pool, Precision};

use crate::semantics::{Gating, Moe};
use crate::weights::RoutedWeights;

/// The smallest weight sum renormalization divides by (llama.cpp clamps
/// the sum to the smallest normal f16, 2^-14).
const MIN_WEIGHT_SUM: f32 = 6.103_515_6e-5;

/// One token's routing: `chosen` gets the `n_used` experts with their
/// weights, largest selection score first (ties: the lower expert id).
/// `logits` are the router's outputs (its bias added), `selection_bias`
/// the `exp_probs_b` values when the routing chooses with them.
pub fn route(
    m: &Moe,
    logits: &[f32],
    selection_bias: Option<&[f32]>,
    scores: &mut Vec<f32>,
    chosen: &mut Vec<(usize, f32)>,
) {
    scores.clear();
    match m.gating.value {
        Gating::Softmax => {
            let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            scores.extend(logits.iter().map(|&l| (l - max).exp()));
            let sum: f32 = scores.iter().sum();
            scores.iter_mut().for_each(|p| *p /= sum);
        }
        Gating::Sigmoid => scores.extend(logits.iter().map(|&l| 1.0 / (1.0 + (-l).exp()))),
        Gating::SoftmaxWeight => scores.extend_from_slice(logits),
    }
    let select = |e: usize| match selection_bias {
        Some(b) => scores[e] + b[e],
        None => scores[e],
    };
    chosen.clear();
    for _ in 0..m.n_used {
        let mut best: Option<usize> = None;
        for e in 0..scores.len() {
            if chosen.iter().any(|&(c, _)| c == e) {
                continue;
            }
            // NaN never wins: an expert with a NaN score is chosen last.
            if best.is_none_or(|b| select(e) > select(b)) {
                best = Some(e);
            }
        }
        let e = best.expect("n_used <= n_expert, checked at load");
        chosen.push((e, scores[e]));
    }
    if m.gating.value == Gating::SoftmaxWeight {
        let max = chosen.iter().map(|c| c.1).fold(f32::NEG_INFINITY, f32::max);
        chosen.iter_mut().for_each(|(_, w)| *w = (*w - max).exp());
        let sum: f32 = chosen.iter().map(|c| c.1).sum();
        chosen.iter_mut().for_each(|(_, w)| *w /= sum);
    }
    if m.norm_weights.value {
        let sum: f32 = chosen.iter().map(|&(_, w)| w).sum();
        let sum = sum.max(MIN_WEIGHT_SUM);
        chosen.iter_mut().for_each(|(_, w)| *w /= sum);
    }
    let s = m.scale.value;
    if s != 1.0 {
        chosen.iter_mut().for_each(|(_, w)| *w *= s);
    }
}

/// The FFN of `n` rows into `out` (\[n\]\[n_embd\]): `x` is the residual
/// stream, `h` the FFN input norm(x; ffn_norm) (both \[n\]\[n_embd\]); `eps`
/// the model's RMSNorm epsilon.
#[allow(clippy::too_many_arguments)]
pub fn routed_ffn(
    pool: &Pool,
    precision: Precision,
    act: GluAct,
    eps: f32,
    m: &Moe,
    w: &RoutedWeights,
    x: &[f32],
    h: &[f32],
    n: usize,
    out: &mut [f32],
) {
    let e = h.len() / n.max(1);
    let (ne, ff) = (m.n_expert, m.n_ff_exp);
    // The router's input: h, or x RMS-normed without a weight, times
    // 1/sqrt(n_embd), times the router's per-channel scale, in that order
    // (llama.cpp's gemma4 graph).
    let scaled: Vec<f32>;
    let router_in: &[f32] = match &w.router_scale {
        None => h,
        Some(scale) => {
            let ones = vec![1f32; e];
            let c = 1.0 / (e as f32).sqrt();
            let mut r = vec![0f32; n * e];
            for (xr, rr) in x.chunks_exact(e).zip(r.chunks_exact_mut(e)) {
                rmsnorm(xr, &ones, eps, rr);
                rr.iter_mut().zip(scale).for_each(|(v, s)| *v = *v * c * s);
            }
            scaled = r;
            &scaled
        }
    };
    // The experts' input: h, or x through the experts' own norm.
    let normed: Vec<f32>;
    let he: &[f32] = match &w.branch_norms {
        None => h,
        Some(b) => {
            let mut r = vec![0f32; n * e];
            for (xr, rr) in x.chunks_exact(e).zip(r.chunks_exact_mut(e)) {
                rmsnorm(xr, &b.experts_in, eps, rr);
            }
            normed = r;
            &normed
        }
    };
    let mut logits = vec![0f32; n * ne];
    matmul(pool, precision, &w.router, router_in, n, &mut logits);
    if let Some(b) = &w.router_bias {
        for row in logits.chunks_exact_mut(ne) {
            row.iter_mut().zip(b).for_each(|(l, b)| *l += b);
        }
    }
    // Routing, and each expert's tokens in token order.
    let mut scores = Vec::with_capacity(ne);
    let mut one = Vec::with_capacity(m.n_used);
    let mut chosen: Vec<(usize, f32)> = Vec::with_capacity(n * m.n_used);
    let mut tokens_of: Vec<Vec<usize>> = vec![Vec::new(); ne];
    for (t, row) in logits.chunks_exact(ne).enumerate() {
        route(m, row, w.selection_bias.as_deref(), &mut scores, &mut one);
        for &(x, _) in &one {
            tokens_of[x].push(t);
        }
        chosen.extend_from_slice(&one);
    }
    let used: Vec<usize> = (0..ne).filter(|&x| !tokens_of[x].is_empty()).collect();

    // Inputs: 0 is the experts' input itself (an expert that has every
    // token reads it, as does the shared expert when the two read the
    // same); the others gather an expert's rows, then h for the shared
    // expert when the experts read another input.
    let gathered: Vec<Option<Vec<f32>>> = used
        .iter()
        .map(|&x| {
            let ts = &tokens_of[x];
            (ts.len() != n).then(|| {
                ts.iter()
                    .flat_map(|&t| &he[t * e..(t + 1) * e])
                    .copied()
                    .collect()
            })
        })
        .collect();
    let mut inputs = vec![Input { x: he, n_tok: n }];
    let input_of: Vec<usize> = gathered
        .iter()
        .zip(&used)
        .map(|(g, &x)| match g {
            Some(rows) => {
                inputs.push(Input {
                    x: rows,
                    n_tok: tokens_of[x].len(),
                });
                inputs.len() - 1
            }
            None => 0,
        })
        .collect();
    let shared_input = if w.branch_norms.is_some() {
        inputs.push(Input { x: h, n_tok: n });
        inputs.len() - 1
    } else {
        0
    };

    // Gate and up of every chosen expert (and the shared expert's, and its
    // gate), in one dispatch.
    let mut gates: Vec<Vec<f32>> = used
        .iter()
        .map(|&x| vec![0f32; tokens_of[x].len() * ff])
        .collect();
    let mut ups = gates.clone();
    let sw = m.shared.value.unwrap_or(0);
    let mut sgate = vec![0f32; if w.shared.is_some() { n * sw } else { 0 }];
    let mut sup = sgate.clone();
    let mut sg = vec![0f32; if w.shared_gate.is_some() { n } else { 0 }];
    {
        let mut products = Vec::with_capacity(2 * used.len() + 3);
        for (((&x, g), u), &i) in used.iter().zip(&mut gates).zip(&mut ups).zip(&input_of) {
            let f = &w.experts[x];
            products.push(Product {
                w: &f.gate,
                input: i,
                out: g,
            });
            products.push(Product {
                w: &f.up,
                input: i,
                out: u,
            });
        }
        if let Some(s) = &w.shared {
            products.push(Product {
                w: &s.gate,
                input: shared_input,
                out: &mut sgate,
            });
            products.push(Product {
                w: &s.up,
                input: shared_input,
                out: &mut sup,
            });
        }
        if let Some(g) = &w.shared_gate {
            products.push(Product {
                w: g,
                input: shared_input,
                out: &mut sg,
            });
        }
        matmul_each(pool, precision, &inputs, &mut products);
    }
    // Each expert's own gate and up biases (gpt-oss), on every row.
    if let Some(b) = &w.expert_biases {
        for ((&x, g), u) in used.iter().zip(&mut gates).zip(&mut ups) {
            add_rows(g, &b[x][0]);
            add_rows(u, &b[x][1]);
        }
    }
    // The activations, row by row (glu's bits do not depend on the split).
    for (g, u) in gates.iter_mut().zip(&ups) {
        for (gr, ur) in g.chunks_exact_mut(ff).zip(u.chunks_exact(ff)) {
            glu(act, gr, ur);
        }
    }
    if sw > 0 {
        for (gr, ur) in sgate.chunks_exact_mut(sw).zip(sup.chunks_exact(sw)) {
            glu(act, gr, ur);
        }
    }

    // Every down product in one dispatch.
    let mut downs: Vec<Vec<f32>> = used
        .iter()
        .map(|&x| vec![0f32; tokens_of[x].len() * e])
        .collect();
    let mut sdown = vec![0f32; if w.shared.is_some() { n * e } else { 0 }];
    {
        let mut down_inputs: Vec<Input> = used
            .iter()
            .zip(&gates)
            .map(|(&x, g)| Input {
                x: g,
                n_tok: tokens_of[x].len(),
            })
            .collect();
        let mut products: Vec<Product> = used
            .iter()
            .zip(&mut downs)
            .enumerate()
            .map(|(j, (&x, d))| Product {
                w: &w.experts[x].down,
                input: j,
                out: d,
            })
            .collect();
        if let Some(s) = &w.shared {
            down_inputs.push(Input {
                x: &sgate,
                n_tok: n,
            });
            products.push(Product {
                w: &s.down,
                input: down_inputs.len() - 1,
                out: &mut sdown,
            });
        }
        matmul_each(pool, precision, &down_inputs, &mut products);
    }

    if let Some(b) = &w.expert_biases {
        for (&x, d) in used.iter().zip(&mut downs) {
            add_rows(d, &b[x][2]);
        }
    }

    // Each token: its experts in its choice order (each output times its
    // scale, then its weight), their sum through its norm, then the shared
    // expert through its own.
    let mut slot = vec![0usize; ne]; // the expert's row of the next token
    let index: Vec<usize> = {
        let mut ix = vec![usize::MAX; ne];
        for (j, &x) in used.iter().enumerate() {
            ix[x] = j;
        }
        ix
    };
    for (t, o) in out.chunks_exact_mut(e).enumerate().take(n) {
        o.fill(0.0);
        for &(x, wt) in &chosen[t * m.n_used..(t + 1) * m.n_used] {
            let d = &downs[index[x]][slot[x] * e..(slot[x] + 1) * e];
            slot[x] += 1;
            match &w.expert_scale {
                Some(sc) => {
                    let s = sc[x];
                    o.iter_mut().zip(d).for_each(|(a, v)| *a += wt * (v * s));
                }
                None => o.iter_mut().zip(d).for_each(|(a, v)| *a += wt * v),
            }
        }
        if let Some(b) = &w.branch_norms {
            rmsnorm_inplace(o, &b.experts_out, eps);
        }
        if w.shared.is_some() {
            let s = &mut sdown[t * e..(t + 1) * e];
            if let Some(b) = &w.branch_norms {
                rmsnorm_inplace(s, &b.shared_out, eps);
            }
            let s = &*s;
            if w.shared_gate.is_some() {
                let g = 1.0 / (1.0 + (-sg[t]).exp());
                o.iter_mut().zip(s).for_each(|(a, v)| *a += v * g);
            } else {
                o.iter_mut().zip(s).for_each(|(a, v)| *a += v);
            }
        }
    }
}

/// Adds `bias` to every row of `rows`.
fn add_rows(rows: &mut [f32], bias: &[f32]) {
    for r in rows.chunks_exact_mut(bias.len()) {
        r.iter_mut().zip(bias).for_each(|(a, b)| *a += b);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::semantics::Sourced;

    fn moe(gating: Gating, bias: bool, norm: bool, scale: f32, n_used: usize) -> Moe {
        let s = |v| Sourced::new(v, "test");
        Moe {
            n_expert: 4,
            n_used,
            n_ff_exp: 8,
            gating: Sourced::new(gating, "test"),
            selection_bias: s(bias),
            norm_weights: s(norm),
            scale: Sourced::new(scale, "test"),
            shared: Sourced::new(None, "test"),
            shared_gate: s(false),
            leading_dense: Sourced::new(0, "test"),
            shared_names: crate::semantics::SHEXP_NAMES,
            router_input: Sourced::new(crate::semantics::RouterInput::FfnInput, "test"),
            expert_scale: Sourced::new(None, "test"),
            branch_norms: Sourced::new(None, "test"),
            expert_biases: Sourced::new(false, "test"),
        }
    }

    fn routed(m: &Moe, logits: &[f32], bias: Option<&[f32]>) -> Vec<(usize, f32)> {
        let (mut s, mut c) = (Vec::new(), Vec::new());
        route(m, logits, bias, &mut s, &mut c);
        c
    }

    /// Softmax over all four, the top two, renormalized: logits ln 1, ln 2,
    /// ln 3, ln 4 give probabilities 0.1..0.4, so experts 3 and 2 with
    /// 4/7 and 3/7; without renormalization 0.4 and 0.3; scaled by 2.5,
    /// 10/7 and 7.5/7.
    #[test]
    fn softmax_top_k_renormalized_and_scaled() {
        let l = [1f32.ln(), 2f32.ln(), 3f32.ln(), 4f32.ln()];
        let close = |got: Vec<(usize, f32)>, want: [(usize, f32); 2]| {
            assert_eq!(got.len(), 2);
            for ((ge, gw), (we, ww)) in got.into_iter().zip(want) {
                assert_eq!(ge, we);
                assert!((gw - ww).abs() < 1e-6, "weight {gw}, expected {ww}");
            }
        };
        close(
            routed(&moe(Gating::Softmax, false, true, 1.0, 2), &l, None),
            [(3, 4.0 / 7.0), (2, 3.0 / 7.0)],
        );
        close(
            routed(&moe(Gating::Softmax, false, false, 1.0, 2), &l, None),
            [(3, 0.4), (2, 0.3)],
        );
        close(
            routed(&moe(Gating::Softmax, false, true, 2.5, 2), &l, None),
            [(3, 10.0 / 7.0), (2, 7.5 / 7.0)],
        );
    }

    /// gpt-oss's SOFTMAX_WEIGHT: the top two logits (ln 4, ln 3) choose,
    /// their weights the softmax over those two only, 4/7 and 3/7, with no
    /// renormalization stated; a softmax over all four first would give
    /// 0.4 and 0.3. Shifting every logit by a constant changes nothing.
    #[test]
    fn softmax_weight_is_a_softmax_over_the_chosen_logits() {
        let l = [1f32.ln(), 2f32.ln(), 3f32.ln(), 4f32.ln()];
        for shift in [0.0f32, 5.0, -30.0] {
            let ls: Vec<f32> = l.iter().map(|x| x + shift).collect();
            let got = routed(&moe(Gating::SoftmaxWeight, false, false, 1.0, 2), &ls, None);
            assert_eq!(got.iter().map(|c| c.0).collect::<Vec<_>>(), [3, 2]);
            assert!(
                (got[0].1 - 4.0 / 7.0).abs() < 1e-6 && (got[1].1 - 3.0 / 7.0).abs() < 1e-6,
                "shift {shift}: {got:?}"
            );
        }
    }

    /// Sigmoid scores; the selection bias chooses experts 0 and 1 (the
    /// lowest scores) but their weights are their sigmoids, renormalized:
    /// logits 0 and ln 3 give 1/2 and 3/4, so 2/5 and 3/5.
    #[test]
    fn sigmoid_with_a_bias_that_chooses_but_does_not_weigh() {
        let l = [0.0, 3f32.ln(), 5.0, 6.0];
        let b = [10.0, 9.0, 0.0, 0.0];
        let got = routed(&moe(Gating::Sigmoid, true, true, 1.0, 2), &l, Some(&b));
        assert_eq!(got.iter().map(|c| c.0).collect::<Vec<_>>(), [0, 1]);
        assert!(
            (got[0].1 - 0.4).abs() < 1e-6 && (got[1].1 - 0.6).abs() < 1e-6,
            "{got:?}"
        );
        // Without the bias: experts 3 and 2.
        let got = routed(&moe(Gating::Sigmoid, false, true, 1.0, 2), &l, None);
        assert_eq!(got.iter().map(|c| c.0).collect::<Vec<_>>(), [3, 2]);
    }
}
