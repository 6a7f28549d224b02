//! The MXFP4 tile of FastFlowLM's gpt-oss pack (the converter's
//! `_pack_MXFP4_q4nx`, `q4nx/model_converter.py`, with `configs/gpt-oss.json`'s
//! 32-row, 128-column blocks): 32 rows x 128 columns of MXFP4 weights in
//! 2,560 bytes, the size of a Q4_1 half tile, blocks in row-major order, K
//! zero-padded to a multiple of 128.
//!
//! | bytes | content |
//! |---|---|
//! | 0..128 | the E8M0 exponent byte of (row r, group g of 32 columns) at g*32 + r |
//! | 128..512 | no weights: zero (the gpt-oss layout keeps a row block's 32 bf16 biases in bytes 128..192 of its first tile) |
//! | 512..2560 | the E2M1 code of (row r, column c) in byte 512 + (r/16)*1024 + c*8 + (r%16)/2, even rows in the low nibble |
//!
//! Invariant: tiles and ggml MXFP4 blocks (byte 0 the exponent, byte 1 + j
//! holding element j low and j + 16 high) convert into each other exactly:
//! exponent bytes and 4-bit codes are moved, none is computed, and the
//! bytes 128..512 are never read as weights.

use super::{CodecError, GROUP};

type Result<T> = std::result::Result<T, CodecError>;

/// Bytes of one MXFP4 tile.
pub const MX_TILE_BYTES: usize = 2560;
/// Rows and columns of one MXFP4 tile.
pub const MX_ROWS: usize = 32;
pub const MX_COLS: usize = 128;
/// Where the exponents end and the codes start.
pub const MX_EXPONENTS_END: usize = MX_ROWS * MX_COLS / GROUP;
pub const MX_CODES_AT: usize = 512;
/// Bytes of one ggml MXFP4 block (32 weights).
const BLOCK: usize = 17;

/// Geometry of an MXFP4 matrix in tiles: `n` rows by `k` columns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MxShape {
    pub n: usize,
    pub k: usize,
}

impl MxShape {
    pub fn new(n: usize, k: usize) -> Result<MxShape> {
        if n == 0 || !n.is_multiple_of(MX_ROWS) {
            return Err(CodecError(format!(
                "{n} rows is not a positive multiple of the MXFP4 tile's {MX_ROWS} rows"
            )));
        }
        if k == 0 || !k.is_multiple_of(GROUP) {
            return Err(CodecError(format!(
                "{k} columns is not a positive multiple of MXFP4's {GROUP}-weight block"
            )));
        }
        Ok(MxShape { n, k })
    }
    pub fn tiles_per_row(&self) -> usize {
        self.k.div_ceil(MX_COLS)
    }
    pub fn n_tiles(&self) -> usize {
        self.n / MX_ROWS * self.tiles_per_row()
    }
    pub fn bytes(&self) -> usize {
        self.n_tiles() * MX_TILE_BYTES
    }
    /// Bytes of the same matrix as ggml MXFP4 blocks.
    pub fn ggml_bytes(&self) -> usize {
        self.n * self.k / GROUP * BLOCK
    }
}

/// The byte of (row r, column c)'s code within a tile, and whether it is the
/// high nibble.
#[inline]
fn code_pos(r: usize, c: usize) -> (usize, bool) {
    (
        MX_CODES_AT + (r / 16) * 1024 + c * 8 + (r % 16) / 2,
        r % 2 == 1,
    )
}

/// Where ggml block `bi` (row-major, rows of k/32 blocks) sits: (tile
/// index, group within the tile, row within the tile).
#[inline]
fn place(s: &MxShape, bi: usize) -> (usize, usize, usize) {
    let (row, gg) = (bi / (s.k / GROUP), bi % (s.k / GROUP));
    let per_tile = MX_COLS / GROUP;
    (
        (row / MX_ROWS) * s.tiles_per_row() + gg / per_tile,
        gg % per_tile,
        row % MX_ROWS,
    )
}

/// ggml MXFP4 blocks (rows of k/32 blocks) laid out as tiles, exactly; the
/// pad columns and bytes 128..512 are zero.
pub fn mx_from_mxfp4(blocks: &[u8], s: MxShape) -> Result<Vec<u8>> {
    if blocks.len() != s.ggml_bytes() {
        return Err(CodecError(format!(
            "{} x {} MXFP4 needs {} bytes, found {}",
            s.n,
            s.k,
            s.ggml_bytes(),
            blocks.len()
        )));
    }
    let mut out = vec![0u8; s.bytes()];
    for (bi, blk) in blocks.chunks_exact(BLOCK).enumerate() {
        let (t, g, r) = place(&s, bi);
        let tile = &mut out[t * MX_TILE_BYTES..][..MX_TILE_BYTES];
        tile[g * MX_ROWS + r] = blk[0];
        for (j, &q) in blk[1..].iter().enumerate() {
            for (c, v) in [(g * GROUP + j, q & 0xF), (g * GROUP + j + 16, q >> 4)] {
                let (at, hi) = code_pos(r, c);
                tile[at] |= if hi { v << 4 } else { v };
            }
        }
    }
    Ok(out)
}

