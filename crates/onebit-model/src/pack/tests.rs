//! Semantics rules from config.json snippets, read the way a pack is read:
//! family by model_type/architectures, the text root, `Decls::config`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use serde_json::{json, Value as Json};

use super::config::{family_of, text_root};
use crate::families::decls::Decls;
use crate::semantics::*;
use crate::weights::{self, RawTensor, TensorSource};
use onebit_formats::{ByteView, GgmlType};

/// Semantics of a config snippet; `tensors` are the GGUF names the
/// container holds (dims unused by these rules).
fn sem_with(config: Json, tensors: &[&str]) -> Result<Semantics, String> {
    let fam = family_of(&config).ok_or("no family")?;
    let text = text_root(&config);
    let names: Vec<String> = tensors.iter().map(|s| s.to_string()).collect();
    let dims = |n: &str| names.iter().any(|x| x == n).then(Vec::new);
    let d = Decls::config(&text, Path::new("pack/config.json"), fam.arch, &dims);
    (fam.semantics)(&d).map_err(|e| e.to_string())
}

fn sem(config: Json) -> Semantics {
    sem_with(config, &["output.weight"]).unwrap()
}

/// A config with the sizes every family needs, merged with `extra`.
fn cfg(model_type: &str, extra: Json) -> Json {
    let mut c = json!({
        "model_type": model_type,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "vocab_size": 100,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
    });
    for (k, v) in extra.as_object().unwrap() {
        c[k] = v.clone();
    }
    c
}

fn full_at(s: &Semantics) -> Vec<usize> {
    layers_of(&s.layer_kinds.value, LayerKind::Full)
}

#[test]
fn gemma3_34_layers_pattern_6_full_exactly_at_5_11_17_23_29() {
    let s = sem(cfg(
        "gemma3_text",
        json!({"num_hidden_layers": 34, "sliding_window": 1024, "sliding_window_pattern": 6}),
    ));
    assert_eq!(full_at(&s), vec![5, 11, 17, 23, 29]);
    assert!(s
        .layer_kinds
        .source
        .contains("config.json sliding_window_pattern"));
    assert_eq!(s.layer_kinds.value[0], LayerKind::Sliding);
}

#[test]
fn layer_types_list_decides_over_the_pattern() {
    let types = [
        "full_attention",
        "sliding_attention",
        "sliding_attention",
        "full_attention",
    ];
    let s = sem(cfg(
        "gemma3_text",
        json!({"sliding_window": 512, "sliding_window_pattern": 6, "layer_types": types}),
    ));
    assert_eq!(full_at(&s), vec![0, 3]);
    assert_eq!(s.layer_kinds.source, "config.json layer_types");
    // LFM2: conv / full_attention.
    let s = sem(cfg(
        "lfm2",
        json!({"conv_L_cache": 3, "norm_eps": 1e-5,
               "layer_types": ["conv", "conv", "full_attention", "conv"]}),
    ));
    assert_eq!(
        s.layer_kinds.value,
        vec![
            LayerKind::ShortConv,
            LayerKind::ShortConv,
            LayerKind::Full,
            LayerKind::ShortConv
        ]
    );
}

#[test]
fn rope_local_base_freq_stated_absent_and_never_zero() {
    let g = |extra: Json| {
        let mut e = json!({"sliding_window": 512, "sliding_window_pattern": 2});
        for (k, v) in extra.as_object().unwrap() {
            e[k] = v.clone();
        }
        sem_with(cfg("gemma3_text", e), &[])
    };
    let s = g(json!({"rope_local_base_freq": 20000.0})).unwrap();
    assert_eq!(s.rope_sliding.value.base, 20000.0);
    assert!(s
        .rope_sliding
        .source
        .contains("config.json rope_local_base_freq"));
    assert_eq!(s.rope_full.value.base, 1e6);
    // Absent: gemma3 takes 10000 (HF's default), not the model's base.
    let s = g(json!({})).unwrap();
    assert_eq!(s.rope_sliding.value.base, 10000.0);
    assert!(s.rope_sliding.source.contains("default"));
    // Zero is refused by name.
    let e = g(json!({"rope_local_base_freq": 0.0})).unwrap_err();
    assert!(e.contains("rope_local_base_freq"), "{e}");
    // Other families: the model's base on every layer.
    let s = sem(cfg("qwen3", json!({})));
    assert_eq!(s.rope_sliding.value.base, 1e6);
    assert_eq!(s.rope_full.value.base, 1e6);
}

