//! What the pack tests share: a model's logits over ids, and the two
//! measures they compare a pack's logits with its GGUF's by (the lowest
//! per-position cosine, the share of positions with the same argmax).

use onebit_model::{load, ExecConfig, Logits};

/// Every position's logits of `ids` on the model at `path`, one thread.
pub fn logits(path: &std::path::Path, ids: &[u32]) -> Vec<f32> {
    let exec = ExecConfig {
        threads: 1,
        ..Default::default()
    };
    let (m, _) = load::load(path, &exec).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut st = m.new_state();
    m.forward(&mut st, ids, Logits::All).unwrap()
}

/// The lowest cosine between the two arrays' rows of `nv` logits.
pub fn min_cos(a: &[f32], b: &[f32], nv: usize) -> f32 {
    a.chunks(nv)
        .zip(b.chunks(nv))
        .map(|(x, y)| {
            let d: f32 = x.iter().zip(y).map(|(p, q)| p * q).sum();
            let n = |v: &[f32]| v.iter().map(|p| p * p).sum::<f32>().sqrt();
            d / n(x) / n(y)
        })
        .fold(1.0, f32::min)
}

/// The share of rows of `nv` logits whose argmax the two arrays agree on.
pub fn top1_agreement(a: &[f32], b: &[f32], nv: usize) -> f32 {
    let n = a.len() / nv;
    a.chunks(nv)
        .zip(b.chunks(nv))
        .filter(|(x, y)| onebit_testdata::argmax(x) == onebit_testdata::argmax(y))
        .count() as f32
        / n as f32
}
