//! FastFlowLM's vision packs: the vision tower a pack carries beside
//! `model.q4nx`, in `vision_weights.q4nx`, as FastFlowLM's public converter
//! writes it (FastFlowLM/FLM_Q4NX_Converter, `convert.py -t vision` run on
//! the model's mmproj GGUF: `q4nx/models/gemma3.py` and `qwen3vl.py` with
//! the name maps of `configs/gemma3.json` and `configs/qwen3vl.json`, and
//! `q4nx/model_converter.py`'s `vision_mm_weight_rearrange`; the pack's
//! file list, `vision_weights.q4nx` among them, is its README's).
//!
//! What the converter stores, a safetensors file whose every tensor is BF16
//! (the mmproj's F32 and F16 values rounded to nearest even, BF16 kept):
//! - each tensor under an HF-style name ([`GEMMA3`], [`QWEN3VL`]: rows of
//!   mmproj name, pack name, [`Op`]);
//! - vectors and the patch and position embeddings in the mmproj's
//!   row-major shape, its ggml dims reversed ([`Op::Plain`]);
//! - every matrix of the blocks, the projector and qwen3vl's mergers as
//!   blocks ([`Op::Blocks`]): the matrix of N outputs by K inputs, zero-
//!   padded in both dimensions to a multiple of max(MM_N, MM_K), stored
//!   [Np / MM_N, Kp / MM_K, MM_N MM_K] with element (n, k) at
//!   [n / MM_N][k / MM_K][(n % MM_N) MM_K + k % MM_K] ([`block_index`]).
//!   MM_N is 64 and MM_K 256 (gemma3) or 512 (qwen3vl) in the converter's
//!   configs (`vision_config`); a reader takes MM_K from the row width;
//! - gemma3's `mm.input_projection` (ggml [n_text, n_embd], which the tower
//!   uses transposed) transposed to n_text rows of n_embd first
//!   ([`Op::TransposedBlocks`]);
//! - qwen3vl's two temporal patch kernels (`v.patch_embd.weight` and
//!   `.weight.1`, each [n_embd, 3, p, p]) stacked on dimension 2 as one
//!   tensor [n_embd, 3, 2, p, p] ([`Op::StackFrames`]);
//! - qwen3vl's deepstack mergers as `deepstack_merger_list.{j}`, j-th
//!   deepstack block in ascending order: the converter's table names blocks
//!   5, 11 and 17 (Qwen3-VL-4B's); HF's config states the blocks as
//!   `vision_config.deepstack_visual_indexes`, which is read where present
//!   (and written by an import, which takes any blocks).
//!
//! The pack states no `clip.*` keys: the tower's rules are read from
//! config.json's `vision_config` (HF's keys), `preprocessor_config.json`
//! where the pack has one, and stated defaults where neither says
//! ([`stated`]: each key with its source); the encoder then runs unchanged
//! ([`VisionTower::from_decls`]).
//!
//! Invariant: [`open`] of what [`import`] writes is the mmproj's tower with
//! every weight rounded to BF16 (exact for BF16 sources) and the same rules
//! (an import checks it); every byte the blocks pad is zero and every
//! stored byte is re-made from the tensors read ([`verify`]). A vision file
//! of another layout (Qwen2.5-VL's, Gemma 4's) or holding a tensor the
//! layout does not name is refused by name.

use std::path::{Path, PathBuf};

use half::bf16;
use onebit_formats::gguf::Gguf;
use onebit_formats::safetensors::{self, SafeTensors, StDtype, StOut, StTensor};
use onebit_formats::{blocks, ByteView, GgmlType};
use serde_json::{json, Map, Value as Json};

use super::config::text_root;
use super::verify::LayoutCheck;
use super::{read_json, CONFIG};
use crate::error::{ModelError, Result};
use crate::families::decls::{Decls, Stated, MAX_SIZE};
use crate::vision::{gemma3, qwen3vl, TowerTensors, VisionTower};
use crate::weights::{RawTensor, TensorSource};

/// The vision tower's file in a pack.
pub const VISION_WEIGHTS: &str = "vision_weights.q4nx";
/// HF's image processor settings (mean, std), where a pack has them.
pub const PREPROCESSOR_CONFIG: &str = "preprocessor_config.json";
/// Rows of a block (`vision_MM_N` in every converter config).
pub const MM_N: usize = 64;

/// A matrix dimension, as the pack's config.json states it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Width {
    /// The tower's width (`vision_config.hidden_size`).
    Embd,
    /// Its MLP's (`vision_config.intermediate_size`).
    Ff,
    /// Three times the width (qwen3vl's fused q, k, v).
    Embd3,
    /// Four times the width (qwen3vl's 2 x 2 merged patches).
    Embd4,
    /// The text model's width (gemma3: the text hidden size; qwen3vl:
    /// `vision_config.out_hidden_size`).
    Text,
}

/// How the converter stores a tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// BF16 in the mmproj's row-major shape.
    Plain,
    /// A matrix of `n` outputs by `k` inputs in blocks.
    Blocks { n: Width, k: Width },
    /// The mmproj's matrix transposed (its ggml [n, k] read as `n` rows of
    /// `k`), then in blocks.
    TransposedBlocks { n: Width, k: Width },
    /// The two temporal patch kernels stacked on dimension 2.
    StackFrames,
}

/// One tensor: its mmproj name, its pack name, how it is stored. `{i}` is a
/// block; `{d}` a deepstack merger (in the mmproj its block, in the pack its
/// place in the list).
pub type Row = (&'static str, &'static str, Op);

/// One converter's vision layout.
pub struct Layout {
    /// The mmproj `clip.projector_type` whose tower it holds.
    pub projector: &'static str,
    /// Where it is read.
    pub source: &'static str,
    /// MM_K of the converter's config for this model (what an import writes).
    pub mm_k: usize,
    /// MM_K values the converter's configs with these names use (a reader
    /// takes MM_K from the row width and accepts these).
    pub mm_k_read: &'static [usize],
    pub rows: &'static [Row],
    /// HF's names for the whole model (config.json's `architectures`,
    /// `model_type`) and the vision config's `model_type`.
    pub hf_arch: &'static str,
    pub model_type: &'static str,
    pub vision_model_type: &'static str,
}

const fn blocks(n: Width, k: Width) -> Op {
    Op::Blocks { n, k }
}

use Op::Plain;
use Width::{Embd, Embd3, Embd4, Ff, Text};

