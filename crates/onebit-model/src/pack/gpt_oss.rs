//! FastFlowLM's gpt-oss pack (`gpt-oss:20b`), as its public converter lays
//! it out: FastFlowLM/FLM_Q4NX_Converter `q4nx/models/gpt_oss.py` with
//! `configs/gpt-oss.json` (tiles of 32 rows by 128 columns,
//! `keep_block_in_2D`, default type Q4_1), the packers of
//! `q4nx/model_converter.py` and the unpackers of `q4nx/gguf_tensor.py`.
//! This module reads, writes and verifies it whole ([`LAYOUT`]); the tile
//! codecs are `onebit_formats::q4nx`'s half tile and MXFP4 tile.
//!
//! What the converter stores (a matrix of N rows by K columns has Nb = N/32
//! tile rows and Kb = ceil(K/128) tile columns, K zero-padded):
//! - q/k/v/o projections: Q4 half tiles (Q4_1; a Q4_0 source stays
//!   symmetric), tile rows zero-padded to a multiple of 16 and grouped by 4:
//!   I8 [Nb'/4, Kb, 4, 2560], tile (rb, cb) at [rb/4]\[cb\][rb%4] ([`ATTN`]).
//! - `lm_head.weight`: half tiles grouped by 2, [Nb/2, Kb, 2, 2560] ([`LM_HEAD`]).
//! - the experts: MXFP4 kept bit for bit in MXFP4 tiles, each expert's
//!   matrix padded to a multiple of 4 tile rows and grouped by 4
//!   ([`EXPERTS`]); the 32 bf16 biases of row block rb in bytes 128..192 of
//!   its first tile (rb, 0); per layer one U8 tensor
//!   `model.layers.{i}.ffn_gate_up_down_exps.weight` [E, 2 Rg + Rd, Kb, 4,
//!   2560]: per expert, gate's and up's groups of 4 tile rows interleaved
//!   (gate group r at 2r, up at 2r + 1), then down's Rd groups. The biases
//!   are also stored as BF16 [E, N] (`mlp.experts.{gate,up,down}_proj_bias`).
//! - the router: BF16 in 32 x 64 blocks, blocks in row-major order, each
//!   block two 16-row tiles stored column by column: element (i, j) at
//!   ((i/32) Hb + j/64) 2048 + ((i%32)/16 64 + j%64) 16 + i%16, shape
//!   [Eb Hb, 128, 16] ([`router_at`]); and a row-major copy
//!   `..._prefill`, BF16 [E, ceil(H/128) 128], zero-padded.
//! - the embedding BF16 [V, H]; norms, sinks and biases BF16.
//!
//! Where an import differs from the converter (each said in its notes):
//! matrices that are not Q4_0 or Q4_1 are re-quantized to Q4_1 (the
//! converter sends Q8_0 through its Q4 packer, which keeps 4 bits of each
//! code, and cannot regroup a float matrix); the router is zero-padded to
//! whole 32 x 64 blocks and lm_head to an even tile-row count (the converter
//! requires both; gpt-oss-20b and 120b need no padding); the embedding is
//! the GGUF's (the converter may take an HF file's instead).
//!
//! Invariant: read(import(gguf)) gives every GGUF tensor back with its dims:
//! MXFP4 experts bit for bit, Q4_0/Q4_1 matrices up to their scales and
//! minimums rounded to bf16, float tensors through bf16; every byte the
//! layout pads is zero and the biases kept twice agree (`verify`).

use std::collections::BTreeMap;
use std::path::Path;

use half::bf16;
use onebit_formats::gguf::Gguf;
use onebit_formats::q4nx::{self, MxShape, Q4Kind, Q4Shape, TileForm, MX_TILE_BYTES};
use onebit_formats::safetensors::{SafeTensors, StDtype, StOut, StTensor};
use onebit_formats::{blocks, ByteView, GgmlType};
use serde_json::Value as Json;

use super::import::{self, ImportOptions, Imported, Tiles};
use super::layout::{fits, Plain};
use super::verify::LayoutCheck;
use super::{names, Form, OwnLayout, Pack, PackTensor};
use crate::error::{ModelError, Result};
use crate::families::decls::{Decls, MAX_SIZE};
use crate::families::{self, Family, ImportRules};
use crate::weights::RawTensor;

pub const SOURCE: &str = "FastFlowLM/FLM_Q4NX_Converter q4nx/models/gpt_oss.py";

pub const LAYOUT: OwnLayout = OwnLayout {
    source: SOURCE,
    read,
    import,
    verify,
};

/// Rows and columns of a tile (configs/gpt-oss.json `row_block_size`,
/// `col_block_size`), and its bytes (both tile forms).
pub const ROWS: usize = 32;
pub const COLS: usize = 128;
pub const TILE: usize = q4nx::HALF_TILE_BYTES;

/// How a matrix's tile rows are stored: zero tile rows pad their count to
/// a multiple of `pad`, then `group` consecutive tile rows sit side by side
/// for each tile column: tile (rb, cb) at [rb / group]\[cb\][rb % group].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Grouping {
    pub group: usize,
    pub pad: usize,
}

/// `post_gpt_oss_process`: q/k/v/o padded to 16 tile rows ("divisible by 16
/// ... full MVM array"), then "(row_div_four four_row)".
pub const ATTN: Grouping = Grouping { group: 4, pad: 16 };
/// `convert`: lm_head "(row_div_two two_row)"; the converter needs an even
/// tile-row count, onebit pads to one.
pub const LM_HEAD: Grouping = Grouping { group: 2, pad: 2 };
/// `post_gpt_oss_process`: each expert padded to `NUM_CT_PER_COLUMN` = 4
/// tile rows, grouped by 4.
pub const EXPERTS: Grouping = Grouping { group: 4, pad: 4 };

