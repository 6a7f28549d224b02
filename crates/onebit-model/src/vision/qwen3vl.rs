//! Qwen3-VL's vision tower (mmproj `clip.projector_type` = `qwen3vl_merger`),
//! as llama.cpp's `tools/mtmd/models/qwen3vl.cpp` computes it. Invariant:
//! every rule below is a [`Sourced`] value of [`Rules`], and every tensor of
//! the file is one this encoder runs (others are refused by name).
//!
//! - Dynamic resolution: any width and height that are multiples of
//!   `patch_size * 2` (the caller fits the image with [`Tower::fit`], mtmd's
//!   `calc_size_preserved_ratio` within 8 .. 4096 tokens, bicubic).
//! - Patch embedding: a still image is both frames of the temporal patch,
//!   so the two kernels (`v.patch_embd.weight`, `.weight.1`) are summed, plus
//!   the bias. Patches are then ordered by 2 x 2 merge blocks (blocks
//!   row-major, patches row-major within a block), and so is everything after.
//! - Position embeddings: the learned grid (`v.position_embd`, n x n) resized
//!   to the patch grid bilinearly with aligned corners (ggml_interpolate
//!   BILINEAR | ALIGN_CORNERS), unchanged when the sizes agree.
//! - Pre-LN blocks (LayerNorm + bias): fused `attn_qkv` with bias, 2-D
//!   rotary positions (ggml_rope_multi VISION: pair j of (j, j + d/2) turns
//!   by row * 10000^(-4j/d) for j < d/4, by column * 10000^(-4(j - d/4)/d)
//!   after), softmax over every patch (`attention::attend_full`, tiled like
//!   a matrix product), `attn_out`; MLP `ffn_up`, GELU,
//!   `ffn_down`, all with biases.
//! - Deepstack: after each block that has `v.deepstack.N.*`, the four
//!   patches of each merge block side by side through LayerNorm (4 n_embd),
//!   fc1, GELU, fc2: one feature per token, in block order.
//! - The merger: `v.post_ln` per patch, four patches side by side, `mm.0`,
//!   GELU, `mm.2`. A token's row is the merger's output, then each
//!   deepstack feature in block order (the text model's input width).
//!
//! The text side takes the rows with their grid ([`ImageEmbeddings::grid`]:
//! pw / 2 tokens a row, ph / 2 rows), which its IMROPE turns into positions,
//! and adds the deepstack features into its first layers (`Body::deepstack`);
//! [`super::VisionTower::check_text_model`] refuses a text model without
//! IMROPE or with another deepstack count.

use onebit_kernels::attention::{attend_full, AttnShape};
use onebit_kernels::{matmul, Pool, Precision, QMatrix};

use super::gemma3::{
    add_bias, f32_matrix, layer_norm_rows, size, triple, Act, Matrix, Norm, Reader,
};
use super::{ImageEmbeddings, ImageMarkers, Preprocess, ResizeFilter, TowerTensors};
use crate::error::{ModelError, Result};
use crate::families::decls::{keys, Decls, MAX_SIZE};
use crate::semantics::Sourced;

/// The `clip.projector_type` this file runs.
pub const PROJECTOR: &str = "qwen3vl_merger";

/// mtmd's `img_beg` / `img_end` for the Qwen-VL projectors (`mtmd.cpp`).
pub const MARKERS: ImageMarkers = ImageMarkers {
    begin: "<|vision_start|>",
    end: "<|vision_end|>",
};

/// Tokens an image may take (llama.cpp's `set_limit_image_tokens(8, 4096)`).
pub const MIN_TOKENS: usize = 8;
pub const MAX_TOKENS: usize = 4096;

/// The 2-D rotary base (qwen3vl.cpp's `ggml_rope_multi` freq_base).
const ROPE_BASE: f32 = 10000.0;

