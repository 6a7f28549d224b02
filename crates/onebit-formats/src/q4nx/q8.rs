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

/// A form of Q8 tile: 32 rows x `cols` columns of int8 codes with one bf16
/// scale per row and 32-column group, stored `copies` times at the start
/// (scale of group g, row r at 2 (g * 32 + r) in each copy), then the codes,
/// row rh * 16 + j of column c at codes + rh * 16 cols + c * 16 + j, then
/// zero padding to `tile_bytes`. The Q8 tile and the MoE packs' wide Q8 tile
/// ([`super::Q8W_TILE`]) are the two forms; both are read and written by
/// the same code.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Q8Form {
    pub cols: usize,
    pub tile_bytes: usize,
    pub copies: usize,
    /// How errors name it ("Q8 tiles", "wide Q8 tiles").
    pub name: &'static str,
}

/// The Q8 tile: 32 x 128, scales twice, 5,120 bytes.
pub const Q8_TILE: Q8Form = Q8Form {
    cols: Q8_COLS,
    tile_bytes: TILE_BYTES,
    copies: 2,
    name: "Q8 tiles",
};

impl Q8Form {
    fn groups(&self) -> usize {
        self.cols / GROUP
    }
    /// Bytes of one copy of the scales.
    fn scales_bytes(&self) -> usize {
        2 * ROWS * self.groups()
    }
    /// Byte of the scale of group `g`, row `r` within a tile (first copy).
    pub fn scale_at(&self, g: usize, r: usize) -> usize {
        2 * (g * ROWS + r)
    }
    /// Byte of row `r` (0..32), column `c` (0..cols) within a tile.
    pub fn code_at(&self, r: usize, c: usize) -> usize {
        self.copies * self.scales_bytes() + (r / 16) * 16 * self.cols + c * 16 + r % 16
    }
    pub fn check_dims(&self, n: usize, k: usize) -> Result<(), CodecError> {
        if n == 0 || !n.is_multiple_of(ROWS) || k == 0 || !k.is_multiple_of(GROUP) {
            return Err(CodecError(format!(
                "{n} x {k}: {} need rows a multiple of {ROWS} and columns a multiple of {GROUP}",
                self.name
            )));
        }
        Ok(())
    }
    pub fn kp(&self, k: usize) -> usize {
        k.div_ceil(self.cols) * self.cols
    }
    pub fn tiles_per_row(&self, k: usize) -> usize {
        self.kp(k) / self.cols
    }
    pub fn bytes(&self, n: usize, k: usize) -> usize {
        n / ROWS * self.tiles_per_row(k) * self.tile_bytes
    }
    /// [N/32, Kp/cols, tile bytes].
    pub fn stored_shape(&self, n: usize, k: usize) -> Vec<u64> {
        vec![
            (n / ROWS) as u64,
            self.tiles_per_row(k) as u64,
            self.tile_bytes as u64,
        ]
    }
    pub fn check(&self, n: usize, k: usize, data: &[u8]) -> Result<(), CodecError> {
        if data.len() != self.bytes(n, k) {
            return Err(CodecError(format!(
                "{n} x {k} in {} needs {} bytes, found {}",
                self.name,
                self.bytes(n, k),
                data.len()
            )));
        }
        Ok(())
    }

    /// The tile and the (group, row) within it of Q8_0 block `bi` of an
    /// `n` x `k` matrix (blocks row by row).
    fn place(&self, k: usize, bi: usize) -> (usize, usize, usize) {
        let gpr = k / GROUP;
        let (row, gg) = (bi / gpr, bi % gpr);
        let (p, r) = (row / ROWS, row % ROWS);
        let (q, g) = (gg / self.groups(), gg % self.groups());
        ((p * self.tiles_per_row(k) + q) * self.tile_bytes, g, r)
    }

