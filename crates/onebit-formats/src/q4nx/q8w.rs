//! The wide Q8 tile of FastFlowLM's MoE packs (its converter's
//! `q4nx/models/qwen35moe.py` packs every quantized matrix but the experts
//! this way): 32 x 256 blocks of int8 codes with one bf16 scale per row and
//! 32-column group, 8,704 bytes each. Bytes 0..512: 256 scales at g * 32 + r
//! (8 groups, no second copy, no minimums); 512..8704: codes, row rh * 16 + j
//! of column c at 512 + rh * 4096 + c * 16 + j. The tensor's shape is
//! [N/32, Kp/256, 8704], K zero-padded to 256, tiles in row-major block
//! order. Value: d * q. Invariant: a Q8_0 matrix whose scales are bf16 values
//! goes through these tiles and back unchanged, byte for byte.

use half::{bf16, f16};

use super::q8::Q8Form;
use super::GROUP;

/// Bytes of one wide Q8 tile.
pub const Q8W_TILE_BYTES: usize = 8704;
/// Columns per wide Q8 tile.
pub const Q8W_COLS: usize = 256;

/// The wide Q8 tile: 32 x 256, scales once, 8,704 bytes (read and written
/// by the same code as the Q8 tile, `q8.rs`).
pub const Q8W_TILE: Q8Form = Q8Form {
    cols: Q8W_COLS,
    tile_bytes: Q8W_TILE_BYTES,
    copies: 1,
    name: "wide Q8 tiles",
};

/// Geometry of a matrix in wide Q8 tiles: `n` rows by `k` columns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Q8wShape {
    pub n: usize,
    pub k: usize,
}

impl Q8wShape {
    pub fn new(n: usize, k: usize) -> Result<Q8wShape, super::CodecError> {
        Q8W_TILE.check_dims(n, k)?;
        Ok(Q8wShape { n, k })
    }
    pub fn kp(&self) -> usize {
        Q8W_TILE.kp(self.k)
    }
    pub fn tiles_per_row(&self) -> usize {
        Q8W_TILE.tiles_per_row(self.k)
    }
    pub fn bytes(&self) -> usize {
        Q8W_TILE.bytes(self.n, self.k)
    }
    /// [N/32, Kp/256, 8704].
    pub fn stored_shape(&self) -> Vec<u64> {
        Q8W_TILE.stored_shape(self.n, self.k)
    }
}

/// Repacks ggml Q8_0 blocks (rows of k/32) into wide Q8 tiles; scales round
/// to bf16 (the count that rounded is returned).
pub fn q8w_from_q8_0(
    blocks: &[u8],
    shape: Q8wShape,
) -> Result<(Vec<u8>, usize), super::CodecError> {
    Q8W_TILE.from_q8_0(shape.n, shape.k, blocks)
}

/// Wide Q8 tiles back to ggml Q8_0 blocks (scales bf16 -> f16; the count of
/// scales that rounded is returned, 0 for scales at or above 2^-17).
pub fn q8w_to_q8_0(data: &[u8], shape: Q8wShape) -> Result<(Vec<u8>, usize), super::CodecError> {
    Q8W_TILE.to_q8_0(shape.n, shape.k, data)
}

