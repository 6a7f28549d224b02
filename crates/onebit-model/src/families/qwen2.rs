//! Qwen2: the llama body with biases on q, k and v, and halves (neox) RoPE.

use super::common::base;
use super::decls::Decls;
use crate::error::Result;
use crate::semantics::*;

pub fn semantics(d: &Decls) -> Result<Semantics> {
    let mut s = base(
        d,
        "qwen2",
        Sourced::new(RopeStyle::Halves, "qwen2: neox (halves) RoPE"),
        &[],
    )?;
    s.attn_bias = Sourced::new(true, "qwen2: q/k/v projections carry biases");
    Ok(s)
}
