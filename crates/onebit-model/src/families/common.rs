//! What every family declares the same way (sizes, RoPE base and scaling, norm
//! epsilon), read once into a base `Semantics` that a family file adjusts.

use super::decls::{self as k, Decls, Key};
use crate::error::Result;
use crate::semantics::*;

/// Most layers a model may declare (the deepest released models have ~160).
pub const MAX_LAYERS: usize = 4096;

/// The base semantics: dimensions, every layer full attention, RoPE from the
/// declared base / rotary width / scaling, plain norms, SiLU gate, tied output
/// when the container has no `output.weight`.
///
/// `own_scaling` lists the RoPE scaling types the family reads itself (e.g.
/// Hunyuan's `dynamic` with alpha); any other type but linear is refused.
pub fn base(
    d: &Decls,
    family: &'static str,
    rope_style: Sourced<RopeStyle>,
    own_scaling: &[&str],
) -> Result<Semantics> {
    base_kv(d, family, rope_style, own_scaling, None)
}

/// [`base`], for a family whose per-layer `attention.head_count_kv` may
/// differ by layer kind (Gemma 4, llama.cpp's `n_head_kv(il)`): with
/// `kinds`, the full layers' entries give `dims.n_head_kv` and the sliding
/// layers' entries `kv_heads_sliding` (when they differ); the entries of
/// one kind must agree. Without `kinds`, as [`base`]: the attention layers
/// must all agree.
pub fn base_kv(
    d: &Decls,
    family: &'static str,
    rope_style: Sourced<RopeStyle>,
    own_scaling: &[&str],
    kinds: Option<&[LayerKind]>,
) -> Result<Semantics> {
    let n_embd = d.positive(k::N_EMBD)?;
    let n_layer = layer_count(d)?;
    let n_head = d.positive(k::N_HEAD)?;
    let (n_head_kv, kv_heads_sliding) = match kinds {
        Some(kinds) => kv_heads_per_kind(d, n_head, kinds)?,
        None => (head_count_kv(d, n_head, n_layer)?, None),
    };
    let (head_dim_k, head_dim_src) = match d.usize_opt(k::HEAD_DIM_K)? {
        Some(v) if v > 0 => (v, d.src(k::HEAD_DIM_K)),
        _ if n_embd % n_head == 0 => (
            n_embd / n_head,
            format!(
                "{} / {} (no head dim declared)",
                d.spelled(k::N_EMBD),
                d.spelled(k::N_HEAD)
            ),
        ),
        _ => {
            return Err(d.err(
                k::HEAD_DIM_K,
                "absent, and the embedding width is not a multiple of the head count",
            ))
        }
    };
    let head_dim_k = d.size_checked(k::HEAD_DIM_K, head_dim_k)?;
    let head_dim_v = d
        .usize_opt(k::HEAD_DIM_V)?
        .filter(|&v| v > 0)
        .unwrap_or(head_dim_k);
    let head_dim_v = d.size_checked(k::HEAD_DIM_V, head_dim_v)?;
    let n_ff = d.positive(k::N_FF)?;
    // The vocabulary: declared, else the embedding's row count.
    let n_vocab = match d.usize_opt(k::N_VOCAB)? {
        Some(v) if v > 0 => v,
        _ => match d.tensor_dims("token_embd.weight").as_deref() {
            Some([_, rows]) => *rows as usize,
            _ => {
                return Err(d.err(
                    k::N_VOCAB,
                    "absent, and there is no 2-D token embedding to count",
                ))
            }
        },
    };
    let n_vocab = d.size_checked(k::N_VOCAB, n_vocab)?;
    let n_ctx_train = d.usize_opt(k::N_CTX_TRAIN)?.unwrap_or(0);

    let eps = d
        .f64_opt(k::NORM_EPS)?
        .ok_or_else(|| d.err(k::NORM_EPS, "is required but absent"))?;
    if !(eps > 0.0 && eps < 1.0) {
        return Err(d.err(k::NORM_EPS, format!("must be in (0, 1), found {eps}")));
    }

    let (base_freq, base_src) = match d.f64_opt(k::ROPE_BASE)? {
        Some(b) if b > 0.0 => (b, d.src(k::ROPE_BASE)),
        Some(b) => return Err(d.err(k::ROPE_BASE, format!("must be positive, found {b}"))),
        None => (
            10000.0,
            format!("default 10000 ({} absent)", d.spelled(k::ROPE_BASE)),
        ),
    };
    let declared_rot = d.usize_opt(k::ROPE_DIMS)?;
    let n_rot = declared_rot.unwrap_or(head_dim_k);
    if n_rot > head_dim_k || n_rot % 2 != 0 {
        // Not declared: the rotary width is the head dim, which is at fault.
        return Err(d.err(
            if declared_rot.is_some() {
                k::ROPE_DIMS
            } else {
                k::HEAD_DIM_K
            },
            format!("the rotary width {n_rot} must be even and at most the head dim {head_dim_k}"),
        ));
    }
    let scaling = rope_scaling(d, own_scaling)?;
    let freq_factors = d
        .has_tensor("rope_freqs.weight")
        .then(|| "rope_freqs.weight".to_string());
    let rope = RopeSpec {
        base: base_freq,
        style: rope_style.value,
        n_rot,
        scaling,
        freq_factors,
        attn_factor: 1.0,
        long_factors: None,
        proportional: None,
        sections: None,
    };
    let rope_src = format!("{base_src}; style: {}", rope_style.source);

    let tied = !d.has_tensor("output.weight");
    Ok(Semantics {
        family,
        dims: Dims {
            n_embd,
            n_layer,
            n_head,
            n_head_kv,
            head_dim_k,
            head_dim_v,
            n_ff,
            n_vocab,
            n_ctx_train,
        },
        layer_kinds: Sourced::new(
            vec![LayerKind::Full; n_layer],
            format!("{family}: every layer full attention"),
        ),
        sliding_window: Sourced::new(None, format!("{family}: no sliding window")),
        rope_full: Sourced::new(rope.clone(), rope_src.clone()),
        rope_sliding: Sourced::new(rope, rope_src),
        attn_scale: Sourced::new(
            1.0 / (head_dim_k as f32).sqrt(),
            format!("1/sqrt(head dim {head_dim_k}) from {head_dim_src}"),
        ),
        attn_softcap: Sourced::new(None, format!("{family}: none")),
        final_softcap: Sourced::new(None, format!("{family}: none")),
        // A stated use_qk_norm decides for every family; the family file
        // replaces this with its own default where it normalises q/k.
        qk_norm: qk_norm(
            d,
            false,
            QkNorm::BeforeRope,
            &format!("{family}: no q/k norm"),
        )?,
        norm_eps: Sourced::new(eps as f32, d.src(k::NORM_EPS)),
        norm_form: Sourced::new(NormForm::Plain, format!("{family}: RMSNorm x/rms * w")),
        body: Sourced::new(
            Body::default(),
            format!("{family}: pre-norm layers, one pass"),
        ),
        embed_scale: Sourced::new(None, format!("{family}: none")),
        activation: Sourced::new(Activation::SiluGate, format!("{family}: SiLU-gated MLP")),
        tied_output: Sourced::new(
            tied,
            if tied {
                "no output weight tensor: the embedding is the output matrix"
            } else {
                "output weight tensor present"
            },
        ),
        attn_bias: Sourced::new(false, format!("{family}: none")),
        attn_out_bias: Sourced::new(false, format!("{family}: none")),
        attn_sinks: Sourced::new(None, format!("{family}: none")),
        attn_output_gate: Sourced::new(false, format!("{family}: none")),
        head_dims_sliding: None,
        kv_heads_sliding,
        v_norm: Sourced::new(false, format!("{family}: none")),
        v_from_k: Sourced::new(
            vec![false; n_layer],
            format!("{family}: V from each layer's own attn_v"),
        ),
        kv_source: Sourced::new(
            (0..n_layer).collect(),
            format!("{family}: every layer its own KV"),
        ),
        short_conv: None,
        delta_net: None,
        mask: Sourced::new(
            Mask::Causal,
            format!("{family}: causal (a generative model)"),
        ),
        pooled_head: Sourced::new(Vec::new(), format!("{family}: none")),
        moe: None,
    })
}

