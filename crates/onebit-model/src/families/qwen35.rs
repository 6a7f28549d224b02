//! Qwen3.5 (text): gated delta-net linear attention mixed with gated full
//! attention. What differs from the base:
//!
//! - Layer kinds: `attention.recurrent_layers` (a flag per layer) when
//!   present, else layer i is linear unless (i + 1) % full_attention_interval
//!   == 0 (default interval 4).
//! - Full attention: `attn_q` yields [q_h | gate_h] per head; the attention
//!   output is multiplied by sigmoid(gate) before `attn_output`; q/k RMSNorm
//!   before RoPE; partial rotary over the first `rope.dimension_count` dims,
//!   interleaved multi-axis (IMROPE, `rope.dimension_sections`, read by
//!   `qwen3vl::imrope`): pairs as halves, text rows at (p, p, p, 0) (a pair
//!   on the fourth component does not turn for text), an image's rows on
//!   their grid (Qwen3.5's vision checkpoints, mmproj `qwen3vl_merger`
//!   without deepstack).
//! - Linear layers: the gated delta rule with per-sequence conv and recurrent
//!   state; V head h reads q/k head h % n_k_heads.
//! - Norms stored with the +1 folded in (plain form); the pre-feed-forward
//!   norm is the tensor GGUF calls `post_attention_norm`.

use serde_json::Value as Json;

use super::common::{base, qk_norm};
use super::decls::{self as k, keys, Decls};
use super::Family;
use crate::error::Result;
use crate::semantics::*;

pub const FAMILY: Family = Family {
    arch: "qwen35",
    hf_names: &[
        "qwen3_5",
        "qwen3_5_text",
        "Qwen3_5ForCausalLM",
        "Qwen3_5ForConditionalGeneration",
    ],
    semantics,
    pack: None,
    import: None,
};

// qwen35's own keys (the shared ones are in decls.rs).
keys! {
    SSM_CONV_KERNEL = "ssm.conv_kernel", ["linear_conv_kernel_dim"];
    SSM_STATE_SIZE = "ssm.state_size", ["linear_key_head_dim"];
    SSM_GROUP_COUNT = "ssm.group_count", ["linear_num_key_heads"];
    SSM_TIME_STEP_RANK = "ssm.time_step_rank", ["linear_num_value_heads"];
    SSM_INNER_SIZE = "ssm.inner_size", [];
    FULL_ATTN_INTERVAL = "full_attention_interval", ["full_attention_interval"];
    RECURRENT_LAYERS = "attention.recurrent_layers", [];
    // config.json only: GGUF states the products (rope.dimension_count,
    // ssm.inner_size).
    PARTIAL_ROTARY = "", ["partial_rotary_factor", "rope_parameters/partial_rotary_factor"];
    LINEAR_V_HEAD_DIM = "", ["linear_value_head_dim"];
}

const DEFAULT_INTERVAL: usize = 4;

pub fn semantics(d: &Decls) -> Result<Semantics> {
    body(d, "qwen35")
}

