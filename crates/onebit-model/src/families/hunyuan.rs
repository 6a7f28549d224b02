//! Hunyuan dense (HunYuanDenseV1). What differs from the base:
//!
//! - q/k RMSNorm *after* RoPE (`use_qk_norm` decides when stated).
//! - NTK-aware RoPE base: HF declares `rope_scaling: {type: dynamic, alpha}`
//!   and uses the fixed base theta * alpha^(d/(d-2)), d the rotary width. The
//!   GGUF converter folds alpha into `rope.freq_base`; a `rope.scaling.alpha`
//!   key, when present, applies on top of it as llama.cpp applies it.

use super::common::{base, qk_norm};
use super::decls::{self as k, keys, Decls};
use super::{Family, PackNames};
use crate::error::Result;
use crate::semantics::*;

/// Hunyuan dense packs use the common tensor names; the converter does not
/// write them.
pub const FAMILY: Family = Family {
    arch: "hunyuan-dense",
    hf_names: &["hunyuan_v1_dense", "HunYuanDenseV1ForCausalLM"],
    semantics,
    pack: Some(PackNames { rows: &[] }),
    import: None,
};

// hunyuan's own keys (the shared ones are in decls.rs).
keys! {
    ROPE_SCALING_ALPHA = "rope.scaling.alpha", ["rope_scaling/alpha"];
}

pub fn semantics(d: &Decls) -> Result<Semantics> {
    let mut s = base(
        d,
        "hunyuan-dense",
        Sourced::new(RopeStyle::Halves, "hunyuan: neox (halves) RoPE"),
        &["dynamic"],
    )?;
    if let Some(alpha) = d.f64_opt(ROPE_SCALING_ALPHA)? {
        if !(alpha > 0.0 && alpha.is_finite()) {
            return Err(d.err(
                ROPE_SCALING_ALPHA,
                format!("must be positive, found {alpha}"),
            ));
        }
        let dim = s.rope_full.value.n_rot as f64;
        if dim <= 2.0 {
            return Err(d.err(k::ROPE_DIMS, "NTK alpha needs a rotary width above 2"));
        }
        let rope = &mut s.rope_full.value;
        rope.base = ntk_alpha_base(rope.base, alpha, dim);
        s.rope_full.source = format!(
            "{} * alpha^(d/(d-2)) with {} = {alpha}, d = {dim}",
            s.rope_full.source,
            d.src(ROPE_SCALING_ALPHA)
        );
    } else if d.str_opt(k::ROPE_SCALING_TYPE)?.as_deref() == Some("dynamic") {
        return Err(d.err(
            ROPE_SCALING_ALPHA,
            "dynamic RoPE scaling is declared without an alpha",
        ));
    }
    s.rope_sliding = s.rope_full.clone();
    s.qk_norm = qk_norm(
        d,
        true,
        QkNorm::AfterRope,
        "hunyuan: q/k RMSNorm after RoPE",
    )?;
    Ok(s)
}

/// The fixed NTK-aware base: theta * alpha^(dim / (dim - 2)).
pub fn ntk_alpha_base(theta: f64, alpha: f64, dim: f64) -> f64 {
    theta * alpha.powf(dim / (dim - 2.0))
}

#[cfg(test)]
mod tests {
    #[test]
    fn ntk_alpha_base_by_the_numbers() {
        // theta 10000, alpha 1000, dim 128: 10000 * 1000^(128/126) = 11,158,839.9
        let b = super::ntk_alpha_base(10000.0, 1000.0, 128.0);
        assert!((b - 11_158_839.9).abs() < 0.1, "{b}");
    }
}
