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
//! - KV heads per layer kind: `attention.head_count_kv` as a per-layer array
//!   (llama.cpp's `n_head_kv(il)`; 26B-A4B: 8 on sliding layers, 2 on full
//!   ones), one count per kind.
//! - A layer with its own KV and no `attn_v` takes V from its raw K
//!   projection, before the k norm and RoPE (`Vcur = wv ? wv*cur : Kcur`;
//!   26B-A4B's and 31B's full layers).
//! - The last `attention.shared_kv_layers` layers have no K/V: a sliding one
//!   reads the KV cache of layer n - shared - 2, a full one of layer
//!   n - shared - 1 (llama.cpp's rule; each must be of the reader's kind).
//! - Body: sandwich norms, GELU(tanh)-gated FFN, then per-layer embeddings
//!   when `embedding_length_per_layer_input` > 0, then the layer output
//!   scale (`layer_output_scale` tensor, when present).
//! - Embeddings times sqrt(n_embd); final logit soft-capping as stated, and
//!   at 30 when a GGUF does not state it (llama.cpp's default; 0: none);
//!   tied output when there is no `output.weight`.
//! - Expert layers (a GGUF with `expert_count` / `ffn_gate_inp`), as
//!   llama.cpp's graph runs them: the dense MLP beside the routed experts,
//!   each branch with its own norms, the router on a scaled RMSNorm of the
//!   attention output, per-expert output scales (`expert_layers`). A pack
//!   with experts is refused by name.
//!
//! A pack states the same rules in HF's config.json spellings: `layer_types`,
//! `head_dim` (sliding layers) and `global_head_dim` (full layers),
//! `rope_parameters` per layer kind (`rope_theta`, `rope_type` "default" or
//! "proportional", `partial_rotary_factor`; HF's defaults when absent),
//! `num_kv_shared_layers`, `hidden_size_per_layer_input`,
//! `final_logit_softcapping`, and `attention_k_eq_v` (every full layer's V
//! from `k_proj`, with `num_global_key_value_heads` KV heads there;
//! `num_key_value_heads` is the sliding layers'). It stores no `rope_freqs`
//! tensor: proportional RoPE is restated as `rope_parameters`. Its embedding
//! is pre-scaled by sqrt(hidden_size) as FastFlowLM stores Gemma's; the
//! per-layer token table is kept as stored (scaled at run time, as in HF).
//! HF config flags for what is not implemented (`enable_moe_block`,
//! `use_double_wide_mlp`) are refused by name, and so is a
//! `num_global_key_value_heads` that differs without `attention_k_eq_v`
//! (HF ignores it then, llama.cpp's converter applies it).

use onebit_formats::q4nx::Q4Kind;
use serde_json::{json, Value as Json};

use super::common::{base_kv, kinds_from_flags, layer_count, qk_norm};
use super::decls::{self as k, keys, ContainerKind, Decls, Key};
use super::moe::MoeRule;
use super::{Family, ImportRules, PackNames};
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
            (
                "blk.{i}.layer_output_scale.weight",
                "model.layers.{i}.layer_scalar",
            ),
            (
                "per_layer_token_embd.weight",
                "model.embed_tokens_per_layer.weight",
            ),
            (
                "per_layer_model_proj.weight",
                "model.per_layer_model_projection.weight",
            ),
            (
                "per_layer_proj_norm.weight",
                "model.per_layer_projection_norm.weight",
            ),
            (
                "blk.{i}.inp_gate.weight",
                "model.layers.{i}.per_layer_input_gate.weight",
            ),
            (
                "blk.{i}.proj.weight",
                "model.layers.{i}.per_layer_projection.weight",
            ),
            (
                "blk.{i}.post_norm.weight",
                "model.layers.{i}.post_per_layer_input_norm.weight",
            ),
            // Restated by config.json's rope_parameters.
            ("rope_freqs.weight", ""),
        ],
    }),
    import: Some(ImportRules {
        model_type: "gemma4_text",
        hf_arch: "Gemma4ForCausalLM",
        q4_kind: Q4Kind::Asymmetric,
        unpermute_qk: false,
        prescale_embedding: true,
        eps_key: "rms_norm_eps",
        config: config_json,
    }),
};

