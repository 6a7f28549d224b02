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
//!
//! A grammar is checked when it is compiled, before any token is generated:
//! one that cannot produce its first token (an unsatisfiable schema such as
//! `{"$ref": "#"}`, a Lark rule with no base case, a regex that matches
//! nothing) or that is over llguidance's size and work limits is refused
//! there. llguidance's errors carry no parser state (`verbose_errors` off).
//! A JSON grammar's numbers are bounded in digits ([`MAX_MANTISSA_DIGITS`]):
//! the mask also removes tokens that would write more, so a schema-constrained
//! answer cannot run out of `max_tokens` inside one number.

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
    json_options_with(", ", ": ")
}

/// The `x-guidance` options with these separators (harmony's calls are
/// compact JSON: `,` and `:`).
pub fn json_options_with(item: &str, key: &str) -> Value {
    let opts = JsonCompileOptions {
        item_separator: item.into(),
        key_separator: key.into(),
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
    words: Arc<Vec<Vec<u8>>>,
    /// The tokens whose bytes hold a digit or a `.`: only they can break
    /// the digit bound, so only they are looked at (a few thousand of a
    /// 262k vocabulary).
    numeric: Arc<Vec<u32>>,
}

/// The most digits a JSON number's mantissa may have in a bounded grammar
/// (a lone integer `0` before the point not counted). An IEEE 754 binary64
/// carries 17 significant decimal digits (IEEE 754-2019, 5.12.2: 17 digits
/// round-trip every double), so an 18th says nothing a client's parser keeps.
pub const MAX_MANTISSA_DIGITS: u32 = 17;

/// The most digits of a JSON number's exponent: a double's decimal
/// exponent lies within -324..=308.
pub const MAX_EXPONENT_DIGITS: u32 = 3;

/// Where the output stands in JSON's lexical structure, for the digit
/// bound: inside a string (digits there are text), in a number's mantissa
/// or exponent, or elsewhere.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct JsonLex {
    in_string: bool,
    escaped: bool,
    /// In a number: digits of its mantissa counted so far.
    mantissa: Option<u32>,
    /// In a number's exponent: its digits so far.
    exponent: Option<u32>,
    /// The number's integer part is a lone `0` (not counted).
    zero: bool,
    /// The last byte was the number's `.`: a digit must follow.
    after_point: bool,
}

impl JsonLex {
    /// Advances over one byte; false when the byte breaks the digit bound.
    fn byte(&mut self, b: u8) -> bool {
        if self.in_string {
            match (self.escaped, b) {
                (true, _) => self.escaped = false,
                (false, b'\\') => self.escaped = true,
                (false, b'"') => self.in_string = false,
                _ => {}
            }
            return true;
        }
        self.after_point = false;
        match (b, self.mantissa, self.exponent) {
            (b'0'..=b'9', _, Some(e)) => {
                self.exponent = Some(e + 1);
                e < MAX_EXPONENT_DIGITS
            }
            (b'0'..=b'9', Some(m), None) => {
                self.mantissa = Some(m + 1);
                m < MAX_MANTISSA_DIGITS
            }
            (b'0'..=b'9', None, None) => {
                self.zero = b == b'0';
                self.mantissa = Some(if self.zero { 0 } else { 1 });
                true
            }
            (b'.', Some(m), None) => {
                self.after_point = true;
                m < MAX_MANTISSA_DIGITS
            }
            (b'e' | b'E', Some(_), None) => {
                self.exponent = Some(0);
                true
            }
            (b'+' | b'-', Some(_), Some(0)) => true,
            (b'-', _, _) => {
                *self = JsonLex {
                    mantissa: Some(0),
                    ..JsonLex::default()
                };
                true
            }
            (b'"', _, _) => {
                *self = JsonLex {
                    in_string: true,
                    ..JsonLex::default()
                };
                true
            }
            _ => {
                *self = JsonLex::default();
                true
            }
        }
    }

    /// Whether `bytes` could come next (the state itself is left as it is).
    fn admits(mut self, bytes: &[u8]) -> bool {
        self.token(bytes)
    }

