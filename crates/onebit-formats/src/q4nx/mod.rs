//! FastFlowLM's tiled weight encodings (`model.q4nx`), described in
//! `docs/q4nx-format.md`: the Q4 matrix in four tile forms (the 5,120-byte
//! full tile, the 2,560-byte half tile of the gpt-oss pack, the 1,280-byte
//! quarter tile, the 4,608-byte symmetric chunk), each in its asymmetric
//! (Q4_1) or symmetric (Q4_0) kind, the Q8 tile (32 x 128 in 5,120 bytes),
//! the wide Q8 tile of the MoE packs (32 x 256 in 8,704 bytes, `q8w`) and
//! the gpt-oss pack's MXFP4 tile (32 x 128 in 2,560 bytes, `mxfp4`).
//!
//! The forms ([`TileForm`]), each a block of `rows` x `cols` weights in
//! quantization groups of 32 columns, blocks in row-major order:
//!
//! | form | block | scales d (bf16) | minimums m (bf16) | code byte of (row r, column c) |
//! |---|---|---|---|---|
//! | full, 5,120 B | 32 x 256 | 0..512, at g*32 + r | 512..1024, at g*32 + r | 1024 + (r/16)*2048 + c*8 + (r%16)/2 |
//! | half, 2,560 B | 32 x 128 | 0..256, at g*32 + r | 256..512, at g*32 + r | 512 + (r/16)*1024 + c*8 + (r%16)/2 |
//! | quarter, 1,280 B | 16 x 128 | 0..128, at g*16 + r | 128..256, at g*16 + r | 256 + c*8 + r/2 |
//! | chunk, 4,608 B | 32 x 256 | 0..512, at g*32 + r | none (symmetric only) | 512 + c*16 + r/2 |
//!
//! (g = the group's index within the block.) An even row sits in the low
//! nibble, an odd row in the high nibble. The quarter and chunk forms are
//! written by FastFlowLM's own packs (Gemma3-270M, K = 640 off the 256
//! grid; Hy-MT2's projections); the declared row width of the tensor
//! (5,120 / 1,280 / 4,608 bytes) names the form. The half tile is the full
//! tile's layout on FastFlowLM's `col_block_size` 128, the converter's
//! setting for gpt-oss only (`configs/gpt-oss.json`): only that family's
//! layout reads it (a dense pack's 2,560-byte rows are refused).
//!
//! Nothing in the container names a Q4 tensor's kind. The rule: a tile is
//! symmetric on its own evidence only when all its minimums are zero (+0 or
//! -0) and some scale is below zero; a tile with zero minimums and no
//! negative scale decides nothing; a tensor is one kind (any symmetric tile
//! makes it symmetric and its undecided tiles follow); a tensor holding both
//! kinds is refused. The chunk has no minimums and is symmetric by its size.
//! Every tensor-level reader here (whole tensor, one row, repacking into
//! ggml blocks) takes the kind from the whole tensor; only [`decode_tile`]
//! on a lone tile uses that tile's evidence.

mod mxfp4;
mod q8;
mod q8w;
mod quant;

pub use mxfp4::*;
pub use q8::*;
pub use q8w::*;
pub use quant::*;

use half::{bf16, f16};

use crate::dtype::GgmlType;

/// Bytes of one full Q4 tile (and one Q8 tile).
pub const TILE_BYTES: usize = 5120;
/// Bytes of the half tile (32 x 128 weights, gpt-oss packs).
pub const HALF_TILE_BYTES: usize = 2560;
/// Bytes of FastFlowLM's quarter tile (16 x 128 weights).
pub const QUARTER_TILE_BYTES: usize = 1280;
/// Bytes of FastFlowLM's symmetric chunk (32 x 256 weights, no minimums).
pub const SYM_CHUNK_BYTES: usize = 4608;
/// Rows per full tile.
pub const ROWS: usize = 32;
/// Columns per full Q4 tile.
pub const COLS: usize = 256;
/// Columns per quantization group.
pub const GROUP: usize = 32;

/// Why a tiled tensor cannot be read or written.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct CodecError(pub String);

type Result<T> = std::result::Result<T, CodecError>;

