//! Quantized dot products, llama.cpp's `vec_dot_<weight>_<activation>` scheme.
//!
//! A matmul over quantized weights does not dequantize them: the activation
//! row is quantized once into the 8-bit format the weight type pairs with
//! ([`act_format`]), and each weight row is dotted with it using integer sums
//! within a block, scaled by the blocks' scales:
//!
//! | weights | activations |
//! |---|---|
//! | Q4_0, Q5_0, Q8_0, Q8_1 | Q8_0: blocks of 32, f16 d = amax/127 |
//! | Q4_1, Q5_1 | Q8_1: Q8_0 plus f16 s = d * sum(q), which carries the weights' min |
//! | Q2_K..Q6_K, Q8_K | Q8_K: blocks of 256, f32 d, sixteen i16 sums of 16 codes |
//! | F32, F16, BF16 | F32 (little-endian bytes) |
//!
//! # Rounding
//!
//! Activations round to nearest, **ties to even** ([`f32::round_ties_even`]),
//! with the multiplier `id = 127 / amax` (Q8_0, Q8_1). This is what llama.cpp's
//! x86 quantizers do (`_mm256_round_ps(v * id, _MM_ROUND_NEAREST)` in
//! `quantize_row_q8_0`/`q8_1`, and `nearest_int` in the Q8_K reference, which is
//! also round-half-even), so on the machines the golden fixtures were produced
//! on, the activation codes agree with llama.cpp's; it is also what SIMD
//! rounding instructions do natively, so the AVX2/AVX-512 quantizers can match
//! this scalar reference bit for bit. (llama.cpp's portable `*_ref` Q8_0/Q8_1
//! quantizers use `roundf`, halves away from zero, and `id = 1/d`; they differ
//! from the x86 path only on exact ties and in the last bit of `id`.)
//!
//! Departures from llama.cpp, only where llama.cpp would produce inf or NaN:
//! a block whose `amax / 127` overflows f16 (amax > ~8.3e6) gets the largest
//! finite f16 scale and saturated codes; a block whose multiplier `127/amax`
//! is not finite (amax subnormal) gets zero codes. Q8_K's f32 scale cannot
//! overflow; a non-finite multiplier also gives zero codes there.
//!
//! # Accumulation
//!
//! Each dot product is a pure function of its inputs: integer sums are exact,
//! and the per-block float terms are added in a fixed order (8 lanes for
//! blocks of 32, one accumulator for super-blocks; see [`scalar`]), float
//! products never fused. The SIMD kernels in `x86` and `arm` compute exactly
//! the same operations, so every ISA level ([`Isa`]) gives the same bits as
//! the scalar reference, and a row gives the same bits whatever batch, tile or thread it
//! is computed in.

mod act;
#[cfg(target_arch = "aarch64")]
pub mod arm;
pub(crate) use crate::isa;
pub mod scalar;
mod scale;
#[cfg(target_arch = "x86_64")]
pub mod x86;

pub use act::{quantize_q8_0, quantize_q8_1, quantize_q8_k};
pub use isa::Isa;
pub use scale::F16_MAX;

use onebit_formats::GgmlType;

/// The encoding of an activation row that a weight type's dot product reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ActFormat {
    F32,
    Q8_0,
    Q8_1,
    Q8K,
}

impl ActFormat {
    /// Elements per block (1 for F32).
    pub fn block_len(self) -> usize {
        match self {
            ActFormat::F32 => 1,
            ActFormat::Q8_0 | ActFormat::Q8_1 => 32,
            ActFormat::Q8K => onebit_formats::blocks::QK_K,
        }
    }
    /// Bytes per block.
    pub fn block_bytes(self) -> usize {
        self.ggml_type().block_bytes()
    }
    /// The ggml type with the same byte layout.
    pub fn ggml_type(self) -> GgmlType {
        match self {
            ActFormat::F32 => GgmlType::F32,
            ActFormat::Q8_0 => GgmlType::Q8_0,
            ActFormat::Q8_1 => GgmlType::Q8_1,
            ActFormat::Q8K => GgmlType::Q8K,
        }
    }
}

/// The activation encoding a weight type's dot product consumes: Q4_0, Q5_0,
/// Q8_0 (and Q8_1), MXFP4 -> Q8_0; Q4_1, Q5_1 -> Q8_1; K-quants -> Q8K;
/// F32/F16/BF16 -> F32.
pub fn act_format(w: GgmlType) -> ActFormat {
    kernel(w).act
}