/// `configs/gemma3.json`'s vision rows with `q4nx/models/gemma3.py`'s ops
/// (blocks for `q/k/v/out_proj`, `fc1`, `fc2`; the input projection
/// transposed first).
pub const GEMMA3_ROWS: &[Row] = &[
    (
        "v.patch_embd.weight",
        "vision_tower.vision_model.embeddings.patch_embedding.weight",
        Plain,
    ),
    (
        "v.patch_embd.bias",
        "vision_tower.vision_model.embeddings.patch_embedding.bias",
        Plain,
    ),
    (
        "v.position_embd.weight",
        "vision_tower.vision_model.embeddings.position_embedding.weight",
        Plain,
    ),
    (
        "v.post_ln.weight",
        "vision_tower.vision_model.post_layernorm.weight",
        Plain,
    ),
    (
        "v.post_ln.bias",
        "vision_tower.vision_model.post_layernorm.bias",
        Plain,
    ),
    (
        "v.blk.{i}.ln1.weight",
        "vision_tower.vision_model.encoder.layers.{i}.layer_norm1.weight",
        Plain,
    ),
    (
        "v.blk.{i}.ln1.bias",
        "vision_tower.vision_model.encoder.layers.{i}.layer_norm1.bias",
        Plain,
    ),
    (
        "v.blk.{i}.ln2.weight",
        "vision_tower.vision_model.encoder.layers.{i}.layer_norm2.weight",
        Plain,
    ),
    (
        "v.blk.{i}.ln2.bias",
        "vision_tower.vision_model.encoder.layers.{i}.layer_norm2.bias",
        Plain,
    ),
    (
        "v.blk.{i}.attn_q.weight",
        "vision_tower.vision_model.encoder.layers.{i}.self_attn.q_proj.weight",
        blocks(Embd, Embd),
    ),
    (
        "v.blk.{i}.attn_q.bias",
        "vision_tower.vision_model.encoder.layers.{i}.self_attn.q_proj.bias",
        Plain,
    ),
    (
        "v.blk.{i}.attn_k.weight",
        "vision_tower.vision_model.encoder.layers.{i}.self_attn.k_proj.weight",
        blocks(Embd, Embd),
    ),
    (
        "v.blk.{i}.attn_k.bias",
        "vision_tower.vision_model.encoder.layers.{i}.self_attn.k_proj.bias",
        Plain,
    ),
    (
        "v.blk.{i}.attn_v.weight",
        "vision_tower.vision_model.encoder.layers.{i}.self_attn.v_proj.weight",
        blocks(Embd, Embd),
    ),
    (
        "v.blk.{i}.attn_v.bias",
        "vision_tower.vision_model.encoder.layers.{i}.self_attn.v_proj.bias",
        Plain,
    ),
    (
        "v.blk.{i}.attn_out.weight",
        "vision_tower.vision_model.encoder.layers.{i}.self_attn.out_proj.weight",
        blocks(Embd, Embd),
    ),
    (
        "v.blk.{i}.attn_out.bias",
        "vision_tower.vision_model.encoder.layers.{i}.self_attn.out_proj.bias",
        Plain,
    ),
    (
        "v.blk.{i}.ffn_up.weight",
        "vision_tower.vision_model.encoder.layers.{i}.mlp.fc1.weight",
        blocks(Ff, Embd),
    ),
    (
        "v.blk.{i}.ffn_up.bias",
        "vision_tower.vision_model.encoder.layers.{i}.mlp.fc1.bias",
        Plain,
    ),
    (
        "v.blk.{i}.ffn_down.weight",
        "vision_tower.vision_model.encoder.layers.{i}.mlp.fc2.weight",
        blocks(Embd, Ff),
    ),
    (
        "v.blk.{i}.ffn_down.bias",
        "vision_tower.vision_model.encoder.layers.{i}.mlp.fc2.bias",
        Plain,
    ),
    (
        "mm.soft_emb_norm.weight",
        "multi_modal_projector.mm_soft_emb_norm.weight",
        Plain,
    ),
    (
        "mm.input_projection.weight",
        "multi_modal_projector.mm_input_projection_weight",
        Op::TransposedBlocks { n: Text, k: Embd },
    ),
];

/// `configs/qwen3vl.json`'s vision rows with `q4nx/models/qwen3vl.py`'s ops
/// (blocks for every name ending `fc1.weight`, `fc2.weight`,
/// `attn.proj.weight`, `attn.qkv.weight`; the patch kernels stacked).
pub const QWEN3VL_ROWS: &[Row] = &[
    (
        "v.patch_embd.weight",
        "model.visual.patch_embed.proj.weight",
        Op::StackFrames,
    ),
    (
        "v.patch_embd.bias",
        "model.visual.patch_embed.proj.bias",
        Plain,
    ),
    (
        "v.position_embd.weight",
        "model.visual.pos_embed.weight",
        Plain,
    ),
    ("v.post_ln.weight", "model.visual.merger.norm.weight", Plain),
    ("v.post_ln.bias", "model.visual.merger.norm.bias", Plain),
    (
        "mm.0.weight",
        "model.visual.merger.linear_fc1.weight",
        blocks(Embd4, Embd4),
    ),
    ("mm.0.bias", "model.visual.merger.linear_fc1.bias", Plain),
    (
        "mm.2.weight",
        "model.visual.merger.linear_fc2.weight",
        blocks(Text, Embd4),
    ),
    ("mm.2.bias", "model.visual.merger.linear_fc2.bias", Plain),
    (
        "v.deepstack.{d}.norm.weight",
        "model.visual.deepstack_merger_list.{d}.norm.weight",
        Plain,
    ),
    (
        "v.deepstack.{d}.norm.bias",
        "model.visual.deepstack_merger_list.{d}.norm.bias",
        Plain,
    ),
    (
        "v.deepstack.{d}.fc1.weight",
        "model.visual.deepstack_merger_list.{d}.linear_fc1.weight",
        blocks(Embd4, Embd4),
    ),
    (
        "v.deepstack.{d}.fc1.bias",
        "model.visual.deepstack_merger_list.{d}.linear_fc1.bias",
        Plain,
    ),
    (
        "v.deepstack.{d}.fc2.weight",
        "model.visual.deepstack_merger_list.{d}.linear_fc2.weight",
        blocks(Text, Embd4),
    ),
    (
        "v.deepstack.{d}.fc2.bias",
        "model.visual.deepstack_merger_list.{d}.linear_fc2.bias",
        Plain,
    ),
    (
        "v.blk.{i}.attn_qkv.weight",
        "model.visual.blocks.{i}.attn.qkv.weight",
        blocks(Embd3, Embd),
    ),
    (
        "v.blk.{i}.attn_qkv.bias",
        "model.visual.blocks.{i}.attn.qkv.bias",
        Plain,
    ),
    (
        "v.blk.{i}.attn_out.weight",
        "model.visual.blocks.{i}.attn.proj.weight",
        blocks(Embd, Embd),
    ),
    (
        "v.blk.{i}.attn_out.bias",
        "model.visual.blocks.{i}.attn.proj.bias",
        Plain,
    ),
    (
        "v.blk.{i}.ffn_up.weight",
        "model.visual.blocks.{i}.mlp.linear_fc1.weight",
        blocks(Ff, Embd),
    ),
    (
        "v.blk.{i}.ffn_up.bias",
        "model.visual.blocks.{i}.mlp.linear_fc1.bias",
        Plain,
    ),
    (
        "v.blk.{i}.ffn_down.weight",
        "model.visual.blocks.{i}.mlp.linear_fc2.weight",
        blocks(Embd, Ff),
    ),
    (
        "v.blk.{i}.ffn_down.bias",
        "model.visual.blocks.{i}.mlp.linear_fc2.bias",
        Plain,
    ),
    (
        "v.blk.{i}.ln1.weight",
        "model.visual.blocks.{i}.norm1.weight",
        Plain,
    ),
    (
        "v.blk.{i}.ln1.bias",
        "model.visual.blocks.{i}.norm1.bias",
        Plain,
    ),
    (
        "v.blk.{i}.ln2.weight",
        "model.visual.blocks.{i}.norm2.weight",
        Plain,
    ),
    (
        "v.blk.{i}.ln2.bias",
        "model.visual.blocks.{i}.norm2.bias",
        Plain,
    ),
];

pub const GEMMA3: Layout = Layout {
    projector: gemma3::PROJECTOR,
    source: "FastFlowLM/FLM_Q4NX_Converter q4nx/models/gemma3.py, configs/gemma3.json (vision_MM_K 256, vision_MM_N 64)",
    mm_k: 256,
    mm_k_read: &[256],
    rows: GEMMA3_ROWS,
    hf_arch: "Gemma3ForConditionalGeneration",
    model_type: "gemma3",
    vision_model_type: "siglip_vision_model",
};

/// Qwen3-VL's; Qwen3.5's vision packs (`q4nx/models/qwen35.py`, the same
/// names, MM_K 256 or 512 by model) read the same way.
pub const QWEN3VL: Layout = Layout {
    projector: qwen3vl::PROJECTOR,
    source: "FastFlowLM/FLM_Q4NX_Converter q4nx/models/qwen3vl.py, configs/qwen3vl.json (vision_MM_K 512, vision_MM_N 64)",
    mm_k: 512,
    mm_k_read: &[512, 256],
    rows: QWEN3VL_ROWS,
    hf_arch: "Qwen3VLForConditionalGeneration",
    model_type: "qwen3_vl",
    vision_model_type: "qwen3_vl",
};

