//! Causal softmax attention, full or over a sliding window: q/k/v
//! projections (with biases, per-head q/k RMSNorm before or after RoPE, and
//! Qwen3.5's sigmoid output gate where the semantics say), RoPE from the
//! layer kind's table, each sequence's KV cache extended and attended, the
//! output projection.

use onebit_kernels::attention::{attend_rows, AttnShape};
use onebit_kernels::ops::rmsnorm_inplace;
use onebit_kernels::rope::Rope;
use onebit_kernels::{matmul, matmul_many, Pool};

use super::{sigmoid, At, Run, Scratch, SeqRows, TokenMixer};
use crate::error::Result;
use crate::rows::{par_rows, sized};
use crate::semantics::{LayerKind, QkNorm};
use crate::state::LayerState;
use crate::weights::AttnWeights;

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
        let (dk, dv) = (d.head_dim_k, d.head_dim_v);
        let gated = sem.attn_output_gate.value;
        let Scratch {
            q: q_all,
            k,
            v,
            ctx,
        } = sc;
        let mut outs = [
            sized(q_all, n * aw.wq.rows),
            sized(k, n * aw.wk.rows),
            sized(v, n * aw.wv.rows),
        ];
        matmul_many(
            run.pool,
            run.precision,
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

        let eps = sem.norm_eps.value;
        let qk_norm = sem.qk_norm.value;
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
            run.pool,
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
            LayerKind::Sliding => sem.sliding_window.value,
            _ => None,
        };
        let scale = sem.attn_scale.value;
        let cap = sem.attn_softcap.value;
        let width = d.n_head * dv;
        let vw = d.n_head_kv * dv;
        let ctx = sized(ctx, n * width);
        for seg in seqs.iter_mut() {
            let LayerState::Attention(cache) = &mut seg.state.layers[at.slot] else {
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
                run.pool,
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
        matmul(run.pool, run.precision, &aw.wo, ctx, n, out);
        Ok(())
    }
}

/// `rope`'s cos/sin pairs for every stacked row ([rows][n_rot / 2]).
fn angle_table(pool: &Pool, rope: &Rope, positions: &[usize]) -> Vec<(f32, f32)> {
    pool.map_ranges(positions.len(), 64, |r| {
        positions[r]
            .iter()
            .flat_map(|&p| rope.angles(p))
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
