//! The vision layout byte by byte against index formulas written here from
//! the converter's description, not from the module's code:
//! - every tensor BF16, torch's `.to(torch.bfloat16)`: round to nearest,
//!   ties to even ([`rne`]);
//! - `vision_mm_weight_rearrange` (q4nx/model_converter.py): pad N and K
//!   with zeros to a multiple of max(MM_N, MM_K), then einops
//!   `"(N mm_n) (K mm_k) -> N K (mm_n mm_k)"` ([`unblock`] takes a stored
//!   index apart that way);
//! - gemma3.py: `mm_input_projection_weight` is `weights.t()` first;
//! - qwen3vl.py: `torch.stack([weight, weight.1], dim=2)`;
//! - the name maps of configs/gemma3.json and configs/qwen3vl.json, written
//!   out below ([`gemma3_names`], [`qwen3vl_names`]).

use std::collections::BTreeSet;

use super::*;

fn mmproj(fixture: &str, file: &str) -> Gguf {
    Gguf::open(onebit_testdata::fixture(fixture).join(file)).unwrap()
}

/// torch's float32 -> bfloat16 for finite values: round to nearest, ties
/// to even.
fn rne(x: f32) -> u16 {
    let b = x.to_bits();
    ((b + 0x7fff + ((b >> 16) & 1)) >> 16) as u16
}

fn values(g: &Gguf, name: &str) -> (Vec<u64>, Vec<f32>) {
    let t = g.tensor(name).unwrap_or_else(|| panic!("{name}"));
    let mut v = vec![0f32; t.n_elements() as usize];
    blocks::dequantize(t.dtype, &g.tensor_bytes(t), &mut v).unwrap();
    (t.dims.clone(), v)
}

/// Stored index `f` of [N', K', MM_N * mm_k] taken apart as einops lays out
/// `(N mm_n) (K mm_k) -> N K (mm_n mm_k)`: the matrix row and column.
fn unblock(f: usize, kb: usize, mm_k: usize) -> (usize, usize) {
    let inner = 64 * mm_k;
    let (big_n, rest) = (f / (kb * inner), f % (kb * inner));
    let (big_k, r) = (rest / inner, rest % inner);
    (big_n * 64 + r / mm_k, big_k * mm_k + r % mm_k)
}

#[derive(Clone, Copy, Debug)]
enum Rule {
    Plain,
    /// A matrix [n][k]; `transposed`: the mmproj holds it as k rows of n.
    Blocks {
        transposed: bool,
    },
    Stack,
}

/// configs/gemma3.json's vision rows, pack name then mmproj name.
fn gemma3_names(n_layer: usize) -> Vec<(String, String, Rule)> {
    let mut v: Vec<(String, String, Rule)> = [
        (
            "vision_tower.vision_model.embeddings.patch_embedding.weight",
            "v.patch_embd.weight",
        ),
        (
            "vision_tower.vision_model.embeddings.patch_embedding.bias",
            "v.patch_embd.bias",
        ),
        (
            "vision_tower.vision_model.embeddings.position_embedding.weight",
            "v.position_embd.weight",
        ),
        (
            "vision_tower.vision_model.post_layernorm.weight",
            "v.post_ln.weight",
        ),
        (
            "vision_tower.vision_model.post_layernorm.bias",
            "v.post_ln.bias",
        ),
        (
            "multi_modal_projector.mm_soft_emb_norm.weight",
            "mm.soft_emb_norm.weight",
        ),
    ]
    .iter()
    .map(|(p, g)| (p.to_string(), g.to_string(), Rule::Plain))
    .collect();
    v.push((
        "multi_modal_projector.mm_input_projection_weight".into(),
        "mm.input_projection.weight".into(),
        Rule::Blocks { transposed: true },
    ));
    for i in 0..n_layer {
        let l = format!("vision_tower.vision_model.encoder.layers.{i}");
        for (p, g, blocked) in [
            ("layer_norm1.weight", "ln1.weight", false),
            ("layer_norm1.bias", "ln1.bias", false),
            ("layer_norm2.weight", "ln2.weight", false),
            ("layer_norm2.bias", "ln2.bias", false),
            ("self_attn.q_proj.weight", "attn_q.weight", true),
            ("self_attn.q_proj.bias", "attn_q.bias", false),
            ("self_attn.k_proj.weight", "attn_k.weight", true),
            ("self_attn.k_proj.bias", "attn_k.bias", false),
            ("self_attn.v_proj.weight", "attn_v.weight", true),
            ("self_attn.v_proj.bias", "attn_v.bias", false),
            ("self_attn.out_proj.weight", "attn_out.weight", true),
            ("self_attn.out_proj.bias", "attn_out.bias", false),
            ("mlp.fc1.weight", "ffn_up.weight", true),
            ("mlp.fc1.bias", "ffn_up.bias", false),
            ("mlp.fc2.weight", "ffn_down.weight", true),
            ("mlp.fc2.bias", "ffn_down.bias", false),
        ] {
            let rule = if blocked {
                Rule::Blocks { transposed: false }
            } else {
                Rule::Plain
            };
            v.push((format!("{l}.{p}"), format!("v.blk.{i}.{g}"), rule));
        }
    }
    v
}