// gemma4's own keys (the shared ones are in decls.rs).
keys! {
    HEAD_DIM_FULL = "attention.key_length", ["global_head_dim"];
    KEY_LENGTH_SWA = "attention.key_length_swa", ["head_dim"];
    VALUE_LENGTH_SWA = "attention.value_length_swa", ["head_dim"];
    ROPE_DIMS_SWA = "rope.dimension_count_swa", [];
    ROPE_BASE_SWA = "rope.freq_base_swa", ["rope_parameters/sliding_attention/rope_theta"];
    ROPE_BASE_FULL = "rope.freq_base", ["rope_parameters/full_attention/rope_theta"];
    ROPE_TYPE_FULL = "", ["rope_parameters/full_attention/rope_type"];
    ROPE_TYPE_SWA = "", ["rope_parameters/sliding_attention/rope_type"];
    PARTIAL_FULL = "", ["rope_parameters/full_attention/partial_rotary_factor"];
    PARTIAL_SWA = "", ["rope_parameters/sliding_attention/partial_rotary_factor"];
    PER_LAYER_INPUT = "embedding_length_per_layer_input", ["hidden_size_per_layer_input"];
    SHARED_KV_LAYERS = "attention.shared_kv_layers", ["num_kv_shared_layers"];
    EXPERT_COUNT = "expert_count", ["num_experts"];
    ENABLE_MOE = "", ["enable_moe_block"];
    DOUBLE_WIDE_MLP = "", ["use_double_wide_mlp"];
    K_EQ_V = "", ["attention_k_eq_v"];
    GLOBAL_KV_HEADS = "", ["num_global_key_value_heads"];
}

/// HF Gemma4TextConfig's RoPE when `rope_parameters` does not say: full
/// layers proportional over a quarter of the head at base 1e6, sliding
/// layers default at base 10000.
const HF_FULL_DEFAULT: (&str, f64, f64) = ("proportional", 1_000_000.0, 0.25);
const HF_SLIDING_DEFAULT: (&str, f64, f64) = ("default", 10_000.0, 1.0);

const OUTPUT_SCALE: &str = "layer_output_scale.weight";

/// The final soft-cap llama.cpp's gemma4 runs when a GGUF does not state one.
const GGUF_DEFAULT_SOFTCAP: f32 = 30.0;

