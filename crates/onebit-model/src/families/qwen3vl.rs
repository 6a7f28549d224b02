//! Qwen3-VL (text side), as llama.cpp's `src/models/qwen3vl.cpp` builds it:
//! the qwen3 body (q/k RMSNorm before RoPE, SiLU-gated FFN) with two rules
//! of its own, both data the forward composes:
//!
//! - Interleaved multi-axis RoPE (ggml's IMROPE, `rope.dimension_sections`,
//!   required): pairs rotate as halves, each by the position component its
//!   sector gives (`RopeSpec::sections`). Text rows sit at (p, p, p, 0), so
//!   a pair on the fourth component does not turn for text; an image's rows
//!   sit on their grid and the text after it continues at p + max(nx, ny)
//!   (mtmd's M-RoPE positions, which an IMROPE text model selects).
//! - Deepstack (`n_deepstack_layers`, default 0): an image row carries that
//!   many features after its embedding, feature k added to layer k's output
//!   (`Body::deepstack`).
//!
//! Invariant: what the graph asserts is refused by name here (the rotary
//! width must be the head dim), and `imrope` reads the sections for every
//! family whose llama.cpp graph uses IMROPE (qwen3vl, qwen3vlmoe, qwen35,
//! qwen35moe). Packs are refused (FastFlowLM's Qwen3-VL pack is not read).

use serde_json::Value as Json;

use super::common::{base, qk_norm};
use super::decls::{keys, Decls};
use super::Family;
use crate::error::Result;
use crate::semantics::*;

pub const FAMILY: Family = Family {
    arch: "qwen3vl",
    hf_names: &["qwen3_vl", "Qwen3VLForConditionalGeneration"],
    semantics,
    pack: None,
    import: None,
};

keys! {
    ROPE_SECTIONS = "rope.dimension_sections", [];
    N_DEEPSTACK = "n_deepstack_layers", [];
}

pub fn semantics(d: &Decls) -> Result<Semantics> {
    let mut s = base(
        d,
        "qwen3vl",
        Sourced::new(
            RopeStyle::Halves,
            "qwen3vl: IMROPE rotates halves (ggml rotate_pairs over n_dims / 2)",
        ),
        &[],
    )?;
    s.qk_norm = qk_norm(
        d,
        true,
        QkNorm::BeforeRope,
        "qwen3vl: q/k RMSNorm before RoPE",
    )?;
    vision_text(d, &mut s, "qwen3vl")?;
    Ok(s)
}

/// What qwen3vl and qwen3vlmoe add to their body: IMROPE over the whole
/// head (the graph asserts n_rot == head dim) and the deepstack count.
pub fn vision_text(d: &Decls, s: &mut Semantics, family: &str) -> Result<()> {
    let n_rot = s.rope_full.value.n_rot;
    if n_rot != s.dims.head_dim_k {
        return Err(d.err(
            super::decls::ROPE_DIMS,
            format!(
                "{family}: the rotary width {n_rot} must be the head dim {} (llama.cpp's graph asserts n_rot == n_embd_head)",
                s.dims.head_dim_k
            ),
        ));
    }
    imrope(d, s, family, true)?;
    let (deepstack, src) = match d.usize_opt(N_DEEPSTACK)? {
        Some(k) => (d.size_checked(N_DEEPSTACK, k)?, d.src(N_DEEPSTACK)),
        None => (
            0,
            format!("{family} default 0 (no {})", d.spelled(N_DEEPSTACK)),
        ),
    };
    s.body = Sourced::new(
        Body {
            deepstack,
            ..s.body.value.clone()
        },
        format!(
            "{}; deepstack after layers 0..{deepstack}: {src} (llama.cpp {family}.cpp: l_out + inp_embd[(il + 1) n_embd..])",
            s.body.source
        ),
    );
    Ok(())
}

/// Reads `rope.dimension_sections` into both RoPE specs' `sections`, as
/// llama.cpp's loader takes it (`get_key_or_arr`: four entries, or one
/// value for all four) and ggml's rope asserts it (t, h, w not all 0; the
/// sum at most the head dim). Absent: refused when `required` (qwen3vl's
/// loader requires it), else single-axis RoPE.
pub fn imrope(d: &Decls, s: &mut Semantics, family: &str, required: bool) -> Result<()> {
    let Some(v) = d.get(ROPE_SECTIONS) else {
        if required {
            return Err(d.err(ROPE_SECTIONS, "is required but absent"));
        }
        return Ok(());
    };
    let bad = |what: String| d.err(ROPE_SECTIONS, format!("{v}: {what}"));
    let secs: Vec<usize> = match &v {
        Json::Array(a) if a.len() == 4 => a
            .iter()
            .map(|x| x.as_u64().map(|x| x as usize))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| bad("entries must be non-negative integers".into()))?,
        Json::Array(a) => return Err(bad(format!("expected 4 entries, found {}", a.len()))),
        x => vec![
            x.as_u64()
                .ok_or_else(|| bad("expected 4 non-negative integers".into()))?
                as usize;
            4
        ],
    };
    let sections = [secs[0], secs[1], secs[2], secs[3]];
    if sections[..3].iter().all(|&x| x == 0) {
        return Err(bad(
            "the t, h and w sections are all 0 (ggml's multi-axis rope asserts one is not)".into(),
        ));
    }
    let head = s.dims.head_dim_k;
    if sections
        .iter()
        .try_fold(0usize, |a, &x| a.checked_add(x))
        .is_none_or(|sum| sum > head)
    {
        return Err(bad(format!(
            "the sections sum to more than the head dim {head} (ggml asserts sect_dims <= ne0)"
        )));
    }
    for r in [&mut s.rope_full, &mut s.rope_sliding] {
        r.value.sections = Some(sections);
        r.source = format!(
            "{}; IMROPE sections {} (llama.cpp {family}: LLAMA_ROPE_TYPE_IMROPE; text (p, p, p, 0) as llm_graph_input_pos; images as mtmd MTMD_POS_TYPE_MROPE)",
            r.source,
            d.src(ROPE_SECTIONS)
        );
    }
    Ok(())
}
