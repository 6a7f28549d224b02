//! LFM2: a hybrid of gated short convolutions and attention. What differs:
//!
//! - Layer kinds from the container: GGUF marks conv layers with a KV head
//!   count of 0 in the per-layer `attention.head_count_kv`; config.json lists
//!   `layer_types` ("conv" / "full_attention").
//! - Short-conv layers: in_proj to B, C, x (in that order); y = C * conv(B * x)
//!   with a causal depthwise kernel of length L (`shortconv.l_cache`, checked
//!   against every layer's conv tensor at load); out_proj.
//! - Attention layers: q/k RMSNorm before RoPE, halves pairing.
//! - The final norm is the tensor GGUF calls `token_embd_norm`.

use onebit_formats::q4nx::Q4Kind;
use serde_json::{json, Value as Json};

use super::common::{base, per_layer_kv_heads, qk_norm};
use super::decls::{self as k, keys, Decls};
use super::{Family, ImportRules, PackNames};
use crate::error::Result;
use crate::semantics::*;

pub const FAMILY: Family = Family {
    arch: "lfm2",
    hf_names: &["lfm2", "Lfm2ForCausalLM"],
    semantics,
    pack: Some(PackNames {
        rows: &[
            ("token_embd.weight", "model.token_embd.weight"),
            ("token_embd_norm.weight", "model.norm.weight"),
            ("output_norm.weight", ""),
            (
                "blk.{i}.shortconv.in_proj.weight",
                "model.layers.{i}.shortconv.in_proj.weight",
            ),
            (
                "blk.{i}.shortconv.out_proj.weight",
                "model.layers.{i}.shortconv.out_proj.weight",
            ),
            (
                "blk.{i}.shortconv.conv.weight",
                "model.layers.{i}.shortconv.conv.weight",
            ),
        ],
    }),
    import: Some(ImportRules {
        model_type: "lfm2",
        hf_arch: "Lfm2ForCausalLM",
        q4_kind: Q4Kind::Symmetric,
        unpermute_qk: false,
        prescale_embedding: false,
        eps_key: "norm_eps",
        config: config_json,
    }),
};

// lfm2's own keys (the shared ones are in decls.rs).
keys! {
    SHORTCONV_L_CACHE = "shortconv.l_cache", ["conv_L_cache"];
    FF_AUTO_ADJUST = "", ["block_auto_adjust_ff_dim"];
    FF_MULTIPLIER = "", ["block_ffn_dim_multiplier"];
    FF_MULTIPLE_OF = "", ["block_multiple_of"];
}

pub fn semantics(d: &Decls) -> Result<Semantics> {
    body(d, "lfm2")
}

