//! x86 SIMD kernels, chosen at run time, and the weight/activation layouts they read.
//!
//! Two levels beside the scalar reference: `avx2` (AVX2 + FMA + F16C) and
//! `avx512` (adds AVX-512 F/BW/VL/VNNI; the kernels still use 256-bit
//! vectors, but with `vpdpbusd`/`vpdpwssd` and 32 registers for larger tiles).
//! Both kernels live in one macro body ([`simd_kernels!`]) instantiated per
//! level over that level's primitives (`dp`, `dp16`, `q8_*`, `expand_bits`).
//!
//! # Exactness
//!
//! Every kernel computes exactly what [`crate::quant::scalar`] computes: the
//! integer sums are exact (any order gives the same i32), and the float
//! operations are the same IEEE operations in the same order, unfused. For
//! blocks of 32, a 256-bit vector holds eight blocks' integer sums, one per
//! 32-bit lane, and the float terms are added lane-wise: block b into lane
//! b % 8, as the scalar reference does. So SIMD results equal the scalar
//! reference bit for bit on every input, which the tests check.
//!
//! # Packed layout (blocks of 32)
//!
//! To get one block per lane without a horizontal reduction, Q4_0, Q4_1, Q5_0
//! and Q8_0 weight rows are repacked at load in groups of 8 blocks; each group
//! is as many bytes as the 8 blocks it replaces, and the last `nb % 8` blocks
//! of a row stay as they are, so a packed matrix is exactly as big as the
//! original. In a group, the 32-byte code vector k (k = 0..8) holds, in its
//! lane l, elements 4k..4k+4 of block l:
//!
//! | type | group layout (bytes) |
//! |---|---|
//! | Q4_0 | d[8] f16 (16), qs (128): vector k' (0..4) = bytes 4k'..4k'+4 of each block's qs; low nibbles are code vector k', high nibbles vector k'+4 |
//! | Q4_1 | d[8] (16), m[8] (16), qs (128) as Q4_0 |
//! | Q5_0 | d[8] (16), fifth bits (32): u32 k has bit 4l+i = bit 4k+i of block l's qh, qs (128) as Q4_0 |
//! | Q8_0 | d[8] (16), qs (256): vector k = bytes 4k..4k+4 of each block's codes |
//!
//! Activations for those kernels are quantized as usual (Q8_0/Q8_1) and then
//! rearranged per row the same way: per group, d[8] as f32 (32 bytes), for Q8_1
//! s[8] as f32 (32), then the 256 code bytes in the order above; the last
//! `nb % 8` blocks stay standard.
//!
//! K-quants (Q4_K, Q6_K) read the standard layouts; their integer sums are
//! reduced once per 256-element super-block.

use onebit_formats::GgmlType;
use std::sync::OnceLock;

use super::ActFormat;

#[macro_use]
mod body;
pub mod avx2;
pub mod avx512;

/// An instruction-set level with kernels.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Isa {
    Scalar,
    Avx2,
    Avx512,
}

impl Isa {
    /// Whether this CPU can run the level.
    pub fn supported(self) -> bool {
        match self {
            Isa::Scalar => true,
            Isa::Avx2 => {
                is_x86_feature_detected!("avx2")
                    && is_x86_feature_detected!("fma")
                    && is_x86_feature_detected!("f16c")
            }
            Isa::Avx512 => {
                Isa::Avx2.supported()
                    && is_x86_feature_detected!("avx512f")
                    && is_x86_feature_detected!("avx512bw")
                    && is_x86_feature_detected!("avx512vl")
                    && is_x86_feature_detected!("avx512vnni")
            }
        }
    }

    /// Every level this CPU supports, scalar first.
    pub fn available() -> Vec<Isa> {
        [Isa::Scalar, Isa::Avx2, Isa::Avx512]
            .into_iter()
            .filter(|i| i.supported())
            .collect()
    }

    /// The best supported level, or the one `ONEBIT_ISA` (scalar, avx2,
    /// avx512) names when this CPU supports it. Detected once.
    pub fn best() -> Isa {
        static BEST: OnceLock<Isa> = OnceLock::new();
        *BEST.get_or_init(|| {
            let want = match std::env::var("ONEBIT_ISA").ok().as_deref() {
                Some("scalar") => Some(Isa::Scalar),
                Some("avx2") => Some(Isa::Avx2),
                Some("avx512") => Some(Isa::Avx512),
                _ => None,
            };
            match want {
                Some(i) if i.supported() => i,
                _ => *Isa::available().last().expect("scalar is always available"),
            }
        })
    }
}

/// Whether `t` rows are repacked for the SIMD kernels.
pub fn packs(t: GgmlType) -> bool {
    matches!(
        t,
        GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q5_0 | GgmlType::Q8_0
    )
}

/// Byte offsets in a packed weight group: (scales, mins or fifth bits, codes, group bytes).
const fn wgroup(t: GgmlType) -> (usize, usize, usize, usize) {
    match t {
        GgmlType::Q4_0 => (0, 16, 16, 144),
        GgmlType::Q4_1 => (0, 16, 32, 160),
        GgmlType::Q5_0 => (0, 16, 48, 176),
        _ => (0, 16, 16, 272), // Q8_0
    }
}

