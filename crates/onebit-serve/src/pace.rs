//! How many prompt tokens the engine's next step may run so that the step,
//! with every decoding sequence in it, stays within `--max-step-ms`: the
//! measured cost model of a step. The invariant: the budget is what the
//! model predicts fits the bound (never more than the chunk, never fewer
//! than [`MIN_PACED_TOKENS`]), and each step's measurement updates it.
//!
//! A step costs a fixed part (the decoding rows; the weights read once),
//! measured on steps that run no prompt token, plus, for the prompt tokens,
//! a cost per token (the matrix products) and a cost per attended position
//! (each token attends to every position before it, so a chunk of `n`
//! tokens starting at position `p` attends to `n (p + n/2)` positions). The
//! two prompt costs are fitted by least squares over the recent steps, each
//! older step weighing [`DECAY`] as much as the next; a step aims at
//! [`AIM`] of the bound. A cost per token
//! alone (the model before this one) lags behind a long prompt: the cost of
//! its tokens rises with every chunk, and the steps overran the bound by a
//! third (790 ms against 600 ms in `serve_faults` on SmolLM2, 8 streams and
//! a 4 x 1,500-token embeddings request). A step runs at most [`GROWTH`]
//! times the prompt tokens of the last one, so the fit is never trusted far
//! from the steps it was fitted to.

use std::time::Duration;

/// Prompt tokens of the first paced step, before any rate is measured.
pub const PROBE_TOKENS: usize = 32;
/// A paced step runs at least this many prompt tokens, so a long prompt
/// still advances on a machine slower than `max_step` allows.
pub const MIN_PACED_TOKENS: usize = 16;
/// The weight of a step's measurement against the next one's.
pub const DECAY: f64 = 0.75;
/// The share of `max_step` a step aims at: the bound is a maximum, and
/// measured steps scatter around the model's prediction (up to 10 % over
/// it on a quiet machine, more beside other work), and the time between
/// two steps (sampling, admission, sending) adds to a stream's wait. At 0.9
/// the largest gap of `serve_faults` was 620 ms against its 625 ms bound.
pub const AIM: f64 = 0.8;
/// Until the steps tell the two prompt costs apart: attending to this many
/// positions costs what one token's matrix products do. Measured 1,000 on
/// SmolLM2-135M (2 threads, AVX-512); a larger model's attention weighs
/// less against its matrices, so for it the guess errs on the short side.
pub const PRIOR_POSITIONS: f64 = 1024.0;
/// A step runs at most this many times the prompt tokens of the last step
/// that ran some. The fit extrapolates only as far as its steps vary: deep
/// in a long prompt every step's tokens attend to about as many positions
/// as the last's, the two costs cannot be told apart, and the fit's cost of
/// a token can land anywhere from a tenth of the true one up (measured
/// 0.11 ms against 1.35). The next prompt's first step, at position 0,
/// then ran 778 tokens in 1.29 s against a 0.6 s bound. Doubling from the
/// last step's count reaches a new regime in a few steps, each of which
/// the fit learns from.
pub const GROWTH: f64 = 2.0;

/// The prompt work of one step: tokens and the positions they attend to.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Work {
    pub tokens: f64,
    pub positions: f64,
}

impl Work {
    /// `n` tokens of one sequence whose first is at position `start`.
    pub fn chunk(start: usize, n: usize) -> Work {
        let n = n as f64;
        Work {
            tokens: n,
            positions: n * (start as f64 + n / 2.0),
        }
    }

    pub fn add(&mut self, other: Work) {
        self.tokens += other.tokens;
        self.positions += other.positions;
    }
}

pub struct Pace {
    pub max_step: f64,
    /// Seconds of a step that runs no prompt token (a running mean, each
    /// new measurement weighing a half).
    fixed: Option<f64>,
    /// The weighted sums of the least-squares fit of the prompt's seconds
    /// to (tokens, positions): x·xᵀ and x·y.
    xx: [f64; 3],
    xy: [f64; 2],
    /// Prompt tokens of the last counted step: the next runs at most
    /// [`GROWTH`] times as many.
    last: Option<f64>,
}

impl Pace {
    pub fn new(max_step: Duration) -> Pace {
        Pace {
            max_step: max_step.as_secs_f64(),
            fixed: None,
            xx: [0.0; 3],
            xy: [0.0; 2],
            last: None,
        }
    }

    /// Seconds per token and per attended position, if measured: the
    /// least-squares fit, or where the steps do not tell the two apart yet
    /// (or the fit gives one a negative cost), the fit of one cost with
    /// [`PRIOR_POSITIONS`] positions costing what a token does.
    fn costs(&self) -> Option<(f64, f64)> {
        let [tt, tp, pp] = self.xx;
        let [ty, py] = self.xy;
        if tt <= 0.0 {
            return None;
        }
        let det = tt * pp - tp * tp;
        if det > 1e-6 * tt * pp {
            let a = (pp * ty - tp * py) / det;
            let b = (tt * py - tp * ty) / det;
            if a >= 0.0 && b >= 0.0 {
                return Some((a, b));
            }
        }
        let w = PRIOR_POSITIONS;
        let a = (ty + py / w) / (tt + 2.0 * tp / w + pp / (w * w));
        Some((a.max(0.0), a.max(0.0) / w))
    }

