//! aarch64 SIMD kernels, chosen at run time: three levels beside the scalar
//! reference.
//!
//! | level | instructions | integer dot product of 16 i8 pairs |
//! |---|---|---|
//! | `neon` | base Advanced SIMD (every aarch64 CPU) | `smull`/`smull2` into i16, `sadalp` into i32 |
//! | `dotprod` | FEAT_DotProd | one `sdot` |
//! | `i8mm` | FEAT_I8MM | `smmla`: 2 rows x 2 tokens at once (tiles of 2 rows x 2 or 4 tokens from 2 tokens on, every quantized type); one token and edges as `dotprod` |
//!
//! Shapes: one token (decode) runs one weight row times the token
//! (`body.rs`); two or more (a batched decode step, a speculative verify,
//! prefill) run tiles of 2 rows x 4 tokens (`rows.rs`; the K-quants' `smmla`
//! tiles in `i8mm.rs`) that decode each weight block once for the tile's
//! tokens and load each activation vector once for both rows. Each row's
//! result is the same bits whatever the tile.
//!
//! `sdot` and `smmla` are issued with inline assembly (their `core::arch`
//! intrinsics are not stable in the Rust this crate builds with), inside
//! functions compiled with the matching `#[target_feature]`, called only when
//! [`Isa::supported`] detected the feature.
//!
//! # Exactness
//!
//! Every kernel computes what [`crate::quant::scalar`] computes, bit for bit:
//! integer sums are exact in any order, and the float terms are the same
//! IEEE operations in the same order, unfused (`fmul` then `fadd`, never
//! `fmla`). For blocks of 32, four consecutive blocks' integer sums are
//! reduced into one vector (block b in lane b % 4) by two pairwise adds, and
//! their float terms are added lane-wise into two f32x4 accumulators (blocks
//! 8g..8g+4 into the first, 8g+4..8g+8 into the second), which is the scalar
//! reference's eight lanes (block b into lane b % 8); blocks past the last
//! whole group of four go to lane b % 8 one at a time. K-quants form the whole
//! super-block's integer sum, then the reference's float formula.
//!
//! # Layouts
//!
//! The kernels read the standard GGUF block layouts (weights and activations
//! alike): a NEON register is 16 bytes, half a block of 32, so there is no
//! repacked copy of the weights on aarch64.

use onebit_formats::GgmlType;

use super::Isa;

pub(crate) mod act;
#[macro_use]
mod rows;
#[macro_use]
mod body;
mod dotprod;
mod i8mm;
mod neon;

/// Operands of one kernel call: `nrows` weight rows of `wrb` bytes and `ntok`
/// activation rows of `arb` bytes (in the format
/// [`crate::quant::act_format`] names, standard blocks), rows of `cols`
/// elements.
#[derive(Clone, Copy)]
pub struct Operands<'a> {
    pub w: &'a [u8],
    pub wrb: usize,
    pub a: &'a [u8],
    pub arb: usize,
    pub cols: usize,
}

impl Operands<'_> {
    /// The weight rows r0..r0 + N.
    ///
    /// # Safety
    /// `w` holds rows r0..r0 + N (`.add` stays within it).
    #[inline(always)]
    pub(crate) unsafe fn w_rows<const N: usize>(&self, r0: usize) -> [*const u8; N] {
        // SAFETY: the caller's contract.
        core::array::from_fn(|i| unsafe { self.w.as_ptr().add((r0 + i) * self.wrb) })
    }

    /// The activation rows (tokens) t0..t0 + N.
    ///
    /// # Safety
    /// `a` holds rows t0..t0 + N (`.add` stays within it).
    #[inline(always)]
    pub(crate) unsafe fn a_rows<const N: usize>(&self, t0: usize) -> [*const u8; N] {
        // SAFETY: the caller's contract.
        core::array::from_fn(|j| unsafe { self.a.as_ptr().add((t0 + j) * self.arb) })
    }
}

/// Computes `out[t * ostride + r] = w[r] · a[t]` for r < nrows, t < ntok.
///
/// # Safety
/// The CPU supports the level the function was taken from; `w` holds
/// `nrows * wrb` bytes and `a` holds `ntok * arb` (checked by [`gemm`]);
/// `out` is valid for writes at every `t * ostride + r` and nothing else reads
/// or writes those elements during the call.
pub type GemmFn = unsafe fn(&Operands, usize, usize, *mut f32, usize);

/// The kernel for weight type `t` at level `isa`, if there is one (Q4_0,
/// Q4_1, Q5_0, Q8_0, MXFP4, Q4_K, Q5_K, Q6_K and F32 at every aarch64 level).
pub fn gemm_fn(isa: Isa, t: GgmlType) -> Option<GemmFn> {
    match isa {
        Isa::Neon => neon::gemm_fn(t),
        Isa::Dotprod => dotprod::gemm_fn(t),
        Isa::I8mm => i8mm::gemm_fn(t),
        Isa::Scalar => None,
    }
}

/// Checked entry to [`gemm_fn`]`(isa, t)`.
///
/// # Safety
/// `out` is valid for writes at every `t * ostride + r` (r < nrows, t < ntok)
/// and no other thread accesses those elements during the call.
#[allow(clippy::too_many_arguments)]
pub unsafe fn gemm(
    isa: Isa,
    t: GgmlType,
    ops: &Operands,
    nrows: usize,
    ntok: usize,
    out: *mut f32,
    ostride: usize,
) {
    let f = gemm_fn(isa, t).expect("no aarch64 kernel for this type at this level");
    assert!(isa.supported(), "{isa:?} is not supported by this CPU");
    assert_eq!(Some(ops.wrb as u64), t.row_bytes(ops.cols as u64));
    let fmt = super::act_format(t);
    assert_eq!(ops.arb, super::act_row_bytes(fmt, ops.cols));
    assert!(ops.w.len() >= nrows * ops.wrb && ops.a.len() >= ntok * ops.arb);
    // SAFETY: the level is supported and the operand lengths match the
    // shapes (checked above); the caller vouches for `out`.
    unsafe { f(ops, nrows, ntok, out, ostride) }
}

#[cfg(test)]
mod tests;
