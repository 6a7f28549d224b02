//! Qwen3: halves RoPE and an RMSNorm over each q and k head before RoPE (its
//! head dim may differ from n_embd / n_head: the key length says).

use onebit_formats::q4nx::Q4Kind;

use super::common::{base, qk_norm};
use super::decls::Decls;
use super::{no_config, Family, ImportRules, PackNames};
use crate::error::Result;
use crate::semantics::*;

pub const FAMILY: Family = Family {
    arch: "qwen3",
    hf_names: &["qwen3", "Qwen3ForCausalLM"],
    semantics,
    pack: Some(PackNames { rows: &[] }),
    import: Some(ImportRules {
        model_type: "qwen3",
        hf_arch: "Qwen3ForCausalLM",
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
