//! Gemma 3's vision tower (mmproj `clip.projector_type` = `gemma3`), as
//! llama.cpp's `tools/mtmd/models/siglip.cpp` computes it. Invariant: every
//! rule below is a [`Sourced`] value of [`Rules`] (a `[semantics]` line),
//! read from the file's keys or stating the llama.cpp line it follows, and
//! every `v.*` / `mm.*` tensor of the file is one this encoder runs (a
//! tensor it does not know is refused by name, not ignored).
//!
//! - Patch embedding: a p x p convolution with stride p (`v.patch_embd`,
//!   ggml dims [p, p, 3, n_embd]) run as one matmul over each patch's
//!   pixels in (channel, row, column) order, plus its bias, plus the
//!   learned position embedding of the patch (`v.position_embd`, one row
//!   per patch in row-major patch order).
//! - Pre-LN blocks (LayerNorm with bias, eps `attention.layer_norm_epsilon`):
//!   x += attn_out(softmax(q k^T / sqrt(head_dim)) v) over every patch
//!   (no mask, no RoPE; `attention::attend_full`, every row seeing every
//!   patch, tiled like a matrix product), q/k/v/out with biases; x += ffn_down(act(ffn_up(x))),
//!   act GELU(tanh) when `clip.use_gelu`, else llama.cpp's default GELU-quick.
//! - `v.post_ln` (LayerNorm), then average pooling of the patch grid by
//!   `n_merge` x `n_merge` (4 unless `projector.scale_factor` says; llama.cpp's
//!   `ggml_pool_2d` AVG: kernel = stride = n_merge), tokens in row-major
//!   order of the pooled grid.
//! - The soft-embedding norm: RMSNorm (same eps) times `mm.soft_emb_norm`,
//!   then the projection `mm.input_projection` (ggml dims [n_text, n_embd]:
//!   used transposed) to the text model's width.
//! - In the text model, one image's rows attend to each other both ways
//!   (mtmd's `mtmd_decode_use_non_causal` is true for gemma3), and the
//!   template puts `<start_of_image>` before them and `<end_of_image>` after.
//!
//! Weights may be F32, F16 or BF16. F16 matrices stay F16 in memory and
//! run `onebit_kernels::f16mm` (widened in registers, f32 fused chains);
//! BF16 ones, and every vector, are widened to F32 at load, and F32 and
//! BF16 matrices run `matmul` at `Precision::Float`.

use onebit_formats::{blocks, ByteView, GgmlType};
use onebit_kernels::attention::{attend_full, AttnShape};
use onebit_kernels::ops::{gelu_tanh_par, rmsnorm_inplace};
use onebit_kernels::{matmul, F16Matrix, Pool, Precision, QMatrix};

use super::{ImageEmbeddings, ImageMarkers, Preprocess, ResizeFilter, TowerTensors};
use crate::error::{ModelError, Result};
use crate::families::decls::{keys, Decls, MAX_SIZE};
use crate::rows::par_rows;
use crate::semantics::Sourced;

/// The `clip.projector_type` this file runs.
pub const PROJECTOR: &str = "gemma3";

/// mtmd's `img_beg` / `img_end` for gemma3 (`mtmd.cpp`).
pub const MARKERS: ImageMarkers = ImageMarkers {
    begin: "<start_of_image>",
    end: "<end_of_image>",
};

/// The largest image side onebit accepts from a file's `image_size`
/// (SigLIP's is 896).
const MAX_IMAGE_SIZE: usize = 4096;

/// The most patches a side of the grid (SigLIP So400m at 896 px: 64).
const MAX_SIDE: usize = 128;

keys! {
    USE_GELU = "use_gelu", [];
    USE_SILU = "use_silu", [];
    N_EMBD = "vision.embedding_length", [];
    N_FF = "vision.feed_forward_length", [];
    N_LAYER = "vision.block_count", [];
    N_HEAD = "vision.attention.head_count", [];
    N_HEAD_KV = "vision.attention.head_count_kv", [];
    HEAD_DIM = "vision.attention.head_dim", [];
    EPS = "vision.attention.layer_norm_epsilon", [];
    IMAGE_SIZE = "vision.image_size", [];
    PATCH_SIZE = "vision.patch_size", [];
    IMAGE_MEAN = "vision.image_mean", [];
    IMAGE_STD = "vision.image_std", [];
    SCALE_FACTOR = "vision.projector.scale_factor", [];
}

