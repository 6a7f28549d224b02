//! Constrained decoding: a grammar (a JSON schema, `json_object`, a Lark
//! grammar, or the forced tool call of [`crate::tools`]) decides which tokens
//! may come next, by `llguidance` (the library llama.cpp, vLLM and mistral.rs
//! use). The engine asks a sequence's [`Constraint`] for the allowed set
//! before sampling, masks the rest to -inf (through the sampler's hook), and
//! tells it the chosen token.
//!
//! llguidance works on token bytes: each id's bytes are read from the
//! vocabulary's spelling (GPT-2's byte alphabet for a byte-level BPE; `▁` as
//! a space and `<0xAB>` as one byte for a SentencePiece vocabulary); control
//! tokens are marked as llguidance expects (0xFF then their text), so no
//! grammar text can produce one. The end of a grammar is the model's first
//! stop token.

use std::sync::Arc;

use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{ApproximateTokEnv, TokEnv, TokRxInfo, TokTrie};
use llguidance::{JsonCompileOptions, Matcher, ParserFactory};
use onebit_text::Tokenizer;
use serde_json::Value;

/// What a request constrains its output to.
#[derive(Clone, Debug, PartialEq)]
pub enum Grammar {
    /// A JSON schema (`response_format` json_schema; `{"type":"object"}` for
    /// json_object).
    JsonSchema(Value),
    /// A grammar in llguidance's Lark dialect.
    Lark(String),
}

impl Grammar {
    /// The grammar as llguidance takes it. A JSON schema gets compact
    /// separators (`", "`, `": "`) and no free whitespace unless it sets its
    /// own `x-guidance` options: a small model left free to add whitespace
    /// can add it forever.
    pub fn top_level(&self) -> TopLevelGrammar {
        match self {
            Grammar::JsonSchema(s) => TopLevelGrammar::from_json_schema(with_options(s.clone())),
            Grammar::Lark(g) => TopLevelGrammar::from_lark(g.clone()),
        }
    }
}

/// The schema with onebit's JSON layout options unless it states its own.
pub fn with_options(mut schema: Value) -> Value {
    if let Value::Object(o) = &mut schema {
        if !o.contains_key("x-guidance") {
            o.insert("x-guidance".into(), json_options());
        }
    }
    schema
}

/// The `x-guidance` options onebit gives a schema.
pub fn json_options() -> Value {
    let opts = JsonCompileOptions {
        item_separator: ", ".into(),
        key_separator: ": ".into(),
        whitespace_flexible: false,
        ..JsonCompileOptions::default()
    };
    serde_json::to_value(opts).unwrap_or(Value::Null)
}

/// The per-model part: token bytes, the trie, llguidance's factory. Built
/// once (a few hundred ms for a 256k vocabulary) and shared by every request.
pub struct Constrainer {
    factory: ParserFactory,
    n_tok: usize,
}

/// The bytes each token stands for, as llguidance reads them.
pub fn token_bytes(tok: &Tokenizer) -> Vec<Vec<u8>> {
    let byte_level = matches!(
        tok.inner().get_decoder(),
        Some(tokenizers::DecoderWrapper::ByteLevel(_))
    );
    let unbyte = gpt2_unicode_to_byte();
    (0..tok.vocab_size() as u32)
        .map(|id| {
            let Some(s) = tok.id_to_token(id) else {
                return Vec::new();
            };
            if tok.is_special(id) {
                let mut b = vec![TokTrie::SPECIAL_TOKEN_MARKER];
                b.extend_from_slice(s.as_bytes());
                return b;
            }
            if byte_level {
                let mapped: Option<Vec<u8>> = s.chars().map(&unbyte).collect();
                // A token outside the byte alphabet (an added plain token)
                // stands for its own text.
                return mapped.unwrap_or_else(|| s.into_bytes());
            }
            if let Some(b) = sp_byte_token(&s) {
                return vec![b];
            }
            s.replace('\u{2581}', " ").into_bytes()
        })
        .collect()
}

/// `<0xAB>` → 0xAB: a SentencePiece byte-fallback token.
fn sp_byte_token(s: &str) -> Option<u8> {
    let hex = s.strip_prefix("<0x")?.strip_suffix('>')?;
    (hex.len() == 2)
        .then(|| u8::from_str_radix(hex, 16).ok())
        .flatten()
}

