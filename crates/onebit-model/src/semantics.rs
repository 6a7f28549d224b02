//! Every rule the forward follows, as data, each with the declaration it came from.
//!
//! The forward never guesses: what a model does differently (which layers slide,
//! which RoPE base each layer kind uses, whether norms add 1, ...) is a field
//! here, filled by the model's family file from the model's own metadata, and
//! printed as `[semantics]` lines at load and by `onebit inspect`.

use std::fmt;

pub use onebit_kernels::rope::RopeStyle;

/// A value and where it came from (a metadata key, a family default, a tensor).
#[derive(Clone, Debug, PartialEq)]
pub struct Sourced<T> {
    pub value: T,
    pub source: String,
}

impl<T> Sourced<T> {
    pub fn new(value: T, source: impl Into<String>) -> Self {
        Sourced {
            value,
            source: source.into(),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LayerKind {
    /// Causal attention over every earlier position.
    Full,
    /// Causal attention over the last `window` positions (the query's own included).
    Sliding,
    /// LFM2 gated short convolution.
    ShortConv,
    /// Gated delta-net linear attention (Qwen3.5).
    DeltaNet,
}

impl LayerKind {
    pub fn is_attention(self) -> bool {
        matches!(self, LayerKind::Full | LayerKind::Sliding)
    }
    fn name(self) -> &'static str {
        match self {
            LayerKind::Full => "full",
            LayerKind::Sliding => "sliding",
            LayerKind::ShortConv => "short-conv",
            LayerKind::DeltaNet => "delta-net",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum RopeScaling {
    None,
    /// Angles divided by the factor.
    Linear {
        factor: f64,
    },
    /// YaRN as llama.cpp runs it (ggml's `rope_yarn`, its context's
    /// ext_factor and attention factor): pair i's angle mixes the
    /// interpolated angle (divided by `factor`) with the unscaled one by
    /// `ramp(i) * ext_factor`, where ramp is 1 below the correction dim of
    /// `beta_fast` and 0 above that of `beta_slow` (over `orig_ctx`
    /// positions), linear between; cos and sin are multiplied by
    /// `1 + 0.1 ln(factor)` when ext_factor is not 0.
    Yarn {
        factor: f64,
        orig_ctx: usize,
        ext_factor: f64,
        beta_fast: f64,
        beta_slow: f64,
    },
}

/// RoPE for one layer kind.
#[derive(Clone, Debug, PartialEq)]
pub struct RopeSpec {
    pub base: f64,
    pub style: RopeStyle,
    /// Dimensions rotated per head (the rest pass through).
    pub n_rot: usize,
    pub scaling: RopeScaling,
    /// The tensor holding per-pair divisors of the angles (`rope_freqs.weight`,
    /// LongRoPE's `rope_factors_short.weight`), when one applies.
    pub freq_factors: Option<String>,
    /// Multiplies cos and sin (LongRoPE's attention factor); 1 elsewhere.
    pub attn_factor: f64,
    /// LongRoPE: this factor tensor replaces `freq_factors` when the run's
    /// context exceeds the original training context (the second field).
    pub long_factors: Option<(String, usize)>,
    /// HF's "proportional" RoPE declared in config.json (Gemma 4's full
    /// layers): angles over the whole rotary width, but only the first this
    /// many pairs rotate; the others pass through. The same divisors llama.cpp's
    /// converter writes as `rope_freqs.weight` (1 for a rotated pair, 1e30
    /// for the others), so a pack without that tensor runs the same angles.
    pub proportional: Option<usize>,
    /// Interleaved multi-axis RoPE (llama.cpp's IMROPE: `rope.dimension_sections`),
    /// pairs assigned to the position components (t, h, w, e) by
    /// `onebit_kernels::rope::imrope_axes`. A text row sits at (p, p, p, 0);
    /// an image's rows laid out nx x ny (`forward::Embeds::grid`) at
    /// (p, p + row, p + column, 0), and the text after it at p + max(nx, ny)
    /// (mtmd's MTMD_POS_TYPE_MROPE, which an IMROPE text model selects).
    /// None: single-axis RoPE, every row at its index.
    pub sections: Option<[usize; 4]>,
}

/// A proportional RoPE's per-pair divisors: `rotated` ones, then 1e30 (the
/// f32 llama.cpp's converter stores: no rotation).
pub fn proportional_factors(n_pairs: usize, rotated: usize) -> Vec<f32> {
    (0..n_pairs)
        .map(|i| if i < rotated { 1.0 } else { 1e30 })
        .collect()
}

impl RopeSpec {
    /// The frequency multiplier that linear scaling implies.
    pub fn freq_scale(&self) -> f64 {
        match self.scaling {
            RopeScaling::None => 1.0,
            RopeScaling::Linear { factor } | RopeScaling::Yarn { factor, .. } => 1.0 / factor,
        }
    }

    /// The per-pair angle multipliers and the cos/sin factor of this spec,
    /// given the unscaled inverse frequencies `extrap` (base^(-2i/n_rot),
    /// already divided by any per-pair factors): linear scaling multiplies
    /// them by 1/factor; YaRN mixes as [`RopeScaling::Yarn`] says.
    pub fn scaled_inv_freq(&self, extrap: &[f64]) -> (Vec<f64>, f64) {
        match self.scaling {
            RopeScaling::None => (extrap.to_vec(), self.attn_factor),
            RopeScaling::Linear { factor } => (
                extrap.iter().map(|f| f / factor).collect(),
                self.attn_factor,
            ),
            RopeScaling::Yarn {
                factor,
                orig_ctx,
                ext_factor,
                beta_fast,
                beta_slow,
            } => {
                let (lo, hi) =
                    yarn_corr_dims(self.n_rot, orig_ctx, self.base, beta_fast, beta_slow);
                let inv = extrap
                    .iter()
                    .enumerate()
                    .map(|(i, &e)| {
                        let y = (i as f64 - lo) / (hi - lo).max(0.001);
                        let mix = (1.0 - y.clamp(0.0, 1.0)) * ext_factor;
                        (e / factor) * (1.0 - mix) + e * mix
                    })
                    .collect();
                let mscale = if ext_factor != 0.0 {
                    self.attn_factor * (1.0 + 0.1 * factor.ln())
                } else {
                    self.attn_factor
                };
                (inv, mscale)
            }
        }
    }
}

/// ggml's YaRN correction range (`ggml_rope_yarn_corr_dims`): the pair
/// indices where a rotation of `beta` turns over `orig_ctx` positions,
/// floor of the fast one and ceil of the slow one, clamped to [0, n_rot - 1].
pub fn yarn_corr_dims(
    n_rot: usize,
    orig_ctx: usize,
    base: f64,
    beta_fast: f64,
    beta_slow: f64,
) -> (f64, f64) {
    let dim = |beta: f64| {
        n_rot as f64 * (orig_ctx as f64 / (beta * 2.0 * std::f64::consts::PI)).ln()
            / (2.0 * base.ln())
    };
    (
        dim(beta_fast).floor().max(0.0),
        dim(beta_slow).ceil().min(n_rot as f64 - 1.0),
    )
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QkNorm {
    None,
    /// RMSNorm over each q and k head, then RoPE (qwen3, gemma3, lfm2).
    BeforeRope,
    /// RoPE, then RMSNorm over each head (hunyuan).
    AfterRope,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NormForm {
    /// `x/rms * w` with w as stored.
    Plain,
    /// `x/rms * (1 + w)`: the container stores HF's w without the 1.
    OnePlus,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    /// `down(silu(gate) * up)`
    SiluGate,
    /// `down(gelu_tanh(gate) * up)`
    GeluTanhGate,
    /// gpt-oss's clamped SwiGLU (llama.cpp's `swiglu_oai`, alpha 1.702,
    /// limit 7): `x = min(gate, 7)`, `y = clamp(up, -7, 7)`,
    /// `down(x sigmoid(1.702 x) (y + 1))`.
    SwigluOai,
}

/// How a routed-experts FFN turns its router's logits into scores.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Gating {
    /// Softmax over all experts' logits.
    Softmax,
    /// A sigmoid of each expert's logit.
    Sigmoid,
    /// The logits themselves choose; the chosen experts' weights are the
    /// softmax over their logits only (llama.cpp's
    /// `LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX_WEIGHT`, gpt-oss).
    SoftmaxWeight,
}

/// A routed-experts (mixture-of-experts) FFN, a kind of FFN a family
/// declares for its layers from `leading_dense` on (the layers before run
/// the dense FFN of `Dims::n_ff`). Per token, with `x` the residual stream
/// and `h = norm(x; ffn_norm)` the FFN input:
///
/// ```text
/// r = h, or (router_input ScaledRms) rmsnorm(x) / sqrt(n_embd) * ffn_gate_inp.scale
/// l = ffn_gate_inp(r) [+ ffn_gate_inp.bias];  p = gating(l)   (SoftmaxWeight: p = l)
/// chosen = the n_used experts of largest p [+ exp_probs_b]   (the bias only chooses)
/// w_e = p_e for e in chosen;  [SoftmaxWeight: w = softmax(w)]
/// [w /= max(sum w, 2^-14)];  w *= scale
/// he = h, or (branch_norms) norm(x; experts_in)
/// f = sum over chosen, largest first: w_e * ([ffn_down_exps.scale_e *] down_e(act(gate_e(he)) * up_e(he)))
///     (expert_biases: gate_e, up_e and down_e each add their row of ffn_{gate,up,down}_exps.bias)
/// [f = norm(f; experts_out)]                                   (branch_norms)
/// s = down_s(act(gate_s(h)) * up_s(h));  [s = norm(s; shared_out)]  (branch_norms)
/// [f += [sigmoid(ffn_gate_inp_shexp(h)) *] s]
/// ```
///
/// Each rule carries its source; what the forward does not run is refused
/// by the family file, by name.
#[derive(Clone, Debug, PartialEq)]
pub struct Moe {
    pub n_expert: usize,
    pub n_used: usize,
    /// Each expert's hidden width.
    pub n_ff_exp: usize,
    pub gating: Sourced<Gating>,
    /// `exp_probs_b` is added to the scores to choose the experts (not to
    /// weigh them).
    pub selection_bias: Sourced<bool>,
    /// The chosen experts' weights are divided by their sum.
    pub norm_weights: Sourced<bool>,
    /// The chosen experts' weights are multiplied by this.
    pub scale: Sourced<f32>,
    /// The shared expert's hidden width, when the layers have one.
    pub shared: Sourced<Option<usize>>,
    /// The shared expert's output is multiplied by sigmoid(ffn_gate_inp_shexp(h)).
    pub shared_gate: Sourced<bool>,
    /// Layers before this one run the dense FFN.
    pub leading_dense: Sourced<usize>,
    /// The shared expert's tensors (without `blk.N.`): `ffn_{gate,up,down}_shexp`,
    /// or (Gemma 4) the layer's dense MLP `ffn_{gate,up,down}`.
    pub shared_names: [&'static str; 3],
    /// What the router reads.
    pub router_input: Sourced<RouterInput>,
    /// Each chosen expert's output is multiplied by its entry of this
    /// \[n_expert\] tensor (llama.cpp's `ffn_down_exps_s`), before its weight.
    pub expert_scale: Sourced<Option<&'static str>>,
    /// Gemma 4's per-branch norms around the experts and the shared expert.
    pub branch_norms: Sourced<Option<BranchNorms>>,
    /// Each expert's gate, up and down products add that expert's row of
    /// `ffn_{gate,up,down}_exps.bias` (gpt-oss), the down bias before the
    /// expert's weight.
    pub expert_biases: Sourced<bool>,
}

/// The router's input.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RouterInput {
    /// The FFN input `h = norm(x; ffn_norm)`.
    FfnInput,
    /// Gemma 4: the residual `x` RMS-normed without a weight, times
    /// 1/sqrt(n_embd), times this \[n_embd\] tensor (`ffn_gate_inp.scale`).
    ScaledRms(&'static str),
}

/// Gemma 4's norms around the two branches of an expert layer (tensor names
/// without `blk.N.`): the experts read `norm(x; experts_in)` (not the FFN
/// input), their weighted sum is normed by `experts_out`, the shared
/// expert's (the dense MLP's) output by `shared_out`, and the two are added.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BranchNorms {
    pub experts_in: &'static str,
    pub experts_out: &'static str,
    pub shared_out: &'static str,
}

/// The shared expert's tensors of most families.
pub const SHEXP_NAMES: [&str; 3] = [
    "ffn_gate_shexp.weight",
    "ffn_up_shexp.weight",
    "ffn_down_shexp.weight",
];

impl Moe {
    /// Whether layer `il` runs the routed experts.
    pub fn routed(&self, il: usize) -> bool {
        il >= self.leading_dense.value
    }
}

/// Sizes of the model.
#[derive(Clone, Debug, PartialEq)]
pub struct Dims {
    pub n_embd: usize,
    pub n_layer: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim_k: usize,
    pub head_dim_v: usize,
    pub n_ff: usize,
    pub n_vocab: usize,
    /// Context the model was trained for (0 when not stated).
    pub n_ctx_train: usize,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Semantics {
    /// The family file that read the model (`llama`, `gemma3`, ...).
    pub family: &'static str,
    pub dims: Dims,
    pub layer_kinds: Sourced<Vec<LayerKind>>,
    pub sliding_window: Sourced<Option<usize>>,
    pub rope_full: Sourced<RopeSpec>,
    pub rope_sliding: Sourced<RopeSpec>,
    pub attn_scale: Sourced<f32>,
    pub attn_softcap: Sourced<Option<f32>>,
    pub final_softcap: Sourced<Option<f32>>,
    pub qk_norm: Sourced<QkNorm>,
    pub norm_eps: Sourced<f32>,
    pub norm_form: Sourced<NormForm>,
    /// How each layer's body is composed: its norms, where they sit, and how
    /// many times the stack of layers runs.
    pub body: Sourced<Body>,
    pub embed_scale: Sourced<Option<f32>>,
    pub activation: Sourced<Activation>,
    pub tied_output: Sourced<bool>,
    pub attn_bias: Sourced<bool>,
    /// The attention output projection adds `attn_output.bias` (gpt-oss).
    pub attn_out_bias: Sourced<bool>,
    /// Each query head's softmax has one more logit in its denominator, that
    /// head's entry of `attn_sinks.weight` (gpt-oss), when this names it.
    pub attn_sinks: Sourced<Option<&'static str>>,
    /// Full-attention output gated by sigmoid of a second half of q (Qwen3.5).
    pub attn_output_gate: Sourced<bool>,
    /// The sliding layers' own head sizes (k, v) (Gemma 4); None: those of
    /// `dims`, as for full layers.
    pub head_dims_sliding: Option<Sourced<(usize, usize)>>,
    /// The sliding layers' own KV head count (Gemma 4's per-layer
    /// `attention.head_count_kv`); None: `dims.n_head_kv`, as full layers.
    pub kv_heads_sliding: Option<Sourced<usize>>,
    /// V normalised per head by an RMSNorm without a weight (Gemma 4).
    pub v_norm: Sourced<bool>,
    /// Per layer: the layer has no V projection, its V is its raw K
    /// projection (before the k norm and RoPE; then the v norm, when
    /// declared). Gemma 4's `attention_k_eq_v`. False for layers that read
    /// another layer's KV cache (the source layer's rule made that cache).
    pub v_from_k: Sourced<Vec<bool>>,
    /// The layer whose KV cache each layer reads: itself, or (Gemma 4's
    /// shared-KV layers) an earlier layer of its kind; such a layer has no
    /// K/V projections of its own.
    pub kv_source: Sourced<Vec<usize>>,
    /// LFM2 short-conv kernel length.
    pub short_conv: Option<Sourced<usize>>,
    /// Gated delta-net sizes (Qwen3.5 linear-attention layers).
    pub delta_net: Option<Sourced<DeltaNetDims>>,
    /// Which positions a query sees: the earlier ones (a generative model) or
    /// all of the sequence (an embedding model such as EmbeddingGemma).
    pub mask: Sourced<Mask>,
    /// Matrices applied, in order, to the pooled embedding (sentence-
    /// transformers' dense layers): (tensor name, rows, cols). Empty: none.
    pub pooled_head: Sourced<Vec<(String, usize, usize)>>,
    /// The routed-experts FFN, when the model has one (see [`Moe`]); None:
    /// every layer's FFN is dense.
    pub moe: Option<Sourced<Moe>>,
}

/// The attention mask.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mask {
    /// Position p sees positions <= p; a sliding layer the last `window` of them.
    Causal,
    /// Position p sees the whole sequence; a sliding layer the positions
    /// within `window / 2` on either side (llama.cpp's symmetric window).
    /// Such a model runs each sequence in one call and cannot generate.
    Bidirectional,
}

#[derive(Clone, Debug, PartialEq)]
pub struct DeltaNetDims {
    pub conv_kernel: usize,
    pub n_k_heads: usize,
    pub n_v_heads: usize,
    pub head_k_dim: usize,
    pub head_v_dim: usize,
}

/// A layer body composed from the parts a family declares. Per layer, with
/// `x` the residual stream:
///
/// ```text
/// h = norm(x; mixer_norm);  m = mixer(h);  [m = norm(m; post_mixer_norm)];  x += m
/// h = norm(x; ffn_norm);    f = ffn(h);    [f = norm(f; post_ffn_norm)];    x += f
/// ```
///
/// The mixer is the layer's kind ([`LayerKind`]), the FFN its
/// [`Activation`]. The stack of layers runs `loops` times (each pass with
/// its own sequence state); between passes `x = norm(x; output_norm)` when
/// `loop_norm`. Norm names are GGUF's, without `blk.N.`.
#[derive(Clone, Debug, PartialEq)]
pub struct Body {
    pub mixer_norm: &'static str,
    pub post_mixer_norm: Option<&'static str>,
    pub ffn_norm: &'static str,
    pub post_ffn_norm: Option<&'static str>,
    /// The final norm (LFM2: `token_embd_norm.weight`).
    pub output_norm: &'static str,
    pub loops: usize,
    pub loop_norm: bool,
    /// Per-layer embeddings (Gemma 4): the width of each layer's slice of
    /// the per-layer input; 0 when the model has none. After the FFN
    /// residual: `x += norm(proj(gelu(inp_gate(x)) * slice); post_norm)`.
    pub per_layer_input: usize,
    /// Each layer's output is multiplied by this one-value tensor (Gemma 4's
    /// `layer_output_scale.weight`), after every other part.
    pub output_scale: Option<&'static str>,
    /// Deepstack (Qwen3-VL): an image row carries this many features after
    /// its embedding (rows of n_embd x (1 + deepstack)); feature k is added
    /// to layer k's output (k < deepstack), after every other part. Text
    /// rows carry none (llama.cpp pads them with zeros). 0: no deepstack.
    pub deepstack: usize,
}

impl Default for Body {
    /// The pre-norm llama body, one pass.
    fn default() -> Self {
        Body {
            mixer_norm: "attn_norm.weight",
            post_mixer_norm: None,
            ffn_norm: "ffn_norm.weight",
            post_ffn_norm: None,
            output_norm: "output_norm.weight",
            loops: 1,
            loop_norm: false,
            per_layer_input: 0,
            output_scale: None,
            deepstack: 0,
        }
    }
}

impl Body {
    fn describe(&self) -> String {
        let post = |p: Option<&str>| p.map_or(String::new(), |n| format!(" -> {n}"));
        let mut s = format!(
            "{} -> mixer{} -> +; {} -> ffn{} -> +; final {}",
            self.mixer_norm,
            post(self.post_mixer_norm),
            self.ffn_norm,
            post(self.post_ffn_norm),
            self.output_norm
        );
        if self.per_layer_input > 0 {
            s += &format!(
                "; per-layer embeddings of width {} (inp_gate -> gelu -> x slice -> proj -> post_norm -> +)",
                self.per_layer_input
            );
        }
        if let Some(t) = self.output_scale {
            s += &format!("; layer output x {t}");
        }
        if self.deepstack > 0 {
            s += &format!(
                "; deepstack: image rows carry {0} features after the embedding, feature k added to layer k's output (k < {0})",
                self.deepstack
            );
        }
        if self.loops > 1 {
            s += &format!(
                "; the layers run {} times{}",
                self.loops,
                if self.loop_norm {
                    format!(", {} between passes", self.output_norm)
                } else {
                    String::new()
                }
            );
        }
        s
    }
}

impl Semantics {
    /// The width of a row given as an embedding ([`crate::forward::Embeds`]):
    /// n_embd, times 1 + the deepstack features it carries.
    pub fn input_width(&self) -> usize {
        self.dims.n_embd * (1 + self.body.value.deepstack)
    }

    /// The semantics of a run whose context limit is `max_context`: a
    /// LongRoPE table choice (short, or long when the context exceeds the
    /// original training context, llama.cpp's rule) resolved into
    /// `freq_factors`, so the `[semantics]` line names the table the forward
    /// uses.
    pub fn at_context(&self, max_context: usize) -> Semantics {
        let mut s = self.clone();
        for rope in [&mut s.rope_full, &mut s.rope_sliding] {
            if let Some((long, orig)) = rope.value.long_factors.take() {
                let short = rope.value.freq_factors.clone().unwrap_or_default();
                if max_context > orig {
                    rope.value.freq_factors = Some(long.clone());
                    rope.source = format!(
                        "{}; {long} used: the context {max_context} exceeds the original {orig}",
                        rope.source
                    );
                } else {
                    rope.source = format!(
                        "{}; {short} used: the context {max_context} is within the original {orig}",
                        rope.source
                    );
                }
            }
        }
        s
    }

    /// Head sizes (k, v) of the attention layers of `kind`.
    pub fn head_dims(&self, kind: LayerKind) -> (usize, usize) {
        match (&self.head_dims_sliding, kind) {
            (Some(hd), LayerKind::Sliding) => hd.value,
            _ => (self.dims.head_dim_k, self.dims.head_dim_v),
        }
    }

    /// KV heads of the attention layers of `kind`.
    pub fn kv_heads(&self, kind: LayerKind) -> usize {
        match (&self.kv_heads_sliding, kind) {
            (Some(h), LayerKind::Sliding) => h.value,
            _ => self.dims.n_head_kv,
        }
    }

    /// Widths (k, v) of one position's K and V rows in a layer of `kind`:
    /// its KV heads times its head sizes.
    pub fn kv_widths(&self, kind: LayerKind) -> (usize, usize) {
        let (dk, dv) = self.head_dims(kind);
        let h = self.kv_heads(kind);
        (h * dk, h * dv)
    }

    /// Sequence-state slots: one per layer per pass of the stack.
    pub fn n_slots(&self) -> usize {
        self.dims.n_layer * self.body.value.loops
    }

    pub fn rope_for(&self, kind: LayerKind) -> &RopeSpec {
        match kind {
            LayerKind::Sliding => &self.rope_sliding.value,
            _ => &self.rope_full.value,
        }
    }

    /// The `[semantics]` lines, one rule each, with its source.
    pub fn lines(&self) -> Vec<String> {
        let d = &self.dims;
        let mut out = vec![format!(
            "family {}: {} layers, n_embd {}, heads {}/{} (q/kv), head_dim {}/{} (k/v), n_ff {}, vocab {}, trained context {}",
            self.family, d.n_layer, d.n_embd, d.n_head, d.n_head_kv, d.head_dim_k, d.head_dim_v, d.n_ff, d.n_vocab, d.n_ctx_train
        )];
        let mut line = |name: &str, value: String, source: &str| {
            out.push(format!("{name}: {value}  <- {source}"))
        };
        line(
            "layer kinds",
            describe_kinds(&self.layer_kinds.value),
            &self.layer_kinds.source,
        );
        line(
            "sliding window",
            self.sliding_window
                .value
                .map_or("none".into(), |w| w.to_string()),
            &self.sliding_window.source,
        );
        line(
            "rope full",
            describe_rope(&self.rope_full.value),
            &self.rope_full.source,
        );
        if self.layer_kinds.value.contains(&LayerKind::Sliding) {
            line(
                "rope sliding",
                describe_rope(&self.rope_sliding.value),
                &self.rope_sliding.source,
            );
        }
        line(
            "attention scale",
            format!("{}", self.attn_scale.value),
            &self.attn_scale.source,
        );
        line(
            "attention softcap",
            opt(self.attn_softcap.value),
            &self.attn_softcap.source,
        );
        line(
            "final logit softcap",
            opt(self.final_softcap.value),
            &self.final_softcap.source,
        );
        line(
            "q/k norm",
            format!("{:?}", self.qk_norm.value),
            &self.qk_norm.source,
        );
        line(
            "norm eps",
            format!("{:e}", self.norm_eps.value),
            &self.norm_eps.source,
        );
        let form = match self.norm_form.value {
            NormForm::Plain => "x/rms * w (w as stored)",
            NormForm::OnePlus => "x/rms * (1 + w)",
        };
        line("norm form", form.into(), &self.norm_form.source);
        line("layer body", self.body.value.describe(), &self.body.source);
        line(
            "embedding scale",
            opt(self.embed_scale.value),
            &self.embed_scale.source,
        );
        line(
            "activation",
            format!("{:?}", self.activation.value),
            &self.activation.source,
        );
        line(
            "tied output",
            self.tied_output.value.to_string(),
            &self.tied_output.source,
        );
        line(
            "attention biases",
            self.attn_bias.value.to_string(),
            &self.attn_bias.source,
        );
        line(
            "attention output bias",
            self.attn_out_bias.value.to_string(),
            &self.attn_out_bias.source,
        );
        line(
            "attention sinks",
            opt(self.attn_sinks.value),
            &self.attn_sinks.source,
        );
        if let Some(hd) = &self.head_dims_sliding {
            line(
                "sliding head dims",
                format!("{}/{} (k/v)", hd.value.0, hd.value.1),
                &hd.source,
            );
        }
        if let Some(h) = &self.kv_heads_sliding {
            line("sliding KV heads", h.value.to_string(), &h.source);
        }
        let from_k: Vec<usize> = (0..self.v_from_k.value.len())
            .filter(|&i| self.v_from_k.value[i])
            .collect();
        if !from_k.is_empty() {
            line(
                "values from keys",
                format!("layers {from_k:?}: V = the raw K projection (before k norm and RoPE), no attn_v"),
                &self.v_from_k.source,
            );
        }
        if self.v_norm.value {
            line(
                "v norm",
                "RMSNorm per head, no weight".into(),
                &self.v_norm.source,
            );
        }
        if self.mask.value != Mask::Causal {
            line(
                "attention mask",
                format!("{:?}", self.mask.value).to_lowercase(),
                &self.mask.source,
            );
        }
        if !self.pooled_head.value.is_empty() {
            let names: Vec<String> = self
                .pooled_head
                .value
                .iter()
                .map(|(n, r, c)| format!("{n} [{r}x{c}]"))
                .collect();
            line(
                "pooled head",
                names.join(" then "),
                &self.pooled_head.source,
            );
        }
        let kv = &self.kv_source.value;
        if kv.iter().enumerate().any(|(i, &s)| s != i) {
            let shared: Vec<String> = kv
                .iter()
                .enumerate()
                .filter(|(i, s)| *i != **s)
                .map(|(i, s)| format!("{i}<-{s}"))
                .collect();
            line(
                "shared KV",
                format!("layer<-source {}", shared.join(", ")),
                &self.kv_source.source,
            );
        }
        if self.attn_output_gate.value {
            line(
                "attention output gate",
                "sigmoid(q gate half)".into(),
                &self.attn_output_gate.source,
            );
        }
        if let Some(c) = &self.short_conv {
            line(
                "short conv",
                format!("kernel length {}", c.value),
                &c.source,
            );
        }
        if let Some(dn) = &self.delta_net {
            let v = &dn.value;
            let what = format!(
                "conv kernel {}, k heads {} x {}, v heads {} x {} (v head h reads k head h % {})",
                v.conv_kernel, v.n_k_heads, v.head_k_dim, v.n_v_heads, v.head_v_dim, v.n_k_heads
            );
            line("delta net", what, &dn.source);
        }
        if let Some(m) = &self.moe {
            let v = &m.value;
            line(
                "routed experts",
                format!(
                    "{} experts of width {}, {} chosen per token",
                    v.n_expert, v.n_ff_exp, v.n_used
                ),
                &m.source,
            );
            line(
                "expert gating",
                format!("{:?}", v.gating.value).to_lowercase(),
                &v.gating.source,
            );
            line(
                "expert selection bias",
                if v.selection_bias.value {
                    "exp_probs_b added to the scores to choose, not to weigh".into()
                } else {
                    "none".into()
                },
                &v.selection_bias.source,
            );
            line(
                "expert weights renormalized",
                v.norm_weights.value.to_string(),
                &v.norm_weights.source,
            );
            line(
                "expert weights scale",
                v.scale.value.to_string(),
                &v.scale.source,
            );
            line(
                "shared expert",
                match v.shared.value {
                    Some(w) => format!(
                        "width {w}{}",
                        if v.shared_gate.value {
                            ", gated by sigmoid(ffn_gate_inp_shexp)"
                        } else {
                            ""
                        }
                    ),
                    None => "none".into(),
                },
                &format!("{}; gate: {}", v.shared.source, v.shared_gate.source),
            );
            line(
                "leading dense layers",
                v.leading_dense.value.to_string(),
                &v.leading_dense.source,
            );
            line(
                "router input",
                match v.router_input.value {
                    RouterInput::FfnInput => "the FFN input (norm(x; ffn_norm))".into(),
                    RouterInput::ScaledRms(t) => {
                        format!("rmsnorm(x) without weight, x 1/sqrt(n_embd), x {t}")
                    }
                },
                &v.router_input.source,
            );
            line(
                "expert output scale",
                opt(v.expert_scale.value),
                &v.expert_scale.source,
            );
            line(
                "expert biases",
                if v.expert_biases.value {
                    "ffn_{gate,up,down}_exps.bias added to each expert's products".into()
                } else {
                    "none".into()
                },
                &v.expert_biases.source,
            );
            line(
                "expert branch norms",
                match v.branch_norms.value {
                    Some(b) => format!(
                        "experts read norm(x; {}), their sum -> {}; shared expert ({}) -> {}; added",
                        b.experts_in,
                        b.experts_out,
                        v.shared_names.join(", "),
                        b.shared_out
                    ),
                    None => "none".into(),
                },
                &v.branch_norms.source,
            );
        }
        out
    }
}

impl fmt::Display for Semantics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for l in self.lines() {
            writeln!(f, "[semantics] {l}")?;
        }
        Ok(())
    }
}

fn opt<T: fmt::Display>(v: Option<T>) -> String {
    v.map_or("none".into(), |x| x.to_string())
}

fn describe_rope(r: &RopeSpec) -> String {
    let style = match r.style {
        RopeStyle::Interleaved => "interleaved pairs",
        RopeStyle::Halves => "halves (neox)",
    };
    let scaling = match r.scaling {
        RopeScaling::None => "no scaling".to_string(),
        RopeScaling::Linear { factor } => format!("linear scaling factor {factor}"),
        RopeScaling::Yarn {
            factor,
            orig_ctx,
            ext_factor,
            beta_fast,
            beta_slow,
        } => format!(
            "yarn factor {factor} over original context {orig_ctx}, ext_factor {ext_factor}, beta_fast {beta_fast}, beta_slow {beta_slow}, cos/sin x (1 + 0.1 ln factor)"
        ),
    };
    let factors = match (&r.freq_factors, r.proportional) {
        (Some(t), _) => format!(" with factors from {t}"),
        (None, Some(p)) => format!(
            " proportional: the first {p} of {} pairs rotate",
            r.n_rot / 2
        ),
        (None, None) => String::new(),
    };
    let sections = match r.sections {
        Some(s) => format!(
            " interleaved multi-axis (IMROPE) sections {s:?}: text at (p, p, p, 0), an image's rows at (p, p + row, p + column, 0), the text after it at p + max(rows, columns)"
        ),
        None => String::new(),
    };
    let attn = if r.attn_factor != 1.0 {
        format!(", cos/sin x {}", r.attn_factor)
    } else {
        String::new()
    };
    format!(
        "base {} style {style} rotary dims {} {scaling}{factors}{attn}{sections}",
        r.base, r.n_rot
    )
}

/// Indices of the layers of one kind.
pub fn layers_of(kinds: &[LayerKind], kind: LayerKind) -> Vec<usize> {
    kinds
        .iter()
        .enumerate()
        .filter(|(_, &x)| x == kind)
        .map(|(i, _)| i)
        .collect()
}

/// "18: sliding x15, full x3 at [5, 11, 17]"
fn describe_kinds(kinds: &[LayerKind]) -> String {
    let mut parts = Vec::new();
    for k in [
        LayerKind::Sliding,
        LayerKind::ShortConv,
        LayerKind::DeltaNet,
        LayerKind::Full,
    ] {
        let at = layers_of(kinds, k);
        if at.is_empty() {
            continue;
        }
        if at.len() == kinds.len() {
            parts.push(format!("{} x{}", k.name(), at.len()));
        } else if at.len() <= 12 {
            parts.push(format!("{} x{} at {:?}", k.name(), at.len(), at));
        } else {
            parts.push(format!("{} x{}", k.name(), at.len()));
        }
    }
    format!("{}: {}", kinds.len(), parts.join(", "))
}