keys! {
    N_EMBD = "vision.embedding_length", [];
    N_FF = "vision.feed_forward_length", [];
    N_LAYER = "vision.block_count", [];
    N_HEAD = "vision.attention.head_count", [];
    EPS = "vision.attention.layer_norm_epsilon", [];
    IMAGE_SIZE = "vision.image_size", [];
    PATCH_SIZE = "vision.patch_size", [];
    IMAGE_MEAN = "vision.image_mean", [];
    IMAGE_STD = "vision.image_std", [];
    MERGE = "vision.spatial_merge_size", [];
}

/// Tensor names, as llama.cpp's `tools/mtmd/clip-impl.h` spells them.
pub mod names {
    pub const PATCH_EMBD: &str = "v.patch_embd.weight";
    pub const PATCH_EMBD_1: &str = "v.patch_embd.weight.1";
    pub const PATCH_BIAS: &str = "v.patch_embd.bias";
    pub const POS_EMBD: &str = "v.position_embd.weight";
    pub const POST_LN: &str = "v.post_ln";
    /// The merger's two layers (`TN_LLAVA_PROJ` 0 and 2).
    pub const MM_0: &str = "mm.0";
    pub const MM_2: &str = "mm.2";
    /// Per block `v.blk.{i}.<part>.{weight,bias}`.
    pub const BLOCK_PARTS: [&str; 6] = ["ln1", "attn_qkv", "attn_out", "ln2", "ffn_up", "ffn_down"];
    /// Per deepstack layer `v.deepstack.{i}.<part>.{weight,bias}`.
    pub const DEEPSTACK_PARTS: [&str; 3] = ["norm", "fc1", "fc2"];
}

/// Every rule of the tower, with its source.
#[derive(Clone, Debug)]
pub struct Rules {
    pub n_embd: usize,
    pub n_ff: usize,
    pub n_layer: usize,
    pub n_head: usize,
    pub eps: Sourced<f32>,
    /// Side of the learned position grid, in patches.
    pub pos_side: Sourced<usize>,
    pub patch_size: Sourced<usize>,
    pub mean: Sourced<[f32; 3]>,
    pub std: Sourced<[f32; 3]>,
    pub act: Sourced<Act>,
    /// The blocks followed by a deepstack merger.
    pub deepstack: Sourced<Vec<usize>>,
    /// The merger's output width (the text model's hidden size).
    pub n_embd_merged: usize,
    pub bidirectional: Sourced<bool>,
}

struct Linear {
    w: Matrix,
    b: Vec<f32>,
}

struct Block {
    ln1: Norm,
    qkv: Linear,
    out: Linear,
    ln2: Norm,
    up: Linear,
    down: Linear,
}

struct Merger {
    norm: Norm,
    fc1: Linear,
    fc2: Linear,
}

pub struct Tower {
    pub rules: Rules,
    /// The two temporal kernels summed: [n_embd][3 p p].
    patch: QMatrix,
    patch_bias: Vec<f32>,
    pos: Vec<f32>,
    blocks: Vec<Block>,
    /// Per block, its deepstack merger.
    deepstack: Vec<Option<Merger>>,
    post_ln: Norm,
    mm0: Linear,
    mm2: Linear,
}

fn blk(i: usize, part: &str, what: &str) -> String {
    format!("v.blk.{i}.{part}.{what}")
}

fn ds(i: usize, part: &str, what: &str) -> String {
    format!("v.deepstack.{i}.{part}.{what}")
}

impl Linear {
    fn read(r: &Reader, prefix: &str, rows: usize, cols: usize) -> Result<Linear> {
        Ok(Linear {
            w: r.matrix(&format!("{prefix}.weight"), rows, cols)?,
            b: r.floats(&format!("{prefix}.bias"), &[rows])?,
        })
    }

    fn run(&self, pool: &Pool, x: &[f32], n: usize) -> Vec<f32> {
        let mut out = vec![0f32; n * self.w.rows()];
        self.w.run(pool, x, n, &mut out);
        add_bias(&mut out, &self.b);
        out
    }
}