#[test]
fn rope_scaling_linear_full_layers_only_for_gemma3_every_layer_otherwise() {
    let lin = json!({"rope_type": "linear", "factor": 8.0});
    for local in [json!(10000.0), Json::Null] {
        let s = sem(cfg(
            "gemma3_text",
            json!({"sliding_window": 512, "sliding_window_pattern": 2,
                   "rope_scaling": lin, "rope_local_base_freq": local}),
        ));
        assert_eq!(
            s.rope_full.value.scaling,
            RopeScaling::Linear { factor: 8.0 }
        );
        assert_eq!(s.rope_full.value.freq_scale(), 0.125);
        // HF's Gemma3 rotates sliding layers unscaled with their own base.
        assert_eq!(s.rope_sliding.value.scaling, RopeScaling::None);
    }
    let s = sem(cfg(
        "llama",
        json!({"rope_scaling": {"type": "linear", "factor": 4.0}}),
    ));
    assert_eq!(
        s.rope_full.value.scaling,
        RopeScaling::Linear { factor: 4.0 }
    );
    assert_eq!(
        s.rope_sliding.value.scaling,
        RopeScaling::Linear { factor: 4.0 }
    );
    for bad in [
        json!({"rope_type": "linear"}),
        json!({"rope_type": "linear", "factor": 0.0}),
    ] {
        let e = sem_with(cfg("llama", json!({"rope_scaling": bad})), &[]).unwrap_err();
        assert!(
            e.contains("rope_scaling.factor") && e.contains("positive factor"),
            "{e}"
        );
    }
}

#[test]
fn rope_scaling_llama3_and_yarn_refused_by_name() {
    for ty in ["llama3", "yarn"] {
        let e = sem_with(
            cfg(
                "llama",
                json!({"rope_scaling": {"rope_type": ty, "factor": 8.0}}),
            ),
            &[],
        )
        .unwrap_err();
        assert!(
            e.contains(ty) && e.contains("rope_scaling.rope_type"),
            "{e}"
        );
        assert!(e.contains("not implemented"), "{e}");
    }
}

fn hunyuan(extra: Json) -> Json {
    cfg(
        "hunyuan_v1_dense",
        json!({"head_dim": 128, "num_attention_heads": 2, "num_key_value_heads": 1,
               "hidden_size": 256, "rope_theta": 10000.0}),
    )
    .as_object()
    .unwrap()
    .iter()
    .chain(extra.as_object().unwrap())
    .map(|(k, v)| (k.clone(), v.clone()))
    .collect::<serde_json::Map<_, _>>()
    .into()
}

#[test]
fn hunyuan_dynamic_alpha_applies_to_the_raw_rope_theta_of_a_pack() {
    // A pack's config states the raw rope_theta; alpha applies:
    // 10000 * 1000^(128/126) = 11,158,839.9.
    let s = sem(hunyuan(
        json!({"rope_scaling": {"type": "dynamic", "alpha": 1000.0, "factor": 1.0}}),
    ));
    assert!(
        (s.rope_full.value.base - 11_158_839.9).abs() < 0.1,
        "{}",
        s.rope_full.value.base
    );
    assert_eq!(s.rope_sliding.value.base, s.rope_full.value.base);
    assert!(s.rope_full.source.contains("rope_scaling.alpha"));
    let e = sem_with(hunyuan(json!({"rope_scaling": {"type": "dynamic"}})), &[]).unwrap_err();
    assert!(e.contains("alpha"), "{e}");
}

#[test]
fn hunyuan_qk_norm_after_rope_by_model_type_or_architectures() {
    let s = sem(hunyuan(json!({})));
    assert_eq!(s.qk_norm.value, QkNorm::AfterRope);
    let mut c = hunyuan(json!({"architectures": ["HunYuanDenseV1ForCausalLM"]}));
    c.as_object_mut().unwrap().remove("model_type");
    let s = sem(c);
    assert_eq!(s.family, "hunyuan-dense");
    assert_eq!(s.qk_norm.value, QkNorm::AfterRope);
    let s = sem(hunyuan(json!({"use_qk_norm": true})));
    assert_eq!(s.qk_norm.value, QkNorm::AfterRope);
    assert_eq!(s.qk_norm.source, "config.json use_qk_norm");
}

#[test]
fn query_pre_attn_scalar_sets_the_attention_scale() {
    let s = sem(cfg(
        "gemma3_text",
        json!({"head_dim": 16, "query_pre_attn_scalar": 256}),
    ));
    assert_eq!(s.attn_scale.value, 1.0 / 16.0);
    assert!(s.attn_scale.source.contains("query_pre_attn_scalar"));
    let s = sem(cfg("gemma3_text", json!({"head_dim": 16})));
    assert_eq!(s.attn_scale.value, 0.25);
}