/// The LFM2 body (its layer kinds, short-conv length, q/k norm and final
/// norm), as `family` (lfm2, or lfm2moe whose FFNs route) reads it.
pub fn body(d: &Decls, family: &'static str) -> Result<Semantics> {
    let mut s = base(
        d,
        family,
        Sourced::new(RopeStyle::Halves, format!("{family}: neox (halves) RoPE")),
        &[],
    )?;
    let n_layer = s.dims.n_layer;
    let kinds = if let Some(types) = d.get(k::LAYER_TYPES) {
        let list = types
            .as_array()
            .filter(|l| l.len() == n_layer)
            .ok_or_else(|| {
                d.err(
                    k::LAYER_TYPES,
                    format!("expected {n_layer} layer types, found {types}"),
                )
            })?;
        let kinds = list
            .iter()
            .map(|t| match t.as_str() {
                Some("conv") => Ok(LayerKind::ShortConv),
                Some("full_attention") | Some("attention") => Ok(LayerKind::Full),
                _ => Err(d.err(
                    k::LAYER_TYPES,
                    format!("layer type {t} is not one {family} runs"),
                )),
            })
            .collect::<Result<Vec<_>>>()?;
        Sourced::new(kinds, d.src(k::LAYER_TYPES))
    } else if let Some(per_layer) = per_layer_kv_heads(d) {
        let kinds = per_layer
            .iter()
            .map(|&h| {
                if h == 0 {
                    LayerKind::ShortConv
                } else {
                    LayerKind::Full
                }
            })
            .collect();
        Sourced::new(
            kinds,
            format!("{}: 0 marks a short-conv layer", d.src(k::N_HEAD_KV)),
        )
    } else {
        return Err(d.err(
            k::N_HEAD_KV,
            format!("{family} needs per-layer KV head counts (or layer_types) to tell conv layers"),
        ));
    };
    s.layer_kinds = kinds;
    if d.bool_opt(FF_AUTO_ADJUST)? == Some(true) {
        let (n_ff, how) = auto_adjusted_ff(d, s.dims.n_ff)?;
        s.dims.n_ff = n_ff;
        s.activation.source = format!("{}; feed-forward width {how}", s.activation.source);
    }
    let l = d.positive(SHORTCONV_L_CACHE)?;
    s.short_conv = Some(Sourced::new(l, d.src(SHORTCONV_L_CACHE)));
    s.qk_norm = qk_norm(
        d,
        true,
        QkNorm::BeforeRope,
        &format!("{family}: q/k RMSNorm before RoPE"),
    )?;
    s.body = Sourced::new(
        Body {
            output_norm: "token_embd_norm.weight",
            ..Body::default()
        },
        format!("{family}: the final norm is GGUF's token_embd_norm"),
    );
    Ok(s)
}

/// HF LFM2 with `block_auto_adjust_ff_dim`: the declared width is scaled by
/// 2/3, then by `block_ffn_dim_multiplier`, then rounded up to a multiple of
/// `block_multiple_of` (as the SwiGLU sizing rule of Llama does).
fn auto_adjusted_ff(d: &Decls, declared: usize) -> Result<(usize, String)> {
    let mut ff = 2 * declared / 3;
    if let Some(m) = d.f64_opt(FF_MULTIPLIER)? {
        if !(m > 0.0 && m.is_finite()) {
            return Err(d.err(FF_MULTIPLIER, format!("must be positive, found {m}")));
        }
        ff = (m * ff as f64) as usize;
    }
    let of = d.usize_opt(FF_MULTIPLE_OF)?.unwrap_or(1).max(1);
    let ff = ff.div_ceil(of) * of;
    Ok((
        ff,
        format!("{ff} from {declared} by {}", d.src(FF_AUTO_ADJUST)),
    ))
}

/// config.json keys of an lfm2 pack, restating the semantics.
fn config_json(sem: &Semantics, c: &mut Json) {
    c["layer_types"] = json!(sem
        .layer_kinds
        .value
        .iter()
        .map(|k| match k {
            LayerKind::ShortConv => "conv",
            _ => "full_attention",
        })
        .collect::<Vec<_>>());
    c["conv_L_cache"] = json!(sem.short_conv.as_ref().map(|s| s.value));
    c["block_auto_adjust_ff_dim"] = json!(false);
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use serde_json::json;

    use super::*;

    #[test]
    fn auto_adjusted_feed_forward_width() {
        // LFM2-1.2B: block_ff_dim 12288 -> 2/3 = 8192 -> x1.0 -> multiple of 256 = 8192.
        let c = json!({"block_auto_adjust_ff_dim": true, "block_ffn_dim_multiplier": 1.0, "block_multiple_of": 256});
        let none = |_: &str| None;
        let d = Decls::config(&c, Path::new("config.json"), "lfm2", &none);
        assert_eq!(auto_adjusted_ff(&d, 12288).unwrap().0, 8192);
        // 1000 -> 666 -> x1.5 = 999 -> up to a multiple of 256 = 1024
        let c = json!({"block_auto_adjust_ff_dim": true, "block_ffn_dim_multiplier": 1.5, "block_multiple_of": 256});
        let d = Decls::config(&c, Path::new("config.json"), "lfm2", &none);
        assert_eq!(auto_adjusted_ff(&d, 1000).unwrap().0, 1024);
    }
}