pub fn semantics(d: &Decls) -> Result<Semantics> {
    // The layer kinds first: the KV head count may differ by kind.
    let n_layer = layer_count(d)?;
    let kinds = layer_kinds(d, n_layer)?;
    let mut s = base_kv(
        d,
        "gemma4",
        Sourced::new(RopeStyle::Halves, "gemma4: neox (halves) RoPE"),
        &[],
        Some(&kinds.value),
    )?;
    let experts =
        d.usize_opt(EXPERT_COUNT)?.unwrap_or(0) > 0 || d.has_tensor("blk.0.ffn_gate_inp.weight");
    if experts && d.container == ContainerKind::Pack {
        return Err(d.err(
            EXPERT_COUNT,
            "mixture-of-experts layers are not implemented for gemma4 packs",
        ));
    }
    if experts {
        s.moe = Some(expert_layers(d, &s.dims)?);
    }

    // HF config flags for what onebit does not run.
    for (key, what) in [
        (
            ENABLE_MOE,
            "mixture-of-experts layers are not implemented for gemma4",
        ),
        (
            DOUBLE_WIDE_MLP,
            "per-layer FFN widths (doubled on KV-shared layers) are not implemented for gemma4",
        ),
    ] {
        if d.bool_opt(key)? == Some(true) {
            return Err(d.err(key, what));
        }
    }
    // config.json's head_dim is the sliding layers'; the full layers' is
    // global_head_dim (GGUF: attention.key_length, read by the base).
    if d.container == ContainerKind::Pack {
        let full = d.positive(HEAD_DIM_FULL)?;
        s.dims.head_dim_k = full;
        s.dims.head_dim_v = full;
    }

    // Layer kinds and the window.
    let window = d
        .usize_opt(k::SLIDING_WINDOW)?
        .filter(|&w| w > 0)
        .ok_or_else(|| d.err(k::SLIDING_WINDOW, "is required (a positive window)"))?;
    s.sliding_window = Sourced::new(Some(window), d.src(k::SLIDING_WINDOW));
    s.layer_kinds = kinds;
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

    match d.container {
        ContainerKind::Gguf => gguf_rope(d, &mut s, sk)?,
        ContainerKind::Pack => {
            let template = s.rope_full.value.clone();
            s.rope_full = rope_parameters(
                d,
                &template,
                dk,
                [ROPE_TYPE_FULL, ROPE_BASE_FULL, PARTIAL_FULL],
                HF_FULL_DEFAULT,
            )?;
            s.rope_sliding = rope_parameters(
                d,
                &template,
                sk,
                [ROPE_TYPE_SWA, ROPE_BASE_SWA, PARTIAL_SWA],
                HF_SLIDING_DEFAULT,
            )?;
        }
    }

    s.attn_scale = Sourced::new(1.0, "gemma4: attention scale 1 (q/k are RMS-normed)");
    s.qk_norm = qk_norm(
        d,
        true,
        QkNorm::BeforeRope,
        "gemma4: q/k RMSNorm before RoPE",
    )?;
    s.v_norm = Sourced::new(true, "gemma4: v RMSNorm without a weight");
    s.norm_form = Sourced::new(
        NormForm::Plain,
        "gemma4: x/rms * w, w as stored (HF's Gemma 4 norm adds no 1; GGUF and pack keep w)",
    );
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
    // llama.cpp's gemma4 reads the key as optional over its hparams default
    // of 30 (src/llama-hparams.h: f_final_logit_softcapping = 30.0f; unlike
    // gemma3.cpp it does not reset it to 0) and soft-caps when it is non-zero.
    s.final_softcap = match d.f64_opt(k::FINAL_SOFTCAP)? {
        Some(0.0) => Sourced::new(None, format!("{} = 0: none", d.src(k::FINAL_SOFTCAP))),
        Some(cap) if cap > 0.0 && cap.is_finite() => {
            Sourced::new(Some(cap as f32), d.src(k::FINAL_SOFTCAP))
        }
        Some(cap) => {
            return Err(d.err(
                k::FINAL_SOFTCAP,
                format!("must be positive (or 0: none), found {cap}"),
            ))
        }
        None if d.container == ContainerKind::Gguf => Sourced::new(
            Some(GGUF_DEFAULT_SOFTCAP),
            format!(
                "{} absent: llama.cpp's gemma4 default {GGUF_DEFAULT_SOFTCAP} (src/llama-hparams.h)",
                d.spelled(k::FINAL_SOFTCAP)
            ),
        ),
        None => Sourced::new(
            None,
            format!("{} absent: none", d.spelled(k::FINAL_SOFTCAP)),
        ),
    };

    // The body: sandwich norms, per-layer embeddings, output scale.
    // HF writes null for a model without per-layer embeddings.
    let per_layer = d.usize_opt(PER_LAYER_INPUT)?.unwrap_or(0);
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
    values_from_keys(d, &mut s)?;
    Ok(s)
}