/// GPT-2's byte alphabet read backwards: printable Latin-1 bytes stand for
/// themselves, the other 68 bytes for U+0100.. in byte order.
fn gpt2_unicode_to_byte() -> impl Fn(char) -> Option<u8> {
    let mut table = std::collections::HashMap::with_capacity(256);
    let mut next = 0x100u32;
    for b in 0..=255u8 {
        let c = b as char;
        let printable = matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
        if printable {
            table.insert(c, b);
        } else {
            if let Some(c) = char::from_u32(next) {
                table.insert(c, b);
            }
            next += 1;
        }
    }
    move |c| table.get(&c).copied()
}

impl Constrainer {
    /// `eos`: the token that ends a finished grammar (one the engine stops on).
    pub fn new(tok: &Tokenizer, eos: u32) -> Result<Constrainer, String> {
        let words = token_bytes(tok);
        let n_tok = words.len();
        if eos as usize >= n_tok {
            return Err(format!(
                "the stop token {eos} is outside the vocabulary ({n_tok} tokens)"
            ));
        }
        let info = TokRxInfo::new(n_tok as u32, eos);
        let trie = TokTrie::from(&info, &words);
        let env: TokEnv = Arc::new(ApproximateTokEnv::new(trie));
        let mut factory = ParserFactory::new_simple(&env).map_err(|e| e.to_string())?;
        factory.quiet();
        Ok(Constrainer { factory, n_tok })
    }

    /// Compiles a grammar: the error is llguidance's, naming what it could not
    /// handle (an unsupported schema keyword, a Lark syntax error).
    pub fn compile(&self, g: &Grammar) -> Result<Constraint, String> {
        let parser = self
            .factory
            .create_parser(g.top_level())
            .map_err(|e| e.to_string())?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            return Err(e);
        }
        Ok(Constraint {
            matcher,
            n_tok: self.n_tok,
        })
    }
}

/// One sequence's grammar state.
pub struct Constraint {
    matcher: Matcher,
    n_tok: usize,
}

impl Constraint {
    /// An independent copy (one per choice of an `n > 1` request).
    pub fn fork(&self) -> Constraint {
        Constraint {
            matcher: self.matcher.deep_clone(),
            n_tok: self.n_tok,
        }
    }

    /// Sets every token the grammar does not allow next to -inf.
    pub fn mask(&mut self, logits: &mut [f32]) -> Result<(), String> {
        let allowed = self
            .matcher
            .compute_mask_or_eos()
            .map_err(|e| format!("the output constraint failed: {e}"))?;
        let n = self.n_tok;
        onebit_model::sampler::mask_logits(logits, |i| i < n && allowed.is_allowed(i as u32));
        Ok(())
    }

    /// Advances past the chosen token.
    pub fn commit(&mut self, id: u32) -> Result<(), String> {
        self.matcher
            .consume_token(id)
            .map_err(|e| format!("the output constraint failed: {e}"))
    }

    /// The grammar is complete and allows nothing more.
    pub fn finished(&self) -> bool {
        self.matcher.is_stopped()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpt2_byte_alphabet_read_backwards() {
        let f = gpt2_unicode_to_byte();
        // Printable bytes stand for themselves.
        assert_eq!(f('a'), Some(b'a'));
        assert_eq!(f('\u{A1}'), Some(0xA1));
        // The 68 others, in byte order, from U+0100: 0x00..=0x20 are the
        // first 33 (space is the 33rd, U+0120 'Ġ'; newline U+010A 'Ċ'),
        // 0x7F..=0xA0 the next 34, and 0xAD the last (U+0100 + 67).
        assert_eq!(f('\u{100}'), Some(0x00));
        assert_eq!(f('\u{10A}'), Some(b'\n'));
        assert_eq!(f('\u{120}'), Some(b' '));
        assert_eq!(f('\u{121}'), Some(0x7F));
        assert_eq!(f('\u{143}'), Some(0xAD));
        assert_eq!(f('\u{144}'), None);
    }

    #[test]
    fn sentencepiece_byte_tokens() {
        assert_eq!(sp_byte_token("<0x0A>"), Some(b'\n'));
        assert_eq!(sp_byte_token("<0xFF>"), Some(0xFF));
        assert_eq!(sp_byte_token("<0x0G>"), None);
        assert_eq!(sp_byte_token("<0x0AB>"), None);
        assert_eq!(sp_byte_token("0x0A"), None);
    }

    #[test]
    fn schemas_get_compact_layout_unless_they_choose_their_own() {
        let s = with_options(serde_json::json!({"type": "object"}));
        assert_eq!(s["x-guidance"]["whitespace_flexible"], false);
        assert_eq!(s["x-guidance"]["key_separator"], ": ");
        let own =
            serde_json::json!({"type": "object", "x-guidance": {"whitespace_flexible": true}});
        assert_eq!(with_options(own.clone()), own);
    }
}
