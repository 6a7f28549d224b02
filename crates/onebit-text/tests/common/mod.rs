//! GGUF files made in memory for tokenizer tests.

#![allow(dead_code)]

use onebit_formats::gguf::writer::GgufWriter;
use onebit_formats::gguf::{Gguf, Value};
use onebit_text::{TextError, Tokenizer};

pub fn strs(items: &[&str]) -> Value {
    Value::Array(items.iter().map(|s| Value::Str(s.to_string())).collect())
}
pub fn f32s(items: &[f32]) -> Value {
    Value::Array(items.iter().map(|&x| Value::F32(x)).collect())
}
pub fn i32s(items: &[i32]) -> Value {
    Value::Array(items.iter().map(|&x| Value::I32(x)).collect())
}

/// A GGUF (no tensors) holding the kvs, opened from memory.
pub fn open(name: &str, kvs: &[(&str, Value)]) -> Gguf {
    let mut w = GgufWriter::new();
    w.kv("general.architecture", Value::Str("llama".into()));
    for (k, v) in kvs {
        w.kv(k, v.clone());
    }
    // In memory: tests run in parallel and build the same vocabularies, and a
    // shared temp file rewritten under another test's map would fault.
    Gguf::from_bytes(format!("{name}.gguf"), &w.to_bytes()).unwrap()
}

pub fn build(name: &str, kvs: &[(&str, Value)]) -> Result<Tokenizer, TextError> {
    Tokenizer::from_gguf(&open(name, kvs))
}

/// A small SentencePiece vocabulary: pieces, scores, types; byte tokens for
/// every byte so any text encodes.
pub fn spm_kvs(add_space_prefix: bool) -> Vec<(&'static str, Value)> {
    let mut tokens: Vec<String> = vec![
        "<unk>".into(),
        "<s>".into(),
        "</s>".into(),
        "<|turn|>".into(),
        "\n".into(),
    ];
    let mut types = vec![2, 3, 3, 3, 4];
    let mut scores = vec![0.0, 0.0, 0.0, 0.0, 0.0];
    for b in 0..=255u32 {
        tokens.push(format!("<0x{b:02X}>"));
        types.push(6);
        scores.push(0.0);
    }
    // Pieces, best score first.
    for (i, p) in ["▁", "a", "b", "c", "ab", "▁ab", "▁c", "é", "bc", "▁abc"]
        .iter()
        .enumerate()
    {
        tokens.push(p.to_string());
        types.push(1);
        scores.push(-(i as f32));
    }
    let tok_refs: Vec<&str> = tokens.iter().map(|s| s.as_str()).collect();
    vec![
        ("tokenizer.ggml.model", Value::Str("llama".into())),
        ("tokenizer.ggml.tokens", strs(&tok_refs)),
        ("tokenizer.ggml.scores", f32s(&scores)),
        ("tokenizer.ggml.token_type", i32s(&types)),
        ("tokenizer.ggml.bos_token_id", Value::U32(1)),
        ("tokenizer.ggml.eos_token_id", Value::U32(2)),
        ("tokenizer.ggml.unknown_token_id", Value::U32(0)),
        (
            "tokenizer.ggml.add_space_prefix",
            Value::Bool(add_space_prefix),
        ),
    ]
}

/// A small byte-level BPE vocabulary.
pub fn bpe_kvs() -> Vec<(&'static str, Value)> {
    // GPT-2 byte spelling: 'Ġ' is a space.
    let tokens = [
        "<|end|>", "h", "i", "Ġ", "Ġh", "hi", "Ġhi", "!", "Ã", "©", "Ã©",
    ];
    let types = [3, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1];
    vec![
        ("tokenizer.ggml.model", Value::Str("gpt2".into())),
        ("tokenizer.ggml.pre", Value::Str("gpt-2".into())),
        ("tokenizer.ggml.tokens", strs(&tokens)),
        ("tokenizer.ggml.token_type", i32s(&types)),
        (
            "tokenizer.ggml.merges",
            strs(&["h i", "Ġ h", "Ġh i", "Ã ©"]),
        ),
        ("tokenizer.ggml.eos_token_id", Value::U32(0)),
    ]
}

/// `base` with `key` replaced (or added), or removed when `value` is None.
pub fn with(
    base: &[(&'static str, Value)],
    key: &'static str,
    value: Option<Value>,
) -> Vec<(&'static str, Value)> {
    let mut out: Vec<_> = base.iter().filter(|(k, _)| *k != key).cloned().collect();
    if let Some(v) = value {
        out.push((key, v));
    }
    out
}
