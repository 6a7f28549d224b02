//! The `tokenizer.ggml.*` metadata of a GGUF file, read and checked.
//!
//! Everything here is validated before a tokenizer is built from it: array
//! lengths agree, ids are in range, merges are `"a b"` strings, and the
//! defaults llama.cpp applies when a key is absent are applied here, each at
//! one named place.

use std::borrow::Cow;

use onebit_formats::gguf::{describe, Gguf, Value};

use crate::fxhash::{map_with_capacity, FxMap};
use crate::TextError;

pub(crate) const KEY_MODEL: &str = "tokenizer.ggml.model";
pub(crate) const KEY_PRE: &str = "tokenizer.ggml.pre";
pub(crate) const KEY_TOKENS: &str = "tokenizer.ggml.tokens";
pub(crate) const KEY_SCORES: &str = "tokenizer.ggml.scores";
pub(crate) const KEY_TYPES: &str = "tokenizer.ggml.token_type";
pub(crate) const KEY_MERGES: &str = "tokenizer.ggml.merges";
pub(crate) const KEY_BOS: &str = "tokenizer.ggml.bos_token_id";
pub(crate) const KEY_EOS: &str = "tokenizer.ggml.eos_token_id";
pub(crate) const KEY_UNK: &str = "tokenizer.ggml.unknown_token_id";
pub(crate) const KEY_PAD: &str = "tokenizer.ggml.padding_token_id";
pub(crate) const KEY_EOT: &str = "tokenizer.ggml.eot_token_id";
pub(crate) const KEY_EOM: &str = "tokenizer.ggml.eom_token_id";
pub(crate) const KEY_ADD_BOS: &str = "tokenizer.ggml.add_bos_token";
pub(crate) const KEY_ADD_EOS: &str = "tokenizer.ggml.add_eos_token";
pub(crate) const KEY_ADD_SPACE_PREFIX: &str = "tokenizer.ggml.add_space_prefix";

/// llama.cpp's token types (`llama_token_type`).
pub(crate) mod token_type {
    pub const NORMAL: i32 = 1;
    pub const UNKNOWN: i32 = 2;
    pub const CONTROL: i32 = 3;
    pub const USER_DEFINED: i32 = 4;
}

/// What `tokenizer.ggml.model` says the vocabulary is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// `"llama"`: SentencePiece pieces with scores; merges follow from the scores.
    Spm,
    /// `"gpt2"`: byte-level BPE with an explicit merge list.
    ByteBpe,
}

/// The tokenizer metadata of one file, checked for consistency.
pub(crate) struct GgufVocab<'a> {
    pub kind: Kind,
    pub pre: Option<&'a str>,
    /// Token strings by id; an empty string is renamed `[EMPTY_<id>]`, as llama.cpp does.
    pub tokens: Vec<Cow<'a, str>>,
    pub scores: Option<Vec<f32>>,
    pub types: Option<Vec<i32>>,
    /// Token string -> id (the strings are unique).
    pub index: FxMap<&'a str, u32>,
    /// `(left, right)` per merge, in rank order.
    pub merges: Option<Vec<(&'a str, &'a str)>>,
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    pub unk: Option<u32>,
    pub pad: Option<u32>,
    pub eot: Option<u32>,
    pub eom: Option<u32>,
    pub add_bos: Option<bool>,
    pub add_eos: Option<bool>,
    pub add_space_prefix: Option<bool>,
}

