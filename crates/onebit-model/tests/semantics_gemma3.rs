//! Gemma3 rules read from GGUF metadata, each asserted on a written-out value,
//! and each checked against llama.cpp's logits on fixture variants where the
//! rule's key is absent or stated differently.

use onebit_formats::gguf::writer::GgufWriter;
use onebit_formats::gguf::{Gguf, Value};
use onebit_kernels::Precision;
use onebit_model::families::semantics_from_gguf;
use onebit_model::semantics::{layers_of, LayerKind, NormForm, QkNorm, RopeScaling};
use onebit_model::{load, ExecConfig, Logits, Semantics};
use onebit_testdata::{compare, Fixture, TempDir};

/// Metadata of a gemma3 model with `n_layer` layers (no tensors: semantics only).
fn gemma3_meta(n_layer: u32) -> GgufWriter {
    let mut w = GgufWriter::new();
    w.kv("general.architecture", Value::Str("gemma3".into()))
        .kv("gemma3.embedding_length", Value::U32(640))
        .kv("gemma3.block_count", Value::U32(n_layer))
        .kv("gemma3.feed_forward_length", Value::U32(2048))
        .kv("gemma3.attention.head_count", Value::U32(4))
        .kv("gemma3.attention.head_count_kv", Value::U32(1))
        .kv("gemma3.attention.key_length", Value::U32(256))
        .kv("gemma3.attention.value_length", Value::U32(256))
        .kv("gemma3.attention.layer_norm_rms_epsilon", Value::F32(1e-6))
        .kv("gemma3.attention.sliding_window", Value::U32(512))
        .kv("gemma3.rope.freq_base", Value::F32(1_000_000.0))
        .kv("gemma3.vocab_size", Value::U32(262144));
    w
}

fn sem_of(w: &GgufWriter) -> Result<Semantics, String> {
    let dir = TempDir::new("sem");
    let p = dir.file("m.gguf", &w.to_bytes());
    let g = Gguf::open(&p).map_err(|e| e.to_string())?;
    semantics_from_gguf(&g).map_err(|e| e.to_string())
}

fn full_layers(s: &Semantics) -> Vec<usize> {
    layers_of(&s.layer_kinds.value, LayerKind::Full)
}

#[test]
fn every_sixth_layer_is_full_by_default() {
    let s = sem_of(&gemma3_meta(34)).unwrap();
    assert_eq!(full_layers(&s), vec![5, 11, 17, 23, 29]);
    assert_eq!(
        s.layer_kinds
            .value
            .iter()
            .filter(|k| **k == LayerKind::Sliding)
            .count(),
        29
    );
    assert_eq!(s.sliding_window.value, Some(512));
}

#[test]
fn a_stated_pattern_overrides_the_default() {
    let mut w = gemma3_meta(8);
    w.kv("gemma3.attention.sliding_window_pattern", Value::U32(4));
    assert_eq!(full_layers(&sem_of(&w).unwrap()), vec![3, 7]);

    let mut w = gemma3_meta(4);
    let flags = [true, false, false, true].map(Value::Bool).to_vec();
    w.kv(
        "gemma3.attention.sliding_window_pattern",
        Value::Array(flags),
    );
    assert_eq!(full_layers(&sem_of(&w).unwrap()), vec![1, 2]);

    let mut w = gemma3_meta(4);
    w.kv(
        "gemma3.attention.sliding_window_pattern",
        Value::Array(vec![Value::Bool(true)]),
    );
    let e = sem_of(&w).unwrap_err();
    assert!(
        e.contains("sliding_window_pattern") && e.contains("1 entries for 4 layers"),
        "{e}"
    );
}

#[test]
fn no_window_means_no_sliding() {
    let mut w = gemma3_meta(12);
    w.remove_kv("gemma3.attention.sliding_window");
    let s = sem_of(&w).unwrap();
    assert!(s.layer_kinds.value.iter().all(|k| *k == LayerKind::Full));
    assert_eq!(s.sliding_window.value, None);
}

#[test]
fn sliding_base_is_10000_when_absent_and_the_stated_one_otherwise() {
    let s = sem_of(&gemma3_meta(6)).unwrap();
    assert_eq!(s.rope_sliding.value.base, 10000.0);
    assert_eq!(s.rope_full.value.base, 1_000_000.0);

    let mut w = gemma3_meta(6);
    w.kv("gemma3.rope.freq_base_swa", Value::F32(20000.0));
    assert_eq!(sem_of(&w).unwrap().rope_sliding.value.base, 20000.0);
}

