//! A smaller model as drafter: it decodes k tokens ahead of the target. Its
//! own state follows the sequence: after each verify step it rewinds to the
//! tokens the target kept (KV truncation, recurrent states from its trail)
//! and runs only the tokens it has not seen.

use std::sync::Arc;

use super::{Draft, Drafter};
use crate::error::{ModelError, Result};
use crate::forward::{Logits, Model};
use crate::sampler::{Sampler, SamplerConfig};
use crate::state::SeqState;

pub struct DraftModel {
    model: Arc<Model>,
    state: SeqState,
    /// The tokens `state` has run.
    fed: Vec<u32>,
    sampler: Sampler,
}

impl DraftModel {
    /// A drafter for a target of `target_vocab` tokens, sampling its guesses
    /// with `cfg` (greedy guesses are point masses). The vocabularies'
    /// tokens must have been compared with [`vocab_mismatch`]; here the
    /// sizes are checked.
    pub fn new(model: Arc<Model>, target_vocab: usize, cfg: SamplerConfig) -> Result<DraftModel> {
        let n = model.sem.dims.n_vocab;
        if n != target_vocab {
            return Err(ModelError::Input(format!(
                "the draft model has {n} vocabulary entries, the target {target_vocab}"
            )));
        }
        let state = model.new_state();
        // Its own stream of draws, fixed by the seed.
        let sampler = Sampler::new(SamplerConfig {
            seed: cfg.seed ^ 0xD1AF_7D1A_F7D1_AF7D,
            ..cfg
        });
        Ok(DraftModel {
            model,
            state,
            fed: Vec::new(),
            sampler,
        })
    }

    fn guess(&mut self, logits: &[f32]) -> (u32, Option<super::Dist>) {
        if self.sampler.greedy() {
            return (self.sampler.sample(logits), None);
        }
        let (idx, p) = self.sampler.distribution(logits);
        let t = self.sampler.pick(&idx, &p);
        (t, Some((idx, p)))
    }
}

impl Drafter for DraftModel {
    fn draft(&mut self, ctx: &[u32], k: usize) -> Result<Draft> {
        let room = self.model.max_context().saturating_sub(ctx.len());
        let k = k.min(room + 1);
        if k == 0 || ctx.is_empty() {
            return Ok(Draft::default());
        }
        // Keep what the state ran of ctx, at least one token left to run.
        let common = self
            .fed
            .iter()
            .zip(ctx)
            .take_while(|(a, b)| a == b)
            .count()
            .min(ctx.len() - 1);
        if !self.state.rewind(common) {
            self.state.reset();
            self.fed.clear();
        }
        self.state.trail = None;
        self.fed.truncate(self.state.pos);
        let mut logits =
            self.model
                .forward(&mut self.state, &ctx[self.fed.len()..], Logits::Last)?;
        self.fed.extend_from_slice(&ctx[self.fed.len()..]);
        // The next rewind lands at or after here: record from now on.
        self.state.start_trail();
        let mut d = Draft::default();
        for i in 0..k {
            let (t, q) = self.guess(&logits);
            d.tokens.push(t);
            d.q.push(q);
            if i + 1 < k {
                logits = self.model.forward(&mut self.state, &[t], Logits::Last)?;
                self.fed.push(t);
            }
        }
        Ok(d)
    }
}

/// The first id whose token differs between two vocabularies, described,
/// or None when they are the same (sizes included). `a` and `b` give an
/// id's token text.
pub fn vocab_mismatch(
    n_a: usize,
    a: impl Fn(u32) -> Option<String>,
    n_b: usize,
    b: impl Fn(u32) -> Option<String>,
) -> Option<String> {
    for id in 0..n_a.min(n_b) as u32 {
        let (ta, tb) = (a(id), b(id));
        if ta != tb {
            return Some(format!(
                "token {id} is {} in the target and {} in the draft",
                ta.map_or("missing".into(), |t| format!("{t:?}")),
                tb.map_or("missing".into(), |t| format!("{t:?}")),
            ));
        }
    }
    (n_a != n_b).then(|| format!("the target has {n_a} tokens and the draft {n_b}"))
}

#[cfg(test)]
mod tests {
    use super::vocab_mismatch;

    fn get(v: &'static [&'static str]) -> impl Fn(u32) -> Option<String> {
        move |i| v.get(i as usize).map(|s| s.to_string())
    }

    #[test]
    fn names_the_first_differing_token_then_the_sizes() {
        const A: &[&str] = &["a", "b", "c"];
        const B: &[&str] = &["a", "x", "y"];
        assert_eq!(
            vocab_mismatch(3, get(A), 3, get(B)).unwrap(),
            "token 1 is \"b\" in the target and \"x\" in the draft"
        );
        assert_eq!(
            vocab_mismatch(3, get(A), 2, get(&A[..2])).unwrap(),
            "the target has 3 tokens and the draft 2"
        );
        assert_eq!(vocab_mismatch(3, get(A), 3, get(A)), None);
    }
}
