//! What every family declares with the same GGUF keys (`<arch>.block_count`,
//! `<arch>.attention.head_count`, ...), read once into a base `Semantics` that
//! a family file then adjusts.

use onebit_formats::gguf::Gguf;

use crate::error::{ModelError, Result};
use crate::semantics::*;

/// Typed reads of `<arch>.<suffix>` keys.
pub struct Keys<'a> {
    pub g: &'a Gguf,
    pub arch: &'static str,
}

impl<'a> Keys<'a> {
    pub fn key(&self, suffix: &str) -> String {
        format!("{}.{suffix}", self.arch)
    }
    pub fn usize(&self, suffix: &str) -> Result<usize> {
        Ok(self.g.u64(&self.key(suffix))? as usize)
    }
    pub fn usize_opt(&self, suffix: &str) -> Result<Option<usize>> {
        Ok(self.g.u64_opt(&self.key(suffix))?.map(|v| v as usize))
    }
    pub fn f64_opt(&self, suffix: &str) -> Result<Option<f64>> {
        Ok(self.g.f64_opt(&self.key(suffix))?)
    }
    pub fn str_opt(&self, suffix: &str) -> Result<Option<&'a str>> {
        Ok(self.g.str_opt(&self.key(suffix))?)
    }
    /// A positive integer, or an error naming the key.
    pub fn positive(&self, suffix: &str) -> Result<usize> {
        let v = self.usize(suffix)?;
        if v == 0 {
            return Err(self
                .g
                .key_error(&self.key(suffix), "must be positive, found 0")
                .into());
        }
        Ok(v)
    }
    /// Where a value came from, for the `[semantics]` lines.
    pub fn src(&self, suffix: &str) -> String {
        format!("GGUF {}", self.key(suffix))
    }
}

/// The base semantics: dimensions, every layer full attention, RoPE from
/// `rope.freq_base` / `rope.dimension_count` / `rope.scaling.*`, plain norms,
/// SiLU gate, tied output when the file has no `output.weight`.
pub fn base(k: &Keys, family: &'static str, rope_style: Sourced<RopeStyle>) -> Result<Semantics> {
    let g = k.g;
    let n_embd = k.positive("embedding_length")?;
    let n_layer = k.positive("block_count")?;
    let n_head = k.positive("attention.head_count")?;
    let n_head_kv = k.usize_opt("attention.head_count_kv")?.unwrap_or(n_head);
    if n_head_kv == 0 || n_head % n_head_kv != 0 {
        return Err(g
            .key_error(
                &k.key("attention.head_count_kv"),
                format!("{n_head_kv} does not divide head_count {n_head}"),
            )
            .into());
    }
    let (head_dim_k, head_dim_src) = match k.usize_opt("attention.key_length")? {
        Some(v) => (v, k.key("attention.key_length")),
        None if n_embd % n_head == 0 => (
            n_embd / n_head,
            "embedding_length / head_count (no key_length key)".to_string(),
        ),
        None => {
            return Err(g
                .key_error(
                    &k.key("attention.key_length"),
                    "absent, and embedding_length is not a multiple of head_count",
                )
                .into())
        }
    };
    let head_dim_v = k.usize_opt("attention.value_length")?.unwrap_or(head_dim_k);
    let n_ff = k.positive("feed_forward_length")?;
    let n_vocab = vocab_size(k)?;
    let n_ctx_train = k.usize_opt("context_length")?.unwrap_or(0);

    let eps_key = "attention.layer_norm_rms_epsilon";
    let eps = k
        .f64_opt(eps_key)?
        .ok_or_else(|| ModelError::from(g.key_error(&k.key(eps_key), "is required but absent")))?;

    let base_freq = k.f64_opt("rope.freq_base")?;
    let (base_freq, base_src) = match base_freq {
        Some(b) if b > 0.0 => (b, k.src("rope.freq_base")),
        Some(b) => {
            return Err(g
                .key_error(
                    &k.key("rope.freq_base"),
                    format!("must be positive, found {b}"),
                )
                .into())
        }
        None => (
            10000.0,
            "ggml default 10000 (rope.freq_base absent)".to_string(),
        ),
    };
    let n_rot = k.usize_opt("rope.dimension_count")?.unwrap_or(head_dim_k);
    if n_rot > head_dim_k || n_rot % 2 != 0 {
        return Err(g
            .key_error(
                &k.key("rope.dimension_count"),
                format!("{n_rot} must be even and at most head_dim {head_dim_k}"),
            )
            .into());
    }
    let scaling = rope_scaling(k)?;
    let freq_factors = g.tensor("rope_freqs.weight").is_some();
    let rope = RopeSpec {
        base: base_freq,
        style: rope_style.value,
        n_rot,
        scaling,
        freq_factors,
    };
    let rope_src = format!(
        "{base_src}; style: {}; {}",
        rope_style.source,
        if freq_factors {
            "rope_freqs.weight present"
        } else {
            "no rope_freqs tensor"
        }
    );

    let tied = g.tensor("output.weight").is_none();
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
            format!("1/sqrt(head_dim {head_dim_k}) from {head_dim_src}"),
        ),
        attn_softcap: Sourced::new(None, format!("{family}: none")),
        final_softcap: Sourced::new(None, format!("{family}: none")),
        qk_norm: Sourced::new(QkNorm::None, format!("{family}: no q/k norm")),
        norm_eps: Sourced::new(eps as f32, k.src(eps_key)),
        norm_form: Sourced::new(NormForm::Plain, format!("{family}: RMSNorm x/rms * w")),
        sandwich_norms: Sourced::new(false, format!("{family}: none")),
        embed_scale: Sourced::new(None, format!("{family}: none")),
        activation: Sourced::new(Activation::SiluGate, format!("{family}: SiLU-gated MLP")),
        tied_output: Sourced::new(
            tied,
            if tied {
                "no output.weight tensor: the embedding is the output matrix"
            } else {
                "output.weight tensor present"
            },
        ),
        attn_bias: Sourced::new(false, format!("{family}: none")),
    })
}