impl Tower {
    pub(super) fn load(g: &dyn TowerTensors, d: &Decls, proj_src: String) -> Result<Tower> {
        let n_embd = size(d, N_EMBD, MAX_SIZE)?;
        let n_ff = size(d, N_FF, MAX_SIZE)?;
        let n_layer = size(d, N_LAYER, 1024)?;
        let n_head = size(d, N_HEAD, MAX_SIZE)?;
        if n_embd % n_head != 0 || (n_embd / n_head) % 4 != 0 {
            return Err(d.err(
                N_HEAD,
                format!("{n_head} heads of {n_embd}: the 2-D rotary needs a head size that is a multiple of 4"),
            ));
        }
        let eps = d
            .f64_opt(EPS)?
            .ok_or_else(|| d.err(EPS, "is required but absent"))?;
        if !(eps.is_finite() && eps >= 0.0) {
            return Err(d.err(EPS, format!("{eps} is not a non-negative number")));
        }
        let eps = Sourced::new(eps as f32, d.src(EPS));
        let patch_size = Sourced::new(size(d, PATCH_SIZE, 64)?, d.src(PATCH_SIZE));
        let image_size = size(d, IMAGE_SIZE, 16384)?;
        if let Some(m) = d.usize_opt(MERGE)? {
            if m != 2 {
                return Err(d.err(
                    MERGE,
                    format!("{m}: llama.cpp's qwen3vl graph merges 2 x 2 patches"),
                ));
            }
        }
        let mean = triple(d, IMAGE_MEAN)?;
        let std = triple(d, IMAGE_STD)?;
        if std.value.iter().any(|s| !(s.is_finite() && *s > 0.0)) {
            return Err(d.err(
                IMAGE_STD,
                format!("{:?}: every value must be positive", std.value),
            ));
        }
        let act = Act::read(d, PROJECTOR)?;
        let r = Reader {
            g,
            tower: PROJECTOR,
        };
        // The learned grid: n_pos = side^2 rows.
        let pos_dims = g
            .tensor(names::POS_EMBD)
            .map(|t| t.dims.clone())
            .ok_or_else(|| {
                r.err(
                    names::POS_EMBD,
                    "is required by the qwen3vl vision tower but absent".into(),
                )
            })?;
        let side = match pos_dims[..] {
            [e, n]
                if e == n_embd as u64 && (n as f64).sqrt().round().powi(2) == n as f64 && n > 0 =>
            {
                (n as f64).sqrt().round() as usize
            }
            _ => {
                return Err(r.err(
                    names::POS_EMBD,
                    format!("has shape {pos_dims:?}, expected [{n_embd}, side^2] (ggml order)"),
                ))
            }
        };
        let pos_side = Sourced::new(
            side,
            format!(
                "tensor {} ({} positions; {} says image_size {image_size})",
                names::POS_EMBD,
                side * side,
                d.spelled(IMAGE_SIZE)
            ),
        );
        let mut deep = Vec::new();
        for i in 0..n_layer {
            if r.has(&ds(i, "norm", "weight")) {
                deep.push(i);
            }
        }
        let mm2_dims = g
            .tensor(&format!("{}.weight", names::MM_2))
            .map(|t| t.dims.clone())
            .ok_or_else(|| {
                r.err(
                    &format!("{}.weight", names::MM_2),
                    "is required by the qwen3vl vision tower but absent".into(),
                )
            })?;
        let e4 = 4 * n_embd;
        let n_embd_merged = match mm2_dims[..] {
            [i, o] if i == e4 as u64 && o > 0 && o <= MAX_SIZE as u64 => o as usize,
            _ => {
                return Err(r.err(
                    &format!("{}.weight", names::MM_2),
                    format!("has shape {mm2_dims:?}, expected [{e4}, n_text_embd] (ggml order)"),
                ))
            }
        };
        let mut known: Vec<String> = vec![
            names::PATCH_EMBD.into(),
            names::PATCH_EMBD_1.into(),
            names::PATCH_BIAS.into(),
            names::POS_EMBD.into(),
        ];
        for p in [names::POST_LN, names::MM_0, names::MM_2] {
            known.push(format!("{p}.weight"));
            known.push(format!("{p}.bias"));
        }
        for i in 0..n_layer {
            for part in names::BLOCK_PARTS {
                known.push(blk(i, part, "weight"));
                known.push(blk(i, part, "bias"));
            }
            for part in names::DEEPSTACK_PARTS {
                known.push(ds(i, part, "weight"));
                known.push(ds(i, part, "bias"));
            }
        }
        if let Some(t) = g.names().into_iter().find(|t| !known.contains(t)) {
            return Err(r.err(
                &t,
                format!(
                    "is not part of the qwen3vl vision tower onebit runs ({n_layer} blocks: {})",
                    names::BLOCK_PARTS.join(", ")
                ),
            ));
        }
        let p = patch_size.value;
        let k0 = r.floats(names::PATCH_EMBD, &[p, p, 3, n_embd])?;
        let k1 = r.floats(names::PATCH_EMBD_1, &[p, p, 3, n_embd])?;
        let summed: Vec<f32> = k0.iter().zip(&k1).map(|(a, b)| a + b).collect();
        let patch = f32_matrix(n_embd, 3 * p * p, &summed);
        let patch_bias = r.floats(names::PATCH_BIAS, &[n_embd])?;
        let pos = r.floats(names::POS_EMBD, &[n_embd, side * side])?;
        let mut blocks = Vec::with_capacity(n_layer);
        let mut deepstack = Vec::with_capacity(n_layer);
        for i in 0..n_layer {
            let pre = |part: &str| format!("v.blk.{i}.{part}");
            blocks.push(Block {
                ln1: r.norm(&pre("ln1"), n_embd)?,
                qkv: Linear::read(&r, &pre("attn_qkv"), 3 * n_embd, n_embd)?,
                out: Linear::read(&r, &pre("attn_out"), n_embd, n_embd)?,
                ln2: r.norm(&pre("ln2"), n_embd)?,
                up: Linear::read(&r, &pre("ffn_up"), n_ff, n_embd)?,
                down: Linear::read(&r, &pre("ffn_down"), n_embd, n_ff)?,
            });
            deepstack.push(if deep.contains(&i) {
                let pre = |part: &str| format!("v.deepstack.{i}.{part}");
                Some(Merger {
                    norm: r.norm(&pre("norm"), e4)?,
                    fc1: Linear::read(&r, &pre("fc1"), e4, e4)?,
                    fc2: Linear::read(&r, &pre("fc2"), n_embd_merged, e4)?,
                })
            } else {
                None
            });
        }
        let rules = Rules {
            n_embd,
            n_ff,
            n_layer,
            n_head,
            eps,
            pos_side,
            patch_size,
            mean,
            std,
            act,
            deepstack: Sourced::new(deep, "tensors v.deepstack.N.* present (llama.cpp clip.cpp has_deepstack)"),
            n_embd_merged,
            bidirectional: Sourced::new(
                false,
                format!("llama.cpp mtmd.cpp mtmd_decode_use_non_causal: false for {proj_src} {PROJECTOR}"),
            ),
        };
        Ok(Tower {
            rules,
            patch,
            patch_bias,
            pos,
            blocks,
            deepstack,
            post_ln: r.norm(names::POST_LN, n_embd)?,
            mm0: Linear::read(&r, names::MM_0, e4, e4)?,
            mm2: Linear::read(&r, names::MM_2, n_embd_merged, e4)?,
        })
    }

