//! Reads a routed-experts FFN's declarations (the `expert_*` keys and the
//! expert tensors' shapes) into [`Moe`], by a family's [`MoeRule`]: the
//! rules its llama.cpp graph hard-codes (gating, selection bias, shared
//! expert) are the family's; what the container states must agree with
//! them or is refused by name, never approximated.

use super::decls::{self as k, Decls, MAX_SIZE};
use crate::error::Result;
use crate::semantics::*;

/// Each expert's output scale (`ffn_down_exps_s` in llama.cpp), one value
/// per expert, when the container has it.
pub const EXPERT_SCALE: &str = "ffn_down_exps.scale";

/// What a family's graph does with routed experts.
pub struct MoeRule {
    /// Where the rules come from (`llama.cpp src/models/qwen3moe.cpp`).
    pub source: &'static str,
    /// The gating the graph runs; `None`: read from `expert_gating_func`
    /// (softmax or sigmoid).
    pub gating: Option<Gating>,
    /// `exp_probs_b` chooses the experts (required then).
    pub selection_bias: bool,
    /// Renormalization when the container does not state it.
    pub norm_default: bool,
    /// Leading dense layers may be declared (`leading_dense_block_count`).
    pub leading_dense: bool,
    /// A shared expert may be present (`ffn_*_shexp`), gated by
    /// `ffn_gate_inp_shexp` when `shared_gate`.
    pub shared: bool,
    pub shared_gate: bool,
}

/// The routed-experts FFN of a model the family declares with `rule`.
pub fn read(d: &Decls, dims: &Dims, rule: &MoeRule) -> Result<Sourced<Moe>> {
    let src = rule.source;
    let n_expert = d.positive(k::EXPERT_COUNT)?;
    let n_used = d.positive(k::EXPERT_USED_COUNT)?;
    if n_used > n_expert {
        return Err(d.err(
            k::EXPERT_USED_COUNT,
            format!("{n_used} chosen experts of {n_expert}: at most the expert count"),
        ));
    }
    if let Some(g) = d.usize_opt(k::EXPERT_GROUP_COUNT)? {
        if g > 1 {
            return Err(d.err(
                k::EXPERT_GROUP_COUNT,
                format!("{g} expert groups: group-limited routing (DeepSeek's) is not implemented"),
            ));
        }
    }
    let (n_ff_exp, ff_src) = match d.usize_opt(k::EXPERT_FF)? {
        Some(v) if v > 0 => (d.size_checked(k::EXPERT_FF, v)?, d.src(k::EXPERT_FF)),
        _ => (
            dims.n_ff / n_used,
            format!(
                "{} / {} ({} absent; {src})",
                d.spelled(k::N_FF),
                d.spelled(k::EXPERT_USED_COUNT),
                d.spelled(k::EXPERT_FF)
            ),
        ),
    };
    if n_ff_exp == 0 {
        return Err(d.err(k::EXPERT_FF, "the experts' width is 0"));
    }

    let gating = gating(d, rule)?;

    let selection_bias = match d.bool_opt(k::EXPERT_SELECTION_BIAS)? {
        Some(false) if rule.selection_bias => {
            return Err(d.err(
                k::EXPERT_SELECTION_BIAS,
                format!("false, but {src} always chooses with exp_probs_b"),
            ))
        }
        Some(true) if !rule.selection_bias => {
            return Err(d.err(
                k::EXPERT_SELECTION_BIAS,
                format!("true, but {src} has no expert selection bias"),
            ))
        }
        _ => Sourced::new(
            rule.selection_bias,
            format!(
                "{src}: {}",
                if rule.selection_bias {
                    "exp_probs_b added to the scores to choose"
                } else {
                    "no selection bias"
                }
            ),
        ),
    };

    let norm_weights = match d.bool_opt(k::EXPERT_WEIGHTS_NORM)? {
        Some(v) => Sourced::new(v, d.src(k::EXPERT_WEIGHTS_NORM)),
        None => Sourced::new(
            rule.norm_default,
            format!("{src} ({} absent)", d.spelled(k::EXPERT_WEIGHTS_NORM)),
        ),
    };

    // llama.cpp's 0 (its default) means no scaling.
    let scale = match d.f64_opt(k::EXPERT_WEIGHTS_SCALE)? {
        Some(0.0) => Sourced::new(1.0, format!("{} = 0: none", d.src(k::EXPERT_WEIGHTS_SCALE))),
        Some(v) if v > 0.0 && v.is_finite() => {
            Sourced::new(v as f32, d.src(k::EXPERT_WEIGHTS_SCALE))
        }
        Some(v) => {
            return Err(d.err(
                k::EXPERT_WEIGHTS_SCALE,
                format!("must be positive and finite, found {v}"),
            ))
        }
        None => Sourced::new(
            1.0,
            format!("none ({} absent)", d.spelled(k::EXPERT_WEIGHTS_SCALE)),
        ),
    };

    let leading = d.usize_opt(k::LEADING_DENSE)?.unwrap_or(0);
    if leading > 0 && !rule.leading_dense {
        return Err(d.err(
            k::LEADING_DENSE,
            format!("{leading} leading dense layers, which {src} does not have"),
        ));
    }
    if leading >= dims.n_layer {
        return Err(d.err(
            k::LEADING_DENSE,
            format!(
                "{leading} leading dense layers of {}: no layer routes",
                dims.n_layer
            ),
        ));
    }
    let leading_dense = Sourced::new(
        leading,
        if d.get(k::LEADING_DENSE).is_some() {
            d.src(k::LEADING_DENSE)
        } else {
            format!("none ({} absent)", d.spelled(k::LEADING_DENSE))
        },
    );

    let (shared, shared_gate) = shared(d, dims, rule, leading)?;

    // llama.cpp loads `ffn_down_exps.scale` for every architecture
    // (src/llama-model.cpp, "MoE expert weight scales") and multiplies each
    // chosen expert's output by its entry (build_lora_mm_id).
    let scale_name = format!("blk.{leading}.{EXPERT_SCALE}");
    let expert_scale = if d.has_tensor(&scale_name) {
        Sourced::new(Some(EXPERT_SCALE), format!("{scale_name} present"))
    } else {
        Sourced::new(None, format!("none ({scale_name} absent)"))
    };

    Ok(Sourced::new(
        Moe {
            n_expert,
            n_used,
            n_ff_exp,
            gating,
            selection_bias,
            norm_weights,
            scale,
            shared,
            shared_gate,
            leading_dense,
            shared_names: SHEXP_NAMES,
            router_input: Sourced::new(RouterInput::FfnInput, format!("{src}: the FFN input")),
            expert_scale,
            branch_norms: Sourced::new(None, format!("{src}: none")),
            expert_biases: Sourced::new(false, format!("{src}: none")),
        },
        format!(
            "{}, {}; width {ff_src}",
            d.src(k::EXPERT_COUNT),
            d.src(k::EXPERT_USED_COUNT)
        ),
    ))
}