/// configs/qwen3vl.json's vision rows; `deep[j]` is the block of
/// `deepstack_merger_list.{j}`.
fn qwen3vl_names(n_layer: usize, deep: &[usize]) -> Vec<(String, String, Rule)> {
    let b = Rule::Blocks { transposed: false };
    let mut v: Vec<(String, String, Rule)> = vec![
        (
            "model.visual.patch_embed.proj.weight".into(),
            "v.patch_embd.weight".into(),
            Rule::Stack,
        ),
        (
            "model.visual.patch_embed.proj.bias".into(),
            "v.patch_embd.bias".into(),
            Rule::Plain,
        ),
        (
            "model.visual.pos_embed.weight".into(),
            "v.position_embd.weight".into(),
            Rule::Plain,
        ),
        (
            "model.visual.merger.norm.weight".into(),
            "v.post_ln.weight".into(),
            Rule::Plain,
        ),
        (
            "model.visual.merger.norm.bias".into(),
            "v.post_ln.bias".into(),
            Rule::Plain,
        ),
        (
            "model.visual.merger.linear_fc1.weight".into(),
            "mm.0.weight".into(),
            b,
        ),
        (
            "model.visual.merger.linear_fc1.bias".into(),
            "mm.0.bias".into(),
            Rule::Plain,
        ),
        (
            "model.visual.merger.linear_fc2.weight".into(),
            "mm.2.weight".into(),
            b,
        ),
        (
            "model.visual.merger.linear_fc2.bias".into(),
            "mm.2.bias".into(),
            Rule::Plain,
        ),
    ];
    for (j, l) in deep.iter().enumerate() {
        for (p, g, rule) in [
            ("norm.weight", "norm.weight", Rule::Plain),
            ("norm.bias", "norm.bias", Rule::Plain),
            ("linear_fc1.weight", "fc1.weight", b),
            ("linear_fc1.bias", "fc1.bias", Rule::Plain),
            ("linear_fc2.weight", "fc2.weight", b),
            ("linear_fc2.bias", "fc2.bias", Rule::Plain),
        ] {
            v.push((
                format!("model.visual.deepstack_merger_list.{j}.{p}"),
                format!("v.deepstack.{l}.{g}"),
                rule,
            ));
        }
    }
    for i in 0..n_layer {
        for (p, g, rule) in [
            ("attn.qkv.weight", "attn_qkv.weight", b),
            ("attn.qkv.bias", "attn_qkv.bias", Rule::Plain),
            ("attn.proj.weight", "attn_out.weight", b),
            ("attn.proj.bias", "attn_out.bias", Rule::Plain),
            ("mlp.linear_fc1.weight", "ffn_up.weight", b),
            ("mlp.linear_fc1.bias", "ffn_up.bias", Rule::Plain),
            ("mlp.linear_fc2.weight", "ffn_down.weight", b),
            ("mlp.linear_fc2.bias", "ffn_down.bias", Rule::Plain),
            ("norm1.weight", "ln1.weight", Rule::Plain),
            ("norm1.bias", "ln1.bias", Rule::Plain),
            ("norm2.weight", "ln2.weight", Rule::Plain),
            ("norm2.bias", "ln2.bias", Rule::Plain),
        ] {
            v.push((
                format!("model.visual.blocks.{i}.{p}"),
                format!("v.blk.{i}.{g}"),
                rule,
            ));
        }
    }
    v
}

