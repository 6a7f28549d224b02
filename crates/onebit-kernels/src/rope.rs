//! Rotary position embedding.
//!
//! The inverse frequencies of a layer kind are computed once (base, rotary
//! width, linear scale, per-pair factors) and applied per position. Dimensions
//! past the rotary width pass through unchanged.
//!
//! A position has four components (t, h, w, e), as ggml's multi-axis RoPE
//! takes them. Single-axis RoPE reads only t. Interleaved multi-axis RoPE
//! (ggml's IMROPE: Qwen3-VL, Qwen3.5) turns each pair by the component
//! [`imrope_axes`] assigns it; with every component equal to t and no pair on
//! e, it is single-axis RoPE, bit for bit.

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeStyle {
    /// Adjacent pairs (x\[2i\], x[2i+1]): ggml's NORM mode, GGUF llama weights.
    Interleaved,
    /// Halves (x\[i\], x[i + n_rot/2]): ggml's NEOX mode, HF's rotate_half.
    Halves,
}

#[derive(Clone, Debug)]
pub struct Rope {
    pub style: RopeStyle,
    pub n_rot: usize,
    /// theta_i = pos * inv_freq\[i\], i < n_rot / 2
    pub inv_freq: Vec<f64>,
    /// Multiplies cos and sin (LongRoPE's attention factor); 1 elsewhere.
    pub attn_factor: f64,
    /// Per pair, the position component (0 t, 1 h, 2 w, 3 e) it turns by
    /// (IMROPE, [`imrope_axes`]); None: every pair turns by t.
    pub axes: Option<Vec<u8>>,
}

/// IMROPE's component of each of `n_pairs` pairs for `sections` (ggml's
/// `ggml_mrope_cache_init` with `is_imrope`): pair i is sector
/// s = i % sum(sections); s % 3 == 1 and s < 3 sections\[1\] turns by h,
/// else s % 3 == 2 and s < 3 sections\[2\] by w, else s % 3 == 0 and
/// s < 3 sections\[0\] by t, else by e. None when the sections sum to 0.
pub fn imrope_axes(sections: [usize; 4], n_pairs: usize) -> Option<Vec<u8>> {
    let total: usize = sections.iter().sum();
    if total == 0 {
        return None;
    }
    Some(
        (0..n_pairs)
            .map(|i| {
                let s = i % total;
                if s % 3 == 1 && s < 3 * sections[1] {
                    1
                } else if s % 3 == 2 && s < 3 * sections[2] {
                    2
                } else if s.is_multiple_of(3) && s < 3 * sections[0] {
                    0
                } else {
                    3
                }
            })
            .collect(),
    )
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
            axes: None,
        }
    }

    /// cos/sin of every pair at the four-component position `pos` (t, h,
    /// w, e): each pair by its component ([`Rope::axes`]), else by t.
    pub fn angles_at(&self, pos: [usize; 4]) -> Vec<(f32, f32)> {
        let Some(axes) = &self.axes else {
            return self.angles(pos[0]);
        };
        self.inv_freq
            .iter()
            .zip(axes)
            .map(|(&f, &a)| {
                let (s, c) = (pos[a as usize] as f64 * f).sin_cos();
                ((c * self.attn_factor) as f32, (s * self.attn_factor) as f32)
            })
            .collect()
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
    fn imrope_assigns_pairs_as_ggml_does() {
        // Qwen3-VL's [24, 20, 20, 0] over 64 pairs: t h w t h w ..., h and
        // w end at sector 60, t runs on to 72; sectors 61 and 62 fall to e.
        let a = imrope_axes([24, 20, 20, 0], 64).unwrap();
        assert_eq!(&a[..6], &[0, 1, 2, 0, 1, 2]);
        assert_eq!(&a[57..], &[0, 1, 2, 0, 3, 3, 0]);
        assert_eq!(a.iter().filter(|&&x| x == 0).count(), 22);
        assert_eq!(a.iter().filter(|&&x| x == 3).count(), 2);
        // Qwen3.5's [11, 11, 10, 0] over 32 pairs: no pair on e.
        let b = imrope_axes([11, 11, 10, 0], 32).unwrap();
        assert!(!b.contains(&3));
        assert_eq!(b.iter().filter(|&&x| x == 2).count(), 10);
        // Sectors repeat past the sections' sum.
        assert_eq!(imrope_axes([1, 1, 1, 0], 5).unwrap(), vec![0, 1, 2, 0, 1]);
        assert!(imrope_axes([0; 4], 8).is_none());
    }

    #[test]
    fn multi_axis_angles_read_each_pairs_component() {
        let mut r = Rope::new(RopeStyle::Halves, 8, 100.0, 1.0, None);
        // All components equal and no e pair: single-axis angles, bit for bit.
        let single = r.angles(7);
        r.axes = imrope_axes([1, 1, 1, 0], 4);
        assert_eq!(r.angles_at([7, 7, 7, 0]), single);
        // Pair 1 turns by h, pair 2 by w, pair 3 (sector 0) by t again.
        let a = r.angles_at([2, 5, 9, 0]);
        for (i, p) in [(0, 2.0), (1, 5.0), (2, 9.0), (3, 2.0)] {
            let want = (p * r.inv_freq[i]).cos() as f32;
            assert_eq!(a[i].0, want, "pair {i}");
        }
        // A pair on e turns by the fourth component.
        r.axes = imrope_axes([2, 1, 1, 0], 4);
        assert_eq!(r.axes.as_deref(), Some(&[0, 1, 2, 0][..]));
        r.axes = Some(vec![0, 1, 2, 3]);
        assert_eq!(r.angles_at([4, 4, 4, 0])[3], (1.0, 0.0));
    }

    #[test]
    fn frequencies_follow_base_scale_and_factors() {
        // n_rot 4: inv_freq = [1, base^-0.5]; base 100 -> [1, 0.1]; scale 0.5; factors [1, 2]
        let r = Rope::new(RopeStyle::Halves, 4, 100.0, 0.5, Some(&[1.0, 2.0]));
        assert!((r.inv_freq[0] - 0.5).abs() < 1e-12);
        assert!((r.inv_freq[1] - 0.025).abs() < 1e-12);
    }
}