/// The three byte layouts of a Q4 block (see the module table).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum TileForm {
    /// 32 x 256 weights in 5,120 bytes (FastFlowLM's converter).
    Full,
    /// 32 x 128 weights in 2,560 bytes (the converter with
    /// `col_block_size` 128: its gpt-oss pack).
    Half,
    /// 16 x 128 weights in 1,280 bytes.
    Quarter,
    /// 32 x 256 weights in 4,608 bytes, symmetric only.
    Chunk4608,
}

impl TileForm {
    pub const ALL: [TileForm; 4] = [
        TileForm::Full,
        TileForm::Half,
        TileForm::Quarter,
        TileForm::Chunk4608,
    ];
    /// The forms a pack of a dense family may hold, named by row width; the
    /// half tile is read only where the gpt-oss layout places it.
    pub const DENSE: [TileForm; 3] = [TileForm::Full, TileForm::Quarter, TileForm::Chunk4608];

    /// The form of [`TileForm::DENSE`] a tensor's declared row width names.
    pub fn from_row_bytes(bytes: usize) -> Option<TileForm> {
        TileForm::DENSE.into_iter().find(|f| f.bytes() == bytes)
    }
    pub fn bytes(self) -> usize {
        match self {
            TileForm::Full => TILE_BYTES,
            TileForm::Half => HALF_TILE_BYTES,
            TileForm::Quarter => QUARTER_TILE_BYTES,
            TileForm::Chunk4608 => SYM_CHUNK_BYTES,
        }
    }
    pub fn rows(self) -> usize {
        match self {
            TileForm::Quarter => 16,
            _ => ROWS,
        }
    }
    pub fn cols(self) -> usize {
        match self {
            TileForm::Quarter | TileForm::Half => 128,
            _ => COLS,
        }
    }
    fn groups(self) -> usize {
        self.cols() / GROUP
    }
    /// Where the minimums start; the chunk has none.
    fn mins_at(self) -> Option<usize> {
        match self {
            TileForm::Chunk4608 => None,
            _ => Some(2 * self.rows() * self.groups()),
        }
    }
    fn codes_at(self) -> usize {
        2 * self.rows() * self.groups() * if self.mins_at().is_some() { 2 } else { 1 }
    }
    /// Byte of the scale (and, past `mins_at`, the minimum) of group `g`, row `r`.
    #[inline]
    fn param_at(self, g: usize, r: usize) -> usize {
        2 * (g * self.rows() + r)
    }
    /// The byte holding the nibble of (row r, column c), and whether it is
    /// the high nibble.
    #[inline]
    fn code_pos(self, r: usize, c: usize) -> (usize, bool) {
        let at = match self {
            TileForm::Full => (r / 16) * 2048 + c * 8 + (r % 16) / 2,
            TileForm::Half => (r / 16) * 1024 + c * 8 + (r % 16) / 2,
            TileForm::Quarter => c * 8 + r / 2,
            TileForm::Chunk4608 => c * 16 + r / 2,
        };
        (self.codes_at() + at, r % 2 == 1)
    }
    /// The kind every tile of this form has, where the form fixes it.
    pub fn fixed_kind(self) -> Option<Q4Kind> {
        match self {
            TileForm::Chunk4608 => Some(Q4Kind::Symmetric),
            _ => None,
        }
    }
    /// A phrase for messages and census lines.
    pub fn name(self) -> &'static str {
        match self {
            TileForm::Full => "full tile (32 x 256, 5,120 bytes)",
            TileForm::Half => "half tile (32 x 128, 2,560 bytes)",
            TileForm::Quarter => "quarter tile (16 x 128, 1,280 bytes)",
            TileForm::Chunk4608 => "symmetric chunk (32 x 256, 4,608 bytes)",
        }
    }
}

/// What one tile says about its kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TileKind {
    Asymmetric,
    Symmetric,
    /// Every minimum zero, no scale below zero: either kind decodes it.
    Undecided,
}

/// The kind of a Q4 tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Q4Kind {
    /// From Q4_1: w = d * q + m, q the unsigned nibble.
    Asymmetric,
    /// From Q4_0: w = d * q, q the nibble as two's complement, m = 0.
    Symmetric,
}

impl Q4Kind {
    pub fn name(self) -> &'static str {
        match self {
            Q4Kind::Asymmetric => "asymmetric",
            Q4Kind::Symmetric => "symmetric",
        }
    }
    /// The ggml block type the kernels run for this kind.
    pub fn ggml(self) -> GgmlType {
        match self {
            Q4Kind::Asymmetric => GgmlType::Q4_1,
            Q4Kind::Symmetric => GgmlType::Q4_0,
        }
    }
}

