//! The Q8 tile: 32 x 128 blocks of int8 codes with one bf16 scale per row and
//! 32-column group. Bytes 0..256: 128 scales at g * 32 + r (4 groups);
//! 256..512: the same scales again; 512..4608: codes, row rh * 16 + j of
//! column c at 512 + rh * 2048 + c * 16 + j; zero padding to 5,120 bytes.
//! The tensor's shape is [N/32, Kp/128, 5120], K zero-padded to 128.
//! Value: d * q.

use half::{bf16, f16};

use super::{bf16_at, CodecError, GROUP, ROWS, TILE_BYTES};
use crate::dtype::GgmlType;

/// Columns per Q8 tile.
pub const Q8_COLS: usize = 128;
const Q8_GROUPS: usize = Q8_COLS / GROUP;
const Q8_CODES_AT: usize = 512;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Q8Shape {
    pub n: usize,
    pub k: usize,
}

impl Q8Shape {
    pub fn new(n: usize, k: usize) -> Result<Q8Shape, CodecError> {
        if n == 0 || !n.is_multiple_of(ROWS) || k == 0 || !k.is_multiple_of(GROUP) {
            return Err(CodecError(format!(
                "{n} x {k}: Q8 tiles need rows a multiple of {ROWS} and columns a multiple of {GROUP}"
            )));
        }
        Ok(Q8Shape { n, k })
    }
    pub fn kp(&self) -> usize {
        self.k.div_ceil(Q8_COLS) * Q8_COLS
    }
    pub fn tiles_per_row(&self) -> usize {
        self.kp() / Q8_COLS
    }
    pub fn bytes(&self) -> usize {
        self.n / ROWS * self.tiles_per_row() * TILE_BYTES
    }
    pub fn stored_shape(&self) -> Vec<u64> {
        vec![
            (self.n / ROWS) as u64,
            self.tiles_per_row() as u64,
            TILE_BYTES as u64,
        ]
    }
    fn check(&self, data: &[u8]) -> Result<(), CodecError> {
        if data.len() != self.bytes() {
            return Err(CodecError(format!(
                "{} x {} in Q8 tiles needs {} bytes, found {}",
                self.n,
                self.k,
                self.bytes(),
                data.len()
            )));
        }
        Ok(())
    }
}

#[inline]
fn q8_code_at(r: usize, c: usize) -> usize {
    Q8_CODES_AT + (r / 16) * 2048 + c * 16 + r % 16
}

/// Repacks ggml Q8_0 blocks (rows of k/32) into Q8 tiles; scales round to bf16.
pub fn q8_from_q8_0(blocks: &[u8], shape: Q8Shape) -> Result<Vec<u8>, CodecError> {
    let bb = GgmlType::Q8_0.block_bytes();
    let gpr = shape.k / GROUP;
    if blocks.len() != shape.n * gpr * bb {
        return Err(CodecError(format!(
            "{} x {} Q8_0 needs {} bytes, found {}",
            shape.n,
            shape.k,
            shape.n * gpr * bb,
            blocks.len()
        )));
    }
    let tpr = shape.tiles_per_row();
    let mut out = vec![0u8; shape.bytes()];
    for (bi, blk) in blocks.chunks_exact(bb).enumerate() {
        let (row, gg) = (bi / gpr, bi % gpr);
        let (p, r) = (row / ROWS, row % ROWS);
        let (q, g) = (gg / Q8_GROUPS, gg % Q8_GROUPS);
        let tile = &mut out[(p * tpr + q) * TILE_BYTES..][..TILE_BYTES];
        let d = bf16::from_f32(f16::from_le_bytes([blk[0], blk[1]]).to_f32()).to_le_bytes();
        let si = 2 * (g * ROWS + r);
        tile[si..si + 2].copy_from_slice(&d);
        tile[256 + si..256 + si + 2].copy_from_slice(&d);
        for x in 0..GROUP {
            tile[q8_code_at(r, g * GROUP + x)] = blk[2 + x];
        }
    }
    Ok(out)
}

/// Q8 tiles back to ggml Q8_0 blocks (scales bf16 -> f16; the count of
/// scales that rounded is returned, 0 for scales at or above 2^-17).
pub fn q8_to_q8_0(data: &[u8], shape: Q8Shape) -> Result<(Vec<u8>, usize), CodecError> {
    shape.check(data)?;
    let bb = GgmlType::Q8_0.block_bytes();
    let gpr = shape.k / GROUP;
    let tpr = shape.tiles_per_row();
    let mut out = vec![0u8; shape.n * gpr * bb];
    let mut inexact = 0;
    for (bi, blk) in out.chunks_exact_mut(bb).enumerate() {
        let (row, gg) = (bi / gpr, bi % gpr);
        let (p, r) = (row / ROWS, row % ROWS);
        let (q, g) = (gg / Q8_GROUPS, gg % Q8_GROUPS);
        let tile = &data[(p * tpr + q) * TILE_BYTES..][..TILE_BYTES];
        let d = bf16_at(tile, 2 * (g * ROWS + r));
        let h = f16::from_f32(d);
        if h.to_f32() != d {
            inexact += 1;
        }
        blk[0..2].copy_from_slice(&h.to_le_bytes());
        for x in 0..GROUP {
            blk[2 + x] = tile[q8_code_at(r, g * GROUP + x)];
        }
    }
    Ok((out, inexact))
}

/// Decodes row `row` of a Q8-tiled tensor.
pub fn q8_decode_row(
    data: &[u8],
    shape: Q8Shape,
    row: usize,
    out: &mut [f32],
) -> Result<(), CodecError> {
    shape.check(data)?;
    if row >= shape.n || out.len() != shape.k {
        return Err(CodecError(format!("row {row} of {}", shape.n)));
    }
    let (p, r) = (row / ROWS, row % ROWS);
    let tpr = shape.tiles_per_row();
    for (c, o) in out.iter_mut().enumerate() {
        let tile = &data[(p * tpr + c / Q8_COLS) * TILE_BYTES..][..TILE_BYTES];
        let cc = c % Q8_COLS;
        let d = bf16_at(tile, 2 * ((cc / GROUP) * ROWS + r));
        *o = d * tile[q8_code_at(r, cc)] as i8 as f32;
    }
    Ok(())
}