/// The layouts onebit reads and writes.
pub const LAYOUTS: &[&Layout] = &[&GEMMA3, &QWEN3VL];

/// The deepstack blocks `configs/qwen3vl.json` names (as list entries 0, 1, 2).
pub const CONVERTER_DEEPSTACK: &[usize] = &[5, 11, 17];

/// Vision layouts of the converter whose towers onebit does not run: a
/// pack tensor name they alone use, and what they are.
pub const OTHER_LAYOUTS: &[(&str, &str)] = &[
    (
        "model.visual.merger.ln_q.",
        "FastFlowLM's Qwen2.5-VL vision layout (q4nx/models/qwen2vl.py; llama.cpp projector qwen2.5vl_merger)",
    ),
    (
        "model.vision.",
        "FastFlowLM's Gemma 4 vision layout (q4nx/models/gemma4.py; llama.cpp projector gemma4v)",
    ),
];

/// The layout for a `clip.projector_type`.
pub fn layout_for(projector: &str) -> Option<&'static Layout> {
    LAYOUTS.iter().copied().find(|l| l.projector == projector)
}

/// Where element (n, k) of a matrix sits in its blocks (`ncols` = Kp).
pub fn block_index(n: usize, k: usize, kp: usize, mm_k: usize) -> usize {
    let kb = kp / mm_k;
    ((n / MM_N * kb + k / mm_k) * MM_N + n % MM_N) * mm_k + k % mm_k
}

/// The padding multiple of both dimensions: max(MM_N, MM_K).
pub fn pad_of(mm_k: usize) -> usize {
    MM_N.max(mm_k)
}

/// The stored shape of an `n` x `k` matrix in blocks.
pub fn blocks_shape(n: usize, k: usize, mm_k: usize) -> [u64; 3] {
    let p = pad_of(mm_k);
    [
        (n.div_ceil(p) * p / MM_N) as u64,
        (k.div_ceil(p) * p / mm_k) as u64,
        (MM_N * mm_k) as u64,
    ]
}

/// `w` (\[n\]\[k\], row-major) in blocks.
pub fn to_blocks(w: &[u16], n: usize, k: usize, mm_k: usize) -> Vec<u16> {
    let s = blocks_shape(n, k, mm_k);
    let kp = s[1] as usize * mm_k;
    let mut out = vec![0u16; s.iter().product::<u64>() as usize];
    for r in 0..n {
        for c in 0..k {
            out[block_index(r, c, kp, mm_k)] = w[r * k + c];
        }
    }
    out
}

/// The \[n\]\[k\] matrix back from its blocks (padding dropped).
pub fn from_blocks(b: &[u16], n: usize, k: usize, mm_k: usize) -> Vec<u16> {
    let kp = blocks_shape(n, k, mm_k)[1] as usize * mm_k;
    let mut out = vec![0u16; n * k];
    for r in 0..n {
        for c in 0..k {
            out[r * k + c] = b[block_index(r, c, kp, mm_k)];
        }
    }
    out
}

/// `w` ([rows][cols]) transposed.
fn transpose(w: &[u16], rows: usize, cols: usize) -> Vec<u16> {
    let mut out = vec![0u16; w.len()];
    for r in 0..rows {
        for c in 0..cols {
            out[c * rows + r] = w[r * cols + c];
        }
    }
    out
}

/// Two frames [outer][inner] stacked as [outer][2][inner].
fn stack_frames(f0: &[u16], f1: &[u16], inner: usize) -> Vec<u16> {
    let mut out = Vec::with_capacity(2 * f0.len());
    for (a, b) in f0.chunks_exact(inner).zip(f1.chunks_exact(inner)) {
        out.extend_from_slice(a);
        out.extend_from_slice(b);
    }
    out
}

/// Frame `t` of [outer][2][inner].
fn frame_of(s: &[u16], t: usize, inner: usize) -> Vec<u16> {
    s.chunks_exact(2 * inner)
        .flat_map(|c| c[t * inner..(t + 1) * inner].iter().copied())
        .collect()
}

fn u16s(b: &[u8]) -> Vec<u16> {
    b.chunks_exact(2)
        .map(|c| u16::from_le_bytes([c[0], c[1]]))
        .collect()
}

fn le(v: &[u16]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// `{i}` / `{d}` in `t` matched against `name`: Some(None) for a name with
/// no index, Some(Some(x)) with the index.
fn match_row(t: &str, name: &str) -> Option<Option<usize>> {
    let Some(at) = t.find('{') else {
        return (t == name).then_some(None);
    };
    let (pre, post) = (&t[..at], &t[at + 3..]);
    let mid = name.strip_prefix(pre)?.strip_suffix(post)?;
    if mid.is_empty() || !mid.bytes().all(|b| b.is_ascii_digit()) || mid.len() > 6 {
        return None;
    }
    mid.parse().ok().map(Some)
}

fn fill(t: &str, x: Option<usize>) -> String {
    match (t.find('{'), x) {
        (Some(at), Some(x)) => format!("{}{x}{}", &t[..at], &t[at + 3..]),
        _ => t.to_string(),
    }
}

fn is_deepstack(t: &str) -> bool {
    t.contains("{d}")
}

/// The sizes a layout's matrices are read with.
#[derive(Clone, Debug, PartialEq)]
pub struct Geometry {
    /// The tower's blocks (`vision_config.num_hidden_layers` / `depth`).
    pub blocks: usize,
    pub embd: usize,
    pub ff: usize,
    pub text: usize,
    /// The blocks followed by a deepstack merger (qwen3vl), in order: entry
    /// j is `deepstack_merger_list.{j}`; and where that was read.
    pub deepstack: Vec<usize>,
    pub deepstack_source: String,
}

impl Geometry {
    pub fn width(&self, w: Width) -> usize {
        match w {
            Embd => self.embd,
            Ff => self.ff,
            Embd3 => 3 * self.embd,
            Embd4 => 4 * self.embd,
            Text => self.text,
        }
    }

    /// The mmproj name of a pack name of `layout` (None: not one of its names).
    pub fn to_gguf(&self, layout: &Layout, pack: &str) -> Option<(String, &'static Row)> {
        layout.rows.iter().find_map(|row| {
            let x = match_row(row.1, pack)?;
            let x = match (is_deepstack(row.1), x) {
                (true, Some(j)) => Some(*self.deepstack.get(j)?),
                (_, x) => x,
            };
            Some((fill(row.0, x), row))
        })
    }

    /// The pack name of an mmproj name (None: the layout has no row for it).
    pub fn to_pack(&self, layout: &Layout, gguf: &str) -> Option<(String, &'static Row)> {
        layout.rows.iter().find_map(|row| {
            let x = match_row(row.0, gguf)?;
            let x = match (is_deepstack(row.0), x) {
                (true, Some(l)) => Some(self.deepstack.iter().position(|&b| b == l)?),
                (_, x) => x,
            };
            Some((fill(row.1, x), row))
        })
    }
}

fn lookup<'j>(v: &'j Json, path: &str) -> Option<&'j Json> {
    path.split('/')
        .try_fold(v, |v, p| v.get(p))
        .filter(|v| !v.is_null())
}

fn dotted(path: &str) -> String {
    path.replace('/', ".")
}

/// A size in config.json (`path` '/'-separated), at most [`MAX_SIZE`].
fn size_at(config: &Json, path: &str, config_path: &Path) -> Result<Option<usize>> {
    let err = |what: String| ModelError::Key {
        path: config_path.to_path_buf(),
        key: dotted(path),
        what,
    };
    match lookup(config, path) {
        None => Ok(None),
        Some(v) => match v.as_u64() {
            Some(x) if x > 0 && x as usize <= MAX_SIZE => Ok(Some(x as usize)),
            _ => Err(err(format!(
                "{v} is not a size (a positive integer at most {MAX_SIZE})"
            ))),
        },
    }
}