/// Geometry of a Q4 matrix: `n` rows (outputs) by `k` columns (inputs), in
/// tiles of `form`; stored with K zero-padded to the form's block width.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Q4Shape {
    pub n: usize,
    pub k: usize,
    pub form: TileForm,
}

impl Q4Shape {
    /// A matrix in full tiles.
    pub fn new(n: usize, k: usize) -> Result<Q4Shape> {
        Q4Shape::of(TileForm::Full, n, k)
    }
    /// A matrix in tiles of `form`.
    pub fn of(form: TileForm, n: usize, k: usize) -> Result<Q4Shape> {
        let rows = form.rows();
        if n == 0 || !n.is_multiple_of(rows) {
            return Err(CodecError(format!(
                "{n} rows is not a positive multiple of the {}'s {rows} rows",
                form.name()
            )));
        }
        if k == 0 || !k.is_multiple_of(GROUP) {
            return Err(CodecError(format!(
                "{k} columns is not a positive multiple of the {GROUP}-column quantization group"
            )));
        }
        Ok(Q4Shape { n, k, form })
    }
    /// K padded to the tile grid.
    pub fn kp(&self) -> usize {
        self.k.div_ceil(self.form.cols()) * self.form.cols()
    }
    pub fn tiles_per_row(&self) -> usize {
        self.kp() / self.form.cols()
    }
    pub fn n_tiles(&self) -> usize {
        self.n / self.form.rows() * self.tiles_per_row()
    }
    pub fn bytes(&self) -> usize {
        self.n_tiles() * self.form.bytes()
    }
    /// The I8 tensor's shape in the safetensors header: [tiles, 5120] for
    /// the full tile (FastFlowLM's converter), [N/rows, Kp/cols, bytes] for
    /// the quarter tile and the chunk (FastFlowLM's own packs).
    pub fn stored_shape(&self) -> Vec<u64> {
        match self.form {
            TileForm::Full => vec![self.n_tiles() as u64, TILE_BYTES as u64],
            f => vec![
                (self.n / f.rows()) as u64,
                self.tiles_per_row() as u64,
                f.bytes() as u64,
            ],
        }
    }
    fn tile<'a>(&self, data: &'a [u8], row: usize, col: usize) -> &'a [u8] {
        let f = self.form;
        let t = (row / f.rows()) * self.tiles_per_row() + col / f.cols();
        &data[t * f.bytes()..][..f.bytes()]
    }
    fn check(&self, data: &[u8]) -> Result<()> {
        if data.len() != self.bytes() {
            return Err(CodecError(format!(
                "{} x {} (K padded to {}) needs {} tiles of the {} ({} bytes), found {} bytes",
                self.n,
                self.k,
                self.kp(),
                self.n_tiles(),
                self.form.name(),
                self.bytes(),
                data.len()
            )));
        }
        Ok(())
    }
}

pub(crate) fn bf16_at(b: &[u8], at: usize) -> f32 {
    bf16::from_bits(u16::from_le_bytes([b[at], b[at + 1]])).to_f32()
}

#[inline]
fn nibble(form: TileForm, tile: &[u8], r: usize, c: usize) -> u8 {
    let (at, hi) = form.code_pos(r, c);
    if hi {
        tile[at] >> 4
    } else {
        tile[at] & 0xF
    }
}

/// What one full tile says about its kind.
pub fn tile_kind(tile: &[u8]) -> TileKind {
    tile_kind_of(TileForm::Full, tile)
}

/// What one tile of `form` says about its kind (a chunk is symmetric).
pub fn tile_kind_of(form: TileForm, tile: &[u8]) -> TileKind {
    debug_assert_eq!(tile.len(), form.bytes());
    let Some(mins_at) = form.mins_at() else {
        return TileKind::Symmetric;
    };
    let mut negative = false;
    for i in 0..form.rows() * form.groups() {
        let m = u16::from_le_bytes([tile[mins_at + 2 * i], tile[mins_at + 2 * i + 1]]);
        if m & 0x7FFF != 0 {
            return TileKind::Asymmetric;
        }
        let d = u16::from_le_bytes([tile[2 * i], tile[2 * i + 1]]);
        // Below zero: the sign bit on a non-zero value (-0 is not below zero).
        negative |= d & 0x8000 != 0 && d & 0x7FFF != 0;
    }
    if negative {
        TileKind::Symmetric
    } else {
        TileKind::Undecided
    }
}