/// `<arch>.vocab_size`, else the length of `tokenizer.ggml.tokens`.
fn vocab_size(k: &Keys) -> Result<usize> {
    if let Some(v) = k.usize_opt("vocab_size")? {
        return Ok(v);
    }
    match k.g.array_opt("tokenizer.ggml.tokens")? {
        Some(t) if !t.is_empty() => Ok(t.len()),
        _ => Err(k
            .g
            .key_error(
                &k.key("vocab_size"),
                "absent, and there is no tokenizer.ggml.tokens array to count",
            )
            .into()),
    }
}

/// `rope.scaling.type` (+ `factor`), or the older `rope.scale_linear`.
/// Types the forward does not implement are refused by name.
fn rope_scaling(k: &Keys) -> Result<RopeScaling> {
    let ty = k.str_opt("rope.scaling.type")?;
    let factor = k.f64_opt("rope.scaling.factor")?;
    match ty {
        None | Some("none") => match k.f64_opt("rope.scale_linear")? {
            Some(f) if f > 0.0 && f != 1.0 => Ok(RopeScaling::Linear { factor: f }),
            _ => Ok(RopeScaling::None),
        },
        Some("linear") => match factor {
            Some(f) if f > 0.0 => Ok(if f == 1.0 {
                RopeScaling::None
            } else {
                RopeScaling::Linear { factor: f }
            }),
            _ => Err(k
                .g
                .key_error(
                    &k.key("rope.scaling.factor"),
                    format!("linear RoPE scaling needs a positive factor, found {factor:?}"),
                )
                .into()),
        },
        Some(other) => Err(k
            .g
            .key_error(
                &k.key("rope.scaling.type"),
                format!("RoPE scaling `{other}` is not implemented (linear is)"),
            )
            .into()),
    }
}
