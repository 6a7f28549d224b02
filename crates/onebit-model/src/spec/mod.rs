//! Speculative decoding: a drafter guesses the next tokens, the target model
//! runs them all in one forward call, and the longest prefix the target
//! agrees with is kept, plus the target's own next token. Because a batched
//! forward gives exactly the logits of the sequential one, greedy output is
//! the plain run's token for token; with temperature, drafted tokens pass
//! the standard rejection rule, so the output follows the target's
//! distribution. Rejected positions are undone without re-running the kept
//! ones: KV rows are truncated and recurrent states restored from the trail
//! the forward recorded per row ([`SeqState::start_trail`]).

use crate::error::Result;
use crate::forward::{Logits, Model};
use crate::sampler::{argmax, Sampler};
use crate::state::SeqState;

mod draft_model;
mod lookup;
mod lookup_first;
mod plan;
pub use draft_model::{vocab_mismatch, DraftModel};
pub use lookup::PromptLookup;
pub use lookup_first::LookupFirst;
pub use plan::{DrafterSource, SpecPlan};

/// A distribution over token ids: candidates and their probabilities.
pub type Dist = (Vec<u32>, Vec<f64>);

/// Guessed continuation tokens; `q[i]` is the distribution token i was
/// drawn from (None: a point mass, as prompt lookup's guesses are).
#[derive(Clone, Debug, Default)]
pub struct Draft {
    pub tokens: Vec<u32>,
    pub q: Vec<Option<Dist>>,
}

/// Something that guesses how a sequence goes on.
pub trait Drafter: Send {
    /// Up to `k` tokens guessed to follow `ctx`: every token of the sequence
    /// so far (prompt and output), the last one being the token about to run.
    fn draft(&mut self, ctx: &[u32], k: usize) -> Result<Draft>;
}

/// Counts over a run, for `bench` and the logs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SpecStats {
    /// Forward calls of the target (one per step).
    pub steps: usize,
    /// Tokens proposed by the drafter.
    pub drafted: usize,
    /// Proposed tokens the target kept.
    pub accepted: usize,
    /// Tokens produced (accepted drafts plus one per step).
    pub produced: usize,
}

impl SpecStats {
    /// Kept share of the drafted tokens (0 when nothing was drafted).
    pub fn acceptance(&self) -> f64 {
        if self.drafted == 0 {
            0.0
        } else {
            self.accepted as f64 / self.drafted as f64
        }
    }

    /// Tokens produced per target forward call.
    pub fn tokens_per_step(&self) -> f64 {
        if self.steps == 0 {
            0.0
        } else {
            self.produced as f64 / self.steps as f64
        }
    }
}

/// One sequence's speculation: its drafter, the adaptive draft length and
/// the counts. Use [`Speculator::propose`], run its tokens with
/// `Logits::All` (alone or in a batch), then [`Speculator::settle`].
pub struct Speculator {
    drafter: Box<dyn Drafter>,
    max: usize,
    k: usize,
    current: Draft,
    pos0: usize,
    /// Steps left without drafting, and how many the next miss skips:
    /// drafts that keep missing (free text for prompt lookup) cost a
    /// wider verify for nothing, so they back off exponentially.
    skip: usize,
    backoff: usize,
    pub stats: SpecStats,
}

/// The most steps a run of misses skips drafting for.
const MAX_BACKOFF: usize = 16;

impl Speculator {
    /// Drafts at most `max` tokens per step (at least 1).
    pub fn new(drafter: Box<dyn Drafter>, max: usize) -> Speculator {
        let max = max.max(1);
        Speculator {
            drafter,
            max,
            k: max.min(4),
            current: Draft::default(),
            pos0: 0,
            skip: 0,
            backoff: 0,
            stats: SpecStats::default(),
        }
    }

    /// The current draft length.
    pub fn draft_len(&self) -> usize {
        self.k
    }

    /// The tokens of one verify step for a sequence whose `state` has run
    /// all of `ctx` but its last token: that token, then the draft (cut to
    /// the `max_context` positions the model allows). Starts the state's trail.
    pub fn propose(
        &mut self,
        ctx: &[u32],
        state: &mut SeqState,
        max_context: usize,
    ) -> Result<Vec<u32>> {
        let last = *ctx.last().expect("a sequence has at least one token");
        let room = max_context.saturating_sub(state.pos + 1);
        let mut k = self.k.min(room);
        if self.skip > 0 {
            self.skip -= 1;
            k = 0;
        }
        let mut d = if k == 0 {
            Draft::default()
        } else {
            self.drafter.draft(ctx, k)?
        };
        d.tokens.truncate(k);
        d.q.truncate(d.tokens.len());
        self.pos0 = state.pos;
        state.start_trail();
        let mut run = Vec::with_capacity(1 + d.tokens.len());
        run.push(last);
        run.extend_from_slice(&d.tokens);
        self.current = d;
        Ok(run)
    }

