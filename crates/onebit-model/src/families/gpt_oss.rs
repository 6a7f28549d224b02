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
//!
//! Its packs (FastFlowLM's `gpt-oss:20b`) are read and written as the
//! public converter's `q4nx/models/gpt_oss.py` lays them out
//! (`crate::pack::gpt_oss`): the names below ([`PACK_ROWS`]) and HF
//! `GptOssConfig`'s config.json keys ([`config_json`]). A pack's config.json
//! states what a GGUF's keys do, spelled as HF does: `layer_types`,
//! `intermediate_size` (the experts' width), `num_local_experts`,
//! `rope_scaling.{rope_type, factor, original_max_position_embeddings}`;
//! the values llama.cpp hard-codes (`swiglu_limit` 7, `beta_fast` 32,
//! `beta_slow` 1, no `attention_factor`) are checked when stated and refused
//! by name when they differ.

use onebit_formats::q4nx::Q4Kind;
use serde_json::{json, Value as Json};

use super::common::{base, kinds_from_flags};
use super::decls::{self as k, keys, Decls};
use super::moe::{self, MoeRule};
use super::{Family, ImportRules, PackNames};
use crate::error::Result;
use crate::semantics::*;

pub const FAMILY: Family = Family {
    arch: "gpt-oss",
    hf_names: &["gpt_oss", "GptOssForCausalLM"],
    semantics,
    pack: Some(PackNames { rows: PACK_ROWS }),
    import: Some(ImportRules {
        model_type: "gpt_oss",
        hf_arch: "GptOssForCausalLM",
        // configs/gpt-oss.json "default_tensor_type": "Q4_1".
        q4_kind: Q4Kind::Asymmetric,
        // llama.cpp's converter keeps HF's q/k rows (NEOX RoPE).
        unpermute_qk: false,
        prescale_embedding: false,
        eps_key: "rms_norm_eps",
        config: config_json,
    }),
};

/// The converter's name map (`configs/gpt-oss.json` `name_map`): GGUF ->
/// pack, replacing the common rows of the same GGUF name. The three expert
/// stacks' names are the converter's before it merges them into
/// `model.layers.{i}.ffn_gate_up_down_exps.weight` (`crate::pack::gpt_oss`).
/// The dense `ffn_norm` row is dropped: gpt-oss's FFN input norm is
/// `post_attention_norm`, which takes that pack name.
pub const PACK_ROWS: &[super::NameRow] = &[
    ("blk.{i}.ffn_norm.weight", ""),
    (
        "blk.{i}.post_attention_norm.weight",
        "model.layers.{i}.post_attention_layernorm.weight",
    ),
    (
        "blk.{i}.attn_sinks.weight",
        "model.layers.{i}.self_attn.sinks.weight",
    ),
    (
        "blk.{i}.attn_output.bias",
        "model.layers.{i}.self_attn.o_proj.bias",
    ),
    (
        "blk.{i}.ffn_gate_inp.weight",
        "model.layers.{i}.mlp.router.weight",
    ),
    (
        "blk.{i}.ffn_gate_inp.bias",
        "model.layers.{i}.mlp.router.bias",
    ),
    (
        "blk.{i}.ffn_gate_exps.weight",
        "model.layers.{i}.ffn_gate_exps.weight",
    ),
    (
        "blk.{i}.ffn_up_exps.weight",
        "model.layers.{i}.ffn_up_exps.weight",
    ),
    (
        "blk.{i}.ffn_down_exps.weight",
        "model.layers.{i}.ffn_down_exps.weight",
    ),
    (
        "blk.{i}.ffn_gate_exps.bias",
        "model.layers.{i}.mlp.experts.gate_proj_bias",
    ),
    (
        "blk.{i}.ffn_up_exps.bias",
        "model.layers.{i}.mlp.experts.up_proj_bias",
    ),
    (
        "blk.{i}.ffn_down_exps.bias",
        "model.layers.{i}.mlp.experts.down_proj_bias",
    ),
];

const SOURCE: &str = "llama.cpp src/models/openai-moe.cpp";

