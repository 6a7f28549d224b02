//! Text: tokenizers, chat templates and detokenization.
//!
//! A [`Tokenizer`] wraps a `tokenizers::Tokenizer` (the HF crate, built C-free)
//! with the facts about BOS/EOS it needs to encode the way the model was
//! trained. It comes from a GGUF file's `tokenizer.ggml.*` metadata
//! ([`Tokenizer::from_gguf`]) or, for packs, from a `tokenizer.json` plus the
//! facts `tokenizer_config.json` states ([`Tokenizer::from_parts`]).

mod build;
pub mod chat;
mod error;
mod fxhash;
mod gguf_vocab;
mod pretok;
mod stream;

pub use chat::{ChatError, ChatLimits, ChatTemplate, TemplateTokens};
pub use error::TextError;
pub use stream::StreamDecoder;

/// Special token ids and whether encoding adds BOS/EOS.
#[derive(Clone, Debug, Default)]
pub struct SpecialTokens {
    pub bos: Option<u32>,
    /// End-of-sequence ids; the first is the one the vocabulary states.
    pub eos: Vec<u32>,
    /// `encode(text, true)` prepends `bos`.
    pub add_bos: bool,
    /// `encode(text, true)` appends `eos[0]`.
    pub add_eos: bool,
    pub unk: Option<u32>,
    pub pad: Option<u32>,
    /// End of turn: `tokenizer.ggml.eot_token_id`, else (as llama.cpp) the first
    /// of `<|eot_id|>`, `<|im_end|>`, `<|end|>`, `<end_of_turn>`, `<|endoftext|>`,
    /// `<EOT>` the vocabulary holds; `None` when that text is one llama.cpp's
    /// harmony rule takes out of the stops (`<|end|>` beside `<|return|>`
    /// and `<|call|>`).
    pub eot: Option<u32>,
    /// End of message (`tokenizer.ggml.eom_token_id`, Llama 3.1 tool calls).
    pub eom: Option<u32>,
    /// Every id llama.cpp ends generation on: eos, eot, eom and the end-of-turn
    /// texts above plus `<|eom_id|>`, `<|return|>` and `<|call|>`, each once,
    /// less `<|end|>` in a vocabulary that has `<|return|>` and `<|call|>`.
    pub eog: Vec<u32>,
    /// The text of `bos`, for chat templates.
    pub bos_token: Option<String>,
    /// The text of `eos[0]`, for chat templates.
    pub eos_token: Option<String>,
}

impl SpecialTokens {
    /// Ids that end generation: `eog` plus any `eos` and `eot` not already in it.
    pub fn stop_ids(&self) -> Vec<u32> {
        let mut out = self.eog.clone();
        for id in self.eos.iter().copied().chain(self.eot).chain(self.eom) {
            if !out.contains(&id) {
                out.push(id);
            }
        }
        out
    }
}

/// A tokenizer and its special-token facts.
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    /// `inner` with special-token parsing off: control-token text is
    /// tokenized as the plain text it spells.
    plain: tokenizers::Tokenizer,
    /// Ids of the special (control) added tokens.
    special_ids: std::collections::HashSet<u32>,
    special: SpecialTokens,
    vocab_size: usize,
}

impl Tokenizer {
    /// From a GGUF file's `tokenizer.ggml.*` metadata. A file whose
    /// `tokenizer.ggml.model` is `"none"` gives [`TextError::NoVocabulary`].
    pub fn from_gguf(g: &onebit_formats::gguf::Gguf) -> Result<Tokenizer, TextError> {
        let v = gguf_vocab::GgufVocab::read(g)?;
        let n = v.tokens.len();
        let (inner, special) = build::build(&v, g.path())?;
        let mut t = Tokenizer::from_parts(inner, special);
        t.vocab_size = t.vocab_size.max(n);
        Ok(t)
    }

    /// From an assembled `tokenizers::Tokenizer` (e.g. a pack's `tokenizer.json`)
    /// and the BOS/EOS facts stated beside it.
    pub fn from_parts(inner: tokenizers::Tokenizer, special: SpecialTokens) -> Tokenizer {
        let model = inner.get_model();
        let added_max = inner
            .get_added_tokens_decoder()
            .keys()
            .max()
            .map_or(0, |&m| m as usize + 1);
        let vocab_size = tokenizers::Model::get_vocab_size(model).max(added_max);
        let special_ids = inner
            .get_added_tokens_decoder()
            .iter()
            .filter(|(_, t)| t.special)
            .map(|(&id, _)| id)
            .collect();
        let mut plain = inner.clone();
        plain.set_encode_special_tokens(true);
        Tokenizer {
            inner,
            plain,
            special_ids,
            special,
            vocab_size,
        }
    }

