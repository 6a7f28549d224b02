//! Llama (and the many models that reuse its architecture, SmolLM2 among them).
//!
//! What differs from the base: only the RoPE pairing, and only in GGUF.
//! llama.cpp's converter permutes the rows of HF's q_proj and k_proj so that
//! RoPE on adjacent pairs (ggml NORM mode) equals HF's rotate-half on the
//! original weights; FastFlowLM's converter permutes them back, so a pack
//! rotates halves.

use super::common::base;
use super::decls::{Container, Decls};
use crate::error::Result;
use crate::semantics::*;

pub fn semantics(d: &Decls) -> Result<Semantics> {
    let style = match d.container {
        Container::Gguf => Sourced::new(
            RopeStyle::Interleaved,
            "llama GGUF: q/k rows permuted by the converter for adjacent-pair RoPE",
        ),
        Container::Pack => Sourced::new(
            RopeStyle::Halves,
            "llama pack: q/k rows un-permuted, HF rotate-half",
        ),
    };
    base(d, "llama", style, &[])
}