fn gating(d: &Decls, rule: &MoeRule) -> Result<Sourced<Gating>> {
    let src = rule.source;
    let stated = match d.get(k::EXPERT_GATING_FUNC) {
        None => None,
        // GGUF: llama.cpp's enum (1 softmax, 2 sigmoid); config.json: a name.
        Some(v) => Some(match (v.as_u64(), v.as_str()) {
            (Some(1), _) | (_, Some("softmax")) => Gating::Softmax,
            (Some(2), _) | (_, Some("sigmoid")) => Gating::Sigmoid,
            _ => {
                return Err(d.err(
                    k::EXPERT_GATING_FUNC,
                    format!("gating {v} is not one onebit runs (softmax: 1, sigmoid: 2)"),
                ))
            }
        }),
    };
    match (rule.gating, stated) {
        (Some(g), None) => Ok(Sourced::new(g, format!("{src}: {g:?}"))),
        (Some(g), Some(s)) if s == g => Ok(Sourced::new(g, d.src(k::EXPERT_GATING_FUNC))),
        (Some(g), Some(s)) => Err(d.err(
            k::EXPERT_GATING_FUNC,
            format!("states {s:?}, but {src} runs {g:?}"),
        )),
        (None, Some(s)) => Ok(Sourced::new(s, d.src(k::EXPERT_GATING_FUNC))),
        (None, None) => Err(d.err(k::EXPERT_GATING_FUNC, "is required but absent")),
    }
}

/// The shared expert's width (key, else the first routed layer's
/// `ffn_up_shexp` rows) and its gate.
fn shared(
    d: &Decls,
    dims: &Dims,
    rule: &MoeRule,
    first: usize,
) -> Result<(Sourced<Option<usize>>, Sourced<bool>)> {
    let src = rule.source;
    let up = format!("blk.{first}.ffn_up_shexp.weight");
    let from_tensor = match d.tensor_dims(&up).as_deref() {
        Some([cols, rows]) if *cols == dims.n_embd as u64 => Some(*rows as usize),
        Some(other) => {
            return Err(d.err(
                k::EXPERT_SHARED_FF,
                format!(
                    "{up} has shape {other:?}, expected [{}, width]",
                    dims.n_embd
                ),
            ))
        }
        None => None,
    };
    if let Some(c) = d.usize_opt(k::EXPERT_SHARED_COUNT)? {
        if c > 1 {
            return Err(d.err(
                k::EXPERT_SHARED_COUNT,
                format!(
                    "{c} shared experts: onebit runs one (its width the declared shared width)"
                ),
            ));
        }
    }
    let declared = d.usize_opt(k::EXPERT_SHARED_FF)?.filter(|&v| v > 0);
    let width = match (declared, from_tensor) {
        (Some(w), Some(t)) if w != t => {
            return Err(d.err(k::EXPERT_SHARED_FF, format!("{w}, but {up} has {t} rows")))
        }
        (Some(w), _) => Some((
            d.size_checked(k::EXPERT_SHARED_FF, w)?,
            d.src(k::EXPERT_SHARED_FF),
        )),
        (None, Some(t)) if t > 0 && t <= MAX_SIZE => Some((t, format!("the rows of {up}"))),
        (None, Some(t)) => return Err(d.err(k::EXPERT_SHARED_FF, format!("{up} has {t} rows"))),
        (None, None) => None,
    };
    match width {
        Some((w, wsrc)) => {
            if !rule.shared {
                return Err(d.err(
                    k::EXPERT_SHARED_FF,
                    format!("a shared expert of width {w} ({wsrc}), which {src} does not have"),
                ));
            }
            Ok((
                Sourced::new(Some(w), wsrc),
                Sourced::new(
                    rule.shared_gate,
                    format!(
                        "{src}: {}",
                        if rule.shared_gate {
                            "sigmoid(ffn_gate_inp_shexp(h))"
                        } else {
                            "none"
                        }
                    ),
                ),
            ))
        }
        None => Ok((
            Sourced::new(None, format!("{src}: no shared expert tensors")),
            Sourced::new(false, format!("{src}: no shared expert")),
        )),
    }
}