/// The declared layer count, at most [`MAX_LAYERS`]: per-layer tables are
/// sized by it before any tensor is looked at, so a corrupt count of
/// billions must be refused, not allocated.
pub fn layer_count(d: &Decls) -> Result<usize> {
    let n_layer = d.positive(k::N_LAYER)?;
    if n_layer > MAX_LAYERS {
        return Err(d.err(
            k::N_LAYER,
            format!("{n_layer} layers is more than the {MAX_LAYERS} onebit accepts: corrupt or not a model"),
        ));
    }
    Ok(n_layer)
}

/// A KV head count that onebit can run: positive, a divisor of the query
/// head count (each KV head serves n_head / n_kv query heads).
fn checked_kv(d: &Decls, n_head: usize, v: usize, at: &str) -> Result<usize> {
    let v = d.size_checked(k::N_HEAD_KV, v)?;
    if v == 0 || !n_head.is_multiple_of(v) {
        return Err(d.err(
            k::N_HEAD_KV,
            format!("{at}{v} does not divide the head count {n_head}"),
        ));
    }
    Ok(v)
}

/// The KV head counts per layer kind (full, sliding when it differs): one
/// number for every layer, or an array with an entry per layer whose
/// entries agree within each kind.
fn kv_heads_per_kind(
    d: &Decls,
    n_head: usize,
    kinds: &[LayerKind],
) -> Result<(usize, Option<Sourced<usize>>)> {
    let per_layer = match d.get(k::N_HEAD_KV) {
        Some(serde_json::Value::Array(a)) => a,
        None => return Ok((checked_kv(d, n_head, n_head, "")?, None)),
        Some(_) => {
            let v = checked_kv(d, n_head, d.usize(k::N_HEAD_KV)?, "")?;
            return Ok((v, None));
        }
    };
    if per_layer.len() != kinds.len() {
        return Err(d.err(
            k::N_HEAD_KV,
            format!("has {} entries for {} layers", per_layer.len(), kinds.len()),
        ));
    }
    // (count, first layer declaring it) for full and sliding layers.
    let mut by_kind: [Option<(usize, usize)>; 2] = [None, None];
    for (i, (v, &kind)) in per_layer.iter().zip(kinds).enumerate() {
        let h = v.as_u64().ok_or_else(|| {
            d.err(
                k::N_HEAD_KV,
                format!("entry {i} is {v}, expected a non-negative integer"),
            )
        })? as usize;
        let h = checked_kv(d, n_head, h, &format!("layer {i}: "))?;
        let slot = &mut by_kind[usize::from(kind == LayerKind::Sliding)];
        match *slot {
            None => *slot = Some((h, i)),
            Some((h0, i0)) if h0 != h => {
                return Err(d.err(
                    k::N_HEAD_KV,
                    format!(
                        "layer {i} declares {h} KV heads and layer {i0}, of the same kind ({kind:?}), {h0}: onebit runs one count per layer kind"
                    ),
                ))
            }
            Some(_) => {}
        }
    }
    let [full, sliding] = by_kind.map(|x| x.map(|(h, _)| h));
    Ok(match (full, sliding) {
        (Some(f), Some(s)) if s != f => (
            f,
            Some(Sourced::new(
                s,
                format!(
                    "{} (per layer): the sliding layers' entries",
                    d.src(k::N_HEAD_KV)
                ),
            )),
        ),
        (Some(f), _) => (f, None),
        (None, Some(s)) => (s, None),
        (None, None) => (n_head, None),
    })
}