/// Repacks one weight row (standard blocks, `out` the same length).
pub fn pack_weight_row(t: GgmlType, row: &[u8], out: &mut [u8]) {
    assert!(packs(t), "{t} rows are not repacked");
    assert_eq!(row.len(), out.len());
    let bb = t.block_bytes();
    let nb = row.len() / bb;
    let ng = nb / 8;
    let (_, mo, qo, gb) = wgroup(t);
    for g in 0..ng {
        let src = &row[g * 8 * bb..(g + 1) * 8 * bb];
        let dst = &mut out[g * gb..(g + 1) * gb];
        let blk = |l: usize| &src[l * bb..(l + 1) * bb];
        for l in 0..8 {
            dst[2 * l..2 * l + 2].copy_from_slice(&blk(l)[0..2]);
        }
        match t {
            GgmlType::Q8_0 => {
                for k in 0..8 {
                    for l in 0..8 {
                        let at = qo + 32 * k + 4 * l;
                        dst[at..at + 4].copy_from_slice(&blk(l)[2 + 4 * k..2 + 4 * k + 4]);
                    }
                }
            }
            _ => {
                let qs_at = match t {
                    GgmlType::Q4_0 => 2,
                    GgmlType::Q4_1 => 4,
                    _ => 6,
                };
                for k in 0..4 {
                    for l in 0..8 {
                        let at = qo + 32 * k + 4 * l;
                        dst[at..at + 4].copy_from_slice(&blk(l)[qs_at + 4 * k..qs_at + 4 * k + 4]);
                    }
                }
                if t == GgmlType::Q4_1 {
                    for l in 0..8 {
                        dst[mo + 2 * l..mo + 2 * l + 2].copy_from_slice(&blk(l)[2..4]);
                    }
                }
                if t == GgmlType::Q5_0 {
                    for k in 0..8 {
                        let mut m = 0u32;
                        for l in 0..8 {
                            let qh = u32::from_le_bytes(blk(l)[2..6].try_into().unwrap());
                            m |= ((qh >> (4 * k)) & 0xF) << (4 * l);
                        }
                        dst[mo + 4 * k..mo + 4 * k + 4].copy_from_slice(&m.to_le_bytes());
                    }
                }
            }
        }
    }
    out[ng * gb..].copy_from_slice(&row[ng * 8 * bb..]);
}

/// Bytes of a packed activation group of 8 blocks.
const fn agroup(fmt: ActFormat) -> usize {
    match fmt {
        ActFormat::Q8_1 => 320,
        _ => 288,
    }
}

/// Bytes of one packed activation row of `n` elements (Q8_0 or Q8_1).
pub fn packed_act_row_bytes(fmt: ActFormat, n: usize) -> usize {
    let nb = n / 32;
    (nb / 8) * agroup(fmt) + (nb % 8) * fmt.block_bytes()
}

/// Rearranges one standard Q8_0/Q8_1 activation row into the packed layout.
pub fn pack_act_row(fmt: ActFormat, row: &[u8], out: &mut [u8]) {
    let bb = fmt.block_bytes();
    let nb = row.len() / bb;
    let ng = nb / 8;
    let gb = agroup(fmt);
    assert_eq!(out.len(), ng * gb + (nb % 8) * bb);
    let qs = if fmt == ActFormat::Q8_1 { 4 } else { 2 };
    let codes = if fmt == ActFormat::Q8_1 { 64 } else { 32 };
    for g in 0..ng {
        let src = &row[g * 8 * bb..(g + 1) * 8 * bb];
        let dst = &mut out[g * gb..(g + 1) * gb];
        for l in 0..8 {
            let b = &src[l * bb..(l + 1) * bb];
            let d = onebit_formats::blocks::f16_at(b, 0);
            dst[4 * l..4 * l + 4].copy_from_slice(&d.to_le_bytes());
            if fmt == ActFormat::Q8_1 {
                let s = onebit_formats::blocks::f16_at(b, 2);
                dst[32 + 4 * l..32 + 4 * l + 4].copy_from_slice(&s.to_le_bytes());
            }
            for k in 0..8 {
                let at = codes + 32 * k + 4 * l;
                dst[at..at + 4].copy_from_slice(&b[qs + 4 * k..qs + 4 * k + 4]);
            }
        }
    }
    out[ng * gb..].copy_from_slice(&row[ng * 8 * bb..]);
}

/// Operands of one kernel call: `nrows` weight rows of `wrb` bytes (packed
/// when [`packs`] says so) and `ntok` activation rows of `arb` bytes (packed
/// likewise), rows of `cols` elements.
#[derive(Clone, Copy)]
pub struct Operands<'a> {
    pub w: &'a [u8],
    pub wrb: usize,
    pub a: &'a [u8],
    pub arb: usize,
    pub cols: usize,
}

/// Computes `out[t * ostride + r] = w[r] · a[t]` for r < nrows, t < ntok.
///
/// # Safety
/// The CPU supports the level the function was taken from; `w` holds
/// `nrows * wrb` bytes and `a` holds `ntok * arb` (checked by [`gemm`]);
/// `out` is valid for writes at every `t * ostride + r` and nothing else reads
/// or writes those elements during the call.
pub type GemmFn = unsafe fn(&Operands, usize, usize, *mut f32, usize);

/// The kernel for weight type `t` at level `isa`, if there is one.
pub fn gemm_fn(isa: Isa, t: GgmlType) -> Option<GemmFn> {
    match isa {
        Isa::Scalar => None,
        Isa::Avx2 => avx2::gemm_fn(t),
        Isa::Avx512 => avx512::gemm_fn(t),
    }
}

/// Checked entry to a [`GemmFn`] from [`gemm_fn`]`(isa, t)`.
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
    let f = gemm_fn(isa, t).expect("no SIMD kernel for this type at this level");
    assert!(isa.supported(), "{isa:?} is not supported by this CPU");
    assert!(ops.w.len() >= nrows * ops.wrb && ops.a.len() >= ntok * ops.arb);
    assert_eq!(Some(ops.wrb as u64), t.row_bytes(ops.cols as u64));
    // SAFETY: the level is supported (checked above), the operand lengths are
    // checked above, and the caller vouches for `out`.
    unsafe { f(ops, nrows, ntok, out, ostride) }
}

#[cfg(test)]
mod tests;
