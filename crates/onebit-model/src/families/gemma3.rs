//! Gemma 3 (text). What differs from the base, each rule read from the model
//! where the model states it:
//!
//! - Sliding-window layers: a `layer_types` list, else the sliding pattern (a
//!   period: layer i full when (i + 1) % p == 0, or per-layer flags), else HF's
//!   default period 6. No window (or 0) means no sliding at all.
//! - Two RoPE bases: sliding layers their local base (GGUF `rope.freq_base_swa`,
//!   config `rope_local_base_freq`), 10000 when absent (HF's default, not the
//!   model's base), unscaled; full layers the model's base with linear scaling.
//! - q/k RMSNorm before RoPE; sandwich norms (post-attention, post-feed-forward).
//! - Norms: HF computes `x/rms * (1 + w)`; GGUF and q4nx containers store
//!   `1 + w`, so the plain form applies to what they hold.
//! - Embeddings times sqrt(n_embd) (a pack stores them pre-scaled); attention
//!   scale 1/sqrt(query_pre_attn_scalar or head dim); GELU(tanh) gate; final
//!   logit soft-capping when stated.

use onebit_formats::q4nx::Q4Kind;
use serde_json::{json, Value as Json};

use super::common::{base, qk_norm};
use super::decls::{self as k, keys, ContainerKind, Decls};
use super::{Family, ImportRules, KnownTemplate, PackNames};
use crate::error::Result;
use crate::semantics::*;

pub const FAMILY: Family = Family {
    arch: "gemma3",
    hf_names: &[
        "gemma3",
        "gemma3_text",
        "Gemma3ForCausalLM",
        "Gemma3ForConditionalGeneration",
    ],
    semantics,
    pack: Some(PackNames {
        rows: &[
            (
                "blk.{i}.post_attention_norm.weight",
                "model.layers.{i}.post_attention_layernorm.weight",
            ),
            (
                "blk.{i}.ffn_norm.weight",
                "model.layers.{i}.pre_feedforward_layernorm.weight",
            ),
            (
                "blk.{i}.post_ffw_norm.weight",
                "model.layers.{i}.post_feedforward_layernorm.weight",
            ),
        ],
    }),
    import: Some(ImportRules {
        model_type: "gemma3_text",
        hf_arch: "Gemma3ForCausalLM",
        q4_kind: Q4Kind::Asymmetric,
        unpermute_qk: false,
        prescale_embedding: true,
        eps_key: "rms_norm_eps",
        config: config_json,
    }),
};

