//! Choosing the next token from logits: greedy, or temperature with top-k and
//! top-p, from a seeded generator so a seed reproduces a run.

#[derive(Clone, Debug)]
pub struct SamplerConfig {
    /// 0 = greedy.
    pub temperature: f32,
    /// 0 = no limit.
    pub top_k: usize,
    /// 1 = no limit.
    pub top_p: f32,
    pub seed: u64,
}

impl Default for SamplerConfig {
    fn default() -> Self {
        SamplerConfig {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            seed: 0,
        }
    }
}

pub struct Sampler {
    cfg: SamplerConfig,
    rng: SplitMix64,
}

impl Sampler {
    pub fn new(cfg: SamplerConfig) -> Sampler {
        let rng = SplitMix64(cfg.seed);
        Sampler { cfg, rng }
    }

    pub fn sample(&mut self, logits: &[f32]) -> u32 {
        if self.cfg.temperature <= 0.0 {
            return argmax(logits);
        }
        let (idx, probs) = self.distribution(logits);
        self.pick(&idx, &probs)
    }

    /// True when sampling is greedy (temperature 0).
    pub fn greedy(&self) -> bool {
        self.cfg.temperature <= 0.0
    }

    /// The candidates `sample` draws from and their probabilities (summing
    /// to 1), highest first: temperature, top-k and top-p applied. Greedy
    /// sampling is the point mass on the argmax.
    pub fn distribution(&self, logits: &[f32]) -> (Vec<u32>, Vec<f64>) {
        if self.cfg.temperature <= 0.0 {
            return (vec![argmax(logits)], vec![1.0]);
        }
        // Candidates sorted by logit, highest first; ties by lower id.
        let mut idx: Vec<u32> = (0..logits.len() as u32).collect();
        let k = if self.cfg.top_k == 0 {
            logits.len()
        } else {
            self.cfg.top_k.min(logits.len())
        };
        let cmp = |a: &u32, b: &u32| {
            logits[*b as usize]
                .total_cmp(&logits[*a as usize])
                .then(a.cmp(b))
        };
        if k < idx.len() {
            idx.select_nth_unstable_by(k - 1, cmp);
            idx.truncate(k);
        }
        idx.sort_by(cmp);
        let max = logits[idx[0] as usize];
        let inv_t = 1.0 / self.cfg.temperature as f64;
        let mut probs: Vec<f64> = idx
            .iter()
            .map(|&i| ((logits[i as usize] - max) as f64 * inv_t).exp())
            .collect();
        let total: f64 = probs.iter().sum();
        probs.iter_mut().for_each(|p| *p /= total);
        // Nucleus: the smallest prefix whose mass reaches top_p.
        if self.cfg.top_p < 1.0 {
            let mut acc = 0.0;
            let mut keep = probs.len();
            for (i, p) in probs.iter().enumerate() {
                acc += p;
                if acc >= self.cfg.top_p as f64 {
                    keep = i + 1;
                    break;
                }
            }
            probs.truncate(keep);
            idx.truncate(keep);
            let total: f64 = probs.iter().sum();
            probs.iter_mut().for_each(|p| *p /= total);
        }
        (idx, probs)
    }

    /// A uniform draw in [0, 1) from the seeded generator.
    pub fn uniform(&mut self) -> f64 {
        self.rng.next_f64()
    }

    /// Draws one of `idx` with the (not necessarily normalized) weights `probs`.
    pub fn pick(&mut self, idx: &[u32], probs: &[f64]) -> u32 {
        let total: f64 = probs.iter().sum();
        let mut r = self.rng.next_f64() * total;
        for (i, p) in probs.iter().enumerate() {
            if r < *p {
                return idx[i];
            }
            r -= p;
        }
        // Rounding left r past the end: the last candidate with any mass (a
        // masked token, at probability 0, is never chosen).
        let last = probs.iter().rposition(|&p| p > 0.0).unwrap_or(0);
        idx[last]
    }
}

