//! Model containers and weight encodings.
//!
//! This crate knows bytes: how a GGUF file or a FastFlowLM pack lays out its
//! metadata and tensors, and how each ggml block format encodes numbers. It
//! knows nothing of models, threads or tokens.

pub mod blocks;
pub mod bytes;
pub mod dtype;
pub mod error;
pub mod gguf;
pub mod q4nx;
pub mod safetensors;

pub use bytes::ByteView;
pub use dtype::GgmlType;
pub use error::FormatError;
