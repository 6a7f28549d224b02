//! The name table: GGUF tensor names (what the loader asks for) and the
//! Hugging Face style names FastFlowLM's converter writes into `model.q4nx`.
//! Data, not branches: a family's table is the common rows below with its
//! own rows (declared in its family file) replacing those of the same GGUF
//! name.

use crate::families::Family;
pub use crate::families::NameRow as Row;

const COMMON: &[Row] = &[
    ("token_embd.weight", "model.embed_tokens.weight"),
    ("output_norm.weight", "model.norm.weight"),
    ("output.weight", "lm_head.weight"),
    ("rope_freqs.weight", "rope_freqs.weight"),
    (
        "blk.{i}.attn_norm.weight",
        "model.layers.{i}.input_layernorm.weight",
    ),
    (
        "blk.{i}.attn_q.weight",
        "model.layers.{i}.self_attn.q_proj.weight",
    ),
    (
        "blk.{i}.attn_k.weight",
        "model.layers.{i}.self_attn.k_proj.weight",
    ),
    (
        "blk.{i}.attn_v.weight",
        "model.layers.{i}.self_attn.v_proj.weight",
    ),
    (
        "blk.{i}.attn_output.weight",
        "model.layers.{i}.self_attn.o_proj.weight",
    ),
    (
        "blk.{i}.attn_q.bias",
        "model.layers.{i}.self_attn.q_proj.bias",
    ),
    (
        "blk.{i}.attn_k.bias",
        "model.layers.{i}.self_attn.k_proj.bias",
    ),
    (
        "blk.{i}.attn_v.bias",
        "model.layers.{i}.self_attn.v_proj.bias",
    ),
    (
        "blk.{i}.attn_q_norm.weight",
        "model.layers.{i}.self_attn.q_norm.weight",
    ),
    (
        "blk.{i}.attn_k_norm.weight",
        "model.layers.{i}.self_attn.k_norm.weight",
    ),
    (
        "blk.{i}.ffn_norm.weight",
        "model.layers.{i}.post_attention_layernorm.weight",
    ),
    (
        "blk.{i}.ffn_gate.weight",
        "model.layers.{i}.mlp.gate_proj.weight",
    ),
    (
        "blk.{i}.ffn_up.weight",
        "model.layers.{i}.mlp.up_proj.weight",
    ),
    (
        "blk.{i}.ffn_down.weight",
        "model.layers.{i}.mlp.down_proj.weight",
    ),
];

/// Tiled matrices whose input width is not the hidden size: (matrix, the
/// matrices whose row count is its input width, first present wins). Tiles
/// do not state a matrix's exact input width; the layer-body parts these
/// belong to (attention, FFN, Gemma 4's per-layer input branch) do.
pub const INPUT_FROM: &[(&str, &[&str])] = &[
    ("blk.{i}.attn_output.weight", &["blk.{i}.attn_q.weight"]),
    (
        "blk.{i}.ffn_down.weight",
        &["blk.{i}.ffn_gate.weight", "blk.{i}.ffn_up.weight"],
    ),
    ("blk.{i}.proj.weight", &["blk.{i}.inp_gate.weight"]),
];

/// 2-D tensors read one row per token (embedding tables), not multiplied:
/// an import keeps them BF16 rather than tiling them.
pub const LOOKUP_TABLES: &[&str] = &["token_embd.weight", "per_layer_token_embd.weight"];

/// The matrices whose row count gives `gguf`'s input width, when its input
/// is not the hidden size.
pub fn input_from(gguf: &str) -> Option<Vec<String>> {
    INPUT_FROM.iter().find_map(|(m, partners)| {
        matches(m, gguf).map(|i| partners.iter().map(|p| fill(p, i)).collect())
    })
}

/// Whether the family's own rows drop `gguf` from its packs (a pack name
/// ""): config.json restates what it held.
pub fn dropped(family: &Family, gguf: &str) -> bool {
    family.pack.as_ref().is_some_and(|p| {
        p.rows
            .iter()
            .any(|(g, h)| h.is_empty() && matches(g, gguf).is_some())
    })
}

/// A family's table: the common rows with the family's own rows
/// (`Family::pack`) replacing those of the same GGUF name; `None` when the
/// family's packs are not read.
pub fn table(family: &Family) -> Option<Vec<Row>> {
    let own = family.pack.as_ref()?.rows;
    let mut rows: Vec<Row> = COMMON
        .iter()
        .filter(|(g, _)| !own.iter().any(|(o, _)| o == g))
        .copied()
        .collect();
    rows.extend(own.iter().filter(|(_, h)| !h.is_empty()));
    Some(rows)
}

/// Matches `name` against a pattern with one `{i}`; the layer index when it fits.
fn matches(pattern: &str, name: &str) -> Option<Option<usize>> {
    match pattern.split_once("{i}") {
        None => (pattern == name).then_some(None),
        Some((pre, post)) => {
            let mid = name.strip_prefix(pre)?.strip_suffix(post)?;
            if mid.is_empty() || !mid.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            mid.parse().ok().map(Some)
        }
    }
}

fn fill(pattern: &str, i: Option<usize>) -> String {
    match i {
        Some(i) => pattern.replace("{i}", &i.to_string()),
        None => pattern.to_string(),
    }
}

/// The pack name of a GGUF tensor name.
pub fn to_pack(rows: &[Row], gguf: &str) -> Option<String> {
    rows.iter()
        .find_map(|(g, h)| matches(g, gguf).map(|i| fill(h, i)))
}

/// The GGUF name of a pack tensor name.
pub fn to_gguf(rows: &[Row], pack: &str) -> Option<String> {
    rows.iter()
        .find_map(|(g, h)| matches(h, pack).map(|i| fill(g, i)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_map_both_ways_per_family() {
        let fam = |a| table(crate::families::by_arch(a).unwrap());
        let g = fam("gemma3").unwrap();
        assert_eq!(
            to_pack(&g, "blk.3.ffn_norm.weight").as_deref(),
            Some("model.layers.3.pre_feedforward_layernorm.weight")
        );
        assert_eq!(
            to_gguf(&g, "model.layers.12.post_attention_layernorm.weight").as_deref(),
            Some("blk.12.post_attention_norm.weight")
        );
        let l = fam("llama").unwrap();
        assert_eq!(
            to_gguf(&l, "model.layers.0.post_attention_layernorm.weight").as_deref(),
            Some("blk.0.ffn_norm.weight")
        );
        assert_eq!(
            to_pack(&l, "output.weight").as_deref(),
            Some("lm_head.weight")
        );
        let f = fam("lfm2").unwrap();
        assert_eq!(
            to_gguf(&f, "model.norm.weight").as_deref(),
            Some("token_embd_norm.weight")
        );
        assert_eq!(to_pack(&f, "output_norm.weight"), None);
        assert_eq!(
            to_gguf(&f, "model.layers.0.shortconv.conv.weight").as_deref(),
            Some("blk.0.shortconv.conv.weight")
        );
        assert_eq!(to_gguf(&l, "model.layers.x.mlp.up_proj.weight"), None);
        assert!(fam("qwen35").is_none());
    }
}