/// The kind of a whole tensor of full tiles; see [`tensor_kind_of`].
pub fn tensor_kind(data: &[u8]) -> Result<Q4Kind> {
    tensor_kind_of(TileForm::Full, data)
}

/// The kind of a whole tensor (its bytes: whole tiles of `form`). A tensor
/// with no tile deciding is asymmetric (how a lone undecided tile reads); one
/// with both kinds is refused, naming a tile of each.
pub fn tensor_kind_of(form: TileForm, data: &[u8]) -> Result<Q4Kind> {
    let tb = form.bytes();
    if !data.len().is_multiple_of(tb) {
        return Err(CodecError(format!(
            "{} bytes is not a whole number of {tb}-byte tiles",
            data.len()
        )));
    }
    let (mut sym, mut asym) = (None, None);
    for (i, t) in data.chunks_exact(tb).enumerate() {
        match tile_kind_of(form, t) {
            TileKind::Symmetric => sym = sym.or(Some(i)),
            TileKind::Asymmetric => asym = asym.or(Some(i)),
            TileKind::Undecided => {}
        }
        if let (Some(s), Some(a)) = (sym, asym) {
            return Err(CodecError(format!(
                "holds both tile kinds (tile {s} symmetric: zero minimums and a negative scale; tile {a} asymmetric: non-zero minimums); a tensor is one kind"
            )));
        }
    }
    Ok(if sym.is_some() {
        Q4Kind::Symmetric
    } else {
        Q4Kind::Asymmetric
    })
}

#[inline]
fn code_value(nib: u8, kind: Q4Kind) -> f32 {
    match kind {
        Q4Kind::Asymmetric => nib as f32,
        Q4Kind::Symmetric => (((nib << 4) as i8) >> 4) as f32,
    }
}

/// The value of (row r, column c) of one tile read as `kind`.
#[inline]
fn value(form: TileForm, tile: &[u8], kind: Q4Kind, r: usize, c: usize) -> f32 {
    let at = form.param_at(c / GROUP, r);
    let m = form.mins_at().map_or(0.0, |m| bf16_at(tile, m + at));
    bf16_at(tile, at) * code_value(nibble(form, tile, r, c), kind) + m
}

/// Decodes one full tile as `kind` into `out` (\[32\]\[256\], row-major).
pub fn decode_tile_as(tile: &[u8], kind: Q4Kind, out: &mut [f32]) {
    decode_tile_of(TileForm::Full, tile, kind, out)
}

/// Decodes one tile of `form` as `kind` into `out` (\[rows\]\[cols\], row-major;
/// a tile's pad columns read as 0, since their scales and minimums are 0).
pub fn decode_tile_of(form: TileForm, tile: &[u8], kind: Q4Kind, out: &mut [f32]) {
    assert_eq!(tile.len(), form.bytes());
    assert_eq!(out.len(), form.rows() * form.cols());
    for (i, o) in out.iter_mut().enumerate() {
        *o = value(form, tile, kind, i / form.cols(), i % form.cols());
    }
}

/// Decodes a lone full tile on its own evidence (an undecided tile reads as
/// asymmetric). Inside a tensor use the tensor readers, which take the kind
/// from every tile.
pub fn decode_tile(tile: &[u8], out: &mut [f32]) {
    let kind = match tile_kind(tile) {
        TileKind::Symmetric => Q4Kind::Symmetric,
        _ => Q4Kind::Asymmetric,
    };
    decode_tile_as(tile, kind, out)
}

/// Decodes row `row` (k values, the padding dropped) of a tensor as `kind`.
pub fn decode_row_as(data: &[u8], shape: Q4Shape, kind: Q4Kind, row: usize, out: &mut [f32]) {
    assert!(row < shape.n && out.len() == shape.k);
    let f = shape.form;
    let r = row % f.rows();
    for (c, o) in out.iter_mut().enumerate() {
        *o = value(f, shape.tile(data, row, c), kind, r, c % f.cols());
    }
}