/// Which layers take V from K, and (config.json) the full layers' KV head
/// count. GGUF, as llama.cpp reads it: a layer with its own KV and no
/// `attn_v` (nor a fused `attn_qkv`) takes V from its raw K projection
/// (`Vcur = wv ? wv*cur : Kcur`, before the k norm and RoPE; then the
/// weightless v norm); the KV head counts per kind are
/// `attention.head_count_kv`'s entries (`base_kv`). config.json, as HF reads
/// it: `attention_k_eq_v` makes every full layer (with its own KV) take V
/// from `k_proj`, and then, only then, `num_global_key_value_heads` is the
/// full layers' KV head count. llama.cpp's converter writes that count for
/// the full layers whether or not `attention_k_eq_v` is set, so a count
/// that differs without it is read differently by the two and refused.
fn values_from_keys(d: &Decls, s: &mut Semantics) -> Result<()> {
    let kinds = s.layer_kinds.value.clone();
    let own: Vec<bool> = (0..kinds.len())
        .map(|i| s.kv_source.value[i] == i)
        .collect();
    match d.container {
        ContainerKind::Gguf => {
            let from_k: Vec<bool> = (0..kinds.len())
                .map(|i| {
                    let has = |t: &str| d.has_tensor(&format!("blk.{i}.{t}"));
                    own[i] && !has("attn_v.weight") && !has("attn_qkv.weight")
                })
                .collect();
            if from_k.contains(&true) {
                s.v_from_k = Sourced::new(
                    from_k,
                    "gemma4: no blk.N.attn_v.weight on these layers; llama.cpp src/models/gemma4.cpp takes V = the K projection then (Vcur = wv ? wv*cur : Kcur)",
                );
            }
        }
        ContainerKind::Pack => {
            let k_eq_v = d.bool_opt(K_EQ_V)?.unwrap_or(false);
            let global = d.usize_opt(GLOBAL_KV_HEADS)?;
            let sliding = s.kv_heads(LayerKind::Sliding);
            if !k_eq_v {
                if let Some(g) = global.filter(|&g| g != sliding) {
                    return Err(d.err(
                        GLOBAL_KV_HEADS,
                        format!(
                            "{g} (the full layers' KV heads) differs from {heads} {sliding} without {k_eq_v} true: HF applies it only with {k_eq_v}, llama.cpp's converter to the full layers regardless",
                            heads = d.spelled(k::N_HEAD_KV),
                            k_eq_v = d.spelled(K_EQ_V)
                        ),
                    ));
                }
                return Ok(());
            }
            let g = global.ok_or_else(|| {
                d.err(
                    GLOBAL_KV_HEADS,
                    format!(
                        "is required with {} true: HF's full layers take their KV head count from it",
                        d.spelled(K_EQ_V)
                    ),
                )
            })?;
            let g = d.size_checked(GLOBAL_KV_HEADS, g)?;
            if g == 0 || !s.dims.n_head.is_multiple_of(g) {
                return Err(d.err(
                    GLOBAL_KV_HEADS,
                    format!("{g} does not divide the head count {}", s.dims.n_head),
                ));
            }
            s.dims.n_head_kv = g;
            s.kv_heads_sliding = (g != sliding && kinds.contains(&LayerKind::Sliding)).then(|| {
                Sourced::new(
                    sliding,
                    format!(
                        "{} (sliding layers; {} is the full layers')",
                        d.src(k::N_HEAD_KV),
                        d.src(GLOBAL_KV_HEADS)
                    ),
                )
            });
            s.v_from_k = Sourced::new(
                kinds
                    .iter()
                    .zip(&own)
                    .map(|(&k, &o)| o && k == LayerKind::Full)
                    .collect(),
                format!(
                    "{}: HF's full layers take V from k_proj (use_alternative_attention), with {} KV heads",
                    d.src(K_EQ_V),
                    d.spelled(GLOBAL_KV_HEADS)
                ),
            );
        }
    }
    Ok(())
}

/// Gemma 4's expert layers as llama.cpp's graph builds them (every layer
/// with a router `ffn_gate_inp` routes; here every layer, from 0).
const MOE_SOURCE: &str = "llama.cpp src/models/gemma4.cpp";
pub const MOE_RULE: MoeRule = MoeRule {
    source: MOE_SOURCE,
    gating: Some(Gating::Softmax),
    selection_bias: false,
    norm_default: true,
    leading_dense: false,
    shared: false,
    shared_gate: false,
};

