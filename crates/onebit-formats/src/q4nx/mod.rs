//! FastFlowLM's tiled weight encodings (`model.q4nx`), described in
//! `docs/q4nx-format.md`: the 5,120-byte Q4 tile in its asymmetric (Q4_1) and
//! symmetric (Q4_0) kinds, and the Q8 tile.
//!
//! Nothing in the container names a Q4 tensor's kind. The rule: a tile is
//! symmetric on its own evidence only when all 256 minimums are zero (+0 or
//! -0) and some scale is below zero; a tile with zero minimums and no negative
//! scale decides nothing; a tensor is one kind (any symmetric tile makes it
//! symmetric and its undecided tiles follow); a tensor holding both kinds is
//! refused. Every tensor-level reader here (whole tensor, one row, repacking
//! into ggml blocks) takes the kind from the whole tensor; only
//! [`decode_tile`] on a lone tile uses that tile's evidence.
//!
//! Not implemented (refused by name where a pack uses them): the 1,280-byte
//! quarter tile (16 x 128 blocks, FastFlowLM's own packs where K is off the
//! 256 grid) and the 4,608-byte symmetric chunk.

mod q8;
mod quant;

pub use q8::*;
pub use quant::*;

use half::{bf16, f16};

use crate::dtype::GgmlType;

/// Bytes of one Q4 (and one Q8) tile.
pub const TILE_BYTES: usize = 5120;
/// FastFlowLM's quarter tile (not read by onebit).
pub const QUARTER_TILE_BYTES: usize = 1280;
/// FastFlowLM's symmetric chunk (not read by onebit).
pub const SYM_CHUNK_BYTES: usize = 4608;
/// Rows per tile.
pub const ROWS: usize = 32;
/// Columns per Q4 tile.
pub const COLS: usize = 256;
/// Columns per quantization group.
pub const GROUP: usize = 32;
const GROUPS: usize = COLS / GROUP;
const MINS_AT: usize = 512;
const CODES_AT: usize = 1024;

/// Why a tiled tensor cannot be read or written.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct CodecError(pub String);

type Result<T> = std::result::Result<T, CodecError>;

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

/// Geometry of a Q4 matrix: `n` rows (outputs) by `k` columns (inputs);
/// stored with K zero-padded to a multiple of 256.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Q4Shape {
    pub n: usize,
    pub k: usize,
}

