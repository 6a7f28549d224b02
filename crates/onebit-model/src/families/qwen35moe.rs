//! Qwen3.5/3.6-MoE (Qwen3.6-35B-A3B, ...): the Qwen3.5 body (gated
//! delta-net and gated attention layers, `qwen35.rs`) whose every FFN is
//! routed experts plus one shared expert, as llama.cpp's
//! `src/models/qwen35moe.cpp` builds it: softmax over all experts, the top
//! `expert_used_count` renormalized; the shared expert's output multiplied
//! by sigmoid(`ffn_gate_inp_shexp` h) and added.
//!
//! Its packs (FastFlowLM's `qwen3.6-moe`) are read and written as the public
//! converter's `q4nx/models/qwen35moe.py` lays them out ([`PACK_LAYOUT`]):
//! names under `model.layer.{i}.`; the three expert stacks flattened
//! expert-major to one matrix each, in Q4_1 tiles; every other quantized
//! matrix in wide Q8 tiles (8,704 bytes); router, shared-expert gate, alpha,
//! beta, conv taps, norms and embedding BF16 (router, alpha, beta and conv
//! taps transposed); ssm_a and dt bias F32; the linear layers' V heads in
//! HF's grouped order instead of llama.cpp's tiled one; the full-attention
//! q_proj rows as all queries, then all gates.

use onebit_formats::q4nx::Q4Kind;
use serde_json::{json, Value as Json};

use super::decls::Decls;
use super::moe::{self, MoeRule};
use super::qwen35;
use super::{Family, ImportRules, PackNames};
use crate::error::Result;
use crate::pack::layout::{after, v_heads_grouped, Layout, Op, PackLayout};
use crate::semantics::*;

pub const FAMILY: Family = Family {
    arch: "qwen35moe",
    hf_names: &["qwen3_5_moe", "qwen3_5_moe_text", "Qwen3_5MoeForCausalLM"],
    semantics,
    pack: Some(PackNames { rows: PACK_ROWS }),
    import: Some(ImportRules {
        model_type: "qwen3_5_moe_text",
        hf_arch: "Qwen3_5MoeForCausalLM",
        q4_kind: Q4Kind::Asymmetric,
        unpermute_qk: false,
        prescale_embedding: false,
        eps_key: "rms_norm_eps",
        config: config_json,
    }),
};

pub const RULE: MoeRule = MoeRule {
    source: "llama.cpp src/models/qwen35moe.cpp",
    gating: Some(Gating::Softmax),
    selection_bias: false,
    norm_default: true,
    leading_dense: false,
    shared: true,
    shared_gate: true,
};

pub fn semantics(d: &Decls) -> Result<Semantics> {
    let mut s = qwen35::body(d, "qwen35moe")?;
    s.moe = Some(moe::read(d, &s.dims, &RULE)?);
    Ok(s)
}

