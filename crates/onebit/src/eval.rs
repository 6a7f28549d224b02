//! `onebit eval`: teacher-forced top-1 accuracy and perplexity of a model
//! over a text (every position predicts the next token).

use anyhow::{bail, Result};
use onebit_model::{Logits, Model};

/// Teacher-forced evaluation: every position predicts the next token.
pub struct EvalResult {
    pub tokens: usize,
    pub correct: usize,
    pub nll: f64,
}

pub fn eval(model: &Model, ids: &[u32]) -> Result<EvalResult> {
    if ids.len() < 2 {
        bail!(
            "the text encodes to {} tokens; eval needs at least 2",
            ids.len()
        );
    }
    if ids.len() > model.max_context() {
        bail!(
            "the text encodes to {} tokens, more than the context of {}",
            ids.len(),
            model.max_context()
        );
    }
    let mut state = model.new_state();
    let logits = model.forward(&mut state, ids, Logits::All)?;
    let nv = model.sem.dims.n_vocab;
    let (mut correct, mut nll) = (0usize, 0f64);
    for (i, &target) in ids[1..].iter().enumerate() {
        let row = &logits[i * nv..(i + 1) * nv];
        let (best, max) =
            row.iter()
                .enumerate()
                .fold((0, f32::MIN), |b, (j, &v)| if v > b.1 { (j, v) } else { b });
        correct += (best as u32 == target) as usize;
        let lse = max as f64
            + row
                .iter()
                .map(|&v| ((v - max) as f64).exp())
                .sum::<f64>()
                .ln();
        nll += lse - row[target as usize] as f64;
    }
    Ok(EvalResult {
        tokens: ids.len() - 1,
        correct,
        nll,
    })
}

impl EvalResult {
    pub fn top1(&self) -> f64 {
        self.correct as f64 / self.tokens as f64
    }
    pub fn perplexity(&self) -> f64 {
        (self.nll / self.tokens as f64).exp()
    }
}