/// Every stored byte of `imp` against the formulas; the count of values
/// checked and of padding values (all zero).
fn check_bytes(
    g: &Gguf,
    imp: &ImportedVision,
    names: &[(String, String, Rule)],
    mm_k: usize,
) -> (usize, usize) {
    let stored: BTreeSet<&str> = imp.tensors.iter().map(|t| t.name.as_str()).collect();
    let want: BTreeSet<&str> = names.iter().map(|n| n.0.as_str()).collect();
    assert_eq!(stored, want, "the converter's names");
    let pad = 64.max(mm_k);
    let (mut checked, mut padding) = (0, 0);
    for (pack, gguf, rule) in names {
        let t = imp.tensors.iter().find(|t| &t.name == pack).unwrap();
        assert_eq!(t.dtype, StDtype::BF16, "{pack}");
        let data: Vec<u16> = t
            .data
            .chunks_exact(2)
            .map(|c| u16::from_le_bytes([c[0], c[1]]))
            .collect();
        let (dims, v) = values(g, gguf);
        match rule {
            Rule::Plain => {
                let shape: Vec<u64> = dims.iter().rev().copied().collect();
                assert_eq!(t.shape, shape, "{pack}");
                for (i, x) in v.iter().enumerate() {
                    assert_eq!(data[i], rne(*x), "{pack} value {i}");
                }
                checked += v.len();
            }
            Rule::Blocks { transposed } => {
                // The converter's matrix: (out, in) = the mmproj's row-major
                // shape, or its transpose.
                let (n, k) = if *transposed {
                    (dims[0] as usize, dims[1] as usize)
                } else {
                    (dims[1] as usize, dims[0] as usize)
                };
                let at = |r: usize, c: usize| {
                    if *transposed {
                        v[c * n + r]
                    } else {
                        v[r * k + c]
                    }
                };
                let (np, kp) = (n.div_ceil(pad) * pad, k.div_ceil(pad) * pad);
                assert_eq!(
                    t.shape,
                    vec![(np / 64) as u64, (kp / mm_k) as u64, (64 * mm_k) as u64],
                    "{pack}"
                );
                for (f, &x) in data.iter().enumerate() {
                    let (r, c) = unblock(f, kp / mm_k, mm_k);
                    if r < n && c < k {
                        assert_eq!(x, rne(at(r, c)), "{pack} stored value {f} = ({r}, {c})");
                        checked += 1;
                    } else {
                        assert_eq!(x, 0, "{pack} padding value {f} = ({r}, {c})");
                        padding += 1;
                    }
                }
            }
            Rule::Stack => {
                let (dims1, v1) = values(g, &format!("{gguf}.1"));
                assert_eq!(dims, dims1);
                let (p, e) = (dims[0] as usize, dims[3] as usize);
                assert_eq!(t.shape, vec![e as u64, 3, 2, p as u64, p as u64], "{pack}");
                for (f, &x) in data.iter().enumerate() {
                    let (q, frame, ec) = (f % (p * p), (f / (p * p)) % 2, f / (2 * p * p));
                    let src = if frame == 0 { &v } else { &v1 };
                    assert_eq!(x, rne(src[ec * p * p + q]), "{pack} value {f}");
                }
                checked += data.len();
            }
        }
    }
    (checked, padding)
}

/// The blocks the mmproj's `clip.vision.is_deepstack_layers` marks.
fn deepstack_blocks(g: &Gguf) -> Vec<usize> {
    g.array_opt("clip.vision.is_deepstack_layers")
        .unwrap()
        .unwrap()
        .iter()
        .enumerate()
        .filter(|(_, v)| v.as_bool() == Some(true))
        .map(|(i, _)| i)
        .collect()
}

fn text_config(hidden: usize) -> Json {
    json!({"model_type": "text", "hidden_size": hidden})
}

#[test]
fn bf16_rounding_is_torchs_nearest_even() {
    // 1 + 2^-8 lies halfway between two bf16 values: ties go to the even one.
    for (x, want) in [
        (f32::from_bits(0x3f80_8000), 0x3f80),
        (f32::from_bits(0x3f81_8000), 0x3f82),
        (f32::from_bits(0x3f80_8001), 0x3f81),
        (-1.5f32, 0xbfc0),
    ] {
        assert_eq!(to_bf16(&[x])[0], want, "{x}");
        assert_eq!(rne(x), want, "{x}");
    }
}

