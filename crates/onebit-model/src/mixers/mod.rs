//! The token mixers, one file each: attention (full and sliding), LFM2's
//! gated short convolution, Qwen3.5's gated delta-net. They share one
//! signature, [`TokenMixer::mix`]: the normed rows of every sequence in the
//! batch in, the mixer's output rows out, each sequence's state read and
//! extended at the layer's slot. The forward composes them into layer
//! bodies; it and the mixers share only this module's types (the mixers do
//! not know the forward).

use std::cell::OnceCell;
use std::ops::Range;

use onebit_kernels::rope::Rope;
use onebit_kernels::{matmul, Pool, Precision, QMatrix};

use crate::error::Result;
use crate::semantics::Semantics;
use crate::state::SeqState;
use crate::weights::Mixer;

mod attention;
mod delta_net;
mod short_conv;

/// What every mixer call of one forward pass shares.
pub(crate) struct Run<'a> {
    pub sem: &'a Semantics,
    pub pool: &'a Pool,
    pub precision: Precision,
    /// RoPE of full and sliding layers.
    pub rope_full: &'a Rope,
    pub rope_sliding: &'a Rope,
    /// Each stacked row's rotary position (t, h, w, e); single-axis RoPE
    /// reads t.
    pub positions: &'a [[usize; 4]],
    /// The cos/sin tables of every row, per RoPE table, computed by the
    /// first layer that needs them.
    pub angles_full: OnceCell<Vec<(f32, f32)>>,
    pub angles_sliding: OnceCell<Vec<(f32, f32)>>,
}

impl Run<'_> {
    /// `w` times `n` rows of `x`.
    pub fn mm(&self, w: &QMatrix, x: &[f32], n: usize) -> Vec<f32> {
        let mut out = vec![0f32; n * w.rows];
        matmul(self.pool, self.precision, w, x, n, &mut out);
        out
    }
}

/// Where a mixer runs: the layer whose weights it holds (`blk.N`) and the
/// sequence-state slot it reads (the same unless the layers loop).
#[derive(Clone, Copy, Debug)]
pub(crate) struct At {
    pub layer: usize,
    pub slot: usize,
}

/// One sequence's part of the stacked rows.
pub(crate) struct SeqRows<'a> {
    pub state: &'a mut SeqState,
    pub rows: Range<usize>,
    /// The position of its first row.
    pub pos0: usize,
    /// Position ranges whose rows attend to each other both ways (an
    /// image's rows, [`crate::forward::Embeds::bidirectional`]); each lies
    /// within this call's rows.
    pub both_ways: Vec<Range<usize>>,
}

/// Buffers reused from layer to layer within one forward call: the big
/// activations are allocated (and their pages faulted in) once per call
/// instead of once per op.
#[derive(Default)]
pub(crate) struct Scratch {
    pub q: Vec<f32>,
    pub k: Vec<f32>,
    pub v: Vec<f32>,
    pub ctx: Vec<f32>,
}

pub(crate) trait TokenMixer {
    /// Mixes `h` ([rows][n_embd], every sequence's rows stacked), reading
    /// and extending each sequence's state at `at.slot`; writes the output
    /// rows ([rows][n_embd]) into `out`.
    fn mix(
        &self,
        run: &Run,
        at: At,
        seqs: &mut [SeqRows],
        h: &[f32],
        scratch: &mut Scratch,
        out: &mut Vec<f32>,
    ) -> Result<()>;
}

impl Mixer {
    /// The layer's token mixer.
    pub(crate) fn mixer(&self) -> &dyn TokenMixer {
        match self {
            Mixer::Attention(w) => w,
            Mixer::ShortConv(w) => w,
            Mixer::DeltaNet(w) => w,
        }
    }
}

pub(crate) fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

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
