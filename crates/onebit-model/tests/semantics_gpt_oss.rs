//! gpt-oss rules read from GGUF metadata (gpt-oss-20b's keys, no tensors),
//! each asserted on a value worked out here from llama.cpp's rule: the
//! sliding pattern (`set_swa_pattern(2)`), YaRN's correction range, ramp
//! and magnitude factor (ggml's `rope_yarn`), the routing and FFN rules, and
//! the refusals of what the graph does not run. The logits of the whole
//! family are checked against llama.cpp by tests/golden.rs.

mod common;

use common::gpt_oss_20b_meta;
use onebit_formats::gguf::writer::GgufWriter;
use onebit_formats::gguf::{Gguf, Value};
use onebit_model::families::semantics_from_gguf;
use onebit_model::semantics::{Activation, Gating, LayerKind, RopeScaling, RopeStyle};
use onebit_model::Semantics;
use onebit_testdata::TempDir;

fn meta() -> GgufWriter {
    gpt_oss_20b_meta(&[])
}

fn sem_of(w: &GgufWriter) -> Result<Semantics, String> {
    let dir = TempDir::new("sem-gpt-oss");
    let p = dir.file("m.gguf", &w.to_bytes());
    let g = Gguf::open(&p).map_err(|e| e.to_string())?;
    semantics_from_gguf(&g).map_err(|e| e.to_string())
}

#[test]
fn even_layers_slide_and_odd_layers_are_full() {
    let s = sem_of(&meta()).unwrap();
    let kinds = &s.layer_kinds.value;
    assert_eq!(kinds.len(), 24);
    for (il, k) in kinds.iter().enumerate() {
        // llama.cpp: is_swa = il % 2 < 2 - 1.
        let want = if il % 2 == 0 {
            LayerKind::Sliding
        } else {
            LayerKind::Full
        };
        assert_eq!(*k, want, "layer {il}");
    }
    assert_eq!(s.sliding_window.value, Some(128));
    assert!(s.layer_kinds.source.contains("load_swa_pattern"));

    // A stated period: il % 3 < 2 slides (S S F S S F ...).
    let s = sem_of(&gpt_oss_20b_meta(&[(
        "attention.sliding_window_pattern",
        Value::U32(3),
    )]))
    .unwrap();
    assert_eq!(
        &s.layer_kinds.value[..3],
        &[LayerKind::Sliding, LayerKind::Sliding, LayerKind::Full]
    );
}

#[test]
fn yarn_mixes_by_the_correction_range_and_scales_cos_and_sin() {
    let s = sem_of(&meta()).unwrap();
    for rope in [&s.rope_full.value, &s.rope_sliding.value] {
        assert_eq!(rope.style, RopeStyle::Halves);
        assert_eq!(rope.n_rot, 64);
        assert_eq!(
            rope.scaling,
            RopeScaling::Yarn {
                factor: 32.0,
                orig_ctx: 4096,
                ext_factor: 1.0,
                beta_fast: 32.0,
                beta_slow: 1.0
            }
        );
        // Correction dims: 64 ln(4096 / (2 pi beta)) / (2 ln 150000) is
        // 8.09 for beta 32 (floor 8) and 17.40 for beta 1 (ceil 18). Pairs
        // up to 8 keep the unscaled angle, pairs from 18 on are divided by
        // 32, pair 13 is halfway: (1/32 + 1) / 2 of it.
        let extrap: Vec<f64> = (0..32)
            .map(|i| 150000f64.powf(-2.0 * i as f64 / 64.0))
            .collect();
        let (inv, mscale) = rope.scaled_inv_freq(&extrap);
        for i in 0..32 {
            let ratio = inv[i] / extrap[i];
            let want = match i {
                0..=8 => 1.0,
                18.. => 1.0 / 32.0,
                _ => {
                    let mix = 1.0 - (i as f64 - 8.0) / 10.0;
                    mix + (1.0 - mix) / 32.0
                }
            };
            assert!((ratio - want).abs() < 1e-12, "pair {i}: {ratio} vs {want}");
        }
        assert!((inv[13] / extrap[13] - (1.0 / 32.0 + 1.0) / 2.0).abs() < 1e-12);
        // 1 + 0.1 ln 32 = 1.346573590...
        assert!((mscale - 1.346_573_590_279_972_6).abs() < 1e-12, "{mscale}");
    }
    assert_eq!(s.attn_scale.value, 1.0 / 8.0, "1/sqrt(n_rot 64)");
}

#[test]
fn routing_ffn_and_attention_rules_are_declared_with_their_source() {
    let s = sem_of(&meta()).unwrap();
    let m = &s.moe.as_ref().expect("every layer routes").value;
    assert_eq!((m.n_expert, m.n_used, m.n_ff_exp), (32, 4, 2880));
    assert_eq!(m.gating.value, Gating::SoftmaxWeight);
    assert!(!m.norm_weights.value);
    assert!(m.expert_biases.value);
    assert_eq!(m.leading_dense.value, 0);
    assert_eq!(s.activation.value, Activation::SwigluOai);
    assert_eq!(s.attn_sinks.value, Some("attn_sinks.weight"));
    assert!(s.attn_out_bias.value);
    assert_eq!(s.body.value.ffn_norm, "post_attention_norm.weight");
    let lines = s.to_string();
    for want in [
        "attention sinks: attn_sinks.weight",
        "expert gating: softmaxweight",
        "activation: SwigluOai",
        "yarn factor 32 over original context 4096",
    ] {
        assert!(lines.contains(want), "no `{want}` in\n{lines}");
    }
}

#[test]
fn what_the_graph_does_not_run_is_refused_by_name() {
    // llama.cpp passes norm_w false: a file asking for renormalization is refused.
    let e = sem_of(&gpt_oss_20b_meta(&[(
        "expert_weights_norm",
        Value::Bool(true),
    )]))
    .unwrap_err();
    assert!(
        e.contains("gpt-oss.expert_weights_norm") && e.contains("norm_w false"),
        "{e}"
    );

    // A yarn factor below 1, and a scaling type no family file reads.
    let e = sem_of(&gpt_oss_20b_meta(&[(
        "rope.scaling.factor",
        Value::F32(0.5),
    )]))
    .unwrap_err();
    assert!(e.contains("gpt-oss.rope.scaling.factor"), "{e}");
    let e = sem_of(&gpt_oss_20b_meta(&[(
        "rope.scaling.type",
        Value::Str("longrope".into()),
    )]))
    .unwrap_err();
    assert!(
        e.contains("gpt-oss.rope.scaling.type") && e.contains("not implemented"),
        "{e}"
    );

    // Another family still refuses yarn: only gpt-oss reads it.
    let mut w = GgufWriter::new();
    w.kv("general.architecture", Value::Str("qwen3".into()))
        .kv("qwen3.embedding_length", Value::U32(64))
        .kv("qwen3.block_count", Value::U32(2))
        .kv("qwen3.feed_forward_length", Value::U32(128))
        .kv("qwen3.attention.head_count", Value::U32(4))
        .kv("qwen3.attention.layer_norm_rms_epsilon", Value::F32(1e-6))
        .kv("qwen3.vocab_size", Value::U32(384))
        .kv("qwen3.rope.scaling.type", Value::Str("yarn".into()))
        .kv("qwen3.rope.scaling.factor", Value::F32(4.0));
    let e = sem_of(&w).unwrap_err();
    assert!(
        e.contains("qwen3.rope.scaling.type")
            && e.contains("yarn")
            && e.contains("not implemented"),
        "{e}"
    );
}