fn required(config: &Json, path: &str, config_path: &Path, why: &str) -> Result<usize> {
    size_at(config, path, config_path)?.ok_or_else(|| ModelError::Key {
        path: config_path.to_path_buf(),
        key: dotted(path),
        what: format!("is required {why}"),
    })
}

/// The sizes `layout`'s matrices take from config.json.
pub fn geometry(layout: &Layout, config: &Json, config_path: &Path) -> Result<Geometry> {
    let why = format!("to read the blocked matrices of {VISION_WEIGHTS}");
    let embd = required(config, "vision_config/hidden_size", config_path, &why)?;
    let ff = required(config, "vision_config/intermediate_size", config_path, &why)?;
    let depth_key = if layout.projector == QWEN3VL.projector {
        "vision_config/depth"
    } else {
        "vision_config/num_hidden_layers"
    };
    let blocks = required(config, depth_key, config_path, &why)?;
    let text = text_root(config);
    let text_width = |what: &str| -> Result<usize> {
        required(
            &text,
            "hidden_size",
            config_path,
            &format!("{why} ({what})"),
        )
    };
    if layout.projector == QWEN3VL.projector {
        let text = match size_at(config, "vision_config/out_hidden_size", config_path)? {
            Some(t) => t,
            None => text_width("no vision_config.out_hidden_size")?,
        };
        let (deepstack, deepstack_source) = match lookup(config, "vision_config/deepstack_visual_indexes") {
            Some(v) => {
                let a = v
                    .as_array()
                    .and_then(|a| a.iter().map(|x| x.as_u64().map(|x| x as usize)).collect::<Option<Vec<_>>>())
                    .filter(|a| a.len() <= 1024 && a.iter().all(|&x| x < 1024))
                    .ok_or_else(|| ModelError::Key {
                        path: config_path.to_path_buf(),
                        key: "vision_config.deepstack_visual_indexes".into(),
                        what: format!("{v} is not a list of block indices"),
                    })?;
                (a, format!("{CONFIG} vision_config.deepstack_visual_indexes"))
            }
            None => (
                CONVERTER_DEEPSTACK.to_vec(),
                format!("FastFlowLM/FLM_Q4NX_Converter configs/qwen3vl.json's deepstack rows ({CONFIG} states no vision_config.deepstack_visual_indexes)"),
            ),
        };
        Ok(Geometry {
            blocks,
            embd,
            ff,
            text,
            deepstack,
            deepstack_source,
        })
    } else {
        Ok(Geometry {
            blocks,
            embd,
            ff,
            text: text_width("the projection's output width")?,
            deepstack: Vec::new(),
            deepstack_source: String::new(),
        })
    }
}

/// The layout of a vision file's tensor names, or why none is read.
pub fn detect(st: &SafeTensors) -> Result<&'static Layout> {
    let path = st.path().to_path_buf();
    for (marker, what) in OTHER_LAYOUTS {
        if let Some(t) = st.tensors.iter().find(|t| t.name.starts_with(marker)) {
            return Err(ModelError::Tensor {
                path,
                tensor: t.name.clone(),
                what: format!(
                    "belongs to {what}, a tower onebit does not run; vision packs onebit reads: {}",
                    LAYOUTS
                        .iter()
                        .map(|l| l.projector)
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            });
        }
    }
    let first = st.tensors.first().ok_or_else(|| ModelError::Unsupported {
        path: path.clone(),
        what: "holds no tensors".into(),
    })?;
    LAYOUTS
        .iter()
        .copied()
        .find(|l| l.rows.iter().any(|r| match_row(r.1, &first.name).is_some()))
        .ok_or_else(|| ModelError::Tensor {
            path,
            tensor: first.name.clone(),
            what: format!(
                "is not a name of FastFlowLM's vision layouts onebit reads ({})",
                LAYOUTS
                    .iter()
                    .map(|l| l.source)
                    .collect::<Vec<_>>()
                    .join("; ")
            ),
        })
}

/// A pack tower's tensors under their mmproj names, with ggml dims.
pub struct PackTensors {
    path: PathBuf,
    tensors: Vec<(String, RawTensor)>,
}

impl TensorSource for PackTensors {
    fn path(&self) -> &Path {
        &self.path
    }
    fn tensor(&self, name: &str) -> Option<RawTensor> {
        self.tensors
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, t)| t.clone())
    }
}

impl TowerTensors for PackTensors {
    fn names(&self) -> Vec<String> {
        self.tensors.iter().map(|(n, _)| n.clone()).collect()
    }
}

fn bf16_raw(dims: Vec<u64>, data: Vec<u16>) -> RawTensor {
    RawTensor {
        dtype: GgmlType::BF16,
        dims,
        bytes: ByteView::from_vec(le(&data)),
    }
}

/// MM_K of a blocked tensor, named by its row width.
fn mm_k_of(layout: &Layout, st: &SafeTensors, t: &StTensor) -> Result<usize> {
    let w = t.shape.last().copied().unwrap_or(0) as usize;
    layout
        .mm_k_read
        .iter()
        .copied()
        .find(|&k| k * MM_N == w)
        .ok_or_else(|| {
            ModelError::from(st.tensor_error(
                &t.name,
                format!(
                    "rows of {w} values are not the converter's blocks ({})",
                    layout
                        .mm_k_read
                        .iter()
                        .map(|k| format!("{MM_N} x {k} = {}", MM_N * k))
                        .collect::<Vec<_>>()
                        .join(" or ")
                ),
            ))
        })
}

/// One stored tensor read back: the mmproj tensors it holds.
fn read_one(
    layout: &Layout,
    geo: &Geometry,
    st: &SafeTensors,
    t: &StTensor,
    gguf: &str,
    op: Op,
) -> Result<Vec<(String, RawTensor)>> {
    let err = |what: String| ModelError::from(st.tensor_error(&t.name, what));
    if t.dtype != StDtype::BF16 {
        return Err(err(format!(
            "is {}; the converter writes every vision tensor as BF16",
            t.dtype.name()
        )));
    }
    let bytes = st.bytes(t);
    match op {
        Op::Plain => {
            let dims: Vec<u64> = t.shape.iter().rev().copied().collect();
            Ok(vec![(
                gguf.to_string(),
                RawTensor {
                    dtype: GgmlType::BF16,
                    dims,
                    bytes,
                },
            )])
        }
        Op::Blocks { n, k } | Op::TransposedBlocks { n, k } => {
            let (n, k) = (geo.width(n), geo.width(k));
            let mm_k = mm_k_of(layout, st, t)?;
            let want = blocks_shape(n, k, mm_k);
            if t.shape != want {
                return Err(err(format!(
                    "shape {:?} is not the blocks [Np/{MM_N}, Kp/{mm_k}, {}] = {want:?} of {n} rows by {k} columns (config.json's sizes)",
                    t.shape,
                    MM_N * mm_k
                )));
            }
            let w = from_blocks(&u16s(&bytes), n, k, mm_k);
            Ok(vec![(
                gguf.to_string(),
                if let Op::TransposedBlocks { .. } = op {
                    // The mmproj's ggml [n, k]: k rows of n.
                    bf16_raw(vec![n as u64, k as u64], transpose(&w, n, k))
                } else {
                    bf16_raw(vec![k as u64, n as u64], w)
                },
            )])
        }
        Op::StackFrames => match t.shape.as_slice() {
            &[e, 3, 2, p, q] if p == q && e as usize == geo.embd => {
                let inner = (p * q) as usize;
                let s = u16s(&bytes);
                let dims = vec![p, p, 3, e];
                Ok(vec![
                    (
                        gguf.to_string(),
                        bf16_raw(dims.clone(), frame_of(&s, 0, inner)),
                    ),
                    (format!("{gguf}.1"), bf16_raw(dims, frame_of(&s, 1, inner))),
                ])
            }
            s => Err(err(format!(
                "shape {s:?} is not the two temporal patch kernels stacked, [{}, 3, 2, p, p]",
                geo.embd
            ))),
        },
    }
}