/// The Qwen3.5 body (layer kinds, delta-net sizes, gated attention, norms),
/// as `family` (qwen35, or qwen35moe whose FFNs route) reads it.
pub fn body(d: &Decls, family: &'static str) -> Result<Semantics> {
    let mut s = base(
        d,
        family,
        Sourced::new(
            RopeStyle::Halves,
            format!("{family}: IMROPE rotates halves (ggml rotate_pairs over n_dims / 2)"),
        ),
        &[],
    )?;
    let n_layer = s.dims.n_layer;

    // IMROPE (llama.cpp's QWEN35 / QWEN35MOE rope type), read as qwen3vl
    // reads it: text at (p, p, p, 0), images on their grid.
    super::qwen3vl::imrope(d, &mut s, family, false)?;

    s.layer_kinds = match d.get(RECURRENT_LAYERS) {
        Some(Json::Array(flags)) if flags.len() == n_layer => {
            let kinds = flags
                .iter()
                .map(
                    |f| match f.as_bool().or_else(|| f.as_u64().map(|v| v != 0)) {
                        Some(true) => Ok(LayerKind::DeltaNet),
                        Some(false) => Ok(LayerKind::Full),
                        None => Err(d.err(
                            RECURRENT_LAYERS,
                            format!("entries must be flags, found {f}"),
                        )),
                    },
                )
                .collect::<Result<Vec<_>>>()?;
            Sourced::new(kinds, d.src(RECURRENT_LAYERS))
        }
        Some(v) => {
            return Err(d.err(
                RECURRENT_LAYERS,
                format!("expected {n_layer} flags, found {v}"),
            ))
        }
        None if d.get(k::LAYER_TYPES).is_some() => {
            let types = d.get(k::LAYER_TYPES).expect("checked");
            let kinds = types
                .as_array()
                .filter(|l| l.len() == n_layer)
                .ok_or_else(|| {
                    d.err(
                        k::LAYER_TYPES,
                        format!("expected {n_layer} layer types, found {types}"),
                    )
                })?
                .iter()
                .map(|t| match t.as_str() {
                    Some("linear_attention") => Ok(LayerKind::DeltaNet),
                    Some("full_attention") => Ok(LayerKind::Full),
                    _ => Err(d.err(
                        k::LAYER_TYPES,
                        format!(
                            "entries are \"linear_attention\" or \"full_attention\", found {t}"
                        ),
                    )),
                })
                .collect::<Result<Vec<_>>>()?;
            Sourced::new(kinds, d.src(k::LAYER_TYPES))
        }
        None => {
            let (interval, src) = match d.usize_opt(FULL_ATTN_INTERVAL)? {
                Some(0) => return Err(d.err(FULL_ATTN_INTERVAL, "must be positive")),
                Some(i) => (i, d.src(FULL_ATTN_INTERVAL)),
                None => (
                    DEFAULT_INTERVAL,
                    format!("{family} default interval {DEFAULT_INTERVAL}"),
                ),
            };
            let kinds = (0..n_layer)
                .map(|i| {
                    if (i + 1) % interval == 0 {
                        LayerKind::Full
                    } else {
                        LayerKind::DeltaNet
                    }
                })
                .collect();
            Sourced::new(
                kinds,
                format!("{src}: layer i full when (i + 1) % {interval} == 0"),
            )
        }
    };

    let conv_kernel = d.positive(SSM_CONV_KERNEL)?;
    let head_k_dim = d.positive(SSM_STATE_SIZE)?;
    let n_k_heads = d.positive(SSM_GROUP_COUNT)?;
    let n_v_heads = d.positive(SSM_TIME_STEP_RANK)?;
    let inner = match (
        d.usize_opt(SSM_INNER_SIZE)?,
        d.usize_opt(LINEAR_V_HEAD_DIM)?,
    ) {
        (Some(i), _) => i,
        (None, Some(dv)) => n_v_heads * d.size_checked(LINEAR_V_HEAD_DIM, dv)?,
        (None, None) => n_v_heads * head_k_dim,
    };
    if inner % n_v_heads != 0 || n_v_heads % n_k_heads != 0 {
        return Err(d.err(
            SSM_INNER_SIZE,
            format!("{inner} inner dims over {n_v_heads} v heads and {n_k_heads} k heads do not divide evenly"),
        ));
    }
    s.delta_net = Some(Sourced::new(
        DeltaNetDims {
            conv_kernel,
            n_k_heads,
            n_v_heads,
            head_k_dim,
            head_v_dim: inner / n_v_heads,
        },
        format!("{} and the other ssm.* keys", d.src(SSM_CONV_KERNEL)),
    ));
    // A config.json states the rotary width as a fraction of the head dim.
    if d.get(k::ROPE_DIMS).is_none() {
        if let Some(f) = d.f64_opt(PARTIAL_ROTARY)? {
            let rot = f * s.dims.head_dim_k as f64;
            let n_rot = rot.round() as usize;
            if !(f > 0.0 && f <= 1.0)
                || (rot - n_rot as f64).abs() > 1e-6
                || !n_rot.is_multiple_of(2)
            {
                return Err(d.err(
                    PARTIAL_ROTARY,
                    format!(
                        "{f} of head dim {} is not an even rotary width",
                        s.dims.head_dim_k
                    ),
                ));
            }
            for r in [&mut s.rope_full, &mut s.rope_sliding] {
                r.value.n_rot = n_rot;
                r.source = format!(
                    "{}; rotary width {} x head_dim",
                    r.source,
                    d.src(PARTIAL_ROTARY)
                );
            }
        }
    }
    s.attn_output_gate = Sourced::new(
        true,
        format!("{family}: attn_q yields [q | gate] per head; output x sigmoid(gate)"),
    );
    s.qk_norm = qk_norm(
        d,
        true,
        QkNorm::BeforeRope,
        &format!("{family}: q/k RMSNorm before RoPE"),
    )?;
    s.norm_form = Sourced::new(
        NormForm::Plain,
        format!("{family} GGUF: norms stored as 1 + w (ssm_norm plain)"),
    );
    s.body = Sourced::new(
        Body {
            ffn_norm: "post_attention_norm.weight",
            ..Body::default()
        },
        format!("{family}: the pre-feed-forward norm is GGUF's post_attention_norm"),
    );
    Ok(s)
}
