//! Gemma 4 (text, dense layers), as llama.cpp's `src/models/gemma4.cpp`
//! reads it from GGUF. What differs from the base, each rule read from the
//! model:
//!
//! - Layer kinds from `attention.sliding_window_pattern` (a flag per layer,
//!   true = sliding; config.json `layer_types`); the window from
//!   `attention.sliding_window`.
//! - Sliding layers have their own head size (`attention.key_length_swa` /
//!   `value_length_swa`), rotary width (`rope.dimension_count_swa`) and base
//!   (`rope.freq_base_swa`); full layers use `rope.freq_base` with the
//!   `rope_freqs` tensor as per-pair divisors ("proportional" RoPE: pairs
//!   past the rotated ones get 1e30, i.e. no rotation). NEOX pairing.
//! - Attention scale 1; q and k RMSNorm with a weight before RoPE, v RMSNorm
//!   without one.
//! - The last `attention.shared_kv_layers` layers have no K/V: a sliding one
//!   reads the KV cache of layer n - shared - 2, a full one of layer
//!   n - shared - 1 (llama.cpp's rule; each must be of the reader's kind).
//! - Body: sandwich norms, GELU(tanh)-gated FFN, then per-layer embeddings
//!   when `embedding_length_per_layer_input` > 0, then the layer output
//!   scale (`layer_output_scale` tensor, when present).
//! - Embeddings times sqrt(n_embd); final logit soft-capping when stated;
//!   tied output when there is no `output.weight`.
//! - Mixture-of-experts layers are refused by name.

use serde_json::Value as Json;

use super::common::{base, qk_norm};
use super::decls::{self as k, keys, ContainerKind, Decls};
use super::Family;
use crate::error::Result;
use crate::semantics::*;

pub const FAMILY: Family = Family {
    arch: "gemma4",
    hf_names: &[
        "gemma4",
        "gemma4_text",
        "Gemma4ForCausalLM",
        "Gemma4ForConditionalGeneration",
    ],
    semantics,
    pack: None,
    import: None,
};

// gemma4's own keys (the shared ones are in decls.rs).
keys! {
    KEY_LENGTH_SWA = "attention.key_length_swa", [];
    VALUE_LENGTH_SWA = "attention.value_length_swa", [];
    ROPE_DIMS_SWA = "rope.dimension_count_swa", [];
    ROPE_BASE_SWA = "rope.freq_base_swa", [];
    PER_LAYER_INPUT = "embedding_length_per_layer_input", ["hidden_size_per_layer_input"];
    SHARED_KV_LAYERS = "attention.shared_kv_layers", ["num_kv_shared_layers"];
    EXPERT_COUNT = "expert_count", ["num_experts"];
}

const OUTPUT_SCALE: &str = "layer_output_scale.weight";

