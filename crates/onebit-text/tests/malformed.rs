//! Bad tokenizer metadata is an error that names the key, never a panic.

mod common;

use common::*;
use onebit_formats::gguf::Value;
use onebit_text::TextError;

#[track_caller]
fn err_of(name: &str, kvs: &[(&str, Value)]) -> (TextError, String) {
    match build(name, kvs) {
        Ok(_) => panic!("{name}: expected an error"),
        Err(e) => {
            let msg = e.to_string();
            (e, msg)
        }
    }
}

#[track_caller]
fn assert_names(name: &str, kvs: &[(&str, Value)], needles: &[&str]) {
    let (_, msg) = err_of(name, kvs);
    for n in needles {
        assert!(
            msg.contains(n),
            "{name}: error {msg:?} should mention {n:?}"
        );
    }
}

#[test]
fn model_none_has_no_vocabulary() {
    let kvs = [("tokenizer.ggml.model", Value::Str("none".into()))];
    let (e, msg) = err_of("none", &kvs);
    assert!(matches!(e, TextError::NoVocabulary { .. }), "{e:?}");
    assert!(msg.contains("has no vocabulary"), "{msg}");
    let (e, _) = err_of("absent", &[]);
    assert!(matches!(e, TextError::NoVocabulary { .. }), "{e:?}");
}

#[test]
fn unknown_model_kinds_are_refused_by_name() {
    for kind in ["bert", "rwkv", "t5", "plamo2"] {
        let kvs = with(
            &spm_kvs(false),
            "tokenizer.ggml.model",
            Some(Value::Str(kind.into())),
        );
        assert_names(kind, &kvs, &["tokenizer.ggml.model", kind]);
    }
    let kvs = with(&spm_kvs(false), "tokenizer.ggml.model", Some(Value::U32(1)));
    assert_names(
        "model-not-string",
        &kvs,
        &["tokenizer.ggml.model", "expected a string"],
    );
}

#[test]
fn tokens_missing_or_mistyped() {
    let base = spm_kvs(false);
    assert_names(
        "no-tokens",
        &with(&base, "tokenizer.ggml.tokens", None),
        &["tokenizer.ggml.tokens", "absent"],
    );
    assert_names(
        "tokens-not-array",
        &with(&base, "tokenizer.ggml.tokens", Some(Value::Str("a".into()))),
        &["tokenizer.ggml.tokens", "expected an array"],
    );
    assert_names(
        "tokens-not-strings",
        &with(&base, "tokenizer.ggml.tokens", Some(i32s(&[1, 2, 3]))),
        &["tokenizer.ggml.tokens", "element 0", "string"],
    );
    assert_names(
        "tokens-empty",
        &with(&base, "tokenizer.ggml.tokens", Some(Value::Array(vec![]))),
        &["tokenizer.ggml.tokens", "empty"],
    );
    let dup = [
        ("tokenizer.ggml.model", Value::Str("llama".into())),
        ("tokenizer.ggml.tokens", strs(&["a", "b", "a"])),
        ("tokenizer.ggml.scores", f32s(&[0.0, 0.0, 0.0])),
    ];
    assert_names(
        "tokens-dup",
        &dup,
        &["tokenizer.ggml.tokens", "\"a\"", "twice", "0", "2"],
    );
}

#[test]
fn per_token_arrays_must_match_the_token_count() {
    let base = spm_kvs(false);
    assert_names(
        "scores-short",
        &with(&base, "tokenizer.ggml.scores", Some(f32s(&[0.0, 1.0]))),
        &["tokenizer.ggml.scores", "2 entries"],
    );
    assert_names(
        "scores-absent",
        &with(&base, "tokenizer.ggml.scores", None),
        &["tokenizer.ggml.scores", "required"],
    );
    assert_names(
        "scores-strings",
        &with(&base, "tokenizer.ggml.scores", Some(strs(&["x"; 271]))),
        &["tokenizer.ggml.scores", "element 0", "number"],
    );
    assert_names(
        "types-short",
        &with(&base, "tokenizer.ggml.token_type", Some(i32s(&[1]))),
        &["tokenizer.ggml.token_type", "1 entries"],
    );
    assert_names(
        "types-bad",
        &with(&base, "tokenizer.ggml.token_type", Some(i32s(&[9; 271]))),
        &["tokenizer.ggml.token_type", "element 0", "9"],
    );
}

