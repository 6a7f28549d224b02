//! Llama (and the many models that reuse its architecture, SmolLM2 among them).
//!
//! What differs from the base: only the RoPE pairing, and only in GGUF.
//! llama.cpp's converter permutes the rows of HF's q_proj and k_proj so that
//! RoPE on adjacent pairs (ggml NORM mode) equals HF's rotate-half on the
//! original weights; FastFlowLM's converter permutes them back, so a pack
//! rotates halves.

use onebit_formats::q4nx::Q4Kind;

use super::common::base;
use super::decls::{ContainerKind, Decls};
use super::{no_config, Family, ImportRules, PackNames};
use crate::error::Result;
use crate::semantics::*;

pub const FAMILY: Family = Family {
    arch: "llama",
    hf_names: &["llama", "LlamaForCausalLM"],
    semantics,
    pack: Some(PackNames { rows: &[] }),
    import: Some(ImportRules {
        model_type: "llama",
        hf_arch: "LlamaForCausalLM",
        q4_kind: Q4Kind::Asymmetric,
        unpermute_qk: true,
        prescale_embedding: false,
        eps_key: "rms_norm_eps",
        config: no_config,
    }),
};

pub fn semantics(d: &Decls) -> Result<Semantics> {
    let style = match d.container {
        ContainerKind::Gguf => Sourced::new(
            RopeStyle::Interleaved,
            "llama GGUF: q/k rows permuted by the converter for adjacent-pair RoPE",
        ),
        ContainerKind::Pack => Sourced::new(
            RopeStyle::Halves,
            "llama pack: q/k rows un-permuted, HF rotate-half",
        ),
    };
    base(d, "llama", style, &[])
}
