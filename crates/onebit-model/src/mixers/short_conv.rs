//! LFM2's gated short convolution: in_proj to B, C, x; y = C * conv(B * x)
//! with a causal depthwise kernel; out_proj. The projections run batched
//! over every row; the convolution runs token by token within each
//! sequence, carrying its history in `SeqState`, so a batch and one token
//! at a time compute the same bits.

use super::{conv_step, At, Run, Scratch, SeqRows, TokenMixer};
use crate::error::Result;
use crate::state::{LayerState, SeqState};
use crate::weights::ShortConvWeights;

/// LFM2: in_proj -> B, C, x; y = C * conv(B * x); out_proj(y).
impl TokenMixer for ShortConvWeights {
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
        let e = run.sem.dims.n_embd;
        let n = h.len() / e;
        let l = w.kernel.len() / e;
        let bcx = run.mm(&w.in_proj, h, n);
        let mut y = vec![0f32; n * e];
        let mut bx = vec![0f32; e];
        for s in seqs.iter_mut() {
            let SeqState { layers, trail, .. } = &mut *s.state;
            let LayerState::ShortConv { history } = &mut layers[at.slot] else {
                unreachable!("short-conv layers hold conv histories (SeqState::new)")
            };
            for t in s.rows.clone() {
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
                    tr.record(at.slot, LayerState::ShortConv { history });
                }
            }
        }
        *out = run.mm(&w.out_proj, &y, n);
        Ok(())
    }
}