    /// Advances over a token's bytes (a control token's are no JSON);
    /// false when they break the bound, or end on a `.` that no digit may
    /// follow.
    pub fn token(&mut self, bytes: &[u8]) -> bool {
        if bytes.first() == Some(&TokTrie::SPECIAL_TOKEN_MARKER) {
            *self = JsonLex::default();
            return true;
        }
        for &b in bytes {
            if !self.byte(b) {
                return false;
            }
        }
        !(self.after_point && self.mantissa.unwrap_or(0) >= MAX_MANTISSA_DIGITS)
    }
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
        // Errors name what failed, never the parser's state and grammar.
        factory.limits_mut().verbose_errors = false;
        let numeric = (0..n_tok as u32)
            .filter(|&i| {
                let w = &words[i as usize];
                w.first() != Some(&TokTrie::SPECIAL_TOKEN_MARKER)
                    && w.iter().any(|&b| b.is_ascii_digit() || b == b'.')
            })
            .collect();
        Ok(Constrainer {
            factory,
            n_tok,
            words: Arc::new(words),
            numeric: Arc::new(numeric),
        })
    }

    /// Compiles a grammar and computes its first mask: the error is
    /// llguidance's, naming what it could not handle (an unsupported schema
    /// keyword, a Lark syntax error, an unsatisfiable schema, a limit), or
    /// that the grammar allows no first token. A JSON schema's numbers are
    /// bounded in digits ([`Constraint::bound_numbers`]).
    pub fn compile(&self, g: &Grammar) -> Result<Constraint, String> {
        let parser = self
            .factory
            .create_parser(g.top_level())
            .map_err(|e| short(&e.to_string()))?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            return Err(short(&e));
        }
        let mut c = Constraint {
            matcher,
            n_tok: self.n_tok,
            words: self.words.clone(),
            numeric: self.numeric.clone(),
            json: None,
        };
        // The first two steps, on a copy: a grammar that cannot begin, or
        // whose first token already breaks a limit (a 20,000-way
        // alternation puts 20,000 items in the parser's row), fails here,
        // at the request, rather than while decoding. The probe takes the
        // lowest allowed id, in a BPE vocabulary a single byte.
        let mut probe = c.matcher.deep_clone();
        let first = probe
            .compute_mask_or_eos()
            .map_err(|e| short(&e.to_string()))?;
        if first.is_zero() {
            return Err("the grammar allows no output at all (it is unsatisfiable)".into());
        }
        if !probe.is_stopped() {
            if let Some(t) = first.first_bit_set() {
                probe
                    .consume_token(t as u32)
                    .and_then(|()| probe.compute_mask_or_eos().map(|_| ()))
                    .map_err(|e| short(&e.to_string()))?;
            }
        }
        if matches!(g, Grammar::JsonSchema(_)) {
            c = c.bound_numbers();
        }
        Ok(c)
    }
}

/// An llguidance error as a client may see it: its first line, at most 300
/// characters; a bare stop reason (`NoExtensionBias`: no token can come
/// next, an internal name) said in words.
fn short(e: &str) -> String {
    let line = e.lines().next().unwrap_or("").trim();
    if !line.is_empty() && line.chars().all(|c| c.is_ascii_alphanumeric()) {
        return "the grammar admits no token here (it is unsatisfiable from this point on)".into();
    }
    match line.char_indices().nth(300) {
        Some((at, _)) => format!("{}...", &line[..at]),
        None => line.to_string(),
    }
}

/// One sequence's grammar state.
pub struct Constraint {
    matcher: Matcher,
    n_tok: usize,
    words: Arc<Vec<Vec<u8>>>,
    numeric: Arc<Vec<u32>>,
    /// For a JSON grammar: where the output stands, for the digit bound.
    json: Option<JsonLex>,
}

impl Constraint {
    /// An independent copy (one per choice of an `n > 1` request).
    pub fn fork(&self) -> Constraint {
        Constraint {
            matcher: self.matcher.deep_clone(),
            n_tok: self.n_tok,
            words: self.words.clone(),
            numeric: self.numeric.clone(),
            json: self.json,
        }
    }

    /// Bounds the digits of the JSON numbers this grammar writes
    /// ([`MAX_MANTISSA_DIGITS`], [`MAX_EXPONENT_DIGITS`]): for JSON schemas
    /// and the forced tool calls, whose output is JSON outside its markers.
    pub fn bound_numbers(mut self) -> Constraint {
        self.json = Some(JsonLex::default());
        self
    }

    /// Sets every token the grammar does not allow next to -inf. With the
    /// digit bound, tokens that would break it are removed too, unless that
    /// would leave none (a grammar that demands more digits keeps its own).
    pub fn mask(&mut self, logits: &mut [f32]) -> Result<(), String> {
        let mut allowed = self
            .matcher
            .compute_mask_or_eos()
            .map_err(|e| format!("the output constraint failed: {}", short(&e.to_string())))?;
        if let Some(lex) = self.json {
            // A token without a digit or a point never breaks the bound.
            let mut bounded = allowed.clone();
            for &i in self.numeric.iter() {
                if allowed.is_allowed(i) && !lex.admits(&self.words[i as usize]) {
                    bounded.disallow_token(i);
                }
            }
            if !bounded.is_zero() {
                allowed = bounded;
            }
        }
        let n = self.n_tok;
        onebit_model::sampler::mask_logits(logits, |i| i < n && allowed.is_allowed(i as u32));
        Ok(())
    }

    /// Advances past the chosen token.
    pub fn commit(&mut self, id: u32) -> Result<(), String> {
        if let (Some(lex), Some(w)) = (self.json.as_mut(), self.words.get(id as usize)) {
            lex.token(w);
        }
        self.matcher
            .consume_token(id)
            .map_err(|e| format!("the output constraint failed: {}", short(&e.to_string())))
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
