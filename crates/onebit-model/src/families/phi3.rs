//! Phi-3. What differs from the base:
//!
//! - Fused tensors: `attn_qkv` rows are Q | K | V and `ffn_up` rows are
//!   gate | up (the loader splits them by rows).
//! - Partial rotary (`rope.dimension_count` < head dim), halves pairing.
//! - LongRoPE: per-pair divisors `rope_factors_short` / `rope_factors_long`;
//!   the long table applies when the run's context exceeds the original
//!   training context (llama.cpp's rule: by context size, not sequence
//!   length), and `rope.scaling.attn_factor` multiplies cos and sin.
//! - A declared sliding window is not applied, as llama.cpp does not.

use super::common::base;
use super::decls::{self as k, keys, Decls};
use super::Family;
use crate::error::Result;
use crate::semantics::*;

pub const FAMILY: Family = Family {
    arch: "phi3",
    hf_names: &["phi3", "Phi3ForCausalLM"],
    semantics,
    pack: None,
    import: None,
};

// phi3's own keys (the shared ones are in decls.rs).
keys! {
    ROPE_SCALING_ATTN_FACTOR = "rope.scaling.attn_factor", [];
    ROPE_SCALING_ORIG_CTX = "rope.scaling.original_context_length", ["rope_scaling/original_max_position_embeddings"];
}

pub const FACTORS_SHORT: &str = "rope_factors_short.weight";
pub const FACTORS_LONG: &str = "rope_factors_long.weight";

pub fn semantics(d: &Decls) -> Result<Semantics> {
    let mut s = base(
        d,
        "phi3",
        Sourced::new(RopeStyle::Halves, "phi3: neox (halves) RoPE"),
        &["longrope"],
    )?;
    let rope = &mut s.rope_full.value;
    if d.has_tensor(FACTORS_SHORT) {
        rope.freq_factors = Some(FACTORS_SHORT.into());
        s.rope_full.source = format!(
            "{}; LongRoPE short factors ({FACTORS_LONG} when the context exceeds {})",
            s.rope_full.source,
            d.spelled(ROPE_SCALING_ORIG_CTX)
        );
    }
    if d.has_tensor(FACTORS_LONG) {
        let orig = d.usize_opt(ROPE_SCALING_ORIG_CTX)?.ok_or_else(|| {
            d.err(
                ROPE_SCALING_ORIG_CTX,
                "LongRoPE factors need the original context length",
            )
        })?;
        rope.long_factors = Some((FACTORS_LONG.into(), orig));
    }
    if let Some(f) = d.f64_opt(ROPE_SCALING_ATTN_FACTOR)? {
        if !(f > 0.0 && f.is_finite()) {
            return Err(d.err(
                ROPE_SCALING_ATTN_FACTOR,
                format!("must be positive, found {f}"),
            ));
        }
        rope.attn_factor = f;
        s.rope_full.source = format!(
            "{}; attention factor from {}",
            s.rope_full.source,
            d.src(ROPE_SCALING_ATTN_FACTOR)
        );
    }
    s.rope_sliding = s.rope_full.clone();
    if let Some(w) = d.usize_opt(k::SLIDING_WINDOW)?.filter(|&w| w > 0) {
        s.sliding_window.source = format!(
            "{} = {w} declared and not applied, as llama.cpp does not",
            d.src(k::SLIDING_WINDOW)
        );
    }
    Ok(s)
}