/// Quantizes f32 rows (`w`, \[n\]\[k\], k a multiple of 32) to ggml Q8_0 blocks
/// by ggml's reference rule (d = max|x| / 127, q = round(x / d)), with d
/// rounded to bf16 first, as the tile will store it, and codes computed
/// against that scale.
pub fn quantize_q8_0_bf16(w: &[f32]) -> Vec<u8> {
    let mut out = Vec::with_capacity(w.len() / GROUP * 34);
    for x in w.chunks_exact(GROUP) {
        let amax = x.iter().fold(0f32, |a, v| a.max(v.abs()));
        let d = bf16::from_f32(amax / 127.0).to_f32();
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        out.extend_from_slice(&f16::from_f32(d).to_le_bytes());
        out.extend(
            x.iter()
                .map(|v| (v * id).round().clamp(-127.0, 127.0) as i8 as u8),
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The layout of FastFlowLM's qwen35moe converter (`_pack_q8nx` with
    /// row_block 32, col_block 256, parallel 16, keep_block_in_2D): per
    /// 32 x 256 block, the scales in (group, row) order as bf16, then the
    /// codes as (row / 16, column, row % 16). Each expected byte offset is
    /// computed here from that statement, not by the writer.
    #[test]
    fn wide_q8_tile_bytes_follow_the_converter_layout() {
        let (n, k) = (64usize, 320usize); // two row blocks, K padded to 512
        let gpr = k / 32;
        // Q8_0 blocks: scale of (row, group) = (1 + (row * gpr + group) % 127) / 64
        // (at most 7 significant bits: exact in bf16 and f16), codes = a
        // function of (row, col).
        let scale = |r: usize, g: usize| (1 + (r * gpr + g) % 127) as f32 / 64.0;
        let code = |r: usize, c: usize| ((r * 7 + c * 3) % 251) as i8;
        let mut blocks = Vec::new();
        for r in 0..n {
            for g in 0..gpr {
                let d = scale(r, g);
                blocks.extend_from_slice(&f16::from_f32(d).to_le_bytes());
                for x in 0..32 {
                    blocks.push(code(r, g * 32 + x) as u8);
                }
            }
        }
        let s = Q8wShape::new(n, k).unwrap();
        assert_eq!(s.stored_shape(), vec![2, 2, 8704]);
        let (tiles, rounded) = q8w_from_q8_0(&blocks, s).unwrap();
        assert_eq!(rounded, 0);
        assert_eq!(tiles.len(), 2 * 2 * 8704);
        assert_eq!(8704, 256 * 2 + 32 * 256, "scales, then one byte per code");
        for p in 0..2 {
            for q in 0..2 {
                let tile = &tiles[(p * 2 + q) * 8704..][..8704];
                for r in 0..32 {
                    let row = p * 32 + r;
                    for g in 0..8 {
                        let col0 = q * 256 + g * 32;
                        let at = (g * 32 + r) * 2;
                        let want = if col0 < k {
                            bf16::from_f32(scale(row, col0 / 32)).to_bits()
                        } else {
                            0 // padding columns: zero scale
                        };
                        let got = u16::from_le_bytes([tile[at], tile[at + 1]]);
                        assert_eq!(got, want, "scale of row {row} group {g} tile ({p}, {q})");
                    }
                    for c in 0..256 {
                        let col = q * 256 + c;
                        let at = 512 + (r / 16) * 4096 + c * 16 + r % 16;
                        let want = if col < k { code(row, col) } else { 0 };
                        assert_eq!(tile[at] as i8, want, "code of ({row}, {col})");
                    }
                }
            }
        }
        // And back: the Q8_0 blocks unchanged.
        let (back, inexact) = q8w_to_q8_0(&tiles, s).unwrap();
        assert_eq!(inexact, 0);
        assert!(back == blocks);
    }

    #[test]
    fn quantizer_scale_is_a_bf16_value_and_codes_fit() {
        let w: Vec<f32> = (0..64).map(|i| (i as f32 - 30.5) * 0.37).collect();
        let b = quantize_q8_0_bf16(&w);
        assert_eq!(b.len(), 2 * 34);
        for (blk, x) in b.chunks_exact(34).zip(w.chunks_exact(32)) {
            let d = f16::from_le_bytes([blk[0], blk[1]]).to_f32();
            assert_eq!(bf16::from_f32(d).to_f32(), d);
            for (q, v) in blk[2..].iter().zip(x) {
                assert!((*q as i8 as f32 * d - v).abs() <= d / 2.0 + 1e-6);
            }
        }
    }
}
