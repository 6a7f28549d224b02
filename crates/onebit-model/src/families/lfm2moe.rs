//! LFM2-MoE (LFM2-8B-A1B, ...): the LFM2 body (short-conv and attention
//! layers, `lfm2.rs`) whose FFNs from `leading_dense_block_count` on are
//! routed experts, as llama.cpp's `src/models/lfm2.cpp` builds them for
//! lfm2moe (`src/models/lfm2moe.cpp` loads them): sigmoid scores (the
//! declared `expert_gating_func`), `exp_probs_b` added to choose the
//! experts but not to weigh them, the chosen weights renormalized; no
//! shared expert. Its packs are refused.

use super::decls::Decls;
use super::lfm2;
use super::moe::{self, MoeRule};
use super::Family;
use crate::error::Result;
use crate::semantics::*;

pub const FAMILY: Family = Family {
    arch: "lfm2moe",
    hf_names: &["lfm2_moe", "Lfm2MoeForCausalLM"],
    semantics,
    pack: None,
    import: None,
};

pub const RULE: MoeRule = MoeRule {
    source: "llama.cpp src/models/lfm2.cpp (lfm2moe)",
    gating: None,
    selection_bias: true,
    norm_default: true,
    leading_dense: true,
    shared: false,
    shared_gate: false,
};

pub fn semantics(d: &Decls) -> Result<Semantics> {
    let mut s = lfm2::body(d, "lfm2moe")?;
    s.moe = Some(moe::read(d, &s.dims, &RULE)?);
    Ok(s)
}