#[test]
fn use_qk_norm_true_false_null_and_nested() {
    // Stated true on a family without q/k norm: normalises.
    let s = sem(cfg("llama", json!({"use_qk_norm": true})));
    assert_eq!(s.qk_norm.value, QkNorm::BeforeRope);
    assert_eq!(s.qk_norm.source, "config.json use_qk_norm");
    // Stated false on a family with it: does not.
    let s = sem(cfg("qwen3", json!({"use_qk_norm": false})));
    assert_eq!(s.qk_norm.value, QkNorm::None);
    // null states nothing: the family table.
    let s = sem(cfg("qwen3", json!({"use_qk_norm": null})));
    assert_eq!(s.qk_norm.value, QkNorm::BeforeRope);
    assert!(s.qk_norm.source.starts_with("qwen3"));
    let s = sem(cfg("llama", json!({"use_qk_norm": null})));
    assert_eq!(s.qk_norm.value, QkNorm::None);
    // Nested under another component's config: not read.
    let s = sem(cfg(
        "llama",
        json!({"vision_config": {"use_qk_norm": true}}),
    ));
    assert_eq!(s.qk_norm.value, QkNorm::None);
    let s = sem(cfg(
        "qwen3",
        json!({"vision_config": {"use_qk_norm": false}}),
    ));
    assert_eq!(s.qk_norm.value, QkNorm::BeforeRope);
    // A multimodal config: the text model's own statement decides, and
    // overrides one at the outer top level.
    let mm = json!({
        "architectures": ["Gemma3ForConditionalGeneration"],
        "use_qk_norm": true,
        "vision_config": {"use_qk_norm": true},
        "text_config": cfg("gemma3_text", json!({"use_qk_norm": false})),
    });
    assert_eq!(sem(mm).qk_norm.value, QkNorm::None);
}

#[test]
fn norm_eps_from_rms_norm_eps_or_norm_eps() {
    let s = sem(cfg("llama", json!({"rms_norm_eps": 1e-5})));
    assert_eq!(s.norm_eps.value, 1e-5);
    let mut c = cfg(
        "lfm2",
        json!({"conv_L_cache": 3, "norm_eps": 2e-5, "layer_types": ["conv", "conv", "full_attention", "conv"]}),
    );
    c.as_object_mut().unwrap().remove("rms_norm_eps");
    let s = sem(c);
    assert_eq!(s.norm_eps.value, 2e-5);
    assert_eq!(s.norm_eps.source, "config.json norm_eps");
}

#[test]
fn container_rules_of_a_pack() {
    // Gemma3: norms stored as 1 + w (plain form), embedding stored pre-scaled.
    let s = sem(cfg("gemma3_text", json!({})));
    assert_eq!(s.norm_form.value, NormForm::Plain);
    assert_eq!(s.embed_scale.value, None);
    assert!(s.embed_scale.source.contains("pre-scaled"));
    // Llama: q/k rows un-permuted by the converter: halves RoPE.
    let s = sem(cfg("llama", json!({})));
    assert_eq!(s.rope_full.value.style, RopeStyle::Halves);
    // Tied output only when the pack has no lm_head.
    assert!(!s.tied_output.value);
    assert!(
        sem_with(cfg("llama", json!({})), &[])
            .unwrap()
            .tied_output
            .value
    );
}

/// An in-memory container of zero F32 tensors.
struct Mem(HashMap<String, RawTensor>, PathBuf);

impl TensorSource for Mem {
    fn path(&self) -> &Path {
        &self.1
    }
    fn tensor(&self, name: &str) -> Option<RawTensor> {
        self.0.get(name).cloned()
    }
}

fn mem(tensors: &[(String, Vec<u64>)]) -> Mem {
    Mem(
        tensors
            .iter()
            .map(|(n, dims)| {
                let len = dims.iter().product::<u64>() as usize * 4;
                (
                    n.clone(),
                    RawTensor {
                        dtype: GgmlType::F32,
                        dims: dims.clone(),
                        bytes: ByteView::from_vec(vec![0; len]),
                    },
                )
            })
            .collect(),
        PathBuf::from("pack/model.q4nx"),
    )
}