impl Q4Shape {
    pub fn new(n: usize, k: usize) -> Result<Q4Shape> {
        if n == 0 || !n.is_multiple_of(ROWS) {
            return Err(CodecError(format!(
                "{n} rows is not a positive multiple of the tile's {ROWS} rows"
            )));
        }
        if k == 0 || !k.is_multiple_of(GROUP) {
            return Err(CodecError(format!(
                "{k} columns is not a positive multiple of the {GROUP}-column quantization group"
            )));
        }
        Ok(Q4Shape { n, k })
    }
    /// K padded to the tile grid.
    pub fn kp(&self) -> usize {
        self.k.div_ceil(COLS) * COLS
    }
    pub fn tiles_per_row(&self) -> usize {
        self.kp() / COLS
    }
    pub fn n_tiles(&self) -> usize {
        self.n / ROWS * self.tiles_per_row()
    }
    pub fn bytes(&self) -> usize {
        self.n_tiles() * TILE_BYTES
    }
    /// The I8 tensor's shape in the safetensors header.
    pub fn stored_shape(&self) -> Vec<u64> {
        vec![self.n_tiles() as u64, TILE_BYTES as u64]
    }
    fn check(&self, data: &[u8]) -> Result<()> {
        if data.len() != self.bytes() {
            return Err(CodecError(format!(
                "{} x {} (K padded to {}) needs {} tiles ({} bytes), found {} bytes",
                self.n,
                self.k,
                self.kp(),
                self.n_tiles(),
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

/// The tile's byte holding the nibble of (row r, column c), and whether it is
/// the high nibble.
#[inline]
fn code_pos(r: usize, c: usize) -> (usize, bool) {
    let h = r / 16;
    let j = (r % 16) / 2;
    (CODES_AT + h * 2048 + c * 8 + j, r % 2 == 1)
}

#[inline]
fn nibble(tile: &[u8], r: usize, c: usize) -> u8 {
    let (at, hi) = code_pos(r, c);
    if hi {
        tile[at] >> 4
    } else {
        tile[at] & 0xF
    }
}

/// What one tile says about its kind.
pub fn tile_kind(tile: &[u8]) -> TileKind {
    debug_assert_eq!(tile.len(), TILE_BYTES);
    let mut negative = false;
    for i in 0..ROWS * GROUPS {
        let m = u16::from_le_bytes([tile[MINS_AT + 2 * i], tile[MINS_AT + 2 * i + 1]]);
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

/// The kind of a whole tensor (its bytes: whole tiles). A tensor with no
/// tile deciding is asymmetric (how a lone undecided tile reads); one with
/// both kinds is refused, naming a tile of each.
pub fn tensor_kind(data: &[u8]) -> Result<Q4Kind> {
    if !data.len().is_multiple_of(TILE_BYTES) {
        return Err(CodecError(format!(
            "{} bytes is not a whole number of {TILE_BYTES}-byte tiles",
            data.len()
        )));
    }
    let (mut sym, mut asym) = (None, None);
    for (i, t) in data.chunks_exact(TILE_BYTES).enumerate() {
        match tile_kind(t) {
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

/// Decodes one tile as `kind` into `out` ([32][256], row-major).
pub fn decode_tile_as(tile: &[u8], kind: Q4Kind, out: &mut [f32]) {
    assert_eq!(tile.len(), TILE_BYTES);
    assert_eq!(out.len(), ROWS * COLS);
    for r in 0..ROWS {
        for c in 0..COLS {
            let gi = (c / GROUP) * ROWS + r;
            let d = bf16_at(tile, 2 * gi);
            let m = bf16_at(tile, MINS_AT + 2 * gi);
            out[r * COLS + c] = d * code_value(nibble(tile, r, c), kind) + m;
        }
    }
}

/// Decodes a lone tile on its own evidence (an undecided tile reads as
/// asymmetric). Inside a tensor use the tensor readers, which take the kind
/// from every tile.
pub fn decode_tile(tile: &[u8], out: &mut [f32]) {
    let kind = match tile_kind(tile) {
        TileKind::Symmetric => Q4Kind::Symmetric,
        _ => Q4Kind::Asymmetric,
    };
    decode_tile_as(tile, kind, out)
}

/// Decodes row `row` (k values) of a tensor as `kind`.
pub fn decode_row_as(data: &[u8], shape: Q4Shape, kind: Q4Kind, row: usize, out: &mut [f32]) {
    assert!(row < shape.n && out.len() == shape.k);
    let (p, r) = (row / ROWS, row % ROWS);
    let tpr = shape.tiles_per_row();
    for (c, o) in out.iter_mut().enumerate() {
        let tile = &data[(p * tpr + c / COLS) * TILE_BYTES..][..TILE_BYTES];
        let cc = c % COLS;
        let gi = (cc / GROUP) * ROWS + r;
        *o = bf16_at(tile, 2 * gi) * code_value(nibble(tile, r, cc), kind)
            + bf16_at(tile, MINS_AT + 2 * gi);
    }
}

/// Decodes one row, the kind taken from the whole tensor (this reads the
/// header of every tile; decide once with [`tensor_kind`] and call
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
    let kind = tensor_kind(data)?;
    decode_row_as(data, shape, kind, row, out);
    Ok(())
}

/// Decodes the whole tensor ([n][k], padding dropped), the kind from every tile.
pub fn decode_tensor(data: &[u8], shape: Q4Shape) -> Result<(Q4Kind, Vec<f32>)> {
    shape.check(data)?;
    let kind = tensor_kind(data)?;
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
    let kind = tensor_kind(data)?;
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
    let dt = kind.ggml();
    let bb = dt.block_bytes();
    let gpr = shape.k / GROUP;
    let tpr = shape.tiles_per_row();
    let mut out = vec![0u8; shape.n * gpr * bb];
    let mut inexact = 0usize;
    for row in 0..shape.n {
        let (p, r) = (row / ROWS, row % ROWS);
        for gg in 0..gpr {
            let tile = &data[(p * tpr + gg / GROUPS) * TILE_BYTES..][..TILE_BYTES];
            let g = gg % GROUPS;
            let gi = g * ROWS + r;
            let blk = &mut out[(row * gpr + gg) * bb..][..bb];
            blk[0..2].copy_from_slice(&to_f16_counting(bf16_at(tile, 2 * gi), &mut inexact));
            let qs = match kind {
                Q4Kind::Asymmetric => {
                    let m = bf16_at(tile, MINS_AT + 2 * gi);
                    blk[2..4].copy_from_slice(&to_f16_counting(m, &mut inexact));
                    &mut blk[4..20]
                }
                Q4Kind::Symmetric => &mut blk[2..18],
            };
            // ggml: byte j holds element j (low nibble) and j + 16 (high).
            let flip = if kind == Q4Kind::Symmetric { 8 } else { 0 };
            for (j, q) in qs.iter_mut().enumerate() {
                let lo = nibble(tile, r, g * GROUP + j) ^ flip;
                let hi = nibble(tile, r, g * GROUP + j + 16) ^ flip;
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
    /// [n][k/32]
    pub d: Vec<u16>,
    /// [n][k/32]; all zero for the symmetric kind.
    pub m: Vec<u16>,
    /// [n][k]
    pub nib: Vec<u8>,
}

/// Lays the groups out as tiles (K zero-padded).
pub fn encode(g: &Q4Groups) -> Vec<u8> {
    let s = g.shape;
    let gpr = s.k / GROUP;
    let tpr = s.tiles_per_row();
    let mut out = vec![0u8; s.bytes()];
    for (t, tile) in out.chunks_exact_mut(TILE_BYTES).enumerate() {
        let (p, q) = (t / tpr, t % tpr);
        for r in 0..ROWS {
            let row = p * ROWS + r;
            for gl in 0..GROUPS {
                let gg = q * GROUPS + gl;
                if gg >= gpr {
                    break;
                }
                let gi = gl * ROWS + r;
                tile[2 * gi..2 * gi + 2].copy_from_slice(&g.d[row * gpr + gg].to_le_bytes());
                tile[MINS_AT + 2 * gi..MINS_AT + 2 * gi + 2]
                    .copy_from_slice(&g.m[row * gpr + gg].to_le_bytes());
                for x in 0..GROUP {
                    let c = gl * GROUP + x;
                    let v = g.nib[row * s.k + q * COLS + c] & 0xF;
                    let (at, hi) = code_pos(r, c);
                    tile[at] |= if hi { v << 4 } else { v };
                }
            }
        }
    }
    out
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
mod tests;