/// A pack's vision tower, read.
pub struct PackVision {
    pub tower: VisionTower,
    pub layout: &'static Layout,
    pub geometry: Geometry,
    /// The `clip.*` keys the pack states, each with its source.
    pub stated: Vec<Stated>,
    /// The tensors read back under their mmproj names.
    pub tensors: PackTensors,
}

impl PackVision {
    /// A stated key's value (full GGUF spelling, e.g. `clip.vision.patch_size`).
    pub fn key(&self, key: &str) -> Option<&Json> {
        self.stated
            .iter()
            .find(|s| s.key == key)
            .map(|s| &s.value)
            .filter(|v| !v.is_null())
    }

    /// One tensor read back, by mmproj name.
    pub fn tensor(&self, name: &str) -> Option<RawTensor> {
        self.tensors.tensor(name)
    }

    /// The mmproj names of every tensor read back.
    pub fn tensor_names(&self) -> Vec<String> {
        self.tensors.names()
    }
}

/// Whether `dir` holds a vision tower file.
pub fn has_vision(dir: &Path) -> bool {
    dir.join(VISION_WEIGHTS).is_file()
}

/// The vision tower of the pack at `dir`: None when it has no
/// `vision_weights.q4nx`; an error naming the file, tensor or key when
/// it holds one onebit does not read.
pub fn open(dir: &Path) -> Result<Option<PackVision>> {
    if !has_vision(dir) {
        return Ok(None);
    }
    let config_path = dir.join(CONFIG);
    let config = read_json(&config_path, true)?.expect("required");
    let pre_path = dir.join(PREPROCESSOR_CONFIG);
    let pre = read_json(&pre_path, false)?;
    let st = SafeTensors::open(dir.join(VISION_WEIGHTS))?;
    read(&st, &config, &config_path, pre.as_ref()).map(Some)
}

/// The tower of an opened vision file, its keys from `config` (at
/// `config_path`) and `pre` (preprocessor_config.json, if any).
pub fn read(
    st: &SafeTensors,
    config: &Json,
    config_path: &Path,
    pre: Option<&Json>,
) -> Result<PackVision> {
    let layout = detect(st)?;
    let geo = geometry(layout, config, config_path)?;
    let mut tensors = Vec::new();
    for t in &st.tensors {
        let (gguf, row) = geo.to_gguf(layout, &t.name).ok_or_else(|| {
            ModelError::from(
                st.tensor_error(
                    &t.name,
                    if layout
                        .rows
                        .iter()
                        .any(|r| is_deepstack(r.1) && match_row(r.1, &t.name).is_some())
                    {
                        format!(
                            "is a deepstack merger beyond the {} blocks {:?} ({})",
                            geo.deepstack.len(),
                            geo.deepstack,
                            geo.deepstack_source
                        )
                    } else {
                        format!("has no row in {}", layout.source)
                    },
                ),
            )
        })?;
        if is_deepstack(row.1) {
            let l = match_row(row.0, &gguf)
                .flatten()
                .expect("filled from the row");
            if l >= geo.blocks {
                return Err(st
                    .tensor_error(
                        &t.name,
                        format!(
                            "is the deepstack merger of block {l} ({}: {:?}), but the tower has {} blocks (vision_config.depth)",
                            geo.deepstack_source, geo.deepstack, geo.blocks
                        ),
                    )
                    .into());
            }
        }
        if tensors
            .iter()
            .any(|(n, _): &(String, RawTensor)| *n == gguf)
        {
            return Err(st
                .tensor_error(
                    &t.name,
                    format!("holds {gguf}, which another tensor holds too"),
                )
                .into());
        }
        tensors.extend(read_one(layout, &geo, st, t, &gguf, row.2)?);
    }
    let tensors = PackTensors {
        path: st.path().to_path_buf(),
        tensors,
    };
    let stated = stated(layout, config, config_path, pre)?;
    let dims = |name: &str| tensors.tensor(name).map(|t| t.dims);
    let d = Decls::stated(&stated, config_path, "clip", &dims);
    let tower = VisionTower::from_decls(&tensors, &d)?;
    Ok(PackVision {
        tower,
        layout,
        geometry: geo,
        stated,
        tensors,
    })
}

/// One stated key: `clip.<suffix>` from `path` in `file` (None: absent).
fn from_file(suffix: &str, file_json: Option<&Json>, file: &str, path: &str) -> Stated {
    Stated {
        key: format!("clip.{suffix}"),
        value: file_json
            .and_then(|j| lookup(j, path))
            .cloned()
            .unwrap_or(Json::Null),
        spelled: if file == CONFIG {
            dotted(path)
        } else {
            format!("{file} {}", dotted(path))
        },
        source: format!("{file} {}", dotted(path)),
    }
}

/// `s`, or the default `value` with its source when `s` states nothing.
fn or_default(mut s: Stated, value: Json, why: &str) -> Stated {
    if s.value.is_null() {
        s.source = format!("{why} (no {} stated)", s.spelled);
        s.value = value;
    }
    s
}

fn value(key: &str, value: Json, spelled: &str, source: String) -> Stated {
    Stated {
        key: format!("clip.{key}"),
        value,
        spelled: spelled.into(),
        source,
    }
}