pub fn semantics(d: &Decls) -> Result<Semantics> {
    let mut s = base(
        d,
        "gemma4",
        Sourced::new(RopeStyle::Halves, "gemma4: neox (halves) RoPE"),
        &[],
    )?;
    let n_layer = s.dims.n_layer;
    if d.usize_opt(EXPERT_COUNT)?.unwrap_or(0) > 0 || d.has_tensor("blk.0.ffn_gate_inp.weight") {
        return Err(d.err(
            EXPERT_COUNT,
            "mixture-of-experts layers are not implemented for gemma4",
        ));
    }

    // Layer kinds and the window.
    let window = d
        .usize_opt(k::SLIDING_WINDOW)?
        .filter(|&w| w > 0)
        .ok_or_else(|| d.err(k::SLIDING_WINDOW, "is required (a positive window)"))?;
    s.sliding_window = Sourced::new(Some(window), d.src(k::SLIDING_WINDOW));
    s.layer_kinds = layer_kinds(d, n_layer)?;
    let kinds = s.layer_kinds.value.clone();

    // Head sizes: full from the base keys, sliding from their own.
    let (dk, dv) = (s.dims.head_dim_k, s.dims.head_dim_v);
    let sk = d.usize_opt(KEY_LENGTH_SWA)?.unwrap_or(dk);
    let sv = d.usize_opt(VALUE_LENGTH_SWA)?.unwrap_or(dv);
    let sk = d.size_checked(KEY_LENGTH_SWA, sk)?;
    let sv = d.size_checked(VALUE_LENGTH_SWA, sv)?;
    if dk != dv || sk != sv {
        return Err(d.err(
            KEY_LENGTH_SWA,
            format!("gemma4 needs equal k and v head sizes per layer kind, found {dk}/{dv} full and {sk}/{sv} sliding"),
        ));
    }
    if sk == 0 {
        return Err(d.err(KEY_LENGTH_SWA, "must be positive, found 0"));
    }
    s.head_dims_sliding = Some(Sourced::new(
        (sk, sv),
        match d.get(KEY_LENGTH_SWA) {
            Some(_) => d.src(KEY_LENGTH_SWA),
            None => format!("{} absent: as full layers", d.spelled(KEY_LENGTH_SWA)),
        },
    ));

    // RoPE: full layers keep the base's spec (rope.freq_base, rotary width,
    // rope_freqs divisors); sliding layers their own base and width, no
    // divisors, unscaled.
    let mut sliding = s.rope_full.value.clone();
    sliding.freq_factors = None;
    sliding.scaling = RopeScaling::None;
    let base_src = match d.f64_opt(ROPE_BASE_SWA)? {
        Some(b) if b > 0.0 => {
            sliding.base = b;
            d.src(ROPE_BASE_SWA)
        }
        Some(b) => return Err(d.err(ROPE_BASE_SWA, format!("must be positive, found {b}"))),
        None => format!("{} absent: the full layers' base", d.spelled(ROPE_BASE_SWA)),
    };
    let n_rot = d.usize_opt(ROPE_DIMS_SWA)?.unwrap_or(sliding.n_rot);
    if n_rot > sk || n_rot % 2 != 0 {
        return Err(d.err(
            ROPE_DIMS_SWA,
            format!("the sliding rotary width {n_rot} must be even and at most the sliding head size {sk}"),
        ));
    }
    sliding.n_rot = n_rot;
    s.rope_sliding = Sourced::new(
        sliding,
        format!(
            "{base_src}; rotary {} from {}; unscaled, no factors",
            n_rot,
            d.spelled(ROPE_DIMS_SWA)
        ),
    );
    if s.rope_full.value.freq_factors.is_some() {
        s.rope_full.source = format!(
            "{}; proportional: rope_freqs.weight divisors on full layers",
            s.rope_full.source
        );
    }

    s.attn_scale = Sourced::new(1.0, "gemma4: attention scale 1 (q/k are RMS-normed)");
    s.qk_norm = qk_norm(
        d,
        true,
        QkNorm::BeforeRope,
        "gemma4: q/k RMSNorm before RoPE",
    )?;
    s.v_norm = Sourced::new(true, "gemma4: v RMSNorm without a weight");
    s.norm_form = Sourced::new(NormForm::Plain, "gemma4 GGUF: norms as stored");
    s.embed_scale = match d.container {
        ContainerKind::Gguf => Sourced::new(
            Some((s.dims.n_embd as f32).sqrt()),
            format!("gemma4: sqrt({} = {})", d.spelled(k::N_EMBD), s.dims.n_embd),
        ),
        ContainerKind::Pack => Sourced::new(
            None,
            "gemma4 pack: embedding stored pre-scaled by sqrt(hidden_size)",
        ),
    };
    s.activation = Sourced::new(Activation::GeluTanhGate, "gemma4: gelu_pytorch_tanh gate");
    if let Some(cap) = d.f64_opt(k::FINAL_SOFTCAP)? {
        s.final_softcap = Sourced::new(Some(cap as f32), d.src(k::FINAL_SOFTCAP));
    }

    // The body: sandwich norms, per-layer embeddings, output scale.
    let per_layer = d.usize(PER_LAYER_INPUT)?;
    let per_layer = d.size_checked(PER_LAYER_INPUT, per_layer)?;
    let output_scale = d.has_tensor(&format!("blk.0.{OUTPUT_SCALE}"));
    s.body = Sourced::new(
        Body {
            post_mixer_norm: Some("post_attention_norm.weight"),
            post_ffn_norm: Some("post_ffw_norm.weight"),
            per_layer_input: per_layer,
            output_scale: output_scale.then_some(OUTPUT_SCALE),
            ..Body::default()
        },
        format!(
            "gemma4: post-attention and post-FFN norms; per-layer input width from {}; output scale {}",
            d.src(PER_LAYER_INPUT),
            if output_scale {
                "from blk.N.layer_output_scale.weight"
            } else {
                "absent (blk.0.layer_output_scale.weight not in the file)"
            }
        ),
    );

    s.kv_source = kv_source(d, &kinds)?;
    Ok(s)
}