/// Tensor names, as llama.cpp's `tools/mtmd/clip-impl.h` spells them.
pub mod names {
    pub const PATCH_EMBD: &str = "v.patch_embd.weight";
    pub const PATCH_BIAS: &str = "v.patch_embd.bias";
    pub const POS_EMBD: &str = "v.position_embd.weight";
    /// Optional (`TN_LN_PRE`); SigLIP has none.
    pub const PRE_LN: &str = "v.pre_ln";
    pub const POST_LN: &str = "v.post_ln";
    pub const SOFT_EMB_NORM: &str = "mm.soft_emb_norm.weight";
    pub const INPUT_PROJ: &str = "mm.input_projection.weight";
    /// Per block `v.blk.{i}.<part>.{weight,bias}`.
    pub const BLOCK: &str = "v.blk";
    pub const LN1: &str = "ln1";
    pub const LN2: &str = "ln2";
    pub const ATTN_Q: &str = "attn_q";
    pub const ATTN_K: &str = "attn_k";
    pub const ATTN_V: &str = "attn_v";
    pub const ATTN_OUT: &str = "attn_out";
    pub const FFN_UP: &str = "ffn_up";
    pub const FFN_DOWN: &str = "ffn_down";
    /// Every part of a block, each with a weight and a bias.
    pub const BLOCK_PARTS: [&str; 8] =
        [LN1, ATTN_Q, ATTN_K, ATTN_V, ATTN_OUT, LN2, FFN_UP, FFN_DOWN];
}

/// The MLP's activation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Act {
    /// ggml_gelu: `0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`.
    GeluTanh,
    /// ggml_gelu_quick: `x sigmoid(1.702 x)`.
    GeluQuick,
}

impl Act {
    /// The activation over every element.
    /// In place on `x`, over the pool (elementwise: the split changes no bit).
    pub fn apply(self, pool: &Pool, x: &mut [f32]) {
        match self {
            Act::GeluTanh => gelu_tanh_par(pool, x),
            Act::GeluQuick => {
                let n = x.len();
                par_rows(pool, n, [1], [x], |_, [xs]| {
                    xs.iter_mut().for_each(|v| *v /= 1.0 + (-1.702 * *v).exp())
                })
            }
        }
    }

    /// `clip.use_gelu` true: GELU(tanh); else llama.cpp's default
    /// GELU-quick; `clip.use_silu` refused (no SiLU ViT here).
    pub(super) fn read(d: &Decls, tower: &str) -> Result<Sourced<Act>> {
        if d.bool_opt(USE_SILU)?.unwrap_or(false) {
            return Err(d.err(
                USE_SILU,
                format!("is true: a SiLU MLP is not the {tower} tower onebit runs"),
            ));
        }
        Ok(if d.bool_opt(USE_GELU)?.unwrap_or(false) {
            Sourced::new(
                Act::GeluTanh,
                format!("{} = true (ggml_gelu)", d.src(USE_GELU)),
            )
        } else {
            Sourced::new(
                Act::GeluQuick,
                format!(
                    "llama.cpp clip.cpp default gelu_quick ({} not true)",
                    d.spelled(USE_GELU)
                ),
            )
        })
    }
}

/// Every rule of the tower, with its source.
#[derive(Clone, Debug)]
pub struct Rules {
    pub n_embd: usize,
    pub n_ff: usize,
    pub n_layer: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: Sourced<usize>,
    pub eps: Sourced<f32>,
    pub image_size: Sourced<usize>,
    pub patch_size: Sourced<usize>,
    pub mean: Sourced<[f32; 3]>,
    pub std: Sourced<[f32; 3]>,
    pub filter: Sourced<ResizeFilter>,
    pub act: Sourced<Act>,
    pub n_merge: Sourced<usize>,
    /// ffn_up / ffn_down stored under each other's names (old converters;
    /// llama.cpp swaps them back when `ffn_down` reads n_embd values).
    pub ffn_swapped: Sourced<bool>,
    pub pre_ln: Sourced<bool>,
    pub bidirectional: Sourced<bool>,
    /// The text model's width (`mm.input_projection` ne\[0\]).
    pub n_embd_out: usize,
}

/// A LayerNorm's weight and bias.
pub(super) struct Norm {
    pub w: Vec<f32>,
    pub b: Vec<f32>,
}

