//! Llama (and the many models that reuse its GGUF architecture, SmolLM2 among them).
//!
//! What differs from the base: nothing in the math, only the RoPE pairing.
//! llama.cpp's converter permutes the rows of HF's q_proj and k_proj so that
//! RoPE on adjacent pairs (ggml NORM mode) equals HF's rotate-half on the
//! original weights. GGUF llama weights therefore rotate interleaved pairs.

use onebit_formats::gguf::Gguf;

use super::common::{base, Keys};
use crate::error::Result;
use crate::semantics::*;

pub fn from_gguf(g: &Gguf) -> Result<Semantics> {
    let k = Keys { g, arch: "llama" };
    base(
        &k,
        "llama",
        Sourced::new(
            RopeStyle::Interleaved,
            "llama GGUF: q/k rows permuted by the converter for adjacent-pair RoPE",
        ),
    )
}
