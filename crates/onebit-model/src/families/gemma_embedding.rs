//! EmbeddingGemma (llama.cpp arch `gemma-embedding`,
//! `src/models/gemma-embedding.cpp`): Gemma 3 layers read by the gemma3 rules
//! (sliding pattern, two RoPE bases, q/k norm, sandwich norms, sqrt(n_embd)
//! embedding scale, GELU(tanh) gate), with what differs:
//!
//! - Attention is bidirectional (`causal_attn = false`); a sliding layer sees
//!   the positions within `sliding_window / 2` on either side
//!   (`LLAMA_SWA_TYPE_SYMMETRIC`).
//! - Attention scale 1/sqrt(head dim) whatever else is stated (llama.cpp
//!   sets `f_attention_scale` so).
//! - The pooled embedding (GGUF `pooling_type`, mean for this model) goes
//!   through sentence-transformers' dense layers when the file has them
//!   (`dense_2.weight` then `dense_3.weight`, no bias, no activation:
//!   `build_dense_out`), and their sizes must meet n_embd at both ends.
//! - It has no generative use: the mask makes `forward` refuse a sequence
//!   that continues, and the servers refuse generation by name.

use super::decls::{keys, Decls};
use super::Family;
use crate::error::Result;
use crate::semantics::*;

pub const FAMILY: Family = Family {
    arch: "gemma-embedding",
    hf_names: &[],
    semantics,
    pack: None,
    import: None,
};

keys! {
    DENSE_2_FEAT_IN = "dense_2_feat_in", [];
    DENSE_2_FEAT_OUT = "dense_2_feat_out", [];
    DENSE_3_FEAT_IN = "dense_3_feat_in", [];
    DENSE_3_FEAT_OUT = "dense_3_feat_out", [];
}

pub fn semantics(d: &Decls) -> Result<Semantics> {
    let mut s = super::gemma3::semantics(d)?;
    s.family = "gemma-embedding";
    let n_embd = s.dims.n_embd;
    let hd = s.dims.head_dim_k;
    s.attn_scale = Sourced::new(
        1.0 / (hd as f32).sqrt(),
        format!("gemma-embedding: 1/sqrt(head dim {hd}) (llama.cpp f_attention_scale)"),
    );
    s.mask = Sourced::new(
        Mask::Bidirectional,
        "gemma-embedding: bidirectional (llama.cpp causal_attn = false, symmetric sliding window)",
    );
    s.final_softcap = Sourced::new(None, "gemma-embedding: no logits");

    // The dense layers, as llama.cpp loads them: each when its tensor exists.
    let mut head = Vec::new();
    let mut width = n_embd;
    for (name, key_in, key_out) in [
        ("dense_2.weight", DENSE_2_FEAT_IN, DENSE_2_FEAT_OUT),
        ("dense_3.weight", DENSE_3_FEAT_IN, DENSE_3_FEAT_OUT),
    ] {
        let Some(dims) = d.tensor_dims(name) else {
            continue;
        };
        let [cols, rows] = dims[..] else {
            return Err(d.err(
                key_out,
                format!("tensor {name} has shape {dims:?}, expected 2 dimensions"),
            ));
        };
        let (rows, cols) = (rows as usize, cols as usize);
        if cols != width {
            return Err(d.err(
                key_in,
                format!("tensor {name} takes {cols} inputs where the pooled embedding has {width}"),
            ));
        }
        for (key, want) in [(key_in, cols), (key_out, rows)] {
            if let Some(v) = d.usize_opt(key)? {
                if v != want {
                    return Err(d.err(key, format!("is {v} but tensor {name} says {want}")));
                }
            }
        }
        head.push((name.to_string(), rows, cols));
        width = rows;
    }
    if width != n_embd {
        return Err(d.err(
            DENSE_3_FEAT_OUT,
            format!("the dense layers end at width {width}, not n_embd {n_embd} (llama.cpp requires dense_3_feat_out == n_embd)"),
        ));
    }
    let src = if head.is_empty() {
        "gemma-embedding: no dense_2/dense_3 tensors (converted without --sentence-transformers-dense-modules)".to_string()
    } else {
        "gemma-embedding: sentence-transformers dense layers present (llama.cpp build_dense_out)"
            .to_string()
    };
    s.pooled_head = Sourced::new(head, src);
    Ok(s)
}