struct Block {
    ln1: Norm,
    q: Matrix,
    bq: Vec<f32>,
    k: Matrix,
    bk: Vec<f32>,
    v: Matrix,
    bv: Vec<f32>,
    out: Matrix,
    bout: Vec<f32>,
    ln2: Norm,
    up: Matrix,
    bup: Vec<f32>,
    down: Matrix,
    bdown: Vec<f32>,
}

/// The loaded tower.
pub struct Tower {
    pub rules: Rules,
    patch: Matrix,
    patch_bias: Vec<f32>,
    pos: Vec<f32>,
    pre_ln: Option<Norm>,
    blocks: Vec<Block>,
    post_ln: Norm,
    soft_norm: Vec<f32>,
    proj: Matrix,
}

/// Reads tensors of one file, widened to f32, shapes checked.
pub(super) struct Reader<'a> {
    pub g: &'a dyn TowerTensors,
    /// The encoder's name, for errors.
    pub tower: &'static str,
}

impl Reader<'_> {
    pub fn err(&self, name: &str, what: String) -> ModelError {
        ModelError::Tensor {
            path: self.g.path().to_path_buf(),
            tensor: name.into(),
            what,
        }
    }

    pub fn has(&self, name: &str) -> bool {
        self.g.tensor(name).is_some()
    }

    /// The tensor's values, its ggml dims exactly `dims`.
    pub fn floats(&self, name: &str, dims: &[usize]) -> Result<Vec<f32>> {
        let t = self.g.tensor(name).ok_or_else(|| {
            self.err(
                name,
                format!("is required by the {} vision tower but absent", self.tower),
            )
        })?;
        let want: Vec<u64> = dims.iter().map(|&d| d as u64).collect();
        if t.dims != want {
            return Err(self.err(
                name,
                format!("has shape {:?}, expected {want:?} (ggml order)", t.dims),
            ));
        }
        if !matches!(t.dtype, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16) {
            return Err(self.err(
                name,
                format!(
                    "is {}; the vision tower runs F32, F16 or BF16 weights",
                    t.dtype
                ),
            ));
        }
        let n: usize = dims.iter().product();
        let mut out = vec![0f32; n];
        blocks::dequantize(t.dtype, &t.bytes, &mut out)
            .map_err(|e| self.err(name, e.to_string()))?;
        Ok(out)
    }

    /// A matrix of `rows` outputs by `cols` inputs (ggml dims [cols, rows]):
    /// kept F16 when stored F16, else widened to F32.
    pub fn matrix(&self, name: &str, rows: usize, cols: usize) -> Result<Matrix> {
        if let Some(bits) = self.f16_bits(name, &[cols, rows])? {
            return Ok(Matrix::F16(F16Matrix::from_bits(rows, cols, &bits)));
        }
        Ok(Matrix::F32(f32_matrix(
            rows,
            cols,
            &self.floats(name, &[cols, rows])?,
        )))
    }

    /// The tensor's f16 bit patterns when it is stored F16 with ggml dims
    /// exactly `dims` (None when it is another type; the shape is checked
    /// by [`Reader::floats`] then).
    pub fn f16_bits(&self, name: &str, dims: &[usize]) -> Result<Option<Vec<u16>>> {
        let Some(t) = self.g.tensor(name) else {
            return Ok(None);
        };
        let want: Vec<u64> = dims.iter().map(|&d| d as u64).collect();
        if t.dtype != GgmlType::F16 || t.dims != want {
            return Ok(None);
        }
        let n: usize = dims.iter().product();
        if t.bytes.len() != 2 * n {
            return Err(self.err(
                name,
                format!("holds {} bytes, expected {}", t.bytes.len(), 2 * n),
            ));
        }
        Ok(Some(
            t.bytes
                .chunks_exact(2)
                .map(|b| u16::from_le_bytes([b[0], b[1]]))
                .collect(),
        ))
    }

    pub fn norm(&self, prefix: &str, n: usize) -> Result<Norm> {
        Ok(Norm {
            w: self.floats(&format!("{prefix}.weight"), &[n])?,
            b: self.floats(&format!("{prefix}.bias"), &[n])?,
        })
    }
}

/// A weight matrix of the tower: F16 as stored, or F32.
pub(super) enum Matrix {
    F32(QMatrix),
    F16(F16Matrix),
}

