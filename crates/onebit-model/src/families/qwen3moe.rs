//! Qwen3-MoE (Qwen3-30B-A3B, ...): the qwen3 body (halves RoPE, q/k RMSNorm
//! before RoPE) with every layer's FFN a routed-experts FFN, as llama.cpp's
//! `src/models/qwen3moe.cpp` builds it: softmax over all experts, the top
//! `expert_used_count`, their weights renormalized; no shared expert, no
//! dense layers. Its packs are refused (FastFlowLM has no qwen3moe pack).

use super::common::{base, qk_norm};
use super::decls::Decls;
use super::moe::{self, MoeRule};
use super::Family;
use crate::error::Result;
use crate::semantics::*;

pub const FAMILY: Family = Family {
    arch: "qwen3moe",
    hf_names: &["qwen3_moe", "Qwen3MoeForCausalLM"],
    semantics,
    pack: None,
    import: None,
};

const SOURCE: &str = "llama.cpp src/models/qwen3moe.cpp";

pub const RULE: MoeRule = MoeRule {
    source: SOURCE,
    gating: Some(Gating::Softmax),
    selection_bias: false,
    norm_default: true,
    leading_dense: false,
    shared: false,
    shared_gate: false,
};

pub fn semantics(d: &Decls) -> Result<Semantics> {
    let mut s = base(
        d,
        "qwen3moe",
        Sourced::new(RopeStyle::Halves, "qwen3moe: neox (halves) RoPE"),
        &[],
    )?;
    s.qk_norm = qk_norm(
        d,
        true,
        QkNorm::BeforeRope,
        "qwen3moe: q/k RMSNorm before RoPE",
    )?;
    s.moe = Some(moe::read(d, &s.dims, &RULE)?);
    Ok(s)
}