    /// The learned grid's size in pixels (the default input size).
    pub fn preprocess(&self) -> Preprocess {
        let s = (self.rules.pos_side.value * self.rules.patch_size.value) as u32;
        Preprocess {
            width: s,
            height: s,
            mean: self.rules.mean.value,
            std: self.rules.std.value,
            filter: ResizeFilter::Bicubic,
            projector: PROJECTOR,
        }
    }

    /// The size an image of `width` x `height` is resized to: mtmd's
    /// `calc_size_preserved_ratio` (multiples of 2 patches, rounded, then
    /// scaled into 8 .. 4096 tokens keeping the aspect ratio).
    pub fn fit(&self, width: u32, height: u32) -> (u32, u32) {
        let f = (self.rules.patch_size.value * 2) as f32;
        let (w, h) = (width.max(1) as f32, height.max(1) as f32);
        let area = f * f;
        let (min_px, max_px) = (MIN_TOKENS as f32 * area, MAX_TOKENS as f32 * area);
        let round = |x: f32| ((x / f).round() * f).max(f);
        let (mut wb, mut hb) = (round(w), round(h));
        if wb * hb > max_px {
            let beta = (h * w / max_px).sqrt();
            hb = ((h / beta / f).floor() * f).max(f);
            wb = ((w / beta / f).floor() * f).max(f);
        } else if wb * hb < min_px {
            let beta = (min_px / (h * w)).sqrt();
            hb = (h * beta / f).ceil() * f;
            wb = (w * beta / f).ceil() * f;
        }
        (wb as u32, hb as u32)
    }