#[test]
fn gemma3_layout_is_the_converters_byte_for_byte() {
    for file in ["mmproj.gguf", "mmproj-f16.gguf"] {
        let g = mmproj("gemma3-vision", file);
        let imp = import(&g, &text_config(64)).unwrap();
        let (checked, padding) = check_bytes(&g, &imp, &gemma3_names(2), 256);
        // 2 blocks of q/k/v/out 32 x 32 and fc1/fc2 32 x 64, each padded to
        // 256 x 256; the projection 64 x 32, padded to 256 x 256.
        assert_eq!(
            padding,
            2 * 6 * 65536 + 65536 - (2 * (4 * 1024 + 2 * 2048) + 2048)
        );
        assert!(checked > 20_000, "{checked}");
    }
}

#[test]
fn qwen3vl_layout_is_the_converters_byte_for_byte() {
    let g = mmproj("qwen3vl-vision", "mmproj.gguf");
    let deep = deepstack_blocks(&g);
    assert!(!deep.is_empty(), "the fixture has deepstack mergers");
    let imp = import(&g, &text_config(64)).unwrap();
    let (checked, padding) = check_bytes(&g, &imp, &qwen3vl_names(3, &deep), 512);
    assert!(checked > 40_000 && padding > 0, "{checked} {padding}");
    assert_eq!(
        imp.config["vision_config"]["deepstack_visual_indexes"],
        json!(deep)
    );
}

#[test]
fn the_block_index_is_einops_layout() {
    // block_index and unblock agree on every element of a 130 x 300 matrix
    // with both MM_K values the converter's configs use.
    for mm_k in [256, 512] {
        let (n, k) = (130, 300);
        let kp = blocks_shape(n, k, mm_k)[1] as usize * mm_k;
        for r in 0..n {
            for c in 0..k {
                let f = block_index(r, c, kp, mm_k);
                assert_eq!(unblock(f, kp / mm_k, mm_k), (r, c), "mm_k {mm_k}");
            }
        }
    }
}

#[test]
fn the_configs_state_the_mmprojs_keys_in_hfs_terms() {
    let g = mmproj("gemma3-vision", "mmproj.gguf");
    let imp = import(&g, &text_config(64)).unwrap();
    let c = &imp.config;
    assert_eq!(
        c["architectures"],
        json!(["Gemma3ForConditionalGeneration"])
    );
    assert_eq!(c["model_type"], "gemma3");
    assert_eq!(c["text_config"], text_config(64));
    assert_eq!(c["mm_tokens_per_image"], 16);
    let vc = &c["vision_config"];
    for (k, v) in [
        ("hidden_size", json!(32)),
        ("intermediate_size", json!(64)),
        ("num_hidden_layers", json!(2)),
        ("num_attention_heads", json!(2)),
        ("image_size", json!(32)),
        ("patch_size", json!(2)),
        ("layer_norm_eps", json!(1e-6)),
        ("hidden_act", json!("gelu_pytorch_tanh")),
    ] {
        assert_eq!(vc[k], v, "vision_config.{k}");
    }
    assert_eq!(imp.preprocessor["image_mean"], json!([0.48, 0.5, 0.52]));
    assert_eq!(imp.preprocessor["image_std"], json!([0.26, 0.27, 0.28]));

    let g = mmproj("qwen3vl-vision", "mmproj.gguf");
    let imp = import(&g, &text_config(64)).unwrap();
    let vc = &imp.config["vision_config"];
    assert_eq!(
        imp.config["architectures"],
        json!(["Qwen3VLForConditionalGeneration"])
    );
    for (k, v) in [
        ("hidden_size", json!(32)),
        ("intermediate_size", json!(64)),
        ("depth", json!(3)),
        ("num_heads", json!(2)),
        ("patch_size", json!(4)),
        ("spatial_merge_size", json!(2)),
        ("out_hidden_size", json!(64)),
        ("num_position_embeddings", json!(64)),
        ("image_size", json!(32)),
    ] {
        assert_eq!(vc[k], v, "vision_config.{k}");
    }
}
