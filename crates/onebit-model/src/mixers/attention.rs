//! Softmax attention (causal, or bidirectional as the semantics' mask
//! says), full or over a sliding window: q/k/v
//! projections (with biases, per-head q/k RMSNorm before or after RoPE, and
//! Qwen3.5's sigmoid output gate where the semantics say), RoPE from the
//! layer kind's table, each sequence's KV cache extended and attended (with
//! per-head sinks where declared), the output projection (and its bias).
//! KV heads and head sizes are those of the layer's kind; a layer without a
//! V projection takes V from its raw K projection (`Semantics::v_from_k`).

use onebit_kernels::attention::{attend_seqs, AttnShape, SeqAttn};
use onebit_kernels::ops::rmsnorm_inplace;
use onebit_kernels::rope::Rope;
use onebit_kernels::{matmul, matmul_many, Pool};

use super::{sigmoid, At, Run, Scratch, SeqRows, TokenMixer};
use crate::error::Result;
use crate::rows::{par_rows, sized};
use crate::semantics::{LayerKind, Mask, QkNorm};
use crate::state::LayerState;
use crate::weights::{AttnWeights, KvWeights};

impl TokenMixer for AttnWeights {
    fn mix(
        &self,
        run: &Run,
        at: At,
        seqs: &mut [SeqRows],
        h: &[f32],
        sc: &mut Scratch,
        mixed: &mut Vec<f32>,
    ) -> Result<()> {
        let aw = self;
        let sem = run.sem;
        let d = &sem.dims;
        let kind = sem.layer_kinds.value[at.layer];
        let (rope, cell) = if kind == LayerKind::Sliding {
            (run.rope_sliding, &run.angles_sliding)
        } else {
            (run.rope_full, &run.angles_full)
        };
        let angles = cell.get_or_init(|| angle_table(run.pool, rope, run.positions));
        let n = h.len() / d.n_embd;
        let (dk, dv) = sem.head_dims(kind);
        let gated = sem.attn_output_gate.value;
        let Scratch {
            q: q_all,
            k,
            v,
            ctx,
        } = sc;
        // A layer without K/V of its own reads its source layer's cache,
        // which that layer extended earlier in this call.
        let kv = aw.kv.as_ref();
        let (kw, vw) = sem.kv_widths(kind);
        match kv {
            Some(KvWeights {
                wk, wv: Some(wv), ..
            }) => {
                let mut outs = [
                    sized(q_all, n * aw.wq.rows),
                    sized(k, n * wk.rows),
                    sized(v, n * wv.rows),
                ];
                matmul_many(run.pool, run.precision, &[&aw.wq, wk, wv], h, n, &mut outs);
            }
            // V from K (Semantics::v_from_k): filled from k below.
            Some(KvWeights { wk, wv: None, .. }) => {
                let mut outs = [sized(q_all, n * aw.wq.rows), sized(k, n * wk.rows)];
                matmul_many(run.pool, run.precision, &[&aw.wq, wk], h, n, &mut outs);
            }
            None => {
                matmul(
                    run.pool,
                    run.precision,
                    &aw.wq,
                    h,
                    n,
                    sized(q_all, n * aw.wq.rows),
                );
                // One unused value per row keeps the row loop below uniform.
                sized(k, n);
            }
        }
        let kw_rows = if kv.is_some() { kw } else { 1 };
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
        let eps = sem.norm_eps.value;
        add_bias(q, aw.bq.as_deref());
        if let Some(kv) = kv {
            add_bias(k, kv.bk.as_deref());
            if kv.wv.is_none() {
                // The K projection as it is, before the k norm and RoPE.
                sized(v, n * vw).copy_from_slice(&k[..n * kw]);
            }
            add_bias(v, kv.bv.as_deref());
            if sem.v_norm.value {
                let ones = vec![1f32; dv];
                v.chunks_exact_mut(dv)
                    .for_each(|head| rmsnorm_inplace(head, &ones, eps));
            }
        }
        let k_norm = kv.and_then(|kv| kv.k_norm.as_ref());
        let qk_norm = sem.qk_norm.value;
        let norm_heads = |buf: &mut [f32], w: Option<&Vec<f32>>| {
            if let Some(w) = w {
                buf.chunks_exact_mut(dk)
                    .for_each(|head| rmsnorm_inplace(head, w, eps));
            }
        };
        let half = rope.inv_freq.len();
        let has_kv = kv.is_some();
        // Per row: q/k norms and RoPE, rows in parallel.
        par_rows(
            run.pool,
            n,
            [qw, kw_rows],
            [&mut *q, &mut k[..]],
            |r0, [qs, ks]| {
                for (j, (qt, kt)) in qs
                    .chunks_exact_mut(qw)
                    .zip(ks.chunks_exact_mut(kw_rows))
                    .enumerate()
                {
                    let t = r0 + j;
                    let angles = &angles[t * half..(t + 1) * half];
                    if qk_norm == QkNorm::BeforeRope {
                        norm_heads(qt, aw.q_norm.as_ref());
                        norm_heads(kt, k_norm);
                    }
                    qt.chunks_exact_mut(dk)
                        .for_each(|head| rope.apply(head, angles));
                    if has_kv {
                        kt.chunks_exact_mut(dk)
                            .for_each(|head| rope.apply(head, angles));
                    }
                    if qk_norm == QkNorm::AfterRope {
                        norm_heads(qt, aw.q_norm.as_ref());
                        norm_heads(kt, k_norm);
                    }
                }
            },
        );

        let shape = AttnShape {
            n_head: d.n_head,
            n_head_kv: sem.kv_heads(kind),
            head_dim_k: dk,
            head_dim_v: dv,
        };
        let window = match kind {
            LayerKind::Sliding => sem.sliding_window.value,
            _ => None,
        };
        let scale = sem.attn_scale.value;
        let cap = sem.attn_softcap.value;
        let width = d.n_head * dv;
        let ctx = sized(ctx, n * width);
        // The source layer's slot in the same pass of the stack.
        let src = at.slot - at.layer + sem.kv_source.value[at.layer];
        // Each sequence's cache extended by its rows, and what each row
        // sees.
        let mut all_spans = Vec::with_capacity(seqs.len());
        for seg in seqs.iter_mut() {
            let LayerState::Attention(cache) = &mut seg.state.layers[src] else {
                unreachable!("attention layers hold KV caches (SeqState::new)")
            };
            if has_kv {
                cache.k.push(&k[seg.rows.start * kw..seg.rows.end * kw]);
                cache.v.push(&v[seg.rows.start * vw..seg.rows.end * vw]);
            }
            let end = seg.pos0 + seg.rows.len();
            let spans: Vec<(usize, usize)> = (0..seg.rows.len())
                .map(|i| {
                    let p = seg.pos0 + i;
                    match sem.mask.value {
                        // A row of a both-ways span also sees the span's
                        // later rows; the window still bounds what lies
                        // behind it (llama.cpp's non-causal KQ mask keeps
                        // SWA: p1 - p0 < window).
                        Mask::Causal => (
                            window.map_or(0, |w| (p + 1).saturating_sub(w)),
                            seg.both_ways
                                .iter()
                                .find(|g| g.contains(&p))
                                .map_or(p + 1, |g| g.end),
                        ),
                        Mask::Bidirectional => window.map_or((0, end), |w| {
                            (p.saturating_sub(w / 2), (p + w / 2 + 1).min(end))
                        }),
                    }
                })
                .collect();
            all_spans.push(spans);
        }
        // Every sequence in one call: a sequence's rows (a verify step's)
        // read each cache block once, and the sequences of a batched step
        // share one parallel pass. The stacked rows are the sequences' in
        // order, one after another.
        let mut rest = &mut ctx[..];
        let mut batch = Vec::with_capacity(seqs.len());
        let mut row = 0;
        for (seg, spans) in seqs.iter().zip(&all_spans) {
            let LayerState::Attention(cache) = &seg.state.layers[src] else {
                unreachable!("attention layers hold KV caches (SeqState::new)")
            };
            assert_eq!(seg.rows.start, row, "sequences' rows stacked in order");
            row = seg.rows.end;
            let (out, tail) = std::mem::take(&mut rest).split_at_mut(seg.rows.len() * width);
            rest = tail;
            batch.push(SeqAttn {
                q: &q[seg.rows.start * qw..seg.rows.end * qw],
                spans,
                k: cache.k.view(),
                v: cache.v.view(),
                out,
            });
        }
        attend_seqs(run.pool, shape, &mut batch, scale, cap, aw.sinks.as_deref());
        drop(batch);
        if let Some(g) = gate {
            ctx.iter_mut().zip(&g).for_each(|(c, g)| *c *= sigmoid(*g));
        }
        let out = sized(mixed, n * aw.wo.rows);
        matmul(run.pool, run.precision, &aw.wo, ctx, n, out);
        add_bias(out, aw.bo.as_deref());
        Ok(())
    }
}

/// `rope`'s cos/sin pairs for every stacked row ([rows][n_rot / 2]).
fn angle_table(pool: &Pool, rope: &Rope, positions: &[[usize; 4]]) -> Vec<(f32, f32)> {
    pool.map_ranges(positions.len(), 64, |r| {
        positions[r]
            .iter()
            .flat_map(|&p| rope.angles_at(p))
            .collect::<Vec<_>>()
    })
    .concat()
}

fn add_bias(x: &mut [f32], b: Option<&[f32]>) {
    if let Some(b) = b {
        for row in x.chunks_exact_mut(b.len()) {
            row.iter_mut().zip(b).for_each(|(v, bb)| *v += bb);
        }
    }
}