/// The `clip.*` keys the tower reads, as the pack states them: config.json's
/// `vision_config` (HF's keys), preprocessor_config.json's `image_mean` /
/// `image_std` where the pack has one, and where neither states a key the
/// default HF's classes (or the model's published processor) take, each
/// with its source. A key whose value has no mmproj equivalent is refused
/// by name.
pub fn stated(
    layout: &Layout,
    config: &Json,
    config_path: &Path,
    pre: Option<&Json>,
) -> Result<Vec<Stated>> {
    let cfg = Some(config);
    let key_err = |key: &str, what: String| ModelError::Key {
        path: config_path.to_path_buf(),
        key: key.into(),
        what,
    };
    let by_layout = format!(
        "{VISION_WEIGHTS} (FastFlowLM's {} vision layout)",
        layout.projector
    );
    let mut out = vec![
        value(
            "has_vision_encoder",
            json!(true),
            VISION_WEIGHTS,
            by_layout.clone(),
        ),
        value(
            "projector_type",
            json!(layout.projector),
            VISION_WEIGHTS,
            by_layout,
        ),
        from_file(
            "vision.embedding_length",
            cfg,
            CONFIG,
            "vision_config/hidden_size",
        ),
        from_file(
            "vision.feed_forward_length",
            cfg,
            CONFIG,
            "vision_config/intermediate_size",
        ),
        from_file("vision.patch_size", cfg, CONFIG, "vision_config/patch_size"),
    ];
    let (model, act_default) = if layout.projector == GEMMA3.projector {
        (
            "google/gemma-3-4b-it preprocessor_config.json",
            "transformers SiglipVisionConfig default hidden_act gelu_pytorch_tanh",
        )
    } else {
        (
            "Qwen/Qwen3-VL-4B-Instruct preprocessor_config.json",
            "transformers Qwen3VLVisionConfig default hidden_act gelu_pytorch_tanh",
        )
    };
    for (suffix, key) in [
        ("vision.image_mean", "image_mean"),
        ("vision.image_std", "image_std"),
    ] {
        let mut s = from_file(suffix, pre, PREPROCESSOR_CONFIG, key);
        if s.value.is_null() {
            s.value = json!([0.5, 0.5, 0.5]);
            s.source = match pre {
                None => format!("{model} {key} (the pack has no {PREPROCESSOR_CONFIG})"),
                Some(_) => format!("{model} {key} (the pack's {PREPROCESSOR_CONFIG} states none)"),
            };
        }
        out.push(s);
    }
    // The MLP's activation: mmproj `clip.use_gelu` (true: tanh GELU; false:
    // llama.cpp's GELU-quick) from HF's hidden_act.
    let act = from_file("use_gelu", cfg, CONFIG, "vision_config/hidden_act");
    out.push(match act.value.as_str() {
        None if act.value.is_null() => Stated {
            value: json!(true),
            source: format!("{act_default} (no {} stated)", act.spelled),
            ..act
        },
        Some("gelu_pytorch_tanh") | Some("gelu_new") => Stated {
            value: json!(true),
            source: format!("{} {} (tanh GELU)", act.source, act.value),
            ..act
        },
        Some("quick_gelu") if layout.projector == GEMMA3.projector => Stated {
            value: json!(false),
            source: format!("{} {} (GELU-quick)", act.source, act.value),
            ..act
        },
        _ => {
            return Err(key_err(
                &act.spelled,
                format!(
                    "{}: the {} tower runs gelu_pytorch_tanh{}",
                    act.value,
                    layout.projector,
                    if layout.projector == GEMMA3.projector {
                        " or quick_gelu"
                    } else {
                        ""
                    }
                ),
            ))
        }
    });
    if layout.projector == GEMMA3.projector {
        out.push(from_file(
            "vision.block_count",
            cfg,
            CONFIG,
            "vision_config/num_hidden_layers",
        ));
        out.push(from_file(
            "vision.attention.head_count",
            cfg,
            CONFIG,
            "vision_config/num_attention_heads",
        ));
        out.push(or_default(
            from_file(
                "vision.attention.layer_norm_epsilon",
                cfg,
                CONFIG,
                "vision_config/layer_norm_eps",
            ),
            json!(1e-6),
            "transformers SiglipVisionConfig default layer_norm_eps 1e-6",
        ));
        let image = from_file("vision.image_size", cfg, CONFIG, "vision_config/image_size");
        // The pooling: `mm_tokens_per_image` tokens from the side^2
        // patches (llama.cpp conversion/gemma.py: side / sqrt(tokens)).
        let tokens = match lookup(config, "mm_tokens_per_image") {
            Some(v) => (v.clone(), format!("{CONFIG} mm_tokens_per_image"), "mm_tokens_per_image"),
            None => match pre.and_then(|p| lookup(p, "image_seq_length")) {
                Some(v) => (v.clone(), format!("{PREPROCESSOR_CONFIG} image_seq_length"), "image_seq_length"),
                None => (
                    json!(256),
                    format!("transformers Gemma3Config default mm_tokens_per_image 256 (no {CONFIG} mm_tokens_per_image)"),
                    "mm_tokens_per_image",
                ),
            },
        };
        let patch = lookup(config, "vision_config/patch_size").and_then(Json::as_u64);
        if let (Some(side), Some(patch)) = (image.value.as_u64(), patch) {
            let t = tokens.0.as_u64().filter(|&t| t > 0).ok_or_else(|| {
                key_err(
                    tokens.2,
                    format!("{} is not a positive token count", tokens.0),
                )
            })?;
            let per_side = (t as f64).sqrt().round() as u64;
            let grid = side / patch.max(1);
            if per_side * per_side != t || per_side == 0 || grid % per_side != 0 {
                return Err(key_err(
                    tokens.2,
                    format!(
                        "{t} tokens do not pool the {grid} x {grid} patch grid evenly (a square whose side divides {grid})"
                    ),
                ));
            }
            out.push(value(
                "vision.projector.scale_factor",
                json!(grid / per_side),
                tokens.2,
                format!(
                    "{} {t}: {grid} x {grid} patches pooled to {per_side} x {per_side}",
                    tokens.1
                ),
            ));
        }
        out.push(image);
    } else {
        out.push(from_file(
            "vision.block_count",
            cfg,
            CONFIG,
            "vision_config/depth",
        ));
        out.push(from_file(
            "vision.attention.head_count",
            cfg,
            CONFIG,
            "vision_config/num_heads",
        ));
        out.push(from_file(
            "vision.spatial_merge_size",
            cfg,
            CONFIG,
            "vision_config/spatial_merge_size",
        ));
        // llama.cpp conversion/qwen3vl.py: the vision LayerNorm eps is the
        // text config's rms_norm_eps (default 1e-6); onebit's import also
        // states it as vision_config.layer_norm_eps, read first.
        let eps = from_file(
            "vision.attention.layer_norm_epsilon",
            cfg,
            CONFIG,
            "vision_config/layer_norm_eps",
        );
        out.push(if eps.value.is_null() {
            let text = text_root(config);
            match lookup(&text, "rms_norm_eps") {
                Some(v) => Stated {
                    value: v.clone(),
                    spelled: "text_config.rms_norm_eps".into(),
                    source: format!("{CONFIG} text_config.rms_norm_eps (llama.cpp conversion/qwen3vl.py takes the vision LayerNorm eps from it)"),
                    ..eps
                },
                None => Stated {
                    value: json!(1e-6),
                    source: "llama.cpp conversion/qwen3vl.py default vision LayerNorm eps 1e-6 (no vision_config.layer_norm_eps, no text_config.rms_norm_eps)".into(),
                    ..eps
                },
            }
        } else {
            eps
        });
        // image_size: stated, else llama.cpp's sqrt(num_position_embeddings) x patch.
        let image = from_file("vision.image_size", cfg, CONFIG, "vision_config/image_size");
        out.push(if image.value.is_null() {
            let n_pos = lookup(config, "vision_config/num_position_embeddings")
                .and_then(Json::as_u64)
                .unwrap_or(2304);
            let patch = lookup(config, "vision_config/patch_size")
                .and_then(Json::as_u64)
                .unwrap_or(16);
            Stated {
                value: json!(((n_pos as f64).sqrt() as u64) * patch),
                spelled: "vision_config.num_position_embeddings".into(),
                source: format!("sqrt({CONFIG} vision_config.num_position_embeddings {n_pos}) x patch {patch} (llama.cpp conversion/qwen3vl.py)"),
                ..image
            }
        } else {
            image
        });
        if let Some(t) = lookup(config, "vision_config/temporal_patch_size") {
            if t.as_u64() != Some(2) {
                return Err(key_err(
                    "vision_config.temporal_patch_size",
                    format!("{t}: the converter stacks two temporal kernels"),
                ));
            }
        }
    }
    Ok(out)
}

/// What an import of a tower writes, beside the text model's files.
pub struct ImportedVision {
    /// `vision_weights.q4nx`'s tensors.
    pub tensors: Vec<StOut>,
    /// config.json: the text model's config nested as `text_config`, with
    /// `vision_config` and the model's keys beside it, as HF writes it.
    pub config: Json,
    /// preprocessor_config.json (the mmproj's image mean and std).
    pub preprocessor: Json,
    pub notes: Vec<String>,
}

fn round_f32(x: f64) -> Json {
    // The f32 value as its shortest decimal (1e-6, not 9.99999997e-7).
    json!((x as f32).to_string().parse::<f64>().unwrap_or(x))
}

