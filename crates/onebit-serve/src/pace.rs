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
//! a 4 x 1,500-token embeddings request).

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
}

impl Pace {
    pub fn new(max_step: Duration) -> Pace {
        Pace {
            max_step: max_step.as_secs_f64(),
            fixed: None,
            xx: [0.0; 3],
            xy: [0.0; 2],
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