/// Decodes one row, the kind taken from the whole tensor (this reads the
/// header of every tile; decide once with [`tensor_kind_of`] and call
/// [`decode_row_as`] to read many rows).
pub fn decode_row(data: &[u8], shape: Q4Shape, row: usize, out: &mut [f32]) -> Result<()> {
    shape.check(data)?;
    if row >= shape.n || out.len() != shape.k {
        return Err(CodecError(format!(
            "row {row} of {} (output of {} values, {} given)",
            shape.n,
            shape.k,
            out.len()
        )));
    }
    let kind = tensor_kind_of(shape.form, data)?;
    decode_row_as(data, shape, kind, row, out);
    Ok(())
}

/// Decodes the whole tensor (\[n\]\[k\], padding dropped), the kind from every tile.
pub fn decode_tensor(data: &[u8], shape: Q4Shape) -> Result<(Q4Kind, Vec<f32>)> {
    shape.check(data)?;
    let kind = tensor_kind_of(shape.form, data)?;
    let mut out = vec![0f32; shape.n * shape.k];
    for (row, o) in out.chunks_exact_mut(shape.k).enumerate() {
        decode_row_as(data, shape, kind, row, o);
    }
    Ok((kind, out))
}

/// The tensor repacked for the kernels: ggml Q4_1 blocks (asymmetric) or
/// Q4_0 blocks (symmetric), rows of k/32 blocks, the padding dropped. The
/// kind comes from every tile. BF16 scales and minimums become f16, exactly
/// for every value at or above 2^-17 in magnitude (below, f16's subnormals
/// round); the count of values that rounded is returned.
pub fn to_ggml(data: &[u8], shape: Q4Shape) -> Result<(GgmlType, Vec<u8>, usize)> {
    shape.check(data)?;
    let kind = tensor_kind_of(shape.form, data)?;
    let (bytes, inexact) = to_ggml_as(data, shape, kind);
    Ok((kind.ggml(), bytes, inexact))
}

fn to_f16_counting(x: f32, inexact: &mut usize) -> [u8; 2] {
    let h = f16::from_f32(x);
    if h.to_f32() != x {
        *inexact += 1;
    }
    h.to_le_bytes()
}

/// [`to_ggml`] with the kind already decided for the whole tensor.
pub fn to_ggml_as(data: &[u8], shape: Q4Shape, kind: Q4Kind) -> (Vec<u8>, usize) {
    let f = shape.form;
    let dt = kind.ggml();
    let bb = dt.block_bytes();
    let gpr = shape.k / GROUP;
    let mut out = vec![0u8; shape.n * gpr * bb];
    let mut inexact = 0usize;
    for row in 0..shape.n {
        let r = row % f.rows();
        for gg in 0..gpr {
            let tile = shape.tile(data, row, gg * GROUP);
            let g = gg % f.groups();
            let at = f.param_at(g, r);
            let blk = &mut out[(row * gpr + gg) * bb..][..bb];
            blk[0..2].copy_from_slice(&to_f16_counting(bf16_at(tile, at), &mut inexact));
            let qs = match kind {
                Q4Kind::Asymmetric => {
                    let m = f.mins_at().map_or(0.0, |m| bf16_at(tile, m + at));
                    blk[2..4].copy_from_slice(&to_f16_counting(m, &mut inexact));
                    &mut blk[4..20]
                }
                Q4Kind::Symmetric => &mut blk[2..18],
            };
            // ggml: byte j holds element j (low nibble) and j + 16 (high).
            let flip = if kind == Q4Kind::Symmetric { 8 } else { 0 };
            for (j, q) in qs.iter_mut().enumerate() {
                let lo = nibble(f, tile, r, g * GROUP + j) ^ flip;
                let hi = nibble(f, tile, r, g * GROUP + j + 16) ^ flip;
                *q = lo | (hi << 4);
            }
        }
    }
    (out, inexact)
}

/// A Q4 matrix before tiling: per (row, group) scale and minimum as bf16
/// bits, and per element the nibble as the tile stores it (asymmetric: the
/// code 0..15; symmetric: the two's complement int4).
pub struct Q4Groups {
    pub shape: Q4Shape,
    pub kind: Q4Kind,
    /// \[n\]\[k/32\]
    pub d: Vec<u16>,
    /// \[n\]\[k/32\]; all zero for the symmetric kind.
    pub m: Vec<u16>,
    /// \[n\]\[k\]
    pub nib: Vec<u8>,
}