/// The vision config HF states for the mmproj's tower, and the keys beside it.
fn hf_config(
    layout: &Layout,
    g: &Gguf,
    geo_text: usize,
    deep: &[usize],
) -> Result<(Json, Map<String, Json>, Json)> {
    let u = |k: &str| -> Result<u64> { Ok(g.u64(k)?) };
    let mean = g.array_opt("clip.vision.image_mean")?.map(|a| {
        a.iter()
            .map(|v| v.as_f64().map(round_f32))
            .collect::<Option<Vec<_>>>()
    });
    let std = g.array_opt("clip.vision.image_std")?.map(|a| {
        a.iter()
            .map(|v| v.as_f64().map(round_f32))
            .collect::<Option<Vec<_>>>()
    });
    let (Some(Some(mean)), Some(Some(std))) = (mean, std) else {
        return Err(g
            .key_error(
                "clip.vision.image_mean",
                "image_mean and image_std must be arrays of numbers",
            )
            .into());
    };
    let eps = g
        .f64_opt("clip.vision.attention.layer_norm_epsilon")?
        .unwrap_or(1e-6);
    let gelu = g.bool_opt("clip.use_gelu")?.unwrap_or(false);
    let (n_embd, n_ff, n_layer, n_head) = (
        u("clip.vision.embedding_length")?,
        u("clip.vision.feed_forward_length")?,
        u("clip.vision.block_count")?,
        u("clip.vision.attention.head_count")?,
    );
    let (image, patch) = (u("clip.vision.image_size")?, u("clip.vision.patch_size")?);
    let mut pre = json!({"image_mean": mean, "image_std": std});
    let mut extra = Map::new();
    let vc = if layout.projector == GEMMA3.projector {
        for (k, want) in [
            ("clip.vision.attention.head_count_kv", n_head),
            ("clip.vision.attention.head_dim", n_embd / n_head.max(1)),
        ] {
            if let Some(v) = g.u64_opt(k)? {
                if v != want {
                    return Err(g
                        .key_error(
                            k,
                            format!(
                                "{v}: HF's SiglipVisionConfig cannot state it (it implies {want})"
                            ),
                        )
                        .into());
                }
            }
        }
        let merge = g
            .u64_opt("clip.vision.projector.scale_factor")?
            .unwrap_or(4);
        let per_side = image / patch.max(1) / merge.max(1);
        extra.insert("mm_tokens_per_image".into(), json!(per_side * per_side));
        pre["image_seq_length"] = json!(per_side * per_side);
        pre["size"] = json!({"height": image, "width": image});
        json!({
            "model_type": layout.vision_model_type,
            "hidden_size": n_embd,
            "intermediate_size": n_ff,
            "num_hidden_layers": n_layer,
            "num_attention_heads": n_head,
            "image_size": image,
            "patch_size": patch,
            "layer_norm_eps": round_f32(eps),
            "hidden_act": if gelu { "gelu_pytorch_tanh" } else { "quick_gelu" },
            "num_channels": 3,
        })
    } else {
        let merge = g.u64_opt("clip.vision.spatial_merge_size")?.unwrap_or(2);
        let n_pos = g
            .tensor("v.position_embd.weight")
            .and_then(|t| t.dims.get(1).copied())
            .ok_or_else(|| {
                ModelError::from(g.tensor_error("v.position_embd.weight", "is required but absent"))
            })?;
        pre["patch_size"] = json!(patch);
        pre["merge_size"] = json!(merge);
        pre["temporal_patch_size"] = json!(2);
        json!({
            "model_type": layout.vision_model_type,
            "hidden_size": n_embd,
            "intermediate_size": n_ff,
            "depth": n_layer,
            "num_heads": n_head,
            "patch_size": patch,
            "spatial_merge_size": merge,
            "temporal_patch_size": 2,
            "in_channels": 3,
            "out_hidden_size": geo_text,
            "num_position_embeddings": n_pos,
            "deepstack_visual_indexes": deep,
            "image_size": image,
            "layer_norm_eps": round_f32(eps),
            "hidden_act": "gelu_pytorch_tanh",
        })
    };
    Ok((vc, extra, pre))
}

/// The rules of a tower, without their sources (the summary line and each
/// `vision <rule>: <value>` line up to its `  <- source`).
fn rule_values(t: &VisionTower) -> Vec<String> {
    t.lines()
        .into_iter()
        .map(|l| l.split("  <- ").next().unwrap_or("").to_string())
        .collect()
}

fn to_bf16(v: &[f32]) -> Vec<u16> {
    v.iter().map(|x| bf16::from_f32(*x).to_bits()).collect()
}

/// Converts the mmproj `g` into a pack's vision file, as the converter does,
/// and the config.json and preprocessor_config.json stating its rules,
/// around `text_config` (the text model's config.json, whose hidden size the
/// tower must project to). Refused by name: a projector the converter has no
/// layout for or onebit does not run, a quantized tensor (the converter's
/// vision branch takes float tensors only), a tensor the layout does not
/// name, a key HF's config cannot state, and a pack that would read back
/// with other rules than the mmproj's.
pub fn import(g: &Gguf, text_config: &Json) -> Result<ImportedVision> {
    let path = g.path().to_path_buf();
    let terr = |name: &str, what: String| ModelError::Tensor {
        path: path.clone(),
        tensor: name.to_string(),
        what,
    };
    let mmproj_tower = VisionTower::from_gguf(g)?;
    let projector = mmproj_tower.preprocess().projector;
    let layout =
        layout_for(projector).ok_or_else(|| ModelError::Unsupported {
            path: path.clone(),
            what: format!(
            "projector {projector}: FastFlowLM's converter has vision layouts onebit writes for {}",
            LAYOUTS.iter().map(|l| l.projector).collect::<Vec<_>>().join(", ")
        ),
        })?;
    let mm_rules = rule_values(&mmproj_tower);
    drop(mmproj_tower);
    // The text width the tower projects to.
    let out_name = if layout.projector == GEMMA3.projector {
        "mm.input_projection.weight"
    } else {
        "mm.2.weight"
    };
    let out_w = g
        .tensor(out_name)
        .and_then(|t| {
            if layout.projector == GEMMA3.projector {
                t.dims.first().copied()
            } else {
                t.dims.get(1).copied()
            }
        })
        .ok_or_else(|| terr(out_name, "is required but absent".into()))? as usize;
    let text = text_root(text_config);
    if let Some(h) = lookup(&text, "hidden_size").and_then(Json::as_u64) {
        if h as usize != out_w {
            return Err(ModelError::Unsupported {
                path: path.clone(),
                what: format!(
                    "the vision tower projects to {out_w} values ({out_name}), the text model's hidden size is {h}: not its mmproj"
                ),
            });
        }
    }
    let mut deep: Vec<usize> = g
        .tensors
        .iter()
        .filter_map(|t| match_row("v.deepstack.{d}.norm.weight", &t.name).flatten())
        .collect();
    deep.sort_unstable();
    let (vc, extra, pre) = hf_config(layout, g, out_w, &deep)?;
    let mut config = Map::new();
    config.insert("architectures".into(), json!([layout.hf_arch]));
    config.insert("model_type".into(), json!(layout.model_type));
    config.extend(extra);
    config.insert("text_config".into(), text_config.clone());
    config.insert("vision_config".into(), vc);
    config.insert("torch_dtype".into(), json!("bfloat16"));
    let config = Json::Object(config);
    let config_path = PathBuf::from(CONFIG);
    let geo = geometry(layout, &config, &config_path)?;
    // What the pack states must make the mmproj's tower: the same rules
    // from the written keys (with the mmproj's tensors, which the layout
    // maps one to one).
    {
        let st = stated(layout, &config, &config_path, Some(&pre))?;
        let dims = |name: &str| g.tensor(name).map(|t| t.dims.clone());
        let d = Decls::stated(&st, &config_path, "clip", &dims);
        let pack_rules = rule_values(&VisionTower::from_decls(g, &d)?);
        if let Some((a, b)) = mm_rules.iter().zip(&pack_rules).find(|(a, b)| a != b) {
            return Err(ModelError::Unsupported {
                path: path.clone(),
                what: format!(
                    "the pack's config.json would state the rule `{b}` where the mmproj's tower has `{a}`"
                ),
            });
        }
        if mm_rules.len() != pack_rules.len() {
            return Err(ModelError::Unsupported {
                path: path.clone(),
                what: "the pack's config.json would state other rules than the mmproj's".into(),
            });
        }
    }

    let mut notes = vec![format!(
        "vision: {projector} tower laid out as {}: every tensor BF16, matrices in {MM_N} x {} blocks",
        layout.source, layout.mm_k
    )];
    if layout.projector == QWEN3VL.projector && deep != CONVERTER_DEEPSTACK {
        notes.push(format!(
            "vision: deepstack after blocks {deep:?}, stated as vision_config.deepstack_visual_indexes (the converter's table names blocks {CONVERTER_DEEPSTACK:?} only)"
        ));
    }
    let (mut rounded, mut values) = (0usize, 0usize);
    let mut tensors = Vec::new();
    for t in &g.tensors {
        if t.name.ends_with(".weight.1") && t.name.starts_with("v.patch_embd") {
            continue; // stacked with frame 0
        }
        let (pack, row) = geo.to_pack(layout, &t.name).ok_or_else(|| {
            terr(
                &t.name,
                format!("has no name in {}, so it cannot be imported", layout.source),
            )
        })?;
        let floats = |name: &str| -> Result<(Vec<u64>, Vec<f32>)> {
            let info = g
                .tensor(name)
                .ok_or_else(|| terr(name, "is required but absent".into()))?;
            if !matches!(info.dtype, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16) {
                return Err(terr(
                    name,
                    format!(
                        "is {}; the converter's vision branch takes F32, F16 or BF16 tensors only (it unpacks each to BF16)",
                        info.dtype
                    ),
                ));
            }
            let mut v = vec![0f32; info.n_elements() as usize];
            blocks::dequantize(info.dtype, &g.tensor_bytes(info), &mut v)
                .map_err(|e| terr(name, e.to_string()))?;
            Ok((info.dims.clone(), v))
        };
        let (dims, v) = floats(&t.name)?;
        let b = to_bf16(&v);
        values += v.len();
        rounded += v
            .iter()
            .zip(&b)
            .filter(|(x, y)| bf16::from_bits(**y).to_f32() != **x)
            .count();
        let want = |n: usize, k: usize, ggml: [u64; 2]| -> Result<()> {
            if dims != ggml {
                return Err(terr(
                    &t.name,
                    format!(
                        "has dims {dims:?}; the layout stores it as {n} rows by {k} columns ({:?}) from config.json's sizes",
                        ggml
                    ),
                ));
            }
            Ok(())
        };
        let (shape, data) = match row.2 {
            Op::Plain => (dims.iter().rev().copied().collect::<Vec<u64>>(), b),
            Op::Blocks { n, k } => {
                let (n, k) = (geo.width(n), geo.width(k));
                want(n, k, [k as u64, n as u64])?;
                (
                    blocks_shape(n, k, layout.mm_k).to_vec(),
                    to_blocks(&b, n, k, layout.mm_k),
                )
            }
            Op::TransposedBlocks { n, k } => {
                let (n, k) = (geo.width(n), geo.width(k));
                want(n, k, [n as u64, k as u64])?;
                let m = transpose(&b, k, n);
                (
                    blocks_shape(n, k, layout.mm_k).to_vec(),
                    to_blocks(&m, n, k, layout.mm_k),
                )
            }
            Op::StackFrames => {
                let second = format!("{}.1", t.name);
                let (dims1, v1) = floats(&second)?;
                if dims1 != dims || dims.len() != 4 || dims[0] != dims[1] || dims[2] != 3 {
                    return Err(terr(
                        &second,
                        format!("has dims {dims1:?}; the patch kernels must both be [p, p, 3, n_embd], the first is {dims:?}"),
                    ));
                }
                let b1 = to_bf16(&v1);
                values += v1.len();
                rounded += v1
                    .iter()
                    .zip(&b1)
                    .filter(|(x, y)| bf16::from_bits(**y).to_f32() != **x)
                    .count();
                let inner = (dims[0] * dims[1]) as usize;
                (
                    vec![dims[3], 3, 2, dims[1], dims[0]],
                    stack_frames(&b, &b1, inner),
                )
            }
        };
        tensors.push(StOut {
            name: pack,
            dtype: StDtype::BF16,
            shape,
            data: le(&data),
        });
    }
    notes.push(format!(
        "vision: {rounded} of {values} values rounded to BF16 (to nearest even, as torch's .to(bfloat16) in the converter)"
    ));
    Ok(ImportedVision {
        tensors,
        config,
        preprocessor: pre,
        notes,
    })
}

