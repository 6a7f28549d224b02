//! Qwen3-VL-MoE (text side), as llama.cpp's `src/models/qwen3vlmoe.cpp`
//! builds it: the qwen3moe body (every layer's FFN routed: softmax over all
//! experts, the top `expert_used_count` renormalized, no shared expert)
//! with Qwen3-VL's IMROPE and deepstack (`qwen3vl::vision_text`). Packs are
//! refused.

use super::common::{base, qk_norm};
use super::decls::Decls;
use super::{moe, qwen3moe, qwen3vl, Family};
use crate::error::Result;
use crate::semantics::*;

pub const FAMILY: Family = Family {
    arch: "qwen3vlmoe",
    hf_names: &["qwen3_vl_moe", "Qwen3VLMoeForConditionalGeneration"],
    semantics,
    pack: None,
    import: None,
};

pub fn semantics(d: &Decls) -> Result<Semantics> {
    let mut s = base(
        d,
        "qwen3vlmoe",
        Sourced::new(
            RopeStyle::Halves,
            "qwen3vlmoe: IMROPE rotates halves (ggml rotate_pairs over n_dims / 2)",
        ),
        &[],
    )?;
    s.qk_norm = qk_norm(
        d,
        true,
        QkNorm::BeforeRope,
        "qwen3vlmoe: q/k RMSNorm before RoPE",
    )?;
    let rule = moe::MoeRule {
        source: "llama.cpp src/models/qwen3vlmoe.cpp",
        ..qwen3moe::RULE
    };
    s.moe = Some(moe::read(d, &s.dims, &rule)?);
    qwen3vl::vision_text(d, &mut s, "qwen3vlmoe")?;
    Ok(s)
}
