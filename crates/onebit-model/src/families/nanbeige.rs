//! Nanbeige (llama.cpp `nanbeige`, HF `NanbeigeForCausalLM`): the llama
//! body whose stack of layers runs `num_loops` times. What differs from
//! llama, as llama.cpp's `src/models/nanbeige.cpp` runs it:
//!
//! - The stored layers 0..n run `num_loops` times (default 1): pass j runs
//!   layer i with the same weights and its own KV cache.
//! - Between passes (not after the last) the hidden state is replaced by
//!   RMSNorm(x; `output_norm`), unless `skip_loop_final_norm` is true; the
//!   final norm is the same tensor.
//! - RoPE as llama: the converter permutes q/k rows for adjacent-pair RoPE in
//!   GGUF; a pack keeps HF's order and rotates halves.

use onebit_formats::q4nx::Q4Kind;
use serde_json::{json, Value as Json};

use super::common::{base, MAX_LAYERS};
use super::decls::{keys, ContainerKind, Decls};
use super::{Family, ImportRules, PackNames};
use crate::error::Result;
use crate::semantics::*;

pub const FAMILY: Family = Family {
    arch: "nanbeige",
    hf_names: &["nanbeige", "NanbeigeForCausalLM"],
    semantics,
    pack: Some(PackNames { rows: &[] }),
    import: Some(ImportRules {
        model_type: "nanbeige",
        hf_arch: "NanbeigeForCausalLM",
        q4_kind: Q4Kind::Asymmetric,
        unpermute_qk: true,
        prescale_embedding: false,
        eps_key: "rms_norm_eps",
        config: config_json,
    }),
};

// nanbeige's own keys (the shared ones are in decls.rs).
keys! {
    NUM_LOOPS = "num_loops", ["num_loops"];
    SKIP_LOOP_FINAL_NORM = "skip_loop_final_norm", ["skip_loop_final_norm"];
}

pub fn semantics(d: &Decls) -> Result<Semantics> {
    let style = match d.container {
        ContainerKind::Gguf => Sourced::new(
            RopeStyle::Interleaved,
            "nanbeige GGUF: q/k rows permuted by the converter for adjacent-pair RoPE",
        ),
        ContainerKind::Pack => Sourced::new(
            RopeStyle::Halves,
            "nanbeige pack: q/k rows in HF order, rotate-half",
        ),
    };
    let mut s = base(d, "nanbeige", style, &[])?;
    let (loops, loops_src) = match d.usize_opt(NUM_LOOPS)? {
        Some(0) => return Err(d.err(NUM_LOOPS, "must be at least 1, found 0")),
        Some(l) => (l, d.src(NUM_LOOPS)),
        None => (
            1,
            format!("nanbeige default 1 ({} absent)", d.spelled(NUM_LOOPS)),
        ),
    };
    // The state holds one slot per layer per pass: bounded like the layer count.
    if s.dims.n_layer.saturating_mul(loops) > MAX_LAYERS {
        return Err(d.err(
            NUM_LOOPS,
            format!(
                "{loops} passes of {} layers is more than the {MAX_LAYERS} layers onebit accepts",
                s.dims.n_layer
            ),
        ));
    }
    let skip = d.bool_opt(SKIP_LOOP_FINAL_NORM)?.unwrap_or(false);
    let norm_src = match d.get(SKIP_LOOP_FINAL_NORM) {
        Some(_) => d.src(SKIP_LOOP_FINAL_NORM),
        None => format!(
            "output_norm between passes ({} absent)",
            d.spelled(SKIP_LOOP_FINAL_NORM)
        ),
    };
    s.body = Sourced::new(
        Body {
            loops,
            loop_norm: !skip,
            ..Body::default()
        },
        format!("{loops_src}; {norm_src}"),
    );
    Ok(s)
}

/// config.json keys of a nanbeige pack, restating the semantics.
fn config_json(sem: &Semantics, c: &mut Json) {
    let b = &sem.body.value;
    c["num_loops"] = json!(b.loops);
    c["skip_loop_final_norm"] = json!(!b.loop_norm);
}