    /// Prompt tokens the next step may run, at most `cap`, when its first
    /// prompt token is at position `start` of its sequence.
    pub fn budget(&self, cap: usize, decoding: bool, start: usize) -> usize {
        if self.max_step <= 0.0 || !decoding {
            return cap;
        }
        let Some((a, b)) = self.costs() else {
            return PROBE_TOKENS.min(cap);
        };
        let room = AIM * self.max_step - self.fixed.unwrap_or(0.0);
        // The largest n with a n + b n (start + n/2) <= room.
        let lin = a + b * start as f64;
        let n = if room <= 0.0 {
            0.0
        } else if b > 0.0 {
            (-lin + (lin * lin + 2.0 * b * room).sqrt()) / b
        } else if lin > 0.0 {
            room / lin
        } else {
            cap as f64
        };
        let n = self.last.map_or(n, |last| n.min(GROWTH * last));
        (n.min(cap as f64) as usize).clamp(MIN_PACED_TOKENS.min(cap), cap)
    }

    /// A step that ran `work` took `secs`.
    pub fn observe(&mut self, secs: f64, work: Work) {
        if work.tokens == 0.0 {
            self.fixed = Some(self.fixed.map_or(secs, |o| (o + secs) / 2.0));
            return;
        }
        if work.tokens < MIN_PACED_TOKENS as f64 {
            // A step of a few prompt tokens says little about their cost.
            return;
        }
        // Never less than a quarter of the step: an estimate of the fixed
        // part close to the whole step must not make the prompt look free.
        self.last = Some(work.tokens);
        let y = (secs - self.fixed.unwrap_or(0.0)).max(secs / 4.0);
        let (t, p) = (work.tokens, work.positions);
        for (s, v) in self.xx.iter_mut().zip([t * t, t * p, p * p]) {
            *s = *s * DECAY + v;
        }
        for (s, v) in self.xy.iter_mut().zip([t * y, p * y]) {
            *s = *s * DECAY + v;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAX_STEP: f64 = 0.5;

    /// `n` is the largest count whose step, as `secs` predicts it, fits
    /// the aim.
    fn largest_fitting(n: usize, secs: impl Fn(usize) -> f64) -> bool {
        secs(n) <= AIM * MAX_STEP && secs(n + 1) > AIM * MAX_STEP
    }

    #[test]
    fn the_pace_probes_then_fits_one_measured_step() {
        let cap = 512;
        let mut p = Pace::new(Duration::from_secs_f64(MAX_STEP));
        // Nothing decoding, or no bound: the whole chunk.
        assert_eq!(p.budget(cap, false, 0), cap);
        assert_eq!(Pace::new(Duration::ZERO).budget(cap, true, 0), cap);
        // No rate measured yet: a probe.
        assert_eq!(p.budget(cap, true, 0), PROBE_TOKENS);
        // Decode steps of 1/8 s, then 32 prompt tokens at position 0 (512
        // attended positions) in 3/16 s: one step cannot tell the two costs
        // apart, so the prior's 1,024 positions a token: 1/16 s over 32.5
        // token-equivalents.
        p.observe(0.125, Work::default());
        p.observe(0.1875, Work::chunk(0, 32));
        let per = 0.0625 / 32.5;
        let at = |start: usize| {
            move |n: usize| {
                let w = Work::chunk(start, n);
                0.125 + per * (w.tokens + w.positions / 1024.0)
            }
        };
        // The step after the probe runs at most twice its tokens, where
        // more would fit.
        assert!(at(0)(2 * PROBE_TOKENS + 1) < AIM * MAX_STEP);
        assert_eq!(p.budget(cap, true, 0), 2 * PROBE_TOKENS);
        // The fit alone, without the growth limit.
        p.last = None;
        for start in [0, 300, 2000] {
            let n = p.budget(cap, true, start);
            assert!(largest_fitting(n, at(start)), "{n} at {start}");
        }
        // A step of a few prompt tokens is not counted.
        let before = p.budget(cap, true, 0);
        p.observe(0.3, Work::chunk(0, 4));
        assert_eq!(p.budget(cap, true, 0), before);
    }

    #[test]
    fn the_pace_learns_the_cost_of_attended_positions() {
        // Steps costing 1/8 s fixed + 2^-10 s a token + 2^-16 s a position
        // (a token at position 64 costs twice what one at 0 does: far from
        // the prior, which the fit must leave behind).
        let (a, b) = (2f64.powi(-10), 2f64.powi(-16));
        let secs = |start: usize| {
            move |n: usize| {
                let w = Work::chunk(start, n);
                0.125 + a * w.tokens + b * w.positions
            }
        };
        let mut p = Pace::new(Duration::from_secs_f64(MAX_STEP));
        p.observe(0.125, Work::default());
        for (start, n) in [(0, 64), (64, 128), (192, 128)] {
            p.observe(secs(start)(n), Work::chunk(start, n));
        }
        // The fit alone, without the growth limit.
        p.last = None;
        for start in [0, 256, 1000] {
            let n = p.budget(512, true, start);
            assert!(largest_fitting(n, secs(start)), "{n} at {start}");
        }
        // Far into a prompt, fewer than the floor fit: the floor.
        assert!(secs(4096)(MIN_PACED_TOKENS) > AIM * MAX_STEP);
        assert_eq!(p.budget(512, true, 4096), MIN_PACED_TOKENS);
        // A cost per token alone, fitted to the same steps, gives position
        // 1,000 the budget of an average one and overruns the bound there.
        let [tt, _, _] = p.xx;
        let per = p.xy[0] / tt;
        let alone = ((AIM * MAX_STEP - 0.125) / per) as usize;
        assert!(secs(1000)(alone) > MAX_STEP, "{alone}");
    }

    /// Two 6,000-token prompts one after the other beside decoding, at
    /// the costs `serve_faults` measured on SmolLM2 (2 threads: 1.35 ms a
    /// token and 0.81 µs an attended position, from its steps at positions
    /// 0 and 5,585), each step off by up to 5 %: every step stays within
    /// the bound, and the largest comes near the aim (the growth limit
    /// does not keep the steps small).
    #[test]
    fn a_prompt_after_a_long_one_stays_within_the_bound() {
        let max_step = 0.6;
        let (fixed, a, b) = (0.02, 1.35e-3, 8.1e-7);
        let mut rng = 12345u64;
        let mut noise = move || {
            rng = rng
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            1.0 + 0.05 * ((rng >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0)
        };
        let mut p = Pace::new(Duration::from_secs_f64(max_step));
        for _ in 0..4 {
            p.observe(fixed * noise(), Work::default());
        }
        let mut worst: f64 = 0.0;
        for prompt in 0..2 {
            let mut start = 0;
            while start < 6000 {
                let n = p.budget(4096, true, start).min(6000 - start);
                let w = Work::chunk(start, n);
                let secs = (fixed + a * w.tokens + b * w.positions) * noise();
                worst = worst.max(secs);
                assert!(
                    secs < max_step,
                    "prompt {prompt}: {n} tokens at {start} took {secs:.3} s"
                );
                p.observe(secs, w);
                start += n;
            }
            p.observe(fixed * noise(), Work::default());
        }
        assert!(
            worst > AIM * max_step * 0.9,
            "the steps were not paced near the aim: {worst}"
        );
    }

    /// The last 19 steps of a 6,000-token prompt as `serve_faults`
    /// measured them (tokens, attended positions, seconds; 8 sequences
    /// decoding, 17 ms a step without prompt tokens), then a new prompt at
    /// position 0. Every step there attends to about 430,000 positions, so
    /// the fit cannot tell the two costs apart: it put the cost of a token
    /// at 0.11 ms (the two-point fit above says 1.35 ms), and the next
    /// prompt's first step ran 778 tokens in 1.29 s against a 0.6 s bound.
    /// Its budget must fit the bound at the measured costs.
    #[test]
    fn a_new_prompt_after_a_deep_one_does_not_trust_a_collinear_fit() {
        let max_step = 0.6;
        let steps = [
            (93, 421057.5, 0.466),
            (93, 429706.5, 0.505),
            (89, 419323.5, 0.479),
            (88, 422400.0, 0.478),
            (87, 425212.5, 0.485),
            (85, 422747.5, 0.469),
            (85, 429972.5, 0.471),
            (84, 432012.0, 0.488),
            (82, 428532.0, 0.482),
            (81, 429907.5, 0.476),
            (80, 431040.0, 0.479),
            (79, 431932.5, 0.480),
            (78, 432588.0, 0.486),
            (76, 427348.0, 0.474),
            (75, 427387.5, 0.509),
            (73, 421392.5, 0.468),
            (73, 426721.5, 0.473),
            (72, 426096.0, 0.465),
            (47, 280942.5, 0.337),
        ];
        let mut p = Pace::new(Duration::from_secs_f64(max_step));
        p.observe(0.017, Work::default());
        for (tokens, positions, secs) in steps {
            p.observe(
                secs,
                Work {
                    tokens: tokens as f64,
                    positions,
                },
            );
            p.observe(0.017, Work::default());
        }
        let n = p.budget(4096, true, 0);
        let w = Work::chunk(0, n);
        let secs = 0.017 + 1.35e-3 * w.tokens + 8.1e-7 * w.positions;
        assert!(secs < max_step, "{n} tokens at position 0: {secs:.3} s");
    }

    #[test]
    fn the_pace_never_goes_past_the_chunk_or_under_the_floor() {
        let cap = 512;
        let mut p = Pace::new(Duration::from_secs_f64(MAX_STEP));
        p.observe(0.125, Work::default());
        p.observe(0.1875, Work::chunk(0, 32));
        assert_eq!(p.budget(40, true, 0), 40);
        // A machine whose decode step alone is over the bound still prefills.
        p.observe(0.75, Work::default());
        p.observe(0.75, Work::default());
        assert_eq!(p.budget(cap, true, 0), MIN_PACED_TOKENS);
        assert_eq!(p.budget(8, true, 0), 8);
    }
}