keys! {
    ROPE_BASE_SWA = "rope.freq_base_swa", [];
    ROPE_SCALING_ORIG_CTX = "rope.scaling.original_context_length", ["rope_scaling/original_max_position_embeddings"];
    ROPE_SCALING_ATTN_FACTOR = "rope.scaling.attn_factor", [];
    // HF GptOssConfig: `intermediate_size` is the experts' width.
    EXPERT_FF = "expert_feed_forward_length", ["intermediate_size"];
    // Values llama.cpp hard-codes; a config.json may state them.
    SWIGLU_LIMIT = "", ["swiglu_limit"];
    YARN_BETA_FAST_KEY = "", ["rope_scaling/beta_fast"];
    YARN_BETA_SLOW_KEY = "", ["rope_scaling/beta_slow"];
    YARN_ATTENTION_FACTOR = "", ["rope_scaling/attention_factor"];
    YARN_TRUNCATE = "", ["rope_scaling/truncate"];
}

/// The clamp of llama.cpp's swiglu_oai (llama-graph.cpp, LLM_FFN_SWIGLU_OAI_MOE).
pub const SWIGLU_LIMIT_VALUE: f64 = 7.0;

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

    // Layer kinds and the window: a pack's HF `layer_types`, else the
    // GGUF's pattern key, else llama.cpp's default period.
    let key = k::SLIDING_WINDOW_PATTERN;
    let (kinds, kinds_src) = match (d.get(k::LAYER_TYPES), d.get(key)) {
        (Some(types), _) => (
            super::gemma3::layer_types(d, &types, n_layer)?,
            d.src(k::LAYER_TYPES),
        ),
        (None, v) => layer_kinds(d, v, n_layer)?,
    };
    s.layer_kinds = Sourced::new(kinds, kinds_src);
    let window = d.positive(k::SLIDING_WINDOW)?;
    s.sliding_window = Sourced::new(Some(window), d.src(k::SLIDING_WINDOW));

    rope(d, &mut s)?;

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
    let limit_src = match d.f64_opt(SWIGLU_LIMIT)? {
        None => "limit 7".to_string(),
        Some(l) if l == SWIGLU_LIMIT_VALUE => format!("limit 7, as {} states", d.src(SWIGLU_LIMIT)),
        Some(l) => {
            let why = format!("{l}, but {SOURCE}'s swiglu_oai clamps at {SWIGLU_LIMIT_VALUE}");
            return Err(d.err(SWIGLU_LIMIT, format!("{why} (llama-graph.cpp)")));
        }
    };
    s.activation = Sourced::new(
        Activation::SwigluOai,
        format!("{SOURCE}: LLM_FFN_SWIGLU_OAI_MOE (llama-graph.cpp: alpha 1.702, {limit_src})"),
    );

    let mut m = moe::read(d, &s.dims, &RULE)?;
    if m.value.norm_weights.value {
        return Err(d.err(
            k::EXPERT_WEIGHTS_NORM,
            format!("true, but {SOURCE} passes norm_w false (the weights are a softmax already)"),
        ));
    }
    // HF spells the experts' width `intermediate_size` (the shared table's
    // `moe_intermediate_size` is other families').
    if let Some(w) = d.usize_opt(EXPERT_FF)? {
        if w == 0 {
            return Err(d.err(EXPERT_FF, "the experts' width is 0"));
        }
        m.value.n_ff_exp = d.size_checked(EXPERT_FF, w)?;
        m.source = format!(
            "{}, {}; width {}",
            d.src(k::EXPERT_COUNT),
            d.src(k::EXPERT_USED_COUNT),
            d.src(EXPERT_FF)
        );
    }
    m.value.expert_biases = Sourced::new(
        true,
        format!("{SOURCE}: ffn_{{gate,up,down}}_exps_b (required), ffn_gate_inp_b on the router"),
    );
    s.moe = Some(m);
    Ok(s)
}