/// The converter's names (`_process_gguf_layer_tensor`): GGUF -> pack.
const PACK_ROWS: &[super::NameRow] = &[
    (
        "blk.{i}.attn_norm.weight",
        "model.layer.{i}.input_layernorm.weight",
    ),
    (
        "blk.{i}.post_attention_norm.weight",
        "model.layer.{i}.post_attention_layernorm.weight",
    ),
    (
        "blk.{i}.ssm_norm.weight",
        "model.layer.{i}.linear_attn.ssm_norm.weight",
    ),
    (
        "blk.{i}.attn_q_norm.weight",
        "model.layer.{i}.self_attn.q_norm.weight",
    ),
    (
        "blk.{i}.attn_k_norm.weight",
        "model.layer.{i}.self_attn.k_norm.weight",
    ),
    ("blk.{i}.ssm_a", "model.layer.{i}.linear_attn.ssm_a"),
    (
        "blk.{i}.ssm_dt.bias",
        "model.layer.{i}.linear_attn.ssm_dt.bias",
    ),
    (
        "blk.{i}.ssm_alpha.weight",
        "model.layer.{i}.linear_attn.ssm_alpha_proj.weight",
    ),
    (
        "blk.{i}.ssm_beta.weight",
        "model.layer.{i}.linear_attn.ssm_beta_proj.weight",
    ),
    (
        "blk.{i}.ssm_conv1d.weight",
        "model.layer.{i}.linear_attn.ssm_conv1d.weight",
    ),
    (
        "blk.{i}.ffn_gate_inp.weight",
        "model.layer.{i}.moe_router.weight",
    ),
    (
        "blk.{i}.ffn_gate_inp_shexp.weight",
        "model.layer.{i}.shared_expert_gate.weight",
    ),
    (
        "blk.{i}.attn_qkv.weight",
        "model.layer.{i}.linear_attn.qkv_proj.weight",
    ),
    (
        "blk.{i}.attn_gate.weight",
        "model.layer.{i}.self_attn.gate_proj.weight",
    ),
    (
        "blk.{i}.ssm_out.weight",
        "model.layer.{i}.linear_attn.ssm_out_proj.weight",
    ),
    (
        "blk.{i}.attn_q.weight",
        "model.layer.{i}.self_attn.q_proj.weight",
    ),
    (
        "blk.{i}.attn_k.weight",
        "model.layer.{i}.self_attn.k_proj.weight",
    ),
    (
        "blk.{i}.attn_v.weight",
        "model.layer.{i}.self_attn.v_proj.weight",
    ),
    (
        "blk.{i}.attn_output.weight",
        "model.layer.{i}.self_attn.o_proj.weight",
    ),
    (
        "blk.{i}.ffn_gate_shexp.weight",
        "model.layer.{i}.mlp.share_gate_exps_proj.weight",
    ),
    (
        "blk.{i}.ffn_up_shexp.weight",
        "model.layer.{i}.mlp.share_up_exps_proj.weight",
    ),
    (
        "blk.{i}.ffn_down_shexp.weight",
        "model.layer.{i}.mlp.share_down_exps_proj.weight",
    ),
    (
        "blk.{i}.ffn_gate_exps.weight",
        "model.layer.{i}.mlp.gate_exps_proj.weight",
    ),
    (
        "blk.{i}.ffn_up_exps.weight",
        "model.layer.{i}.mlp.up_exps_proj.weight",
    ),
    (
        "blk.{i}.ffn_down_exps.weight",
        "model.layer.{i}.mlp.down_exps_proj.weight",
    ),
];

const EXPERTS: &[&str] = &[
    "blk.{i}.ffn_gate_exps.weight",
    "blk.{i}.ffn_up_exps.weight",
    "blk.{i}.ffn_down_exps.weight",
];

pub const PACK_LAYOUT: PackLayout = PackLayout {
    source: "FastFlowLM/FLM_Q4NX_Converter q4nx/models/qwen35moe.py",
    experts: EXPERTS,
    // `_Q4_1_NAMES`: the three expert stacks; the rest quantized is Q8_0.
    q4: EXPERTS,
    // "dtype policy: BF16 norms/router/gates/alpha/beta/conv1d/ssm_norm/embed".
    bf16: &[
        "token_embd.weight",
        "blk.{i}.ffn_gate_inp.weight",
        "blk.{i}.ffn_gate_inp_shexp.weight",
        "blk.{i}.ssm_alpha.weight",
        "blk.{i}.ssm_beta.weight",
        "blk.{i}.ssm_conv1d.weight",
    ],
    // "F32 ssm_a + ssm_dt.bias".
    f32: &["blk.{i}.ssm_a", "blk.{i}.ssm_dt.bias"],
    resolve: layout,
};

/// A positive integer of config.json, or the key and why not.
fn size(c: &Json, key: &str) -> std::result::Result<usize, (String, String)> {
    match c.get(key).and_then(Json::as_u64) {
        Some(v) if v > 0 && v <= super::decls::MAX_SIZE as u64 => Ok(v as usize),
        Some(v) => Err((
            key.into(),
            format!("{v} is not a size the pack layout can use"),
        )),
        None => Err((
            key.into(),
            "is required to lay out the pack's reordered tensors".into(),
        )),
    }
}