/// Sliding flags per layer (GGUF), or HF `layer_types`.
fn layer_kinds(d: &Decls, n_layer: usize) -> Result<Sourced<Vec<LayerKind>>> {
    if let Some(types) = d.get(k::LAYER_TYPES) {
        let kinds = super::gemma3::layer_types(d, &types, n_layer)?;
        return Ok(Sourced::new(kinds, d.src(k::LAYER_TYPES)));
    }
    let key = k::SLIDING_WINDOW_PATTERN;
    let flags = match d.get(key) {
        Some(Json::Array(f)) if f.len() == n_layer => f,
        Some(v) => {
            return Err(d.err(
                key,
                format!("expected {n_layer} per-layer flags, found {v}"),
            ))
        }
        None => return Err(d.err(key, "is required (one flag per layer, true = sliding)")),
    };
    let kinds = flags
        .iter()
        .map(|f| match f.as_bool() {
            Some(true) => Ok(LayerKind::Sliding),
            Some(false) => Ok(LayerKind::Full),
            None => Err(d.err(key, format!("entries must be true or false, found {f}"))),
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(Sourced::new(
        kinds,
        format!("{} (per-layer flags, true = sliding)", d.src(key)),
    ))
}

/// Which layer's KV cache each layer reads: the last `shared` layers read
/// layer n - shared - 2 (sliding) or n - shared - 1 (full).
fn kv_source(d: &Decls, kinds: &[LayerKind]) -> Result<Sourced<Vec<usize>>> {
    let n = kinds.len();
    let shared = d.usize_opt(SHARED_KV_LAYERS)?.unwrap_or(0);
    let mut src: Vec<usize> = (0..n).collect();
    if shared == 0 {
        return Ok(Sourced::new(
            src,
            format!(
                "{} 0 or absent: every layer its own KV",
                d.spelled(SHARED_KV_LAYERS)
            ),
        ));
    }
    if shared + 2 > n {
        return Err(d.err(
            SHARED_KV_LAYERS,
            format!("{shared} shared layers of {n} leave fewer than 2 layers with their own KV"),
        ));
    }
    let first = n - shared;
    for (i, s) in src.iter_mut().enumerate().skip(first) {
        let from = first - if kinds[i] == LayerKind::Sliding { 2 } else { 1 };
        if kinds[from] != kinds[i] {
            return Err(d.err(
                SHARED_KV_LAYERS,
                format!("layer {i} would read layer {from}'s KV cache, which is of another kind"),
            ));
        }
        *s = from;
    }
    Ok(Sourced::new(
        src,
        format!(
            "{} = {shared}: sliding layers read layer {}, full layers layer {}",
            d.src(SHARED_KV_LAYERS),
            first - 2,
            first - 1
        ),
    ))
}
