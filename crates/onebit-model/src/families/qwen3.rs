//! Qwen3: halves RoPE and an RMSNorm over each q and k head before RoPE (its
//! head dim may differ from n_embd / n_head: the key length says).

use super::common::{base, qk_norm};
use super::decls::Decls;
use crate::error::Result;
use crate::semantics::*;

pub fn semantics(d: &Decls) -> Result<Semantics> {
    let mut s = base(
        d,
        "qwen3",
        Sourced::new(RopeStyle::Halves, "qwen3: neox (halves) RoPE"),
        &[],
    )?;
    s.qk_norm = qk_norm(
        d,
        true,
        QkNorm::BeforeRope,
        "qwen3: q/k RMSNorm before RoPE",
    )?;
    Ok(s)
}