/// `process_gptoss_router_weights`: 32 x 64 blocks of two 16-row tiles.
pub const ROUTER_ROWS: usize = 32;
pub const ROUTER_COLS: usize = 64;
pub const ROUTER_TILE_ROWS: usize = 16;

/// Where a row block's biases sit in its first expert tile: after the
/// 32 x 4 exponent bytes (`row_block_size * col_block_size / 32`).
pub const BIAS_AT: usize = ROWS * COLS / 32;

/// Pack names the name table does not hold (the converter makes them after
/// naming): the merged expert stacks and the router's row-major copy.
pub const MERGED: &str = "model.layers.{i}.ffn_gate_up_down_exps.weight";
pub const ROUTER_PREFILL: &str = "model.layers.{i}.mlp.router.weight_prefill";

const ROUTER: &str = "blk.{i}.ffn_gate_inp.weight";
/// The expert stacks in the merged tensor's order of parts, with their biases.
const STACKS: [(&str, &str); 3] = [
    ("blk.{i}.ffn_gate_exps.weight", "blk.{i}.ffn_gate_exps.bias"),
    ("blk.{i}.ffn_up_exps.weight", "blk.{i}.ffn_up_exps.bias"),
    ("blk.{i}.ffn_down_exps.weight", "blk.{i}.ffn_down_exps.bias"),
];

/// The layer index of `name` under a pattern with one `{i}`.
fn layer_of(pattern: &str, name: &str) -> Option<usize> {
    let (pre, post) = pattern.split_once("{i}")?;
    let mid = name.strip_prefix(pre)?.strip_suffix(post)?;
    if mid.is_empty() || !mid.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    mid.parse().ok()
}

fn at(pattern: &str, i: usize) -> String {
    pattern.replace("{i}", &i.to_string())
}

/// The sizes the layout needs, from config.json (HF `GptOssConfig`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Geometry {
    pub hidden: usize,
    pub n_head: usize,
    pub n_kv: usize,
    pub head_dim: usize,
    pub n_expert: usize,
    /// The experts' width (`intermediate_size`).
    pub n_ff: usize,
    pub vocab: usize,
}

type KeyResult<T> = std::result::Result<T, (String, String)>;

fn size(c: &Json, key: &str) -> KeyResult<usize> {
    match c.get(key).and_then(Json::as_u64) {
        Some(v) if v > 0 && v <= MAX_SIZE as u64 => Ok(v as usize),
        Some(v) => Err((
            key.into(),
            format!("{v} is not a size the pack layout can use"),
        )),
        None => Err((
            key.into(),
            "is required to read the tiled matrices' shapes".into(),
        )),
    }
}

impl Geometry {
    pub fn from_config(c: &Json) -> KeyResult<Geometry> {
        let g = Geometry {
            hidden: size(c, "hidden_size")?,
            n_head: size(c, "num_attention_heads")?,
            n_kv: size(c, "num_key_value_heads")?,
            head_dim: size(c, "head_dim")?,
            n_expert: size(c, "num_local_experts")?,
            n_ff: size(c, "intermediate_size")?,
            vocab: size(c, "vocab_size")?,
        };
        for (key, rows) in [
            ("hidden_size", g.hidden),
            ("intermediate_size", g.n_ff),
            ("vocab_size", g.vocab),
            ("num_attention_heads", g.n_head * g.head_dim),
            ("num_key_value_heads", g.n_kv * g.head_dim),
        ] {
            if !rows.is_multiple_of(ROWS) {
                return Err((
                    key.into(),
                    format!("makes matrices of {rows} rows, not whole tile rows of {ROWS}"),
                ));
            }
        }
        if g.hidden.div_ceil(COLS) != g.n_ff.div_ceil(COLS) {
            return Err((
                "intermediate_size".into(),
                format!(
                    "{}: the converter concatenates the experts' gate/up tiles (hidden size {} wide) with their down tiles ({} wide), which needs the same count of {COLS}-column tiles",
                    g.n_ff, g.hidden, g.n_ff
                ),
            ));
        }
        Ok(g)
    }

    /// A Q4 matrix's rows, columns and grouping, by GGUF name (`output.weight`
    /// for lm_head).
    pub fn q4(&self, gguf: &str) -> Option<(usize, usize, Grouping)> {
        let q = self.n_head * self.head_dim;
        let kv = self.n_kv * self.head_dim;
        let h = self.hidden;
        [
            ("blk.{i}.attn_q.weight", q, h, ATTN),
            ("blk.{i}.attn_k.weight", kv, h, ATTN),
            ("blk.{i}.attn_v.weight", kv, h, ATTN),
            ("blk.{i}.attn_output.weight", h, q, ATTN),
            ("output.weight", self.vocab, h, LM_HEAD),
        ]
        .into_iter()
        .find(|(p, ..)| fits(p, gguf))
        .map(|(_, n, k, g)| (n, k, g))
    }