/// Tensors of a 64-wide model with the given layer kinds.
fn model_tensors(kinds: &[LayerKind], qk_norm: &[bool]) -> Vec<(String, Vec<u64>)> {
    let mut v = vec![
        ("token_embd.weight".to_string(), vec![64, 100]),
        ("output.weight".into(), vec![64, 100]),
        ("output_norm.weight".into(), vec![64]),
        ("token_embd_norm.weight".into(), vec![64]),
    ];
    for (i, k) in kinds.iter().enumerate() {
        let mut t = |s: &str, d: Vec<u64>| v.push((format!("blk.{i}.{s}"), d));
        t("attn_norm.weight", vec![64]);
        t("ffn_norm.weight", vec![64]);
        t("ffn_gate.weight", vec![64, 128]);
        t("ffn_up.weight", vec![64, 128]);
        t("ffn_down.weight", vec![128, 64]);
        match k {
            LayerKind::ShortConv => {
                t("shortconv.in_proj.weight", vec![64, 192]);
                t("shortconv.out_proj.weight", vec![64, 64]);
                t("shortconv.conv.weight", vec![3, 64]);
            }
            _ => {
                t("attn_q.weight", vec![64, 64]);
                t("attn_k.weight", vec![64, 32]);
                t("attn_v.weight", vec![64, 32]);
                t("attn_output.weight", vec![64, 64]);
                if qk_norm[i] {
                    t("attn_q_norm.weight", vec![16]);
                    t("attn_k_norm.weight", vec![16]);
                }
            }
        }
    }
    v
}

#[test]
fn declared_qk_norm_without_q_norm_is_refused_at_load_naming_the_key() {
    let kinds = [LayerKind::Full; 4];
    let s = sem(cfg("llama", json!({"use_qk_norm": true})));
    let src = mem(&model_tensors(&kinds, &[true, true, false, true]));
    let e = weights::load(&src, &s).err().expect("refused").to_string();
    assert!(
        e.contains("blk.2.attn_q_norm.weight") && e.contains("config.json use_qk_norm"),
        "{e}"
    );
    // Stated false: the same container loads.
    let s = sem(cfg("llama", json!({"use_qk_norm": false})));
    assert!(weights::load(&src, &s).is_ok());
}

#[test]
fn conv_layers_are_exempt_from_the_q_norm_check() {
    use LayerKind::*;
    let c = cfg(
        "lfm2",
        json!({"conv_L_cache": 3, "norm_eps": 1e-5,
               "layer_types": ["conv", "conv", "full_attention", "conv"]}),
    );
    let s = sem_with(c.clone(), &["output.weight"]).unwrap();
    assert_ne!(s.qk_norm.value, QkNorm::None);
    let kinds = [ShortConv, ShortConv, Full, ShortConv];
    let ok = mem(&model_tensors(&kinds, &[false, false, true, false]));
    weights::load(&ok, &s).map_err(|e| e.to_string()).unwrap();
    let missing = mem(&model_tensors(&kinds, &[false; 4]));
    let e = weights::load(&missing, &s).err().unwrap().to_string();
    assert!(
        e.contains("blk.2.attn_q_norm.weight") && e.contains("lfm2"),
        "{e}"
    );
}

/// A Gemma 4 text config: 4 layers, sliding head 16, full head 32.
fn gemma4(extra: Json) -> Json {
    let mut c = cfg(
        "gemma4_text",
        json!({
            "layer_types": ["sliding_attention", "sliding_attention", "sliding_attention", "full_attention"],
            "sliding_window": 8,
            "global_head_dim": 32,
            "num_kv_shared_layers": 0,
            "hidden_size_per_layer_input": 0,
        }),
    );
    c.as_object_mut().unwrap().remove("rope_theta");
    for (k, v) in extra.as_object().unwrap() {
        c[k] = v.clone();
    }
    c
}