    pub fn n_tokens_for(&self, width: usize, height: usize) -> usize {
        let p2 = 2 * self.rules.patch_size.value;
        (width / p2) * (height / p2)
    }

    /// Each token's row width: the merger's output, then each deepstack feature.
    pub fn n_embd_out(&self) -> usize {
        self.rules.n_embd_merged * (1 + self.rules.deepstack.value.len())
    }

    pub fn lines(&self) -> Vec<String> {
        let r = &self.rules;
        let mut out = vec![format!(
            "vision tower {PROJECTOR}: {} blocks, n_embd {}, heads {}, n_ff {}, rows of {} ({} merged + {} deepstack)",
            r.n_layer, r.n_embd, r.n_head, r.n_ff, self.n_embd_out(), r.n_embd_merged, r.deepstack.value.len()
        )];
        let mut line = |name: &str, value: String, source: &str| {
            out.push(format!("vision {name}: {value}  <- {source}"))
        };
        line("norm eps", format!("{:e}", r.eps.value), &r.eps.source);
        line(
            "patch size",
            r.patch_size.value.to_string(),
            &r.patch_size.source,
        );
        line(
            "position grid",
            format!(
                "{0} x {0}, resized bilinearly (aligned corners)",
                r.pos_side.value
            ),
            &r.pos_side.source,
        );
        line("image mean", format!("{:?}", r.mean.value), &r.mean.source);
        line("image std", format!("{:?}", r.std.value), &r.std.source);
        line(
            "resize filter",
            "Bicubic, sizes by calc_size_preserved_ratio (8..4096 tokens)".into(),
            "llama.cpp clip.cpp qwen3vl RESIZE_ALGO_BICUBIC, set_limit_image_tokens(8, 4096)",
        );
        line(
            "mlp activation",
            format!("{:?}", r.act.value),
            &r.act.source,
        );
        line(
            "deepstack after blocks",
            format!("{:?}", r.deepstack.value),
            &r.deepstack.source,
        );
        line(
            "rotary",
            format!(
                "2-D, base {ROPE_BASE}: rows on the first quarter of pairs, columns on the second"
            ),
            "llama.cpp qwen3vl.cpp ggml_rope_multi VISION",
        );
        line(
            "merge",
            "2 x 2 patches; post_ln, mm.0, GELU, mm.2".into(),
            "llama.cpp qwen3vl.cpp",
        );
        out
    }