/// The converter's transforms for this model's sizes. It hard-codes the
/// 35B-A3B's (16 key heads, 32 value heads of 128, head dim 256, q/k | v
/// split at the halves); these are its rules with the sizes read from
/// config.json: V heads tiled -> grouped in attn_qkv's V rows, attn_gate's
/// rows, ssm_out's columns, alpha/beta rows, ssm_a, dt bias and the conv's V
/// channels; attn_q's [head][q | gate] rows -> [q | gate][head].
fn layout(c: &Json) -> std::result::Result<Layout, (String, String)> {
    let n_k = size(c, "linear_num_key_heads")?;
    let n_v = size(c, "linear_num_value_heads")?;
    let d_k = size(c, "linear_key_head_dim")?;
    let d_v = size(c, "linear_value_head_dim")?;
    let n_head = size(c, "num_attention_heads")?;
    let hd = size(c, "head_dim")?;
    let n_expert = size(c, "num_experts")?;
    let ff_exp = size(c, "moe_intermediate_size")?;
    let ff_sh = size(c, "shared_expert_intermediate_size")?;
    if !n_v.is_multiple_of(n_k) {
        return Err((
            "linear_num_value_heads".into(),
            format!("{n_v} is not a multiple of linear_num_key_heads {n_k}"),
        ));
    }
    let qk = 2 * n_k * d_k;
    let q_rows: Vec<usize> = (0..2)
        .flat_map(|p| (0..n_head).flat_map(move |g| (0..hd).map(move |h| (g * 2 + p) * hd + h)))
        .collect();
    Ok(Layout {
        ops: vec![
            (
                "blk.{i}.attn_qkv.weight",
                vec![Op::Rows(after(qk, v_heads_grouped(n_k, n_v, d_v)))],
            ),
            (
                "blk.{i}.attn_gate.weight",
                vec![Op::Rows(v_heads_grouped(n_k, n_v, d_v))],
            ),
            (
                "blk.{i}.ssm_out.weight",
                vec![Op::Cols {
                    unit: d_v,
                    perm: v_heads_grouped(n_k, n_v, 1),
                }],
            ),
            (
                "blk.{i}.ssm_alpha.weight",
                vec![Op::Rows(v_heads_grouped(n_k, n_v, 1)), Op::Transpose],
            ),
            (
                "blk.{i}.ssm_beta.weight",
                vec![Op::Rows(v_heads_grouped(n_k, n_v, 1)), Op::Transpose],
            ),
            (
                "blk.{i}.ssm_conv1d.weight",
                vec![
                    Op::Rows(after(qk, v_heads_grouped(n_k, n_v, d_v))),
                    Op::Transpose,
                ],
            ),
            (
                "blk.{i}.ssm_a",
                vec![Op::Rows(v_heads_grouped(n_k, n_v, 1))],
            ),
            (
                "blk.{i}.ssm_dt.bias",
                vec![Op::Rows(v_heads_grouped(n_k, n_v, 1))],
            ),
            ("blk.{i}.attn_q.weight", vec![Op::Rows(q_rows)]),
            ("blk.{i}.ffn_gate_inp.weight", vec![Op::Transpose]),
        ],
        widths: vec![
            ("blk.{i}.attn_output.weight", n_head * hd),
            ("blk.{i}.ssm_out.weight", n_v * d_v),
            ("blk.{i}.ffn_down_exps.weight", ff_exp),
            ("blk.{i}.ffn_down_shexp.weight", ff_sh),
        ],
        n_expert,
    })
}

/// config.json keys of a Qwen3.5-MoE text config (HF `Qwen3_5MoeTextConfig`).
fn config_json(sem: &Semantics, c: &mut Json) {
    if let Some(dn) = &sem.delta_net {
        let dn = &dn.value;
        c["linear_conv_kernel_dim"] = json!(dn.conv_kernel);
        c["linear_num_key_heads"] = json!(dn.n_k_heads);
        c["linear_num_value_heads"] = json!(dn.n_v_heads);
        c["linear_key_head_dim"] = json!(dn.head_k_dim);
        c["linear_value_head_dim"] = json!(dn.head_v_dim);
    }
    c["layer_types"] = json!(sem
        .layer_kinds
        .value
        .iter()
        .map(|k| match k {
            LayerKind::DeltaNet => "linear_attention",
            _ => "full_attention",
        })
        .collect::<Vec<_>>());
    c["partial_rotary_factor"] =
        json!(sem.rope_full.value.n_rot as f64 / sem.dims.head_dim_k as f64);
    c["attn_output_gate"] = json!(true);
    if let Some(m) = &sem.moe {
        let m = &m.value;
        c["num_experts"] = json!(m.n_expert);
        c["num_experts_per_tok"] = json!(m.n_used);
        c["moe_intermediate_size"] = json!(m.n_ff_exp);
        c["shared_expert_intermediate_size"] = json!(m.shared.value);
        c["norm_topk_prob"] = json!(m.norm_weights.value);
    }
}
