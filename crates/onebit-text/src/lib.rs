//! Text: tokenizers and detokenization.