#[test]
fn merges_must_be_pairs_of_known_tokens() {
    let base = bpe_kvs();
    assert_names(
        "merges-absent",
        &with(&base, "tokenizer.ggml.merges", None),
        &["tokenizer.ggml.merges", "required"],
    );
    assert_names(
        "merges-no-space",
        &with(&base, "tokenizer.ggml.merges", Some(strs(&["h i", "hi"]))),
        &["tokenizer.ggml.merges", "element 1", "\"hi\""],
    );
    assert_names(
        "merges-trailing-space",
        &with(&base, "tokenizer.ggml.merges", Some(strs(&["h "]))),
        &["tokenizer.ggml.merges", "element 0"],
    );
    assert_names(
        "merges-not-strings",
        &with(&base, "tokenizer.ggml.merges", Some(i32s(&[1]))),
        &["tokenizer.ggml.merges", "element 0", "string"],
    );
    assert_names(
        "merges-unknown",
        &with(&base, "tokenizer.ggml.merges", Some(strs(&["h i", "x y"]))),
        &["tokenizer.ggml.merges", "merge 1", "\"x\""],
    );
    assert_names(
        "merges-result-unknown",
        &with(&base, "tokenizer.ggml.merges", Some(strs(&["i h"]))),
        &["tokenizer.ggml.merges", "\"ih\""],
    );
}

#[test]
fn special_ids_must_be_in_range() {
    for key in [
        "tokenizer.ggml.bos_token_id",
        "tokenizer.ggml.eos_token_id",
        "tokenizer.ggml.unknown_token_id",
        "tokenizer.ggml.padding_token_id",
        "tokenizer.ggml.eot_token_id",
        "tokenizer.ggml.eom_token_id",
    ] {
        let kvs = with(&spm_kvs(false), key, Some(Value::U32(100_000)));
        assert_names(key, &kvs, &[key, "100000", "out of range"]);
        let kvs = with(&spm_kvs(false), key, Some(Value::I32(-1)));
        assert_names(key, &kvs, &[key, "non-negative"]);
    }
    let kvs = with(
        &spm_kvs(false),
        "tokenizer.ggml.add_bos_token",
        Some(Value::U8(1)),
    );
    assert_names(
        "add-bos-u8",
        &kvs,
        &["tokenizer.ggml.add_bos_token", "bool"],
    );
}

#[test]
fn adding_bos_without_a_bos_id_is_refused() {
    let kvs = with(&spm_kvs(false), "tokenizer.ggml.bos_token_id", None);
    let (e, _) = err_of("no-bos", &kvs);
    assert!(
        matches!(e, TextError::MissingSpecial { which: "BOS" }),
        "{e:?}"
    );
    // Stating that BOS is not added makes the missing id fine.
    let kvs = with(
        &kvs,
        "tokenizer.ggml.add_bos_token",
        Some(Value::Bool(false)),
    );
    build("no-bos-ok", &kvs).unwrap();
}

#[test]
fn unknown_pre_tokenizer_is_refused_by_name() {
    let kvs = with(
        &bpe_kvs(),
        "tokenizer.ggml.pre",
        Some(Value::Str("my-new-model".into())),
    );
    assert_names(
        "pre-unknown",
        &kvs,
        &["tokenizer.ggml.pre", "my-new-model", "smollm"],
    );
    // Absent means llama.cpp's "default".
    build("pre-absent", &with(&bpe_kvs(), "tokenizer.ggml.pre", None)).unwrap();
}
