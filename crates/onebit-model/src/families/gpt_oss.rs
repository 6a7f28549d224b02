//! gpt-oss (GGUF arch `gpt-oss`), as llama.cpp's `src/models/openai-moe.cpp`
//! builds it. Invariant: every rule below is read from the model's
//! declarations or is a rule llama.cpp's graph hard-codes, each with its
//! source; what that graph would not run is refused by name.
//!
//! - Layer kinds: llama.cpp's `load_swa_pattern(ml, 2)`: per-layer flags
//!   when `attention.sliding_window_pattern` is an array, else the period
//!   n (key, default 2), layer il sliding iff il % n < n - 1: even layers
//!   slide, odd layers are full. The window from `attention.sliding_window`.
//! - NEOX RoPE on both kinds (the sliding base from `rope.freq_base_swa`
//!   when stated), with YaRN from `rope.scaling.{type,factor,
//!   original_context_length}`: ext_factor 1, beta_fast 32, beta_slow 1
//!   (llama.cpp's defaults, its context's rule for a yarn model), cos/sin
//!   times 1 + 0.1 ln(factor) (times `rope.scaling.attn_factor` when stated).
//! - Attention scale 1/sqrt(n_rot); per-head sinks `attn_sinks.weight`;
//!   biases on q, k, v (when present, as llama.cpp loads them) and on the
//!   output projection (required).
//! - The FFN input norm is `post_attention_norm.weight`.
//! - Every layer routes: the router's logits (plus `ffn_gate_inp.bias`)
//!   choose the top `expert_used_count`, their weights the softmax over the
//!   chosen logits (SOFTMAX_WEIGHT), no renormalization; every expert
//!   matrix adds its bias; the clamped SwiGLU (swiglu_oai).

use super::common::{base, kinds_from_flags};
use super::decls::{self as k, keys, Decls};
use super::moe::{self, MoeRule};
use super::Family;
use crate::error::Result;
use crate::semantics::*;

pub const FAMILY: Family = Family {
    arch: "gpt-oss",
    hf_names: &["gpt_oss", "GptOssForCausalLM"],
    semantics,
    pack: None,
    import: None,
};

const SOURCE: &str = "llama.cpp src/models/openai-moe.cpp";

keys! {
    ROPE_BASE_SWA = "rope.freq_base_swa", [];
    ROPE_SCALING_ORIG_CTX = "rope.scaling.original_context_length", ["rope_scaling/original_max_position_embeddings"];
    ROPE_SCALING_ATTN_FACTOR = "rope.scaling.attn_factor", [];
}

/// llama.cpp's swa pattern for this architecture (`load_swa_pattern(ml, 2)`).
pub const SWA_PERIOD: usize = 2;
/// llama.cpp's hparams defaults (src/llama-hparams.h), not read from GGUF
/// for this architecture.
pub const YARN_BETA_FAST: f64 = 32.0;
pub const YARN_BETA_SLOW: f64 = 1.0;

pub const RULE: MoeRule = MoeRule {
    source: SOURCE,
    gating: Some(Gating::SoftmaxWeight),
    selection_bias: false,
    norm_default: false,
    leading_dense: false,
    shared: false,
    shared_gate: false,
};