/// config.json's `rope_parameters` per layer kind: proportional on full
/// layers rotates partial_rotary_factor x head/2 pairs with angles over the
/// whole head (32 x 0.25 / 2 = 4 of 16 pairs); default on sliding layers
/// rotates partial_rotary_factor x head dims (16 x 0.5 = 8); head_dim is the
/// sliding layers', global_head_dim the full layers'.
#[test]
fn gemma4_rope_parameters_and_head_sizes_per_layer_kind() {
    let s = sem(gemma4(json!({"rope_parameters": {
        "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1e6},
        "sliding_attention": {"rope_type": "default", "partial_rotary_factor": 0.5, "rope_theta": 1e4},
    }})));
    assert_eq!((s.dims.head_dim_k, s.dims.head_dim_v), (32, 32));
    assert_eq!(s.head_dims_sliding.as_ref().unwrap().value, (16, 16));
    let (f, w) = (&s.rope_full.value, &s.rope_sliding.value);
    assert_eq!((f.base, f.n_rot, f.proportional), (1e6, 32, Some(4)));
    assert_eq!((w.base, w.n_rot, w.proportional), (1e4, 8, None));
    assert!(s
        .rope_full
        .source
        .contains("rope_parameters.full_attention.rope_type"));
    // The divisors are llama.cpp's rope_freqs for the same model.
    assert_eq!(
        proportional_factors(16, 4),
        [[1.0f32; 4].as_slice(), &[1e30; 12]].concat()
    );

    // Absent: HF Gemma4TextConfig's defaults (proportional 0.25 at 1e6 on
    // full layers, default at 10000 on sliding ones), said so.
    let s = sem(gemma4(json!({})));
    let (f, w) = (&s.rope_full.value, &s.rope_sliding.value);
    assert_eq!((f.base, f.n_rot, f.proportional), (1e6, 32, Some(4)));
    assert_eq!((w.base, w.n_rot, w.proportional), (1e4, 16, None));
    assert!(
        s.rope_full.source.contains("HF default"),
        "{}",
        s.rope_full.source
    );

    // null per-layer width: no per-layer embeddings.
    let s = sem(gemma4(json!({"hidden_size_per_layer_input": null})));
    assert_eq!(s.body.value.per_layer_input, 0);
}