/// Bytes one activation row of `n` elements takes in `fmt` (F32: 4 * n).
/// Panics when `n` is not a multiple of the format's block length.
pub fn act_row_bytes(fmt: ActFormat, n: usize) -> usize {
    let bl = fmt.block_len();
    assert!(
        n.is_multiple_of(bl),
        "{fmt:?} activation rows need a multiple of {bl} elements, got {n}"
    );
    n / bl * fmt.block_bytes()
}

/// Quantizes one activation row (`x.len()` a multiple of the format's block
/// length) into `out` (exactly `act_row_bytes(fmt, x.len())` bytes). F32
/// writes the little-endian bytes of `x`.
pub fn quantize_act(fmt: ActFormat, x: &[f32], out: &mut [u8]) {
    let want = act_row_bytes(fmt, x.len());
    assert_eq!(
        out.len(),
        want,
        "{fmt:?} activation row of {} elements needs {want} bytes, the buffer has {}",
        x.len(),
        out.len()
    );
    match fmt {
        ActFormat::F32 => {
            for (o, v) in out.chunks_exact_mut(4).zip(x) {
                o.copy_from_slice(&v.to_le_bytes());
            }
        }
        ActFormat::Q8_0 => quantize_q8_0(x, out),
        ActFormat::Q8_1 => quantize_q8_1(x, out),
        ActFormat::Q8K => quantize_q8_k(x, out),
    }
}

/// A scalar dot product: (weight row bytes, activation row bytes, n) -> sum.
/// Lengths are checked by [`dot`], not by the kernels.
pub type DotFn = fn(&[u8], &[u8], usize) -> f32;

/// One row of the dispatch table.
#[derive(Clone, Copy, Debug)]
pub struct Kernel {
    pub act: ActFormat,
    pub dot: DotFn,
}

/// The dispatch table: weight type -> activation format and scalar dot product.
pub fn kernel(w: GgmlType) -> Kernel {
    use scalar::*;
    use ActFormat as A;
    let (act, dot): (ActFormat, DotFn) = match w {
        GgmlType::F32 => (A::F32, dot_f32_f32),
        GgmlType::F16 => (A::F32, dot_f16_f32),
        GgmlType::BF16 => (A::F32, dot_bf16_f32),
        GgmlType::Q4_0 => (A::Q8_0, dot_q4_0_q8_0),
        GgmlType::Q4_1 => (A::Q8_1, dot_q4_1_q8_1),
        GgmlType::Q5_0 => (A::Q8_0, dot_q5_0_q8_0),
        GgmlType::Q5_1 => (A::Q8_1, dot_q5_1_q8_1),
        GgmlType::Q8_0 => (A::Q8_0, dot_q8_0_q8_0),
        GgmlType::Q8_1 => (A::Q8_0, dot_q8_1_q8_0),
        GgmlType::Q2K => (A::Q8K, dot_q2_k_q8_k),
        GgmlType::Q3K => (A::Q8K, dot_q3_k_q8_k),
        GgmlType::Q4K => (A::Q8K, dot_q4_k_q8_k),
        GgmlType::Q5K => (A::Q8K, dot_q5_k_q8_k),
        GgmlType::Q6K => (A::Q8K, dot_q6_k_q8_k),
        GgmlType::Q8K => (A::Q8K, dot_q8_k_q8_k),
        GgmlType::MXFP4 => (A::Q8_0, dot_mxfp4_q8_0),
    };
    Kernel { act, dot }
}

/// Dot product of one weight row (encoded in `w`) with one activation row
/// encoded in `act_format(w)` (as [`quantize_act`] wrote it), `n` elements.
/// Panics when a buffer's length does not match `n`.
pub fn dot(w: GgmlType, w_row: &[u8], act: &[u8], n: usize) -> f32 {
    let k = kernel(w);
    let w_bytes = w.row_bytes(n as u64);
    assert!(
        w_bytes == Some(w_row.len() as u64),
        "{w} weight row of {n} elements needs {w_bytes:?} bytes, got {}",
        w_row.len()
    );
    let a_bytes = act_row_bytes(k.act, n);
    assert_eq!(
        act.len(),
        a_bytes,
        "{:?} activation row of {n} elements for {w} weights needs {a_bytes} bytes, got {}",
        k.act,
        act.len()
    );
    (k.dot)(w_row, act, n)
}

#[cfg(test)]
mod test_inputs;
#[cfg(test)]
mod tests;