impl Matrix {
    pub fn rows(&self) -> usize {
        match self {
            Matrix::F32(w) => w.rows,
            Matrix::F16(w) => w.rows(),
        }
    }

    /// `out` = this matrix times the `n` rows of `x`.
    pub fn run(&self, pool: &Pool, x: &[f32], n: usize, out: &mut [f32]) {
        match self {
            Matrix::F32(w) => matmul(pool, Precision::Float, w, x, n, out),
            Matrix::F16(w) => w.matmul(pool, x, n, out),
        }
    }
}

/// An F32 [`QMatrix`] holding `data` ([rows][cols]).
pub(super) fn f32_matrix(rows: usize, cols: usize, data: &[f32]) -> QMatrix {
    let bytes: Vec<u8> = data.iter().flat_map(|v| v.to_le_bytes()).collect();
    QMatrix::new(GgmlType::F32, rows, cols, ByteView::from_vec(bytes))
        .expect("rows x cols f32 values make an F32 matrix")
}

/// `w` ([rows][cols]) transposed into [cols][rows].
fn transpose<T: Copy + Default>(w: &[T], rows: usize, cols: usize) -> Vec<T> {
    let mut t = vec![T::default(); w.len()];
    for i in 0..rows {
        for j in 0..cols {
            t[j * rows + i] = w[i * cols + j];
        }
    }
    t
}

fn blk(i: usize, part: &str, what: &str) -> String {
    format!("{}.{i}.{part}.{what}", names::BLOCK)
}

/// A size key: present, positive, at most `max`.
pub(super) fn size(d: &Decls, k: crate::families::decls::Key, max: usize) -> Result<usize> {
    let v = d.positive(k)?;
    if v > max {
        return Err(d.err(k, format!("{v} is larger than the {max} onebit accepts")));
    }
    Ok(v)
}

/// Three numbers of an array key.
pub(super) fn triple(d: &Decls, k: crate::families::decls::Key) -> Result<Sourced<[f32; 3]>> {
    let v = d.get(k).ok_or_else(|| d.err(k, "is required but absent"))?;
    let a = v
        .as_array()
        .filter(|a| a.len() >= 3)
        .ok_or_else(|| d.err(k, format!("expected an array of 3 numbers, found {v}")))?;
    let mut out = [0f32; 3];
    for (o, x) in out.iter_mut().zip(a) {
        *o = x
            .as_f64()
            .ok_or_else(|| d.err(k, format!("expected numbers, found {x}")))? as f32;
    }
    Ok(Sourced::new(out, d.src(k)))
}