pub fn semantics(d: &Decls) -> Result<Semantics> {
    let mut s = base(
        d,
        "gpt-oss",
        Sourced::new(RopeStyle::Halves, "gpt-oss: neox (halves) RoPE"),
        &["yarn"],
    )?;
    let n_layer = s.dims.n_layer;

    // Layer kinds and the window.
    let key = k::SLIDING_WINDOW_PATTERN;
    let (kinds, kinds_src) = match d.get(key) {
        Some(serde_json::Value::Array(flags)) if flags.len() == n_layer => {
            let kinds = kinds_from_flags(d, key, &flags)?;
            (
                kinds,
                format!("{} (per-layer flags, true = sliding)", d.src(key)),
            )
        }
        Some(serde_json::Value::Array(flags)) => {
            return Err(d.err(key, format!("{} flags for {n_layer} layers", flags.len())))
        }
        _ => {
            let (n, src) = match d.usize_opt(key)? {
                Some(n) => (n, d.src(key)),
                None => (
                    SWA_PERIOD,
                    format!(
                        "{SOURCE}: load_swa_pattern(ml, {SWA_PERIOD}) ({} absent)",
                        d.spelled(key)
                    ),
                ),
            };
            let kinds = (0..n_layer)
                .map(|il| {
                    if n == 0 || il % n < n - 1 {
                        LayerKind::Sliding
                    } else {
                        LayerKind::Full
                    }
                })
                .collect();
            (
                kinds,
                format!(
                    "{src}: layer il slides iff il % {n} < {} (llama_hparams::set_swa_pattern)",
                    n.saturating_sub(1)
                ),
            )
        }
    };
    s.layer_kinds = Sourced::new(kinds, kinds_src);
    let window = d.positive(k::SLIDING_WINDOW)?;
    s.sliding_window = Sourced::new(Some(window), d.src(k::SLIDING_WINDOW));

    // RoPE: YaRN when declared, on both layer kinds.
    let mut rope = s.rope_full.value.clone();
    let mut rope_src = s.rope_full.source.clone();
    if d.str_opt(k::ROPE_SCALING_TYPE)?.as_deref() == Some("yarn") {
        let factor = match d.f64_opt(k::ROPE_SCALING_FACTOR)? {
            Some(f) if f >= 1.0 && f.is_finite() => f,
            f => {
                return Err(d.err(
                    k::ROPE_SCALING_FACTOR,
                    format!("yarn RoPE scaling needs a factor of at least 1, found {f:?}"),
                ))
            }
        };
        let (orig_ctx, orig_src) = match d.usize_opt(ROPE_SCALING_ORIG_CTX)? {
            Some(o) if o > 0 => (o, d.src(ROPE_SCALING_ORIG_CTX)),
            _ if s.dims.n_ctx_train > 0 => (
                s.dims.n_ctx_train,
                format!(
                    "{} ({} absent; llama.cpp's n_ctx_orig_yarn default)",
                    d.src(k::N_CTX_TRAIN),
                    d.spelled(ROPE_SCALING_ORIG_CTX)
                ),
            ),
            _ => {
                return Err(d.err(
                    ROPE_SCALING_ORIG_CTX,
                    "is required for yarn RoPE scaling (and no context length is declared)",
                ))
            }
        };
        let (attn_factor, attn_src) = match d.f64_opt(ROPE_SCALING_ATTN_FACTOR)? {
            Some(a) if a > 0.0 && a.is_finite() => (a, d.src(ROPE_SCALING_ATTN_FACTOR)),
            Some(a) => {
                return Err(d.err(
                    ROPE_SCALING_ATTN_FACTOR,
                    format!("must be positive, found {a}"),
                ))
            }
            None => (
                1.0,
                format!("{} absent: 1", d.spelled(ROPE_SCALING_ATTN_FACTOR)),
            ),
        };
        rope.scaling = RopeScaling::Yarn {
            factor,
            orig_ctx,
            ext_factor: 1.0,
            beta_fast: YARN_BETA_FAST,
            beta_slow: YARN_BETA_SLOW,
        };
        rope.attn_factor = attn_factor;
        rope_src = format!(
            "{rope_src}; yarn: {}, {}, {orig_src}, {attn_src}; ext_factor 1 (llama_context: yarn type), beta_fast {YARN_BETA_FAST} and beta_slow {YARN_BETA_SLOW} (llama-hparams.h defaults), cos/sin x (1 + 0.1 ln factor) (ggml rope_yarn; llama_context's yarn_attn_factor cancels its own)",
            d.src(k::ROPE_SCALING_TYPE),
            d.src(k::ROPE_SCALING_FACTOR)
        );
    }
    s.rope_full = Sourced::new(rope.clone(), rope_src.clone());
    let mut sliding = rope;
    let sliding_src = match d.f64_opt(ROPE_BASE_SWA)? {
        Some(b) if b > 0.0 => {
            sliding.base = b;
            format!("{rope_src}; base {}", d.src(ROPE_BASE_SWA))
        }
        Some(b) => return Err(d.err(ROPE_BASE_SWA, format!("must be positive, found {b}"))),
        None => format!(
            "{rope_src} ({} absent: the full layers' base)",
            d.spelled(ROPE_BASE_SWA)
        ),
    };
    s.rope_sliding = Sourced::new(sliding, sliding_src);

    let n_rot = s.rope_full.value.n_rot;
    s.attn_scale = Sourced::new(
        1.0 / (n_rot as f32).sqrt(),
        format!("{SOURCE}: 1/sqrt(n_rot = {n_rot})"),
    );
    s.attn_sinks = Sourced::new(
        Some("attn_sinks.weight"),
        format!("{SOURCE}: build_attn with attn_sinks (one logit per query head)"),
    );
    s.attn_out_bias = Sourced::new(true, format!("{SOURCE}: wo_b (attn_output.bias, required)"));
    let qkv_bias = d.has_tensor("blk.0.attn_q.bias");
    s.attn_bias = Sourced::new(
        qkv_bias,
        format!(
            "{SOURCE}: create_tensor_qkv loads q/k/v biases when present (blk.0.attn_q.bias {})",
            if qkv_bias { "present" } else { "absent" }
        ),
    );
    s.body = Sourced::new(
        Body {
            ffn_norm: "post_attention_norm.weight",
            ..Body::default()
        },
        format!("{SOURCE}: attn_norm -> attention -> +; attn_post_norm -> routed FFN -> +"),
    );
    s.activation = Sourced::new(
        Activation::SwigluOai,
        format!("{SOURCE}: LLM_FFN_SWIGLU_OAI_MOE (llama-graph.cpp: alpha 1.702, limit 7)"),
    );

    let mut m = moe::read(d, &s.dims, &RULE)?;
    if m.value.norm_weights.value {
        return Err(d.err(
            k::EXPERT_WEIGHTS_NORM,
            format!("true, but {SOURCE} passes norm_w false (the weights are a softmax already)"),
        ));
    }
    m.value.expert_biases = Sourced::new(
        true,
        format!("{SOURCE}: ffn_{{gate,up,down}}_exps_b (required), ffn_gate_inp_b on the router"),
    );
    s.moe = Some(m);
    Ok(s)
}