    /// Ids for `text`. Special tokens written in the text are parsed as such.
    /// With `add_special`, BOS is prepended when the model adds BOS, and EOS
    /// appended when it adds EOS.
    pub fn encode(&self, text: &str, add_special: bool) -> Result<Vec<u32>, TextError> {
        let enc = self
            .inner
            .encode_fast(text, false)
            .map_err(|e| TextError::Encode {
                text_start: text.chars().take(40).collect(),
                what: e.to_string(),
            })?;
        let body = enc.get_ids();
        let mut ids = Vec::with_capacity(body.len() + 2);
        if add_special && self.special.add_bos {
            ids.push(
                self.special
                    .bos
                    .ok_or(TextError::MissingSpecial { which: "BOS" })?,
            );
        }
        ids.extend_from_slice(body);
        if add_special && self.special.add_eos {
            ids.push(
                *self
                    .special
                    .eos
                    .first()
                    .ok_or(TextError::MissingSpecial { which: "EOS" })?,
            );
        }
        Ok(ids)
    }

    /// Ids for `text` with special-token parsing off: text that spells a
    /// control token (`<|im_end|>`) is tokenized as that text, as llama.cpp
    /// does with `parse_special` false. No BOS/EOS is added.
    pub fn encode_plain(&self, text: &str) -> Result<Vec<u32>, TextError> {
        let enc = self
            .plain
            .encode_fast(text, false)
            .map_err(|e| TextError::Encode {
                text_start: text.chars().take(40).collect(),
                what: e.to_string(),
            })?;
        Ok(enc.get_ids().to_vec())
    }

    /// Whether `id` is a special (control) token.
    pub fn is_special(&self, id: u32) -> bool {
        self.special_ids.contains(&id)
    }

    /// Ids for `text` (no BOS/EOS added) where control-token text is parsed
    /// as control tokens outside `plain_spans` (byte ranges, sorted, not
    /// overlapping) and kept as plain text inside them. Everything else is
    /// as [`encode`](Self::encode): the text is cut at the control tokens
    /// found outside the spans, exactly where `encode` cuts it, and each
    /// piece between them is tokenized whole with parsing off.
    pub fn encode_with_plain_spans(
        &self,
        text: &str,
        plain_spans: &[(usize, usize)],
    ) -> Result<Vec<u32>, TextError> {
        let err = |e: tokenizers::Error| TextError::Encode {
            text_start: text.chars().take(40).collect(),
            what: e.to_string(),
        };
        let enc = self.inner.encode(text, false).map_err(err)?;
        let inside = |(a, b): (usize, usize)| plain_spans.iter().any(|&(s, e)| a < e && s < b);
        let specials: Vec<(u32, (usize, usize))> = enc
            .get_ids()
            .iter()
            .zip(enc.get_offsets())
            .filter(|(id, _)| self.special_ids.contains(id))
            .map(|(&id, &o)| (id, o))
            .collect();
        if !specials.iter().any(|&(_, o)| inside(o)) {
            return Ok(enc.get_ids().to_vec());
        }
        let mut ids = Vec::with_capacity(enc.get_ids().len());
        let mut at = 0;
        for (id, (a, b)) in specials.into_iter().filter(|&(_, o)| !inside(o)) {
            if at < a {
                ids.extend(self.encode_plain(&text[at..a])?);
            }
            ids.push(id);
            at = b;
        }
        if at < text.len() {
            ids.extend(self.encode_plain(&text[at..])?);
        }
        Ok(ids)
    }

    /// Text for `ids`; with `skip_special`, special (control) tokens are left out.
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String, TextError> {
        for &id in ids {
            self.check_id(id)?;
        }
        self.inner
            .decode(ids, skip_special)
            .map_err(|e| TextError::Decode {
                what: e.to_string(),
            })
    }

    /// Number of ids: one past the largest id the tokenizer knows.
    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    pub fn special(&self) -> &SpecialTokens {
        &self.special
    }

    pub fn token_to_id(&self, s: &str) -> Option<u32> {
        self.inner.token_to_id(s)
    }

    /// The token's text as the vocabulary stores it (`▁` for spaces in
    /// SentencePiece, GPT-2's byte alphabet in byte-level BPE).
    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    /// The underlying tokenizer, e.g. to write `tokenizer.json`.
    pub fn inner(&self) -> &tokenizers::Tokenizer {
        &self.inner
    }

    pub(crate) fn check_id(&self, id: u32) -> Result<(), TextError> {
        if (id as usize) < self.vocab_size && self.inner.id_to_token(id).is_some() {
            Ok(())
        } else {
            Err(TextError::UnknownId {
                id,
                vocab_size: self.vocab_size,
            })
        }
    }
}