impl Tower {
    /// Reads the rules and the weights; `proj_src` names the projector key.
    pub(super) fn load(g: &dyn TowerTensors, d: &Decls, proj_src: String) -> Result<Tower> {
        let n_embd = size(d, N_EMBD, MAX_SIZE)?;
        let n_ff = size(d, N_FF, MAX_SIZE)?;
        let n_layer = size(d, N_LAYER, 1024)?;
        let n_head = size(d, N_HEAD, MAX_SIZE)?;
        let n_head_kv = match d.usize_opt(N_HEAD_KV)? {
            None => n_head,
            Some(v) if v > 0 && n_head % v == 0 => v,
            Some(v) => {
                return Err(d.err(
                    N_HEAD_KV,
                    format!("{v} does not divide the {n_head} query heads"),
                ))
            }
        };
        let head_dim = match d.usize_opt(HEAD_DIM)? {
            Some(v) if v > 0 => Sourced::new(size(d, HEAD_DIM, MAX_SIZE)?, d.src(HEAD_DIM)),
            _ if n_embd % n_head == 0 => Sourced::new(
                n_embd / n_head,
                format!(
                    "{} / {} (no head dim declared)",
                    d.spelled(N_EMBD),
                    d.spelled(N_HEAD)
                ),
            ),
            _ => {
                return Err(d.err(
                    HEAD_DIM,
                    format!("absent, and {n_head} heads do not divide {n_embd}"),
                ))
            }
        };
        let eps = d
            .f64_opt(EPS)?
            .ok_or_else(|| d.err(EPS, "is required but absent"))?;
        if !(eps.is_finite() && eps >= 0.0) {
            return Err(d.err(EPS, format!("{eps} is not a non-negative number")));
        }
        let eps = Sourced::new(eps as f32, d.src(EPS));
        let image_size = Sourced::new(size(d, IMAGE_SIZE, MAX_IMAGE_SIZE)?, d.src(IMAGE_SIZE));
        let patch_size = Sourced::new(size(d, PATCH_SIZE, MAX_IMAGE_SIZE)?, d.src(PATCH_SIZE));
        if image_size.value % patch_size.value != 0 {
            return Err(d.err(
                IMAGE_SIZE,
                format!(
                    "{} is not a multiple of the patch size {}",
                    image_size.value, patch_size.value
                ),
            ));
        }
        let n_merge = match d.usize_opt(SCALE_FACTOR)? {
            Some(v) => Sourced::new(v, d.src(SCALE_FACTOR)),
            None => Sourced::new(
                4,
                format!(
                    "llama.cpp clip.cpp gemma3 default n_merge (no {})",
                    d.spelled(SCALE_FACTOR)
                ),
            ),
        };
        let side = image_size.value / patch_size.value;
        if side > MAX_SIDE {
            return Err(d.err(
                IMAGE_SIZE,
                format!(
                    "{} / patch {} = {side} patches a side, more than the {MAX_SIDE} onebit accepts (attention over every patch is quadratic)",
                    image_size.value, patch_size.value
                ),
            ));
        }
        if n_merge.value == 0 || side % n_merge.value != 0 {
            return Err(d.err(
                SCALE_FACTOR,
                format!(
                    "pooling by {} does not tile the {side} x {side} patch grid",
                    n_merge.value
                ),
            ));
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
        // Every tensor of the file must be one this tower runs.
        let mut known: Vec<String> = vec![
            names::PATCH_EMBD.into(),
            names::PATCH_BIAS.into(),
            names::POS_EMBD.into(),
            format!("{}.weight", names::PRE_LN),
            format!("{}.bias", names::PRE_LN),
            format!("{}.weight", names::POST_LN),
            format!("{}.bias", names::POST_LN),
            names::SOFT_EMB_NORM.into(),
            names::INPUT_PROJ.into(),
        ];
        for i in 0..n_layer {
            for part in names::BLOCK_PARTS {
                known.push(blk(i, part, "weight"));
                known.push(blk(i, part, "bias"));
            }
        }
        if let Some(t) = g.names().into_iter().find(|t| !known.contains(t)) {
            return Err(r.err(
                &t,
                format!(
                    "is not part of the gemma3 vision tower onebit runs ({n_layer} blocks: {})",
                    names::BLOCK_PARTS.join(", ")
                ),
            ));
        }

        let proj_dims = g
            .tensor(names::INPUT_PROJ)
            .map(|t| t.dims.clone())
            .ok_or_else(|| {
                r.err(
                    names::INPUT_PROJ,
                    "is required by the gemma3 vision tower but absent".into(),
                )
            })?;
        let n_embd_out = match proj_dims[..] {
            [out, inp] if inp == n_embd as u64 && out > 0 && out <= MAX_SIZE as u64 => out as usize,
            _ => {
                return Err(r.err(
                    names::INPUT_PROJ,
                    format!(
                        "has shape {proj_dims:?}, expected [n_text_embd, {n_embd}] (ggml order)"
                    ),
                ))
            }
        };
        let p = patch_size.value;
        let n_patches = side * side;
        // ggml [p, p, 3, n_embd]: each output channel's kernel is one row of
        // 3 p p values in (channel, row, column) order.
        let patch = Matrix::F32(f32_matrix(
            n_embd,
            3 * p * p,
            &r.floats(names::PATCH_EMBD, &[p, p, 3, n_embd])?,
        ));
        let patch_bias = r.floats(names::PATCH_BIAS, &[n_embd])?;
        let pos = r.floats(names::POS_EMBD, &[n_embd, n_patches])?;
        let has_pre = r.has(&format!("{}.weight", names::PRE_LN));
        let pre_ln = has_pre.then(|| r.norm(names::PRE_LN, n_embd)).transpose()?;
        let pre_src = format!(
            "tensor {}.weight {}",
            names::PRE_LN,
            if has_pre { "present" } else { "absent" }
        );
        // llama.cpp's legacy fix: ffn_down reading n_embd values means the
        // two were stored under each other's names.
        let down0 = g
            .tensor(&blk(0, names::FFN_DOWN, "weight"))
            .map(|t| t.dims.clone());
        let swapped = n_ff != n_embd
            && down0.as_deref().and_then(|d| d.first().copied()) == Some(n_embd as u64);
        let ffn_swapped = Sourced::new(
            swapped,
            format!(
                "{} ne[0] {} n_embd (llama.cpp clip.cpp is_ffn_swapped)",
                blk(0, names::FFN_DOWN, "weight"),
                if swapped { "==" } else { "!=" }
            ),
        );
        let (up_name, down_name) = if swapped {
            (names::FFN_DOWN, names::FFN_UP)
        } else {
            (names::FFN_UP, names::FFN_DOWN)
        };
        let (q_w, kv_w) = (n_head * head_dim.value, n_head_kv * head_dim.value);
        let mut blocks = Vec::with_capacity(n_layer);
        for i in 0..n_layer {
            let m = |part: &str, rows, cols| r.matrix(&blk(i, part, "weight"), rows, cols);
            let b = |part: &str, n| r.floats(&blk(i, part, "bias"), &[n]);
            blocks.push(Block {
                ln1: r.norm(&format!("{}.{i}.{}", names::BLOCK, names::LN1), n_embd)?,
                q: m(names::ATTN_Q, q_w, n_embd)?,
                bq: b(names::ATTN_Q, q_w)?,
                k: m(names::ATTN_K, kv_w, n_embd)?,
                bk: b(names::ATTN_K, kv_w)?,
                v: m(names::ATTN_V, kv_w, n_embd)?,
                bv: b(names::ATTN_V, kv_w)?,
                out: m(names::ATTN_OUT, n_embd, q_w)?,
                bout: b(names::ATTN_OUT, n_embd)?,
                ln2: r.norm(&format!("{}.{i}.{}", names::BLOCK, names::LN2), n_embd)?,
                up: m(up_name, n_ff, n_embd)?,
                bup: b(up_name, n_ff)?,
                down: m(down_name, n_embd, n_ff)?,
                bdown: b(down_name, n_embd)?,
            });
        }
        let post_ln = r.norm(names::POST_LN, n_embd)?;
        let soft_norm = r.floats(names::SOFT_EMB_NORM, &[n_embd])?;
        // Stored [n_text][n_embd] as ggml [n_text, n_embd]: out[j] = sum_i
        // w[i * n_text + j] x[i]; transposed here into rows of n_embd.
        let proj = match r.f16_bits(names::INPUT_PROJ, &[n_embd_out, n_embd])? {
            Some(w) => Matrix::F16(F16Matrix::from_bits(
                n_embd_out,
                n_embd,
                &transpose(&w, n_embd, n_embd_out),
            )),
            None => {
                let w = r.floats(names::INPUT_PROJ, &[n_embd_out, n_embd])?;
                Matrix::F32(f32_matrix(
                    n_embd_out,
                    n_embd,
                    &transpose(&w, n_embd, n_embd_out),
                ))
            }
        };
        let rules = Rules {
            n_embd,
            n_ff,
            n_layer,
            n_head,
            n_head_kv,
            head_dim,
            eps,
            image_size,
            patch_size,
            mean,
            std,
            filter: Sourced::new(
                ResizeFilter::Bilinear,
                format!("llama.cpp clip.cpp: {proj_src} gemma3 uses RESIZE_ALGO_BILINEAR"),
            ),
            act,
            n_merge,
            ffn_swapped,
            pre_ln: Sourced::new(has_pre, pre_src),
            bidirectional: Sourced::new(
                true,
                format!(
                    "llama.cpp mtmd.cpp mtmd_decode_use_non_causal: true for {proj_src} gemma3"
                ),
            ),
            n_embd_out,
        };
        Ok(Tower {
            rules,
            patch,
            patch_bias,
            pos,
            pre_ln,
            blocks,
            post_ln,
            soft_norm,
            proj,
        })
    }

    pub fn preprocess(&self) -> Preprocess {
        let s = self.rules.image_size.value as u32;
        Preprocess {
            width: s,
            height: s,
            mean: self.rules.mean.value,
            std: self.rules.std.value,
            filter: self.rules.filter.value,
            projector: PROJECTOR,
        }
    }

    /// Patches per side of the grid.
    fn side(&self) -> usize {
        self.rules.image_size.value / self.rules.patch_size.value
    }

    pub fn n_tokens(&self) -> usize {
        let s = self.side() / self.rules.n_merge.value;
        s * s
    }

    pub fn n_embd_out(&self) -> usize {
        self.rules.n_embd_out
    }

    pub fn lines(&self) -> Vec<String> {
        let r = &self.rules;
        let mut out = vec![format!(
            "vision tower {PROJECTOR}: {} blocks, n_embd {}, heads {}/{} (q/kv), n_ff {}, out {} x {} rows",
            r.n_layer,
            r.n_embd,
            r.n_head,
            r.n_head_kv,
            r.n_ff,
            self.n_tokens(),
            r.n_embd_out
        )];
        let mut line = |name: &str, value: String, source: &str| {
            out.push(format!("vision {name}: {value}  <- {source}"))
        };
        line("head dim", r.head_dim.value.to_string(), &r.head_dim.source);
        line("norm eps", format!("{:e}", r.eps.value), &r.eps.source);
        line(
            "image size",
            r.image_size.value.to_string(),
            &r.image_size.source,
        );
        line(
            "patch size",
            r.patch_size.value.to_string(),
            &r.patch_size.source,
        );
        line("image mean", format!("{:?}", r.mean.value), &r.mean.source);
        line("image std", format!("{:?}", r.std.value), &r.std.source);
        line(
            "resize filter",
            format!("{:?}", r.filter.value),
            &r.filter.source,
        );
        line(
            "mlp activation",
            format!("{:?}", r.act.value),
            &r.act.source,
        );
        line("pre-LN", r.pre_ln.value.to_string(), &r.pre_ln.source);
        line(
            "ffn up/down swapped",
            r.ffn_swapped.value.to_string(),
            &r.ffn_swapped.source,
        );
        line(
            "pooling",
            format!("average {0} x {0}", r.n_merge.value),
            &r.n_merge.source,
        );
        line(
            "soft-embedding norm",
            format!("RMSNorm x {}", names::SOFT_EMB_NORM),
            "llama.cpp siglip.cpp (gemma3)",
        );
        line(
            "image attention in the text model",
            if r.bidirectional.value {
                "both ways within one image"
            } else {
                "causal"
            }
            .into(),
            &r.bidirectional.source,
        );
        line(
            "image markers",
            format!("{} ... {}", MARKERS.begin, MARKERS.end),
            "llama.cpp mtmd.cpp (gemma3 img_beg / img_end)",
        );
        out
    }

    /// The forward: `pixels` CHW, checked by the caller.
    pub(super) fn encode(&self, pool: &Pool, pixels: &[f32]) -> ImageEmbeddings {
        let r = &self.rules;
        let (e, p, side) = (r.n_embd, r.patch_size.value, self.side());
        let size = r.image_size.value;
        let n = side * side;
        let eps = r.eps.value;
        let mm = |w: &Matrix, x: &[f32], rows: usize| {
            let mut out = vec![0f32; rows * w.rows()];
            w.run(pool, x, rows, &mut out);
            out
        };
        // Each patch's pixels in the kernel's (channel, row, column) order.
        let pp = 3 * p * p;
        let mut patches = vec![0f32; n * pp];
        for (t, row) in patches.chunks_exact_mut(pp).enumerate() {
            let (py, px) = (t / side, t % side);
            for c in 0..3 {
                for ky in 0..p {
                    let src = c * size * size + (py * p + ky) * size + px * p;
                    row[c * p * p + ky * p..c * p * p + (ky + 1) * p]
                        .copy_from_slice(&pixels[src..src + p]);
                }
            }
        }
        let mut x = mm(&self.patch, &patches, n);
        for (t, row) in x.chunks_exact_mut(e).enumerate() {
            let pos = &self.pos[t * e..(t + 1) * e];
            for ((v, b), q) in row.iter_mut().zip(&self.patch_bias).zip(pos) {
                *v = *v + b + q;
            }
        }
        if let Some(ln) = &self.pre_ln {
            layer_norm_rows(pool, &mut x, e, ln, eps);
        }
        let dh = r.head_dim.value;
        let shape = AttnShape {
            n_head: r.n_head,
            n_head_kv: r.n_head_kv,
            head_dim_k: dh,
            head_dim_v: dh,
        };
        let scale = 1.0 / (dh as f32).sqrt();
        let mut h = vec![0f32; n * e];
        for b in &self.blocks {
            h.copy_from_slice(&x);
            layer_norm_rows(pool, &mut h, e, &b.ln1, eps);
            let mut q = mm(&b.q, &h, n);
            let mut k = mm(&b.k, &h, n);
            let mut v = mm(&b.v, &h, n);
            add_bias_par(pool, &mut q, &b.bq);
            add_bias_par(pool, &mut k, &b.bk);
            add_bias_par(pool, &mut v, &b.bv);
            let mut ctx = vec![0f32; n * r.n_head * dh];
            attend_full(pool, shape, &q, &k, &v, n, scale, &mut ctx);
            let mut o = mm(&b.out, &ctx, n);
            add_bias_par(pool, &mut o, &b.bout);
            add_rows(pool, &mut x, &mut o, e);
            h.copy_from_slice(&x);
            layer_norm_rows(pool, &mut h, e, &b.ln2, eps);
            let mut u = mm(&b.up, &h, n);
            add_bias_par(pool, &mut u, &b.bup);
            r.act.value.apply(pool, &mut u);
            let mut dn = mm(&b.down, &u, n);
            add_bias_par(pool, &mut dn, &b.bdown);
            add_rows(pool, &mut x, &mut dn, e);
        }
        layer_norm_rows(pool, &mut x, e, &self.post_ln, eps);

        // Average pooling, kernel = stride = k, over the row-major grid.
        let k = r.n_merge.value;
        let out_side = side / k;
        let n_out = out_side * out_side;
        let mut pooled = vec![0f32; n_out * e];
        let inv = (k * k) as f32;
        for (t, row) in pooled.chunks_exact_mut(e).enumerate() {
            let (oy, ox) = (t / out_side, t % out_side);
            for (c, o) in row.iter_mut().enumerate() {
                let mut s = 0f32;
                for ky in 0..k {
                    for kx in 0..k {
                        s += x[((oy * k + ky) * side + ox * k + kx) * e + c];
                    }
                }
                *o = s / inv;
            }
        }
        for row in pooled.chunks_exact_mut(e) {
            rmsnorm_inplace(row, &self.soft_norm, eps);
        }
        let rows = mm(&self.proj, &pooled, n_out);
        ImageEmbeddings {
            n_tokens: n_out,
            n_embd: r.n_embd_out,
            rows,
            bidirectional: r.bidirectional.value,
            grid: None,
        }
    }
}

/// [`add_bias`] over the pool, by rows (elementwise: the same bits).
pub(super) fn add_bias_par(pool: &Pool, x: &mut [f32], b: &[f32]) {
    let n = x.len() / b.len();
    par_rows(pool, n, [b.len()], [x], |_, [xs]| add_bias(xs, b));
}

/// `x += d` ([n][e] both) over the pool, by rows (the same bits).
pub(super) fn add_rows(pool: &Pool, x: &mut [f32], d: &mut [f32], e: usize) {
    let n = x.len() / e;
    par_rows(pool, n, [e, e], [x, d], |_, [xs, ds]| {
        xs.iter_mut().zip(ds.iter()).for_each(|(a, d)| *a += *d)
    });
}

pub(super) fn add_bias(x: &mut [f32], b: &[f32]) {
    for row in x.chunks_exact_mut(b.len()) {
        row.iter_mut().zip(b).for_each(|(v, c)| *v += c);
    }
}

/// LayerNorm of every row in place: `(x - mean) / sqrt(var + eps) * w + b`
/// (ggml_norm then the weight and bias), sums in f64.
pub(super) fn layer_norm_rows(pool: &Pool, x: &mut [f32], e: usize, ln: &Norm, eps: f32) {
    let n = x.len() / e;
    par_rows(pool, n, [e], [x], |_, [xs]| {
        for row in xs.chunks_exact_mut(e) {
            let mean = (row.iter().map(|&v| v as f64).sum::<f64>() / e as f64) as f32;
            let var = row
                .iter()
                .map(|&v| {
                    let d = (v - mean) as f64;
                    d * d
                })
                .sum::<f64>()
                / e as f64;
            let scale = (1.0 / (var + eps as f64).sqrt()) as f32;
            for ((v, w), b) in row.iter_mut().zip(&ln.w).zip(&ln.b) {
                *v = (*v - mean) * scale * w + b;
            }
        }
    });
}