    /// Repacks ggml Q8_0 blocks (rows of k/32) into tiles of this form;
    /// scales round to bf16 (the count that rounded is returned).
    pub fn from_q8_0(
        &self,
        n: usize,
        k: usize,
        blocks: &[u8],
    ) -> Result<(Vec<u8>, usize), CodecError> {
        let bb = GgmlType::Q8_0.block_bytes();
        let want = n * (k / GROUP) * bb;
        if blocks.len() != want {
            return Err(CodecError(format!(
                "{n} x {k} Q8_0 needs {want} bytes, found {}",
                blocks.len()
            )));
        }
        let mut out = vec![0u8; self.bytes(n, k)];
        let mut rounded = 0;
        for (bi, blk) in blocks.chunks_exact(bb).enumerate() {
            let (at, g, r) = self.place(k, bi);
            let tile = &mut out[at..][..self.tile_bytes];
            let v = f16::from_le_bytes([blk[0], blk[1]]).to_f32();
            let d = bf16::from_f32(v);
            rounded += (d.to_f32() != v) as usize;
            for copy in 0..self.copies {
                let si = copy * self.scales_bytes() + self.scale_at(g, r);
                tile[si..si + 2].copy_from_slice(&d.to_le_bytes());
            }
            for x in 0..GROUP {
                tile[self.code_at(r, g * GROUP + x)] = blk[2 + x];
            }
        }
        Ok((out, rounded))
    }

    /// Tiles of this form back to ggml Q8_0 blocks (scales bf16 -> f16; the
    /// count of scales that rounded is returned, 0 for scales at or above
    /// 2^-17).
    pub fn to_q8_0(&self, n: usize, k: usize, data: &[u8]) -> Result<(Vec<u8>, usize), CodecError> {
        self.check(n, k, data)?;
        let bb = GgmlType::Q8_0.block_bytes();
        let mut out = vec![0u8; n * (k / GROUP) * bb];
        let mut inexact = 0;
        for (bi, blk) in out.chunks_exact_mut(bb).enumerate() {
            let (at, g, r) = self.place(k, bi);
            let tile = &data[at..][..self.tile_bytes];
            let d = bf16_at(tile, self.scale_at(g, r));
            let h = f16::from_f32(d);
            inexact += (h.to_f32() != d) as usize;
            blk[0..2].copy_from_slice(&h.to_le_bytes());
            for x in 0..GROUP {
                blk[2 + x] = tile[self.code_at(r, g * GROUP + x)];
            }
        }
        Ok((out, inexact))
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Q8Shape {
    pub n: usize,
    pub k: usize,
}

impl Q8Shape {
    pub fn new(n: usize, k: usize) -> Result<Q8Shape, CodecError> {
        Q8_TILE.check_dims(n, k)?;
        Ok(Q8Shape { n, k })
    }
    pub fn kp(&self) -> usize {
        Q8_TILE.kp(self.k)
    }
    pub fn tiles_per_row(&self) -> usize {
        Q8_TILE.tiles_per_row(self.k)
    }
    pub fn bytes(&self) -> usize {
        Q8_TILE.bytes(self.n, self.k)
    }
    pub fn stored_shape(&self) -> Vec<u64> {
        Q8_TILE.stored_shape(self.n, self.k)
    }
}

/// Repacks ggml Q8_0 blocks (rows of k/32) into Q8 tiles; scales round to bf16.
pub fn q8_from_q8_0(blocks: &[u8], shape: Q8Shape) -> Result<Vec<u8>, CodecError> {
    Ok(Q8_TILE.from_q8_0(shape.n, shape.k, blocks)?.0)
}

/// Q8 tiles back to ggml Q8_0 blocks (scales bf16 -> f16; the count of
/// scales that rounded is returned, 0 for scales at or above 2^-17).
pub fn q8_to_q8_0(data: &[u8], shape: Q8Shape) -> Result<(Vec<u8>, usize), CodecError> {
    Q8_TILE.to_q8_0(shape.n, shape.k, data)
}

/// Decodes row `row` of a Q8-tiled tensor.
pub fn q8_decode_row(
    data: &[u8],
    shape: Q8Shape,
    row: usize,
    out: &mut [f32],
) -> Result<(), CodecError> {
    Q8_TILE.check(shape.n, shape.k, data)?;
    if row >= shape.n || out.len() != shape.k {
        return Err(CodecError(format!("row {row} of {}", shape.n)));
    }
    let (p, r) = (row / ROWS, row % ROWS);
    let tpr = shape.tiles_per_row();
    for (c, o) in out.iter_mut().enumerate() {
        let tile = &data[(p * tpr + c / Q8_COLS) * TILE_BYTES..][..TILE_BYTES];
        let cc = c % Q8_COLS;
        let d = bf16_at(tile, Q8_TILE.scale_at(cc / GROUP, r));
        *o = d * tile[Q8_TILE.code_at(r, cc)] as i8 as f32;
    }
    Ok(())
}
