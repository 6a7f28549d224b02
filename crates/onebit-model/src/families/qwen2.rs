//! Qwen2: the llama body with biases on q, k and v, and halves (neox) RoPE.

use onebit_formats::q4nx::Q4Kind;

use super::common::base;
use super::decls::Decls;
use super::{no_config, Family, ImportRules, PackNames};
use crate::error::Result;
use crate::semantics::*;

pub const FAMILY: Family = Family {
    arch: "qwen2",
    hf_names: &["qwen2", "Qwen2ForCausalLM"],
    semantics,
    pack: Some(PackNames { rows: &[] }),
    import: Some(ImportRules {
        model_type: "qwen2",
        hf_arch: "Qwen2ForCausalLM",
        q4_kind: Q4Kind::Asymmetric,
        unpermute_qk: false,
        prescale_embedding: false,
        eps_key: "rms_norm_eps",
        config: no_config,
    }),
};

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