impl TileForm {
    /// Whether tiles of this form can hold weights of `kind`.
    pub fn holds(self, kind: Q4Kind) -> bool {
        self.fixed_kind().is_none_or(|k| k == kind)
    }
}

/// Lays the groups out as tiles of `g.shape.form` (K zero-padded: the pad
/// columns' scales, minimums and codes are 0). Panics if the form cannot
/// hold the kind ([`TileForm::holds`]); callers check first.
pub fn encode(g: &Q4Groups) -> Vec<u8> {
    let s = g.shape;
    let f = s.form;
    assert!(
        f.holds(g.kind),
        "a {} cannot hold {} weights",
        f.name(),
        g.kind.name()
    );
    let gpr = s.k / GROUP;
    let mut out = vec![0u8; s.bytes()];
    for row in 0..s.n {
        let r = row % f.rows();
        for gg in 0..gpr {
            let t = (row / f.rows()) * s.tiles_per_row() + gg / f.groups();
            let tile = &mut out[t * f.bytes()..][..f.bytes()];
            let gl = gg % f.groups();
            let at = f.param_at(gl, r);
            tile[at..at + 2].copy_from_slice(&g.d[row * gpr + gg].to_le_bytes());
            if let Some(m) = f.mins_at() {
                tile[m + at..m + at + 2].copy_from_slice(&g.m[row * gpr + gg].to_le_bytes());
            }
            for x in 0..GROUP {
                let v = g.nib[row * s.k + gg * GROUP + x] & 0xF;
                let (at, hi) = f.code_pos(r, gl * GROUP + x);
                tile[at] |= if hi { v << 4 } else { v };
            }
        }
    }
    out
}

fn kind_other(k: Q4Kind) -> Q4Kind {
    match k {
        Q4Kind::Asymmetric => Q4Kind::Symmetric,
        Q4Kind::Symmetric => Q4Kind::Asymmetric,
    }
}

/// Repacks ggml Q4_0 / Q4_1 blocks (rows of k/32 blocks) into tiles exactly:
/// the codes as they are, scales and minimums rounded to bf16.
pub fn from_ggml(dtype: GgmlType, blocks: &[u8], shape: Q4Shape) -> Result<Vec<u8>> {
    let kind = match dtype {
        GgmlType::Q4_0 => Q4Kind::Symmetric,
        GgmlType::Q4_1 => Q4Kind::Asymmetric,
        other => {
            return Err(CodecError(format!(
                "{other} blocks cannot be repacked into Q4 tiles (Q4_0 and Q4_1 can)"
            )))
        }
    };
    if !shape.form.holds(kind) {
        return Err(CodecError(format!(
            "{dtype} blocks are {} and a {} holds only {} weights",
            kind.name(),
            shape.form.name(),
            kind_other(kind).name()
        )));
    }
    let bb = dtype.block_bytes();
    let gpr = shape.k / GROUP;
    if blocks.len() != shape.n * gpr * bb {
        return Err(CodecError(format!(
            "{} x {} {dtype} needs {} bytes, found {}",
            shape.n,
            shape.k,
            shape.n * gpr * bb,
            blocks.len()
        )));
    }
    let mut g = Q4Groups {
        shape,
        kind,
        d: vec![0; shape.n * gpr],
        m: vec![0; shape.n * gpr],
        nib: vec![0; shape.n * shape.k],
    };
    let bf = |b: &[u8]| bf16::from_f32(f16::from_le_bytes([b[0], b[1]]).to_f32()).to_bits();
    for (bi, blk) in blocks.chunks_exact(bb).enumerate() {
        let (row, gg) = (bi / gpr, bi % gpr);
        g.d[bi] = bf(&blk[0..2]);
        let (qs, flip) = match kind {
            Q4Kind::Asymmetric => {
                g.m[bi] = bf(&blk[2..4]);
                (&blk[4..20], 0)
            }
            Q4Kind::Symmetric => (&blk[2..18], 8),
        };
        let base = row * shape.k + gg * GROUP;
        for (j, &q) in qs.iter().enumerate() {
            g.nib[base + j] = (q & 0xF) ^ flip;
            g.nib[base + j + 16] = (q >> 4) ^ flip;
        }
    }
    Ok(encode(&g))
}

#[cfg(test)]
mod form_tests;
#[cfg(test)]
mod tests;