/// The chat template Gemma 3's instruction-tuned models use, for a file that
/// carries none (Gemma 3 270M's GGUF has no `tokenizer.chat_template`).
/// The text is Google's, the `chat_template` of the `tokenizer_config.json`
/// in the google/gemma-3-*-it repositories on Hugging Face, as stored in
/// testdata/chat-templates/gemma3.jinja (a test checks they agree).
pub const CHAT_TEMPLATE: KnownTemplate = KnownTemplate {
    text: r#"{{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
    {%- if messages[0]['content'] is string -%}
        {%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}
    {%- else -%}
        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\n\n' -%}
    {%- endif -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set first_user_prefix = "" -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}
    {%- endif -%}
    {%- if (message['role'] == 'assistant') -%}
        {%- set role = "model" -%}
    {%- else -%}
        {%- set role = message['role'] -%}
    {%- endif -%}
    {{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else "") }}
    {%- if message['content'] is string -%}
        {{ message['content'] | trim }}
    {%- elif message['content'] is iterable -%}
        {%- for item in message['content'] -%}
            {%- if item['type'] == 'image' -%}
                {{ '<start_of_image>' }}
            {%- elif item['type'] == 'text' -%}
                {{ item['text'] | trim }}
            {%- endif -%}
        {%- endfor -%}
    {%- else -%}
        {{ raise_exception("Invalid content type") }}
    {%- endif -%}
    {{ '<end_of_turn>\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{'<start_of_turn>model\n'}}
{%- endif -%}
"#,
    source: "Google's Gemma 3 chat template (tokenizer_config.json of google/gemma-3-*-it; testdata/chat-templates/gemma3.jinja)",
};

// gemma3's own keys (the shared ones are in decls.rs).
keys! {
    ROPE_BASE_SWA = "rope.freq_base_swa", ["rope_local_base_freq"];
    QUERY_PRE_ATTN_SCALAR = "", ["query_pre_attn_scalar"];
    ATTN_SOFTCAP = "attn_logit_softcapping", ["attn_logit_softcapping"];
}

/// HF Gemma3's default sliding pattern and its sliding layers' default base.
const DEFAULT_PATTERN: usize = 6;
const DEFAULT_SWA_BASE: f64 = 10000.0;

pub fn semantics(d: &Decls) -> Result<Semantics> {
    let mut s = base(
        d,
        "gemma3",
        Sourced::new(RopeStyle::Halves, "gemma3: neox (halves) RoPE"),
        &[],
    )?;
    let n_layer = s.dims.n_layer;

    let window = d.usize_opt(k::SLIDING_WINDOW)?.filter(|&w| w > 0);
    s.sliding_window = Sourced::new(
        window,
        match window {
            Some(_) => d.src(k::SLIDING_WINDOW),
            None => format!("no {} (or 0): no sliding", d.spelled(k::SLIDING_WINDOW)),
        },
    );
    if window.is_some() {
        s.layer_kinds = sliding_kinds(d, n_layer)?;
    }

    // Sliding layers: their own base (stated, or HF's default), unscaled;
    // linear scaling belongs to the full layers.
    let mut sliding = s.rope_full.value.clone();
    sliding.scaling = RopeScaling::None;
    let swa_src = match d.f64_opt(ROPE_BASE_SWA)? {
        Some(b) if b > 0.0 => {
            sliding.base = b;
            format!("{}; unscaled", d.src(ROPE_BASE_SWA))
        }
        Some(b) => return Err(d.err(ROPE_BASE_SWA, format!("must be positive, found {b}"))),
        None => {
            sliding.base = DEFAULT_SWA_BASE;
            format!(
                "gemma3 default {DEFAULT_SWA_BASE} ({} absent; HF's rope_local_base_freq default); unscaled",
                d.spelled(ROPE_BASE_SWA)
            )
        }
    };
    s.rope_sliding = Sourced::new(sliding, swa_src);

    if let Some(q) = d.f64_opt(QUERY_PRE_ATTN_SCALAR)? {
        if q <= 0.0 {
            return Err(d.err(
                QUERY_PRE_ATTN_SCALAR,
                format!("must be positive, found {q}"),
            ));
        }
        s.attn_scale = Sourced::new(
            (1.0 / q.sqrt()) as f32,
            format!("1/sqrt({})", d.src(QUERY_PRE_ATTN_SCALAR)),
        );
    }

    s.qk_norm = qk_norm(
        d,
        true,
        QkNorm::BeforeRope,
        "gemma3: q/k RMSNorm before RoPE",
    )?;
    s.norm_form = Sourced::new(
        NormForm::Plain,
        "gemma3 GGUF/q4nx: norms stored as 1 + w (the converter adds the 1)",
    );
    s.body = Sourced::new(
        Body {
            post_mixer_norm: Some("post_attention_norm.weight"),
            post_ffn_norm: Some("post_ffw_norm.weight"),
            ..Body::default()
        },
        "gemma3: post-attention and post-feed-forward norms",
    );
    s.embed_scale = match d.container {
        ContainerKind::Gguf => Sourced::new(
            Some((s.dims.n_embd as f32).sqrt()),
            format!("gemma3: sqrt({} = {})", d.spelled(k::N_EMBD), s.dims.n_embd),
        ),
        ContainerKind::Pack => Sourced::new(
            None,
            "gemma3 pack: embedding stored pre-scaled by sqrt(hidden_size)",
        ),
    };
    s.activation = Sourced::new(Activation::GeluTanhGate, "gemma3: gelu_pytorch_tanh gate");
    // 0 is llama.cpp's "none" (gemma3.cpp soft-caps when it is non-zero).
    if let Some(cap) = d.f64_opt(k::FINAL_SOFTCAP)?.filter(|&c| c != 0.0) {
        s.final_softcap = Sourced::new(Some(cap as f32), d.src(k::FINAL_SOFTCAP));
    }
    if let Some(cap) = d.f64_opt(ATTN_SOFTCAP)? {
        s.attn_softcap = Sourced::new(Some(cap as f32), d.src(ATTN_SOFTCAP));
    }
    Ok(s)
}

/// Which layers slide: `layer_types`, else the pattern key (a period, or one
/// flag per layer), else HF's default period 6.
fn sliding_kinds(d: &Decls, n_layer: usize) -> Result<Sourced<Vec<LayerKind>>> {
    let by_period = |p: usize| -> Vec<LayerKind> {
        (0..n_layer)
            .map(|i| {
                if (i + 1) % p == 0 {
                    LayerKind::Full
                } else {
                    LayerKind::Sliding
                }
            })
            .collect()
    };
    if let Some(types) = d.get(k::LAYER_TYPES) {
        let kinds = layer_types(d, &types, n_layer)?;
        return Ok(Sourced::new(kinds, d.src(k::LAYER_TYPES)));
    }
    let key = k::SLIDING_WINDOW_PATTERN;
    match d.get(key) {
        None => Ok(Sourced::new(
            by_period(DEFAULT_PATTERN),
            format!(
                "gemma3 default: layer i full when (i + 1) % {DEFAULT_PATTERN} == 0 ({} absent)",
                d.spelled(key)
            ),
        )),
        Some(Json::Array(flags)) => {
            if flags.len() != n_layer {
                return Err(d.err(
                    key,
                    format!("has {} entries for {n_layer} layers", flags.len()),
                ));
            }
            let kinds = flags
                .iter()
                .map(
                    |f| match f.as_bool().or_else(|| f.as_i64().map(|v| v != 0)) {
                        Some(true) => Ok(LayerKind::Sliding),
                        Some(false) => Ok(LayerKind::Full),
                        None => {
                            Err(d.err(key, format!("entries must be bools or integers, found {f}")))
                        }
                    },
                )
                .collect::<Result<Vec<_>>>()?;
            Ok(Sourced::new(
                kinds,
                format!("{} (per-layer flags, true = sliding)", d.src(key)),
            ))
        }
        Some(v) => match v.as_u64() {
            Some(p) if p > 0 => Ok(Sourced::new(
                by_period(p as usize),
                format!("{} = {p}: layer i full when (i + 1) % {p} == 0", d.src(key)),
            )),
            _ => Err(d.err(
                key,
                format!("expected a positive period or per-layer flags, found {v}"),
            )),
        },
    }
}

/// HF `layer_types`: "full_attention" / "sliding_attention" per layer.
pub fn layer_types(d: &Decls, types: &Json, n_layer: usize) -> Result<Vec<LayerKind>> {
    let list = types
        .as_array()
        .ok_or_else(|| d.err(k::LAYER_TYPES, format!("expected a list, found {types}")))?;
    if list.len() != n_layer {
        return Err(d.err(
            k::LAYER_TYPES,
            format!("has {} entries for {n_layer} layers", list.len()),
        ));
    }
    list.iter()
        .map(|t| match t.as_str() {
            Some("full_attention") => Ok(LayerKind::Full),
            Some("sliding_attention") => Ok(LayerKind::Sliding),
            _ => Err(d.err(
                k::LAYER_TYPES,
                format!("layer type {t} is not one this family runs"),
            )),
        })
        .collect()
}

/// HF `layer_types` and `sliding_window`, as a pack's config.json states
/// them (the writing side of [`layer_types`]).
pub fn write_layer_types(sem: &Semantics, c: &mut Json) {
    c["layer_types"] = json!(sem
        .layer_kinds
        .value
        .iter()
        .map(|k| match k {
            LayerKind::Sliding => "sliding_attention",
            _ => "full_attention",
        })
        .collect::<Vec<_>>());
    if let Some(w) = sem.sliding_window.value {
        c["sliding_window"] = json!(w);
    }
}

/// config.json keys of a gemma3 pack, restating the semantics.
fn config_json(sem: &Semantics, c: &mut Json) {
    write_layer_types(sem, c);
    c["rope_local_base_freq"] = json!(sem.rope_sliding.value.base);
    let s = sem.attn_scale.value as f64;
    let q = 1.0 / (s * s);
    c["query_pre_attn_scalar"] = json!(if (q - q.round()).abs() < 1e-3 {
        q.round()
    } else {
        q
    });
    if let Some(cap) = sem.final_softcap.value {
        c["final_logit_softcapping"] = json!(cap);
    }
    if let Some(cap) = sem.attn_softcap.value {
        c["attn_logit_softcapping"] = json!(cap);
    }
}