    /// The stored (row-major) shape of a float tensor whose size config.json
    /// fixes, by GGUF name, and the keys that fix it: tiles do not state
    /// their rows exactly (padding), these tensors do.
    pub fn plain_shape(&self, gguf: &str) -> Option<(Vec<u64>, &'static str)> {
        let q = self.n_head * self.head_dim;
        let kv = self.n_kv * self.head_dim;
        let (h, e, f) = (self.hidden, self.n_expert, self.n_ff);
        let table: [(&str, Vec<usize>, &'static str); 12] = [
            (
                "token_embd.weight",
                vec![self.vocab, h],
                "vocab_size and hidden_size",
            ),
            ("output_norm.weight", vec![h], "hidden_size"),
            ("blk.{i}.attn_norm.weight", vec![h], "hidden_size"),
            ("blk.{i}.post_attention_norm.weight", vec![h], "hidden_size"),
            (
                "blk.{i}.attn_q.bias",
                vec![q],
                "num_attention_heads and head_dim",
            ),
            (
                "blk.{i}.attn_k.bias",
                vec![kv],
                "num_key_value_heads and head_dim",
            ),
            (
                "blk.{i}.attn_v.bias",
                vec![kv],
                "num_key_value_heads and head_dim",
            ),
            ("blk.{i}.attn_output.bias", vec![h], "hidden_size"),
            (
                "blk.{i}.attn_sinks.weight",
                vec![self.n_head],
                "num_attention_heads",
            ),
            ("blk.{i}.ffn_gate_inp.bias", vec![e], "num_local_experts"),
            (
                "blk.{i}.ffn_gate_exps.bias",
                vec![e, f],
                "num_local_experts and intermediate_size",
            ),
            (
                "blk.{i}.ffn_down_exps.bias",
                vec![e, h],
                "num_local_experts and hidden_size",
            ),
        ];
        let up = (
            "blk.{i}.ffn_up_exps.bias",
            vec![e, f],
            "num_local_experts and intermediate_size",
        );
        table
            .into_iter()
            .chain(std::iter::once(up))
            .find(|(p, ..)| fits(p, gguf))
            .map(|(_, s, k)| (s.into_iter().map(|x| x as u64).collect(), k))
    }

    /// Rows and columns of each part of the merged experts (gate, up, down).
    pub fn stacks(&self) -> [(usize, usize); 3] {
        [
            (self.n_ff, self.hidden),
            (self.n_ff, self.hidden),
            (self.hidden, self.n_ff),
        ]
    }

    /// Row groups of gate (and up) and of down in one expert.
    fn expert_groups(&self) -> (usize, usize) {
        let g = |n: usize| padded(n / ROWS, EXPERTS) / EXPERTS.group;
        (g(self.n_ff), g(self.hidden))
    }

    /// The merged experts' stored shape.
    pub fn merged_shape(&self) -> Vec<u64> {
        let (rg, rd) = self.expert_groups();
        [
            self.n_expert,
            2 * rg + rd,
            self.hidden.div_ceil(COLS),
            EXPERTS.group,
            MX_TILE_BYTES,
        ]
        .map(|x| x as u64)
        .to_vec()
    }

    /// The router's tiled shape.
    pub fn router_shape(&self) -> Vec<u64> {
        let blocks = self.n_expert.div_ceil(ROUTER_ROWS) * self.hidden.div_ceil(ROUTER_COLS);
        [
            blocks,
            ROUTER_ROWS * ROUTER_COLS / ROUTER_TILE_ROWS,
            ROUTER_TILE_ROWS,
        ]
        .map(|x| x as u64)
        .to_vec()
    }
}

/// Tile rows after padding.
pub fn padded(nb: usize, g: Grouping) -> usize {
    nb.div_ceil(g.pad) * g.pad
}

/// The stored shape of `nb` x `kb` tiles of `tb` bytes under `g`.
pub fn grouped_shape(nb: usize, kb: usize, tb: usize, g: Grouping) -> Vec<u64> {
    [padded(nb, g) / g.group, kb, g.group, tb]
        .map(|x| x as u64)
        .to_vec()
}

/// Where tile (rb, cb) sits under `g`, in tiles.
fn grouped_at(rb: usize, cb: usize, kb: usize, g: Grouping) -> usize {
    ((rb / g.group) * kb + cb) * g.group + rb % g.group
}

/// Tiles in row-major block order (\[nb\]\[kb\]) stored under `g`.
pub fn group(tiles: &[u8], nb: usize, kb: usize, tb: usize, g: Grouping) -> Vec<u8> {
    let mut out = vec![0u8; padded(nb, g) * kb * tb];
    for rb in 0..nb {
        for cb in 0..kb {
            let dst = grouped_at(rb, cb, kb, g) * tb;
            out[dst..dst + tb].copy_from_slice(&tiles[(rb * kb + cb) * tb..][..tb]);
        }
    }
    out
}

/// The first `nb` tile rows of a grouped tensor, back in row-major order.
pub fn ungroup(stored: &[u8], nb: usize, kb: usize, tb: usize, g: Grouping) -> Vec<u8> {
    let mut out = vec![0u8; nb * kb * tb];
    for rb in 0..nb {
        for cb in 0..kb {
            let src = grouped_at(rb, cb, kb, g) * tb;
            out[(rb * kb + cb) * tb..][..tb].copy_from_slice(&stored[src..src + tb]);
        }
    }
    out
}

/// Where router element (i, j) sits, in elements, for a hidden size `h`.
pub fn router_at(i: usize, j: usize, h: usize) -> usize {
    let hb = h.div_ceil(ROUTER_COLS);
    let block = (i / ROUTER_ROWS) * hb + j / ROUTER_COLS;
    let (t, r, c) = (
        (i % ROUTER_ROWS) / ROUTER_TILE_ROWS,
        i % ROUTER_TILE_ROWS,
        j % ROUTER_COLS,
    );
    block * ROUTER_ROWS * ROUTER_COLS + (t * ROUTER_COLS + c) * ROUTER_TILE_ROWS + r
}

/// The router ([e][h] bf16 bits) in its tiles, zero-padded.
fn router_tiles(w: &[u16], e: usize, h: usize) -> Vec<u8> {
    let blocks = e.div_ceil(ROUTER_ROWS) * h.div_ceil(ROUTER_COLS);
    let mut out = vec![0u8; blocks * ROUTER_ROWS * ROUTER_COLS * 2];
    for i in 0..e {
        for j in 0..h {
            let at = 2 * router_at(i, j, h);
            out[at..at + 2].copy_from_slice(&w[i * h + j].to_le_bytes());
        }
    }
    out
}

/// The router's [e][h] bf16 bytes from its tiles.
fn router_from_tiles(b: &[u8], e: usize, h: usize) -> Vec<u8> {
    let mut out = vec![0u8; e * h * 2];
    for i in 0..e {
        for j in 0..h {
            let at = 2 * router_at(i, j, h);
            out[2 * (i * h + j)..][..2].copy_from_slice(&b[at..at + 2]);
        }
    }
    out
}

/// One expert's three grouped matrices as the converter concatenates them:
/// gate's and up's row groups interleaved, then down's (`chunk` bytes a group).
fn merge(parts: [&[u8]; 3], chunk: usize) -> Vec<u8> {
    let [gate, up, down] = parts;
    let mut out = Vec::with_capacity(gate.len() + up.len() + down.len());
    for (g, u) in gate.chunks_exact(chunk).zip(up.chunks_exact(chunk)) {
        out.extend_from_slice(g);
        out.extend_from_slice(u);
    }
    out.extend_from_slice(down);
    out
}

/// The inverse of [`merge`]: where part p's row group r sits in one expert,
/// in groups.
fn merged_group(part: usize, r: usize, rg: usize) -> usize {
    match part {
        0 | 1 => 2 * r + part,
        _ => 2 * rg + r,
    }
}

/// One expert matrix (ggml MXFP4 rows) as the converter stores it: tiles,
/// its biases (bf16 bits, one per row) in each row block's first tile,
/// tile rows grouped.
fn expert_tiles(
    mx: &[u8],
    bias: &[u16],
    n: usize,
    k: usize,
) -> std::result::Result<Vec<u8>, String> {
    let s = MxShape::new(n, k).map_err(|e| e.0)?;
    let mut tiles = q4nx::mx_from_mxfp4(mx, s).map_err(|e| e.0)?;
    let kb = s.tiles_per_row();
    for rb in 0..n / ROWS {
        let t = &mut tiles[rb * kb * TILE..][..TILE];
        for r in 0..ROWS {
            t[BIAS_AT + 2 * r..][..2].copy_from_slice(&bias[rb * ROWS + r].to_le_bytes());
        }
    }
    Ok(group(&tiles, n / ROWS, kb, TILE, EXPERTS))
}

// ---------------------------------------------------------------- reading

fn read(
    st: &SafeTensors,
    rows: &[names::Row],
    text: &Json,
    config_path: &Path,
) -> Result<(Vec<PackTensor>, Vec<String>)> {
    let geo = Geometry::from_config(text).map_err(|(key, what)| ModelError::Key {
        path: config_path.to_path_buf(),
        key,
        what: format!("{what} (the layout of {SOURCE})"),
    })?;
    let mut tensors = Vec::new();
    let mut unmapped = Vec::new();
    for t in &st.tensors {
        let err = |what: String| ModelError::from(st.tensor_error(&t.name, what));
        if let Some(i) = layer_of(MERGED, &t.name) {
            tensors.extend(read_experts(st, t, i, &geo)?);
            continue;
        }
        if layer_of(ROUTER_PREFILL, &t.name).is_some() {
            // The router's row-major copy: `verify` compares the two.
            continue;
        }
        let Some(g) = names::to_gguf(rows, &t.name) else {
            unmapped.push(t.name.clone());
            continue;
        };
        if STACKS.iter().any(|(w, _)| fits(w, &g)) {
            return Err(err(format!(
                "an expert stack on its own: the converter merges the three into {MERGED}"
            )));
        }
        if fits(ROUTER, &g) {
            tensors.push(read_router(st, t, &g, &geo)?);
        } else if let Some((n, k, grouping)) = geo.q4(&g) {
            tensors.push(read_q4(st, t, &g, n, k, grouping)?);
        } else {
            if let Some((want, keys)) = geo.plain_shape(&g) {
                if t.shape != want {
                    return Err(err(format!(
                        "shape {:?}, but config.json's {keys} make it {want:?}",
                        t.shape
                    )));
                }
            }
            tensors.push(super::read_tensor(
                st,
                t,
                &g,
                super::KHint::None,
                None,
                false,
            )?);
        }
    }
    Ok((tensors, unmapped))
}

fn read_q4(
    st: &SafeTensors,
    t: &StTensor,
    gguf: &str,
    n: usize,
    k: usize,
    g: Grouping,
) -> Result<PackTensor> {
    let err = |what: String| ModelError::from(st.tensor_error(&t.name, what));
    let kb = k.div_ceil(COLS);
    let want = grouped_shape(n / ROWS, kb, TILE, g);
    if t.dtype != StDtype::I8 || t.shape != want {
        return Err(err(format!(
            "{} {:?}: the gpt-oss converter stores this {n} x {k} matrix as I8 {want:?}: Q4 half tiles (32 x 128, 2,560 bytes), {} tile rows grouped by {} after zero-padding to a multiple of {} ({SOURCE})",
            t.dtype.name(),
            t.shape,
            n / ROWS,
            g.group,
            g.pad
        )));
    }
    let tiles = ungroup(&st.bytes(t), n / ROWS, kb, TILE, g);
    let s = Q4Shape::of(TileForm::Half, n, k).map_err(|e| err(e.0))?;
    let (dtype, data, inexact) = q4nx::to_ggml(&tiles, s).map_err(|e| err(e.0))?;
    let kind = if dtype == GgmlType::Q4_0 {
        Q4Kind::Symmetric
    } else {
        Q4Kind::Asymmetric
    };
    Ok(PackTensor {
        pack_name: t.name.clone(),
        gguf_name: gguf.to_string(),
        form: Form::Q4(TileForm::Half, kind.name()),
        stored_shape: t.shape.clone(),
        stored_bytes: t.len,
        raw: RawTensor {
            dtype,
            dims: vec![k as u64, n as u64],
            bytes: ByteView::from_vec(data),
        },
        inexact_scales: inexact,
    })
}

fn read_router(st: &SafeTensors, t: &StTensor, gguf: &str, geo: &Geometry) -> Result<PackTensor> {
    let (e, h) = (geo.n_expert, geo.hidden);
    let want = geo.router_shape();
    if t.dtype != StDtype::BF16 || t.shape != want {
        return Err(ModelError::from(st.tensor_error(
            &t.name,
            format!(
                "{} {:?}: the gpt-oss converter stores the {e} x {h} router as BF16 {want:?}, 32 x 64 blocks of two 16-row tiles ({SOURCE} process_gptoss_router_weights)",
                t.dtype.name(),
                t.shape
            ),
        )));
    }
    Ok(PackTensor {
        pack_name: t.name.clone(),
        gguf_name: gguf.to_string(),
        form: Form::Plain("BF16 router tiles (32 x 64)"),
        stored_shape: t.shape.clone(),
        stored_bytes: t.len,
        raw: RawTensor {
            dtype: GgmlType::BF16,
            dims: vec![h as u64, e as u64],
            bytes: ByteView::from_vec(router_from_tiles(&st.bytes(t), e, h)),
        },
        inexact_scales: 0,
    })
}

/// The merged experts of layer `i` as the three GGUF stacks ([K, N, E] MXFP4).
fn read_experts(
    st: &SafeTensors,
    t: &StTensor,
    i: usize,
    geo: &Geometry,
) -> Result<Vec<PackTensor>> {
    let err = |what: String| ModelError::from(st.tensor_error(&t.name, what));
    let want = geo.merged_shape();
    if !matches!(t.dtype, StDtype::U8 | StDtype::I8) || t.shape != want {
        return Err(err(format!(
            "{} {:?}: the gpt-oss converter stores layer {i}'s experts as U8 {want:?}: [experts, gate and up row groups interleaved then down's, tile columns, 4 tile rows, MXFP4 tiles of 2,560 bytes] ({SOURCE} post_gpt_oss_process)",
            t.dtype.name(),
            t.shape
        )));
    }
    let bytes = st.bytes(t);
    let (rg, rd) = geo.expert_groups();
    let kb = want[2] as usize;
    let chunk = kb * EXPERTS.group * TILE;
    let per_expert = (2 * rg + rd) * chunk;
    let mut out = Vec::new();
    for (part, (n, k)) in geo.stacks().into_iter().enumerate() {
        let nb = n / ROWS;
        let groups = if part < 2 { rg } else { rd };
        let s = MxShape::new(n, k).map_err(|e| err(e.0))?;
        let mut data = Vec::with_capacity(geo.n_expert * s.ggml_bytes());
        for e in 0..geo.n_expert {
            let x = &bytes[e * per_expert..][..per_expert];
            let mut grouped = Vec::with_capacity(groups * chunk);
            for r in 0..groups {
                grouped.extend_from_slice(&x[merged_group(part, r, rg) * chunk..][..chunk]);
            }
            let tiles = ungroup(&grouped, nb, kb, TILE, EXPERTS);
            data.extend(q4nx::mx_to_mxfp4(&tiles, s).map_err(|e| err(e.0))?);
        }
        out.push(PackTensor {
            pack_name: t.name.clone(),
            gguf_name: at(STACKS[part].0, i),
            form: Form::Mx,
            stored_shape: t.shape.clone(),
            stored_bytes: t.len * groups / (2 * rg + rd),
            raw: RawTensor {
                dtype: GgmlType::MXFP4,
                dims: vec![k as u64, n as u64, geo.n_expert as u64],
                bytes: ByteView::from_vec(data),
            },
            inexact_scales: 0,
        });
    }
    Ok(out)
}

// ---------------------------------------------------------------- writing

fn bf16_bits(v: &[f32]) -> Vec<u16> {
    v.iter().map(|&x| bf16::from_f32(x).to_bits()).collect()
}

fn le(v: &[u16]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// The config.json written for a GGUF must read back to its semantics:
/// what it cannot restate (a sliding-layer RoPE base, a stated
/// `rope.scaling.attn_factor`, a dense width other than the experts') is
/// refused by name.
fn restated(
    g: &Gguf,
    family: &'static Family,
    sem: &crate::semantics::Semantics,
    config: &Json,
) -> Result<()> {
    let refuse = |what: String| ModelError::Unsupported {
        path: g.path().to_path_buf(),
        what,
    };
    let dims = |n: &str| g.tensor(n).map(|t| t.dims.clone());
    let d = Decls::config(config, g.path(), family.arch, &dims);
    let back = (family.semantics)(&d).map_err(|e| {
        refuse(format!(
            "the config.json written for it does not read back: {e}"
        ))
    })?;
    let (gm, bm) = (
        sem.moe
            .as_ref()
            .map(|m| (m.value.n_expert, m.value.n_used, m.value.n_ff_exp)),
        back.moe
            .as_ref()
            .map(|m| (m.value.n_expert, m.value.n_used, m.value.n_ff_exp)),
    );
    let field = |what, a: &dyn std::fmt::Debug, b: &dyn std::fmt::Debug| {
        (what, format!("{a:?}"), format!("{b:?}"))
    };
    let fields: [(&str, String, String); 8] = [
        field("dims", &sem.dims, &back.dims),
        field(
            "layer kinds",
            &sem.layer_kinds.value,
            &back.layer_kinds.value,
        ),
        field(
            "sliding window",
            &sem.sliding_window.value,
            &back.sliding_window.value,
        ),
        field(
            "full layers' RoPE",
            &sem.rope_full.value,
            &back.rope_full.value,
        ),
        field(
            "sliding layers' RoPE",
            &sem.rope_sliding.value,
            &back.rope_sliding.value,
        ),
        field("norm epsilon", &sem.norm_eps.value, &back.norm_eps.value),
        field("q/k/v biases", &sem.attn_bias.value, &back.attn_bias.value),
        field("experts (count, chosen, width)", &gm, &bm),
    ];
    for (what, a, b) in fields {
        if a != b {
            return Err(refuse(format!(
                "a gpt-oss pack's config.json cannot restate its {what}: the GGUF declares {a}, HF's GptOssConfig keys would say {b}"
            )));
        }
    }
    Ok(())
}

fn import(
    g: &Gguf,
    family: &'static Family,
    rules: &ImportRules,
    opts: ImportOptions,
    progress: &mut dyn FnMut(usize, usize, &str),
) -> Result<Imported> {
    let path = g.path().to_path_buf();
    let refuse = |what: String| ModelError::Unsupported {
        path: path.clone(),
        what,
    };
    let terr = |name: &str, what: String| ModelError::Tensor {
        path: path.clone(),
        tensor: name.to_string(),
        what,
    };
    if opts.keep_q8 {
        return Err(refuse(format!(
            "--keep-q8: a gpt-oss pack holds its matrices in Q4 half tiles and its experts in MXFP4 tiles ({SOURCE}); it has no Q8 tiles"
        )));
    }
    if let Tiles::Force(f) = opts.tiles {
        if f != TileForm::Half {
            return Err(refuse(format!(
                "--tiles forces the {}, but gpt-oss packs hold their Q4 matrices in the {} (configs/gpt-oss.json col_block_size 128; --tiles auto writes it)",
                f.name(),
                TileForm::Half.name()
            )));
        }
    }
    let rows =
        names::table(family).ok_or_else(|| refuse("gpt-oss has no pack name table".into()))?;
    let sem = families::semantics_from_gguf(g)?;
    let config = import::config_json(g, &sem, rules)?;
    restated(g, family, &sem, &config)?;
    let geo = Geometry::from_config(&config).map_err(|(key, what)| ModelError::Key {
        path: path.clone(),
        key,
        what: format!("{what} (writing the layout of {SOURCE})"),
    })?;
    let mut notes = vec![format!(
        "gpt-oss: laid out as {SOURCE}: Q4 matrices in half tiles (32 x 128, 2,560 bytes), q/k/v/o tile rows padded to 16 and grouped by 4, lm_head grouped by 2; experts kept bit for bit in MXFP4 tiles with their biases, gate/up/down merged per layer; router in 32 x 64 BF16 tiles plus its row-major copy"
    )];
    let plan = import::plan_names(g, family, &rows, &mut notes)?;
    let mut requantized: BTreeMap<String, usize> = BTreeMap::new();
    let mut experts: BTreeMap<usize, [Option<Vec<Vec<u8>>>; 3]> = BTreeMap::new();
    let mut tensors = Vec::with_capacity(plan.len());
    for (gname, pname, info) in import::planned(g, &plan, progress) {
        let bytes = g.tensor_bytes(info);
        let key = if pname == "lm_head.weight" {
            "output.weight"
        } else {
            gname.as_str()
        };
        let values = || -> Result<Vec<f32>> {
            let mut v = vec![0f32; info.n_elements() as usize];
            blocks::dequantize(info.dtype, &bytes, &mut v)
                .map_err(|e| terr(gname, e.to_string()))?;
            Ok(v)
        };
        let expect_dims = |want: Vec<u64>| -> Result<()> {
            if info.dims != want {
                return Err(terr(
                    gname,
                    format!(
                        "dims {:?}, but the config.json written for it makes it {want:?}",
                        info.dims
                    ),
                ));
            }
            Ok(())
        };
        if let Some((part, i)) = STACKS
            .iter()
            .enumerate()
            .find_map(|(p, (w, _))| layer_of(w, key).map(|i| (p, i)))
        {
            let (n, k) = geo.stacks()[part];
            expect_dims(vec![k as u64, n as u64, geo.n_expert as u64])?;
            if info.dtype != GgmlType::MXFP4 {
                return Err(terr(
                    gname,
                    format!(
                        "is {}: the gpt-oss converter takes MXFP4 experts only and keeps them bit for bit ({SOURCE}: _pack_MXFP4_q4nx); llama-quantize's MXFP4_MOE makes them",
                        info.dtype
                    ),
                ));
            }
            let bname = at(STACKS[part].1, i);
            let b = g.tensor(&bname).ok_or_else(|| {
                terr(
                    &bname,
                    "is required: the layout keeps each expert's biases in its tiles".into(),
                )
            })?;
            if b.dims != [n as u64, geo.n_expert as u64] {
                return Err(terr(
                    &bname,
                    format!("dims {:?}, expected [{n}, {}]", b.dims, geo.n_expert),
                ));
            }
            let mut bias = vec![0f32; n * geo.n_expert];
            blocks::dequantize(b.dtype, &g.tensor_bytes(b), &mut bias)
                .map_err(|e| terr(&bname, e.to_string()))?;
            let bias = bf16_bits(&bias);
            let per = MxShape::new(n, k)
                .map_err(|e| terr(gname, e.0))?
                .ggml_bytes();
            let parts = (0..geo.n_expert)
                .map(|e| expert_tiles(&bytes[e * per..][..per], &bias[e * n..][..n], n, k))
                .collect::<std::result::Result<Vec<_>, _>>()
                .map_err(|e| terr(gname, e))?;
            let slot = experts.entry(i).or_default();
            slot[part] = Some(parts);
            if slot.iter().all(Option::is_some) {
                let [gate, up, down] = experts.remove(&i).expect("present").map(Option::unwrap);
                let chunk = k.div_ceil(COLS) * EXPERTS.group * TILE;
                let mut data = Vec::new();
                for e in 0..geo.n_expert {
                    data.extend(merge([&gate[e], &up[e], &down[e]], chunk));
                }
                tensors.push(StOut {
                    name: at(MERGED, i),
                    dtype: StDtype::U8,
                    shape: geo.merged_shape(),
                    data,
                });
            }
            continue;
        }
        if fits(ROUTER, key) {
            let (e, h) = (geo.n_expert, geo.hidden);
            expect_dims(vec![h as u64, e as u64])?;
            let w = bf16_bits(&values()?);
            tensors.push(StOut {
                name: pname.clone(),
                dtype: StDtype::BF16,
                shape: geo.router_shape(),
                data: router_tiles(&w, e, h),
            });
            let hp = h.div_ceil(COLS) * COLS;
            let mut prefill = vec![0u16; e * hp];
            for r in 0..e {
                prefill[r * hp..r * hp + h].copy_from_slice(&w[r * h..(r + 1) * h]);
            }
            tensors.push(StOut {
                name: at(ROUTER_PREFILL, layer_of(ROUTER, key).expect("fits")),
                dtype: StDtype::BF16,
                shape: vec![e as u64, hp as u64],
                data: le(&prefill),
            });
            continue;
        }
        if let Some((n, k, grouping)) = geo.q4(key) {
            expect_dims(vec![k as u64, n as u64])?;
            let s = Q4Shape::of(TileForm::Half, n, k).map_err(|e| terr(gname, e.0))?;
            let tiles = match info.dtype {
                dt @ (GgmlType::Q4_0 | GgmlType::Q4_1) => {
                    q4nx::from_ggml(dt, &bytes, s).map_err(|e| terr(gname, e.0))?
                }
                dt => {
                    *requantized.entry(dt.name().to_string()).or_default() += 1;
                    let band = Q4Shape::of(TileForm::Half, ROWS, k).expect("checked above");
                    let plain = Plain {
                        dtype: dt,
                        dims: info.dims.clone(),
                        bytes: bytes.to_vec(),
                    };
                    import::banded(&plain, ROWS, |v| {
                        Ok(q4nx::quantize(v, band, Q4Kind::Asymmetric))
                    })
                    .map_err(|e| terr(gname, e))?
                }
            };
            let kb = s.tiles_per_row();
            tensors.push(StOut {
                name: pname.clone(),
                dtype: StDtype::I8,
                shape: grouped_shape(n / ROWS, kb, TILE, grouping),
                data: group(&tiles, n / ROWS, kb, TILE, grouping),
            });
            continue;
        }
        if info.dims.len() > 2
            || (info.dims.len() == 2 && info.dtype.is_quantized() && key != "token_embd.weight")
        {
            return Err(terr(
                gname,
                format!(
                    "a {} tensor of dims {:?} that the gpt-oss layout does not place",
                    info.dtype, info.dims
                ),
            ));
        }
        // The embedding, norms, sinks and biases: BF16 with the HF shape.
        tensors.push(StOut {
            name: pname.clone(),
            dtype: StDtype::BF16,
            shape: info.dims.iter().rev().copied().collect(),
            data: import::to_bf16_bytes(&values()?),
        });
    }
    if let Some((i, _)) = experts.iter().next() {
        return Err(terr(
            &at(STACKS[0].0, *i),
            "layer's expert stacks are not all present (gate, up and down are merged)".into(),
        ));
    }
    for (dt, count) in &requantized {
        notes.push(format!(
            "{count} {dt} matrices re-quantized to Q4_1 (configs/gpt-oss.json default_tensor_type){}",
            if dt == "Q8_0" {
                ": the converter sends Q8_0 through its Q4 packer, which keeps 4 bits of each code"
            } else {
                ""
            }
        ));
    }
    if geo.n_expert % ROUTER_ROWS != 0 || geo.hidden % ROUTER_COLS != 0 {
        notes.push(format!(
            "the {} x {} router zero-padded to whole 32 x 64 tiles (the converter requires {} experts and a hidden size of a multiple of 64)",
            geo.n_expert, geo.hidden, ROUTER_ROWS
        ));
    }
    Ok(Imported {
        tensors,
        config,
        sem,
        notes,
    })
}

// ---------------------------------------------------------------- verify

/// A running comparison: how many values, the first place that differs.
struct Tally {
    check: LayoutCheck,
}

impl Tally {
    fn new(what: &str) -> Tally {
        Tally {
            check: LayoutCheck {
                what: what.into(),
                values: 0,
                failure: None,
            },
        }
    }
    fn compare(&mut self, tensor: &str, got: &[u8], want: &[u8], unit: &str) {
        self.check.values += want.len();
        if self.check.failure.is_some() {
            return;
        }
        if got.len() != want.len() {
            self.check.failure = Some(format!(
                "{tensor}: {} bytes where the layout makes {}",
                got.len(),
                want.len()
            ));
        } else if let Some(at) = got.iter().zip(want).position(|(a, b)| a != b) {
            self.check.failure = Some(format!(
                "{tensor}: byte {at} ({unit}) is {:#04x}, the layout makes {:#04x}",
                got[at], want[at]
            ));
        }
    }
}

/// The gpt-oss layout's own checks: the biases kept in the expert tiles
/// equal the bias tensors; every laid-out tensor is, byte for byte, the
/// layout of the weights read from it (so every padding byte is zero and
/// no tile is out of place); the router's row-major copy holds its values.
fn verify(pack: &Pack) -> Result<Vec<LayoutCheck>> {
    let st = SafeTensors::open(&pack.weights_path)?;
    let geo = Geometry::from_config(&pack.text).map_err(|(key, what)| ModelError::Key {
        path: pack.dir.join(super::CONFIG),
        key,
        what,
    })?;
    let mut biases = Tally::new("expert biases kept in the MXFP4 tiles (bytes 128..192 of each row block's first tile) against mlp.experts.*_proj_bias");
    let mut experts = Tally::new(
        "merged experts: every byte is the layout of the weights and biases read (padding zero)",
    );
    let mut q4 =
        Tally::new("Q4 matrices: every byte is the layout of the weights read (padding zero)");
    let mut router = Tally::new("router: its tiles are the layout of the router read, and router.weight_prefill holds the same values, zero-padded");
    let mut notes = Vec::new();
    let raw = |name: &str| pack.by_gguf(name).map(|t| t.raw.bytes.to_vec());
    for t in &st.tensors {
        let stored = st.bytes(t);
        if let Some(i) = layer_of(MERGED, &t.name) {
            let (rg, _) = geo.expert_groups();
            let kb = geo.hidden.div_ceil(COLS);
            let chunk = kb * EXPERTS.group * TILE;
            let mut parts: Vec<Vec<Vec<u8>>> = Vec::new();
            for (part, (n, k)) in geo.stacks().into_iter().enumerate() {
                let (Some(w), Some(b)) = (
                    raw(&at(STACKS[part].0, i)),
                    pack.by_gguf(&at(STACKS[part].1, i)),
                ) else {
                    return Err(ModelError::from(
                        st.tensor_error(&t.name, "read without its expert stacks or biases"),
                    ));
                };
                let mut bias = vec![0f32; n * geo.n_expert];
                blocks::dequantize(b.raw.dtype, &b.raw.bytes, &mut bias)
                    .map_err(|e| ModelError::from(st.tensor_error(&b.pack_name, e.to_string())))?;
                let bias = bf16_bits(&bias);
                let per = MxShape::new(n, k).expect("read").ggml_bytes();
                let mut tiles = Vec::new();
                for e in 0..geo.n_expert {
                    tiles.push(
                        expert_tiles(&w[e * per..][..per], &bias[e * n..][..n], n, k)
                            .map_err(|x| ModelError::from(st.tensor_error(&t.name, x)))?,
                    );
                }
                // The biases as stored in the tiles, against the bias tensor.
                let per_expert = stored.len() / geo.n_expert;
                for e in 0..geo.n_expert {
                    let x = &stored[e * per_expert..][..per_expert];
                    for rb in 0..n / ROWS {
                        let grp = merged_group(part, rb / EXPERTS.group, rg);
                        let tile = &x[grp * chunk + (rb % EXPERTS.group) * TILE..][..TILE];
                        biases.compare(
                            &format!("{} expert {e} row block {rb}", t.name),
                            &tile[BIAS_AT..BIAS_AT + 2 * ROWS],
                            &le(&bias[e * n + rb * ROWS..][..ROWS]),
                            "a bf16 bias",
                        );
                    }
                }
                parts.push(tiles);
            }
            let mut want = Vec::new();
            for ((gate, up), down) in parts[0].iter().zip(&parts[1]).zip(&parts[2]) {
                want.extend(merge([gate, up, down], chunk));
            }
            experts.compare(&t.name, &stored, &want, "of an MXFP4 tile");
            continue;
        }
        if let Some(i) = layer_of(ROUTER_PREFILL, &t.name) {
            let Some(r) = pack.by_gguf(&at(ROUTER, i)) else {
                return Err(ModelError::from(
                    st.tensor_error(&t.name, "a router copy without a router"),
                ));
            };
            let (e, h) = (geo.n_expert, geo.hidden);
            let hp = h.div_ceil(COLS) * COLS;
            let mut want = vec![0u8; e * hp * 2];
            for row in 0..e {
                want[2 * row * hp..][..2 * h].copy_from_slice(&r.raw.bytes[2 * row * h..][..2 * h]);
            }
            router.compare(&t.name, &stored, &want, "a bf16 weight");
            continue;
        }
        let Some(p) = pack.tensors.iter().find(|p| p.pack_name == t.name) else {
            continue;
        };
        if fits(ROUTER, &p.gguf_name) {
            let w: Vec<u16> = p
                .raw
                .bytes
                .chunks_exact(2)
                .map(|b| u16::from_le_bytes([b[0], b[1]]))
                .collect();
            router.compare(
                &t.name,
                &stored,
                &router_tiles(&w, geo.n_expert, geo.hidden),
                "a bf16 weight",
            );
        } else if let Some((n, k, grouping)) = geo.q4(&p.gguf_name) {
            if p.inexact_scales > 0 {
                notes.push(format!(
                    "{}: {} scales do not survive bf16 -> f16 -> bf16, its bytes are not re-laid",
                    t.name, p.inexact_scales
                ));
                continue;
            }
            let s = Q4Shape::of(TileForm::Half, n, k).expect("read");
            let tiles = q4nx::from_ggml(p.raw.dtype, &p.raw.bytes, s)
                .map_err(|e| ModelError::from(st.tensor_error(&t.name, e.0)))?;
            let want = group(&tiles, n / ROWS, s.tiles_per_row(), TILE, grouping);
            q4.compare(&t.name, &stored, &want, "of a Q4 half tile");
        }
    }
    let mut out = vec![biases.check, experts.check, q4.check, router.check];
    for n in notes {
        out.push(LayoutCheck {
            what: n,
            values: 0,
            failure: None,
        });
    }
    Ok(out)
}