/// The routed FFN of a gemma4 GGUF with experts: softmax over all experts,
/// the top `expert_used_count` renormalized (build_moe_ffn with norm_w
/// true, scale 1), each expert's output times its `ffn_down_exps.scale`;
/// the router reads rmsnorm(x) / sqrt(n_embd) * `ffn_gate_inp.scale`; the
/// layer's dense MLP (`ffn_{gate,up,down}`, width `feed_forward_length`)
/// runs beside the experts as an ungated shared expert on norm(x; ffn_norm),
/// normed by `post_ffw_norm_1`; the experts read norm(x; `pre_ffw_norm_2`),
/// their sum normed by `post_ffw_norm_2`; the two added, then the body's
/// `post_ffw_norm`.
fn expert_layers(d: &Decls, dims: &Dims) -> Result<Sourced<Moe>> {
    let mut moe = super::moe::read(d, dims, &MOE_RULE)?;
    let m = &mut moe.value;
    // llama.cpp reads no expert_weights_norm/scale or gating key for gemma4:
    // one stating otherwise is refused rather than run as the graph does.
    if !m.norm_weights.value {
        return Err(d.err(
            k::EXPERT_WEIGHTS_NORM,
            format!("false, but {MOE_SOURCE} always renormalizes the chosen experts' weights"),
        ));
    }
    if m.scale.value != 1.0 {
        return Err(d.err(
            k::EXPERT_WEIGHTS_SCALE,
            format!(
                "{}, but {MOE_SOURCE} scales the weights by 1 (the per-expert scale is ffn_down_exps.scale)",
                m.scale.value
            ),
        ));
    }
    if m.expert_scale.value.is_none() {
        // Optional in llama.cpp's loader, but every converted Gemma 4 has
        // it (HF's router.per_expert_scale); without it llama.cpp runs 1.
        m.expert_scale.source = format!(
            "{}; {MOE_SOURCE} runs no per-expert scale then",
            m.expert_scale.source
        );
    }
    m.shared = Sourced::new(
        Some(dims.n_ff),
        format!(
            "{MOE_SOURCE}: the layer's dense MLP (width {}) runs beside the experts",
            d.spelled(k::N_FF)
        ),
    );
    m.shared_names = ["ffn_gate.weight", "ffn_up.weight", "ffn_down.weight"];
    m.shared_gate = Sourced::new(false, format!("{MOE_SOURCE}: the dense MLP is not gated"));
    m.router_input = Sourced::new(
        RouterInput::ScaledRms("ffn_gate_inp.scale"),
        format!("{MOE_SOURCE}: the router reads the attention output, not the FFN input"),
    );
    m.branch_norms = Sourced::new(
        Some(BranchNorms {
            experts_in: "pre_ffw_norm_2.weight",
            experts_out: "post_ffw_norm_2.weight",
            shared_out: "post_ffw_norm_1.weight",
        }),
        format!(
            "{MOE_SOURCE}: ffn_pre_norm_2, ffn_post_norm_2, ffn_post_norm_1; cur_mlp + cur_moe"
        ),
    );
    Ok(moe)
}

/// RoPE as a GGUF states it: full layers keep the base's spec
/// (rope.freq_base, rotary width, rope_freqs divisors); sliding layers their
/// own base and width, no divisors, unscaled.
fn gguf_rope(d: &Decls, s: &mut Semantics, sk: usize) -> Result<()> {
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

    Ok(())
}