    /// From the logits of every row `propose` gave (`Logits::All`): the
    /// tokens this step produced (kept drafts, then one the target chose),
    /// with `state` rewound to end just before the last of them.
    pub fn settle(
        &mut self,
        state: &mut SeqState,
        logits: &[f32],
        sampler: &mut Sampler,
    ) -> Vec<u32> {
        let d = std::mem::take(&mut self.current);
        let k = d.tokens.len();
        let v = logits.len() / (k + 1);
        let mut out = Vec::with_capacity(k + 1);
        for j in 0..=k {
            let row = &logits[j * v..(j + 1) * v];
            if j == k {
                out.push(sampler.sample(row));
                break;
            }
            let t = d.tokens[j];
            match verify(sampler, row, t, d.q[j].as_ref()) {
                None => out.push(t),
                Some(own) => {
                    out.push(own);
                    break;
                }
            }
        }
        let kept = out.len();
        let ok = state.rewind(self.pos0 + kept);
        debug_assert!(ok, "the verify rows are on the trail");
        state.trail = None;
        let accepted = kept - 1;
        self.stats.steps += 1;
        self.stats.drafted += k;
        self.stats.accepted += accepted;
        self.stats.produced += kept;
        // Adapt: longer after a fully kept draft, shorter after a partial
        // one, and after a draft missed from its first token no drafting
        // for 1, 2, 4, ... steps.
        if k > 0 {
            if accepted == 0 {
                self.backoff = (2 * self.backoff).clamp(1, MAX_BACKOFF);
                self.skip = self.backoff;
                self.k = 1;
            } else {
                self.backoff = 0;
                self.k = if accepted == k {
                    (self.k + 2).min(self.max)
                } else {
                    (accepted + 1).min(self.max)
                };
            }
        }
        out
    }
}

/// The rejection rule for drafted token `t` drawn from `q` (None = point
/// mass) against the target's row: None if `t` is kept, else the token the
/// target takes instead. Greedy keeps `t` exactly when it is the argmax.
fn verify(sampler: &mut Sampler, row: &[f32], t: u32, q: Option<&Dist>) -> Option<u32> {
    if sampler.greedy() {
        let own = argmax(row);
        return (own != t).then_some(own);
    }
    let (idx, p) = sampler.distribution(row);
    let prob = |(ids, ps): (&[u32], &[f64]), x: u32| {
        ids.iter().position(|&i| i == x).map_or(0.0, |i| ps[i])
    };
    let pt = prob((&idx, &p), t);
    let qt = q.map_or(1.0, |(qi, qp)| prob((qi, qp), t));
    // Keep with probability min(1, p/q).
    if qt > 0.0 && sampler.uniform() * qt < pt {
        return None;
    }
    // Else draw from max(0, p - q), normalized (p itself if that is empty).
    let residual: Vec<f64> = idx
        .iter()
        .zip(&p)
        .map(|(&i, &pi)| {
            let qi = match q {
                None => f64::from(u8::from(i == t)),
                Some((qi, qp)) => prob((qi, qp), i),
            };
            (pi - qi).max(0.0)
        })
        .collect();
    if residual.iter().sum::<f64>() > 0.0 {
        Some(sampler.pick(&idx, &residual))
    } else {
        Some(sampler.pick(&idx, &p))
    }
}

/// One decode step of a sequence whose `state` has run all of `ctx` but its
/// last token: the tokens it produces (one without a speculator).
pub fn decode_step(
    model: &Model,
    state: &mut SeqState,
    ctx: &[u32],
    sampler: &mut Sampler,
    spec: Option<&mut Speculator>,
) -> Result<Vec<u32>> {
    let last = *ctx.last().expect("a sequence has at least one token");
    match spec {
        None => {
            let l = model.forward(state, &[last], Logits::Last)?;
            Ok(vec![sampler.sample(&l)])
        }
        Some(sp) => {
            let run = sp.propose(ctx, state, model.max_context())?;
            match model.forward(state, &run, Logits::All) {
                Ok(l) => Ok(sp.settle(state, &l, sampler)),
                Err(e) => {
                    state.trail = None;
                    Err(e)
                }
            }
        }
    }
}