    /// The forward: `pixels` CHW, 3 x height x width (multiples of 2 patches).
    pub(super) fn encode(
        &self,
        pool: &Pool,
        pixels: &[f32],
        width: usize,
        height: usize,
    ) -> Result<ImageEmbeddings> {
        let r = &self.rules;
        let (e, p) = (r.n_embd, r.patch_size.value);
        if !width.is_multiple_of(2 * p)
            || !height.is_multiple_of(2 * p)
            || width == 0
            || height == 0
        {
            return Err(ModelError::Input(format!(
                "image of {width} x {height}: the qwen3vl tower takes sides that are multiples of {}",
                2 * p
            )));
        }
        let (pw, ph) = (width / p, height / p);
        let n = pw * ph;
        if n / 4 > MAX_TOKENS {
            return Err(ModelError::Input(format!(
                "image of {width} x {height}: {} tokens, more than the {MAX_TOKENS} llama.cpp allows",
                n / 4
            )));
        }
        // The patch grid's (row, column) of each position in merge-block order.
        let order: Vec<(usize, usize)> = (0..ph / 2)
            .flat_map(|by| (0..pw / 2).map(move |bx| (by, bx)))
            .flat_map(|(by, bx)| {
                [(0, 0), (0, 1), (1, 0), (1, 1)].map(|(dy, dx)| (2 * by + dy, 2 * bx + dx))
            })
            .collect();
        let pp = 3 * p * p;
        let mut patches = vec![0f32; n * pp];
        for (row, &(py, px)) in patches.chunks_exact_mut(pp).zip(&order) {
            for c in 0..3 {
                for ky in 0..p {
                    let src = c * width * height + (py * p + ky) * width + px * p;
                    row[c * p * p + ky * p..c * p * p + (ky + 1) * p]
                        .copy_from_slice(&pixels[src..src + p]);
                }
            }
        }
        let mut x = vec![0f32; n * e];
        matmul(pool, Precision::Float, &self.patch, &patches, n, &mut x);
        let pos = self.positions(pw, ph);
        for (row, &(py, px)) in x.chunks_exact_mut(e).zip(&order) {
            let q = &pos[(py * pw + px) * e..(py * pw + px + 1) * e];
            for ((v, b), q) in row.iter_mut().zip(&self.patch_bias).zip(q) {
                *v = *v + b + q;
            }
        }
        // Rotary angles per position: pairs j < d/4 by row, the rest by column.
        let dh = e / r.n_head;
        let quarter = dh / 4;
        let inv: Vec<f32> = (0..quarter)
            .map(|j| ROPE_BASE.powf(-4.0 * j as f32 / dh as f32))
            .collect();
        let rope = |head: &mut [f32], (py, px): (usize, usize)| {
            for j in 0..dh / 2 {
                let (pos, k) = if j < quarter {
                    (py, j)
                } else {
                    (px, j - quarter)
                };
                let theta = pos as f32 * inv[k];
                let (s, c) = theta.sin_cos();
                let (a, b) = (head[j], head[j + dh / 2]);
                head[j] = a * c - b * s;
                head[j + dh / 2] = a * s + b * c;
            }
        };
        let shape = AttnShape {
            n_head: r.n_head,
            n_head_kv: r.n_head,
            head_dim_k: dh,
            head_dim_v: dh,
        };
        let scale = 1.0 / (dh as f32).sqrt();
        let eps = r.eps.value;
        let mut feats: Vec<Vec<f32>> = Vec::new();
        let mut h = vec![0f32; n * e];
        for (b, merger) in self.blocks.iter().zip(&self.deepstack) {
            h.copy_from_slice(&x);
            layer_norm_rows(pool, &mut h, e, &b.ln1, eps);
            let qkv = b.qkv.run(pool, &h, n);
            let (mut q, mut k, mut v) = (vec![0f32; n * e], vec![0f32; n * e], vec![0f32; n * e]);
            for (t, row) in qkv.chunks_exact(3 * e).enumerate() {
                q[t * e..(t + 1) * e].copy_from_slice(&row[..e]);
                k[t * e..(t + 1) * e].copy_from_slice(&row[e..2 * e]);
                v[t * e..(t + 1) * e].copy_from_slice(&row[2 * e..]);
            }
            for (t, &at) in order.iter().enumerate() {
                q[t * e..(t + 1) * e]
                    .chunks_exact_mut(dh)
                    .for_each(|hd| rope(hd, at));
                k[t * e..(t + 1) * e]
                    .chunks_exact_mut(dh)
                    .for_each(|hd| rope(hd, at));
            }
            let mut ctx = vec![0f32; n * e];
            attend_full(pool, shape, &q, &k, &v, n, scale, &mut ctx);
            let o = b.out.run(pool, &ctx, n);
            x.iter_mut().zip(&o).for_each(|(a, d)| *a += d);
            h.copy_from_slice(&x);
            layer_norm_rows(pool, &mut h, e, &b.ln2, eps);
            let mut u = b.up.run(pool, &h, n);
            r.act.value.apply(pool, &mut u);
            let dn = b.down.run(pool, &u, n);
            x.iter_mut().zip(&dn).for_each(|(a, d)| *a += d);
            if let Some(m) = merger {
                // Four patches side by side: the rows of x taken 4 at a time.
                let mut f = x.clone();
                layer_norm_rows(pool, &mut f, 4 * e, &m.norm, eps);
                let mut g = m.fc1.run(pool, &f, n / 4);
                Act::GeluTanh.apply(pool, &mut g);
                feats.push(m.fc2.run(pool, &g, n / 4));
            }
        }
        layer_norm_rows(pool, &mut x, e, &self.post_ln, eps);
        let mut g = self.mm0.run(pool, &x, n / 4);
        Act::GeluTanh.apply(pool, &mut g);
        let main = self.mm2.run(pool, &g, n / 4);
        let w = r.n_embd_merged;
        let n_tok = n / 4;
        let width_out = self.n_embd_out();
        let mut rows = Vec::with_capacity(n_tok * width_out);
        for t in 0..n_tok {
            rows.extend_from_slice(&main[t * w..(t + 1) * w]);
            for f in &feats {
                rows.extend_from_slice(&f[t * w..(t + 1) * w]);
            }
        }
        Ok(ImageEmbeddings {
            n_tokens: n_tok,
            n_embd: width_out,
            rows,
            bidirectional: false,
            // Tokens in merge-block order: block rows of pw / 2 blocks.
            grid: Some((pw / 2, ph / 2)),
        })
    }