/// The KV head count: one number, or (LFM2) one per layer where 0 marks a layer
/// without attention; the attention layers must agree.
fn head_count_kv(d: &Decls, n_head: usize, n_layer: usize) -> Result<usize> {
    let v = match d.get(k::N_HEAD_KV) {
        None => n_head,
        Some(serde_json::Value::Array(per_layer)) => {
            if per_layer.len() != n_layer {
                return Err(d.err(
                    k::N_HEAD_KV,
                    format!("has {} entries for {n_layer} layers", per_layer.len()),
                ));
            }
            let mut nonzero: Vec<u64> = per_layer
                .iter()
                .filter_map(|x| x.as_u64())
                .filter(|&x| x > 0)
                .collect();
            nonzero.dedup();
            match nonzero.as_slice() {
                [one] => *one as usize,
                [] => n_head,
                _ => {
                    return Err(d.err(
                        k::N_HEAD_KV,
                        "attention layers disagree on the KV head count",
                    ))
                }
            }
        }
        Some(_) => d.usize(k::N_HEAD_KV)?,
    };
    let v = d.size_checked(k::N_HEAD_KV, v)?;
    if v == 0 || !n_head.is_multiple_of(v) {
        return Err(d.err(
            k::N_HEAD_KV,
            format!("{v} does not divide the head count {n_head}"),
        ));
    }
    Ok(v)
}