/// The hook a constraint uses: every token `allowed` refuses gets -inf, so
/// neither greedy nor sampling can choose it.
pub fn mask_logits(logits: &mut [f32], allowed: impl Fn(usize) -> bool) {
    for (i, l) in logits.iter_mut().enumerate() {
        if !allowed(i) {
            *l = f32::NEG_INFINITY;
        }
    }
}

/// OpenAI's `logit_bias`: each (token, bias) adds the bias to the token's
/// logit; -100 and 100 in effect ban and force it. Ids are checked by the
/// caller; one outside `logits` is ignored.
pub fn bias_logits(logits: &mut [f32], bias: &[(u32, f32)]) {
    for &(id, b) in bias {
        if let Some(l) = logits.get_mut(id as usize) {
            *l += b;
        }
    }
}

/// Index of the largest logit; the lowest index among equals.
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in logits.iter().enumerate() {
        if v > logits[best] {
            best = i;
        }
    }
    best as u32
}

/// SplitMix64: tiny, fast, and fully determined by its seed.
struct SplitMix64(u64);

impl SplitMix64 {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_masked_token_is_never_chosen_greedy_or_sampled() {
        // Id 1 has by far the largest logit; masked, it must never come out.
        let mut l = [0.0, 50.0, 0.0, 1.0];
        mask_logits(&mut l, |i| i != 1);
        assert_eq!(argmax(&l), 3);
        let mut s = Sampler::new(SamplerConfig {
            temperature: 2.0,
            top_k: 0,
            top_p: 1.0,
            seed: 9,
        });
        for _ in 0..500 {
            assert_ne!(s.sample(&l), 1);
        }
    }

    #[test]
    fn logit_bias_adds_to_the_named_tokens_only() {
        let mut l = [1.0, 2.0, 3.0];
        bias_logits(&mut l, &[(0, 5.0), (2, -100.0), (7, 1.0)]);
        assert_eq!(l, [6.0, 2.0, -97.0]);
        assert_eq!(argmax(&l), 0);
    }

    #[test]
    fn greedy_takes_the_first_maximum() {
        let mut s = Sampler::new(SamplerConfig::default());
        assert_eq!(s.sample(&[0.1, 3.0, 3.0, -1.0]), 1);
    }

    #[test]
    fn top_k_one_is_greedy_at_any_temperature() {
        let mut s = Sampler::new(SamplerConfig {
            temperature: 5.0,
            top_k: 1,
            top_p: 1.0,
            seed: 7,
        });
        for _ in 0..50 {
            assert_eq!(s.sample(&[0.0, 1.0, 0.5]), 1);
        }
    }

    #[test]
    fn top_p_keeps_only_the_nucleus() {
        // probs at T=1: softmax([10, 0, 0]) puts 0.99991 on id 0: top_p 0.9 keeps it alone.
        let mut s = Sampler::new(SamplerConfig {
            temperature: 1.0,
            top_k: 0,
            top_p: 0.9,
            seed: 3,
        });
        for _ in 0..50 {
            assert_eq!(s.sample(&[10.0, 0.0, 0.0]), 0);
        }
    }

    #[test]
    fn same_seed_same_choices_and_frequencies_follow_probabilities() {
        let cfg = SamplerConfig {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            seed: 42,
        };
        // ln 3 apart: p = [0.75, 0.25]
        let logits = [1.0986123, 0.0];
        let a: Vec<u32> = (0..2000)
            .map({
                let mut s = Sampler::new(cfg.clone());
                move |_| s.sample(&logits)
            })
            .collect();
        let b: Vec<u32> = (0..2000)
            .map({
                let mut s = Sampler::new(cfg.clone());
                move |_| s.sample(&logits)
            })
            .collect();
        assert_eq!(a, b);
        let zeros = a.iter().filter(|&&x| x == 0).count() as f64 / 2000.0;
        assert!((zeros - 0.75).abs() < 0.04, "{zeros}");
    }
}