#[test]
fn linear_scaling_applies_to_full_layers_only() {
    let mut w = gemma3_meta(6);
    w.kv("gemma3.rope.scaling.type", Value::Str("linear".into()))
        .kv("gemma3.rope.scaling.factor", Value::F32(8.0));
    let s = sem_of(&w).unwrap();
    assert_eq!(
        s.rope_full.value.scaling,
        RopeScaling::Linear { factor: 8.0 }
    );
    assert_eq!(s.rope_full.value.freq_scale(), 0.125);
    assert_eq!(s.rope_sliding.value.scaling, RopeScaling::None);
}

#[test]
fn unusable_or_unknown_rope_scaling_is_refused_by_name() {
    let mut w = gemma3_meta(6);
    w.kv("gemma3.rope.scaling.type", Value::Str("linear".into()));
    let e = sem_of(&w).unwrap_err();
    assert!(e.contains("gemma3.rope.scaling.factor"), "{e}");

    let mut w = gemma3_meta(6);
    w.kv("gemma3.rope.scaling.type", Value::Str("yarn".into()))
        .kv("gemma3.rope.scaling.factor", Value::F32(4.0));
    let e = sem_of(&w).unwrap_err();
    assert!(
        e.contains("gemma3.rope.scaling.type") && e.contains("yarn"),
        "{e}"
    );
}

#[test]
fn attention_scale_comes_from_key_length_not_embedding_over_heads() {
    // key_length 256; n_embd / n_head would be 160.
    let s = sem_of(&gemma3_meta(6)).unwrap();
    assert_eq!(s.attn_scale.value, 1.0 / 16.0);
}

#[test]
fn gemma3_norms_embedding_and_qk_rules() {
    let s = sem_of(&gemma3_meta(6)).unwrap();
    assert_eq!(
        s.norm_form.value,
        NormForm::Plain,
        "GGUF gemma3 norms already hold 1 + w"
    );
    assert_eq!(
        s.body.value.post_mixer_norm,
        Some("post_attention_norm.weight")
    );
    assert_eq!(s.body.value.post_ffn_norm, Some("post_ffw_norm.weight"));
    assert_eq!(s.qk_norm.value, QkNorm::BeforeRope);
    assert_eq!(s.embed_scale.value, Some(640f32.sqrt()));
}

/// Runs a fixture variant and compares with a llama.cpp reference at 2e-5 * M.
fn variant_matches(
    edit: impl Fn(&mut GgufWriter),
    reference: &str,
    run_name: &str,
    tokens_key: &str,
) {
    let fx = Fixture::new("gemma3");
    let g = Gguf::open(fx.dir.join("f32.gguf")).unwrap();
    let mut w = GgufWriter::from_gguf(&g);
    edit(&mut w);
    let dir = TempDir::new("variant");
    let p = dir.file("v.gguf", &w.to_bytes());
    let exec = ExecConfig {
        threads: 2,
        precision: Precision::Quantized,
        max_context: 0,
        kv_type: onebit_kernels::kv::KvType::F32,
    };
    let (model, _) = load::load(&p, &exec).unwrap();
    let mut st = model.new_state();
    let ours = model
        .forward(&mut st, &fx.tokens(tokens_key), Logits::All)
        .unwrap();
    let m = fx.max_abs_logit(run_name);
    let c = compare(
        &ours,
        &fx.logits(reference),
        fx.n_vocab(),
        &fx.top1_margin(run_name),
    );
    assert!(
        c.max_abs_diff <= 2e-5 * m,
        "max |diff| {} > 2e-5 M",
        c.max_abs_diff
    );
}

#[test]
fn fixture_without_the_swa_base_key_still_matches_llamacpp() {
    // llama.cpp takes 10000 when rope.freq_base_swa is absent, as the fixture states it.
    variant_matches(
        |w| {
            w.remove_kv("gemma3.rope.freq_base_swa");
        },
        "f32.tokens2.exact_gelu.logits.bin",
        "f32.tokens2",
        "tokens2",
    );
}

#[test]
fn fixture_with_the_default_pattern_stated_still_matches_llamacpp() {
    variant_matches(
        |w| {
            w.kv("gemma3.attention.sliding_window_pattern", Value::U32(6));
        },
        "f32.tokens2.exact_gelu.logits.bin",
        "f32.tokens2",
        "tokens2",
    );
}