/// Per-layer KV head counts as declared (LFM2 marks conv layers with 0).
pub fn per_layer_kv_heads(d: &Decls) -> Option<Vec<u64>> {
    match d.get(k::N_HEAD_KV) {
        Some(serde_json::Value::Array(a)) => {
            Some(a.iter().map(|x| x.as_u64().unwrap_or(0)).collect())
        }
        _ => None,
    }
}

/// Linear RoPE scaling from the declared type and factor; a type the forward
/// does not implement is refused by name. (Families with other scaling kinds,
/// e.g. Hunyuan's NTK alpha, read their own keys first.)
fn rope_scaling(d: &Decls, own_scaling: &[&str]) -> Result<RopeScaling> {
    let ty = d.str_opt(k::ROPE_SCALING_TYPE)?;
    let factor = d.f64_opt(k::ROPE_SCALING_FACTOR)?;
    match ty.as_deref() {
        None | Some("none") | Some("default") => match d.f64_opt(k::ROPE_SCALE_LINEAR)? {
            Some(f) if f > 0.0 && f != 1.0 => Ok(RopeScaling::Linear { factor: f }),
            _ => Ok(RopeScaling::None),
        },
        Some("linear") => match factor {
            Some(f) if f > 0.0 && f.is_finite() => Ok(if f == 1.0 {
                RopeScaling::None
            } else {
                RopeScaling::Linear { factor: f }
            }),
            _ => Err(d.err(
                k::ROPE_SCALING_FACTOR,
                format!("linear RoPE scaling needs a positive factor, found {factor:?}"),
            )),
        },
        Some(t) if own_scaling.contains(&t) => Ok(RopeScaling::None),
        Some(other) => Err(d.err(
            k::ROPE_SCALING_TYPE,
            format!("RoPE scaling `{other}` is not implemented for this family (linear is; yarn for gpt-oss)"),
        )),
    }
}

/// Whether q and k are RMS-normalised per head: a stated `use_qk_norm`
/// (true or false) decides; otherwise the family's own rule. `order` is where
/// the family applies the norm relative to RoPE.
pub fn qk_norm(
    d: &Decls,
    family_default: bool,
    order: QkNorm,
    family_src: &str,
) -> Result<Sourced<QkNorm>> {
    Ok(match d.bool_opt(k::USE_QK_NORM)? {
        Some(true) => Sourced::new(order, d.src(k::USE_QK_NORM)),
        Some(false) => Sourced::new(QkNorm::None, d.src(k::USE_QK_NORM)),
        None if family_default => Sourced::new(order, family_src.to_string()),
        None => Sourced::new(QkNorm::None, family_src.to_string()),
    })
}

/// Per-layer sliding flags as llama.cpp's `sliding_window_pattern` array
/// writes them (true = sliding), as layer kinds; an entry that is no bool is
/// refused naming `key`.
pub fn kinds_from_flags(
    d: &Decls,
    key: Key,
    flags: &[serde_json::Value],
) -> Result<Vec<LayerKind>> {
    flags
        .iter()
        .map(|f| match f.as_bool() {
            Some(true) => Ok(LayerKind::Sliding),
            Some(false) => Ok(LayerKind::Full),
            None => Err(d.err(key, format!("entries must be true or false, found {f}"))),
        })
        .collect()
}