/// RoPE of one layer kind from config.json's `rope_parameters`: "default"
/// rotates `partial_rotary_factor` of the head; "proportional" computes the
/// angles over the whole head and rotates only that share of the pairs.
/// HF's defaults when the kind's entry is absent.
fn rope_parameters(
    d: &Decls,
    template: &RopeSpec,
    head: usize,
    [ty_key, base_key, partial_key]: [Key; 3],
    default: (&str, f64, f64),
) -> Result<Sourced<RopeSpec>> {
    let mut r = template.clone();
    r.scaling = RopeScaling::None;
    r.freq_factors = None;
    r.long_factors = None;
    let stated = [ty_key, base_key, partial_key]
        .iter()
        .any(|&k| d.get(k).is_some());
    let (ty, base, partial, src) = if !stated {
        (
            default.0.to_string(),
            default.1,
            default.2,
            format!(
                "gemma4 HF default ({} absent): {} RoPE, base {}, partial_rotary_factor {}",
                d.spelled(ty_key)
                    .rsplit_once('.')
                    .map_or(String::new(), |(p, _)| p.to_string()),
                default.0,
                default.1,
                default.2
            ),
        )
    } else {
        let ty = d.str_opt(ty_key)?.ok_or_else(|| {
            d.err(
                ty_key,
                "is required when the layer kind's rope_parameters are given",
            )
        })?;
        let base = d.f64_opt(base_key)?.ok_or_else(|| {
            d.err(
                base_key,
                "is required when the layer kind's rope_parameters are given",
            )
        })?;
        let partial = d.f64_opt(partial_key)?.unwrap_or(1.0);
        let src = format!(
            "{}, {}, {}",
            d.src(ty_key),
            d.src(base_key),
            match d.get(partial_key) {
                Some(_) => d.src(partial_key),
                None => format!("{} absent: 1", d.spelled(partial_key)),
            }
        );
        (ty, base, partial, src)
    };
    if !(base > 0.0 && base.is_finite()) {
        return Err(d.err(base_key, format!("must be positive, found {base}")));
    }
    if !(partial > 0.0 && partial <= 1.0) {
        return Err(d.err(partial_key, format!("must be in (0, 1], found {partial}")));
    }
    r.base = base;
    let share = head as f64 * partial;
    let whole = |n: f64| (n - n.round()).abs() < 1e-9;
    match ty.as_str() {
        "default" if whole(share) && (share.round() as usize).is_multiple_of(2) => {
            r.n_rot = share.round() as usize;
            r.proportional = None;
        }
        "proportional" if whole(share / 2.0) => {
            r.n_rot = head;
            r.proportional = Some((share / 2.0).round() as usize);
        }
        "default" | "proportional" => {
            return Err(d.err(
                partial_key,
                format!("{partial} of a {head}-wide head is not a whole number of rotated pairs"),
            ))
        }
        other => {
            return Err(d.err(
                ty_key,
                format!(
                "RoPE type `{other}` is not implemented for gemma4 (default and proportional are)"
            ),
            ))
        }
    }
    Ok(Sourced::new(r, src))
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
    let kinds = kinds_from_flags(d, key, &flags)?;
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

/// config.json keys of a gemma4 pack, restating the semantics in HF's
/// spellings (the importer has turned GGUF's rope_freqs into `proportional`).
fn config_json(sem: &Semantics, c: &mut Json) {
    super::gemma3::write_layer_types(sem, c);
    if let Some(h) = &sem.head_dims_sliding {
        c["head_dim"] = json!(h.value.0);
    }
    c["global_head_dim"] = json!(sem.dims.head_dim_k);
    // HF: num_key_value_heads is the sliding layers' count; the full
    // layers' is num_global_key_value_heads, applied with attention_k_eq_v
    // (V from K on every full layer). The importer reads this back and
    // refuses a GGUF whose rules it does not restate.
    c["num_key_value_heads"] = json!(sem.kv_heads(LayerKind::Sliding));
    if sem.v_from_k.value.contains(&true) {
        c["attention_k_eq_v"] = json!(true);
    }
    if sem.kv_heads(LayerKind::Full) != sem.kv_heads(LayerKind::Sliding)
        || sem.v_from_k.value.contains(&true)
    {
        c["num_global_key_value_heads"] = json!(sem.kv_heads(LayerKind::Full));
    }
    let src = &sem.kv_source.value;
    c["num_kv_shared_layers"] = json!(src.iter().enumerate().filter(|(i, s)| i != *s).count());
    c["hidden_size_per_layer_input"] = json!(sem.body.value.per_layer_input);
    if let Some(cap) = sem.final_softcap.value {
        c["final_logit_softcapping"] = json!(cap);
    }
    c["hidden_activation"] = json!("gelu_pytorch_tanh");
    let rope = |r: &RopeSpec| match r.proportional {
        Some(pairs) => json!({
            "rope_type": "proportional",
            "rope_theta": r.base,
            "partial_rotary_factor": (2 * pairs) as f64 / r.n_rot as f64,
        }),
        None => json!({"rope_type": "default", "rope_theta": r.base}),
    };
    c["rope_parameters"] = json!({
        "full_attention": rope(&sem.rope_full.value),
        "sliding_attention": rope(&sem.rope_sliding.value),
    });
    if let Some(o) = c.as_object_mut() {
        o.remove("rope_theta");
    }
}