    /// The learned position grid resized to `pw` x `ph` patches, rows in
    /// row-major patch order ([ph * pw][n_embd]).
    fn positions(&self, pw: usize, ph: usize) -> Vec<f32> {
        let e = self.rules.n_embd;
        let s = self.rules.pos_side.value;
        if pw == s && ph == s {
            return self.pos.clone();
        }
        // ggml_interpolate BILINEAR | ALIGN_CORNERS: source coordinate
        // i * (in - 1) / (out - 1), clamped, the four neighbours weighted.
        let scale = |out: usize| {
            if out > 1 && s > 1 {
                (out - 1) as f32 / (s - 1) as f32
            } else {
                out as f32 / s as f32
            }
        };
        let (sx, sy) = (scale(pw), scale(ph));
        let mut out = vec![0f32; pw * ph * e];
        for i1 in 0..ph {
            let y = i1 as f32 / sy;
            let y0 = (y.floor() as usize).min(s - 1);
            let y1 = (y0 + 1).min(s - 1);
            let dy = (y - y0 as f32).clamp(0.0, 1.0);
            for i0 in 0..pw {
                let xf = i0 as f32 / sx;
                let x0 = (xf.floor() as usize).min(s - 1);
                let x1 = (x0 + 1).min(s - 1);
                let dx = (xf - x0 as f32).clamp(0.0, 1.0);
                let at = |yy: usize, xx: usize, c: usize| self.pos[(yy * s + xx) * e + c];
                for c in 0..e {
                    let (a, b, cc, d) =
                        (at(y0, x0, c), at(y0, x1, c), at(y1, x0, c), at(y1, x1, c));
                    out[(i1 * pw + i0) * e + c] = a * (1.0 - dx) * (1.0 - dy)
                        + b * dx * (1.0 - dy)
                        + cc * (1.0 - dx) * dy
                        + d * dx * dy;
                }
            }
        }
        out
    }
}
