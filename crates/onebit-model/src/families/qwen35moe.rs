//! Qwen3.5/3.6-MoE (Qwen3.6-35B-A3B, ...): the Qwen3.5 body (gated
//! delta-net and gated attention layers, `qwen35.rs`) whose every FFN is
//! routed experts plus one shared expert, as llama.cpp's
//! `src/models/qwen35moe.cpp` builds it: softmax over all experts, the top
//! `expert_used_count` renormalized; the shared expert's output multiplied
//! by sigmoid(`ffn_gate_inp_shexp` h) and added. Its packs (FastFlowLM's
//! `qwen3.6-moe`) are not read yet: refused.

use super::decls::Decls;
use super::moe::{self, MoeRule};
use super::qwen35;
use super::Family;
use crate::error::Result;
use crate::semantics::*;

pub const FAMILY: Family = Family {
    arch: "qwen35moe",
    hf_names: &["qwen3_5_moe", "qwen3_5_moe_text", "Qwen3_5MoeForCausalLM"],
    semantics,
    pack: None,
    import: None,
};

pub const RULE: MoeRule = MoeRule {
    source: "llama.cpp src/models/qwen35moe.cpp",
    gating: Some(Gating::Softmax),
    selection_bias: false,
    norm_default: true,
    leading_dense: false,
    shared: true,
    shared_gate: true,
};

pub fn semantics(d: &Decls) -> Result<Semantics> {
    let mut s = qwen35::body(d, "qwen35moe")?;
    s.moe = Some(moe::read(d, &s.dims, &RULE)?);
    Ok(s)
}
