//! Streaming detokenization that never splits a character.
//!
//! Each pushed id is decoded together with the few ids before it, and only the
//! text past what those already produced is returned, once it no longer ends in
//! an incomplete character (U+FFFD from a partial byte sequence). Decoding a
//! window rather than the single id keeps what depends on neighbours right:
//! bytes split over byte-fallback or byte-level tokens, and decoders that strip
//! a leading space.

use crate::{TextError, Tokenizer};

/// Feed ids one at a time; get text as soon as it is complete UTF-8.
///
/// The pieces returned by [`push`](Self::push), followed by [`finish`](Self::finish),
/// concatenate to `decode(all ids, skip_special)`.
pub struct StreamDecoder<'a> {
    tok: &'a Tokenizer,
    skip_special: bool,
    ids: Vec<u32>,
    /// Start of the window decoded for context.
    prefix_start: usize,
    /// Ids before this have been emitted.
    read_start: usize,
    /// Bytes of text emitted so far.
    emitted: String,
}

impl<'a> StreamDecoder<'a> {
    /// Special tokens are decoded as their text (as `decode(ids, false)`).
    pub fn new(t: &'a Tokenizer) -> Self {
        Self::with_skip_special(t, false)
    }

    /// `skip_special` as in [`Tokenizer::decode`].
    pub fn with_skip_special(t: &'a Tokenizer, skip_special: bool) -> Self {
        StreamDecoder {
            tok: t,
            skip_special,
            ids: Vec::new(),
            prefix_start: 0,
            read_start: 0,
            emitted: String::new(),
        }
    }

    /// Adds one id; returns the text it completes (possibly empty).
    pub fn push(&mut self, id: u32) -> Result<String, TextError> {
        self.tok.check_id(id)?;
        self.ids.push(id);
        let prefix = self.tok.decode(
            &self.ids[self.prefix_start..self.read_start],
            self.skip_special,
        )?;
        let full = self
            .tok
            .decode(&self.ids[self.prefix_start..], self.skip_special)?;
        if full.len() > prefix.len() && !full.ends_with('\u{FFFD}') && full.starts_with(&prefix) {
            let piece = full[prefix.len()..].to_string();
            self.prefix_start = self.read_start;
            self.read_start = self.ids.len();
            self.emitted.push_str(&piece);
            Ok(piece)
        } else {
            Ok(String::new())
        }
    }

    /// The text still held back (an incomplete character at the end of the
    /// stream comes out as U+FFFD, as `decode` gives it). Resets the decoder.
    pub fn finish(&mut self) -> String {
        let rest = match self.tok.decode(&self.ids, self.skip_special) {
            Ok(all) if all.starts_with(&self.emitted) => all[self.emitted.len()..].to_string(),
            _ => {
                let prefix = self.tok.decode(
                    &self.ids[self.prefix_start..self.read_start],
                    self.skip_special,
                );
                let full = self
                    .tok
                    .decode(&self.ids[self.prefix_start..], self.skip_special);
                match (prefix, full) {
                    (Ok(p), Ok(f)) if f.starts_with(&p) => f[p.len()..].to_string(),
                    (_, Ok(f)) => f,
                    _ => String::new(),
                }
            }
        };
        self.ids.clear();
        self.prefix_start = 0;
        self.read_start = 0;
        self.emitted.clear();
        rest
    }
}
