//! Rotary position embedding.
//!
//! The inverse frequencies of a layer kind are computed once (base, rotary
//! width, linear scale, per-pair factors) and applied per position. Dimensions
//! past the rotary width pass through unchanged.

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeStyle {
    /// Adjacent pairs (x[2i], x[2i+1]): ggml's NORM mode, GGUF llama weights.
    Interleaved,
    /// Halves (x[i], x[i + n_rot/2]): ggml's NEOX mode, HF's rotate_half.
    Halves,
}

#[derive(Clone, Debug)]
pub struct Rope {
    pub style: RopeStyle,
    pub n_rot: usize,
    /// theta_i = pos * inv_freq[i], i < n_rot / 2
    pub inv_freq: Vec<f64>,
    /// Multiplies cos and sin (LongRoPE's attention factor); 1 elsewhere.
    pub attn_factor: f64,
}

impl Rope {
    /// `freq_scale` multiplies every angle (linear scaling: 1/factor);
    /// `factors[i]`, when given, divides pair i's angle (rope_freqs tables).
    pub fn new(
        style: RopeStyle,
        n_rot: usize,
        base: f64,
        freq_scale: f64,
        factors: Option<&[f32]>,
    ) -> Rope {
        let half = n_rot / 2;
        let inv_freq = (0..half)
            .map(|i| {
                let f = freq_scale * base.powf(-2.0 * i as f64 / n_rot as f64);
                match factors {
                    Some(fs) => f / fs[i] as f64,
                    None => f,
                }
            })
            .collect();
        Rope {
            style,
            n_rot,
            inv_freq,
            attn_factor: 1.0,
        }
    }

    /// cos/sin of every pair at `pos`, to share across the heads of a token.
    pub fn angles(&self, pos: usize) -> Vec<(f32, f32)> {
        self.inv_freq
            .iter()
            .map(|&f| {
                let (s, c) = (pos as f64 * f).sin_cos();
                ((c * self.attn_factor) as f32, (s * self.attn_factor) as f32)
            })
            .collect()
    }

    /// Rotates one head vector in place with precomputed angles.
    pub fn apply(&self, head: &mut [f32], angles: &[(f32, f32)]) {
        let half = self.n_rot / 2;
        match self.style {
            RopeStyle::Interleaved => {
                for (i, &(c, s)) in angles.iter().enumerate() {
                    let (a, b) = (head[2 * i], head[2 * i + 1]);
                    head[2 * i] = a * c - b * s;
                    head[2 * i + 1] = a * s + b * c;
                }
            }
            RopeStyle::Halves => {
                for (i, &(c, s)) in angles.iter().enumerate() {
                    let (a, b) = (head[i], head[i + half]);
                    head[i] = a * c - b * s;
                    head[i + half] = a * s + b * c;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn position_zero_is_identity_and_styles_pair_differently() {
        let r = Rope::new(RopeStyle::Halves, 4, 10000.0, 1.0, None);
        let mut v = [1.0, 2.0, 3.0, 4.0, 5.0];
        r.apply(&mut v, &r.angles(0));
        assert_eq!(v, [1.0, 2.0, 3.0, 4.0, 5.0]);

        // pos 1, pair 0 has inv_freq 1: angle 1 rad. Halves rotates (x0, x2);
        // interleaved rotates (x0, x1). Dim 4 is past n_rot and untouched.
        let (c, s) = (1f32.cos(), 1f32.sin());
        let mut h = [1.0, 0.0, 0.0, 0.0, 9.0];
        r.apply(&mut h, &r.angles(1));
        assert!((h[0] - c).abs() < 1e-6 && (h[2] - s).abs() < 1e-6 && h[4] == 9.0);
        let ri = Rope::new(RopeStyle::Interleaved, 4, 10000.0, 1.0, None);
        let mut h = [1.0, 0.0, 0.0, 0.0];
        ri.apply(&mut h, &ri.angles(1));
        assert!((h[0] - c).abs() < 1e-6 && (h[1] - s).abs() < 1e-6);
    }

    #[test]
    fn frequencies_follow_base_scale_and_factors() {
        // n_rot 4: inv_freq = [1, base^-0.5]; base 100 -> [1, 0.1]; scale 0.5; factors [1, 2]
        let r = Rope::new(RopeStyle::Halves, 4, 100.0, 0.5, Some(&[1.0, 2.0]));
        assert!((r.inv_freq[0] - 0.5).abs() < 1e-12);
        assert!((r.inv_freq[1] - 0.025).abs() < 1e-12);
    }
}
