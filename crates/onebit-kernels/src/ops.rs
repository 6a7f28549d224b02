//! Elementwise and per-row ops in f32, written so that a row's result depends
//! only on that row (batched prefill must equal one token at a time, bit for bit).

/// RMSNorm of one row: `x / sqrt(mean(x^2) + eps) * w`. The sum of squares is
/// accumulated in f64: cheap at these widths and independent of row order.
pub fn rmsnorm(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    debug_assert_eq!(x.len(), w.len());
    let ss: f64 = x.iter().map(|&v| (v as f64) * (v as f64)).sum();
    let scale = (1.0 / (ss / x.len() as f64 + eps as f64).sqrt()) as f32;
    for ((o, &v), &g) in out.iter_mut().zip(x).zip(w) {
        *o = v * scale * g;
    }
}

/// RMSNorm in place.
pub fn rmsnorm_inplace(x: &mut [f32], w: &[f32], eps: f32) {
    let ss: f64 = x.iter().map(|&v| (v as f64) * (v as f64)).sum();
    let scale = (1.0 / (ss / x.len() as f64 + eps as f64).sqrt()) as f32;
    for (v, &g) in x.iter_mut().zip(w) {
        *v = *v * scale * g;
    }
}

pub fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

/// GELU, tanh approximation (what Gemma's `gelu_pytorch_tanh` computes).
pub fn gelu_tanh(x: f32) -> f32 {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    0.5 * x * (1.0 + (SQRT_2_OVER_PI * x * (1.0 + 0.044_715 * x * x)).tanh())
}

/// In-place softmax; max-subtracted, sum in f64.
pub fn softmax(x: &mut [f32]) {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0f64;
    for v in x.iter_mut() {
        *v = (*v - max).exp();
        sum += *v as f64;
    }
    let inv = (1.0 / sum) as f32;
    for v in x.iter_mut() {
        *v *= inv;
    }
}

/// Logit soft-capping: `cap * tanh(x / cap)`.
pub fn softcap(x: &mut [f32], cap: f32) {
    for v in x.iter_mut() {
        *v = cap * (*v / cap).tanh();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rmsnorm_by_hand() {
        // x = [3, 4]: mean square = 12.5, rms = 3.5355339; w = [1, 2]
        let mut out = [0.0; 2];
        rmsnorm(&[3.0, 4.0], &[1.0, 2.0], 0.0, &mut out);
        assert!((out[0] - 3.0 / 3.535_534).abs() < 1e-6);
        assert!((out[1] - 8.0 / 3.535_534).abs() < 1e-6);
    }

    #[test]
    fn gelu_and_silu_known_values() {
        // silu(1) = 1 / (1 + e^-1) = 0.7310586
        assert!((silu(1.0) - 0.731_058_6).abs() < 1e-6);
        // gelu_tanh(1) = 0.5 * (1 + tanh(0.7978846 * 1.044715)) = 0.8411920
        assert!((gelu_tanh(1.0) - 0.841_192).abs() < 1e-6);
        assert_eq!(gelu_tanh(0.0), 0.0);
    }

    #[test]
    fn softmax_sums_to_one_and_survives_large_inputs() {
        let mut x = [1000.0, 1000.0, -1000.0];
        softmax(&mut x);
        assert!((x[0] - 0.5).abs() < 1e-6 && (x[1] - 0.5).abs() < 1e-6 && x[2] == 0.0);
    }
}
