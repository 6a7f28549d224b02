use std::path::PathBuf;

use onebit_formats::FormatError;

/// Every error names what is at fault: the file and GGUF key, the token, or the id.
#[derive(Debug, thiserror::Error)]
pub enum TextError {
    /// A `tokenizer.ggml.*` key is absent, mistyped or inconsistent with the others.
    #[error(transparent)]
    Metadata(#[from] FormatError),
    /// `tokenizer.ggml.model` is `"none"` (or absent): the file carries ids only, no text.
    /// Callers that only need ids can skip the tokenizer on this error.
    #[error("{path}: has no vocabulary (`tokenizer.ggml.model` is {model}); it can be run on ids but cannot encode or decode text")]
    NoVocabulary { path: PathBuf, model: String },
    /// The `tokenizers` crate refused the vocabulary we assembled from the metadata.
    #[error("{path}: building the tokenizer from `{key}` failed: {what}")]
    Build {
        path: PathBuf,
        key: String,
        what: String,
    },
    #[error("encoding {text_start:?}: {what}")]
    Encode { text_start: String, what: String },
    #[error("decoding: {what}")]
    Decode { what: String },
    /// An id past the end of the vocabulary.
    #[error("token id {id} is out of range: the vocabulary has {vocab_size} tokens")]
    UnknownId { id: u32, vocab_size: usize },
    /// The model adds BOS (or EOS) but states no id for it.
    #[error("the tokenizer is set to add {which} but has no {which} token id")]
    MissingSpecial { which: &'static str },
}