impl<'a> GgufVocab<'a> {
    pub fn read(g: &'a Gguf) -> Result<GgufVocab<'a>, TextError> {
        let model = g.str_opt(KEY_MODEL)?;
        let kind = match model {
            None | Some("none") => {
                return Err(TextError::NoVocabulary {
                    path: g.path().to_path_buf(),
                    model: match model {
                        None => "absent".into(),
                        Some(m) => format!("{m:?}"),
                    },
                })
            }
            Some("llama") => Kind::Spm,
            Some("gpt2") => Kind::ByteBpe,
            Some(other) => {
                return Err(g
                    .key_error(
                        KEY_MODEL,
                        format!(
                            "is {other:?}, a tokenizer onebit does not implement (\"llama\" SentencePiece and \"gpt2\" byte-level BPE are)"
                        ),
                    )
                    .into())
            }
        };
        let pre = g.str_opt(KEY_PRE)?;

        let raw_tokens = g.array_opt(KEY_TOKENS)?.ok_or_else(|| {
            g.key_error(
                KEY_TOKENS,
                format!(
                    "is required by tokenizer {model:?} but absent",
                    model = model.unwrap_or_default()
                ),
            )
        })?;
        if raw_tokens.is_empty() {
            return Err(g.key_error(KEY_TOKENS, "is empty").into());
        }
        if raw_tokens.len() > u32::MAX as usize {
            return Err(g
                .key_error(KEY_TOKENS, "holds more tokens than u32 ids can name")
                .into());
        }
        let n = raw_tokens.len();
        let mut tokens = Vec::with_capacity(n);
        let mut index: FxMap<&'a str, u32> = map_with_capacity(n);
        for (i, v) in raw_tokens.iter().enumerate() {
            match v {
                // llama.cpp renames an empty token; nothing can spell it, so it
                // stays out of the index.
                Value::Str(s) if s.is_empty() => tokens.push(Cow::Owned(format!("[EMPTY_{i}]"))),
                Value::Str(s) => {
                    if let Some(first) = index.insert(s.as_str(), i as u32) {
                        return Err(g
                            .key_error(
                                KEY_TOKENS,
                                format!("token {s:?} appears twice, as ids {first} and {i}"),
                            )
                            .into());
                    }
                    tokens.push(Cow::Borrowed(s.as_str()));
                }
                other => {
                    return Err(g
                        .key_error(
                            KEY_TOKENS,
                            format!("element {i} should be a string, found {}", describe(other)),
                        )
                        .into())
                }
            }
        }

        let scores = match g.array_opt(KEY_SCORES)? {
            None => None,
            Some(a) => {
                check_len(g, KEY_SCORES, a.len(), n)?;
                let mut out = Vec::with_capacity(n);
                for (i, v) in a.iter().enumerate() {
                    match v.as_f64() {
                        Some(x) if x.is_finite() || x == f64::NEG_INFINITY => out.push(x as f32),
                        _ => {
                            return Err(g
                                .key_error(
                                    KEY_SCORES,
                                    format!(
                                        "element {i} should be a finite number, found {}",
                                        describe(v)
                                    ),
                                )
                                .into())
                        }
                    }
                }
                Some(out)
            }
        };
        if kind == Kind::Spm && scores.is_none() {
            return Err(g
                .key_error(KEY_SCORES, "is required by a SentencePiece (\"llama\") vocabulary but absent: merges follow from the scores")
                .into());
        }

        let types = match g.array_opt(KEY_TYPES)? {
            None => None,
            Some(a) => {
                check_len(g, KEY_TYPES, a.len(), n)?;
                let mut out = Vec::with_capacity(n);
                for (i, v) in a.iter().enumerate() {
                    match v.as_i64() {
                        Some(x) if (0..=6).contains(&x) => out.push(x as i32),
                        _ => {
                            return Err(g
                                .key_error(
                                    KEY_TYPES,
                                    format!(
                                        "element {i} should be a token type 0..=6, found {}",
                                        describe(v)
                                    ),
                                )
                                .into())
                        }
                    }
                }
                Some(out)
            }
        };

        let merges = match g.array_opt(KEY_MERGES)? {
            None => None,
            Some(a) => {
                let mut out = Vec::with_capacity(a.len());
                for (i, v) in a.iter().enumerate() {
                    let s = v.as_str().ok_or_else(|| {
                        g.key_error(
                            KEY_MERGES,
                            format!(
                                "element {i} should be a string \"left right\", found {}",
                                describe(v)
                            ),
                        )
                    })?;
                    // The separator is the first space after the first byte, as in
                    // llama.cpp: a left half may itself be a space.
                    let first = s.chars().next().map_or(0, char::len_utf8);
                    let split = s[first..].find(' ').map(|p| p + first);
                    match split {
                        Some(p) if p + 1 < s.len() => out.push((&s[..p], &s[p + 1..])),
                        _ => {
                            return Err(g
                                .key_error(KEY_MERGES, format!("element {i} is {s:?}, expected two tokens separated by a space"))
                                .into())
                        }
                    }
                }
                Some(out)
            }
        };
        if kind == Kind::ByteBpe && merges.is_none() {
            return Err(g
                .key_error(
                    KEY_MERGES,
                    "is required by a byte-level BPE (\"gpt2\") vocabulary but absent",
                )
                .into());
        }

        let id = |key: &str| -> Result<Option<u32>, TextError> {
            match g.u64_opt(key)? {
                None => Ok(None),
                Some(x) if (x as usize) < n => Ok(Some(x as u32)),
                Some(x) => Err(g
                    .key_error(
                        key,
                        format!("is {x}, out of range for a vocabulary of {n} tokens"),
                    )
                    .into()),
            }
        };

        Ok(GgufVocab {
            kind,
            pre,
            tokens,
            index,
            scores,
            types,
            merges,
            bos: id(KEY_BOS)?,
            eos: id(KEY_EOS)?,
            unk: id(KEY_UNK)?,
            pad: id(KEY_PAD)?,
            eot: id(KEY_EOT)?,
            eom: id(KEY_EOM)?,
            add_bos: g.bool_opt(KEY_ADD_BOS)?,
            add_eos: g.bool_opt(KEY_ADD_EOS)?,
            add_space_prefix: g.bool_opt(KEY_ADD_SPACE_PREFIX)?,
        })
    }

    pub fn token_type(&self, id: usize) -> i32 {
        self.types.as_ref().map_or(token_type::NORMAL, |t| t[id])
    }
}

fn check_len(g: &Gguf, key: &str, len: usize, n: usize) -> Result<(), TextError> {
    if len != n {
        return Err(g
            .key_error(
                key,
                format!("has {len} entries but `{KEY_TOKENS}` has {n}: one per token expected"),
            )
            .into());
    }
    Ok(())
}