/// What a Gemma 4 config declares and onebit does not run is refused by
/// the key's name.
#[test]
fn gemma4_config_refusals_name_the_key() {
    let full = |p: Json| json!({"rope_parameters": {"full_attention": p, "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}});
    for (extra, key, what) in [
        (
            json!({"enable_moe_block": true}),
            "enable_moe_block",
            "mixture-of-experts",
        ),
        (
            json!({"use_double_wide_mlp": true}),
            "use_double_wide_mlp",
            "per-layer FFN widths",
        ),
        (
            json!({"attention_k_eq_v": true}),
            "num_global_key_value_heads",
            "is required with attention_k_eq_v true",
        ),
        (
            json!({"num_global_key_value_heads": 1}),
            "num_global_key_value_heads",
            "without attention_k_eq_v true: HF applies it only with",
        ),
        (
            json!({"attention_k_eq_v": true, "num_global_key_value_heads": 3}),
            "num_global_key_value_heads",
            "3 does not divide the head count 4",
        ),
        (
            json!({"attention_k_eq_v": true, "num_global_key_value_heads": 0}),
            "num_global_key_value_heads",
            "0 does not divide",
        ),
        (
            full(json!({"rope_type": "yarn", "rope_theta": 1e6})),
            "rope_parameters.full_attention.rope_type",
            "`yarn` is not implemented",
        ),
        (
            full(
                json!({"rope_type": "proportional", "rope_theta": 1e6, "partial_rotary_factor": 0.3}),
            ),
            "rope_parameters.full_attention.partial_rotary_factor",
            "not a whole number of rotated pairs",
        ),
        (
            full(json!({"rope_type": "proportional", "partial_rotary_factor": 0.25})),
            "rope_parameters.full_attention.rope_theta",
            "is required",
        ),
        (
            json!({"global_head_dim": null}),
            "global_head_dim",
            "absent",
        ),
    ] {
        let e = sem_with(gemma4(extra.clone()), &["output.weight"]).unwrap_err();
        assert!(e.contains(key) && e.contains(what), "{extra}: {e}");
    }
    // Stated false, they are no obstacle; nor is a full layers' count
    // equal to num_key_value_heads (HF and llama.cpp's converter agree).
    let s = sem(gemma4(
        json!({"enable_moe_block": false, "use_double_wide_mlp": false, "attention_k_eq_v": false, "num_global_key_value_heads": 2}),
    ));
    assert_eq!((s.kv_heads(LayerKind::Full), s.kv_heads_sliding), (2, None));
    assert!(!s.v_from_k.value.contains(&true));
}

/// HF's `attention_k_eq_v` (Gemma-4-26B-A4B, 31B): every full layer with
/// its own KV takes V from `k_proj` and has `num_global_key_value_heads`
/// KV heads; sliding layers keep `num_key_value_heads` and their own
/// `v_proj`. A full layer reading another layer's KV has no K of its own.
#[test]
fn gemma4_k_eq_v_takes_full_layers_v_from_k_with_the_global_kv_heads() {
    let s = sem(gemma4(
        json!({"attention_k_eq_v": true, "num_global_key_value_heads": 1}),
    ));
    assert_eq!(s.v_from_k.value, [false, false, false, true]);
    assert_eq!(
        (s.kv_heads(LayerKind::Full), s.kv_heads(LayerKind::Sliding)),
        (1, 2)
    );
    assert_eq!(s.kv_widths(LayerKind::Full), (32, 32));
    assert_eq!(s.kv_widths(LayerKind::Sliding), (32, 32));
    let lines = s.to_string();
    assert!(
        lines.contains("values from keys: layers [3]")
            && lines.contains("config.json attention_k_eq_v")
            && lines.contains("sliding KV heads: 2  <- config.json num_key_value_heads"),
        "{lines}"
    );
    // Shared KV: layer 3 (full) reads layer 1's cache, made from 1's K.
    let s = sem(gemma4(json!({
        "attention_k_eq_v": true, "num_global_key_value_heads": 1, "num_kv_shared_layers": 2,
        "layer_types": ["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
    })));
    assert_eq!(s.kv_source.value, [0, 1, 0, 1]);
    assert_eq!(s.v_from_k.value, [false, true, false, false]);
    // Equal counts: no per-kind line, V still from K.
    let s = sem(gemma4(
        json!({"attention_k_eq_v": true, "num_global_key_value_heads": 2}),
    ));
    assert_eq!(s.kv_heads_sliding, None);
    assert_eq!(s.v_from_k.value, [false, false, false, true]);
}

/// Tensors of the 4-layer Gemma 4 of `gemma4()` (SSSF, sliding heads 2 x
/// 16, full heads `full_kv` x 32), with or without `v_proj` on the full
/// layer.
fn gemma4_tensors(full_kv: u64, v_on_full: bool) -> Vec<(String, Vec<u64>)> {
    let mut v = vec![
        ("token_embd.weight".to_string(), vec![64, 100]),
        ("output_norm.weight".into(), vec![64]),
    ];
    for i in 0..4 {
        let full = i == 3;
        let (d, kv) = if full { (32, full_kv) } else { (16, 2) };
        let mut t = |s: &str, dims: Vec<u64>| v.push((format!("blk.{i}.{s}"), dims));
        for n in [
            "attn_norm",
            "post_attention_norm",
            "ffn_norm",
            "post_ffw_norm",
        ] {
            t(&format!("{n}.weight"), vec![64]);
        }
        t("ffn_gate.weight", vec![64, 128]);
        t("ffn_up.weight", vec![64, 128]);
        t("ffn_down.weight", vec![128, 64]);
        t("attn_q.weight", vec![64, 4 * d]);
        t("attn_k.weight", vec![64, kv * d]);
        if !full || v_on_full {
            t("attn_v.weight", vec![64, kv * d]);
        }
        t("attn_output.weight", vec![4 * d, 64]);
        t("attn_q_norm.weight", vec![d]);
        t("attn_k_norm.weight", vec![d]);
    }
    v
}

#[test]
fn gemma4_k_eq_v_pack_weights_load_without_v_proj_on_full_layers() {
    let s = sem_with(
        gemma4(json!({"attention_k_eq_v": true, "num_global_key_value_heads": 1})),
        &[],
    )
    .unwrap();
    let w = weights::load(&mem(&gemma4_tensors(1, false)), &s)
        .map_err(|e| e.to_string())
        .unwrap();
    let kv = |i: usize| match &w.layers[i].mixer {
        weights::Mixer::Attention(a) => a.kv.as_ref().unwrap(),
        _ => unreachable!("gemma4 layers are attention layers"),
    };
    assert!(kv(3).wv.is_none() && kv(0).wv.is_some());
    assert_eq!((kv(3).wk.rows, kv(0).wk.rows), (32, 32));
    // A v_proj on a full layer would go unused: refused by its name.
    let e = weights::load(&mem(&gemma4_tensors(1, true)), &s)
        .err()
        .expect("refused")
        .to_string();
    assert!(
        e.contains("blk.3.attn_v.weight") && e.contains("attention_k_eq_v"),
        "{e}"
    );
    // The full layers' K has num_global_key_value_heads rows of heads.
    let e = weights::load(&mem(&gemma4_tensors(2, false)), &s)
        .err()
        .expect("refused")
        .to_string();
    assert!(
        e.contains("blk.3.attn_k.weight") && e.contains("expected [64, 32]"),
        "{e}"
    );
}
