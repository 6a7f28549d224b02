//! Gemma 3 (text). What differs from the base, each rule read from the file
//! where the file states it:
//!
//! - Sliding-window layers: every 6th layer is full (HF's `(i + 1) % 6 == 0`)
//!   unless `attention.sliding_window_pattern` says otherwise; no window key
//!   (or 0) means no sliding at all.
//! - Two RoPE bases: sliding layers `rope.freq_base_swa`, 10000 when absent
//!   (not the model's base), unscaled; full layers `rope.freq_base` with the
//!   linear scaling factor. Halves (neox) pairing.
//! - q/k RMSNorm before RoPE; sandwich norms (post-attention, post-feed-forward).
//! - Norms: HF computes `x/rms * (1 + w)`; the GGUF converter stores `1 + w`,
//!   so the plain form applies to what the file holds.
//! - Embeddings times sqrt(n_embd); attention scale 1/sqrt(key_length);
//!   GELU(tanh)-gated MLP; final logit soft-capping when stated.

use onebit_formats::gguf::{describe, Gguf, Value};

use super::common::{base, Keys};
use crate::error::Result;
use crate::semantics::*;

/// HF Gemma3's default sliding pattern and its sliding layers' default base.
const DEFAULT_PATTERN: usize = 6;
const DEFAULT_SWA_BASE: f64 = 10000.0;

pub fn from_gguf(g: &Gguf) -> Result<Semantics> {
    let k = Keys { g, arch: "gemma3" };
    let mut s = base(
        &k,
        "gemma3",
        Sourced::new(RopeStyle::Halves, "gemma3: neox (halves) RoPE"),
    )?;
    let n_layer = s.dims.n_layer;

    let window = k.usize_opt("attention.sliding_window")?.filter(|&w| w > 0);
    s.sliding_window = Sourced::new(
        window,
        if window.is_some() {
            k.src("attention.sliding_window")
        } else {
            "no attention.sliding_window key (or 0): no sliding".into()
        },
    );
    if window.is_some() {
        s.layer_kinds = sliding_kinds(&k, n_layer)?;
    }

    // Sliding layers: their own base, unscaled.
    let mut sliding = s.rope_full.value.clone();
    sliding.scaling = RopeScaling::None;
    let swa_src = match k.f64_opt("rope.freq_base_swa")? {
        Some(b) if b > 0.0 => {
            sliding.base = b;
            k.src("rope.freq_base_swa")
        }
        Some(b) => {
            return Err(g
                .key_error(
                    &k.key("rope.freq_base_swa"),
                    format!("must be positive, found {b}"),
                )
                .into());
        }
        None => {
            sliding.base = DEFAULT_SWA_BASE;
            format!("gemma3 default {DEFAULT_SWA_BASE} (rope.freq_base_swa absent; HF's rope_local_base_freq default)")
        }
    };
    s.rope_sliding = Sourced::new(sliding, format!("{swa_src}; unscaled"));

    s.qk_norm = Sourced::new(QkNorm::BeforeRope, "gemma3: q/k RMSNorm before RoPE");
    s.norm_form = Sourced::new(
        NormForm::Plain,
        "gemma3 GGUF: norms stored as 1 + w (converter adds the 1)",
    );
    s.sandwich_norms = Sourced::new(true, "gemma3: post-attention and post-feed-forward norms");
    s.embed_scale = Sourced::new(
        Some((s.dims.n_embd as f32).sqrt()),
        format!("gemma3: sqrt(embedding_length {})", s.dims.n_embd),
    );
    s.activation = Sourced::new(Activation::GeluTanhGate, "gemma3: gelu_pytorch_tanh gate");
    if let Some(cap) = k.f64_opt("final_logit_softcapping")? {
        s.final_softcap = Sourced::new(Some(cap as f32), k.src("final_logit_softcapping"));
    }
    if let Some(cap) = k.f64_opt("attn_logit_softcapping")? {
        s.attn_softcap = Sourced::new(Some(cap as f32), k.src("attn_logit_softcapping"));
    }
    Ok(s)
}

/// Which layers slide: the pattern key (a period, or one flag per layer), else
/// HF's default period 6.
fn sliding_kinds(k: &Keys, n_layer: usize) -> Result<Sourced<Vec<LayerKind>>> {
    let key = k.key("attention.sliding_window_pattern");
    let by_period = |p: usize| -> Vec<LayerKind> {
        (0..n_layer)
            .map(|i| {
                if (i + 1) % p == 0 {
                    LayerKind::Full
                } else {
                    LayerKind::Sliding
                }
            })
            .collect()
    };
    match k.g.get(&key) {
        None => Ok(Sourced::new(
            by_period(DEFAULT_PATTERN),
            format!(
                "gemma3 default: layer i full when (i + 1) % {DEFAULT_PATTERN} == 0 ({key} absent)"
            ),
        )),
        Some(Value::Array(flags)) => {
            if flags.len() != n_layer {
                return Err(k
                    .g
                    .key_error(
                        &key,
                        format!("has {} entries for {n_layer} layers", flags.len()),
                    )
                    .into());
            }
            let kinds = flags
                .iter()
                .map(
                    |f| match f.as_bool().or_else(|| f.as_i64().map(|v| v != 0)) {
                        Some(true) => Ok(LayerKind::Sliding),
                        Some(false) => Ok(LayerKind::Full),
                        None => Err(k.g.key_error(
                            &key,
                            format!("entries must be bools or integers, found {}", describe(f)),
                        )),
                    },
                )
                .collect::<std::result::Result<Vec<_>, _>>()?;
            Ok(Sourced::new(
                kinds,
                format!("GGUF {key} (per-layer flags, true = sliding)"),
            ))
        }
        Some(v) => match v.as_i64() {
            Some(p) if p > 0 => Ok(Sourced::new(
                by_period(p as usize),
                format!("GGUF {key} = {p}: layer i full when (i + 1) % {p} == 0"),
            )),
            _ => Err(k
                .g
                .key_error(
                    &key,
                    format!(
                        "expected a positive period or per-layer flags, found {}",
                        describe(v)
                    ),
                )
                .into()),
        },
    }
}