/// Tiles back to ggml MXFP4 blocks (rows of k/32 blocks, the padding
/// dropped), exactly.
pub fn mx_to_mxfp4(tiles: &[u8], s: MxShape) -> Result<Vec<u8>> {
    if tiles.len() != s.bytes() {
        return Err(CodecError(format!(
            "{} x {} (K padded to {}) needs {} MXFP4 tiles ({} bytes), found {} bytes",
            s.n,
            s.k,
            s.tiles_per_row() * MX_COLS,
            s.n_tiles(),
            s.bytes(),
            tiles.len()
        )));
    }
    let mut out = vec![0u8; s.ggml_bytes()];
    for (bi, blk) in out.chunks_exact_mut(BLOCK).enumerate() {
        let (t, g, r) = place(&s, bi);
        let tile = &tiles[t * MX_TILE_BYTES..][..MX_TILE_BYTES];
        blk[0] = tile[g * MX_ROWS + r];
        let code = |c: usize| {
            let (at, hi) = code_pos(r, c);
            if hi {
                tile[at] >> 4
            } else {
                tile[at] & 0xF
            }
        };
        for j in 0..16 {
            blk[1 + j] = code(g * GROUP + j) | (code(g * GROUP + j + 16) << 4);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::blocks;
    use crate::dtype::GgmlType;
    use crate::q4nx::tests::rng;

    /// A tile written here from the layout table: exponent e(r, g) at
    /// g*32 + r, the code of (r, c) in byte 512 + (r/16)*1024 + c*8 + (r%16)/2.
    fn hand_tile(e: &dyn Fn(usize, usize) -> u8, q: &dyn Fn(usize, usize) -> u8) -> Vec<u8> {
        let mut t = vec![0u8; 2560];
        for g in 0..4 {
            for r in 0..32 {
                t[g * 32 + r] = e(r, g);
            }
        }
        for r in 0..32 {
            for c in 0..128 {
                let at = 512 + (r / 16) * 1024 + c * 8 + (r % 16) / 2;
                t[at] |= if r % 2 == 1 { q(r, c) << 4 } else { q(r, c) };
            }
        }
        t
    }

    /// Hand-written tiles of a 64 x 256 matrix read back as MXFP4 blocks
    /// whose values are the layout's (code table times 2^(e - 128), ggml's
    /// half-exponent convention), and the writer gives the same bytes back.
    #[test]
    fn tiles_hold_the_codes_and_exponents_the_layout_places() {
        let mut r = rng(5);
        let (n, k) = (64, 256);
        let codes: Vec<u8> = (0..n * k).map(|_| (r() % 16) as u8).collect();
        let exps: Vec<u8> = (0..n * k / 32).map(|_| 110 + (r() % 30) as u8).collect();
        let s = MxShape::new(n, k).unwrap();
        let mut tiles = Vec::new();
        for p in 0..n / 32 {
            for q in 0..k / 128 {
                tiles.extend(hand_tile(
                    &|rr, g| exps[(p * 32 + rr) * (k / 32) + q * 4 + g],
                    &|rr, c| codes[(p * 32 + rr) * k + q * 128 + c],
                ));
            }
        }
        let b = mx_to_mxfp4(&tiles, s).unwrap();
        let mut got = vec![0f32; n * k];
        blocks::dequantize(GgmlType::MXFP4, &b, &mut got).unwrap();
        for row in 0..n {
            for col in 0..k {
                let e = exps[row * (k / 32) + col / 32] as i32;
                let want = blocks::MXFP4_CODES[codes[row * k + col] as usize] as f32
                    * (2f32).powi(e - 128);
                assert_eq!(got[row * k + col], want, "({row}, {col})");
            }
        }
        assert!(mx_from_mxfp4(&b, s).unwrap() == tiles);
    }

    /// K off the 128 grid: the pad columns are zero and the round trip exact.
    #[test]
    fn padded_columns_are_zero_and_the_round_trip_is_exact() {
        let mut r = rng(9);
        let s = MxShape::new(32, 96).unwrap();
        let b: Vec<u8> = (0..s.ggml_bytes()).map(|_| r() as u8).collect();
        let t = mx_from_mxfp4(&b, s).unwrap();
        assert_eq!(t.len(), 2560);
        // Group 3 (columns 96..128) is padding: exponents and codes zero.
        assert!(t[96..128].iter().all(|&x| x == 0));
        for rr in 0..32 {
            for c in 96..128 {
                assert_eq!(t[512 + (rr / 16) * 1024 + c * 8 + (rr % 16) / 2], 0);
            }
        }
        assert!(t[128..512].iter().all(|&x| x == 0));
        assert_eq!(mx_to_mxfp4(&t, s).unwrap(), b);
        let e = MxShape::new(48, 64).unwrap_err().0;
        assert!(e.contains("32 rows"), "{e}");
        let e = mx_to_mxfp4(&t[..2559], s).unwrap_err().0;
        assert!(e.contains("2560 bytes"), "{e}");
    }
}