/// Writes `vision_weights.q4nx` and preprocessor_config.json into `dir`;
/// the caller writes [`ImportedVision::config`] as the pack's config.json.
pub fn write(dir: &Path, v: &ImportedVision) -> Result<()> {
    safetensors::write(&dir.join(VISION_WEIGHTS), &v.tensors, &Default::default())?;
    let p = dir.join(PREPROCESSOR_CONFIG);
    std::fs::write(
        &p,
        serde_json::to_string_pretty(&v.preprocessor).expect("JSON serializes") + "\n",
    )
    .map_err(|e| ModelError::Unsupported {
        path: p,
        what: format!("cannot write: {e}"),
    })
}

/// `inspect --verify`'s checks of a pack's vision file (none when it has
/// none): it reads as a tower onebit runs, whose rows fit the text model;
/// every stored byte is re-made from the tensors read by the layout's
/// rules (so every padding byte is zero).
pub fn verify(dir: &Path, text_hidden: Option<usize>) -> Result<Vec<LayoutCheck>> {
    if !has_vision(dir) {
        return Ok(Vec::new());
    }
    let v = match open(dir) {
        Ok(v) => v.expect("has a vision file"),
        Err(e) => {
            return Ok(vec![LayoutCheck {
                what: format!("{VISION_WEIGHTS} reads as a vision tower"),
                values: 0,
                failure: Some(e.to_string()),
            }])
        }
    };
    let mut out = vec![LayoutCheck {
        what: format!(
            "{VISION_WEIGHTS}: the {} tower in the layout of {}, {} tensors",
            v.layout.projector,
            v.layout.source,
            v.tensors.tensors.len()
        ),
        values: 0,
        failure: None,
    }];
    if let Some(h) = text_hidden {
        out.push(LayoutCheck {
            what: format!(
                "{VISION_WEIGHTS}: the tower projects to the text model's hidden size {h}"
            ),
            values: 0,
            failure: (v.geometry.text != h)
                .then(|| format!("it projects to {} values", v.geometry.text)),
        });
    }
    let st = SafeTensors::open(dir.join(VISION_WEIGHTS))?;
    let (mut bytes, mut failure) = (0usize, None);
    for t in &st.tensors {
        let (gguf, row) = v.geometry.to_gguf(v.layout, &t.name).expect("read above");
        let stored = st.bytes(t);
        let get = |n: &str| u16s(&v.tensor(n).expect("read above").bytes);
        let remade = match row.2 {
            Op::Plain => get(&gguf),
            Op::Blocks { n, k } => {
                let (n, k) = (v.geometry.width(n), v.geometry.width(k));
                to_blocks(&get(&gguf), n, k, mm_k_of(v.layout, &st, t)?)
            }
            Op::TransposedBlocks { n, k } => {
                let (n, k) = (v.geometry.width(n), v.geometry.width(k));
                let m = transpose(&get(&gguf), k, n);
                to_blocks(&m, n, k, mm_k_of(v.layout, &st, t)?)
            }
            Op::StackFrames => {
                let inner = (t.shape[3] * t.shape[4]) as usize;
                stack_frames(&get(&gguf), &get(&format!("{gguf}.1")), inner)
            }
        };
        let remade = le(&remade);
        bytes += stored.len();
        if failure.is_none() {
            if let Some(i) = (0..stored.len()).find(|&i| remade.get(i) != Some(&stored[i])) {
                failure = Some(format!(
                    "{} byte {i} is {:#04x}, the layout's rules make {}",
                    t.name,
                    stored[i],
                    remade
                        .get(i)
                        .map_or("no byte".into(), |b| format!("{b:#04x}")),
                ));
            }
        }
    }
    out.push(LayoutCheck {
        what: format!(
            "{VISION_WEIGHTS}: every stored byte re-made from the tensors read (padding zero)"
        ),
        values: bytes,
        failure,
    });
    Ok(out)
}

#[cfg(test)]
mod tests;