/// Layer kinds from the GGUF's `sliding_window_pattern` (flags or a
/// period), else llama.cpp's `load_swa_pattern(ml, 2)`.
fn layer_kinds(
    d: &Decls,
    pattern: Option<Json>,
    n_layer: usize,
) -> Result<(Vec<LayerKind>, String)> {
    let key = k::SLIDING_WINDOW_PATTERN;
    Ok(match pattern {
        Some(Json::Array(flags)) if flags.len() == n_layer => {
            let kinds = kinds_from_flags(d, key, &flags)?;
            (
                kinds,
                format!("{} (per-layer flags, true = sliding)", d.src(key)),
            )
        }
        Some(Json::Array(flags)) => {
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
    })
}

/// A value llama.cpp hard-codes, which a config.json may state: stated and
/// different is refused by name.
fn hard_coded(d: &Decls, key: k::Key, value: f64, rule: &str) -> Result<String> {
    match d.f64_opt(key)? {
        None => Ok(String::new()),
        Some(v) if v == value => Ok(format!(", as {} states", d.src(key))),
        Some(v) => Err(d.err(
            key,
            format!("{v}, but {SOURCE} runs {rule} {value}: a different value is not implemented"),
        )),
    }
}

/// RoPE: YaRN when declared, on both layer kinds.
fn rope(d: &Decls, s: &mut Semantics) -> Result<()> {
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
            None if d.container == super::decls::ContainerKind::Pack => (
                1.0,
                "attn_factor 1 (config.json has no key for it)".to_string(),
            ),
            None => (
                1.0,
                format!("{} absent: 1", d.spelled(ROPE_SCALING_ATTN_FACTOR)),
            ),
        };
        // HF's `attention_factor` replaces the magnitude factor 1 + 0.1 ln
        // factor as a whole; llama.cpp computes that factor itself.
        if let Some(a) = d.f64_opt(YARN_ATTENTION_FACTOR)? {
            return Err(d.err(
                YARN_ATTENTION_FACTOR,
                format!("{a}: {SOURCE} computes the magnitude factor as 1 + 0.1 ln factor; a stated one is not implemented"),
            ));
        }
        let fast = hard_coded(d, YARN_BETA_FAST_KEY, YARN_BETA_FAST, "beta_fast")?;
        let slow = hard_coded(d, YARN_BETA_SLOW_KEY, YARN_BETA_SLOW, "beta_slow")?;
        // HF's `truncate: false` (gpt-oss's config.json) keeps the
        // correction range unrounded; ggml_rope_yarn_corr_dims floors and
        // ceils it whatever the model states, and onebit runs llama.cpp's.
        let truncate = match d.get(YARN_TRUNCATE).and_then(|v| v.as_bool()) {
            Some(false) => format!(
                "; {} false stated, but the correction range is floored and ceiled as ggml_rope_yarn_corr_dims does",
                d.src(YARN_TRUNCATE)
            ),
            _ => String::new(),
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
            "{rope_src}; yarn: {}, {}, {orig_src}, {attn_src}; ext_factor 1 (llama_context: yarn type), beta_fast {YARN_BETA_FAST}{fast} and beta_slow {YARN_BETA_SLOW}{slow} (llama-hparams.h defaults), cos/sin x (1 + 0.1 ln factor) (ggml rope_yarn; llama_context's yarn_attn_factor cancels its own){truncate}",
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
    Ok(())
}

/// config.json keys of a gpt-oss pack (HF `GptOssConfig`), restating the
/// semantics; `crate::pack::gpt_oss::import` checks that they read back to
/// the GGUF's.
pub fn config_json(sem: &Semantics, c: &mut Json) {
    super::gemma3::write_layer_types(sem, c);
    if let Some(m) = &sem.moe {
        let m = &m.value;
        c["intermediate_size"] = json!(m.n_ff_exp);
        c["num_local_experts"] = json!(m.n_expert);
        c["num_experts_per_tok"] = json!(m.n_used);
        c["experts_per_token"] = json!(m.n_used);
    }
    c["attention_bias"] = json!(sem.attn_bias.value);
    c["swiglu_limit"] = json!(SWIGLU_LIMIT_VALUE);
    if let RopeScaling::Yarn {
        factor, orig_ctx, ..
    } = sem.rope_full.value.scaling
    {
        c["rope_scaling"] = json!({
            "rope_type": "yarn",
            "factor": factor,
            "original_max_position_embeddings": orig_ctx,
            "beta_fast": YARN_BETA_FAST,
            "beta_slow": YARN_BETA_SLOW,
        });
        c["initial_context_length"] = json!(orig_ctx);
    }
}
